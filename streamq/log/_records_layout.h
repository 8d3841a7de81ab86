/*
 * streamq.log._records' record layout, shared by its two units: `_records.c` (the record
 * encoder, CRC32C and the module) and `_records_scan.c` (reading records back: checks,
 * scans, resync after damage, a chunk's entry CRCs). Constants, and declarations of what
 * one unit defines for the other. Include after <Python.h>.
 */
#ifndef STREAMQ_RECORDS_LAYOUT_H
#define STREAMQ_RECORDS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

/* Record layout (docs/log-format.md, "Record"); all integers little-endian:
 *
 *    0  4  length           u32, bytes after this field: the record is 4 + length bytes
 *    4  4  crc              u32, CRC32C of bytes 8 .. 4 + length (everything after it)
 *    8  8  offset           u64, the record's offset (dense within the log)
 *   16  8  timestamp_ms     i64, append time in ms since the Unix epoch
 *   24  1  exchange_len     u8
 *   25  1  routing_key_len  u8
 *   26  2  flags            u16, 0 in format version 1
 *   28  4  properties_len   u32
 *   32  .. exchange, routing_key, properties, body (body_len is what the length leaves)
 */
#define RECORD_LENGTH_AT 0
#define RECORD_CRC_AT 4
#define RECORD_OFFSET_AT 8
#define RECORD_TIMESTAMP_AT 16
#define RECORD_EXCHANGE_LEN_AT 24
#define RECORD_ROUTING_KEY_LEN_AT 25
#define RECORD_FLAGS_AT 26
#define RECORD_PROPERTIES_LEN_AT 28
#define RECORD_HEADER_BYTES 32
/* The CRC covers the fixed fields from the offset on, and everything after them. */
#define RECORD_CRC_FROM RECORD_OFFSET_AT
#define SHORTSTR_BYTES_MAX 255 /* exchange_len and routing_key_len are u8 */
#define U32_MAX ((uint64_t)0xFFFFFFFFu)


/* length counts from the crc field on: the fixed fields after it are 28 bytes. */
#define RECORD_LENGTH_MIN (RECORD_HEADER_BYTES - 4)

/* _records.c: CRC32C over the raw (inverted) register, as _crc32c.h's crc32c_update. */
uint32_t records_crc32c(uint32_t crc, const unsigned char *p, size_t n);

/* _records_scan.c */
PyObject *check_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char check_records_doc[];
PyObject *scan_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char scan_records_doc[];
PyObject *resync_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char resync_records_doc[];
PyObject *entry_crcs(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char entry_crcs_doc[];

#endif /* STREAMQ_RECORDS_LAYOUT_H */

/*
 * streamq.log._streamwire's layouts, shared by its five units: `_streamwire.c` (Publish
 * frames into records, index spans, and the module), `_streamwire_publish_frames.c`
 * (Publish frames into chunk entries), `_streamwire_chunks.c`
 * (osiris chunks from version-1 records, for stream-protocol consumers),
 * `_streamwire_runs.c` (a stored chunk's entries as a run of version-1 records, for AMQP
 * 0-9-1 consumers) and `_streamwire_publish.c` (an AMQP 0-9-1 publish run as chunk
 * entries). Everything here is a constant, a static inline reader, or a
 * declaration of what one unit defines for the other.
 *
 * Record (docs/log-format.md, "Record"), little-endian:
 *   u32 length (bytes after this field) | u32 crc (CRC32C of bytes 8..) | u64 offset |
 *   i64 timestamp_ms | u8 exchange_len | u8 routing_key_len | u16 flags (0) |
 *   u32 properties_len | exchange | routing_key | properties | body
 *
 * Chunk entries (osiris, docs/log-format-v2.md), big-endian: a simple entry is
 * `u32 size` (top bit 0) then the message; a sub-entry batch is `u8 1ccc0000` (c: the
 * compression, 0 none), `u16 records`, `u32 uncompressed length`, `u32 length`, then the
 * body (uncompressed: `u32 size | message` per record).
 *
 * Include after <Python.h>.
 */
#ifndef STREAMQ_STREAMWIRE_ENTRIES_H
#define STREAMQ_STREAMWIRE_ENTRIES_H

#include <stddef.h>
#include <stdint.h>

/* Record layout. */
#define RECORD_HEADER_BYTES 32
#define RECORD_LENGTH_MIN (RECORD_HEADER_BYTES - 4)
#define SHORTSTR_BYTES_MAX 255
#define U32_MAX ((uint64_t)0xFFFFFFFFu)
/* A native record's properties: NATIVE_MARK then the u64 publishing id (little-endian). */
#define NATIVE_PROPERTIES_BYTES 10
static const unsigned char NATIVE_MARK[2] = {0x00, 0x02};

/* Chunk layout: the osiris header (48 bytes, big-endian), then the entries. */
#define CHUNK_HEADER_BYTES 48
#define ENTRY_SIZE_BYTES 4
#define ENTRY_SIZE_MAX 0x7FFFFFFFu /* the top bit marks a sub-entry batch */
#define BATCH_HEADER_BYTES 11
#define BATCH_FLAG 0x80
#define BATCH_RESERVED_MASK 0x0F
#define BATCH_COMPRESSION_SHIFT 4
#define BATCH_COMPRESSION_NONE 0
#define BATCH_COMPRESSION_MAX 4 /* zstd; 5 ("extension") and above are refused */

static inline uint16_t
load_be16(const unsigned char *p)
{
    return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t
load_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint64_t
load_be64(const unsigned char *p)
{
    return (uint64_t)load_be32(p) << 32 | load_be32(p + 4);
}

static inline void
store_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void
store_be64(unsigned char *p, uint64_t v)
{
    store_be32(p, (uint32_t)(v >> 32));
    store_be32(p + 4, (uint32_t)v);
}

/* _streamwire.c: CRC32C over the raw (inverted) register, as _crc32c.h's crc32c_update,
 * and the CRC32 (IEEE) of _crc32.h's crc32_ieee. */
uint32_t streamwire_crc32c(uint32_t crc, const unsigned char *p, size_t n);
uint32_t streamwire_crc32(uint32_t crc, const unsigned char *p, size_t n);

/* _streamwire.c: one message of a Publish frame, as parsed (where its parts are in the
 * payload), and the parser: NULL with the message's size in *size and its parts in *m,
 * or a text naming what is wrong. */
typedef struct {
    uint64_t id;
    const unsigned char *filter; /* NULL: none */
    size_t filter_len;
    const unsigned char *body; /* a simple entry's message, or a sub-entry batch's data */
    size_t body_len;
    uint32_t batch_count; /* 0: a simple entry; else the messages of an uncompressed batch */
} PublishedMessage;
const char *streamwire_parse_message(const unsigned char *p, size_t avail, int version,
                                     PublishedMessage *m, size_t *size, size_t filter_max);

/* _streamwire_publish_frames.c */
PyObject *publish_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char publish_entries_doc[];

/* _streamwire_chunks.c */
PyObject *chunk_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char chunk_add_doc[];
PyObject *crc32_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char crc32_doc[];

/* _streamwire_publish.c */
PyObject *converted_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char converted_entries_doc[];

/* _streamwire_runs.c */
PyObject *chunk_run_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char chunk_run_records_doc[];
PyObject *chunk_message_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char chunk_message_spans_doc[];

#endif /* STREAMQ_STREAMWIRE_ENTRIES_H */

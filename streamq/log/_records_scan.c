/* streamq.log._records, second unit: reading records back (recovery, scrubs, salvage).
 *
 * `check_records` checks a run of records (lengths, CRC32C, dense offsets) as recovery
 * and scrubs read them, `scan_records` lists a run's records without building them,
 * `resync_records` finds the next whole record after damage, and `entry_crcs` checks a
 * version-2 chunk's entries against the CRC32C trailer. The record layout is in
 * _records_layout.h; the CRC32C tables belong to the module's first unit (_records.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_le.h"
#include "_records_layout.h"

static const char RECORD_PARTIAL[] = "partial record";

static const char *
check_one_record(const unsigned char *r, Py_ssize_t avail, uint64_t expected, size_t *size)
{
    if (avail < RECORD_HEADER_BYTES) {
        return RECORD_PARTIAL;
    }
    uint32_t record_length = load_le32(r);
    if (record_length < RECORD_LENGTH_MIN) {
        return "bad record length";
    }
    if ((size_t)avail < 4 + (size_t)record_length) {
        return RECORD_PARTIAL;
    }
    uint32_t lex = r[24], lrk = r[25], flags = (uint32_t)r[26] | (uint32_t)r[27] << 8;
    uint32_t lprops = load_le32(r + 28);
    if (flags != 0 || (uint64_t)lex + lrk + lprops > record_length - RECORD_LENGTH_MIN) {
        return "bad record fields";
    }
    uint32_t crc = records_crc32c(0xFFFFFFFFu, r + 8, record_length - 4) ^ 0xFFFFFFFFu;
    if (crc != load_le32(r + 4)) {
        return "record checksum mismatch";
    }
    if (load_le64(r + 8) != expected) {
        return "record offset out of sequence";
    }
    *size = 4 + (size_t)record_length;
    return NULL;
}

const char check_records_doc[] = PyDoc_STR(
"check_records(data, position, first_offset, /) -> (end, next_offset, error)\n"
"\n"
"Check the whole records of `data` from `position` on (segment-log records back to\n"
"back, the first with offset `first_offset`): each record's length, flags, CRC32C and\n"
"offset in sequence. Returns where the checked records end and the offset after them,\n"
"and None, or a text saying what is wrong with the record at `end` (the records before\n"
"it are good). A partial record at the end is not checked and not an error.");

PyObject *
check_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "check_records() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    unsigned long long expected = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t length = view.len;
    const char *error = NULL;
    if (position < 0 || position > length) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the data");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    size_t size;
    while ((error = check_one_record(data + position, length - position, expected, &size)) ==
           NULL) {
        expected++;
        position += (Py_ssize_t)size;
    }
    if (error == RECORD_PARTIAL) {
        error = NULL; /* the end of the data, not damage */
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (error == NULL) {
        return Py_BuildValue("(nKO)", position, expected, Py_None);
    }
    return Py_BuildValue("(nKs)", position, expected, error);
}

const char scan_records_doc[] = PyDoc_STR(
"scan_records(data, position, first_offset, limit_offset, base_position,\n"
"             last_index_position, interval_bytes, last_timestamp_ms, /)\n"
"-> (end, next_offset, first_timestamp_ms, last_timestamp_ms, entries, stopped)\n"
"\n"
"Recovery's walk over a segment, one chunk per call: check the whole records of `data`\n"
"from `position` on as check_records does, the first with offset `first_offset`, and\n"
"also that timestamps never decrease (from `last_timestamp_ms`); stop before a record\n"
"with offset `limit_offset` or more. `base_position` is the segment position of\n"
"data[0]. Returns where the good records end, the offset after them, the first and last\n"
"timestamps met (-1 when none; `last_timestamp_ms` carried over), the sparse index\n"
"entries of the records that start an interval of `interval_bytes` after the previous\n"
"entry (at `last_index_position`) as (offset, segment position, timestamp) tuples, and\n"
"whether the walk stopped for good (a torn, corrupt or out-of-order record, or the\n"
"limit) rather than at the end of the data.");

PyObject *
scan_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "scan_records() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    unsigned long long expected = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long limit = PyLong_AsUnsignedLongLong(args[3]);
    long long base_position = PyLong_AsLongLong(args[4]);
    long long last_index = PyLong_AsLongLong(args[5]);
    long long interval = PyLong_AsLongLong(args[6]);
    long long last_ts = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *entries = PyList_New(0);
    if (entries == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t length = view.len;
    long long first_ts = -1;
    int stopped = 0;
    if (position < 0 || position > length) {
        PyErr_SetString(PyExc_ValueError, "position outside the data");
        goto fail;
    }
    while (1) {
        if (expected >= limit) {
            stopped = 1;
            break;
        }
        const unsigned char *r = data + position;
        size_t size;
        const char *error = check_one_record(r, length - position, expected, &size);
        long long ts = error == NULL ? (long long)load_le64(r + 16) : 0;
        if (error != NULL || ts < last_ts) {
            stopped = error != RECORD_PARTIAL; /* a partial record: the end of the data */
            break;
        }
        long long at = base_position + position;
        if (at - last_index >= interval) {
            PyObject *entry = Py_BuildValue("(KLL)", expected, at, ts);
            if (entry == NULL || PyList_Append(entries, entry) < 0) {
                Py_XDECREF(entry);
                goto fail;
            }
            Py_DECREF(entry);
            last_index = at;
        }
        if (first_ts < 0) {
            first_ts = ts;
        }
        last_ts = ts;
        expected++;
        position += (Py_ssize_t)size;
    }
    PyBuffer_Release(&view);
    PyObject *result = Py_BuildValue("(nKLLOO)", position, expected, first_ts, last_ts, entries,
                                     stopped ? Py_True : Py_False);
    Py_DECREF(entries);
    return result;
fail:
    Py_DECREF(entries);
    PyBuffer_Release(&view);
    return NULL;
}

const char resync_records_doc[] = PyDoc_STR(
"resync_records(data, position, file_bytes, min_offset, max_offset, last_timestamp_ms, /)\n"
"-> (found, offset, complete) | None\n"
"\n"
"Find where records start again after damage: the first position `found` at or after\n"
"`position` in `data` holding a record header whose length and fields are plausible,\n"
"whose offset lies in [min_offset, max_offset + (found - position) / 32] (each record\n"
"lost to the damage takes 32 bytes or more), whose timestamp is not below\n"
"`last_timestamp_ms`, and whose record ends within `file_bytes` (the bytes the file\n"
"holds from data[0] on). `complete` is True when the record is wholly in `data` and its\n"
"CRC32C matches; False when it runs past the end of `data` (read on from `found` to\n"
"check it). None when no position before the last 32 bytes of `data` qualifies.");

PyObject *
resync_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "resync_records() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    long long file_bytes = PyLong_AsLongLong(args[2]);
    unsigned long long min_offset = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long max_offset = PyLong_AsUnsignedLongLong(args[4]);
    long long last_ts = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t length = view.len;
    if (position < 0 || position > length || file_bytes < length) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position or file size outside the data");
        return NULL;
    }
    Py_ssize_t found = -1;
    int complete = 0;
    unsigned long long offset = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t q = position; q + RECORD_HEADER_BYTES <= length; q++) {
        const unsigned char *r = data + q;
        offset = load_le64(r + RECORD_OFFSET_AT);
        /* The cheap tests first: almost every position fails the offset range. */
        if (offset < min_offset || offset > max_offset + (unsigned long long)(q - position) / 32) {
            continue;
        }
        uint32_t record_length = load_le32(r);
        uint32_t lex = r[24], lrk = r[25], flags = (uint32_t)r[26] | (uint32_t)r[27] << 8;
        uint32_t lprops = load_le32(r + RECORD_PROPERTIES_LEN_AT);
        if (record_length < RECORD_LENGTH_MIN || flags != 0 ||
            (uint64_t)lex + lrk + lprops > record_length - RECORD_LENGTH_MIN ||
            (long long)q + 4 + (long long)record_length > file_bytes ||
            (long long)load_le64(r + RECORD_TIMESTAMP_AT) < last_ts) {
            continue;
        }
        if ((size_t)(length - q) < 4 + (size_t)record_length) {
            found = q; /* runs past the data: the caller reads on to check it */
            break;
        }
        uint32_t crc = records_crc32c(0xFFFFFFFFu, r + 8, record_length - 4) ^ 0xFFFFFFFFu;
        if (crc == load_le32(r + RECORD_CRC_AT)) {
            found = q;
            complete = 1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (found < 0) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(nKO)", found, offset, complete ? Py_True : Py_False);
}

static inline uint32_t
load_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

const char entry_crcs_doc[] = PyDoc_STR(
"entry_crcs(entries, /) -> bytes\n"
"\n"
"The CRC32C of each osiris chunk entry in `entries` (simple entries and sub-entry\n"
"batches back to back, each with its size or batch header), as big-endian u32s, in\n"
"order: the per-entry checksums of a version-2 chunk's trailer (docs/log-format.md).\n"
"ValueError when an entry crosses the end.");

PyObject *
entry_crcs(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_Format(PyExc_TypeError, "entry_crcs() takes 1 argument (%zd given)", nargs);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    size_t len = (size_t)view.len, at = 0, count = 0;
    /* First pass: count the entries and check their framing. */
    while (at < len) {
        size_t size;
        if (data[at] & 0x80) { /* batch: type, u16 records, u32 uncompressed, u32 length */
            if (len - at < 11) {
                goto crosses;
            }
            size = 11 + (size_t)load_be32(data + at + 7);
        }
        else {
            if (len - at < 4) {
                goto crosses;
            }
            size = 4 + (size_t)load_be32(data + at);
        }
        if (size > len - at) {
            goto crosses;
        }
        at += size;
        count += 1;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(count * 4));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *crcs = (unsigned char *)PyBytes_AS_STRING(out);
    at = 0;
    for (size_t i = 0; i < count; i++) {
        size_t size = (data[at] & 0x80) ? 11 + (size_t)load_be32(data + at + 7)
                                         : 4 + (size_t)load_be32(data + at);
        uint32_t crc = records_crc32c(0xFFFFFFFFu, data + at, size) ^ 0xFFFFFFFFu;
        crcs[4 * i] = (unsigned char)(crc >> 24);
        crcs[4 * i + 1] = (unsigned char)(crc >> 16);
        crcs[4 * i + 2] = (unsigned char)(crc >> 8);
        crcs[4 * i + 3] = (unsigned char)crc;
        at += size;
    }
    PyBuffer_Release(&view);
    return out;
crosses:
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "an entry crosses the end of the entries");
    return NULL;
}

/* streamq.log._streamwire, fourth unit: osiris chunks for stream-protocol consumers.
 *
 * `chunk_add` builds an osiris chunk's entries from version-1 segment records (each
 * record's CRC32C checked, the stream filter applied, an AMQP 0-9-1 record converted by a
 * call back into Python), and `crc32` is the chunk header's CRC32 (IEEE) of the entries.
 * The record and chunk layouts and the readers are in _streamwire_entries.h; the CRCs'
 * tables belong to the module's first unit (_streamwire.c), which this one calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_le.h"
#include "_streamwire_entries.h"

/* ---- Chunks ------------------------------------------------------------------------- */

/* Skip an AMQP 0-9-1 field value of `type` at p (avail bytes): its size, or -1. */
static Py_ssize_t
field_value_size(unsigned char type, const unsigned char *p, size_t avail)
{
    size_t size;
    switch (type) {
    case 't': case 'b': case 'B':
        size = 1;
        break;
    case 's': case 'u': case 'U':
        size = 2;
        break;
    case 'I': case 'i': case 'f':
        size = 4;
        break;
    case 'l': case 'L': case 'd': case 'T':
        size = 8;
        break;
    case 'D':
        size = 5;
        break;
    case 'V':
        size = 0;
        break;
    case 'S': case 'x': case 'F': case 'A':
        if (avail < 4) {
            return -1;
        }
        size = 4 + (size_t)load_be32(p);
        break;
    default:
        return -1;
    }
    return size <= avail ? (Py_ssize_t)size : -1;
}

/* The `x-stream-filter-value` header (a long string) of AMQP 0-9-1 properties in wire
 * encoding: 1 with *value and *len set, or 0 when there is none (or the properties do
 * not parse: the record then counts as unfiltered). */
static int
header_filter_value(const unsigned char *p, size_t n, const unsigned char **value, size_t *len)
{
    static const char KEY[] = "x-stream-filter-value";
    const size_t key_len = sizeof(KEY) - 1;
    if (n < 2) {
        return 0;
    }
    uint16_t flags = load_be16(p);
    size_t at = 2;
    for (uint16_t word = flags; word & 1;) { /* continuation flag words */
        if (n - at < 2) {
            return 0;
        }
        word = load_be16(p + at);
        at += 2;
    }
    for (int bit = 15; bit >= 14; bit--) { /* content-type, content-encoding: shortstr */
        if (flags & (1u << bit)) {
            if (n - at < 1 || n - at - 1 < p[at]) {
                return 0;
            }
            at += 1 + (size_t)p[at];
        }
    }
    if (!(flags & (1u << 13)) || n - at < 4) {
        return 0;
    }
    size_t table_len = load_be32(p + at);
    at += 4;
    if (n - at < table_len) {
        return 0;
    }
    const unsigned char *t = p + at, *end = t + table_len;
    while (end - t >= 2) {
        size_t name_len = t[0];
        if ((size_t)(end - t) < 2 + name_len) {
            return 0;
        }
        const unsigned char *name = t + 1;
        unsigned char type = t[1 + name_len];
        t += 2 + name_len;
        Py_ssize_t size = field_value_size(type, t, (size_t)(end - t));
        if (size < 0) {
            return 0;
        }
        if (type == 'S' && name_len == key_len && memcmp(name, KEY, key_len) == 0) {
            *value = t + 4;
            *len = (size_t)size - 4;
            return 1;
        }
        t += size;
    }
    return 0;
}

typedef struct {
    PyObject *values; /* a tuple of bytes, or NULL: no filter */
    int match_unfiltered;
} Filter;

static int
filter_accepts(const Filter *filter, const unsigned char *value, size_t len, int has_value)
{
    if (!has_value) {
        return filter->match_unfiltered;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(filter->values);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(filter->values, i);
        if ((size_t)PyBytes_GET_SIZE(v) == len && memcmp(PyBytes_AS_STRING(v), value, len) == 0) {
            return 1;
        }
    }
    return 0;
}

/* A record's parts, located by check_record. */
typedef struct {
    uint64_t offset;
    int64_t timestamp_ms;
    const unsigned char *exchange, *routing_key, *properties, *body;
    size_t exchange_len, routing_key_len, properties_len, body_len;
    size_t size;
} RecordView;

static const char RECORD_PARTIAL[] = "partial record";

static const char *
check_record(const unsigned char *r, size_t avail, uint64_t expected, RecordView *v)
{
    if (avail < RECORD_HEADER_BYTES) {
        return RECORD_PARTIAL;
    }
    uint32_t length = load_le32(r);
    if (length < RECORD_LENGTH_MIN) {
        return "bad record length";
    }
    if (avail - 4 < length) {
        return RECORD_PARTIAL;
    }
    size_t lex = r[24], lrk = r[25], lprops = load_le32(r + 28);
    if ((r[26] | r[27]) != 0 || (uint64_t)lex + lrk + lprops > length - RECORD_LENGTH_MIN) {
        return "bad record fields";
    }
    uint32_t crc = streamwire_crc32c(0xFFFFFFFFu, r + 8, length - 4) ^ 0xFFFFFFFFu;
    if (crc != load_le32(r + 4)) {
        return "record checksum mismatch";
    }
    v->offset = load_le64(r + 8);
    if (v->offset != expected) {
        return "record offset out of sequence";
    }
    v->timestamp_ms = (int64_t)load_le64(r + 16);
    v->exchange = r + RECORD_HEADER_BYTES;
    v->exchange_len = lex;
    v->routing_key = v->exchange + lex;
    v->routing_key_len = lrk;
    v->properties = v->routing_key + lrk;
    v->properties_len = lprops;
    v->body = v->properties + lprops;
    v->body_len = length - RECORD_LENGTH_MIN - lex - lrk - lprops;
    v->size = 4 + (size_t)length;
    return NULL;
}

static inline int
is_native(const RecordView *v)
{
    return v->properties_len == NATIVE_PROPERTIES_BYTES &&
           memcmp(v->properties, NATIVE_MARK, 2) == 0;
}

/* Append one entry (`u32 size | message`) to `out`; -1 with an exception set. */
static int
append_entry(PyObject *out, const unsigned char *message, size_t len)
{
    Py_ssize_t old = PyByteArray_GET_SIZE(out);
    if (len > ENTRY_SIZE_MAX) {
        PyErr_SetString(PyExc_OverflowError, "message too large for a chunk entry");
        return -1;
    }
    if (PyByteArray_Resize(out, old + ENTRY_SIZE_BYTES + (Py_ssize_t)len) < 0) {
        return -1;
    }
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(out) + old;
    store_be32(w, (uint32_t)len);
    memcpy(w + ENTRY_SIZE_BYTES, message, len);
    return 0;
}

/* The AMQP 1.0 message of a 0-9-1 record, from `convert`; NULL with an exception set. */
static PyObject *
convert_record(PyObject *convert, const RecordView *v)
{
    PyObject *parts[4] = {
        PyBytes_FromStringAndSize((const char *)v->exchange, (Py_ssize_t)v->exchange_len),
        PyBytes_FromStringAndSize((const char *)v->routing_key, (Py_ssize_t)v->routing_key_len),
        PyBytes_FromStringAndSize((const char *)v->properties, (Py_ssize_t)v->properties_len),
        PyBytes_FromStringAndSize((const char *)v->body, (Py_ssize_t)v->body_len),
    };
    PyObject *message = NULL;
    if (parts[0] && parts[1] && parts[2] && parts[3]) {
        message = PyObject_Vectorcall(convert, parts, 4, NULL);
        if (message != NULL && !PyBytes_Check(message)) {
            PyErr_Format(PyExc_TypeError, "convert must return bytes, not %.200s",
                         Py_TYPE(message)->tp_name);
            Py_CLEAR(message);
        }
    }
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(parts[i]);
    }
    return message;
}

/* What chunk_add carries between calls (the Python side passes it back in). */
typedef struct {
    Py_ssize_t records;
    long long first_offset; /* -1: no entry yet */
    long long timestamp_ms;
    int closed; /* a filtered-out record followed the entries: take no more */
} ChunkState;

/* Add the record `v` to the chunk if the filter takes it. Returns 1 to go on, 0 to stop
 * before it (the chunk is full or closed), -1 with an exception set. */
static int
chunk_take(PyObject *out, const RecordView *v, ChunkState *s, const Filter *filter,
           PyObject *convert, Py_ssize_t records_max, Py_ssize_t bytes_max)
{
    int native = is_native(v);
    if (filter->values != NULL) {
        const unsigned char *value = v->routing_key;
        size_t len = v->routing_key_len;
        int has = native ? len > 0 : header_filter_value(v->properties, v->properties_len,
                                                         &value, &len);
        if (!filter_accepts(filter, value, len, has)) {
            if (s->records > 0) {
                s->closed = 1; /* a chunk holds contiguous offsets only */
            }
            return 1; /* passed over */
        }
    }
    if (s->closed || s->records >= records_max) {
        return 0;
    }
    Py_ssize_t data_len = PyByteArray_GET_SIZE(out) - CHUNK_HEADER_BYTES;
    if (native) {
        if (s->records > 0 && (Py_ssize_t)(ENTRY_SIZE_BYTES + v->body_len) > bytes_max - data_len) {
            return 0;
        }
        if (append_entry(out, v->body, v->body_len) < 0) {
            return -1;
        }
    }
    else {
        PyObject *message = convert_record(convert, v);
        if (message == NULL) {
            return -1;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(message);
        int fits = s->records == 0 || ENTRY_SIZE_BYTES + len <= bytes_max - data_len;
        int rc = fits ? append_entry(out, (const unsigned char *)PyBytes_AS_STRING(message),
                                     (size_t)len)
                      : 0;
        Py_DECREF(message);
        if (rc < 0 || !fits) {
            return rc < 0 ? -1 : 0;
        }
    }
    if (s->records++ == 0) {
        s->first_offset = (long long)v->offset;
        s->timestamp_ms = v->timestamp_ms;
    }
    return 1;
}

const char chunk_add_doc[] = PyDoc_STR(
"chunk_add(out, data, position, expected_offset, skip_before, offset_end, records_max,\n"
"          bytes_max, convert, values, match_unfiltered, records, first_offset,\n"
"          timestamp_ms, closed, /)\n"
"-> (position, next_offset, records, first_offset, timestamp_ms, closed, full)\n"
"\n"
"Append to the chunk being built in `out` (a bytearray whose first 48 bytes are the\n"
"header's room) the entries of the records in `data` from `position` on, the first with\n"
"offset `expected_offset`: each record's length, CRC32C and offset are checked. Records\n"
"below `skip_before` are passed over, and so are records the filter refuses (`values`: a\n"
"tuple of bytes, or None for no filter; a native record's filter value is its routing\n"
"key, a 0-9-1 record's its `x-stream-filter-value` header; `match_unfiltered` takes\n"
"records without one). A native record's entry is its body; a 0-9-1 record's is\n"
"`convert(exchange, routing_key, properties, body)`. Stops before offset `offset_end`,\n"
"at `records_max` entries, before an entry that would take the entries past `bytes_max`\n"
"bytes (the first always goes in), before a taken record after a refused one (a chunk\n"
"holds contiguous offsets), or at the end of the whole records of `data`. The state\n"
"(`records`, `first_offset` (-1: none), `timestamp_ms`, `closed`) goes from one call to\n"
"the next. Returns where it stopped, the offset of the record there, the state, and\n"
"whether the chunk is done. Raises ValueError naming damage at the returned position.");

PyObject *
chunk_add(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 15) {
        PyErr_Format(PyExc_TypeError, "chunk_add() takes 15 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *out = args[0], *convert = args[8];
    Py_ssize_t position = PyLong_AsSsize_t(args[2]);
    unsigned long long expected = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long skip_before = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long offset_end = PyLong_AsUnsignedLongLong(args[5]);
    Py_ssize_t records_max = PyLong_AsSsize_t(args[6]);
    Py_ssize_t bytes_max = PyLong_AsSsize_t(args[7]);
    ChunkState s = {
        .records = PyLong_AsSsize_t(args[11]),
        .first_offset = PyLong_AsLongLong(args[12]),
        .timestamp_ms = PyLong_AsLongLong(args[13]),
        .closed = PyObject_IsTrue(args[14]),
    };
    Filter filter = {.values = args[9] == Py_None ? NULL : args[9],
                     .match_unfiltered = PyObject_IsTrue(args[10])};
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!PyByteArray_Check(out) || PyByteArray_GET_SIZE(out) < CHUNK_HEADER_BYTES) {
        PyErr_SetString(PyExc_TypeError, "out must be a bytearray of at least 48 bytes");
        return NULL;
    }
    if (filter.values != NULL) {
        if (!PyTuple_Check(filter.values)) {
            PyErr_SetString(PyExc_TypeError, "values must be a tuple of bytes or None");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(filter.values); i++) {
            if (!PyBytes_Check(PyTuple_GET_ITEM(filter.values, i))) {
                PyErr_SetString(PyExc_TypeError, "values must be a tuple of bytes or None");
                return NULL;
            }
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *data = view.buf;
    size_t length = (size_t)view.len;
    if (position < 0 || (size_t)position > length) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the data");
        return NULL;
    }
    int full = 0;
    while (expected < offset_end) {
        RecordView v;
        const char *error = check_record(data + position, length - (size_t)position, expected, &v);
        if (error == RECORD_PARTIAL) {
            break;
        }
        if (error != NULL) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "%s at position %zd", error, position);
            return NULL;
        }
        int rc = 1;
        if (v.offset >= skip_before) {
            rc = chunk_take(out, &v, &s, &filter, convert, records_max, bytes_max);
        }
        if (rc < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (rc == 0) {
            full = 1;
            break;
        }
        position += (Py_ssize_t)v.size;
        expected++;
    }
    if (expected >= offset_end) {
        full = 1;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nKnLLOO)", position, expected, s.records, s.first_offset,
                         s.timestamp_ms, s.closed ? Py_True : Py_False,
                         full ? Py_True : Py_False);
}

const char crc32_doc[] = PyDoc_STR(
"crc32(data, start, /) -> int\n\n"
"zlib.crc32(data[start:]), for a chunk's entries: folded with PCLMULQDQ where the CPU\n"
"has it (see _crc32.h).");

PyObject *
crc32_of(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "crc32 takes data and start");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start out of the data");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf + start;
    size_t n = (size_t)(view.len - start);
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = streamwire_crc32(0, p, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* streamq.log._streamwire, second unit: a stored chunk's entries as version-1 records.
 *
 * AMQP 0-9-1 consumers of a version-2 stream take a chunk the way they take a version-1
 * segment: as records back to back that `_deliver.deliver_stream_records` frames in one C
 * call (streamq/log/chunk_runs.py). This unit writes those records straight from the
 * chunk's entries, one per message: offset and timestamp from the chunk, the entry's
 * filter value as the routing key, a native record's properties (publishing id 0) and
 * the message as the body, as `chunk_segment.chunk_records` + `chunk_runs.chunk_run`
 * do in Python (the reference: tests/unit/log/test_chunk_run_c.py compares the two).
 *
 * The entries are bytes read from disk: every size is checked against the entries' end
 * before it is used, and framing the Python reader refuses (`chunk.iter_entries`,
 * `batches.messages`) raises ValueError here; nothing is written until the whole chunk
 * has been checked (a first pass sizes the output). A compressed sub-entry batch, or a
 * filter value too long for a routing key, is not done here (None: the caller takes the
 * Python path). No I/O, no state, no Python call while walking.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_streamwire_entries.h"

const char chunk_run_records_doc[] = PyDoc_STR(
"chunk_run_records(data, entries_at, data_length, num_entries, first_offset, num_records,\n"
"                  timestamp_ms, filter_runs, /) -> tuple[bytes, bytes] | None\n"
"\n"
"The records of a chunk whose entries are `data[entries_at:entries_at + data_length]`\n"
"(`num_entries` entries holding `num_records` records from `first_offset`, as the chunk\n"
"header says), as version-1 records back to back: each message's record has the chunk's\n"
"`timestamp_ms`, an empty exchange, its entry's filter value as the routing key (from\n"
"`filter_runs`: (first entry, entries, value) tuples, a later run winning, as\n"
"frame.filter_value_list), a native record's properties (publishing id 0) and the\n"
"message as the body. Returns (records, positions): positions are each record's start,\n"
"native i64s (array('q').frombytes). None when an entry is a compressed sub-entry batch\n"
"or a filter value is over 255 bytes (the Python path's). Raises ValueError when the\n"
"entries do not fill data_length exactly, their or their records' count is not the\n"
"header's, or a batch is malformed (reserved bits, unknown compression, no records, its\n"
"messages not filling it exactly).");

#define RUN_NARGS 8
#define SPANS_NARGS 6
#define PLAN_NO_RUN ((const char *)1) /* plan_run: no run here (the Python path's) */

static inline void
put_le16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void
put_le32(unsigned char *p, uint32_t v)
{
    put_le16(p, (uint16_t)v);
    put_le16(p + 2, (uint16_t)(v >> 16));
}

static inline void
put_le64(unsigned char *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

/* One entry's filter value (len 0: none). */
typedef struct {
    const unsigned char *value;
    size_t len;
} EntryValue;

/* The chunk's entries and what its header says of them. */
typedef struct {
    const unsigned char *entries;
    size_t data_length;
    size_t num_entries;
    uint64_t num_records;
    uint64_t first_offset;
    int64_t timestamp_ms;
    const EntryValue *values; /* num_entries of them */
} ChunkEntries;

/* Where the walk writes (out == NULL: the sizing pass, which only counts; spans != NULL:
 * each message's start and end in the caller's buffer instead of records). */
typedef struct {
    unsigned char *out;
    int64_t *positions;
    size_t bytes;     /* the records' bytes so far */
    uint64_t records; /* records so far */
    int64_t *spans;   /* chunk_message_spans: 2 per record, up to spans_max records */
    uint64_t spans_max;
    const unsigned char *base; /* what the spans count from */
} RunOut;

/* One message's record at out->out + out->bytes (or only counted). */
static const char *
put_record(RunOut *out, const ChunkEntries *c, const EntryValue *key,
           const unsigned char *message, size_t len)
{
    if (out->spans != NULL) {
        /* Past the header's count only counted: walk_entries refuses that count at the end,
         * after a compressed batch further on has had its say, as chunk_run_records. */
        if (out->records < out->spans_max) {
            out->spans[2 * out->records] = (int64_t)(message - out->base);
            out->spans[2 * out->records + 1] = (int64_t)(message + len - out->base);
        }
        out->records += 1;
        return NULL;
    }
    size_t size = RECORD_HEADER_BYTES + key->len + NATIVE_PROPERTIES_BYTES + len;
    if (size - 4 > U32_MAX || out->bytes > (size_t)PY_SSIZE_T_MAX - size) {
        return "the chunk's records would not fit a bytes object";
    }
    if (out->out != NULL) {
        unsigned char *r = out->out + out->bytes;
        put_le32(r, (uint32_t)(size - 4));
        put_le64(r + 8, c->first_offset + out->records);
        put_le64(r + 16, (uint64_t)c->timestamp_ms); /* two's complement i64 */
        r[24] = 0;                                    /* exchange: none */
        r[25] = (unsigned char)key->len;
        put_le16(r + 26, 0);
        put_le32(r + 28, NATIVE_PROPERTIES_BYTES);
        unsigned char *w = r + RECORD_HEADER_BYTES;
        if (key->len) {
            memcpy(w, key->value, key->len);
            w += key->len;
        }
        memcpy(w, NATIVE_MARK, sizeof NATIVE_MARK);
        memset(w + sizeof NATIVE_MARK, 0, NATIVE_PROPERTIES_BYTES - sizeof NATIVE_MARK);
        w += NATIVE_PROPERTIES_BYTES;
        memcpy(w, message, len);
        uint32_t crc = streamwire_crc32c(0xFFFFFFFFu, r + 8, size - 8) ^ 0xFFFFFFFFu;
        put_le32(r + 4, crc);
        out->positions[out->records] = (int64_t)out->bytes;
    }
    out->bytes += size;
    out->records += 1;
    return NULL;
}

/* The messages of an uncompressed batch body (`u32 size | message` each), which must be
 * exactly `records` of them filling `len` bytes. */
static const char *
put_batch(RunOut *out, const ChunkEntries *c, const EntryValue *key, const unsigned char *body,
          size_t len, uint32_t records)
{
    size_t at = 0;
    for (uint32_t i = 0; i < records; i++) {
        if (len - at < ENTRY_SIZE_BYTES) {
            return "a sub-entry batch's message crosses its end";
        }
        size_t size = load_be32(body + at);
        at += ENTRY_SIZE_BYTES;
        if (size > len - at) {
            return "a sub-entry batch's message crosses its end";
        }
        const char *error = put_record(out, c, key, body + at, size);
        if (error != NULL) {
            return error;
        }
        at += size;
    }
    return at == len ? NULL : "a sub-entry batch holds more than its record count";
}

/* One entry at `at` (before `end`): its records, and where the next entry starts. */
static const char *
put_entry(RunOut *out, const ChunkEntries *c, const EntryValue *key, size_t *at)
{
    const unsigned char *p = c->entries + *at;
    size_t left = c->data_length - *at;
    if (left < ENTRY_SIZE_BYTES) {
        return "an entry header crosses the end of the entries";
    }
    if (!(p[0] & BATCH_FLAG)) {
        size_t size = load_be32(p);
        if (size > left - ENTRY_SIZE_BYTES) {
            return "a simple entry crosses the end of the entries";
        }
        *at += ENTRY_SIZE_BYTES + size;
        return put_record(out, c, key, p + ENTRY_SIZE_BYTES, size);
    }
    if (left < BATCH_HEADER_BYTES) {
        return "a sub-entry batch header crosses the end of the entries";
    }
    if (p[0] & BATCH_RESERVED_MASK) {
        return "a sub-entry batch's type byte has reserved bits set";
    }
    unsigned compression = (p[0] & ~BATCH_FLAG) >> BATCH_COMPRESSION_SHIFT;
    if (compression > BATCH_COMPRESSION_MAX) {
        return "unknown sub-entry batch compression";
    }
    uint16_t records = load_be16(p + 1);
    size_t length = load_be32(p + 7); /* p + 3: the uncompressed length, unused when none */
    if (records == 0) {
        return "a sub-entry batch of 0 records";
    }
    if (length > left - BATCH_HEADER_BYTES) {
        return "a sub-entry batch crosses the end of the entries";
    }
    if (compression != BATCH_COMPRESSION_NONE) {
        return PLAN_NO_RUN;
    }
    *at += BATCH_HEADER_BYTES + length;
    return put_batch(out, c, key, p + BATCH_HEADER_BYTES, length, records);
}

/* Walk every entry (sizing or writing, as `out` says); NULL when the chunk is sound,
 * PLAN_NO_RUN when it has no run, else what is wrong. */
static const char *
walk_entries(RunOut *out, const ChunkEntries *c)
{
    size_t at = 0, entries = 0;
    while (at < c->data_length) {
        if (entries == c->num_entries) {
            return "more entries than the chunk header's";
        }
        const char *error = put_entry(out, c, &c->values[entries], &at);
        if (error != NULL) {
            return error;
        }
        entries += 1;
    }
    if (entries != c->num_entries || out->records != c->num_records) {
        return "the entries or their records are not the chunk header's count";
    }
    return NULL;
}

/* Each entry's filter value from the runs, a later run winning (frame.filter_value_list);
 * -1 with an exception set, 1 when a value is too long for a routing key, else 0. */
static int
entry_values(PyObject *runs, EntryValue *values, size_t num_entries)
{
    if (!PyList_Check(runs)) {
        PyErr_SetString(PyExc_TypeError, "filter_runs must be a list");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(runs); i++) {
        PyObject *run = PyList_GET_ITEM(runs, i);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 3 ||
            !PyBytes_Check(PyTuple_GET_ITEM(run, 2))) {
            PyErr_SetString(PyExc_TypeError, "a filter run is (first, entries, bytes)");
            return -1;
        }
        Py_ssize_t first = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 0));
        Py_ssize_t count = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 1));
        if ((first == -1 || count == -1) && PyErr_Occurred()) {
            return -1;
        }
        if (first < 0 || count < 0) {
            PyErr_SetString(PyExc_ValueError, "a filter run's first entry or count is negative");
            return -1;
        }
        if ((size_t)first >= num_entries) {
            continue; /* past the last entry: no entry's value */
        }
        PyObject *value = PyTuple_GET_ITEM(run, 2);
        size_t end = (size_t)count > num_entries - (size_t)first ? num_entries
                                                                 : (size_t)first + (size_t)count;
        for (size_t e = (size_t)first; e < end; e++) {
            values[e].value = (const unsigned char *)PyBytes_AS_STRING(value);
            values[e].len = (size_t)PyBytes_GET_SIZE(value);
        }
    }
    for (size_t e = 0; e < num_entries; e++) {
        if (values[e].len > SHORTSTR_BYTES_MAX) {
            return 1;
        }
    }
    return 0;
}

/* The records of the walked chunk, written: (records, positions). */
static PyObject *
write_run(const ChunkEntries *c, const RunOut *sized)
{
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sized->bytes);
    PyObject *positions = PyBytes_FromStringAndSize(
        NULL, (Py_ssize_t)(sized->records * sizeof(int64_t)));
    if (data == NULL || positions == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(positions);
        return NULL;
    }
    RunOut out = {(unsigned char *)PyBytes_AS_STRING(data),
                  (int64_t *)(void *)PyBytes_AS_STRING(positions), 0, 0, NULL, 0, NULL};
    (void)walk_entries(&out, c); /* the sizing pass checked every entry */
    return Py_BuildValue("(NN)", data, positions);
}

/* The arguments both functions share (data, entries_at, data_length, num_entries,
 * first_offset, num_records): `c` filled, `view` held and `*values` allocated (zeroed: no
 * filter value) on 0; -1 with an exception set and nothing held. */
static int
open_entries(const char *name, int nargs_wanted, PyObject *const *args, Py_ssize_t nargs,
             ChunkEntries *c, Py_buffer *view, EntryValue **values)
{
    if (nargs != nargs_wanted) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d arguments (%zd given)", name,
                     nargs_wanted, nargs);
        return -1;
    }
    Py_ssize_t entries_at = PyLong_AsSsize_t(args[1]);
    Py_ssize_t data_length = PyLong_AsSsize_t(args[2]);
    Py_ssize_t num_entries = PyLong_AsSsize_t(args[3]);
    c->first_offset = PyLong_AsUnsignedLongLong(args[4]);
    c->num_records = PyLong_AsUnsignedLongLong(args[5]);
    c->timestamp_ms = 0; /* chunk_run_records reads its args[6] */
    if (PyErr_Occurred()) {
        return -1;
    }
    if (entries_at < 0 || data_length < 0 || num_entries <= 0) {
        PyErr_Format(PyExc_ValueError, "%s(): negative position or length, or no entries",
                     name);
        return -1;
    }
    if (c->num_records > UINT64_MAX - c->first_offset) {
        PyErr_SetString(PyExc_ValueError, "the chunk's offsets pass a u64");
        return -1;
    }
    c->data_length = (size_t)data_length;
    c->num_entries = (size_t)num_entries;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (entries_at > view->len || c->data_length > (size_t)(view->len - entries_at)) {
        PyErr_SetString(PyExc_ValueError, "the buffer ends inside the chunk's entries");
        PyBuffer_Release(view);
        return -1;
    }
    c->entries = (const unsigned char *)view->buf + entries_at;
    *values = PyMem_Calloc(c->num_entries, sizeof(EntryValue));
    if (*values == NULL) {
        PyErr_NoMemory();
        PyBuffer_Release(view);
        return -1;
    }
    c->values = *values;
    return 0;
}

PyObject *
chunk_run_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    ChunkEntries c;
    Py_buffer view;
    EntryValue *values;
    if (open_entries("chunk_run_records", RUN_NARGS, args, nargs, &c, &view, &values) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    c.timestamp_ms = PyLong_AsLongLong(args[6]);
    if (c.timestamp_ms == -1 && PyErr_Occurred()) {
        goto done;
    }
    int long_value = entry_values(args[7], values, c.num_entries);
    if (long_value < 0) {
        goto done;
    }
    RunOut sized = {NULL, NULL, 0, 0, NULL, 0, NULL};
    const char *error = long_value ? PLAN_NO_RUN : walk_entries(&sized, &c);
    if (error == PLAN_NO_RUN) {
        result = Py_NewRef(Py_None);
    }
    else if (error != NULL) {
        PyErr_Format(PyExc_ValueError, "chunk at offset %llu: %s",
                     (unsigned long long)c.first_offset, error);
    }
    else {
        result = write_run(&c, &sized);
    }
done:
    PyMem_Free(values);
    PyBuffer_Release(&view);
    return result;
}

const char chunk_message_spans_doc[] = PyDoc_STR(
"chunk_message_spans(data, entries_at, data_length, num_entries, first_offset,\n"
"                    num_records, /) -> bytes | None\n"
"\n"
"Where each message of the chunk whose entries are `data[entries_at:entries_at +\n"
"data_length]` is in `data`: native i64 (start, end) pairs, one per record in offset\n"
"order (np.frombuffer(..., np.int64).reshape(-1, 2)), checked as chunk_run_records\n"
"checks the entries. None when an entry is a compressed sub-entry batch. Raises\n"
"ValueError as chunk_run_records does.");

PyObject *
chunk_message_spans(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    ChunkEntries c;
    Py_buffer view;
    EntryValue *values; /* all empty: the spans do not look at filter values */
    if (open_entries("chunk_message_spans", SPANS_NARGS, args, nargs, &c, &view, &values) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    /* Every record takes at least a 4-byte size in the entries: a header that says more
     * is refused by the walk (which counts them all), and gets no room past that. */
    uint64_t room = c.data_length / ENTRY_SIZE_BYTES;
    uint64_t spans_max = c.num_records < room ? c.num_records : room;
    PyObject *spans = PyBytes_FromStringAndSize(
        NULL, (Py_ssize_t)(spans_max * 2 * sizeof(int64_t)));
    if (spans == NULL) {
        goto done;
    }
    RunOut out = {NULL, NULL, 0, 0, (int64_t *)(void *)PyBytes_AS_STRING(spans), spans_max,
                  (const unsigned char *)view.buf};
    const char *error = walk_entries(&out, &c);
    if (error == NULL) {
        result = spans;
    }
    else {
        Py_DECREF(spans);
        if (error == PLAN_NO_RUN) {
            result = Py_NewRef(Py_None);
        }
        else {
            PyErr_Format(PyExc_ValueError, "chunk at offset %llu: %s",
                         (unsigned long long)c.first_offset, error);
        }
    }
done:
    PyMem_Free(values);
    PyBuffer_Release(&view);
    return result;
}

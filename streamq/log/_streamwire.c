/* streamq.log._streamwire: the stream protocol's hot paths over the segment log, in C.
 *
 * See MODULE_DOC below for what this module owns and why it is C. The records it writes
 * are those of docs/log-format.md ("Record", and "Stream-native records"); the chunks it
 * builds are osiris chunks as RabbitMQ's stream protocol delivers them
 * (docs/stream-protocol.md, "Consuming: offsets, credit and chunks").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_crc32.h"
#include "_crc32c.h"
#include "_streamwire_entries.h"

PyDoc_STRVAR(MODULE_DOC,
"The stream protocol's per-message work on the segment log, in C.\n"
"\n"
"This module owns three steps of the stream protocol's hot paths (STYLE.md section 11):\n"
"parsing a Publish frame's messages straight into stream-native log records (with\n"
"deduplication by publishing id), listing the sparse index entries due in such a run of\n"
"encoded records, and building an osiris chunk's entries from segment bytes (with the\n"
"stream filter). No Python object is made per message, except for the conversion of an\n"
"AMQP 0-9-1 record, which calls back into Python.\n"
"\n"
"It must not do I/O, keep state between calls, or decide where records go: SegmentLog\n"
"places the records and StreamQueue reads the segment bytes.\n"
"\n"
"Why C: a Python loop over a Publish frame's messages makes about 0.6 M messages/s\n"
"(struct.unpack_from, a record encode and a CRC each), far below the protocol's rates;\n"
"see benchmarks/stream_store_bench.py for this module's numbers.\n");

/* The record and chunk layouts, and the big-endian readers: _streamwire_entries.h. */

/* _crc32c.h's CRC32C for the module's other unit (its tables are this unit's). */
uint32_t
streamwire_crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
    return crc32c_update(crc, p, n);
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

/* ---- Publish ------------------------------------------------------------------------ */

/* One message of a Publish frame, as parsed: where its parts are in the payload. */
typedef struct {
    uint64_t id;
    const unsigned char *filter; /* NULL: none */
    size_t filter_len;
    const unsigned char *body; /* a simple entry's message, or a sub-entry batch's data */
    size_t body_len;
    uint32_t batch_count; /* 0: a simple entry; else the messages of an uncompressed batch */
} PublishedMessage;

/* Parse the message at `p` (with `avail` bytes); NULL with its size in *size and its
 * parts in *m, or a text naming what is wrong. */
static const char *
parse_message(const unsigned char *p, size_t avail, int version, PublishedMessage *m,
              size_t *size, size_t filter_max)
{
    size_t at = 8;
    if (avail < at) {
        return "truncated publishing id";
    }
    m->id = load_be64(p);
    m->filter = NULL;
    m->filter_len = 0;
    if (version >= 2) {
        if (avail < at + 2) {
            return "truncated filter value";
        }
        int16_t len = (int16_t)load_be16(p + at);
        at += 2;
        if (len < -1) {
            return "negative filter value length";
        }
        if (len >= 0) {
            if ((size_t)len > filter_max) {
                return "filter value longer than 255 bytes";
            }
            if (avail - at < (size_t)len) {
                return "truncated filter value";
            }
            m->filter = p + at;
            m->filter_len = (size_t)len;
            at += (size_t)len;
        }
    }
    if (avail - at < 1) {
        return "truncated message";
    }
    m->batch_count = 0;
    if ((p[at] & 0x80) == 0) {
        if (avail - at < 4) {
            return "truncated message size";
        }
        m->body_len = load_be32(p + at);
        at += 4;
        if (avail - at < m->body_len) {
            return "truncated message";
        }
        m->body = p + at;
        *size = at + m->body_len;
        return NULL;
    }
    /* A sub-entry batch: type byte, u16 count, u32 uncompressed and data length, data. */
    if (avail - at < 11) {
        return "truncated sub-entry batch";
    }
    unsigned compression = (p[at] >> 4) & 0x7;
    uint16_t count = load_be16(p + at + 1);
    uint32_t data_len = load_be32(p + at + 7);
    at += 11;
    if (compression != 0) {
        return "compressed sub-entry batches are not supported";
    }
    if (avail - at < data_len) {
        return "truncated sub-entry batch";
    }
    /* Uncompressed: count messages `u32 size | bytes` filling the data exactly. */
    const unsigned char *q = p + at;
    size_t left = data_len;
    for (uint16_t i = 0; i < count; i++) {
        if (left < 4 || left - 4 < load_be32(q)) {
            return "sub-entry batch does not hold its messages";
        }
        size_t n = 4 + (size_t)load_be32(q);
        q += n;
        left -= n;
    }
    if (left != 0 || count == 0) {
        return "sub-entry batch does not hold its messages";
    }
    m->body = p + at;
    m->body_len = data_len;
    m->batch_count = count;
    *size = at + data_len;
    return NULL;
}

/* Write one native record at `out`; returns its size. */
static size_t
write_native(unsigned char *out, uint64_t offset, int64_t timestamp_ms,
             const unsigned char *reference, size_t reference_len, const PublishedMessage *m,
             const unsigned char *body, size_t body_len)
{
    size_t size = RECORD_HEADER_BYTES + reference_len + m->filter_len + NATIVE_PROPERTIES_BYTES +
                  body_len;
    store_le32(out + 0, (uint32_t)(size - 4));
    store_le64(out + 8, offset);
    store_le64(out + 16, (uint64_t)timestamp_ms);
    out[24] = (unsigned char)reference_len;
    out[25] = (unsigned char)m->filter_len;
    store_le16(out + 26, 0);
    store_le32(out + 28, NATIVE_PROPERTIES_BYTES);
    unsigned char *w = out + RECORD_HEADER_BYTES;
    memcpy(w, reference, reference_len);
    w += reference_len;
    if (m->filter_len) {
        memcpy(w, m->filter, m->filter_len);
        w += m->filter_len;
    }
    memcpy(w, NATIVE_MARK, 2);
    store_le64(w + 2, m->id);
    w += NATIVE_PROPERTIES_BYTES;
    memcpy(w, body, body_len);
    uint32_t crc = crc32c_update(0xFFFFFFFFu, out + 8, size - 8) ^ 0xFFFFFFFFu;
    store_le32(out + 4, crc);
    return size;
}

/* The largest message body of `m` (a batch's messages were checked by parse_message). */
static size_t
largest_body(const PublishedMessage *m)
{
    if (m->batch_count == 0) {
        return m->body_len;
    }
    size_t largest = 0;
    const unsigned char *q = m->body;
    for (uint32_t k = 0; k < m->batch_count; k++) {
        size_t n = load_be32(q);
        largest = n > largest ? n : largest;
        q += 4 + n;
    }
    return largest;
}

typedef struct {
    const unsigned char *payload;
    size_t payload_len;
    int version;
    const unsigned char *reference;
    size_t reference_len;
    uint64_t sequence;
    int has_sequence; /* 0: the reference stored nothing yet, every id is new */
    uint64_t record_bytes_max;
    uint32_t count;
    uint64_t records;      /* native records to write */
    uint64_t record_bytes; /* their total size */
} PublishPlan;

/* Pass 1: validate the whole payload and size what pass 2 writes; NULL or what is wrong. */
static const char *
plan_publish(PublishPlan *plan)
{
    if (plan->payload_len < 4) {
        return "truncated message count";
    }
    uint32_t count = load_be32(plan->payload);
    if (count > 0x7FFFFFFFu) {
        return "negative message count";
    }
    plan->count = count;
    const unsigned char *p = plan->payload + 4;
    size_t left = plan->payload_len - 4;
    uint64_t sequence = plan->sequence;
    int seen = plan->has_sequence;
    int dedup = plan->reference_len > 0;
    uint64_t head = RECORD_HEADER_BYTES + plan->reference_len + NATIVE_PROPERTIES_BYTES;
    for (uint32_t i = 0; i < count; i++) {
        PublishedMessage m;
        size_t size;
        const char *error = parse_message(p, left, plan->version, &m, &size, SHORTSTR_BYTES_MAX);
        if (error != NULL) {
            return error;
        }
        p += size;
        left -= size;
        if (dedup) {
            if (seen && m.id <= sequence) {
                continue; /* a duplicate: confirmed, not stored */
            }
            sequence = m.id;
            seen = 1;
        }
        uint32_t n = m.batch_count ? m.batch_count : 1;
        /* A batch's messages each take a 4-byte size in its data and a record header here. */
        uint64_t bodies = m.batch_count ? m.body_len - 4 * (uint64_t)n : m.body_len;
        if (head + m.filter_len + largest_body(&m) > plan->record_bytes_max) {
            return "message larger than the log's record size limit";
        }
        plan->records += n;
        plan->record_bytes += n * (head + m.filter_len) + bodies;
    }
    if (left != 0) {
        return "bytes after the last message";
    }
    return NULL;
}

/* Pass 2: write the records planned; `ids` gets the count publishing ids (big-endian). */
static void
write_publish(const PublishPlan *plan, unsigned char *out, unsigned char *ids,
              uint64_t first_offset, int64_t timestamp_ms)
{
    const unsigned char *p = plan->payload + 4;
    size_t left = plan->payload_len - 4;
    uint64_t sequence = plan->sequence;
    int seen = plan->has_sequence;
    int dedup = plan->reference_len > 0;
    uint64_t offset = first_offset;
    for (uint32_t i = 0; i < plan->count; i++) {
        PublishedMessage m;
        size_t size;
        (void)parse_message(p, left, plan->version, &m, &size, SHORTSTR_BYTES_MAX); /* checked */
        p += size;
        left -= size;
        store_be64(ids + 8 * (size_t)i, m.id);
        if (dedup) {
            if (seen && m.id <= sequence) {
                continue;
            }
            sequence = m.id;
            seen = 1;
        }
        if (m.batch_count == 0) {
            out += write_native(out, offset++, timestamp_ms, plan->reference, plan->reference_len,
                                &m, m.body, m.body_len);
            continue;
        }
        const unsigned char *q = m.body;
        for (uint32_t k = 0; k < m.batch_count; k++) {
            size_t n = load_be32(q);
            out += write_native(out, offset++, timestamp_ms, plan->reference, plan->reference_len,
                                &m, q + 4, n);
            q += 4 + n;
        }
    }
}

PyDoc_STRVAR(encode_publish_doc,
"encode_publish(version, payload, first_offset, timestamp_ms, reference, sequence,\n"
"               record_bytes_max, /) -> (records, count, appended, ids, sequence)\n"
"\n"
"Parse a Publish frame's messages (`payload`: from its message count on) and encode the\n"
"ones to store as native records with offsets from `first_offset`, all with\n"
"`timestamp_ms`. With a non-empty `reference`, a message whose publishing id is not above\n"
"`sequence` (then the highest id seen so far) is a duplicate and not stored; a `sequence`\n"
"of -1 means none stored yet (every id is new, 0 included). Returns the records back to\n"
"back, the frame's message count, the records written, the count publishing ids (u64\n"
"big-endian each, in frame order) and the new sequence (-1 while still none). Raises\n"
"ValueError, encoding nothing, for a malformed payload.");

static PyObject *
encode_publish(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "encode_publish() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    long version = PyLong_AsLong(args[0]);
    unsigned long long first_offset = PyLong_AsUnsignedLongLong(args[2]);
    long long timestamp_ms = PyLong_AsLongLong(args[3]);
    /* -1: the reference stored nothing yet; else its highest publishing id (u64). */
    int has_sequence = 1;
    unsigned long long sequence = 0;
    long long signed_sequence = PyLong_AsLongLong(args[5]);
    if (signed_sequence == -1 && !PyErr_Occurred()) {
        has_sequence = 0;
    } else {
        PyErr_Clear();
        sequence = PyLong_AsUnsignedLongLong(args[5]);
    }
    unsigned long long record_bytes_max = PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!PyBytes_Check(args[4]) || PyBytes_GET_SIZE(args[4]) > SHORTSTR_BYTES_MAX) {
        PyErr_SetString(PyExc_ValueError, "reference must be bytes of at most 255");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PublishPlan plan = {
        .payload = view.buf,
        .payload_len = (size_t)view.len,
        .version = (int)version,
        .reference = (const unsigned char *)PyBytes_AS_STRING(args[4]),
        .reference_len = (size_t)PyBytes_GET_SIZE(args[4]),
        .sequence = sequence,
        .has_sequence = has_sequence,
        .record_bytes_max = record_bytes_max,
    };
    PyObject *records = NULL, *ids = NULL, *result = NULL;
    const char *error = version == 1 || version == 2 ? plan_publish(&plan)
                                                     : "unsupported Publish version";
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        goto done;
    }
    if (plan.record_bytes > (uint64_t)PY_SSIZE_T_MAX ||
        plan.records > UINT64_MAX - first_offset) {
        PyErr_SetString(PyExc_OverflowError, "publish does not fit the log");
        goto done;
    }
    records = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)plan.record_bytes);
    ids = PyBytes_FromStringAndSize(NULL, 8 * (Py_ssize_t)plan.count);
    if (records == NULL || ids == NULL) {
        goto done;
    }
    write_publish(&plan, (unsigned char *)PyBytes_AS_STRING(records),
                  (unsigned char *)PyBytes_AS_STRING(ids), first_offset, timestamp_ms);
    /* The new sequence: the highest id stored (with a reference), else unchanged. */
    uint64_t new_sequence = sequence;
    int new_has_sequence = has_sequence;
    if (plan.reference_len > 0) {
        const unsigned char *id = (const unsigned char *)PyBytes_AS_STRING(ids);
        for (uint32_t i = 0; i < plan.count; i++) {
            uint64_t value = load_be64(id + 8 * (size_t)i);
            new_sequence = !new_has_sequence || value > new_sequence ? value : new_sequence;
            new_has_sequence = 1;
        }
    }
    PyObject *sequence_object = new_has_sequence
                                    ? PyLong_FromUnsignedLongLong(new_sequence)
                                    : PyLong_FromLong(-1);
    if (sequence_object == NULL) {
        goto done;
    }
    result = Py_BuildValue("(OIKON)", records, plan.count, (unsigned long long)plan.records,
                           ids, sequence_object);
done:
    Py_XDECREF(records);
    Py_XDECREF(ids);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(publish_entries_doc,
"publish_entries(version, payload, sequence, dedup, entry_bytes_max, /)\n"
"-> (entries, sizes, records, count, stored_records, ids, sequence, filters)\n"
"\n"
"Parse a Publish frame's messages (`payload`: from its message count on) into osiris\n"
"chunk entries, for a stream stored in chunks: each message to store copied as it was\n"
"sent (`u32 size | message`, or an uncompressed sub-entry batch with its 11-byte\n"
"header), back to back. With `dedup`, a message whose publishing id is not above\n"
"`sequence` (then the highest id seen so far; -1: none yet) is a duplicate and not\n"
"stored. Returns the entries, each entry's size and record count (native u32 arrays:\n"
"array('I').frombytes), the frame's message count, the records stored, the count\n"
"publishing ids (u64 big-endian each, in frame order), the new sequence (-1: none) and\n"
"the filter values as runs [(first entry, entries, value)] of consecutive entries with\n"
"one value. Raises ValueError, storing nothing, for\n"
"a malformed payload (a compressed batch: COMPRESSED, for the caller to decompress).");

#define FILTER_VALUE_BYTES_MAX 0x7FFF /* Publish v2's i16 */

/* Pass 1 of publish_entries: validate and size; NULL or what is wrong. */
static const char *
plan_entries(const unsigned char *payload, size_t len, int version, int dedup,
             uint64_t sequence, int seen, uint64_t entry_max, uint32_t *count,
             size_t *entries, size_t *bytes, uint64_t *records)
{
    if (len < 4) {
        return "truncated message count";
    }
    *count = load_be32(payload);
    if (*count > 0x7FFFFFFFu) {
        return "negative message count";
    }
    const unsigned char *p = payload + 4;
    size_t left = len - 4;
    for (uint32_t i = 0; i < *count; i++) {
        PublishedMessage m;
        size_t size;
        const char *error = parse_message(p, left, version, &m, &size, FILTER_VALUE_BYTES_MAX);
        if (error != NULL) {
            return error;
        }
        if (m.batch_count && (m.body[-BATCH_HEADER_BYTES] & 0x0F)) {
            return "sub-entry batch type byte has reserved bits set";
        }
        p += size;
        left -= size;
        if (dedup) {
            if (seen && m.id <= sequence) {
                continue;
            }
            sequence = m.id;
            seen = 1;
        }
        size_t entry = (m.batch_count ? BATCH_HEADER_BYTES : ENTRY_SIZE_BYTES) + m.body_len;
        if (entry > entry_max) {
            return "message larger than the log's record size limit";
        }
        *entries += 1;
        *bytes += entry;
        *records += m.batch_count ? m.batch_count : 1;
    }
    return left != 0 ? "bytes after the last message" : NULL;
}

/* Append (first entry, entries, value) to `runs`; -1 with an exception set on failure. */
static int
add_filter_run(PyObject *runs, uint32_t first, uint32_t count, const unsigned char *value,
               size_t len)
{
    PyObject *item = Py_BuildValue("(IIy#)", first, count, (const char *)value, (Py_ssize_t)len);
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(runs, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *
publish_entries(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "publish_entries() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    long version = PyLong_AsLong(args[0]);
    long long signed_sequence = PyLong_AsLongLong(args[2]);
    int has_sequence = !(signed_sequence == -1 && !PyErr_Occurred());
    unsigned long long sequence = 0;
    if (has_sequence) {
        PyErr_Clear();
        sequence = PyLong_AsUnsignedLongLong(args[2]);
    }
    int dedup = PyObject_IsTrue(args[3]);
    unsigned long long entry_max = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred() || dedup < 0) {
        return NULL;
    }
    if (version != 1 && version != 2) {
        PyErr_SetString(PyExc_ValueError, "unsupported Publish version");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *payload = view.buf;
    uint32_t count = 0;
    size_t entries = 0, bytes = 0;
    uint64_t records = 0;
    PyObject *data = NULL, *sizes = NULL, *counts = NULL, *ids = NULL, *filters = NULL;
    PyObject *result = NULL;
    const char *error = plan_entries(payload, (size_t)view.len, (int)version, dedup, sequence,
                                     has_sequence, entry_max, &count, &entries, &bytes, &records);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        goto done;
    }
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    sizes = PyBytes_FromStringAndSize(NULL, 4 * (Py_ssize_t)entries);
    counts = PyBytes_FromStringAndSize(NULL, 4 * (Py_ssize_t)entries);
    ids = PyBytes_FromStringAndSize(NULL, 8 * (Py_ssize_t)count);
    filters = PyList_New(0);
    if (data == NULL || sizes == NULL || counts == NULL || ids == NULL || filters == NULL) {
        goto done;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(data);
    unsigned char *id_out = (unsigned char *)PyBytes_AS_STRING(ids);
    uint32_t *size_out = (uint32_t *)PyBytes_AS_STRING(sizes);
    uint32_t *count_out = (uint32_t *)PyBytes_AS_STRING(counts);
    const unsigned char *p = payload + 4;
    size_t left = (size_t)view.len - 4;
    int seen = has_sequence;
    uint32_t entry = 0;
    /* The run of consecutive entries with one filter value being gathered. */
    const unsigned char *run_value = NULL;
    size_t run_len = 0;
    uint32_t run_start = 0, run_count = 0;
    for (uint32_t i = 0; i < count; i++) {
        PublishedMessage m;
        size_t size;
        (void)parse_message(p, left, (int)version, &m, &size, FILTER_VALUE_BYTES_MAX);
        p += size;
        left -= size;
        store_be64(id_out + 8 * (size_t)i, m.id);
        if (dedup) {
            if (seen && m.id <= sequence) {
                continue;
            }
            sequence = m.id;
            seen = 1;
        }
        size_t head = m.batch_count ? BATCH_HEADER_BYTES : ENTRY_SIZE_BYTES;
        memcpy(out, m.body - head, head + m.body_len); /* as sent, its header included */
        out += head + m.body_len;
        uint32_t n = (uint32_t)(head + m.body_len), r = m.batch_count ? m.batch_count : 1;
        memcpy(size_out + entry, &n, 4);
        memcpy(count_out + entry, &r, 4);
        if (m.filter_len) {
            int continues = run_value != NULL && run_start + run_count == entry &&
                            run_len == m.filter_len &&
                            memcmp(run_value, m.filter, m.filter_len) == 0;
            if (!continues) {
                if (run_value != NULL &&
                    add_filter_run(filters, run_start, run_count, run_value, run_len) < 0) {
                    goto done;
                }
                run_value = m.filter;
                run_len = m.filter_len;
                run_start = entry;
                run_count = 0;
            }
            run_count++;
        }
        entry++;
    }
    if (run_value != NULL &&
        add_filter_run(filters, run_start, run_count, run_value, run_len) < 0) {
        goto done;
    }
    PyObject *sequence_object = seen ? PyLong_FromUnsignedLongLong(sequence) : PyLong_FromLong(-1);
    if (sequence_object == NULL) {
        goto done;
    }
    result = Py_BuildValue("(OOOIKOOO)", data, sizes, counts, count, (unsigned long long)records,
                           ids, sequence_object, filters);
    Py_DECREF(sequence_object);
done:
    Py_XDECREF(data);
    Py_XDECREF(sizes);
    Py_XDECREF(counts);
    Py_XDECREF(ids);
    Py_XDECREF(filters);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(span_indexed_doc,
"span_indexed(data, position, segment_position, first_relative_offset,\n"
"             last_index_position, interval_bytes, end_limit, /)\n"
"-> (end, count, relative_offsets, positions, last_index_position)\n"
"\n"
"Walk the encoded records (by their length fields, unchecked: the caller's fresh\n"
"encodings) of a run that goes into a segment at `segment_position`, its first record\n"
"with relative offset `first_relative_offset`: walk the records that end within\n"
"`end_limit` bytes from `position`, and list the sparse index entries due among them (a\n"
"record that starts `interval_bytes` or more after the previous entry, at\n"
"`last_index_position`) as two arrays of native u32 (array('I').frombytes). Returns\n"
"where the walked records end, how many there are, the entries' relative offsets and\n"
"positions, and the position of the last entry.");

static PyObject *
span_indexed(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "span_indexed() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    long long segment_position = PyLong_AsLongLong(args[2]);
    long long first_relative = PyLong_AsLongLong(args[3]);
    long long last_index = PyLong_AsLongLong(args[4]);
    long long interval = PyLong_AsLongLong(args[5]);
    Py_ssize_t end_limit = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t length = view.len;
    if (position < 0 || position > length || end_limit < 0 || segment_position < 0 ||
        first_relative < 0 || interval <= 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position or limit out of range");
        return NULL;
    }
    /* First pass: how many records and entries (so that the outputs are sized once). */
    Py_ssize_t at = position, count = 0, entries = 0;
    long long last = last_index;
    while (length - at >= 4) {
        Py_ssize_t size = 4 + (Py_ssize_t)load_le32(data + at);
        Py_ssize_t walked = at - position;
        if (size > end_limit - walked || size > length - at) {
            break;
        }
        long long where = segment_position + walked;
        if (where - last >= interval) {
            last = where;
            entries++;
        }
        at += size;
        count++;
    }
    if (segment_position + (at - position) > (long long)U32_MAX ||
        first_relative + count > (long long)U32_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_OverflowError, "index entry beyond u32");
        return NULL;
    }
    PyObject *rels = PyBytes_FromStringAndSize(NULL, entries * 4);
    PyObject *poss = PyBytes_FromStringAndSize(NULL, entries * 4);
    PyObject *result = NULL;
    if (rels != NULL && poss != NULL) {
        unsigned char *r = (unsigned char *)PyBytes_AS_STRING(rels);
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(poss);
        Py_ssize_t walk = position;
        last = last_index;
        for (Py_ssize_t i = 0; i < count; i++) {
            long long where = segment_position + (walk - position);
            if (where - last >= interval) {
                uint32_t rel = (uint32_t)(first_relative + i), pos = (uint32_t)where;
                memcpy(r, &rel, 4); /* native order: array('I') */
                memcpy(p, &pos, 4);
                r += 4;
                p += 4;
                last = where;
            }
            walk += 4 + (Py_ssize_t)load_le32(data + walk);
        }
        result = Py_BuildValue("(nnOOL)", at, count, rels, poss, last);
    }
    Py_XDECREF(rels);
    Py_XDECREF(poss);
    PyBuffer_Release(&view);
    return result;
}

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
    uint32_t crc = crc32c_update(0xFFFFFFFFu, r + 8, length - 4) ^ 0xFFFFFFFFu;
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

PyDoc_STRVAR(chunk_add_doc,
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

static PyObject *
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

PyDoc_STRVAR(crc32_doc,
"crc32(data, start, /) -> int\n\n"
"zlib.crc32(data[start:]), for a chunk's entries: folded with PCLMULQDQ where the CPU\n"
"has it (see _crc32.h).");

static PyObject *
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
    crc = crc32_ieee(0, p, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef streamwire_methods[] = {
    {"encode_publish", (PyCFunction)(void (*)(void))encode_publish, METH_FASTCALL,
     encode_publish_doc},
    {"span_indexed", (PyCFunction)(void (*)(void))span_indexed, METH_FASTCALL,
     span_indexed_doc},
    {"publish_entries", (PyCFunction)(void (*)(void))publish_entries, METH_FASTCALL,
     publish_entries_doc},
    {"chunk_add", (PyCFunction)(void (*)(void))chunk_add, METH_FASTCALL, chunk_add_doc},
    {"crc32", (PyCFunction)(void (*)(void))crc32_of, METH_FASTCALL, crc32_doc},
    {"chunk_run_records", (PyCFunction)(void (*)(void))chunk_run_records, METH_FASTCALL,
     chunk_run_records_doc},
    {"converted_entries", (PyCFunction)(void (*)(void))converted_entries, METH_FASTCALL,
     converted_entries_doc},
    {NULL, NULL, 0, NULL},
};

static int
streamwire_exec(PyObject *Py_UNUSED(module))
{
    crc32c_init(); /* process-wide constants: every import computes the same */
    crc32_ieee_init();
    return 0;
}

static PyModuleDef_Slot streamwire_slots[] = {
    {Py_mod_exec, streamwire_exec},
    {0, NULL},
};

static struct PyModuleDef streamwire_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamq.log._streamwire",
    .m_doc = MODULE_DOC,
    .m_size = 0,
    .m_methods = streamwire_methods,
    .m_slots = streamwire_slots,
};

PyMODINIT_FUNC
PyInit__streamwire(void)
{
    return PyModuleDef_Init(&streamwire_module);
}

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

/* _crc32c.h's CRC32C and _crc32.h's CRC32 for the module's other units (their tables
 * are this unit's, filled at import). */
uint32_t
streamwire_crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
    return crc32c_update(crc, p, n);
}

uint32_t
streamwire_crc32(uint32_t crc, const unsigned char *p, size_t n)
{
    return crc32_ieee(crc, p, n);
}

/* ---- Publish ------------------------------------------------------------------------ */

/* Parse the message at `p` (with `avail` bytes); NULL with its size in *size and its
 * parts in *m, or a text naming what is wrong. */
const char *
streamwire_parse_message(const unsigned char *p, size_t avail, int version,
                         PublishedMessage *m, size_t *size, size_t filter_max)
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
        const char *error = streamwire_parse_message(p, left, plan->version, &m, &size, SHORTSTR_BYTES_MAX);
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
        (void)streamwire_parse_message(p, left, plan->version, &m, &size, SHORTSTR_BYTES_MAX); /* checked */
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
    {"chunk_message_spans", (PyCFunction)(void (*)(void))chunk_message_spans, METH_FASTCALL,
     chunk_message_spans_doc},
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

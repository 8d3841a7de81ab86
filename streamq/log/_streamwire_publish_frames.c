/* streamq.log._streamwire, fifth unit: a stream-protocol Publish frame as chunk entries.
 *
 * `publish_entries` turns the messages of a Publish frame (or PublishV2, with filter
 * values) into the entries of a version-2 chunk, as the producer sent them (simple
 * entries, sub-entry batches kept as they are), deduplicated by publishing id, with the
 * filter values as runs for the chunk's trailer. The frame's messages are parsed by the
 * first unit's `streamwire_parse_message` (_streamwire.c), which `encode_publish` (the
 * version-1 records) shares; the layouts are in _streamwire_entries.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_streamwire_entries.h"

const char publish_entries_doc[] = PyDoc_STR(
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
        const char *error = streamwire_parse_message(p, left, version, &m, &size, FILTER_VALUE_BYTES_MAX);
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

PyObject *
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
        (void)streamwire_parse_message(p, left, (int)version, &m, &size, FILTER_VALUE_BYTES_MAX);
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

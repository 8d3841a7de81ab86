/* streamq.log._amqp10: stream-native records' AMQP 1.0 messages converted for AMQP 0-9-1
 * readers, in C. The conversion itself is _amqp10_convert.h; this file is its Python API.
 * See MODULE_DOC below for what it owns and why it is C.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_amqp10_convert.h"

PyDoc_STRVAR(MODULE_DOC,
"Stream-native records' AMQP 1.0 messages as AMQP 0-9-1 readers get them, in C.\n"
"\n"
"This module owns `convert` (one message: `amqp10.to_amqp091_reference`'s result, or\n"
"None when the Python must do it) and `convert_records` (a run of records as Arrow-ready\n"
"columns for the Spark source). The conversion's rules are Python's, in\n"
"streamq/log/amqp10.py (docs/stream-protocol.md, \"Message conversion\"), the reference\n"
"the tests hold it to. No I/O, no state kept between calls.\n"
"\n"
"Why C: the Python decodes each message into tagged values and encodes the 0-9-1\n"
"properties again, about 5 us per message with properties and application properties\n"
"(~200k rows per CPU-second in Spark); AMQP consumers of a stream pay it per delivery.\n"
"See benchmarks/spark_read.py --writer stream-props and docs/benchmarks.md.\n");

enum {
    RECORD_HEADER_BYTES = 32, /* docs/log-format.md, "Record" */
    COLUMNS = 4,              /* exchange, routing key, properties, body */
};
#define ARROW_OFFSET_MAX ((uint64_t)INT32_MAX) /* Arrow binary arrays: int32 offsets */
static const uint8_t NATIVE_MARK[2] = {0x00, 0x02};

/* Reused by `convert` (the GIL is held throughout and no Python code runs inside). */
static A10Scratch scratch;
static A10Out props_out;

/* A span's pointer for Py_BuildValue's "y#", which makes None of a NULL one. */
static const char *
not_null(const void *p)
{
    return p != NULL ? (const char *)p : "";
}

static int
get_span(PyObject *object, Py_buffer *view, A10Span *span)
{
    if (PyObject_GetBuffer(object, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    span->p = view->buf;
    span->n = (size_t)view->len;
    return 0;
}

/* The joined data sections of the last conversion as bytes. */
static PyObject *
body_bytes(const A10Scratch *s)
{
    if (s->data_count == 1) {
        return PyBytes_FromStringAndSize((const char *)s->data[0].p, (Py_ssize_t)s->data[0].n);
    }
    size_t total = 0;
    for (size_t i = 0; i < s->data_count; i++) {
        total += s->data[i].n; /* each within the message: no overflow */
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (body == NULL) {
        return NULL;
    }
    char *p = PyBytes_AS_STRING(body);
    for (size_t i = 0; i < s->data_count; i++) {
        if (s->data[i].n) {
            memcpy(p, s->data[i].p, s->data[i].n);
            p += s->data[i].n;
        }
    }
    return body;
}

PyDoc_STRVAR(convert_doc,
"convert($module, body, stream_key, filter_value, /)\n"
"--\n"
"\n"
"`amqp10.to_amqp091_reference` of a native record whose body (the AMQP 1.0 message) is\n"
"`body` and whose filter value is `filter_value`, in a stream whose name in UTF-8 is\n"
"`stream_key`: `(exchange, routing_key, properties, body)`, or None when the message\n"
"holds what only the Python converts (see _amqp10_convert.h).");

static PyObject *
convert(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "convert() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer views[3];
    A10Span spans[3];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 3; got++) {
        if (get_span(args[got], &views[got], &spans[got]) < 0) {
            goto done;
        }
    }
    A10Result r;
    props_out.len = 0;
    props_out.failed = 0;
    if (a10_convert(spans[0].p, spans[0].n, spans[1], spans[2], &scratch, &props_out, &r) !=
        A10_OK) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *body = body_bytes(&scratch);
    if (body != NULL) {
        result = Py_BuildValue("(y#y#y#N)", not_null(r.exchange.p), (Py_ssize_t)r.exchange.n,
                               not_null(r.routing_key.p), (Py_ssize_t)r.routing_key.n,
                               not_null(props_out.data), (Py_ssize_t)props_out.len, body);
    }
done:
    while (got-- > 0) {
        PyBuffer_Release(&views[got]);
    }
    if (props_out.cap > (1u << 20)) {
        a10_out_free(&props_out); /* a huge message does not pin its buffer */
    }
    return result;
}

/* One column under construction: its values back to back and their int32 offsets. */
typedef struct {
    A10Out data;
    A10Out offsets;
} Column;

static int
column_end(Column *c) /* the offset after the value just appended */
{
    if (c->data.len > ARROW_OFFSET_MAX) {
        return -1;
    }
    uint32_t end = (uint32_t)c->data.len;
    a10_put(&c->offsets, &end, 4); /* native byte order, as Arrow reads it */
    return c->offsets.failed || c->data.failed ? -1 : 0;
}

static int
column_add(Column *c, const uint8_t *p, size_t n)
{
    a10_put(&c->data, p, n);
    return column_end(c);
}

typedef struct {
    const int64_t *positions, *ends, *exchange_lens, *routing_key_lens, *properties_lens;
} RecordIndex;

/* What the last converted native record gave, when its message was `head` then one data
 * section: a record whose message has the same head bytes and the same filter value,
 * then one data section, converts to the same exchange, routing key and properties
 * (they come from the sections before the body alone), so they are copied, not decoded
 * again. Records of one publisher mostly share their head. */
typedef struct {
    const uint8_t *head;
    size_t head_n;
    A10Span filter, exchange, routing_key;
    size_t props_at, props_n; /* the properties, in the properties column's data */
    int valid;
} Memo;

/* Whether `p[0..n)` is exactly one data section (binary of one- or four-byte size);
 * its payload in `payload`. */
static int
one_data_section(const uint8_t *p, size_t n, A10Span *payload)
{
    if (n < 5 || p[0] != 0x00 || p[1] != 0x53 || p[2] != 0x75) {
        return 0;
    }
    size_t header = p[3] == 0xa0 ? 5 : p[3] == 0xb0 ? 8 : 0;
    if (header == 0 || n < header ||
        (header == 5 ? (size_t)p[4] : (size_t)a10_be(p + 4, 4)) != n - header) {
        return 0;
    }
    payload->p = p + header;
    payload->n = n - header;
    return 1;
}

/* The memo's copy for a native message `body` with filter value `filter`: 1 and its
 * columns appended, 0 when the memo does not apply, -1 on an allocation failure. */
static int
add_remembered(Column *cols, Memo *m, const uint8_t *body, size_t body_len, A10Span filter)
{
    A10Span payload;
    if (!m->valid || body_len < m->head_n || filter.n != m->filter.n ||
        memcmp(body, m->head, m->head_n) != 0 ||
        (filter.n && memcmp(filter.p, m->filter.p, filter.n) != 0) ||
        !one_data_section(body + m->head_n, body_len - m->head_n, &payload)) {
        return 0;
    }
    uint8_t *p = a10_grow(&cols[2].data, m->props_n);
    if (p == NULL && m->props_n) {
        return -1;
    }
    if (m->props_n) { /* below the old end: the grown buffer still holds it */
        memcpy(p, cols[2].data.data + m->props_at, m->props_n);
    }
    a10_put(&cols[3].data, payload.p, payload.n);
    return column_end(&cols[2]) || column_add(&cols[0], m->exchange.p, m->exchange.n) ||
           column_add(&cols[1], m->routing_key.p, m->routing_key.n) || column_end(&cols[3])
               ? -1 : 1;
}

/* After converting `body` (its properties from `props_at` in the column): remember it
 * when its message is a head then one data section. */
static void
remember(Memo *m, const uint8_t *body, size_t body_len, A10Span filter, const A10Result *r,
         const A10Scratch *s, const Column *props, size_t props_at)
{
    m->valid = 0;
    if (s->data_count != 1 || s->data[0].p + s->data[0].n != body + body_len) {
        return;
    }
    for (size_t header = 5; header <= 8; header += 3) {
        A10Span payload;
        size_t at = (size_t)(s->data[0].p - body);
        if (at >= header && one_data_section(body + at - header, body_len - at + header,
                                             &payload)) {
            *m = (Memo){body, at - header, filter, r->exchange, r->routing_key, props_at,
                        props->data.len - props_at, 1};
            return;
        }
    }
}

/* Record i's columns appended: as they are, or converted when native. 1: fall back. */
static int
add_record(Column *cols, const uint8_t *buf, size_t size, const RecordIndex *ix, size_t i,
           A10Span stream_key, A10Scratch *s, Memo *memo)
{
    int64_t pos = ix->positions[i], end = ix->ends[i];
    int64_t lens[3] = {ix->exchange_lens[i], ix->routing_key_lens[i], ix->properties_lens[i]};
    if (pos < 0 || end < pos || (uint64_t)end > size || lens[0] < 0 || lens[1] < 0 ||
        lens[2] < 0 || lens[0] > end || lens[1] > end || lens[2] > end ||
        end - pos - RECORD_HEADER_BYTES < lens[0] + lens[1] + lens[2]) {
        return 1;
    }
    const uint8_t *exchange = buf + pos + RECORD_HEADER_BYTES;
    const uint8_t *key = exchange + lens[0];
    const uint8_t *props = key + lens[1];
    const uint8_t *body = props + lens[2];
    size_t body_len = (size_t)(buf + end - body);
    if (lens[2] < 2 || memcmp(props, NATIVE_MARK, 2) != 0) {
        return column_add(&cols[0], exchange, (size_t)lens[0]) ||
               column_add(&cols[1], key, (size_t)lens[1]) ||
               column_add(&cols[2], props, (size_t)lens[2]) ||
               column_add(&cols[3], body, body_len) ? 1 : 0;
    }
    A10Span filter = {key, (size_t)lens[1]};
    int remembered = add_remembered(cols, memo, body, body_len, filter);
    if (remembered) {
        return remembered < 0 ? 1 : 0;
    }
    size_t props_at = cols[2].data.len;
    A10Result r;
    if (a10_convert(body, body_len, stream_key, filter, s, &cols[2].data, &r) != A10_OK) {
        return 1;
    }
    remember(memo, body, body_len, filter, &r, s, &cols[2], props_at);
    if (column_end(&cols[2]) < 0) {
        return 1;
    }
    for (size_t k = 0; k < s->data_count; k++) {
        a10_put(&cols[3].data, s->data[k].p, s->data[k].n);
    }
    return column_add(&cols[0], r.exchange.p, r.exchange.n) ||
           column_add(&cols[1], r.routing_key.p, r.routing_key.n) || column_end(&cols[3]) ? 1 : 0;
}

PyDoc_STRVAR(convert_records_doc,
"convert_records($module, buffer, positions, ends, exchange_lens, routing_key_lens,\n"
"                properties_lens, stream_key, /)\n"
"--\n"
"\n"
"The records of `buffer` (record i spans positions[i]..ends[i], its fields laid out as\n"
"docs/log-format.md says, with the lengths given: int64 arrays in native byte order)\n"
"as AMQP 0-9-1 readers see them, native ones converted as `convert` does: a tuple of\n"
"four (data, offsets) pairs, for exchange, routing key, properties and body, each an\n"
"Arrow binary column's buffers (int32 offsets, native byte order, count + 1 of them).\n"
"None when a record is one only the Python converts, or a column passes 2 GiB.\n"
"Raises ValueError when the arrays' sizes differ.");

static PyObject *
convert_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "convert_records() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer views[7];
    A10Span spans[7];
    int got = 0;
    PyObject *result = NULL;
    Column cols[COLUMNS];
    memset(cols, 0, sizeof cols);
    A10Scratch *s = NULL;
    for (; got < 7; got++) {
        if (get_span(args[got], &views[got], &spans[got]) < 0) {
            goto done;
        }
    }
    size_t count = spans[1].n / 8;
    for (int k = 1; k < 6; k++) {
        if (spans[k].n != count * 8 || ((uintptr_t)spans[k].p % sizeof(int64_t)) != 0) {
            PyErr_SetString(PyExc_ValueError, "convert_records: arrays of different sizes");
            goto done;
        }
    }
    RecordIndex ix = {(const int64_t *)spans[1].p, (const int64_t *)spans[2].p,
                      (const int64_t *)spans[3].p, (const int64_t *)spans[4].p,
                      (const int64_t *)spans[5].p};
    s = malloc(sizeof *s);
    if (s == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int fallback = 0;
    for (int k = 0; k < COLUMNS; k++) {
        fallback |= column_end(&cols[k]); /* the first offset, 0 */
    }
    Memo memo = {0};
    for (size_t i = 0; i < count && !fallback; i++) {
        fallback = add_record(cols, spans[0].p, spans[0].n, &ix, i, spans[6], s, &memo);
    }
    if (fallback) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_New(COLUMNS);
    for (int k = 0; result != NULL && k < COLUMNS; k++) {
        PyObject *pair = Py_BuildValue("(y#y#)", not_null(cols[k].data.data),
                                       (Py_ssize_t)cols[k].data.len,
                                       not_null(cols[k].offsets.data),
                                       (Py_ssize_t)cols[k].offsets.len);
        if (pair == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, k, pair);
    }
done:
    while (got-- > 0) {
        PyBuffer_Release(&views[got]);
    }
    for (int k = 0; k < COLUMNS; k++) {
        a10_out_free(&cols[k].data);
        a10_out_free(&cols[k].offsets);
    }
    free(s);
    return result;
}

/* -- split_properties: 0-9-1 property lists as Arrow-ready columns ---------------------- */

enum { PROPERTY_COUNT = 14, FIELD_HEADERS = 2, FIELD_DELIVERY_MODE = 3, FIELD_PRIORITY = 4,
       FIELD_TIMESTAMP = 9 };
#define MICROS_PER_S 1000000
#define TIMESTAMP_S_MAX ((uint64_t)INT64_MAX / MICROS_PER_S) /* microseconds fit an int64 */

/* Column k of the 14 (amqp091.PROPERTY_NAMES order): values (a binary column's data and
 * offsets, or fixed-width numbers in `data`) and one validity byte per row. */
typedef struct {
    Column values;
    A10Out valid;
} PropertyColumn;

/* One property list's fields appended to the columns; 1 when it is malformed (Python's
 * decode_properties raises then) or a timestamp's microseconds pass an int64. */
static int
split_one(PropertyColumn *cols, const uint8_t *p, size_t n)
{
    if (n < 2) {
        return 1;
    }
    unsigned flags = (unsigned)p[0] << 8 | p[1];
    size_t at = 2;
    for (int k = 0; k < PROPERTY_COUNT; k++) {
        PropertyColumn *c = &cols[k];
        int present = (flags >> (15 - k)) & 1;
        a10_put_byte(&c->valid, (uint8_t)present);
        /* bytes needed before the field's own size is known: its size field, or all */
        size_t size = k == FIELD_HEADERS ? 4 : k == FIELD_TIMESTAMP ? 8 : 1;
        if (present && n - at < size) {
            return 1;
        }
        if (k == FIELD_DELIVERY_MODE || k == FIELD_PRIORITY) {
            int32_t value = present ? p[at] : 0;
            a10_put(&c->values.data, &value, 4);
            at += present ? 1 : 0;
            continue;
        }
        if (k == FIELD_TIMESTAMP) {
            uint64_t seconds = present ? a10_be(p + at, 8) : 0;
            if (seconds > TIMESTAMP_S_MAX) {
                return 1;
            }
            int64_t micros = (int64_t)seconds * MICROS_PER_S;
            a10_put(&c->values.data, &micros, 8);
            at += present ? 8 : 0;
            continue;
        }
        size_t start = at;
        if (present) {
            size = k == FIELD_HEADERS ? 4 + (size_t)a10_be(p + at, 4) : 1 + (size_t)p[at];
            if (n - at < size) {
                return 1;
            }
            at += size;
        }
        size_t skip = k == FIELD_HEADERS ? 0 : 1; /* the headers keep their size field */
        if (column_add(&c->values, p + start + (present ? skip : 0), present ? size - skip : 0)) {
            return 1;
        }
    }
    return at == n ? 0 : 1;
}

PyDoc_STRVAR(split_properties_doc,
"split_properties($module, data, offsets, /)\n"
"--\n"
"\n"
"The AMQP 0-9-1 property lists of a binary column (`data` and its int32 `offsets`, count\n"
"+ 1 of them) split into the 14 properties, in amqp091.PROPERTY_NAMES order: per\n"
"property a tuple (data, offsets, valid) for the shortstrs and for headers (the field\n"
"table with its size field), (values, valid) for delivery_mode and priority (int32) and\n"
"timestamp (int64 microseconds), `valid` one byte per row. None when a list is\n"
"malformed or a timestamp's microseconds pass an int64 (the Python decode then raises or\n"
"overflows as it does). Raises ValueError for offsets that do not fit `data`.");

static PyObject *
property_tuple(PropertyColumn *c, int k)
{
    const char *valid = not_null(c->valid.data);
    Py_ssize_t rows = (Py_ssize_t)c->valid.len;
    if (k == FIELD_DELIVERY_MODE || k == FIELD_PRIORITY || k == FIELD_TIMESTAMP) {
        return Py_BuildValue("(y#y#)", not_null(c->values.data.data),
                             (Py_ssize_t)c->values.data.len, valid, rows);
    }
    return Py_BuildValue("(y#y#y#)", not_null(c->values.data.data), (Py_ssize_t)c->values.data.len,
                         not_null(c->values.offsets.data), (Py_ssize_t)c->values.offsets.len,
                         valid, rows);
}

static PyObject *
split_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "split_properties() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer views[2];
    A10Span spans[2];
    int got = 0;
    PyObject *result = NULL;
    PropertyColumn cols[PROPERTY_COUNT];
    memset(cols, 0, sizeof cols);
    for (; got < 2; got++) {
        if (get_span(args[got], &views[got], &spans[got]) < 0) {
            goto done;
        }
    }
    const uint8_t *offsets = spans[1].p;
    size_t count = spans[1].n / 4;
    if (count == 0 || spans[1].n % 4) {
        PyErr_SetString(PyExc_ValueError, "split_properties: offsets must hold count + 1 int32");
        goto done;
    }
    count--;
    int fallback = 0;
    for (int k = 0; k < PROPERTY_COUNT; k++) {
        if (k != FIELD_DELIVERY_MODE && k != FIELD_PRIORITY && k != FIELD_TIMESTAMP) {
            fallback |= column_end(&cols[k].values);
        }
    }
    for (size_t i = 0; i < count && !fallback; i++) {
        int32_t start, end;
        memcpy(&start, offsets + 4 * i, 4);
        memcpy(&end, offsets + 4 * (i + 1), 4);
        if (start < 0 || end < start || (size_t)end > spans[0].n) {
            PyErr_SetString(PyExc_ValueError, "split_properties: offsets past the data");
            goto done;
        }
        fallback = split_one(cols, spans[0].p + start, (size_t)(end - start));
    }
    if (fallback) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_New(PROPERTY_COUNT);
    for (int k = 0; result != NULL && k < PROPERTY_COUNT; k++) {
        PyObject *item = property_tuple(&cols[k], k);
        if (item == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, k, item);
    }
done:
    while (got-- > 0) {
        PyBuffer_Release(&views[got]);
    }
    for (int k = 0; k < PROPERTY_COUNT; k++) {
        a10_out_free(&cols[k].values.data);
        a10_out_free(&cols[k].values.offsets);
        a10_out_free(&cols[k].valid);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"convert", (PyCFunction)(void (*)(void))convert, METH_FASTCALL, convert_doc},
    {"convert_records", (PyCFunction)(void (*)(void))convert_records, METH_FASTCALL,
     convert_records_doc},
    {"split_properties", (PyCFunction)(void (*)(void))split_properties, METH_FASTCALL,
     split_properties_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_amqp10", MODULE_DOC, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__amqp10(void)
{
    return PyModule_Create(&module_def);
}

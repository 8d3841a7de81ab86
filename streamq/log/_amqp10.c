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

/* Record i's columns appended: as they are, or converted when native. 1: fall back. */
static int
add_record(Column *cols, const uint8_t *buf, size_t size, const RecordIndex *ix, size_t i,
           A10Span stream_key, A10Scratch *s)
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
    A10Result r;
    if (a10_convert(body, body_len, stream_key, filter, s, &cols[2].data, &r) != A10_OK ||
        column_end(&cols[2]) < 0) {
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
    for (size_t i = 0; i < count && !fallback; i++) {
        fallback = add_record(cols, spans[0].p, spans[0].n, &ix, i, spans[6], s);
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

static PyMethodDef methods[] = {
    {"convert", (PyCFunction)(void (*)(void))convert, METH_FASTCALL, convert_doc},
    {"convert_records", (PyCFunction)(void (*)(void))convert_records, METH_FASTCALL,
     convert_records_doc},
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

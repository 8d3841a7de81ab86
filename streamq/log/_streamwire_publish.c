/* streamq.log._streamwire, third unit: an AMQP 0-9-1 publish run as chunk entries.
 *
 * A 0-9-1 publish run to a version-2 stream is stored as AMQP 1.0 messages, simple
 * entries back to back (streamq/queues/converted_run.py). The messages of a run mostly
 * share their properties, so their 1.0 sections before the body are the same bytes: this
 * unit asks Python for them (and the filter value) once per distinct property list met in
 * a row, and writes each entry itself: `u32 size`, those sections, a data section holding
 * the body. A native record's body goes in as it is. Python is called per message only
 * where the body decides the conversion (basic.type amqp-1.0). The reference is
 * `amqp10.to_amqp10`; tests/unit/queues/test_converted_run.py compares the stored bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_streamwire_entries.h"

const char converted_entries_doc[] = PyDoc_STR(
"converted_entries(messages, routing_key, prefix_of, convert, entry_bytes_max, /)\n"
"-> tuple[bytes, bytes, list[tuple[int, int, bytes]]] | None\n"
"\n"
"The chunk entries of a 0-9-1 publish run: for each message (a tuple whose items 0 and 1\n"
"are its properties and body, bytes), a native record's body with `routing_key` as its\n"
"filter value, else its AMQP 1.0 conversion: `prefix_of(properties)` gives (the sections\n"
"before the body, or None when the body decides, and the filter value), asked again only\n"
"when the properties differ from the message before; then a data section of the body,\n"
"or with None `convert(properties, body)` whole. Returns (entries back to back, each\n"
"entry's size with its u32 size field as native u32s, filter value runs (first entry,\n"
"entries, value) merged as frame.add_filter_run merges them), or None when an entry with\n"
"its size field would be over `entry_bytes_max`.");

#define CONVERTED_NARGS 5
#define DATA_SMALL_MAX 255 /* a vbin8's length */
static const unsigned char DATA_SMALL[4] = {0x00, 0x53, 0x75, 0xa0};
static const unsigned char DATA_LARGE[4] = {0x00, 0x53, 0x75, 0xb0};

/* What one run of equal properties converts to. */
typedef struct {
    PyObject *properties; /* the last property list asked about (owned) */
    PyObject *answer;     /* prefix_of's (prefix or None, value) tuple (owned) */
} Memo;

/* The output so far. */
typedef struct {
    PyObject *data;     /* bytearray */
    Py_ssize_t used;
    uint32_t *sizes;
    PyObject *runs;     /* list of [first, count, value] (lists until the end) */
    Py_ssize_t run_end; /* the entry after the last run's (-1: no run yet) */
} Converted;

static int
same_bytes(PyObject *a, PyObject *b)
{
    return a == b || (PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
                      memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b),
                             (size_t)PyBytes_GET_SIZE(a)) == 0);
}

/* frame.add_filter_run for entry `number` with `value` (b"": none). */
static int
add_value(Converted *c, Py_ssize_t number, PyObject *value)
{
    if (PyBytes_GET_SIZE(value) == 0) {
        return 0;
    }
    Py_ssize_t count = PyList_GET_SIZE(c->runs);
    if (count && c->run_end == number) {
        PyObject *last = PyList_GET_ITEM(c->runs, count - 1);
        if (same_bytes(PyList_GET_ITEM(last, 2), value)) {
            Py_ssize_t entries = PyLong_AsSsize_t(PyList_GET_ITEM(last, 1));
            PyObject *more = PyLong_FromSsize_t(entries + 1);
            if (more == NULL || PyList_SetItem(last, 1, more) < 0) {
                return -1;
            }
            c->run_end = number + 1;
            return 0;
        }
    }
    PyObject *run = Py_BuildValue("[nnO]", number, (Py_ssize_t)1, value);
    if (run == NULL || PyList_Append(c->runs, run) < 0) {
        Py_XDECREF(run);
        return -1;
    }
    Py_DECREF(run);
    c->run_end = number + 1;
    return 0;
}

/* Append `size | head | data-section header | body` (head, or the section header, may
 * be absent); 1 when over the limit, -1 with an exception set. */
static int
put_entry(Converted *c, Py_ssize_t number, PyObject *head, int data_section, PyObject *body,
          Py_ssize_t limit)
{
    Py_ssize_t head_len = head ? PyBytes_GET_SIZE(head) : 0;
    Py_ssize_t body_len = PyBytes_GET_SIZE(body);
    Py_ssize_t section = !data_section ? 0 : body_len <= DATA_SMALL_MAX ? 5 : 8;
    if (body_len > (Py_ssize_t)ENTRY_SIZE_MAX || head_len > (Py_ssize_t)ENTRY_SIZE_MAX) {
        return 1;
    }
    Py_ssize_t size = ENTRY_SIZE_BYTES + head_len + section + body_len;
    if (size > limit || size - ENTRY_SIZE_BYTES > (Py_ssize_t)ENTRY_SIZE_MAX) {
        return 1;
    }
    if (PyByteArray_Resize(c->data, c->used + size) < 0) {
        return -1;
    }
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(c->data) + c->used;
    uint32_t entry = (uint32_t)(size - ENTRY_SIZE_BYTES);
    w[0] = (unsigned char)(entry >> 24);
    w[1] = (unsigned char)(entry >> 16);
    w[2] = (unsigned char)(entry >> 8);
    w[3] = (unsigned char)entry;
    w += ENTRY_SIZE_BYTES;
    if (head_len) {
        memcpy(w, PyBytes_AS_STRING(head), (size_t)head_len);
        w += head_len;
    }
    if (section == 5) {
        memcpy(w, DATA_SMALL, 4);
        w[4] = (unsigned char)body_len;
    }
    else if (section == 8) {
        memcpy(w, DATA_LARGE, 4);
        w[4] = (unsigned char)(body_len >> 24);
        w[5] = (unsigned char)(body_len >> 16);
        w[6] = (unsigned char)(body_len >> 8);
        w[7] = (unsigned char)body_len;
    }
    memcpy(w + section, PyBytes_AS_STRING(body), (size_t)body_len);
    c->used += size;
    c->sizes[number] = (uint32_t)size;
    return 0;
}

/* The prefix_of answer for `properties`, asked once per run of equal ones (borrowed). */
static PyObject *
answer_for(Memo *memo, PyObject *properties, PyObject *prefix_of)
{
    if (memo->answer != NULL && same_bytes(memo->properties, properties)) {
        return memo->answer;
    }
    PyObject *answer = PyObject_CallOneArg(prefix_of, properties);
    if (answer == NULL) {
        return NULL;
    }
    if (!PyTuple_Check(answer) || PyTuple_GET_SIZE(answer) != 2 ||
        !PyBytes_Check(PyTuple_GET_ITEM(answer, 1)) ||
        (PyTuple_GET_ITEM(answer, 0) != Py_None && !PyBytes_Check(PyTuple_GET_ITEM(answer, 0)))) {
        Py_DECREF(answer);
        PyErr_SetString(PyExc_TypeError, "prefix_of must return (bytes or None, bytes)");
        return NULL;
    }
    Py_XSETREF(memo->answer, answer);
    Py_INCREF(properties);
    Py_XSETREF(memo->properties, properties);
    return answer;
}

/* One message's entry; 1 when over the limit, -1 with an exception set. */
static int
convert_one(Converted *c, Memo *memo, Py_ssize_t number, PyObject *message,
            PyObject *const *args, Py_ssize_t limit)
{
    PyObject *properties, *body;
    if (!PyTuple_Check(message) || PyTuple_GET_SIZE(message) < 2 ||
        !PyBytes_Check(properties = PyTuple_GET_ITEM(message, 0)) ||
        !PyBytes_Check(body = PyTuple_GET_ITEM(message, 1))) {
        PyErr_SetString(PyExc_TypeError, "a message is a tuple of (properties, body, ...)");
        return -1;
    }
    if (PyBytes_GET_SIZE(properties) >= (Py_ssize_t)sizeof NATIVE_MARK &&
        memcmp(PyBytes_AS_STRING(properties), NATIVE_MARK, sizeof NATIVE_MARK) == 0) {
        int done = put_entry(c, number, NULL, 0, body, limit);
        return done ? done : add_value(c, number, args[1]);
    }
    PyObject *answer = answer_for(memo, properties, args[2]);
    if (answer == NULL) {
        return -1;
    }
    PyObject *prefix = PyTuple_GET_ITEM(answer, 0);
    PyObject *value = PyTuple_GET_ITEM(answer, 1);
    Py_INCREF(value); /* the memo may change below */
    int done;
    if (prefix != Py_None) {
        done = put_entry(c, number, prefix, 1, body, limit);
    }
    else {
        PyObject *entry = PyObject_CallFunctionObjArgs(args[3], properties, body, NULL);
        done = entry == NULL ? -1 : !PyBytes_Check(entry) ? -2 : put_entry(c, number, NULL, 0,
                                                                           entry, limit);
        if (done == -2) {
            PyErr_SetString(PyExc_TypeError, "convert must return bytes");
            done = -1;
        }
        Py_XDECREF(entry);
    }
    if (done == 0) {
        done = add_value(c, number, value);
    }
    Py_DECREF(value);
    return done;
}

/* The runs as tuples, and the result tuple. */
static PyObject *
converted_result(Converted *c, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(c->runs); i++) {
        PyObject *run = PyList_AsTuple(PyList_GET_ITEM(c->runs, i));
        if (run == NULL) {
            return NULL;
        }
        PyList_SET_ITEM(c->runs, i, run); /* steals run, drops the list */
    }
    PyObject *data = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(c->data), c->used);
    PyObject *sizes = PyBytes_FromStringAndSize((const char *)c->sizes,
                                                count * (Py_ssize_t)sizeof(uint32_t));
    if (data == NULL || sizes == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(sizes);
        return NULL;
    }
    return Py_BuildValue("(NNO)", data, sizes, c->runs);
}

PyObject *
converted_entries(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != CONVERTED_NARGS) {
        PyErr_Format(PyExc_TypeError, "converted_entries() takes %d arguments (%zd given)",
                     CONVERTED_NARGS, nargs);
        return NULL;
    }
    if (!PyList_Check(args[0]) || !PyBytes_Check(args[1]) || !PyCallable_Check(args[2]) ||
        !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "converted_entries(list, bytes, callable, callable, "
                                         "int)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *messages = args[0], *result = NULL;
    Py_ssize_t count = PyList_GET_SIZE(messages);
    Memo memo = {NULL, NULL};
    Converted c = {PyByteArray_FromStringAndSize(NULL, 0), 0,
                   PyMem_Malloc((size_t)(count ? count : 1) * sizeof(uint32_t)), PyList_New(0),
                   -1};
    if (c.data == NULL || c.sizes == NULL || c.runs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* The list is the caller's: a callback could shorten it, so its size is read each time. */
    for (Py_ssize_t i = 0; i < count && i < PyList_GET_SIZE(messages); i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        Py_INCREF(message);
        int done = convert_one(&c, &memo, i, message, args, limit);
        Py_DECREF(message);
        if (done < 0) {
            goto done;
        }
        if (done > 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    if (PyList_GET_SIZE(messages) != count) {
        PyErr_SetString(PyExc_RuntimeError, "the message list changed during the conversion");
        goto done;
    }
    result = converted_result(&c, count);
done:
    Py_XDECREF(memo.answer);
    Py_XDECREF(memo.properties);
    Py_XDECREF(c.data);
    Py_XDECREF(c.runs);
    PyMem_Free(c.sizes);
    return result;
}

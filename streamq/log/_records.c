/* streamq.log._records: the publish path's record encoder and CRC32C, in C.
 *
 * See MODULE_DOC below for what this module owns and why it is C. The layout it writes is
 * the record of docs/log-format.md (and the header of streamq/log/format.py); the Python
 * function `format.encode_record_parts` is its reference, and the tests compare the two
 * byte for byte.
 *
 * Build by hand (setup.py builds it for installs), from the repository root:
 *   gcc -O2 -Wall -Wextra -Werror -shared -fPIC -I<python include dir> \
 *       streamq/log/_records.c -o streamq/log/_records$(python3-config --extension-suffix)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* -DRECORDS_PORTABLE_ONLY builds without the SSE4.2 path (to test the fallback in place). */
#ifdef RECORDS_PORTABLE_ONLY
#define CRC32C_PORTABLE_ONLY
#endif
#include "_crc32c.h" /* CRC32C, shared with _streamwire.c */

PyDoc_STRVAR(MODULE_DOC,
"Encode runs of log records into the log's write buffer, and CRC32C, in C.\n"
"\n"
"This module owns one step of the publish hot path (STYLE.md section 11): turning a run of\n"
"messages that share an exchange, a routing key and a timestamp into segment-log records\n"
"(the layout of docs/log-format.md, byte-identical to format.encode_record_parts), appended\n"
"to a bytearray with one resize. It also exposes the CRC32C it uses.\n"
"\n"
"It must not do I/O, keep state between calls, or decide where records go: SegmentLog\n"
"passes the byte limits at which an index entry or a segment roll is due, and handles\n"
"that record itself.\n"
"\n"
"Why C: record encoding (encode_record_parts + SegmentLog.append_one) was ~10% of broker\n"
"CPU per message. Measured by benchmarks/records_bench.py (one core of an AMD EPYC,\n"
"CPython 3.11.7; 10-byte exchange, 6-byte routing key, 14 bytes of properties): with a\n"
"16-byte body, a Python loop of encode_record_parts + bytearray += makes 2.5-2.8 M\n"
"records/s, this module 39-41 M in runs of 64 and 5.3 M in runs of one; with a 1 KiB\n"
"body, 1.9-2.0 M against 11.4-11.7 M (runs of one: 3.8-4.0 M).\n");

#include "_records_layout.h" /* the record layout, and what the units share */

#define ENCODE_RECORDS_NARGS 10

/* The crc32c package releases the GIL from 32 KiB on; so does crc32c() here. Record
 * encoding never does: it reads the caller's list, which another thread could change. */
#define CRC_GIL_RELEASE_BYTES (32 * 1024)

/* _crc32c.h's CRC32C for the module's other unit (its tables are this unit's). */
uint32_t
records_crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
    return crc32c_update(crc, p, n);
}

/* Argument conversion. Each returns -1 with an exception set on error. */

static int
arg_count(PyObject *obj, const char *name, Py_ssize_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.200s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t value = PyLong_AsSsize_t(obj); /* OverflowError past Py_ssize_t */
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "%s must not be negative, got %zd", name, value);
        return -1;
    }
    *out = value;
    return 0;
}

static int
arg_shortstr(PyObject *obj, const char *name)
{
    if (!PyBytes_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.200s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyBytes_GET_SIZE(obj) > SHORTSTR_BYTES_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s of %zd bytes does not fit the u8 length field",
                     name, PyBytes_GET_SIZE(obj));
        return -1;
    }
    return 0;
}

/* The properties and body of messages[index], borrowed; TypeError unless the item is a
 * tuple whose first two items are bytes. */
static int
message_parts(PyObject *messages, Py_ssize_t index, PyObject **properties, PyObject **body)
{
    PyObject *item = PyList_GET_ITEM(messages, index);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2) {
        PyErr_Format(PyExc_TypeError,
                     "messages[%zd] must be a tuple (properties, body, ...), not %.200s", index,
                     Py_TYPE(item)->tp_name);
        return -1;
    }
    *properties = PyTuple_GET_ITEM(item, 0);
    *body = PyTuple_GET_ITEM(item, 1);
    if (!PyBytes_Check(*properties) || !PyBytes_Check(*body)) {
        PyErr_Format(PyExc_TypeError,
                     "messages[%zd] must hold bytes properties and body, not %.200s and %.200s",
                     index, Py_TYPE(*properties)->tp_name, Py_TYPE(*body)->tp_name);
        return -1;
    }
    return 0;
}

/* One record at `out`, which has room for it; returns its size. */
static size_t
write_record(unsigned char *out, uint64_t offset, int64_t timestamp_ms, PyObject *exchange,
             PyObject *routing_key, PyObject *properties, PyObject *body)
{
    size_t exchange_len = (size_t)PyBytes_GET_SIZE(exchange);
    size_t routing_key_len = (size_t)PyBytes_GET_SIZE(routing_key);
    size_t properties_len = (size_t)PyBytes_GET_SIZE(properties);
    size_t body_len = (size_t)PyBytes_GET_SIZE(body);
    size_t size = RECORD_HEADER_BYTES + exchange_len + routing_key_len + properties_len + body_len;
    /* The caller checked that size - 4 fits the u32 length, so these casts are exact. */
    store_le32(out + RECORD_LENGTH_AT, (uint32_t)(size - 4));
    store_le64(out + RECORD_OFFSET_AT, offset);
    store_le64(out + RECORD_TIMESTAMP_AT, (uint64_t)timestamp_ms); /* two's complement i64 */
    out[RECORD_EXCHANGE_LEN_AT] = (unsigned char)exchange_len;
    out[RECORD_ROUTING_KEY_LEN_AT] = (unsigned char)routing_key_len;
    store_le16(out + RECORD_FLAGS_AT, 0);
    store_le32(out + RECORD_PROPERTIES_LEN_AT, (uint32_t)properties_len);
    unsigned char *p = out + RECORD_HEADER_BYTES;
    memcpy(p, PyBytes_AS_STRING(exchange), exchange_len);
    p += exchange_len;
    memcpy(p, PyBytes_AS_STRING(routing_key), routing_key_len);
    p += routing_key_len;
    memcpy(p, PyBytes_AS_STRING(properties), properties_len);
    p += properties_len;
    memcpy(p, PyBytes_AS_STRING(body), body_len);
    /* One CRC pass over the record just written, while it is still in cache. */
    uint32_t crc = crc32c_update(0xFFFFFFFFu, out + RECORD_CRC_FROM, size - RECORD_CRC_FROM);
    store_le32(out + RECORD_CRC_AT, crc ^ 0xFFFFFFFFu);
    return size;
}

PyDoc_STRVAR(encode_records_doc,
"encode_records(buffer, first_offset, timestamp_ms, exchange, routing_key, messages, start,\n"
"               start_limit, end_limit, record_bytes_max, /) -> int\n"
"\n"
"Append the records of messages[start], messages[start + 1], ... to buffer, with offsets\n"
"first_offset, first_offset + 1, ...; return the index of the first message not encoded.\n"
"See _records.pyi for the limits and the errors.");

static PyObject *
encode_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* METH_FASTCALL with positional arguments only: a run is often one message long, so
     * the call itself is part of the per-message cost. */
    if (nargs != ENCODE_RECORDS_NARGS) {
        PyErr_Format(PyExc_TypeError,
                     "encode_records() takes exactly %d positional arguments (%zd given)",
                     ENCODE_RECORDS_NARGS, nargs);
        return NULL;
    }
    PyObject *buffer = args[0];
    PyObject *exchange = args[3];
    PyObject *routing_key = args[4];
    PyObject *messages = args[5];
    if (!PyByteArray_Check(buffer)) {
        PyErr_Format(PyExc_TypeError, "buffer must be a bytearray, not %.200s",
                     Py_TYPE(buffer)->tp_name);
        return NULL;
    }
    if (!PyLong_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "first_offset and timestamp_ms must be ints");
        return NULL;
    }
    /* OverflowError below 0 or past 2**64 - 1: the offset field is a u64. */
    unsigned long long first_offset = PyLong_AsUnsignedLongLong(args[1]);
    if (first_offset == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    /* OverflowError outside the i64 timestamp field. */
    long long timestamp_ms = PyLong_AsLongLong(args[2]);
    if (timestamp_ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (arg_shortstr(exchange, "exchange") < 0 || arg_shortstr(routing_key, "routing_key") < 0) {
        return NULL;
    }
    if (!PyList_Check(messages)) {
        PyErr_Format(PyExc_TypeError, "messages must be a list, not %.200s",
                     Py_TYPE(messages)->tp_name);
        return NULL;
    }
    Py_ssize_t start, start_limit, end_limit, record_bytes_max;
    if (arg_count(args[6], "start", &start) < 0 ||
        arg_count(args[7], "start_limit", &start_limit) < 0 ||
        arg_count(args[8], "end_limit", &end_limit) < 0 ||
        arg_count(args[9], "record_bytes_max", &record_bytes_max) < 0) {
        return NULL;
    }
    Py_ssize_t message_count = PyList_GET_SIZE(messages);
    if (start > message_count) {
        PyErr_Format(PyExc_ValueError, "start %zd is past the end of messages (%zd)", start,
                     message_count);
        return NULL;
    }

    /* Pass 1: validate the run and find where it stops, before touching the buffer, so
     * that an error appends nothing. Sizes are u64: no sum of in-memory lengths wraps. */
    uint64_t head_bytes = RECORD_HEADER_BYTES + (uint64_t)PyBytes_GET_SIZE(exchange) +
                          (uint64_t)PyBytes_GET_SIZE(routing_key);
    uint64_t run_bytes = 0; /* from the buffer's length at the call */
    Py_ssize_t stop = start;
    for (; stop < message_count; stop++) {
        if (run_bytes >= (uint64_t)start_limit) {
            break; /* the record would start at or after start_limit */
        }
        PyObject *properties, *body;
        if (message_parts(messages, stop, &properties, &body) < 0) {
            return NULL;
        }
        uint64_t size = head_bytes + (uint64_t)PyBytes_GET_SIZE(properties) +
                        (uint64_t)PyBytes_GET_SIZE(body);
        if (size > (uint64_t)record_bytes_max || size > (uint64_t)end_limit - run_bytes) {
            break; /* run_bytes <= end_limit holds: every record so far ended within it */
        }
        if (size - 4 > U32_MAX) {
            PyErr_Format(PyExc_OverflowError,
                         "record of messages[%zd] (%llu bytes) does not fit the u32 length field",
                         stop, (unsigned long long)size);
            return NULL;
        }
        if ((uint64_t)(stop - start) > UINT64_MAX - first_offset) {
            PyErr_Format(PyExc_OverflowError,
                         "the offset of messages[%zd] does not fit the u64 offset field", stop);
            return NULL;
        }
        run_bytes += size;
    }
    if (stop == start) {
        return PyLong_FromSsize_t(stop);
    }

    /* Pass 2: grow the buffer once and write the records in place. No Python code runs
     * between the passes, so the borrowed list items are still there and unchanged. */
    Py_ssize_t old_len = PyByteArray_GET_SIZE(buffer);
    if (run_bytes > (uint64_t)(PY_SSIZE_T_MAX - old_len)) {
        PyErr_NoMemory();
        return NULL;
    }
    /* BufferError while a memoryview of buffer is alive; the buffer is unchanged then. */
    if (PyByteArray_Resize(buffer, old_len + (Py_ssize_t)run_bytes) < 0) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(buffer) + old_len;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *item = PyList_GET_ITEM(messages, i);
        out += write_record(out, first_offset + (uint64_t)(i - start), timestamp_ms, exchange,
                            routing_key, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1));
    }
    PyObject *result = PyLong_FromSsize_t(stop);
    if (result == NULL) {
        /* Appending nothing on any error is the contract; shrinking cannot fail. */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        (void)PyByteArray_Resize(buffer, old_len);
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    return result;
}

static PyObject *
crc32c_call(const char *name, PyObject *const *args, Py_ssize_t nargs, int portable)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 1 or 2 positional arguments (%zd given)",
                     name, nargs);
        return NULL;
    }
    uint32_t value = 0;
    if (nargs == 2) {
        if (!PyLong_Check(args[1])) {
            PyErr_Format(PyExc_TypeError, "value must be an int, not %.200s",
                         Py_TYPE(args[1])->tp_name);
            return NULL;
        }
        unsigned long long v = PyLong_AsUnsignedLongLong(args[1]);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        if (v > U32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "value must be a CRC32C, below 2**32");
            return NULL;
        }
        value = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    size_t len = (size_t)view.len;
    /* `value` is a finished CRC: undo its final xor to continue from it. */
    uint32_t crc = value ^ 0xFFFFFFFFu;
    if (len >= CRC_GIL_RELEASE_BYTES) {
        /* The exported buffer cannot be resized or freed while we hold the view. */
        Py_BEGIN_ALLOW_THREADS
        crc = portable ? crc32c_update_portable(crc, data, len) : crc32c_update(crc, data, len);
        Py_END_ALLOW_THREADS
    }
    else {
        crc = portable ? crc32c_update_portable(crc, data, len) : crc32c_update(crc, data, len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc ^ 0xFFFFFFFFu);
}

PyDoc_STRVAR(crc32c_doc,
"crc32c(data, value=0, /) -> int\n"
"\n"
"CRC32C of data, continuing from the CRC `value`: crc32c.crc32c(data, value) of the\n"
"crc32c package. Uses SSE4.2's crc32 instruction when the CPU has it.");

static PyObject *
py_crc32c(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return crc32c_call("crc32c", args, nargs, 0);
}

PyDoc_STRVAR(crc32c_portable_doc,
"_crc32c_portable(data, value=0, /) -> int\n"
"\n"
"crc32c() with the table-driven code only, so that tests check it on any CPU.");

static PyObject *
py_crc32c_portable(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return crc32c_call("_crc32c_portable", args, nargs, 1);
}

/* The record at `r`, with `avail` bytes from it on, checked: its length, flags, fields,
 * CRC32C and that its offset is `expected`. Returns NULL with its size (4 + length) in
 * `*size`, RECORD_PARTIAL when it is not wholly there, or a text naming the damage. */
static PyMethodDef records_methods[] = {
    {"entry_crcs", (PyCFunction)(void (*)(void))entry_crcs, METH_FASTCALL, entry_crcs_doc},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records, METH_FASTCALL,
     encode_records_doc},
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_FASTCALL, crc32c_doc},
    {"check_records", (PyCFunction)(void (*)(void))check_records, METH_FASTCALL,
     check_records_doc},
    {"scan_records", (PyCFunction)(void (*)(void))scan_records, METH_FASTCALL,
     scan_records_doc},
    {"resync_records", (PyCFunction)(void (*)(void))resync_records, METH_FASTCALL,
     resync_records_doc},
    {"_crc32c_portable", (PyCFunction)(void (*)(void))py_crc32c_portable, METH_FASTCALL,
     crc32c_portable_doc},
    {NULL, NULL, 0, NULL},
};

static int
records_exec(PyObject *module)
{
    /* The tables and the CPU flag are process-wide constants: every (sub)interpreter that
     * imports the module computes the same values. */
    crc32c_init();
    return PyModule_AddObjectRef(module, "CRC32C_HARDWARE", crc_hardware ? Py_True : Py_False);
}

static PyModuleDef_Slot records_slots[] = {
    {Py_mod_exec, records_exec},
    {0, NULL},
};

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamq.log._records",
    .m_doc = MODULE_DOC,
    .m_size = 0,
    .m_methods = records_methods,
    .m_slots = records_slots,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    return PyModuleDef_Init(&records_module);
}

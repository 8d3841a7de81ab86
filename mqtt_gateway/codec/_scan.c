/*
 * mqtt_gateway.codec._scan: a run of whole MQTT PUBLISH packets split from a receive
 * buffer in one call (STYLE.md section 11, the hot path). See MODULE_DOC below for what it
 * owns and why it is C.
 *
 * PUBLISH layout (MQTT 3.1.1 section 3.3, 5.0 section 3.3):
 *
 *   byte 0          0x30 | DUP << 3 | QoS << 1 | RETAIN
 *   1-4 bytes       remaining length, a Variable Byte Integer in its shortest form
 *   u16 + bytes     topic name, UTF-8
 *   u16             packet identifier (QoS 1 and 2 only), never 0
 *   varint + bytes  properties (5.0 only)
 *   rest            payload
 *
 * Rules:
 * 1. It accepts a packet only when `framing.Decoder` would decode it to the same
 *    `Publish` (the unit tests and tests/fuzz/test_mqtt_packets.py use the decoder as the
 *    oracle), and only the common case: QoS 0 or 1, no RETAIN, the run's first topic
 *    name, no properties. Everything else it leaves to the packet-by-packet path, which
 *    reports the error: it stops, it never raises for the bytes it reads.
 * 2. Every read is bounds-checked against the buffer before it happens.
 * 3. No Python code runs per message: only object allocation (the routing key's callable
 *    runs once per run).
 *
 * Build in place (setup.py does the same for the package):
 *   gcc -O2 -Wall -Wextra -Werror -shared -fPIC $(python3-config --includes) \
 *       mqtt_gateway/codec/_scan.c -o mqtt_gateway/codec/_scan$(python3-config --extension-suffix)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "../../streamq/_steal_tuple.h" /* steal_tuple */

PyDoc_STRVAR(MODULE_DOC,
"Split a run of whole MQTT PUBLISH packets from a receive buffer in one call.\n"
"\n"
"This module owns `scan_publishes`, the C form of the MQTT receive loop's fast path:\n"
"consecutive QoS 0 and 1 PUBLISH packets to one topic name, without RETAIN and without\n"
"MQTT 5 properties, as the message tuples the broker's `publish_run` stores, with the\n"
"PUBACKs of the QoS 1 ones already encoded (4 bytes each, every level's short form).\n"
"It must not judge anything the codec's `Decoder` would refuse: it stops at the first\n"
"packet it does not accept, and the caller decodes that one the slow way, which reports\n"
"errors with the right reason code. It keeps no state and never raises for the bytes\n"
"it reads.\n"
"\n"
"Why C (STYLE.md section 11): py-spy on the broker under `streamq perf mqtt --qos 1`\n"
"showed the codec's decoding at 27% of the gateway's time and routing and appending\n"
"message by message at 34% (docs/benchmarks.md); a QoS 1 publisher's round trip is\n"
"mostly that CPU, the fsyncs taking 0.2 ms each. The topic name is decoded and checked\n"
"once per run; the rest is a bounds-checked walk and one bytes object per payload.");

enum {
    PUBLISH_TYPE = 3,
    TYPE_SHIFT = 4,
    FLAG_RETAIN = 0x01,
    FLAG_DUP = 0x08,
    QOS_SHIFT = 1,
    QOS_MASK = 0x03,
    VARINT_BYTES_MAX = 4,
    VARINT_CONTINUE = 0x80,
    VARINT_DIGIT = 0x7F,
    TOPIC_LEVELS_MAX = 128, /* codec/constants.py: separators must stay below this */
    PUBACK_BYTE0 = 0x40,
    PUBACK_REMAINING = 2,
    PUBACK_BYTES = 4,
    KINDS = 4, /* QoS << 1 | DUP */
};

/* One accepted PUBLISH as spans into the buffer. */
typedef struct {
    Py_ssize_t topic;      /* offset of the topic name's bytes */
    Py_ssize_t topic_size;
    Py_ssize_t payload;
    Py_ssize_t payload_size;
    unsigned kind;         /* QoS << 1 | DUP */
    unsigned packet_id;    /* QoS 1; 0 for QoS 0 */
    Py_ssize_t end;        /* offset after the packet */
} Packet;

/* A Variable Byte Integer at `at` in its shortest form (MQTT-1.5.5-1); the offset after
 * it, or -1 when it is incomplete or malformed (the slow path judges which). */
static Py_ssize_t
read_varint(const unsigned char *data, Py_ssize_t length, Py_ssize_t at, Py_ssize_t *value)
{
    Py_ssize_t result = 0;
    for (int i = 0; i < VARINT_BYTES_MAX; i++) {
        if (at + i >= length) {
            return -1;
        }
        unsigned byte = data[at + i];
        result |= (Py_ssize_t)(byte & VARINT_DIGIT) << (7 * i);
        if (!(byte & VARINT_CONTINUE)) {
            if (byte == 0 && i > 0) {
                return -1;
            }
            *value = result;
            return at + i + 1;
        }
    }
    return -1;
}

/* Whether a topic name's bytes are one `check_topic_name` and the decoder's UTF-8 rules
 * accept: not empty, strict UTF-8 (Python's codec), no U+0000, no wildcard, fewer than
 * TOPIC_LEVELS_MAX separators. Its decoded form in `*topic` (a new reference) when so;
 * never leaves an exception set. */
static int
topic_accepted(const unsigned char *name, Py_ssize_t size, PyObject **topic)
{
    if (size == 0 || memchr(name, 0, (size_t)size) != NULL || memchr(name, '+', (size_t)size)
        || memchr(name, '#', (size_t)size)) {
        return 0;
    }
    Py_ssize_t separators = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        separators += name[i] == '/';
    }
    if (separators >= TOPIC_LEVELS_MAX) {
        return 0;
    }
    *topic = PyUnicode_DecodeUTF8((const char *)name, size, "strict");
    if (*topic == NULL) {
        PyErr_Clear(); /* ill-formed UTF-8 (or no memory): the slow path decides */
        return 0;
    }
    return 1;
}

/* The PUBLISH at `at` when it is one a run may hold (rule 1), with the topic name's
 * bytes equal to `first_topic` unless that is NULL. 1 with `*packet` filled, else 0. */
static int
accept_packet(const unsigned char *data, Py_ssize_t length, Py_ssize_t at, int v5,
              Py_ssize_t bytes_max, const unsigned char *first_topic, Py_ssize_t first_size,
              Packet *packet)
{
    if (length - at < 2) {
        return 0;
    }
    unsigned byte0 = data[at];
    unsigned qos = (byte0 >> QOS_SHIFT) & QOS_MASK;
    unsigned dup = (byte0 & FLAG_DUP) != 0;
    if (byte0 >> TYPE_SHIFT != PUBLISH_TYPE || (byte0 & FLAG_RETAIN) || qos > 1
        || (dup && qos == 0)) {
        return 0;
    }
    Py_ssize_t remaining;
    Py_ssize_t body = read_varint(data, length, at + 1, &remaining);
    if (body < 0 || body + remaining - at > bytes_max || remaining > length - body) {
        return 0;
    }
    Py_ssize_t end = body + remaining;
    if (end - body < 2) {
        return 0;
    }
    Py_ssize_t topic_size = (Py_ssize_t)data[body] << 8 | data[body + 1];
    Py_ssize_t p = body + 2;
    if (topic_size > end - p) {
        return 0;
    }
    if (first_topic != NULL
        && (topic_size != first_size || memcmp(data + p, first_topic, (size_t)topic_size))) {
        return 0;
    }
    packet->topic = p;
    packet->topic_size = topic_size;
    p += topic_size;
    packet->packet_id = 0;
    if (qos) {
        if (end - p < 2) {
            return 0;
        }
        packet->packet_id = (unsigned)data[p] << 8 | data[p + 1];
        if (packet->packet_id == 0) {
            return 0;
        }
        p += 2;
    }
    if (v5) {
        if (end - p < 1 || data[p] != 0) { /* a property list, or none at all */
            return 0;
        }
        p += 1;
    }
    packet->payload = p;
    packet->payload_size = end - p;
    packet->kind = qos << 1 | dup;
    packet->end = end;
    return 1;
}

/* An integer argument >= 0; -1 with TypeError or ValueError. */
static int
non_negative(PyObject *value, const char *name, Py_ssize_t *out)
{
    Py_ssize_t number = PyNumber_AsSsize_t(value, PyExc_OverflowError);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (number < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0", name);
        return -1;
    }
    *out = number;
    return 0;
}

/* The checked `properties` argument: a tuple of KINDS bytes objects. */
static int
check_properties(PyObject *properties)
{
    if (!PyTuple_Check(properties) || PyTuple_GET_SIZE(properties) != KINDS) {
        PyErr_SetString(PyExc_TypeError, "properties must be a tuple of 4 bytes objects");
        return -1;
    }
    for (Py_ssize_t i = 0; i < KINDS; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(properties, i))) {
            PyErr_SetString(PyExc_TypeError, "properties must be a tuple of 4 bytes objects");
            return -1;
        }
    }
    return 0;
}

/* Fill `messages`, `acks` and `kinds` (of their exact sizes) from the `count` packets
 * from `position`, all accepted by the first pass; -1 with MemoryError. */
static int
fill_run(const unsigned char *data, Py_ssize_t length, Py_ssize_t position, int v5,
         PyObject *properties, PyObject *exchange, PyObject *routing_key, PyObject *messages,
         PyObject *acks, PyObject *kinds)
{
    unsigned char *ack = (unsigned char *)PyBytes_AS_STRING(acks);
    char *kind = PyBytes_AS_STRING(kinds);
    Py_ssize_t at = position;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        Packet packet;
        int accepted = accept_packet(data, length, at, v5, PY_SSIZE_T_MAX, NULL, 0, &packet);
        assert(accepted);
        (void)accepted; /* read by the assert only */
        PyObject *item[5] = {
            PyTuple_GET_ITEM(properties, packet.kind),
            PyBytes_FromStringAndSize((const char *)data + packet.payload, packet.payload_size),
            exchange,
            routing_key,
            PyLong_FromLong(0),
        };
        Py_INCREF(item[0]);
        Py_INCREF(item[2]);
        Py_INCREF(item[3]);
        PyObject *message = steal_tuple(item, 5);
        if (message == NULL) {
            return -1;
        }
        PyList_SET_ITEM(messages, i, message);
        kind[i] = (char)packet.kind;
        if (packet.packet_id) {
            ack[0] = PUBACK_BYTE0;
            ack[1] = PUBACK_REMAINING;
            ack[2] = (unsigned char)(packet.packet_id >> 8);
            ack[3] = (unsigned char)packet.packet_id;
            ack += PUBACK_BYTES;
        }
        at = packet.end;
    }
    return 0;
}

/* The result tuple of a run of `count` packets (`acks_count` of them QoS 1) from
 * `position` to `end`; NULL with MemoryError. Borrows every argument. */
static PyObject *
build_run(const unsigned char *data, Py_ssize_t length, Py_ssize_t position, Py_ssize_t count,
          Py_ssize_t acks_count, int v5, PyObject *properties, PyObject *exchange,
          PyObject *routing_key, PyObject *topic, Py_ssize_t end)
{
    PyObject *messages = PyList_New(count);
    PyObject *acks = PyBytes_FromStringAndSize(NULL, acks_count * PUBACK_BYTES);
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, count);
    if (messages == NULL || acks == NULL || kinds == NULL
        || fill_run(data, length, position, v5, properties, exchange, routing_key, messages,
                    acks, kinds) < 0) {
        Py_XDECREF(messages); /* unset items are NULL, which the list skips */
        Py_XDECREF(acks);
        Py_XDECREF(kinds);
        return NULL;
    }
    Py_INCREF(topic);
    Py_INCREF(routing_key);
    PyObject *items[6] = {PyLong_FromSsize_t(end), topic, routing_key, messages, acks, kinds};
    return steal_tuple(items, 6);
}

/* The result when no packet is accepted: (position, "", "", [], b"", b""). */
static PyObject *
empty_result(Py_ssize_t position)
{
    PyObject *items[6] = {
        PyLong_FromSsize_t(position),
        PyUnicode_FromStringAndSize(NULL, 0),
        PyUnicode_FromStringAndSize(NULL, 0),
        PyList_New(0),
        PyBytes_FromStringAndSize(NULL, 0),
        PyBytes_FromStringAndSize(NULL, 0),
    };
    return steal_tuple(items, 6);
}

/* The first pass: how many packets from `position` a run takes (rule 1), how many are
 * QoS 1, and where the last ends; the topic name decoded (a new reference) when any. */
static Py_ssize_t
count_run(const unsigned char *data, Py_ssize_t length, Py_ssize_t position, int v5,
          Py_ssize_t bytes_max, Py_ssize_t count_max, PyObject **topic,
          Py_ssize_t *acks_count, Py_ssize_t *end)
{
    Packet packet;
    *topic = NULL;
    *acks_count = 0;
    *end = position;
    if (!accept_packet(data, length, position, v5, bytes_max, NULL, 0, &packet)
        || !topic_accepted(data + packet.topic, packet.topic_size, topic)) {
        return 0;
    }
    const unsigned char *first = data + packet.topic;
    Py_ssize_t first_size = packet.topic_size;
    Py_ssize_t count = 0;
    do {
        count++;
        *acks_count += packet.packet_id != 0;
        *end = packet.end;
    } while (count < count_max
             && accept_packet(data, length, *end, v5, bytes_max, first, first_size, &packet));
    return count;
}

PyDoc_STRVAR(scan_publishes_doc,
"scan_publishes(data, position, v5, packet_bytes_max, count_max, properties, exchange,\n"
"               routing_key_of, /)\n"
"--\n"
"\n"
"Read consecutive whole PUBLISH packets from `data` at `position` (module docstring).\n"
"\n"
"Returns `(end, topic, routing_key, messages, acks, kinds)`: `topic` the run's topic\n"
"name, `routing_key` what `routing_key_of(topic)` returned (called once), `messages`\n"
"one `(properties[kind], payload, exchange, routing_key, 0)` tuple per packet, where\n"
"`kind` is QoS << 1 | DUP, `acks` the PUBACKs of the QoS 1 packets in order (4 bytes\n"
"each), `kinds` one kind byte per packet, `end` the offset after the last packet. `v5`:\n"
"the connection speaks MQTT 5.0 (a property length follows the packet identifier).\n"
"A packet longer than `packet_bytes_max`, or past `count_max` packets, is not taken.\n"
"With none it returns `(position, '', '', [], b'', b'')`.\n"
"\n"
"Never raises for the bytes it reads. Raises TypeError for an argument of the wrong\n"
"type, ValueError for a negative integer, `position > len(data)` or `count_max < 1`,\n"
"and what `routing_key_of` raises.");

/* scan_publishes on a buffer held open, its arguments checked. */
static PyObject *
scan_view(const Py_buffer *view, Py_ssize_t position, int v5, Py_ssize_t bytes_max,
          Py_ssize_t count_max, PyObject *const *args)
{
    if (position > view->len) {
        PyErr_Format(PyExc_ValueError, "position %zd is past the end of the data (%zd bytes)",
                     position, view->len);
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view->buf;
    PyObject *topic;
    Py_ssize_t acks_count, end;
    Py_ssize_t count =
        count_run(data, view->len, position, v5, bytes_max, count_max, &topic, &acks_count, &end);
    if (count == 0) {
        return empty_result(position);
    }
    PyObject *result = NULL;
    PyObject *routing_key = PyObject_CallOneArg(args[7], topic);
    if (routing_key != NULL) {
        result = build_run(data, view->len, position, count, acks_count, v5, args[5], args[6],
                           routing_key, topic, end);
        Py_DECREF(routing_key);
    }
    Py_DECREF(topic);
    return result;
}

static PyObject *
scan_publishes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "scan_publishes() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t position, bytes_max, count_max;
    if (non_negative(args[1], "position", &position) < 0
        || non_negative(args[3], "packet_bytes_max", &bytes_max) < 0
        || non_negative(args[4], "count_max", &count_max) < 0 || check_properties(args[5]) < 0) {
        return NULL;
    }
    int v5 = PyObject_IsTrue(args[2]);
    if (v5 < 0) {
        return NULL;
    }
    if (count_max < 1) {
        PyErr_SetString(PyExc_ValueError, "count_max must be >= 1");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = scan_view(&view, position, v5, bytes_max, count_max, args);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef scan_methods[] = {
    {"scan_publishes", (PyCFunction)(void (*)(void))scan_publishes, METH_FASTCALL,
     scan_publishes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mqtt_gateway.codec._scan",
    .m_doc = MODULE_DOC,
    .m_size = 0,
    .m_methods = scan_methods,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModuleDef_Init(&scan_module);
}

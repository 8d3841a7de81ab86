/*
 * amqp_gateway.codec._scan's shared parts, for its two units: `_scan.c` (scan_publishes
 * and the module) and `_scan_acks.c` (scan_acks): the frame and method constants, the
 * big-endian readers, the frame envelope check, and the argument and result helpers.
 * Everything here is static inline. Include after <Python.h>.
 */
#ifndef STREAMQ_SCAN_FRAMES_H
#define STREAMQ_SCAN_FRAMES_H

#include <stdint.h>
#include <string.h>

/* Spec 4.2.3: frame types and the frame-end octet. */
enum {
    FRAME_METHOD = 1,
    FRAME_HEADER = 2,
    FRAME_BODY = 3,
    FRAME_END = 0xCE,
    FRAME_HEARTBEAT = 8,
    FRAME_HEADER_BYTES = 7, /* type, channel, size */
    BASIC_CLASS = 60,
    BASIC_PUBLISH = 40,
    BASIC_ACK = 80,
    BASIC_REJECT = 90,
    BASIC_NACK = 120,
    /* class, method, delivery-tag, one octet of bits: all three methods (spec 1.8.3). */
    ACK_PAYLOAD_BYTES = 2 + 2 + 8 + 1,
    ACK_FRAME_BYTES = FRAME_HEADER_BYTES + ACK_PAYLOAD_BYTES + 1,
    HEARTBEAT_FRAME_BYTES = FRAME_HEADER_BYTES + 1,
    /* The kind byte of an entry of `scan_acks`; 0 is basic.ack without `multiple`. */
    KIND_MULTIPLE = 1,
    KIND_REQUEUE = 2,
    KIND_NACK = 4,
    KIND_REJECT = 8,
    /* Method frame header, class, method, ticket, exchange length. */
    PUBLISH_FIXED_BYTES = FRAME_HEADER_BYTES + 2 + 2 + 2 + 1,
    /* Payload bytes besides the two shortstrs: ids, ticket, two length octets, bits. */
    PUBLISH_PAYLOAD_FIXED_BYTES = 2 + 2 + 2 + 1 + 1 + 1,
    /* Content header payload: class, weight, body-size (spec 4.2.6.1). */
    HEADER_FIELDS_BYTES = 2 + 2 + 8,
    /* The property flag word is mandatory, so the payload holds at least 14 bytes
     * (content.decode_content_header raises FrameError below that). */
    HEADER_PAYLOAD_MIN_BYTES = HEADER_FIELDS_BYTES + 2,
};

static inline uint32_t
read_u16(const unsigned char *p)
{
    return (uint32_t)p[0] << 8 | (uint32_t)p[1];
}

static inline uint32_t
read_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint64_t
read_u64(const unsigned char *p)
{
    return (uint64_t)read_u32(p) << 32 | read_u32(p + 4);
}

/* Reads the frame envelope at `at` and checks it: type, size <= payload_max, and the
 * whole frame, frame-end octet included, inside the buffer with 0xCE there (spec 4.2.3:
 * "frame-end" must be %xCE, else the frame is malformed). Returns the payload size, or
 * -1 when the frame is not complete and well formed. */
static inline Py_ssize_t
frame_payload_size(const unsigned char *data, Py_ssize_t length, Py_ssize_t at,
                   unsigned kind, uint32_t channel, Py_ssize_t payload_max)
{
    if (length - at < FRAME_HEADER_BYTES) {
        return -1; /* the envelope itself is incomplete */
    }
    const unsigned char *p = data + at;
    /* Spec 4.2.6: content frames belong to the channel of the method they follow. */
    if (p[0] != kind || read_u16(p + 1) != channel) {
        return -1;
    }
    uint32_t size = read_u32(p + 3);
    /* Spec 4.2.3 and frame_max: the caller passes the largest payload it accepts,
     * frame_max itself (frame_max - 8 plus the 8 bytes of slack RabbitMQ allows a
     * received frame, frame.received_payload_max); a larger one is a FRAME_ERROR the
     * slow path reports. */
    if ((uint64_t)size > (uint64_t)payload_max) {
        return -1;
    }
    /* The payload and its frame-end octet must both be in the buffer. The subtraction
     * cannot overflow: at + 7 <= length here. */
    if ((uint64_t)size >= (uint64_t)(length - at - FRAME_HEADER_BYTES)) {
        return -1;
    }
    if (p[FRAME_HEADER_BYTES + size] != FRAME_END) {
        return -1;
    }
    return (Py_ssize_t)size;
}

#include "../../streamq/_steal_tuple.h" /* steal_tuple */

/* An integer argument >= 0 (anything with __index__); a value past PY_SSIZE_T_MAX is
 * clamped to it, which no buffer reaches. Returns -1 with TypeError or ValueError. */
static inline int
non_negative(PyObject *value, const char *name, Py_ssize_t *out)
{
    PyObject *index = PyNumber_Index(value);
    if (index == NULL) {
        return -1;
    }
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow < 0 || (overflow == 0 && number < 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0", name);
        return -1;
    }
    *out = (overflow > 0 || number > PY_SSIZE_T_MAX) ? PY_SSIZE_T_MAX : (Py_ssize_t)number;
    return 0;
}

/* The scanned buffer of scan_publishes and scan_acks, with their common argument checks:
 * 0 with `view` held (release it), or -1 with ValueError or the buffer's error set. */
static inline int
open_scan(PyObject *data, Py_ssize_t position, Py_ssize_t count_max, Py_buffer *view)
{
    if (count_max < 1) {
        PyErr_SetString(PyExc_ValueError, "count_max must be >= 1");
        return -1;
    }
    if (PyObject_GetBuffer(data, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (position > view->len) {
        PyErr_Format(PyExc_ValueError, "position %zd is past the end of the data (%zd bytes)",
                     position, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* scan_acks (_scan_acks.c), in the module's method table (_scan.c). */
PyObject *scan_acks(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char scan_acks_doc[];

#endif

/*
 * amqp_gateway.codec._scan's scan_acks: the delivery tags of consecutive basic.ack,
 * basic.nack and basic.reject methods on one channel, split from a receive buffer in one
 * call (STYLE.md section 11, the hot path; why, in _scan.c's MODULE_DOC).
 *
 *   ack frame      type=1 | channel u16 | size u32=13 | class u16=60 |
 *                  method u16=80 (ack), 90 (reject) or 120 (nack) | delivery-tag u64 |
 *                  bits u8 | 0xCE
 *   heartbeat      type=8 | channel u16=0 | size u32=0 | 0xCE
 *
 * It accepts an ack, nack or reject exactly when `read_frame` and `decode_method` accept
 * it, on the run's one channel; everything else it leaves to the frame-by-frame path: it
 * stops, it never raises for the bytes it reads. Every read is bounds-checked first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "_scan_frames.h"

/* Whether the 8 bytes at `at` are an empty heartbeat on channel 0, the one form
 * `check_heartbeat_frame` accepts (spec 4.2.7). */
static inline int
is_heartbeat(const unsigned char *data, Py_ssize_t length, Py_ssize_t at)
{
    static const unsigned char heartbeat[HEARTBEAT_FRAME_BYTES] = {
        FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END,
    };
    return length - at >= HEARTBEAT_FRAME_BYTES
           && memcmp(data + at, heartbeat, HEARTBEAT_FRAME_BYTES) == 0;
}

/* The kind byte of the ack, nack or reject frame at `at` (its channel in `*channel`), or
 * -1 unless the frame is one that `read_frame` and `decode_method` accept: a whole method
 * frame with the frame-end octet, a payload of exactly 13 bytes (decode_basic_ack and the
 * generic decoder refuse any other size with 502) and class 60. Only the bits the spec
 * defines count, as in the decoders: multiple (ack, nack) and requeue (nack, reject). */
static int
ack_kind(const unsigned char *data, Py_ssize_t length, Py_ssize_t at, Py_ssize_t payload_max,
         uint32_t *channel)
{
    if (length - at < ACK_FRAME_BYTES) {
        return -1;
    }
    const unsigned char *p = data + at;
    *channel = read_u16(p + 1);
    Py_ssize_t size = frame_payload_size(data, length, at, FRAME_METHOD, *channel, payload_max);
    if (size != ACK_PAYLOAD_BYTES || read_u16(p + 7) != BASIC_CLASS) {
        return -1;
    }
    unsigned bits = p[FRAME_HEADER_BYTES + ACK_PAYLOAD_BYTES - 1];
    switch (read_u16(p + 9)) {
    case BASIC_ACK: /* multiple */
        return (int)(bits & 1 ? KIND_MULTIPLE : 0);
    case BASIC_NACK: /* multiple, requeue */
        return (int)(KIND_NACK | (bits & 1 ? KIND_MULTIPLE : 0) | (bits & 2 ? KIND_REQUEUE : 0));
    case BASIC_REJECT: /* requeue */
        return (int)(KIND_REJECT | (bits & 1 ? KIND_REQUEUE : 0));
    default:
        return -1;
    }
}

/* The first pass: how many acks from `position` make a run (on one channel, at most
 * `count_max`, empty heartbeats between them skipped), their channel, the OR of their
 * kinds and the end of the last one. Allocates nothing. */
static Py_ssize_t
count_acks(const unsigned char *data, Py_ssize_t length, Py_ssize_t position,
           Py_ssize_t payload_max, Py_ssize_t count_max, uint32_t *channel, unsigned *flags,
           Py_ssize_t *end)
{
    Py_ssize_t count = 0;
    Py_ssize_t at = position;
    *end = position;
    while (count < count_max) {
        /* A heartbeat only between acks: one before the first, or after the last, is
         * left to the frame-by-frame path (`end` stays before it). */
        if (count > 0 && is_heartbeat(data, length, at)) {
            at += HEARTBEAT_FRAME_BYTES;
            continue;
        }
        uint32_t frame_channel;
        int kind = ack_kind(data, length, at, payload_max, &frame_channel);
        if (kind < 0 || (count > 0 && frame_channel != *channel)) {
            break;
        }
        *channel = frame_channel;
        *flags |= (unsigned)kind;
        count++;
        at += ACK_FRAME_BYTES;
        *end = at;
    }
    return count;
}

const char scan_acks_doc[] = PyDoc_STR(
"scan_acks(data, position, payload_max, count_max, /)\n"
"--\n"
"\n"
"Read consecutive basic.ack, basic.nack and basic.reject methods on one channel from\n"
"`data` at `position`.\n"
"\n"
"Returns `(channel, end, tags, kinds, flags)`: `tags` the delivery tags in frame order,\n"
"`kinds` one byte per tag (multiple = 1, requeue = 2, nack = 4, reject = 8; a plain\n"
"basic.ack is 0), `flags` the OR of the kinds, `end` the offset after the last frame\n"
"read. A frame is taken exactly when `read_frame(data, offset, payload_max)` and\n"
"`decode_method` would accept it, on the first frame's channel; at most `count_max`.\n"
"Empty heartbeats on channel 0 between two of them are skipped. With none it returns\n"
"`(0, position, [], b'', 0)`.\n"
"\n"
"Never raises for the bytes it reads: it stops at the first frame it does not accept.\n"
"Raises TypeError when `data` has no buffer or an argument is not an integer, and\n"
"ValueError for a negative argument, `position > len(data)` or `count_max < 1`.");

PyObject *
scan_acks(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "scan_acks() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t position, payload_max, count_max;
    if (non_negative(args[1], "position", &position) < 0
        || non_negative(args[2], "payload_max", &payload_max) < 0
        || non_negative(args[3], "count_max", &count_max) < 0) {
        return NULL;
    }
    Py_buffer view;
    if (open_scan(args[0], position, count_max, &view) < 0) {
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    uint32_t channel = 0;
    unsigned flags = 0;
    Py_ssize_t end;
    Py_ssize_t count =
        count_acks(data, view.len, position, payload_max, count_max, &channel, &flags, &end);
    /* The second pass fills objects of the exact size: every frame up to `end` is an
     * accepted ack or a skipped heartbeat. */
    PyObject *tags = PyList_New(count);
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, count);
    if (tags == NULL || kinds == NULL) {
        PyBuffer_Release(&view);
        Py_XDECREF(tags);
        Py_XDECREF(kinds);
        return NULL;
    }
    char *kind_bytes = PyBytes_AS_STRING(kinds);
    Py_ssize_t at = position;
    for (Py_ssize_t i = 0; i < count; i++) {
        while (data[at] == FRAME_HEARTBEAT) {
            at += HEARTBEAT_FRAME_BYTES;
        }
        uint32_t frame_channel;
        int kind = ack_kind(data, view.len, at, payload_max, &frame_channel);
        assert(kind >= 0 && frame_channel == channel);
        (void)frame_channel; /* read by the assert only */
        PyObject *tag = PyLong_FromUnsignedLongLong(read_u64(data + at + FRAME_HEADER_BYTES + 4));
        if (tag == NULL) {
            PyBuffer_Release(&view);
            Py_DECREF(tags); /* the unset items are NULL, which the list skips */
            Py_DECREF(kinds);
            return NULL;
        }
        PyList_SET_ITEM(tags, i, tag);
        kind_bytes[i] = (char)kind;
        at += ACK_FRAME_BYTES;
    }
    PyBuffer_Release(&view);
    PyObject *items[5] = {
        PyLong_FromUnsignedLong(channel),
        PyLong_FromSsize_t(end),
        tags,
        kinds,
        PyLong_FromUnsignedLong(flags),
    };
    return steal_tuple(items, 5);
}


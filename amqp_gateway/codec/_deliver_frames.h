/*
 * amqp_gateway.codec._deliver's frame writers, shared by its two units: `_deliver.c`
 * (encode_deliver, one delivery from Python arguments, and the module) and
 * `_deliver_runs.c` (deliver_records and deliver_stream_records, runs of deliveries
 * framed straight from segment-log records). Everything here is static inline: the
 * constants of the frames, a bytes-like argument, the big-endian writers of the
 * basic.deliver method frame, the content header and the body frames, and the reader
 * of a segment-log record.
 *
 * Frame layout (AMQP 0-9-1 spec 4.2.3 general frame format, 4.2.6 content framing):
 *
 *   method frame   type=1 | channel u16 | size u32 | class u16=60 | method u16=60 |
 *                  consumer-tag shortstr | delivery-tag u64 | redelivered u8 |
 *                  exchange shortstr | routing-key shortstr | 0xCE
 *   header frame   type=2 | channel u16 | size u32 | class u16=60 | weight u16=0 |
 *                  body-size u64 | property flags + property list | 0xCE
 *   body frames    type=3 | channel u16 | size u32 | at most frame_max - 8 bytes | 0xCE
 *
 * Include after <Python.h>.
 */
#ifndef STREAMQ_DELIVER_FRAMES_H
#define STREAMQ_DELIVER_FRAMES_H

#include <stdint.h>
#include <string.h>

#include "../../streamq/log/_le.h" /* load_le32, load_le64 */

/* Spec 4.2.3 and 1.8.3.9 (basic.deliver is class 60, method 60). */
enum {
    FRAME_METHOD = 1,
    FRAME_HEADER = 2,
    FRAME_BODY = 3,
    FRAME_END = 0xCE,
    FRAME_OVERHEAD_BYTES = 8, /* type, channel, size, frame-end */
    BASIC_CLASS = 60,
    BASIC_DELIVER = 60,
    SHORTSTR_BYTES_MAX = 255,
    CHANNEL_MAX = 65535,
    REDELIVERED_MAX = 255, /* the Python function packs it as an octet ("B") */
    /* Method payload besides the three shortstrs' bytes: ids (4), three length octets,
     * delivery-tag (8), redelivered (1). */
    DELIVER_PAYLOAD_FIXED_BYTES = 4 + 3 + 8 + 1,
    /* Content header payload before the properties: class, weight, body-size. */
    HEADER_FIELDS_BYTES = 2 + 2 + 8,
};

#define FRAME_SIZE_MAX 0xFFFFFFFFu /* the size field is a u32 */

/* A bytes-like argument: where its bytes are, and the buffer to release when one was
 * taken (view.obj is NULL for bytes and str, whose memory the argument itself owns). */
typedef struct {
    const char *data;
    Py_ssize_t size;
    Py_buffer view;
} Bytes;

static inline void
bytes_release(Bytes *b)
{
    if (b->view.obj != NULL) {
        PyBuffer_Release(&b->view);
    }
}

/* bytes directly; anything else through the buffer protocol, as `bytearray +=` takes
 * it: a contiguous buffer, else TypeError with the message `+=` gives. Its size counts
 * bytes, not items: a memoryview of another format gives its raw bytes. */
static inline int
get_bytes(PyObject *obj, Bytes *b)
{
    if (PyBytes_Check(obj)) {
        b->data = PyBytes_AS_STRING(obj);
        b->size = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_SIMPLE) < 0) {
        b->view.obj = NULL;
        PyErr_Format(PyExc_TypeError, "can't concat %.100s to bytearray",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    b->data = b->view.buf;
    b->size = b->view.len;
    return 0;
}

/* basic._encoded: str as UTF-8 (UnicodeEncodeError for lone surrogates), else bytes-like;
 * ValueError over 255 bytes (spec 4.2.5.3: a shortstr's length is one octet).
 * PyUnicode_AsUTF8AndSize returns an ASCII str's own bytes; a non-ASCII str keeps its
 * UTF-8 form cached on the object after the first call. */
static inline int
get_shortstr(PyObject *obj, Bytes *b)
{
    if (PyUnicode_Check(obj)) {
        b->data = PyUnicode_AsUTF8AndSize(obj, &b->size);
        if (b->data == NULL) {
            return -1;
        }
    }
    else if (get_bytes(obj, b) < 0) {
        return -1;
    }
    if (b->size > SHORTSTR_BYTES_MAX) {
        PyErr_Format(PyExc_ValueError, "shortstr of %zd bytes exceeds %d", b->size,
                     SHORTSTR_BYTES_MAX);
        return -1;
    }
    return 0;
}

/* An integer field as struct.pack reads it: an int (bool and subclasses as they are),
 * else the result of __index__ (whose own errors pass through); anything else, or a
 * value outside 0..max, is a struct.error there, turned into ValueError by
 * basic.encode_deliver. */
static inline unsigned char *
put_u16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
    return p + 2;
}

static inline unsigned char *
put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return p + 4;
}

static inline unsigned char *
put_u64(unsigned char *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    return put_u32(p + 4, (uint32_t)v);
}

static inline unsigned char *
put_frame_start(unsigned char *p, unsigned kind, uint32_t channel, uint32_t size)
{
    p[0] = (unsigned char)kind;
    return put_u32(put_u16(p + 1, channel), size);
}

static inline unsigned char *
put_shortstr(unsigned char *p, const Bytes *s)
{
    *p++ = (unsigned char)s->size;
    memcpy(p, s->data, (size_t)s->size);
    return p + s->size;
}

/* The basic.deliver method frame: `exchange` and `routing_key` are at most 255 bytes. */
static inline unsigned char *
put_deliver_method(unsigned char *p, uint32_t channel, uint32_t method_size, const Bytes *tag,
                   uint64_t delivery_tag, unsigned redelivered, const void *exchange,
                   size_t exchange_len, const void *routing_key, size_t routing_key_len)
{
    p = put_frame_start(p, FRAME_METHOD, channel, method_size);
    p = put_u16(put_u16(p, BASIC_CLASS), BASIC_DELIVER);
    p = put_shortstr(p, tag);
    p = put_u64(p, delivery_tag);
    *p++ = (unsigned char)redelivered;
    *p++ = (unsigned char)exchange_len;
    memcpy(p, exchange, exchange_len);
    p += exchange_len;
    *p++ = (unsigned char)routing_key_len;
    memcpy(p, routing_key, routing_key_len);
    p += routing_key_len;
    *p++ = FRAME_END;
    return p;
}

/* The body frames, at most `piece_max` body bytes each; none for an empty body (spec
 * 4.2.6.2). */
static inline unsigned char *
put_body_frames(unsigned char *p, uint32_t channel, const void *body, size_t size,
                size_t piece_max)
{
    const unsigned char *b = body;
    for (size_t left = size; left > 0;) {
        size_t piece = left < piece_max ? left : piece_max;
        p = put_frame_start(p, FRAME_BODY, channel, (uint32_t)piece);
        memcpy(p, b, piece);
        p += piece;
        *p++ = FRAME_END;
        b += piece;
        left -= piece;
    }
    return p;
}

/* The content header frame up to its property list: the caller copies the `properties_len`
 * bytes of properties at the pointer returned, then FRAME_END. Spec 4.2.6.1: weight is
 * unused and must be zero. */
static inline unsigned char *
put_content_header(unsigned char *p, uint32_t channel, uint32_t properties_len,
                   uint64_t body_size)
{
    p = put_frame_start(p, FRAME_HEADER, channel, HEADER_FIELDS_BYTES + properties_len);
    return put_u64(put_u16(put_u16(p, BASIC_CLASS), 0), body_size);
}

/* -- deliver_records: deliveries framed straight from segment-log records ----------------
 *
 * A record of the segment log (docs/log-format.md), little-endian:
 *   u32 length (bytes after this field) | u32 crc | u64 offset | i64 timestamp_ms |
 *   u8 exchange_len | u8 routing_key_len | u16 flags (0) | u32 properties_len |
 *   exchange | routing_key | properties (wire form, flag word first) | body
 */
enum {
    RECORD_HEADER_BYTES = 32,
    RECORD_LENGTH_MIN = 28, /* length counts from the crc field on */
};

/* One record found in the input: where its parts are. */
typedef struct {
    const unsigned char *exchange;
    const unsigned char *routing_key;
    const unsigned char *properties;
    const unsigned char *body;
    uint32_t exchange_len, routing_key_len, properties_len;
    size_t body_len;
} Record;

/* Where one record's parts are, its length and flags checked against the record's
 * length; -1 with ValueError set when they do not add up. */
static inline int
parse_record(const unsigned char *r, uint32_t record_length, Py_ssize_t pos, Record *rec)
{
    rec->exchange_len = r[24];
    rec->routing_key_len = r[25];
    rec->properties_len = load_le32(r + 28);
    uint32_t flags = (uint32_t)r[26] | (uint32_t)r[27] << 8;
    if (flags != 0 || (uint64_t)rec->exchange_len + rec->routing_key_len + rec->properties_len >
                          record_length - RECORD_LENGTH_MIN) {
        PyErr_Format(PyExc_ValueError, "bad record at %zd", pos);
        return -1;
    }
    rec->exchange = r + RECORD_HEADER_BYTES;
    rec->routing_key = rec->exchange + rec->exchange_len;
    rec->properties = rec->routing_key + rec->routing_key_len;
    rec->body = rec->properties + rec->properties_len;
    rec->body_len = record_length - RECORD_LENGTH_MIN - rec->exchange_len - rec->routing_key_len -
                    rec->properties_len;
    return 0;
}

/* The record at `pos` for a run's first pass: 1 with `*record_length`, `*offset` and
 * `rec` set; 0 when `data` holds no whole record from `pos` on (the rest is in the next
 * read); -1 with ValueError when its length or fields do not add up. */
static inline int
read_record_at(const unsigned char *data, Py_ssize_t length, Py_ssize_t pos,
               uint32_t *record_length, uint64_t *offset, Record *rec)
{
    if (length - pos < RECORD_HEADER_BYTES) {
        return 0;
    }
    const unsigned char *r = data + pos;
    *record_length = load_le32(r);
    if (*record_length < RECORD_LENGTH_MIN) {
        PyErr_Format(PyExc_ValueError, "bad record length %u at %zd", *record_length, pos);
        return -1;
    }
    if ((size_t)(length - pos) < 4 + (size_t)*record_length) {
        return 0;
    }
    *offset = load_le64(r + 8);
    return parse_record(r, *record_length, pos, rec) < 0 ? -1 : 1;
}

/* The runs (_deliver_runs.c), in the module's method table (_deliver.c). */
PyObject *deliver_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *deliver_stream_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char deliver_records_doc[];
extern const char deliver_stream_records_doc[];

#endif

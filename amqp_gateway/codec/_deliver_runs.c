/*
 * amqp_gateway.codec._deliver's runs: deliveries framed straight from segment-log
 * records, in one call per run (STYLE.md section 11, the hot path). `deliver_records`
 * for a queue's records, `deliver_stream_records` for a stream's, each delivery's
 * properties with its x-stream-offset header spliced in, and a stream client's native
 * records converted as `amqp10.as_amqp091` converts them (streamq/log/_amqp10_convert.h).
 * Both check every record in a first pass, grow `out` once, then write: on an error
 * nothing is appended. The frame writers are in _deliver_frames.h; the module, its
 * method table and encode_deliver in _deliver.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "../../streamq/log/_amqp10_convert.h" /* native records' conversion */
#include "_deliver_frames.h"

/* -- what both runs share: their arguments, and the first pass's walk over the records --- */

/* The arguments both run functions take first (out, data, position, first_offset, count,
 * channel, consumer_tag, first_tag, frame_max, out_bytes_max), read and checked. */
typedef struct {
    PyObject *out; /* a bytearray */
    Py_buffer in;
    Bytes tag;
    Py_ssize_t position;
    uint64_t first_offset;
    Py_ssize_t count;
    long channel;
    uint64_t first_tag;
    size_t piece_max;    /* frame_max less a frame's overhead */
    size_t method_fixed; /* a basic.deliver payload's size less exchange and routing key */
    Py_ssize_t out_bytes_max;
} RunArgs;

/* Reads args[0..9] into `a`; -1 with an exception (nothing held then). `name` is the
 * function's, for the messages; `offset_max` bounds first_offset. */
static int
run_args(PyObject *const *args, const char *name, unsigned long long offset_max, RunArgs *a)
{
    memset(a, 0, sizeof *a);
    a->out = args[0];
    if (!PyByteArray_Check(a->out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a bytearray");
        return -1;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[2]);
    unsigned long long first_offset = PyLong_AsUnsignedLongLong(args[3]);
    Py_ssize_t count = PyLong_AsSsize_t(args[4]);
    long channel = PyLong_AsLong(args[5]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[7]);
    long long frame_max = PyLong_AsLongLong(args[8]);
    Py_ssize_t out_bytes_max = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (channel < 0 || channel > CHANNEL_MAX || position < 0 || count < 0 ||
        frame_max < FRAME_OVERHEAD_BYTES + HEADER_FIELDS_BYTES + 2 || first_offset > offset_max) {
        PyErr_Format(PyExc_ValueError, "%s: argument out of range", name);
        return -1;
    }
    if (get_shortstr(args[6], &a->tag) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(args[1], &a->in, PyBUF_SIMPLE) < 0) {
        bytes_release(&a->tag);
        return -1;
    }
    a->position = position;
    a->first_offset = first_offset;
    a->count = count;
    a->channel = channel;
    a->first_tag = first_tag;
    a->piece_max = (size_t)(frame_max - FRAME_OVERHEAD_BYTES);
    a->method_fixed = DELIVER_PAYLOAD_FIXED_BYTES + (size_t)a->tag.size;
    a->out_bytes_max = out_bytes_max;
    return 0;
}

static void
run_args_release(RunArgs *a)
{
    PyBuffer_Release(&a->in);
    bytes_release(&a->tag);
}

/* The first pass: where it is in the data and what the run holds so far. */
typedef struct {
    Py_ssize_t pos;        /* the next record */
    Py_ssize_t start;      /* the run's first record */
    Py_ssize_t end_pos;    /* after the last record delivered or passed over */
    uint64_t expected;     /* the offset the next delivered record must have */
    long long next_offset; /* after the last record passed over or delivered; -1: none */
    Py_ssize_t delivered;
    size_t total; /* the bytes the run appends to out */
} RunWalk;

static void
run_walk_init(RunWalk *w, const RunArgs *a)
{
    w->pos = a->position > a->in.len ? a->in.len : a->position;
    w->start = w->end_pos = w->pos;
    w->expected = a->first_offset;
    w->next_offset = -1;
    w->delivered = 0;
    w->total = 0;
}

/* The next record of the run into `rec`: 1 when it is there, at the expected offset; 0
 * when the run ends before it (count or out_bytes_max reached, or the rest is in the next
 * read); -1 with ValueError. Records before the run's first offset are passed over. */
static inline int
run_walk_next(RunWalk *w, const RunArgs *a, uint32_t *record_length, Record *rec)
{
    const unsigned char *data = a->in.buf;
    while (w->delivered < a->count && (a->out_bytes_max <= 0 || w->delivered == 0 ||
                                       w->total < (size_t)a->out_bytes_max)) {
        uint64_t offset;
        int found = read_record_at(data, a->in.len, w->pos, record_length, &offset, rec);
        if (found <= 0) {
            return found;
        }
        if (offset < w->expected && w->delivered == 0) {
            w->pos += 4 + (Py_ssize_t)*record_length; /* before the run: passed over */
            w->start = w->end_pos = w->pos;
            w->next_offset = (long long)offset + 1;
            continue;
        }
        if (offset != w->expected) {
            PyErr_Format(PyExc_ValueError, "record offset %llu at %zd where %llu was expected",
                         (unsigned long long)offset, w->pos, (unsigned long long)w->expected);
            return -1;
        }
        return 1;
    }
    return 0;
}

/* Takes the record run_walk_next found into the run, its delivery `header_size` bytes of
 * content header fields. */
static inline void
run_walk_take(RunWalk *w, const RunArgs *a, uint32_t record_length, const Record *rec,
              size_t header_size)
{
    size_t pieces = rec->body_len == 0 ? 0 : (rec->body_len - 1) / a->piece_max + 1;
    w->total += a->method_fixed + rec->exchange_len + rec->routing_key_len + header_size +
                rec->body_len + (2 + pieces) * FRAME_OVERHEAD_BYTES;
    w->pos += 4 + (Py_ssize_t)record_length;
    w->end_pos = w->pos;
    w->expected++;
    w->delivered++;
    w->next_offset = (long long)w->expected;
}

/* Grows out by the run's bytes; where pass 2 writes them, or NULL with an exception. */
static unsigned char *
run_room(const RunWalk *w, const RunArgs *a)
{
    Py_ssize_t mark = PyByteArray_GET_SIZE(a->out);
    if (w->delivered > 0) {
        if (w->total > (size_t)(PY_SSIZE_T_MAX - mark)) {
            PyErr_NoMemory();
            return NULL;
        }
        if (PyByteArray_Resize(a->out, mark + (Py_ssize_t)w->total) < 0) {
            return NULL;
        }
    }
    return (unsigned char *)PyByteArray_AS_STRING(a->out) + mark;
}

const char deliver_records_doc[] = PyDoc_STR(
"deliver_records($module, out, records, position, first_offset, count, channel,\n"
"                consumer_tag, first_delivery_tag, frame_max, out_bytes_max, /)\n"
"--\n"
"\n"
"Append the deliveries of the log records at offsets `first_offset` ..\n"
"`first_offset + count - 1` found in `records` from `position` on (segment-log records\n"
"back to back, docs/log-format.md; records below `first_offset` are skipped) to `out`:\n"
"for each, basic.deliver with delivery tags from `first_delivery_tag` on, redelivered\n"
"false, the record's exchange and routing key, its properties unchanged and its body,\n"
"split into frames of at most frame_max - 8 bytes. Stops at the end of the whole\n"
"records in `records`, after `count`, or once `out_bytes_max` bytes were appended (at\n"
"least one delivery). Returns `(delivered, position, next_offset, sizes)`: how many,\n"
"where the next record starts and its offset (-1 when no record was read), and the\n"
"body size of each. `out` grows once.\n"
"\n"
"Raises ValueError, appending nothing, for a record whose length or fields do not add\n"
"up, whose flags are not 0, or whose offset breaks the sequence, and for properties\n"
"that do not fit one frame or a consumer tag over 255 bytes.");

PyObject *
deliver_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "deliver_records() takes 10 arguments (%zd given)", nargs);
        return NULL;
    }
    RunArgs a;
    if (run_args(args, "deliver_records", UINT64_MAX, &a) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *sizes = NULL;

    /* Pass 1: find the records, check them, and size the output. */
    RunWalk w;
    run_walk_init(&w, &a);
    Record rec;
    uint32_t record_length;
    int found;
    while ((found = run_walk_next(&w, &a, &record_length, &rec)) == 1) {
        size_t header_size = HEADER_FIELDS_BYTES + rec.properties_len;
        if (header_size > a.piece_max) {
            PyErr_Format(PyExc_ValueError, "content header of %zu bytes exceeds frame_max %lld",
                         header_size, (long long)(a.piece_max + FRAME_OVERHEAD_BYTES));
            goto done;
        }
        run_walk_take(&w, &a, record_length, &rec, header_size);
    }
    if (found < 0) {
        goto done;
    }
    sizes = PyList_New(w.delivered);
    if (sizes == NULL) {
        goto done;
    }
    unsigned char *p = run_room(&w, &a);
    if (p == NULL) {
        goto done;
    }
    /* Pass 2: write them (the checks above hold: the input did not change). */
    const unsigned char *data = a.in.buf;
    Py_ssize_t pos = w.start;
    for (Py_ssize_t written = 0; written < w.delivered; written++) {
        const unsigned char *r = data + pos;
        uint32_t length = load_le32(r);
        pos += 4 + (Py_ssize_t)length;
        (void)parse_record(r, length, pos, &rec); /* checked in pass 1 */

        uint32_t method_size = (uint32_t)(a.method_fixed + rec.exchange_len + rec.routing_key_len);
        p = put_deliver_method(p, (uint32_t)a.channel, method_size, &a.tag,
                               a.first_tag + (uint64_t)written, 0, rec.exchange, rec.exchange_len,
                               rec.routing_key, rec.routing_key_len);
        p = put_content_header(p, (uint32_t)a.channel, rec.properties_len, (uint64_t)rec.body_len);
        memcpy(p, rec.properties, rec.properties_len);
        p += rec.properties_len;
        *p++ = FRAME_END;
        p = put_body_frames(p, (uint32_t)a.channel, rec.body, rec.body_len, a.piece_max);
        PyObject *size = PyLong_FromSize_t(rec.body_len);
        if (size == NULL) {
            goto done; /* out keeps what was written: only on memory exhaustion */
        }
        PyList_SET_ITEM(sizes, written, size);
    }
    result = Py_BuildValue("(nnLO)", w.delivered, w.end_pos, w.next_offset, sizes);
done:
    Py_XDECREF(sizes);
    run_args_release(&a);
    return result;
}

/* -- deliver_stream_records: a stream's records, each with its x-stream-offset ------------
 *
 * As deliver_records, but each record's properties get the header `x-stream-offset`
 * (field table entry: shortstr name, 'l', the offset as a big-endian int64) spliced in
 * as `properties.add_long_header` splices it: after the entries of an existing headers
 * table, whose size grows by the entry's, or as a new table (the headers flag set) after
 * content-type and content-encoding. A record it cannot splice that way stops the run
 * before it, for the caller's per-record path (`channels.with_long_header`): a native
 * record (properties starting with streamq.log.amqp10.NATIVE_MARK) when no stream key is
 * given or the C conversion (`native_as_091`) leaves it to Python, properties that
 * already name x-stream-offset anywhere, a property list too short or malformed to find
 * the headers table's place, or properties that would no longer fit one frame. A native
 * record converted here is spliced as the 0-9-1 record it converts to.
 */
#define STREAM_OFFSET_NAME "x-stream-offset"
enum {
    STREAM_OFFSET_NAME_BYTES = sizeof STREAM_OFFSET_NAME - 1,
    /* name length octet, name, type octet 'l', int64 */
    STREAM_OFFSET_ENTRY_BYTES = 1 + STREAM_OFFSET_NAME_BYTES + 1 + 8,
    FLAG_CONTENT_TYPE = 0x8000,
    FLAG_CONTENT_ENCODING = 0x4000,
    FLAG_HEADERS = 0x2000,
};

/* Where the header goes in one record's properties, found by `plan_splice`. */
typedef struct {
    uint32_t table_at; /* the headers table's size field, or where a new table goes */
    uint32_t table_end; /* one past the existing table (has_table only) */
    uint32_t table_size; /* the existing table's size */
    int has_table;
} Splice;

/* Whether `name` occurs anywhere in `data`: `with_long_header` takes its slow path then
 * (`name.encode() in properties_raw`), which this module leaves to Python. */
static int
contains(const unsigned char *data, size_t size, const char *name, size_t name_size)
{
    const unsigned char *p = data;
    const unsigned char *end = data + size;
    while ((size_t)(end - p) >= name_size) {
        p = memchr(p, name[0], (size_t)(end - p) - name_size + 1);
        if (p == NULL) {
            return 0;
        }
        if (memcmp(p, name, name_size) == 0) {
            return 1;
        }
        p++;
    }
    return 0;
}

/* Finds where add_long_header splices the entry into `props`; 0 when it can, -1 when the
 * record is Python's (add_long_header would raise, or its slices would run past the
 * end, which this module does not reproduce). */
static int
plan_splice(const unsigned char *props, uint32_t size, Splice *s)
{
    if (size < 2 || contains(props, size, STREAM_OFFSET_NAME, STREAM_OFFSET_NAME_BYTES)) {
        return -1;
    }
    if (props[0] == 0x00 && props[1] == 0x02) {
        return -1; /* a stream client's record (amqp10.NATIVE_MARK): converted in Python */
    }
    uint32_t flags = (uint32_t)props[0] << 8 | props[1];
    uint64_t at = 2;
    if (flags & FLAG_CONTENT_TYPE) {
        if (at >= size) {
            return -1;
        }
        at += 1 + (uint64_t)props[at];
    }
    if (flags & FLAG_CONTENT_ENCODING) {
        if (at >= size) {
            return -1;
        }
        at += 1 + (uint64_t)props[at];
    }
    if (at > size) {
        return -1;
    }
    s->table_at = (uint32_t)at;
    s->has_table = (flags & FLAG_HEADERS) != 0;
    if (s->has_table) {
        if (at + 4 > size) {
            return -1;
        }
        uint32_t table = (uint32_t)props[at] << 24 | (uint32_t)props[at + 1] << 16 |
                         (uint32_t)props[at + 2] << 8 | props[at + 3];
        uint64_t end = at + 4 + (uint64_t)table;
        if (end > size || (uint64_t)table + STREAM_OFFSET_ENTRY_BYTES > 0xFFFFFFFFu) {
            return -1;
        }
        s->table_size = table;
        s->table_end = (uint32_t)end;
    }
    return 0;
}

static unsigned char *
put_stream_offset_entry(unsigned char *p, uint64_t offset)
{
    *p++ = STREAM_OFFSET_NAME_BYTES;
    memcpy(p, STREAM_OFFSET_NAME, STREAM_OFFSET_NAME_BYTES);
    p += STREAM_OFFSET_NAME_BYTES;
    *p++ = 'l';
    return put_u64(p, offset); /* an int64 in two's complement: offsets stay below 2**63 */
}

/* The spliced properties (STREAM_OFFSET_ENTRY_BYTES, or 4 more for a new table, longer
 * than `props`), as add_long_header joins them. */
static unsigned char *
put_spliced_properties(unsigned char *p, const unsigned char *props, uint32_t size,
                       const Splice *s, uint64_t offset)
{
    if (s->has_table) {
        memcpy(p, props, s->table_at);
        p = put_u32(p + s->table_at, s->table_size + STREAM_OFFSET_ENTRY_BYTES);
        memcpy(p, props + s->table_at + 4, s->table_size);
        p = put_stream_offset_entry(p + s->table_size, offset);
        memcpy(p, props + s->table_end, size - s->table_end);
        return p + (size - s->table_end);
    }
    p = put_u16(p, ((uint32_t)props[0] << 8 | props[1]) | FLAG_HEADERS);
    memcpy(p, props + 2, s->table_at - 2);
    p = put_u32(p + (s->table_at - 2), STREAM_OFFSET_ENTRY_BYTES);
    p = put_stream_offset_entry(p, offset);
    memcpy(p, props + s->table_at, size - s->table_at);
    return p + (size - s->table_at);
}

static inline uint32_t
spliced_size(uint32_t size, const Splice *s)
{
    return size + STREAM_OFFSET_ENTRY_BYTES + (s->has_table ? 0 : 4);
}

/* Native records (streamq.log.amqp10.NATIVE_MARK): converted here as `amqp10.as_amqp091`
 * converts them (streamq/log/_amqp10_convert.h), so that a stream written by stream
 * clients is delivered in runs too. Scratch space reused across calls: the GIL is held
 * and no Python code runs while it is in use. */
static A10Scratch native_scratch;
static A10Out native_props;

static int
is_native_record(const Record *rec)
{
    return rec->properties_len >= 2 && rec->properties[0] == 0x00 && rec->properties[1] == 0x02;
}

/* `rec` as the 0-9-1 record AMQP consumers get, its parts pointing at the converted ones
 * (the properties in native_props, valid until the next call). -1 leaves the record to
 * the per-record path: the C conversion declines it, its body is several data sections,
 * or its exchange or routing key would not fit a shortstr. */
static int
native_as_091(Record *rec, A10Span stream_key)
{
    A10Result r;
    A10Span filter = {rec->routing_key, rec->routing_key_len};
    native_props.len = 0;
    native_props.failed = 0;
    if (a10_convert(rec->body, rec->body_len, stream_key, filter, &native_scratch, &native_props,
                    &r) != A10_OK ||
        native_scratch.data_count > 1 || r.exchange.n > SHORTSTR_BYTES_MAX ||
        r.routing_key.n > SHORTSTR_BYTES_MAX || native_props.len > UINT32_MAX) {
        return -1;
    }
    rec->exchange = r.exchange.p;
    rec->exchange_len = (uint32_t)r.exchange.n;
    rec->routing_key = r.routing_key.p;
    rec->routing_key_len = (uint32_t)r.routing_key.n;
    rec->properties = native_props.data;
    rec->properties_len = (uint32_t)native_props.len;
    rec->body_len = native_scratch.data_count ? native_scratch.data[0].n : 0;
    rec->body = native_scratch.data_count ? native_scratch.data[0].p : rec->body;
    return 0;
}

const char deliver_stream_records_doc[] = PyDoc_STR(
"deliver_stream_records($module, out, records, position, first_offset, count, channel,\n"
"                       consumer_tag, first_delivery_tag, frame_max, out_bytes_max,\n"
"                       stream_key=None, /)\n"
"--\n"
"\n"
"`deliver_records` for a stream: each delivery's properties carry the header\n"
"x-stream-offset (a long, the record's offset), spliced in byte for byte as\n"
"`properties.add_long_header` does. Stops, besides where deliver_records stops,\n"
"before a record it leaves to the per-record path: one whose properties already hold\n"
"the name x-stream-offset, cannot be spliced simply, or would no longer fit one frame.\n"
"With `stream_key` (the stream's name in UTF-8), a stream client's native record is\n"
"delivered converted as `amqp10.as_amqp091` converts it (in C, streamq/log/_amqp10.c),\n"
"or stops the run when that conversion leaves it to Python; without, every native\n"
"record stops the run.\n"
"Returns `(delivered, position, next_offset, stopped)`: how many, where the next\n"
"record starts and its offset (-1 when no record was read), and whether it stopped\n"
"before such a record (then `position` is that record's and `next_offset` its\n"
"offset). `out` grows once.\n"
"\n"
"Raises ValueError, appending nothing, for a record whose length or fields do not add\n"
"up, whose flags are not 0, or whose offset breaks the sequence, and for a consumer tag\n"
"over 255 bytes.");

PyObject *
deliver_stream_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 10 && nargs != 11) {
        PyErr_Format(PyExc_TypeError,
                     "deliver_stream_records() takes 10 or 11 arguments (%zd given)", nargs);
        return NULL;
    }
    RunArgs a;
    if (run_args(args, "deliver_stream_records", (unsigned long long)INT64_MAX, &a) < 0) {
        return NULL;
    }
    Py_buffer key_view = {0};
    int has_key = nargs == 11 && args[10] != Py_None;
    if (has_key && PyObject_GetBuffer(args[10], &key_view, PyBUF_SIMPLE) < 0) {
        run_args_release(&a);
        return NULL;
    }
    A10Span stream_key = {key_view.buf, has_key ? (size_t)key_view.len : 0};
    PyObject *result = NULL;

    /* Pass 1: find the records, check them, plan their splices and size the output. */
    RunWalk w;
    run_walk_init(&w, &a);
    int stopped = 0;
    Record rec;
    Splice splice;
    uint32_t record_length;
    int found;
    while ((found = run_walk_next(&w, &a, &record_length, &rec)) == 1) {
        size_t header_size = 0;
        int converted = has_key && is_native_record(&rec) ? native_as_091(&rec, stream_key) : 0;
        if (converted == 0 && plan_splice(rec.properties, rec.properties_len, &splice) == 0) {
            header_size = HEADER_FIELDS_BYTES + spliced_size(rec.properties_len, &splice);
        }
        if (header_size == 0 || header_size > a.piece_max) {
            stopped = 1; /* the per-record path's: it splices, or raises, as it does */
            w.next_offset = (long long)w.expected;
            break;
        }
        run_walk_take(&w, &a, record_length, &rec, header_size);
    }
    if (found < 0) {
        goto done;
    }
    unsigned char *p = run_room(&w, &a);
    if (p == NULL) {
        goto done;
    }
    /* Pass 2: write them (the checks above hold: the input did not change). */
    const unsigned char *data = a.in.buf;
    Py_ssize_t pos = w.start;
    for (Py_ssize_t written = 0; written < w.delivered; written++) {
        const unsigned char *r = data + pos;
        uint32_t length = load_le32(r);
        pos += 4 + (Py_ssize_t)length;
        (void)parse_record(r, length, pos, &rec); /* checked in pass 1 */
        if (has_key && is_native_record(&rec)) {
            (void)native_as_091(&rec, stream_key); /* as in pass 1: the same bytes */
        }
        (void)plan_splice(rec.properties, rec.properties_len, &splice);

        uint32_t method_size = (uint32_t)(a.method_fixed + rec.exchange_len + rec.routing_key_len);
        p = put_deliver_method(p, (uint32_t)a.channel, method_size, &a.tag,
                               a.first_tag + (uint64_t)written, 0, rec.exchange, rec.exchange_len,
                               rec.routing_key, rec.routing_key_len);

        uint32_t properties_size = spliced_size(rec.properties_len, &splice);
        p = put_content_header(p, (uint32_t)a.channel, properties_size, (uint64_t)rec.body_len);
        p = put_spliced_properties(p, rec.properties, rec.properties_len, &splice,
                                   a.first_offset + (uint64_t)written);
        *p++ = FRAME_END;
        p = put_body_frames(p, (uint32_t)a.channel, rec.body, rec.body_len, a.piece_max);
    }
    /* end_pos is after the last record delivered or passed over: where a stop is. */
    result = Py_BuildValue("(nnLO)", w.delivered, w.end_pos, w.next_offset,
                           stopped ? Py_True : Py_False);
done:
    if (has_key) {
        PyBuffer_Release(&key_view);
    }
    if (native_props.cap > (1u << 20)) {
        a10_out_free(&native_props); /* a huge message does not pin its buffer */
    }
    run_args_release(&a);
    return result;
}

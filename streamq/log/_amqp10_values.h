/* streamq/log/_amqp10_values.h: AMQP 1.0 values and message sections, read and checked for
 * the conversion in _amqp10_convert.h (which owns the whole and lists what it takes), and
 * 1.0 values written as AMQP 0-9-1 field values (Python's `amqp10._to_091`, then
 * `amqp091._write_value`). No Python API is used here.
 *
 * Rules:
 * 1. Every read is bounded by the enclosing value's end, checked by subtraction (no
 *    pointer or size overflow); nesting by A10_DEPTH_MAX, entries by A10_ENTRIES_MAX.
 * 2. What it accepts is a subset of what `amqp10_types.decode_value` accepts: when in
 *    doubt, A10_FALLBACK (the caller then runs the Python).
 */
#ifndef STREAMQ_AMQP10_VALUES_H
#define STREAMQ_AMQP10_VALUES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    A10_OK = 0,
    A10_FALLBACK = 1,
    A10_DEPTH_MAX = 16,       /* compounds within a section (Python allows 64) */
    A10_ENTRIES_MAX = 256,    /* headers of one message; more: Python's */
    A10_DATA_SECTIONS_MAX = 64,
    A10_SHORTSTR_MAX = 255,
    A10_TEXT_BYTES = 48,      /* "urn:uuid:" + 36, or a u64 in decimal */
};
#define A10_U32_MAX ((uint64_t)0xFFFFFFFFu)
#define A10_INT64_MAX ((uint64_t)INT64_MAX)
#define A10_FILTER_HEADER "x-stream-filter-value"

typedef struct {
    const uint8_t *p;
    size_t n;
} A10Span;

/* One decoded value: its constructor, where its payload starts (after any size and
 * count fields), its payload bytes (variable) or element count (compound), and its end. */
typedef struct {
    uint8_t code;
    size_t at;
    size_t size;
    size_t count;
    size_t end;
} A10Value;

/* A growable output buffer; `failed` once an allocation or a size limit fails. */
typedef struct {
    uint8_t *data;
    size_t len;
    size_t cap;
    int failed;
} A10Out;

static void
a10_out_free(A10Out *o)
{
    free(o->data);
    o->data = NULL;
    o->len = o->cap = 0;
    o->failed = 0;
}

static uint8_t *
a10_grow(A10Out *o, size_t n)
{
    if (o->failed) {
        return NULL;
    }
    if (n > SIZE_MAX / 4 - o->len) {
        o->failed = 1;
        return NULL;
    }
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->len + n) {
            cap *= 2;
        }
        uint8_t *data = realloc(o->data, cap);
        if (data == NULL) {
            o->failed = 1;
            return NULL;
        }
        o->data = data;
        o->cap = cap;
    }
    uint8_t *p = o->data + o->len;
    o->len += n;
    return p;
}

static void
a10_put(A10Out *o, const void *src, size_t n)
{
    uint8_t *p = a10_grow(o, n);
    if (p != NULL && n) {
        memcpy(p, src, n);
    }
}

static void
a10_put_byte(A10Out *o, uint8_t byte)
{
    a10_put(o, &byte, 1);
}

static void
a10_put_be(A10Out *o, uint64_t value, int width)
{
    uint8_t buf[8];
    for (int i = 0; i < width; i++) {
        buf[i] = (uint8_t)(value >> (8 * (width - 1 - i)));
    }
    a10_put(o, buf, (size_t)width);
}

static uint64_t
a10_be(const uint8_t *p, int width)
{
    uint64_t value = 0;
    for (int i = 0; i < width; i++) {
        value = value << 8 | p[i];
    }
    return value;
}

/* The width of a fixed-size constructor's payload, or -1 when it is not one we take. */
static int
a10_fixed_width(uint8_t code)
{
    switch (code) {
    case 0x40: case 0x41: case 0x42: case 0x43: case 0x44: case 0x45:
        return 0;
    case 0x50: case 0x51: case 0x52: case 0x53: case 0x54: case 0x55: case 0x56:
        return 1;
    case 0x60: case 0x61:
        return 2;
    case 0x70: case 0x71: case 0x72: case 0x74:
        return 4;
    case 0x80: case 0x81: case 0x82: case 0x83: case 0x84:
        return 8;
    case 0x94: case 0x98:
        return 16;
    default:
        return -1;
    }
}

static int a10_read(const uint8_t *b, size_t pos, size_t end, int depth, A10Value *v);

/* A list or map (Python's `_region` and `_decode_compound`): every element read. */
static int
a10_read_compound(const uint8_t *b, size_t pos, size_t end, int depth, int width, A10Value *v)
{
    if (depth >= A10_DEPTH_MAX || end - pos < (size_t)width) {
        return A10_FALLBACK;
    }
    uint64_t size = a10_be(b + pos, width);
    pos += (size_t)width;
    if (size > end - pos || size < (uint64_t)width) {
        return A10_FALLBACK;
    }
    size_t region_end = pos + (size_t)size;
    uint64_t count = a10_be(b + pos, width);
    pos += (size_t)width;
    if (count > size || ((v->code & 0x0F) == 0x01 && count % 2)) {
        return A10_FALLBACK;
    }
    v->at = pos;
    v->count = (size_t)count;
    A10Value item;
    for (uint64_t i = 0; i < count; i++) {
        if (a10_read(b, pos, region_end, depth + 1, &item) != A10_OK) {
            return A10_FALLBACK;
        }
        pos = item.end;
    }
    if (pos != region_end) {
        return A10_FALLBACK;
    }
    v->end = region_end;
    return A10_OK;
}

/* The value at `pos`, checked whole (nested elements included). */
static int
a10_read(const uint8_t *b, size_t pos, size_t end, int depth, A10Value *v)
{
    if (pos >= end) {
        return A10_FALLBACK;
    }
    v->code = b[pos++];
    v->at = pos;
    v->count = 0;
    int width = a10_fixed_width(v->code);
    if (width >= 0) {
        if (end - pos < (size_t)width) {
            return A10_FALLBACK;
        }
        if (v->code == 0x72) { /* float: a NaN's bits change through Python's double */
            uint32_t bits = (uint32_t)a10_be(b + pos, 4);
            if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) {
                return A10_FALLBACK;
            }
        }
        v->size = (size_t)width;
        v->end = pos + (size_t)width;
        return A10_OK;
    }
    switch (v->code) {
    case 0xa0: case 0xa1: case 0xa3: case 0xb0: case 0xb1: case 0xb3: {
        int w = v->code < 0xb0 ? 1 : 4;
        if (end - pos < (size_t)w) {
            return A10_FALLBACK;
        }
        uint64_t size = a10_be(b + pos, w);
        pos += (size_t)w;
        if (size > end - pos) {
            return A10_FALLBACK;
        }
        v->at = pos;
        v->size = (size_t)size;
        v->end = pos + (size_t)size;
        return A10_OK;
    }
    case 0xc0: case 0xc1:
        return a10_read_compound(b, pos, end, depth, 1, v);
    case 0xd0: case 0xd1:
        return a10_read_compound(b, pos, end, depth, 4, v);
    default:
        return A10_FALLBACK; /* described, char, array, unknown: Python's */
    }
}

static int
a10_is_text(const A10Value *v) /* string or symbol */
{
    return v->code == 0xa1 || v->code == 0xb1 || v->code == 0xa3 || v->code == 0xb3;
}

static int
a10_is_map(const A10Value *v)
{
    return v->code == 0xc1 || v->code == 0xd1;
}

static int
a10_is_list(const A10Value *v)
{
    return v->code == 0xc0 || v->code == 0xd0 || v->code == 0x45;
}

/* Python's `_octet`: an integer kind (not bool) from 0 to 255, else -1. */
static int
a10_octet(const uint8_t *b, const A10Value *v)
{
    const uint8_t *p = b + v->at;
    int64_t value;
    switch (v->code) {
    case 0x43: case 0x44:
        return 0;
    case 0x50: case 0x52: case 0x53:
        return p[0];
    case 0x51: case 0x54: case 0x55:
        return (int8_t)p[0] >= 0 ? p[0] : -1;
    case 0x60: case 0x61: case 0x70: case 0x71: case 0x80: case 0x81: case 0x83:
        if (v->code == 0x60 || v->code == 0x70 || v->code == 0x80) {
            uint64_t u = a10_be(p, (int)v->size);
            return u <= 255 ? (int)u : -1;
        }
        value = v->size == 2   ? (int16_t)a10_be(p, 2)
                : v->size == 4 ? (int32_t)a10_be(p, 4)
                               : (int64_t)a10_be(p, 8);
        return value >= 0 && value <= 255 ? (int)value : -1;
    default:
        return -1;
    }
}

/* The n-th element of a list (`items[n]` padded with nulls): 0 with *item set, or 1 for
 * a null or missing one (then *item is a null). */
static void
a10_list_item(const uint8_t *b, const A10Value *list, size_t n, A10Value *item)
{
    item->code = 0x40;
    item->at = item->end = 0;
    item->size = item->count = 0;
    if (list == NULL || !a10_is_list(list) || n >= list->count) {
        return;
    }
    size_t pos = list->at;
    for (size_t i = 0; i <= n; i++) {
        (void)a10_read(b, pos, list->end, 0, item); /* checked when the section was read */
        pos = item->end;
    }
}

/* --- a 1.0 value as a 0-9-1 field value (Python's `_to_091`, then `_write_value`) ------ */

static size_t
a10_decimal(char *buf, uint64_t value)
{
    return (size_t)snprintf(buf, A10_TEXT_BYTES, "%llu", (unsigned long long)value);
}

static size_t
a10_uuid_text(char *buf, const uint8_t *p) /* "urn:uuid:" and the 8-4-4-4-12 form */
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    memcpy(buf, "urn:uuid:", 9);
    n = 9;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            buf[n++] = '-';
        }
        buf[n++] = hex[p[i] >> 4];
        buf[n++] = hex[p[i] & 0x0F];
    }
    return n;
}

static void
a10_put_sized(A10Out *o, uint8_t tag, const void *data, size_t size)
{
    if (size > A10_U32_MAX) {
        o->failed = 1;
        return;
    }
    a10_put_byte(o, tag);
    a10_put_be(o, size, 4);
    a10_put(o, data, size);
}

/* Backpatch the u32 size of a table or array whose size field is at `mark`. */
static void
a10_patch_size(A10Out *o, size_t mark)
{
    if (o->failed) {
        return;
    }
    uint64_t size = o->len - mark - 4;
    if (size > A10_U32_MAX) {
        o->failed = 1;
        return;
    }
    for (int i = 0; i < 4; i++) {
        o->data[mark + (size_t)i] = (uint8_t)(size >> (8 * (3 - i)));
    }
}

static int a10_emit(A10Out *o, const uint8_t *b, const A10Value *v);

static int
a10_emit_compound(A10Out *o, const uint8_t *b, const A10Value *v)
{
    int map = a10_is_map(v);
    a10_put_byte(o, map ? 'F' : 'A');
    size_t mark = o->len;
    a10_put_be(o, 0, 4);
    size_t pos = v->at;
    A10Value item;
    for (size_t i = 0; i < v->count; i++) {
        (void)a10_read(b, pos, v->end, 0, &item); /* checked whole by the section's read */
        pos = item.end;
        if (map && i % 2 == 0) { /* a key: str(key) as a shortstr, text keys only */
            if (!a10_is_text(&item) || item.size > A10_SHORTSTR_MAX) {
                return A10_FALLBACK;
            }
            a10_put_byte(o, (uint8_t)item.size);
            a10_put(o, b + item.at, item.size);
        } else if (a10_emit(o, b, &item) != A10_OK) {
            return A10_FALLBACK;
        }
    }
    a10_patch_size(o, mark);
    return A10_OK;
}

static int
a10_emit(A10Out *o, const uint8_t *b, const A10Value *v)
{
    const uint8_t *p = b + v->at;
    char text[A10_TEXT_BYTES];
    uint64_t u;
    switch (v->code) {
    case 0x40: a10_put_byte(o, 'V'); break;
    case 0x41: case 0x42: case 0x56:
        a10_put_byte(o, 't');
        a10_put_byte(o, v->code == 0x41 || (v->code == 0x56 && p[0] != 0));
        break;
    case 0x50: case 0x51: a10_put_byte(o, v->code == 0x50 ? 'B' : 'b'); a10_put(o, p, 1); break;
    case 0x60: case 0x61: a10_put_byte(o, v->code == 0x60 ? 'u' : 's'); a10_put(o, p, 2); break;
    case 0x70: case 0x71: case 0x72:
        a10_put_byte(o, v->code == 0x70 ? 'i' : v->code == 0x71 ? 'I' : 'f');
        a10_put(o, p, 4);
        break;
    case 0x43: case 0x52: a10_put_byte(o, 'i'); a10_put_be(o, v->code == 0x52 ? p[0] : 0, 4); break;
    case 0x54: a10_put_byte(o, 'I'); a10_put_be(o, (uint32_t)(int32_t)(int8_t)p[0], 4); break;
    case 0x44: case 0x53: a10_put_byte(o, 'l'); a10_put_be(o, v->code == 0x53 ? p[0] : 0, 8); break;
    case 0x55: a10_put_byte(o, 'l'); a10_put_be(o, (uint64_t)(int64_t)(int8_t)p[0], 8); break;
    case 0x81: case 0x82: a10_put_byte(o, v->code == 0x81 ? 'l' : 'd'); a10_put(o, p, 8); break;
    case 0x80:
        u = a10_be(p, 8);
        if (u <= A10_INT64_MAX) {
            a10_put_byte(o, 'l');
            a10_put(o, p, 8);
        } else {
            a10_put_sized(o, 'S', text, a10_decimal(text, u));
        }
        break;
    case 0x83: { /* ms since the epoch: seconds when not negative, else the long */
        int64_t ms = (int64_t)a10_be(p, 8);
        a10_put_byte(o, ms >= 0 ? 'T' : 'l');
        a10_put_be(o, ms >= 0 ? (uint64_t)(ms / 1000) : (uint64_t)ms, 8);
        break;
    }
    case 0x98: a10_put_sized(o, 'S', text, a10_uuid_text(text, p)); break;
    case 0x74: case 0x84: case 0x94: case 0xa0: case 0xb0: a10_put_sized(o, 'x', p, v->size); break;
    case 0xa1: case 0xb1: case 0xa3: case 0xb3: a10_put_sized(o, 'S', p, v->size); break;
    case 0x45: a10_put_byte(o, 'A'); a10_put_be(o, 0, 4); break;
    case 0xc0: case 0xd0: case 0xc1: case 0xd1: return a10_emit_compound(o, b, v);
    default: return A10_FALLBACK;
    }
    return A10_OK;
}

/* --- the message ----------------------------------------------------------------------- */

typedef struct {
    A10Span name;
    const uint8_t *base; /* the message, for `value`; NULL: the filter value as a longstr */
    A10Value value;
} A10Header;

/* Working space for one conversion, reused across a batch (kept off the C stack). */
typedef struct {
    A10Value header, annotations, properties, application;
    int has_header, has_annotations, has_properties, has_application;
    A10Span data[A10_DATA_SECTIONS_MAX];
    size_t data_count;
    A10Span keys[A10_ENTRIES_MAX];
    A10Value values[A10_ENTRIES_MAX];
    size_t annotation_count; /* keys[0..annotation_count) are the annotations' */
    size_t key_count;        /* then the application properties' */
    A10Header headers[A10_ENTRIES_MAX + 3];
    size_t header_count;
} A10Scratch;

typedef struct {
    A10Span exchange;
    A10Span routing_key;
} A10Result;

static const char *const A10_SECTION_NAMES[] = {
    "amqp:header:list", "amqp:delivery-annotations:map", "amqp:message-annotations:map",
    "amqp:properties:list", "amqp:application-properties:map", "amqp:data:binary",
};

/* The section number of the descriptor at `pos` (ulong or symbol), or -1; *next after it. */
static int
a10_descriptor(const uint8_t *b, size_t pos, size_t end, size_t *next)
{
    A10Value d;
    if (a10_read(b, pos, end, 1, &d) != A10_OK) {
        return -1;
    }
    *next = d.end;
    if (d.code == 0x53 || d.code == 0x80) {
        uint64_t code = a10_be(b + d.at, (int)d.size);
        return code >= 0x70 && code <= 0x75 ? (int)code : -1;
    }
    if (d.code != 0xa3 && d.code != 0xb3) {
        return -1;
    }
    for (int i = 0; i < 6; i++) {
        size_t n = strlen(A10_SECTION_NAMES[i]);
        if (d.size == n && memcmp(b + d.at, A10_SECTION_NAMES[i], n) == 0) {
            return 0x70 + i;
        }
    }
    return -1;
}

static int
a10_sections(const uint8_t *b, size_t n, A10Scratch *s)
{
    s->has_header = s->has_annotations = s->has_properties = s->has_application = 0;
    s->data_count = 0;
    size_t pos = 0;
    while (pos < n) {
        A10Value v;
        int code = b[pos] == 0x00 ? a10_descriptor(b, pos + 1, n, &pos) : -1;
        if (code < 0 || a10_read(b, pos, n, 1, &v) != A10_OK) {
            return A10_FALLBACK;
        }
        pos = v.end;
        switch (code) { /* a repeated section: the last one counts, as Python's dict */
        case 0x70: s->header = v; s->has_header = 1; break;
        case 0x72: s->annotations = v; s->has_annotations = 1; break;
        case 0x73: s->properties = v; s->has_properties = 1; break;
        case 0x74: s->application = v; s->has_application = 1; break;
        case 0x75:
            if ((v.code != 0xa0 && v.code != 0xb0) || s->data_count == A10_DATA_SECTIONS_MAX) {
                return A10_FALLBACK;
            }
            s->data[s->data_count].p = b + v.at;
            s->data[s->data_count++].n = v.size;
            break;
        default: break; /* delivery annotations: checked, not used */
        }
    }
    return A10_OK;
}

/* The text-keyed entries of a map section into s->keys/values (Python's `_string_keyed`);
 * a key seen twice is Python's (its dict keeps the first place and the last value). */
static int
a10_keyed(const uint8_t *b, const A10Value *map, A10Scratch *s)
{
    size_t first = s->key_count;
    size_t pos = map->at;
    A10Value key, value;
    for (size_t i = 0; i < map->count; i += 2) {
        (void)a10_read(b, pos, map->end, 0, &key);
        (void)a10_read(b, key.end, map->end, 0, &value);
        pos = value.end;
        if (!a10_is_text(&key)) {
            continue;
        }
        for (size_t k = first; k < s->key_count; k++) {
            if (s->keys[k].n == key.size && memcmp(s->keys[k].p, b + key.at, key.size) == 0) {
                return A10_FALLBACK;
            }
        }
        if (s->key_count == A10_ENTRIES_MAX) {
            return A10_FALLBACK;
        }
        s->keys[s->key_count].p = b + key.at;
        s->keys[s->key_count].n = key.size;
        s->values[s->key_count++] = value;
    }
    return A10_OK;
}

static const A10Value *
a10_annotation(const A10Scratch *s, const char *name)
{
    size_t n = strlen(name);
    for (size_t k = 0; k < s->annotation_count; k++) {
        if (s->keys[k].n == n && memcmp(s->keys[k].p, name, n) == 0) {
            return &s->values[k];
        }
    }
    return NULL;
}

#endif /* STREAMQ_AMQP10_VALUES_H */

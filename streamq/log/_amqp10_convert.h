/* streamq/log/_amqp10_convert.h: one stream-native record's AMQP 1.0 message converted to
 * what an AMQP 0-9-1 consumer gets, in C. Included by streamq/log/_amqp10.c (and meant for
 * amqp_gateway/codec/_deliver.c's stream splice); no Python API is used here.
 *
 * The reference is `streamq.log.amqp10.to_amqp091_reference` (docs/stream-protocol.md,
 * "Message conversion"): `a10_convert` gives exactly its exchange, routing key, property
 * bytes (as `streamq.log.amqp091.encode_properties` writes them) and body, or says
 * A10_FALLBACK for anything it does not handle, and the caller runs the Python.
 *
 * Handled: the sections header, delivery-annotations (checked, ignored),
 * message-annotations, properties, application-properties and data (one or more), with
 * the values null, bool, the integers, float (not NaN), double, timestamp, uuid,
 * decimals, binary, string, symbol, list and map. Left to Python: amqp-value,
 * amqp-sequence and footer sections, described values inside a section, arrays, chars,
 * malformed bytes (Python delivers them raw), a map with a repeated text key (a Python
 * dict folds it), and anything past the named limits of _amqp10_values.h.
 */
#ifndef STREAMQ_AMQP10_CONVERT_H
#define STREAMQ_AMQP10_CONVERT_H

#include "_amqp10_values.h"

/* 0-9-1 property flags (spec 4.2.6.1; amqp091.PROPERTY_NAMES order). */
enum {
    A10_FLAG_CONTENT_TYPE = 0x8000,
    A10_FLAG_CONTENT_ENCODING = 0x4000,
    A10_FLAG_HEADERS = 0x2000,
    A10_FLAG_DELIVERY_MODE = 0x1000,
    A10_FLAG_PRIORITY = 0x0800,
    A10_FLAG_CORRELATION_ID = 0x0400,
    A10_FLAG_REPLY_TO = 0x0200,
    A10_FLAG_EXPIRATION = 0x0100,
    A10_FLAG_MESSAGE_ID = 0x0080,
    A10_FLAG_TIMESTAMP = 0x0040,
    A10_FLAG_TYPE = 0x0020,
    A10_FLAG_USER_ID = 0x0010,
    A10_FLAG_APP_ID = 0x0008,
};

/* The 0-9-1 properties of one message (a span with p NULL: absent). */
typedef struct {
    A10Span content_type, content_encoding, correlation_id, reply_to, expiration;
    A10Span message_id, type, user_id, app_id;
    int delivery_mode, priority; /* -1: absent */
    int has_timestamp;
    uint64_t timestamp_s;
    char expiration_text[A10_TEXT_BYTES];
    char message_id_text[A10_TEXT_BYTES];
    char correlation_id_text[A10_TEXT_BYTES];
} A10Properties;

static A10Span
a10_shortstr(const uint8_t *b, const A10Value *v) /* Python's `_shortstr` */
{
    A10Span span = {NULL, 0};
    if (v != NULL && a10_is_text(v) && v->size <= A10_SHORTSTR_MAX) {
        span.p = b + v->at;
        span.n = v->size;
    }
    return span;
}

static int
a10_add_header(A10Scratch *s, const uint8_t *name, size_t size, const uint8_t *b,
               const A10Value *v)
{
    if (s->header_count == A10_ENTRIES_MAX + 3) {
        return A10_FALLBACK;
    }
    A10Header *h = &s->headers[s->header_count++];
    h->name.p = name;
    h->name.n = size;
    h->base = b;
    if (v != NULL) {
        h->value = *v;
    }
    return A10_OK;
}

/* Python's `_id_091`: a message or correlation id as a shortstr, or a header. */
static int
a10_id(const uint8_t *b, const A10Value *v, const char *header, char *text, A10Span *out,
       A10Scratch *s)
{
    out->p = NULL;
    switch (v->code) {
    case 0x98:
        out->n = a10_uuid_text(text, b + v->at);
        out->p = (const uint8_t *)text;
        return A10_OK;
    case 0x44: case 0x53: case 0x80:
        out->n = a10_decimal(text, v->code == 0x44 ? 0 : a10_be(b + v->at, (int)v->size));
        out->p = (const uint8_t *)text;
        return A10_OK;
    case 0xa1: case 0xb1:
        if (v->size <= A10_SHORTSTR_MAX) {
            out->p = b + v->at;
            out->n = v->size;
            return A10_OK;
        }
        return a10_add_header(s, (const uint8_t *)header, strlen(header), b, v); /* too long */
    case 0xa0: case 0xb0:
        return a10_add_header(s, (const uint8_t *)header, strlen(header), b, v);
    default:
        return A10_OK;
    }
}

/* Python's `_apply_header`: delivery mode, priority and expiration. */
static void
a10_header_fields(const uint8_t *b, const A10Scratch *s, A10Properties *f)
{
    A10Value item;
    const A10Value *list = s->has_header ? &s->header : NULL;
    const A10Value *note;
    a10_list_item(b, list, 0, &item);
    if (s->has_header) {
        f->delivery_mode = item.code == 0x41 || (item.code == 0x56 && b[item.at]) ? 2 : 1;
    } else {
        note = a10_annotation(s, "x-basic-delivery-mode");
        f->delivery_mode = note ? a10_octet(b, note) : -1;
    }
    a10_list_item(b, list, 1, &item);
    note = a10_annotation(s, "x-basic-priority");
    f->priority = item.code != 0x40 ? a10_octet(b, &item) : note ? a10_octet(b, note) : -1;
    a10_list_item(b, list, 2, &item);
    if (item.code == 0x70 || item.code == 0x52 || item.code == 0x43) {
        uint64_t ttl = item.code == 0x43 ? 0 : a10_be(b + item.at, (int)item.size);
        f->expiration.n = a10_decimal(f->expiration_text, ttl);
        f->expiration.p = (const uint8_t *)f->expiration_text;
    } else {
        f->expiration = a10_shortstr(b, a10_annotation(s, "x-basic-expiration"));
    }
}

static int
a10_is_field_annotation(const A10Span *name) /* amqp10._ANNOTATIONS_AS_FIELDS */
{
    static const char *const names[] = {
        "x-exchange", "x-routing-key", "x-basic-type", "x-basic-priority",
        "x-basic-delivery-mode", "x-basic-expiration", "x-stream-offset",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (name->n == strlen(names[i]) && memcmp(name->p, names[i], name->n) == 0) {
            return 1;
        }
    }
    return 0;
}

static int
a10_fits_name(const A10Span *name) /* Python's `_fits_name` */
{
    size_t n = sizeof A10_FILTER_HEADER - 1;
    return name->n <= A10_SHORTSTR_MAX &&
           !(name->n == n && memcmp(name->p, A10_FILTER_HEADER, n) == 0);
}

/* Python's `_headers`: application properties, then the x- annotations (x-cc as CC). */
static int
a10_headers(const uint8_t *b, A10Scratch *s)
{
    for (size_t k = s->annotation_count; k < s->key_count; k++) {
        if (a10_fits_name(&s->keys[k]) &&
            a10_add_header(s, s->keys[k].p, s->keys[k].n, b, &s->values[k]) != A10_OK) {
            return A10_FALLBACK;
        }
    }
    for (size_t k = 0; k < s->annotation_count; k++) {
        const A10Span *name = &s->keys[k];
        int rc = A10_OK;
        if (name->n == 4 && memcmp(name->p, "x-cc", 4) == 0) {
            rc = a10_add_header(s, (const uint8_t *)"CC", 2, b, &s->values[k]);
        } else if (name->n >= 2 && memcmp(name->p, "x-", 2) == 0 &&
                   !a10_is_field_annotation(name) && a10_fits_name(name)) {
            rc = a10_add_header(s, name->p, name->n, b, &s->values[k]);
        }
        if (rc != A10_OK) {
            return A10_FALLBACK;
        }
    }
    return A10_OK;
}

/* Python's `_apply_properties`: the properties section's fields (ids may add headers). */
static int
a10_properties_fields(const uint8_t *b, A10Scratch *s, A10Properties *f)
{
    const A10Value *list = s->has_properties ? &s->properties : NULL;
    A10Value item;
    a10_list_item(b, list, 0, &item);
    if (a10_id(b, &item, "x-message-id", f->message_id_text, &f->message_id, s) != A10_OK) {
        return A10_FALLBACK;
    }
    a10_list_item(b, list, 1, &item);
    if ((item.code == 0xa0 || item.code == 0xb0) && item.size <= A10_SHORTSTR_MAX) {
        f->user_id.p = b + item.at;
        f->user_id.n = item.size;
    }
    a10_list_item(b, list, 4, &item);
    f->reply_to = a10_shortstr(b, &item);
    a10_list_item(b, list, 5, &item);
    if (a10_id(b, &item, "x-correlation-id", f->correlation_id_text, &f->correlation_id, s) !=
        A10_OK) {
        return A10_FALLBACK;
    }
    a10_list_item(b, list, 6, &item);
    f->content_type = a10_shortstr(b, &item);
    a10_list_item(b, list, 7, &item);
    f->content_encoding = a10_shortstr(b, &item);
    a10_list_item(b, list, 9, &item);
    if (item.code == 0x83 && (int64_t)a10_be(b + item.at, 8) >= 0) {
        f->has_timestamp = 1;
        f->timestamp_s = a10_be(b + item.at, 8) / 1000;
    }
    a10_list_item(b, list, 10, &item);
    f->app_id = a10_shortstr(b, &item);
    return A10_OK;
}

static void
a10_put_shortstr(A10Out *o, const A10Span *span)
{
    a10_put_byte(o, (uint8_t)span->n);
    a10_put(o, span->p, span->n);
}

/* `encode_properties` of the fields: the flag word, then the present ones in flag order. */
static int
a10_write_properties(A10Out *o, const A10Scratch *s, const A10Properties *f, A10Span filter)
{
    const A10Span *strings[] = {&f->content_type, &f->content_encoding};
    const A10Span *late[] = {&f->correlation_id, &f->reply_to, &f->expiration, &f->message_id};
    const A10Span *last[] = {&f->type, &f->user_id, &f->app_id};
    unsigned flags = (f->content_type.p ? A10_FLAG_CONTENT_TYPE : 0) |
        (f->content_encoding.p ? A10_FLAG_CONTENT_ENCODING : 0) |
        (s->header_count ? A10_FLAG_HEADERS : 0) |
        (f->delivery_mode >= 0 ? A10_FLAG_DELIVERY_MODE : 0) |
        (f->priority >= 0 ? A10_FLAG_PRIORITY : 0) |
        (f->correlation_id.p ? A10_FLAG_CORRELATION_ID : 0) |
        (f->reply_to.p ? A10_FLAG_REPLY_TO : 0) | (f->expiration.p ? A10_FLAG_EXPIRATION : 0) |
        (f->message_id.p ? A10_FLAG_MESSAGE_ID : 0) |
        (f->has_timestamp ? A10_FLAG_TIMESTAMP : 0) | (f->type.p ? A10_FLAG_TYPE : 0) |
        (f->user_id.p ? A10_FLAG_USER_ID : 0) | (f->app_id.p ? A10_FLAG_APP_ID : 0);
    a10_put_be(o, flags, 2);
    for (int i = 0; i < 2; i++) {
        if (strings[i]->p) {
            a10_put_shortstr(o, strings[i]);
        }
    }
    if (s->header_count) {
        size_t mark = o->len;
        a10_put_be(o, 0, 4);
        for (size_t i = 0; i < s->header_count; i++) {
            const A10Header *h = &s->headers[i];
            a10_put_shortstr(o, &h->name);
            if (h->base == NULL) {
                a10_put_sized(o, 'S', filter.p, filter.n);
            } else if (a10_emit(o, h->base, &h->value) != A10_OK) {
                return A10_FALLBACK;
            }
        }
        a10_patch_size(o, mark);
    }
    if (f->delivery_mode >= 0) {
        a10_put_byte(o, (uint8_t)f->delivery_mode);
    }
    if (f->priority >= 0) {
        a10_put_byte(o, (uint8_t)f->priority);
    }
    for (int i = 0; i < 4; i++) {
        if (late[i]->p) {
            a10_put_shortstr(o, late[i]);
        }
    }
    if (f->has_timestamp) {
        a10_put_be(o, f->timestamp_s, 8);
    }
    for (int i = 0; i < 3; i++) {
        if (last[i]->p) {
            a10_put_shortstr(o, last[i]);
        }
    }
    return o->failed ? A10_FALLBACK : A10_OK;
}

/* The message `b[0..n)` of a native record whose filter value is `filter`, for a stream
 * whose name (UTF-8) is `stream_key`: appends its 0-9-1 properties to `props` and sets
 * the exchange and routing key (spans into `b` or `stream_key`); the body is the data
 * sections s->data[0..s->data_count), joined. On A10_FALLBACK, `props` may hold part of
 * them: the caller cuts it back. */
static int
a10_convert(const uint8_t *b, size_t n, A10Span stream_key, A10Span filter, A10Scratch *s,
            A10Out *props, A10Result *r)
{
    A10Properties f;
    memset(&f, 0, sizeof f);
    s->key_count = s->annotation_count = s->header_count = 0;
    if (a10_sections(b, n, s) != A10_OK) {
        return A10_FALLBACK;
    }
    if (s->has_annotations && a10_is_map(&s->annotations) &&
        a10_keyed(b, &s->annotations, s) != A10_OK) {
        return A10_FALLBACK;
    }
    s->annotation_count = s->key_count;
    if (s->has_application && a10_is_map(&s->application) &&
        a10_keyed(b, &s->application, s) != A10_OK) {
        return A10_FALLBACK;
    }
    a10_header_fields(b, s, &f);
    if (a10_headers(b, s) != A10_OK || a10_properties_fields(b, s, &f) != A10_OK) {
        return A10_FALLBACK;
    }
    if (filter.n && a10_add_header(s, (const uint8_t *)A10_FILTER_HEADER,
                                   sizeof A10_FILTER_HEADER - 1, NULL, NULL) != A10_OK) {
        return A10_FALLBACK;
    }
    f.type = a10_shortstr(b, a10_annotation(s, "x-basic-type"));
    const A10Value *exchange = a10_annotation(s, "x-exchange");
    const A10Value *key = a10_annotation(s, "x-routing-key");
    r->exchange.p = b;
    r->exchange.n = 0;
    r->routing_key = stream_key;
    if (exchange && (exchange->code == 0xa1 || exchange->code == 0xb1)) {
        r->exchange.p = b + exchange->at;
        r->exchange.n = exchange->size;
    }
    if (key && (key->code == 0xa1 || key->code == 0xb1)) {
        r->routing_key.p = b + key->at;
        r->routing_key.n = key->size;
    }
    return a10_write_properties(props, s, &f, filter);
}

#endif /* STREAMQ_AMQP10_CONVERT_H */

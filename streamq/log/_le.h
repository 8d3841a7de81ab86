/*
 * Little-endian loads of the segment log's integers (docs/log-format.md), shared by the
 * C units that read records: `_crc32c.h` (its slicing loop), the record readers of
 * `_records_scan.c` and `_streamwire_chunks.c`, and amqp_gateway's deliveries
 * (`_deliver_frames.h`). Static inline, no state.
 */
#ifndef STREAMQ_LE_H
#define STREAMQ_LE_H

#include <stdint.h>

static inline uint32_t
load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t
load_le64(const unsigned char *p)
{
    return (uint64_t)load_le32(p) | (uint64_t)load_le32(p + 4) << 32;
}

#endif /* STREAMQ_LE_H */

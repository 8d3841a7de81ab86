/* CRC32 (IEEE 802.3, zlib's crc32) for the osiris chunks of the stream protocol,
 * header-only (static functions); call crc32_ieee_init() once at import.
 *
 * Every chunk sent to a stream consumer carries the CRC32 of its entries, and clients
 * (the Java and Go ones by default) check it. zlib's table code ran at about 3 GB/s here
 * and took a quarter of the broker's CPU while a consumer read 1 KiB messages, so bulk
 * data goes through carry-less multiplication (PCLMULQDQ) folding: 64 bytes per step in
 * four lanes, folded into one 128-bit lane, reduced to 64 then 32 bits (Barrett), as in
 * Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction" (Intel, 2009). The folding constants are the published ones for the
 * reflected polynomial 0xEDB88320: x^(4*128+32), x^(4*128-32) mod P (four-lane fold),
 * x^(128+32), x^(128-32) mod P (one-lane fold), x^64 mod P, and P' and mu for Barrett.
 * Short inputs, the unaligned tail and CPUs without PCLMULQDQ use a byte table. The
 * values equal zlib.crc32's: the tests compare them on random lengths and contents.
 */
#ifndef STREAMQ_CRC32_H
#define STREAMQ_CRC32_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(CRC32C_PORTABLE_ONLY)
#include <smmintrin.h>
#include <wmmintrin.h>
#define CRC32_HAVE_CLMUL 1
#else
#define CRC32_HAVE_CLMUL 0
#endif

#define CRC32_POLY_REFLECTED 0xEDB88320u
#define CRC32_FOLD_MIN 64 /* the folding path needs at least one 64-byte block */

static uint32_t crc32_ieee_table[256];
static int crc32_clmul; /* the CPU has PCLMULQDQ and SSE4.1 */

static void
crc32_ieee_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32_POLY_REFLECTED : c >> 1;
        crc32_ieee_table[n] = c;
    }
#if CRC32_HAVE_CLMUL
    crc32_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* On the raw (inverted) register. */
static uint32_t
crc32_ieee_bytes(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--)
        c = crc32_ieee_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if CRC32_HAVE_CLMUL
/* The raw register after `n` bytes, n >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc32_ieee_fold(uint32_t c, const unsigned char *p, size_t n)
{
    const __m128i fold4 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i fold1 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i x64 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i barrett = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    __m128i a = _mm_loadu_si128((const __m128i *)p);
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(p + 48));
    a = _mm_xor_si128(a, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
#define CRC32_FOLD_INTO(lane, k, next)                                                      \
    lane = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(lane, k, 0x00),                 \
                                       _mm_clmulepi64_si128(lane, k, 0x11)),                \
                         next)
    for (; n >= 64; p += 64, n -= 64) {
        CRC32_FOLD_INTO(a, fold4, _mm_loadu_si128((const __m128i *)p));
        CRC32_FOLD_INTO(b, fold4, _mm_loadu_si128((const __m128i *)(p + 16)));
        CRC32_FOLD_INTO(d, fold4, _mm_loadu_si128((const __m128i *)(p + 32)));
        CRC32_FOLD_INTO(e, fold4, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    CRC32_FOLD_INTO(a, fold1, b); /* four lanes into one */
    CRC32_FOLD_INTO(a, fold1, d);
    CRC32_FOLD_INTO(a, fold1, e);
    for (; n >= 16; p += 16, n -= 16)
        CRC32_FOLD_INTO(a, fold1, _mm_loadu_si128((const __m128i *)p));
#undef CRC32_FOLD_INTO
    /* 128 bits to 64, then to 32 with x^64 mod P, then Barrett's reduction. */
    __m128i t = _mm_clmulepi64_si128(a, fold1, 0x10);
    a = _mm_xor_si128(_mm_srli_si128(a, 8), t);
    t = _mm_srli_si128(a, 4);
    a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), x64, 0x00), t);
    t = _mm_clmulepi64_si128(_mm_and_si128(a, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(a, t), 1);
}
#endif

/* zlib's crc32(crc, p, n): `crc` is a previous result (0 to start). */
static uint32_t
crc32_ieee(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t c = crc ^ 0xFFFFFFFFu;
#if CRC32_HAVE_CLMUL
    if (crc32_clmul && n >= CRC32_FOLD_MIN) {
        size_t bulk = n & ~(size_t)15;
        c = crc32_ieee_fold(c, p, bulk);
        p += bulk;
        n -= bulk;
    }
#endif
    return crc32_ieee_bytes(c, p, n) ^ 0xFFFFFFFFu;
}

#endif

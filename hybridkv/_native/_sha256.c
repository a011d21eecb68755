/* SHA-256 (FIPS 180-4, section 6.2): padding, a portable compression
 * function and one using the x86 SHA extensions, chosen at run time.
 *
 * The message is processed in 64-byte blocks; the last one or two blocks
 * carry the 0x80 byte, zero padding and the message length in bits as a
 * big-endian uint64. The state is eight uint32 words H0..H7.
 */
#include "_sha256.h"

#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HKV_HAVE_SHA_NI 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define HKV_HAVE_SHA_NI 0
#endif

typedef void (*compress_fn)(uint32_t state[8], const unsigned char *blocks, size_t num_blocks);

/* The first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes (FIPS 180-4, 4.2.2). */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

/* Initial hash value: fractional parts of the square roots of the first 8 primes (5.3.3). */
static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static inline uint32_t
rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static inline uint32_t
load_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void
store_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* ---- portable compression (6.2.2) ---------------------------------------- */

#define BSIG0(x) (rotr((x), 2) ^ rotr((x), 13) ^ rotr((x), 22))
#define BSIG1(x) (rotr((x), 6) ^ rotr((x), 11) ^ rotr((x), 25))
#define SSIG0(x) (rotr((x), 7) ^ rotr((x), 18) ^ ((x) >> 3))
#define SSIG1(x) (rotr((x), 17) ^ rotr((x), 19) ^ ((x) >> 10))
#define CH(x, y, z) (((x) & (y)) ^ (~(x) & (z)))
#define MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))

static void
compress_portable(uint32_t state[8], const unsigned char *blocks, size_t num_blocks)
{
    uint32_t w[64];
    for (; num_blocks > 0; num_blocks--, blocks += 64) {
        for (int t = 0; t < 16; t++)
            w[t] = load_be32(blocks + 4 * t);
        for (int t = 16; t < 64; t++)
            w[t] = SSIG1(w[t - 2]) + w[t - 7] + SSIG0(w[t - 15]) + w[t - 16];
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = h + BSIG1(e) + CH(e, f, g) + K[t] + w[t];
            uint32_t t2 = BSIG0(a) + MAJ(a, b, c);
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        state[0] += a;
        state[1] += b;
        state[2] += c;
        state[3] += d;
        state[4] += e;
        state[5] += f;
        state[6] += g;
        state[7] += h;
    }
}

/* ---- compression with the x86 SHA extensions ---------------------------- */
#if HKV_HAVE_SHA_NI

#define HKV_SHA_TARGET __attribute__((target("sha,sse4.1,ssse3")))

/* Four rounds t..t+3 on the message words in msg (W[t] in lane 0).
 * sha256rnds2 runs two rounds on lanes 0-1 of its third operand; after it
 * the old ABEF is the new CDGH. */
#define FOUR_ROUNDS(msg, t)                                                   \
    do {                                                                      \
        __m128i wk = _mm_add_epi32((msg), _mm_loadu_si128((const __m128i *)&K[t])); \
        __m128i next = _mm_sha256rnds2_epu32(cdgh, abef, wk);                 \
        cdgh = abef;                                                          \
        abef = next;                                                          \
        next = _mm_sha256rnds2_epu32(cdgh, abef, _mm_shuffle_epi32(wk, 0x0E)); \
        cdgh = abef;                                                          \
        abef = next;                                                          \
    } while (0)

/* W[t..t+3] from the previous four groups: w16 = W[t-16..], w12 = W[t-12..],
 * w8 = W[t-8..], w4 = W[t-4..]; the result replaces w16. */
#define SCHEDULE(w16, w12, w8, w4)                                             \
    (w16) = _mm_sha256msg2_epu32(                                              \
        _mm_add_epi32(_mm_sha256msg1_epu32((w16), (w12)), _mm_alignr_epi8((w4), (w8), 4)), (w4))

HKV_SHA_TARGET static void
compress_sha_ni(uint32_t state[8], const unsigned char *blocks, size_t num_blocks)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    /* state as the instructions want it: abef = (F, E, B, A), cdgh = (H, G, D, C) */
    __m128i lo = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0xB1);
    __m128i hi = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1B);
    __m128i abef = _mm_alignr_epi8(lo, hi, 8);
    __m128i cdgh = _mm_blend_epi16(hi, lo, 0xF0);
    for (; num_blocks > 0; num_blocks--, blocks += 64) {
        __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i m0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 0)), bswap);
        __m128i m1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 16)), bswap);
        __m128i m2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 32)), bswap);
        __m128i m3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 48)), bswap);
        FOUR_ROUNDS(m0, 0);
        FOUR_ROUNDS(m1, 4);
        FOUR_ROUNDS(m2, 8);
        FOUR_ROUNDS(m3, 12);
        for (int t = 16; t < 64; t += 16) {
            SCHEDULE(m0, m1, m2, m3);
            FOUR_ROUNDS(m0, t);
            SCHEDULE(m1, m2, m3, m0);
            FOUR_ROUNDS(m1, t + 4);
            SCHEDULE(m2, m3, m0, m1);
            FOUR_ROUNDS(m2, t + 8);
            SCHEDULE(m3, m0, m1, m2);
            FOUR_ROUNDS(m3, t + 12);
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }
    /* back to (A, B, C, D), (E, F, G, H) */
    lo = _mm_shuffle_epi32(abef, 0x1B);  /* (A, B, E, F) */
    hi = _mm_shuffle_epi32(cdgh, 0xB1);  /* (G, H, C, D) */
    _mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(lo, hi, 0xF0));
    _mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(hi, lo, 8));
}

/* SHA (CPUID.7.0:EBX[29]) with SSSE3 and SSE4.1 (CPUID.1:ECX[9], [19]). */
static int
cpu_has_sha_ni(void)
{
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    if (!(ecx & (1u << 9)) || !(ecx & (1u << 19)))
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return (ebx >> 29) & 1;
}

#else
static int
cpu_has_sha_ni(void)
{
    return 0;
}
#endif

/* ---- dispatch and padding ------------------------------------------------ */

static compress_fn compress = compress_portable;
static const char *backend = "portable";

void
hkv_sha256_init(void)
{
    hkv_sha256_force_portable(0);
}

const char *
hkv_sha256_force_portable(int portable)
{
    compress = compress_portable;
    backend = "portable";
#if HKV_HAVE_SHA_NI
    if (!portable && cpu_has_sha_ni()) {
        compress = compress_sha_ni;
        backend = "sha-ni";
    }
#endif
    return backend;
}

const char *
hkv_sha256_backend(void)
{
    return backend;
}

void
hkv_sha256(const unsigned char *data, size_t len, unsigned char out[HKV_SHA256_DIGEST])
{
    uint32_t state[8];
    memcpy(state, H0, sizeof state);
    /* a message that fits in two padded blocks (the usual block input) is
     * copied whole, so that one call compresses it */
    size_t full = len <= 128 - 9 ? 0 : len / 64;
    if (full > 0)
        compress(state, data, full);
    /* the tail, 0x80, zeros, then the bit length: one block, or two when
     * fewer than 9 bytes are left after the tail */
    unsigned char last[128];
    size_t tail = len - full * 64;
    size_t padded = tail + 9 <= 64 ? 64 : 128;
    memcpy(last, data + full * 64, tail);
    last[tail] = 0x80;
    memset(last + tail + 1, 0, padded - tail - 1);
    uint64_t bits = (uint64_t)len * 8;
    store_be32(last + padded - 8, (uint32_t)(bits >> 32));
    store_be32(last + padded - 4, (uint32_t)bits);
    compress(state, last, padded / 64);
    for (int i = 0; i < 8; i++)
        store_be32(out + 4 * i, state[i]);
}

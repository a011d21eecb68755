/* SHA-256 (FIPS 180-4) for the chained block hasher, with no library behind it.
 *
 * hkv_sha256() hashes one message in one call. The compression function is
 * picked once, by hkv_sha256_init(): the x86 SHA extensions (SHA-NI) when
 * the CPU reports them at run time, else portable C. Both give the same
 * digests; tests compare them with hashlib.
 */
#ifndef HYBRIDKV_SHA256_H
#define HYBRIDKV_SHA256_H

#include <stddef.h>
#include <stdint.h>

enum { HKV_SHA256_DIGEST = 32 };

/* Selects the compression function for this CPU; call once before hashing. */
void hkv_sha256_init(void);

/* "sha-ni" or "portable": the compression function in use. */
const char *hkv_sha256_backend(void);

/* Forces the portable compression function (1) or the CPU's best (0);
 * returns the backend now in use. For tests and benchmarks. */
const char *hkv_sha256_force_portable(int portable);

/* out = SHA-256(data[0:len]). */
void hkv_sha256(const unsigned char *data, size_t len, unsigned char out[HKV_SHA256_DIGEST]);

#endif

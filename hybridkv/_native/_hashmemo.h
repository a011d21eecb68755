/* A bounded memo of SHA-256 block digests for chain_cached (_chainhash.c).
 *
 * A block's digest is a pure function of its input bytes (the previous
 * digest, the block's tokens, its extra keys), so a block hashed before can
 * return the digest object it got then: requests sharing a prefix hash it
 * once, and the prefix cache's hash map finds its own key object. The memo
 * holds MEMO_SLOTS inputs (direct-mapped on an XXH3 hash of the input,
 * compared byte for byte; a new input replaces the slot's old one), under the
 * GIL. Results are identical with or without it. */
#ifndef HKV_HASHMEMO_H
#define HKV_HASHMEMO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The digest memoized for input[0:len] (a new reference), or NULL (no error). */
PyObject *hkv_memo_get(const unsigned char *input, size_t len, uint64_t *key);

/* Memoizes `digest` for the input whose key hkv_memo_get returned; -1 on no memory. */
int hkv_memo_put(const unsigned char *input, size_t len, uint64_t key, PyObject *digest);

/* Empties the memo (for tests). */
void hkv_memo_clear(void);

#endif

/* The C API of hybridkv._native._chainhash for other extensions (a capsule). */
#ifndef HKV_CHAINHASH_API_H
#define HKV_CHAINHASH_API_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define HKV_CHAIN_API_NAME "hybridkv._native._chainhash._C_API"

typedef struct {
    /* chain()/chain_cached(): the digests (a new list) of num_blocks blocks of `seq`
     * (a list or tuple of token ids) from first_token; memo: use the digest memo
     * (only for SHA-256, algo == sha256_id). NULL with an exception set on error. */
    PyObject *(*chain)(int algo, const char *parent, Py_ssize_t parent_len, PyObject *seq,
                       Py_ssize_t first_token, Py_ssize_t num_blocks, Py_ssize_t block_size,
                       const char *extra, Py_ssize_t extra_len, int memo);
    int sha256_id;
} HkvChainApi;

#endif

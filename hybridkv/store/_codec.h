/* Shared between the C files of hybridkv.store._codec. */
#ifndef HKV_STORE_CODEC_H
#define HKV_STORE_CODEC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* XXH3-64 of `len` bytes */
uint64_t hkv_hash64(const void *data, size_t len);

/* Write the stored value of block i of a batch into `value` (head_len + 8 +
 * num_layers * layer_bytes bytes): the header start, the checksum (XXH3-64 of
 * the block's data seeded with XXH3-64 of its key, little-endian), the data
 * (layer l of block i at src + (l * n + i) * layer_bytes). Needs no GIL. */
void hkv_encode_value(char *value, const char *head, Py_ssize_t head_len, const char *key,
                      size_t key_len, const char *src, Py_ssize_t n, Py_ssize_t i,
                      Py_ssize_t num_layers, Py_ssize_t layer_bytes);

/* Add the LruTable / EvictionRecorder type to the module; 0 or -1 with an
 * exception set */
int hkv_add_lrutable(PyObject *module);
int hkv_add_recorder(PyObject *module);

#endif

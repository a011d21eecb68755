/* Shared between the C files of hybridkv._native._codec. */
#ifndef HKV_STORE_CODEC_H
#define HKV_STORE_CODEC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* XXH3-64 of `len` bytes */
uint64_t hkv_hash64(const void *data, size_t len);

/* Where the data of a batch's blocks is: block i's page in layer l is the
 * layer_bytes at bases[l] + row * strides[l], row being ids[i] (ids NULL: i) */
typedef struct {
    Py_ssize_t num_layers, layer_bytes;
    const char **bases;
    Py_ssize_t *strides;
    const int64_t *ids;
    Py_buffer *views;  /* buffers to release (num_layers of them), or NULL */
} Rows;

/* Rows over a C-contiguous buffer of num_layers x n x layer_bytes bytes; 0,
 * or -1 with an exception set. hkv_rows_release frees what either made. */
int hkv_rows_contiguous(Rows *rows, const char *data, Py_ssize_t n, Py_ssize_t num_layers,
                        Py_ssize_t layer_bytes);
/* Rows over pages: `views` a list of 2-D buffers (one per layer: a row per
 * block id, each row's first layer_bytes bytes contiguous), `ids` native
 * int64 block ids, each checked to be a row of every view */
int hkv_rows_pages(Rows *rows, PyObject *views, Py_ssize_t layer_bytes, const int64_t *ids,
                   Py_ssize_t n);
void hkv_rows_release(Rows *rows);

/* Write the stored value of block i into `value` (head_len + 8 + num_layers *
 * layer_bytes bytes): the header start, the checksum (XXH3-64 of the block's
 * data seeded with `key_hash`, XXH3-64 of its key; little-endian), the data
 * (its page in each layer, in layer order). Needs no GIL. */
void hkv_encode_value(char *value, const char *head, Py_ssize_t head_len, uint64_t key_hash,
                      const Rows *rows, Py_ssize_t i);

/* Add the LruTable / EvictionRecorder / TailSet type to the module; 0 or -1
 * with an exception set */
int hkv_add_lrutable(PyObject *module);
int hkv_add_recorder(PyObject *module);
int hkv_add_tailset(PyObject *module);

/* Whether `obj` is a TailSet; whether it holds the bytes `h` (no error) */
int hkv_tailset_check(PyObject *obj);
int hkv_tailset_contains(PyObject *obj, PyObject *h);

#endif

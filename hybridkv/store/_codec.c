/* Per-batch work of the KV tier in C: the fast path of hybridkv/store/codec.py.
 *
 * encode(header_start, keys, data, num_layers, layer_bytes) -> list[bytes]
 *     The stored values of a batch of blocks (hybridkv/store/payload.py):
 *     header_start | checksum (u64 LE) | block data, where block i's data is
 *     data[l, i, :] for each layer l in order (`data` is a C-contiguous
 *     buffer of num_layers x n x layer_bytes bytes, n = len(keys)) and the
 *     checksum is XXH3-64 of that data seeded with XXH3-64 of keys[i].
 *     The values are allocated first; the copies and checksums then run
 *     with the GIL released.
 *
 * EvictionRecorder (_recorder.c): the pool's eviction hook.
 * LruTable (_lrutable.c): the cpu:// store's map.
 *
 * xxHash is the vendored header-only library (hybridkv/kv_cache/_vendor).
 */
#include "_codec.h"

#include <string.h>

#define XXH_INLINE_ALL
#include "_vendor/xxhash.h"

/* ---- encode ------------------------------------------------------------ */

uint64_t
hkv_hash64(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

void
hkv_encode_value(char *value, const char *head, Py_ssize_t head_len, const char *key,
                 size_t key_len, const char *src, Py_ssize_t n, Py_ssize_t i,
                 Py_ssize_t num_layers, Py_ssize_t layer_bytes)
{
    char *dst = value + head_len + 8;
    for (Py_ssize_t l = 0; l < num_layers; l++)
        memcpy(dst + l * layer_bytes, src + (l * n + i) * layer_bytes, (size_t)layer_bytes);
    uint64_t sum = XXH3_64bits_withSeed(dst, (size_t)(num_layers * layer_bytes),
                                        XXH3_64bits(key, key_len));
    memcpy(value, head, (size_t)head_len);
    for (int b = 0; b < 8; b++)
        value[head_len + b] = (char)(sum >> (8 * b));
}

static PyObject *
encode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer head, data;
    PyObject *keys;
    Py_ssize_t num_layers, layer_bytes;
    if (!PyArg_ParseTuple(args, "y*O!y*nn", &head, &PyList_Type, &keys, &data, &num_layers,
                          &layer_bytes))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (num_layers < 1 || layer_bytes < 0 || data.len != n * num_layers * layer_bytes) {
        PyErr_Format(PyExc_ValueError, "encode: %zd data bytes for %zd blocks of %zd x %zd",
                     data.len, n, num_layers, layer_bytes);
        goto done;
    }
    Py_ssize_t value_bytes = head.len + 8 + num_layers * layer_bytes;
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = NULL;
        if (!PyBytes_Check(key))
            PyErr_Format(PyExc_TypeError, "encode: keys[%zd] is %.100s, not bytes", i,
                         Py_TYPE(key)->tp_name);
        else
            value = PyBytes_FromStringAndSize(NULL, value_bytes);
        if (!value)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, value);
    }
    if (!out)
        goto done;
    /* the keys are held by the caller's list (the call holds it), the values
     * only by `out`: nothing else reads or frees them while the GIL is out */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        hkv_encode_value(PyBytes_AS_STRING(PyList_GET_ITEM(out, i)), head.buf, head.len,
                         PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), data.buf, n, i,
                         num_layers, layer_bytes);
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&head);
    PyBuffer_Release(&data);
    return out;
}

PyDoc_STRVAR(encode_doc,
"encode(header_start, keys, data, num_layers, layer_bytes) -> list[bytes]\n"
"\n"
"The stored values of n = len(keys) blocks: header_start, the XXH3-64\n"
"checksum of the block's data seeded with XXH3-64 of its key (8 bytes,\n"
"little-endian), then the data: data[l, i, :] for each layer l, with data a\n"
"C-contiguous buffer of num_layers x n x layer_bytes bytes.");

static PyMethodDef codec_methods[] = {
    {"encode", encode, METH_VARARGS, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hybridkv.store._codec",
    .m_doc = "C fast path of hybridkv.store (block payloads, eviction selection, LruTable).",
    .m_size = -1,
    .m_methods = codec_methods,
};

PyMODINIT_FUNC
PyInit__codec(void)
{
    PyObject *module = PyModule_Create(&codec_module);
    if (module && (hkv_add_lrutable(module) < 0 || hkv_add_recorder(module) < 0))
        Py_CLEAR(module);
    return module;
}

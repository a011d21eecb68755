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
 * TailSet (_tailset.c): recent prompts' tail blocks, for the selection.
 *
 * xxHash is the vendored header-only library (hybridkv/_native/_vendor).
 *
 * mirrors hybridkv.store.codec.encode_blocks_raw
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

int
hkv_rows_contiguous(Rows *rows, const char *data, Py_ssize_t n, Py_ssize_t num_layers,
                    Py_ssize_t layer_bytes)
{
    memset(rows, 0, sizeof(*rows));
    rows->num_layers = num_layers;
    rows->layer_bytes = layer_bytes;
    rows->bases = PyMem_Malloc(sizeof(char *) * (size_t)num_layers);
    rows->strides = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)num_layers);
    if (!rows->bases || !rows->strides) {
        hkv_rows_release(rows);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t l = 0; l < num_layers; l++) {
        rows->bases[l] = data + l * n * layer_bytes;
        rows->strides[l] = layer_bytes;
    }
    return 0;
}

int
hkv_rows_pages(Rows *rows, PyObject *views, Py_ssize_t layer_bytes, const int64_t *ids,
               Py_ssize_t n)
{
    memset(rows, 0, sizeof(*rows));
    if (!PyList_Check(views) || PyList_GET_SIZE(views) < 1) {
        PyErr_SetString(PyExc_TypeError, "page views must be a non-empty list");
        return -1;
    }
    Py_ssize_t num_layers = PyList_GET_SIZE(views);
    rows->layer_bytes = layer_bytes;
    rows->ids = ids;
    rows->bases = PyMem_Malloc(sizeof(char *) * (size_t)num_layers);
    rows->strides = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)num_layers);
    rows->views = PyMem_Calloc((size_t)num_layers, sizeof(Py_buffer));
    if (!rows->bases || !rows->strides || !rows->views) {
        hkv_rows_release(rows);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t l = 0; l < num_layers; l++) {
        Py_buffer *v = &rows->views[l];
        if (PyObject_GetBuffer(PyList_GET_ITEM(views, l), v, PyBUF_STRIDED_RO) < 0) {
            hkv_rows_release(rows);
            return -1;
        }
        rows->num_layers = l + 1;  /* (buffers to release) */
        if (v->ndim != 2 || v->strides[1] != v->itemsize
                || v->shape[1] * v->itemsize < layer_bytes) {
            PyErr_Format(PyExc_ValueError, "page view %zd: not 2-D rows of at least %zd "
                         "contiguous bytes", l, layer_bytes);
            hkv_rows_release(rows);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= v->shape[0]) {
                PyErr_Format(PyExc_ValueError, "block id %lld is not a row of page view %zd "
                             "(%zd rows)", (long long)ids[i], l, v->shape[0]);
                hkv_rows_release(rows);
                return -1;
            }
        }
        rows->bases[l] = v->buf;
        rows->strides[l] = v->strides[0];
    }
    return 0;
}

void
hkv_rows_release(Rows *rows)
{
    for (Py_ssize_t l = 0; rows->views && l < rows->num_layers; l++)
        PyBuffer_Release(&rows->views[l]);
    PyMem_Free(rows->views);
    PyMem_Free(rows->bases);
    PyMem_Free(rows->strides);
    rows->views = NULL;
    rows->bases = NULL;
    rows->strides = NULL;
}

void
hkv_encode_value(char *value, const char *head, Py_ssize_t head_len, uint64_t key_hash,
                 const Rows *rows, Py_ssize_t i)
{
    Py_ssize_t b = rows->layer_bytes, row = rows->ids ? (Py_ssize_t)rows->ids[i] : i;
    char *dst = value + head_len + 8;
    for (Py_ssize_t l = 0; l < rows->num_layers; l++)
        memcpy(dst + l * b, rows->bases[l] + row * rows->strides[l], (size_t)b);
    uint64_t sum = XXH3_64bits_withSeed(dst, (size_t)(rows->num_layers * b), key_hash);
    memcpy(value, head, (size_t)head_len);
    for (int k = 0; k < 8; k++)
        value[head_len + k] = (char)(sum >> (8 * k));
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
    Rows rows;
    if (hkv_rows_contiguous(&rows, data.buf, n, num_layers, layer_bytes) < 0) {
        Py_CLEAR(out);
        goto done;
    }
    /* the keys are held by the caller's list (the call holds it), the values
     * only by `out`: nothing else reads or frees them while the GIL is out */
    PyThreadState *saved = n * value_bytes >= (64 << 10) ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        hkv_encode_value(PyBytes_AS_STRING(PyList_GET_ITEM(out, i)), head.buf, head.len,
                         XXH3_64bits(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)),
                         &rows, i);
    }
    if (saved)
        PyEval_RestoreThread(saved);
    hkv_rows_release(&rows);
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
    .m_name = "hybridkv._native._codec",
    .m_doc = "C fast path of hybridkv.store (block payloads, eviction selection, LruTable).",
    .m_size = -1,
    .m_methods = codec_methods,
};

PyMODINIT_FUNC
PyInit__codec(void)
{
    PyObject *module = PyModule_Create(&codec_module);
    if (module && (hkv_add_lrutable(module) < 0 || hkv_add_recorder(module) < 0
                   || hkv_add_tailset(module) < 0))
        Py_CLEAR(module);
    return module;
}

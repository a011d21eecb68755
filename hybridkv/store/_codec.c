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
 * EvictionRecorder(always, low, tails, hashes_out, ids_out)(blocks) -> int
 *     The pool's eviction hook, with the selection of selection.py: for each
 *     block (objects with block_id, block_hash, group_id, value_hint), with
 *     g its group, keep it when always[g] is true, its value_hint is not
 *     `low`, or its hash is in one of the sets of tails[g]; a kept block's
 *     hash goes to hashes_out[g] and its id to ids_out[g]. Returns how many
 *     were kept. The attributes of a class with __slots__ are read straight
 *     from their slots.
 *
 * LruTable (_lrutable.c): the cpu:// store's map.
 *
 * xxHash is the vendored header-only library (hybridkv/kv_cache/_vendor).
 */
#include "_codec.h"

#include <string.h>
#include <structmember.h>

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

/* ---- reading blocks ----------------------------------------------------- */

enum { ATTR_ID, ATTR_HASH, ATTR_GROUP, ATTR_HINT, NUM_ATTRS };
static PyObject *attr_names[NUM_ATTRS];
/* the class whose __slots__ offsets are known, and those offsets */
static PyTypeObject *slots_type;
static Py_ssize_t slot_offsets[NUM_ATTRS];

/* Learn the slot offsets of `type` if each attribute is a plain object slot */
static void
learn_slots(PyTypeObject *type)
{
    Py_ssize_t offsets[NUM_ATTRS];
    for (int a = 0; a < NUM_ATTRS; a++) {
        PyObject *descr = PyObject_GetAttr((PyObject *)type, attr_names[a]);
        if (!descr) {
            PyErr_Clear();
            return;
        }
        int plain = Py_IS_TYPE(descr, &PyMemberDescr_Type)
            && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (plain)
            offsets[a] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!plain)
            return;
    }
    Py_INCREF(type);
    Py_XSETREF(slots_type, type);
    memcpy(slot_offsets, offsets, sizeof(offsets));
}

/* A block's attribute: a new reference, or NULL with an exception set */
static PyObject *
block_attr(PyObject *block, int a)
{
    if (Py_TYPE(block) == slots_type) {
        PyObject *v = *(PyObject **)((char *)block + slot_offsets[a]);
        if (v) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(block, attr_names[a]);
}

/* 1 if `h` is in `sets` (a set, a tuple of sets, or None), 0 if not, -1 on error */
static int
in_tails(PyObject *sets, PyObject *h)
{
    if (PyTuple_Check(sets)) {
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(sets); j++) {
            int r = PySequence_Contains(PyTuple_GET_ITEM(sets, j), h);
            if (r)
                return r;
        }
        return 0;
    }
    return sets == Py_None ? 0 : PySequence_Contains(sets, h);
}

/* Whether the block is kept: 1, 0 or -1 on error */
static int
keep_block(PyObject *block, PyObject *always, Py_ssize_t g, long low, PyObject *tails,
           PyObject *h)
{
    int r = PyObject_IsTrue(PyList_GET_ITEM(always, g));
    if (r)
        return r;
    PyObject *hint = block_attr(block, ATTR_HINT);
    if (!hint)
        return -1;
    long v = PyLong_AsLong(hint);
    Py_DECREF(hint);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v != low)
        return 1;
    return in_tails(PyList_GET_ITEM(tails, g), h);
}

/* ---- EvictionRecorder ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *always, *tails, *hashes_out, *ids_out;  /* lists, one entry per group */
    long low;
} Recorder;

static int
recorder_init(Recorder *r, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"always", "low", "tails", "hashes_out", "ids_out", NULL};
    PyObject *always, *low_obj, *tails, *hashes_out, *ids_out;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!O!O!", names, &PyList_Type, &always,
                                     &low_obj, &PyList_Type, &tails, &PyList_Type, &hashes_out,
                                     &PyList_Type, &ids_out))
        return -1;
    Py_ssize_t num_groups = PyList_GET_SIZE(always);
    if (PyList_GET_SIZE(tails) != num_groups || PyList_GET_SIZE(hashes_out) != num_groups
            || PyList_GET_SIZE(ids_out) != num_groups) {
        PyErr_SetString(PyExc_ValueError, "EvictionRecorder: one list entry per group needed");
        return -1;
    }
    long low = PyLong_AsLong(low_obj);
    if (low == -1 && PyErr_Occurred())
        return -1;
    r->low = low;
    Py_INCREF(always);
    Py_XSETREF(r->always, always);
    Py_INCREF(tails);
    Py_XSETREF(r->tails, tails);
    Py_INCREF(hashes_out);
    Py_XSETREF(r->hashes_out, hashes_out);
    Py_INCREF(ids_out);
    Py_XSETREF(r->ids_out, ids_out);
    return 0;
}

/* The list at `lists[g]` (checked), borrowed; NULL with an exception set */
static PyObject *
output_list(PyObject *lists, Py_ssize_t g)
{
    PyObject *out = g < PyList_GET_SIZE(lists) ? PyList_GET_ITEM(lists, g) : NULL;
    if (!out || !PyList_Check(out)) {
        PyErr_Format(PyExc_TypeError, "EvictionRecorder: no output list for group %zd", g);
        return NULL;
    }
    return out;
}

static int
record_one(Recorder *r, PyObject *block)
{
    int kept = -1;
    PyObject *h = NULL, *gobj = NULL, *id = NULL, *hashes, *ids;
    h = block_attr(block, ATTR_HASH);
    gobj = h ? block_attr(block, ATTR_GROUP) : NULL;
    if (!gobj)
        goto done;
    Py_ssize_t g = PyLong_AsSsize_t(gobj);
    if (g == -1 && PyErr_Occurred())
        goto done;
    if (g < 0 || g >= PyList_GET_SIZE(r->always) || g >= PyList_GET_SIZE(r->tails)) {
        PyErr_Format(PyExc_ValueError, "EvictionRecorder: group id %zd of %zd groups", g,
                     PyList_GET_SIZE(r->always));
        goto done;
    }
    kept = keep_block(block, r->always, g, r->low, r->tails, h);
    if (kept <= 0)
        goto done;
    kept = -1;
    id = block_attr(block, ATTR_ID);
    if (id && (hashes = output_list(r->hashes_out, g)) && (ids = output_list(r->ids_out, g))
            && PyList_Append(hashes, h) == 0 && PyList_Append(ids, id) == 0)
        kept = 1;
done:
    Py_XDECREF(h);
    Py_XDECREF(gobj);
    Py_XDECREF(id);
    return kept;
}

static PyObject *
recorder_call(Recorder *r, PyObject *args, PyObject *kwds)
{
    PyObject *blocks;
    if (!r->always) {
        PyErr_SetString(PyExc_RuntimeError, "EvictionRecorder is not initialized");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "EvictionRecorder", 1, 1, &blocks))
        return NULL;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "EvictionRecorder takes no keyword arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(blocks, "EvictionRecorder: blocks must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t kept = 0, n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n && Py_TYPE(items[0]) != slots_type)
        learn_slots(Py_TYPE(items[0]));
    for (Py_ssize_t i = 0; i < n; i++) {
        int k = record_one(r, items[i]);
        if (k < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        kept += k;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(kept);
}

static int
recorder_traverse(Recorder *r, visitproc visit, void *arg)
{
    Py_VISIT(r->always);
    Py_VISIT(r->tails);
    Py_VISIT(r->hashes_out);
    Py_VISIT(r->ids_out);
    return 0;
}

static int
recorder_clear(Recorder *r)
{
    Py_CLEAR(r->always);
    Py_CLEAR(r->tails);
    Py_CLEAR(r->hashes_out);
    Py_CLEAR(r->ids_out);
    return 0;
}

static void
recorder_dealloc(Recorder *r)
{
    PyObject_GC_UnTrack(r);
    recorder_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

PyDoc_STRVAR(recorder_doc,
"EvictionRecorder(always, low, tails, hashes_out, ids_out)\n"
"\n"
"Called with evicted blocks, notes those worth storing: a block of group g\n"
"when always[g], its value_hint is not low, or its hash is in tails[g] (a\n"
"set, a tuple of sets, or None); its hash goes to the list hashes_out[g]\n"
"(the one there at the call), its id to ids_out[g]. Returns how many.");

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv.store._codec.EvictionRecorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = recorder_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_call = (ternaryfunc)recorder_call,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
};

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
    static const char *names[NUM_ATTRS] = {"block_id", "block_hash", "group_id",
                                            "value_hint"};
    for (int a = 0; a < NUM_ATTRS; a++)
        if (!(attr_names[a] = PyUnicode_InternFromString(names[a])))
            return NULL;
    PyObject *module = PyModule_Create(&codec_module);
    if (!module)
        return NULL;
    if (PyType_Ready(&RecorderType) < 0 || hkv_add_lrutable(module) < 0)
        goto fail;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(module, "EvictionRecorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        goto fail;
    }
    return module;
fail:
    Py_DECREF(module);
    return NULL;
}

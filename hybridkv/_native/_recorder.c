/* EvictionRecorder: the pool's eviction hook of a KV tier, in C (the
 * reference is codec.PyEvictionRecorder).
 *
 * EvictionRecorder(always, low, tails) is called by the pool with the cached
 * blocks it takes for new data (objects with block_id, block_hash, group_id
 * and value_hint, before they lose their hash). It keeps a block of group g
 * when always[g] is true, its value_hint is not `low`, or its hash is in
 * tails[g] (a TailSet, a set, a tuple of sets, or None): the selection of
 * selection.py.
 * Blocks without a hash (that cached nothing) are passed over.
 * A kept block's hash is appended to the group's list and its id to the
 * group's int64 buffer; take(g) returns both, most recently evicted first
 * (the heads of chains first: a request's tail is evicted first), and
 * empties them. No Python object is made per block; the attributes of a
 * class with __slots__ are read straight from their slots.
 *
 * mirrors hybridkv.store.codec.PyEvictionRecorder
 */
#include "_codec.h"

#include <string.h>
#include <structmember.h>

enum { ATTR_ID, ATTR_HASH, ATTR_GROUP, ATTR_HINT, NUM_ATTRS };
static PyObject *attr_names[NUM_ATTRS];
/* the block class whose __slots__ offsets are known, and those offsets */
static PyTypeObject *slots_type;
static Py_ssize_t slot_offsets[NUM_ATTRS];

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t num_groups;
    char *always;          /* per group: keep every block */
    PyObject *tails;       /* list: per group, a set, a tuple of sets, or None */
    PyObject **hashes;     /* per group: a list of the kept blocks' hashes */
    int64_t **ids;         /* per group: the kept blocks' ids */
    Py_ssize_t *num_ids, *cap_ids;
    long low;
    Py_ssize_t num_recorded;  /* kept blocks not taken yet */
} Recorder;

/* ---- reading blocks ------------------------------------------------------ */

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

/* 1 if `h` is in `sets` (a TailSet, a set, a tuple of sets, or None), 0 if not,
 * -1 on error */
static int
in_tails(PyObject *sets, PyObject *h)
{
    if (hkv_tailset_check(sets))
        return hkv_tailset_contains(sets, h);
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
keep_block(Recorder *r, PyObject *block, Py_ssize_t g, PyObject *h)
{
    if (r->always[g])
        return 1;
    PyObject *hint = block_attr(block, ATTR_HINT);
    if (!hint)
        return -1;
    long v = PyLong_AsLong(hint);
    Py_DECREF(hint);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v != r->low)
        return 1;
    return in_tails(PyList_GET_ITEM(r->tails, g), h);
}

/* ---- recording ------------------------------------------------------------ */

static int
append_id(Recorder *r, Py_ssize_t g, int64_t id)
{
    if (r->num_ids[g] == r->cap_ids[g]) {
        Py_ssize_t cap = r->cap_ids[g] ? 2 * r->cap_ids[g] : 64;
        int64_t *ids = PyMem_Realloc(r->ids[g], (size_t)cap * sizeof(int64_t));
        if (!ids) {
            PyErr_NoMemory();
            return -1;
        }
        r->ids[g] = ids;
        r->cap_ids[g] = cap;
    }
    r->ids[g][r->num_ids[g]++] = id;
    return 0;
}

/* Record one block if kept: 1 kept, 0 not, -1 on error */
static int
record_one(Recorder *r, PyObject *block)
{
    int kept = -1;
    PyObject *h = NULL, *gobj = NULL, *id = NULL;
    h = block_attr(block, ATTR_HASH);
    if (h == Py_None) {  /* a block that cached nothing */
        kept = 0;
        goto done;
    }
    gobj = h ? block_attr(block, ATTR_GROUP) : NULL;
    if (!gobj)
        goto done;
    Py_ssize_t g = PyLong_AsSsize_t(gobj);
    if (g == -1 && PyErr_Occurred())
        goto done;
    if (g < 0 || g >= r->num_groups) {
        PyErr_Format(PyExc_ValueError, "EvictionRecorder: group id %zd of %zd groups", g,
                     r->num_groups);
        goto done;
    }
    kept = keep_block(r, block, g, h);
    if (kept <= 0)
        goto done;
    kept = -1;
    id = block_attr(block, ATTR_ID);
    long long v = id ? PyLong_AsLongLong(id) : -1;
    if (!id || (v == -1 && PyErr_Occurred()))
        goto done;
    if (append_id(r, g, (int64_t)v) < 0)
        goto done;
    if (PyList_Append(r->hashes[g], h) < 0) {
        r->num_ids[g]--;
        goto done;
    }
    r->num_recorded++;
    kept = 1;
done:
    Py_XDECREF(h);
    Py_XDECREF(gobj);
    Py_XDECREF(id);
    return kept;
}

static PyObject *
recorder_vectorcall(Recorder *r, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!r->always) {
        PyErr_SetString(PyExc_RuntimeError, "EvictionRecorder is not initialized");
        return NULL;
    }
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "EvictionRecorder takes one argument, the blocks");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "EvictionRecorder: blocks must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n && Py_TYPE(items[0]) != slots_type)
        learn_slots(Py_TYPE(items[0]));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (record_one(r, items[i]) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *
recorder_take(Recorder *r, PyObject *arg)
{
    if (!r->always) {
        PyErr_SetString(PyExc_RuntimeError, "EvictionRecorder is not initialized");
        return NULL;
    }
    Py_ssize_t g = PyLong_AsSsize_t(arg);
    if (g == -1 && PyErr_Occurred())
        return NULL;
    if (g < 0 || g >= r->num_groups) {
        PyErr_Format(PyExc_ValueError, "take: group id %zd of %zd groups", g, r->num_groups);
        return NULL;
    }
    Py_ssize_t n = r->num_ids[g];
    PyObject *fresh = PyList_New(0);
    PyObject *ids = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!fresh || !ids) {
        Py_XDECREF(fresh);
        Py_XDECREF(ids);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(ids);
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = r->ids[g][n - 1 - i];
    PyObject *hashes = r->hashes[g];
    r->hashes[g] = fresh;
    r->num_ids[g] = 0;
    r->num_recorded -= n;
    if (PyList_Reverse(hashes) < 0) {
        Py_DECREF(hashes);
        Py_DECREF(ids);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, hashes, ids);
    Py_DECREF(hashes);
    Py_DECREF(ids);
    return result;
}

static PyObject *
recorder_num_recorded(Recorder *r, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(r->num_recorded);
}

/* ---- the type -------------------------------------------------------------- */

static void
free_groups(Recorder *r)
{
    for (Py_ssize_t g = 0; g < r->num_groups; g++) {
        if (r->hashes)
            Py_CLEAR(r->hashes[g]);
        if (r->ids)
            PyMem_Free(r->ids[g]);
    }
    PyMem_Free(r->hashes);
    PyMem_Free(r->ids);
    PyMem_Free(r->num_ids);
    PyMem_Free(r->cap_ids);
    PyMem_Free(r->always);
    r->hashes = NULL;
    r->ids = NULL;
    r->num_ids = r->cap_ids = NULL;
    r->always = NULL;
    r->num_groups = 0;
}

static int
recorder_init(Recorder *r, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"always", "low", "tails", NULL};
    PyObject *always, *low_obj, *tails;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!", names, &PyList_Type, &always,
                                     &low_obj, &PyList_Type, &tails))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(always);
    if (PyList_GET_SIZE(tails) != n) {
        PyErr_SetString(PyExc_ValueError, "EvictionRecorder: one tails entry per group needed");
        return -1;
    }
    long low = PyLong_AsLong(low_obj);
    if (low == -1 && PyErr_Occurred())
        return -1;
    free_groups(r);
    size_t m = (size_t)(n ? n : 1);
    r->always = PyMem_Calloc(m, 1);
    r->hashes = PyMem_Calloc(m, sizeof(PyObject *));
    r->ids = PyMem_Calloc(m, sizeof(int64_t *));
    r->num_ids = PyMem_Calloc(m, sizeof(Py_ssize_t));
    r->cap_ids = PyMem_Calloc(m, sizeof(Py_ssize_t));
    if (!r->always || !r->hashes || !r->ids || !r->num_ids || !r->cap_ids) {
        free_groups(r);
        PyErr_NoMemory();
        return -1;
    }
    r->num_groups = n;
    for (Py_ssize_t g = 0; g < n; g++) {
        int keep_all = PyObject_IsTrue(PyList_GET_ITEM(always, g));
        if (keep_all < 0 || !(r->hashes[g] = PyList_New(0))) {
            free_groups(r);
            return -1;
        }
        r->always[g] = (char)keep_all;
    }
    Py_INCREF(tails);
    Py_XSETREF(r->tails, tails);
    r->low = low;
    r->num_recorded = 0;
    r->vectorcall = (vectorcallfunc)recorder_vectorcall;
    return 0;
}

static int
recorder_traverse(Recorder *r, visitproc visit, void *arg)
{
    Py_VISIT(r->tails);
    for (Py_ssize_t g = 0; r->hashes && g < r->num_groups; g++)
        Py_VISIT(r->hashes[g]);
    return 0;
}

static int
recorder_clear(Recorder *r)
{
    Py_CLEAR(r->tails);
    for (Py_ssize_t g = 0; r->hashes && g < r->num_groups; g++)
        Py_CLEAR(r->hashes[g]);
    return 0;
}

static void
recorder_dealloc(Recorder *r)
{
    PyObject_GC_UnTrack(r);
    recorder_clear(r);
    free_groups(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef recorder_methods[] = {
    {"take", (PyCFunction)recorder_take, METH_O,
     "take(group_id) -> (hashes, ids): the group's kept blocks, most recently evicted\n"
     "first (a list of hashes and the ids as native int64 bytes); empties them"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef recorder_getset[] = {
    {"num_recorded", (getter)recorder_num_recorded, NULL, "kept blocks not taken yet", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(recorder_doc,
"EvictionRecorder(always, low, tails)\n"
"\n"
"The pool's eviction hook: called with evicted blocks, keeps a block of group\n"
"g when always[g], its value_hint is not low, or its hash is in tails[g] (a\n"
"set, a tuple of sets, or None); take(g) returns the kept hashes and ids.");

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._codec.EvictionRecorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = recorder_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Recorder, vectorcall),
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
    .tp_getset = recorder_getset,
};

int
hkv_add_recorder(PyObject *module)
{
    static const char *names[NUM_ATTRS] = {"block_id", "block_hash", "group_id",
                                            "value_hint"};
    for (int a = 0; a < NUM_ATTRS; a++)
        if (!attr_names[a] && !(attr_names[a] = PyUnicode_InternFromString(names[a])))
            return -1;
    if (PyType_Ready(&RecorderType) < 0)
        return -1;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(module, "EvictionRecorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        return -1;
    }
    return 0;
}

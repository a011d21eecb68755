/* TailSet: the tier's memory of recent prompts' tail blocks, in C (the
 * reference is selection.RecentSet).
 *
 * A set keeping about the `capacity` most recently added block hashes in two
 * generations: items go to the newer one; when an update leaves it with more
 * than capacity / 2, the older one is emptied and becomes the newer. Items
 * are kept as 64-bit fingerprints (XXH3-64 of the hash) in open-addressing
 * tables, 8 bytes each, instead of Python sets holding the hash objects alive:
 * a fingerprint shared by two hashes (odds about n / 2**64) makes one more
 * block look like a tail block, which only stores it.
 *
 * mirrors hybridkv.store.selection.RecentSet
 */
#include "_codec.h"

#include <string.h>

typedef struct {
    uint64_t *slots;  /* 0: empty */
    size_t mask;
    Py_ssize_t count;
} Generation;

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    Generation gens[2];
    int newer;
} TailSet;

static PyTypeObject TailSetType;

static uint64_t
fingerprint(PyObject *h)
{
    uint64_t f = hkv_hash64(PyBytes_AS_STRING(h), (size_t)PyBytes_GET_SIZE(h));
    return f ? f : 1;
}

static int
gen_has(const Generation *g, uint64_t f)
{
    for (size_t pos = f & g->mask;; pos = (pos + 1) & g->mask) {
        if (g->slots[pos] == f)
            return 1;
        if (!g->slots[pos])
            return 0;
    }
}

static void
gen_add(Generation *g, uint64_t f)
{
    size_t pos = f & g->mask;
    for (; g->slots[pos]; pos = (pos + 1) & g->mask)
        if (g->slots[pos] == f)
            return;
    g->slots[pos] = f;
    g->count++;
}

int
hkv_tailset_check(PyObject *obj)
{
    return Py_IS_TYPE(obj, &TailSetType);
}

int
hkv_tailset_contains(PyObject *obj, PyObject *h)
{
    if (!PyBytes_Check(h))
        return 0;
    TailSet *s = (TailSet *)obj;
    if (!s->gens[0].slots)
        return 0;
    uint64_t f = fingerprint(h);
    return gen_has(&s->gens[s->newer], f) || gen_has(&s->gens[1 - s->newer], f);
}

static int
tailset_init(TailSet *s, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"capacity", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", names, &capacity))
        return -1;
    if (s->gens[0].slots) {
        PyErr_SetString(PyExc_RuntimeError, "TailSet is initialized once");
        return -1;
    }
    s->capacity = capacity < 2 ? 2 : capacity;
    /* a generation holds up to capacity / 2 + one update's items: about half full */
    size_t size = 64;
    while (size < (size_t)s->capacity)
        size *= 2;
    for (int i = 0; i < 2; i++) {
        s->gens[i].slots = PyMem_Calloc(size, sizeof(uint64_t));
        if (!s->gens[i].slots) {
            PyErr_NoMemory();
            return -1;
        }
        s->gens[i].mask = size - 1;
        s->gens[i].count = 0;
    }
    s->newer = 0;
    return 0;
}

static PyObject *
tailset_update(TailSet *s, PyObject *items)
{
    if (!s->gens[0].slots) {
        PyErr_SetString(PyExc_RuntimeError, "TailSet is not initialized");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(items, "TailSet.update takes a sequence of bytes");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **hashes = PySequence_Fast_ITEMS(seq);
    Generation *g = &s->gens[s->newer];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(hashes[i])) {
            PyErr_Format(PyExc_TypeError, "TailSet.update: item %zd is %.100s, not bytes", i,
                         Py_TYPE(hashes[i])->tp_name);
            Py_DECREF(seq);
            return NULL;
        }
        if ((size_t)g->count * 4 >= (g->mask + 1) * 3) {  /* (an update larger than the set) */
            PyErr_SetString(PyExc_ValueError, "TailSet.update: more items than its capacity");
            Py_DECREF(seq);
            return NULL;
        }
        gen_add(g, fingerprint(hashes[i]));
    }
    Py_DECREF(seq);
    if (g->count > s->capacity / 2) {  /* the older generation goes */
        s->newer = 1 - s->newer;
        Generation *old = &s->gens[s->newer];
        memset(old->slots, 0, (old->mask + 1) * sizeof(uint64_t));
        old->count = 0;
    }
    Py_RETURN_NONE;
}

static int
tailset_sq_contains(TailSet *s, PyObject *h)
{
    return hkv_tailset_contains((PyObject *)s, h);
}

static Py_ssize_t
tailset_len(TailSet *s)
{
    return s->gens[0].count + s->gens[1].count;
}

static void
tailset_dealloc(TailSet *s)
{
    PyMem_Free(s->gens[0].slots);
    PyMem_Free(s->gens[1].slots);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef tailset_methods[] = {
    {"update", (PyCFunction)tailset_update, METH_O,
     "update(hashes): add these block hashes (the newer generation)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods tailset_as_sequence = {
    .sq_length = (lenfunc)tailset_len,
    .sq_contains = (objobjproc)tailset_sq_contains,
};

static PyTypeObject TailSetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._codec.TailSet",
    .tp_basicsize = sizeof(TailSet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TailSet(capacity): about the capacity most recently added block hashes",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tailset_init,
    .tp_dealloc = (destructor)tailset_dealloc,
    .tp_methods = tailset_methods,
    .tp_as_sequence = &tailset_as_sequence,
};

int
hkv_add_tailset(PyObject *module)
{
    if (PyType_Ready(&TailSetType) < 0)
        return -1;
    Py_INCREF(&TailSetType);
    if (PyModule_AddObject(module, "TailSet", (PyObject *)&TailSetType) < 0) {
        Py_DECREF(&TailSetType);
        return -1;
    }
    return 0;
}

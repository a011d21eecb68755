/* HybridCore: the queues of the `hybrid` eviction policy in C.
 *
 * The rules are eviction/hybrid.py's (`HybridQueues` there is the pure-Python
 * reference this matches decision for decision); HybridPolicy subclasses this
 * type when the extension is built and gives it the ratings that decide a
 * queue (`QUEUE_RATINGS`, a named structure read by attribute). Each queue is a
 * doubly linked list threaded through the blocks themselves (BlockObject.q_*,
 * _fp_hybrid.h), holding a reference to each block, taken from its head: every
 * operation is O(1) per block whatever the pool size. */
#include "_fp_hybrid.h"

PyObject *hkv_slot_values[NUM_QUEUES + 1];

/* The block's rating as a C long (-1 when it is not an int). */
static long
rating_of(BlockObject *b)
{
    PyObject *v = b->value_hint;
    if (v == NULL || !PyLong_Check(v))
        return -1;
    long r = PyLong_AsLong(v);
    if (r == -1 && PyErr_Occurred())
        PyErr_Clear();
    return r;
}

/* The queue a released block joins (hybrid.py's queue_of). */
static int
queue_of(HybridObject *self, BlockObject *b)
{
    if (b->block_hash == Py_None)
        return EMPTY;
    long rating = rating_of(b);
    if (rating == self->protected_value)
        return KEPT;
    if (rating == self->low_value && b->num_hits == 0)
        return LOW;
    return ORDERED;
}

/* ---- construction ------------------------------------------------------------------- */

static void
clear_queues(HybridObject *self)
{
    for (int q = 0; q < NUM_QUEUES; q++) {
        while (self->queues[q].head != NULL) {
            BlockObject *b = self->queues[q].head;
            unlink_block(self, b);
            Py_DECREF(b);
        }
    }
    self->num_free = 0;
}

static int
read_rating(PyObject *ratings, const char *name, long *out)
{
    PyObject *v = PyObject_GetAttrString(ratings, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int
hybrid_init(HybridObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"blocks", "ratings", NULL};
    PyObject *blocks, *ratings;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:HybridCore", kwlist, &blocks, &ratings))
        return -1;
    long low, protected_value;
    if (read_rating(ratings, "low_value", &low) < 0 ||
        read_rating(ratings, "protected", &protected_value) < 0)
        return -1;
    PyObject *seq = PySequence_Fast(blocks, "blocks must be iterable");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(items[i], &HKV_BlockType) || BLOCK(items[i])->q_owner != NULL) {
            PyErr_Format(PyExc_ValueError, "HybridPolicy: %R is not a free Block", items[i]);
            Py_DECREF(seq);
            return -1;
        }
    }
    clear_queues(self);
    self->low_value = low;
    self->protected_value = protected_value;
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        if (b->q_owner == self)  /* given twice: the reference keeps its first place */
            continue;
        Py_INCREF(b);
        push_block(self, EMPTY, b, 0);
        self->num_free++;
    }
    Py_DECREF(seq);
    return 0;
}

static int
hybrid_traverse(HybridObject *Py_UNUSED(self), visitproc Py_UNUSED(visit), void *Py_UNUSED(arg))
{
    return 0;  /* blocks are not tracked by the collector */
}

static int
hybrid_clear(HybridObject *self)
{
    clear_queues(self);
    return 0;
}

static void
hybrid_dealloc(HybridObject *self)
{
    PyObject_GC_UnTrack(self);
    hybrid_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- the policy's methods --------------------------------------------------------------- */

static Py_ssize_t
hybrid_len(HybridObject *self)
{
    return self->num_free;
}

static int
hybrid_contains(HybridObject *self, PyObject *block)
{
    return queued_here(self, block);
}

static PyObject *
hybrid_iter(HybridObject *self)
{
    PyObject *out = PyList_New(0);
    for (int q = 0; out != NULL && q < NUM_QUEUES; q++) {
        for (BlockObject *b = self->queues[q].head; b != NULL; b = b->q_next) {
            if (PyList_Append(out, (PyObject *)b) < 0) {
                Py_CLEAR(out);
                break;
            }
        }
    }
    if (out == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(out);
    Py_DECREF(out);
    return it;
}

/* Checks that every item of seq is a block this policy holds (want_queued) or
 * none holds, and none is given twice; -1 with an error otherwise. */
static int
check_blocks(HybridObject *self, PyObject *seq, int want_queued)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i, bad = -1;
    for (i = 0; i < n && bad < 0; i++) {
        PyObject *obj = items[i];
        if (!PyObject_TypeCheck(obj, &HKV_BlockType) ||
            (BLOCK(obj)->q_owner == self) != want_queued ||
            (!want_queued && BLOCK(obj)->q_owner != NULL) || BLOCK(obj)->q_tier < 0)
            bad = i;
        else
            BLOCK(obj)->q_tier = -1 - BLOCK(obj)->q_tier;  /* marked: seen once */
    }
    for (Py_ssize_t j = 0; j < i - (bad >= 0); j++)
        BLOCK(items[j])->q_tier = -1 - BLOCK(items[j])->q_tier;
    if (bad < 0)
        return 0;
    if (want_queued)
        PyErr_SetObject(PyExc_KeyError, items[bad]);
    else
        PyErr_Format(PyExc_ValueError, "add_free: %R is not a held Block (or given twice)",
                     items[bad]);
    return -1;
}

static PyObject *
hybrid_add_free(HybridObject *self, PyObject *blocks)
{
    PyObject *seq = PySequence_Fast(blocks, "add_free: blocks must be iterable");
    if (seq == NULL)
        return NULL;
    if (check_blocks(self, seq, 0) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        int q = queue_of(self, b);
        Py_INCREF(b);
        push_block(self, q, b, q == EMPTY);  /* empty blocks: reused first */
    }
    self->num_free += n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *
hybrid_remove_blocks(HybridObject *self, PyObject *blocks)
{
    PyObject *seq = PySequence_Fast(blocks, "remove_blocks: blocks must be a sequence");
    if (seq == NULL)
        return NULL;
    if (check_blocks(self, seq, 1) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        unlink_block(self, BLOCK(items[i]));
        Py_DECREF(items[i]);  /* the caller's sequence still holds it */
    }
    self->num_free -= n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *
hybrid_remove(HybridObject *self, PyObject *block)
{
    PyObject *one = PyTuple_Pack(1, block);
    if (one == NULL)
        return NULL;
    PyObject *out = hybrid_remove_blocks(self, one);
    Py_DECREF(one);
    return out;
}

static PyObject *
hybrid_take(HybridObject *self, PyObject *arg)
{
    Py_ssize_t num_blocks = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (num_blocks == -1 && PyErr_Occurred())
        return NULL;
    if (num_blocks < 0 || num_blocks > self->num_free)
        return PyErr_Format(PyExc_ValueError, "take: %zd blocks asked, %zd free", num_blocks,
                            self->num_free);
    PyObject *out = PyList_New(num_blocks);
    if (out == NULL)
        return NULL;
    int q = 0;
    for (Py_ssize_t i = 0; i < num_blocks; i++) {
        while (self->queues[q].head == NULL)
            q++;
        BlockObject *b = self->queues[q].head;
        unlink_block(self, b);
        PyList_SET_ITEM(out, i, (PyObject *)b);  /* the list's reference moves to out */
    }
    self->num_free -= num_blocks;
    return out;
}

static PyObject *
hybrid_hint_changed(HybridObject *self, PyObject *block)
{
    if (!queued_here(self, block)) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    BlockObject *b = BLOCK(block);
    int q = queue_of(self, b);
    if (q != b->q_tier) {  /* not a hit, not a release: the back of its new queue */
        unlink_block(self, b);
        push_block(self, q, b, 0);  /* the list's reference moves with it */
    }
    Py_RETURN_NONE;
}

static PyObject *
hybrid_uncache(HybridObject *self, PyObject *block)
{
    if (!queued_here(self, block)) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    BlockObject *b = BLOCK(block);
    unlink_block(self, b);
    push_block(self, EMPTY, b, 1);  /* the front: reused first */
    Py_RETURN_NONE;
}

static PyMethodDef hybrid_methods[] = {
    {"add_free", (PyCFunction)hybrid_add_free, METH_O, NULL},
    {"remove", (PyCFunction)hybrid_remove, METH_O, NULL},
    {"remove_blocks", (PyCFunction)hybrid_remove_blocks, METH_O, NULL},
    {"take", (PyCFunction)hybrid_take, METH_O, NULL},
    {"hint_changed", (PyCFunction)hybrid_hint_changed, METH_O, NULL},
    {"uncache", (PyCFunction)hybrid_uncache, METH_O, NULL},
    {NULL},
};

static PySequenceMethods hybrid_as_sequence = {
    .sq_length = (lenfunc)hybrid_len,
    .sq_contains = (objobjproc)hybrid_contains,
};

static PyObject *
hybrid_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    if (hkv_slot_values[0] == NULL) {
        for (int q = -1; q < NUM_QUEUES; q++)
            if ((hkv_slot_values[q + 1] = PyLong_FromLong(q)) == NULL)
                return NULL;
    }
    return type->tp_alloc(type, 0);
}

PyTypeObject HKV_HybridCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv.kv_cache._fastpath.HybridCore",
    .tp_basicsize = sizeof(HybridObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Base of HybridPolicy: its queues in C (see eviction/hybrid.py)."),
    .tp_new = hybrid_new,
    .tp_init = (initproc)hybrid_init,
    .tp_dealloc = (destructor)hybrid_dealloc,
    .tp_traverse = (traverseproc)hybrid_traverse,
    .tp_clear = (inquiry)hybrid_clear,
    .tp_iter = (getiterfunc)hybrid_iter,
    .tp_as_sequence = &hybrid_as_sequence,
    .tp_methods = hybrid_methods,
};

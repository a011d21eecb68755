/* HybridRulesCore: the `hybrid` eviction policy's five rules in C.
 *
 * eviction/hybrid.py's HybridPolicy is the pure-Python reference this matches
 * decision for decision; under the C backend, HybridPolicy.for_backend gives a
 * subclass of this type instead, which reads the policy's `rules` (a HybridRules)
 * by field name. Each queue is a doubly linked list threaded through the blocks
 * (BlockObject.q_*, _fp_rules.h) holding a reference to each: head is the front
 * of the reference's OrderedDict, tail its end, and every operation is O(1) per
 * block. The evicted hashes are a Watch (_fp_watch.h): Python sees the same
 * hashes in the same order as the reference's `evicted`. */
#include "_fp_rules.h"

/* ---- the rules' constants ------------------------------------------------------------ */

static int
read_double(PyObject *rules, const char *name, double *out)
{
    PyObject *v = PyObject_GetAttrString(rules, name);
    if (v == NULL)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int
read_flag(PyObject *rules, const char *name, int *out)
{
    PyObject *v = PyObject_GetAttrString(rules, name);
    if (v == NULL)
        return -1;
    *out = PyObject_IsTrue(v);
    Py_DECREF(v);
    return *out < 0 ? -1 : 0;
}

static int
read_count(PyObject *rules, const char *name, Py_ssize_t *out)
{
    PyObject *v = PyObject_GetAttrString(rules, name);
    if (v == NULL)
        return -1;
    *out = PyNumber_AsSsize_t(v, PyExc_OverflowError);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Reads HybridRules by field name (its ranges checked again: the C relies on them). */
static int
read_rules(RulesObject *self, PyObject *rules)
{
    if (read_double(rules, "hit_share", &self->hit_share) < 0 ||
        read_double(rules, "vote_weight", &self->vote_weight) < 0 ||
        read_count(rules, "ghost_pools", &self->ghost_pools) < 0 ||
        read_flag(rules, "low_value_first", &self->low_value_first) < 0 ||
        read_flag(rules, "hits_kept", &self->hits_kept) < 0 ||
        read_flag(rules, "cycle_guard", &self->cycle_guard) < 0 ||
        read_flag(rules, "protected_last", &self->protected_last) < 0)
        return -1;
    const char *bad = !(self->hit_share >= 0.0 && self->hit_share <= 1.0) ? "hit_share"
        : !(self->vote_weight > 0.0 && self->vote_weight < 1.0) ? "vote_weight"
        : self->ghost_pools < 1 ? "ghost_pools" : NULL;
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, "HybridRules.%s is out of range", bad);
        return -1;
    }
    return 0;
}

/* ---- the rules ---------------------------------------------------------------------- */

/* mirrors hybridkv.kv_cache.eviction.hybrid.queue_of */
static int
queue_of(RulesObject *self, BlockObject *b)
{
    if (b->block_hash == Py_None)
        return EMPTY;
    if (self->protected_last && rating_is(b, PROTECTED))
        return KEPT;
    if (self->low_value_first && b->num_hits == 0 && rating_is(b, LOW_VALUE))
        return LOW;
    return b->num_hits && self->hits_kept ? HIT : FRESH;
}

/* mirrors HybridPolicy._spill */
static void
spill(RulesObject *self)
{
    double limit = self->hit_share * (double)self->size;
    Queue *hit = &self->queues[HIT];
    while ((double)hit->size > limit) {
        BlockObject *b = hit->head;
        queue_unlink(self, b);
        queue_push_back(self, FRESH, b);
    }
}

/* ---- construction ------------------------------------------------------------------- */

static void
clear_queues(RulesObject *self)
{
    for (int q = 0; q < NUM_QUEUES; q++) {
        while (self->queues[q].head != NULL) {
            BlockObject *b = self->queues[q].head;
            queue_unlink(self, b);
            Py_DECREF(b);
        }
    }
    self->num_free = 0;
}

/* Checks that every block given is free (none holds it) and given once. */
static int
check_new_blocks(RulesObject *self, PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(items[i], &HKV_BlockType) ||
            (BLOCK(items[i])->q_owner != NULL && BLOCK(items[i])->q_owner != self)) {
            PyErr_Format(PyExc_ValueError, "HybridPolicy: %R is not a free Block", items[i]);
            return -1;
        }
    }
    return 0;
}

/* mirrors HybridPolicy.__init__ (the rules: the policy's `rules` unless given) */
static int
rules_init(RulesObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"blocks", "rules", NULL};
    PyObject *blocks = NULL, *rules = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:HybridRulesCore", kwlist, &blocks,
                                     &rules))
        return -1;
    PyObject *seq = blocks == NULL ? PyTuple_New(0)
        : PySequence_Fast(blocks, "HybridPolicy: blocks must be iterable");
    if (seq == NULL)
        return -1;
    rules = rules == Py_None ? PyObject_GetAttrString((PyObject *)self, "rules")
                             : Py_NewRef(rules);
    int rc = rules == NULL || read_rules(self, rules) < 0 || check_new_blocks(self, seq) < 0 ||
        hkv_watch_init(&self->ghosts) < 0 ? -1 : 0;
    Py_XDECREF(rules);
    if (rc == 0) {
        clear_queues(self);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            BlockObject *b = BLOCK(PySequence_Fast_GET_ITEM(seq, i));
            if (b->q_owner == self)  /* given twice: the reference keeps its first place */
                continue;
            b->q_mark = 0;
            queue_push_back(self, EMPTY, (BlockObject *)Py_NewRef(b));
            self->num_free++;
        }
        self->size = self->num_free > 1 ? self->num_free : 1;
        self->clock = 0;
        self->lru_share = self->cycle_share = 0.0;
    }
    Py_DECREF(seq);
    return rc;
}

static int
rules_traverse(RulesObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ghosts.dict);  /* blocks are not tracked by the collector */
    Py_VISIT(self->ghosts.view);
    return 0;
}

static int
rules_clear(RulesObject *self)
{
    clear_queues(self);
    hkv_watch_clear(&self->ghosts);
    return 0;
}

static void
rules_dealloc(RulesObject *self)
{
    PyObject_GC_UnTrack(self);
    rules_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- the policy's methods --------------------------------------------------------------- */

static Py_ssize_t
rules_len(RulesObject *self)
{
    return self->num_free;
}

static int
rules_contains(RulesObject *self, PyObject *block)
{
    return rules_queued_here(self, block);
}

/* mirrors HybridPolicy.__iter__ */
static PyObject *
rules_iter(RulesObject *self)
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

static PyObject *
rules_is_cycling(RulesObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(is_cycling(self));
}

/* Checks that every item of seq is a block this policy holds (want_queued) or none
 * holds, each given once; -1 with KeyError / ValueError otherwise. */
static int
check_blocks(RulesObject *self, PyObject *seq, int want_queued)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i, bad = -1;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (i = 0; i < n && bad < 0; i++) {
        PyObject *obj = items[i];
        if (!PyObject_TypeCheck(obj, &HKV_BlockType) || BLOCK(obj)->q_queue < 0 ||
            BLOCK(obj)->q_owner != (want_queued ? (void *)self : NULL))
            bad = i;
        else
            BLOCK(obj)->q_queue = -1 - BLOCK(obj)->q_queue;  /* marked: seen once */
    }
    for (Py_ssize_t j = 0; j < i - (bad >= 0); j++)
        BLOCK(items[j])->q_queue = -1 - BLOCK(items[j])->q_queue;
    if (bad < 0)
        return 0;
    if (want_queued)
        PyErr_SetObject(PyExc_KeyError, items[bad]);
    else
        PyErr_Format(PyExc_ValueError, "add_free: %R is not a held Block (or given twice)",
                     items[bad]);
    return -1;
}

/* mirrors HybridPolicy.add_free */
static PyObject *
rules_add_free(RulesObject *self, PyObject *blocks)
{
    PyObject *seq = PySequence_Fast(blocks, "add_free: blocks must be iterable");
    if (seq == NULL || check_blocks(self, seq, 0) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t mark = self->clock + self->num_free;  /* blocks ahead in one LRU queue */
    int cycling = is_cycling(self);
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        b->q_mark = mark + i;
        int q = queue_of(self, b);
        if (q == FRESH && cycling)
            continue;  /* queued below, with the whole release */
        Py_INCREF(b);
        if (q == EMPTY)  /* reused first, as under `lru` */
            queue_push_front(self, EMPTY, b);
        else
            queue_push_back(self, q, b);
    }
    for (Py_ssize_t i = n - 1; cycling && i >= 0; i--) {  /* the whole release first, its
                                                            tail first */
        BlockObject *b = BLOCK(items[i]);
        if (b->q_owner == NULL)
            queue_push_front(self, FRESH, (BlockObject *)Py_NewRef(b));
    }
    self->num_free += n;
    spill(self);
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* mirrors HybridPolicy.remove_blocks */
static PyObject *
rules_remove_blocks(RulesObject *self, PyObject *blocks)
{
    PyObject *seq = PySequence_Fast(blocks, "remove_blocks: blocks must be a sequence");
    if (seq == NULL || check_blocks(self, seq, 1) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int late = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        int q = b->q_queue;
        if (b->ref_cnt && (q == FRESH || q == HIT) && self->clock > b->q_mark)
            late = 1;  /* a hit on data LRU would have dropped */
        queue_unlink(self, b);
        Py_DECREF(b);  /* the caller's sequence still holds it */
    }
    if (late)
        vote(self, 0);
    self->num_free -= n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* mirrors HybridPolicy.remove */
static PyObject *
rules_remove(RulesObject *self, PyObject *block)
{
    PyObject *one = PyTuple_Pack(1, block);
    if (one == NULL)
        return NULL;
    PyObject *out = rules_remove_blocks(self, one);
    Py_DECREF(one);
    return out;
}

/* mirrors HybridPolicy.uncache */
static PyObject *
rules_uncache(RulesObject *self, PyObject *block)
{
    if (!rules_queued_here(self, block)) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    BlockObject *b = BLOCK(block);
    queue_unlink(self, b);
    queue_push_front(self, EMPTY, b);  /* the queue's reference moves with it */
    Py_RETURN_NONE;
}

/* mirrors HybridPolicy.hint_changed */
static PyObject *
rules_hint_changed(RulesObject *self, PyObject *block)
{
    if (!rules_queued_here(self, block)) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    BlockObject *b = BLOCK(block);
    int q = queue_of(self, b);
    if (q != b->q_queue) {  /* to its new queue's back; not a release: its mark stays */
        queue_unlink(self, b);
        queue_push_back(self, q, b);
        spill(self);
    }
    Py_RETURN_NONE;
}

static PyMethodDef rules_methods[] = {
    {"add_free", (PyCFunction)rules_add_free, METH_O, NULL},
    {"remove", (PyCFunction)rules_remove, METH_O, NULL},
    {"remove_blocks", (PyCFunction)rules_remove_blocks, METH_O, NULL},
    {"take", (PyCFunction)hkv_rules_take, METH_O, NULL},
    {"recomputed", (PyCFunction)hkv_rules_recomputed, METH_O, NULL},
    {"uncache", (PyCFunction)rules_uncache, METH_O, NULL},
    {"hint_changed", (PyCFunction)rules_hint_changed, METH_O, NULL},
    {"is_cycling", (PyCFunction)rules_is_cycling, METH_NOARGS, NULL},
    {NULL},
};

static PyObject *
rules_evicted(RulesObject *self, void *Py_UNUSED(closure))
{
    if (self->ghosts.view == NULL) {
        PyErr_SetString(PyExc_AttributeError, "evicted: the policy was not initialized");
        return NULL;
    }
    return Py_NewRef(self->ghosts.view);
}

static PyGetSetDef rules_getset[] = {
    {"evicted", (getter)rules_evicted, NULL,
     "hashes of data evicted, oldest first (a read-only mapping)", NULL},
    {NULL},
};

static PySequenceMethods rules_as_sequence = {
    .sq_length = (lenfunc)rules_len,
    .sq_contains = (objobjproc)rules_contains,
};

PyTypeObject HKV_HybridRulesCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._fastpath.HybridRulesCore",
    .tp_basicsize = sizeof(RulesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("The `hybrid` policy's rules in C (see eviction/hybrid.py)."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rules_init,
    .tp_dealloc = (destructor)rules_dealloc,
    .tp_traverse = (traverseproc)rules_traverse,
    .tp_clear = (inquiry)rules_clear,
    .tp_iter = (getiterfunc)rules_iter,
    .tp_as_sequence = &rules_as_sequence,
    .tp_methods = rules_methods,
    .tp_getset = rules_getset,
};

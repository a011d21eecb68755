/* HybridCore: the tiers of the `tiered` eviction policy in C.
 *
 * The rules are eviction/tiers.py's (`HybridTiers` there is the pure-Python
 * reference this matches decision for decision); TieredPolicy subclasses this
 * type when the extension is built and gives it the rules' constants (TierRules). Each
 * tier is a doubly linked list threaded through the blocks themselves
 * (BlockObject.q_*, _fp_hybrid.h), holding a reference to each block:
 * every operation is O(1) per block whatever the pool size. The head of a
 * list is the front of the reference's OrderedDict, the tail its end; stacks
 * (empty, fresh) are taken from the tail, queues from the head. The watched
 * fresh evictions and the remembered evicted hashes of the LRU votes are Watches
 * (_fp_watch.h): Python sees the same hashes in the same order as the reference's
 * OrderedDict (`evicted`: the remembered ones); each block carries its release
 * marks in one LRU queue for the votes (BlockObject.q_mark_*, _fp_lrupos.h). */
#include "_fp_hybrid.h"

PyObject *hkv_slot_values[NUM_TIERS + 1];

/* The tier a released block joins (add_free's rules). */
int
hkv_hybrid_tier_of(BlockObject *b)
{
    if (b->block_hash == Py_None)
        return EMPTY;
    int rating = rating_of(b);
    Py_ssize_t hits = b->num_hits;
    if (rating == PROTECTED)
        return KEPT;
    if (rating == LOW_VALUE && hits == 0)
        return LOW;
    Py_ssize_t t = rating == JUNCTION ? hits + 1 : hits;
    return t == 0 ? FRESH : t == 1 ? HIT_ONCE : HIT_OFTEN;
}

/* ---- construction ------------------------------------------------------------------- */

static void
clear_tiers(HybridObject *self)
{
    while (self->order_head != NULL)
        order_unlink(self, self->order_head, 0);
    for (int t = 0; t < NUM_TIERS; t++) {
        while (self->tiers[t].head != NULL) {
            BlockObject *b = pop_block(self, t, 0);
            order_drop(self, b);  /* parked */
            Py_DECREF(b);
        }
    }
    self->num_free = 0;
}

static int
hybrid_init(HybridObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"blocks", "rules", NULL};
    PyObject *blocks;
    Py_ssize_t age_every, ghost_pools;
    double stale_age, reuse_decay, return_gate, return_weight, vote_weight, vote_back;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O(nddddddn):HybridCore", kwlist, &blocks,
                                     &age_every, &stale_age, &reuse_decay, &return_gate,
                                     &return_weight, &vote_weight, &vote_back, &ghost_pools))
        return -1;
    if (age_every < 1) {
        PyErr_Format(PyExc_ValueError, "HybridCore: AGE_EVERY must be >= 1, got %zd", age_every);
        return -1;
    }
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
    if (hkv_watch_init(&self->watch) < 0 || hkv_watch_init(&self->ghosts) < 0 ||
        hkv_lrupos_init(&self->lru, hkv_lrupos_capacity(ghost_pools, n > 1 ? n : 1)) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    clear_tiers(self);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* a stack: the first given on top */
        BlockObject *b = BLOCK(items[i]);
        if (b->q_owner == self)  /* given twice: the reference keeps its first place */
            continue;
        Py_INCREF(b);
        push_tail(self, EMPTY, b, 0);
        b->q_mark_number = b->q_mark_base = 0;
    }
    self->num_free = n;
    self->num_taken = self->clock = 0;
    self->reuse = self->returns = 0.0;
    self->lru_share = self->tier_share = 0.0;
    self->watch_limit = n > 1 ? n : 1;
    self->age_every = age_every;
    self->stale_age = stale_age;
    self->reuse_decay = reuse_decay;
    self->return_gate = return_gate;
    self->return_weight = return_weight;
    self->vote_weight = vote_weight;
    self->vote_back = vote_back;
    self->ghost_pools = ghost_pools;
    Py_DECREF(seq);
    return 0;
}

static int
hybrid_traverse(HybridObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->watch.dict);  /* blocks are not tracked by the collector */
    Py_VISIT(self->watch.view);
    Py_VISIT(self->ghosts.dict);
    Py_VISIT(self->ghosts.view);
    return 0;
}

static int
hybrid_clear(HybridObject *self)
{
    clear_tiers(self);
    hkv_watch_clear(&self->watch);
    hkv_watch_clear(&self->ghosts);
    hkv_lrupos_clear(&self->lru);
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
    for (int t = 0; out != NULL && t < NUM_TIERS; t++) {
        int stack = is_stack(t);
        for (BlockObject *b = stack ? self->tiers[t].tail : self->tiers[t].head; b != NULL;
             b = stack ? b->q_prev : b->q_next) {
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
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), clock = self->clock;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int any_fresh = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        mark_release(self, b, self->num_free + i);
        if (b->o_owner == NULL && b->block_hash != Py_None)  /* (ours: queued anew) */
            order_push(self, b, 0);
        int t = hkv_hybrid_tier_of(b);
        if (t == FRESH) {
            any_fresh = 1;
            continue;
        }
        Py_INCREF(b);
        push_tail(self, t, b, clock);
    }
    for (Py_ssize_t i = n - 1; any_fresh && i >= 0; i--) {  /* the whole release goes first,
                                                              its tail first */
        BlockObject *b = BLOCK(items[i]);
        if (b->q_owner == NULL) {
            Py_INCREF(b);
            push_tail(self, FRESH, b, clock);
        }
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* parked ones: every block released before
                                                 them is gone, the front */
        BlockObject *b = BLOCK(items[i]);
        if (b->o_owner == self && b->o_parked)
            order_push(self, b, 1);
    }
    self->num_free += n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* remove_blocks on a checked sequence. */
static void
remove_checked(HybridObject *self, PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), clock = self->clock;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    double reuse = self->reuse * self->reuse_decay;  /* one hit, however many blocks */
    for (Py_ssize_t i = 0; i < n; i++) {  /* where LRU would have had them when the hit came */
        BlockObject *b = BLOCK(items[i]);
        if (b->block_hash != Py_None && b->q_tier >= FRESH &&
            hkv_lrupos_position(&self->lru, b->q_mark_number, b->q_mark_base) < 0)
            hkv_hybrid_vote(self, 0, 1.0);  /* a hit LRU would have missed */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        if (b->ref_cnt)  /* held again (an unheld block is only being queued anew) */
            order_drop(self, b);
        int slot = b->q_tier;
        Py_ssize_t waited = clock - b->q_released;
        hkv_lrupos_hit(&self->lru, b->q_mark_number);
        unlink_block(self, b);
        if (slot >= FRESH && slot <= HIT_OFTEN && (double)waited > reuse &&
            rating_of(b) != JUNCTION)
            reuse = (double)waited;
        Py_DECREF(b);  /* the caller's sequence still holds it */
    }
    self->reuse = reuse;
    self->num_free -= n;
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
    remove_checked(self, seq);
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

void
hkv_hybrid_vote(HybridObject *self, int lru, double count)
{
    double keep = 1 - self->vote_weight;
    self->lru_share *= keep;
    self->tier_share *= keep;
    if (lru)
        self->lru_share += self->vote_weight * count;
    else
        self->tier_share += self->vote_weight * count;
}

static PyObject *
hybrid_recomputed(HybridObject *self, PyObject *block_hash)
{
    int watched = self->watch.dict ? PyDict_Contains(self->watch.dict, block_hash) : 0;
    if (watched < 0)
        return NULL;
    if (watched) {
        if (hkv_watch_remove(&self->watch, block_hash) < 0)
            return NULL;
        self->returns += self->return_weight;
    }
    WatchInfo info;
    if (hkv_watch_pop(&self->ghosts, block_hash, &info) < 0)  /* KeyError when not evicted */
        return NULL;
    if (info.from_hit)
        hkv_hybrid_vote(self, 0, self->vote_back);  /* hit data LRU order dropped came back */
    else if (hkv_lrupos_position(&self->lru, info.number, info.base) >= 0)
        hkv_hybrid_vote(self, 1, 1.0);  /* LRU would still have held it */
    Py_RETURN_NONE;
}

static PyObject *
hybrid_hint_changed(HybridObject *self, PyObject *block)
{
    if (!queued_here(self, block)) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    BlockObject *b = BLOCK(block);
    /* not a hit: no reuse distance, no vote; not a release: LRU keeps it where it is */
    unlink_block(self, b);
    int t = hkv_hybrid_tier_of(b);
    push_tail(self, t, b, self->clock);  /* the list's reference moves with it */
    if (t != KEPT && b->o_owner == self && b->o_parked)
        order_push(self, b, 1);
    return Py_NewRef(Py_None);
}

static PyObject *
hybrid_uncache(HybridObject *self, PyObject *block)
{
    if (!queued_here(self, block)) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    BlockObject *b = BLOCK(block);
    Py_ssize_t released = b->q_released;
    hkv_lrupos_to_front(&self->lru, b->q_mark_number);
    order_drop(self, b);
    unlink_block(self, b);
    push_tail(self, EMPTY, b, released);  /* on top: reused first */
    Py_RETURN_NONE;
}

static PyMethodDef hybrid_methods[] = {
    {"add_free", (PyCFunction)hybrid_add_free, METH_O, NULL},
    {"remove", (PyCFunction)hybrid_remove, METH_O, NULL},
    {"remove_blocks", (PyCFunction)hybrid_remove_blocks, METH_O, NULL},
    {"take", (PyCFunction)hkv_hybrid_take, METH_O, NULL},
    {"recomputed", (PyCFunction)hybrid_recomputed, METH_O, NULL},
    {"hint_changed", (PyCFunction)hybrid_hint_changed, METH_O, NULL},
    {"uncache", (PyCFunction)hybrid_uncache, METH_O, NULL},
    {NULL},
};

static PyObject *
hybrid_evicted(HybridObject *self, void *Py_UNUSED(closure))
{
    if (self->ghosts.view == NULL) {
        PyErr_SetString(PyExc_AttributeError, "evicted: the policy was not initialized");
        return NULL;
    }
    return Py_NewRef(self->ghosts.view);
}

static PyGetSetDef hybrid_getset[] = {
    {"evicted", (getter)hybrid_evicted, NULL,
     "hashes of data evicted, oldest first (a read-only mapping)", NULL},
    {NULL},
};

static PySequenceMethods hybrid_as_sequence = {
    .sq_length = (lenfunc)hybrid_len,
    .sq_contains = (objobjproc)hybrid_contains,
};

static PyObject *
hybrid_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (hkv_slot_values[0] == NULL) {
        for (int t = -1; t < NUM_TIERS; t++)
            if ((hkv_slot_values[t + 1] = PyLong_FromLong(t)) == NULL)
                return NULL;
    }
    return type->tp_alloc(type, 0);
}

PyTypeObject HKV_HybridCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._fastpath.HybridCore",
    .tp_basicsize = sizeof(HybridObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Base of TieredPolicy: its tiers in C (see eviction/tiers.py)."),
    .tp_new = hybrid_new,
    .tp_init = (initproc)hybrid_init,
    .tp_dealloc = (destructor)hybrid_dealloc,
    .tp_traverse = (traverseproc)hybrid_traverse,
    .tp_clear = (inquiry)hybrid_clear,
    .tp_iter = (getiterfunc)hybrid_iter,
    .tp_as_sequence = &hybrid_as_sequence,
    .tp_methods = hybrid_methods,
    .tp_getset = hybrid_getset,
};

/* HybridCore: the tiers of the `hybrid` eviction policy in C.
 *
 * The rules are eviction/hybrid.py's (`HybridTiers` there is the pure-Python
 * reference this matches decision for decision); HybridPolicy subclasses this
 * type when the extension is built and gives it the rules' constants. Each tier is a doubly linked list threaded through the
 * blocks themselves (BlockObject.q_*), holding a reference to each block:
 * every operation is O(1) per block whatever the pool size. The head of a
 * list is the front of the reference's OrderedDict, the tail its end; stacks
 * (empty, fresh) are taken from the tail, queues from the head. The watched
 * evictions stay an OrderedDict, as in the reference. */
#include "_fastpath.h"

#include <math.h>

enum { EMPTY, LOW, FRESH, HIT_ONCE, HIT_OFTEN, KEPT, NUM_TIERS };
/* ratings (eviction/base.py Rating) */
enum { LOW_VALUE = 0, NORMAL_VALUE = 1, JUNCTION = 2, PROTECTED = 3, NOT_A_RATING = -1 };

typedef struct {
    BlockObject *head, *tail;
    Py_ssize_t size;
} Tier;

typedef struct {
    PyObject_HEAD
    Tier tiers[NUM_TIERS];
    Py_ssize_t num_free;
    Py_ssize_t num_taken;  /* never-hit data evicted (drives aging) */
    Py_ssize_t clock;      /* blocks taken */
    double reuse;          /* the longest recent reuse distance of hits */
    double returns;        /* share of recent fresh evictions computed again */
    Py_ssize_t watch_limit;
    PyObject *evicted;     /* OrderedDict: fresh evictions watched */
    /* the rules' constants, given at construction (hybrid.py's names) */
    Py_ssize_t age_every;
    double stale_age, reuse_decay, return_gate, return_weight;
} HybridObject;

static PyObject *slot_values[NUM_TIERS + 1];  /* -1, 0..5 as ints */
static PyObject *ordered_dict_type;

static inline int
is_stack(int t)
{
    return t == EMPTY || t == FRESH;
}

static inline void
set_slot(BlockObject *b, int t)
{
    Py_SETREF(b->queue_slot, Py_NewRef(slot_values[t + 1]));
}

/* ---- one tier as a linked list ------------------------------------------------- */

static inline void
push_tail(HybridObject *self, int t, BlockObject *b, Py_ssize_t released)
{
    Tier *tier = &self->tiers[t];
    b->q_owner = self;
    b->q_tier = t;
    b->q_released = released;
    b->q_next = NULL;
    b->q_prev = tier->tail;
    if (tier->tail != NULL)
        tier->tail->q_next = b;
    else
        tier->head = b;
    tier->tail = b;
    tier->size++;
    set_slot(b, t);
}

static inline void
push_head(HybridObject *self, int t, BlockObject *b, Py_ssize_t released)
{
    Tier *tier = &self->tiers[t];
    b->q_owner = self;
    b->q_tier = t;
    b->q_released = released;
    b->q_prev = NULL;
    b->q_next = tier->head;
    if (tier->head != NULL)
        tier->head->q_prev = b;
    else
        tier->tail = b;
    tier->head = b;
    tier->size++;
    set_slot(b, t);
}

/* Takes b out of its tier; the list's reference passes to the caller. */
static inline void
unlink_block(HybridObject *self, BlockObject *b)
{
    Tier *tier = &self->tiers[b->q_tier];
    if (b->q_prev != NULL)
        b->q_prev->q_next = b->q_next;
    else
        tier->head = b->q_next;
    if (b->q_next != NULL)
        b->q_next->q_prev = b->q_prev;
    else
        tier->tail = b->q_prev;
    tier->size--;
    b->q_owner = NULL;
    b->q_prev = b->q_next = NULL;
    set_slot(b, -1);
}

/* The block a take removes from tier t (stacks: the tail, queues: the head). */
static inline BlockObject *
pop_block(HybridObject *self, int t, int from_tail)
{
    BlockObject *b = from_tail ? self->tiers[t].tail : self->tiers[t].head;
    unlink_block(self, b);
    return b;
}

static inline int
queued_here(HybridObject *self, PyObject *obj)
{
    return PyObject_TypeCheck(obj, &HKV_BlockType) && BLOCK(obj)->q_owner == self;
}

/* ---- rules ----------------------------------------------------------------------- */

static inline int
rating_of(BlockObject *b)
{
    PyObject *v = b->value_hint;
    if (v == NULL || !PyLong_Check(v))
        return NOT_A_RATING;
    long r = PyLong_AsLong(v);
    if (r == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NOT_A_RATING;
    }
    return r >= LOW_VALUE && r <= PROTECTED ? (int)r : NOT_A_RATING;
}

/* The tier a released block joins (add_free's rules). */
static int
tier_of(BlockObject *b)
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

/* Moves the least recently used block of each hit tier one tier down. */
static void
age(HybridObject *self)
{
    for (int t = HIT_ONCE; t <= HIT_OFTEN; t++) {
        if (self->tiers[t].size == 0)
            continue;
        BlockObject *b = pop_block(self, t, 0);
        if (is_stack(t - 1))
            push_head(self, t - 1, b, b->q_released);  /* the bottom: taken last there */
        else
            push_tail(self, t - 1, b, b->q_released);
    }
}

/* Counts never-hit data evicted (aging; the share that comes back). */
static int
evicted_fresh(HybridObject *self, BlockObject **blocks, Py_ssize_t n)
{
    Py_ssize_t before = self->num_taken;
    self->num_taken += n;
    for (Py_ssize_t i = self->num_taken / self->age_every - before / self->age_every; i > 0; i--)
        age(self);
    self->returns *= pow(1 - self->return_weight, (double)n);
    for (Py_ssize_t i = 0; i < n; i++)
        if (blocks[i]->block_hash != Py_None &&
            PyObject_SetItem(self->evicted, blocks[i]->block_hash, Py_None) < 0)
            return -1;
    while (PyObject_Size(self->evicted) > self->watch_limit) {
        PyObject *it = PyObject_GetIter(self->evicted);
        PyObject *oldest = it ? PyIter_Next(it) : NULL;
        Py_XDECREF(it);
        int rc = oldest == NULL ? -1 : PyObject_DelItem(self->evicted, oldest);
        Py_XDECREF(oldest);
        if (rc < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "the watched evictions changed");
            return -1;
        }
    }
    return 0;
}

/* ---- construction ------------------------------------------------------------------- */

static void
clear_tiers(HybridObject *self)
{
    for (int t = 0; t < NUM_TIERS; t++) {
        while (self->tiers[t].head != NULL) {
            BlockObject *b = pop_block(self, t, 0);
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
    Py_ssize_t age_every;
    double stale_age, reuse_decay, return_gate, return_weight;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O(ndddd):HybridCore", kwlist, &blocks,
                                     &age_every, &stale_age, &reuse_decay, &return_gate,
                                     &return_weight))
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
    PyObject *evicted = PyObject_CallNoArgs(ordered_dict_type);
    if (evicted == NULL) {
        Py_DECREF(seq);
        return -1;
    }
    clear_tiers(self);
    Py_XSETREF(self->evicted, evicted);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* a stack: the first given on top */
        BlockObject *b = BLOCK(items[i]);
        if (b->q_owner == self)  /* given twice: the reference keeps its first place */
            continue;
        Py_INCREF(b);
        push_tail(self, EMPTY, b, 0);
    }
    self->num_free = n;
    self->num_taken = self->clock = 0;
    self->reuse = self->returns = 0.0;
    self->watch_limit = n > 1 ? n : 1;
    self->age_every = age_every;
    self->stale_age = stale_age;
    self->reuse_decay = reuse_decay;
    self->return_gate = return_gate;
    self->return_weight = return_weight;
    Py_DECREF(seq);
    return 0;
}

static int
hybrid_traverse(HybridObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->evicted);  /* blocks are not tracked by the collector */
    return 0;
}

static int
hybrid_clear(HybridObject *self)
{
    clear_tiers(self);
    Py_CLEAR(self->evicted);
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
        int t = tier_of(b);
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
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = BLOCK(items[i]);
        int slot = b->q_tier;
        Py_ssize_t waited = clock - b->q_released;
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

/* Appends b to out (which takes the list's reference); -1 on error. */
static inline int
give(PyObject *out, BlockObject *b)
{
    int rc = PyList_Append(out, (PyObject *)b);
    Py_DECREF(b);
    return rc;
}

/* Takes up to `num_blocks` from the never-hit tier, or stale hit blocks before
 * them; within the tier, the bottom of the stack first while it is stale too. */
static int
take_fresh(HybridObject *self, PyObject *out, Py_ssize_t num_blocks)
{
    double limit = (double)(self->clock + PyList_GET_SIZE(out)) - self->stale_age * self->reuse;
    Tier *fresh = &self->tiers[FRESH];
    while (num_blocks && fresh->size) {
        BlockObject *b = NULL;
        for (int t = HIT_ONCE; t <= HIT_OFTEN && b == NULL; t++)
            if (self->tiers[t].size && (double)self->tiers[t].head->q_released < limit)
                b = pop_block(self, t, 0);  /* unused for too long */
        if (b == NULL) {  /* the newest release first, unless the bottom is as stale */
            b = pop_block(self, FRESH, (double)fresh->head->q_released >= limit);
            if (evicted_fresh(self, &b, 1) < 0) {
                Py_DECREF(b);
                return -1;
            }
        }
        if (give(out, b) < 0)
            return -1;
        num_blocks--;
        limit += 1;
    }
    return 0;
}

/* Pops `count` blocks of tier t into out (and a C array for evicted_fresh). */
static int
take_run(HybridObject *self, int t, Py_ssize_t count, PyObject *out, BlockObject **taken)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        BlockObject *b = pop_block(self, t, is_stack(t));
        taken[i] = b;
        if (give(out, b) < 0)
            return -1;
    }
    return 0;
}

static int
first_non_empty(HybridObject *self)
{
    for (int t = 0; t < NUM_TIERS; t++)
        if (self->tiers[t].size)
            return t;
    return -1;
}

static PyObject *
take_blocks(HybridObject *self, Py_ssize_t num_blocks)
{
    int stale = self->returns >= self->return_gate && self->reuse > 0;  /* the stale-data rule */
    PyObject *out = PyList_New(0);
    BlockObject **taken = PyMem_Malloc(sizeof(BlockObject *) * (num_blocks ? num_blocks : 1));
    if (out == NULL || taken == NULL)
        goto fail;
    while (PyList_GET_SIZE(out) < num_blocks) {  /* the lowest non-empty tier (aging may
                                                    refill one) */
        Py_ssize_t want = num_blocks - PyList_GET_SIZE(out);
        int t = first_non_empty(self);
        if (t == FRESH && stale) {
            if (take_fresh(self, out, want) < 0)
                goto fail;
            continue;
        }
        Py_ssize_t count = want < self->tiers[t].size ? want : self->tiers[t].size;
        if (take_run(self, t, count, out, taken) < 0)
            goto fail;
        /* only evicting data counts: empty and low-value blocks are no loss */
        if (t == FRESH && evicted_fresh(self, taken, count) < 0)
            goto fail;
    }
    PyMem_Free(taken);
    self->num_free -= num_blocks;
    self->clock += num_blocks;
    return out;
fail:
    PyMem_Free(taken);
    Py_XDECREF(out);
    return PyErr_Occurred() ? NULL : PyErr_NoMemory();
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
    return take_blocks(self, num_blocks);
}

static PyObject *
hybrid_recomputed(HybridObject *self, PyObject *block_hash)
{
    if (PyObject_DelItem(self->evicted, block_hash) < 0)
        return NULL;
    self->returns += self->return_weight;
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
    unlink_block(self, b);  /* not a hit: no reuse distance */
    int t = tier_of(b);
    push_tail(self, t, b, self->clock);  /* the list's reference moves with it */
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
    unlink_block(self, b);
    push_tail(self, EMPTY, b, released);  /* on top: reused first */
    Py_RETURN_NONE;
}

static PyMethodDef hybrid_methods[] = {
    {"add_free", (PyCFunction)hybrid_add_free, METH_O, NULL},
    {"remove", (PyCFunction)hybrid_remove, METH_O, NULL},
    {"remove_blocks", (PyCFunction)hybrid_remove_blocks, METH_O, NULL},
    {"take", (PyCFunction)hybrid_take, METH_O, NULL},
    {"recomputed", (PyCFunction)hybrid_recomputed, METH_O, NULL},
    {"hint_changed", (PyCFunction)hybrid_hint_changed, METH_O, NULL},
    {"uncache", (PyCFunction)hybrid_uncache, METH_O, NULL},
    {NULL},
};

static PyMemberDef hybrid_members[] = {
    {"evicted", T_OBJECT_EX, offsetof(HybridObject, evicted), READONLY, NULL},
    {NULL},
};

static PySequenceMethods hybrid_as_sequence = {
    .sq_length = (lenfunc)hybrid_len,
    .sq_contains = (objobjproc)hybrid_contains,
};

static PyObject *
hybrid_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (slot_values[0] == NULL) {
        for (int t = -1; t < NUM_TIERS; t++)
            if ((slot_values[t + 1] = PyLong_FromLong(t)) == NULL)
                return NULL;
    }
    if (ordered_dict_type == NULL) {
        PyObject *collections = PyImport_ImportModule("collections");
        ordered_dict_type = collections ? PyObject_GetAttrString(collections, "OrderedDict")
                                        : NULL;
        Py_XDECREF(collections);
        if (ordered_dict_type == NULL)
            return NULL;
    }
    return type->tp_alloc(type, 0);
}

PyTypeObject HKV_HybridCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv.kv_cache._fastpath.HybridCore",
    .tp_basicsize = sizeof(HybridObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Base of HybridPolicy: its tiers in C (see eviction/hybrid.py)."),
    .tp_new = hybrid_new,
    .tp_init = (initproc)hybrid_init,
    .tp_dealloc = (destructor)hybrid_dealloc,
    .tp_traverse = (traverseproc)hybrid_traverse,
    .tp_clear = (inquiry)hybrid_clear,
    .tp_iter = (getiterfunc)hybrid_iter,
    .tp_as_sequence = &hybrid_as_sequence,
    .tp_methods = hybrid_methods,
    .tp_members = hybrid_members,
};

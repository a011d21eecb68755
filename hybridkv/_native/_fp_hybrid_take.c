/* HybridCore.take: the next blocks to reuse, from the lowest non-empty tier;
 * aging, the stale-data rule, LRU order while the LRU votes win, the watched and
 * remembered evictions (the reference: HybridTiers.take, _take, _take_fresh,
 * _take_lru, _evicted_fresh and _age in eviction/tiers.py). */
#include "_fp_hybrid.h"

#include <math.h>

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
            hkv_watch_add(&self->watch, blocks[i]->block_hash) < 0)
            return -1;
    return hkv_watch_trim(&self->watch, self->watch_limit);
}

/* Remembers an evicted hash, newest last: its release marks and whether it was hit
 * data taken in LRU order. */
static int
remember(HybridObject *self, BlockObject *b, int from_hit)
{
    PyObject *h = b->block_hash;
    if (h == Py_None)
        return 0;
    WatchInfo info = {b->q_mark_number, b->q_mark_base, from_hit};
    if (hkv_watch_put(&self->ghosts, h, info) < 0)
        return -1;
    return hkv_watch_trim(&self->ghosts, self->ghost_pools * self->watch_limit);
}

/* Appends b to out (which takes the list's reference) and remembers its hash; -1 on
 * error. */
static inline int
give(HybridObject *self, PyObject *out, BlockObject *b, int from_hit)
{
    order_drop(self, b);
    if (remember(self, b, from_hit) < 0) {
        Py_DECREF(b);
        return -1;
    }
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
        if (give(self, out, b, 0) < 0)
            return -1;
        num_blocks--;
        limit += 1;
    }
    return 0;
}

/* Takes up to `num_blocks` never-hit and hit blocks in LRU's order (the front of
 * the order); kept blocks met at the front are parked. */
static int
take_lru(HybridObject *self, PyObject *out, Py_ssize_t num_blocks)
{
    Tier *fresh = &self->tiers[FRESH];
    while (num_blocks && fresh->size) {
        BlockObject *b = self->order_head;
        if (b == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "take: a never-hit block is out of LRU's order");
            return -1;
        }
        if (b->q_owner != self) {  /* taken out of its tier and not queued again */
            order_unlink(self, b, 0);
            continue;
        }
        int t = b->q_tier;
        if (t < FRESH || t > HIT_OFTEN) {  /* kept for a running request */
            order_unlink(self, b, 1);
            continue;
        }
        unlink_block(self, b);  /* the tier's reference passes to give */
        if (t == FRESH && evicted_fresh(self, &b, 1) < 0) {
            Py_DECREF(b);
            return -1;
        }
        if (give(self, out, b, t != FRESH) < 0)
            return -1;
        num_blocks--;
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
        if (give(self, out, b, 0) < 0)
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
    int lru = self->lru_share > self->tier_share;  /* LRU order for the never-hit tier */
    int stale = lru || (self->returns >= self->return_gate && self->reuse > 0);
    PyObject *out = PyList_New(0);
    BlockObject **taken = PyMem_Malloc(sizeof(BlockObject *) * (num_blocks ? num_blocks : 1));
    if (out == NULL || taken == NULL)
        goto fail;
    while (PyList_GET_SIZE(out) < num_blocks) {  /* the lowest non-empty tier (aging may
                                                    refill one) */
        Py_ssize_t want = num_blocks - PyList_GET_SIZE(out);
        int t = first_non_empty(self);
        if (t == FRESH && stale) {
            if ((lru ? take_lru(self, out, want) : take_fresh(self, out, want)) < 0)
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
    hkv_lrupos_taken(&self->lru, num_blocks);
    return out;
fail:
    PyMem_Free(taken);
    Py_XDECREF(out);
    return PyErr_Occurred() ? NULL : PyErr_NoMemory();
}

PyObject *
hkv_hybrid_take(HybridObject *self, PyObject *arg)
{
    Py_ssize_t num_blocks = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (num_blocks == -1 && PyErr_Occurred())
        return NULL;
    if (num_blocks < 0 || num_blocks > self->num_free)
        return PyErr_Format(PyExc_ValueError, "take: %zd blocks asked, %zd free", num_blocks,
                            self->num_free);
    return take_blocks(self, num_blocks);
}


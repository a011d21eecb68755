/* The C tiers of the hybrid eviction policy (HybridCore): the object, its
 * tiers as linked lists through the blocks, and their O(1) primitives.
 * _fp_hybrid.c has the type and the methods, _fp_hybrid_take.c taking blocks
 * (aging, the stale-data rule, the watched evictions). */
#ifndef HKV_FP_HYBRID_H
#define HKV_FP_HYBRID_H

#include "_fastpath.h"
#include "_fp_lrupos.h"
#include "_fp_watch.h"

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
    Watch watch;           /* fresh evictions watched */
    LruPositions lru;      /* where blocks would stand in one LRU queue */
    double lru_share, tier_share;  /* votes for LRU order and for the tiers */
    Watch ghosts;          /* every evicted hash (`evicted`), with its release marks and
                              whether it was hit data taken in LRU order */
    BlockObject *order_head, *order_tail;  /* cached free blocks in LRU's order (front:
                                              released first; BlockObject.o_*) */
    /* the rules' constants, given at construction (hybrid.py's names) */
    Py_ssize_t age_every, ghost_pools;
    double stale_age, reuse_decay, return_gate, return_weight, vote_weight, vote_back;
} HybridObject;

extern PyObject *hkv_slot_values[NUM_TIERS + 1];  /* -1, 0..5 as ints */

static inline int
is_stack(int t)
{
    return t == EMPTY || t == FRESH;
}

static inline void
set_slot(BlockObject *b, int t)
{
    Py_SETREF(b->queue_slot, Py_NewRef(hkv_slot_values[t + 1]));
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

/* ---- LRU's order of the cached free blocks (a second list through the blocks,
 * holding a reference to each; a parked block is out of it and holds none) ------ */

static inline void
order_push(HybridObject *self, BlockObject *b, int front)
{
    Py_INCREF(b);
    b->o_owner = self;
    b->o_parked = 0;
    if (front) {
        b->o_prev = NULL;
        b->o_next = self->order_head;
        if (self->order_head != NULL)
            self->order_head->o_prev = b;
        else
            self->order_tail = b;
        self->order_head = b;
    }
    else {
        b->o_next = NULL;
        b->o_prev = self->order_tail;
        if (self->order_tail != NULL)
            self->order_tail->o_next = b;
        else
            self->order_head = b;
        self->order_tail = b;
    }
}

/* Takes b (in the order, not parked) out of it; parked: it stays the policy's. */
static inline void
order_unlink(HybridObject *self, BlockObject *b, int parked)
{
    if (b->o_prev != NULL)
        b->o_prev->o_next = b->o_next;
    else
        self->order_head = b->o_next;
    if (b->o_next != NULL)
        b->o_next->o_prev = b->o_prev;
    else
        self->order_tail = b->o_prev;
    b->o_prev = b->o_next = NULL;
    b->o_owner = parked ? (void *)self : NULL;
    b->o_parked = parked;
    Py_DECREF(b);
}

/* b is no longer a cached free block of this policy (in the order or parked). */
static inline void
order_drop(HybridObject *self, BlockObject *b)
{
    if (b->o_owner != self)
        return;
    if (b->o_parked) {
        b->o_owner = NULL;
        b->o_parked = 0;
    }
    else {
        order_unlink(self, b, 0);
    }
}

static inline int
queued_here(HybridObject *self, PyObject *obj)
{
    return PyObject_TypeCheck(obj, &HKV_BlockType) && BLOCK(obj)->q_owner == self;
}

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


static inline void
mark_release(HybridObject *self, BlockObject *b, Py_ssize_t free)
{
    hkv_lrupos_release(&self->lru, free, b->block_hash == Py_None, &b->q_mark_number,
                       &b->q_mark_base);
}

int hkv_hybrid_tier_of(BlockObject *b);  /* the tier a released block joins */
void hkv_hybrid_vote(HybridObject *self, int lru, double count);
PyObject *hkv_hybrid_take(HybridObject *self, PyObject *num_blocks);  /* take(n) */

#endif

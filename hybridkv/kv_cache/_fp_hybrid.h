/* The C queues of the `hybrid` eviction policy (HybridCore): the object, its
 * queues as linked lists through the blocks, and their O(1) primitives.
 * _fp_hybrid.c has the type and its methods. */
#ifndef HKV_FP_HYBRID_H
#define HKV_FP_HYBRID_H

#include "_fastpath.h"

/* the queues, taken in this order (eviction/hybrid.py: EMPTY, LOW, ORDERED, KEPT) */
enum { EMPTY, LOW, ORDERED, KEPT, NUM_QUEUES };

typedef struct {
    BlockObject *head, *tail;
    Py_ssize_t size;
} Queue;

typedef struct {
    PyObject_HEAD
    Queue queues[NUM_QUEUES];
    Py_ssize_t num_free;
    /* the ratings that decide a queue (eviction/base.py's Rating values, given at
     * construction as a named structure: hybrid.py's QUEUE_RATINGS) */
    long low_value, protected_value;
} HybridObject;

extern PyObject *hkv_slot_values[NUM_QUEUES + 1];  /* -1, 0..3 as ints */

static inline void
set_slot(BlockObject *b, int q)
{
    Py_SETREF(b->queue_slot, Py_NewRef(hkv_slot_values[q + 1]));
}

/* Appends b (a reference the list now owns) at the back of queue q, or the front. */
static inline void
push_block(HybridObject *self, int q, BlockObject *b, int front)
{
    Queue *queue = &self->queues[q];
    b->q_owner = self;
    b->q_tier = q;
    if (front) {
        b->q_prev = NULL;
        b->q_next = queue->head;
        if (queue->head != NULL)
            queue->head->q_prev = b;
        else
            queue->tail = b;
        queue->head = b;
    }
    else {
        b->q_next = NULL;
        b->q_prev = queue->tail;
        if (queue->tail != NULL)
            queue->tail->q_next = b;
        else
            queue->head = b;
        queue->tail = b;
    }
    queue->size++;
    set_slot(b, q);
}

/* Takes b out of its queue; the list's reference passes to the caller. */
static inline void
unlink_block(HybridObject *self, BlockObject *b)
{
    Queue *queue = &self->queues[b->q_tier];
    if (b->q_prev != NULL)
        b->q_prev->q_next = b->q_next;
    else
        queue->head = b->q_next;
    if (b->q_next != NULL)
        b->q_next->q_prev = b->q_prev;
    else
        queue->tail = b->q_prev;
    queue->size--;
    b->q_owner = NULL;
    b->q_prev = b->q_next = NULL;
    set_slot(b, -1);
}

static inline int
queued_here(HybridObject *self, PyObject *obj)
{
    return PyObject_TypeCheck(obj, &HKV_BlockType) && BLOCK(obj)->q_owner == self;
}

#endif

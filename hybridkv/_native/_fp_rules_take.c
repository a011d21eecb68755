/* HybridRulesCore.take and .recomputed: the blocks taken and the evicted hashes
 * remembered for rule 4's votes (the reference: HybridPolicy.take and .recomputed in
 * eviction/hybrid.py). */
#include "_fp_rules.h"

/* The next `num_blocks` free blocks, front of each queue first, as a new list. */
static PyObject *
next_blocks(RulesObject *self, Py_ssize_t num_blocks)
{
    PyObject *out = PyList_New(num_blocks);
    Py_ssize_t i = 0;
    for (int q = 0; out != NULL && q < NUM_QUEUES && i < num_blocks; q++)
        for (BlockObject *b = self->queues[q].head; b != NULL && i < num_blocks; b = b->q_next)
            PyList_SET_ITEM(out, i++, Py_NewRef(b));
    return out;
}

/* Remembers the evicted hashes of `out`, newest last, each with its mark. */
static int
remember(RulesObject *self, PyObject *out)
{
    if (self->ghosts.dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "take: the policy was not initialized");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(out); i++) {
        BlockObject *b = BLOCK(PyList_GET_ITEM(out, i));
        WatchInfo info = {b->q_mark};
        if (b->block_hash != Py_None && hkv_watch_put(&self->ghosts, b->block_hash, info) < 0)
            return -1;
    }
    return hkv_watch_trim(&self->ghosts, self->ghost_pools * self->size);
}

/* mirrors HybridPolicy.take */
PyObject *
hkv_rules_take(RulesObject *self, PyObject *arg)
{
    Py_ssize_t num_blocks = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (num_blocks == -1 && PyErr_Occurred())
        return NULL;
    if (num_blocks < 0 || num_blocks > self->num_free)
        return PyErr_Format(PyExc_ValueError, "take: %zd blocks asked, %zd free", num_blocks,
                            self->num_free);
    PyObject *out = next_blocks(self, num_blocks);
    if (out == NULL || remember(self, out) < 0) {  /* the queues are as they were */
        Py_XDECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < num_blocks; i++) {
        BlockObject *b = BLOCK(PyList_GET_ITEM(out, i));
        queue_unlink(self, b);
        Py_DECREF(b);  /* the list holds it */
    }
    self->num_free -= num_blocks;
    self->clock += num_blocks;
    return out;
}

/* mirrors HybridPolicy.recomputed */
PyObject *
hkv_rules_recomputed(RulesObject *self, PyObject *block_hash)
{
    WatchInfo info;
    if (self->ghosts.dict == NULL) {
        PyErr_SetObject(PyExc_KeyError, block_hash);
        return NULL;
    }
    if (hkv_watch_pop(&self->ghosts, block_hash, &info) < 0)  /* KeyError when not evicted */
        return NULL;
    if (self->clock <= info.mark)
        vote(self, 1);  /* evicted before LRU would have dropped it */
    Py_RETURN_NONE;
}

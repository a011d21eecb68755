/* BlockPool's operations (block_pool.py) on the bound pool: take new blocks,
 * touch hit blocks, free blocks, cache full blocks. Same steps in the same
 * order as the Python methods; the eviction policy is called through its
 * Python methods. With a stale-block listener or an event subscriber
 * registered, the Python method itself runs (events and notifications stay in
 * one place); eviction listeners (a KV tier's hook) are called from here, as
 * BlockPool._notify_evict calls them. */
#include "_fastpath.h"

static inline int
listening(PyObject *list)
{
    return list != NULL && PyList_GET_SIZE(list) > 0;
}

/* The i-th item of a list of blocks (borrowed), or NULL with TypeError. */
static inline BlockObject *
block_at(PyObject *list, Py_ssize_t i)
{
    PyObject *b = PyList_GET_ITEM(list, i);
    if (Py_IS_TYPE(b, &HKV_BlockType) || PyObject_TypeCheck(b, &HKV_BlockType))
        return BLOCK(b);
    PyErr_Format(PyExc_TypeError, "expected a Block, got %R", b);
    return NULL;
}

Py_ssize_t
hkv_pool_num_free(Pool *pool)
{
    return PyObject_Size(pool->free_queue);
}

/* `del cached[group][hash]`, then the block caches nothing (no subscribers). */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool._drop_hash */
static int
drop_hash(Pool *pool, BlockObject *b, Py_ssize_t group)
{
    if (group < 0 || group >= PyList_GET_SIZE(pool->cached)) {
        PyErr_Format(PyExc_IndexError, "block group id %zd out of range", group);
        return -1;
    }
    if (PyDict_DelItem(PyList_GET_ITEM(pool->cached, group), b->block_hash) < 0)
        return -1;
    Py_SETREF(b->block_hash, Py_NewRef(Py_None));
    return hkv_set_field(&b->group_id, -1);
}

int
hkv_add_to_item(PyObject *list, Py_ssize_t i, Py_ssize_t delta)
{
    if (i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_Format(PyExc_IndexError, "group id %zd out of range", i);
        return -1;
    }
    Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(list, i));
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *obj = PyLong_FromSsize_t(v + delta);
    return obj == NULL ? -1 : PyList_SetItem(list, i, obj);
}

int
hkv_add_to_attr(PyObject *obj, PyObject *name, Py_ssize_t delta)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    PyObject *d = PyLong_FromSsize_t(delta);
    PyObject *sum = d ? PyNumber_Add(v, d) : NULL;
    Py_DECREF(v);
    Py_XDECREF(d);
    if (sum == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

enum { MAX_COUNTED_GROUPS = 16 };

/* One block taken for new data: drop what it cached (counted per group in
 * `evicted`, or straight into group_evictions past MAX_COUNTED_GROUPS), hold it once. */
static int
reset_taken(Pool *pool, BlockObject *b, Py_ssize_t *evicted)
{
    if (b->block_hash != Py_None) {
        Py_ssize_t group = hkv_field(b->group_id);
        if (group == -1 && PyErr_Occurred())
            return -1;
        if (drop_hash(pool, b, group) < 0)
            return -1;
        if (group < MAX_COUNTED_GROUPS)
            evicted[group]++;
        else if (hkv_add_to_item(pool->group_evictions, group, 1) < 0)
            return -1;
        evicted[MAX_COUNTED_GROUPS]++;
    }
    b->ref_cnt = 1;
    b->num_hits = 0;
    Py_SETREF(b->value_hint, Py_NewRef(hkv_normal_value));
    return 0;
}

/* The evictions of one take into group_evictions and num_evictions. */
static int
count_evictions(Pool *pool, Py_ssize_t *evicted)
{
    if (evicted[MAX_COUNTED_GROUPS] == 0)
        return 0;
    for (Py_ssize_t g = 0; g < MAX_COUNTED_GROUPS; g++)
        if (evicted[g] && hkv_add_to_item(pool->group_evictions, g, evicted[g]) < 0)
            return -1;
    return hkv_add_to_attr(pool->pool, hkv_names.num_evictions, evicted[MAX_COUNTED_GROUPS]);
}

/* BlockPool._notify_evict: the eviction listeners get the blocks taken that
 * cache data (or all of them, when every listener skips empty ones itself). */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool._notify_evict */
static int
notify_evict(Pool *pool, PyObject *blocks)
{
    PyObject *flag = PyObject_GetAttr(pool->pool, hkv_names.filter_evicted);
    int filter = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    if (filter < 0)
        return -1;
    PyObject *evicted = blocks;
    if (filter) {
        evicted = PyList_New(0);
        for (Py_ssize_t i = 0; evicted && i < PyList_GET_SIZE(blocks); i++) {
            PyObject *b = PyList_GET_ITEM(blocks, i);
            if (BLOCK(b)->block_hash != Py_None && PyList_Append(evicted, b) < 0)
                Py_CLEAR(evicted);
        }
        if (evicted == NULL)
            return -1;
    } else {
        Py_INCREF(evicted);
    }
    int rc = 0;
    if (PyList_GET_SIZE(evicted) > 0) {
        for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(pool->evict_listeners); i++) {
            PyObject *out = PyObject_CallOneArg(PyList_GET_ITEM(pool->evict_listeners, i),
                                                evicted);
            rc = out == NULL ? -1 : 0;
            Py_XDECREF(out);
        }
    }
    Py_DECREF(evicted);
    return rc;
}

/* BlockPool.get_new_blocks: a new list of num_blocks blocks, each held once.
 * `counted`: the caller knows that many are free (an allocation that fit), so the
 * free count is not read again. */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool.get_new_blocks */
PyObject *
hkv_pool_take(Pool *pool, Py_ssize_t num_blocks, int counted)
{
    if (listening(pool->stale_listeners) || listening(pool->subscribers))
        return hkv_call(pool->pool, hkv_names.get_new_blocks,
                        (PyObject *[]){HKV_N(num_blocks)}, 1);
    Py_ssize_t num_free = counted ? num_blocks : hkv_pool_num_free(pool);
    if (num_free < 0)
        return NULL;
    if (num_blocks > num_free)
        return PyErr_Format(PyExc_ValueError, "cannot take %zd blocks: only %zd are free",
                            num_blocks, num_free);
    PyObject *blocks = hkv_call(pool->free_queue, hkv_names.take,
                                 (PyObject *[]){HKV_N(num_blocks)}, 1);
    if (blocks == NULL)
        return NULL;
    if (!PyList_CheckExact(blocks) || PyList_GET_SIZE(blocks) != num_blocks) {
        Py_DECREF(blocks);
        PyErr_SetString(PyExc_AssertionError, "the eviction policy returned too few blocks");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < num_blocks; i++) {
        if (!PyObject_TypeCheck(PyList_GET_ITEM(blocks, i), &HKV_BlockType)) {
            PyErr_SetString(PyExc_TypeError, "the eviction policy returned a non-block");
            goto fail;
        }
    }
    if (listening(pool->evict_listeners) && notify_evict(pool, blocks) < 0)
        goto fail;
    Py_ssize_t evicted[MAX_COUNTED_GROUPS + 1] = {0};  /* per group, then the total */
    for (Py_ssize_t i = 0; i < num_blocks; i++)
        if (reset_taken(pool, BLOCK(PyList_GET_ITEM(blocks, i)), evicted) < 0)
            goto fail;
    if (count_evictions(pool, evicted) < 0)
        goto fail;
    return blocks;
fail:
    Py_DECREF(blocks);
    return NULL;
}

/* BlockPool.touch: one more reference on each block (a hit); free ones leave the queue. */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool.touch */
int
hkv_pool_touch(Pool *pool, PyObject *blocks)
{
    PyObject *queued = NULL;  /* made when a free block is hit (others hold most hits) */
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = block_at(blocks, i);
        if (b == NULL)
            goto fail;
        Py_ssize_t ref = b->ref_cnt;
        if (ref == 0) {
            if ((PyObject *)b == pool->null_block)
                continue;
            if ((queued == NULL && (queued = PyList_New(0)) == NULL) ||
                PyList_Append(queued, (PyObject *)b) < 0)
                goto fail;
        }
        b->ref_cnt = ref + 1;
        b->num_hits++;
    }
    if (queued != NULL) {
        PyObject *out = PyObject_CallMethodOneArg(pool->free_queue, hkv_names.remove_blocks,
                                                  queued);
        if (out == NULL)
            goto fail;
        Py_DECREF(out);
    }
    Py_XDECREF(queued);
    return 0;
fail:
    Py_XDECREF(queued);
    return -1;
}

/* BlockPool.free_blocks(blocks, requeue): `blocks` a list in the order to evict them. */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool.free_blocks */
int
hkv_pool_free(Pool *pool, PyObject *blocks, PyObject *requeue)
{
    int has_requeue = requeue != NULL && PyList_GET_SIZE(requeue) > 0;
    if (listening(pool->stale_listeners)) {
        PyObject *none = PyTuple_New(0);
        if (none == NULL)
            return -1;
        PyObject *out = PyObject_CallMethodObjArgs(pool->pool, hkv_names.free_blocks, blocks,
                                                   has_requeue ? requeue : none, NULL);
        Py_DECREF(none);
        Py_XDECREF(out);
        return out == NULL ? -1 : 0;
    }
    PyObject *freed = PyList_New(0);
    if (freed == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i < n; i++) {
        BlockObject *b = block_at(blocks, i);
        if (b == NULL)
            goto fail;
        if ((PyObject *)b == pool->null_block)
            continue;
        Py_ssize_t ref = --b->ref_cnt;
        if (ref == 0 && PyList_Append(freed, (PyObject *)b) < 0)
            goto fail;
    }
    if (has_requeue && pool->uses_hints) {
        PyObject *out = PyObject_CallMethodOneArg(pool->free_queue, hkv_names.remove_blocks,
                                                  requeue);
        if (out == NULL)
            goto fail;
        Py_DECREF(out);
        Py_ssize_t end = PyList_GET_SIZE(freed);
        if (PyList_SetSlice(freed, end, end, requeue) < 0)
            goto fail;
    }
    if (PyList_GET_SIZE(freed)) {
        PyObject *out = PyObject_CallMethodOneArg(pool->free_queue, hkv_names.add_free, freed);
        if (out == NULL)
            goto fail;
        Py_DECREF(out);
    }
    Py_DECREF(freed);
    return 0;
fail:
    Py_DECREF(freed);
    return -1;
}

/* BlockPool._note_recompute: a request computed data `b` caches already. */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool._note_recompute */
static int
note_recompute(Pool *pool, BlockObject *b)
{
    b->num_hits++;
    if (b->ref_cnt == 0) {
        PyObject *out = PyObject_CallMethodOneArg(pool->free_queue, hkv_names.hint_changed,
                                                  (PyObject *)b);
        if (out == NULL)
            return -1;
        Py_DECREF(out);
    }
    return 0;
}

static Py_ssize_t
num_watched(Pool *pool)
{
    return PyDict_Check(pool->evicted) ? PyDict_GET_SIZE(pool->evicted)
                                       : PyObject_Size(pool->evicted);
}

/* Caches blocks[i] under this group's hash of block i (hashes at the hash
 * block size, `stride` per block), as BlockPool.cache_blocks: 1 when stored,
 * 0 when another block caches that data already, -1 on error. */
/* mirrors hybridkv.kv_cache.block_pool.BlockPool.cache_block */
static int
cache_one(Pool *pool, Group *g, BlockObject *b, PyObject *h)
{
    PyObject *cached = PyDict_GetItemWithError(g->table, h);
    if (cached != NULL)
        return note_recompute(pool, BLOCK(cached));
    if (PyErr_Occurred())
        return -1;
    Py_SETREF(b->block_hash, Py_NewRef(h));
    b->num_children = 0;
    if (hkv_set_field(&b->group_id, g->group_id) < 0 ||
        PyDict_SetItem(g->table, h, (PyObject *)b) < 0)
        return -1;
    Py_ssize_t watched = num_watched(pool);
    if (watched < 0)
        return -1;
    if (watched) {
        int in = PySequence_Contains(pool->evicted, h);
        if (in < 0)
            return -1;
        if (in) {
            PyObject *out = PyObject_CallMethodOneArg(pool->free_queue, hkv_names.recomputed, h);
            if (out == NULL)
                return -1;
            Py_DECREF(out);
        }
    }
    return 1;
}

/* One more child of the block caching the data before blocks[i] (i > 0). */
static int
count_child(Pool *pool, Group *g, PyObject *blocks, PyObject *hashes, Py_ssize_t i)
{
    BlockObject *parent = block_at(blocks, i - 1);
    if (parent == NULL)
        return -1;
    if (parent->block_hash == Py_None) {  /* the null block, or a copy of cached data */
        PyObject *cached = PyDict_GetItemWithError(g->table,
                                                   PyList_GET_ITEM(hashes, i * g->stride - 1));
        if (cached == NULL)
            return PyErr_Occurred() ? -1 : 0;
        parent = BLOCK(cached);
    }
    parent->num_children++;
    return 0;
}

static PyObject *
group_hash_list(PyObject *hashes, Py_ssize_t stride, Py_ssize_t end)
{
    if (stride == 1)
        return Py_NewRef(hashes);
    PyObject *out = PyList_New(end);
    for (Py_ssize_t i = 0; out != NULL && i < end; i++)
        PyList_SET_ITEM(out, i, Py_NewRef(PyList_GET_ITEM(hashes, (i + 1) * stride - 1)));
    return out;
}

/* mirrors hybridkv.kv_cache.block_pool.BlockPool.cache_blocks */
int
hkv_pool_cache(Pool *pool, Group *g, PyObject *blocks, PyObject *hashes, Py_ssize_t start,
               Py_ssize_t end)
{
    if (!PyList_Check(blocks) || !PyList_Check(hashes) || end > PyList_GET_SIZE(blocks) ||
        end * g->stride > PyList_GET_SIZE(hashes)) {
        PyErr_SetString(PyExc_IndexError, "cache_blocks: blocks or hashes too short");
        return -1;
    }
    if (listening(pool->subscribers)) {
        PyObject *group_hashes = group_hash_list(hashes, g->stride, end);
        if (group_hashes == NULL)
            return -1;
        PyObject *out = PyObject_CallMethod(pool->pool, "cache_blocks", "OOnnn", blocks,
                                            group_hashes, start, end, g->group_id);
        Py_DECREF(group_hashes);
        Py_XDECREF(out);
        return out == NULL ? -1 : 0;
    }
    for (Py_ssize_t i = start; i < end; i++) {
        BlockObject *b = block_at(blocks, i);
        if (b == NULL)
            return -1;
        if ((PyObject *)b == pool->null_block || b->block_hash != Py_None)
            continue;
        int stored = cache_one(pool, g, b, PyList_GET_ITEM(hashes, (i + 1) * g->stride - 1));
        if (stored < 0 || (stored && i && count_child(pool, g, blocks, hashes, i) < 0))
            return -1;
    }
    return 0;
}

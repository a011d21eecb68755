/* One group's share of an allocation and of freeing: SingleTypeManager's
 * mechanics (managers/base.py, Mamba's in managers/mamba.py) for the
 * built-in types. The rules that decide ratings, retention and protection
 * stay Python methods of the manager, called here only when blocks are
 * actually released. */
#include "_fastpath.h"

static Py_ssize_t
num_with_ref(PyObject *seq, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t ref, PyObject *null)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *item = PyList_GET_ITEM(seq, i);
        if (item == null)
            continue;
        if (!PyObject_TypeCheck(item, &HKV_BlockType)) {
            PyErr_Format(PyExc_TypeError, "expected a Block, got %R", item);
            return -1;
        }
        BlockObject *b = BLOCK(item);
        count += b->ref_cnt == ref;
    }
    return count;
}

/* _num_freed_by_skip: blocks skipping at `computed` returns to the free queue. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager._num_freed_by_skip */
static Py_ssize_t
num_freed_by_skip(Pool *pool, Group *g, PyObject *req, PyObject *blocks, Py_ssize_t computed,
                  Py_ssize_t junction)
{
    Py_ssize_t start, end;
    int any = skip_range(g, req, blocks, computed, &start, &end);
    if (any <= 0)
        return any;
    if (!g->retains)
        return num_with_ref(blocks, start, end, 1, pool->null_block);
    PyObject *retention = PyObject_GetAttr(g->manager, hkv_names.retention);
    if (retention == NULL)
        return -1;
    PyObject *split = hkv_call(retention, hkv_names.split,  /* (holds its arguments) */
                               (PyObject *[]){HKV_O(req), HKV_N(junction), HKV_O(blocks),
                                              HKV_N(start), HKV_N(end)}, 5);
    Py_DECREF(retention);
    if (split == NULL)
        return -1;
    PyObject *released = PyTuple_Check(split) && PyTuple_GET_SIZE(split) == 2
                         ? PyTuple_GET_ITEM(split, 0) : NULL;
    Py_ssize_t freed = released && PyList_Check(released)
                       ? num_with_ref(released, 0, PyList_GET_SIZE(released), 1, NULL) : -1;
    if (freed < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a retention rule must return two lists");
    Py_DECREF(split);
    return freed;
}

/* Mamba: boundary j (state after j * B tokens) is checkpointed in (computed, num_tokens]. */
static int
is_checkpoint(Group *g, Py_ssize_t j, Py_ssize_t prompt_end)
{
    return g->every == 1 || j % g->every == 0 || j == prompt_end;
}

static Py_ssize_t
prompt_end(Group *g, PyObject *req)
{
    PyObject *n = ((RequestObject *)req)->num_prompt_tokens;
    Py_ssize_t v = n ? PyLong_AsSsize_t(n) : -1;
    if (v < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "request without num_prompt_tokens");
    return v < 0 ? -1 : v / g->block_size;
}

/* mirrors hybridkv.kv_cache.managers.mamba.MambaManager.checkpoint_boundaries */
static Py_ssize_t
num_checkpoints(Group *g, PyObject *req, Py_ssize_t computed, Py_ssize_t num_tokens)
{
    if (!g->caching)
        return 0;
    Py_ssize_t first = computed / g->block_size + 1, last = num_tokens / g->block_size;
    if (g->every == 1)
        return last >= first ? last - first + 1 : 0;
    Py_ssize_t end = prompt_end(g, req), count = 0;
    if (end < 0)
        return -1;
    for (Py_ssize_t j = first; j <= last; j++)
        count += is_checkpoint(g, j, end);
    return count;
}

/* Mamba's live block: the last entry once the request has one (not right after a hit). */
/* mirrors hybridkv.kv_cache.managers.mamba.MambaManager._live_block */
static PyObject *
live_block(Group *g, PyObject *blocks, Py_ssize_t computed)
{
    Py_ssize_t n = blocks ? PyList_GET_SIZE(blocks) : 0;
    return n > computed / g->block_size ? PyList_GET_ITEM(blocks, n - 1) : NULL;
}

/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.num_evictable */
static Py_ssize_t
num_evictable(Pool *pool, PyObject *hit)
{
    return num_with_ref(hit, 0, PyList_GET_SIZE(hit), 0, pool->null_block);
}

/* mirrors hybridkv.kv_cache.managers.mamba.MambaManager.num_blocks_to_allocate */
static int
mamba_need(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed, Py_ssize_t num_tokens,
           PyObject *hit, Py_ssize_t junction, Py_ssize_t *need)
{
    Py_ssize_t num_ckpt = num_checkpoints(g, req, computed, num_tokens);
    if (num_ckpt < 0)
        return -1;
    if (hit != NULL && PyList_GET_SIZE(hit)) {
        Py_ssize_t evictable = num_evictable(pool, hit);
        *need = 1 + num_ckpt + evictable;
        return evictable < 0 ? -1 : 0;
    }
    PyObject *blocks = blocks_of(g, req);
    if (blocks == NULL || PyList_GET_SIZE(blocks) == 0) {
        *need = 1 + num_ckpt;
        return PyErr_Occurred() ? -1 : 0;
    }
    int no_live = live_block(g, blocks, computed) == NULL;  /* before the rule runs */
    Py_ssize_t freed = num_freed_by_skip(pool, g, req, blocks, computed, junction);
    *need = no_live + num_ckpt - freed;
    return freed < 0 ? -1 : 0;
}

/* num_blocks_to_allocate: net free-queue blocks this group takes (negative
 * when skipping returns more than it takes). -1 on error. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.num_blocks_to_allocate */
int
hkv_group_need(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed, Py_ssize_t num_tokens,
               PyObject *hit, Py_ssize_t junction, Py_ssize_t *need)
{
    if (g->kind == KIND_MAMBA)
        return mamba_need(pool, g, req, computed, num_tokens, hit, junction, need);
    Py_ssize_t total = CDIV(num_tokens, g->block_size);
    if (hit != NULL && PyList_GET_SIZE(hit)) {
        Py_ssize_t evictable = num_evictable(pool, hit);
        Py_ssize_t missing = total - PyList_GET_SIZE(hit);
        *need = (missing > 0 ? missing : 0) + evictable;
        return evictable < 0 ? -1 : 0;
    }
    PyObject *blocks = blocks_of(g, req);
    if (blocks == NULL || PyList_GET_SIZE(blocks) == 0) {
        *need = total;
        return PyErr_Occurred() ? -1 : 0;
    }
    *need = total - PyList_GET_SIZE(blocks);
    if (*need < 0)
        *need = 0;
    if (g->skips) {
        Py_ssize_t freed = num_freed_by_skip(pool, g, req, blocks, computed, junction);
        if (freed < 0)
            return -1;
        *need -= freed;
    }
    return 0;
}

/* ---- commit ------------------------------------------------------------------ */

/* prepare: adopt the hit (save_new_computed_blocks), or release skipped blocks. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.prepare */
int
hkv_group_prepare(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed, PyObject *hit,
                  Py_ssize_t junction)
{
    if (hit == NULL || PyList_GET_SIZE(hit) == 0)
        return hkv_group_release_skipped(pool, g, req, computed, junction);
    PyObject *held = blocks_of(g, req);
    if (held != NULL && PyList_GET_SIZE(held)) {
        PyErr_Format(PyExc_AssertionError, "%S already holds blocks", RID(req));
        return -1;
    }
    if (PyErr_Occurred() || hkv_pool_touch(pool, hit) < 0)
        return -1;
    PyObject *copy = PyList_GetSlice(hit, 0, PyList_GET_SIZE(hit));
    if (copy == NULL)
        return -1;
    int rc = PyDict_SetItem(g->req_to_blocks, RID(req), copy);
    Py_DECREF(copy);
    if (rc < 0)
        return -1;
    return dict_set_count(g->num_cached_blocks, RID(req), PyList_GET_SIZE(hit));
}

static PyObject *
own_blocks(Group *g, PyObject *req)
{
    PyObject *blocks = blocks_of(g, req);
    if (blocks != NULL || PyErr_Occurred())
        return Py_XNewRef(blocks);  /* a reference of ours: the policy runs Python code */
    blocks = PyList_New(0);
    if (blocks != NULL && PyDict_SetItem(g->req_to_blocks, RID(req), blocks) < 0)
        Py_CLEAR(blocks);
    return blocks;
}

static int
set_item(PyObject *list, Py_ssize_t i, PyObject *value)
{
    return PyList_SetItem(list, i, Py_NewRef(value));
}

/* Mamba's allocate_new_blocks: checkpoints of the step, the live block last. */
/* mirrors hybridkv.kv_cache.managers.mamba.MambaManager.allocate_new_blocks */
static PyObject *
mamba_allocate_into(Pool *pool, Group *g, PyObject *req, PyObject *blocks, Py_ssize_t computed,
                    Py_ssize_t num_tokens)
{
    PyObject *live = live_block(g, blocks, computed);
    Py_ssize_t num_ckpt = num_checkpoints(g, req, computed, num_tokens);
    Py_ssize_t size = num_tokens / g->block_size + 1;
    if (num_ckpt < 0)
        return NULL;
    Py_XINCREF(live);
    PyObject *new_blocks = NULL;
    if (num_ckpt == 0 && live != NULL) {  /* no new block: the live one may move */
        Py_ssize_t grow = size - PyList_GET_SIZE(blocks);
        if (grow > 0 && (set_item(blocks, PyList_GET_SIZE(blocks) - 1, pool->null_block) < 0 ||
                         hkv_extend_nulls(blocks, pool->null_block, grow) < 0 ||
                         set_item(blocks, PyList_GET_SIZE(blocks) - 1, live) < 0))
            goto done;
        new_blocks = PyList_New(0);
        goto done;
    }
    new_blocks = hkv_pool_take(pool, num_ckpt + (live == NULL), 1);
    if (new_blocks == NULL)
        goto done;
    if (live == NULL)
        live = Py_NewRef(PyList_GET_ITEM(new_blocks, PyList_GET_SIZE(new_blocks) - 1));
    else if (set_item(blocks, PyList_GET_SIZE(blocks) - 1, pool->null_block) < 0)
        goto fail;
    if (hkv_extend_nulls(blocks, pool->null_block, size - PyList_GET_SIZE(blocks)) < 0)
        goto fail;
    Py_ssize_t end = prompt_end(g, req), k = 0;
    if (end < 0 && g->every != 1)
        goto fail;
    for (Py_ssize_t j = computed / g->block_size + 1; k < num_ckpt; j++)
        if (is_checkpoint(g, j, end) &&
            set_item(blocks, j - 1, PyList_GET_ITEM(new_blocks, k++)) < 0)
            goto fail;
    if (set_item(blocks, PyList_GET_SIZE(blocks) - 1, live) < 0)
        goto fail;
    goto done;
fail:
    Py_CLEAR(new_blocks);
done:
    Py_XDECREF(live);
    return new_blocks;
}

/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.allocate_new_blocks */
static PyObject *
allocate_into(Pool *pool, Group *g, PyObject *blocks, Py_ssize_t num_tokens)
{
    Py_ssize_t need = CDIV(num_tokens, g->block_size) - PyList_GET_SIZE(blocks);
    if (need <= 0)
        return PyList_New(0);
    PyObject *new_blocks = hkv_pool_take(pool, need, 1);
    if (new_blocks == NULL)
        return NULL;
    Py_ssize_t end = PyList_GET_SIZE(blocks);
    if (PyList_SetSlice(blocks, end, end, new_blocks) < 0)
        Py_CLEAR(new_blocks);
    return new_blocks;
}

/* ---- sharing cached blocks of recomputed data (managers/base.py `shared_run`) ---- */

static int
shares(Group *g)
{
    return g->caching && g->shares && g->kind != KIND_MAMBA;
}

/* Positions `share` may fill: from the request's (or the hit's) end up to the
 * blocks `num_tokens` need, full blocks of its known tokens only. Their count. */
static Py_ssize_t
share_span(Group *g, PyObject *req, PyObject *hit, Py_ssize_t num_tokens, Py_ssize_t *first)
{
    PyObject *blocks = hit != NULL && PyList_GET_SIZE(hit) ? hit : blocks_of(g, req);
    PyObject *tokens = ((RequestObject *)req)->all_token_ids;
    *first = blocks != NULL ? PyList_GET_SIZE(blocks) : 0;
    if (blocks == NULL && PyErr_Occurred())
        return -1;
    Py_ssize_t known = tokens == NULL ? 0 : PyObject_Length(tokens);
    if (known < 0)
        return -1;
    Py_ssize_t end = CDIV(num_tokens, g->block_size);
    if (end > known / g->block_size)
        end = known / g->block_size;
    return end > *first ? end - *first : 0;
}

/* The cached blocks of positions first .. first + count - 1, up to the first
 * one not cached: a new list. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.shared_run */
static PyObject *
shared_run(Group *g, PyObject *hashes, Py_ssize_t first, Py_ssize_t count)
{
    Py_ssize_t end = PyList_GET_SIZE(hashes) / g->stride;
    if (end > first + count)
        end = first + count;
    PyObject *run = PyList_New(0);
    for (Py_ssize_t i = first; run != NULL && i < end; i++) {
        PyObject *h = PyList_GET_ITEM(hashes, (i + 1) * g->stride - 1);
        PyObject *block = PyDict_GetItemWithError(g->table, h);
        if (block == NULL) {
            if (PyErr_Occurred())
                Py_CLEAR(run);
            break;
        }
        if (!PyObject_TypeCheck(block, &HKV_BlockType)) {
            PyErr_Format(PyExc_TypeError, "expected a Block, got %R", block);
            Py_CLEAR(run);
        }
        else if (PyList_Append(run, block) < 0)
            Py_CLEAR(run);
    }
    return run;
}

/* The run `share` would take, or NULL with *run_out NULL when there is none. */
static int
find_run(Group *g, PyObject *req, PyObject *hit, Py_ssize_t num_tokens, PyObject **hashes,
         ManagerObject *m, PyObject **run_out, Py_ssize_t *first)
{
    *run_out = NULL;
    if (!shares(g))
        return 0;
    Py_ssize_t count = share_span(g, req, hit, num_tokens, first);
    if (count <= 0)
        return count < 0 ? -1 : 0;
    if (*hashes == NULL && (*hashes = hkv_block_hashes(m, req)) == NULL)
        return -1;
    *run_out = shared_run(g, *hashes, *first, count);
    return *run_out == NULL ? -1 : 0;
}

/* num_shared_held: of the blocks `share` would take, those held by others. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.num_shared_held */
int
hkv_group_shared_held(Group *g, PyObject *req, PyObject *hit, Py_ssize_t num_tokens,
                      PyObject **hashes, ManagerObject *m, Py_ssize_t *held)
{
    PyObject *run;
    Py_ssize_t first;
    *held = 0;
    if (find_run(g, req, hit, num_tokens, hashes, m, &run, &first) < 0)
        return -1;
    if (run == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(run); i++)
        *held += BLOCK(PyList_GET_ITEM(run, i))->ref_cnt > 0;
    Py_DECREF(run);
    return 0;
}

/* share: the request takes (touches) the cached blocks of the positions it is
 * about to compute, up to the first not cached. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.share */
int
hkv_group_share(Pool *pool, Group *g, PyObject *req, Py_ssize_t num_tokens, PyObject **hashes,
                ManagerObject *m)
{
    PyObject *run;
    Py_ssize_t first;
    if (find_run(g, req, NULL, num_tokens, hashes, m, &run, &first) < 0)
        return -1;
    if (run == NULL || PyList_GET_SIZE(run) == 0) {
        Py_XDECREF(run);
        return 0;
    }
    PyObject *blocks = own_blocks(g, req);
    int rc = blocks == NULL || hkv_pool_touch(pool, run) < 0 ? -1 : 0;
    if (rc == 0) {
        Py_ssize_t end = PyList_GET_SIZE(blocks);
        rc = PyList_SetSlice(blocks, end, end, run);
    }
    Py_XDECREF(blocks);
    Py_DECREF(run);
    return rc;
}

/* allocate_new_blocks: blocks for `num_tokens` tokens; a new list of the new ones. */
PyObject *
hkv_group_allocate(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed,
                   Py_ssize_t num_tokens)
{
    PyObject *blocks = own_blocks(g, req);
    if (blocks == NULL)
        return NULL;
    PyObject *out = g->kind == KIND_MAMBA
        ? mamba_allocate_into(pool, g, req, blocks, computed, num_tokens)
        : allocate_into(pool, g, blocks, num_tokens);
    Py_DECREF(blocks);
    return out;
}

/* cache_blocks: the request's full blocks among the first `num_tokens` become
 * reusable. `*hashes` is fetched (hkv_block_hashes) only when a block is new. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.cache_blocks */
int
hkv_group_cache(Pool *pool, Group *g, PyObject *req, PyObject **hashes, ManagerObject *m,
                Py_ssize_t num_tokens)
{
    Py_ssize_t num_full = num_tokens / g->block_size;
    Py_ssize_t start = dict_count(g->num_cached_blocks, RID(req), 0);
    if (FAILED(start))
        return -1;
    if (num_full <= start)
        return 0;
    if (*hashes == NULL && (*hashes = hkv_block_hashes(m, req)) == NULL)
        return -1;
    if (PyList_GET_SIZE(*hashes) / g->stride < num_full)
        num_full = PyList_GET_SIZE(*hashes) / g->stride;
    if (num_full <= start)
        return 0;
    PyObject *blocks = blocks_of(g, req);
    if (blocks == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, RID(req));
        return -1;
    }
    Py_INCREF(blocks);  /* the policy's hooks run Python code */
    int rc = hkv_pool_cache(pool, g, blocks, *hashes, start, num_full);
    Py_DECREF(blocks);
    return rc < 0 ? -1 : dict_set_count(g->num_cached_blocks, RID(req), num_full);
}

/* max_quiet_computed of the type: the largest computed count releasing nothing. */
/* mirrors hybridkv.kv_cache.managers.sliding_window.SlidingWindowManager.max_quiet_computed,
 *         hybridkv.kv_cache.managers.chunked_local.ChunkedLocalAttentionManager.max_quiet_computed,
 *         hybridkv.kv_cache.managers.mamba.MambaManager.max_quiet_computed */
static Py_ssize_t
max_quiet_computed(Group *g, PyObject *req)
{
    Py_ssize_t bs = g->block_size;
    switch (g->kind) {
    case KIND_SLIDING: {
        Py_ssize_t start = skip_start(g, req);
        return FAILED(start) ? -1 : (start + 1) * bs + g->window - 2;
    }
    case KIND_CHUNKED: {
        Py_ssize_t start = dict_count(g->num_skipped, RID(req), 0);
        return FAILED(start) ? -1 : (start * bs / g->chunk + 1) * g->chunk - 1;
    }
    case KIND_MAMBA: {
        Py_ssize_t start = dict_count(g->num_skipped, RID(req), 0);
        return FAILED(start) ? -1 : (start + 1) * bs - 1;
    }
    default:
        return HKV_UNLIMITED;
    }
}

/* quiet_limits: (max tokens, max computed) up to which nothing changes here. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.quiet_limits,
 *         hybridkv.kv_cache.managers.mamba.MambaManager.quiet_limits */
int
hkv_group_limits(Group *g, PyObject *req, Py_ssize_t *max_tokens, Py_ssize_t *max_computed)
{
    PyObject *blocks = blocks_of(g, req);
    if (blocks == NULL || PyList_GET_SIZE(blocks) == 0) {
        *max_tokens = *max_computed = 0;
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_ssize_t bs = g->block_size, n = PyList_GET_SIZE(blocks);
    if (g->kind == KIND_MAMBA) {
        *max_tokens = n * bs - 1;
    } else {
        *max_tokens = n * bs;
        if (g->caching) {
            Py_ssize_t cached = dict_count(g->num_cached_blocks, RID(req), 0);
            if (FAILED(cached))
                return -1;
            if ((cached + 1) * bs - 1 < *max_tokens)
                *max_tokens = (cached + 1) * bs - 1;
        }
    }
    *max_computed = g->skips ? max_quiet_computed(g, req) : HKV_UNLIMITED;
    return FAILED(*max_computed) ? -1 : 0;
}


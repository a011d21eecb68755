/* get_computed_blocks in C (`_lookup`, after the facade's checks) and the hit search: each built-in type's `find_longest_cache_hit`
 * (the managers' modules) and the hybrid fixed point of
 * HybridCoordinator.find_longest_cache_hit, which is the reference: full
 * attention is searched once, then the other groups shrink the length in
 * turn until none does; every group's hit is trimmed to the answer. */
#include "_fastpath.h"

/* The block caching this group's hash of block i (borrowed), NULL if none. */
static inline PyObject *
cached_block(Group *g, PyObject *hashes, Py_ssize_t i)
{
    return PyDict_GetItemWithError(g->table, PyList_GET_ITEM(hashes, (i + 1) * g->stride - 1));
}

static inline Py_ssize_t
num_searchable(Group *g, PyObject *hashes, Py_ssize_t max_length)
{
    Py_ssize_t n = max_length / g->block_size, have = PyList_GET_SIZE(hashes) / g->stride;
    return n < have ? n : have;
}

/* Full attention: left to right, up to the first miss. */
/* mirrors hybridkv.kv_cache.managers.full.FullAttentionManager.find_longest_cache_hit */
static PyObject *
search_full(Group *g, PyObject *hashes, Py_ssize_t max_length, PyObject *null)
{
    PyObject *hit = PyList_New(0);
    Py_ssize_t n = num_searchable(g, hashes, max_length);
    for (Py_ssize_t i = 0; hit != NULL && i < n; i++) {
        PyObject *b = cached_block(g, hashes, i);
        if (b == NULL || PyList_Append(hit, b) < 0) {
            if (PyErr_Occurred())
                Py_CLEAR(hit);
            break;
        }
    }
    return hit;
}

/* Chunked local: nulls up to the chunk start, then left to right to the first miss. */
/* mirrors hybridkv.kv_cache.managers.chunked_local.ChunkedLocalAttentionManager.find_longest_cache_hit */
static PyObject *
search_chunked(Group *g, PyObject *hashes, Py_ssize_t max_length, PyObject *null)
{
    Py_ssize_t n = num_searchable(g, hashes, max_length);
    Py_ssize_t chunk_start = n * g->block_size / g->chunk * g->chunk / g->block_size;
    PyObject *hit = PyList_New(0);
    if (hit == NULL || hkv_extend_nulls(hit, null, chunk_start) < 0)
        goto fail;
    for (Py_ssize_t i = chunk_start; i < n; i++) {
        PyObject *b = cached_block(g, hashes, i);
        if (b == NULL)
            break;
        if (PyList_Append(hit, b) < 0)
            goto fail;
    }
    if (!PyErr_Occurred())
        return hit;
fail:
    Py_XDECREF(hit);
    return NULL;
}

/* Mamba: the last cached state at or before the length: [null, ..., null, state]. */
/* mirrors hybridkv.kv_cache.managers.mamba.MambaManager.find_longest_cache_hit */
static PyObject *
search_mamba(Group *g, PyObject *hashes, Py_ssize_t max_length, PyObject *null)
{
    for (Py_ssize_t i = num_searchable(g, hashes, max_length) - 1; i >= 0; i--) {
        PyObject *b = cached_block(g, hashes, i);
        if (b == NULL) {
            if (PyErr_Occurred())
                return NULL;
            continue;
        }
        PyObject *hit = PyList_New(0);
        if (hit == NULL || hkv_extend_nulls(hit, null, i) < 0 || PyList_Append(hit, b) < 0) {
            Py_XDECREF(hit);
            return NULL;
        }
        return hit;
    }
    return PyList_New(0);
}

/* sinks[:start] + [null] * (start - min(start, len(sinks))) + run, as a new list. */
static PyObject *
window_hit(PyObject *sinks, Py_ssize_t start, PyObject *run, PyObject *null)
{
    Py_ssize_t num_sinks = PyList_GET_SIZE(sinks) < start ? PyList_GET_SIZE(sinks) : start;
    PyObject *hit = PyList_GetSlice(sinks, 0, num_sinks);
    if (hit == NULL || hkv_extend_nulls(hit, null, start - num_sinks) < 0 ||
        PyList_SetSlice(hit, PyList_GET_SIZE(hit), PyList_GET_SIZE(hit), run) < 0) {
        Py_XDECREF(hit);
        return NULL;
    }
    return hit;
}

/* The rightmost run of `need` cached blocks ending at or before num_blocks (or a
 * run from block 0), sinks in front (SlidingWindowManager._search_window). */
/* mirrors hybridkv.kv_cache.managers.sliding_window.SlidingWindowManager._search_window */
static PyObject *
search_window(Group *g, PyObject *hashes, Py_ssize_t num_blocks, PyObject *sinks,
              PyObject *null)
{
    Py_ssize_t need = g->window_blocks, end = num_blocks;
    PyObject *run = PyList_New(0), *hit = NULL;
    if (run == NULL)
        return NULL;
    if (need == 0) {
        hit = window_hit(sinks, num_blocks > PyList_GET_SIZE(sinks) ? num_blocks
                         : PyList_GET_SIZE(sinks), run, null);
        goto done;
    }
    for (Py_ssize_t i = num_blocks - 1; i >= 0; i--) {  /* rightmost first */
        PyObject *b = cached_block(g, hashes, i);
        if (b == NULL) {
            if (PyErr_Occurred())
                goto done;
            if (PyList_SetSlice(run, 0, PyList_GET_SIZE(run), NULL) < 0)
                goto done;
            end = i;
            continue;
        }
        if (PyList_Append(run, b) < 0)
            goto done;
        if (PyList_GET_SIZE(run) == need)
            break;
    }
    Py_ssize_t found = PyList_GET_SIZE(run), start = end - found;
    if (found == 0 || (found < need && start != 0)) {
        hit = PyList_New(0);
        goto done;
    }
    if (PyList_Reverse(run) == 0)
        hit = window_hit(sinks, start, run, null);
done:
    Py_DECREF(run);
    return hit;
}

/* Sliding window: the sink blocks must all be cached up to the length, then the window. */
/* mirrors hybridkv.kv_cache.managers.sliding_window.SlidingWindowManager.find_longest_cache_hit */
static PyObject *
search_sliding(Group *g, PyObject *hashes, Py_ssize_t max_length, PyObject *null)
{
    Py_ssize_t n = num_searchable(g, hashes, max_length);
    PyObject *sinks = PyList_New(0), *hit = NULL;
    if (sinks == NULL)
        return NULL;
    Py_ssize_t num_sinks = g->kept_head < n ? g->kept_head : n;
    for (Py_ssize_t i = 0; i < num_sinks; i++) {
        PyObject *b = cached_block(g, hashes, i);
        if (b == NULL) {
            if (PyErr_Occurred())
                goto done;
            n = i;  /* L may not pass a missing sink block */
            break;
        }
        if (PyList_Append(sinks, b) < 0)
            goto done;
    }
    hit = search_window(g, hashes, n, sinks, null);
done:
    Py_DECREF(sinks);
    return hit;
}

static PyObject *
search(Group *g, PyObject *hashes, Py_ssize_t max_length, PyObject *null)
{
    switch (g->kind) {
    case KIND_FULL:
        return search_full(g, hashes, max_length, null);
    case KIND_SLIDING:
        return search_sliding(g, hashes, max_length, null);
    case KIND_CHUNKED:
        return search_chunked(g, hashes, max_length, null);
    default:
        return search_mamba(g, hashes, max_length, null);
    }
}

/* Replaces hits[g] (a new reference) and returns its length in tokens; -1 on error. */
static Py_ssize_t
search_into(Group *g, PyObject *hashes, Py_ssize_t length, PyObject *null, PyObject **hit)
{
    PyObject *found = search(g, hashes, length, null);
    if (found == NULL)
        return -1;
    Py_XSETREF(*hit, found);
    return PyList_GET_SIZE(found) * g->block_size;
}

/* The other groups shrink `*length` in turn until none does. */
static int
settle(ManagerObject *self, PyObject *hashes, Py_ssize_t *length, PyObject **hits,
       Py_ssize_t *first)
{
    Py_ssize_t align = self->alignment;
    int settled = 0;
    while (!settled && *length > 0) {
        settled = 1;
        for (Py_ssize_t g = 0; g < self->num_groups; g++) {
            Group *group = &self->groups[g];
            if (group->kind == KIND_FULL)
                continue;
            Py_ssize_t len = search_into(group, hashes, *length, self->pool.null_block, &hits[g]);
            if (len < 0)
                return -1;
            if (first[g] < 0)
                first[g] = len;
            if (len / align * align < *length) {
                *length = len / align * align;
                settled = 0;
            }
        }
    }
    return 0;
}

/* Every group's hit trimmed to `length`: a new tuple of lists. */
/* mirrors hybridkv.kv_cache.coordinator.HybridCoordinator._trim */
static PyObject *
trim(ManagerObject *self, PyObject **hits, Py_ssize_t length)
{
    PyObject *out = PyTuple_New(self->num_groups);
    for (Py_ssize_t g = 0; out != NULL && g < self->num_groups; g++) {
        Py_ssize_t n = length / self->groups[g].block_size;
        PyObject *hit = hits[g];
        PyObject *item = hit == NULL ? PyList_New(0)
                         : PyList_GET_SIZE(hit) == n ? Py_NewRef(hit)
                         : PyList_GetSlice(hit, 0, n);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, g, item);
    }
    return out;
}

/* HybridCoordinator.find_longest_cache_hit over the pool: blocks per group (a new
 * tuple), the length every group reuses, the full-attention match, and each
 * group's first search (group_lengths, num_groups entries). */
/* mirrors hybridkv.kv_cache.coordinator.HybridCoordinator.find_longest_cache_hit */
PyObject *
hkv_find_hit(ManagerObject *self, PyObject *hashes, Py_ssize_t max_length, Py_ssize_t *length,
             Py_ssize_t *matched, Py_ssize_t *group_lengths)
{
    Py_ssize_t align = self->alignment, n = self->num_groups;
    PyObject **hits = PyMem_Calloc(n, sizeof(PyObject *));
    PyObject *out = NULL;
    if (hits == NULL)
        return PyErr_NoMemory();
    *length = max_length / align * align;
    for (Py_ssize_t g = 0; g < n; g++) {  /* full attention once, trimmed at the end */
        group_lengths[g] = -1;
        if (self->groups[g].kind != KIND_FULL)
            continue;
        Py_ssize_t len = search_into(&self->groups[g], hashes, *length, self->pool.null_block,
                                     &hits[g]);
        if (len < 0)
            goto done;
        group_lengths[g] = len;
        *length = (len < *length ? len : *length) / align * align;
    }
    *matched = *length;
    if (settle(self, hashes, length, hits, group_lengths) < 0)
        goto done;
    for (Py_ssize_t g = 0; g < n; g++)
        if (group_lengths[g] < 0)  /* not searched: the full-attention match was 0 */
            group_lengths[g] = 0;
    out = trim(self, hits, *length);
done:
    for (Py_ssize_t g = 0; g < n; g++)
        Py_XDECREF(hits[g]);
    PyMem_Free(hits);
    return out;
}

/* ---- get_computed_blocks ------------------------------------------------------------ */

static int
stats_add(ManagerObject *self, Py_ssize_t num_tokens, Py_ssize_t length, Py_ssize_t matched,
          Py_ssize_t *group_lengths)
{
    PyObject *stats = self->stats;
    if (hkv_add_to_attr(stats, hkv_names.requests, 1) < 0 ||
        hkv_add_to_attr(stats, hkv_names.queries, num_tokens) < 0 ||
        hkv_add_to_attr(stats, hkv_names.hits, length) < 0 ||
        hkv_add_to_attr(stats, hkv_names.stranded_tokens, matched - length) < 0)
        return -1;
    PyObject *group_hits = PyObject_GetAttr(stats, hkv_names.group_hits);
    int rc = group_hits == NULL || !PyList_Check(group_hits) ? -1 : 0;
    for (Py_ssize_t g = 0; rc == 0 && g < self->num_groups; g++)
        rc = hkv_add_to_item(group_hits, g, group_lengths[g]);
    if (group_hits != NULL && rc < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "group_hits must be a list");
    Py_XDECREF(group_hits);
    return rc;
}

/* The junction: recorded per request object, and on the Held of a held one. */
static int
note_junction(ManagerObject *self, RequestObject *req, Py_ssize_t matched)
{
    PyObject *value = PyLong_FromSsize_t(matched);
    if (value == NULL)
        return -1;
    int rc = PyObject_SetItem(self->junctions, (PyObject *)req, value);
    Py_DECREF(value);
    HeldObject *held;
    if (rc < 0 || hkv_held_entry(self, req, &held) < 0)
        return -1;
    if (held != NULL)
        held->junction = matched;
    return 0;
}

static PyObject *
lookup(ManagerObject *self, RequestObject *req)
{
    PyObject *hashes = hkv_block_hashes(self, (PyObject *)req);
    if (hashes == NULL)
        return NULL;
    PyObject *out = NULL, *blocks = NULL;
    Py_ssize_t num_tokens = PyList_GET_SIZE(req->all_token_ids), length, matched;
    Py_ssize_t *group_lengths = PyMem_Calloc(self->num_groups, sizeof(Py_ssize_t));
    if (group_lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    blocks = hkv_find_hit(self, hashes, num_tokens - 1, &length, &matched, group_lengths);
    if (blocks == NULL || note_junction(self, req, matched) < 0 ||
        stats_add(self, num_tokens, length, matched, group_lengths) < 0)
        goto done;
    if (length == 0 && PyList_GET_SIZE(hashes)) {
        PyObject *r = PyObject_CallMethodOneArg(self->owner, hkv_names.note_repeated_miss,
                                                PyList_GET_ITEM(hashes, 0));
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    PyObject *hit = hkv_new_blocks(self, blocks);
    blocks = NULL;
    if (hit != NULL)
        out = Py_BuildValue("(Nn)", hit, length);
done:
    Py_XDECREF(blocks);
    PyMem_Free(group_lengths);
    Py_DECREF(hashes);
    return out;
}

/* lookup(request): get_computed_blocks after its checks (a Request, caching on); the
 * owner's `_lookup_py` when a group is not a built-in type. */
/* mirrors hybridkv.kv_cache.kv_cache_manager.KVCacheManager._lookup_py */
PyObject *
hkv_manager_lookup(ManagerObject *self, PyObject *request)
{
    RequestObject *req = (RequestObject *)request;
    if (self->owner == NULL)
        return hkv_unbound();
    if (!self->native || !self->caching || self->request_type == NULL ||
        !PyObject_TypeCheck(request, (PyTypeObject *)self->request_type) ||
        req->all_token_ids == NULL || !PyList_CheckExact(req->all_token_ids) ||
        PyList_GET_SIZE(req->all_token_ids) == 0 || self->stats == NULL ||
        self->junctions == NULL)
        return hkv_call_owner(self, hkv_names.lookup_py, request);
    return lookup(self, req);
}


/* KVCacheManager._allocate in C: check, then commit, an allocation the
 * caller validated (kv_cache_manager.py `_allocate_py` is the reference):
 *
 * 1. every group's net need; when the pool is short, `_make_room` (Python)
 *    decides (it may release retained blocks, or refuse: None);
 * 2. release skipped blocks (or adopt the hit), then new blocks per group;
 * 3. cache the full blocks the allocation covers, and set the request's
 *    fast-path limits. */
#include "_fastpath.h"

/* request.block_hashes(hash_algo, hash_block_size): the request's hasher list
 * itself when it covers every full block, else the Python method. */
PyObject *
hkv_block_hashes(ManagerObject *self, PyObject *req)
{
    RequestObject *r = (RequestObject *)req;
    PyObject *hasher = r->hasher;
    if (hasher != NULL && hasher != Py_None && r->all_token_ids != NULL &&
        PyList_CheckExact(r->all_token_ids)) {
        PyObject *bs = PyObject_GetAttr(hasher, hkv_names.block_size);
        PyObject *algo = bs ? PyObject_GetAttr(hasher, hkv_names.hash_algo) : NULL;
        PyObject *hashes = algo ? PyObject_GetAttr(hasher, hkv_names.hashes) : NULL;
        Py_ssize_t size = bs ? hkv_exact_index(bs) : -1;
        int same = size > 0 && hashes && PyList_CheckExact(hashes) &&
                   size == hkv_exact_index(self->hash_block_size) &&
                   PyUnicode_Check(algo) && PyUnicode_Compare(algo, self->hash_algo) == 0;
        Py_XDECREF(bs);
        Py_XDECREF(algo);
        if (PyErr_Occurred()) {
            Py_XDECREF(hashes);
            return NULL;
        }
        if (same && PyList_GET_SIZE(hashes) >= PyList_GET_SIZE(r->all_token_ids) / size)
            return hashes;
        Py_XDECREF(hashes);
    }
    PyObject *args[] = {req, self->hash_algo, self->hash_block_size};
    PyObject *out = PyObject_VectorcallMethod(hkv_names.block_hashes, args,
                                              3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (out != NULL && !PyList_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "block_hashes() must return a list");
        return NULL;
    }
    return out;
}

static PyObject *
hit_of(PyObject *hit, Py_ssize_t g)
{
    if (hit == NULL)
        return NULL;
    PyObject *blocks = PyTuple_GET_ITEM(hit, g);
    return PyList_Check(blocks) ? blocks : NULL;
}

/* Step 1: whether the pool can supply the allocation now (0: refused, -1: error). */
static int
fits(ManagerObject *self, HeldObject *held, Py_ssize_t computed, Py_ssize_t num_tokens,
     PyObject *hit)
{
    Py_ssize_t need = 0;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        Py_ssize_t n;
        if (hkv_group_need(&self->pool, &self->groups[g], held->request, computed, num_tokens,
                           hit_of(hit, g), held->junction, &n) < 0)
            return -1;
        need += n;
    }
    Py_ssize_t num_free = hkv_pool_num_free(&self->pool);
    if (num_free < 0)
        return -1;
    if (need <= num_free)
        return 1;
    PyObject *out = PyObject_CallMethod((PyObject *)self, "_make_room", "On", (PyObject *)held,
                                        need);
    if (out == NULL)
        return -1;
    int ok = PyObject_IsTrue(out);
    Py_DECREF(out);
    return ok;
}

/* Step 2: release or adopt, then take new blocks; a new tuple of new-block lists. */
static PyObject *
commit(ManagerObject *self, HeldObject *held, Py_ssize_t computed, Py_ssize_t num_tokens,
       PyObject *hit, int releases)
{
    PyObject *req = held->request;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        Group *group = &self->groups[g];
        int rc = hit == NULL
            ? (releases ? hkv_group_release_skipped(group, req, computed, held->junction) : 0)
            : hkv_group_prepare(&self->pool, group, req, computed, hit_of(hit, g),
                                held->junction);
        if (rc < 0)
            return NULL;
    }
    PyObject *out = PyTuple_New(self->num_groups);
    for (Py_ssize_t g = 0; out != NULL && g < self->num_groups; g++) {
        PyObject *blocks = hkv_group_allocate(&self->pool, &self->groups[g], req, computed,
                                              num_tokens);
        if (blocks == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, g, blocks);
    }
    return out;
}

/* Step 3: cache full blocks; the request's fast-path limits. */
static int
cache_and_limit(ManagerObject *self, HeldObject *held, Py_ssize_t num_tokens)
{
    PyObject *hashes = NULL;
    Py_ssize_t max_tokens = HKV_UNLIMITED, max_computed = HKV_UNLIMITED;
    int rc = 0;
    for (Py_ssize_t g = 0; g < self->num_groups && rc == 0; g++) {
        Group *group = &self->groups[g];
        Py_ssize_t tokens, computed;
        if (self->caching)
            rc = hkv_group_cache(&self->pool, group, held->request, &hashes, self, num_tokens);
        if (rc == 0)
            rc = hkv_group_limits(group, held->request, &tokens, &computed);
        if (rc == 0 && tokens < max_tokens)
            max_tokens = tokens;
        if (rc == 0 && computed < max_computed)
            max_computed = computed;
    }
    Py_XDECREF(hashes);
    held->max_tokens = max_tokens;
    held->max_computed = max_computed;
    return rc;
}

PyObject *
hkv_new_blocks(ManagerObject *self, PyObject *groups)
{
    PyTypeObject *type = (PyTypeObject *)self->blocks_type;
    BlocksObject *out = (BlocksObject *)type->tp_alloc(type, 0);
    if (out == NULL) {
        Py_DECREF(groups);
        return NULL;
    }
    out->blocks = groups;
    return (PyObject *)out;
}

/* The allocation of a request the caller validated: new blocks (KVCacheBlocks),
 * None when the pool can't supply them now. `hit`: a tuple of lists, or NULL. */
PyObject *
hkv_allocate(ManagerObject *self, HeldObject *held, Py_ssize_t computed, Py_ssize_t num_tokens,
             PyObject *hit, int releases)
{
    if (hit != NULL && (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != self->num_groups)) {
        PyErr_SetString(PyExc_ValueError, "a hit must have one list of blocks per group");
        return NULL;
    }
    int ok = fits(self, held, computed, num_tokens, hit);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *new_blocks = commit(self, held, computed, num_tokens, hit, releases);
    if (new_blocks == NULL)
        return NULL;
    RequestObject *req = (RequestObject *)held->request;
    if (cache_and_limit(self, held, num_tokens) < 0 ||
        PyDict_SetItem(self->held, req->request_id, (PyObject *)held) < 0) {
        Py_DECREF(new_blocks);
        return NULL;
    }
    return hkv_new_blocks(self, new_blocks);
}

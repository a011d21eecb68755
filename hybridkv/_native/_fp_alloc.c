/* KVCacheManager._allocate in C: check, then commit, an allocation the
 * caller validated (kv_cache_manager.py `_allocate_py` is the reference):
 *
 * 1. every group's net need; when the pool is short, `_make_room` (Python)
 *    decides (it may release retained blocks, or refuse: None);
 * 2. release skipped blocks (or adopt the hit), then new blocks per group;
 * 3. cache the full blocks the allocation covers, and set the request's
 *    fast-path limits. */
#include "_chainhash_api.h"
#include "_fastpath.h"

/* Set by configure_hashing (hashing.py, on import): BlockHasher, the hashing
 * extension's C API, the algorithm ids and the seeds. */
static PyObject *hasher_type, *algo_ids, *seeds, *hasher_kwnames;
static HkvChainApi *chain_api;

PyObject *
hkv_configure_hashing(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *type, *capsule, *ids, *seed_map;
    if (!PyArg_ParseTuple(args, "O!OO!O!:configure_hashing", &PyType_Type, &type, &capsule,
                          &PyDict_Type, &ids, &PyDict_Type, &seed_map))
        return NULL;
    HkvChainApi *api = PyCapsule_GetPointer(capsule, HKV_CHAIN_API_NAME);
    if (api == NULL)
        return NULL;
    chain_api = api;
    Py_XSETREF(hasher_type, Py_NewRef(type));
    Py_XSETREF(algo_ids, Py_NewRef(ids));
    Py_XSETREF(seeds, Py_NewRef(seed_map));
    if (hasher_kwnames == NULL)
        hasher_kwnames = Py_BuildValue("(ssss)", "memo", "cache_salt", "lora_name", "mm_items");
    if (hasher_kwnames == NULL)
        return NULL;
    Py_RETURN_NONE;
}

#define attr(obj, name) PyObject_GetAttr((obj), hkv_names.name)

/* BlockHasher._hash_range's one-call case (no multimodal items, no salt to add):
 * hashes blocks first..last-1 onto `hashes`. 1 done, 0 not this case, -1 error. */
static int
extend_plain(PyObject *hasher, PyObject *hashes, PyObject *algo, PyObject *tokens,
             Py_ssize_t first, Py_ssize_t last, Py_ssize_t bs)
{
    PyObject *mm = attr(hasher, h_mm), *salt = mm ? attr(hasher, h_salt) : NULL;
    PyObject *lora = salt ? attr(hasher, h_lora) : NULL, *out = NULL;
    int rc = lora == NULL ? -1 : 0, plain = 0;
    if (rc == 0) {
        int has_mm = PyObject_IsTrue(mm), has_salt = PyObject_IsTrue(salt);
        rc = has_mm < 0 || has_salt < 0 ? -1 : 0;
        plain = !has_mm && !(first == 0 && has_salt);
    }
    PyObject *id = rc == 0 && plain ? PyDict_GetItemWithError(algo_ids, algo) : NULL;
    PyObject *parent = first ? PyList_GET_ITEM(hashes, first - 1)
                             : (id ? PyDict_GetItemWithError(seeds, algo) : NULL);
    int algo_id = id ? (int)PyLong_AsLong(id) : -1;
    if (id != NULL && parent != NULL && PyBytes_Check(parent) && PyBytes_Check(lora) &&
        !PyErr_Occurred()) {
        out = chain_api->chain(algo_id, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent),
                               tokens, first * bs, last - first, bs, PyBytes_AS_STRING(lora),
                               PyBytes_GET_SIZE(lora), 1);
        rc = out == NULL || PyList_SetSlice(hashes, first, first, out) < 0 ? -1 : 1;
    }
    if (rc == 0 && PyErr_Occurred())
        rc = -1;
    Py_XDECREF(mm);
    Py_XDECREF(salt);
    Py_XDECREF(lora);
    Py_XDECREF(out);
    return rc;
}

/* The request's hasher list when it covers every full block, or after
 * extending it in C; NULL (no error) when the Python method must run. */
static PyObject *
hasher_hashes(ManagerObject *self, RequestObject *r)
{
    PyObject *hasher = r->hasher, *tokens = r->all_token_ids;
    if (hasher == NULL || hasher_type == NULL || !Py_IS_TYPE(hasher, (PyTypeObject *)hasher_type)
        || tokens == NULL || !PyList_CheckExact(tokens) ||
        Py_TYPE(r) != (PyTypeObject *)self->request_type)  /* a subclass may hash otherwise */
        return NULL;
    PyObject *bs = attr(hasher, block_size), *algo = bs ? attr(hasher, hash_algo) : NULL;
    PyObject *hashes = algo ? attr(hasher, hashes) : NULL;
    Py_ssize_t size = bs ? hkv_exact_index(bs) : -1;
    int same = size > 0 && hashes && PyList_CheckExact(hashes) &&
               size == hkv_exact_index(self->hash_block_size) && PyUnicode_Check(algo) &&
               PyUnicode_Compare(algo, self->hash_algo) == 0;
    int rc = 1;
    if (same && PyList_GET_SIZE(hashes) < PyList_GET_SIZE(tokens) / size)
        rc = extend_plain(hasher, hashes, algo, tokens, PyList_GET_SIZE(hashes),
                          PyList_GET_SIZE(tokens) / size, size);
    Py_XDECREF(bs);
    Py_XDECREF(algo);
    if (same && rc == 1 && !PyErr_Occurred())
        return hashes;
    Py_XDECREF(hashes);
    return NULL;
}

/* Request.block_hashes' first step for a request with no hasher yet:
 * req.hasher = BlockHasher(hash_algo, block_size, memo=True, cache_salt=...,
 * lora_name=..., mm_items=...). -1 on error. */
static int
new_hasher(ManagerObject *self, RequestObject *r)
{
    PyObject *req = (PyObject *)r;
    PyObject *salt = PyObject_GetAttr(req, hkv_names.cache_salt);
    PyObject *lora = salt ? PyObject_GetAttr(req, hkv_names.lora_name) : NULL;
    PyObject *mm = lora ? PyObject_GetAttr(req, hkv_names.mm_hashes) : NULL;
    PyObject *hasher = NULL;
    if (mm != NULL) {
        PyObject *args[] = {self->hash_algo, self->hash_block_size, Py_True, salt, lora, mm};
        hasher = PyObject_Vectorcall(hasher_type, args, 2, hasher_kwnames);
    }
    Py_XDECREF(salt);
    Py_XDECREF(lora);
    Py_XDECREF(mm);
    if (hasher == NULL)
        return -1;
    Py_XSETREF(r->hasher, hasher);
    return 0;
}

/* request.block_hashes(hash_algo, hash_block_size) (a list). */
/* mirrors hybridkv.kv_cache.request.Request.block_hashes */
PyObject *
hkv_block_hashes(ManagerObject *self, PyObject *req)
{
    RequestObject *r = (RequestObject *)req;
    if ((r->hasher == NULL || r->hasher == Py_None) && hasher_type != NULL &&
        hasher_kwnames != NULL && Py_TYPE(r) == (PyTypeObject *)self->request_type &&
        new_hasher(self, r) < 0)
        return NULL;
    PyObject *hashes = hasher_hashes(self, r);
    if (hashes != NULL || PyErr_Occurred())
        return hashes;
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
/* mirrors hybridkv.kv_cache.kv_cache_manager.KVCacheManager._allocate_py (the check)
 *         and hybridkv.kv_cache.coordinator.HybridCoordinator.num_blocks_to_allocate */
static int
fits(ManagerObject *self, HeldObject *held, Py_ssize_t computed, Py_ssize_t num_tokens,
     PyObject *hit, PyObject **hashes)
{
    Py_ssize_t need = 0;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        Py_ssize_t n, shared;
        if (hkv_group_need(&self->pool, &self->groups[g], held->request, computed, num_tokens,
                           hit_of(hit, g), held->junction, &n) < 0 ||
            hkv_group_shared_held(&self->groups[g], held->request, hit_of(hit, g), num_tokens,
                                  hashes, self, &shared) < 0)
            return -1;
        need += n - shared;
    }
    if (need <= 0)
        return 1;
    Py_ssize_t num_free = hkv_pool_num_free(&self->pool);
    if (num_free < 0)
        return -1;
    if (need <= num_free)
        return 1;
    PyObject *out = hkv_call(self->owner, hkv_names.make_room,
                             (PyObject *[]){HKV_O((PyObject *)held), HKV_N(need)}, 2);
    if (out == NULL)
        return -1;
    int ok = PyObject_IsTrue(out);
    Py_DECREF(out);
    return ok;
}

/* Step 2: release or adopt, then take new blocks; a new tuple of new-block lists. */
/* mirrors hybridkv.kv_cache.coordinator.HybridCoordinator.allocate */
static PyObject *
commit(ManagerObject *self, HeldObject *held, Py_ssize_t computed, Py_ssize_t num_tokens,
       PyObject *hit, int releases, PyObject **hashes)
{
    PyObject *req = held->request;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        Group *group = &self->groups[g];
        int rc = hit == NULL
            ? (releases ? hkv_group_release_skipped(&self->pool, group, req, computed,
                                                    held->junction) : 0)
            : hkv_group_prepare(&self->pool, group, req, computed, hit_of(hit, g),
                                held->junction);
        if (rc < 0)
            return NULL;
    }
    /* every group's shared blocks leave the free queue before any group evicts */
    for (Py_ssize_t g = 0; g < self->num_groups; g++)
        if (hkv_group_share(&self->pool, &self->groups[g], req, num_tokens, hashes, self) < 0)
            return NULL;
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
/* mirrors hybridkv.kv_cache.coordinator.HybridCoordinator.cache_blocks */
static int
cache_and_limit(ManagerObject *self, HeldObject *held, Py_ssize_t num_tokens, PyObject **hashes)
{
    Py_ssize_t max_tokens = HKV_UNLIMITED, max_computed = HKV_UNLIMITED;
    int rc = 0;
    for (Py_ssize_t g = 0; g < self->num_groups && rc == 0; g++) {
        Group *group = &self->groups[g];
        Py_ssize_t tokens, computed;
        if (self->caching)
            rc = hkv_group_cache(&self->pool, group, held->request, hashes, self, num_tokens);
        if (rc == 0)
            rc = hkv_group_limits(group, held->request, &tokens, &computed);
        if (rc == 0 && tokens < max_tokens)
            max_tokens = tokens;
        if (rc == 0 && computed < max_computed)
            max_computed = computed;
    }
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
/* mirrors hybridkv.kv_cache.kv_cache_manager.KVCacheManager._allocate_py */
PyObject *
hkv_allocate(ManagerObject *self, HeldObject *held, Py_ssize_t computed, Py_ssize_t num_tokens,
             PyObject *hit, int releases)
{
    if (hit != NULL && (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != self->num_groups)) {
        PyErr_SetString(PyExc_ValueError, "a hit must have one list of blocks per group");
        return NULL;
    }
    PyObject *hashes = NULL;  /* the request's block hashes, fetched when first needed */
    int ok = fits(self, held, computed, num_tokens, hit, &hashes);
    if (ok <= 0) {
        Py_XDECREF(hashes);
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *new_blocks = commit(self, held, computed, num_tokens, hit, releases, &hashes);
    if (new_blocks == NULL) {
        Py_XDECREF(hashes);
        return NULL;
    }
    RequestObject *req = (RequestObject *)held->request;
    int rc = cache_and_limit(self, held, num_tokens, &hashes);
    Py_XDECREF(hashes);
    if (rc < 0 || PyDict_SetItem(self->held, req->request_id, (PyObject *)held) < 0) {
        Py_DECREF(new_blocks);
        return NULL;
    }
    for (Py_ssize_t g = 0; g < self->num_groups; g++)
        if (PyList_GET_SIZE(PyTuple_GET_ITEM(new_blocks, g)))
            return hkv_new_blocks(self, new_blocks);
    Py_DECREF(new_blocks);
    return Py_NewRef(self->no_blocks);  /* no new block: the shared empty result */
}

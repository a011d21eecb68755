/* ManagerCore: a KVCacheManager's C backend (`manager._core`), whose
 * `allocate_slots` the manager binds as its own at construction. A request
 * the manager holds whose allocation changes nothing (a decode step inside
 * its block, under its fast-path limits) returns at C speed; other
 * allocations of held requests go to `allocate`, everything else to the
 * manager's checked path `_allocate_checked`.
 * mirrors hybridkv.kv_cache.fastpath.ManagerCore (the pure-Python reference) */
#include "_fastpath.h"

enum { ARG_REQUEST, ARG_NUM_NEW, ARG_NUM_COMPUTED, ARG_HIT, NUM_ARGS };

static const char *const arg_names[NUM_ARGS] = {
    "request", "num_new_tokens", "num_new_computed_tokens", "new_computed_blocks"};

/* Fills args[0..3] from a vectorcall (NULL where not given); -1 on a bad call. */
static int
parse_allocate_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                    PyObject **out)
{
    if (nargs > NUM_ARGS) {
        PyErr_Format(PyExc_TypeError, "allocate_slots() takes at most 4 arguments (%zd given)",
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < NUM_ARGS; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int i = 0; i < NUM_ARGS && slot < 0; i++)
            if (PyUnicode_CompareWithASCIIString(name, arg_names[i]) == 0)
                slot = i;
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError,
                         "allocate_slots() got an unexpected keyword argument %R", name);
            return -1;
        }
        if (out[slot] != NULL) {
            PyErr_Format(PyExc_TypeError, "allocate_slots() got multiple values for argument "
                         "'%s'", arg_names[slot]);
            return -1;
        }
        out[slot] = args[nargs + k];
    }
    for (int i = 0; i < 2; i++)
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "allocate_slots() missing required argument '%s'",
                         arg_names[i]);
            return -1;
        }
    return 0;
}

/* The request's Held when this manager holds it (borrowed), else NULL; -1 on error. */
int
hkv_held_entry(ManagerObject *self, RequestObject *req, HeldObject **out)
{
    *out = NULL;
    if (req->request_id == NULL)
        return 0;
    PyObject *held = PyDict_GetItemWithError(self->held, req->request_id);
    if (held == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (Py_IS_TYPE(held, &HKV_HeldType) && ((HeldObject *)held)->request == (PyObject *)req)
        *out = (HeldObject *)held;
    return 0;
}

/* `_allocate` of a request this manager holds: in C when every group is a
 * built-in type, else the Python reference `_allocate_py`. */
static PyObject *
call_allocate(ManagerObject *self, HeldObject *held, Py_ssize_t computed,
              Py_ssize_t num_tokens)
{
    if (self->native) {
        Py_INCREF(held);  /* borrowed from _held, and Python code (the policy) runs */
        PyObject *out = hkv_allocate(self, held, computed, num_tokens, NULL,
                                     computed > held->max_computed);
        Py_DECREF(held);
        return out;
    }
    PyObject *c = PyLong_FromSsize_t(computed);
    PyObject *t = PyLong_FromSsize_t(num_tokens);
    PyObject *out = NULL;
    if (c != NULL && t != NULL) {
        PyObject *releases = computed > held->max_computed ? Py_True : Py_False;
        PyObject *args[] = {self->owner, (PyObject *)held, c, t, Py_None, releases};
        out = PyObject_VectorcallMethod(hkv_names.allocate_py, args,
                                        6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_XDECREF(c);
    Py_XDECREF(t);
    return out;
}

static PyObject *
call_checked(ManagerObject *self, PyObject **a)
{
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return NULL;
    PyObject *args[] = {self->owner, a[ARG_REQUEST], a[ARG_NUM_NEW],
                        a[ARG_NUM_COMPUTED] ? a[ARG_NUM_COMPUTED] : zero,
                        a[ARG_HIT] ? a[ARG_HIT] : Py_None};
    PyObject *out = PyObject_VectorcallMethod(hkv_names.allocate_checked, args,
                                              5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(zero);
    return out;
}

/* The hit an admission adopts (a tuple of lists), when `blocks` is a
 * KVCacheBlocks covering num_computed tokens in every group; else NULL. */
static PyObject *
valid_hit(ManagerObject *self, PyObject *blocks, Py_ssize_t num_computed)
{
    if (blocks == NULL || !PyObject_TypeCheck(blocks, (PyTypeObject *)self->blocks_type))
        return NULL;
    PyObject *hit = ((BlocksObject *)blocks)->blocks;
    if (hit == NULL || !PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != self->num_groups)
        return NULL;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        PyObject *group = PyTuple_GET_ITEM(hit, g);
        if (!PyList_Check(group) ||
            PyList_GET_SIZE(group) * self->groups[g].block_size != num_computed)
            return NULL;
    }
    return hit;
}

/* The junction of a request not held: its last lookup's (0 if none); -1 if not an int. */
static Py_ssize_t
junction_of(ManagerObject *self, PyObject *req)
{
    PyObject *v = hkv_call(self->junctions, hkv_names.get,
                           (PyObject *[]){HKV_O(req), HKV_N(0)}, 2);
    if (v == NULL)
        return -2;
    Py_ssize_t junction = hkv_exact_index(v);
    Py_DECREF(v);
    return junction;
}

/* A request this manager does not hold yet: checked in C, allocated in C. The
 * checked path runs (and raises) for anything the checks would refuse. */
/* mirrors hybridkv.kv_cache.kv_cache_manager.KVCacheManager._allocate_checked */
static PyObject *
admit(ManagerObject *self, RequestObject *req, PyObject **a, Py_ssize_t n, Py_ssize_t nc,
      Py_ssize_t computed)
{
    if (nc > PY_SSIZE_T_MAX - computed - n ||
        computed + nc + n > PyList_GET_SIZE(req->all_token_ids) || (nc && computed))
        return call_checked(self, a);
    PyObject *hit = nc ? valid_hit(self, a[ARG_HIT], nc) : NULL;
    if (nc && hit == NULL)
        return call_checked(self, a);
    Py_ssize_t junction = junction_of(self, (PyObject *)req);
    if (junction < 0)
        return junction == -2 ? NULL : call_checked(self, a);
    HeldObject *held = (HeldObject *)HKV_HeldType.tp_alloc(&HKV_HeldType, 0);
    if (held == NULL)
        return NULL;
    held->request = Py_NewRef((PyObject *)req);
    held->junction = junction;
    PyObject *out = hkv_allocate(self, held, computed + nc, computed + nc + n, hit, 1);
    Py_DECREF(held);
    return out;
}

/* mirrors hybridkv.kv_cache.fastpath.ManagerCore.allocate_slots */
static PyObject *
manager_allocate_slots(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    PyObject *a[NUM_ARGS];
    if (parse_allocate_args(args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *request = a[ARG_REQUEST];
    if (self->owner == NULL)
        return hkv_unbound();
    if (self->request_type == NULL || self->held == NULL || !PyDict_Check(self->held) ||
        self->no_blocks == NULL || !PyObject_TypeCheck(request, (PyTypeObject *)self->request_type))
        return call_checked(self, a);
    RequestObject *req = (RequestObject *)request;
    Py_ssize_t n = hkv_exact_index(a[ARG_NUM_NEW]);
    Py_ssize_t nc = a[ARG_NUM_COMPUTED] ? hkv_exact_index(a[ARG_NUM_COMPUTED]) : 0;
    Py_ssize_t computed = req->num_computed_tokens ? hkv_exact_index(req->num_computed_tokens)
                                                   : -1;
    if (n < 0 || nc < 0 || computed < 0 || n > PY_SSIZE_T_MAX - computed ||
        req->request_id == NULL || req->all_token_ids == NULL ||
        !PyList_CheckExact(req->all_token_ids))
        return call_checked(self, a);
    PyObject *entry = PyDict_GetItemWithError(self->held, req->request_id);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return self->native ? admit(self, req, a, n, nc, computed) : call_checked(self, a);
    }
    if (nc || !Held_Check(entry) || ((HeldObject *)entry)->request != request)
        return call_checked(self, a);
    HeldObject *held = (HeldObject *)entry;
    Py_ssize_t num_tokens = computed + n;
    if (num_tokens > PyList_GET_SIZE(req->all_token_ids))
        return call_checked(self, a);
    if (num_tokens <= held->max_tokens && computed <= held->max_computed)
        return Py_NewRef(self->no_blocks);  /* an allocation that changes nothing */
    return call_allocate(self, held, computed, num_tokens);
}

PyDoc_STRVAR(allocate_slots_doc,
"allocate_slots(request, num_new_tokens, num_new_computed_tokens=0,\n"
"               new_computed_blocks=None) -> KVCacheBlocks | None\n"
"\n"
"Reserve slots for the next `num_new_tokens` tokens after the computed ones.\n"
"\n"
"`num_new_computed_tokens`/`new_computed_blocks` adopt a hit from\n"
"`get_computed_blocks` (for a request that holds no blocks). Returns the newly\n"
"allocated blocks per group, or None, with no state change at all, when the\n"
"pool can't supply them now: other requests hold blocks, wait for them (or\n"
"preempt one).\n"
"\n"
"Raises ValueError, changing nothing, for counts past the request's tokens, a\n"
"hit that does not match, or an allocation the pool could not supply even\n"
"with no other request holding blocks: waiting would never help (`can_fit`\n"
"tells beforehand whether a request fits at all).");

/* allocate(held, computed, num_tokens, hit, releases=True), called by the
 * manager's checked path: in C when every group is a built-in type, else the
 * manager's `_allocate_py`. */
/* mirrors hybridkv.kv_cache.kv_cache_manager.KVCacheManager._allocate_py */
static PyObject *
manager_allocate(ManagerObject *self, PyObject *args)
{
    PyObject *held, *hit;
    Py_ssize_t computed, num_tokens;
    int releases = 1;
    if (!PyArg_ParseTuple(args, "OnnO|p:allocate", &held, &computed, &num_tokens, &hit,
                          &releases))
        return NULL;
    if (self->owner == NULL)
        return hkv_unbound();
    int lists = hit == Py_None;
    if (PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == self->num_groups) {
        lists = 1;
        for (Py_ssize_t g = 0; g < self->num_groups; g++)
            lists &= PyList_Check(PyTuple_GET_ITEM(hit, g));
    }
    if (!self->native || !Held_Check(held) || !lists)
        return PyObject_CallMethodObjArgs(self->owner, hkv_names.allocate_py,
                                          PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1),
                                          PyTuple_GET_ITEM(args, 2), hit,
                                          releases ? Py_True : Py_False, NULL);
    return hkv_allocate(self, (HeldObject *)held, computed, num_tokens,
                        hit == Py_None ? NULL : hit, releases);
}

/* release(held): free after its checks: every group returns the request's blocks
 * (the manager's `_release_py` when a group is not a built-in type). */
/* mirrors hybridkv.kv_cache.kv_cache_manager.KVCacheManager._release_py */
static PyObject *
manager_release(ManagerObject *self, PyObject *held)
{
    if (self->owner == NULL)
        return hkv_unbound();
    if (!self->native || !Held_Check(held))
        return hkv_call_owner(self, hkv_names.free_py, held);
    HeldObject *h = (HeldObject *)held;
    RequestObject *req = (RequestObject *)h->request;
    if (!PyObject_TypeCheck(h->request, &HKV_RequestCoreType) || req->request_id == NULL)
        return hkv_call_owner(self, hkv_names.free_py, held);
    for (Py_ssize_t g = 0; g < self->num_groups; g++)
        if (hkv_group_free(&self->pool, &self->groups[g], h->request, h->junction) < 0)
            return NULL;
    if (PyDict_DelItem(self->held, req->request_id) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static void
unbind(ManagerObject *self)
{
    for (Py_ssize_t g = 0; g < self->num_groups; g++)
        hkv_group_clear(&self->groups[g]);
    PyMem_Free(self->groups);
    self->groups = NULL;
    self->num_groups = 0;
    self->native = 0;
    hkv_pool_clear(&self->pool);
}

static int
bind_groups(ManagerObject *self, PyObject *groups)
{
    Py_ssize_t n = PyList_GET_SIZE(groups);
    self->groups = PyMem_Calloc(n ? n : 1, sizeof(Group));
    if (self->groups == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->num_groups = n;
    int native = n > 0;
    for (Py_ssize_t g = 0; g < n; g++) {
        PyObject *item = PyList_GET_ITEM(groups, g);
        PyObject *manager;
        int kind;
        if (!PyArg_ParseTuple(item, "Oi:_bind group", &manager, &kind))
            return -1;
        kind = hkv_kind_label(kind);
        native &= kind != KIND_OTHER;
        if (kind != KIND_OTHER &&
            hkv_group_bind(&self->groups[g], manager, kind, self->pool.cached) < 0)
            return -1;
    }
    self->native = native;
    return 0;
}

/* The owner's state the C paths share (the same objects, never rebound). */
static int
bind_state(ManagerObject *self, PyObject *owner)
{
    static const char *const names[] = {"_held", "_no_blocks", "_junctions", "_stats",
                                         "hash_algo", "hash_block_size"};
    PyObject **slots[] = {&self->held, &self->no_blocks, &self->junctions, &self->stats,
                          &self->hash_algo, &self->hash_block_size};
    for (int i = 0; i < 6; i++) {
        PyObject *v = PyObject_GetAttrString(owner, names[i]);
        if (v == NULL)
            return -1;
        Py_XSETREF(*slots[i], v);
    }
    if (!PyDict_Check(self->held)) {
        PyErr_SetString(PyExc_TypeError, "bind: the manager's _held must be a dict");
        return -1;
    }
    Py_XSETREF(self->owner, Py_NewRef(owner));
    return 0;
}

/* bind(owner, request_type, blocks_type, pool, groups, alignment, caching) */
/* mirrors hybridkv.kv_cache.fastpath.ManagerCore.bind */
static PyObject *
manager_bind(ManagerObject *self, PyObject *args)
{
    PyObject *owner, *request_type, *blocks_type, *pool, *groups;
    Py_ssize_t alignment;
    int caching;
    if (!PyArg_ParseTuple(args, "OO!O!OO!np:bind", &owner, &PyType_Type, &request_type,
                          &PyType_Type, &blocks_type, &pool, &PyList_Type, &groups, &alignment,
                          &caching))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)request_type, &HKV_RequestCoreType) ||
        !PyType_IsSubtype((PyTypeObject *)blocks_type, &HKV_BlocksCoreType) || alignment < 1) {
        PyErr_SetString(PyExc_TypeError, "bind: the request type must subclass RequestCore, "
                        "the blocks type BlocksCore");
        return NULL;
    }
    if (!hkv_consts.configured) {
        PyErr_SetString(PyExc_RuntimeError, "bind: configure_constants was not called");
        return NULL;
    }
    unbind(self);
    if (bind_state(self, owner) < 0)
        return NULL;
    Py_XSETREF(self->request_type, Py_NewRef(request_type));
    Py_XSETREF(self->blocks_type, Py_NewRef(blocks_type));
    self->alignment = alignment;
    self->caching = caching;
    if (hkv_pool_bind(&self->pool, pool) < 0 || bind_groups(self, groups) < 0) {
        unbind(self);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
manager_native(ManagerObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->native);
}

static int
manager_traverse(ManagerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->owner);
    Py_VISIT(self->held);
    Py_VISIT(self->no_blocks);
    Py_VISIT(self->junctions);
    Py_VISIT(self->stats);
    Py_VISIT(self->hash_algo);
    Py_VISIT(self->hash_block_size);
    Py_VISIT(self->request_type);
    Py_VISIT(self->blocks_type);
    for (Py_ssize_t g = 0; g < self->num_groups; g++)
        if (hkv_group_traverse(&self->groups[g], visit, arg))
            return 1;
    return hkv_pool_traverse(&self->pool, visit, arg);
}

static int
manager_clear(ManagerObject *self)
{
    unbind(self);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->held);
    Py_CLEAR(self->no_blocks);
    Py_CLEAR(self->junctions);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->hash_algo);
    Py_CLEAR(self->hash_block_size);
    Py_CLEAR(self->request_type);
    Py_CLEAR(self->blocks_type);
    return 0;
}

static void
manager_dealloc(ManagerObject *self)
{
    PyObject_GC_UnTrack(self);
    manager_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef manager_methods[] = {
    {"allocate_slots", (PyCFunction)(void (*)(void))manager_allocate_slots,
     METH_FASTCALL | METH_KEYWORDS, allocate_slots_doc},
    {"allocate", (PyCFunction)manager_allocate, METH_VARARGS, NULL},
    {"lookup", (PyCFunction)hkv_manager_lookup, METH_O, NULL},
    {"release", (PyCFunction)manager_release, METH_O, NULL},
    {"bind", (PyCFunction)manager_bind, METH_VARARGS, NULL},
    {NULL},
};

static PyMemberDef manager_members[] = {
    {"owner", T_OBJECT, offsetof(ManagerObject, owner), READONLY, "the KVCacheManager"},
    {NULL},
};

static PyGetSetDef manager_getset[] = {
    {"native", (getter)manager_native, NULL, "whether the C paths serve every group", NULL},
    {NULL},
};

PyTypeObject HKV_ManagerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._fastpath.ManagerCore",
    .tp_basicsize = sizeof(ManagerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("A KVCacheManager's C backend (manager._core; see fastpath.py)."),
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)manager_dealloc,
    .tp_traverse = (traverseproc)manager_traverse,
    .tp_clear = (inquiry)manager_clear,
    .tp_methods = manager_methods,
    .tp_members = manager_members,
    .tp_getset = manager_getset,
};

/* ManagerCore: the base of KVCacheManager whose `allocate_slots` is a C
 * method. A request this manager holds whose allocation changes nothing (a
 * decode step inside its block, under its fast-path limits) returns at C
 * speed; other allocations of held requests go to `_allocate`, everything
 * else to the checked path `_allocate_checked`. `fastpath.ManagerCore` is
 * the pure-Python reference. */
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
static int
held_entry(ManagerObject *self, RequestObject *req, HeldObject **out)
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

static PyObject *
call_allocate(ManagerObject *self, HeldObject *held, Py_ssize_t computed,
              Py_ssize_t num_tokens)
{
    PyObject *c = PyLong_FromSsize_t(computed);
    PyObject *t = PyLong_FromSsize_t(num_tokens);
    PyObject *out = NULL;
    if (c != NULL && t != NULL) {
        PyObject *releases = computed > held->max_computed ? Py_True : Py_False;
        PyObject *args[] = {(PyObject *)self, (PyObject *)held, c, t, Py_None, releases};
        out = PyObject_VectorcallMethod(hkv_names.allocate, args,
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
    PyObject *args[] = {(PyObject *)self, a[ARG_REQUEST], a[ARG_NUM_NEW],
                        a[ARG_NUM_COMPUTED] ? a[ARG_NUM_COMPUTED] : zero,
                        a[ARG_HIT] ? a[ARG_HIT] : Py_None};
    PyObject *out = PyObject_VectorcallMethod(hkv_names.allocate_checked, args,
                                              5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(zero);
    return out;
}

static int
is_zero(PyObject *obj)
{
    return obj == NULL || hkv_exact_index(obj) == 0;
}

static PyObject *
manager_allocate_slots(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    PyObject *a[NUM_ARGS];
    if (parse_allocate_args(args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *request = a[ARG_REQUEST];
    if (self->request_type == NULL || self->held == NULL || !PyDict_Check(self->held) ||
        self->no_blocks == NULL || !is_zero(a[ARG_NUM_COMPUTED]) ||
        !PyObject_TypeCheck(request, (PyTypeObject *)self->request_type))
        return call_checked(self, a);
    RequestObject *req = (RequestObject *)request;
    HeldObject *held;
    if (held_entry(self, req, &held) < 0)
        return NULL;
    if (held == NULL || req->all_token_ids == NULL || !PyList_CheckExact(req->all_token_ids) ||
        req->num_computed_tokens == NULL)
        return call_checked(self, a);
    Py_ssize_t n = hkv_exact_index(a[ARG_NUM_NEW]);
    Py_ssize_t computed = hkv_exact_index(req->num_computed_tokens);
    if (n < 0 || computed < 0 || n > PY_SSIZE_T_MAX - computed)
        return call_checked(self, a);
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

static PyObject *
manager_bind(ManagerObject *self, PyObject *args)
{
    PyObject *request_type, *held_type;
    if (!PyArg_ParseTuple(args, "O!O!:_bind", &PyType_Type, &request_type, &PyType_Type,
                          &held_type))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)request_type, &HKV_RequestCoreType) ||
        (PyTypeObject *)held_type != &HKV_HeldType) {
        PyErr_SetString(PyExc_TypeError, "_bind: the request type must subclass RequestCore "
                        "and the held type be _fastpath.Held");
        return NULL;
    }
    Py_XSETREF(self->request_type, Py_NewRef(request_type));
    Py_XSETREF(self->held_type, Py_NewRef(held_type));
    Py_RETURN_NONE;
}

static int
manager_traverse(ManagerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->held);
    Py_VISIT(self->no_blocks);
    Py_VISIT(self->request_type);
    Py_VISIT(self->blocks_type);
    Py_VISIT(self->held_type);
    return 0;
}

static int
manager_clear(ManagerObject *self)
{
    Py_CLEAR(self->held);
    Py_CLEAR(self->no_blocks);
    Py_CLEAR(self->request_type);
    Py_CLEAR(self->blocks_type);
    Py_CLEAR(self->held_type);
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
    {"_bind", (PyCFunction)manager_bind, METH_VARARGS, NULL},
    {NULL},
};

static PyMemberDef manager_members[] = {
    {"_held", T_OBJECT_EX, offsetof(ManagerObject, held), 0, NULL},
    {"_no_blocks", T_OBJECT_EX, offsetof(ManagerObject, no_blocks), 0, NULL},
    {NULL},
};

PyTypeObject HKV_ManagerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv.kv_cache._fastpath.ManagerCore",
    .tp_basicsize = sizeof(ManagerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Base of KVCacheManager: allocate_slots (see fastpath.py)."),
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)manager_dealloc,
    .tp_traverse = (traverseproc)manager_traverse,
    .tp_clear = (inquiry)manager_clear,
    .tp_methods = manager_methods,
    .tp_members = manager_members,
};

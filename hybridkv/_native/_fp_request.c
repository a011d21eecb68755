/* RequestCore: the fields of hybridkv's Request the manager reads on every
 * call, appending a decoded token, and the block-hash lookup that is a no-op
 * until a block fills. Request (request.py) subclasses it and adds the
 * validation and the keys; `fastpath.RequestCore` is the pure-Python
 * reference. */
#include "_fastpath.h"

/* 1 when obj is an exact int in [0, max_token], else 0 (no error set). Callers
 * pass hkv_consts.max_token_id read once (a local: loops keep it in a register). */
static inline int
is_token(PyObject *obj, unsigned long max_token)
{
    if (!PyLong_CheckExact(obj))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)obj))
        return PyUnstable_Long_CompactValue((PyLongObject *)obj) >= 0 &&
               (unsigned long)PyUnstable_Long_CompactValue((PyLongObject *)obj) <= max_token;
#else
    if ((Py_SIZE(obj) == 0 || Py_SIZE(obj) == 1) &&  /* one 30-bit digit, non-negative */
        max_token >= (1UL << 30) - 1)
        return 1;
#endif
    unsigned long v = PyLong_AsUnsignedLong(obj);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return v <= max_token;
}

/* mirrors hybridkv.kv_cache.fastpath.RequestCore.append_output_token_ids */
static PyObject *
request_append(RequestObject *self, PyObject *token_ids)
{
    PyObject *tokens = self->all_token_ids;
    if (tokens != NULL && PyList_CheckExact(tokens)) {
        PyObject *token = NULL;
        if (PyList_CheckExact(token_ids) && PyList_GET_SIZE(token_ids) == 1)
            token = PyList_GET_ITEM(token_ids, 0);  /* one decoded token */
        else if (PyLong_CheckExact(token_ids))
            token = token_ids;
        if (token != NULL && is_token(token, hkv_consts.max_token_id)) {
            if (PyList_Append(tokens, token) < 0)
                return NULL;
            Py_RETURN_NONE;
        }
    }
    /* anything else: the checked path of the subclass */
    return PyObject_CallMethodOneArg((PyObject *)self, hkv_names.append_checked, token_ids);
}

PyDoc_STRVAR(request_append_doc,
"append_output_token_ids(token_ids)\n"
"\n"
"Append generated token(s); their blocks are hashed when they fill.\n"
"\n"
"Raises ValueError (appending nothing) for ids not in [0, 2**32).");

/* A copy of `prompt` (a list or tuple) when every item is a token id; else NULL. */
static PyObject *
copy_tokens(PyObject *prompt)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(prompt);
    PyObject **items = PySequence_Fast_ITEMS(prompt);
    PyObject *copy = PyList_New(n);
    unsigned long max_token = hkv_consts.max_token_id;
    for (Py_ssize_t i = 0; copy != NULL && i < n; i++) {
        if (!is_token(items[i], max_token)) {
            Py_CLEAR(copy);
            break;
        }
        PyList_SET_ITEM(copy, i, Py_NewRef(items[i]));
    }
    return copy;
}

/* Request(request_id, prompt_token_ids) with a non-empty str id and a non-empty
 * list or tuple of token ids, no keys: set here. 1 done, 0 not this case, -1 error. */
static int
init_plain(RequestObject *self, PyObject *args, PyObject *kwds)
{
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) || PyTuple_GET_SIZE(args) != 2)
        return 0;
    PyObject *rid = PyTuple_GET_ITEM(args, 0), *prompt = PyTuple_GET_ITEM(args, 1);
    if (!PyUnicode_CheckExact(rid) || PyUnicode_GET_LENGTH(rid) == 0 ||
        !(PyList_CheckExact(prompt) || PyTuple_CheckExact(prompt)) ||
        PySequence_Fast_GET_SIZE(prompt) == 0)
        return 0;
    PyObject *tokens = copy_tokens(prompt);
    if (tokens == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *size = PyLong_FromSsize_t(PyList_GET_SIZE(tokens)), *zero = PyLong_FromLong(0);
    PyObject *empty = PyTuple_New(0);
    if (size == NULL || zero == NULL || empty == NULL) {
        Py_DECREF(tokens);
        Py_XDECREF(size);
        Py_XDECREF(zero);
        Py_XDECREF(empty);
        return -1;
    }
    Py_XSETREF(self->all_token_ids, tokens);
    Py_XSETREF(self->request_id, Py_NewRef(rid));
    Py_XSETREF(self->num_prompt_tokens, size);
    Py_XSETREF(self->num_computed_tokens, zero);
    Py_XSETREF(self->hasher, Py_NewRef(Py_None));
    int rc = PyObject_SetAttr((PyObject *)self, hkv_names.cache_salt, Py_None) < 0 ||
             PyObject_SetAttr((PyObject *)self, hkv_names.lora_name, Py_None) < 0 ||
             PyObject_SetAttr((PyObject *)self, hkv_names.mm_hashes, empty) < 0 ||
             PyObject_SetAttr((PyObject *)self, hkv_names.max_tokens, Py_None) < 0 ? -1 : 1;
    Py_DECREF(empty);
    return rc;
}

/* mirrors hybridkv.kv_cache.request.Request._init_checked */
static int
request_init(RequestObject *self, PyObject *args, PyObject *kwds)
{
    int rc = init_plain(self, args, kwds);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    PyObject *init = PyObject_GetAttr((PyObject *)self, hkv_names.init_checked);
    if (init == NULL)
        return -1;
    PyObject *out = PyObject_Call(init, args, kwds);
    Py_DECREF(init);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

static PyObject *
request_num_tokens(RequestObject *self, void *Py_UNUSED(closure))
{
    if (self->all_token_ids == NULL) {
        PyErr_SetString(PyExc_AttributeError, "all_token_ids");
        return NULL;
    }
    Py_ssize_t n = PyObject_Size(self->all_token_ids);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static int
request_traverse(RequestObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->request_id);
    Py_VISIT(self->all_token_ids);
    Py_VISIT(self->num_computed_tokens);
    Py_VISIT(self->num_prompt_tokens);
    Py_VISIT(self->hasher);
    return 0;
}

static int
request_clear(RequestObject *self)
{
    Py_CLEAR(self->request_id);
    Py_CLEAR(self->all_token_ids);
    Py_CLEAR(self->num_computed_tokens);
    Py_CLEAR(self->num_prompt_tokens);
    Py_CLEAR(self->hasher);
    return 0;
}

static void
request_dealloc(RequestObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    request_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef request_methods[] = {
    {"append_output_token_ids", (PyCFunction)request_append, METH_O, request_append_doc},
    {NULL},
};

static PyGetSetDef request_getset[] = {
    {"num_tokens", (getter)request_num_tokens, NULL, NULL, NULL},
    {NULL},
};

static PyMemberDef request_members[] = {
    {"request_id", T_OBJECT_EX, offsetof(RequestObject, request_id), 0, NULL},
    {"all_token_ids", T_OBJECT_EX, offsetof(RequestObject, all_token_ids), 0, NULL},
    {"num_computed_tokens", T_OBJECT_EX, offsetof(RequestObject, num_computed_tokens), 0, NULL},
    {"num_prompt_tokens", T_OBJECT_EX, offsetof(RequestObject, num_prompt_tokens), 0, NULL},
    {"hasher", T_OBJECT_EX, offsetof(RequestObject, hasher), 0, NULL},
    {NULL},
};

PyTypeObject HKV_RequestCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._fastpath.RequestCore",
    .tp_basicsize = sizeof(RequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Base of Request: its token ids and progress (see fastpath.py)."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)request_init,
    .tp_dealloc = (destructor)request_dealloc,
    .tp_traverse = (traverseproc)request_traverse,
    .tp_clear = (inquiry)request_clear,
    .tp_methods = request_methods,
    .tp_getset = request_getset,
    .tp_members = request_members,
    .tp_weaklistoffset = offsetof(RequestObject, weakreflist),
};

/* Small record types: Block, Held (a request holding blocks), and the base of
 * KVCacheBlocks. Python reads and writes their fields as attributes, exactly
 * like the pure-Python classes they replace; C reads them as struct fields. */
#include "_fastpath.h"

PyObject *hkv_normal_value = NULL;

/* ---- Block ------------------------------------------------------------------ */

static PyObject *
block_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    BlockObject *self = (BlockObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->block_id = PyLong_FromLong(0);
    self->block_hash = Py_NewRef(Py_None);
    self->group_id = PyLong_FromLong(-1);
    self->value_hint = Py_NewRef(hkv_normal_value ? hkv_normal_value : Py_None);
    self->queue_slot = PyLong_FromLong(-1);
    return (PyObject *)self;
}

static int
block_init(BlockObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"block_id", NULL};
    PyObject *block_id;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Block", kwlist, &block_id))
        return -1;
    Py_XSETREF(self->block_id, Py_NewRef(block_id));
    return 0;
}

static void
block_dealloc(BlockObject *self)
{
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_XDECREF(self->block_id);
    Py_XDECREF(self->block_hash);
    Py_XDECREF(self->group_id);
    Py_XDECREF(self->value_hint);
    Py_XDECREF(self->queue_slot);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
block_repr(BlockObject *self)
{
    PyObject *h = Py_NewRef(Py_None);
    int truthy = self->block_hash ? PyObject_IsTrue(self->block_hash) : 0;
    if (truthy < 0) {
        Py_DECREF(h);
        return NULL;
    }
    if (truthy) {
        PyObject *hex = PyObject_CallMethod(self->block_hash, "hex", NULL);
        Py_DECREF(h);
        if (hex == NULL)
            return NULL;
        h = PyUnicode_Substring(hex, 0, 8);
        Py_DECREF(hex);
        if (h == NULL)
            return NULL;
    }
    PyObject *out = PyUnicode_FromFormat("Block(%S, ref=%zd, hash=%S)", self->block_id,
                                         self->ref_cnt, h);
    Py_DECREF(h);
    return out;
}

static PyMemberDef block_members[] = {
    {"block_id", T_OBJECT_EX, offsetof(BlockObject, block_id), 0, NULL},
    {"ref_cnt", T_PYSSIZET, offsetof(BlockObject, ref_cnt), 0, NULL},
    {"block_hash", T_OBJECT_EX, offsetof(BlockObject, block_hash), 0, NULL},
    {"group_id", T_OBJECT_EX, offsetof(BlockObject, group_id), 0, NULL},
    {"num_hits", T_PYSSIZET, offsetof(BlockObject, num_hits), 0, NULL},
    {"num_children", T_PYSSIZET, offsetof(BlockObject, num_children), 0, NULL},
    {"value_hint", T_OBJECT_EX, offsetof(BlockObject, value_hint), 0, NULL},
    {"queue_slot", T_OBJECT_EX, offsetof(BlockObject, queue_slot), 0, NULL},
    {NULL},
};

PyTypeObject HKV_BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv.kv_cache.block_pool.Block",
    .tp_basicsize = sizeof(BlockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = PyDoc_STR("One block record. `block_hash`/`group_id` are set while it caches "
                        "data."),
    .tp_new = block_new,
    .tp_init = (initproc)block_init,
    .tp_dealloc = (destructor)block_dealloc,
    .tp_repr = (reprfunc)block_repr,
    .tp_members = block_members,
    .tp_weaklistoffset = offsetof(BlockObject, weakreflist),
};

/* ---- Held --------------------------------------------------------------------- */

static int
held_init(HeldObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"request", "junction", NULL};
    PyObject *request;
    Py_ssize_t junction;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On:_Held", kwlist, &request, &junction))
        return -1;
    Py_XSETREF(self->request, Py_NewRef(request));
    self->junction = junction;
    self->max_tokens = 0;
    self->max_computed = 0;
    return 0;
}

static int
held_traverse(HeldObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->request);
    return 0;
}

static int
held_clear(HeldObject *self)
{
    Py_CLEAR(self->request);
    return 0;
}

static void
held_dealloc(HeldObject *self)
{
    PyObject_GC_UnTrack(self);
    held_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef held_members[] = {
    {"request", T_OBJECT_EX, offsetof(HeldObject, request), 0, NULL},
    {"junction", T_PYSSIZET, offsetof(HeldObject, junction), 0, NULL},
    {"max_tokens", T_PYSSIZET, offsetof(HeldObject, max_tokens), 0, NULL},
    {"max_computed", T_PYSSIZET, offsetof(HeldObject, max_computed), 0, NULL},
    {NULL},
};

PyTypeObject HKV_HeldType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv.kv_cache.kv_cache_manager._Held",
    .tp_basicsize = sizeof(HeldObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("A request holding blocks, as the manager tracks it (see "
                        "kv_cache_manager._Held)."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)held_init,
    .tp_dealloc = (destructor)held_dealloc,
    .tp_traverse = (traverseproc)held_traverse,
    .tp_clear = (inquiry)held_clear,
    .tp_members = held_members,
};

/* ---- KVCacheBlocks' base ---------------------------------------------------------- */

static int
blocks_init(BlocksObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"blocks", NULL};
    PyObject *blocks;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:KVCacheBlocks", kwlist, &blocks))
        return -1;
    Py_XSETREF(self->blocks, Py_NewRef(blocks));
    return 0;
}

static int
blocks_traverse(BlocksObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->blocks);
    return 0;
}

static int
blocks_clear(BlocksObject *self)
{
    Py_CLEAR(self->blocks);
    return 0;
}

static void
blocks_dealloc(BlocksObject *self)
{
    PyObject_GC_UnTrack(self);
    blocks_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef blocks_members[] = {
    {"blocks", T_OBJECT_EX, offsetof(BlocksObject, blocks), 0, NULL},
    {NULL},
};

PyTypeObject HKV_BlocksCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._fastpath.BlocksCore",
    .tp_basicsize = sizeof(BlocksObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Base of KVCacheBlocks: `blocks`, one list per group."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)blocks_init,
    .tp_dealloc = (destructor)blocks_dealloc,
    .tp_traverse = (traverseproc)blocks_traverse,
    .tp_clear = (inquiry)blocks_clear,
    .tp_members = blocks_members,
};

/* Binding a manager's C view: the pool's objects and one Group per KV cache
 * group, read once from the Python objects (none of them is ever rebound:
 * the views share the dicts and lists the Python code mutates). */
#include "_fastpath.h"

/* obj.name as a new reference that must be an instance of `type` (or any
 * type when NULL); -1 with an error otherwise. */
static int
get_typed(PyObject *obj, PyObject *name, PyTypeObject *type, PyObject **out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    if (type != NULL && !PyObject_TypeCheck(v, type)) {
        PyErr_Format(PyExc_TypeError, "_bind: %R must be a %s", name, type->tp_name);
        Py_DECREF(v);
        return -1;
    }
    Py_XSETREF(*out, v);
    return 0;
}

static int
get_size(PyObject *obj, PyObject *name, Py_ssize_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int
get_flag(PyObject *obj, PyObject *name, int *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyObject_IsTrue(v);
    Py_DECREF(v);
    return *out < 0 ? -1 : 0;
}

/* whether manager.<name> is set (not None) */
static int
has_component(PyObject *manager, PyObject *name, int *out)
{
    PyObject *v = PyObject_GetAttr(manager, name);
    if (v == NULL)
        return -1;
    *out = v != Py_None;
    Py_DECREF(v);
    return 0;
}

static int
bind_spec(Group *g, PyObject *manager)
{
    PyObject *spec = PyObject_GetAttr(manager, hkv_names.spec);
    int rc = spec == NULL ? -1 : 0;
    if (rc == 0 && g->kind == KIND_SLIDING)
        rc = get_size(spec, hkv_names.sliding_window, &g->window) < 0 ||
             get_size(spec, hkv_names.num_window_blocks, &g->window_blocks) < 0 ? -1 : 0;
    if (rc == 0 && g->kind == KIND_CHUNKED)
        rc = get_size(spec, hkv_names.attention_chunk_size, &g->chunk);
    if (rc == 0 && g->kind == KIND_MAMBA)
        rc = get_size(spec, hkv_names.checkpoint_interval, &g->every);
    Py_XDECREF(spec);
    return rc;
}

int
hkv_group_bind(Group *g, PyObject *manager, int kind, PyObject *pool_cached)
{
    g->kind = kind;
    g->manager = Py_NewRef(manager);
    g->rates = kind == KIND_SLIDING || kind == KIND_MAMBA;  /* the others' is the base no-op */
    if (get_size(manager, hkv_names.group_id, &g->group_id) < 0 ||
        get_size(manager, hkv_names.block_size, &g->block_size) < 0 ||
        get_size(manager, hkv_names.stride, &g->stride) < 0 ||
        get_size(manager, hkv_names.num_kept_head_blocks, &g->kept_head) < 0 ||
        get_flag(manager, hkv_names.enable_caching, &g->caching) < 0 ||
        get_flag(manager, hkv_names.skips, &g->skips) < 0 ||
        get_flag(manager, hkv_names.shares, &g->shares) < 0 ||
        has_component(manager, hkv_names.retention, &g->retains) < 0 ||
        has_component(manager, hkv_names.protection, &g->protects) < 0 ||
        get_typed(manager, hkv_names.req_to_blocks, &PyDict_Type, &g->req_to_blocks) < 0 ||
        get_typed(manager, hkv_names.num_cached_blocks, &PyDict_Type,
                  &g->num_cached_blocks) < 0 ||
        get_typed(manager, hkv_names.num_skipped, &PyDict_Type, &g->num_skipped) < 0 ||
        bind_spec(g, manager) < 0)
        return -1;
    if (g->block_size < 1 || g->stride < 1 || g->group_id < 0 ||
        g->group_id >= PyList_GET_SIZE(pool_cached) || (kind == KIND_CHUNKED && g->chunk < 1) ||
        (kind == KIND_MAMBA && g->every < 1)) {
        PyErr_SetString(PyExc_ValueError, "_bind: a group's sizes are out of range");
        return -1;
    }
    PyObject *table = PyList_GET_ITEM(pool_cached, g->group_id);
    if (!PyDict_CheckExact(table)) {
        PyErr_SetString(PyExc_TypeError, "_bind: the pool's hash maps must be dicts");
        return -1;
    }
    g->table = Py_NewRef(table);
    return 0;
}

void
hkv_group_clear(Group *g)
{
    Py_CLEAR(g->manager);
    Py_CLEAR(g->req_to_blocks);
    Py_CLEAR(g->num_cached_blocks);
    Py_CLEAR(g->num_skipped);
    Py_CLEAR(g->table);
}

int
hkv_pool_bind(Pool *p, PyObject *pool)
{
    p->pool = Py_NewRef(pool);
    if (get_typed(pool, hkv_names.free_queue, NULL, &p->free_queue) < 0 ||
        get_typed(pool, hkv_names.null_block, &HKV_BlockType, &p->null_block) < 0 ||
        get_typed(pool, hkv_names.cached, &PyList_Type, &p->cached) < 0 ||
        get_typed(pool, hkv_names.subscribers, &PyList_Type, &p->subscribers) < 0 ||
        get_typed(pool, hkv_names.evict_listeners, &PyList_Type, &p->evict_listeners) < 0 ||
        get_typed(pool, hkv_names.stale_listeners, &PyList_Type, &p->stale_listeners) < 0 ||
        get_typed(pool, hkv_names.group_evictions, &PyList_Type, &p->group_evictions) < 0 ||
        get_typed(p->free_queue, hkv_names.evicted, NULL, &p->evicted) < 0 ||
        get_flag(p->free_queue, hkv_names.uses_hints, &p->uses_hints) < 0)
        return -1;
    return 0;
}

void
hkv_pool_clear(Pool *p)
{
    Py_CLEAR(p->pool);
    Py_CLEAR(p->free_queue);
    Py_CLEAR(p->null_block);
    Py_CLEAR(p->cached);
    Py_CLEAR(p->subscribers);
    Py_CLEAR(p->evict_listeners);
    Py_CLEAR(p->stale_listeners);
    Py_CLEAR(p->group_evictions);
    Py_CLEAR(p->evicted);
}

int
hkv_pool_traverse(Pool *p, visitproc visit, void *arg)
{
    Py_VISIT(p->pool);
    Py_VISIT(p->free_queue);
    Py_VISIT(p->null_block);
    Py_VISIT(p->cached);
    Py_VISIT(p->subscribers);
    Py_VISIT(p->evict_listeners);
    Py_VISIT(p->stale_listeners);
    Py_VISIT(p->group_evictions);
    Py_VISIT(p->evicted);
    return 0;
}

int
hkv_group_traverse(Group *g, visitproc visit, void *arg)
{
    Py_VISIT(g->manager);
    Py_VISIT(g->req_to_blocks);
    Py_VISIT(g->num_cached_blocks);
    Py_VISIT(g->num_skipped);
    Py_VISIT(g->table);
    return 0;
}

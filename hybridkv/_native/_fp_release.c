/* Blocks going back to the pool: those a request no longer needs
 * (SingleTypeManager.remove_skipped_blocks) and all of them when it ends
 * (SingleTypeManager.free). The mechanics are here; the type's rules (its
 * ratings, protection and retention) are the manager's Python methods,
 * called only when there is something to release. */
#include "_fastpath.h"

/* obj.<name> for a component of the manager (a new reference). */
static PyObject *
component(Group *g, PyObject *name)
{
    return PyObject_GetAttr(g->manager, name);
}

static int
call_rule(PyObject *obj, PyObject *name, PyObject **args, Py_ssize_t nargs)
{
    PyObject *out = hkv_call(obj, name, args, nargs);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

/* blocks[start:end] without the null block, last first (a new list). */
static PyObject *
non_null_reversed(PyObject *blocks, Py_ssize_t start, Py_ssize_t end, PyObject *null)
{
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = end - 1; out != NULL && i >= start; i--) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        if (b != null && PyList_Append(out, b) < 0)
            Py_CLEAR(out);
    }
    return out;
}

/* The retention rule's split of blocks[start:end]: keeps the retained ones for
 * the request, returns the released ones last first (a new list). */
/* mirrors hybridkv.kv_cache.managers.mamba.MambaManager.split_skipped */
static PyObject *
split_retained(Group *g, PyObject *req, Py_ssize_t junction, PyObject *blocks,
               Py_ssize_t start, Py_ssize_t end)
{
    PyObject *retention = component(g, hkv_names.retention), *out = NULL;
    if (retention == NULL)
        return NULL;
    PyObject *split = hkv_call(retention, hkv_names.split,
                               (PyObject *[]){HKV_O(req), HKV_N(junction), HKV_O(blocks),
                                              HKV_N(start), HKV_N(end)}, 5);
    if (split == NULL)
        goto done;
    if (!PyTuple_Check(split) || PyTuple_GET_SIZE(split) != 2 ||
        !PyList_Check(PyTuple_GET_ITEM(split, 0)) || !PyList_Check(PyTuple_GET_ITEM(split, 1))) {
        PyErr_SetString(PyExc_TypeError, "a retention rule must return two lists");
        goto done;
    }
    PyObject *released = PyTuple_GET_ITEM(split, 0), *retained = PyTuple_GET_ITEM(split, 1);
    if (PyList_GET_SIZE(retained) &&
        call_rule(retention, hkv_names.keep, (PyObject *[]){HKV_O(RID(req)), HKV_O(retained)},
                  2) < 0)
        goto done;
    out = non_null_reversed(released, 0, PyList_GET_SIZE(released), NULL);
done:
    Py_XDECREF(split);
    Py_DECREF(retention);
    return out;
}

/* remove_skipped_blocks: rate, protect and split blocks[start:end] by the type's
 * rules, null their positions, release the rest tail first. */
static int
release_skipped(Pool *pool, Group *g, PyObject *req, Py_ssize_t junction, PyObject *blocks,
                Py_ssize_t start, Py_ssize_t end)
{
    if (g->rates &&
        call_rule(g->manager, hkv_names.rate_released,
                  (PyObject *[]){HKV_O(req), HKV_N(junction), HKV_O(blocks), HKV_N(start),
                                 HKV_N(end)}, 5) < 0)
        return -1;
    if (g->protects) {
        PyObject *protection = component(g, hkv_names.protection);
        int rc = protection == NULL ? -1 : call_rule(
            protection, hkv_names.protect,
            (PyObject *[]){HKV_O(req), HKV_N(junction), HKV_O(blocks), HKV_N(start),
                           HKV_N(end), HKV_O(pool->null_block)}, 6);
        Py_XDECREF(protection);
        if (rc < 0)
            return -1;
    }
    PyObject *released = g->retains ? split_retained(g, req, junction, blocks, start, end)
                                    : non_null_reversed(blocks, start, end, pool->null_block);
    if (released == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = start; rc == 0 && i < end; i++)
        rc = PyList_SetItem(blocks, i, Py_NewRef(pool->null_block));
    if (rc == 0)
        rc = dict_set_count(g->num_skipped, RID(req), end);
    if (rc == 0)
        rc = hkv_pool_free(pool, released, NULL);
    Py_DECREF(released);
    return rc;
}

/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.remove_skipped_blocks */
int
hkv_group_release_skipped(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed,
                          Py_ssize_t junction)
{
    if (!g->skips)
        return 0;
    PyObject *blocks = blocks_of(g, req);
    if (blocks == NULL || PyList_GET_SIZE(blocks) == 0)
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t start, end;
    int any = skip_range(g, req, blocks, computed, &start, &end);
    if (any <= 0)
        return any;
    Py_INCREF(blocks);  /* the rules run Python code */
    int rc = release_skipped(pool, g, req, junction, blocks, start, end);
    Py_DECREF(blocks);
    return rc;
}

/* d.pop(key, None) as a new reference (NULL: absent, or an error). */
static PyObject *
dict_pop(PyObject *d, PyObject *key)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL)
        return NULL;
    Py_INCREF(v);
    if (PyDict_DelItem(d, key) < 0)
        Py_CLEAR(v);
    return v;
}

static PyObject *
call_component(Group *g, PyObject *name, PyObject *method, PyObject *arg)
{
    PyObject *component = PyObject_GetAttr(g->manager, name);
    if (component == NULL)
        return NULL;
    PyObject *out = PyObject_CallMethodOneArg(component, method, arg);
    Py_DECREF(component);
    if (out != NULL && !PyList_Check(out)) {
        Py_DECREF(out);
        PyErr_Format(PyExc_TypeError, "%U() must return a list", method);
        return NULL;
    }
    return out;
}

static inline int
non_empty(PyObject *list)
{
    return list != NULL && PyList_GET_SIZE(list) > 0;
}

/* The release order of free: the request's blocks tail first, then the retained ones. */
static PyObject *
release_order(PyObject *blocks, PyObject *retained)
{
    PyObject *order = PyList_New(0);
    PyObject *parts[2] = {blocks, retained};
    for (int p = 0; p < 2 && order != NULL; p++) {
        PyObject *part = parts[p];
        for (Py_ssize_t i = part ? PyList_GET_SIZE(part) - 1 : -1; i >= 0; i--)
            if (PyList_Append(order, PyList_GET_ITEM(part, i)) < 0) {
                Py_CLEAR(order);
                break;
            }
    }
    return order;
}

/* SingleTypeManager.free: return all the request's blocks, tail first, then
 * the retained ones; the type's rules rate them and give back protection. */
/* mirrors hybridkv.kv_cache.managers.base.SingleTypeManager.free */
int
hkv_group_free(Pool *pool, Group *g, PyObject *req, Py_ssize_t junction)
{
    PyObject *rid = RID(req), *retained = NULL, *requeue = NULL, *order = NULL;
    int rc = -1;
    PyObject *blocks = dict_pop(g->req_to_blocks, rid);
    if (PyErr_Occurred())
        goto done;
    PyObject *cached = dict_pop(g->num_cached_blocks, rid);
    Py_XDECREF(cached);
    if (PyErr_Occurred())
        goto done;
    if (blocks != NULL && !PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "a request's blocks must be a list");
        goto done;
    }
    if ((g->retains && !(retained = call_component(g, hkv_names.retention, hkv_names.pop, rid))) ||
        (g->protects && !(requeue = call_component(g, hkv_names.protection, hkv_names.unprotect, rid))))
        goto done;
    if (non_empty(blocks) && g->rates) {
        PyObject *out = hkv_call(g->manager, hkv_names.rate_released,
                                 (PyObject *[]){HKV_O(req), HKV_N(junction), HKV_O(blocks),
                                                HKV_N(0), HKV_N(PyList_GET_SIZE(blocks))}, 5);
        if (out == NULL)
            goto done;
        Py_DECREF(out);
    }
    if (non_empty(blocks) || non_empty(retained) || non_empty(requeue)) {
        order = release_order(blocks, retained);
        if (order == NULL || hkv_pool_free(pool, order, requeue) < 0)
            goto done;
    }
    PyObject *skipped = dict_pop(g->num_skipped, rid);
    Py_XDECREF(skipped);
    rc = PyErr_Occurred() ? -1 : 0;
done:
    Py_XDECREF(blocks);
    Py_XDECREF(retained);
    Py_XDECREF(requeue);
    Py_XDECREF(order);
    return rc;
}

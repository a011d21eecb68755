/* Module hybridkv._native._fastpath: the types and `configure`. */
#include "_fastpath.h"

Names hkv_names;
Constants hkv_consts;

#define INTERN(field, text)                                   \
    do {                                                      \
        hkv_names.field = PyUnicode_InternFromString(text);   \
        if (hkv_names.field == NULL)                          \
            return -1;                                        \
    } while (0)

int
hkv_init_names(void)
{
    INTERN(allocate, "_allocate");
    INTERN(allocate_checked, "_allocate_checked");
    INTERN(take, "take");
    INTERN(add_free, "add_free");
    INTERN(remove_blocks, "remove_blocks");
    INTERN(remove_skipped_blocks, "remove_skipped_blocks");
    INTERN(rate_released, "rate_released");
    INTERN(block_hashes, "block_hashes");
    INTERN(extend, "extend");
    INTERN(make_room, "_make_room");
    INTERN(note_recompute, "_note_recompute");
    INTERN(hint_changed, "hint_changed");
    INTERN(recomputed, "recomputed");
    INTERN(retention, "retention");
    INTERN(protection, "protection");
    INTERN(split, "split");
    INTERN(keep, "keep");
    INTERN(pop, "pop");
    INTERN(unprotect, "unprotect");
    INTERN(get_new_blocks, "get_new_blocks");
    INTERN(cache_blocks, "cache_blocks");
    INTERN(free_blocks, "free_blocks");
    INTERN(touch, "touch");
    INTERN(allocate_py, "_allocate_py");
    INTERN(lookup_py, "_lookup_py");
    INTERN(free_py, "_release_py");
    INTERN(note_repeated_miss, "_note_repeated_miss");
    INTERN(prune_junctions, "_prune_junctions");
    INTERN(requests, "requests");
    INTERN(queries, "queries");
    INTERN(hits, "hits");
    INTERN(stranded_tokens, "stranded_tokens");
    INTERN(group_hits, "group_hits");
    INTERN(num_evictions, "num_evictions");
    INTERN(hash_algo, "hash_algo");
    INTERN(block_size, "block_size");
    INTERN(hashes, "hashes");
    INTERN(num_computed_tokens, "num_computed_tokens");
    INTERN(group_id, "group_id");
    INTERN(stride, "stride");
    INTERN(num_kept_head_blocks, "num_kept_head_blocks");
    INTERN(enable_caching, "enable_caching");
    INTERN(req_to_blocks, "req_to_blocks");
    INTERN(num_cached_blocks, "num_cached_blocks");
    INTERN(num_skipped, "num_skipped");
    INTERN(skips, "skips");
    INTERN(shares, "shares");
    INTERN(spec, "spec");
    INTERN(sliding_window, "sliding_window");
    INTERN(num_window_blocks, "num_window_blocks");
    INTERN(attention_chunk_size, "attention_chunk_size");
    INTERN(checkpoint_interval, "checkpoint_interval");
    INTERN(free_queue, "free_queue");
    INTERN(null_block, "null_block");
    INTERN(cached, "cached");
    INTERN(group_evictions, "group_evictions");
    INTERN(uses_hints, "uses_hints");
    INTERN(evicted, "evicted");
    INTERN(h_mm, "_mm");
    INTERN(get, "get");
    INTERN(protect, "protect");
    INTERN(init_checked, "_init_checked");
    INTERN(cache_salt, "cache_salt");
    INTERN(lora_name, "lora_name");
    INTERN(mm_hashes, "mm_hashes");
    INTERN(max_tokens, "max_tokens");
    INTERN(hex, "hex");
    INTERN(append_checked, "_append_checked");
    INTERN(h_salt, "_salt");
    INTERN(h_lora, "_lora");
    INTERN(subscribers, "_subscribers");
    INTERN(evict_listeners, "_evict_listeners");
    INTERN(filter_evicted, "_filter_evicted");
    INTERN(stale_listeners, "_stale_listeners");
    return 0;
}

static PyObject *
configure(PyObject *Py_UNUSED(module), PyObject *normal_value)
{
    Py_XSETREF(hkv_normal_value, Py_NewRef(normal_value));
    Py_RETURN_NONE;
}

/* An int item of the constants dict; -1 with an error when missing or not an int. */
static int
constant(PyObject *consts, const char *name, long *out)
{
    PyObject *v = PyDict_GetItemString(consts, name);
    if (v == NULL || !PyLong_Check(v)) {
        PyErr_Format(PyExc_ValueError, "configure_constants: %s must be an int", name);
        return -1;
    }
    *out = PyLong_AsLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
configure_constants(PyObject *Py_UNUSED(module), PyObject *consts)
{
    static const char *const kind_names[NUM_KINDS] = {
        "KIND_OTHER", "KIND_FULL", "KIND_SLIDING", "KIND_CHUNKED", "KIND_MAMBA"};
    Constants c = {0};
    long unlimited, max_token;
    if (!PyDict_Check(consts)) {
        PyErr_SetString(PyExc_TypeError, "configure_constants: expected a dict");
        return NULL;
    }
    for (int k = 0; k < NUM_KINDS; k++)
        if (constant(consts, kind_names[k], &c.kinds[k]) < 0)
            return NULL;
    if (constant(consts, "UNLIMITED", &unlimited) < 0 ||
        constant(consts, "MAX_TOKEN_ID", &max_token) < 0)
        return NULL;
    for (int k = 0; k < NUM_KINDS; k++)
        for (int j = 0; j < k; j++)
            if (c.kinds[j] == c.kinds[k]) {
                PyErr_SetString(PyExc_ValueError, "configure_constants: kinds must differ");
                return NULL;
            }
    if (unlimited < 1 || max_token < 0 || (unsigned long)max_token > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_ValueError, "configure_constants: UNLIMITED must be positive, "
                        "MAX_TOKEN_ID fit the 32 bits a token is hashed with");
        return NULL;
    }
    c.unlimited = (Py_ssize_t)unlimited;
    c.max_token_id = (unsigned long)max_token;
    c.configured = 1;
    hkv_consts = c;
    Py_RETURN_NONE;
}

int
hkv_kind_label(long python_kind)
{
    for (int k = 0; k < NUM_KINDS; k++)
        if (hkv_consts.kinds[k] == python_kind)
            return k;
    return KIND_OTHER;
}

PyDoc_STRVAR(configure_constants_doc,
"configure_constants(constants)\n"
"\n"
"The constants the C paths share with Python, from their one source\n"
"(fastpath.py calls it on import): KIND_OTHER .. KIND_MAMBA, UNLIMITED,\n"
"MAX_TOKEN_ID.");

PyDoc_STRVAR(configure_doc,
"configure(normal_value)\n"
"\n"
"The rating new Block records start with (eviction.NORMAL_VALUE); block_pool\n"
"calls it once on import.");

PyDoc_STRVAR(configure_hashing_doc,
"configure_hashing(BlockHasher, chain, algo_ids, seeds)\n"
"\n"
"What extending a request's hashes in C needs (hashing.py calls it on import\n"
"when its C extension is built).");

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_O, configure_doc},
    {"configure_constants", configure_constants, METH_O, configure_constants_doc},
    {"configure_hashing", hkv_configure_hashing, METH_VARARGS, configure_hashing_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hybridkv._native._fastpath",
    .m_doc = "C fast paths of hybridkv's KV cache manager (see fastpath.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

static int
add_type(PyObject *module, PyTypeObject *type, const char *name)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    if (hkv_init_names() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module == NULL)
        return NULL;
    if (add_type(module, &HKV_BlockType, "Block") < 0 ||
        add_type(module, &HKV_HeldType, "Held") < 0 ||
        add_type(module, &HKV_BlocksCoreType, "BlocksCore") < 0 ||
        add_type(module, &HKV_RequestCoreType, "RequestCore") < 0 ||
        add_type(module, &HKV_ManagerCoreType, "ManagerCore") < 0 ||
        add_type(module, &HKV_HybridRulesCoreType, "HybridRulesCore") < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

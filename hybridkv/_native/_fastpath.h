/* hybridkv._native._fastpath: C versions of the KV cache manager's hot paths.
 *
 * The extension holds no state of its own beyond what Python sees: it works
 * on the same block records, request lists, dicts and eviction-policy
 * objects as the pure-Python code, which stays the reference (see
 * hybridkv/kv_cache/fastpath.py). Per-type rules (ratings, retention,
 * protection), the eviction policy and eviction listeners are Python callables it
 * calls; stale-block listeners and event subscribers make it take the Python path.
 */
#ifndef HKV_FASTPATH_H
#define HKV_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* ---- block records (hybridkv.kv_cache.block_pool.Block) ------------------- */

/* The two counts C changes on every hit and release are C integers (Python
 * reads and writes them as ints); the other fields are objects, as in a
 * slotted Python class (C converts the few ints it needs: small ints are
 * cached singletons). */
typedef struct BlockObject {
    PyObject_HEAD
    PyObject *block_id;
    Py_ssize_t ref_cnt;
    PyObject *block_hash;  /* None, or the bytes it caches */
    PyObject *group_id;
    Py_ssize_t num_hits;
    Py_ssize_t num_children;  /* blocks stored right after it since it was stored */
    PyObject *value_hint;  /* a Rating */
    PyObject *queue_slot;
    PyObject *weakreflist;
    /* the C eviction policy's links (_fp_rules.h; not seen from Python): the
     * policy queueing the block (NULL: none), its queue there, its neighbours in
     * that queue, and its LRU mark (the blocks taken by which one LRU queue would
     * still hold it: hybrid.py's `_marks`) */
    void *q_owner;
    struct BlockObject *q_prev, *q_next;
    Py_ssize_t q_mark;
    int q_queue;
} BlockObject;

extern PyTypeObject HKV_BlockType;
#define BLOCK(o) ((BlockObject *)(o))

/* An int field of a block as a Py_ssize_t (-1 with an error set when it is not one). */
static inline Py_ssize_t
hkv_field(PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a block field was deleted");
        return -1;
    }
    return PyLong_AsSsize_t(value);
}

/* Sets an int field of a block; -1 on error. */
static inline int
hkv_set_field(PyObject **slot, Py_ssize_t value)
{
    PyObject *obj = PyLong_FromSsize_t(value);
    if (obj == NULL)
        return -1;
    Py_XSETREF(*slot, obj);
    return 0;
}

/* ---- requests (hybridkv.kv_cache.request.Request's base) ------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *request_id;
    PyObject *all_token_ids;  /* a list */
    PyObject *num_computed_tokens;
    PyObject *num_prompt_tokens;
    PyObject *hasher;
    PyObject *weakreflist;
} RequestObject;

extern PyTypeObject HKV_RequestCoreType;

/* ---- what the manager tracks per request holding blocks (_Held) ----------- */

typedef struct {
    PyObject_HEAD
    PyObject *request;
    Py_ssize_t junction;
    Py_ssize_t max_tokens;
    Py_ssize_t max_computed;
} HeldObject;

extern PyTypeObject HKV_HeldType;
#define Held_Check(o) Py_IS_TYPE((o), &HKV_HeldType)

/* ---- blocks per group, as allocate_slots returns them (KVCacheBlocks) ----- */

typedef struct {
    PyObject_HEAD
    PyObject *blocks;  /* a tuple of lists */
} BlocksObject;

extern PyTypeObject HKV_BlocksCoreType;

/* ---- the manager's backend (KVCacheManager._core) ------------------------- */

/* The reuse rule a group follows, as the C paths name it. Python names a
 * group's type with fastpath.KIND_*; `bind` maps those values to these
 * labels through hkv_consts (C never repeats Python's numbers). */
enum { KIND_OTHER = 0, KIND_FULL, KIND_SLIDING, KIND_CHUNKED, KIND_MAMBA, NUM_KINDS };

/* Constants whose one source is Python, read by `configure_constants`
 * (fastpath.py calls it when it loads this module, before any manager binds). */
typedef struct {
    long kinds[NUM_KINDS];       /* fastpath.KIND_OTHER .. KIND_MAMBA, by C label */
    Py_ssize_t unlimited;        /* fastpath.UNLIMITED: a fast-path limit that never binds */
    unsigned long max_token_id;  /* fastpath.MAX_TOKEN_ID: the largest token id */
    int configured;
} Constants;

extern Constants hkv_consts;

/* One KV cache group as the C paths see it (a view of its manager). */
typedef struct {
    PyObject *manager;
    int kind;
    int skips;           /* its blocks can be released before the request ends */
    int shares;          /* it takes cached blocks for data it recomputes */
    int rates;           /* it rates released blocks (rate_released is not a no-op) */
    int retains;         /* it has a Retention */
    int protects;        /* it has a Protection */
    Py_ssize_t group_id, block_size, stride, kept_head;
    Py_ssize_t window, window_blocks;  /* sliding window */
    Py_ssize_t chunk;                  /* chunked local */
    Py_ssize_t every;                  /* Mamba checkpoint interval */
    int caching;
    PyObject *req_to_blocks;     /* dict: request id -> list of blocks */
    PyObject *num_cached_blocks; /* dict: request id -> int */
    PyObject *num_skipped;       /* dict: request id -> int */
    PyObject *table;             /* the pool's hash map of this group */
} Group;

/* The pool as the C paths see it: the objects BlockPool works on. */
typedef struct {
    PyObject *pool;
    PyObject *free_queue;       /* the eviction policy */
    PyObject *null_block;
    PyObject *cached;           /* list: group id -> hash map */
    PyObject *subscribers, *evict_listeners, *stale_listeners;  /* lists */
    PyObject *group_evictions;  /* list of ints */
    PyObject *evicted;          /* the policy's watched hashes (a mapping) */
    int uses_hints;
} Pool;

/* A KVCacheManager's C backend (`manager._core`): it works on the manager's
 * own dicts and stats, read at `bind`, and calls the manager's Python methods
 * (`owner`) for whatever it does not do itself. */
typedef struct {
    PyObject_HEAD
    PyObject *owner;      /* the KVCacheManager */
    PyObject *held;       /* dict: request id -> Held */
    PyObject *no_blocks;  /* KVCacheBlocks of empty lists */
    PyObject *junctions;  /* dict: id(request) -> (weakref, junction) */
    PyObject *stats;      /* PrefixCacheStats */
    PyObject *hash_algo;
    PyObject *hash_block_size;
    PyObject *request_type;
    PyObject *blocks_type;
    /* the bound view (NULL/0 until _bind) */
    Pool pool;
    int native;           /* every group is a built-in type the C paths know */
    int caching;
    Py_ssize_t alignment;
    Py_ssize_t num_groups;
    Group *groups;
} ManagerObject;

extern PyTypeObject HKV_ManagerCoreType;

/* owner.name(arg): the manager's Python method, for what the backend leaves to it */
static inline PyObject *
hkv_call_owner(ManagerObject *self, PyObject *name, PyObject *arg)
{
    return PyObject_CallMethodOneArg(self->owner, name, arg);
}

/* NULL with the error of a backend used before `bind` */
static inline PyObject *
hkv_unbound(void)
{
    PyErr_SetString(PyExc_RuntimeError, "ManagerCore is not bound to a KVCacheManager");
    return NULL;
}

/* ---- the hybrid eviction policy's queues (_fp_rules.c) ---------------------- */

extern PyTypeObject HKV_HybridRulesCoreType;

/* ---- the paths (each file's entry points) ---------------------------------- */

/* _fp_pool.c: BlockPool's operations on the bound pool (listeners: the Python methods) */
PyObject *hkv_pool_take(Pool *pool, Py_ssize_t num_blocks, int counted);
int hkv_pool_touch(Pool *pool, PyObject *blocks);
int hkv_pool_free(Pool *pool, PyObject *blocks, PyObject *requeue);
int hkv_pool_cache(Pool *pool, Group *g, PyObject *blocks, PyObject *hashes,
                   Py_ssize_t start, Py_ssize_t end);
Py_ssize_t hkv_pool_num_free(Pool *pool);
int hkv_add_to_item(PyObject *list, Py_ssize_t i, Py_ssize_t delta);  /* list[i] += delta */
int hkv_add_to_attr(PyObject *obj, PyObject *name, Py_ssize_t delta);  /* obj.name += delta */

/* _fp_group.c: one group's share of an allocation and of freeing */
int hkv_group_need(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed,
                   Py_ssize_t num_tokens, PyObject *hit, Py_ssize_t junction, Py_ssize_t *need);

/* _fp_release.c: blocks a request no longer needs, and freeing */
int hkv_group_release_skipped(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed,
                              Py_ssize_t junction);
int hkv_group_prepare(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed, PyObject *hit,
                      Py_ssize_t junction);
PyObject *hkv_group_allocate(Pool *pool, Group *g, PyObject *req, Py_ssize_t computed,
                             Py_ssize_t num_tokens);
int hkv_group_shared_held(Group *g, PyObject *req, PyObject *hit, Py_ssize_t num_tokens,
                          PyObject **hashes, ManagerObject *m, Py_ssize_t *held);
int hkv_group_share(Pool *pool, Group *g, PyObject *req, Py_ssize_t num_tokens,
                    PyObject **hashes, ManagerObject *m);
int hkv_group_cache(Pool *pool, Group *g, PyObject *req, PyObject **hashes, ManagerObject *m,
                    Py_ssize_t num_tokens);
int hkv_group_limits(Group *g, PyObject *req, Py_ssize_t *max_tokens, Py_ssize_t *max_computed);
int hkv_group_free(Pool *pool, Group *g, PyObject *req, Py_ssize_t junction);

/* _fp_bind.c */
int hkv_group_bind(Group *g, PyObject *manager, int kind, PyObject *pool_cached);
void hkv_group_clear(Group *g);
int hkv_group_traverse(Group *g, visitproc visit, void *arg);
int hkv_pool_bind(Pool *p, PyObject *pool);
void hkv_pool_clear(Pool *p);
int hkv_pool_traverse(Pool *p, visitproc visit, void *arg);

/* _fp_alloc.c */
PyObject *hkv_allocate(ManagerObject *self, HeldObject *held, Py_ssize_t computed,
                       Py_ssize_t num_tokens, PyObject *hit, int releases);
PyObject *hkv_block_hashes(ManagerObject *self, PyObject *req);
PyObject *hkv_new_blocks(ManagerObject *self, PyObject *groups);  /* steals groups */
PyObject *hkv_configure_hashing(PyObject *module, PyObject *args);

/* _fp_module.c: the C label of a Python kind value (KIND_OTHER when unknown) */
int hkv_kind_label(long python_kind);

/* _fp_manager.c */
int hkv_held_entry(ManagerObject *self, RequestObject *req, HeldObject **out);

/* _fp_lookup.c */
PyObject *hkv_manager_lookup(ManagerObject *self, PyObject *request);
PyObject *hkv_find_hit(ManagerObject *self, PyObject *hashes, Py_ssize_t max_length,
                       Py_ssize_t *length, Py_ssize_t *matched, Py_ssize_t *group_lengths);

#define HKV_UNLIMITED (hkv_consts.unlimited)

/* ---- shared helpers -------------------------------------------------------- */

/* interned attribute and method names */
typedef struct {
    PyObject *allocate, *allocate_checked, *take, *add_free, *remove_blocks;
    PyObject *remove_skipped_blocks, *rate_released, *block_hashes, *extend;
    PyObject *make_room, *note_recompute, *hint_changed, *recomputed;
    PyObject *retention, *protection, *split, *keep, *pop, *unprotect;
    PyObject *get_new_blocks, *cache_blocks, *free_blocks, *touch;
    PyObject *allocate_py, *lookup_py, *free_py, *note_repeated_miss, *prune_junctions;
    PyObject *requests, *queries, *hits, *stranded_tokens, *group_hits, *num_evictions;
    PyObject *hash_algo, *block_size, *hashes, *num_computed_tokens;
    PyObject *group_id, *stride, *num_kept_head_blocks, *enable_caching, *req_to_blocks;
    PyObject *num_cached_blocks, *num_skipped, *skips, *shares, *spec, *sliding_window;
    PyObject *num_window_blocks, *attention_chunk_size, *checkpoint_interval;
    PyObject *free_queue, *null_block, *cached, *subscribers, *evict_listeners;
    PyObject *stale_listeners, *group_evictions, *uses_hints, *evicted, *filter_evicted;
    PyObject *h_mm, *h_salt, *h_lora, *get, *hex, *append_checked;
    PyObject *init_checked, *cache_salt, *lora_name, *mm_hashes, *max_tokens, *protect;
} Names;

extern Names hkv_names;
extern PyObject *hkv_normal_value;  /* Rating.NORMAL_VALUE, set by configure() */

int hkv_init_names(void);

/* floor division and ceiling division of non-negative counts */
#define CDIV(a, b) (((a) + (b) - 1) / (b))

/* A non-negative Py_ssize_t from an exact int; -1 (no error set) otherwise. */
static inline Py_ssize_t
hkv_exact_index(PyObject *obj)
{
    if (!PyLong_CheckExact(obj))
        return -1;
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return v < 0 ? -1 : v;
}

/* obj.name(*args) with an interned name: `args` are new references (NULL
 * entries mean an earlier conversion failed); all are released. */
static inline PyObject *
hkv_call(PyObject *obj, PyObject *name, PyObject **args, Py_ssize_t nargs)
{
    PyObject *out = NULL, *stack[8];
    int ok = nargs < 8;
    for (Py_ssize_t i = 0; i < nargs; i++)
        ok &= args[i] != NULL;
    if (ok) {
        stack[0] = obj;
        for (Py_ssize_t i = 0; i < nargs; i++)
            stack[i + 1] = args[i];
        out = PyObject_VectorcallMethod(name, stack, (nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                        NULL);
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        Py_XDECREF(args[i]);
    return out;
}

/* ---- a group's per-request state (managers/base.py's dicts) ---------------- */

#define RID(req) (((RequestObject *)(req))->request_id)

/* d.get(key, default) for an int value; -1 with an error set on failure. */
static inline Py_ssize_t
dict_count(PyObject *d, PyObject *key, Py_ssize_t dflt)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : dflt;
    return PyLong_AsSsize_t(v);
}

static inline int
dict_set_count(PyObject *d, PyObject *key, Py_ssize_t value)
{
    PyObject *v = PyLong_FromSsize_t(value);
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* The request's block list in this group (borrowed) or NULL (none, or an error). */
static inline PyObject *
blocks_of(Group *g, PyObject *req)
{
    PyObject *blocks = PyDict_GetItemWithError(g->req_to_blocks, RID(req));
    if (blocks != NULL && !PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "a request's blocks must be a list");
        return NULL;
    }
    return blocks;
}

#define FAILED(v) ((v) == -1 && PyErr_Occurred())

/* num_skipped_blocks of the type: leading positions no longer needed. */
static inline Py_ssize_t
num_skipped_blocks(Group *g, Py_ssize_t computed)
{
    switch (g->kind) {
    case KIND_SLIDING: {
        Py_ssize_t first_needed = computed - g->window + 1;
        return (first_needed > 0 ? first_needed : 0) / g->block_size;
    }
    case KIND_CHUNKED:
        return computed / g->chunk * g->chunk / g->block_size;
    case KIND_MAMBA:
        return computed / g->block_size;
    default:
        return 0;
    }
}

static inline Py_ssize_t
skip_start(Group *g, PyObject *req)
{
    return dict_count(g->num_skipped, RID(req), g->kept_head);
}

/* The positions skipping at `computed` releases from `blocks`: [*start, *end).
 * 0 (none: *end <= *start), 1, or -1 on error. */
static inline int
skip_range(Group *g, PyObject *req, PyObject *blocks, Py_ssize_t computed, Py_ssize_t *start,
           Py_ssize_t *end)
{
    *start = skip_start(g, req);
    if (FAILED(*start))
        return -1;
    *end = num_skipped_blocks(g, computed);
    if (*end > PyList_GET_SIZE(blocks))
        *end = PyList_GET_SIZE(blocks);
    return *end > *start;
}


/* list.extend([null] * count) in one resize. */
static inline int
hkv_extend_nulls(PyObject *list, PyObject *null, Py_ssize_t count)
{
    if (count <= 8) {
        for (Py_ssize_t i = 0; i < count; i++)
            if (PyList_Append(list, null) < 0)
                return -1;
        return 0;
    }
    PyObject *nulls = PyList_New(count);
    if (nulls == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < count; i++)
        PyList_SET_ITEM(nulls, i, Py_NewRef(null));
    Py_ssize_t end = PyList_GET_SIZE(list);
    int rc = PyList_SetSlice(list, end, end, nulls);
    Py_DECREF(nulls);
    return rc;
}

#define HKV_N(v) PyLong_FromSsize_t(v)
#define HKV_O(v) Py_NewRef(v)

#endif

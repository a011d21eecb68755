/* LruTable: the cpu:// store's map in C (the reference is hybridkv/store/lru.py).
 *
 * Byte keys -> bytes values, bounded in bytes (key + value + a fixed
 * overhead per entry), least recently used out. Keys are copied into the
 * table; values are held as the bytes objects given (get returns them, no
 * copy). An open-addressing hash table (linear probing, XXH3-64 of the key,
 * deletion by backward shift) indexes an array of entries chained in LRU
 * order. Every method runs with the GIL held and so is atomic for Python
 * threads; put_encoded builds values from raw block data with the GIL
 * released for the copies and checksums.
 *
 * The behaviour is that of LruDict (lru.py), which tests compare it with:
 *   put(keys, values): inserted tail first (the head ends most recent); a
 *     stored key is replaced and refreshed; an entry larger than the
 *     capacity is skipped; then the least recent entries go until it fits.
 *   get(keys): the values of the longest stored prefix, refreshed so that
 *     the head ends most recent. contains / prefix_length refresh nothing.
 *
 * mirrors hybridkv.store.lru.LruDict
 */
#include "_codec.h"

#include <string.h>

enum { KEY_INLINE = 64, EMPTY = -1 };
/* batches of up to SMALL_BATCH blocks use stack space; the GIL is let go while
 * values are filled when they come to RELEASE_GIL_BYTES */
enum { SMALL_BATCH = 64, RELEASE_GIL_BYTES = 64 << 10 };
/* entries evicted per pass (see evict) */
enum { EVICT_RUN = 64 };

typedef struct {
    uint64_t hash;
    PyObject *value;  /* a bytes object (strong reference); NULL: a free entry */
    Py_ssize_t cost;
    int32_t older, newer;  /* the LRU chain; EMPTY at its ends. Free list: newer */
    uint32_t key_len;
    char *heap_key;  /* the key when longer than KEY_INLINE, else NULL */
    char inline_key[KEY_INLINE];
} Entry;

/* a hash table slot: an entry and the low bits of its key's hash (probes and
 * moves read no entry but the one they find) */
typedef struct {
    int32_t index;  /* EMPTY: a free slot */
    uint32_t tag;
} Slot;

typedef struct {
    PyObject_HEAD
    Entry *entries;
    int32_t num_alloc;  /* entries allocated */
    int32_t free_head;  /* a free entry, or EMPTY */
    Slot *slots;        /* the hash table */
    size_t mask;        /* slots - 1 (a power of two minus one) */
    Py_ssize_t count;
    int32_t oldest, newest;
    long long used, capacity, overhead, evicted;
} LruTable;

#define KEY(e) ((e)->heap_key ? (e)->heap_key : (e)->inline_key)

/* methods of a table whose __init__ did not run raise instead of crashing */
#define CHECK_INIT(t)                                                          \
    do {                                                                       \
        if (!(t)->slots) {                                                     \
            PyErr_SetString(PyExc_RuntimeError, "LruTable is not initialized"); \
            return NULL;                                                       \
        }                                                                      \
    } while (0)

/* ---- the hash table ------------------------------------------------------ */

static int32_t
find(LruTable *t, const char *key, size_t len, uint64_t h)
{
    uint32_t tag = (uint32_t)h;
    for (size_t pos = h & t->mask;; pos = (pos + 1) & t->mask) {
        Slot slot = t->slots[pos];
        if (slot.index == EMPTY)
            return EMPTY;
        if (slot.tag != tag)
            continue;
        Entry *e = &t->entries[slot.index];
        if (e->hash == h && e->key_len == len && memcmp(KEY(e), key, len) == 0)
            return slot.index;
    }
}

static void
slot_insert(LruTable *t, int32_t i)
{
    uint32_t tag = (uint32_t)t->entries[i].hash;
    size_t pos = tag & t->mask;
    while (t->slots[pos].index != EMPTY)
        pos = (pos + 1) & t->mask;
    t->slots[pos].index = i;
    t->slots[pos].tag = tag;
}

static void
slot_remove(LruTable *t, int32_t i)
{
    size_t mask = t->mask, pos = t->entries[i].hash & mask;
    while (t->slots[pos].index != i)
        pos = (pos + 1) & mask;
    /* backward shift: move up each later slot of the run that may live at pos */
    for (size_t j = (pos + 1) & mask; t->slots[j].index != EMPTY; j = (j + 1) & mask) {
        size_t home = t->slots[j].tag & mask;
        if (((j - home) & mask) >= ((j - pos) & mask)) {
            t->slots[pos] = t->slots[j];
            pos = j;
        }
    }
    t->slots[pos].index = EMPTY;
}

static Slot *
new_slots(size_t size)
{
    Slot *slots = PyMem_Malloc(size * sizeof(Slot));
    if (!slots) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < size; i++)
        slots[i].index = EMPTY;
    return slots;
}

static int
grow_slots(LruTable *t)
{
    size_t size = (t->mask + 1) * 2;
    Slot *slots = new_slots(size);
    if (!slots)
        return -1;
    PyMem_Free(t->slots);
    t->slots = slots;
    t->mask = size - 1;
    for (int32_t i = t->oldest; i != EMPTY; i = t->entries[i].newer)
        slot_insert(t, i);
    return 0;
}

/* ---- entries and the LRU chain --------------------------------------------- */

static void
unlink_entry(LruTable *t, int32_t i)
{
    Entry *e = &t->entries[i];
    if (e->older != EMPTY)
        t->entries[e->older].newer = e->newer;
    else
        t->oldest = e->newer;
    if (e->newer != EMPTY)
        t->entries[e->newer].older = e->older;
    else
        t->newest = e->older;
}

static void
link_newest(LruTable *t, int32_t i)
{
    Entry *e = &t->entries[i];
    e->older = t->newest;
    e->newer = EMPTY;
    if (t->newest != EMPTY)
        t->entries[t->newest].newer = i;
    else
        t->oldest = i;
    t->newest = i;
}

static void
touch(LruTable *t, int32_t i)
{
    if (t->newest != i) {
        unlink_entry(t, i);
        link_newest(t, i);
    }
}

static void
remove_entry(LruTable *t, int32_t i)
{
    Entry *e = &t->entries[i];
    slot_remove(t, i);
    unlink_entry(t, i);
    t->used -= e->cost;
    t->count--;
    PyMem_Free(e->heap_key);
    e->heap_key = NULL;
    PyObject *value = e->value;
    e->value = NULL;
    e->newer = t->free_head;
    t->free_head = i;
    Py_DECREF(value);  /* a bytes object: frees memory, runs no code */
}

/* A new entry for the key (not stored yet), newest; steals `value`. -1 on error. */
static int
insert_new(LruTable *t, const char *key, size_t len, uint64_t h, PyObject *value,
           Py_ssize_t cost)
{
    if ((size_t)(t->count + 1) * 2 > t->mask + 1 && grow_slots(t) < 0)
        return -1;
    if (t->free_head == EMPTY) {
        int32_t n = t->num_alloc ? t->num_alloc * 2 : 64;
        Entry *entries = PyMem_Realloc(t->entries, (size_t)n * sizeof(Entry));
        if (!entries) {
            PyErr_NoMemory();
            return -1;
        }
        for (int32_t i = n - 1; i >= t->num_alloc; i--) {
            entries[i].value = NULL;
            entries[i].heap_key = NULL;
            entries[i].newer = t->free_head;
            t->free_head = i;
        }
        t->entries = entries;
        t->num_alloc = n;
    }
    int32_t i = t->free_head;
    Entry *e = &t->entries[i];
    if (len > KEY_INLINE) {
        e->heap_key = PyMem_Malloc(len);
        if (!e->heap_key) {
            PyErr_NoMemory();
            return -1;
        }
    }
    t->free_head = e->newer;
    memcpy(KEY(e), key, len);
    e->key_len = (uint32_t)len;
    e->hash = h;
    e->value = value;
    e->cost = cost;
    slot_insert(t, i);
    link_newest(t, i);
    t->used += cost;
    t->count++;
    return 0;
}

/* Store `value` (a new reference, stolen) under the key, whose hash is `h`:
 * 1 stored, 0 skipped (larger than the table), -1 on error */
static int
put_one(LruTable *t, const char *key, size_t len, uint64_t h, PyObject *value)
{
    Py_ssize_t cost = (Py_ssize_t)len + PyBytes_GET_SIZE(value) + (Py_ssize_t)t->overhead;
    if (cost > t->capacity) {
        Py_DECREF(value);
        return 0;
    }
    int32_t i = find(t, key, len, h);
    if (i != EMPTY) {  /* replace and refresh */
        Entry *e = &t->entries[i];
        PyObject *old = e->value;
        e->value = value;
        t->used += cost - e->cost;
        e->cost = cost;
        touch(t, i);
        Py_DECREF(old);
        return 1;
    }
    if (insert_new(t, key, len, h, value, cost) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 1;
}

/* Drop the least recent entries until the table fits. The victims are found
 * first, walking from the oldest (their values and slots are fetched into the
 * cache on the way), then removed: each costs about one memory round trip, not
 * three in a row. */
static void
evict(LruTable *t)
{
    while (t->used > t->capacity && t->oldest != EMPTY) {
        int32_t victims[EVICT_RUN];
        int num = 0;
        long long excess = t->used - t->capacity;
        for (int32_t i = t->oldest; excess > 0 && i != EMPTY && num < EVICT_RUN;) {
            Entry *e = &t->entries[i];
            if (e->newer != EMPTY)
                __builtin_prefetch(&t->entries[e->newer]);
            __builtin_prefetch(e->value);
            __builtin_prefetch(&t->slots[e->hash & t->mask]);
            excess -= e->cost;
            victims[num++] = i;
            i = e->newer;
        }
        for (int k = 0; k < num; k++)
            remove_entry(t, victims[k]);
        t->evicted += num;
    }
}

/* ---- argument helpers ---------------------------------------------------------- */

/* A list of the items (a new reference), each checked to be bytes (exactly bytes for
 * `exact`: values are freed by the table, which must run no code); NULL on error */
static PyObject *
bytes_list_of(PyObject *seq, const char *what, int exact)
{
    /* a list is used as it is (no method here runs code that could change it) */
    PyObject *list = PyList_CheckExact(seq) ? Py_NewRef(seq) : PySequence_List(seq);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (exact ? !PyBytes_CheckExact(item) : !PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] is %.100s, not bytes", what, i,
                         Py_TYPE(item)->tp_name);
            Py_DECREF(list);
            return NULL;
        }
    }
    return list;
}

#define bytes_list(seq, what) bytes_list_of(seq, what, 0)

static int32_t
find_bytes(LruTable *t, PyObject *key)
{
    size_t len = (size_t)PyBytes_GET_SIZE(key);
    const char *k = PyBytes_AS_STRING(key);
    return find(t, k, len, hkv_hash64(k, len));
}

/* ---- methods -------------------------------------------------------------------- */

static PyObject *
lru_put(LruTable *t, PyObject *args)
{
    CHECK_INIT(t);
    PyObject *keys_arg, *values_arg;
    if (!PyArg_ParseTuple(args, "OO", &keys_arg, &values_arg))
        return NULL;
    PyObject *keys = bytes_list(keys_arg, "keys");
    PyObject *values = keys ? bytes_list_of(values_arg, "values", 1) : NULL;
    PyObject *result = NULL;
    if (!values)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_Format(PyExc_ValueError, "put: %zd keys but %zd values", n,
                     PyList_GET_SIZE(values));
        goto done;
    }
    Py_ssize_t stored = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* tail first: the head ends most recent */
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        Py_INCREF(value);
        size_t len = (size_t)PyBytes_GET_SIZE(key);
        int r = put_one(t, PyBytes_AS_STRING(key), len, hkv_hash64(PyBytes_AS_STRING(key), len),
                        value);
        if (r < 0)
            break;
        stored += r;
    }
    evict(t);
    if (!PyErr_Occurred())
        result = PyLong_FromSsize_t(stored);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return result;
}

/* Store block i of `rows` encoded under prefix + hashes[i] (a list of bytes),
 * for each i, as put does (tail first, then evict); how many were stored, or
 * -1 with an exception set. Copies and checksums run without the GIL. */
static Py_ssize_t
put_rows(LruTable *t, const Py_buffer *head, const Py_buffer *prefix, PyObject *hashes,
         const Rows *rows)
{
    Py_ssize_t n = PyList_GET_SIZE(hashes), made = 0, stored = -1;
    Py_ssize_t value_bytes = head->len + 8 + rows->num_layers * rows->layer_bytes;
    size_t max_key = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)prefix->len + (size_t)PyBytes_GET_SIZE(PyList_GET_ITEM(hashes, i));
        max_key = len > max_key ? len : max_key;
    }
    /* keys (prefix + hash) side by side, each in max_key bytes; on the stack
     * for the usual small batch */
    char key_space[SMALL_BATCH * 2 * KEY_INLINE];
    size_t len_space[SMALL_BATCH];
    uint64_t hash_space[SMALL_BATCH];
    PyObject *value_space[SMALL_BATCH];
    int small = n <= SMALL_BATCH && max_key <= 2 * KEY_INLINE;
    char *keys = small ? key_space : PyMem_Malloc(max_key * (size_t)n + 1);
    size_t *key_lens = small ? len_space : PyMem_Malloc(sizeof(size_t) * (size_t)n + 1);
    uint64_t *key_hashes = small ? hash_space : PyMem_Malloc(sizeof(uint64_t) * (size_t)n + 1);
    PyObject **values = small ? value_space : PyMem_Malloc(sizeof(PyObject *) * (size_t)n + 1);
    if (!keys || !key_lens || !key_hashes || !values) {
        PyErr_NoMemory();
        goto done;
    }
    for (; made < n; made++) {
        PyObject *h = PyList_GET_ITEM(hashes, made);
        char *key = keys + max_key * (size_t)made;
        memcpy(key, prefix->buf, (size_t)prefix->len);
        memcpy(key + prefix->len, PyBytes_AS_STRING(h), (size_t)PyBytes_GET_SIZE(h));
        key_lens[made] = (size_t)prefix->len + (size_t)PyBytes_GET_SIZE(h);
        values[made] = PyBytes_FromStringAndSize(NULL, value_bytes);
        if (!values[made])
            goto done;
    }
    /* the values are ours alone until stored: fill them without the GIL (when
     * there is enough to fill to be worth letting another thread run) */
    PyThreadState *saved = n * value_bytes >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        key_hashes[i] = hkv_hash64(keys + max_key * (size_t)i, key_lens[i]);
        hkv_encode_value(PyBytes_AS_STRING(values[i]), head->buf, head->len, key_hashes[i],
                         rows, i);
    }
    if (saved)
        PyEval_RestoreThread(saved);
    stored = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* tail first: the head ends most recent */
        PyObject *value = values[i];
        values[i] = NULL;
        made--;  /* (the values after i are stored or freed) */
        int r = put_one(t, keys + max_key * (size_t)i, key_lens[i], key_hashes[i], value);
        if (r < 0) {
            stored = -1;
            break;
        }
        stored += r;
    }
    evict(t);
done:
    if (values)
        for (Py_ssize_t i = 0; i < made; i++)
            Py_XDECREF(values[i]);
    if (!small) {
        PyMem_Free(values);
        PyMem_Free(keys);
        PyMem_Free(key_lens);
        PyMem_Free(key_hashes);
    }
    return stored;
}

/* The end of put_encoded and put_from_pages: store the batch `rows` describes
 * (if `ok`: it was checked and made), then release what the call holds */
static PyObject *
finish_put(LruTable *t, Py_buffer *head, Py_buffer *prefix, Py_buffer *data, PyObject *hashes,
           Rows *rows, int ok)
{
    PyObject *result = NULL;
    Py_ssize_t stored = ok ? put_rows(t, head, prefix, hashes, rows) : -1;
    if (stored >= 0)
        result = PyLong_FromSsize_t(stored);
    hkv_rows_release(rows);
    Py_XDECREF(hashes);
    PyBuffer_Release(head);
    PyBuffer_Release(prefix);
    PyBuffer_Release(data);
    return result;
}

static PyObject *
lru_put_encoded(LruTable *t, PyObject *args)
{
    CHECK_INIT(t);
    Py_buffer head, prefix, data;
    PyObject *hashes_arg;
    Py_ssize_t num_layers, layer_bytes;
    if (!PyArg_ParseTuple(args, "y*y*Oy*nn", &head, &prefix, &hashes_arg, &data, &num_layers,
                          &layer_bytes))
        return NULL;
    PyObject *hashes = bytes_list(hashes_arg, "hashes");
    Rows rows = {0};
    Py_ssize_t n = hashes ? PyList_GET_SIZE(hashes) : 0;
    int ok = hashes != NULL;
    if (ok && (num_layers < 1 || layer_bytes < 0 || data.len != n * num_layers * layer_bytes)) {
        PyErr_Format(PyExc_ValueError, "put_encoded: %zd data bytes for %zd blocks of %zd x %zd",
                     data.len, n, num_layers, layer_bytes);
        ok = 0;
    }
    ok = ok && hkv_rows_contiguous(&rows, data.buf, n, num_layers, layer_bytes) == 0;
    return finish_put(t, &head, &prefix, &data, hashes, &rows, ok);
}

static PyObject *
lru_put_from_pages(LruTable *t, PyObject *args)
{
    CHECK_INIT(t);
    Py_buffer head, prefix, ids;
    PyObject *hashes_arg, *views;
    Py_ssize_t layer_bytes;
    if (!PyArg_ParseTuple(args, "y*y*Oy*O!n", &head, &prefix, &hashes_arg, &ids, &PyList_Type,
                          &views, &layer_bytes))
        return NULL;
    PyObject *hashes = bytes_list(hashes_arg, "hashes");
    Rows rows = {0};
    Py_ssize_t n = hashes ? PyList_GET_SIZE(hashes) : 0;
    int ok = hashes != NULL;
    if (ok && (ids.len != n * (Py_ssize_t)sizeof(int64_t) || layer_bytes < 0)) {
        PyErr_Format(PyExc_ValueError, "put_from_pages: %zd bytes of ids for %zd blocks "
                     "(native int64 each)", ids.len, n);
        ok = 0;
    }
    ok = ok && hkv_rows_pages(&rows, views, layer_bytes, (const int64_t *)ids.buf, n) == 0;
    return finish_put(t, &head, &prefix, &ids, hashes, &rows, ok);
}

/* put_from_pages with the header start and layer bytes read from `layout` */
static PyObject *
lru_put_pages(LruTable *t, PyObject *args)
{
    PyObject *layout, *prefix, *hashes, *ids, *views;
    if (!PyArg_ParseTuple(args, "OOOOO", &layout, &prefix, &hashes, &ids, &views))
        return NULL;
    static PyObject *header_start_name, *layer_bytes_name;
    if (!header_start_name && !(header_start_name = PyUnicode_InternFromString("header_start")))
        return NULL;
    if (!layer_bytes_name && !(layer_bytes_name = PyUnicode_InternFromString("layer_bytes")))
        return NULL;
    PyObject *head = PyObject_GetAttr(layout, header_start_name);
    PyObject *layer_bytes = head ? PyObject_GetAttr(layout, layer_bytes_name) : NULL;
    PyObject *inner = layer_bytes ? PyTuple_Pack(6, head, prefix, hashes, ids, views,
                                                 layer_bytes) : NULL;
    PyObject *result = inner ? lru_put_from_pages(t, inner) : NULL;
    Py_XDECREF(head);
    Py_XDECREF(layer_bytes);
    Py_XDECREF(inner);
    return result;
}

static PyObject *
lru_get(LruTable *t, PyObject *keys_arg)
{
    CHECK_INIT(t);
    PyObject *keys = bytes_list(keys_arg, "keys");
    if (!keys)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    int32_t *found = PyMem_Malloc(sizeof(int32_t) * (size_t)n + 1);
    PyObject *out = found ? PyList_New(0) : NULL;
    if (!out) {
        if (!found)
            PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t m = 0;
    for (; m < n; m++) {
        int32_t i = find_bytes(t, PyList_GET_ITEM(keys, m));
        if (i == EMPTY)
            break;
        found[m] = i;
        if (PyList_Append(out, t->entries[i].value) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
    for (Py_ssize_t j = m - 1; j >= 0; j--)  /* the head ends most recent */
        touch(t, found[j]);
done:
    PyMem_Free(found);
    Py_DECREF(keys);
    return out;
}

/* Index of prefix + h, or EMPTY; `buf` holds KEY_INLINE * 2 bytes for short keys */
static int32_t
find_prefixed(LruTable *t, const char *prefix, size_t plen, PyObject *h, char *buf)
{
    size_t hlen = (size_t)PyBytes_GET_SIZE(h), len = plen + hlen;
    char *key = len <= 2 * KEY_INLINE ? buf : PyMem_Malloc(len);
    if (!key)
        return EMPTY;  /* (a key too long to copy is reported missing) */
    memcpy(key, prefix, plen);
    memcpy(key + plen, PyBytes_AS_STRING(h), hlen);
    int32_t i = find(t, key, len, hkv_hash64(key, len));
    if (key != buf)
        PyMem_Free(key);
    return i;
}

/* contains (`prefix_length` 0) or prefix_length (1) of the keys prefix + each
 * of `items`, a sequence of bytes */
static PyObject *
query(LruTable *t, const char *prefix, size_t plen, PyObject *items, int prefix_length)
{
    PyObject *list = bytes_list(items, "keys");
    if (!list)
        return NULL;
    char buf[2 * KEY_INLINE];
    Py_ssize_t n = PyList_GET_SIZE(list), m = 0;
    PyObject *out = prefix_length ? NULL : PyList_New(n);
    if (prefix_length) {
        while (m < n && find_prefixed(t, prefix, plen, PyList_GET_ITEM(list, m), buf) != EMPTY)
            m++;
        out = PyLong_FromSsize_t(m);
    }
    for (Py_ssize_t j = 0; out && !prefix_length && j < n; j++) {
        int held = find_prefixed(t, prefix, plen, PyList_GET_ITEM(list, j), buf) != EMPTY;
        PyList_SET_ITEM(out, j, Py_NewRef(held ? Py_True : Py_False));
    }
    Py_DECREF(list);
    return out;
}

static PyObject *
lru_contains(LruTable *t, PyObject *keys)
{
    CHECK_INIT(t);
    return query(t, "", 0, keys, 0);
}

static PyObject *
lru_prefix_length(LruTable *t, PyObject *keys)
{
    CHECK_INIT(t);
    return query(t, "", 0, keys, 1);
}

/* contains_blocks (`prefix_length` 0) or prefix_length_blocks (1) */
static PyObject *
query_blocks(LruTable *t, PyObject *args, int prefix_length)
{
    Py_buffer prefix;
    PyObject *hashes;
    if (!PyArg_ParseTuple(args, "y*O", &prefix, &hashes))
        return NULL;
    PyObject *out = query(t, prefix.buf, (size_t)prefix.len, hashes, prefix_length);
    PyBuffer_Release(&prefix);
    return out;
}

static PyObject *
lru_prefix_length_blocks(LruTable *t, PyObject *args)
{
    CHECK_INIT(t);
    return query_blocks(t, args, 1);
}

static PyObject *
lru_contains_blocks(LruTable *t, PyObject *args)
{
    CHECK_INIT(t);
    return query_blocks(t, args, 0);
}

static PyObject *
lru_delete(LruTable *t, PyObject *keys_arg)
{
    CHECK_INIT(t);
    PyObject *keys = bytes_list(keys_arg, "keys");
    if (!keys)
        return NULL;
    Py_ssize_t removed = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(keys); j++) {
        int32_t i = find_bytes(t, PyList_GET_ITEM(keys, j));
        if (i != EMPTY) {
            remove_entry(t, i);
            removed++;
        }
    }
    Py_DECREF(keys);
    return PyLong_FromSsize_t(removed);
}

static PyObject *
lru_keys(LruTable *t, PyObject *Py_UNUSED(ignored))
{
    CHECK_INIT(t);
    PyObject *out = PyList_New(0);
    for (int32_t i = t->oldest; out && i != EMPTY; i = t->entries[i].newer) {
        Entry *e = &t->entries[i];
        PyObject *key = PyBytes_FromStringAndSize(KEY(e), e->key_len);
        if (!key || PyList_Append(out, key) < 0)
            Py_CLEAR(out);
        Py_XDECREF(key);
    }
    return out;
}

static PyObject *
lru_stats(LruTable *t, PyObject *Py_UNUSED(ignored))
{
    CHECK_INIT(t);
    return Py_BuildValue("(nLL)", t->count, t->used, t->evicted);
}

static Py_ssize_t
lru_len(LruTable *t)
{
    return t->count;
}

/* ---- the type -------------------------------------------------------------------- */

static int
lru_init(LruTable *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"capacity", "overhead", NULL};
    long long capacity, overhead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL", names, &capacity, &overhead))
        return -1;
    if (capacity <= 0 || overhead < 0) {
        PyErr_Format(PyExc_ValueError, "LruTable: capacity %lld, overhead %lld", capacity,
                     overhead);
        return -1;
    }
    if (t->slots) {
        PyErr_SetString(PyExc_RuntimeError, "LruTable is initialized once");
        return -1;
    }
    t->slots = new_slots(64);
    if (!t->slots)
        return -1;
    t->mask = 63;
    t->entries = NULL;
    t->num_alloc = 0;
    t->free_head = t->oldest = t->newest = EMPTY;
    t->count = 0;
    t->used = t->evicted = 0;
    t->capacity = capacity;
    t->overhead = overhead;
    return 0;
}

static void
lru_dealloc(LruTable *t)
{
    for (int32_t i = t->slots ? t->oldest : EMPTY; i != EMPTY; i = t->entries[i].newer) {
        PyMem_Free(t->entries[i].heap_key);
        Py_DECREF(t->entries[i].value);
    }
    PyMem_Free(t->entries);
    PyMem_Free(t->slots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef lru_methods[] = {
    {"put", (PyCFunction)lru_put, METH_VARARGS,
     "put(keys, values) -> int: store each value under its key (tail first); how many"},
    {"put_encoded", (PyCFunction)lru_put_encoded, METH_VARARGS,
     "put_encoded(header_start, prefix, hashes, data, num_layers, layer_bytes) -> int:\n"
     "put(prefix + hash, encoded block) for a batch, as _codec.encode builds them"},
    {"put_from_pages", (PyCFunction)lru_put_from_pages, METH_VARARGS,
     "put_from_pages(header_start, prefix, hashes, ids, views, layer_bytes) -> int:\n"
     "put_encoded of the blocks whose pages are row ids[i] (native int64) of each view"},
    {"put_pages", (PyCFunction)lru_put_pages, METH_VARARGS,
     "put_pages(layout, prefix, hashes, ids, views) -> int: KVStore.put_pages, with the\n"
     "header start and layer bytes of a payload.BlockLayout"},
    {"get", (PyCFunction)lru_get, METH_O,
     "get(keys) -> list[bytes]: the values of the longest stored prefix (refreshed)"},
    {"contains", (PyCFunction)lru_contains, METH_O, "contains(keys) -> list[bool]"},
    {"prefix_length", (PyCFunction)lru_prefix_length, METH_O,
     "prefix_length(keys) -> int: how many leading keys are stored"},
    {"prefix_length_blocks", (PyCFunction)lru_prefix_length_blocks, METH_VARARGS,
     "prefix_length_blocks(prefix, hashes) -> int: prefix_length of prefix + each hash"},
    {"contains_blocks", (PyCFunction)lru_contains_blocks, METH_VARARGS,
     "contains_blocks(prefix, hashes) -> list[bool]: contains of prefix + each hash"},
    {"delete", (PyCFunction)lru_delete, METH_O, "delete(keys) -> int: how many were stored"},
    {"keys", (PyCFunction)lru_keys, METH_NOARGS, "keys() -> list[bytes], least recent first"},
    {"stats", (PyCFunction)lru_stats, METH_NOARGS,
     "stats() -> (entries, used bytes, evicted entries)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods lru_as_sequence = {
    .sq_length = (lenfunc)lru_len,
};

static PyTypeObject LruTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridkv._native._codec.LruTable",
    .tp_basicsize = sizeof(LruTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LruTable(capacity, overhead): bytes -> bytes, bounded in bytes, "
              "least recently used out",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lru_init,
    .tp_dealloc = (destructor)lru_dealloc,
    .tp_methods = lru_methods,
    .tp_as_sequence = &lru_as_sequence,
};

int
hkv_add_lrutable(PyObject *module)
{
    if (PyType_Ready(&LruTableType) < 0)
        return -1;
    Py_INCREF(&LruTableType);
    if (PyModule_AddObject(module, "LruTable", (PyObject *)&LruTableType) < 0) {
        Py_DECREF(&LruTableType);
        return -1;
    }
    return 0;
}

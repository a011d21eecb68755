/* The remembered evictions of the C eviction policy (see _fp_watch.h). */
#include "_fp_watch.h"

enum { FIRST_CAP = 64 };

static inline WatchEntry *
entry(Watch *w, Py_ssize_t pos)
{
    return &w->ring[pos & (w->cap - 1)];
}

static void
release_entries(Watch *w)
{
    for (Py_ssize_t p = w->head; w->ring != NULL && p < w->tail; p++) {
        WatchEntry *e = entry(w, p);
        Py_CLEAR(e->key);
        Py_CLEAR(e->pos);
    }
    PyMem_Free(w->ring);
    w->ring = NULL;
    w->cap = w->head = w->tail = 0;
}

void
hkv_watch_clear(Watch *w)
{
    release_entries(w);
    Py_CLEAR(w->view);
    Py_CLEAR(w->dict);
}

int
hkv_watch_init(Watch *w)
{
    hkv_watch_clear(w);
    w->dict = PyDict_New();
    w->view = w->dict ? PyDictProxy_New(w->dict) : NULL;
    w->ring = PyMem_Calloc(FIRST_CAP, sizeof(WatchEntry));
    if (w->view == NULL || w->ring == NULL) {
        hkv_watch_clear(w);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    w->cap = FIRST_CAP;
    return 0;
}

/* A ring twice the size; positions (and so the dict) unchanged. */
static int
grow(Watch *w)
{
    Py_ssize_t cap = w->cap * 2;
    WatchEntry *ring = PyMem_Calloc(cap, sizeof(WatchEntry));
    if (ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t p = w->head; p < w->tail; p++)
        ring[p & (cap - 1)] = *entry(w, p);
    PyMem_Free(w->ring);
    w->ring = ring;
    w->cap = cap;
    return 0;
}

/* Frees a new ring whose keys are still owned by the old one; -1. */
static int
drop_new(WatchEntry *ring, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(ring[i].pos);
    PyMem_Free(ring);
    return -1;
}

/* The same ring size with the removed entries squeezed out: the live ones get
 * positions 0.. in order (in the dict too). */
static int
compact(Watch *w)
{
    WatchEntry *ring = PyMem_Calloc(w->cap, sizeof(WatchEntry));
    if (ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t p = w->head; p < w->tail; p++) {
        WatchEntry *e = entry(w, p);
        if (e->key == NULL)
            continue;
        ring[n] = *e;  /* the key borrowed until every new position exists */
        ring[n].pos = PyLong_FromSsize_t(n);
        if (ring[n++].pos == NULL)
            return drop_new(ring, n);
    }
    for (Py_ssize_t i = 0; i < n; i++)  /* existing keys: a value replaced, no resize */
        if (PyDict_SetItem(w->dict, ring[i].key, ring[i].pos) < 0)
            return drop_new(ring, n);
    for (Py_ssize_t p = w->head; p < w->tail; p++) {  /* keys move to the new ring */
        WatchEntry *e = entry(w, p);
        e->key = NULL;
        Py_CLEAR(e->pos);
    }
    PyMem_Free(w->ring);
    w->ring = ring;
    w->head = 0;
    w->tail = n;
    return 0;
}

/* Room for one more entry: compacted when at most half the entries are live. */
static int
make_room(Watch *w)
{
    return PyDict_GET_SIZE(w->dict) <= w->cap / 2 ? compact(w) : grow(w);
}

/* Skips removed entries at the front. */
static void
advance(Watch *w)
{
    while (w->head < w->tail && entry(w, w->head)->key == NULL)
        w->head++;
}

int
hkv_watch_trim(Watch *w, Py_ssize_t limit)
{
    while (PyDict_GET_SIZE(w->dict) > limit && w->head < w->tail) {
        WatchEntry *e = entry(w, w->head++);
        if (e->key == NULL)
            continue;
        int rc = PyDict_DelItem(w->dict, e->key);
        Py_CLEAR(e->key);
        Py_CLEAR(e->pos);
        if (rc < 0)
            return -1;
    }
    advance(w);
    return 0;
}

/* The live entry at the dict value `pos`; NULL with an error if out of order. */
static WatchEntry *
entry_at(Watch *w, PyObject *pos)
{
    Py_ssize_t p = PyLong_AsSsize_t(pos);
    if (p == -1 && PyErr_Occurred())
        return NULL;
    if (p < w->head || p >= w->tail || entry(w, p)->pos != pos) {
        PyErr_SetString(PyExc_RuntimeError, "watched evictions out of order");
        return NULL;
    }
    return entry(w, p);
}

/* The live entry of `key`; NULL with KeyError when not watched. */
static WatchEntry *
find(Watch *w, PyObject *key)
{
    PyObject *pos = PyDict_GetItemWithError(w->dict, key);
    if (pos == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return entry_at(w, pos);
}

/* Adds `key` as the newest entry, with one dict lookup when it is new (watched
 * already: it becomes the newest); -1 on error. */
static int
place(Watch *w, PyObject *key)
{
    if (w->tail - w->head == w->cap && make_room(w) < 0)
        return -1;
    PyObject *pos = PyLong_FromSsize_t(w->tail);
    if (pos == NULL)
        return -1;
    PyObject *old = PyDict_SetDefault(w->dict, key, pos);  /* borrowed */
    if (old == NULL) {
        Py_DECREF(pos);
        return -1;
    }
    if (old != pos) {  /* watched already */
        WatchEntry *e = entry_at(w, old);
        if (e == NULL) {
            Py_DECREF(pos);
            return -1;
        }
        /* deleted and inserted again: the key moves to the end of the dict's order */
        if (PyDict_DelItem(w->dict, key) < 0 || PyDict_SetItem(w->dict, key, pos) < 0) {
            Py_DECREF(pos);
            return -1;
        }
        Py_CLEAR(e->key);
        Py_CLEAR(e->pos);
        advance(w);
    }
    WatchEntry *e = entry(w, w->tail++);
    e->key = Py_NewRef(key);
    e->pos = pos;
    return 0;
}

static int
drop(Watch *w, WatchEntry *e)
{
    if (PyDict_DelItem(w->dict, e->key) < 0)
        return -1;
    Py_CLEAR(e->key);
    Py_CLEAR(e->pos);
    advance(w);
    return 0;
}

int
hkv_watch_pop(Watch *w, PyObject *key, WatchInfo *info)
{
    WatchEntry *e = find(w, key);
    if (e == NULL)
        return -1;
    *info = e->info;
    return drop(w, e);
}

int
hkv_watch_put(Watch *w, PyObject *key, WatchInfo info)
{
    if (place(w, key) < 0)
        return -1;
    entry(w, w->tail - 1)->info = info;
    return 0;
}

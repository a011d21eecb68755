/* The hashes of evicted data an eviction policy remembers (_fp_watch.c): an
 * insertion-ordered map with O(1) put, pop and drop-the-oldest.
 *
 * Python sees a read-only mapping (`view`) of a dict from each hash to its
 * position in the order; a ring of (hash, position) entries in insertion
 * order finds the oldest. Removing a hash empties its ring entry; the ring
 * grows, or is compacted, when full. Putting a hash already watched makes it the
 * newest, as assigning an OrderedDict key and moving it to the end does. Each
 * entry carries a small record (`WatchInfo`) kept with it in the ring. */
#ifndef HKV_FP_WATCH_H
#define HKV_FP_WATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    Py_ssize_t mark;  /* the evicted block's LRU mark (hybrid.py's `_ghosts` value) */
} WatchInfo;

typedef struct {
    PyObject *key;  /* NULL: removed */
    PyObject *pos;  /* the dict's value for key */
    WatchInfo info;
} WatchEntry;

typedef struct {
    PyObject *dict;  /* hash -> position */
    PyObject *view;  /* types.MappingProxyType(dict) */
    WatchEntry *ring;
    Py_ssize_t cap;         /* a power of two */
    Py_ssize_t head, tail;  /* positions of the oldest entry and the next one */
} Watch;

int hkv_watch_init(Watch *w);  /* empty; -1 on error (the old contents are released) */
void hkv_watch_clear(Watch *w);
int hkv_watch_trim(Watch *w, Py_ssize_t limit);  /* forget the oldest while more are watched */
/* add `key` as the newest with `info` (moved there if watched already) */
int hkv_watch_put(Watch *w, PyObject *key, WatchInfo info);
/* remove `key`, its record in *info; KeyError when not watched */
int hkv_watch_pop(Watch *w, PyObject *key, WatchInfo *info);

static inline Py_ssize_t
hkv_watch_size(Watch *w)
{
    return w->dict ? PyDict_GET_SIZE(w->dict) : 0;
}

#endif

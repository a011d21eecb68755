/* Where a block would stand in one LRU free queue (_fp_lrupos.c): the model of
 * eviction/lru_positions.py, number for number. A release is marked by its
 * number and a base; its position is base - drift - (hits recorded on earlier
 * releases), counted over a ring of release numbers: one bit per release (hit
 * or not), and a Fenwick tree over words of 64 bits. */
#ifndef HKV_FP_LRUPOS_H
#define HKV_FP_LRUPOS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    int32_t *tree;      /* Fenwick tree over the words of `hit`, 1-based */
    uint64_t *hit;      /* bit s: a hit recorded on the release in ring slot s */
    Py_ssize_t words;   /* words of `hit` */
    Py_ssize_t live;    /* hits recorded in the ring */
    Py_ssize_t cap;     /* a power of two */
    Py_ssize_t next;    /* the next release number */
    Py_ssize_t records; /* hits recorded, ancient ones included */
    Py_ssize_t ancient; /* hits recorded on releases now older than the ring */
    Py_ssize_t drift;   /* blocks taken minus empty blocks released */
} LruPositions;

int hkv_lrupos_init(LruPositions *p, Py_ssize_t cap);  /* -1 with MemoryError */
void hkv_lrupos_clear(LruPositions *p);
/* marks a block released with `free` blocks ahead of it */
void hkv_lrupos_release(LruPositions *p, Py_ssize_t free, int empty, Py_ssize_t *number,
                        Py_ssize_t *base);
void hkv_lrupos_hit(LruPositions *p, Py_ssize_t number);
Py_ssize_t hkv_lrupos_position(LruPositions *p, Py_ssize_t number, Py_ssize_t base);

static inline void
hkv_lrupos_taken(LruPositions *p, Py_ssize_t count)
{
    p->drift += count;
}

static inline void
hkv_lrupos_to_front(LruPositions *p, Py_ssize_t number)
{
    hkv_lrupos_hit(p, number);
    p->drift--;
}

/* the ring's size for a pool of `pool` blocks remembering `ghost_pools` pools of
 * evictions (hybrid.py's lru_capacity) */
static inline Py_ssize_t
hkv_lrupos_capacity(Py_ssize_t ghost_pools, Py_ssize_t pool)
{
    Py_ssize_t need = (ghost_pools + 2) * pool, cap = 1;
    while (cap < need)
        cap <<= 1;
    return cap < 2 ? 2 : cap;
}

#endif

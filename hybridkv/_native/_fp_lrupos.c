/* LRU queue positions without the queue: see _fp_lrupos.h and
 * eviction/lru_positions.py (the reference, same numbers). */
#include "_fp_lrupos.h"

int
hkv_lrupos_init(LruPositions *p, Py_ssize_t cap)
{
    hkv_lrupos_clear(p);
    Py_ssize_t words = (cap + 63) / 64;
    p->tree = PyMem_Calloc((size_t)words + 1, sizeof(int32_t));
    p->hit = PyMem_Calloc((size_t)words, sizeof(uint64_t));
    if (p->tree == NULL || p->hit == NULL) {
        hkv_lrupos_clear(p);
        PyErr_NoMemory();
        return -1;
    }
    p->cap = cap;
    p->words = words;
    return 0;
}

void
hkv_lrupos_clear(LruPositions *p)
{
    PyMem_Free(p->tree);
    PyMem_Free(p->hit);
    p->tree = NULL;
    p->hit = NULL;
    p->cap = p->words = p->live = p->next = p->records = p->ancient = p->drift = 0;
}

static inline void
add(LruPositions *p, Py_ssize_t word, int32_t delta)
{
    for (Py_ssize_t i = word + 1; i <= p->words; i += i & -i)
        p->tree[i] += delta;
    p->live += delta;
}

/* hits recorded in ring slots [0, slot) */
static inline Py_ssize_t
prefix(LruPositions *p, Py_ssize_t slot)
{
    Py_ssize_t word = slot >> 6, total = 0;
    for (Py_ssize_t i = word; i > 0; i -= i & -i)
        total += p->tree[i];
    if (slot & 63)
        total += __builtin_popcountll(p->hit[word] & ((UINT64_C(1) << (slot & 63)) - 1));
    return total;
}

void
hkv_lrupos_release(LruPositions *p, Py_ssize_t free, int empty, Py_ssize_t *number,
                   Py_ssize_t *base)
{
    Py_ssize_t n = p->next++, slot = n & (p->cap - 1);
    uint64_t bit = UINT64_C(1) << (slot & 63);
    if (p->hit[slot >> 6] & bit) {  /* that slot's previous release leaves the ring */
        p->hit[slot >> 6] &= ~bit;
        add(p, slot >> 6, -1);
        p->ancient++;
    }
    *number = n;
    *base = free + p->drift + p->records;
    if (empty)
        p->drift--;
}

void
hkv_lrupos_hit(LruPositions *p, Py_ssize_t number)
{
    if (number < p->next - p->cap) {
        p->records++;
        p->ancient++;
        return;
    }
    Py_ssize_t slot = number & (p->cap - 1);
    uint64_t bit = UINT64_C(1) << (slot & 63);
    if (p->hit[slot >> 6] & bit)  /* recorded already: a release leaves the queue once */
        return;
    p->records++;
    p->hit[slot >> 6] |= bit;
    add(p, slot >> 6, 1);
}

Py_ssize_t
hkv_lrupos_position(LruPositions *p, Py_ssize_t number, Py_ssize_t base)
{
    Py_ssize_t start = p->next - p->cap, before = p->ancient;  /* start: the ring's oldest */
    if (number > start) {
        Py_ssize_t mask = p->cap - 1, lo = start < 0 ? 0 : start & mask, hi = number & mask;
        before += lo <= hi ? prefix(p, hi) - prefix(p, lo)
                           : p->live - prefix(p, lo) + prefix(p, hi);
    }
    return base - p->drift - before;
}

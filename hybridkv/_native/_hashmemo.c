/* The block-digest memo (see _hashmemo.h). A slot is two cache lines: its
 * header and, inline, an input of up to INLINE_INPUT bytes (a SHA-256 parent
 * and 16 tokens: 96), so a hit reads one place; longer inputs go to a buffer
 * of the slot's own. */
#include "_hashmemo.h"

#include <string.h>

#define XXH_INLINE_ALL
#include "_vendor/xxhash.h"

enum { MEMO_BITS = 13, MEMO_SLOTS = 1 << MEMO_BITS, INLINE_INPUT = 96 };

typedef struct {
    uint64_t key;
    PyObject *digest;     /* NULL: an empty slot */
    unsigned char *heap;  /* the input when longer than INLINE_INPUT */
    uint32_t len;         /* inputs of 4 GiB or more are not memoized */
    uint32_t capacity;    /* of heap */
    unsigned char input[INLINE_INPUT];
} Slot;  /* 128 bytes */

static Slot slots[MEMO_SLOTS] __attribute__((aligned(128)));

static inline Slot *
slot_of(uint64_t key)
{
    return &slots[key & (MEMO_SLOTS - 1)];
}

static inline const unsigned char *
input_of(const Slot *s)
{
    return s->len <= INLINE_INPUT ? s->input : s->heap;
}

PyObject *
hkv_memo_get(const unsigned char *input, size_t len, uint64_t *key)
{
    *key = XXH3_64bits(input, len);
    if (len > UINT32_MAX)
        return NULL;
    Slot *s = slot_of(*key);
    if (s->digest == NULL || s->key != *key || s->len != len || memcmp(input_of(s), input, len))
        return NULL;
    return Py_NewRef(s->digest);
}

int
hkv_memo_put(const unsigned char *input, size_t len, uint64_t key, PyObject *digest)
{
    if (len > UINT32_MAX)
        return 0;  /* not memoized */
    Slot *s = slot_of(key);
    unsigned char *dst = s->input;
    if (len > INLINE_INPUT) {
        if (s->capacity < len) {
            unsigned char *grown = PyMem_Realloc(s->heap, len);
            if (grown == NULL)
                return -1;
            s->heap = grown;
            s->capacity = (uint32_t)len;
        }
        dst = s->heap;
    }
    memcpy(dst, input, len);
    s->key = key;
    s->len = (uint32_t)len;
    Py_XSETREF(s->digest, Py_NewRef(digest));
    return 0;
}

void
hkv_memo_clear(void)
{
    for (int i = 0; i < MEMO_SLOTS; i++)
        Py_CLEAR(slots[i].digest);
}

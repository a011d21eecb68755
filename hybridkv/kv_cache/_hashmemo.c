/* The block-digest memo (see _hashmemo.h). */
#include "_hashmemo.h"

#include <string.h>

#define XXH_INLINE_ALL
#include "_vendor/xxhash.h"

enum { MEMO_BITS = 13, MEMO_SLOTS = 1 << MEMO_BITS };

typedef struct {
    uint64_t key;
    size_t len;
    size_t capacity;
    unsigned char *input;
    PyObject *digest;  /* NULL: an empty slot */
} Slot;

static Slot slots[MEMO_SLOTS];

static inline Slot *
slot_of(uint64_t key)
{
    return &slots[key & (MEMO_SLOTS - 1)];
}

PyObject *
hkv_memo_get(const unsigned char *input, size_t len, uint64_t *key)
{
    *key = XXH3_64bits(input, len);
    Slot *s = slot_of(*key);
    if (s->digest == NULL || s->key != *key || s->len != len || memcmp(s->input, input, len))
        return NULL;
    return Py_NewRef(s->digest);
}

int
hkv_memo_put(const unsigned char *input, size_t len, uint64_t key, PyObject *digest)
{
    Slot *s = slot_of(key);
    if (s->capacity < len) {
        unsigned char *grown = PyMem_Realloc(s->input, len);
        if (grown == NULL)
            return -1;
        s->input = grown;
        s->capacity = len;
    }
    memcpy(s->input, input, len);
    s->key = key;
    s->len = len;
    Py_XSETREF(s->digest, Py_NewRef(digest));
    return 0;
}

void
hkv_memo_clear(void)
{
    for (int i = 0; i < MEMO_SLOTS; i++)
        Py_CLEAR(slots[i].digest);
}

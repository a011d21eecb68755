/* Chained block hashing in C: the fast path of hybridkv/kv_cache/hashing.py.
 *
 * chain(algo_id, parent, token_ids, first_token, num_blocks, block_size, extra)
 * hashes num_blocks consecutive blocks of token_ids starting at first_token.
 * Block k's input is
 *
 *     previous digest (parent for k = 0) || block_size tokens as LE uint32 || extra
 *
 * and the result is the list of the num_blocks digests. The algorithm ids are
 * hashing.py's (`configure(algo_ids)`, called when it loads this module):
 * "sha256" is SHA-256 (_sha256.c: SHA-NI when the CPU has it, else portable
 * C), "xxhash" XXH3 128-bit in canonical (big-endian) form, the digest of
 * xxhash.xxh3_128_digest (the vendored header-only xxHash, _vendor/xxhash.h).
 * Nothing here needs a system header beyond Python's and the C library's,
 * nor links any library. Token ids must be ints in [0, 2**32)
 * (bools are rejected); anything else raises ValueError naming the value and
 * nothing is returned. The pure-Python loop in hashing.py is the reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_chainhash_api.h"
#include "_hashmemo.h"
#include "_sha256.h"

/* xxHash compiled into this module: no library, static symbols only */
#define XXH_INLINE_ALL
#include "_vendor/xxhash.h"

/* hashing._ALGO_IDS["sha256"] and ["xxhash"], set by configure (-1: not yet) */
static int ALGO_SHA256 = -1, ALGO_XXH3_128 = -1;
enum { MAX_DIGEST = 32, STACK_BUF = 4096 };

static const char BAD_TOKEN_FMT[] = "token_ids: token id %R is not an int in [0, 2**32)";

/* Raises the ValueError naming a bad token; returns -1. A pending
 * TypeError or OverflowError (from __index__ or the conversion) is replaced,
 * any other exception is left to propagate. */
static int
bad_token(PyObject *obj)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError) &&
            !PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
    }
    PyErr_Format(PyExc_ValueError, BAD_TOKEN_FMT, obj);
    return -1;
}

/* Tokens that are not exact ints: bools (refused), int subclasses and
 * objects with __index__ such as numpy integers (accepted, as `array` does). */
static int
read_token_slow(PyObject *obj, uint32_t *out)
{
    if (PyBool_Check(obj) || !PyIndex_Check(obj))
        return bad_token(obj);
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL)
        return bad_token(obj);
    unsigned long long v = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > 0xFFFFFFFFULL)
        return bad_token(obj);
    *out = (uint32_t)v;
    return 0;
}

/* Reads an exact int below 2**30 straight from its digit, without a call;
 * returns 0 when obj needs the general conversion. */
static inline int
read_small_int(PyObject *obj, uint32_t *out)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyLongObject *v = (PyLongObject *)obj;
    if (!PyUnstable_Long_IsCompact(v) || PyUnstable_Long_CompactValue(v) < 0)
        return 0;
    *out = (uint32_t)PyUnstable_Long_CompactValue(v);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(obj);  /* signed number of digits */
    if (size == 1) {
        *out = (uint32_t)((PyLongObject *)obj)->ob_digit[0];
        return 1;
    }
    if (size == 0) {
        *out = 0;
        return 1;
    }
    return 0;
#endif
}

/* One exact int token as a uint32; ValueError naming it unless in range. */
static inline int
read_exact_int(PyObject *obj, uint32_t *out)
{
    if (read_small_int(obj, out))
        return 0;
    unsigned long v = PyLong_AsUnsignedLong(obj);
    if (v <= 0xFFFFFFFFUL) {  /* (unsigned long)-1 on error is out of range too */
        *out = (uint32_t)v;
        return 0;
    }
    return bad_token(obj);
}

/* Any other token. Its __index__ may run Python code that resizes the
 * list being read, so the list is checked to be untouched afterwards. */
static int
read_other_token(PyObject *seq, PyObject *obj, uint32_t *out)
{
    PyObject *const *items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    Py_INCREF(obj);
    int rc = read_token_slow(obj, out);
    Py_DECREF(obj);
    if (rc == 0 && (PySequence_Fast_ITEMS(seq) != items || PySequence_Fast_GET_SIZE(seq) != size)) {
        PyErr_SetString(PyExc_RuntimeError, "token_ids changed while being hashed");
        return -1;
    }
    return rc;
}

static inline void
store_le32(unsigned char *dst, uint32_t v)
{
#if PY_LITTLE_ENDIAN
    memcpy(dst, &v, 4);
#else
    dst[0] = (unsigned char)v;
    dst[1] = (unsigned char)(v >> 8);
    dst[2] = (unsigned char)(v >> 16);
    dst[3] = (unsigned char)(v >> 24);
#endif
}

/* Writes tokens seq[start:start + n] as little-endian uint32 to dst. */
/* mirrors hybridkv.kv_cache.hashing.pack_tokens */
static int
pack_tokens(PyObject *seq, Py_ssize_t start, Py_ssize_t n, unsigned char *dst)
{
    PyObject *const *items = PySequence_Fast_ITEMS(seq) + start;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v;
        int rc = PyLong_CheckExact(items[i]) ? read_exact_int(items[i], &v)
                                             : read_other_token(seq, items[i], &v);
        if (rc < 0)
            return -1;  /* read_other_token also fails if items moved */
        store_le32(dst + 4 * i, v);
    }
    return 0;
}

static inline Py_ssize_t
digest_size(int algo)
{
    return algo == ALGO_SHA256 ? HKV_SHA256_DIGEST : (Py_ssize_t)sizeof(XXH128_canonical_t);
}

/* Digest of data[0:len] into out (digest_size(algo) bytes). */
static inline void
digest(int algo, const unsigned char *data, size_t len, unsigned char *out)
{
    if (algo == ALGO_SHA256) {
        hkv_sha256(data, len, out);
        return;
    }
    XXH128_hash_t h = XXH3_128bits(data, len);
    XXH128_canonicalFromHash((XXH128_canonical_t *)out, h);
}

/* memcpy, inlined for the two digest sizes. */
static inline void
copy_prefix(unsigned char *dst, const char *src, Py_ssize_t n)
{
    if (n == 32)
        memcpy(dst, src, 32);
    else if (n == 16)
        memcpy(dst, src, 16);
    else if (n > 0)
        memcpy(dst, src, (size_t)n);
}

/* The digest of one block input (a new bytes object): from the memo when
 * `memo` and it was hashed before, else computed (and memoized). */
static PyObject *
block_digest(int algo, const unsigned char *buf, size_t len, int memo)
{
    uint64_t key = 0;
    if (memo) {
        PyObject *known = hkv_memo_get(buf, len, &key);
        if (known != NULL)
            return known;
    }
    PyObject *h = PyBytes_FromStringAndSize(NULL, digest_size(algo));
    if (h == NULL)
        return NULL;
    digest(algo, buf, len, (unsigned char *)PyBytes_AS_STRING(h));
    if (memo && hkv_memo_put(buf, len, key, h) < 0) {
        Py_DECREF(h);
        return PyErr_NoMemory();
    }
    return h;
}

/* Hashes the chain into result (a list of num_blocks NULL slots).
 * buf holds one block input: [previous digest | tokens | extra]. */
/* mirrors hybridkv.kv_cache.hashing.BlockHasher._hash_run */
static int
run_chain(int algo, const char *parent, Py_ssize_t parent_len, PyObject *seq,
          Py_ssize_t first_token, Py_ssize_t num_blocks, Py_ssize_t block_size, const char *extra,
          Py_ssize_t extra_len, unsigned char *buf, PyObject *result, int memo)
{
    Py_ssize_t token_bytes = block_size * 4;
    Py_ssize_t out_len = digest_size(algo);
    const char *prev = parent;
    Py_ssize_t prev_len = parent_len;
    for (Py_ssize_t k = 0; k < num_blocks; k++) {
        copy_prefix(buf, prev, prev_len);
        unsigned char *tok = buf + prev_len;
        if (pack_tokens(seq, first_token + k * block_size, block_size, tok) < 0)
            return -1;
        if (extra_len > 0)
            memcpy(tok + token_bytes, extra, (size_t)extra_len);
        size_t len = (size_t)(prev_len + token_bytes + extra_len);
        PyObject *h = block_digest(algo, buf, len, memo);
        if (h == NULL)
            return -1;
        PyList_SET_ITEM(result, k, h);
        prev = PyBytes_AS_STRING(h);
        prev_len = out_len;
    }
    return 0;
}

static int
check_args(int algo, Py_ssize_t num_tokens, Py_ssize_t first_token, Py_ssize_t num_blocks,
           Py_ssize_t block_size)
{
    if (algo < 0 || (algo != ALGO_SHA256 && algo != ALGO_XXH3_128)) {
        PyErr_Format(PyExc_ValueError, "algo_id must be %d (sha256) or %d (xxhash), got %d",
                     ALGO_SHA256, ALGO_XXH3_128, algo);
        return -1;
    }
    if (block_size < 1 || block_size > (PY_SSIZE_T_MAX - 2 * MAX_DIGEST) / 8) {
        PyErr_Format(PyExc_ValueError, "block_size must be >= 1 (and fit in memory), got %zd",
                     block_size);
        return -1;
    }
    if (first_token < 0 || num_blocks < 0) {
        PyErr_Format(PyExc_ValueError, "first_token and num_blocks must be >= 0, got %zd, %zd",
                     first_token, num_blocks);
        return -1;
    }
    if (first_token > num_tokens || num_blocks > (num_tokens - first_token) / block_size) {
        PyErr_Format(PyExc_ValueError,
                     "token_ids: %zd blocks of %zd tokens from %zd exceed %zd tokens",
                     num_blocks, block_size, first_token, num_tokens);
        return -1;
    }
    return 0;
}

static PyObject *
chain_impl(int algo, const char *parent, Py_ssize_t parent_len, PyObject *seq,
           Py_ssize_t first_token, Py_ssize_t num_blocks, Py_ssize_t block_size,
           const char *extra, Py_ssize_t extra_len, int memo)
{
    if (check_args(algo, PySequence_Fast_GET_SIZE(seq), first_token, num_blocks, block_size) < 0)
        return NULL;
    PyObject *result = PyList_New(num_blocks);
    if (result == NULL || num_blocks == 0)
        return result;
    if (parent_len > PY_SSIZE_T_MAX / 4 || extra_len > PY_SSIZE_T_MAX / 4) {
        Py_DECREF(result);
        return PyErr_NoMemory();
    }
    Py_ssize_t prefix = parent_len > MAX_DIGEST ? parent_len : MAX_DIGEST;
    Py_ssize_t need = prefix + block_size * 4 + extra_len;
    unsigned char stack_buf[STACK_BUF];
    unsigned char *buf = need <= STACK_BUF ? stack_buf : PyMem_Malloc((size_t)need);
    if (buf == NULL) {
        Py_DECREF(result);
        return PyErr_NoMemory();
    }
    int rc = run_chain(algo, parent, parent_len, seq, first_token, num_blocks, block_size, extra,
                       extra_len, buf, result, memo);
    if (buf != stack_buf)
        PyMem_Free(buf);
    if (rc < 0) {
        Py_DECREF(result);  /* unfilled slots are NULL, which list dealloc skips */
        return NULL;
    }
    return result;
}

static PyObject *
chain_args(PyObject *args, int memo)
{
    int algo;
    const char *parent, *extra;
    Py_ssize_t parent_len, extra_len, first_token, num_blocks, block_size;
    PyObject *token_ids;
    if (!PyArg_ParseTuple(args, "iy#Onnny#:chain", &algo, &parent, &parent_len, &token_ids,
                          &first_token, &num_blocks, &block_size, &extra, &extra_len))
        return NULL;
    PyObject *seq = PySequence_Fast(token_ids, "token_ids must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    PyObject *result = chain_impl(algo, parent, parent_len, seq, first_token, num_blocks,
                                  block_size, extra, extra_len, memo && algo == ALGO_SHA256);
    Py_DECREF(seq);
    return result;
}

static PyObject *
chain(PyObject *Py_UNUSED(self), PyObject *args)
{
    return chain_args(args, 0);
}

#ifdef Py_GIL_DISABLED
#define MEMO_ON 0  /* the memo relies on the GIL */
#else
#define MEMO_ON 1
#endif

static PyObject *
chain_cached(PyObject *Py_UNUSED(self), PyObject *args)
{
    return chain_args(args, MEMO_ON);
}

static PyObject *
chain_for_api(int algo, const char *parent, Py_ssize_t parent_len, PyObject *seq,
              Py_ssize_t first_token, Py_ssize_t num_blocks, Py_ssize_t block_size,
              const char *extra, Py_ssize_t extra_len, int memo)
{
    return chain_impl(algo, parent, parent_len, seq, first_token, num_blocks, block_size, extra,
                      extra_len, memo && MEMO_ON && algo == ALGO_SHA256);
}

PyDoc_STRVAR(chain_cached_doc,
"chain_cached(algo_id, parent, token_ids, first_token, num_blocks, block_size, extra)\n"
"\n"
"chain(), with SHA-256 block digests taken from a bounded memo of recently\n"
"hashed block inputs when the same input was hashed before (the same digest\n"
"objects; see _hashmemo.h). The KV cache manager hashes requests with it.");

static PyObject *
clear_memo(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args))
{
    hkv_memo_clear();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(chain_doc,
"chain(algo_id, parent, token_ids, first_token, num_blocks, block_size, extra) -> list[bytes]\n"
"\n"
"Chained digests of the num_blocks blocks of token_ids[first_token:\n"
"first_token + num_blocks * block_size]. Block k hashes the previous digest\n"
"(parent for k = 0), its tokens as little-endian uint32, then extra.\n"
"algo_id: 0 = sha256, 1 = xxhash (XXH3 128-bit, canonical). Raises\n"
"ValueError for token ids that are not ints in [0, 2**32) and bad ranges.");

/* mirrors hybridkv.kv_cache.hashing.max_token_id */
static PyObject *
max_token(PyObject *Py_UNUSED(self), PyObject *token_ids)
{
    PyObject *seq = PySequence_Fast(token_ids, "token_ids must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint32_t best = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PySequence_Fast_ITEMS(seq)[i];  /* re-read: __index__ may resize */
        uint32_t v;
        int rc = PyLong_CheckExact(obj) ? read_exact_int(obj, &v)
                                        : read_other_token(seq, obj, &v);
        if (rc < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (v > best)
            best = v;
    }
    Py_DECREF(seq);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "token_ids: max of no tokens");
        return NULL;
    }
    return PyLong_FromUnsignedLong(best);
}

PyDoc_STRVAR(max_token_doc,
"max_token(token_ids) -> int\n"
"\n"
"The largest token id, after checking every one is an int in [0, 2**32) as\n"
"chain() does (ValueError naming the first that is not, or for no tokens).");

static PyObject *
sha256_backend(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args))
{
    return PyUnicode_FromString(hkv_sha256_backend());
}

PyDoc_STRVAR(sha256_backend_doc,
"sha256_backend() -> str\n"
"\n"
"The SHA-256 compression in use: 'sha-ni' (x86 SHA extensions, found at\n"
"import) or 'portable' (plain C).");

static PyObject *
force_portable_sha256(PyObject *Py_UNUSED(self), PyObject *flag)
{
    int portable = PyObject_IsTrue(flag);
    if (portable < 0)
        return NULL;
    return PyUnicode_FromString(hkv_sha256_force_portable(portable));
}

PyDoc_STRVAR(force_portable_sha256_doc,
"force_portable_sha256(flag) -> str\n"
"\n"
"Use the portable SHA-256 compression (flag true) or the CPU's best (false);\n"
"returns the backend now in use. The digests are the same; for tests and\n"
"benchmarks.");

static HkvChainApi chain_api;

static int
algo_id(PyObject *ids, const char *name, int *out)
{
    PyObject *v = PyDict_GetItemString(ids, name);
    long id = v != NULL && PyLong_Check(v) ? PyLong_AsLong(v) : -1;
    if (id < 0 || id > INT_MAX) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "configure: algo_ids[%s] must be an int >= 0", name);
        return -1;
    }
    *out = (int)id;
    return 0;
}

/* configure(algo_ids): the algorithm ids from their one source, hashing._ALGO_IDS. */
static PyObject *
configure(PyObject *Py_UNUSED(self), PyObject *ids)
{
    int sha, xxh;
    if (!PyDict_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "configure: algo_ids must be a dict");
        return NULL;
    }
    if (algo_id(ids, "sha256", &sha) < 0 || algo_id(ids, "xxhash", &xxh) < 0)
        return NULL;
    if (sha == xxh) {
        PyErr_SetString(PyExc_ValueError, "configure: the algorithm ids must differ");
        return NULL;
    }
    ALGO_SHA256 = chain_api.sha256_id = sha;
    ALGO_XXH3_128 = xxh;
    Py_RETURN_NONE;
}

static PyMethodDef chainhash_methods[] = {
    {"configure", configure, METH_O,
     "configure(algo_ids): the algorithm ids chain() takes (hashing.py, on import)."},
    {"chain", chain, METH_VARARGS, chain_doc},
    {"chain_cached", chain_cached, METH_VARARGS, chain_cached_doc},
    {"clear_memo", clear_memo, METH_NOARGS, "Empty chain_cached's memo (for tests)."},
    {"max_token", max_token, METH_O, max_token_doc},
    {"sha256_backend", sha256_backend, METH_NOARGS, sha256_backend_doc},
    {"force_portable_sha256", force_portable_sha256, METH_O, force_portable_sha256_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef chainhash_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hybridkv._native._chainhash",
    .m_doc = "C fast path of hybridkv.kv_cache.hashing (chained block hashes).",
    .m_size = -1,
    .m_methods = chainhash_methods,
};

/* For other C extensions (hybridkv._native._fastpath): chain_impl as a function
 * pointer in the capsule `_C_API`, so that extending a request's hashes needs no
 * argument tuple. */
static HkvChainApi chain_api = {chain_for_api, -1};  /* sha256_id: set by configure */

PyMODINIT_FUNC
PyInit__chainhash(void)
{
    hkv_sha256_init();
    PyObject *module = PyModule_Create(&chainhash_module);
    if (module == NULL)
        return NULL;
    PyObject *api = PyCapsule_New(&chain_api, HKV_CHAIN_API_NAME, NULL);
    if (api == NULL || PyModule_AddObject(module, "_C_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

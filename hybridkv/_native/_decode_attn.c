/* Decode attention read straight from a paged KV cache (float32, CPU).
 *
 * One query token per sequence. Sequence s sees `counts[s]` keys, the cache rows
 * `rows[s * max_keys + j]` (j < counts[s]); a row holds every KV head of one token,
 * `row_stride` floats apart. For each (sequence, KV head) the kernel reads each key
 * row and each value row once, for all the query heads that share that KV head:
 *
 *     score[g][j] = scale * dot(q[s, h * G + g], K[row j, h])
 *     (with a softcap c > 0: score -> c * tanh(score / c), as Gemma 2 caps its logits;
 *     with sink logits, sinks[h * G + g] joins the softmax's denominator as a key
 *     without a value, as gpt-oss's attention sinks do)
 *     out[s, h * G + g] = sum_j softmax(score[g])[j] * V[row j, h]
 *
 * Nothing is gathered into a temporary copy, which is what a decode step of a model
 * with large heads spends its time on in the torch path. The caller checks shapes,
 * dtypes and bounds (`hybridkv/kernels/decode_native.py`); this file trusts them.
 * The GIL is released while it computes. With `threads` > 1 and enough keys to read
 * (`MIN_PARALLEL_FLOATS`), the sequences are split into that many contiguous runs of about
 * equal key counts, each computed on its own OpenMP thread (at the Gemma 3 270M shape
 * this is a quarter of a decode step, bound by the kernel's own arithmetic, and two
 * threads halve it). Each sequence is still computed by one thread in one order, so the
 * results do not depend on the thread count. torch's pip wheels use GNU OpenMP, so the
 * threads are torch's own; under another OpenMP runtime they would be a second pool.
 *
 * mirrors hybridkv.kernels.attention_decode (the gather + scaled_dot_product_attention
 * path, which runs where this extension is not built or the layer is not float32 on CPU).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_simd.h"

typedef struct {
    const float *q;        /* [S, Hq, D] */
    float *out;            /* [S, Hq, D] */
    const float *k;        /* row r, head h at k + r * row_stride + h * D */
    const float *v;
    const int64_t *rows;   /* [S, max_keys] */
    const int64_t *counts; /* [S] */
    Py_ssize_t num_seqs, num_q_heads, num_kv_heads, head_dim, max_keys, row_stride;
    float scale;
    float softcap;         /* 0: none */
    const float *sinks;    /* [Hq] sink logits, or NULL */
} DecodeArgs;

/* A score after the optional softcap, in torch's order: divide, tanh, multiply. */
static inline float capped(const DecodeArgs *a, float score)
{
    return a->softcap > 0.0f ? a->softcap * tanhf(score / a->softcap) : score;
}

/* dot(a, b) over n floats, with LANES independent sums (vectorizable without
 * reassociating one running sum). */
HKV_CLONES
static float dot(const float *a, const float *b, Py_ssize_t n)
{
    float acc[LANES] = {0};
    Py_ssize_t d = 0;
    for (; d + LANES <= n; d += LANES)
        for (int i = 0; i < LANES; i++)
            acc[i] += a[d + i] * b[d + i];
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++)
        sum += acc[i];
    for (; d < n; d++)
        sum += a[d] * b[d];
    return sum;
}

/* dots[g] = dot(q + g * n, k) for 4 query heads at once: one pass over the key row with
 * 4 x 2 independent LANES-wide sums, so the multiply-adds do not wait on each other. */
HKV_CLONES
static void dot4(const float *q, const float *k, Py_ssize_t n, float *dots)
{
    float acc[4][2 * LANES] = {{0}};
    Py_ssize_t d = 0;
    for (; d + 2 * LANES <= n; d += 2 * LANES)
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < 2 * LANES; i++)
                acc[g][i] += q[g * n + d + i] * k[d + i];
    for (int g = 0; g < 4; g++) {
        float sum = 0.0f;
        for (int i = 0; i < 2 * LANES; i++)
            sum += acc[g][i];
        for (Py_ssize_t t = d; t < n; t++)
            sum += q[g * n + t] * k[t];
        dots[g] = sum;
    }
}

/* acc[0:n] += w * x[0:n] */
HKV_CLONES
static void axpy(float *acc, float w, const float *x, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        acc[d] += w * x[d];
}

#define PREFETCH_AHEAD 2  /* rows */

/* Ask for the cache lines of the `n` floats at x (a row read a little later). */
static inline void prefetch_row(const float *x, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d += 64 / (Py_ssize_t)sizeof(float))
        __builtin_prefetch(x + d, 0, 3);
}

/* scores[g * L + j] for the `group` query heads at q, against keys 0..n-1. */
static void score_keys(const DecodeArgs *a, const float *q, const int64_t *rows,
                       Py_ssize_t n, Py_ssize_t kv_head, Py_ssize_t group, float *scores)
{
    Py_ssize_t D = a->head_dim;
    for (Py_ssize_t j = 0; j < n; j++) {
        const float *key = a->k + rows[j] * a->row_stride + kv_head * D;
        if (j + PREFETCH_AHEAD < n)
            prefetch_row(a->k + rows[j + PREFETCH_AHEAD] * a->row_stride + kv_head * D, D);
        Py_ssize_t g = 0;
        for (; g + 4 <= group; g += 4) {
            float dots[4];
            dot4(q + g * D, key, D, dots);
            for (int i = 0; i < 4; i++)
                scores[(g + i) * a->max_keys + j] = capped(a, a->scale * dots[i]);
        }
        for (; g < group; g++)
            scores[g * a->max_keys + j] = capped(a, a->scale * dot(q + g * D, key, D));
    }
}

/* In place: scores[0:n] -> exp(scores - max); returns their sum, plus exp(*sink - max)
 * when `sink` is given (the max then counts the sink too). */
static float softmax_weights(float *scores, Py_ssize_t n, const float *sink)
{
    float top = scores[0];
    for (Py_ssize_t j = 1; j < n; j++)
        top = scores[j] > top ? scores[j] : top;
    if (sink != NULL && *sink > top)
        top = *sink;
    float sum = 0.0f;
    for (Py_ssize_t j = 0; j < n; j++) {
        scores[j] = expf(scores[j] - top);
        sum += scores[j];
    }
    if (sink != NULL)
        sum += expf(*sink - top);
    return sum;
}

/* out[g] = sum_j weights[g][j] * V[row j] / norm[g] for the group's query heads. */
static void mix_values(const DecodeArgs *a, const float *weights, const float *norms,
                       const int64_t *rows, Py_ssize_t n, Py_ssize_t kv_head,
                       Py_ssize_t group, float *out)
{
    Py_ssize_t D = a->head_dim;
    memset(out, 0, (size_t)(group * D) * sizeof(float));
    for (Py_ssize_t j = 0; j < n; j++) {
        const float *value = a->v + rows[j] * a->row_stride + kv_head * D;
        if (j + PREFETCH_AHEAD < n)
            prefetch_row(a->v + rows[j + PREFETCH_AHEAD] * a->row_stride + kv_head * D, D);
        for (Py_ssize_t g = 0; g < group; g++)
            axpy(out + g * D, weights[g * a->max_keys + j], value, D);
    }
    for (Py_ssize_t g = 0; g < group; g++) {
        float inv = 1.0f / norms[g];
        for (Py_ssize_t d = 0; d < D; d++)
            out[g * D + d] *= inv;
    }
}

/* Sequence s over its first n cache rows `rows`. */
static void decode_seq(const DecodeArgs *a, Py_ssize_t s, const int64_t *rows, Py_ssize_t n,
                       float *scores, float *norms)
{
    Py_ssize_t group = a->num_q_heads / a->num_kv_heads, D = a->head_dim;
    for (Py_ssize_t h = 0; h < a->num_kv_heads; h++) {
        Py_ssize_t first = (s * a->num_q_heads + h * group) * D;
        score_keys(a, a->q + first, rows, n, h, group, scores);
        for (Py_ssize_t g = 0; g < group; g++)
            norms[g] = softmax_weights(scores + g * a->max_keys, n,
                                       a->sinks ? a->sinks + h * group + g : NULL);
        mix_values(a, scores, norms, rows, n, h, group, a->out + first);
    }
}

/* Where a sequence's keys lie in a block table: key j of sequence s is at position
 * firsts[s] + j, in block table[s * width + pos / block_size], row
 * block * rows_per_block + pos % block_size. */
typedef struct {
    const int32_t *table;   /* [S, width] */
    const int64_t *firsts;  /* [S] */
    Py_ssize_t width, block_size, rows_per_block;
} TableArgs;

/* Floats before the rows in one thread's scratch space: scores (group * max_keys) and
 * norms (group), rounded up to an even count so that the int64 rows are aligned. */
static size_t rows_offset(const DecodeArgs *a)
{
    size_t group = (size_t)(a->num_q_heads / a->num_kv_heads);
    size_t floats = group * (size_t)a->max_keys + group;
    return floats + (floats & 1);
}

/* Floats of one thread's scratch space: the above, then max_keys int64 rows. */
static size_t work_floats(const DecodeArgs *a)
{
    return rows_offset(a) + 2 * (size_t)a->max_keys;
}

/* Sequences [first, last) with the rows of a->rows, or (t given) found from the table
 * into the scratch space `work` (see rows_offset). */
static void decode_range(const DecodeArgs *a, const TableArgs *t, Py_ssize_t first,
                         Py_ssize_t last, float *work)
{
    Py_ssize_t group = a->num_q_heads / a->num_kv_heads;
    float *scores = work, *norms = work + group * a->max_keys;
    int64_t *rows = (int64_t *)(work + rows_offset(a));
    for (Py_ssize_t s = first; s < last; s++) {
        Py_ssize_t n = (Py_ssize_t)a->counts[s];
        if (t == NULL) {
            decode_seq(a, s, a->rows + s * a->max_keys, n, scores, norms);
            continue;
        }
        const int32_t *blocks = t->table + s * t->width;
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t pos = t->firsts[s] + j;
            rows[j] = (int64_t)blocks[pos / t->block_size] * t->rows_per_block
                      + pos % t->block_size;
        }
        decode_seq(a, s, rows, n, scores, norms);
    }
}

#define MAX_THREADS 64
/* K floats a call must read before a second thread pays for its start (about 2 MB of K
 * and V: the Gemma 3 270M shape's layers from about 128 keys a sequence, 8 sequences;
 * the small presets' calls stay on one thread). */
#define MIN_PARALLEL_FLOATS (1 << 18)

typedef struct {
    Py_ssize_t first, last;
} Part;

/* Every sequence, on up to `threads` threads (the caller's among them): OpenMP's, the
 * pool torch's own CPU operators run on (one libgomp per process), so its threads,
 * still waiting for work after the step's last product, pick the parts up at once.
 * Returns -1 when out of memory (nothing computed), else 0. */
static int decode_parallel(const DecodeArgs *a, const TableArgs *t, Py_ssize_t threads)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t s = 0; s < a->num_seqs; s++)
        total += (Py_ssize_t)a->counts[s];
    double floats = (double)total * (double)(a->num_kv_heads * a->head_dim);
    if (threads > a->num_seqs)
        threads = a->num_seqs;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads < 2 || floats < (double)MIN_PARALLEL_FLOATS)
        threads = 1;
    size_t per = work_floats(a);
    float *work = malloc(per * (size_t)threads * sizeof(float));
    if (work == NULL)
        return -1;
    Part parts[MAX_THREADS];
    Py_ssize_t s = 0, done = 0;
    for (Py_ssize_t i = 0; i < threads; i++) {  /* contiguous runs of about total/threads keys */
        parts[i].first = s;
        Py_ssize_t goal = total * (i + 1) / threads;
        while (s < a->num_seqs && (i == threads - 1 || done < goal)) {
            done += (Py_ssize_t)a->counts[s];
            s++;
        }
        parts[i].last = s;
    }
    int count = (int)threads;
#pragma omp parallel for num_threads(count) schedule(static, 1) if (count > 1)
    for (int i = 0; i < count; i++)
        decode_range(a, t, parts[i].first, parts[i].last, work + per * (size_t)i);
    free(work);
    return 0;
}

static void *as_pointer(PyObject *value)
{
    return PyLong_AsVoidPtr(value);
}

/* decode(q, out, k, v, rows, counts, num_seqs, num_q_heads, num_kv_heads, head_dim,
 *        max_keys, row_stride, scale[, threads]): addresses as ints, sizes in elements;
 *        threads: at most this many threads compute (1, the default: the caller's). */
static PyObject *decode(PyObject *self, PyObject *args)
{
    PyObject *q, *out, *k, *v, *rows, *counts;
    DecodeArgs a;
    Py_ssize_t threads = 1;
    a.softcap = 0.0f;
    a.sinks = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnnnnf|n", &q, &out, &k, &v, &rows, &counts,
                          &a.num_seqs, &a.num_q_heads, &a.num_kv_heads, &a.head_dim,
                          &a.max_keys, &a.row_stride, &a.scale, &threads))
        return NULL;
    a.q = as_pointer(q);
    a.out = as_pointer(out);
    a.k = as_pointer(k);
    a.v = as_pointer(v);
    a.rows = as_pointer(rows);
    a.counts = as_pointer(counts);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t group = a.num_kv_heads > 0 ? a.num_q_heads / a.num_kv_heads : 0;
    if (a.max_keys < 1 || group < 1 || a.head_dim < 1)
        return PyErr_Format(PyExc_ValueError, "decode: bad sizes");
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = decode_parallel(&a, NULL, threads);
    Py_END_ALLOW_THREADS
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* decode_table(q, out, k, v, table, firsts, counts, num_seqs, num_q_heads, num_kv_heads,
 *              head_dim, max_keys, row_stride, scale, width, block_size, rows_per_block
 *              [, softcap, sinks, threads]): as `decode`, the rows found from the block
 *              table (see TableArgs); softcap 0 (the default) caps nothing; sinks: the
 *              address of Hq float32 sink logits, or 0 (the default) for none. */
static PyObject *decode_table(PyObject *self, PyObject *args)
{
    PyObject *q, *out, *k, *v, *table, *firsts, *counts;
    DecodeArgs a;
    TableArgs t;
    PyObject *sinks = NULL;
    Py_ssize_t threads = 1;
    a.softcap = 0.0f;
    if (!PyArg_ParseTuple(args, "OOOOOOOnnnnnnfnnn|fOn", &q, &out, &k, &v, &table, &firsts,
                          &counts, &a.num_seqs, &a.num_q_heads, &a.num_kv_heads, &a.head_dim,
                          &a.max_keys, &a.row_stride, &a.scale, &t.width, &t.block_size,
                          &t.rows_per_block, &a.softcap, &sinks, &threads))
        return NULL;
    a.sinks = sinks == NULL ? NULL : as_pointer(sinks);
    if (!(a.softcap >= 0.0f))
        return PyErr_Format(PyExc_ValueError, "decode_table: softcap must be >= 0");
    a.q = as_pointer(q);
    a.out = as_pointer(out);
    a.k = as_pointer(k);
    a.v = as_pointer(v);
    a.rows = NULL;
    a.counts = as_pointer(counts);
    t.table = as_pointer(table);
    t.firsts = as_pointer(firsts);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t group = a.num_kv_heads > 0 ? a.num_q_heads / a.num_kv_heads : 0;
    if (a.max_keys < 1 || group < 1 || a.head_dim < 1 || t.block_size < 1)
        return PyErr_Format(PyExc_ValueError, "decode_table: bad sizes");
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = decode_parallel(&a, &t, threads);
    Py_END_ALLOW_THREADS
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "Decode attention from a paged cache, written into `out` (see the module's C source)."},
    {"decode_table", decode_table, METH_VARARGS,
     "Decode attention from a paged cache addressed by a block table (see the C source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode_attn", "Decode attention from a paged KV cache.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__decode_attn(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MIN_PARALLEL_FLOATS", MIN_PARALLEL_FLOATS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

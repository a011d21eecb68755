/* RMSNorm, residual add and rotary embedding on rows of float32, in as few passes as the
 * arithmetic allows (CPU).
 *
 * A decode step of a small model is hundreds of torch calls on rows of a few hundred
 * floats, and each call costs more in dispatch than in arithmetic: torch's RMSNorm alone
 * is six of them. Here one call does what a decoder layer needs between its matrix
 * products:
 *
 *     norm(x)                       out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w
 *     residual_norm(h, x)           h'[r] = h[r] + norm_a(x[r]) (or + x[r]);
 *                                   y[r] = norm_b(h'[r])
 *     head_norm_rope(q), (k)        per head: optional norm, then the rotary rotation
 *                                   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
 *
 * Each product and sum is rounded as torch rounds it (the build turns off contraction
 * into fused multiply-adds), so the results equal torch's except for the order in which
 * a row's squares are summed. The caller checks shapes, strides and dtypes
 * (`hybridkv/kernels/norm_rope.py`, which also holds the torch reference); this file
 * trusts them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "_simd.h"

/* 1 / sqrt(mean(x[0:n]^2) + eps), the sum taken in LANES independent parts. */
HKV_CLONES
static float inverse_rms(const float *x, Py_ssize_t n, float eps)
{
    float acc[LANES] = {0};
    Py_ssize_t d = 0;
    for (; d + LANES <= n; d += LANES)
        for (int i = 0; i < LANES; i++)
            acc[i] += x[d + i] * x[d + i];
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++)
        sum += acc[i];
    for (; d < n; d++)
        sum += x[d] * x[d];
    return 1.0f / sqrtf(sum / (float)n + eps);
}

/* out[0:n] = x[0:n] * inv * w[0:n] (x * inv rounded first, as torch computes it) */
HKV_CLONES
static void scale_row(const float *x, float inv, const float *w, float *out, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        out[d] = (x[d] * inv) * w[d];
}

/* out[0:n] = h[0:n] + x[0:n] * inv * w[0:n] (out may be h) */
HKV_CLONES
static void add_scaled_row(const float *h, const float *x, float inv, const float *w,
                           float *out, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        out[d] = h[d] + (x[d] * inv) * w[d];
}

/* out[0:n] = h[0:n] + x[0:n] (out may be h) */
HKV_CLONES
static void add_row(const float *h, const float *x, float *out, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        out[d] = h[d] + x[d];
}

/* x[0:2m] <- (x1 cos - x2 sin, x2 cos + x1 sin), x1 = x[0:m], x2 = x[m:2m] */
HKV_CLONES
static void rotate_halves(float *x, const float *cos, const float *sin, Py_ssize_t m)
{
    float *x2 = x + m;
    for (Py_ssize_t d = 0; d < m; d++) {
        float a = x[d], b = x2[d];
        x[d] = a * cos[d] - b * sin[d];
        x2[d] = b * cos[d] + a * sin[d];
    }
}

static void *as_pointer(PyObject *value)
{
    return value == Py_None ? NULL : PyLong_AsVoidPtr(value);
}

/* norm(x, out, w, rows, dim, x_stride, eps): out [rows, dim] contiguous */
static PyObject *norm(PyObject *self, PyObject *args)
{
    PyObject *xo, *outo, *wo;
    Py_ssize_t rows, dim, stride;
    float eps;
    if (!PyArg_ParseTuple(args, "OOOnnnf", &xo, &outo, &wo, &rows, &dim, &stride, &eps))
        return NULL;
    const float *x = as_pointer(xo), *w = as_pointer(wo);
    float *out = as_pointer(outo);
    if (PyErr_Occurred())
        return NULL;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *row = x + r * stride;
        scale_row(row, inverse_rms(row, dim, eps), w, out + r * dim, dim);
    }
    Py_RETURN_NONE;
}

/* residual_norm(h, x, wa, wb, h_out, y, rows, dim, x_stride, eps_a, eps_b): h and h_out
 * [rows, dim] contiguous (h_out may be h); wa None: plain add; y None: no second norm. */
static PyObject *residual_norm(PyObject *self, PyObject *args)
{
    PyObject *ho, *xo, *wao, *wbo, *outo, *yo;
    Py_ssize_t rows, dim, stride;
    float eps_a, eps_b;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnff", &ho, &xo, &wao, &wbo, &outo, &yo, &rows, &dim,
                          &stride, &eps_a, &eps_b))
        return NULL;
    const float *h = as_pointer(ho), *x = as_pointer(xo);
    const float *wa = as_pointer(wao), *wb = as_pointer(wbo);
    float *out = as_pointer(outo), *y = as_pointer(yo);
    if (PyErr_Occurred())
        return NULL;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * stride;
        float *hr = out + r * dim;
        if (wa != NULL)
            add_scaled_row(h + r * dim, xr, inverse_rms(xr, dim, eps_a), wa, hr, dim);
        else
            add_row(h + r * dim, xr, hr, dim);
        if (y != NULL)
            scale_row(hr, inverse_rms(hr, dim, eps_b), wb, y + r * dim, dim);
    }
    Py_RETURN_NONE;
}

/* Heads of `tokens` rows at x (row t, head j at x + t * stride + j * dim), in place:
 * normed by w when w is not NULL, then rotated by cos/sin [tokens, dim / 2]. */
static void heads_norm_rope(float *x, Py_ssize_t tokens, Py_ssize_t heads, Py_ssize_t dim,
                            Py_ssize_t stride, const float *w, float eps, const float *cos,
                            const float *sin)
{
    Py_ssize_t half = dim / 2;
    for (Py_ssize_t t = 0; t < tokens; t++)
        for (Py_ssize_t j = 0; j < heads; j++) {
            float *head = x + t * stride + j * dim;
            if (w != NULL)
                scale_row(head, inverse_rms(head, dim, eps), w, head, dim);
            rotate_halves(head, cos + t * half, sin + t * half, half);
        }
}

/* qk_norm_rope(q, k, qw, kw, cos, sin, tokens, q_heads, k_heads, dim, q_stride, k_stride,
 *              eps): q and k in place; qw / kw None: no norm. */
static PyObject *qk_norm_rope(PyObject *self, PyObject *args)
{
    PyObject *qo, *ko, *qwo, *kwo, *coso, *sino;
    Py_ssize_t tokens, q_heads, k_heads, dim, q_stride, k_stride;
    float eps;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnnnnf", &qo, &ko, &qwo, &kwo, &coso, &sino,
                          &tokens, &q_heads, &k_heads, &dim, &q_stride, &k_stride, &eps))
        return NULL;
    float *q = as_pointer(qo), *k = as_pointer(ko);
    const float *qw = as_pointer(qwo), *kw = as_pointer(kwo);
    const float *cos = as_pointer(coso), *sin = as_pointer(sino);
    if (PyErr_Occurred())
        return NULL;
    heads_norm_rope(q, tokens, q_heads, dim, q_stride, qw, eps, cos, sin);
    heads_norm_rope(k, tokens, k_heads, dim, k_stride, kw, eps, cos, sin);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"norm", norm, METH_VARARGS, "RMSNorm of rows into `out` (see the module's C source)."},
    {"residual_norm", residual_norm, METH_VARARGS,
     "h_out = h + norm_a(x); y = norm_b(h_out) (see the module's C source)."},
    {"qk_norm_rope", qk_norm_rope, METH_VARARGS,
     "Per-head RMSNorm and rotary embedding of q and k, in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_norm_rope", "RMSNorm, residual add and rotary on float32 rows.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__norm_rope(void)
{
    return PyModule_Create(&module);
}

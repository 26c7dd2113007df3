/* The groundwork every quantization driver shares: row I/O, the absmax pass and the NaN/Inf scan (through the
 * dispatched bulk helpers), the input checks, and the plan: a format's per-tensor scales and per-row arguments,
 * resolved and checked once (calibrated amax state against the tensor) for quantize, fake quant and calibration. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant_internal.h"
#include "cpu/fast_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- row I/O helpers ------------------------------------------------------------------------ */

/* Row I/O, the absmax pass and the NaN/Inf scan go through the dispatched bulk helpers in
 * fast_dispatch.c (AVX2/F16C when the CPU has them): exact conversions, so only speed changes. */
void nbq_load_row(const void *base, nb_dtype dt, int64_t row, int64_t n, float *out) {
    nbq_fast_load_f32((const uint8_t *)base + row * n * (dt == NB_F32 ? 4 : 2), dt, n, out);
}

void nbq_store_row(void *base, nb_dtype dt, int64_t row, int64_t n, const float *in) {
    nbq_fast_store_f32((uint8_t *)base + row * n * (dt == NB_F32 ? 4 : 2), dt, n, in);
}

int64_t nbq_find_nonfinite(const void *base, nb_dtype dt, int64_t n) {
    int nonfinite = 0;
    nbq_fast_absmax(base, dt, n, &nonfinite);   /* one vectorized pass; the search below runs only on failure */
    if (!nonfinite) return -1;
    if (dt == NB_F32) {
        const float *p = base;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(p[i])) return i;
    } else if (dt == NB_BF16) {
        const uint16_t *p = base;
        for (int64_t i = 0; i < n; i++)
            if ((p[i] & 0x7F80) == 0x7F80) return i;
    } else if (dt == NB_F16) {
        const uint16_t *p = base;
        for (int64_t i = 0; i < n; i++)
            if ((p[i] & 0x7C00) == 0x7C00) return i;
    }
    return -1;
}

/* max |x| over a tensor, NaN ignored and Inf the max: the threaded vectorized pass, and on a
 * non-finite value (rare: callers usually reject those first) a plain scan with that meaning. */
float nbq_absmax(nb_ctx *ctx, const void *base, nb_dtype dt, int64_t n) {
    int nonfinite = 0;
    float m = nbq_fast_absmax_mt(ctx, base, dt, n, &nonfinite);
    if (!nonfinite) return m;
    float buf[256];
    m = 0.0f;
    for (int64_t i = 0; i < n; i += 256) {
        int64_t k = n - i < 256 ? n - i : 256;
        nbq_load_row((const uint8_t *)base + i * nb_dtype_nbytes(dt, 1), dt, 0, k, buf);
        for (int64_t t = 0; t < k; t++) {
            float v = fabsf(buf[t]);
            if (v > m) m = v;
        }
    }
    return m;
}

nb_status nbq_check_input(nb_ctx *ctx, const nb_tensor *x, nb_qformat f, const char *what) {
    nb_status s = nbq_check_input_any(ctx, x, f, what);
    if (!s && x->device >= 0)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: device tensors are not supported by the CPU quantizer", what);
    return s;
}

nb_status nbq_check_input_any(nb_ctx *ctx, const nb_tensor *x, nb_qformat f, const char *what) {
    nb_status se = nbq_env_path_status(ctx);   /* a bad NIBBLE_QUANT_PATH fails here, never silently */
    if (se) return se;
    const nb_qformat_traits *tr = nb_qformat_info(f);
    if (!tr || f == NB_FMT_NONE) return nb_fail(ctx, NB_ERR_INVALID, "%s: unknown or empty quantization format %d", what, (int)f);
    if (!x) return nb_fail(ctx, NB_ERR_INVALID, "%s: tensor is NULL", what);
    if (x->dtype != NB_F32 && x->dtype != NB_BF16 && x->dtype != NB_F16)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s input: %s quantizes f32, bf16 or f16 tensors", what,
                       nb_dtype_info(x->dtype)->name, tr->name);
    if (x->ndim < 1) return nb_fail(ctx, NB_ERR_SHAPE, "%s: %s needs a tensor with at least one dimension", what, tr->name);
    int64_t n = x->shape[x->ndim - 1];
    if (tr->block_size && n % tr->block_size)
        return nb_fail(ctx, NB_ERR_SHAPE,
                       "%s: last dimension (dim %d) is %lld, not divisible by the %s block size %d", what,
                       x->ndim - 1, (long long)n, tr->name, tr->block_size);
    return NB_OK;
}

nb_status nbq_contiguous(nb_ctx *ctx, const nb_tensor *x, nb_tensor **out) {
    if (nb_tensor_is_contiguous(x)) {
        nb_tensor_retain((nb_tensor *)x);
        *out = (nb_tensor *)x;
        return NB_OK;
    }
    return nb_tensor_contiguous(ctx, x, out);
}

nb_status nbq_check_finite(nb_ctx *ctx, const nb_tensor *x, const char *what) {
    return nbq_check_finite_why(ctx, x, what, "; quantization needs finite values");
}

nb_status nbq_check_finite_why(nb_ctx *ctx, const nb_tensor *x, const char *what, const char *why) {
    int nonfinite = 0;
    nbq_fast_absmax_mt(ctx, nb_tensor_data(x), x->dtype, nb_tensor_numel(x), &nonfinite);   /* threaded pass */
    if (!nonfinite) return NB_OK;
    int64_t i = nbq_find_nonfinite(nb_tensor_data(x), x->dtype, nb_tensor_numel(x));
    if (i < 0) return NB_OK;
    double v = nb_load_elem(nb_tensor_data(x), x->dtype, i);
    char idx[160];
    int len = 0;
    int64_t rem = i, sub[NB_MAX_DIMS];
    for (int d = x->ndim - 1; d >= 0; d--) { sub[d] = rem % x->shape[d]; rem /= x->shape[d]; }
    for (int d = 0; d < x->ndim && len < (int)sizeof idx - 24; d++)
        len += snprintf(idx + len, sizeof idx - (size_t)len, d ? ", %lld" : "%lld", (long long)sub[d]);
    return nb_fail(ctx, NB_ERR_NUMERIC, "%s: %s at flat index %lld (element [%s])%s", what,
                   isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf"), (long long)i, idx, why);
}

/* ---- plans -------------------------------------------------------------------------------- */

/* One pass over calibrated amax values: 1 when every value is finite and >= 0 (-0 included), with
 * their maximum in *max. Integer compares on the bit patterns so the loop vectorizes: finite values
 * >= 0 are the patterns below 0x7F800000, plus 0x80000000 (-0), and their order is the values'. */
static int amax_values_ok(const float *v, int64_t n, float *max) {
    const uint32_t *u = (const uint32_t *)v;
    uint32_t m = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = u[i] == 0x80000000u ? 0u : u[i];
        bad |= b >= 0x7F800000u;
        m = b > m ? b : m;
    }
    memcpy(max, &m, 4);
    return !bad;
}

typedef struct amax_check_job {
    const float *v;
    int64_t n, chunk;
    float max[64];
    int ok[64];
} amax_check_job;

static void amax_check_range(void *arg, int64_t b, int64_t e) {
    amax_check_job *j = arg;
    for (int64_t c = b; c < e; c++) {
        int64_t lo = c * j->chunk, hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
        j->ok[c] = amax_values_ok(j->v + lo, hi - lo, &j->max[c]);
    }
}

/* amax_values_ok split over ctx's threads (a static NVFP4 weight has numel/16 block amax values). */
static int amax_values_ok_mt(nb_ctx *ctx, const float *v, int64_t n, float *max) {
    if (n < 65536) return amax_values_ok(v, n, max);
    amax_check_job j;
    j.v = v;
    j.n = n;
    j.chunk = (n + 63) / 64;
    int64_t nchunks = (n + j.chunk - 1) / j.chunk;
    nb_parallel_for(ctx, nchunks, 1, amax_check_range, &j);
    int ok = 1;
    *max = 0.0f;
    for (int64_t c = 0; c < nchunks; c++) {
        ok &= j.ok[c];
        *max = j.max[c] > *max ? j.max[c] : *max;
    }
    return ok;
}

const char *nbq_num(float v, char *buf, size_t n) {
    if (isnan(v)) snprintf(buf, n, "NaN");
    else if (isinf(v)) snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
    else snprintf(buf, n, "%g", (double)v);
    return buf;
}

int nbq_shape_str(const nb_tensor *t, int ndim, const int64_t *shape, char *buf, size_t n) {
    if (t) {
        ndim = t->ndim;
        shape = t->shape;
    }
    int len = snprintf(buf, n, "{");
    for (int d = 0; d < ndim && len < (int)n; d++)
        len += snprintf(buf + len, n - (size_t)len, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (len < (int)n) len += snprintf(buf + len, n - (size_t)len, "}");
    return len;
}

nb_status nbq_check_state_shape(nb_ctx *ctx, const nb_tensor *t, const nb_tensor *x, int64_t per_row, const char *attr,
                                const char *what) {
    int64_t n = x->shape[x->ndim - 1], rows = n ? nb_tensor_numel(x) / n : 0;
    int64_t want[NB_MAX_DIMS];
    memcpy(want, x->shape, sizeof want);
    want[x->ndim - 1] = per_row;
    int fits = nb_tensor_numel(t) == rows * per_row;
    if (fits && t->ndim != 1) {   /* flat (ModelOpt's own layout) fits by count; else the shape must match */
        int same = t->ndim == x->ndim, lead = t->ndim == x->ndim - 1 && per_row == 1;   /* FP8 row scales: [out] */
        for (int d = 0; same && d < x->ndim; d++) same = t->shape[d] == want[d];
        for (int d = 0; lead && d < t->ndim; d++) lead = t->shape[d] == want[d];
        fits = same || lead;
    }
    if (fits) return NB_OK;
    char ts[160], xs[160], ws[160];
    nbq_shape_str(t, 0, NULL, ts, sizeof ts);
    nbq_shape_str(x, 0, NULL, xs, sizeof xs);
    nbq_shape_str(NULL, x->ndim, want, ws, sizeof ws);
    if (nb_tensor_numel(t) != rows * per_row)
        return nb_fail(ctx, NB_ERR_SHAPE, "%s: %s has %lld values, the tensor needs %lld (%s %s does not fit this %s tensor, "
                       "which needs %s)", what, attr, (long long)nb_tensor_numel(t), (long long)(rows * per_row), attr, ts, xs, ws);
    return nb_fail(ctx, NB_ERR_SHAPE, "%s: %s %s does not fit this %s tensor, which needs %s (calibrated on a tensor of another "
                   "shape)", what, attr, ts, xs, ws);
}

/* Checks a calibrated amax tensor against x (per_row values per row of x); *max receives the largest value. */
static nb_status check_amax_tensor(nb_ctx *ctx, const nb_tensor *t, const nb_tensor *x, int64_t per_row, const char *attr,
                                   const char *what, float *max) {
    if (t->dtype != NB_F32 || !nb_tensor_is_contiguous(t))
        return nb_fail(ctx, NB_ERR_INVALID, "%s: %s must be a contiguous f32 tensor", what, attr);
    nb_status s = nbq_check_state_shape(ctx, t, x, per_row, attr, what);
    if (s) return s;
    int64_t want = nb_tensor_numel(t);
    const float *v = nb_tensor_data(t);
    if (amax_values_ok_mt(ctx, v, want, max)) return NB_OK;
    for (int64_t i = 0; i < want; i++)
        if (!isfinite(v[i]) || v[i] < 0.0f) {
            char num[32];
            return nb_fail(ctx, NB_ERR_NUMERIC, "%s: %s[%lld] = %s is not a finite amax >= 0", what, attr, (long long)i,
                           nbq_num(v[i], num, sizeof num));
        }
    return NB_OK;
}

/* A per-tensor amax: NaN/Inf is an error; 0 (an all-zero tensor, a dead row) becomes the format's
 * maxbound, as ModelOpt's _sanitize_export_amax does, so the scale stays positive and the codes are 0. */
static nb_status resolve_tensor_amax(nb_ctx *ctx, float *a, nb_qformat f, const char *attr, const char *what) {
    if (!isfinite(*a)) {
        char num[32];
        return nb_fail(ctx, NB_ERR_NUMERIC, "%s: %s is %s", what, attr, nbq_num(*a, num, sizeof num));
    }
    *a = nbq_sanitized_amax(f, *a);
    return NB_OK;
}

nb_status nbq_plan_init(nb_ctx *ctx, nbq_plan *plan, const nb_tensor *x, const nb_qparams *p) {
    memset(plan, 0, sizeof *plan);
    const char *what = p->name ? p->name : "tensor";
    plan->fmt = p->format;
    plan->tr = nb_qformat_info(p->format);
    if (plan->tr && p->format != NB_FMT_NONE) plan->fn = *nb_qformat_rows(ctx, p->format);
    if (!plan->tr || p->format == NB_FMT_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "%s: unknown or empty quantization format %d", what, (int)p->format);
    if (x) {
        plan->n = x->shape[x->ndim - 1];
        plan->rows = plan->n ? nb_tensor_numel(x) / plan->n : 0;
    }
    plan->base.mx_floor = p->mx_floor;
    plan->base.div_dtype = NB_F32;
    nb_status s;
    switch (p->format) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46: {
        float norm = plan->tr->scale_norm, a;
        if (p->block_amax) {
            float bmax;
            if (!x) return nb_fail(ctx, NB_ERR_INTERNAL, "%s: a block_amax plan needs the tensor", what);
            if ((s = check_amax_tensor(ctx, p->block_amax, x, plan->n / NB_NVFP4_BLOCK, "block_amax", what, &bmax)))
                return s;
            plan->block_amax = nb_tensor_data(p->block_amax);
            a = p->global_amax;
            if (nbq_from_data(a)) a = bmax;
            if ((s = resolve_tensor_amax(ctx, &a, p->format, "global_amax", what))) return s;
        } else {
            a = p->amax;
            if (nbq_from_data(a)) a = x ? nbq_absmax(ctx, nb_tensor_data(x), x->dtype, nb_tensor_numel(x)) : 0.0f;
            if ((s = resolve_tensor_amax(ctx, &a, p->format, "amax", what))) return s;
        }
        plan->base.global_amax = a;
        plan->base.scale = nb_nvfp4_scale2(a, norm);
        return NB_OK;
    }
    case NB_FMT_MXFP8:
        return NB_OK;
    case NB_FMT_FP8_TENSOR: {
        float a = p->amax;
        if (nbq_from_data(a)) a = x ? nbq_absmax(ctx, nb_tensor_data(x), x->dtype, nb_tensor_numel(x)) : 0.0f;
        if ((s = resolve_tensor_amax(ctx, &a, p->format, "amax", what))) return s;
        plan->base.global_amax = a;
        plan->base.scale = a / 448.0f;
        int32_t dd = p->fp8_div_dtype;
        if (dd < 0) dd = x ? (int32_t)x->dtype : NB_F32;
        if (dd != NB_F32 && dd != NB_BF16 && dd != NB_F16)
            return nb_fail(ctx, NB_ERR_INVALID, "%s: fp8_div_dtype must be f32, bf16 or f16", what);
        plan->base.div_dtype = dd;
        return NB_OK;
    }
    case NB_FMT_FP8_CHANNEL: {
        plan->row_scale = malloc((size_t)(plan->rows ? plan->rows : 1) * sizeof(float));
        plan->row_amax = malloc((size_t)(plan->rows ? plan->rows : 1) * sizeof(float));
        if (!plan->row_scale || !plan->row_amax) {
            nbq_plan_free(plan);
            return nb_fail(ctx, NB_ERR_NOMEM, "%s: out of memory (row scales)", what);
        }
        if (p->channel_amax) {
            float unused;
            if (!x) {
                nbq_plan_free(plan);
                return nb_fail(ctx, NB_ERR_INTERNAL, "%s: a channel_amax plan needs the tensor", what);
            }
            if ((s = check_amax_tensor(ctx, p->channel_amax, x, 1, "amax", what, &unused))) {
                nbq_plan_free(plan);
                return s;
            }
            memcpy(plan->row_amax, nb_tensor_data(p->channel_amax), (size_t)plan->rows * sizeof(float));
        } else {
            nbq_fast_row_absmax_mt(ctx, nb_tensor_data(x), x->dtype, plan->rows, plan->n, plan->row_amax);   /* threaded */
        }
        for (int64_t r = 0; r < plan->rows; r++) {
            plan->row_amax[r] = nbq_sanitized_amax(NB_FMT_FP8_CHANNEL, plan->row_amax[r]);   /* a dead row: scale 1 */
            plan->row_scale[r] = plan->row_amax[r] / 448.0f;
        }
        return NB_OK;
    }
    default:
        return nb_fail(ctx, NB_ERR_INVALID, "%s: unknown quantization format %d", what, (int)p->format);
    }
}

void nbq_plan_row(const nbq_plan *plan, int64_t row, nb_qrow_args *a) {
    *a = plan->base;
    if (plan->block_amax) a->block_amax = plan->block_amax + row * (plan->n / NB_NVFP4_BLOCK);
    if (plan->row_scale) {
        a->scale = plan->row_scale[row];
        a->global_amax = plan->row_amax[row];
    }
}

void nbq_plan_free(nbq_plan *plan) {
    free(plan->row_scale);
    free(plan->row_amax);
    plan->row_scale = plan->row_amax = NULL;
}

/* Quantized tensors and the tensor-level drivers: validate the input (shape vs block, NaN/Inf),
 * resolve the per-tensor scales once (a plan: qplan.c), then run the format's row functions over rows
 * with nb_parallel_for. Quantize, fake quant and dequantize all go through the traits table.
 * Quantize reads the input once unless a per-tensor amax must come from the data first: the NaN/Inf
 * check and FP8's row amax happen per row, in cache, in the same pass as the quantization. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant_internal.h"
#include "cpu/fast_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- quantized tensors ------------------------------------------------------------------------ */

static int64_t data_row_bytes(nb_qformat f, int64_t n) { return nbq_is_nvfp4(f) ? n / 2 : n; }
static int64_t scale_row_bytes(const nb_qformat_traits *tr, int64_t n) { return tr->block_size ? n / tr->block_size : 0; }

/* A tensor of the quantized tensor on `device` (-1: the host, zeroed unless uninit). */
static nb_status part_new(nb_ctx *ctx, int device, int uninit, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out) {
    if (device >= 0) return nb_tensor_new_on(ctx, device, dt, ndim, shape, out);
    return uninit ? nb_tensor_new_uninit(ctx, dt, ndim, shape, out) : nb_tensor_new(ctx, dt, ndim, shape, out);
}

/* uninit: the buffers' contents are unspecified (nb_quantize writes every byte); device >= 0: on that
 * CUDA device (contents unspecified). */
static nb_status qtensor_alloc(nb_ctx *ctx, nb_qformat f, int ndim, const int64_t *shape, int uninit, int device,
                               nb_qtensor **out) {
    *out = NULL;
    const nb_qformat_traits *tr = nb_qformat_info(f);
    if (!tr || f == NB_FMT_NONE) return nb_fail(ctx, NB_ERR_INVALID, "qtensor: unknown or empty format %d", (int)f);
    if (ndim < 1 || ndim > NB_MAX_DIMS) return nb_fail(ctx, NB_ERR_SHAPE, "qtensor: ndim %d out of range 1..%d", ndim, NB_MAX_DIMS);
    int64_t n = shape[ndim - 1];
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return nb_fail(ctx, NB_ERR_SHAPE, "qtensor: negative dimension %lld", (long long)shape[i]);
    if (tr->block_size && n % tr->block_size)
        return nb_fail(ctx, NB_ERR_SHAPE, "qtensor: last dimension (dim %d) is %lld, not divisible by the %s block size %d",
                       ndim - 1, (long long)n, tr->name, tr->block_size);
    nb_qtensor *q = calloc(1, sizeof *q);
    if (!q) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qtensor)");
    q->format = f;
    q->ndim = ndim;
    q->refcount = 1;
    memcpy(q->shape, shape, (size_t)ndim * sizeof(int64_t));
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, shape, (size_t)ndim * sizeof(int64_t));
    nb_status s;
    sh[ndim - 1] = data_row_bytes(f, n);
    if ((s = part_new(ctx, device, uninit, tr->data_dtype, ndim, sh, &q->data))) goto fail;
    if (tr->block_size) {
        sh[ndim - 1] = n / tr->block_size;
        s = part_new(ctx, device, uninit, tr->scale_dtype, ndim, sh, &q->scale);
    } else if (f == NB_FMT_FP8_CHANNEL) {
        s = part_new(ctx, device, uninit, NB_F32, ndim - 1, sh, &q->scale);   /* [out]: ModelOpt's exported shape */
    } else {
        s = part_new(ctx, device, uninit, NB_F32, 0, NULL, &q->scale);
    }
    if (s) goto fail;
    if (nbq_is_nvfp4(f) && (s = part_new(ctx, device, uninit, NB_F32, 0, NULL, &q->scale2))) goto fail;
    *out = q;
    return NB_OK;
fail:
    nb_qtensor_release(q);
    return s;
}

nb_status nb_qtensor_new(nb_ctx *ctx, nb_qformat f, int ndim, const int64_t *shape, nb_qtensor **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_qtensor_new: out is NULL");
    if (!shape && ndim > 0) return nb_fail(ctx, NB_ERR_INVALID, "nb_qtensor_new: shape is NULL");
    return qtensor_alloc(ctx, f, ndim, shape, 0, -1, out);
}

static int same_dims(const nb_tensor *t, int ndim, const int64_t *sh) {
    if (!t || t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != sh[i]) return 0;
    return 1;
}

nb_status nb_qtensor_wrap(nb_ctx *ctx, nb_qformat f, nb_tensor *data, nb_tensor *scale, nb_tensor *scale2,
                          nb_qtensor **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_qtensor_wrap: out is NULL");
    *out = NULL;
    const nb_qformat_traits *tr = nb_qformat_info(f);
    if (!tr || f == NB_FMT_NONE) return nb_fail(ctx, NB_ERR_INVALID, "qtensor: unknown or empty format %d", (int)f);
    if (!data || !scale) return nb_fail(ctx, NB_ERR_INVALID, "qtensor %s: data and scale are required", tr->name);
    if (data->dtype != tr->data_dtype && !(data->dtype == NB_U8 && tr->data_dtype == NB_E4M3))
        return nb_fail(ctx, NB_ERR_INVALID, "qtensor %s: data must be %s, not %s", tr->name,
                       nb_dtype_info(tr->data_dtype)->name, nb_dtype_info(data->dtype)->name);
    if (data->ndim < 1 || !nb_tensor_is_contiguous(data) || !nb_tensor_is_contiguous(scale))
        return nb_fail(ctx, NB_ERR_INVALID, "qtensor %s: data and scale must be contiguous with ndim >= 1", tr->name);
    int nd = data->ndim;
    int64_t shape[NB_MAX_DIMS], sh[NB_MAX_DIMS];
    memcpy(shape, data->shape, (size_t)nd * sizeof(int64_t));
    if (nbq_is_nvfp4(f)) shape[nd - 1] *= 2;
    int64_t n = shape[nd - 1];
    if (tr->block_size && n % tr->block_size)
        return nb_fail(ctx, NB_ERR_SHAPE, "qtensor %s: last dimension %lld is not divisible by the block size %d", tr->name,
                       (long long)n, tr->block_size);
    memcpy(sh, shape, sizeof sh);
    int scale_ok;
    nb_dtype want_scale = tr->scale_dtype;
    if (tr->block_size) {
        sh[nd - 1] = n / tr->block_size;
        scale_ok = same_dims(scale, nd, sh);
    } else if (f == NB_FMT_FP8_CHANNEL) {
        scale_ok = nb_tensor_numel(scale) == nb_tensor_numel(data) / (n ? n : 1);
    } else {
        scale_ok = nb_tensor_numel(scale) == 1;
    }
    if (!scale_ok || (scale->dtype != want_scale && !(want_scale == NB_U8 && scale->dtype == NB_E8M0)))
        return nb_fail(ctx, NB_ERR_SHAPE, "qtensor %s: scale has the wrong dtype or shape", tr->name);
    if (nbq_is_nvfp4(f) && (!scale2 || scale2->dtype != NB_F32 || nb_tensor_numel(scale2) != 1))
        return nb_fail(ctx, NB_ERR_INVALID, "qtensor %s: weight_scale_2 must be one f32 value", tr->name);
    nb_qtensor *q = calloc(1, sizeof *q);
    if (!q) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qtensor)");
    q->format = f;
    q->ndim = nd;
    q->refcount = 1;
    memcpy(q->shape, shape, (size_t)nd * sizeof(int64_t));
    q->data = data;
    nb_tensor_retain(data);
    q->scale = scale;
    nb_tensor_retain(scale);
    if (nbq_is_nvfp4(f)) {
        q->scale2 = scale2;
        nb_tensor_retain(scale2);
    }
    *out = q;
    return NB_OK;
}

void nb_qtensor_retain(nb_qtensor *q) { if (q) __atomic_add_fetch(&q->refcount, 1, __ATOMIC_RELAXED); }

void nb_qtensor_release(nb_qtensor *q) {
    if (!q || __atomic_sub_fetch(&q->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    nb_tensor_release(q->data);
    nb_tensor_release(q->scale);
    nb_tensor_release(q->scale2);
    free(q);
}

int64_t nb_qtensor_numel(const nb_qtensor *q) {
    if (!q) return 0;
    int64_t n = 1;
    for (int i = 0; i < q->ndim; i++) n *= q->shape[i];
    return n;
}

/* ---- parallel row jobs --------------------------------------------------------------------------- */

typedef struct row_job {
    const nbq_plan *plan;
    const void *x;        /* input rows (quantize, fake) */
    nb_dtype xdt;
    uint8_t *q, *s;       /* quantize / dequantize */
    void *y;              /* fake / dequantize output */
    nb_dtype ydt;
    const float *row_scales;   /* dequantize: per-row scale (FP8_CHANNEL) */
    int failed;
} row_job;

static int64_t grain_for(int64_t n) { return n >= 16384 ? 1 : 16384 / (n ? n : 1); }

static void fake_range(void *arg, int64_t begin, int64_t end) {
    row_job *j = arg;
    const nbq_plan *pl = j->plan;
    float *buf = malloc((size_t)pl->n * 2 * sizeof(float));
    if (!buf) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
    nb_qrow_args a;
    for (int64_t r = begin; r < end; r++) {
        nbq_load_row(j->x, j->xdt, r, pl->n, buf);
        nbq_plan_row(pl, r, &a);
        pl->fn.fake(buf, pl->n, &a, buf + pl->n);
        nbq_store_row(j->y, j->ydt, r, pl->n, buf + pl->n);
    }
    free(buf);
}

static void dequant_range(void *arg, int64_t begin, int64_t end) {
    row_job *j = arg;
    const nbq_plan *pl = j->plan;
    float *buf = malloc((size_t)pl->n * sizeof(float));
    if (!buf) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
    int64_t qb = data_row_bytes(pl->fmt, pl->n), sb = scale_row_bytes(pl->tr, pl->n);
    nb_qrow_args a = pl->base;
    for (int64_t r = begin; r < end; r++) {
        if (j->row_scales) a.scale = j->row_scales[r];
        pl->fn.dequantize(j->q + r * qb, sb ? j->s + r * sb : NULL, pl->n, &a, buf);
        nbq_store_row(j->y, j->ydt, r, pl->n, buf);
    }
    free(buf);
}

/* ---- quantize ---------------------------------------------------------------------------------- */

/* One pass over the rows: the NaN/Inf check (when no amax pass ran), FP8_CHANNEL's row amax (when it
 * comes from the data) and the quantization, a row at a time while the row is in cache. BF16 rows go
 * to the AVX-512 kernels when the "avx512" path is installed; on the "avx2" path MXFP8 / FP8 BF16 rows
 * go to the AVX2 BF16 kernels and NVFP4 BF16 rows of large tensors to the AVX2 threshold-table kernel;
 * other rows through an f32 row buffer and the format's row function. */
typedef int (*bf16_row_fn)(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
typedef int (*bf16_next_fn)(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q, const uint16_t *next,
                            uint32_t *next_max);
typedef struct quant_job {
    nbq_plan *plan;
    const uint8_t *x;
    nb_dtype xdt;
    uint8_t *q, *s;
    float *row_scale_out;   /* FP8_CHANNEL from the data: the qtensor's scale, written per row */
    int check_rows;         /* NaN/Inf scan per row (no amax pass before) */
    const nbq_nv_table *nvtab;   /* NVFP4 on large BF16 tensors: the threshold table for s2 */
    bf16_row_fn bf16;       /* BF16 row kernel (nbq_avx512_quantize_bf16 / nbq_avx2_quantize_bf16) or NULL */
    bf16_next_fn bf16_next; /* its FP8-per-channel form that also takes the next row's max */
    int avx2tab;            /* "avx2" path: rows by nbq_avx2_nvfp4_table_bf16 with nvtab */
    int failed, nonfinite;
} quant_job;

static void quant_range(void *arg, int64_t begin, int64_t end) {
    quant_job *j = arg;
    nbq_plan *pl = j->plan;
    const int64_t n = pl->n, xb = n * (j->xdt == NB_F32 ? 4 : 2);
    const int64_t qb = data_row_bytes(pl->fmt, n), sb = scale_row_bytes(pl->tr, n);
    float *buf = NULL;
    nb_qrow_args a;
    if (j->bf16 && j->row_scale_out) {
        /* FP8 per channel on BF16: each row's kernel also takes the next row's max |x|, so the next
         * scale is ready and its reads overlapped this row's arithmetic */
        const uint16_t *x16 = (const uint16_t *)j->x;
        uint32_t mb = 0;
        for (int64_t i = 0; i < n; i++) mb = (uint32_t)(x16[begin * n + i] & 0x7FFF) > mb ? (uint32_t)(x16[begin * n + i] & 0x7FFF) : mb;
        for (int64_t r = begin; r < end; r++) {
            const uint16_t *xr = x16 + r * n, *next = r + 1 < end ? xr + n : NULL;
            uint32_t nb = 0;
            int nonfinite = mb >= 0x7F80u;
            float m = nb_bf16_to_f32((uint16_t)mb);
            m = nbq_sanitized_amax(NB_FMT_FP8_CHANNEL, m);   /* a dead row: scale 1, codes 0 */
            if (!nonfinite) pl->row_amax[r] = m;
            if (nonfinite) {   /* reported after the pass */
                __atomic_store_n(&j->nonfinite, 1, __ATOMIC_RELAXED);
                for (int64_t i = 0; next && i < n; i++) nb = (uint32_t)(next[i] & 0x7FFF) > nb ? (uint32_t)(next[i] & 0x7FFF) : nb;
                mb = nb;
                continue;
            }
            pl->row_scale[r] = j->row_scale_out[r] = m / 448.0f;
            nbq_plan_row(pl, r, &a);
            uint8_t *qr = j->q + r * qb;
            int st = j->bf16_next(xr, n, &a, qr, next, &nb);
            mb = nb;
            if (st != 1) continue;
            if (!buf && !(buf = malloc((size_t)n * sizeof(float)))) {
                __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
                return;
            }
            nbq_fast_load_f32(xr, NB_BF16, n, buf);
            pl->fn.quantize(buf, n, &a, qr, NULL);
        }
        free(buf);
        return;
    }
    for (int64_t r = begin; r < end; r++) {
        const uint8_t *xr = j->x + r * xb;
        int kernel = (j->bf16 && !j->row_scale_out) || j->avx2tab;   /* the kernel checks NaN/Inf itself */
        if (kernel) {
            nbq_plan_row(pl, r, &a);
            const uint16_t *x16 = (const uint16_t *)xr;
            int st = j->avx2tab ? nbq_avx2_nvfp4_table_bf16(pl->fmt, x16, n, &a, j->nvtab, j->q + r * qb, j->s + r * sb)
                   : j->nvtab ? nbq_avx512_nvfp4_table_bf16(pl->fmt, x16, n, &a, j->nvtab, j->q + r * qb, j->s + r * sb)
                              : j->bf16(pl->fmt, x16, n, &a, j->q + r * qb, j->s ? j->s + r * sb : NULL);
            if (st == 2) __atomic_store_n(&j->nonfinite, 1, __ATOMIC_RELAXED);
            if (st != 1) continue;
        }
        if (j->check_rows || j->row_scale_out) {
            int nonfinite = 0;
            float m = nbq_fast_absmax(xr, j->xdt, n, &nonfinite);
            if (nonfinite) {
                __atomic_store_n(&j->nonfinite, 1, __ATOMIC_RELAXED);
                continue;
            }
            if (j->row_scale_out) {
                m = nbq_sanitized_amax(NB_FMT_FP8_CHANNEL, m);   /* a dead row: scale 1, codes 0 */
                pl->row_amax[r] = m;
                pl->row_scale[r] = j->row_scale_out[r] = m / 448.0f;
            }
        }
        nbq_plan_row(pl, r, &a);
        uint8_t *qr = j->q + r * qb, *sr = j->s ? j->s + r * sb : NULL;
        if (j->bf16 && !kernel && j->bf16(pl->fmt, (const uint16_t *)xr, n, &a, qr, sr) != 1) continue;
        if (!buf && !(buf = malloc((size_t)n * sizeof(float)))) {
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        nbq_fast_load_f32(xr, j->xdt, n, buf);
        pl->fn.quantize(buf, n, &a, qr, sr);
    }
    free(buf);
}

typedef struct nvtab_job {
    nbq_nv_table *t;
    float s2;
} nvtab_job;

static void nvtab_range(void *arg, int64_t b, int64_t e) {
    nvtab_job *j = arg;
    nbq_nv_table_build_range(j->s2, j->t, (int)b, (int)e);
}

/* FP8_CHANNEL with the row amax from the data: a plan whose row arrays quant_range fills. */
static nb_status plan_channel_deferred(nb_ctx *ctx, nbq_plan *plan, const nb_tensor *x, const nb_qparams *p) {
    memset(plan, 0, sizeof *plan);
    plan->fmt = p->format;
    plan->tr = nb_qformat_info(p->format);
    plan->fn = *nb_qformat_rows(ctx, p->format);
    plan->n = x->shape[x->ndim - 1];
    plan->rows = plan->n ? nb_tensor_numel(x) / plan->n : 0;
    plan->base.mx_floor = p->mx_floor;
    plan->base.div_dtype = NB_F32;
    plan->row_scale = malloc((size_t)(plan->rows ? plan->rows : 1) * sizeof(float));
    plan->row_amax = malloc((size_t)(plan->rows ? plan->rows : 1) * sizeof(float));
    if (!plan->row_scale || !plan->row_amax) {
        nbq_plan_free(plan);
        return nb_fail(ctx, NB_ERR_NOMEM, "%s: out of memory (row scales)", p->name ? p->name : "tensor");
    }
    return NB_OK;
}

/* Quantize contiguous, checked x into q (allocated here when *qp is NULL). Errors come in the order
 * of the two-pass driver this replaces: NaN/Inf first (named), then the plan's (bad state). */
static nb_status quantize_impl(nb_ctx *ctx, const nb_tensor *xc, const nb_qparams *p, nb_qtensor **qp) {
    const char *what = p->name ? p->name : "tensor";
    int need_amax = nbq_from_data(p->amax) && ((nbq_is_nvfp4(p->format) && !p->block_amax) || p->format == NB_FMT_FP8_TENSOR);
    int channel = p->format == NB_FMT_FP8_CHANNEL && !p->channel_amax;
    nbq_plan plan;
    nb_status s;
    if (need_amax) {
        nb_qparams pa;   /* p with the data's amax, from the threaded NaN/Inf pass */
        if ((s = nbq_check_finite_params(ctx, xc, what, p, &pa))) return s;
        if ((s = nbq_plan_init(ctx, &plan, xc, &pa))) return s;
    } else if (channel) {
        if ((s = plan_channel_deferred(ctx, &plan, xc, p))) return s;
    } else if ((s = nbq_plan_init(ctx, &plan, xc, p))) {
        nb_status sf = nbq_check_finite(ctx, xc, what);   /* a NaN/Inf is reported before a state error */
        return sf ? sf : s;
    }
    nb_qtensor *q = *qp;
    if (!q && (s = qtensor_alloc(ctx, p->format, xc->ndim, xc->shape, 1, -1, &q))) goto done;
    if (q->scale2) *(float *)nb_tensor_data(q->scale2) = plan.base.scale;
    if (p->format == NB_FMT_FP8_TENSOR) *(float *)nb_tensor_data(q->scale) = plan.base.scale;
    if (p->format == NB_FMT_FP8_CHANNEL && !channel)
        memcpy(nb_tensor_data(q->scale), plan.row_scale, (size_t)plan.rows * sizeof(float));
    quant_job j = {.plan = &plan, .x = nb_tensor_data(xc), .xdt = xc->dtype, .q = nb_tensor_data(q->data),
                   .s = plan.tr->block_size ? nb_tensor_data(q->scale) : NULL,
                   .row_scale_out = channel ? nb_tensor_data(q->scale) : NULL, .check_rows = !need_amax};
    if (xc->dtype == NB_BF16 && nbq_bf16_kernels_for(ctx, p->format)) {
        j.bf16 = nbq_avx512_quantize_bf16;
        j.bf16_next = nbq_avx512_fp8_row_next_bf16;
    } else if (xc->dtype == NB_BF16 && nbq_avx2_bf16_for(ctx, p->format)) {   /* MXFP8, FP8 */
        j.bf16 = nbq_avx2_quantize_bf16;
        j.bf16_next = nbq_avx2_fp8_row_next_bf16;
    }
    nbq_nv_table *tab = NULL;
    /* every NVFP4 case, four_over_six's per-block pick included (both candidates' codes from the table):
     * on the "avx512" path the BF16 kernel, on the "avx2" path (installed AVX2 rows) the AVX2 one */
    int tab_fmt = nbq_is_nvfp4(p->format);
    int avx2tab = !j.bf16 && tab_fmt && xc->dtype == NB_BF16 && nbq_avx2_nv_table_for(ctx, p->format);
    if ((j.bf16 || avx2tab) && tab_fmt && plan.rows * plan.n >= ((int64_t)1 << 20) &&
        (tab = aligned_alloc(64, (sizeof *tab + 63) & ~(size_t)63))) {   /* rows on cache lines */
        /* ~50 us of exact divisions (one thread) make the kernel ~2.5x faster, ~0.2 ns per element
         * per thread: paid back from ~250K elements */
        nvtab_job tj = {tab, plan.base.scale};
        nb_parallel_for(ctx, 128, 8, nvtab_range, &tj);
        nbq_nv_table_finish(tab);
        j.nvtab = tab;
        j.avx2tab = avx2tab;
    }
    nb_parallel_for(ctx, plan.rows, grain_for(plan.n), quant_range, &j);
    free(tab);
    if (j.nonfinite) {
        s = nbq_check_finite(ctx, xc, what);
        if (!s) s = nb_fail(ctx, NB_ERR_INTERNAL, "%s: NaN/Inf seen in a row but not found again", what);
    } else if (j.failed) {
        s = nb_fail(ctx, NB_ERR_NOMEM, "%s: out of memory (row buffer)", what);
    }
done:
    nbq_plan_free(&plan);
    if (s && !*qp) nb_qtensor_release(q);
    else if (!s) *qp = q;
    return s;
}

nb_status nb_quantize(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, nb_qtensor **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantize: out is NULL");
    *out = NULL;
    if (!p) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantize: params are NULL (nb_qparams_init makes them)");
    const char *what = p->name ? p->name : "tensor";
    nb_status s = nbq_check_input_any(ctx, x, p->format, what);
    if (s) return s;
    if (x->device >= 0) {   /* on its CUDA device, into a quantized tensor there */
        nb_qtensor *q = NULL;
        if ((s = nbq_device_check(ctx, x, what, "input"))) return s;
        if ((s = qtensor_alloc(ctx, p->format, x->ndim, x->shape, 1, x->device, &q))) return s;
        if ((s = nbq_device_quantize(ctx, x, p, what, q))) nb_qtensor_release(q);
        else *out = q;
        return s;
    }
    nb_tensor *xc = NULL;
    if ((s = nbq_contiguous(ctx, x, &xc))) return s;
    s = quantize_impl(ctx, xc, p, out);
    nb_tensor_release(xc);
    return s;
}

/* An output on the input's device (host or CUDA): NB_ERR_DEVICE naming both otherwise. */
static nb_status same_device(nb_ctx *ctx, const nb_tensor *x, const nb_tensor *out, const char *what) {
    if (x->device == out->device) return NB_OK;
    char a[32], b[32];
    snprintf(a, sizeof a, x->device < 0 ? "the host" : "CUDA device %d", x->device);
    snprintf(b, sizeof b, out->device < 0 ? "the host" : "CUDA device %d", out->device);
    return nb_fail(ctx, NB_ERR_DEVICE, "%s: the input is on %s, the output on %s (nb_tensor_to_device moves tensors)", what,
                   a, b);
}

static int tensor_fits(const nb_tensor *t, nb_dtype dt, nb_dtype alt, int64_t numel) {
    return t && (t->dtype == dt || t->dtype == alt) && nb_tensor_is_contiguous(t) && nb_buffer_writable(t->buf) &&
           nb_tensor_numel(t) == numel;
}

nb_status nb_quantize_into(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, nb_qtensor *q) {
    if (!p) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantize_into: params are NULL (nb_qparams_init makes them)");
    const char *what = p->name ? p->name : "tensor";
    nb_status s = nbq_check_input_any(ctx, x, p->format, what);
    if (s) return s;
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "%s: quantized output is NULL", what);
    const nb_qformat_traits *tr = nb_qformat_info(p->format);
    if (q->format != p->format)
        return nb_fail(ctx, NB_ERR_INVALID, "%s: quantized output is %s, the parameters ask for %s", what,
                       nb_qformat_info(q->format) ? nb_qformat_info(q->format)->name : "?", tr->name);
    int same = q->ndim == x->ndim;
    for (int i = 0; same && i < x->ndim; i++) same = q->shape[i] == x->shape[i];
    if (!same) return nb_fail(ctx, NB_ERR_SHAPE, "%s: quantized output's shape differs from the input's", what);
    int64_t n = x->shape[x->ndim - 1], numel = nb_tensor_numel(x), rows = n ? numel / n : 0;
    int64_t nscale = tr->block_size ? numel / tr->block_size : p->format == NB_FMT_FP8_CHANNEL ? rows : 1;
    if (!tensor_fits(q->data, tr->data_dtype, NB_U8, nbq_is_nvfp4(p->format) ? numel / 2 : numel) ||
        !tensor_fits(q->scale, tr->scale_dtype, tr->scale_dtype == NB_U8 ? NB_E8M0 : tr->scale_dtype, nscale) ||
        (nbq_is_nvfp4(p->format) && !tensor_fits(q->scale2, NB_F32, NB_F32, 1)))
        return nb_fail(ctx, NB_ERR_INVALID, "%s: quantized output's tensors must be contiguous, writable and sized for the input",
                       what);
    if (x->device >= 0 || q->data->device >= 0) {
        if ((s = same_device(ctx, x, q->data, what)) || (s = same_device(ctx, x, q->scale, what)) ||
            (q->scale2 && (s = same_device(ctx, x, q->scale2, what))) || (s = nbq_device_check(ctx, x, what, "input")))
            return s;
        return nbq_device_quantize(ctx, x, p, what, q);
    }
    nb_tensor *xc = NULL;
    if ((s = nbq_contiguous(ctx, x, &xc))) return s;
    s = quantize_impl(ctx, xc, p, &q);
    nb_tensor_release(xc);
    return s;
}

/* ---- fake quant --------------------------------------------------------------------------------- */

static nb_status check_out(nb_ctx *ctx, const nb_tensor *x, const nb_tensor *out, const char *what) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "%s: output tensor is NULL", what);
    if (out->dtype != NB_F32 && out->dtype != NB_BF16 && out->dtype != NB_F16)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: output dtype %s (f32, bf16 or f16 only)", what,
                       nb_dtype_info(out->dtype)->name);
    if (!nb_tensor_is_contiguous(out)) return nb_fail(ctx, NB_ERR_INVALID, "%s: output must be contiguous", what);
    if (!nb_buffer_writable(out->buf)) return nb_fail(ctx, NB_ERR_INVALID, "%s: output is read-only", what);
    if (out->ndim != x->ndim) return nb_fail(ctx, NB_ERR_SHAPE, "%s: output has %d dims, input %d", what, out->ndim, x->ndim);
    for (int i = 0; i < x->ndim; i++)
        if (out->shape[i] != x->shape[i])
            return nb_fail(ctx, NB_ERR_SHAPE, "%s: output dim %d is %lld, input %lld", what, i, (long long)out->shape[i],
                           (long long)x->shape[i]);
    return NB_OK;
}

nb_status nbq_fake_plan(nb_ctx *ctx, const nbq_plan *plan, const nb_tensor *x, nb_tensor *out) {
    row_job j = {.plan = plan, .x = nb_tensor_data(x), .xdt = x->dtype, .y = nb_tensor_data(out), .ydt = out->dtype};
    nb_parallel_for(ctx, plan->rows, grain_for(plan->n), fake_range, &j);
    if (j.failed) return nb_fail(ctx, NB_ERR_NOMEM, "fake quant: out of memory (row buffer)");
    return NB_OK;
}

nb_status nbq_fake_plan_f32(nb_ctx *ctx, const nbq_plan *plan, const nb_tensor *x, float *out) {
    row_job j = {.plan = plan, .x = nb_tensor_data(x), .xdt = x->dtype, .y = out, .ydt = NB_F32};
    nb_parallel_for(ctx, plan->rows, grain_for(plan->n), fake_range, &j);
    if (j.failed) return nb_fail(ctx, NB_ERR_NOMEM, "fake quant: out of memory (row buffer)");
    return NB_OK;
}

nb_status nb_fake_quant(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, nb_tensor *out) {
    if (!p) return nb_fail(ctx, NB_ERR_INVALID, "nb_fake_quant: params are NULL (nb_qparams_init makes them)");
    const char *what = p->name ? p->name : "tensor";
    nb_status s = nbq_check_input_any(ctx, x, p->format, what);
    if (s) return s;
    if ((s = check_out(ctx, x, out, what))) return s;
    if (x->device >= 0 || out->device >= 0) {
        if ((s = same_device(ctx, x, out, what)) || (s = nbq_device_check(ctx, x, what, "input")) ||
            (s = nbq_device_check(ctx, out, what, "output")))
            return s;
        return nbq_device_fake(ctx, x, p, what, out);
    }
    nb_tensor *xc = NULL;
    if ((s = nbq_contiguous(ctx, x, &xc))) return s;
    nbq_plan plan;
    nb_qparams pa;   /* p, with the data's amax from the NaN/Inf pass (one pass instead of two) */
    if ((s = nbq_check_finite_params(ctx, xc, what, p, &pa))) goto done;
    if ((s = nbq_plan_init(ctx, &plan, xc, &pa))) goto done;
    s = nbq_fake_plan(ctx, &plan, xc, out);
    nbq_plan_free(&plan);
done:
    nb_tensor_release(xc);
    return s;
}

/* ---- dequantize ---------------------------------------------------------------------------------- */

nb_status nb_qtensor_dequantize_into(nb_ctx *ctx, const nb_qtensor *q, nb_tensor *out) {
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "dequantize: quantized tensor is NULL");
    nb_status s = nbq_env_path_status(ctx);
    if (s) return s;
    const nb_qformat_traits *tr = nb_qformat_info(q->format);
    if (!out || out->ndim != q->ndim) return nb_fail(ctx, NB_ERR_SHAPE, "dequantize: output must have %d dims", q->ndim);
    for (int i = 0; i < q->ndim; i++)
        if (out->shape[i] != q->shape[i])
            return nb_fail(ctx, NB_ERR_SHAPE, "dequantize: output dim %d is %lld, quantized tensor %lld", i,
                           (long long)out->shape[i], (long long)q->shape[i]);
    if (out->dtype != NB_F32 && out->dtype != NB_BF16 && out->dtype != NB_F16)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "dequantize: output dtype %s (f32, bf16 or f16 only)",
                       nb_dtype_info(out->dtype)->name);
    if (!nb_tensor_is_contiguous(out) || !nb_buffer_writable(out->buf))
        return nb_fail(ctx, NB_ERR_INVALID, "dequantize: output must be contiguous and writable");
    if (q->data->device >= 0 || out->device >= 0) {
        if ((s = same_device(ctx, q->data, out, "dequantize")) || (s = same_device(ctx, q->data, q->scale, "dequantize")) ||
            (s = nbq_device_check(ctx, out, "dequantize", "output")))
            return s;
        return nbq_device_dequantize(ctx, q, out);
    }
    nbq_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.fmt = q->format;
    plan.tr = tr;
    if (!nb_qformat_rows(ctx, q->format))
        return nb_fail(ctx, NB_ERR_INVALID, "dequantize: unknown or empty quantization format %d", (int)q->format);
    plan.fn = *nb_qformat_rows(ctx, q->format);
    plan.n = q->shape[q->ndim - 1];
    plan.rows = plan.n ? nb_qtensor_numel(q) / plan.n : 0;
    row_job j = {.plan = &plan, .q = nb_tensor_data(q->data), .s = nb_tensor_data(q->scale), .y = nb_tensor_data(out),
                 .ydt = out->dtype};
    if (nbq_is_nvfp4(q->format)) plan.base.scale = *(const float *)nb_tensor_data(q->scale2);
    else if (q->format == NB_FMT_FP8_TENSOR) plan.base.scale = *(const float *)nb_tensor_data(q->scale);
    else if (q->format == NB_FMT_FP8_CHANNEL) j.row_scales = nb_tensor_data(q->scale);
    nb_parallel_for(ctx, plan.rows, grain_for(plan.n), dequant_range, &j);
    if (j.failed) return nb_fail(ctx, NB_ERR_NOMEM, "dequantize: out of memory (row buffer)");
    return NB_OK;
}

nb_status nb_qtensor_dequantize(nb_ctx *ctx, const nb_qtensor *q, nb_dtype dt, nb_tensor **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "dequantize: out is NULL");
    *out = NULL;
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "dequantize: quantized tensor is NULL");
    if (dt != NB_F32 && dt != NB_BF16 && dt != NB_F16)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "dequantize: output dtype %s (f32, bf16 or f16 only)",
                       nb_dtype_info(dt) ? nb_dtype_info(dt)->name : "?");
    /* on the quantized tensor's device */
    nb_status s = q->data && q->data->device >= 0 ? nb_tensor_new_on(ctx, q->data->device, dt, q->ndim, q->shape, out)
                                                  : nb_tensor_new(ctx, dt, q->ndim, q->shape, out);
    if (s) return s;
    if ((s = nb_qtensor_dequantize_into(ctx, q, *out))) {
        nb_tensor_release(*out);
        *out = NULL;
    }
    return s;
}

void nb_qparams_init(nb_qparams *p, nb_qformat f) {
    memset(p, 0, sizeof *p);
    p->format = f;
    p->amax = -1.0f;
    p->global_amax = -1.0f;
    p->fp8_div_dtype = -1;
}

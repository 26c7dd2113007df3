/* Calibrators (observers) that accumulate over batches and write a quantizer's state:
 * max (per tensor, per row, per block), ModelOpt's MSE search over amax multipliers (first index
 * wins ties) and four_over_six (MSE with multipliers {1.0, 1.5} on a static NVFP4_46 quantizer).
 * As in ModelOpt (max_calibrate, then the search), the candidates are multiples of the max the
 * observer saw over all its batches, never of the quantizer's current state, so a search repeated on
 * the same data gives the same state. The MSE error is summed per amax element, with ModelOpt's
 * fake-quant arithmetic by default (so the chosen amax matches ModelOpt's) or nibble's export arithmetic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/comm.h"
#include "nibble/formats.h"
#include "quant/quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Granularity of the searched / observed amax. */
enum { G_TENSOR = 0, G_ROW = 1, G_BLOCK = 2, G_NONE = 3 };

struct nb_calib {
    nb_quantizer *q;
    nb_calib_config cfg;
    int gran;
    int64_t batches;
    /* the shape of x[..., :-1] seen first (rows) and the last dim */
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    /* max observer (MSE too: the search's centre) */
    float *vals;          /* [nvals]: the running max per amax element */
    int64_t nvals;
    /* MSE: the batches are kept until finish, since the candidates are multiples of the max over all
     * of them (ModelOpt runs max calibration over every batch before the search) */
    nb_tensor **batch;    /* [nbatch] contiguous copies (or x itself, retained, for the one-shot calibrate) */
    int64_t nbatch, batch_cap;
    int borrow;           /* nb_quantizer_calibrate: x outlives the observer, so it is retained, not copied */
    int64_t ncand;
    float *mult;          /* [ncand] */
    float *init;          /* [nvals] initial amax per element (the data max) */
    double *loss;         /* [ncand * nvals] */
    int32_t *choice;      /* [nvals] after finish */
    nb_dtype xdt;         /* dtype of the first batch: a searched per-tensor/row amax is stored in it */
};

/* What the observer calibrates, from the format's row: per block (static), per row, per tensor, or
 * nothing (a format whose scales come from the data alone). */
static int granularity(const nb_quantizer_config *c) {
    const nb_format_desc *d = nb_format_desc_of(c->format);
    if (!d) return G_NONE;
    if (c->is_static && d->state_static) return G_BLOCK;
    if (!d->state_dynamic[0]) return G_NONE;
    return d->per_row ? G_ROW : G_TENSOR;
}

void nb_calib_config_init(nb_calib_config *cfg, nb_calib_method m) {
    memset(cfg, 0, sizeof *cfg);
    cfg->method = m;
    cfg->metric = NB_MSE_MODELOPT;
    if (m == NB_CALIB_FOUR_OVER_SIX) {
        cfg->start_multiplier = 1.0;   /* ModelOpt NVFP4_FOUR_OVER_SIX_CFG: {1.0, 1.5} */
        cfg->stop_multiplier = 1.5;
        cfg->step_size = 0.5;
    } else {
        cfg->start_multiplier = 0.25;  /* ModelOpt mse_calibrate defaults */
        cfg->stop_multiplier = 4.0;
        cfg->step_size = 0.1;
    }
}

nb_status nb_calib_new(nb_ctx *ctx, nb_quantizer *q, const nb_calib_config *cfg, nb_calib **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_calib_new: out is NULL");
    *out = NULL;
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_calib_new: quantizer is NULL");
    if (!cfg) return nb_fail(ctx, NB_ERR_INVALID, "nb_calib_new: config is NULL (nb_calib_config_init makes one)");
    nb_quantizer_config qc;
    nb_quantizer_get_config(q, &qc);
    const char *name = nb_quantizer_name(q);
    if (cfg->method != NB_CALIB_MAX && cfg->method != NB_CALIB_MSE && cfg->method != NB_CALIB_FOUR_OVER_SIX)
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': unknown method %d", name, (int)cfg->method);
    int takes = (nb_format_desc_of(qc.format)->calib_methods >> cfg->method) & 1u;
    if (cfg->method == NB_CALIB_FOUR_OVER_SIX && takes && !qc.is_static)
        return nb_fail(ctx, NB_ERR_INVALID,
                       "calibrator for '%s': four_over_six calibration stores a per-block M=6/M=4 choice, which only a "
                       "static nvfp4_46 quantizer keeps; this one is dynamic (it picks per block when it quantizes), so "
                       "calibrate it with max (its global amax), or make it static",
                       name);
    if (cfg->method == NB_CALIB_FOUR_OVER_SIX && !takes)
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': four_over_six needs a static nvfp4_46 quantizer, not %s%s",
                       name, nb_qformat_info(qc.format)->name, qc.is_static ? " static" : "");
    if (cfg->method != NB_CALIB_MAX && granularity(&qc) == G_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': %s has no amax to search", name,
                       nb_qformat_info(qc.format)->name);
    if (cfg->method != NB_CALIB_MAX &&
        (!(cfg->step_size > 0) || !(cfg->stop_multiplier >= cfg->start_multiplier) || !(cfg->start_multiplier > 0)))
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': need 0 < start <= stop and step > 0", name);
    if (cfg->method != NB_CALIB_MAX) {
        double steps = ceil((cfg->stop_multiplier - cfg->start_multiplier) / cfg->step_size) + 1.0;
        if (!(steps <= 65536.0))
            return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': start %g, stop %g, step %g make %.0f MSE candidates; "
                           "at most 65536", name, cfg->start_multiplier, cfg->stop_multiplier, cfg->step_size, steps);
    }
    nb_calib *c = calloc(1, sizeof *c);
    if (!c) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibrator)");
    c->q = q;
    nb_quantizer_retain(q);
    c->cfg = *cfg;
    c->gran = granularity(&qc);
    *out = c;
    return NB_OK;
}

void nb_calib_free(nb_calib *c) {
    if (!c) return;
    for (int64_t i = 0; i < c->nbatch; i++) nb_tensor_release(c->batch[i]);
    free(c->batch);
    nb_quantizer_release(c->q);
    free(c->vals);
    free(c->mult);
    free(c->init);
    free(c->loss);
    free(c->choice);
    free(c);
}

int64_t nb_calib_batches(const nb_calib *c) { return c ? c->batches : 0; }

const int32_t *nb_calib_choice(const nb_calib *c, int64_t *n) {
    if (n) *n = c && c->choice ? c->nvals : 0;
    return c ? c->choice : NULL;
}

/* The number of amax elements for x at this granularity. */
static int64_t count_for(int gran, int64_t rows, int64_t n) {
    switch (gran) {
    case G_TENSOR: return 1;
    case G_ROW: return rows;
    case G_BLOCK: return rows * (n / NB_NVFP4_BLOCK);
    default: return 0;
    }
}

/* Remember the first batch's shape; later batches must have the same per-element layout. */
static nb_status check_layout(nb_ctx *ctx, nb_calib *c, const nb_tensor *x, int64_t count) {
    const char *name = nb_quantizer_name(c->q);
    if (c->batches == 0 && !c->vals) {
        c->ndim = x->ndim;
        memcpy(c->shape, x->shape, sizeof c->shape);
        c->nvals = count;
        c->xdt = x->dtype;
        return NB_OK;
    }
    if (c->gran != G_TENSOR && count != c->nvals)
        return nb_fail(ctx, NB_ERR_SHAPE,
                       "calibrator for '%s': this batch has %lld %s amax values, earlier batches %lld (a per-row/per-block "
                       "observer needs the same shape every batch)",
                       name, (long long)count, c->gran == G_ROW ? "per-row" : "per-block", (long long)c->nvals);
    return NB_OK;
}

/* ---- max ---------------------------------------------------------------------------------------- */

typedef struct max_job {
    const void *x;
    nb_dtype dt;
    int64_t n;
    int gran;
    float *out;      /* [rows] or [rows * n/16] */
    int failed;
} max_job;

static void max_range(void *arg, int64_t begin, int64_t end) {
    max_job *j = arg;
    float *buf = malloc((size_t)j->n * sizeof(float));
    if (!buf) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
    for (int64_t r = begin; r < end; r++) {
        nbq_load_row(j->x, j->dt, r, j->n, buf);
        if (j->gran == G_BLOCK) {
            int64_t nb = j->n / NB_NVFP4_BLOCK;
            for (int64_t b = 0; b < nb; b++) {
                float m = 0.0f;
                for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
                    float a = fabsf(buf[b * NB_NVFP4_BLOCK + i]);
                    if (a > m) m = a;
                }
                j->out[r * nb + b] = m;
            }
        } else {
            float m = 0.0f;
            for (int64_t i = 0; i < j->n; i++) {
                float a = fabsf(buf[i]);
                if (a > m) m = a;
            }
            j->out[r] = m;
        }
    }
    free(buf);
}

static nb_status collect_max(nb_ctx *ctx, nb_calib *c, const nb_tensor *x) {
    int64_t n = x->shape[x->ndim - 1], rows = n ? nb_tensor_numel(x) / n : 0;
    int64_t count = count_for(c->gran, rows, n);
    nb_status s = check_layout(ctx, c, x, count);
    if (s) return s;
    if (c->gran == G_NONE) return NB_OK;
    if (!c->vals) {
        c->vals = calloc((size_t)(count ? count : 1), sizeof(float));
        if (!c->vals) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibrator)");
    }
    if (c->gran == G_TENSOR) {
        float m = nbq_absmax(ctx, nb_tensor_data(x), x->dtype, nb_tensor_numel(x));
        if (m > c->vals[0]) c->vals[0] = m;
        return NB_OK;
    }
    float *tmp = malloc((size_t)(count ? count : 1) * sizeof(float));
    if (!tmp) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibrator)");
    max_job j = {.x = nb_tensor_data(x), .dt = x->dtype, .n = n, .gran = c->gran, .out = tmp};
    nb_parallel_for(ctx, rows, n >= 16384 ? 1 : 16384 / (n ? n : 1), max_range, &j);
    if (j.failed) { free(tmp); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibrator)"); }
    for (int64_t i = 0; i < count; i++)
        if (tmp[i] > c->vals[i]) c->vals[i] = tmp[i];
    free(tmp);
    return NB_OK;
}

/* Write a max result into the quantizer (the shape of the state follows x). */
static nb_status store_max(nb_ctx *ctx, nb_calib *c) {
    nb_quantizer *q = c->q;
    nb_tensor *t = NULL;
    nb_status s;
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, c->shape, sizeof sh);
    switch (c->gran) {
    case G_TENSOR:
        if ((s = nb_tensor_from_data(ctx, NB_F32, 0, NULL, c->vals, &t))) return s;
        s = nbq_quantizer_replace_state(ctx, q, "amax", t);
        break;
    case G_ROW:
        sh[c->ndim - 1] = 1;
        if ((s = nb_tensor_from_data(ctx, NB_F32, c->ndim, sh, c->vals, &t))) return s;
        s = nbq_quantizer_replace_state(ctx, q, "amax", t);
        break;
    case G_BLOCK: {
        sh[c->ndim - 1] /= NB_NVFP4_BLOCK;
        if ((s = nb_tensor_from_data(ctx, NB_F32, c->ndim, sh, c->vals, &t))) return s;
        if ((s = nbq_quantizer_replace_state(ctx, q, "block_amax", t))) break;
        /* promote_static_block_weight_quantizers: global_amax = max of the per-block amax */
        float g = 0.0f;
        for (int64_t i = 0; i < c->nvals; i++)
            if (c->vals[i] > g) g = c->vals[i];
        nb_tensor_release(t);
        t = NULL;
        if ((s = nb_tensor_from_data(ctx, NB_F32, 0, NULL, &g, &t))) return s;
        s = nbq_quantizer_replace_state(ctx, q, "global_amax", t);
        break;
    }
    default:
        return NB_OK;
    }
    nb_tensor_release(t);
    return s;
}

/* ---- ModelOpt's fake-quant arithmetic (the MSE metric that reproduces ModelOpt's choices) ----------- */

/* tensor_quant._fp8_eager(x, amax): x * (448/amax), clamp, e4m3, times 1/(448/amax). A Python
 * scalar divided by a tensor is torch's __rtruediv__, reciprocal(t) * scalar: two roundings. */
static float mo_fp8_eager(float x, float amax) {
    float safe = amax <= 0x1p-24f ? 1.0f : amax;
    float r = 1.0f / safe;
    float s = r * 448.0f;
    float sinv = 1.0f / s;
    float v = x * s;
    float q = nb_e4m3_to_f32(nb_f32_to_e4m3(v));   /* clamps to ±448 first */
    return q * sinv;
}

/* static_blockwise_fp4_fake_quant: compute_fp4_scales (amax/6, fp8-fake-quantized against
 * G*(448/norm)/6, which may underflow to 0) then the kernel's round-to-E2M1 with a zero scale
 * zeroing the block. */
static void mo_nvfp4_static_block(const float *x, float amax, float gq, float *y) {
    float scale = amax / 6.0f;
    float sq = mo_fp8_eager(scale, gq);
    int zero = sq == 0.0f;
    float safe = (zero || isnan(sq) || isinf(sq)) ? 1.0f : sq;
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        float a = fabsf(x[i]) / safe;
        float r = nb_e2m1_deq[nb_f32_to_e2m1(a)] * safe;
        y[i] = zero ? 0.0f : (x[i] >= 0.0f ? r : -r);
    }
}

static float round_to(float v, nb_dtype dt) {
    if (dt == NB_BF16) return nb_bf16_to_f32(nb_f32_to_bf16(v));
    if (dt == NB_F16) return nb_f16_to_f32(nb_f32_to_f16(v));
    return v;
}

/* ---- MSE ------------------------------------------------------------------------------------------ */

typedef struct sse_job {
    const nbq_plan *plan;  /* export metric */
    int mo;                /* ModelOpt metric: 1 = fp8_eager, 2 = static NVFP4 */
    const float *cand;     /* ModelOpt metric: candidate amax per element */
    float gq;              /* ModelOpt static NVFP4: G*(448/norm)/6 */
    int64_t n;
    const void *x;
    nb_dtype dt;
    int gran;
    double *out;     /* G_TENSOR: [rows] partials; G_ROW: [rows]; G_BLOCK: [rows * n/16] */
    int failed;
} sse_job;

static void sse_range(void *arg, int64_t begin, int64_t end) {
    sse_job *j = arg;
    int64_t n = j->n;
    float *buf = malloc((size_t)n * 2 * sizeof(float));
    if (!buf) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
    float *y = buf + n;
    nb_qrow_args a;
    for (int64_t r = begin; r < end; r++) {
        nbq_load_row(j->x, j->dt, r, n, buf);
        if (j->mo == 1) {
            float am = j->gran == G_ROW ? j->cand[r] : j->cand[0];
            for (int64_t i = 0; i < n; i++) y[i] = mo_fp8_eager(buf[i], am);
        } else if (j->mo == 2) {
            int64_t nb = n / NB_NVFP4_BLOCK;
            for (int64_t b = 0; b < nb; b++)
                mo_nvfp4_static_block(buf + b * NB_NVFP4_BLOCK, j->cand[r * nb + b], j->gq, y + b * NB_NVFP4_BLOCK);
        } else {
            nbq_plan_row(j->plan, r, &a);
            j->plan->fn.fake(buf, n, &a, y);
        }
        /* F.mse_loss(x, xq, reduction="none"): f32 difference and square; summed in double */
        if (j->gran == G_BLOCK) {
            int64_t nb = n / NB_NVFP4_BLOCK;
            for (int64_t b = 0; b < nb; b++) {
                double s = 0.0;
                for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
                    float e = buf[b * NB_NVFP4_BLOCK + i] - y[b * NB_NVFP4_BLOCK + i];
                    float e2 = e * e;
                    s += (double)e2;
                }
                j->out[r * nb + b] = s;
            }
        } else {
            double s = 0.0;
            for (int64_t i = 0; i < n; i++) {
                float e = buf[i] - y[i];
                float e2 = e * e;
                s += (double)e2;
            }
            j->out[r] = s;
        }
    }
    free(buf);
}

/* Keep one batch for the search at finish. */
static nb_status keep_batch(nb_ctx *ctx, nb_calib *c, const nb_tensor *x) {
    if (c->nbatch == c->batch_cap) {
        int64_t cap = c->batch_cap ? c->batch_cap * 2 : 4;
        nb_tensor **b = realloc(c->batch, (size_t)cap * sizeof *b);
        if (!b) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)");
        c->batch = b;
        c->batch_cap = cap;
    }
    nb_tensor *t = NULL;
    if (c->borrow) {
        nb_tensor_retain((nb_tensor *)x);
        t = (nb_tensor *)x;
    } else {
        nb_status s = nb_tensor_contiguous(ctx, x, &t);   /* a copy: the caller may refill x before finish */
        if (s) return s;
    }
    c->batch[c->nbatch++] = t;
    return NB_OK;
}

/* Add one batch's squared errors for every candidate to c->loss. */
static nb_status mse_batch(nb_ctx *ctx, nb_calib *c, const nb_tensor *x, const nb_qparams *p, int mo, float gq) {
    int64_t n = x->shape[x->ndim - 1], rows = n ? nb_tensor_numel(x) / n : 0;
    int64_t count = c->nvals;
    nb_status s = NB_OK;
    int64_t nout = c->gran == G_BLOCK ? count : rows;
    double *part = malloc((size_t)(nout ? nout : 1) * sizeof(double));
    float *cand = malloc((size_t)(count ? count : 1) * sizeof(float));
    unsigned char *skip = malloc((size_t)(count ? count : 1));
    nb_tensor *ct = NULL;
    if (!part || !cand || !skip) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)"); goto done; }
    if (c->gran != G_TENSOR) {
        /* the candidate amax in the layout of the state a quantize of x would check */
        int64_t sh[NB_MAX_DIMS];
        memcpy(sh, x->shape, sizeof sh);
        sh[x->ndim - 1] = c->gran == G_BLOCK ? n / NB_NVFP4_BLOCK : 1;
        if ((s = nb_tensor_new(ctx, NB_F32, x->ndim, sh, &ct))) goto done;
    }
    for (int64_t k = 0; k < c->ncand; k++) {
        /* MseCalibrator._compute_candidate_amax: initial_amax * candidate in f32; a per-row amax is a
         * dimensioned tensor in the weight's dtype, so torch rounds that product to it */
        int any_skip = 0;
        for (int64_t e = 0; e < count; e++) {
            float v = c->init[e] * c->mult[k];
            if (c->gran == G_ROW && mo) v = round_to(v, x->dtype);
            skip[e] = !isfinite(v);
            if (skip[e]) { v = c->init[e]; any_skip = 1; }
            cand[e] = v;
        }
        double *L = c->loss + k * count;
        if (c->gran == G_TENSOR && any_skip) { L[0] = INFINITY; continue; }
        nb_qparams pc = *p;
        if (c->gran == G_TENSOR) pc.amax = cand[0];
        else {
            memcpy(nb_tensor_data(ct), cand, (size_t)count * sizeof(float));
            if (c->gran == G_BLOCK) pc.block_amax = ct;
            else pc.channel_amax = ct;
        }
        nbq_plan plan;
        memset(&plan, 0, sizeof plan);
        if (!mo && (s = nbq_plan_init(ctx, &plan, x, &pc))) goto done;
        sse_job j = {.plan = &plan, .mo = mo, .cand = cand, .gq = gq, .n = n, .x = nb_tensor_data(x), .dt = x->dtype,
                     .gran = c->gran, .out = part};
        nb_parallel_for(ctx, rows, n >= 16384 ? 1 : 16384 / (n ? n : 1), sse_range, &j);
        nbq_plan_free(&plan);
        if (j.failed) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)"); goto done; }
        if (c->gran == G_TENSOR) {
            double t = 0.0;
            for (int64_t r = 0; r < rows; r++) t += part[r];   /* row order: independent of threading */
            L[0] += t;
        } else {
            for (int64_t e = 0; e < count; e++) L[e] = skip[e] ? INFINITY : L[e] + part[e];
        }
    }
done:
    nb_tensor_release(ct);
    free(part);
    free(cand);
    free(skip);
    return s;
}

/* The search: candidates around the data max of every kept batch, their summed errors, the argmin
 * per element, written into the quantizer. Static NVFP4 also stores its global_amax = the data max
 * (what a max pass stores); the search's global amax is the group's, with this member's data max. */
static nb_status store_mse(nb_ctx *ctx, nb_calib *c) {
    nb_quantizer *q = c->q;
    nb_quantizer_config qc;
    nb_quantizer_get_config(q, &qc);
    int64_t count = c->nvals;
    free(c->init);
    free(c->mult);
    free(c->loss);
    free(c->choice);
    c->init = NULL;
    c->mult = NULL;
    c->loss = NULL;
    c->choice = NULL;
    c->ncand = nb_mse_steps(c->cfg.start_multiplier, c->cfg.stop_multiplier, c->cfg.step_size);
    c->init = malloc((size_t)(count ? count : 1) * sizeof(float));
    c->mult = malloc((size_t)c->ncand * sizeof(float));
    c->loss = calloc((size_t)(c->ncand * (count ? count : 1)), sizeof(double));
    float *best = malloc((size_t)(count ? count : 1) * sizeof(float));
    if (!c->init || !c->mult || !c->loss || !best) {
        free(best);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)");
    }
    memcpy(c->init, c->vals, (size_t)count * sizeof(float));
    for (int64_t k = 0; k < c->ncand; k++)
        c->mult[k] = nb_linspace_f32(c->cfg.start_multiplier, c->cfg.stop_multiplier, c->ncand, k);
    nb_qparams p;
    nb_qparams_init(&p, qc.format);
    p.name = nb_quantizer_name(q);
    p.mx_floor = qc.mx_floor;
    p.fp8_div_dtype = qc.fp8_div_dtype;
    float own = 0.0f;
    nb_status s = NB_OK;
    if (c->gran == G_BLOCK) {
        for (int64_t e = 0; e < count; e++)
            if (c->vals[e] > own) own = c->vals[e];
        if ((s = nbq_group_amax_with(ctx, q, own, "calibrator", &p.global_amax))) { free(best); return s; }
        p.global_amax = nbq_sanitized_amax(qc.format, p.global_amax);   /* as quantize will (all-zero) */
    }
    /* ModelOpt's metric exists on CPU for FP8 (fp8_eager) and static NVFP4 (the blockwise kernel) */
    int mo = 0;
    if (c->cfg.metric == NB_MSE_MODELOPT) {
        if (nb_format_desc_of(qc.format)->elem_dtype == NB_E4M3 && c->gran != G_NONE) mo = 1;   /* FP8 */
        else if (c->gran == G_BLOCK) mo = 2;
    }
    float gq = 0.0f;
    if (mo == 2) {
        float norm = nb_qformat_info(qc.format)->scale_norm;
        float t = p.global_amax * (448.0f / norm);   /* 448/norm is exact: 1 or 1.75 */
        gq = t / 6.0f;
    }
    for (int64_t b = 0; b < c->nbatch && !s; b++) s = mse_batch(ctx, c, c->batch[b], &p, mo, gq);
    if (s) { free(best); return s; }
    c->choice = malloc((size_t)(count ? count : 1) * sizeof(int32_t));
    if (!c->choice) { free(best); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)"); }
    for (int64_t e = 0; e < count; e++) {
        int64_t bi = 0;   /* torch.argmin: the first index on ties */
        for (int64_t k = 1; k < c->ncand; k++)
            if (c->loss[k * count + e] < c->loss[bi * count + e]) bi = k;
        c->choice[e] = (int32_t)bi;
        best[e] = c->init[e] * c->mult[bi];
        /* ModelOpt's _amax buffer keeps the weight's dtype (static NVFP4 keeps f32) */
        if (c->gran != G_BLOCK) best[e] = round_to(best[e], c->xdt);
        if (!isfinite(best[e])) {
            free(best);
            return nb_fail(ctx, NB_ERR_NUMERIC, "calibrator for '%s': every candidate amax overflows", nb_quantizer_name(q));
        }
    }
    nb_tensor *t = NULL;
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, c->shape, sizeof sh);
    if (c->gran == G_TENSOR) s = nb_tensor_from_data(ctx, NB_F32, 0, NULL, best, &t);
    else {
        sh[c->ndim - 1] = c->gran == G_ROW ? 1 : sh[c->ndim - 1] / NB_NVFP4_BLOCK;
        s = nb_tensor_from_data(ctx, NB_F32, c->ndim, sh, best, &t);
    }
    if (!s) s = nbq_quantizer_replace_state(ctx, q, c->gran == G_BLOCK ? "block_amax" : "amax", t);
    nb_tensor_release(t);
    free(best);
    if (!s && c->gran == G_BLOCK) {
        if (!(s = nb_tensor_from_data(ctx, NB_F32, 0, NULL, &own, &t))) {
            s = nbq_quantizer_replace_state(ctx, q, "global_amax", t);
            nb_tensor_release(t);
        }
    }
    return s;
}

/* ---- public ------------------------------------------------------------------------------------------ */

nb_status nb_calib_collect(nb_ctx *ctx, nb_calib *c, const nb_tensor *x) {
    if (!c) return nb_fail(ctx, NB_ERR_INVALID, "nb_calib_collect: calibrator is NULL");
    nb_quantizer_config qc;
    nb_quantizer_get_config(c->q, &qc);
    const char *name = nb_quantizer_name(c->q);
    nb_status s = nbq_check_input(ctx, x, qc.format, name);
    if (s) return s;
    nb_tensor *xc = NULL;
    if ((s = nbq_contiguous(ctx, x, &xc))) return s;
    if (!(s = nbq_check_finite(ctx, xc, name))) {
        s = collect_max(ctx, c, xc);   /* MSE too: the search is centred on the max over every batch */
        if (!s && c->cfg.method != NB_CALIB_MAX) s = keep_batch(ctx, c, xc);
        if (!s) c->batches++;
    }
    nb_tensor_release(xc);
    return s;
}

nb_status nb_calib_finish(nb_ctx *ctx, nb_calib *c) {
    if (!c) return nb_fail(ctx, NB_ERR_INVALID, "nb_calib_finish: calibrator is NULL");
    if (c->batches == 0)
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': no batch was collected", nb_quantizer_name(c->q));
    return c->cfg.method == NB_CALIB_MAX ? store_max(ctx, c) : store_mse(ctx, c);
}

nb_status nb_quantizer_calibrate(nb_ctx *ctx, nb_quantizer *q, const nb_tensor *x, nb_calib_method m) {
    nb_calib_config cfg;
    nb_calib_config_init(&cfg, m);
    nb_calib *c = NULL;
    nb_status s = nb_calib_new(ctx, q, &cfg, &c);
    if (s) return s;
    c->borrow = 1;   /* x lives until finish below: the MSE search reads it without a copy */
    if (!(s = nb_calib_collect(ctx, c, x))) s = nb_calib_finish(ctx, c);
    nb_calib_free(c);
    return s;
}

/* ---- data-parallel calibration ---------------------------------------------------------------------- */

/* Merge max observers across the ranks of ctx's communicator, each of which fed its own share of the
 * batches: the batch counts are summed (coverage is the union over ranks) and the running maxima
 * all-reduced with MAX, which is exact in any order, so the state equals one rank's over all batches.
 * A rank whose share reached an observer with no batch takes the layout from the ranks that saw one. */
nb_status nbq_calib_allreduce(nb_ctx *ctx, nb_calib **cals, int64_t n) {
    if (nb_comm_size(ctx) <= 1 || n <= 0) return NB_OK;
    enum { META = 3 + NB_MAX_DIMS };   /* nvals, ndim, xdt, shape */
    int64_t *sum = calloc((size_t)n, sizeof *sum);
    int64_t *meta = calloc((size_t)(n * META), sizeof *meta);
    float *vals = NULL;
    nb_status s = NB_OK;
    if (!sum || !meta) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibration over ranks)"); goto done; }
    for (int64_t i = 0; i < n; i++) {
        nb_calib *c = cals[i];
        if (c->cfg.method != NB_CALIB_MAX) {
            s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "calibrator for '%s': only max observers merge over ranks",
                        nb_quantizer_name(c->q));
            goto done;
        }
        sum[i] = c->batches;
        if (c->batches == 0) continue;
        int64_t *m = meta + i * META;
        m[0] = c->nvals, m[1] = c->ndim, m[2] = (int64_t)c->xdt;
        memcpy(m + 3, c->shape, sizeof c->shape);
    }
    if ((s = nb_comm_allreduce(ctx, sum, n, NB_I64, NB_COMM_SUM))) goto done;
    if ((s = nb_comm_allreduce(ctx, meta, n * META, NB_I64, NB_COMM_MAX))) goto done;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        nb_calib *c = cals[i];
        int64_t *m = meta + i * META;
        if (cals[i]->gran == G_NONE || sum[i] == 0) continue;
        if (c->batches > 0 && c->nvals != m[0]) {
            s = nb_fail(ctx, NB_ERR_SHAPE, "calibrator for '%s': %lld amax values on rank %d, %lld on another rank",
                        nb_quantizer_name(c->q), (long long)c->nvals, nb_comm_rank(ctx), (long long)m[0]);
            goto done;
        }
        total += m[0];
    }
    vals = calloc((size_t)(total ? total : 1), sizeof *vals);
    if (!vals) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibration over ranks)"); goto done; }
    for (int64_t i = 0, off = 0; i < n; i++) {
        nb_calib *c = cals[i];
        if (c->gran == G_NONE || sum[i] == 0) continue;
        int64_t k = meta[i * META];
        if (c->batches > 0) memcpy(vals + off, c->vals, (size_t)k * sizeof *vals);
        off += k;
    }
    if ((s = nb_comm_allreduce(ctx, vals, total, NB_F32, NB_COMM_MAX))) goto done;
    for (int64_t i = 0, off = 0; i < n; i++) {
        nb_calib *c = cals[i];
        int64_t *m = meta + i * META;
        if (c->batches == 0 && sum[i] > 0) {   /* this rank's share never reached it: the others' layout */
            c->nvals = m[0], c->ndim = (int)m[1], c->xdt = (nb_dtype)m[2];
            memcpy(c->shape, m + 3, sizeof c->shape);
        }
        if (c->gran != G_NONE && sum[i] > 0) {
            if (!c->vals && !(c->vals = calloc((size_t)(m[0] ? m[0] : 1), sizeof(float)))) {
                s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (calibrator)");
                goto done;
            }
            memcpy(c->vals, vals + off, (size_t)m[0] * sizeof *vals);
            off += m[0];
        }
        c->batches = sum[i];
    }
done:
    free(sum);
    free(meta);
    free(vals);
    return s;
}

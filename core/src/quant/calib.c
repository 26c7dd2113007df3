/* Calibrators (observers) that accumulate over batches and write a quantizer's state:
 * max (per tensor, per row, per block), ModelOpt's MSE search over amax multipliers (first index
 * wins ties) and four_over_six (MSE with multipliers {1.0, 1.5} on a static NVFP4_46 quantizer).
 * The MSE error is summed per amax element, with ModelOpt's fake-quant arithmetic by default (so the
 * chosen amax matches ModelOpt's) or nibble's export arithmetic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant_internal.h"

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
    /* max observer */
    float *vals;          /* [nvals]: the running max per amax element */
    int64_t nvals;
    /* MSE */
    int mse_ready;
    int64_t ncand;
    float *mult;          /* [ncand] */
    float *init;          /* [nvals] initial amax per element */
    double *loss;         /* [ncand * nvals] */
    int32_t *choice;      /* [nvals] after finish */
    nb_dtype xdt;         /* dtype of the first batch: a searched per-tensor/row amax is stored in it */
};

static int granularity(const nb_quantizer_config *c) {
    switch (c->format) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46: return c->is_static ? G_BLOCK : G_TENSOR;
    case NB_FMT_FP8_TENSOR: return G_TENSOR;
    case NB_FMT_FP8_CHANNEL: return G_ROW;
    default: return G_NONE;
    }
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
    *out = NULL;
    nb_quantizer_config qc;
    nb_quantizer_get_config(q, &qc);
    const char *name = nb_quantizer_name(q);
    if (cfg->method != NB_CALIB_MAX && cfg->method != NB_CALIB_MSE && cfg->method != NB_CALIB_FOUR_OVER_SIX)
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': unknown method %d", name, (int)cfg->method);
    if (cfg->method == NB_CALIB_FOUR_OVER_SIX && !(qc.format == NB_FMT_NVFP4_46 && qc.is_static))
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': four_over_six needs a static nvfp4_46 quantizer, not %s%s",
                       name, nb_qformat_info(qc.format)->name, qc.is_static ? " static" : "");
    if (cfg->method != NB_CALIB_MAX && granularity(&qc) == G_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': %s has no amax to search", name,
                       nb_qformat_info(qc.format)->name);
    if (cfg->method != NB_CALIB_MAX &&
        (!(cfg->step_size > 0) || !(cfg->stop_multiplier >= cfg->start_multiplier) || !(cfg->start_multiplier > 0)))
        return nb_fail(ctx, NB_ERR_INVALID, "calibrator for '%s': need 0 < start <= stop and step > 0", name);
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
    nb_quantizer_release(c->q);
    free(c->vals);
    free(c->mult);
    free(c->init);
    free(c->loss);
    free(c->choice);
    free(c);
}

int64_t nb_calib_batches(const nb_calib *c) { return c->batches; }

const int32_t *nb_calib_choice(const nb_calib *c, int64_t *n) {
    if (n) *n = c->choice ? c->nvals : 0;
    return c->choice;
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
    if (c->batches == 0 && !c->vals && !c->mse_ready) {
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
        s = nb_quantizer_set_state(ctx, q, "amax", t);
        break;
    case G_ROW:
        sh[c->ndim - 1] = 1;
        if ((s = nb_tensor_from_data(ctx, NB_F32, c->ndim, sh, c->vals, &t))) return s;
        s = nb_quantizer_set_state(ctx, q, "amax", t);
        break;
    case G_BLOCK: {
        sh[c->ndim - 1] /= NB_NVFP4_BLOCK;
        if ((s = nb_tensor_from_data(ctx, NB_F32, c->ndim, sh, c->vals, &t))) return s;
        if ((s = nb_quantizer_set_state(ctx, q, "block_amax", t))) break;
        /* promote_static_block_weight_quantizers: global_amax = max of the per-block amax */
        float g = 0.0f;
        for (int64_t i = 0; i < c->nvals; i++)
            if (c->vals[i] > g) g = c->vals[i];
        nb_tensor_release(t);
        t = NULL;
        if ((s = nb_tensor_from_data(ctx, NB_F32, 0, NULL, &g, &t))) return s;
        s = nb_quantizer_set_state(ctx, q, "global_amax", t);
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
            j->plan->tr->fake_row(buf, n, &a, y);
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

/* Take the quantizer's current amax as the search's starting point (max-calibrating x first when it
 * has none) and lay out the candidates. */
static nb_status mse_prepare(nb_ctx *ctx, nb_calib *c, const nb_tensor *x, int64_t count) {
    nb_quantizer *q = c->q;
    const char *attr = c->gran == G_BLOCK ? "block_amax" : "amax";
    if (!nb_quantizer_has_state(q, attr)) {
        nb_calib_config mc;
        nb_calib_config_init(&mc, NB_CALIB_MAX);
        nb_calib *m = NULL;
        nb_status s = nb_calib_new(ctx, q, &mc, &m);
        if (!s) s = nb_calib_collect(ctx, m, x);
        if (!s) s = nb_calib_finish(ctx, m);
        nb_calib_free(m);
        if (s) return s;
    }
    nb_tensor *st = NULL;
    nb_status s = nb_quantizer_get_state(ctx, q, attr, &st);
    if (s) return s;
    if (nb_tensor_numel(st) != count) {
        nb_tensor_release(st);
        return nb_fail(ctx, NB_ERR_SHAPE, "calibrator for '%s': its %s has %lld values, this tensor needs %lld",
                       nb_quantizer_name(q), attr, (long long)nb_tensor_numel(st), (long long)count);
    }
    c->ncand = nb_mse_steps(c->cfg.start_multiplier, c->cfg.stop_multiplier, c->cfg.step_size);
    c->init = malloc((size_t)count * sizeof(float));
    c->mult = malloc((size_t)c->ncand * sizeof(float));
    c->loss = calloc((size_t)(c->ncand * count), sizeof(double));
    if (!c->init || !c->mult || !c->loss) {
        nb_tensor_release(st);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)");
    }
    memcpy(c->init, nb_tensor_data(st), (size_t)count * sizeof(float));
    nb_tensor_release(st);
    for (int64_t k = 0; k < c->ncand; k++)
        c->mult[k] = nb_linspace_f32(c->cfg.start_multiplier, c->cfg.stop_multiplier, c->ncand, k);
    c->mse_ready = 1;
    return NB_OK;
}

static nb_status collect_mse(nb_ctx *ctx, nb_calib *c, const nb_tensor *x) {
    int64_t n = x->shape[x->ndim - 1], rows = n ? nb_tensor_numel(x) / n : 0;
    int64_t count = count_for(c->gran, rows, n);
    nb_status s = check_layout(ctx, c, x, count);
    if (s) return s;
    if (!c->mse_ready && (s = mse_prepare(ctx, c, x, count))) return s;
    nb_qparams p;
    if ((s = nb_quantizer_params(ctx, c->q, &p))) return s;
    nb_quantizer_config qc;
    nb_quantizer_get_config(c->q, &qc);
    /* ModelOpt's metric exists on CPU for FP8 (fp8_eager) and static NVFP4 (the blockwise kernel) */
    int mo = 0;
    if (c->cfg.metric == NB_MSE_MODELOPT) {
        if (qc.format == NB_FMT_FP8_TENSOR || qc.format == NB_FMT_FP8_CHANNEL) mo = 1;
        else if (c->gran == G_BLOCK) mo = 2;
    }
    float gq = 0.0f;
    if (mo == 2) {
        float norm = nb_qformat_info(qc.format)->scale_norm;
        float t = p.global_amax * (448.0f / norm);   /* 448/norm is exact: 1 or 1.75 */
        gq = t / 6.0f;
    }
    int64_t nout = c->gran == G_BLOCK ? count : rows;
    double *part = malloc((size_t)(nout ? nout : 1) * sizeof(double));
    float *cand = malloc((size_t)count * sizeof(float));
    unsigned char *skip = malloc((size_t)count);
    nb_tensor *ct = NULL;
    if (!part || !cand || !skip) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)"); goto done; }
    if (c->gran != G_TENSOR) {
        int64_t one = count;
        if ((s = nb_tensor_new(ctx, NB_F32, 1, &one, &ct))) goto done;
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
        nb_qparams pc = p;
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

static nb_status store_mse(nb_ctx *ctx, nb_calib *c) {
    free(c->choice);
    c->choice = malloc((size_t)c->nvals * sizeof(int32_t));
    float *best = malloc((size_t)c->nvals * sizeof(float));
    nb_status s = NB_OK;
    if (!c->choice || !best) { free(best); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (MSE calibrator)"); }
    for (int64_t e = 0; e < c->nvals; e++) {
        int64_t bi = 0;   /* torch.argmin: the first index on ties */
        for (int64_t k = 1; k < c->ncand; k++)
            if (c->loss[k * c->nvals + e] < c->loss[bi * c->nvals + e]) bi = k;
        c->choice[e] = (int32_t)bi;
        best[e] = c->init[e] * c->mult[bi];
        /* ModelOpt's _amax buffer keeps the weight's dtype (static NVFP4 keeps f32) */
        if (c->gran != G_BLOCK) best[e] = round_to(best[e], c->xdt);
        if (!isfinite(best[e])) {
            free(best);
            return nb_fail(ctx, NB_ERR_NUMERIC, "calibrator for '%s': every candidate amax overflows",
                           nb_quantizer_name(c->q));
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
    if (!s) s = nb_quantizer_set_state(ctx, c->q, c->gran == G_BLOCK ? "block_amax" : "amax", t);
    nb_tensor_release(t);
    free(best);
    return s;
}

/* ---- public ------------------------------------------------------------------------------------------ */

nb_status nb_calib_collect(nb_ctx *ctx, nb_calib *c, const nb_tensor *x) {
    nb_quantizer_config qc;
    nb_quantizer_get_config(c->q, &qc);
    const char *name = nb_quantizer_name(c->q);
    nb_status s = nbq_check_input(ctx, x, qc.format, name);
    if (s) return s;
    nb_tensor *xc = NULL;
    if ((s = nbq_contiguous(ctx, x, &xc))) return s;
    if (!(s = nbq_check_finite(ctx, xc, name))) {
        s = c->cfg.method == NB_CALIB_MAX ? collect_max(ctx, c, xc) : collect_mse(ctx, c, xc);
        if (!s) c->batches++;
    }
    nb_tensor_release(xc);
    return s;
}

nb_status nb_calib_finish(nb_ctx *ctx, nb_calib *c) {
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
    if (!(s = nb_calib_collect(ctx, c, x))) s = nb_calib_finish(ctx, c);
    nb_calib_free(c);
    return s;
}

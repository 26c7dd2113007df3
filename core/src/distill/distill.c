/* Distillation losses (forward/reverse KL, teacher top-k KL in three normalizations, cross-entropy) with
 * their gradients w.r.t. the student logits, one row at a time in double precision, threaded over rows.
 * The definitions and the reduction are in nibble/distill.h; the golden values come from
 * tests/golden/gen_distill_golden.py (float64 torch autograd, modelopt's own LogitsDistillationLoss). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/distill.h"

/* ---- tensor access ----------------------------------------------------------------------------- */

/* A [rows, cols] view with a contiguous last dim: either 2-D with any row stride, or any contiguous
 * tensor (leading dims flattened). */
typedef struct rows_view {
    uint8_t *base;
    int64_t rows, cols, row_stride;   /* row_stride in bytes */
} rows_view;

static nb_status get_rows(nb_ctx *ctx, const char *what, const nb_tensor *t, nb_dtype dt, rows_view *rv) {
    if (t->device >= 0) return nb_fail(ctx, NB_ERR_UNSUPPORTED, "distill: %s is a device tensor (host only)", what);
    if (t->dtype != dt)
        return nb_fail(ctx, NB_ERR_INVALID, "distill: %s must be %s, got %s", what, nb_dtype_info(dt)->name,
                       nb_dtype_info(t->dtype) ? nb_dtype_info(t->dtype)->name : "?");
    if (t->ndim < 2) return nb_fail(ctx, NB_ERR_SHAPE, "distill: %s must have 2 dims [rows, cols], has %d", what, (int)t->ndim);
    int64_t esz = nb_dtype_info(dt)->bits / 8;
    rv->base = nb_tensor_data(t);
    rv->cols = t->shape[t->ndim - 1];
    if (t->ndim == 2 && (t->strides[1] == esz || t->shape[1] <= 1)) {
        rv->rows = t->shape[0];
        rv->row_stride = t->strides[0];
        return NB_OK;
    }
    if (!nb_tensor_is_contiguous(t))
        return nb_fail(ctx, NB_ERR_SHAPE, "distill: %s needs a contiguous last dimension", what);
    rv->rows = rv->cols ? nb_tensor_numel(t) / rv->cols : 0;
    rv->row_stride = rv->cols * esz;
    return NB_OK;
}

/* A per-row vector ([n], any shape with n elements if contiguous, or 1-D with a stride). */
typedef struct vec_view {
    const uint8_t *base;
    int64_t stride;
    nb_dtype dtype;
} vec_view;

static nb_status get_vec(nb_ctx *ctx, const char *what, const nb_tensor *t, int64_t n, const nb_dtype *ok, int nok,
                         vec_view *vv) {
    int good = 0;
    for (int i = 0; i < nok; i++) good |= t->dtype == ok[i];
    if (!good)
        return nb_fail(ctx, NB_ERR_INVALID, "distill: %s has dtype %s, not one it accepts", what,
                       nb_dtype_info(t->dtype) ? nb_dtype_info(t->dtype)->name : "?");
    if (t->device >= 0) return nb_fail(ctx, NB_ERR_UNSUPPORTED, "distill: %s is a device tensor (host only)", what);
    if (nb_tensor_numel(t) != n)
        return nb_fail(ctx, NB_ERR_SHAPE, "distill: %s has %lld elements, expected %lld (one per row)", what,
                       (long long)nb_tensor_numel(t), (long long)n);
    vv->base = nb_tensor_data(t);
    vv->dtype = t->dtype;
    int64_t esz = nb_dtype_info(t->dtype)->bits / 8;
    if (t->ndim == 1) vv->stride = t->strides[0];
    else if (nb_tensor_is_contiguous(t)) vv->stride = esz;
    else return nb_fail(ctx, NB_ERR_SHAPE, "distill: %s must be 1-D or contiguous", what);
    if (n == 1) vv->stride = esz;
    return NB_OK;
}

static double vec_get(const vec_view *v, int64_t i) {
    const uint8_t *p = v->base + i * v->stride;
    switch (v->dtype) {
    case NB_F32: { float x; memcpy(&x, p, 4); return x; }
    case NB_F64: { double x; memcpy(&x, p, 8); return x; }
    case NB_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    case NB_I64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case NB_U8: case NB_BOOL: return *p;
    default: return NAN;
    }
}

static int64_t vec_get_i64(const vec_view *v, int64_t i) {
    const uint8_t *p = v->base + i * v->stride;
    if (v->dtype == NB_I64) { int64_t x; memcpy(&x, p, 8); return x; }
    int32_t x; memcpy(&x, p, 4); return x;
}

static const nb_dtype LABEL_DT[] = {NB_I32, NB_I64};
static const nb_dtype WEIGHT_DT[] = {NB_F32, NB_U8, NB_BOOL};
static const nb_dtype LSE_DT[] = {NB_F32, NB_F64};

/* Row weights: weights[n] (1 if absent), 0 where the label is ignore_index. Validates both. */
static nb_status row_weights(nb_ctx *ctx, const nb_distill_cfg *cfg, int64_t n, int64_t vocab, const nb_tensor *labels,
                             const nb_tensor *weights, double *w) {
    vec_view lv = {0}, wv = {0};
    nb_status s;
    if (labels && (s = get_vec(ctx, "labels", labels, n, LABEL_DT, 2, &lv))) return s;
    if (weights && (s = get_vec(ctx, "weights", weights, n, WEIGHT_DT, 3, &wv))) return s;
    for (int64_t i = 0; i < n; i++) {
        double x = weights ? vec_get(&wv, i) : 1.0;
        if (!(x >= 0.0) || !isfinite(x))
            return nb_fail(ctx, NB_ERR_INVALID, "distill: weight of row %lld is %g (must be finite and >= 0)",
                           (long long)i, x);
        if (labels) {
            int64_t l = vec_get_i64(&lv, i);
            if (l == cfg->ignore_index) x = 0.0;
            else if (vocab >= 0 && (l < 0 || l >= vocab))
                return nb_fail(ctx, NB_ERR_INVALID, "distill: label %lld of row %lld is outside the vocabulary [0, %lld)",
                               (long long)l, (long long)i, (long long)vocab);
        }
        w[i] = x;
    }
    return NB_OK;
}

/* ---- configuration ----------------------------------------------------------------------------- */

void nb_distill_cfg_init(nb_distill_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->kd = NB_KD_FORWARD;
    cfg->temperature = 1.0;
    cfg->t2_scale = 1;
    cfg->top_k = 0;
    cfg->topk_norm = NB_TOPK_RENORM;
    cfg->lm_loss = 0;
    cfg->kd_loss_scale = 1.0;
    cfg->ignore_index = -100;
}

static nb_status check_cfg(nb_ctx *ctx, const nb_distill_cfg *c) {
    if (c->kd != NB_KD_NONE && c->kd != NB_KD_FORWARD && c->kd != NB_KD_REVERSE)
        return nb_fail(ctx, NB_ERR_INVALID, "distill: unknown kd kind %d", (int)c->kd);
    if (!(c->temperature > 0.0) || !isfinite(c->temperature))
        return nb_fail(ctx, NB_ERR_INVALID, "distill: temperature must be finite and > 0, got %g", c->temperature);
    if (c->top_k < 0) return nb_fail(ctx, NB_ERR_INVALID, "distill: top_k must be >= 0, got %d", (int)c->top_k);
    if (c->topk_norm != NB_TOPK_RENORM && c->topk_norm != NB_TOPK_STUDENT_FULL && c->topk_norm != NB_TOPK_GHOST)
        return nb_fail(ctx, NB_ERR_INVALID, "distill: unknown topk_norm %d", (int)c->topk_norm);
    if (c->top_k > 0 && c->topk_norm == NB_TOPK_STUDENT_FULL && c->kd == NB_KD_REVERSE)
        return nb_fail(ctx, NB_ERR_INVALID,
                       "distill: reverse KL is undefined with topk_norm student_full (the student has mass outside "
                       "the teacher's top k); use renorm or ghost");
    if (!(c->kd_loss_scale >= 0.0) || !isfinite(c->kd_loss_scale))
        return nb_fail(ctx, NB_ERR_INVALID, "distill: kd_loss_scale must be finite and >= 0, got %g", c->kd_loss_scale);
    if (c->kd == NB_KD_NONE && !c->lm_loss)
        return nb_fail(ctx, NB_ERR_INVALID, "distill: no loss: kd is none and lm_loss is off");
    return NB_OK;
}

nb_status nb_distill_begin(nb_ctx *ctx, const nb_distill_cfg *cfg, int64_t n_rows, const nb_tensor *labels,
                           const nb_tensor *weights, nb_distill_state *st) {
    nb_status s = check_cfg(ctx, cfg);
    if (s) return s;
    if (n_rows < 0) return nb_fail(ctx, NB_ERR_INVALID, "distill: n_rows %lld < 0", (long long)n_rows);
    if (cfg->lm_loss && !labels) return nb_fail(ctx, NB_ERR_INVALID, "distill: lm_loss needs labels");
    memset(st, 0, sizeof *st);
    st->cfg = *cfg;
    double denom = (double)n_rows;
    if (labels || weights) {
        double *w = nb_alloc(ctx, (size_t)(n_rows > 0 ? n_rows : 1) * sizeof(double));
        if (!w) return NB_ERR_NOMEM;
        s = row_weights(ctx, cfg, n_rows, -1, labels, weights, w);
        denom = 0.0;
        for (int64_t i = 0; i < n_rows && !s; i++) denom += w[i];
        nb_dealloc(ctx, w, (size_t)(n_rows > 0 ? n_rows : 1) * sizeof(double));
        if (s) return s;
    }
    st->denom = denom > 0.0 ? denom : 1.0;
    st->lm_coef = cfg->lm_loss ? 1.0 : 0.0;
    st->kd_coef = cfg->kd == NB_KD_NONE ? 0.0 : (cfg->lm_loss ? cfg->kd_loss_scale : 1.0);
    return NB_OK;
}

void nb_distill_rescale_kd(nb_distill_state *st, double lm, double kd) {
    if (st->cfg.kd != NB_KD_NONE && st->cfg.lm_loss && lm > 0.0 && kd > 0.0 && isfinite(lm) && isfinite(kd))
        st->kd_coef = st->cfg.kd_loss_scale * (lm / kd);
}

nb_status nb_distill_finish(nb_ctx *ctx, const nb_distill_state *st, nb_distill_result *out) {
    if (!(st->denom > 0.0)) return nb_fail(ctx, NB_ERR_INVALID, "distill: state has no denominator (call begin)");
    memset(out, 0, sizeof *out);
    out->kd = st->kd_sum / st->denom;
    out->lm = st->lm_sum / st->denom;
    out->loss = st->lm_coef * out->lm + st->kd_coef * out->kd;
    out->weight_sum = st->weight_sum;
    out->tokens = st->tokens;
    if (!isfinite(out->loss)) return nb_fail(ctx, NB_ERR_NUMERIC, "distill: the loss is not finite (%g)", out->loss);
    return NB_OK;
}

/* ---- top-k selection ----------------------------------------------------------------------------- */

/* Keeps the k largest values of x[0..V) as a min-heap on (value, -index): the root is the entry that
 * leaves first. Scanning in index order, an equal value never displaces an earlier one, so ties go to
 * the lower index; the final sort is by value descending, then index ascending. */
static int worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void heap_down(float *hv, int32_t *hi, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && worse(hv[l], hi[l], hv[m], hi[m])) m = l;
        if (r < k && worse(hv[r], hi[r], hv[m], hi[m])) m = r;
        if (m == i) return;
        float tv = hv[i]; hv[i] = hv[m]; hv[m] = tv;
        int32_t ti = hi[i]; hi[i] = hi[m]; hi[m] = ti;
        i = m;
    }
}

static void topk_row(const float *x, int64_t V, int k, float *hv, int32_t *hi) {
    for (int j = 0; j < k; j++) { hv[j] = x[j]; hi[j] = j; }
    for (int j = k / 2 - 1; j >= 0; j--) heap_down(hv, hi, k, j);
    for (int64_t v = k; v < V; v++) {
        if (x[v] > hv[0]) { hv[0] = x[v]; hi[0] = (int32_t)v; heap_down(hv, hi, k, 0); }
    }
    /* heap sort: repeatedly move the worst to the end -> best first */
    for (int end = k - 1; end > 0; end--) {
        float tv = hv[0]; hv[0] = hv[end]; hv[end] = tv;
        int32_t ti = hi[0]; hi[0] = hi[end]; hi[end] = ti;
        heap_down(hv, hi, end, 0);
    }
}

/* logsumexp of x[0..V) / T in double (as x · (1/T), like the row kernel) */
static double lse_row(const float *x, int64_t V, double T) {
    const double invT = 1.0 / T;
    double m = -INFINITY;
    for (int64_t v = 0; v < V; v++) if (x[v] > m) m = x[v];
    m *= invT;
    if (!isfinite(m)) return m;
    double s = 0.0;
    for (int64_t v = 0; v < V; v++) s += exp((double)x[v] * invT - m);
    return m + log(s);
}

/* ---- the row kernel ------------------------------------------------------------------------------ */

typedef struct job {
    nb_ctx *ctx;
    const nb_distill_cfg *cfg;
    int64_t V, k;
    rows_view s, t, tv, ti, g;
    int have_t, have_topk, have_grad;
    vec_view lse, lab;
    int have_lse, have_lab;
    const double *w;              /* [n] row weights */
    double gl, gk;                /* gradient factors before w_n: lm_coef / D and kd_coef·(T² or 1) / D */
    double *kd_row, *ce_row;      /* [n] outputs */
    int *bad;                     /* [n] 1 = non-finite, 2 = bad top-k index */
    double *scratch;              /* per slot: 5V + 3(k+1) doubles */
    int64_t scratch_per_slot;
    int nslots;
    int slot_next;
    int slot_overflow, interrupted;
    float *tk_v;                  /* per slot k floats / ints for top-k from the full teacher */
    int32_t *tk_i;
} job;

/* ---- one row, per loss ------------------------------------------------------------------------- */

/* What the per-loss functions of one row share: the student row x (copied: the gradient may alias it),
 * its softmax P at temperature T and log-normalizer lsez, and the scratch the losses write into: gz
 * (d kd_n / d z, z = x / T), qf (the full teacher's softmax), P1 (the softmax at T = 1) and the top-k
 * buckets' log p, log q and dL/dlog p. */
typedef struct row_ctx {
    job *J;
    int64_t r;
    double invT, lsez;
    double *x, *P, *gz, *qf, *P1, *blp, *blq, *bc;
    float *tkv;
    int32_t *tki;
    int bad_index;   /* set by a top-k loss given an index outside the vocabulary */
} row_ctx;

/* The student at temperature T (max(x·c) = max(x)·c for c > 0: rounding is monotonic). */
static void student_softmax(row_ctx *R, double xmax) {
    const int64_t V = R->J->V;
    const double mz = xmax * R->invT;
    double sz = 0.0;
    for (int64_t v = 0; v < V; v++) { R->P[v] = exp(R->x[v] * R->invT - mz); sz += R->P[v]; }
    R->lsez = mz + log(sz);
    for (int64_t v = 0; v < V; v++) R->P[v] /= sz;
}

/* Cross-entropy at T = 1 (whenever a label is there: logged even when lm_loss is off); with lm_grad, P1
 * becomes the softmax the LM gradient needs. */
static double ce_row(row_ctx *R, int64_t label, double xmax, int lm_grad) {
    const nb_distill_cfg *cfg = R->J->cfg;
    const int64_t V = R->J->V;
    double lse1;
    if (cfg->kd != NB_KD_NONE && cfg->temperature == 1.0) {
        lse1 = R->lsez;
        R->P1 = R->P;
    } else {
        double s1 = 0.0;
        for (int64_t v = 0; v < V; v++) { R->P1[v] = exp(R->x[v] - xmax); s1 += R->P1[v]; }
        lse1 = xmax + log(s1);
        if (lm_grad) for (int64_t v = 0; v < V; v++) R->P1[v] /= s1;
    }
    return label >= 0 ? lse1 - R->x[label] : 0.0;
}

/* The full teacher row at temperature T: its softmax into qf; returns its log-normalizer. */
static double teacher_softmax(row_ctx *R, const float **trow_out) {
    const int64_t V = R->J->V;
    const float *trow = (const float *)(R->J->t.base + R->r * R->J->t.row_stride);
    double ma = -INFINITY;
    for (int64_t v = 0; v < V; v++) if (trow[v] > ma) ma = trow[v];
    ma *= R->invT;
    double sa = 0.0;
    for (int64_t v = 0; v < V; v++) { R->qf[v] = exp((double)trow[v] * R->invT - ma); sa += R->qf[v]; }
    for (int64_t v = 0; v < V; v++) R->qf[v] /= sa;
    *trow_out = trow;
    return ma + log(sa);
}

/* Full vocabulary, KL(teacher ‖ student): bucket v is token v. */
static double kd_full_forward(row_ctx *R) {
    const int64_t V = R->J->V;
    const float *trow;
    const double lsea = teacher_softmax(R, &trow);
    double kd = 0.0, C = 0.0;
    for (int64_t v = 0; v < V; v++) {
        double q = R->qf[v];
        if (q > 0.0) kd += q * (((double)trow[v] * R->invT - lsea) - (R->x[v] * R->invT - R->lsez));
        C -= q;
    }
    for (int64_t v = 0; v < V; v++) R->gz[v] = -R->qf[v] - R->P[v] * C;
    return kd;
}

/* Full vocabulary, KL(student ‖ teacher). */
static double kd_full_reverse(row_ctx *R) {
    const int64_t V = R->J->V;
    const float *trow;
    const double lsea = teacher_softmax(R, &trow);
    double kd = 0.0;
    for (int64_t v = 0; v < V; v++) {
        double p = R->P[v];
        R->gz[v] = p > 0.0 ? (R->x[v] * R->invT - R->lsez) - ((double)trow[v] * R->invT - lsea) : 0.0; /* log p - log q */
        if (p > 0.0) kd += p * R->gz[v];
    }
    for (int64_t v = 0; v < V; v++) R->gz[v] = R->P[v] * (R->gz[v] - kd);
    return kd;
}

/* The teacher's top k, from the full teacher or given; 0 when an index is outside the vocabulary. */
static int topk_teacher(row_ctx *R, const float **tvals, const int32_t **tidx, double *tlse) {
    job *J = R->J;
    const int K = (int)J->k;
    const int ghost = J->cfg->topk_norm == NB_TOPK_GHOST;
    if (J->have_t) {
        const float *trow = (const float *)(J->t.base + R->r * J->t.row_stride);
        topk_row(trow, J->V, K, R->tkv, R->tki);
        *tvals = R->tkv;
        *tidx = R->tki;
        if (ghost) *tlse = lse_row(trow, J->V, J->cfg->temperature);
        return 1;
    }
    *tvals = (const float *)(J->tv.base + R->r * J->tv.row_stride);
    *tidx = (const int32_t *)(J->ti.base + R->r * J->ti.row_stride);
    for (int j = 0; j < K; j++)
        if ((*tidx)[j] < 0 || (*tidx)[j] >= J->V) return 0;
    if (ghost) *tlse = vec_get(&J->lse, R->r);
    return 1;
}

/* NB_TOPK_RENORM buckets: student and teacher both softmaxed over the k tokens alone. */
static int buckets_renorm(row_ctx *R, int K, const float *tvals, const int32_t *tidx, double tlse) {
    (void)tlse;
    double mp = -INFINITY, mq = -INFINITY;
    for (int j = 0; j < K; j++) {
        R->blp[j] = R->x[tidx[j]] * R->invT; if (R->blp[j] > mp) mp = R->blp[j];
        R->blq[j] = (double)tvals[j] * R->invT; if (R->blq[j] > mq) mq = R->blq[j];
    }
    double sp = 0.0, sq = 0.0;
    for (int j = 0; j < K; j++) { sp += exp(R->blp[j] - mp); sq += exp(R->blq[j] - mq); }
    double lp = mp + log(sp), lq = mq + log(sq);
    for (int j = 0; j < K; j++) { R->blp[j] -= lp; R->blq[j] -= lq; }
    return K;
}

/* The student's full-vocabulary log-probs on the k tokens, the teacher's raw values / T (max returned). */
static double buckets_student_full_logp(row_ctx *R, int K, const float *tvals, const int32_t *tidx) {
    double mq = -INFINITY;
    for (int j = 0; j < K; j++) {
        R->blp[j] = R->x[tidx[j]] * R->invT - R->lsez;
        R->blq[j] = (double)tvals[j] * R->invT; if (R->blq[j] > mq) mq = R->blq[j];
    }
    return mq;
}

/* NB_TOPK_STUDENT_FULL buckets: the teacher softmaxed over the k tokens. */
static int buckets_student_full(row_ctx *R, int K, const float *tvals, const int32_t *tidx, double tlse) {
    (void)tlse;
    const double mq = buckets_student_full_logp(R, K, tvals, tidx);
    double sq = 0.0;
    for (int j = 0; j < K; j++) sq += exp(R->blq[j] - mq);
    double lq = mq + log(sq);
    for (int j = 0; j < K; j++) R->blq[j] -= lq;
    return K;
}

/* NB_TOPK_GHOST buckets: the teacher's full-vocabulary log-probs too, and a residual bucket (filled by
 * ghost_bucket). */
static int buckets_ghost(row_ctx *R, int K, const float *tvals, const int32_t *tidx, double tlse) {
    (void)buckets_student_full_logp(R, K, tvals, tidx);
    for (int j = 0; j < K; j++) R->blq[j] -= tlse;
    return K + 1;
}

typedef int (*buckets_fn)(row_ctx *R, int K, const float *tvals, const int32_t *tidx, double tlse);
static const buckets_fn TOPK_BUCKETS[] = {
    [NB_TOPK_RENORM] = buckets_renorm,
    [NB_TOPK_STUDENT_FULL] = buckets_student_full,
    [NB_TOPK_GHOST] = buckets_ghost,
};

/* The ghost bucket: log(1 − Σ_S), with log Σ_S clamped at −FLT_EPSILON (ModelOpt, fp32 eps). Sets *lkp
 * to the student's log Σ_S; returns 1 when the student's was clamped. */
static int ghost_bucket(row_ctx *R, int K, double *lkp) {
    double mp = -INFINITY, mq = -INFINITY;
    for (int j = 0; j < K; j++) { if (R->blp[j] > mp) mp = R->blp[j]; if (R->blq[j] > mq) mq = R->blq[j]; }
    double sp = 0.0, sq = 0.0;
    for (int j = 0; j < K; j++) { sp += exp(R->blp[j] - mp); sq += exp(R->blq[j] - mq); }
    *lkp = mp + log(sp);
    double lkq = mq + log(sq);
    const double neg_eps = -(double)FLT_EPSILON;
    int clamped = 0;
    if (*lkp > neg_eps) { *lkp = neg_eps; clamped = 1; }
    if (lkq > neg_eps) lkq = neg_eps;
    R->blp[K] = log(-expm1(*lkp));
    R->blq[K] = log(-expm1(lkq));
    return clamped;
}

/* The chain rule from bucket log-probs to z (see nibble/distill.h for the three definitions). */
static void topk_chain(row_ctx *R, int K, int nb, const int32_t *tidx, int clamped_p, double lkp) {
    const int64_t V = R->J->V;
    double C = 0.0;
    for (int j = 0; j < K; j++) C += R->bc[j];
    if (R->J->cfg->topk_norm == NB_TOPK_RENORM) {
        memset(R->gz, 0, (size_t)V * sizeof(double));
        for (int j = 0; j < K; j++) R->gz[tidx[j]] += R->bc[j] - C * exp(R->blp[j]);
        return;
    }
    double base = -C, ginv = 0.0;   /* ghost: d log p_g / d log p_j = −p_j / (1 − K), zero when clamped */
    if (nb == K + 1 && !clamped_p) {
        ginv = R->bc[K] / -expm1(lkp);   /* c_g / (1 − K) */
        base += ginv * exp(lkp);         /* + c_g K / (1 − K) */
    }
    for (int64_t v = 0; v < V; v++) R->gz[v] = R->P[v] * base;
    for (int j = 0; j < K; j++) R->gz[tidx[j]] += R->bc[j] - ginv * exp(R->blp[j]);
}

/* The teacher's top k: buckets, then each bucket's value and dL/dlog p (forward or reverse KL), then z. */
static double kd_topk(row_ctx *R, int rev) {
    const int K = (int)R->J->k;
    const float *tvals;
    const int32_t *tidx;
    double tlse = NAN;
    if (!topk_teacher(R, &tvals, &tidx, &tlse)) {
        R->bad_index = 1;
        return 0.0;
    }
    const int nb = TOPK_BUCKETS[R->J->cfg->topk_norm](R, K, tvals, tidx, tlse);
    double lkp = 0.0;
    const int clamped_p = nb == K + 1 ? ghost_bucket(R, K, &lkp) : 0;
    double kd = 0.0;
    for (int b = 0; b < nb; b++) {
        if (!rev) {
            double q = exp(R->blq[b]);
            if (q > 0.0) kd += q * (R->blq[b] - R->blp[b]);
            R->bc[b] = -q;
        } else {
            double p = exp(R->blp[b]);
            double f = p > 0.0 ? R->blp[b] - R->blq[b] : 0.0;
            if (p > 0.0) kd += p * f;
            R->bc[b] = p * (f + 1.0);
        }
    }
    topk_chain(R, K, nb, tidx, clamped_p, lkp);
    return kd;
}

static double kd_topk_forward(row_ctx *R) { return kd_topk(R, 0); }
static double kd_topk_reverse(row_ctx *R) { return kd_topk(R, 1); }

/* The KD losses: kd_n (without the T² factor) and gz, by [top-k or full vocabulary][forward or reverse]. */
typedef double (*kd_fn)(row_ctx *R);
static const kd_fn KD_ROW[2][2] = {
    { kd_full_forward, kd_full_reverse },
    { kd_topk_forward, kd_topk_reverse },
};

/* d loss / d x for the row: the KD part through z = x / T and the LM part through P1. */
static void grad_row(row_ctx *R, float *grow, int64_t label, double w) {
    const nb_distill_cfg *cfg = R->J->cfg;
    const int64_t V = R->J->V;
    const double gk = cfg->kd != NB_KD_NONE ? w * R->J->gk / cfg->temperature : 0.0;   /* d kd_n / d x = T² · (1/T) · d/dz */
    const double gl = cfg->lm_loss ? w * R->J->gl : 0.0;
    for (int64_t v = 0; v < V; v++) {
        double g = 0.0;
        if (gk != 0.0) g += gk * R->gz[v];
        if (gl != 0.0) g += gl * (R->P1[v] - (v == label ? 1.0 : 0.0));
        grow[v] = (float)g;
    }
}

/* One row: kd_n (T² included when t2_scale) and ce_n into the job's outputs; the gradient if asked. */
static void do_row(job *J, int64_t r, double *scr, float *tkv, int32_t *tki) {
    const nb_distill_cfg *cfg = J->cfg;
    const int64_t V = J->V;
    const double w = J->w[r];
    float *grow = J->have_grad ? (float *)(J->g.base + r * J->g.row_stride) : NULL;
    J->kd_row[r] = 0.0;
    J->ce_row[r] = 0.0;
    J->bad[r] = 0;
    if (w == 0.0) {
        if (grow) memset(grow, 0, (size_t)V * sizeof(float));
        return;
    }
    row_ctx R = {J, r, 1.0 / cfg->temperature, NAN, scr, scr + V, scr + 2 * V, scr + 3 * V, scr + 4 * V,
                 scr + 5 * V, scr + 5 * V + (J->k + 1), scr + 5 * V + 2 * (J->k + 1), tkv, tki, 0};
    /* invT is exact for powers of two; otherwise within an ulp of x / T */
    const float *srow = (const float *)(J->s.base + r * J->s.row_stride);
    double xmax = -INFINITY;
    for (int64_t v = 0; v < V; v++) {   /* copied first: grad may alias the student row */
        R.x[v] = srow[v];
        if (R.x[v] > xmax) xmax = R.x[v];
    }
    if (cfg->kd != NB_KD_NONE) student_softmax(&R, xmax);
    int64_t label = J->have_lab ? vec_get_i64(&J->lab, r) : -1;
    const int lm_grad = cfg->lm_loss && grow;
    if (label >= 0 || lm_grad) J->ce_row[r] = ce_row(&R, label, xmax, lm_grad);
    double kd = 0.0;
    if (cfg->kd != NB_KD_NONE) {
        kd = KD_ROW[J->k > 0][cfg->kd == NB_KD_REVERSE](&R);
        if (R.bad_index) { J->bad[r] = 2; return; }
    }
    J->kd_row[r] = kd * (cfg->t2_scale ? cfg->temperature * cfg->temperature : 1.0);
    if (!isfinite(J->kd_row[r]) || !isfinite(J->ce_row[r])) { J->bad[r] = 1; return; }
    if (grow) grad_row(&R, grow, label, w);
}

static void run_rows(void *arg, int64_t begin, int64_t end) {
    job *J = arg;
    int slot = __atomic_fetch_add(&J->slot_next, 1, __ATOMIC_RELAXED);
    if (slot >= J->nslots) { __atomic_store_n(&J->slot_overflow, 1, __ATOMIC_RELAXED); return; }
    double *scr = J->scratch + slot * J->scratch_per_slot;
    float *tkv = J->tk_v + slot * (J->k + 1);
    int32_t *tki = J->tk_i + slot * (J->k + 1);
    for (int64_t r = begin; r < end; r++) {
        if (nb_ctx_interrupted(J->ctx)) { __atomic_store_n(&J->interrupted, 1, __ATOMIC_RELAXED); return; }
        do_row(J, r, scr, tkv, tki);
    }
}

nb_status nb_distill_chunk(nb_ctx *ctx, nb_distill_state *st, const nb_distill_batch *b, nb_tensor *grad) {
    const nb_distill_cfg *cfg = &st->cfg;
    nb_status s = check_cfg(ctx, cfg);
    if (s) return s;
    if (!(st->denom > 0.0)) return nb_fail(ctx, NB_ERR_INVALID, "distill: state has no denominator (call begin)");
    if (!b || !b->student) return nb_fail(ctx, NB_ERR_INVALID, "distill: the batch has no student logits");
    job J;
    memset(&J, 0, sizeof J);
    J.ctx = ctx;
    J.cfg = cfg;
    if ((s = get_rows(ctx, "student", b->student, NB_F32, &J.s))) return s;
    const int64_t n = J.s.rows, V = J.s.cols;
    if (V < 1) return nb_fail(ctx, NB_ERR_SHAPE, "distill: the vocabulary is empty");
    J.V = V;
    J.k = cfg->top_k;
    if (cfg->kd == NB_KD_NONE) J.k = 0;
    if (J.k > V)
        return nb_fail(ctx, NB_ERR_INVALID, "distill: top_k %d is larger than the vocabulary (%lld)", (int)cfg->top_k,
                       (long long)V);
    if (cfg->kd != NB_KD_NONE) {
        if (b->teacher) {
            if ((s = get_rows(ctx, "teacher", b->teacher, NB_F32, &J.t))) return s;
            if (J.t.rows != n || J.t.cols != V)
                return nb_fail(ctx, NB_ERR_SHAPE, "distill: teacher is [%lld, %lld], student is [%lld, %lld]",
                               (long long)J.t.rows, (long long)J.t.cols, (long long)n, (long long)V);
            J.have_t = 1;
        } else {
            if (cfg->top_k == 0 || !b->topk_vals || !b->topk_idx)
                return nb_fail(ctx, NB_ERR_INVALID,
                               "distill: no teacher: give teacher logits, or top_k > 0 with topk_vals and topk_idx");
            if ((s = get_rows(ctx, "topk_vals", b->topk_vals, NB_F32, &J.tv))) return s;
            if ((s = get_rows(ctx, "topk_idx", b->topk_idx, NB_I32, &J.ti))) return s;
            if (J.tv.rows != n || J.ti.rows != n || J.tv.cols != cfg->top_k || J.ti.cols != cfg->top_k)
                return nb_fail(ctx, NB_ERR_SHAPE, "distill: topk_vals/topk_idx must be [%lld, %d]", (long long)n,
                               (int)cfg->top_k);
            J.have_topk = 1;
            if (cfg->topk_norm == NB_TOPK_GHOST) {
                if (!b->topk_lse)
                    return nb_fail(ctx, NB_ERR_INVALID,
                                   "distill: topk_norm ghost needs topk_lse (the teacher's full-vocab logsumexp at T)");
                if ((s = get_vec(ctx, "topk_lse", b->topk_lse, n, LSE_DT, 2, &J.lse))) return s;
                J.have_lse = 1;
            }
        }
    }
    if (cfg->lm_loss && !b->labels) return nb_fail(ctx, NB_ERR_INVALID, "distill: lm_loss needs labels");
    if (b->labels) {
        if ((s = get_vec(ctx, "labels", b->labels, n, LABEL_DT, 2, &J.lab))) return s;
        J.have_lab = 1;
    }
    if (grad) {
        if ((s = get_rows(ctx, "grad", grad, NB_F32, &J.g))) return s;
        if (J.g.rows != n || J.g.cols != V)
            return nb_fail(ctx, NB_ERR_SHAPE, "distill: grad is [%lld, %lld], student is [%lld, %lld]",
                           (long long)J.g.rows, (long long)J.g.cols, (long long)n, (long long)V);
        if (!nb_buffer_writable(grad->buf)) return nb_fail(ctx, NB_ERR_INVALID, "distill: grad is read-only");
        J.have_grad = 1;
    }
    if (n == 0) return NB_OK;

    /* per-row arrays and per-slot scratch, all from one counted allocation */
    int nslots = nb_ctx_threads(ctx);
    if (nslots < 1) nslots = 1;
    J.nslots = nslots;
    J.scratch_per_slot = 5 * V + 3 * (J.k + 1);
    size_t bytes = (size_t)n * (3 * sizeof(double) + sizeof(int)) +
                   (size_t)nslots * (size_t)J.scratch_per_slot * sizeof(double) +
                   (size_t)nslots * (size_t)(J.k + 1) * (sizeof(float) + sizeof(int32_t));
    uint8_t *mem = nb_alloc(ctx, bytes);
    if (!mem) return NB_ERR_NOMEM;
    double *w = (double *)mem;
    J.kd_row = w + n;
    J.ce_row = w + 2 * n;
    J.scratch = w + 3 * n;
    J.tk_v = (float *)(J.scratch + (size_t)nslots * (size_t)J.scratch_per_slot);
    J.tk_i = (int32_t *)(J.tk_v + (size_t)nslots * (size_t)(J.k + 1));
    J.bad = (int *)(J.tk_i + (size_t)nslots * (size_t)(J.k + 1));
    J.w = w;

    s = row_weights(ctx, cfg, n, V, b->labels, b->weights, w);
    if (!s) {
        const double t2 = cfg->t2_scale ? cfg->temperature * cfg->temperature : 1.0;
        J.gl = st->lm_coef / st->denom;
        J.gk = st->kd_coef * t2 / st->denom;
        int64_t grain = V >= 16384 ? 1 : 16384 / V;
        nb_parallel_for(ctx, n, grain, run_rows, &J);
        if (J.interrupted) s = nb_fail(ctx, NB_ERR_INTERRUPTED, "distill: interrupted");
        else if (J.slot_overflow) s = nb_fail(ctx, NB_ERR_INTERNAL, "distill: more thread chunks than slots");
    }
    if (!s) {
        for (int64_t r = 0; r < n; r++) {
            if (J.bad[r] == 2) { s = nb_fail(ctx, NB_ERR_INVALID, "distill: topk_idx of row %lld is outside [0, %lld)", (long long)r, (long long)V); break; }
            if (J.bad[r] == 1) {
                s = nb_fail(ctx, NB_ERR_NUMERIC, "distill: non-finite loss at row %lld of this chunk (kd %g, ce %g)",
                            (long long)r, J.kd_row[r], J.ce_row[r]);
                break;
            }
        }
    }
    if (!s) {
        /* summed row by row into the running sums: the same bits for any thread count or chunking */
        for (int64_t r = 0; r < n; r++) {
            if (w[r] == 0.0) continue;
            st->kd_sum += w[r] * J.kd_row[r];
            st->lm_sum += w[r] * J.ce_row[r];
            st->weight_sum += w[r];
            st->tokens++;
        }
        st->rows += n;
    }
    nb_dealloc(ctx, mem, bytes);
    return s;
}

nb_status nb_distill_loss(nb_ctx *ctx, const nb_distill_cfg *cfg, const nb_distill_batch *b, nb_tensor *grad,
                          nb_distill_result *out) {
    if (!b || !b->student) return nb_fail(ctx, NB_ERR_INVALID, "distill: the batch has no student logits");
    rows_view rv = {0};
    nb_status s = get_rows(ctx, "student", b->student, NB_F32, &rv);
    if (s) return s;
    nb_distill_state st;
    if ((s = nb_distill_begin(ctx, cfg, rv.rows, b->labels, b->weights, &st))) return s;
    if ((s = nb_distill_chunk(ctx, &st, b, grad))) return s;
    return nb_distill_finish(ctx, &st, out);
}

/* ---- teacher top-k extraction ------------------------------------------------------------------- */

typedef struct topk_job {
    rows_view t, v, i;
    int k;
    double T;
    uint8_t *lse;
    int64_t lse_stride;
    nb_dtype lse_dt;
} topk_job;

static void run_topk(void *arg, int64_t begin, int64_t end) {
    topk_job *J = arg;
    for (int64_t r = begin; r < end; r++) {
        const float *x = (const float *)(J->t.base + r * J->t.row_stride);
        topk_row(x, J->t.cols, J->k, (float *)(J->v.base + r * J->v.row_stride),
                 (int32_t *)(J->i.base + r * J->i.row_stride));
        if (J->lse) {
            double l = lse_row(x, J->t.cols, J->T);
            if (J->lse_dt == NB_F64) memcpy(J->lse + r * J->lse_stride, &l, 8);
            else { float f = (float)l; memcpy(J->lse + r * J->lse_stride, &f, 4); }
        }
    }
}

nb_status nb_distill_topk(nb_ctx *ctx, const nb_tensor *teacher, int32_t k, double temperature, nb_tensor *vals,
                          nb_tensor *idx, nb_tensor *lse) {
    topk_job J;
    memset(&J, 0, sizeof J);
    nb_status s;
    if (!teacher || !vals || !idx) return nb_fail(ctx, NB_ERR_INVALID, "distill_topk: teacher, vals and idx are required");
    if ((s = get_rows(ctx, "teacher", teacher, NB_F32, &J.t))) return s;
    if (k < 1 || k > J.t.cols)
        return nb_fail(ctx, NB_ERR_INVALID, "distill_topk: k = %d must be in [1, %lld]", (int)k, (long long)J.t.cols);
    if (!(temperature > 0.0) || !isfinite(temperature))
        return nb_fail(ctx, NB_ERR_INVALID, "distill_topk: temperature must be finite and > 0, got %g", temperature);
    if ((s = get_rows(ctx, "vals", vals, NB_F32, &J.v))) return s;
    if ((s = get_rows(ctx, "idx", idx, NB_I32, &J.i))) return s;
    if (J.v.rows != J.t.rows || J.i.rows != J.t.rows || J.v.cols != k || J.i.cols != k)
        return nb_fail(ctx, NB_ERR_SHAPE, "distill_topk: vals and idx must be [%lld, %d]", (long long)J.t.rows, (int)k);
    if (!nb_buffer_writable(vals->buf) || !nb_buffer_writable(idx->buf))
        return nb_fail(ctx, NB_ERR_INVALID, "distill_topk: vals/idx are read-only");
    if (lse) {
        vec_view lv = {0};
        if ((s = get_vec(ctx, "lse", lse, J.t.rows, LSE_DT, 2, &lv))) return s;
        if (!nb_buffer_writable(lse->buf)) return nb_fail(ctx, NB_ERR_INVALID, "distill_topk: lse is read-only");
        J.lse = (uint8_t *)lv.base;
        J.lse_stride = lv.stride;
        J.lse_dt = lv.dtype;
    }
    J.k = k;
    J.T = temperature;
    int64_t grain = J.t.cols >= 16384 ? 1 : 16384 / J.t.cols;
    nb_parallel_for(ctx, J.t.rows, grain, run_topk, &J);
    return NB_OK;
}

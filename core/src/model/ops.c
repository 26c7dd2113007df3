/* Fast float32 CPU kernels of the model runtime (declared in nibble/ops.h): OpenBLAS sgemm for
 * every matrix product, the context's thread pool for the elementwise and row-wise work.
 * Each op has a double-precision scalar twin in ops_ref.c that tests/c/test_ops_*.c hold it to. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/ops.h"
#include "model/internal.h"

/* ---- BLAS plumbing ------------------------------------------------------------------------- */

/* OpenBLAS keeps one process-wide thread count. We set it to the context's count around the big
 * products and to 1 inside our own parallel regions (attention), so the two pools never run at
 * once on the same cores. The cache only avoids redundant calls. */
static int g_blas_threads = -1;

void nb_blas_threads(int n) {
    if (n < 1) n = 1;
    if (__atomic_load_n(&g_blas_threads, __ATOMIC_RELAXED) != n) {
        openblas_set_num_threads(n);
        __atomic_store_n(&g_blas_threads, n, __ATOMIC_RELAXED);
    }
}

void nb_gemm(nb_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (ctx) nb_blas_threads(nb_ctx_threads(ctx));
    if (K <= 0) {   /* OpenBLAS handles K == 0, but be explicit: C = beta*C */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* Single-threaded product for use inside nb_parallel_for bodies (the caller set BLAS to 1 thread). */
static void gemm1(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    nb_gemm(NULL, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- a vectorizable expf ------------------------------------------------------------------- */

/* Cephes-style expf: range reduction by n = round(x/ln2) with the 1.5*2^23 trick (no libm call, so
 * the loops that use it vectorize), degree-6 polynomial, scale by 2^n through the exponent bits.
 * Relative error about 2 ulp over the clamped range; inputs are clamped to [-87.3, 88.7]. */
static inline float fast_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return y * s;
}

float nb_fast_expf(float x) { return fast_expf(x); }

/* ---- embedding ----------------------------------------------------------------------------- */

typedef struct {
    const float *table;
    const int32_t *tokens;
    const float *dy;
    float *out;
    int64_t n, d;
} emb_job;

static void emb_fwd_range(void *arg, int64_t b, int64_t e) {
    emb_job *j = arg;
    for (int64_t i = b; i < e; i++)
        memcpy(j->out + i * j->d, j->table + (int64_t)j->tokens[i] * j->d, (size_t)j->d * sizeof(float));
}

nb_status nb_op_embedding_fwd(nb_ctx *ctx, const float *table, int64_t vocab, const int32_t *tokens, int64_t n,
                              int64_t d, float *out) {
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return nb_fail(ctx, NB_ERR_INVALID, "token id %d at position %lld is outside the vocabulary [0, %lld)",
                           (int)tokens[i], (long long)i, (long long)vocab);
    emb_job j = {table, tokens, NULL, out, n, d};
    nb_parallel_for(ctx, n, 64, emb_fwd_range, &j);
    return NB_OK;
}

/* Columns are split across threads so repeated tokens never race. */
static void emb_bwd_range(void *arg, int64_t c0, int64_t c1) {
    emb_job *j = arg;
    for (int64_t i = 0; i < j->n; i++) {
        float *dst = j->out + (int64_t)j->tokens[i] * j->d;
        const float *src = j->dy + i * j->d;
        for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
}

nb_status nb_op_embedding_bwd(nb_ctx *ctx, const int32_t *tokens, const float *dy, int64_t n, int64_t d,
                              float *dtable) {
    emb_job j = {NULL, tokens, dy, dtable, n, d};
    nb_parallel_for(ctx, d, n * d > 65536 ? 16 : d, emb_bwd_range, &j);
    return NB_OK;
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */

typedef struct {
    const float *x, *w, *rstd_in, *dy;
    float *y, *rstd, *dx, *dw;
    int64_t n, d;
    float eps;
} rms_job;

static void rms_fwd_range(void *arg, int64_t b, int64_t e) {
    rms_job *j = arg;
    int64_t d = j->d;
    for (int64_t i = b; i < e; i++) {
        const float *x = j->x + i * d;
        float *y = j->y + i * d;
        float ss = 0.0f;
        for (int64_t c = 0; c < d; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / (float)d + j->eps);
        if (j->rstd) j->rstd[i] = r;
        for (int64_t c = 0; c < d; c++) y[c] = x[c] * r * j->w[c];
    }
}

nb_status nb_op_rmsnorm_fwd(nb_ctx *ctx, const float *x, const float *w, float *y, float *rstd, int64_t n,
                            int64_t d, float eps) {
    rms_job j = {x, w, NULL, NULL, y, rstd, NULL, NULL, n, d, eps};
    nb_parallel_for(ctx, n, 1 + 8192 / (d + 1), rms_fwd_range, &j);
    return NB_OK;
}

/* y_c = w_c r x_c, r = (mean x^2 + eps)^-1/2  =>  dx_c = r (g_c - x_c r^2 mean_k(g_k x_k)), g = dy*w */
static void rms_bwd_rows(void *arg, int64_t b, int64_t e) {
    rms_job *j = arg;
    int64_t d = j->d;
    for (int64_t i = b; i < e; i++) {
        const float *x = j->x + i * d, *dy = j->dy + i * d;
        float *dx = j->dx + i * d;
        float r = j->rstd_in[i];
        float dot = 0.0f;
        for (int64_t c = 0; c < d; c++) dot += dy[c] * j->w[c] * x[c];
        float k = r * r * r * dot / (float)d;
        for (int64_t c = 0; c < d; c++) dx[c] += r * dy[c] * j->w[c] - k * x[c];
    }
}

static void rms_bwd_cols(void *arg, int64_t c0, int64_t c1) {
    rms_job *j = arg;
    int64_t d = j->d;
    for (int64_t i = 0; i < j->n; i++) {
        const float *x = j->x + i * d, *dy = j->dy + i * d;
        float r = j->rstd_in[i];
        for (int64_t c = c0; c < c1; c++) j->dw[c] += dy[c] * x[c] * r;
    }
}

nb_status nb_op_rmsnorm_bwd(nb_ctx *ctx, const float *x, const float *w, const float *rstd, const float *dy,
                            float *dx, float *dw, int64_t n, int64_t d) {
    rms_job j = {x, w, rstd, dy, NULL, NULL, dx, dw, n, d, 0.0f};
    if (dx) nb_parallel_for(ctx, n, 1 + 8192 / (d + 1), rms_bwd_rows, &j);
    if (dw) nb_parallel_for(ctx, d, n * d > 65536 ? 16 : d, rms_bwd_cols, &j);
    return NB_OK;
}

/* ---- RoPE ---------------------------------------------------------------------------------- */

typedef struct {
    float *x;
    int64_t T, nh, hd;
    const float *cos_t, *sin_t;
    float sign;
} rope_job;

static void rope_range(void *arg, int64_t b, int64_t e) {
    rope_job *j = arg;
    int64_t half = j->hd / 2;
    for (int64_t i = b; i < e; i++) {
        const float *c = j->cos_t + (i % j->T) * half, *s = j->sin_t + (i % j->T) * half;
        for (int64_t h = 0; h < j->nh; h++) {
            float *x = j->x + (i * j->nh + h) * j->hd;
            for (int64_t k = 0; k < half; k++) {
                float x1 = x[k], x2 = x[k + half], sn = j->sign * s[k];
                x[k] = x1 * c[k] - x2 * sn;
                x[k + half] = x2 * c[k] + x1 * sn;
            }
        }
    }
}

nb_status nb_op_rope_fwd(nb_ctx *ctx, float *x, int64_t n, int64_t T, int64_t nh, int64_t hd, const float *cos_t,
                         const float *sin_t) {
    if (hd % 2) return nb_fail(ctx, NB_ERR_SHAPE, "rope: head_dim %lld is odd", (long long)hd);
    rope_job j = {x, T, nh, hd, cos_t, sin_t, 1.0f};
    nb_parallel_for(ctx, n, 1 + 8192 / (nh * hd + 1), rope_range, &j);
    return NB_OK;
}

nb_status nb_op_rope_bwd(nb_ctx *ctx, float *dx, int64_t n, int64_t T, int64_t nh, int64_t hd, const float *cos_t,
                         const float *sin_t) {
    if (hd % 2) return nb_fail(ctx, NB_ERR_SHAPE, "rope: head_dim %lld is odd", (long long)hd);
    rope_job j = {dx, T, nh, hd, cos_t, sin_t, -1.0f};
    nb_parallel_for(ctx, n, 1 + 8192 / (nh * hd + 1), rope_range, &j);
    return NB_OK;
}

/* ---- attention ----------------------------------------------------------------------------- */

enum { ATT_BQ = 64 };   /* query rows per block: bounds the score scratch to ATT_BQ x Tk */

typedef struct {
    const nb_attn_dims *a;
    const float *q, *k, *v, *o, *lse_in, *dout;
    float *out, *lse, *dq, *dkh, *dvh;
    int64_t nqb;
    int failed;
} att_job;

/* Key range [jlo, jhi) that any query of rows [i0, i1) may see. */
static void att_key_range(const nb_attn_dims *a, int64_t i0, int64_t i1, int64_t *jlo, int64_t *jhi) {
    int64_t p0 = a->q_pos0 + i0, p1 = a->q_pos0 + i1 - 1;
    int64_t hi = p1 + 1 < a->Tk ? p1 + 1 : a->Tk;
    int64_t lo = a->window > 0 ? p0 - a->window + 1 : 0;
    if (lo < 0) lo = 0;
    *jlo = lo;
    *jhi = hi;
}

/* Valid keys [lo, hi) of the query at absolute position p. */
static inline void att_row_range(const nb_attn_dims *a, int64_t p, int64_t *lo, int64_t *hi) {
    int64_t h = p + 1 < a->Tk ? p + 1 : a->Tk;
    int64_t l = a->window > 0 ? p - a->window + 1 : 0;
    *lo = l < 0 ? 0 : l;
    *hi = h;
}

static void att_fwd_range(void *arg, int64_t u0, int64_t u1) {
    att_job *j = arg;
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, qs = a->H * hd, ks = a->KVH * hd, grp = a->H / a->KVH;
    float *S = malloc(sizeof(float) * ATT_BQ * (size_t)(a->Tk > 0 ? a->Tk : 1));
    if (!S) { j->failed = 1; return; }
    for (int64_t u = u0; u < u1; u++) {
        int64_t qb = u % j->nqb, bh = u / j->nqb, h = bh % a->H, b = bh / a->H;
        int64_t i0 = qb * ATT_BQ, i1 = i0 + ATT_BQ < a->Tq ? i0 + ATT_BQ : a->Tq, m = i1 - i0;
        int64_t jlo, jhi;
        att_key_range(a, i0, i1, &jlo, &jhi);
        int64_t nk = jhi - jlo;
        const float *Q = j->q + (b * a->Tq + i0) * qs + h * hd;
        const float *K = j->k + (b * a->kv_rows + jlo) * ks + (h / grp) * hd;
        const float *V = j->v + (b * a->kv_rows + jlo) * ks + (h / grp) * hd;
        float *O = j->out + (b * a->Tq + i0) * qs + h * hd;
        if (nk <= 0) {   /* no visible key (only possible with an empty cache): zeros */
            for (int64_t r = 0; r < m; r++) memset(O + r * qs, 0, sizeof(float) * (size_t)hd);
            if (j->lse)
                for (int64_t r = 0; r < m; r++) j->lse[(b * a->H + h) * a->Tq + i0 + r] = -INFINITY;
            continue;
        }
        gemm1(0, 1, m, nk, hd, a->scale, Q, qs, K, ks, 0.0f, S, nk);
        for (int64_t r = 0; r < m; r++) {
            float *s = S + r * nk;
            int64_t lo, hi;
            att_row_range(a, a->q_pos0 + i0 + r, &lo, &hi);
            lo -= jlo;
            hi -= jlo;
            float mx = -INFINITY;
            for (int64_t c = lo; c < hi; c++) mx = s[c] > mx ? s[c] : mx;
            for (int64_t c = lo; c < hi; c++) s[c] = fast_expf(s[c] - mx);   /* vectorizes */
            float sum = 0.0f;
            for (int64_t c = lo; c < hi; c++) sum += s[c];
            float inv = 1.0f / sum;
            for (int64_t c = 0; c < lo; c++) s[c] = 0.0f;
            for (int64_t c = lo; c < hi; c++) s[c] *= inv;
            for (int64_t c = hi; c < nk; c++) s[c] = 0.0f;
            if (j->lse) j->lse[(b * a->H + h) * a->Tq + i0 + r] = mx + logf(sum);
        }
        gemm1(0, 0, m, hd, nk, 1.0f, S, nk, V, ks, 0.0f, O, qs);
    }
    free(S);
}

static nb_status att_check(nb_ctx *ctx, const nb_attn_dims *a) {
    if (a->B < 0 || a->Tq < 0 || a->Tk < 0 || a->kv_rows < a->Tk || a->H <= 0 || a->KVH <= 0 || a->hd <= 0 ||
        a->H % a->KVH != 0 || a->q_pos0 < 0)
        return nb_fail(ctx, NB_ERR_SHAPE,
                       "attention: bad dims B=%lld Tq=%lld Tk=%lld kv_rows=%lld H=%lld KVH=%lld hd=%lld q_pos0=%lld",
                       (long long)a->B, (long long)a->Tq, (long long)a->Tk, (long long)a->kv_rows, (long long)a->H,
                       (long long)a->KVH, (long long)a->hd, (long long)a->q_pos0);
    return NB_OK;
}

nb_status nb_op_attention_fwd(nb_ctx *ctx, const nb_attn_dims *a, const float *q, const float *k, const float *v,
                              float *out, float *lse) {
    nb_status s = att_check(ctx, a);
    if (s) return s;
    att_job j = {0};
    j.a = a;
    j.q = q;
    j.k = k;
    j.v = v;
    j.out = out;
    j.lse = lse;
    j.nqb = (a->Tq + ATT_BQ - 1) / ATT_BQ;
    nb_blas_threads(1);
    nb_parallel_for(ctx, a->B * a->H * j.nqb, 1, att_fwd_range, &j);
    nb_blas_threads(nb_ctx_threads(ctx));
    if (j.failed) return nb_fail(ctx, NB_ERR_NOMEM, "attention: out of memory for the score scratch");
    return NB_OK;
}

/* One unit is one (batch, query head): it writes dq of that head and accumulates the head's own
 * dk/dv copies (dkh/dvh, [B, H, Tk, hd]) that are summed over each GQA group afterwards, so no two
 * threads ever add into the same memory. */
static void att_bwd_range(void *arg, int64_t u0, int64_t u1) {
    att_job *j = arg;
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, qs = a->H * hd, ks = a->KVH * hd, grp = a->H / a->KVH;
    size_t sz = (size_t)ATT_BQ * (size_t)(a->Tk > 0 ? a->Tk : 1);
    float *P = malloc(sizeof(float) * sz), *dP = malloc(sizeof(float) * sz);
    float *Dr = malloc(sizeof(float) * ATT_BQ);
    if (!P || !dP || !Dr) { j->failed = 1; free(P); free(dP); free(Dr); return; }
    for (int64_t u = u0; u < u1; u++) {
        int64_t h = u % a->H, b = u / a->H;
        float *dKh = j->dkh + (b * a->H + h) * a->Tk * hd, *dVh = j->dvh + (b * a->H + h) * a->Tk * hd;
        memset(dKh, 0, sizeof(float) * (size_t)(a->Tk * hd));
        memset(dVh, 0, sizeof(float) * (size_t)(a->Tk * hd));
        for (int64_t qb = 0; qb < j->nqb; qb++) {
            int64_t i0 = qb * ATT_BQ, i1 = i0 + ATT_BQ < a->Tq ? i0 + ATT_BQ : a->Tq, m = i1 - i0;
            int64_t jlo, jhi;
            att_key_range(a, i0, i1, &jlo, &jhi);
            int64_t nk = jhi - jlo;
            const float *Q = j->q + (b * a->Tq + i0) * qs + h * hd;
            const float *O = j->o + (b * a->Tq + i0) * qs + h * hd;
            const float *dO = j->dout + (b * a->Tq + i0) * qs + h * hd;
            float *dQ = j->dq + (b * a->Tq + i0) * qs + h * hd;
            if (nk <= 0) {
                for (int64_t r = 0; r < m; r++) memset(dQ + r * qs, 0, sizeof(float) * (size_t)hd);
                continue;
            }
            const float *K = j->k + (b * a->kv_rows + jlo) * ks + (h / grp) * hd;
            const float *V = j->v + (b * a->kv_rows + jlo) * ks + (h / grp) * hd;
            const float *lse = j->lse_in + (b * a->H + h) * a->Tq + i0;
            gemm1(0, 1, m, nk, hd, a->scale, Q, qs, K, ks, 0.0f, P, nk);
            gemm1(0, 1, m, nk, hd, 1.0f, dO, qs, V, ks, 0.0f, dP, nk);
            for (int64_t r = 0; r < m; r++) {
                float d = 0.0f;
                for (int64_t c = 0; c < hd; c++) d += dO[r * qs + c] * O[r * qs + c];
                Dr[r] = d;
            }
            for (int64_t r = 0; r < m; r++) {
                float *p = P + r * nk, *dp = dP + r * nk;
                int64_t lo, hi;
                att_row_range(a, a->q_pos0 + i0 + r, &lo, &hi);
                lo -= jlo;
                hi -= jlo;
                float l = lse[r];
                for (int64_t c = 0; c < lo; c++) { p[c] = 0.0f; dp[c] = 0.0f; }
                for (int64_t c = lo; c < hi; c++) {
                    float pv = fast_expf(p[c] - l);
                    p[c] = pv;
                    dp[c] = pv * (dp[c] - Dr[r]) * a->scale;   /* dS, with the scale of S folded in */
                }
                for (int64_t c = hi; c < nk; c++) { p[c] = 0.0f; dp[c] = 0.0f; }
            }
            gemm1(0, 0, m, hd, nk, 1.0f, dP, nk, K, ks, 0.0f, dQ, qs);
            gemm1(1, 0, nk, hd, m, 1.0f, dP, nk, Q, qs, 1.0f, dKh + jlo * hd, hd);
            gemm1(1, 0, nk, hd, m, 1.0f, P, nk, dO, qs, 1.0f, dVh + jlo * hd, hd);
        }
    }
    free(P);
    free(dP);
    free(Dr);
}

typedef struct {
    const nb_attn_dims *a;
    const float *dkh, *dvh;
    float *dk, *dv;
} att_red_job;

static void att_reduce_range(void *arg, int64_t r0, int64_t r1) {
    att_red_job *j = arg;
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, grp = a->H / a->KVH;
    for (int64_t r = r0; r < r1; r++) {   /* r = b * Tk + t */
        int64_t b = r / a->Tk, t = r % a->Tk;
        for (int64_t kh = 0; kh < a->KVH; kh++) {
            float *dk = j->dk + (r * a->KVH + kh) * hd, *dv = j->dv + (r * a->KVH + kh) * hd;
            memset(dk, 0, sizeof(float) * (size_t)hd);
            memset(dv, 0, sizeof(float) * (size_t)hd);
            for (int64_t g = 0; g < grp; g++) {
                int64_t h = kh * grp + g;
                const float *sk = j->dkh + ((b * a->H + h) * a->Tk + t) * hd;
                const float *sv = j->dvh + ((b * a->H + h) * a->Tk + t) * hd;
                for (int64_t c = 0; c < hd; c++) { dk[c] += sk[c]; dv[c] += sv[c]; }
            }
        }
    }
}

nb_status nb_op_attention_bwd(nb_ctx *ctx, const nb_attn_dims *a, const float *q, const float *k, const float *v,
                              const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv) {
    nb_status s = att_check(ctx, a);
    if (s) return s;
    size_t n = (size_t)(a->B * a->H * a->Tk * a->hd);
    float *dkh = malloc(sizeof(float) * (n ? n : 1)), *dvh = malloc(sizeof(float) * (n ? n : 1));
    if (!dkh || !dvh) {
        free(dkh);
        free(dvh);
        return nb_fail(ctx, NB_ERR_NOMEM, "attention backward: out of memory (%zu floats)", 2 * n);
    }
    att_job j = {0};
    j.a = a;
    j.q = q;
    j.k = k;
    j.v = v;
    j.o = out;
    j.lse_in = lse;
    j.dout = dout;
    j.dq = dq;
    j.dkh = dkh;
    j.dvh = dvh;
    j.nqb = (a->Tq + ATT_BQ - 1) / ATT_BQ;
    nb_blas_threads(1);
    nb_parallel_for(ctx, a->B * a->H, 1, att_bwd_range, &j);
    nb_blas_threads(nb_ctx_threads(ctx));
    if (!j.failed) {
        att_red_job r = {a, dkh, dvh, dk, dv};
        nb_parallel_for(ctx, a->B * a->Tk, 16, att_reduce_range, &r);
    }
    free(dkh);
    free(dvh);
    if (j.failed) return nb_fail(ctx, NB_ERR_NOMEM, "attention backward: out of memory for the score scratch");
    return NB_OK;
}

/* ---- SwiGLU -------------------------------------------------------------------------------- */

typedef struct {
    const float *g, *u, *da;
    float *a, *dg, *du;
} swi_job;

static void swi_fwd_range(void *arg, int64_t b, int64_t e) {
    swi_job *j = arg;
    for (int64_t i = b; i < e; i++) {
        float g = j->g[i];
        j->a[i] = g / (1.0f + fast_expf(-g)) * j->u[i];
    }
}

static void swi_bwd_range(void *arg, int64_t b, int64_t e) {
    swi_job *j = arg;
    for (int64_t i = b; i < e; i++) {
        float g = j->g[i], u = j->u[i], da = j->da[i];
        float sg = 1.0f / (1.0f + fast_expf(-g));
        float silu = g * sg;
        j->du[i] = da * silu;
        j->dg[i] = da * u * sg * (1.0f + g * (1.0f - sg));
    }
}

nb_status nb_op_swiglu_fwd(nb_ctx *ctx, const float *g, const float *u, float *a, int64_t n) {
    swi_job j = {g, u, NULL, a, NULL, NULL};
    nb_parallel_for(ctx, n, 16384, swi_fwd_range, &j);
    return NB_OK;
}

nb_status nb_op_swiglu_bwd(nb_ctx *ctx, const float *g, const float *u, const float *da, float *dg, float *du,
                           int64_t n) {
    swi_job j = {g, u, da, NULL, dg, du};
    nb_parallel_for(ctx, n, 16384, swi_bwd_range, &j);
    return NB_OK;
}

/* ---- linear -------------------------------------------------------------------------------- */

typedef struct {
    const float *b, *dy;
    float *y, *db;
    int64_t n, out;
} bias_job;

static void bias_add_range(void *arg, int64_t r0, int64_t r1) {
    bias_job *j = arg;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t c = 0; c < j->out; c++) j->y[i * j->out + c] += j->b[c];
}

static void bias_grad_range(void *arg, int64_t c0, int64_t c1) {
    bias_job *j = arg;
    for (int64_t i = 0; i < j->n; i++)
        for (int64_t c = c0; c < c1; c++) j->db[c] += j->dy[i * j->out + c];
}

void nb_bias_add(nb_ctx *ctx, float *y, const float *b, int64_t n, int64_t out) {
    bias_job j = {b, NULL, y, NULL, n, out};
    nb_parallel_for(ctx, n, 1 + 16384 / (out + 1), bias_add_range, &j);
}

nb_status nb_op_linear_fwd(nb_ctx *ctx, const float *x, const float *w, const float *b, float *y, int64_t n,
                           int64_t in, int64_t out) {
    nb_gemm(ctx, 0, 1, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    if (b) nb_bias_add(ctx, y, b, n, out);
    return NB_OK;
}

nb_status nb_op_linear_bwd(nb_ctx *ctx, const float *x, const float *w, const float *dy, float *dx, int dx_accumulate,
                           float *dw, float *db, int64_t n, int64_t in, int64_t out) {
    if (dx) nb_gemm(ctx, 0, 0, n, in, out, 1.0f, dy, out, w, in, dx_accumulate ? 1.0f : 0.0f, dx, in);
    if (dw) nb_gemm(ctx, 1, 0, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db) {
        bias_job j = {NULL, dy, NULL, db, n, out};
        nb_parallel_for(ctx, out, n * out > 65536 ? 16 : out, bias_grad_range, &j);
    }
    return NB_OK;
}

/* ---- cross-entropy ------------------------------------------------------------------------- */

typedef struct {
    const float *logits;
    const int32_t *targets;
    float *dlogits;
    double *row_loss;
    int64_t V;
    int32_t ignore;
    float scale;
} ce_job;

static void ce_range(void *arg, int64_t b, int64_t e) {
    ce_job *j = arg;
    int64_t V = j->V;
    for (int64_t i = b; i < e; i++) {
        const float *l = j->logits + i * V;
        int32_t t = j->targets[i];
        if (t == j->ignore) {
            j->row_loss[i] = NAN;   /* marks "not counted" */
            if (j->dlogits) memset(j->dlogits + i * V, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float mx = -INFINITY;
        for (int64_t c = 0; c < V; c++) mx = l[c] > mx ? l[c] : mx;
        float fs = 0.0f;
        for (int64_t c = 0; c < V; c++) fs += fast_expf(l[c] - mx);
        double lse = (double)mx + log((double)fs);
        j->row_loss[i] = lse - (double)l[t];
        if (j->dlogits) {
            float *d = j->dlogits + i * V;
            float k = j->scale / fs;
            for (int64_t c = 0; c < V; c++) d[c] = k * fast_expf(l[c] - mx);
            d[t] -= j->scale;
        }
    }
}

nb_status nb_op_cross_entropy(nb_ctx *ctx, const float *logits, const int32_t *targets, int64_t n, int64_t V,
                              int32_t ignore_index, float grad_scale, double *loss_sum, int64_t *count,
                              float *dlogits) {
    for (int64_t i = 0; i < n; i++)
        if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= V))
            return nb_fail(ctx, NB_ERR_INVALID, "cross_entropy: target %d of row %lld is outside [0, %lld)",
                           (int)targets[i], (long long)i, (long long)V);
    double *rl = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!rl) return nb_fail(ctx, NB_ERR_NOMEM, "cross_entropy: out of memory");
    ce_job j = {logits, targets, dlogits, rl, V, ignore_index, grad_scale};
    nb_parallel_for(ctx, n, 1 + 16384 / (V + 1), ce_range, &j);
    double s = 0.0;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(rl[i])) { s += rl[i]; c++; }
    free(rl);
    if (loss_sum) *loss_sum += s;
    if (count) *count += c;
    return NB_OK;
}

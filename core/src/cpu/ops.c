/* Fast float32 CPU kernels of the model runtime (declared in nibble/ops.h): OpenBLAS sgemm for
 * every matrix product, the context's thread pool for the elementwise and row-wise work.
 * Each op has a double-precision scalar twin in ops_ref.c that tests/c/test_ops_*.c hold it to. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/ops.h"
#include "model/internal.h"
#include "cpu/blas_internal.h"
#include "backend.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>   /* _mm_getcsr / _mm_setcsr: the attention backward's FTZ/DAZ */
#endif

/* ---- BLAS plumbing ------------------------------------------------------------------------- */

/* OpenBLAS keeps one process-wide thread count and its idle workers spin (sched_yield) for a
 * while after each threaded call. Next to our own pool that oversubscribes the cores: measured on
 * stories260K, a quarter of the CPU went to that spinning. So by default OpenBLAS runs with one
 * thread and nb_gemm splits a product into one slice per context thread on our pool (the slices
 * are big enough that sgemm runs at full speed in each). A context created with gemm "openblas"
 * (nb_ctx_options.gemm, or NIBBLE_GEMM=openblas) uses OpenBLAS's own threads (set to its count) for
 * comparison. The OpenBLAS thread count itself is process-wide, like the library (nibble/blas.h). */
static int g_blas_threads = -1;

void nb_blas_threads(int n) {
    if (n < 1) n = 1;
    if (__atomic_load_n(&g_blas_threads, __ATOMIC_RELAXED) != n) {
        nb_blas_set_threads(n);
        __atomic_store_n(&g_blas_threads, n, __ATOMIC_RELAXED);
    }
}

static void sgemm1(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* C = beta C, spelled out (BLAS leaves K == 0 to the implementation's care) */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    nb_blas_sgemm(ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

typedef struct {
    int ta, tb, split_n;
    int64_t M, N, K, lda, ldb, ldc, step;
    float alpha, beta;
    const float *A, *B;
    float *C;
} gemm_job;

static void gemm_range(void *arg, int64_t s0, int64_t s1) {
    gemm_job *j = arg;
    for (int64_t sl = s0; sl < s1; sl++) {
        if (j->split_n) {   /* columns [c0, c1) of C: rows of B^T or columns of B */
            int64_t c0 = sl * j->step, c1 = c0 + j->step < j->N ? c0 + j->step : j->N;
            if (c0 >= c1) continue;
            const float *B = j->tb ? j->B + c0 * j->ldb : j->B + c0;
            sgemm1(j->ta, j->tb, j->M, c1 - c0, j->K, j->alpha, j->A, j->lda, B, j->ldb, j->beta, j->C + c0, j->ldc);
        } else {            /* rows [r0, r1) of C: rows of A or columns of A^T */
            int64_t r0 = sl * j->step, r1 = r0 + j->step < j->M ? r0 + j->step : j->M;
            if (r0 >= r1) continue;
            const float *A = j->ta ? j->A + r0 : j->A + r0 * j->lda;
            sgemm1(j->ta, j->tb, r1 - r0, j->N, j->K, j->alpha, A, j->lda, j->B, j->ldb, j->beta, j->C + r0 * j->ldc,
                   j->ldc);
        }
    }
}

void nb_gemm(nb_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    int nt = ctx ? nb_ctx_threads(ctx) : 1;
    if (ctx && nb_backend_of(ctx)->gemm_openblas) {
        nb_blas_threads(nt);
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    nb_blas_threads(1);
    double flops = 2.0 * (double)M * (double)N * (double)(K > 0 ? K : 1);
    if (nt <= 1 || flops < 4e6) {
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* split the larger side into nt slices, multiples of 16 (whole SIMD tiles) */
    gemm_job j = {ta, tb, N >= M, M, N, K, lda, ldb, ldc, 0, alpha, beta, A, B, C};
    int64_t side = j.split_n ? N : M;
    j.step = ((side + nt - 1) / nt + 15) & ~(int64_t)15;
    int64_t slices = (side + j.step - 1) / j.step;
    nb_parallel_for(ctx, slices, 1, gemm_range, &j);
}

/* Single-threaded product for use inside nb_parallel_for bodies. */
static void gemm1(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

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
    const nb_simd_table *S;    /* the context's row kernels */
} rms_job;

static void rms_fwd_range(void *arg, int64_t b, int64_t e) {
    rms_job *j = arg;
    int64_t d = j->d;
    for (int64_t i = b; i < e; i++) {
        const float *x = j->x + i * d;
        float *y = j->y + i * d;
        float r = 1.0f / sqrtf(j->S->dot(x, x, d) / (float)d + j->eps);
        if (j->rstd) j->rstd[i] = r;
        for (int64_t c = 0; c < d; c++) y[c] = x[c] * r * j->w[c];
    }
}

nb_status nb_op_rmsnorm_fwd(nb_ctx *ctx, const float *x, const float *w, float *y, float *rstd, int64_t n,
                            int64_t d, float eps) {
    rms_job j = {x, w, NULL, NULL, y, rstd, NULL, NULL, n, d, eps, nb_ctx_simd(ctx)};
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
        float k = r * r * r * j->S->dot3(dy, j->w, x, d) / (float)d;
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
    rms_job j = {x, w, rstd, dy, NULL, NULL, dx, dw, n, d, 0.0f, nb_ctx_simd(ctx)};
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

enum { ATT_BQ = 64 };        /* query rows per block: bounds the score scratch to ATT_BQ x Tk */
enum { ATT_SMALL_HD = 16 };  /* head dims up to this use register-blocked row kernels instead of sgemm,
                                whose small-matrix paths are slow when K or N is this small
                                (stories260K has head_dim 8) */

/* Work is split into `nt` slices, one per thread, each with its own scratch area allocated once per
 * call. The backward's slices take units t, t+nt, ... (its units are whole heads, all the same
 * size). The forward's units are query blocks of unequal size (the causal triangle), and an
 * interleaved split gave one of 2 threads every odd block, 20 against 16 blocks of work; so its
 * slices take units from a shared counter, largest blocks first. Each unit writes only its own
 * outputs, so the result does not depend on which thread ran it. */
typedef struct {
    const nb_attn_dims *a;
    const float *q, *k, *v, *o, *lse_in, *dout;
    float *out, *lse, *dq, *dk, *dv, *dkh, *dvh;
    float *kt;                  /* forward, small head dims: K transposed, [B][KVH][hd][Tk] */
    int64_t nqb, nunits, nt;
    int64_t next;               /* forward: the next unit to take (atomic) */
    float *scratch;
    size_t scratch_per;
    const nb_simd_table *S;    /* the context's row kernels */
} att_job;

static size_t al16z(size_t n) { return (n + 15) & ~(size_t)15; }

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

enum { ATT_SLAB = 16 };   /* query rows per row-kernel call: each call stops at the last key its rows see */

/* Keys [0, n) of the block that rows [r0, r0 + ATT_SLAB) of the query block at i0 may see (the
 * causal triangle of the diagonal block is skipped; the probabilities there are zero). */
static inline int64_t att_slab_keys(const nb_attn_dims *a, int64_t i0, int64_t r0, int64_t m, int64_t jlo, int64_t nk) {
    int64_t r1 = r0 + ATT_SLAB < m ? r0 + ATT_SLAB : m, lo, hi;
    att_row_range(a, a->q_pos0 + i0 + r1 - 1, &lo, &hi);
    hi -= jlo;
    return hi < nk ? hi : nk;
}

/* Kt[b][kh][d][t] = K[b][t][kh][d] for t < Tk, one (b, kh) per index: done once per call rather
 * than once per query block (it was a quarter of the forward at head_dim 8) */
static void att_transpose_range(void *arg, int64_t u0, int64_t u1) {
    att_job *j = arg;
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, ks = a->KVH * hd, Tk = a->Tk;
    for (int64_t u = u0; u < u1; u++) {
        int64_t kh = u % a->KVH, b = u / a->KVH;
        const float *K = j->k + b * a->kv_rows * ks + kh * hd;
        float *Kt = j->kt + u * hd * Tk;
        for (int64_t c = 0; c < Tk; c++)
            for (int64_t d = 0; d < hd; d++) Kt[d * Tk + c] = K[c * ks + d];
    }
}

static void att_fwd_unit(att_job *j, int64_t u, float *S) {
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, qs = a->H * hd, ks = a->KVH * hd, grp = a->H / a->KVH;
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
        return;
    }
    if (hd <= ATT_SMALL_HD) {
        /* register-blocked row kernels (K transposed once per call by att_transpose_range); the
         * 1/sum of each row is applied to its hd outputs instead of its nk probabilities */
        const float *Kt = j->kt + (b * a->KVH + h / grp) * hd * a->Tk + jlo;
        float *inv = S + al16z((size_t)m * nk);
        for (int64_t r0 = 0; r0 < m; r0 += ATT_SLAB) {
            int64_t ms = m - r0 < ATT_SLAB ? m - r0 : ATT_SLAB;
            j->S->rows_qk(Q + r0 * qs, qs, ms, Kt, a->Tk, att_slab_keys(a, i0, r0, m, jlo, nk), hd, a->scale,
                            S + r0 * nk, nk);
        }
        for (int64_t r = 0; r < m; r++) {
            float *s = S + r * nk;
            int64_t lo, hi;
            att_row_range(a, a->q_pos0 + i0 + r, &lo, &hi);
            lo -= jlo;
            hi -= jlo;
            float mx = j->S->max(s + lo, hi - lo);
            float sum = j->S->exp_sub_sum(s + lo, hi - lo, mx);
            for (int64_t c = 0; c < lo; c++) s[c] = 0.0f;
            for (int64_t c = hi; c < nk; c++) s[c] = 0.0f;
            inv[r] = 1.0f / sum;
            if (j->lse) j->lse[(b * a->H + h) * a->Tq + i0 + r] = mx + logf(sum);
        }
        for (int64_t r0 = 0; r0 < m; r0 += ATT_SLAB) {
            int64_t ms = m - r0 < ATT_SLAB ? m - r0 : ATT_SLAB;
            j->S->rows_pvr(S + r0 * nk, nk, ms, att_slab_keys(a, i0, r0, m, jlo, nk), V, ks, hd, O + r0 * qs, qs);
        }
        for (int64_t r = 0; r < m; r++)
            for (int64_t d = 0; d < hd; d++) O[r * qs + d] *= inv[r];
        return;
    }
    gemm1(0, 1, m, nk, hd, a->scale, Q, qs, K, ks, 0.0f, S, nk);
    for (int64_t r = 0; r < m; r++) {
        float *s = S + r * nk;
        int64_t lo, hi;
        att_row_range(a, a->q_pos0 + i0 + r, &lo, &hi);
        lo -= jlo;
        hi -= jlo;
        float mx = j->S->max(s + lo, hi - lo);
        float sum = j->S->exp_sub_sum(s + lo, hi - lo, mx);
        float inv = 1.0f / sum;
        for (int64_t c = 0; c < lo; c++) s[c] = 0.0f;
        for (int64_t c = lo; c < hi; c++) s[c] *= inv;
        for (int64_t c = hi; c < nk; c++) s[c] = 0.0f;
        if (j->lse) j->lse[(b * a->H + h) * a->Tq + i0 + r] = mx + logf(sum);
    }
    gemm1(0, 0, m, hd, nk, 1.0f, S, nk, V, ks, 0.0f, O, qs);
}

static void att_fwd_range(void *arg, int64_t t0, int64_t t1) {
    att_job *j = arg;
    for (int64_t t = t0; t < t1; t++)
        for (;;) {
            int64_t k = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
            if (k >= j->nunits) break;
            int64_t nbh = j->nunits / j->nqb, qb = j->nqb - 1 - k / nbh;
            att_fwd_unit(j, (k % nbh) * j->nqb + qb, j->scratch + (size_t)t * j->scratch_per);
        }
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
    att_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.q = q;
    j.k = k;
    j.v = v;
    j.out = out;
    j.lse = lse;
    j.nqb = (a->Tq + ATT_BQ - 1) / ATT_BQ;
    j.nunits = a->B * a->H * j.nqb;
    j.nt = nb_ctx_threads(ctx) < j.nunits ? nb_ctx_threads(ctx) : j.nunits;
    if (j.nt < 1) return NB_OK;
    size_t tk = (size_t)(a->Tk > 0 ? a->Tk : 1);
    int small = a->hd <= ATT_SMALL_HD;
    j.scratch_per = al16z((size_t)ATT_BQ * tk) + (small ? ATT_BQ : 0);
    j.scratch = malloc(sizeof(float) * j.scratch_per * (size_t)j.nt);
    if (small) j.kt = malloc(sizeof(float) * (size_t)(a->B * a->KVH * a->hd) * tk);
    if (!j.scratch || (small && !j.kt)) {
        free(j.scratch);
        free(j.kt);
        return nb_fail(ctx, NB_ERR_NOMEM, "attention: out of memory for the score scratch");
    }
    nb_blas_threads(1);
    j.S = nb_ctx_simd(ctx);
    if (small) nb_parallel_for(ctx, a->B * a->KVH, 1, att_transpose_range, &j);
    nb_parallel_for(ctx, j.nt, 1, att_fwd_range, &j);
    free(j.scratch);
    free(j.kt);
    return NB_OK;
}

/* Query block qb of head h (batch b) in the backward: its rows [i0, i0 + m), the keys [jlo, jlo + nk)
 * any of them sees, and its Q, O, dO, dQ rows and lse. 0 when the block sees no key (its dQ rows are
 * then zeroed and there is nothing else to do). */
typedef struct {
    int64_t i0, m, jlo, nk;
    const float *Q, *O, *dO, *lse;
    float *dQ;
} att_blk;

static int att_bwd_block(const att_job *j, int64_t b, int64_t h, int64_t qb, att_blk *k) {
    const nb_attn_dims *a = j->a;
    int64_t qs = a->H * a->hd, jhi;
    k->i0 = qb * ATT_BQ;
    k->m = (k->i0 + ATT_BQ < a->Tq ? k->i0 + ATT_BQ : a->Tq) - k->i0;
    att_key_range(a, k->i0, k->i0 + k->m, &k->jlo, &jhi);
    k->nk = jhi - k->jlo;
    int64_t off = (b * a->Tq + k->i0) * qs + h * a->hd;
    k->Q = j->q + off;
    k->O = j->o + off;
    k->dO = j->dout + off;
    k->dQ = j->dq + off;
    k->lse = j->lse_in + (b * a->H + h) * a->Tq + k->i0;
    if (k->nk > 0) return 1;
    for (int64_t r = 0; r < k->m; r++) memset(k->dQ + r * qs, 0, sizeof(float) * (size_t)a->hd);
    return 0;
}

/* The backward for small head dims with the row kernels, one unit per (batch, kv head): K and V
 * are transposed once ([hd][Tk], Kt/Vt), every query head of the GQA group and every query block
 * is run against them, and dK/dV accumulate transposed in the unit's own scratch (dKt/dVt), written
 * out once at the end. So no two threads touch the same dk/dv rows and no reduction is needed.
 * Per block: P and dS over the visible keys (zero elsewhere), dQ = dS K, dK += dS^T Q, dV += P^T dO.
 * Scratch: 2 ATT_BQ*Tk + 4 hd*Tk floats. */
static void att_bwd_small_unit(att_job *j, int64_t u, float *scratch) {
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, qs = a->H * hd, ks = a->KVH * hd, grp = a->H / a->KVH, Tk = a->Tk;
    int64_t kh = u % a->KVH, b = u / a->KVH;
    size_t sz = al16z((size_t)ATT_BQ * (size_t)(Tk > 0 ? Tk : 1)), tz = al16z((size_t)(hd * (Tk > 0 ? Tk : 1)));
    float *P = scratch, *dS = P + sz, *Kt = dS + sz, *Vt = Kt + tz, *dKt = Vt + tz, *dVt = dKt + tz;
    const float *K = j->k + b * a->kv_rows * ks + kh * hd, *V = j->v + b * a->kv_rows * ks + kh * hd;
    for (int64_t c = 0; c < Tk; c++)
        for (int64_t d = 0; d < hd; d++) {
            Kt[d * Tk + c] = K[c * ks + d];
            Vt[d * Tk + c] = V[c * ks + d];
        }
    memset(dKt, 0, sizeof(float) * (size_t)(hd * Tk));
    memset(dVt, 0, sizeof(float) * (size_t)(hd * Tk));
    for (int64_t h = kh * grp; h < (kh + 1) * grp; h++)
        for (int64_t qb = 0; qb < j->nqb; qb++) {
            att_blk k;
            if (!att_bwd_block(j, b, h, qb, &k)) continue;
            int64_t i0 = k.i0, m = k.m, jlo = k.jlo, nk = k.nk;
            const float *Q = k.Q, *O = k.O, *dO = k.dO, *lse = k.lse;
            float *dQ = k.dQ;
            for (int64_t r0 = 0; r0 < m; r0 += ATT_SLAB) {
                int64_t ms = m - r0 < ATT_SLAB ? m - r0 : ATT_SLAB, n = att_slab_keys(a, i0, r0, m, jlo, nk);
                j->S->rows_qk(Q + r0 * qs, qs, ms, Kt + jlo, Tk, n, hd, a->scale, P + r0 * nk, nk);
                j->S->rows_qk(dO + r0 * qs, qs, ms, Vt + jlo, Tk, n, hd, 1.0f, dS + r0 * nk, nk);
            }
            for (int64_t r = 0; r < m; r++) {
                int64_t lo, hi;
                att_row_range(a, a->q_pos0 + i0 + r, &lo, &hi);
                lo -= jlo;
                hi -= jlo;
                float *p = P + r * nk, *ds = dS + r * nk;
                for (int64_t c = 0; c < lo; c++) p[c] = ds[c] = 0.0f;
                for (int64_t c = hi; c < nk; c++) p[c] = ds[c] = 0.0f;
                j->S->attn_dsoft(p + lo, ds + lo, hi - lo, lse[r], j->S->dot(dO + r * qs, O + r * qs, hd), a->scale);
            }
            /* dK, dV: the keys [nprev, n) that slab r0 is the first to see get rows [r0, m) */
            for (int64_t r0 = 0, nprev = 0; r0 < m; r0 += ATT_SLAB) {
                int64_t ms = m - r0 < ATT_SLAB ? m - r0 : ATT_SLAB, n = att_slab_keys(a, i0, r0, m, jlo, nk);
                j->S->rows_pv(dS + r0 * nk, nk, ms, n, Kt + jlo, Tk, hd, dQ + r0 * qs, qs);
                if (n > nprev) {
                    j->S->rows_tn(dS + r0 * nk + nprev, nk, m - r0, n - nprev, Q + r0 * qs, qs, hd,
                                    dKt + jlo + nprev, Tk);
                    j->S->rows_tn(P + r0 * nk + nprev, nk, m - r0, n - nprev, dO + r0 * qs, qs, hd,
                                    dVt + jlo + nprev, Tk);
                    nprev = n;
                }
            }
        }
    float *dk = j->dk + b * Tk * ks + kh * hd, *dv = j->dv + b * Tk * ks + kh * hd;
    for (int64_t c = 0; c < Tk; c++)
        for (int64_t d = 0; d < hd; d++) {
            dk[c * ks + d] = dKt[d * Tk + c];
            dv[c * ks + d] = dVt[d * Tk + c];
        }
}

/* One unit is one (batch, query head): it writes dq of that head and accumulates the head's own
 * dk/dv copies (dkh/dvh, [B, H, Tk, hd]) that are summed over each GQA group afterwards, so no two
 * threads ever add into the same memory. */
static void att_bwd_unit(att_job *j, int64_t u, float *P) {
    const nb_attn_dims *a = j->a;
    int64_t hd = a->hd, qs = a->H * hd, ks = a->KVH * hd, grp = a->H / a->KVH;
    size_t sz = al16z((size_t)ATT_BQ * (size_t)(a->Tk > 0 ? a->Tk : 1));
    float *dP = P + sz, *Dr = dP + sz;
    int64_t h = u % a->H, b = u / a->H;
    float *dKh = j->dkh + (b * a->H + h) * a->Tk * hd, *dVh = j->dvh + (b * a->H + h) * a->Tk * hd;
    memset(dKh, 0, sizeof(float) * (size_t)(a->Tk * hd));
    memset(dVh, 0, sizeof(float) * (size_t)(a->Tk * hd));
    for (int64_t qb = 0; qb < j->nqb; qb++) {
        att_blk k;
        if (!att_bwd_block(j, b, h, qb, &k)) continue;
        int64_t i0 = k.i0, m = k.m, jlo = k.jlo, nk = k.nk;
        const float *Q = k.Q, *O = k.O, *dO = k.dO, *lse = k.lse;
        float *dQ = k.dQ;
        const float *K = j->k + (b * a->kv_rows + jlo) * ks + (h / grp) * hd;
        const float *V = j->v + (b * a->kv_rows + jlo) * ks + (h / grp) * hd;
        gemm1(0, 1, m, nk, hd, a->scale, Q, qs, K, ks, 0.0f, P, nk);
        gemm1(0, 1, m, nk, hd, 1.0f, dO, qs, V, ks, 0.0f, dP, nk);
        for (int64_t r = 0; r < m; r++) Dr[r] = j->S->dot(dO + r * qs, O + r * qs, hd);
        for (int64_t r = 0; r < m; r++) {
            float *p = P + r * nk, *dp = dP + r * nk;
            int64_t lo, hi;
            att_row_range(a, a->q_pos0 + i0 + r, &lo, &hi);
            lo -= jlo;
            hi -= jlo;
            for (int64_t c = 0; c < lo; c++) { p[c] = 0.0f; dp[c] = 0.0f; }
            j->S->attn_dsoft(p + lo, dp + lo, hi - lo, lse[r], Dr[r], a->scale);   /* P and dS */
            for (int64_t c = hi; c < nk; c++) { p[c] = 0.0f; dp[c] = 0.0f; }
        }
        gemm1(0, 0, m, hd, nk, 1.0f, dP, nk, K, ks, 0.0f, dQ, qs);
        gemm1(1, 0, nk, hd, m, 1.0f, dP, nk, Q, qs, 1.0f, dKh + jlo * hd, hd);
        gemm1(1, 0, nk, hd, m, 1.0f, P, nk, dO, qs, 1.0f, dVh + jlo * hd, hd);
    }
}

/* The backward runs with denormals flushed (FTZ/DAZ on this thread, restored after). Its products
 * (P dO, dS Q, dS K) underflow all the time: a peaked softmax puts probabilities near exp(-87.3)
 * = 1.2e-38, and every product with such a p is subnormal, which costs an x86 core a microcode
 * assist of ~100 cycles per instruction. On stories260K that made the backward's dot-product and
 * dK/dV kernels 45 % of the QAD step. What is flushed is below 1.2e-38, far under any tolerance of
 * a float32 gradient. The forward is left as it is (its rounding is pinned by golden tests). */
#if defined(__x86_64__) || defined(__i386__)
static unsigned att_ftz_on(void) {
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u);   /* FTZ (bit 15) | DAZ (bit 6) */
    return old;
}
static void att_ftz_off(unsigned old) { _mm_setcsr(old); }
#else
static unsigned att_ftz_on(void) { return 0; }
static void att_ftz_off(unsigned old) { (void)old; }
#endif

static void att_bwd_range(void *arg, int64_t t0, int64_t t1) {
    att_job *j = arg;
    unsigned csr = att_ftz_on();
    for (int64_t t = t0; t < t1; t++)
        for (int64_t u = t; u < j->nunits; u += j->nt) {
            if (j->a->hd <= ATT_SMALL_HD) att_bwd_small_unit(j, u, j->scratch + (size_t)t * j->scratch_per);
            else att_bwd_unit(j, u, j->scratch + (size_t)t * j->scratch_per);
        }
    att_ftz_off(csr);
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
    att_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.q = q;
    j.k = k;
    j.v = v;
    j.o = out;
    j.lse_in = lse;
    j.dout = dout;
    j.dq = dq;
    j.dk = dk;
    j.dv = dv;
    j.nqb = (a->Tq + ATT_BQ - 1) / ATT_BQ;
    int small = a->hd <= ATT_SMALL_HD;
    j.nunits = small ? a->B * a->KVH : a->B * a->H;
    j.nt = nb_ctx_threads(ctx) < j.nunits ? nb_ctx_threads(ctx) : j.nunits;
    if (j.nt < 1) return NB_OK;
    size_t sz = al16z((size_t)ATT_BQ * (size_t)(a->Tk > 0 ? a->Tk : 1));
    j.scratch_per = 2 * sz + (small ? 4 * al16z((size_t)(a->hd * (a->Tk > 0 ? a->Tk : 1))) : ATT_BQ);
    size_t n = small ? 1 : (size_t)(a->B * a->H * a->Tk * a->hd);
    j.scratch = malloc(sizeof(float) * j.scratch_per * (size_t)j.nt);
    if (!small) {
        j.dkh = malloc(sizeof(float) * (n ? n : 1));
        j.dvh = malloc(sizeof(float) * (n ? n : 1));
    }
    if (!j.scratch || (!small && (!j.dkh || !j.dvh))) {
        free(j.scratch);
        free(j.dkh);
        free(j.dvh);
        return nb_fail(ctx, NB_ERR_NOMEM, "attention backward: out of memory");
    }
    nb_blas_threads(1);
    j.S = nb_ctx_simd(ctx);
    nb_parallel_for(ctx, j.nt, 1, att_bwd_range, &j);
    if (!small) {
        att_red_job r = {a, j.dkh, j.dvh, dk, dv};
        nb_parallel_for(ctx, a->B * a->Tk, 16, att_reduce_range, &r);
    }
    free(j.scratch);
    free(j.dkh);
    free(j.dvh);
    return NB_OK;
}

/* ---- SwiGLU -------------------------------------------------------------------------------- */

typedef struct {
    const float *g, *u, *da;
    float *a, *dg, *du;
    const nb_simd_table *S;    /* the context's row kernels */
} swi_job;

static void swi_fwd_range(void *arg, int64_t b, int64_t e) {
    swi_job *j = arg;
    j->S->swiglu(j->g + b, j->u + b, j->a + b, e - b);
}

static void swi_bwd_range(void *arg, int64_t b, int64_t e) {
    swi_job *j = arg;
    j->S->swiglu_bwd(j->g + b, j->u + b, j->da + b, j->dg + b, j->du + b, e - b);
}

nb_status nb_op_swiglu_fwd(nb_ctx *ctx, const float *g, const float *u, float *a, int64_t n) {
    swi_job j = {g, u, NULL, a, NULL, NULL, nb_ctx_simd(ctx)};
    nb_parallel_for(ctx, n, 16384, swi_fwd_range, &j);
    return NB_OK;
}

nb_status nb_op_swiglu_bwd(nb_ctx *ctx, const float *g, const float *u, const float *da, float *dg, float *du,
                           int64_t n) {
    swi_job j = {g, u, da, NULL, dg, du, nb_ctx_simd(ctx)};
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
    const nb_simd_table *S;    /* the context's row kernels */
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
        float mx = j->S->max(l, V);
        float fs = j->S->exp_sum(l, V, mx);
        double lse = (double)mx + log((double)fs);
        j->row_loss[i] = lse - (double)l[t];
        if (j->dlogits) {
            float *d = j->dlogits + i * V;
            j->S->exp_scale(l, d, V, mx, j->scale / fs);
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
    ce_job j = {logits, targets, dlogits, rl, V, ignore_index, grad_scale, nb_ctx_simd(ctx)};
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

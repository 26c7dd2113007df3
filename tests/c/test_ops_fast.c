/* The fast float32 kernels (nb_op_*) against the float64 scalar references (nb_ref_*), forward
 * and backward, on shapes that cross the kernels' blocking (attention query blocks of 64 rows,
 * grouped-query heads, sliding windows, decoding against a cache), with 1 and 2 threads, and with
 * the portable, AVX2 and AVX-512 row kernels (those the CPU has). */
#include <stdlib.h>

#include "nbtest.h"
#include "model/internal.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

static nb_rng rng;
static float *frand(int64_t n, double scale) {
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = (float)(scale * (2.0 * nb_rng_uniform(&rng) - 1.0));
    return v;
}
static double *tod(const float *f, int64_t n) {
    double *d = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}
static float *fz(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static double *dz(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(double)); }

/* max |a - b| / max(1, max |b|) */
static double rel_err(const float *a, const double *b, int64_t n) {
    double e = 0, s = 1.0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > e) e = fabs(a[i] - b[i]);
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    return e / s;
}
#define CHECK_CLOSE(a, b, n, tol) do { double _e = rel_err((a), (b), (n)); \
    CHECK_MSG(_e <= (tol), "%s vs %s: relative error %.3g > %g", #a, #b, _e, (double)(tol)); } while (0)

static void test_rmsnorm(nb_ctx *ctx, int64_t n, int64_t d) {
    float *x = frand(n * d, 2), *w = frand(d, 1), *dy = frand(n * d, 1), *y = fz(n * d), *r = fz(n);
    float *dx = frand(n * d, 1), *dw = frand(d, 1);
    double *xd = tod(x, n * d), *wd = tod(w, d), *dyd = tod(dy, n * d), *yd = dz(n * d);
    double *dxd = tod(dx, n * d), *dwd = tod(dw, d);   /* both accumulate onto the same start */
    CHECK_OK(ctx, nb_op_rmsnorm_fwd(ctx, x, w, y, r, n, d, 1e-5f));
    nb_ref_rmsnorm_fwd(xd, wd, yd, n, d, 1e-5);
    CHECK_CLOSE(y, yd, n * d, 2e-6);
    CHECK_OK(ctx, nb_op_rmsnorm_bwd(ctx, x, w, r, dy, dx, dw, n, d));
    nb_ref_rmsnorm_bwd(xd, wd, dyd, dxd, dwd, n, d, 1e-5);
    CHECK_CLOSE(dx, dxd, n * d, 1e-5);
    CHECK_CLOSE(dw, dwd, d, 1e-5);
    free(x); free(w); free(dy); free(y); free(r); free(dx); free(dw);
    free(xd); free(wd); free(dyd); free(yd); free(dxd); free(dwd);
}

static void test_rope(nb_ctx *ctx, int64_t n, int64_t T, int64_t pos0, int64_t nh, int64_t hd) {
    int64_t half = hd / 2, m = n * nh * hd;
    double *inv = malloc(sizeof(double) * (size_t)half);
    for (int64_t i = 0; i < half; i++) inv[i] = pow(10000.0, -2.0 * (double)i / (double)hd);
    float *ct = fz(T * half), *st = fz(T * half);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            ct[t * half + i] = (float)cos((double)(pos0 + t) * inv[i]);
            st[t * half + i] = (float)sin((double)(pos0 + t) * inv[i]);
        }
    float *x = frand(m, 1);
    double *xd = tod(x, m);
    CHECK_OK(ctx, nb_op_rope_fwd(ctx, x, n, T, nh, hd, ct, st));
    nb_ref_rope_fwd(xd, n, T, pos0, nh, hd, inv);
    CHECK_CLOSE(x, xd, m, 1e-6);
    CHECK_OK(ctx, nb_op_rope_bwd(ctx, x, n, T, nh, hd, ct, st));
    nb_ref_rope_bwd(xd, n, T, pos0, nh, hd, inv);
    CHECK_CLOSE(x, xd, m, 1e-6);
    CHECK_FAIL(ctx, nb_op_rope_fwd(ctx, x, n, T, nh, 3, ct, st), NB_ERR_SHAPE, "odd");
    free(inv); free(ct); free(st); free(x); free(xd);
}

static double q_amp = 2;   /* the amplitude of q: large values give the peaked softmax whose
                              probabilities underflow (the backward runs with FTZ/DAZ) */

/* The forward's float32 rounding bound, any summation order (u = 2^-24, first order in u), for
 * |q| <= q_amp, |k| <= 2, |v| <= 1 (so |o| <= 1 and the error is relative to max(1, max |o|) = 1):
 *   score s_c = scale sum_d q_d k_d, hd products summed and scaled: |ds| <= (hd + 1) u A_s, with
 *     A_s = scale hd max|q| max|k| bounding |s|; s_c - max: one rounding of a value <= 2 A_s;
 *   e_c = exp(s_c - max): the Cephes polynomial and its 2^n scaling, <= 4u relative (2 ulp + roundings);
 *     so e_c carries a relative error eta_c, |eta| <= (hd + 3) u A_s + 4u (an absolute error in the
 *     exponent is a relative one in e; the max's own error cancels in the ratio);
 *   o = sum_c e_c v_c / sum_c e_c over n <= Tk keys: the two sums (any order) <= (n + 1) u and n u of
 *     sum e |v| <= sum e; the reciprocal and its product (or the normalised P the sgemm path stores) 3u;
 *     and eta moves the weighted mean by <= 2 max|eta| max|v|.
 * Total: |do| <= u (2 (hd + 3) A_s + 8 + 2n + 4). With A_s = 11.3 (hd 8, q 2) and n = 150 that is
 * 3.3e-5; a wrong mask, window or GQA head moves o by ~0.1. */
static double attn_fwd_tol(int64_t hd, int64_t n, double A_s) {
    return 0x1p-24 * (2.0 * (double)(hd + 3) * A_s + 12.0 + 2.0 * (double)n);
}

static void test_attention(nb_ctx *ctx, int64_t B, int64_t Tq, int64_t Tk, int64_t kv_rows, int64_t H, int64_t KVH,
                           int64_t hd, int64_t pos0, int64_t window) {
    nb_attn_dims a = {B, Tq, Tk, kv_rows, H, KVH, hd, pos0, window, (float)(1.0 / sqrt((double)hd))};
    int64_t nq = B * Tq * H * hd, nk = B * kv_rows * KVH * hd, nk2 = B * Tk * KVH * hd;
    float *q = frand(nq, q_amp), *k = frand(nk, 2), *v = frand(nk, 1), *o = fz(nq), *lse = fz(B * H * Tq);
    float *dout = frand(nq, 1), *dq = fz(nq), *dk = fz(nk2), *dv = fz(nk2);
    double *qd = tod(q, nq), *kd = tod(k, nk), *vd = tod(v, nk), *od = dz(nq), *doutd = tod(dout, nq);
    double *dqd = dz(nq), *dkd = dz(nk), *dvd = dz(nk);
    CHECK_OK(ctx, nb_op_attention_fwd(ctx, &a, q, k, v, o, lse));
    nb_ref_attention_fwd(&a, qd, kd, vd, od);
    CHECK_CLOSE(o, od, nq, attn_fwd_tol(hd, Tk, a.scale * (double)hd * q_amp * 2.0));
#if defined(__x86_64__)
    unsigned csr = _mm_getcsr();
#endif
    CHECK_OK(ctx, nb_op_attention_bwd(ctx, &a, q, k, v, o, lse, dout, dq, dk, dv));
#if defined(__x86_64__)
    CHECK_MSG(_mm_getcsr() == csr, "attention backward left MXCSR %#x (was %#x)", _mm_getcsr(), csr);
#endif
    nb_ref_attention_bwd(&a, qd, kd, vd, doutd, dqd, dkd, dvd);
    CHECK_CLOSE(dq, dqd, nq, 2e-5);
    /* the fast kernel writes dk/dv [B, Tk, ...]; the reference uses the kv_rows layout */
    double *dk2 = dz(nk2), *dv2 = dz(nk2);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tk; t++)
            for (int64_t c = 0; c < KVH * hd; c++) {
                dk2[(b * Tk + t) * KVH * hd + c] = dkd[(b * kv_rows + t) * KVH * hd + c];
                dv2[(b * Tk + t) * KVH * hd + c] = dvd[(b * kv_rows + t) * KVH * hd + c];
            }
    CHECK_CLOSE(dk, dk2, nk2, 2e-5);
    CHECK_CLOSE(dv, dv2, nk2, 2e-5);
    free(q); free(k); free(v); free(o); free(lse); free(dout); free(dq); free(dk); free(dv);
    free(qd); free(kd); free(vd); free(od); free(doutd); free(dqd); free(dkd); free(dvd); free(dk2); free(dv2);
}

static void test_swiglu(nb_ctx *ctx, int64_t n) {
    float *g = frand(n, 12), *u = frand(n, 2), *da = frand(n, 1), *a = fz(n), *dg = fz(n), *du = fz(n);
    double *gd = tod(g, n), *ud = tod(u, n), *dad = tod(da, n), *ad = dz(n), *dgd = dz(n), *dud = dz(n);
    CHECK_OK(ctx, nb_op_swiglu_fwd(ctx, g, u, a, n));
    nb_ref_swiglu_fwd(gd, ud, ad, n);
    CHECK_CLOSE(a, ad, n, 1e-6);
    CHECK_OK(ctx, nb_op_swiglu_bwd(ctx, g, u, da, dg, du, n));
    nb_ref_swiglu_bwd(gd, ud, dad, dgd, dud, n);
    CHECK_CLOSE(dg, dgd, n, 1e-6);
    CHECK_CLOSE(du, dud, n, 1e-6);
    /* in place, as the model uses it */
    CHECK_OK(ctx, nb_op_swiglu_bwd(ctx, g, u, da, g, u, n));
    CHECK_CLOSE(g, dgd, n, 1e-6);
    CHECK_CLOSE(u, dud, n, 1e-6);
    free(g); free(u); free(da); free(a); free(dg); free(du);
    free(gd); free(ud); free(dad); free(ad); free(dgd); free(dud);
}

static void test_linear(nb_ctx *ctx, int64_t n, int64_t in, int64_t out) {
    float *x = frand(n * in, 1), *w = frand(out * in, 1), *b = frand(out, 1), *y = fz(n * out), *dy = frand(n * out, 1);
    float *dx = frand(n * in, 1), *dw = frand(out * in, 1), *db = frand(out, 1);
    double *xd = tod(x, n * in), *wd = tod(w, out * in), *bd = tod(b, out), *yd = dz(n * out), *dyd = tod(dy, n * out);
    double *dxd = tod(dx, n * in), *dwd = tod(dw, out * in), *dbd = tod(db, out);
    CHECK_OK(ctx, nb_op_linear_fwd(ctx, x, w, b, y, n, in, out));
    nb_ref_linear_fwd(xd, wd, bd, yd, n, in, out);
    CHECK_CLOSE(y, yd, n * out, 1e-5);
    CHECK_OK(ctx, nb_op_linear_bwd(ctx, x, w, dy, dx, 1, dw, db, n, in, out));
    nb_ref_linear_bwd(xd, wd, dyd, dxd, dwd, dbd, n, in, out);
    CHECK_CLOSE(dx, dxd, n * in, 1e-5);
    CHECK_CLOSE(dw, dwd, out * in, 1e-5);
    CHECK_CLOSE(db, dbd, out, 1e-5);
    /* dx written, not accumulated */
    double *dx0 = dz(n * in);
    nb_ref_linear_bwd(xd, wd, dyd, dx0, NULL, NULL, n, in, out);
    CHECK_OK(ctx, nb_op_linear_bwd(ctx, x, w, dy, dx, 0, NULL, NULL, n, in, out));
    CHECK_CLOSE(dx, dx0, n * in, 1e-5);
    free(x); free(w); free(b); free(y); free(dy); free(dx); free(dw); free(db);
    free(xd); free(wd); free(bd); free(yd); free(dyd); free(dxd); free(dwd); free(dbd); free(dx0);
}

static void test_embedding(nb_ctx *ctx) {
    int64_t V = 11, d = 37, n = 300;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)(nb_rng_next(&rng) % (uint64_t)V);
    float *t = frand(V * d, 1), *y = fz(n * d), *dy = frand(n * d, 1), *dt = fz(V * d);
    double *td = tod(t, V * d), *yd = dz(n * d), *dyd = tod(dy, n * d), *dtd = dz(V * d);
    CHECK_OK(ctx, nb_op_embedding_fwd(ctx, t, V, tok, n, d, y));
    nb_ref_embedding_fwd(td, tok, n, d, yd);
    CHECK_CLOSE(y, yd, n * d, 0);
    CHECK_OK(ctx, nb_op_embedding_bwd(ctx, tok, dy, n, d, dt));
    nb_ref_embedding_bwd(tok, dyd, n, d, dtd);
    CHECK_CLOSE(dt, dtd, V * d, 1e-6);
    tok[7] = (int32_t)V;
    CHECK_FAIL(ctx, nb_op_embedding_fwd(ctx, t, V, tok, n, d, y), NB_ERR_INVALID, "token id 11 at position 7");
    free(tok); free(t); free(y); free(dy); free(dt); free(td); free(yd); free(dyd); free(dtd);
}

static void test_ce(nb_ctx *ctx, int64_t n, int64_t V) {
    float *l = frand(n * V, 8), *dl = fz(n * V);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) t[i] = i % 5 == 3 ? -100 : (int32_t)(nb_rng_next(&rng) % (uint64_t)V);
    double *ld = tod(l, n * V), *dld = dz(n * V);
    double loss = 0;
    int64_t cnt = 0;
    CHECK_OK(ctx, nb_op_cross_entropy(ctx, l, t, n, V, -100, 0.25f, &loss, &cnt, dl));
    double ref = nb_ref_cross_entropy(ld, t, n, V, -100, 0.25, dld);
    int64_t want = 0;
    for (int64_t i = 0; i < n; i++) want += t[i] != -100;
    CHECK_EQ_INT(cnt, want);
    CHECK_NEAR(loss, ref, 1e-5 * fabs(ref));
    CHECK_CLOSE(dl, dld, n * V, 1e-6);
    /* in place */
    CHECK_OK(ctx, nb_op_cross_entropy(ctx, l, t, n, V, -100, 0.25f, NULL, NULL, l));
    CHECK_CLOSE(l, dld, n * V, 1e-6);
    t[0] = (int32_t)V;
    CHECK_FAIL(ctx, nb_op_cross_entropy(ctx, l, t, n, V, -100, 1.0f, NULL, NULL, NULL), NB_ERR_INVALID, "target");
    free(l); free(dl); free(t); free(ld); free(dld);
}

/* The small-head-dim attention blocks of the row-kernel table in use, against double loops, on
 * every tail: row counts around the register blocks, key counts around the 8/16/32-key vectors,
 * head dims with and without a remainder of hd % 8, and leading dimensions wider than the block. */
static void test_att_rows(nb_ctx *lc) {
    const nb_simd_table *K = nb_ctx_simd(lc);
    static const int64_t ms[] = {1, 2, 3, 5, 9}, ns[] = {1, 7, 15, 16, 17, 31, 33, 47}, hds[] = {4, 8, 12, 16, 24};
    for (size_t im = 0; im < sizeof ms / sizeof *ms; im++)
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
            for (size_t ih = 0; ih < sizeof hds / sizeof *hds; ih++) {
                int64_t m = ms[im], n = ns[in], hd = hds[ih], ldq = hd + 3, ldk = n + 5, lds = n + 2;
                float *Q = frand(m * ldq, 1), *Kt = frand(hd * ldk, 1), *V = frand(n * ldq, 1);
                float *S = frand(m * lds, 1), *O = fz(m * ldq), *O2 = fz(m * ldq), *C = frand(hd * ldk, 1);
                double *Sd = dz(m * lds), *Od = dz(m * ldq), *Cd = tod(C, hd * ldk);
                float *Sk = malloc(sizeof(float) * (size_t)(m * lds));
                memcpy(Sk, S, sizeof(float) * (size_t)(m * lds));
                K->rows_qk(Q, ldq, m, Kt, ldk, n, hd, 0.5f, S, lds);
                for (int64_t r = 0; r < m; r++)
                    for (int64_t c = 0; c < lds; c++) {
                        double t = 0;
                        for (int64_t d = 0; d < hd; d++) t += (double)Q[r * ldq + d] * Kt[d * ldk + c];
                        Sd[r * lds + c] = c < n ? 0.5 * t : Sk[r * lds + c];   /* beyond n: untouched */
                    }
                CHECK_CLOSE(S, Sd, m * lds, 1e-6);
                /* P = S (as probabilities); rows_pv reads Kt as V^T, rows_pvr the row-major V */
                K->rows_pv(S, lds, m, n, Kt, ldk, hd, O, ldq);
                for (int64_t c = 0; c < n; c++)
                    for (int64_t d = 0; d < hd; d++) V[c * ldq + d] = Kt[d * ldk + c];
                K->rows_pvr(S, lds, m, n, V, ldq, hd, O2, ldq);
                for (int64_t r = 0; r < m; r++)
                    for (int64_t d = 0; d < hd; d++) {
                        double t = 0;
                        for (int64_t c = 0; c < n; c++) t += (double)S[r * lds + c] * Kt[d * ldk + c];
                        Od[r * ldq + d] = t;
                    }
                CHECK_CLOSE(O, Od, m * ldq, 1e-6);
                CHECK_CLOSE(O2, Od, m * ldq, 1e-6);
                /* Ct[d][c] += sum_r S[r][c] Q[r][d] for c < n; the rest of each Ct row untouched */
                K->rows_tn(S, lds, m, n, Q, ldq, hd, C, ldk);
                for (int64_t d = 0; d < hd; d++)
                    for (int64_t c = 0; c < n; c++)
                        for (int64_t r = 0; r < m; r++) Cd[d * ldk + c] += (double)S[r * lds + c] * Q[r * ldq + d];
                CHECK_CLOSE(C, Cd, hd * ldk, 1e-6);
                free(Q); free(Kt); free(V); free(S); free(O); free(O2); free(C); free(Sd); free(Od); free(Cd); free(Sk);
            }
}

/* The AVX-512 softmax row (exp_sub_sum) takes its last n % 16 elements as the AVX2 row does, to
 * the bit: the forward's probabilities must not move (golden tests with FP8 rounding downstream). */
static void test_exp_tail_bits(nb_ctx *lc) {
    if (strcmp(nb_simd_force(lc, "avx512"), "avx512") != 0) return;
    for (int64_t n = 0; n < 16; n++) {
        float *x = frand(n, 6), *y = malloc(sizeof(float) * 16);
        memcpy(y, x, sizeof(float) * (size_t)n);
        float s2 = nb_simd_table_for(NB_SIMD_AVX2)->exp_sub_sum(x, n, 0.75f);
        float s5 = nb_simd_table_for(NB_SIMD_AVX512)->exp_sub_sum(y, n, 0.75f);
        CHECK_MSG(memcmp(&s2, &s5, sizeof s2) == 0, "exp_sub_sum n=%lld: sum %.9g vs %.9g", (long long)n, s2, s5);
        CHECK_MSG(n == 0 || memcmp(x, y, sizeof(float) * (size_t)n) == 0, "exp_sub_sum n=%lld: values differ", (long long)n);
        free(x);
        free(y);
    }
}

int main(void) {
    nb_rng_seed(&rng, 777);
    nb_ctx *lc = NULL;   /* the context whose level the row tests force */
    if (nb_ctx_new(1, &lc)) return 1;
    test_exp_tail_bits(lc);
    const char *paths[3] = {"scalar", "avx2", "avx512"};
    for (int p = 0; p < 3; p++) {
    if (strcmp(nb_simd_force(lc, paths[p]), paths[p]) != 0) { printf("no %s path on this CPU\n", paths[p]); continue; }
    printf("row kernels: %s\n", paths[p]);
    test_att_rows(lc);
    for (int threads = 1; threads <= 2; threads++) {
        nb_ctx *ctx = NULL;
        if (nb_ctx_new(threads, &ctx)) return 1;
        nb_simd_force(ctx, paths[p]);
        test_rmsnorm(ctx, 5, 64);
        test_rmsnorm(ctx, 300, 8);
        test_rope(ctx, 12, 4, 0, 3, 8);
        test_rope(ctx, 7, 7, 100, 2, 64);
        test_attention(ctx, 2, 5, 5, 5, 4, 2, 8, 0, 0);
        test_attention(ctx, 2, 150, 150, 150, 4, 1, 8, 0, 0);     /* crosses the 64-row query blocks */
        test_attention(ctx, 1, 130, 130, 130, 2, 2, 16, 0, 40);  /* sliding window */
        test_attention(ctx, 2, 3, 70, 90, 4, 2, 8, 67, 0);        /* decode against a cache */
        test_attention(ctx, 1, 1, 1, 4, 1, 1, 4, 0, 0);           /* one token */
        test_attention(ctx, 2, 100, 100, 100, 4, 2, 64, 0, 0);    /* head_dim 64: the sgemm path */
        test_attention(ctx, 1, 90, 90, 90, 2, 1, 48, 0, 30);      /* sgemm path, sliding window */
        test_attention(ctx, 1, 2, 75, 80, 2, 2, 64, 73, 0);       /* sgemm path, cache */
        test_attention(ctx, 1, 70, 70, 70, 2, 2, 32, 0, 0);       /* the largest row-kernel head_dim */
        /* GQA groups of 2-4 at odd lengths on both sides of the row-kernel / sgemm switch */
        test_attention(ctx, 2, 77, 77, 77, 8, 4, 8, 0, 0);        /* stories260K's heads */
        test_attention(ctx, 1, 131, 131, 131, 6, 2, 16, 0, 0);
        test_attention(ctx, 1, 67, 67, 67, 4, 1, 64, 0, 0);
        test_attention(ctx, 1, 33, 33, 33, 4, 2, 128, 0, 0);
        test_attention(ctx, 1, 45, 45, 45, 4, 2, 12, 0, 0);       /* hd % 8 != 0 */
        test_attention(ctx, 2, 99, 99, 99, 4, 2, 8, 0, 17);       /* window, GQA */
        test_attention(ctx, 1, 5, 40, 50, 4, 2, 16, 35, 0);       /* cache, GQA */
        q_amp = 25;   /* scores over a hundred apart: probabilities at exp(-87.3), subnormal products */
        test_attention(ctx, 2, 77, 77, 77, 8, 4, 8, 0, 0);
        test_attention(ctx, 1, 50, 50, 50, 4, 2, 64, 0, 0);
        q_amp = 2;
        test_swiglu(ctx, 1000);
        test_linear(ctx, 7, 33, 19);
        test_linear(ctx, 130, 64, 172);
        test_embedding(ctx);
        test_ce(ctx, 13, 40);
        test_ce(ctx, 3, 5000);
        nb_ctx_release(ctx);
    }
    }
    nb_ctx_release(lc);
    return nbt_done("test_ops_fast");
}

/* Row kernels with runtime CPU dispatch: AVX-512 or AVX2+FMA on x86-64 machines that have them,
 * portable C otherwise. They are the exp/max/dot loops a compiler will not vectorize on its own without
 * -ffast-math (reductions, clamps), used by softmax, SwiGLU, RMSNorm and cross-entropy in ops.c.
 * Each context runs the table of the level its backend chose at creation (nb_ctx_options.simd, or
 * NIBBLE_SIMD=auto|avx512|avx2|scalar read then; see ctx.c), so the tables here are constants. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NB_HAVE_AVX2_PATH 1
#include <immintrin.h>
#endif

/* ---- portable versions ---------------------------------------------------------------------- */

/* Cephes-style expf (see ops.c's fast_expf): about 2 ulp on the clamped range [-87.3, 88.7]. */
static inline float sc_exp(float x) {
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

static float sc_max(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
static float sc_exp_sub_sum(float *x, int64_t n, float sub) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = sc_exp(x[i] - sub);
        s += x[i];
    }
    return s;
}
static float sc_exp_sum(const float *x, int64_t n, float sub) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += sc_exp(x[i] - sub);
    return s;
}
static void sc_exp_scale(const float *x, float *y, int64_t n, float sub, float k) {
    for (int64_t i = 0; i < n; i++) y[i] = k * sc_exp(x[i] - sub);
}
static float sc_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static float sc_dot3(const float *a, const float *b, const float *c, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i] * c[i];
    return s;
}
static void sc_swiglu(const float *g, const float *u, float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = g[i] / (1.0f + sc_exp(-g[i])) * u[i];
}
static void sc_swiglu_bwd(const float *g, const float *u, const float *da, float *dg, float *du, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i], ui = u[i], d = da[i];
        float sg = 1.0f / (1.0f + sc_exp(-gi));
        du[i] = d * gi * sg;
        dg[i] = d * ui * sg * (1.0f + gi * (1.0f - sg));
    }
}
static void sc_attn_dsoft(float *p, float *dp, int64_t n, float lse, float D, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float pv = sc_exp(p[i] - lse);
        p[i] = pv;
        dp[i] = pv * (dp[i] - D) * scale;
    }
}

/* S[r][c] = scale sum_d Q[r][d] Kt[d][c] (r < m, c < n) */
static void sc_rows_qk(const float *Q, int64_t ldq, int64_t m, const float *Kt, int64_t ldk, int64_t n, int64_t hd,
                       float scale, float *S, int64_t lds) {
    for (int64_t r = 0; r < m; r++) {
        float *s = S + r * lds;
        for (int64_t c = 0; c < n; c++) s[c] = 0.0f;
        for (int64_t d = 0; d < hd; d++) {
            float qd = Q[r * ldq + d] * scale;
            const float *k = Kt + d * ldk;
            for (int64_t c = 0; c < n; c++) s[c] += qd * k[c];
        }
    }
}
/* O[r][:hd] = sum_c P[r][c] V[c][:hd] (r < m, c < n) */
static void sc_rows_pvr(const float *P, int64_t ldp, int64_t m, int64_t n, const float *V, int64_t ldv, int64_t hd,
                       float *O, int64_t ldo) {
    for (int64_t r = 0; r < m; r++) {
        float *o = O + r * ldo;
        for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t c = 0; c < n; c++) {
            float pc = P[r * ldp + c];
            const float *vc = V + c * ldv;
            for (int64_t d = 0; d < hd; d++) o[d] += pc * vc[d];
        }
    }
}
/* O[r][d] = sum_c P[r][c] Vt[d][c] (r < m, d < hd) */
static void sc_rows_pv(const float *P, int64_t ldp, int64_t m, int64_t n, const float *Vt, int64_t ldv, int64_t hd,
                       float *O, int64_t ldo) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t d = 0; d < hd; d++) {
            float s = 0.0f;
            for (int64_t c = 0; c < n; c++) s += P[r * ldp + c] * Vt[d * ldv + c];
            O[r * ldo + d] = s;
        }
}
/* Ct[d][c] += sum_r A[r][c] B[r][d] (d < hd, c < n) */
static void sc_rows_tn(const float *A, int64_t lda, int64_t m, int64_t n, const float *B, int64_t ldb, int64_t hd,
                       float *Ct, int64_t ldc) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t d = 0; d < hd; d++) {
            float b = B[r * ldb + d];
            float *ct = Ct + d * ldc;
            for (int64_t c = 0; c < n; c++) ct[c] += A[r * lda + c] * b;
        }
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------------ */

#ifdef NB_HAVE_AVX2_PATH
#define AVX2 __attribute__((target("avx2,fma")))

static inline AVX2 __m256 v_exp(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline AVX2 float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline AVX2 float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static AVX2 float av_max(const float *x, int64_t n) {
    int64_t i = 0;
    float m = -INFINITY;
    if (n >= 8) {
        __m256 a = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8) a = _mm256_max_ps(a, _mm256_loadu_ps(x + i));
        m = hmax(a);
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static AVX2 float av_exp_sub_sum(float *x, int64_t n, float sub) {
    __m256 s = _mm256_setzero_ps(), vs = _mm256_set1_ps(sub);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = v_exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    float t = hsum(s);
    for (; i < n; i++) {
        x[i] = sc_exp(x[i] - sub);
        t += x[i];
    }
    return t;
}

static AVX2 float av_exp_sum(const float *x, int64_t n, float sub) {
    __m256 s = _mm256_setzero_ps(), vs = _mm256_set1_ps(sub);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_add_ps(s, v_exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs)));
    float t = hsum(s);
    for (; i < n; i++) t += sc_exp(x[i] - sub);
    return t;
}

static AVX2 void av_exp_scale(const float *x, float *y, int64_t n, float sub, float k) {
    __m256 vs = _mm256_set1_ps(sub), vk = _mm256_set1_ps(k);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(vk, v_exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs))));
    for (; i < n; i++) y[i] = k * sc_exp(x[i] - sub);
}

static AVX2 float av_dot(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float t = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

static AVX2 float av_dot3(const float *a, const float *b, const float *c, int64_t n) {
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        s = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)), _mm256_loadu_ps(c + i), s);
    float t = hsum(s);
    for (; i < n; i++) t += a[i] * b[i] * c[i];
    return t;
}

static AVX2 void av_swiglu(const float *g, const float *u, float *a, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, v_exp(_mm256_sub_ps(zero, gv))));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(gv, sg), _mm256_loadu_ps(u + i)));
    }
    sc_swiglu(g + i, u + i, a + i, n - i);
}

static AVX2 void av_swiglu_bwd(const float *g, const float *u, const float *da, float *dg, float *du, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i), d = _mm256_loadu_ps(da + i);
        __m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, v_exp(_mm256_sub_ps(zero, gv))));
        __m256 duv = _mm256_mul_ps(d, _mm256_mul_ps(gv, sg));
        __m256 t = _mm256_fmadd_ps(gv, _mm256_sub_ps(one, sg), one);
        __m256 dgv = _mm256_mul_ps(_mm256_mul_ps(d, uv), _mm256_mul_ps(sg, t));
        _mm256_storeu_ps(du + i, duv);
        _mm256_storeu_ps(dg + i, dgv);
    }
    sc_swiglu_bwd(g + i, u + i, da + i, dg + i, du + i, n - i);
}

/* The small-head-dim attention products with vectors along the keys (K, V, dK, dV transposed):
 * rows_pv and the dQ product are dot products over the keys (8 accumulators per row, one per head
 * dim, reduced once at the end); rows_tn accumulates dK^T / dV^T rows of 8 keys over the query rows.
 * Head dims are taken 8 at a time; a remainder of hd % 8 goes to the portable loops. */

/* The forward's O = P V keeps V row-major and the vector along the head row: each output is one
 * FMA chain over the keys in order, the rounding the golden tests were made with (a dot product
 * over keys reduced by a tree rounds differently, and FP8 KV fake quant downstream amplifies it). */
/* HV = hd / 8 vectors per row, RB rows (or keys) per register block: RB * HV accumulators, chosen
 * so that they and the loads fit the 16 ymm registers and enough FMA chains are in flight. */
static inline __attribute__((always_inline)) AVX2 void av_rows_pvr_hv(const float *P, int64_t ldp, int64_t m, int64_t n,
                                                                      const float *V, int64_t ldv, float *O, int64_t ldo,
                                                                      const int HV, const int RB) {
    int64_t r = 0;
    for (; r + RB <= m; r += RB) {
        __m256 acc[8][4];
        for (int i = 0; i < RB; i++)
            for (int h = 0; h < HV; h++) acc[i][h] = _mm256_setzero_ps();
        for (int64_t c = 0; c < n; c++) {
            __m256 v[4];
            for (int h = 0; h < HV; h++) v[h] = _mm256_loadu_ps(V + c * ldv + 8 * h);
            for (int i = 0; i < RB; i++) {
                __m256 pb = _mm256_broadcast_ss(P + (r + i) * ldp + c);
                for (int h = 0; h < HV; h++) acc[i][h] = _mm256_fmadd_ps(pb, v[h], acc[i][h]);
            }
        }
        for (int i = 0; i < RB; i++)
            for (int h = 0; h < HV; h++) _mm256_storeu_ps(O + (r + i) * ldo + 8 * h, acc[i][h]);
    }
    for (; r < m; r++) {
        __m256 acc[4];
        for (int h = 0; h < HV; h++) acc[h] = _mm256_setzero_ps();
        for (int64_t c = 0; c < n; c++) {
            __m256 pb = _mm256_broadcast_ss(P + r * ldp + c);
            for (int h = 0; h < HV; h++) acc[h] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(V + c * ldv + 8 * h), acc[h]);
        }
        for (int h = 0; h < HV; h++) _mm256_storeu_ps(O + r * ldo + 8 * h, acc[h]);
    }
}

static AVX2 void av_rows_pvr(const float *P, int64_t ldp, int64_t m, int64_t n, const float *V, int64_t ldv, int64_t hd,
                            float *O, int64_t ldo) {
    switch (hd) {
    case 8: av_rows_pvr_hv(P, ldp, m, n, V, ldv, O, ldo, 1, 8); return;
    case 16: av_rows_pvr_hv(P, ldp, m, n, V, ldv, O, ldo, 2, 4); return;
    case 24: av_rows_pvr_hv(P, ldp, m, n, V, ldv, O, ldo, 3, 4); return;
    case 32: av_rows_pvr_hv(P, ldp, m, n, V, ldv, O, ldo, 4, 2); return;
    default: sc_rows_pvr(P, ldp, m, n, V, ldv, hd, O, ldo);
    }
}

/* lane i of the result = sum of the 8 lanes of v[i] */
static inline AVX2 __m256 hsum8x8(const __m256 v[8]) {
    __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
    __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
    __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

static AVX2 void av_rows_pv(const float *P, int64_t ldp, int64_t m, int64_t n, const float *Vt, int64_t ldv, int64_t hd,
                            float *O, int64_t ldo) {
    int64_t d0 = 0;
    for (; d0 + 8 <= hd; d0 += 8) {
        const float *V = Vt + d0 * ldv;
        for (int64_t r = 0; r < m; r++) {
            const float *p = P + r * ldp;
            __m256 acc[8];
            for (int d = 0; d < 8; d++) acc[d] = _mm256_setzero_ps();
            int64_t c = 0;
            for (; c + 8 <= n; c += 8) {
                __m256 pv = _mm256_loadu_ps(p + c);
                for (int d = 0; d < 8; d++) acc[d] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(V + d * ldv + c), acc[d]);
            }
            __m256 s = hsum8x8(acc);
            if (c < n) {
                float t[8];
                for (int d = 0; d < 8; d++) {
                    float x = 0.0f;
                    for (int64_t cc = c; cc < n; cc++) x += p[cc] * V[d * ldv + cc];
                    t[d] = x;
                }
                s = _mm256_add_ps(s, _mm256_loadu_ps(t));
            }
            _mm256_storeu_ps(O + r * ldo + d0, s);
        }
    }
    if (d0 < hd) sc_rows_pv(P, ldp, m, n, Vt + d0 * ldv, ldv, hd - d0, O + d0, ldo);
}

static AVX2 void av_rows_tn(const float *A, int64_t lda, int64_t m, int64_t n, const float *B, int64_t ldb, int64_t hd,
                            float *Ct, int64_t ldc) {
    int64_t d0 = 0;
    for (; d0 + 8 <= hd; d0 += 8) {
        float *C = Ct + d0 * ldc;
        int64_t c = 0;
        for (; c + 8 <= n; c += 8) {
            __m256 acc[8];
            for (int d = 0; d < 8; d++) acc[d] = _mm256_loadu_ps(C + d * ldc + c);
            for (int64_t r = 0; r < m; r++) {
                __m256 av = _mm256_loadu_ps(A + r * lda + c);
                const float *b = B + r * ldb + d0;
                for (int d = 0; d < 8; d++) acc[d] = _mm256_fmadd_ps(av, _mm256_broadcast_ss(b + d), acc[d]);
            }
            for (int d = 0; d < 8; d++) _mm256_storeu_ps(C + d * ldc + c, acc[d]);
        }
        if (c < n) sc_rows_tn(A + c, lda, m, n - c, B + d0, ldb, 8, C + c, ldc);
    }
    if (d0 < hd) sc_rows_tn(A, lda, m, n, B + d0, ldb, hd - d0, Ct + d0 * ldc, ldc);
}

static AVX2 void av_rows_qk(const float *Q, int64_t ldq, int64_t m, const float *Kt, int64_t ldk, int64_t n, int64_t hd,
                            float scale, float *S, int64_t lds) {
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) {
        int64_t c = 0;
        for (; c + 8 <= n; c += 8) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
            for (int64_t d = 0; d < hd; d++) {
                __m256 k = _mm256_loadu_ps(Kt + d * ldk + c);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(Q + r * ldq + d), k, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(Q + (r + 1) * ldq + d), k, a1);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(Q + (r + 2) * ldq + d), k, a2);
                a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(Q + (r + 3) * ldq + d), k, a3);
            }
            _mm256_storeu_ps(S + r * lds + c, _mm256_mul_ps(a0, vs));
            _mm256_storeu_ps(S + (r + 1) * lds + c, _mm256_mul_ps(a1, vs));
            _mm256_storeu_ps(S + (r + 2) * lds + c, _mm256_mul_ps(a2, vs));
            _mm256_storeu_ps(S + (r + 3) * lds + c, _mm256_mul_ps(a3, vs));
        }
        if (c < n) sc_rows_qk(Q + r * ldq, ldq, 4, Kt + c, ldk, n - c, hd, scale, S + r * lds + c, lds);
    }
    if (r < m) sc_rows_qk(Q + r * ldq, ldq, m - r, Kt, ldk, n, hd, scale, S + r * lds, lds);
}

static AVX2 void av_attn_dsoft(float *p, float *dp, int64_t n, float lse, float D, float scale) {
    __m256 vl = _mm256_set1_ps(lse), vD = _mm256_set1_ps(D), vsc = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pv = v_exp(_mm256_sub_ps(_mm256_loadu_ps(p + i), vl));
        _mm256_storeu_ps(p + i, pv);
        _mm256_storeu_ps(dp + i, _mm256_mul_ps(_mm256_mul_ps(pv, _mm256_sub_ps(_mm256_loadu_ps(dp + i), vD)), vsc));
    }
    sc_attn_dsoft(p + i, dp + i, n - i, lse, D, scale);
}
/* ---- AVX-512 (the exp-heavy row kernels and the attention blocks) -------------------------------- */

#define AVX512 __attribute__((target("avx512f,avx2,fma")))

static inline AVX512 __m512 v5_exp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    /* y * 2^n in one instruction: the same exactly rounded product as building 2^n's bits and
     * multiplying (n is in [-126, 128) after the clamp) */
    return _mm512_scalef_ps(y, n);
}

/* The row kernels below take their last n % 16 elements with masked loads and stores: attention
 * rows have every length, and a scalar tail of up to 15 exps was a tenth of the softmax. */
static inline AVX512 __mmask16 tmask(int64_t left) { return (__mmask16)((1u << left) - 1u); }

/* sc_exp's operations (separately rounded, as the portable C is compiled: ISO C, no contraction)
 * on 16 lanes: the same bits as sc_exp per lane */
static inline AVX512 __m512 v5_exp_sc(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), magic);
    __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

static AVX512 float a5_max(const float *x, int64_t n) {
    if (n <= 0) return -INFINITY;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 a = ninf;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) a = _mm512_max_ps(a, _mm512_loadu_ps(x + i));
    if (i < n) a = _mm512_max_ps(a, _mm512_mask_loadu_ps(ninf, tmask(n - i), x + i));
    return _mm512_reduce_max_ps(a);
}

static AVX512 float a5_exp_sub_sum(float *x, int64_t n, float sub) {
    __m512 s = _mm512_setzero_ps(), vs = _mm512_set1_ps(sub);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = v5_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs));
        _mm512_storeu_ps(x + i, e);
        s = _mm512_add_ps(s, e);
    }
    /* the tail as av_exp_sub_sum takes it, to the bit (the forward's softmax is pinned by golden
     * tests downstream of FP8 rounding): 8 lanes of v_exp, then the last ones through sc_exp's exact
     * operations in one masked vector, summed in order */
    float t = 0.0f;
    if (n - i >= 8) {
        __m256 e = v_exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(sub)));
        _mm256_storeu_ps(x + i, e);
        t = hsum(e);
        i += 8;
    }
    if (i < n) {
        __mmask16 k = tmask(n - i);
        _mm512_mask_storeu_ps(x + i, k, v5_exp_sc(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vs)));
        for (; i < n; i++) t += x[i];
    }
    return _mm512_reduce_add_ps(s) + t;
}

static AVX512 float a5_exp_sum(const float *x, int64_t n, float sub) {
    __m512 s = _mm512_setzero_ps(), vs = _mm512_set1_ps(sub);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) s = _mm512_add_ps(s, v5_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs)));
    return _mm512_reduce_add_ps(s) + av_exp_sum(x + i, n - i, sub);
}

static AVX512 void a5_exp_scale(const float *x, float *y, int64_t n, float sub, float k) {
    __m512 vs = _mm512_set1_ps(sub), vk = _mm512_set1_ps(k);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(vk, v5_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs))));
    av_exp_scale(x + i, y + i, n - i, sub, k);
}

static AVX512 void a5_swiglu(const float *g, const float *u, float *a, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, v5_exp(_mm512_sub_ps(zero, gv))));
        _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_mul_ps(gv, sg), _mm512_loadu_ps(u + i)));
    }
    av_swiglu(g + i, u + i, a + i, n - i);
}

static AVX512 void a5_swiglu_bwd(const float *g, const float *u, const float *da, float *dg, float *du, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i), uv = _mm512_loadu_ps(u + i), d = _mm512_loadu_ps(da + i);
        __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, v5_exp(_mm512_sub_ps(zero, gv))));
        __m512 duv = _mm512_mul_ps(d, _mm512_mul_ps(gv, sg));
        __m512 t = _mm512_fmadd_ps(gv, _mm512_sub_ps(one, sg), one);
        __m512 dgv = _mm512_mul_ps(_mm512_mul_ps(d, uv), _mm512_mul_ps(sg, t));
        _mm512_storeu_ps(du + i, duv);
        _mm512_storeu_ps(dg + i, dgv);
    }
    av_swiglu_bwd(g + i, u + i, da + i, dg + i, du + i, n - i);
}

static AVX512 void a5_attn_dsoft(float *p, float *dp, int64_t n, float lse, float D, float scale) {
    __m512 vl = _mm512_set1_ps(lse), vD = _mm512_set1_ps(D), vsc = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 pv = v5_exp(_mm512_sub_ps(_mm512_loadu_ps(p + i), vl));
        _mm512_storeu_ps(p + i, pv);
        _mm512_storeu_ps(dp + i, _mm512_mul_ps(_mm512_mul_ps(pv, _mm512_sub_ps(_mm512_loadu_ps(dp + i), vD)), vsc));
    }
    if (i < n) {
        __mmask16 k = tmask(n - i);
        __m512 pv = v5_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + i), vl));
        _mm512_mask_storeu_ps(p + i, k, pv);
        _mm512_mask_storeu_ps(dp + i, k, _mm512_mul_ps(_mm512_mul_ps(pv, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + i), vD)), vsc));
    }
}
/* AVX-512 forms of the attention blocks: 16 keys per vector, masked loads/stores for the last keys. */
static inline AVX512 __mmask16 kmask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u); }

/* lane i of the result = sum of the 16 lanes of v[i] (a transpose-and-add tree) */
static inline AVX512 __m512 hsum16x16(const __m512 v[16]) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* hd = HD (8 or 16): the HD x 16*CV block of Kt stays in registers while every row passes over it
 * (R rows at a time, R*CV accumulators: enough independent FMA chains of length HD), so a row
 * costs HD broadcasts and HD*CV FMAs. Each score is the same FMA chain over d as the generic form. */
static inline __attribute__((always_inline)) AVX512 void a5_rows_qk_hd(const float *Q, int64_t ldq, int64_t m,
                                                                        const float *Kt, int64_t ldk, int64_t n,
                                                                        float scale, float *S, int64_t lds,
                                                                        const int HD, const int CV, const int R) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t c = 0; c < n; c += 16 * CV) {
        __mmask16 km[2];
        __m512 kt[16][2];
        for (int v = 0; v < CV; v++) km[v] = kmask(n - c - 16 * v > 0 ? n - c - 16 * v : 0);
        for (int d = 0; d < HD; d++)
            for (int v = 0; v < CV; v++) kt[d][v] = _mm512_maskz_loadu_ps(km[v], Kt + d * ldk + c + 16 * v);
        int64_t r = 0;
        for (; r + R <= m; r += R) {
            __m512 a[8][2];
            for (int i = 0; i < R; i++)
                for (int v = 0; v < CV; v++) a[i][v] = _mm512_setzero_ps();
            for (int d = 0; d < HD; d++)
                for (int i = 0; i < R; i++) {
                    __m512 q = _mm512_set1_ps(Q[(r + i) * ldq + d]);
                    for (int v = 0; v < CV; v++) a[i][v] = _mm512_fmadd_ps(q, kt[d][v], a[i][v]);
                }
            for (int i = 0; i < R; i++)
                for (int v = 0; v < CV; v++)
                    _mm512_mask_storeu_ps(S + (r + i) * lds + c + 16 * v, km[v], _mm512_mul_ps(a[i][v], vs));
        }
        for (; r < m; r++) {
            __m512 a[2];
            for (int v = 0; v < CV; v++) a[v] = _mm512_setzero_ps();
            for (int d = 0; d < HD; d++) {
                __m512 q = _mm512_set1_ps(Q[r * ldq + d]);
                for (int v = 0; v < CV; v++) a[v] = _mm512_fmadd_ps(q, kt[d][v], a[v]);
            }
            for (int v = 0; v < CV; v++) _mm512_mask_storeu_ps(S + r * lds + c + 16 * v, km[v], _mm512_mul_ps(a[v], vs));
        }
    }
}

/* 4 rows x 32 keys per register block (8 accumulators, 6 loads per 8 FMAs) */
static AVX512 void a5_rows_qk(const float *Q, int64_t ldq, int64_t m, const float *Kt, int64_t ldk, int64_t n,
                              int64_t hd, float scale, float *S, int64_t lds) {
    if (hd == 8) { a5_rows_qk_hd(Q, ldq, m, Kt, ldk, n, scale, S, lds, 8, 2, 4); return; }
    if (hd == 16) { a5_rows_qk_hd(Q, ldq, m, Kt, ldk, n, scale, S, lds, 16, 1, 8); return; }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t c = 0; c < n; c += 32) {
        __mmask16 k0 = kmask(n - c), k1 = kmask(n - c - 16 > 0 ? n - c - 16 : 0);
        int64_t r = 0;
        for (; r + 4 <= m; r += 4) {
            __m512 a[4][2];
            for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
            for (int64_t d = 0; d < hd; d++) {
                __m512 x0 = _mm512_maskz_loadu_ps(k0, Kt + d * ldk + c), x1 = _mm512_maskz_loadu_ps(k1, Kt + d * ldk + c + 16);
                for (int i = 0; i < 4; i++) {
                    __m512 q = _mm512_set1_ps(Q[(r + i) * ldq + d]);
                    a[i][0] = _mm512_fmadd_ps(q, x0, a[i][0]);
                    a[i][1] = _mm512_fmadd_ps(q, x1, a[i][1]);
                }
            }
            for (int i = 0; i < 4; i++) {
                _mm512_mask_storeu_ps(S + (r + i) * lds + c, k0, _mm512_mul_ps(a[i][0], vs));
                _mm512_mask_storeu_ps(S + (r + i) * lds + c + 16, k1, _mm512_mul_ps(a[i][1], vs));
            }
        }
        for (; r < m; r++) {
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            for (int64_t d = 0; d < hd; d++) {
                __m512 q = _mm512_set1_ps(Q[r * ldq + d]);
                a0 = _mm512_fmadd_ps(q, _mm512_maskz_loadu_ps(k0, Kt + d * ldk + c), a0);
                a1 = _mm512_fmadd_ps(q, _mm512_maskz_loadu_ps(k1, Kt + d * ldk + c + 16), a1);
            }
            _mm512_mask_storeu_ps(S + r * lds + c, k0, _mm512_mul_ps(a0, vs));
            _mm512_mask_storeu_ps(S + r * lds + c + 16, k1, _mm512_mul_ps(a1, vs));
        }
    }
}

/* 2 rows x 8 head dims per pass: 16 dot-product accumulators over the keys, 10 loads per 16 FMAs */
static AVX512 void a5_rows_pv(const float *P, int64_t ldp, int64_t m, int64_t n, const float *Vt, int64_t ldv,
                              int64_t hd, float *O, int64_t ldo) {
    int64_t d0 = 0;
    for (; d0 + 8 <= hd; d0 += 8) {
        const float *V = Vt + d0 * ldv;
        for (int64_t r = 0; r < m; r += 2) {
            const float *p0 = P + r * ldp, *p1 = r + 1 < m ? p0 + ldp : p0;
            __m512 acc[16];
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t c = 0; c < n; c += 16) {
                __mmask16 k = kmask(n - c);
                __m512 x0 = _mm512_maskz_loadu_ps(k, p0 + c), x1 = _mm512_maskz_loadu_ps(k, p1 + c);
                for (int d = 0; d < 8; d++) {
                    __m512 v = _mm512_maskz_loadu_ps(k, V + d * ldv + c);
                    acc[d] = _mm512_fmadd_ps(x0, v, acc[d]);
                    acc[8 + d] = _mm512_fmadd_ps(x1, v, acc[8 + d]);
                }
            }
            __m512 s = hsum16x16(acc);
            _mm256_storeu_ps(O + r * ldo + d0, _mm512_castps512_ps256(s));
            if (r + 1 < m) _mm256_storeu_ps(O + (r + 1) * ldo + d0, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
        }
    }
    if (d0 < hd) sc_rows_pv(P, ldp, m, n, Vt + d0 * ldv, ldv, hd - d0, O + d0, ldo);
}

/* 32 keys x 8 head dims per register block: 16 accumulators, 10 loads per 16 FMAs */
static AVX512 void a5_rows_tn(const float *A, int64_t lda, int64_t m, int64_t n, const float *B, int64_t ldb,
                              int64_t hd, float *Ct, int64_t ldc) {
    int64_t d0 = 0;
    for (; d0 + 8 <= hd; d0 += 8) {
        float *C = Ct + d0 * ldc;
        for (int64_t c = 0; c < n; c += 32) {
            __mmask16 k0 = kmask(n - c), k1 = kmask(n - c - 16 > 0 ? n - c - 16 : 0);
            __m512 a0[8], a1[8];
            for (int d = 0; d < 8; d++) {
                a0[d] = _mm512_maskz_loadu_ps(k0, C + d * ldc + c);
                a1[d] = _mm512_maskz_loadu_ps(k1, C + d * ldc + c + 16);
            }
            for (int64_t r = 0; r < m; r++) {
                __m512 x0 = _mm512_maskz_loadu_ps(k0, A + r * lda + c), x1 = _mm512_maskz_loadu_ps(k1, A + r * lda + c + 16);
                const float *b = B + r * ldb + d0;
                for (int d = 0; d < 8; d++) {
                    __m512 bv = _mm512_set1_ps(b[d]);
                    a0[d] = _mm512_fmadd_ps(x0, bv, a0[d]);
                    a1[d] = _mm512_fmadd_ps(x1, bv, a1[d]);
                }
            }
            for (int d = 0; d < 8; d++) {
                _mm512_mask_storeu_ps(C + d * ldc + c, k0, a0[d]);
                _mm512_mask_storeu_ps(C + d * ldc + c + 16, k1, a1[d]);
            }
        }
    }
    if (d0 < hd) sc_rows_tn(A, lda, m, n, B + d0, ldb, hd - d0, Ct + d0 * ldc, ldc);
}
#endif

/* ---- the tables ------------------------------------------------------------------------------ */

static const nb_simd_table k_scalar = {"scalar", sc_max, sc_exp_sub_sum, sc_exp_sum, sc_exp_scale, sc_dot, sc_dot3,
                                       sc_swiglu, sc_swiglu_bwd, sc_attn_dsoft, sc_rows_qk, sc_rows_pvr, sc_rows_pv, sc_rows_tn};
#ifdef NB_HAVE_AVX2_PATH
static const nb_simd_table k_avx2 = {"avx2", av_max, av_exp_sub_sum, av_exp_sum, av_exp_scale, av_dot, av_dot3,
                                     av_swiglu, av_swiglu_bwd, av_attn_dsoft, av_rows_qk, av_rows_pvr, av_rows_pv, av_rows_tn};
static const nb_simd_table k_avx512 = {"avx512", a5_max, a5_exp_sub_sum, a5_exp_sum, a5_exp_scale, av_dot, av_dot3,
                                       a5_swiglu, a5_swiglu_bwd, a5_attn_dsoft, a5_rows_qk, av_rows_pvr, a5_rows_pv, a5_rows_tn};
#endif

const nb_simd_table *nb_simd_table_for(int level) {
#ifdef NB_HAVE_AVX2_PATH
    if (level == NB_SIMD_AVX512) return &k_avx512;
    if (level == NB_SIMD_AVX2) return &k_avx2;
#endif
    (void)level;
    return &k_scalar;
}

static const char *const LEVEL_NAMES[3] = {"scalar", "avx2", "avx512"};

int nb_simd_level_of(const char *name) {
    for (int l = 0; l < 3; l++)
        if (name && !strcmp(name, LEVEL_NAMES[l])) return l;
    return -1;
}

/* A value that is not a level, or a level this CPU (or build) lacks, is an error naming what is valid
 * here: never a silent fallback to another level. */
nb_status nb_simd_select(nb_ctx *ctx, const char *value, int cpu_level, const char **level) {
    static const char *const valid[3] = {"auto, scalar", "auto, avx2, scalar", "auto, avx512, avx2, scalar"};
    *level = LEVEL_NAMES[cpu_level];
    if (!value || !*value || !strcmp(value, "auto")) return NB_OK;
    int l = nb_simd_level_of(value);
    if (l < 0)
        return nb_fail(ctx, NB_ERR_INVALID, "NIBBLE_SIMD='%.60s' is not a SIMD level: expected auto, avx512, avx2 or scalar "
                       "(unset it for auto)", value);
    if (l > cpu_level)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "NIBBLE_SIMD='%s': this CPU (or this build) lacks %s; valid values "
                       "here are %s", value, l == 1 ? "AVX2+FMA" : "AVX-512F", valid[cpu_level]);
    *level = LEVEL_NAMES[l];
    return NB_OK;
}

/* Private interface of the model runtime's SIMD row kernels (simd.c): one constant table per level
 * (scalar, AVX2+FMA, AVX-512), and the table of a context (its backend chose the level at creation).
 * Nothing here is mutable: two contexts may run different levels side by side. */
#ifndef NIBBLE_CPU_SIMD_H
#define NIBBLE_CPU_SIMD_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "cpu/features.h"

typedef struct nb_simd_table {
    const char *name;
    float (*max)(const float *x, int64_t n);                              /* -inf when n == 0 */
    float (*exp_sub_sum)(float *x, int64_t n, float sub);                 /* x = exp(x - sub); returns the sum */
    float (*exp_sum)(const float *x, int64_t n, float sub);               /* sum exp(x - sub) */
    void (*exp_scale)(const float *x, float *y, int64_t n, float sub, float k);   /* y = k exp(x - sub) */
    float (*dot)(const float *a, const float *b, int64_t n);
    float (*dot3)(const float *a, const float *b, const float *c, int64_t n);
    void (*swiglu)(const float *g, const float *u, float *a, int64_t n);
    void (*swiglu_bwd)(const float *g, const float *u, const float *da, float *dg, float *du, int64_t n);
    void (*attn_dsoft)(float *p, float *dp, int64_t n, float lse, float D, float scale);  /* p = exp(p - lse);
                                                                                            dp = p (dp - D) scale */
    /* attention blocks for small head dims (rows of Q, P, dS; keys of K, V). K, V and the dK, dV
     * accumulators are kept transposed ([hd][keys]), so the vectors of every kernel run along the
     * keys: with hd = 8 a vector holds 8 or 16 keys instead of one short head row.
     * rows_qk: S[r][c] = scale sum_d Q[r][d] Kt[d][c]      (r < m, c < n)
     * rows_pvr: O[r][:hd] = sum_c P[r][c] V[c][:hd]       (V row-major, one FMA chain per output in key
     *           order: the forward's rounding; written)
     * rows_pv: O[r][d] = sum_c P[r][c] Vt[d][c]            (d < hd; written)
     * rows_tn: Ct[d][c] += sum_r A[r][c] B[r][d]           (d < hd, c < n; accumulated) */
    void (*rows_qk)(const float *Q, int64_t ldq, int64_t m, const float *Kt, int64_t ldk, int64_t n, int64_t hd,
                    float scale, float *S, int64_t lds);
    void (*rows_pvr)(const float *P, int64_t ldp, int64_t m, int64_t n, const float *V, int64_t ldv, int64_t hd,
                     float *O, int64_t ldo);
    void (*rows_pv)(const float *P, int64_t ldp, int64_t m, int64_t n, const float *Vt, int64_t ldv, int64_t hd,
                    float *O, int64_t ldo);
    void (*rows_tn)(const float *A, int64_t lda, int64_t m, int64_t n, const float *B, int64_t ldb, int64_t hd,
                    float *Ct, int64_t ldc);
} nb_simd_table;

/* The table of a level (NB_SIMD_*); a level this build lacks gives the scalar table. */
const nb_simd_table *nb_simd_table_for(int level);
/* The table ctx runs (ctx NULL: the best this CPU has). */
const nb_simd_table *nb_ctx_simd(const nb_ctx *ctx);
/* The level NIBBLE_SIMD=value (or the option nb_ctx_options.simd) selects on a CPU whose best level
 * is cpu_level (NB_SIMD_*): *level is its name, or the best one and an error for a value
 * that is not a level or a level above cpu_level (a pure function, so tests can ask for CPUs other
 * than this one). */
nb_status nb_simd_select(nb_ctx *ctx, const char *value, int cpu_level, const char **level);
/* NB_SIMD_* of a level name ("scalar", "avx2", "avx512"), -1 for another string. */
int nb_simd_level_of(const char *name);
/* Tests: make ctx run "scalar", "avx2" or "avx512" when the CPU has it (else leave it); returns the
 * name ctx runs now. */
const char *nb_simd_force(nb_ctx *ctx, const char *name);

#endif

/* Helpers the fast quantizer tests (test_quant_fast.c, _bf16.c, _nvfp4.c) share: row generators and their bf16
 * roundings, the BF16 kernels' output checks with guard bytes, the NVFP4 threshold-table comparison, the driver tensor
 * and the path-against-reference check. All static (inline: no unused warning where a test skips one). */
#ifndef NIBBLE_TEST_QUANT_FAST_COMMON_H
#define NIBBLE_TEST_QUANT_FAST_COMMON_H

#include "nbtest.h"
#include <stdint.h>

#include "nibble/quant_fast.h"
#include "cpu/fast_internal.h"

/* ---- rows ------------------------------------------------------------------------------------------ */

enum { KINDS = 12 };

/* One block (len elements) of a given kind; t = exponent that makes the "tie" kinds exact. */
static inline void gen_block(float *x, int len, int kind, int t) {
    double sc = ldexp(1.0, (int)(nbt_unif() * 60) - 30);
    for (int i = 0; i < len; i++) {
        double v;
        switch (kind) {
        case 0: v = nb_rng_normal(&nbt_rng) * sc; break;                                  /* plain */
        case 1: v = 0.0; break;                                                       /* zero block */
        case 2: v = (i & 1) ? -0.0 : -(double)ldexpf(1.0f, -149) * (nbt_rnd32() % 4); break;  /* -0 / subnormal negatives */
        case 3: v = ldexp((double)((int)(nbt_rnd32() % 49) - 24) * 0.25, t); break;        /* E2M1 ties at p = 2^t */
        case 4: v = nb_rng_normal(&nbt_rng) * 1e30; break;                                /* huge */
        case 5: v = nb_rng_normal(&nbt_rng) * 1e-39; break;                               /* subnormal */
        case 6: v = nb_rng_normal(&nbt_rng) * 1e-20; break;                               /* tiny: FP8 scale underflow */
        case 7: v = (double)nbt_u2f(nbt_rnd32() & 0x807FFFFFu); break;                        /* raw subnormal patterns */
        case 8: v = (double)nb_e4m3_to_f32((uint8_t)(nbt_rnd32() % 0x7E)) * ((nbt_rnd32() & 1) ? 1.5 : 1.0) *
                    ((nbt_rnd32() & 1) ? -1 : 1) * ldexp(1.0, (int)(nbt_rnd32() % 8) - 4); break;  /* E4M3 grid and midpoints */
        case 9: v = (double)nbt_u2f((nbt_rnd32() & 0x80000000u) | (nbt_rnd32() % 0x7F7FFFFFu)); break;   /* any finite pattern */
        case 10: v = (nbt_rnd32() & 1) ? 3.4028235e38 : -3.4028235e38; break;            /* FLT_MAX */
        default: v = (double)(int)(nbt_rnd32() % 13 - 6) * sc; break;                      /* small integers */
        }
        x[i] = (float)v;
    }
    if (kind == 3) x[nbt_rnd32() % (unsigned)len] = (float)ldexp(6.0, t) * ((nbt_rnd32() & 1) ? 1.0f : -1.0f);
}

static inline void gen_row(float *x, int64_t n, int block, int row_kind, int t) {
    for (int64_t b = 0; b < n / block; b++) {
        int kind = row_kind >= 0 ? row_kind : (int)(nbt_rnd32() % KINDS);
        gen_block(x + b * block, block, kind, t);
    }
    for (int64_t i = (n / block) * block; i < n; i++) x[i] = (float)nb_rng_normal(&nbt_rng);
}

static inline float row_absmax(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* The row kind of a trial whose lengths cycle with period nlens: each length meets every kind in
 * turn, and mixed-block rows (-1) four times in KINDS + 4. */
static inline int trial_kind(int trial, int nlens) {
    int kind = (trial / nlens) % (KINDS + 4) - 4;
    return kind < 0 ? -1 : kind;
}

/* h[0, n) -> x as f32 (the reference's input). */
static inline void bf16_to_f32_row(const uint16_t *h, int64_t n, float *x) {
    for (int64_t i = 0; i < n; i++) x[i] = nb_bf16_to_f32(h[i]);
}

/* ---- BF16-input kernels: AVX-512 (when the CPU has it) and the AVX2 NVFP4 threshold table ---------- */

static int HAVE512 = 0;   /* nbq_cpu_has_avx512(): the AVX-512 kernels run only then */

/* A generated row rounded to bf16 (what the kernels read), finite values only; f keeps it as f32. */
static inline void bf16_row(float *f, uint16_t *h, int64_t n, int block, int kind, int t) {
    gen_row(f, n, block, kind, t);
    for (int64_t i = 0; i < n; i++) {
        h[i] = nb_f32_to_bf16(f[i]);
        if ((h[i] & 0x7F80) == 0x7F80) h[i] = (uint16_t)((h[i] & 0x8000) | 0x7F7F);   /* inf after rounding: FLT_MAX-ish */
        f[i] = nb_bf16_to_f32(h[i]);
    }
}

/* BF16 rows compared bit for bit: AVX-512 kernels (plain and table), the AVX2 table kernel. */
static int64_t n_bf16_rows = 0, n_avx2_tab_rows = 0;

enum { GUARD = 64 };   /* bytes past a kernel's outputs, prefilled too: a byte written past the row shows */

/* The kernel's outputs and the guard bytes past them to 0xEE: a byte the kernel forgets to write shows. */
static inline void prefill_out(uint8_t *q1, int64_t qb, uint8_t *s1, int64_t sbn) {
    memset(q1, 0xEE, (size_t)(qb + GUARD));
    memset(s1, 0xEE, (size_t)(sbn + GUARD));
}

/* A kernel's data (and scales, s1 set) against the reference's, and its guard bytes untouched. */
static inline void check_bf16_out(const char *fmt_name, const char *kernel, const uint8_t *q0, const uint8_t *q1,
                                  int64_t qb, const uint8_t *s0, const uint8_t *s1, int64_t sbn, const char *mode,
                                  int64_t n, float scale) {
    uint8_t ee[GUARD];
    memset(ee, 0xEE, sizeof ee);
    CHECK_SAME(fmt_name, q0, q1, qb, "%s data, %s n=%lld scale=%a", kernel, mode, (long long)n, (double)scale);
    CHECK_SAME(fmt_name, ee, q1 + qb, GUARD, "%s data written past the row, %s n=%lld", kernel, mode, (long long)n);
    if (!s1) return;
    CHECK_SAME(fmt_name, s0, s1, sbn, "%s scales, %s n=%lld scale=%a", kernel, mode, (long long)n, (double)scale);
    CHECK_SAME(fmt_name, ee, s1 + sbn, GUARD, "%s scales written past the row, %s n=%lld", kernel, mode, (long long)n);
}

/* The NVFP4 threshold-table kernels (AVX-512, AVX2) against the reference (table built for a->scale). */
static nbq_nv_table NVTAB;
static inline void compare_nv_table(nb_qformat f, nb_qrow_quantize_fn ref, const float *x, const uint16_t *h,
                                    int64_t n, const nb_qrow_args *a, const char *mode) {
    int64_t qb = n / 2, sbn = n / 16;
    uint8_t *q0 = calloc((size_t)qb + 1, 1), *q1 = calloc((size_t)qb + 1, 1);
    uint8_t *s0 = calloc((size_t)sbn + 1, 1), *s1 = calloc((size_t)sbn + 1, 1);
    nbq_nv_table_build(a->scale, &NVTAB);
    ref(x, n, a, q0, s0);
    if (HAVE512 && nbq_avx512_nvfp4_table_bf16(f, h, n, a, &NVTAB, q1, s1) == 0) {
        CHECK_SAME("nvfp4 table", q0, q1, qb, "table kernel data, %s n=%lld s2=%a", mode, (long long)n, (double)a->scale);
        CHECK_SAME("nvfp4 table", s0, s1, sbn, "table kernel scales, %s n=%lld", mode, (long long)n);
        n_bf16_rows++;
    }
    memset(q1, 0xEE, (size_t)qb);
    memset(s1, 0xEE, (size_t)sbn);
    CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(f, h, n, a, &NVTAB, q1, s1), 0);
    CHECK_SAME("nvfp4 table avx2", q0, q1, qb, "avx2 table kernel data, %s n=%lld s2=%a", mode, (long long)n, (double)a->scale);
    CHECK_SAME("nvfp4 table avx2", s0, s1, sbn, "avx2 table kernel scales, %s n=%lld", mode, (long long)n);
    n_avx2_tab_rows++;
    free(q0); free(q1); free(s0); free(s1);
}

/* ---- drivers --------------------------------------------------------------------------------------- */

/* A 1024 x 4096 BF16 tensor of generated rows for the drivers (blocks of `block` elements; every fourth
 * row mixes block kinds, the others are plain at a scale that moves with the row), non-finite and huge
 * values replaced by 1. NULL when it cannot be made. */
static inline nb_tensor *driver_tensor(nb_ctx *ctx, int block) {
    const int64_t shape[2] = {1024, 4096};
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 2, shape, &x));
    if (!x) return NULL;
    uint16_t *h = nb_tensor_data(x);
    for (int64_t r = 0; r < 1024; r++) {
        float row[4096];
        gen_row(row, 4096, block, r % 4 == 0 ? -1 : 0, (int)(r % 24) - 12);
        for (int64_t i = 0; i < 4096; i++) h[r * 4096 + i] = nb_f32_to_bf16(isfinite(row[i]) && fabsf(row[i]) < 1e30f ? row[i] : 1.0f);
    }
    return x;
}

/* nb_quantize of x with `path` installed against the reference path: data, scales and the second-level
 * scale bit for bit, and with dq also nb_qtensor_dequantize of each (on its own path). `name` and
 * `what` label a failure. Leaves `path` installed. */
static inline void check_quantize_path(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *path,
                                       int dq, const char *name, const char *what) {
    nb_qtensor *q[2] = {NULL, NULL};
    nb_tensor *d[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {   /* 0: path, 1: the reference */
        CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, k ? "reference" : path));
        CHECK_OK(ctx, nb_quantize(ctx, x, p, &q[k]));
        if (dq && q[k]) CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q[k], NB_F32, &d[k]));
    }
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, path));
    if (q[0] && q[1]) {
        CHECK_SAME(name, nb_tensor_data(q[0]->data), nb_tensor_data(q[1]->data), nb_tensor_nbytes(q[0]->data), "quantize data, %s, %s", what, path);
        CHECK_SAME(name, nb_tensor_data(q[0]->scale), nb_tensor_data(q[1]->scale), nb_tensor_nbytes(q[0]->scale), "quantize scales, %s, %s", what, path);
        CHECK_EQ_INT(!q[0]->scale2, !q[1]->scale2);
        if (q[0]->scale2 && q[1]->scale2)
            CHECK_EQ_INT(nbt_f2u(*(float *)nb_tensor_data(q[0]->scale2)), nbt_f2u(*(float *)nb_tensor_data(q[1]->scale2)));
    }
    if (d[0] && d[1]) CHECK_SAME(name, nb_tensor_data(d[0]), nb_tensor_data(d[1]), nb_tensor_nbytes(d[0]), "dequantize, %s, %s", what, path);
    for (int k = 0; k < 2; k++) {
        nb_qtensor_release(q[k]);
        nb_tensor_release(d[k]);
    }
}

#endif

/* The fast quantizer paths against the scalar references, bit for bit: element kernels over bit patterns, the MXFP8
 * scale byte, the AVX2 f32 row functions on random and adversarial rows, and the drivers end to end with every path.
 * The BF16-input kernels' own tests are in test_quant_fast_bf16.c and test_quant_fast_nvfp4.c. */
#include "quant_fast_common.h"

/* ---- element kernels ------------------------------------------------------------------------------ */

/* Every bf16-truncated pattern with a set of low halves (0, 1, the midpoint bits, all ones, random),
 * plus the exact E2M1 midpoints and their neighbours. */
static int64_t sweep_values(float *v) {
    int64_t k = 0;
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0800, 0x07FF, 0x0801, 0x1000};
    for (uint32_t hi = 0; hi < 65536; hi++) {
        for (size_t j = 0; j < sizeof lows / sizeof lows[0]; j++) v[k++] = nbt_u2f(hi << 16 | lows[j]);
        for (int j = 0; j < 6; j++) v[k++] = nbt_u2f(hi << 16 | (nbt_rnd32() & 0xFFFF));
    }
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 1.0f, 448.0f, 464.0f, 480.0f};
    for (size_t j = 0; j < sizeof mids / sizeof mids[0]; j++)
        for (int d = -2; d <= 2; d++) {
            v[k++] = nbt_u2f(nbt_f2u(mids[j]) + (uint32_t)d);
            v[k++] = -nbt_u2f(nbt_f2u(mids[j]) + (uint32_t)d);
        }
    return k;
}

static void test_elements(void) {
    const int64_t cap = 65536 * 16 + 256;
    float *v = malloc((size_t)cap * sizeof(float)), *y = malloc((size_t)cap * sizeof(float));
    uint8_t *a = malloc((size_t)cap), *b = malloc((size_t)cap);
    uint16_t *h0 = malloc((size_t)cap * 2), *h1 = malloc((size_t)cap * 2);
    int64_t n = sweep_values(v);
    CHECK(n <= cap);
    int bad_e4m3 = 0, bad_e2m1 = 0, bad_bf16 = 0, bad_f16 = 0;
    nbq_avx2_e4m3_encode(v, n, a);
    for (int64_t i = 0; i < n; i++)
        if (a[i] != nb_f32_to_e4m3(v[i]) && bad_e4m3++ < 5)
            fprintf(stderr, "e4m3(%08x): avx2 %02x ref %02x\n", nbt_f2u(v[i]), a[i], nb_f32_to_e4m3(v[i]));
    nbq_avx2_e2m1_encode(v, n, b);
    for (int64_t i = 0; i < n; i++)
        if (b[i] != nb_f32_to_e2m1(v[i]) && bad_e2m1++ < 5)
            fprintf(stderr, "e2m1(%08x): avx2 %x ref %x\n", nbt_f2u(v[i]), b[i], nb_f32_to_e2m1(v[i]));
    nbq_avx2_store_f32(h0, NB_BF16, n, v);
    for (int64_t i = 0; i < n; i++)
        if (h0[i] != nb_f32_to_bf16(v[i]) && bad_bf16++ < 5)
            fprintf(stderr, "bf16(%08x): avx2 %04x ref %04x\n", nbt_f2u(v[i]), h0[i], nb_f32_to_bf16(v[i]));
    nbq_avx2_store_f32(h1, NB_F16, n, v);
    for (int64_t i = 0; i < n; i++)
        if (h1[i] != nb_f32_to_f16(v[i]) && bad_f16++ < 5)
            fprintf(stderr, "f16(%08x): avx2 %04x ref %04x\n", nbt_f2u(v[i]), h1[i], nb_f32_to_f16(v[i]));
    CHECK_EQ_INT(bad_e4m3, 0);
    CHECK_EQ_INT(bad_e2m1, 0);
    CHECK_EQ_INT(bad_bf16, 0);
    CHECK_EQ_INT(bad_f16, 0);
    /* plain-C store (the non-AVX2 machines' path) agrees too */
    {
        uint16_t *h2 = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) h2[i] = nb_f32_to_bf16(v[i]);
        CHECK_SAME("bf16 store", h0, h2, n * 2, "n=%lld", (long long)n);
        free(h2);
    }
    /* decoders: every E4M3 byte; every BF16 / F16 pattern */
    uint8_t all[256];
    float d0[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    int bad_dec = 0;
    nbq_avx2_e4m3_decode(all, 256, d0);
    for (int i = 0; i < 256; i++) bad_dec += nbt_f2u(d0[i]) != nbt_f2u(nb_e4m3_to_f32((uint8_t)i));
    CHECK_EQ_INT(bad_dec, 0);
    for (uint32_t i = 0; i < 65536; i++) h0[i] = (uint16_t)i;
    int bad_load = 0;
    nbq_avx2_load_f32(h0, NB_BF16, 65536, y);
    for (uint32_t i = 0; i < 65536; i++) bad_load += nbt_f2u(y[i]) != nbt_f2u(nb_bf16_to_f32((uint16_t)i));
    nbq_avx2_load_f32(h0, NB_F16, 65536, y);
    for (uint32_t i = 0; i < 65536; i++) bad_load += nbt_f2u(y[i]) != nbt_f2u(nb_f16_to_f32((uint16_t)i));
    CHECK_EQ_INT(bad_load, 0);
    /* absmax + non-finite flag, both paths, each dtype, with the max at every position class */
    for (int dt = 0; dt < 3; dt++) {
        nb_dtype t = dt == 0 ? NB_F32 : dt == 1 ? NB_BF16 : NB_F16;
        for (int trial = 0; trial < 200; trial++) {
            int64_t m = 1 + (int64_t)(nbt_unif() * 300);
            for (int64_t i = 0; i < m; i++) y[i] = (float)(nb_rng_normal(&nbt_rng) * ldexp(1.0, (int)(nbt_unif() * 20) - 10));
            if (trial % 7 == 0) y[(int64_t)(nbt_unif() * (double)m)] = (trial & 8) ? -INFINITY : NAN;
            if (trial % 11 == 0) for (int64_t i = 0; i < m; i++) y[i] = (i & 1) ? -0.0f : 0.0f;
            void *buf = malloc((size_t)m * 4);
            nbq_avx2_store_f32(buf, t, m, y);
            int nf0 = 0, nf1 = 0;
            float m0 = nbq_avx2_absmax(buf, t, m, &nf0), m1 = nbq_fast_absmax(buf, t, m, &nf1);
            int want_nf = 0;
            float want = 0.0f;
            for (int64_t i = 0; i < m; i++) {
                double e = nb_load_elem(buf, t, i);
                if (!isfinite(e)) want_nf = 1;
                else if (fabs(e) > want) want = (float)fabs(e);
            }
            CHECK_EQ_INT(nf0, want_nf);
            CHECK_EQ_INT(nf1, want_nf);
            if (!want_nf) {
                CHECK_EQ_INT(nbt_f2u(m0), nbt_f2u(want));
                CHECK_EQ_INT(nbt_f2u(m1), nbt_f2u(want));
            }
            free(buf);
        }
    }
    free(v); free(y); free(a); free(b); free(h0); free(h1);
}

/* ---- MXFP8 scale byte ------------------------------------------------------------------------------- */

static void test_mx_scale(void) {
    int bad = 0;
    int64_t n = 0;
    /* every amax whose descale amax/448 lies in the first ~4600 patterns of a binade (448 = 1.75*2^8,
     * so consecutive amax patterns step the descale by ~0.57 of its ulp and cover all of them) */
    for (int k = -140; k <= 119; k++) {
        uint32_t base = nbt_f2u(ldexpf(448.0f, k));
        for (int j = -300; j <= 8192; j++) {
            float amax = nbt_u2f(base + (uint32_t)j);
            for (int fl = 0; fl < 2; fl++) {
                n++;
                uint8_t r = nb_mxfp8_scale_byte(amax, fl), f = nbq_mx_scale_byte_fast(amax, fl);
                if (r != f && bad++ < 5) fprintf(stderr, "mx byte(%08x, floor %d): fast %u ref %u\n", nbt_f2u(amax), fl, f, r);
            }
        }
    }
    /* random finite amax, every subnormal class, zero, and the extremes */
    for (int i = 0; i < 400000; i++) {
        uint32_t u = nbt_rnd32() & 0x7FFFFFFFu;
        if (u >= 0x7F800000u) continue;
        if (i & 1) u >>= (nbt_rnd32() % 31);
        float amax = nbt_u2f(u);
        for (int fl = 0; fl < 2; fl++) {
            n++;
            uint8_t r = nb_mxfp8_scale_byte(amax, fl), f = nbq_mx_scale_byte_fast(amax, fl);
            if (r != f && bad++ < 10) fprintf(stderr, "mx byte(%08x, floor %d): fast %u ref %u\n", u, fl, f, r);
        }
    }
    static const float edge[] = {0.0f, -0.0f, 1e-45f, 1e-40f, 448.0f, 3.4028235e38f, 1.0f, 0x1p-127f, 0x1p-118f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        for (int fl = 0; fl < 2; fl++) bad += nb_mxfp8_scale_byte(edge[i], fl) != nbq_mx_scale_byte_fast(edge[i], fl);
    CHECK_EQ_INT(bad, 0);
    /* the table is the rule: thresholds sit inside their binade, past its first pattern */
    const uint32_t *t = nbq_mx_ceil_table();
    int order = 0;
    for (int k = -126; k <= 119; k++) order += !(t[k + 127] > (uint32_t)(k + 127) << 23 && t[k + 127] < (uint32_t)(k + 128) << 23);
    CHECK_EQ_INT(order, 0);
    printf("mx scale byte: %lld amax values, table-driven == reference\n", (long long)n);
}

/* ---- rows -------------------------------------------------------------------------------------------- */

typedef struct row_case {
    const char *name;
    nb_qrow_quantize_fn qf, qr;
    nb_qrow_dequantize_fn df, dr;
    nb_qrow_fake_fn ff, fr;
    int block;       /* elements per scale (0: FP8, any n) */
    int qbytes_num;  /* data bytes per element = num/2 */
} row_case;

static int64_t n_rows_checked = 0;

enum { ROW_GUARD = 64 };   /* bytes past a row function's outputs, prefilled with 0xEE and checked after */

/* The row function's outputs and their guard bytes to 0xEE, and afterwards the guard bytes unchanged. */
static void row_guard_fill(void *p, int64_t bytes) { memset(p, 0xEE, (size_t)(bytes + ROW_GUARD)); }
static int row_guard_ok(const void *p, int64_t bytes) {
    const uint8_t *b = (const uint8_t *)p + bytes;
    for (int i = 0; i < ROW_GUARD; i++)
        if (b[i] != 0xEE) return 0;
    return 1;
}

static void compare_row(const row_case *rc, const float *x, int64_t n, const nb_qrow_args *a, const char *mode) {
    int64_t qb = n * rc->qbytes_num / 2, sbn = rc->block ? n / rc->block : 0;
    uint8_t *q0 = calloc((size_t)qb + 1, 1), *q1 = malloc((size_t)(qb + ROW_GUARD));
    uint8_t *s0 = calloc((size_t)sbn + 1, 1), *s1 = malloc((size_t)(sbn + ROW_GUARD));
    float *y0 = calloc((size_t)n + 1, 4), *y1 = malloc((size_t)(n * 4 + ROW_GUARD));
    rc->qr(x, n, a, q0, s0);
    row_guard_fill(q1, qb);
    row_guard_fill(s1, sbn);
    rc->qf(x, n, a, q1, s1);
    CHECK_SAME(rc->name, q0, q1, qb, "quantize data, %s n=%lld scale=%a", mode, (long long)n, (double)a->scale);
    CHECK_SAME(rc->name, s0, s1, sbn, "quantize scales, %s n=%lld scale=%a", mode, (long long)n, (double)a->scale);
    CHECK_MSG(row_guard_ok(q1, qb) && row_guard_ok(s1, sbn), "%s quantize wrote past the row, %s n=%lld", rc->name, mode, (long long)n);
    rc->fr(x, n, a, y0);
    row_guard_fill(y1, n * 4);
    rc->ff(x, n, a, y1);
    CHECK_SAME(rc->name, y0, y1, n * 4, "fake, %s n=%lld scale=%a", mode, (long long)n, (double)a->scale);
    CHECK_MSG(row_guard_ok(y1, n * 4), "%s fake wrote past the row, %s n=%lld", rc->name, mode, (long long)n);
    if (rc->dr) {
        rc->dr(q0, s0, n, a, y0);
        row_guard_fill(y1, n * 4);
        rc->df(q0, s0, n, a, y1);
        CHECK_SAME(rc->name, y0, y1, n * 4, "dequantize of the quantized row, %s n=%lld", mode, (long long)n);
        CHECK_MSG(row_guard_ok(y1, n * 4), "%s dequantize wrote past the row, %s n=%lld", rc->name, mode, (long long)n);
        /* arbitrary bytes too: NaN scale codes, inf E8M0, every data code */
        for (int64_t i = 0; i < qb; i++) q0[i] = (uint8_t)nbt_rnd32();
        for (int64_t i = 0; i < sbn; i++) s0[i] = (uint8_t)nbt_rnd32();
        rc->dr(q0, s0, n, a, y0);
        rc->df(q0, s0, n, a, y1);
        CHECK_SAME(rc->name, y0, y1, n * 4, "dequantize of random bytes, %s n=%lld", mode, (long long)n);
    }
    n_rows_checked++;
    free(q0); free(q1); free(s0); free(s1); free(y0); free(y1);
}

static const int64_t NV_LENS[] = {16, 48, 128, 144, 256, 400, 1024, 2064, 4480, 8208};   /* > 4096: several pass-1 chunks */
static const int64_t MX_LENS[] = {32, 96, 256, 288, 1024, 4096, 4384, 8480};
static const int64_t FP8_LENS[] = {1, 7, 8, 31, 32, 33, 100, 257, 1024, 4099};

static void test_nvfp4_rows(void) {
    row_case nv = {"nvfp4", nbq_avx2_nvfp4_quantize_row, nb_nvfp4_quantize_row_ref, nbq_avx2_nvfp4_dequantize_row,
                   nb_nvfp4_dequantize_row_ref, nbq_avx2_nvfp4_fake_row, nb_nvfp4_fake_row_ref, 16, 1};
    row_case nv46 = {"nvfp4_46", nbq_avx2_nvfp4_46_quantize_row, nb_nvfp4_46_quantize_row_ref, NULL, NULL,
                     nbq_avx2_nvfp4_46_fake_row, nb_nvfp4_46_fake_row_ref, 16, 1};
    float *x = malloc(8208 * 4), *bam = malloc(8208 / 16 * 4);
    for (int trial = 0; trial < 1500; trial++) {
        int64_t n = NV_LENS[trial % 10];
        int kind = trial_kind(trial, 10);
        int t = (int)(nbt_rnd32() % 40) - 20;
        gen_row(x, n, 16, kind, t);
        float amax = row_absmax(x, n);
        nb_qrow_args a;
        memset(&a, 0, sizeof a);
        a.div_dtype = NB_F32;
        /* dynamic: the driver's s2 from the data; or an exact power of two (ties land on the grid);
         * or an arbitrary scale (incl. 0 and subnormal: NaN/Inf block scales) */
        int mode = trial % 5;
        if (mode == 0 || mode == 3) a.scale = nb_nvfp4_scale2(amax, 448.0f);
        else if (mode == 1) a.scale = ldexpf(1.0f, t);
        else if (mode == 2) a.scale = (trial & 8) ? 0.0f : nbt_u2f(nbt_rnd32() & 0x007FFFFFu);
        else a.scale = (float)(nbt_unif() * 10.0);
        a.global_amax = amax;
        compare_row(&nv, x, n, &a, "dynamic");
        /* static: calibrated per-block amax (the data's, scaled, zeros), G = max or the tie value */
        for (int64_t b = 0; b < n / 16; b++) {
            float m = row_absmax(x + b * 16, 16);
            int r = (int)(nbt_rnd32() % 4);
            bam[b] = r == 0 ? m : r == 1 ? m * 1.5f : r == 2 ? 0.0f : (float)(nbt_unif() * 4.0);
        }
        a.block_amax = bam;
        a.global_amax = mode == 1 ? ldexpf(2688.0f, t) : row_absmax(bam, n / 16);
        if (a.global_amax == 0.0f) a.global_amax = 1.0f;
        a.scale = mode == 1 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 448.0f);
        compare_row(&nv, x, n, &a, "static");
        a.scale = mode == 1 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 256.0f);
        if (mode == 1) a.global_amax = ldexpf(1536.0f, t);
        compare_row(&nv46, x, n, &a, "46 static");
        /* four_over_six per-block pick: G from the data, from the tie exponent, or an odd value;
         * the row's scale equal to G/1536 (the driver's case) or not */
        a.block_amax = NULL;
        a.global_amax = mode == 1 ? ldexpf(1536.0f, t) : mode == 4 ? (float)(nbt_unif() * 100.0) + 1e-3f : amax;
        if (a.global_amax == 0.0f) a.global_amax = 1e-30f;
        a.scale = (trial & 16) ? (float)(nbt_unif() * 3.0) : nb_nvfp4_scale2(a.global_amax, 256.0f);
        compare_row(&nv46, x, n, &a, "46 pick");
    }
    /* rows that are not whole 8-block groups: 1-7 blocks (one group on a zero-padded copy), 9-40
     * blocks (whole groups, then one group ending at the row's last block over blocks already done),
     * SmolLM2-135M's 576 and 896; each block unlike its neighbours (kinds and scales at random) */
    const int64_t rows0 = n_rows_checked;
    for (int64_t nb = 1; nb <= 42; nb++)
        for (int trial = 0; trial < 4; trial++) {
            const int64_t n = (nb <= 40 ? nb : nb == 41 ? 36 : 56) * 16;
            const int t = (int)(nbt_rnd32() % 40) - 20;
            gen_row(x, n, 16, trial == 0 ? 0 : trial == 1 ? 3 : -1, t);
            float amax = row_absmax(x, n);
            nb_qrow_args a;
            memset(&a, 0, sizeof a);
            a.div_dtype = NB_F32;
            a.global_amax = amax > 0.0f ? amax : 1.0f;
            a.scale = trial == 1 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 448.0f);
            compare_row(&nv, x, n, &a, "row tails, dynamic");
            a.scale = trial == 1 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 256.0f);
            compare_row(&nv46, x, n, &a, "row tails, 46 pick");
            for (int64_t b = 0; b < n / 16; b++) {
                float m = row_absmax(x + b * 16, 16);
                int r = (int)(nbt_rnd32() % 4);
                bam[b] = r == 0 ? m : r == 1 ? m * 1.5f : r == 2 ? 0.0f : (float)(nbt_unif() * 4.0) * m;
            }
            a.block_amax = bam;
            a.global_amax = row_absmax(bam, n / 16);
            if (a.global_amax == 0.0f) a.global_amax = 1.0f;
            a.scale = nb_nvfp4_scale2(a.global_amax, 448.0f);
            compare_row(&nv, x, n, &a, "row tails, static");
            a.scale = nb_nvfp4_scale2(a.global_amax, 256.0f);
            compare_row(&nv46, x, n, &a, "row tails, 46 static");
        }
    CHECK_EQ_INT(n_rows_checked - rows0, 42 * 4 * 4);
    free(x);
    free(bam);
}

static void test_mxfp8_rows(void) {
    row_case mx = {"mxfp8", nbq_avx2_mxfp8_quantize_row, nb_mxfp8_quantize_row_ref, nbq_avx2_mxfp8_dequantize_row,
                   nb_mxfp8_dequantize_row_ref, nbq_avx2_mxfp8_fake_row, nb_mxfp8_fake_row_ref, 32, 2};
    float *x = malloc(8480 * 4);
    for (int trial = 0; trial < 1200; trial++) {
        int64_t n = MX_LENS[trial % 8];
        int kind = trial_kind(trial, 8);
        gen_row(x, n, 32, kind, (int)(nbt_rnd32() % 40) - 20);
        nb_qrow_args a;
        memset(&a, 0, sizeof a);
        a.mx_floor = trial & 1;
        compare_row(&mx, x, n, &a, a.mx_floor ? "floor" : "ceil");
    }
    free(x);
}

static void test_fp8_rows(void) {
    row_case fp = {"fp8", nbq_avx2_fp8_quantize_row, nb_fp8_quantize_row_ref, nbq_avx2_fp8_dequantize_row,
                   nb_fp8_dequantize_row_ref, nbq_avx2_fp8_fake_row, nb_fp8_fake_row_ref, 0, 2};
    float *x = malloc(4100 * 4);
    for (int trial = 0; trial < 1500; trial++) {
        int64_t n = FP8_LENS[trial % 10];
        int kind = trial_kind(trial, 10);
        gen_row(x, n, 1, kind, (int)(nbt_rnd32() % 40) - 20);
        nb_qrow_args a;
        memset(&a, 0, sizeof a);
        float amax = row_absmax(x, n);
        int mode = trial % 4;
        a.scale = mode == 0 ? amax / 448.0f : mode == 1 ? ldexpf(1.0f, (int)(nbt_rnd32() % 40) - 20)
                : mode == 2 ? amax / 448.0f * 0.001f : (float)(nbt_unif() * 2.0) + 1e-30f;
        if (a.scale == 0.0f) a.scale = 1.0f;
        a.global_amax = amax;
        static const int32_t dts[3] = {NB_F32, NB_BF16, NB_F16};
        a.div_dtype = dts[(trial / 4) % 3];
        compare_row(&fp, x, n, &a, a.div_dtype == NB_F32 ? "f32" : a.div_dtype == NB_BF16 ? "bf16 div" : "f16 div");
    }
    free(x);
}

/* ---- drivers end to end with both paths ----------------------------------------------------------- */

/* FP8 (per tensor from the data with either division dtype, calibrated, per channel from the data and
 * calibrated) and MXFP8 (both rules) on a BF16 tensor of 4M elements with `path` installed, split over
 * the context's threads, against the reference path; a NaN in it is still named. */
static void test_fp8_mx_driver(nb_ctx *ctx, const char *path) {
    const int64_t cshape[1] = {1024};
    nb_tensor *x = driver_tensor(ctx, 32), *cam = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, cshape, &cam));
    if (!x || !cam) return;
    uint16_t *h = nb_tensor_data(x);
    float *cd = nb_tensor_data(cam);
    for (int64_t r = 0; r < 1024; r++) {
        float m = 0.0f;
        for (int64_t i = 0; i < 4096; i++) m = fmaxf(m, fabsf(nb_bf16_to_f32(h[r * 4096 + i])));
        cd[r] = m == 0.0f ? 1.0f : r % 3 ? m : m * 0.75f;   /* calibrated below the data's max too: clamps */
    }
    for (int k = 0; k < 7; k++) {
        nb_qparams p;
        nb_qparams_init(&p, k < 3 ? NB_FMT_FP8_TENSOR : k < 5 ? NB_FMT_FP8_CHANNEL : NB_FMT_MXFP8);
        if (k == 1) p.fp8_div_dtype = NB_F32;
        if (k == 2) p.amax = 3.25f;
        if (k == 4) p.channel_amax = cam;
        if (k == 6) p.mx_floor = 1;
        char what[16];
        snprintf(what, sizeof what, "case %d", k);
        check_quantize_path(ctx, x, &p, path, 0, "fp8/mxfp8 driver", what);
    }
    h[901 * 4096 + 4095] = 0xFF80;
    for (int k = 0; k < 3; k++) {
        nb_qparams p;
        nb_qparams_init(&p, k == 0 ? NB_FMT_FP8_TENSOR : k == 1 ? NB_FMT_FP8_CHANNEL : NB_FMT_MXFP8);
        if (k == 0) p.amax = 3.25f;   /* calibrated: the kernels' own check */
        p.name = "big.weight";
        nb_qtensor *q = NULL;
        CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_NUMERIC, "big.weight: -Inf at flat index 3694591 (element [901, 4095])");
        CHECK(q == NULL);
    }
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
    nb_tensor_release(x);
    nb_tensor_release(cam);
}

/* FP8 per channel on BF16 rows long enough for the table kernel, where each row's kernel also reads
 * the next row's max: a NaN, an Inf or an all-zero row anywhere (first, middle, last row of a
 * thread's range) is reported as before, and clean tensors match the reference path. */
static void test_channel_next_rows(nb_ctx *ctx, const char *path) {
    const int64_t shape[2] = {6, 2048};
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 2, shape, &x));
    if (!x) return;
    uint16_t *h = nb_tensor_data(x);
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, path));
    for (int where = 0; where < 6; where++) {
        for (int kind = 0; kind < 3; kind++) {
            for (int64_t i = 0; i < 6 * 2048; i++) h[i] = nb_f32_to_bf16((float)nb_rng_normal(&nbt_rng) * (float)(1 + i / 2048));
            int64_t at = where * 2048 + 1000 + where;
            nb_qparams p;
            nb_qparams_init(&p, NB_FMT_FP8_CHANNEL);
            p.name = "down.weight";
            nb_qtensor *q = NULL;
            char msg[96];
            if (kind == 2) {
                /* an all-zero row quantizes with ModelOpt's sanitized amax 448: scale 1, codes +-0 */
                for (int64_t i = 0; i < 2048; i++) h[where * 2048 + i] = (i & 1) ? 0x8000 : 0;
                CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
                if (q) {
                    const uint8_t *c = (const uint8_t *)nb_tensor_data(q->data) + where * 2048;
                    int zero_ok = 1;
                    for (int64_t i = 0; i < 2048; i++) zero_ok &= c[i] == ((i & 1) ? 0x80 : 0x00);
                    CHECK_MSG(zero_ok && ((const float *)nb_tensor_data(q->scale))[where] == 1.0f, "zero row %d", where);
                }
                nb_qtensor_release(q);
                q = NULL;
            } else {
                h[at] = kind ? 0xFF80 : 0x7FC1;
                snprintf(msg, sizeof msg, "down.weight: %s at flat index %lld", kind ? "-Inf" : "NaN", (long long)at);
                CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_NUMERIC, msg);
            }
            CHECK(q == NULL);
        }
    }
    /* clean: the path == reference */
    for (int64_t i = 0; i < 6 * 2048; i++) h[i] = nb_f32_to_bf16((float)nb_rng_normal(&nbt_rng) * (float)(1 + i / 2048));
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_FP8_CHANNEL);
    check_quantize_path(ctx, x, &p, path, 0, "fp8_channel", "next-row kernel");
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
    nb_tensor_release(x);
}

/* The fused driver: NaN/Inf named with tensor and index in the one-pass formats (no amax pass runs
 * first), FP8_CHANNEL's zero row after the pass, nb_quantize_into == nb_quantize, its errors. */
static void test_fused_driver(nb_ctx *ctx) {
    const int64_t shape[2] = {9, 64};
    static const nb_dtype dts[3] = {NB_BF16, NB_F32, NB_F16};
    for (int d = 0; d < 3; d++) {
        nb_tensor *x = NULL, *bam = NULL;
        CHECK_OK(ctx, nb_tensor_new(ctx, dts[d], 2, shape, &x));
        const int64_t bshape[2] = {9, 4};
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, bshape, &bam));
        if (!x || !bam) return;
        for (int64_t i = 0; i < 9 * 64; i++) nb_store_elem(nb_tensor_data(x), dts[d], i, (double)((i * 7) % 23) - 11.0);
        for (int64_t i = 0; i < 36; i++) ((float *)nb_tensor_data(bam))[i] = 11.0f;
        static const nb_qformat fs[6] = {NB_FMT_MXFP8, NB_FMT_FP8_CHANNEL, NB_FMT_NVFP4, NB_FMT_NVFP4_46, NB_FMT_FP8_TENSOR, NB_FMT_NVFP4};
        for (int k = 0; k < 6; k++) {
            nb_qparams p;
            nb_qparams_init(&p, fs[k]);
            p.name = "w_proj.weight";
            if (k == 2 || k == 4) p.amax = 11.0f;          /* calibrated: one pass */
            if (k == 3) p.block_amax = bam;                 /* static four_over_six: one pass */
            nb_qtensor *q = NULL, *q2 = NULL;
            CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
            CHECK_OK(ctx, nb_qtensor_new(ctx, fs[k], 2, shape, &q2));
            CHECK_OK(ctx, nb_quantize_into(ctx, x, &p, q2));
            if (q && q2) {
                CHECK_SAME("into", nb_tensor_data(q->data), nb_tensor_data(q2->data), nb_tensor_nbytes(q->data), "format %d", k);
                CHECK_SAME("into", nb_tensor_data(q->scale), nb_tensor_data(q2->scale), nb_tensor_nbytes(q->scale), "format %d", k);
            }
            /* NaN in row 6 (flat 6*64+5 = 389), then -Inf earlier in row 2 (flat 133): the first is named */
            nb_store_elem(nb_tensor_data(x), dts[d], 389, NAN);
            nb_qtensor *qn = NULL;
            CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &qn), NB_ERR_NUMERIC, "w_proj.weight: NaN at flat index 389 (element [6, 5])");
            CHECK(qn == NULL);
            nb_store_elem(nb_tensor_data(x), dts[d], 133, -INFINITY);
            CHECK_FAIL(ctx, nb_quantize_into(ctx, x, &p, q), NB_ERR_NUMERIC, "w_proj.weight: -Inf at flat index 133 (element [2, 5])");
            nb_store_elem(nb_tensor_data(x), dts[d], 389, 1.0);
            nb_store_elem(nb_tensor_data(x), dts[d], 133, 1.0);
            nb_qtensor_release(q);
            nb_qtensor_release(q2);
        }
        /* FP8 per channel: an all-zero row gets scale 1 and zero codes (a NaN elsewhere is still reported) */
        for (int64_t i = 4 * 64; i < 5 * 64; i++) nb_store_elem(nb_tensor_data(x), dts[d], i, 0.0);
        nb_qparams p;
        nb_qparams_init(&p, NB_FMT_FP8_CHANNEL);
        p.name = "w_proj.weight";
        nb_qtensor *q = NULL;
        CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
        CHECK(q && ((const float *)nb_tensor_data(q->scale))[4] == 1.0f && ((const uint8_t *)nb_tensor_data(q->data))[4 * 64] == 0);
        nb_qtensor_release(q);
        q = NULL;
        nb_store_elem(nb_tensor_data(x), dts[d], 8 * 64 + 1, NAN);
        CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_NUMERIC, "w_proj.weight: NaN at flat index 513 (element [8, 1])");
        /* a bad calibrated state with a NaN in x: the NaN is reported first, as before */
        nb_qparams_init(&p, NB_FMT_NVFP4);
        p.name = "w_proj.weight";
        p.amax = 0.0f;
        CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_NUMERIC, "w_proj.weight: NaN at flat index 513");
        nb_store_elem(nb_tensor_data(x), dts[d], 8 * 64 + 1, 1.0);
        CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));   /* amax 0 -> 6 (ModelOpt's sanitize): s2 = 6/2688 */
        CHECK(q && *(const float *)nb_tensor_data(q->scale2) == 6.0f / 2688.0f);
        nb_qtensor_release(q);
        q = NULL;
        /* nb_quantize_into: wrong format, wrong shape */
        nb_qparams_init(&p, NB_FMT_MXFP8);
        nb_qtensor *qo = NULL;
        CHECK_OK(ctx, nb_qtensor_new(ctx, NB_FMT_FP8_TENSOR, 2, shape, &qo));
        CHECK_FAIL(ctx, nb_quantize_into(ctx, x, &p, qo), NB_ERR_INVALID, "quantized output is fp8, the parameters ask for mxfp8");
        nb_qtensor_release(qo);
        const int64_t other[2] = {9, 96};
        CHECK_OK(ctx, nb_qtensor_new(ctx, NB_FMT_MXFP8, 2, other, &qo));
        CHECK_FAIL(ctx, nb_quantize_into(ctx, x, &p, qo), NB_ERR_SHAPE, "shape differs");
        nb_qtensor_release(qo);
        nb_tensor_release(x);
        nb_tensor_release(bam);
    }
}

/* nb_quantize / nb_fake_quant / nb_qtensor_dequantize with `path` installed vs the references. */
static void test_drivers(nb_ctx *ctx, const char *path) {
    static const nb_dtype dts[3] = {NB_F32, NB_BF16, NB_F16};
    static const int64_t shapes[2][2] = {{37, 2048}, {7, 352}};   /* odd row counts; rows that are not whole kernel groups */
    for (int si = 0; si < 2; si++)
    for (int f = NB_FMT_NVFP4; f < NB_FMT_COUNT; f++) {
        const int64_t *shape = shapes[si];
        for (int d = 0; d < 3; d++) {
            nb_tensor *x = NULL, *ya = NULL, *yr = NULL;
            CHECK_OK(ctx, nb_tensor_new(ctx, dts[d], 2, shape, &x));
            CHECK_OK(ctx, nb_tensor_new(ctx, dts[d], 2, shape, &ya));
            CHECK_OK(ctx, nb_tensor_new(ctx, dts[d], 2, shape, &yr));
            if (!x || !ya || !yr) return;
            float *tmp = malloc((size_t)shape[1] * 4);
            for (int64_t r = 0; r < shape[0]; r++) {
                gen_row(tmp, shape[1], 16, r % 3 == 0 ? -1 : 0, (int)r - 18);
                for (int64_t i = 0; i < shape[1]; i++) if (!isfinite(tmp[i]) || fabsf(tmp[i]) > 60000.0f) tmp[i] = 1.0f;
                if (r == 5) for (int64_t i = 0; i < shape[1]; i++) tmp[i] = i % 64 ? 0.0f : 1.0f;
                nbq_fast_store_f32((char *)nb_tensor_data(x) + r * shape[1] * (dts[d] == NB_F32 ? 4 : 2), dts[d], shape[1], tmp);
            }
            free(tmp);
            nb_qparams p;
            nb_qparams_init(&p, (nb_qformat)f);
            const char *fname = nb_qformat_info((nb_qformat)f)->name;
            char what[64];
            snprintf(what, sizeof what, "driver, %s input", nb_dtype_info(dts[d])->name);
            check_quantize_path(ctx, x, &p, path, 1, fname, what);
            CHECK_OK(ctx, nb_fake_quant(ctx, x, &p, ya));
            CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "reference"));
            CHECK_OK(ctx, nb_fake_quant(ctx, x, &p, yr));
            CHECK_SAME(fname, nb_tensor_data(ya), nb_tensor_data(yr), nb_tensor_nbytes(ya), "driver fake quant, %s, %s",
                       nb_dtype_info(dts[d])->name, path);
            nb_tensor_release(x); nb_tensor_release(ya); nb_tensor_release(yr);
        }
    }
}

/* The dispatcher's choice at load and nb_quant_set_cpu_path's names. Returns whether the CPU has AVX2
 * (else only the portable pieces can run). */
static int test_path_choice(nb_ctx *ctx) {
    const char *path = nb_quant_cpu_path(ctx);
    printf("quantizer CPU path chosen at the context's creation: %s (CPU has AVX2+FMA+F16C: %s)\n", path, nbq_cpu_has_avx2() ? "yes" : "no");
    if (!nbq_cpu_has_avx2()) {
        CHECK(strcmp(path, "reference") == 0 || getenv("NIBBLE_QUANT_PATH"));
        CHECK_FAIL(ctx, nb_quant_set_cpu_path(ctx, "avx2"), NB_ERR_UNSUPPORTED, "lacks AVX2");
        return 0;
    }
    const char *best = nbq_cpu_has_avx512() ? "avx512" : "avx2";
    if (!getenv("NIBBLE_QUANT_PATH")) CHECK(strcmp(path, best) == 0);
    CHECK_FAIL(ctx, nb_quant_set_cpu_path(ctx, "sse9"), NB_ERR_INVALID, "expected auto, avx512, avx2 or reference");
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "reference"));
    CHECK(strcmp(nb_quant_cpu_path(ctx), "reference") == 0);
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "avx2"));
    CHECK(strcmp(nb_quant_cpu_path(ctx), "avx2") == 0);
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
    CHECK(strcmp(nb_quant_cpu_path(ctx), best) == 0);
    if (!nbq_cpu_has_avx512())
        CHECK_FAIL(ctx, nb_quant_set_cpu_path(ctx, "avx512"), NB_ERR_UNSUPPORTED, "lacks AVX-512");
    return 1;
}

/* The drivers end to end on every path the CPU has (the "avx2" test_drivers runs first, in main). */
static void test_driver_paths(nb_ctx *ctx) {
    if (HAVE512) test_drivers(ctx, "avx512");
    else printf("no AVX-512 F/BW/VL/DQ on this CPU: only the AVX2 BF16 table kernel was run\n");
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
    test_fused_driver(ctx);
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "avx2"));
    test_fused_driver(ctx);
    test_channel_next_rows(ctx, "avx2");
    if (HAVE512) test_channel_next_rows(ctx, "avx512");
    test_fp8_mx_driver(ctx, "avx2");
    if (HAVE512) test_fp8_mx_driver(ctx, "avx512");
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "reference"));
    test_fused_driver(ctx);
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
}

int main(void) {
    nb_ctx *ctx = NULL;
    CHECK_OK(ctx, nb_ctx_new(2, &ctx));
    nb_rng_seed(&nbt_rng, 0x5eedf00dULL);
    if (!test_path_choice(ctx)) {
        test_mx_scale();
        return nbt_done("test_quant_fast (no AVX2 on this CPU: only the portable pieces ran)");
    }
    test_elements();
    test_mx_scale();
    test_nvfp4_rows();
    test_mxfp8_rows();
    test_fp8_rows();
    test_drivers(ctx, "avx2");
    HAVE512 = nbq_cpu_has_avx512();
    test_driver_paths(ctx);
    printf("rows compared bit for bit (quantize, fake, dequantize): %lld\n", (long long)n_rows_checked);
    nb_ctx_release(ctx);
    return nbt_done("test_quant_fast");
}

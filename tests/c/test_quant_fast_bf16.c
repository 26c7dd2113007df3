/* The BF16-input kernels against the scalar references, bit for bit: the AVX-512 ones (with AVX-512), the AVX2 NVFP4
 * threshold table and the AVX2 MXFP8 / FP8 ones on random rows, every bf16 pattern, their edges and row tails, with
 * guard bytes. Split from test_quant_fast.c, whose generators and checks they share (quant_fast_common.h). */
#include "quant_fast_common.h"

/* ---- BF16-input kernels: AVX-512 (when the CPU has it) and the AVX2 NVFP4 threshold table ------- */

/* h/x = the 4096 bf16 patterns base .. base + 4095, Inf/NaN patterns replaced by a signed zero. */
static void bf16_patterns(uint32_t base, uint16_t *h, float *x) {
    for (int64_t i = 0; i < 4096; i++) {
        uint16_t v = (uint16_t)(base + (uint32_t)i);
        h[i] = (v & 0x7F80) == 0x7F80 ? (uint16_t)(v & 0x8000) : v;
        x[i] = nb_bf16_to_f32(h[i]);
    }
}

static int64_t n_avx2_bf16_rows = 0, n_mx512_rows = 0;   /* n_bf16_rows, n_avx2_tab_rows: quant_fast_common.h */

/* Whether nbq_avx2_quantize_bf16 takes these arguments (else it must answer 1: the f32 row). */
static int avx2_bf16_handles(nb_qformat f, const nb_qrow_args *a) {
    if (f == NB_FMT_MXFP8) return 1;
    if (f != NB_FMT_FP8_TENSOR && f != NB_FMT_FP8_CHANNEL) return 0;
    return (a->div_dtype == NB_F32 || a->div_dtype == NB_BF16) && a->scale >= 0x1p-100f && a->scale <= 0x1p100f;
}

/* nbq_avx512_quantize_bf16 (with AVX-512) and, for MXFP8 / FP8, nbq_avx2_quantize_bf16 (every AVX2
 * CPU) against the reference row on the same values. */
static void compare_bf16(nb_qformat f, nb_qrow_quantize_fn ref, const float *x, const uint16_t *h, int64_t n,
                         const nb_qrow_args *a, const char *mode) {
    const nb_qformat_traits *tr = nb_qformat_info(f);
    int64_t qb = nbq_is_nvfp4(f) ? n / 2 : n, sbn = tr->block_size ? n / tr->block_size : 0;
    uint8_t *q0 = calloc((size_t)qb + 1, 1), *q1 = malloc((size_t)(qb + GUARD));
    uint8_t *s0 = calloc((size_t)sbn + 1, 1), *s1 = malloc((size_t)(sbn + GUARD));
    ref(x, n, a, q0, s0);
    prefill_out(q1, qb, s1, sbn);
    int st512 = HAVE512 ? nbq_avx512_quantize_bf16(f, h, n, a, q1, s1) : -1;
    if (HAVE512 && f == NB_FMT_MXFP8) CHECK_EQ_INT(st512, 0);   /* every finite MXFP8 row is the kernel's */
    if (st512 == 0) {
        check_bf16_out(tr->name, "avx512 bf16", q0, q1, qb, s0, s1, sbn, mode, n, a->scale);
        n_bf16_rows++;
        if (f == NB_FMT_MXFP8) n_mx512_rows++;
    }
    if (f == NB_FMT_MXFP8 || f == NB_FMT_FP8_TENSOR || f == NB_FMT_FP8_CHANNEL) {
        prefill_out(q1, qb, s1, sbn);
        int want = avx2_bf16_handles(f, a) ? 0 : 1, st = nbq_avx2_quantize_bf16(f, h, n, a, q1, s1);
        CHECK_EQ_INT(st, want);
        if (st == 0) {
            check_bf16_out(tr->name, "avx2 bf16", q0, q1, qb, s0, s1, sbn, mode, n, a->scale);
            n_avx2_bf16_rows++;
        }
        if (f != NB_FMT_MXFP8) {   /* the per-channel entry, with and without a next row */
            uint32_t nm = 0xDEAD;
            prefill_out(q1, qb, s1, sbn);
            CHECK_EQ_INT(nbq_avx2_fp8_row_next_bf16(h, n, a, q1, h, &nm), want);
            uint32_t want_nm = 0;
            for (int64_t i = 0; i < n; i++) want_nm = (uint32_t)(h[i] & 0x7FFF) > want_nm ? (uint32_t)(h[i] & 0x7FFF) : want_nm;
            CHECK_EQ_INT(nm, want_nm);
            if (want == 0) check_bf16_out(tr->name, "avx2 bf16 next-row entry", q0, q1, qb, NULL, NULL, 0, mode, n, a->scale);
        }
    }
    free(q0); free(q1); free(s0); free(s1);
}

static void test_bf16_kernels(void) {
    static const int64_t lens[] = {32, 96, 256, 288, 512, 544, 1024, 4096, 4128, 8192};
    float *x = malloc(8192 * 4), *bam = malloc(8192 / 16 * 4);
    uint16_t *h = malloc(8192 * 2);
    nb_qrow_args a;
    for (int trial = 0; trial < 1600; trial++) {
        int64_t n = lens[trial % 10];
        int kind = trial_kind(trial, 10);
        int t = (int)(nbt_rnd32() % 40) - 20;
        /* NVFP4: the driver's s2, a power of two (E2M1 ties land exactly), arbitrary */
        bf16_row(x, h, n, 16, kind, t);
        memset(&a, 0, sizeof a);
        a.div_dtype = NB_F32;
        float amax = row_absmax(x, n);
        int mode = trial % 4;
        a.global_amax = amax > 0.0f ? amax : 1.0f;
        a.scale = mode == 0 ? nb_nvfp4_scale2(a.global_amax, 448.0f) : mode == 1 ? ldexpf(1.0f, t)
                : mode == 2 ? (float)(nbt_unif() * 3.0) + 1e-6f : (trial & 8) ? 0.0f : nbt_u2f(nbt_rnd32() & 0x007FFFFFu);   /* NaN/Inf scales */
        compare_bf16(NB_FMT_NVFP4, nb_nvfp4_quantize_row_ref, x, h, n, &a, "nvfp4 dynamic");
        compare_nv_table(NB_FMT_NVFP4, nb_nvfp4_quantize_row_ref, x, h, n, &a, "nvfp4 dynamic");
        for (int64_t b = 0; b < n / 16; b++) {
            float m = row_absmax(x + b * 16, 16);
            int r = (int)(nbt_rnd32() % 4);
            bam[b] = r == 0 ? m : r == 1 ? m * 1.5f : r == 2 ? 0.0f : (float)(nbt_unif() * 4.0);
        }
        a.block_amax = bam;
        a.global_amax = row_absmax(bam, n / 16);
        if (a.global_amax == 0.0f) a.global_amax = 1.0f;
        a.scale = nb_nvfp4_scale2(a.global_amax, 448.0f);
        compare_bf16(NB_FMT_NVFP4, nb_nvfp4_quantize_row_ref, x, h, n, &a, "nvfp4 static");
        compare_nv_table(NB_FMT_NVFP4, nb_nvfp4_quantize_row_ref, x, h, n, &a, "nvfp4 static");
        a.scale = nb_nvfp4_scale2(a.global_amax, 256.0f);
        compare_bf16(NB_FMT_NVFP4_46, nb_nvfp4_46_quantize_row_ref, x, h, n, &a, "nvfp4_46 static");
        compare_nv_table(NB_FMT_NVFP4_46, nb_nvfp4_46_quantize_row_ref, x, h, n, &a, "nvfp4_46 static");
        /* MXFP8, both exponent rules */
        bf16_row(x, h, n, 32, kind, t);
        memset(&a, 0, sizeof a);
        a.mx_floor = trial & 1;
        compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, n, &a, a.mx_floor ? "mxfp8 floor" : "mxfp8 ceil");
        /* FP8: amax/448 (exact E4M3 and bf16 ties when x are grid values), powers of two, arbitrary */
        int64_t nf = n - (trial % 7);   /* lengths that are not whole 32-element steps */
        bf16_row(x, h, nf, 1, kind, t);
        memset(&a, 0, sizeof a);
        amax = row_absmax(x, nf);
        mode = trial % 4;
        a.scale = mode == 0 ? amax / 448.0f : mode == 1 ? ldexpf(1.0f, (int)(nbt_rnd32() % 40) - 20)
                : mode == 2 ? amax / 448.0f * 0.001f : (float)(nbt_unif() * 2.0) + 1e-30f;
        if (a.scale == 0.0f) a.scale = 1.0f;
        a.global_amax = amax;
        a.div_dtype = (trial / 4) % 2 ? NB_BF16 : NB_F32;
        compare_bf16(a.div_dtype == NB_BF16 ? NB_FMT_FP8_TENSOR : NB_FMT_FP8_CHANNEL, nb_fp8_quantize_row_ref, x, h, nf, &a,
                     a.div_dtype == NB_BF16 ? "fp8 bf16 div" : "fp8 f32 div");
    }
    /* every bf16 pattern below the max through FP8 and MXFP8 (one row per 4096 patterns) */
    for (uint32_t base = 0; base < 0x10000; base += 4096) {
        bf16_patterns(base, h, x);
        memset(&a, 0, sizeof a);
        float amax = row_absmax(x, 4096);
        static const float scs[3] = {1.0f, 0.3f, 7.1e-3f};
        for (int k = 0; k < 3; k++) {
            a.scale = k == 0 ? amax / 448.0f : scs[k];
            a.global_amax = amax;
            a.div_dtype = NB_BF16;
            compare_bf16(NB_FMT_FP8_TENSOR, nb_fp8_quantize_row_ref, x, h, 4096, &a, "fp8 bf16 div, all patterns");
            a.div_dtype = NB_F32;
            compare_bf16(NB_FMT_FP8_CHANNEL, nb_fp8_quantize_row_ref, x, h, 4096, &a, "fp8 f32 div, all patterns");
        }
        for (a.mx_floor = 0; a.mx_floor < 2; a.mx_floor++)
            compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, 4096, &a, a.mx_floor ? "mxfp8 floor, all patterns" : "mxfp8 ceil, all patterns");
        a.mx_floor = 0;
        a.global_amax = amax;
        a.scale = nb_nvfp4_scale2(amax, 448.0f);
        compare_bf16(NB_FMT_NVFP4, nb_nvfp4_quantize_row_ref, x, h, 4096, &a, "nvfp4, all patterns");
        compare_nv_table(NB_FMT_NVFP4, nb_nvfp4_quantize_row_ref, x, h, 4096, &a, "nvfp4, all patterns");
    }
    /* arguments the kernels leave to the f32 rows */
    memset(&a, 0, sizeof a);
    a.scale = 1.0f;
    a.div_dtype = NB_F16;
    uint8_t q[64], sc[4];
    if (HAVE512) CHECK_EQ_INT(nbq_avx512_quantize_bf16(NB_FMT_FP8_TENSOR, h, 32, &a, q, sc), 1);
    CHECK_EQ_INT(nbq_avx2_quantize_bf16(NB_FMT_FP8_TENSOR, h, 32, &a, q, sc), 1);
    {
        uint32_t nm = 0;
        CHECK_EQ_INT(nbq_avx2_fp8_row_next_bf16(h, 32, &a, q, h + 32, &nm), 1);   /* the next row's max all the same */
        uint32_t want = 0;
        for (int i = 32; i < 64; i++) want = (uint32_t)(h[i] & 0x7FFF) > want ? (uint32_t)(h[i] & 0x7FFF) : want;
        CHECK_EQ_INT(nm, want);
    }
    a.div_dtype = NB_BF16;
    a.scale = 0x1p-110f;
    if (HAVE512) CHECK_EQ_INT(nbq_avx512_quantize_bf16(NB_FMT_FP8_TENSOR, h, 32, &a, q, sc), 1);
    CHECK_EQ_INT(nbq_avx2_quantize_bf16(NB_FMT_FP8_CHANNEL, h, 32, &a, q, sc), 1);
    a.scale = 0x1.8p100f;
    CHECK_EQ_INT(nbq_avx2_quantize_bf16(NB_FMT_FP8_TENSOR, h, 32, &a, q, sc), 1);
    a.scale = 1.0f;
    CHECK_EQ_INT(nbq_avx2_quantize_bf16(NB_FMT_NVFP4, h, 32, &a, q, sc), 1);   /* NVFP4 has its own AVX2 kernel */
    a.scale = 1.0f;
    a.global_amax = 1.0f;
    if (HAVE512) CHECK_EQ_INT(nbq_avx512_quantize_bf16(NB_FMT_NVFP4_46, h, 32, &a, q, sc), 1);
    nbq_nv_table_build(a.scale, &NVTAB);
    CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(NB_FMT_NVFP4_46, h, 32, &a, &NVTAB, q, sc), 1);   /* the pick, s2 not G/1536 */
    CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(NB_FMT_MXFP8, h, 32, &a, &NVTAB, q, sc), 1);
    CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(NB_FMT_NVFP4, h, 32, &a, NULL, q, sc), 1);
    /* NVFP4's division without dividing: every block with the same amax (so one divisor p per row),
     * its other 15 elements sweeping every bf16 magnitude up to it, both signs; 60 divisors */
    {
        const int64_t nb = 4096, len = nb * 16;
        float *xf = malloc((size_t)len * 4);
        uint16_t *xh = malloc((size_t)len * 2);
        uint8_t *q0 = malloc((size_t)len / 2), *q1 = malloc((size_t)len / 2), *s0 = malloc((size_t)nb), *s1 = malloc((size_t)nb);
        for (int trial = 0; trial < 60; trial++) {
            uint16_t top = (uint16_t)(0x2000 + nbt_rnd32() % 0x3F00);   /* amax from ~1e-19 to ~1e19 */
            uint32_t k = nbt_rnd32();
            for (int64_t b = 0; b < nb; b++)
                for (int i = 0; i < 16; i++) {
                    uint16_t m = i == 0 ? top : (uint16_t)(k++ % ((uint32_t)top + 1));
                    xh[b * 16 + i] = (uint16_t)(m | ((nbt_rnd32() & 1) ? 0x8000 : 0));
                    xf[b * 16 + i] = nb_bf16_to_f32(xh[b * 16 + i]);
                }
            memset(&a, 0, sizeof a);
            float am = nb_bf16_to_f32(top);
            a.global_amax = trial % 3 == 0 ? am : am * (float)(1.0 + nbt_unif() * 300.0);
            a.scale = nb_nvfp4_scale2(a.global_amax, 448.0f);
            nb_nvfp4_quantize_row_ref(xf, len, &a, q0, s0);
            nbq_nv_table_build(a.scale, &NVTAB);
            if (HAVE512) {
                CHECK_EQ_INT(nbq_avx512_quantize_bf16(NB_FMT_NVFP4, xh, len, &a, q1, s1), 0);
                CHECK_SAME("nvfp4", q0, q1, len / 2, "one divisor, every magnitude: amax %a s2 %a", (double)am, (double)a.scale);
                CHECK_SAME("nvfp4", s0, s1, nb, "one divisor, every magnitude (scales)");
                memset(q1, 0, (size_t)len / 2);
                CHECK_EQ_INT(nbq_avx512_nvfp4_table_bf16(NB_FMT_NVFP4, xh, len, &a, &NVTAB, q1, s1), 0);
                CHECK_SAME("nvfp4 table", q0, q1, len / 2, "one divisor, every magnitude: amax %a s2 %a", (double)am, (double)a.scale);
            }
            memset(q1, 0, (size_t)len / 2);
            memset(s1, 0, (size_t)nb);
            CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(NB_FMT_NVFP4, xh, len, &a, &NVTAB, q1, s1), 0);
            CHECK_SAME("nvfp4 table avx2", q0, q1, len / 2, "one divisor, every magnitude: amax %a s2 %a", (double)am, (double)a.scale);
            CHECK_SAME("nvfp4 table avx2", s0, s1, nb, "one divisor, every magnitude (scales)");
        }
        free(xf); free(xh); free(q0); free(q1); free(s0); free(s1);
    }
    /* FP8 (the per-row E4M3 table, the arithmetic it is built from): every bf16 pattern against 40
     * divisors from 2^-90 to 2^90, both division dtypes */
    for (int trial = 0; trial < 40; trial++) {
        float dv = ldexpf((float)(1.0 + nbt_unif()), (int)(nbt_rnd32() % 181) - 90);
        if (trial == 0) dv = 1.0f;
        for (uint32_t base = 0; base < 0x10000; base += 4096) {
            bf16_patterns(base, h, x);
            memset(&a, 0, sizeof a);
            a.scale = dv;
            a.div_dtype = trial & 1 ? NB_BF16 : NB_F32;
            compare_bf16(NB_FMT_FP8_TENSOR, nb_fp8_quantize_row_ref, x, h, 4096, &a, "fp8, every pattern, 40 divisors");
        }
    }
    /* a NaN or Inf anywhere in the row (groups and tails) is reported: 2 */
    static const nb_qformat kf[4] = {NB_FMT_NVFP4, NB_FMT_NVFP4_46, NB_FMT_MXFP8, NB_FMT_FP8_TENSOR};
    static const uint16_t bad[3] = {0x7FC0, 0x7F80, 0xFF80};
    uint8_t *qq = malloc(4128), *ss = malloc(4128 / 16);
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 3; b++)
            for (int pos = 0; pos < 3; pos++) {
                int64_t len = 4128, at = pos == 0 ? 5 : pos == 1 ? 3000 : 4127;   /* last: in the tail past 4096 */
                for (int64_t i = 0; i < len; i++) h[i] = nb_f32_to_bf16((float)nb_rng_normal(&nbt_rng));
                h[at] = bad[b];
                memset(&a, 0, sizeof a);
                a.scale = 0.01f;
                a.global_amax = 4.0f;
                a.div_dtype = NB_BF16;
                for (int64_t i = 0; i < len / 16; i++) bam[i] = 1.0f;
                if (kf[k] == NB_FMT_NVFP4_46) a.block_amax = bam;   /* static: no block maxima from the data */
                if (HAVE512) CHECK_EQ_INT(nbq_avx512_quantize_bf16(kf[k], h, len, &a, qq, ss), 2);
                if (!nbq_is_nvfp4(kf[k])) continue;
                /* the AVX2 table kernel: dynamic (maxima from the data) and static (from bam) */
                a.scale = nb_nvfp4_scale2(a.global_amax, kf[k] == NB_FMT_NVFP4 ? 448.0f : 256.0f);
                nbq_nv_table_build(a.scale, &NVTAB);
                CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(kf[k], h, len, &a, &NVTAB, qq, ss), 2);
                a.block_amax = bam;
                CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(kf[k], h, len, &a, &NVTAB, qq, ss), 2);
                h[at] = 0x3F80;   /* and without it: 0 */
                CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(kf[k], h, len, &a, &NVTAB, qq, ss), 0);
                if (kf[k] == NB_FMT_NVFP4) {
                    a.block_amax = NULL;
                    CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(kf[k], h, len, &a, &NVTAB, qq, ss), 0);
                }
            }
    free(qq);
    free(ss);
    if (HAVE512) printf("avx512 bf16 rows compared bit for bit: %lld\n", (long long)n_bf16_rows);
    printf("avx2 mxfp8/fp8 bf16 rows compared bit for bit: %lld\n", (long long)n_avx2_bf16_rows);
    printf("avx2 nvfp4 table rows compared bit for bit: %lld\n", (long long)n_avx2_tab_rows);
    free(x); free(bam); free(h);
}

/* ---- the AVX2 MXFP8 / FP8 BF16 kernels: edges the random rows rarely reach ----------------------- */
/* (compare_bf16 runs the AVX-512 kernel on every one of these rows too, and requires MXFP8 to take them) */

/* A random bf16 of magnitude at most mag (a pattern), random sign. */
static uint16_t bf16_below(uint32_t mag) {
    return (uint16_t)((nbt_rnd32() % (mag + 1)) | ((nbt_rnd32() & 1) ? 0x8000u : 0u));
}

/* An element whose quotient by sc is in 2^-12 .. 2^-5 (E4M3 subnormals and their neighbours: the
 * FP8 kernels' reference lanes), random sign. */
static float fp8_slow_value(float sc) {
    return sc * ldexpf((float)(1.0 + nbt_unif()), -12 + (int)(nbt_rnd32() % 7)) * ((nbt_rnd32() & 1) ? -1.0f : 1.0f);
}

/* A 32-element MXFP8 block with amax 448 * 2^t (random t: code t + 127 under both rules, at lane
 * r + 5) whose lanes r and r + 13 scale to 2^-12 .. 2^-5 (the MXFP8 kernels' reference lanes). */
static void mx_slow_block(uint16_t *hb, int r) {
    int t = (int)(nbt_rnd32() % 60) - 30;
    for (int i = 0; i < 32; i++) {
        float v = ldexpf((float)nb_rng_normal(&nbt_rng), t + 6);
        if (i == r || i == (r + 13) % 32) v = ldexpf((float)(1.0 + nbt_unif()), t - 12 + (int)(nbt_rnd32() % 7));
        if (fabsf(v) > ldexpf(448.0f, t)) v = 0.0f;
        hb[i] = (uint16_t)(nb_f32_to_bf16(v) | ((nbt_rnd32() & 1) ? 0x8000u : 0u));
    }
    hb[(r + 5) % 32] = nb_f32_to_bf16(ldexpf(448.0f, t));
}

static void test_avx2_bf16_kernels(void) {
    const int64_t cap = 8192;
    float *x = malloc((size_t)cap * 4);
    uint16_t *h = malloc((size_t)cap * 2), *h2 = malloc((size_t)cap * 2);
    uint8_t *q = malloc((size_t)cap), *s = malloc((size_t)cap / 32 + 1);
    nb_qrow_args a;
    int64_t rows0 = n_avx2_bf16_rows;
    /* the FP8 table splits into the two VPSHUFB tables for every divisor (fast_avx2.c proves it; all
     * 2^23 mantissas were checked by hand): a sample of divisors across [2^-100, 2^100], both dtypes */
    int split_bad = 0;
    for (int i = 0; i < (1 << 14); i++) {
        uint32_t u = (uint32_t)(27 + nbt_rnd32() % 200) << 23 | (nbt_rnd32() & 0x7FFFFFu);
        if (i < 4) u = i == 0 ? 0x3F800000u : i == 1 ? 0x3F7FFFFFu : i == 2 ? 0x0D800000u : 0x71800000u;   /* 1, 1-ulp, 2^-100, 2^100 */
        for (int dd = 0; dd < 2; dd++) split_bad += !nbq_avx2_fp8_table_ok(nbt_u2f(u), dd ? NB_BF16 : NB_F32);
    }
    CHECK_EQ_INT(split_bad, 0);
    CHECK_EQ_INT(nbq_avx2_fp8_table_ok(0x1p-101f, NB_F32), 0);   /* outside the kernel's range: f32 rows */
    CHECK_EQ_INT(nbq_avx2_fp8_table_ok(1.0f, NB_F16), 0);
    /* every bf16 pattern against 24 divisors (exact powers of two, mantissa extremes, 448 = 1.75 * 2^8,
     * the range ends, random), both division dtypes, per tensor and per channel (and the next-row entry) */
    static const uint32_t fixed[] = {0x3F800000u, 0x3F7FFFFFu, 0x3FC00000u, 0x3FE00000u, 0x0D800000u, 0x71800000u, 0x3A800001u};
    for (int t = 0; t < 24; t++) {
        float dv = t < 7 ? nbt_u2f(fixed[t]) : ldexpf((float)(1.0 + nbt_unif()), (int)(nbt_rnd32() % 181) - 90);
        for (int dd = 0; dd < 2; dd++)
            for (uint32_t base = 0; base < 0x10000; base += 4096) {
                bf16_patterns(base, h, x);
                memset(&a, 0, sizeof a);
                a.scale = dv;
                a.div_dtype = dd ? NB_BF16 : NB_F32;
                compare_bf16((t + dd + (int)(base >> 12)) & 1 ? NB_FMT_FP8_CHANNEL : NB_FMT_FP8_TENSOR, nb_fp8_quantize_row_ref,
                             x, h, 4096, &a, dd ? "fp8 bf16 div, every pattern, 24 divisors" : "fp8 f32 div, every pattern, 24 divisors");
            }
    }
    /* MXFP8 scale bytes: a block for every finite bf16 block max P (the closed form of the E8M0 byte),
     * its other elements below it, both rules; 128 blocks per row */
    for (int fl = 0; fl < 2; fl++)
        for (uint32_t p0 = 0; p0 < 0x7F80; p0 += 128) {
            for (int k = 0; k < 128; k++) {
                uint32_t P = p0 + (uint32_t)k;
                for (int i = 0; i < 32; i++) h[k * 32 + i] = bf16_below(P);
                h[k * 32 + (k * 7) % 32] = (uint16_t)(P | ((nbt_rnd32() & 1) ? 0x8000u : 0u));
            }
            bf16_to_f32_row(h, 4096, x);
            memset(&a, 0, sizeof a);
            a.mx_floor = fl;
            compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, 4096, &a, fl ? "mxfp8 floor, every block max" : "mxfp8 ceil, every block max");
        }
    /* lanes for the reference (E4M3-subnormal results and their neighbours) at every position of a
     * 64-element iteration, so in both halves of each packed pair; rows with a lone 32-element step and
     * a scalar tail (FP8) or tail blocks (MXFP8) */
    static const float fscales[3] = {0.02f / 448.0f, 1.0f, 3.7e-3f};
    for (int si = 0; si < 3; si++)
        for (int r = 0; r < 64; r++) {
            const int64_t n = 4096 + 32 + 7;
            float sc = fscales[si];
            for (int64_t i = 0; i < n; i++) {
                float v = (float)nb_rng_normal(&nbt_rng) * sc * 100.0f;
                if (i % 64 == r || i % 64 == (r + 37) % 64) v = fp8_slow_value(sc);
                h[i] = nb_f32_to_bf16(v);
            }
            bf16_to_f32_row(h, n, x);
            memset(&a, 0, sizeof a);
            a.scale = sc;
            for (int dd = 0; dd < 2; dd++) {
                a.div_dtype = dd ? NB_BF16 : NB_F32;
                compare_bf16(dd ? NB_FMT_FP8_TENSOR : NB_FMT_FP8_CHANNEL, nb_fp8_quantize_row_ref, x, h, n, &a, "fp8, slow lanes at every position");
            }
        }
    for (int r = 0; r < 32; r++) {
        const int64_t n = 4096 + 3 * 32;   /* 16 groups of 8 blocks, 3 tail blocks */
        for (int64_t b = 0; b < n / 32; b++) mx_slow_block(h + b * 32, r);
        bf16_to_f32_row(h, n, x);
        memset(&a, 0, sizeof a);
        for (a.mx_floor = 0; a.mx_floor < 2; a.mx_floor++)
            compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, n, &a, "mxfp8, slow lanes at every position");
    }
    /* zero rows (+0 and -0), and rows of bf16 subnormals only */
    for (int k = 0; k < 4; k++) {
        const int64_t n = 4096 + 32;
        for (int64_t i = 0; i < n; i++)
            h[i] = k < 2 ? (uint16_t)(((i ^ k) & 1) ? 0x8000 : 0) : bf16_below(0x7F);
        bf16_to_f32_row(h, n, x);
        memset(&a, 0, sizeof a);
        a.mx_floor = k & 1;
        compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, n, &a, k < 2 ? "mxfp8 zero row" : "mxfp8 subnormal row");
        a.scale = k < 2 ? 1.0f : 0x1p-100f;
        a.div_dtype = k & 1 ? NB_BF16 : NB_F32;
        compare_bf16(NB_FMT_FP8_TENSOR, nb_fp8_quantize_row_ref, x, h, n - 3, &a, k < 2 ? "fp8 zero row" : "fp8 subnormal row");
    }
    /* a NaN or Inf anywhere (both pairs of an iteration, a lone step, the scalar tail, MXFP8's tail
     * blocks) is reported: 2; the next-row entry reports the next row's too, through *next_max */
    /* (each block of an AVX-512 MXFP8 group of 8: 0, 32, 64, 100, 133, 191, 208, 225; 4096..4127: its tail block) */
    static const int64_t at[] = {0, 1, 15, 16, 31, 32, 47, 63, 64, 100, 133, 191, 208, 225, 2047, 4095, 4096, 4111, 4127, 4130};
    static const uint16_t badv[4] = {0x7FC0, 0x7F80, 0xFF80, 0xFFC1};
    int reported = 0, checked = 0;
    for (int b = 0; b < 4; b++)
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            const int64_t nf = 4131, nm = 4128;
            for (int64_t i = 0; i < nf; i++) h[i] = h2[i] = nb_f32_to_bf16((float)nb_rng_normal(&nbt_rng));
            h[at[k]] = badv[b];
            memset(&a, 0, sizeof a);
            a.scale = 0.01f;
            for (int dd = 0; dd < 2; dd++) {
                a.div_dtype = dd ? NB_BF16 : NB_F32;
                reported += nbq_avx2_quantize_bf16(dd ? NB_FMT_FP8_TENSOR : NB_FMT_FP8_CHANNEL, h, nf, &a, q, NULL) == 2;
                uint32_t nmx = 0;
                reported += nbq_avx2_fp8_row_next_bf16(h, nf, &a, q, h2, &nmx) == 2;
                reported += nbq_avx2_fp8_row_next_bf16(h2, nf, &a, q, h, &nmx) == 0 && nmx >= 0x7F80u;
                checked += 3;
            }
            if (at[k] < nm)
                for (a.mx_floor = 0; a.mx_floor < 2; a.mx_floor++) {
                    reported += nbq_avx2_quantize_bf16(NB_FMT_MXFP8, h, nm, &a, q, s) == 2;
                    checked++;
                    if (HAVE512) {
                        reported += nbq_avx512_quantize_bf16(NB_FMT_MXFP8, h, nm, &a, q, s) == 2;
                        checked++;
                    }
                }
            h[at[k]] = 0x3F80;   /* and without it: 0 */
            a.div_dtype = NB_BF16;
            CHECK_EQ_INT(nbq_avx2_quantize_bf16(NB_FMT_FP8_TENSOR, h, nf, &a, q, NULL), 0);
            CHECK_EQ_INT(nbq_avx2_quantize_bf16(NB_FMT_MXFP8, h, nm, &a, q, s), 0);
            if (HAVE512) CHECK_EQ_INT(nbq_avx512_quantize_bf16(NB_FMT_MXFP8, h, nm, &a, q, s), 0);
        }
    CHECK_EQ_INT(reported, checked);
    printf("avx2 mxfp8/fp8 edge rows compared bit for bit: %lld; NaN/Inf reported %d of %d\n",
           (long long)(n_avx2_bf16_rows - rows0), reported, checked);
    free(x); free(h); free(h2); free(q); free(s);
}

/* The MXFP8 BF16 kernels (AVX2, AVX-512) on every element magnitude under every block exponent: for
 * each biased exponent E of the block max P = E << 7 | j (j cycling through the closed form's edges
 * 0, 96, 97, 127 and random ones), every magnitude 0..P as an element (random signs), 31 to a block
 * with P at a position that moves; every fifth block instead has a random max of its own (so
 * reference blocks, code < 12, sit among vector ones and the scale changes inside a group). Both
 * rules; the row lengths leave every number of tail blocks. */
static void test_mx_bf16_sweep(void) {
    const int64_t cap = 1400 * 32;
    float *x = malloc((size_t)cap * 4);
    uint16_t *h = malloc((size_t)cap * 2);
    nb_qrow_args a;
    int64_t rows0 = n_avx2_bf16_rows, r512 = n_mx512_rows, elems = 0;
    for (int fl = 0; fl < 2; fl++)
        for (uint32_t E = 0; E < 255; E++) {
            static const uint32_t js[4] = {0, 96, 97, 127};
            uint32_t k = (E * 2 + (uint32_t)fl) % 5, P = E << 7 | (k < 4 ? js[k] : nbt_rnd32() % 128);
            int64_t n = 0;
            uint32_t next = 0;   /* the next magnitude of the sweep */
            for (int64_t b = 0; next <= P; b++) {
                uint16_t *hb = h + b * 32;
                if (b % 5 == 4) {   /* a block with a random max of its own */
                    uint32_t Q = nbt_rnd32() % 0x7F80;
                    for (int i = 0; i < 32; i++) hb[i] = bf16_below(Q);
                    hb[nbt_rnd32() % 32] = (uint16_t)Q;
                } else {
                    int at = (int)(b % 32);
                    for (int i = 0; i < 32; i++) {
                        uint32_t m = i == at ? P : next <= P ? next++ : nbt_rnd32() % (P + 1);
                        hb[i] = (uint16_t)(m | ((nbt_rnd32() & 1) ? 0x8000u : 0u));
                    }
                }
                n += 32;
            }
            bf16_to_f32_row(h, n, x);
            memset(&a, 0, sizeof a);
            a.mx_floor = fl;
            compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, n, &a, fl ? "mxfp8 floor, every magnitude under every exponent" : "mxfp8 ceil, every magnitude under every exponent");
            elems += n;
        }
    printf("mxfp8 bf16 sweep: %lld elements; rows compared bit for bit: avx2 %lld, avx512 %lld\n", (long long)elems,
           (long long)(n_avx2_bf16_rows - rows0), (long long)(n_mx512_rows - r512));
    CHECK_EQ_INT(n_avx2_bf16_rows - rows0, 510);
    if (HAVE512) CHECK_EQ_INT(n_mx512_rows - r512, 510);
    free(x);
    free(h);
}

/* Rows of every length around the BF16 kernels' steps, where the last group or step overlaps the one
 * before: MXFP8 rows of 1 to 40 blocks (every number of blocks past whole 8-block groups, after 1 to
 * 4 groups, and rows under one group, which take the reference), FP8 rows of 1 to 200 elements
 * (every remainder of the 64- and 32-element steps). Mixed block kinds, and rows with reference
 * lanes (E4M3-subnormal results) in every block, so in the overlapped blocks and steps too; both
 * exponent rules, both division dtypes, every entry. */
static void test_bf16_row_tails(void) {
    float *x = malloc(40 * 32 * 4);
    uint16_t *h = malloc(40 * 32 * 2);
    nb_qrow_args a;
    int64_t rows0 = n_avx2_bf16_rows;
    for (int64_t nb = 1; nb <= 40; nb++)
        for (int k = 0; k < 4; k++) {
            const int64_t n = nb * 32;
            if (k < 2) {
                bf16_row(x, h, n, 32, k ? (int)(nbt_rnd32() % KINDS) : -1, (int)(nbt_rnd32() % 40) - 20);
            } else {
                for (int64_t b = 0; b < nb; b++) mx_slow_block(h + b * 32, (int)(nbt_rnd32() % 32));
                bf16_to_f32_row(h, n, x);
            }
            memset(&a, 0, sizeof a);
            a.mx_floor = k & 1;
            compare_bf16(NB_FMT_MXFP8, nb_mxfp8_quantize_row_ref, x, h, n, &a, "mxfp8, row tails");
        }
    for (int64_t n = 1; n <= 200; n++)
        for (int k = 0; k < 4; k++) {
            bf16_row(x, h, n, 1, k < 2 ? -1 : 0, (int)(nbt_rnd32() % 40) - 20);
            float sc = row_absmax(x, n) / 448.0f;
            if (!(sc >= 0x1p-100f && sc <= 0x1p100f)) sc = 1.0f;
            if (k >= 2) {   /* reference lanes: one in 6, and one in each of the last 32 elements' halves */
                for (int64_t i = 0; i < n; i++)
                    if (nbt_rnd32() % 6 == 0 || i == n - 1 - (int64_t)(nbt_rnd32() % 16) || i == n - 17 - (int64_t)(nbt_rnd32() % 16))
                        h[i] = nb_f32_to_bf16(fp8_slow_value(sc));
                bf16_to_f32_row(h, n, x);
            }
            memset(&a, 0, sizeof a);
            a.scale = sc;
            a.global_amax = row_absmax(x, n);
            a.div_dtype = k & 1 ? NB_BF16 : NB_F32;
            compare_bf16(k & 1 ? NB_FMT_FP8_TENSOR : NB_FMT_FP8_CHANNEL, nb_fp8_quantize_row_ref, x, h, n, &a, "fp8, row tails");
        }
    printf("bf16 row tails: avx2 mxfp8/fp8 rows compared bit for bit: %lld\n", (long long)(n_avx2_bf16_rows - rows0));
    CHECK_EQ_INT(n_avx2_bf16_rows - rows0, 40 * 4 + 200 * 4);
    free(x);
    free(h);
}

int main(void) {
    nb_rng_seed(&nbt_rng, 0x5eedf00dULL);
    if (!nbq_cpu_has_avx2()) {   /* every kernel here needs AVX2 */
        printf("test_quant_fast_bf16: no AVX2 on this CPU, skipped\n");
        return 77;
    }
    HAVE512 = nbq_cpu_has_avx512();
    test_bf16_kernels();   /* the AVX-512 kernels only with HAVE512; the AVX2 ones always */
    test_avx2_bf16_kernels();
    test_mx_bf16_sweep();
    test_bf16_row_tails();
    return nbt_done("test_quant_fast_bf16");
}

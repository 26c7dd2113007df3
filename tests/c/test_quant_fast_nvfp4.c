/* The NVFP4 BF16 kernels against the scalar references, bit for bit (the AVX-512 ones with AVX-512, the AVX2
 * threshold-table one on every AVX2 CPU): four_over_six's per-block pick and its branches, table groups mixing
 * table and reference blocks, rows that are not whole 16-block groups (the overlapping last group, the zero-padded
 * short rows, with guard bytes), and the NVFP4 drivers on such tensors with every path. Split from
 * test_quant_fast.c, whose generators and checks they share (quant_fast_common.h). */
#include "quant_fast_common.h"

/* ---- four_over_six's per-block pick ---------------------------------------------------------------- */

/* four_over_six's per-block pick by the table kernels (rows from bf16_row, as test_bf16_kernels',
 * the per-tensor amax at, above or far above the row's), the rows of 1-15 blocks it pads included, and
 * blocks built to reach each of its branches: a pick of 4, a keep of 6, an exact tie of two nonzero
 * error sums (the reference keeps 6: the near-tie path), two zero sums, and huge values whose squared
 * errors overflow (the reference path). */
static int64_t n_pick_rows = 0, n_pick_rows_avx2 = 0;
static void compare_nv46_pick(const float *x, const uint16_t *h, int64_t n, float global_amax, const char *mode) {
    nb_qrow_args a;
    memset(&a, 0, sizeof a);
    a.div_dtype = NB_F32;
    a.global_amax = global_amax;
    a.scale = nb_nvfp4_scale2(global_amax, 256.0f);
    int64_t before = n_bf16_rows, before2 = n_avx2_tab_rows;
    compare_nv_table(NB_FMT_NVFP4_46, nb_nvfp4_46_quantize_row_ref, x, h, n, &a, mode);
    n_pick_rows += n_bf16_rows - before;
    n_pick_rows_avx2 += n_avx2_tab_rows - before2;
    /* another s2 than the pick's own: not these kernels' case */
    uint8_t q[8], sc[1];
    a.scale = a.scale * 2.0f;
    if (a.scale > 0.0f) {
        if (HAVE512) CHECK_EQ_INT(nbq_avx512_nvfp4_table_bf16(NB_FMT_NVFP4_46, h, 16, &a, &NVTAB, q, sc), 1);
        CHECK_EQ_INT(nbq_avx2_nvfp4_table_bf16(NB_FMT_NVFP4_46, h, 16, &a, &NVTAB, q, sc), 1);
    }
}

static void test_nv46_pick(void) {
    enum { N = 4096 };
    float *x = malloc(N * 4);
    uint16_t *h = malloc(N * 2);
    static const int64_t lens[] = {16, 64, 240, 256, 288, 576, 896, 4096};
    for (int trial = 0; trial < 800; trial++) {
        int64_t n = lens[trial % 8];
        int t = (int)(nbt_rnd32() % 40) - 20;
        bf16_row(x, h, n, 16, trial_kind(trial, 8), t);
        float amax = row_absmax(x, n);
        if (!(amax > 0.0f) || !isfinite(amax)) amax = 1.0f;
        float g = trial % 3 == 0 ? amax : trial % 3 == 1 ? amax * (float)(1.0 + 3.0 * nbt_unif()) : amax * 0x1p20f;
        compare_nv46_pick(x, h, n, isfinite(g) ? g : amax, "nvfp4_46 pick");
    }
    /* G = 1536 gives s2 = 1. Block 0: max 4 -> p6 = e4m3(4/6) = 0.6875, p4 = 1: 4 is exact on 4's grid,
     * 4.125 on 6's: pick 4. Block 1: max 6 -> p6 = 1, p4 = 1.5; 0.75 is 0.5 + a tie (RNE to 1.0, error
     * 0.25) on 6's grid and exact on 4's, 1.0 the other way round: both sums 0.0625, keep 6. Block 2:
     * 6 and 1.5, exact on both grids: two zero sums, keep 6. Block 3: 6 and 1.25: error 0.25 on 4's grid
     * (1.25 / 1.5 -> 1.0 * 1.5 = 1.5), 0.25 on 6's (1.25 -> RNE 1.0): a tie again, 6. Blocks 4+: zeros. */
    memset(x, 0, 64 * 16 * sizeof *x);
    x[0] = 4.0f;
    x[16] = 6.0f; x[17] = 0.75f; x[18] = 1.0f;
    x[32] = 6.0f; x[33] = 1.5f;
    x[48] = 6.0f; x[49] = -1.25f;
    for (int i = 0; i < 64 * 16; i++) h[i] = nb_f32_to_bf16(x[i]);
    uint8_t q0[512], s0[64];
    nb_qrow_args a;
    memset(&a, 0, sizeof a);
    a.global_amax = 1536.0f;
    a.scale = nb_nvfp4_scale2(1536.0f, 256.0f);
    CHECK_EQ_INT(nbt_f2u(a.scale), nbt_f2u(1.0f));
    nb_nvfp4_46_quantize_row_ref(x, 64 * 16, &a, q0, s0);
    CHECK_EQ_INT(s0[0], 0x38);   /* 1.0: the block max on 4 */
    CHECK_EQ_INT(s0[1], 0x38);   /* 1.0: the block max on 6 (the tie keeps 6) */
    CHECK_EQ_INT(s0[2], 0x38);
    CHECK_EQ_INT(s0[3], 0x38);
    CHECK_EQ_INT(nb_nvfp4_46_pick_block(x, 4.0f, 1536.0f), 1);
    CHECK_EQ_INT(nb_nvfp4_46_pick_block(x + 16, 6.0f, 1536.0f), 0);
    CHECK_EQ_INT(nb_nvfp4_46_pick_block(x + 48, 6.0f, 1536.0f), 0);
    for (int64_t n = 16; n <= 64 * 16; n *= 2) compare_nv46_pick(x, h, n, 1536.0f, "nvfp4_46 pick ties");
    /* huge values: squared errors past FLT_MAX in both candidates */
    for (int i = 0; i < 64 * 16; i++) x[i] = (i % 3 ? -1.0f : 1.0f) * 0x1p120f * (float)(1.0 + (i % 7) / 8.0);
    for (int i = 0; i < 64 * 16; i++) h[i] = nb_f32_to_bf16(x[i]);
    for (int i = 0; i < 64 * 16; i++) x[i] = nb_bf16_to_f32(h[i]);
    compare_nv46_pick(x, h, 64 * 16, row_absmax(x, 64 * 16), "nvfp4_46 pick, overflowing errors");
    if (HAVE512) CHECK(n_pick_rows > 700);
    CHECK(n_pick_rows_avx2 > 700);
    printf("four_over_six pick rows compared: %lld (AVX-512 table kernel), %lld (AVX2)\n", (long long)n_pick_rows,
           (long long)n_pick_rows_avx2);
    free(x);
    free(h);
}

/* ---- the threshold table's mixed groups ------------------------------------------------------------ */

/* The threshold-table kernel's mixed groups: blocks whose divisor p is above 2^16 (a huge tensor
 * amax), so their scale bytes are outside the table's run, in the same 16-block groups as blocks
 * inside it; dynamic and static (block amax not from the data). The test also checks that such
 * groups occurred. (p underflowing to 0 would also leave the run, but no finite amax reaches it
 * with a nonzero block scale: the block amax / 6 underflows first.) */
static void test_nv_table_mixed(void) {
    const int64_t n = 4096, nb = n / 16;
    float *x = malloc((size_t)n * 4), *bam = malloc((size_t)nb * 4);
    uint16_t *h = malloc((size_t)n * 2);
    uint8_t *q0 = malloc((size_t)n / 2), *q1 = malloc((size_t)n / 2), *s0 = malloc((size_t)nb), *s1 = malloc((size_t)nb);
    int mixed_groups[2] = {0, 0};
    for (int trial = 0; trial < 24; trial++) {
        int stat = trial % 2;
        float amax = ldexpf(1.0f, 19 + (int)(nbt_rnd32() % 11));
        for (int64_t b = 0; b < nb; b++) {
            float top = b == 0 ? amax : ldexpf(amax, -(int)(nbt_rnd32() % 14));
            bam[b] = b == 0 ? amax : ldexpf(amax, -(int)(nbt_rnd32() % 24));
            for (int i = 0; i < 16; i++) {
                float v = i == 3 ? top : top * (float)(2.0 * nbt_unif() - 1.0);
                if (nbt_rnd32() & 1) v = -v;
                h[b * 16 + i] = nb_f32_to_bf16(v);
                x[b * 16 + i] = nb_bf16_to_f32(h[b * 16 + i]);
            }
        }
        nb_qrow_args a;
        memset(&a, 0, sizeof a);
        a.global_amax = amax;
        a.scale = nb_nvfp4_scale2(amax, 448.0f);
        if (stat) a.block_amax = bam;
        nbq_nv_table_build(a.scale, &NVTAB);
        nb_nvfp4_quantize_row_ref(x, n, &a, q0, s0);
        for (int avx2 = !HAVE512; avx2 < 2; avx2++) {
            memset(q1, 0, (size_t)n / 2);
            memset(s1, 0, (size_t)nb);
            CHECK_EQ_INT(avx2 ? nbq_avx2_nvfp4_table_bf16(NB_FMT_NVFP4, h, n, &a, &NVTAB, q1, s1)
                              : nbq_avx512_nvfp4_table_bf16(NB_FMT_NVFP4, h, n, &a, &NVTAB, q1, s1), 0);
            CHECK_SAME("nvfp4 table mixed", q0, q1, n / 2, "%s %s amax %a s2 %a", avx2 ? "avx2" : "avx512",
                       stat ? "static" : "dynamic", (double)amax, (double)a.scale);
            CHECK_SAME("nvfp4 table mixed", s0, s1, nb, "%s scales, amax %a", avx2 ? "avx2" : "avx512", (double)amax);
        }
        for (int64_t g = 0; g < nb; g += 16) {
            int in = 0;
            for (int b = 0; b < 16; b++) in += NVTAB.ok[s0[g + b] & 0x7F];
            mixed_groups[stat] += in > 0 && in < 16;
        }
    }
    printf("nvfp4 table: groups mixing table and reference blocks: %d dynamic, %d static, of %d each\n",
           mixed_groups[0], mixed_groups[1], 12 * (int)(nb / 16));
    CHECK(mixed_groups[0] > 50 && mixed_groups[1] > 50);
    free(x); free(bam); free(h); free(q0); free(q1); free(s0); free(s1);
}

/* ---- NVFP4 BF16 row tails: the overlapping last group, the padded short rows ----------------------- */

static int64_t n_nv_tail_rows = 0, n_nv_tail_bad = 0;

/* The three BF16 NVFP4 kernels (AVX-512 plain and by table with HAVE512, AVX2 by table always) on one
 * row: status `want` (0, or 2 for a row holding a NaN/Inf), and for want 0 data and scales equal to the
 * reference's; nothing written past the row either way. */
static void check_nv_tail(nb_qformat f, const float *x, const uint16_t *h, int64_t n, const nb_qrow_args *a, int want,
                          const char *mode) {
    static const char *names[3] = {"avx512 bf16", "avx512 table", "avx2 table"};
    const int64_t qb = n / 2, sbn = n / 16;
    uint8_t *q0 = calloc((size_t)qb + 1, 1), *q1 = malloc((size_t)(qb + GUARD));
    uint8_t *s0 = calloc((size_t)sbn + 1, 1), *s1 = malloc((size_t)(sbn + GUARD));
    uint8_t ee[GUARD];
    memset(ee, 0xEE, sizeof ee);
    if (want == 0) (f == NB_FMT_NVFP4 ? nb_nvfp4_quantize_row_ref : nb_nvfp4_46_quantize_row_ref)(x, n, a, q0, s0);
    nbq_nv_table_build(a->scale, &NVTAB);
    for (int k = HAVE512 ? 0 : 2; k < 3; k++) {
        prefill_out(q1, qb, s1, sbn);
        int st = k == 0 ? nbq_avx512_quantize_bf16(f, h, n, a, q1, s1)
               : k == 1 ? nbq_avx512_nvfp4_table_bf16(f, h, n, a, &NVTAB, q1, s1)
                        : nbq_avx2_nvfp4_table_bf16(f, h, n, a, &NVTAB, q1, s1);
        CHECK_MSG(st == want, "%s returned %d, wanted %d: nvfp4 row tails, %s n=%lld", names[k], st, want, mode, (long long)n);
        if (want == 0) {
            check_bf16_out("nvfp4 row tails", names[k], q0, q1, qb, s0, s1, sbn, mode, n, a->scale);
            n_nv_tail_rows++;
        } else {
            CHECK_SAME("nvfp4 row tails", ee, q1 + qb, GUARD, "%s data written past the row, %s n=%lld", names[k], mode, (long long)n);
            CHECK_SAME("nvfp4 row tails", ee, s1 + sbn, GUARD, "%s scales written past the row, %s n=%lld", names[k], mode, (long long)n);
            n_nv_tail_bad++;
        }
    }
    free(q0); free(q1); free(s0); free(s1);
}

/* NVFP4 BF16 rows that are not whole 16-block groups: 1-15 blocks (one group on a zero-padded copy),
 * 16-40 blocks, SmolLM2-135M's 576 and 896 and 1552 (whole groups, then one group ending at the row's
 * last block, redoing blocks the group before did), each through check_nv_tail dynamic (the driver's
 * s2 and powers of two: exact E2M1 ties), static (per-block amax: the data's, x1.5, 0, arbitrary) and
 * four_over_six static. Neighbouring blocks differ (random kinds and scales, random static amax), so a
 * group one block off, or a block amax read at the wrong offset, changes bytes. The contents: mixed
 * block kinds (zeros, -0, ties, huge, tiny, subnormal, FLT_MAX-ish), plain blocks, ties only, and a
 * huge amax (divisors above 2^16: the table kernels' mixed groups in the overlapped blocks); and rows
 * with one NaN/Inf in the first block, in the blocks both last groups cover, or in the last block. */
static void test_nvfp4_row_tails(void) {
    static const int64_t extra[3] = {36, 56, 97};
    float *x = malloc(97 * 16 * 4), *bam = malloc(97 * 4);
    uint16_t *h = malloc(97 * 16 * 2);
    nb_qrow_args a;
    int64_t lens = 0;
    for (int li = 0; li < 40 + 3; li++) {
        const int64_t nb = li < 40 ? li + 1 : extra[li - 40], n = nb * 16;
        lens++;
        for (int c = 0; c < 6; c++) {
            const int t = (int)(nbt_rnd32() % 40) - 20;
            float amax;
            if (c < 4) {
                bf16_row(x, h, n, 16, c == 0 ? -1 : c == 1 ? 0 : c == 2 ? 3 : -1, t);
                amax = row_absmax(x, n);
            } else {   /* c 4, 5: blocks up to 2^19-2^29 (c 5 also holds a NaN/Inf below) */
                amax = ldexpf(1.0f, 19 + (int)(nbt_rnd32() % 11));
                for (int64_t b = 0; b < nb; b++) {
                    float top = b == nb - 1 - (int64_t)(nbt_rnd32() % 3) ? amax : ldexpf(amax, -(int)(nbt_rnd32() % 14));
                    for (int i = 0; i < 16; i++) {
                        float v = i == 3 ? top : top * (float)(2.0 * nbt_unif() - 1.0);
                        h[b * 16 + i] = nb_f32_to_bf16((nbt_rnd32() & 1) ? -v : v);
                    }
                }
                bf16_to_f32_row(h, n, x);
                amax = row_absmax(x, n);
            }
            int want = 0;
            if (c == 5) {   /* first block, the blocks the last two groups share (or any), the last block */
                int64_t at = (nbt_rnd32() % 3 == 0) ? (int64_t)(nbt_rnd32() % 16)
                           : (nbt_rnd32() & 1) ? n - 1 - (int64_t)(nbt_rnd32() % 16)
                           : nb > 16 ? (nb - 16) * 16 + (int64_t)(nbt_rnd32() % 16) : (int64_t)(nbt_rnd32() % (uint32_t)n);
                static const uint16_t bad[4] = {0x7FC0, 0x7F80, 0xFF80, 0xFFC1};
                h[at] = bad[nbt_rnd32() % 4];
                want = 2;
            }
            char mode[64];
            memset(&a, 0, sizeof a);
            a.div_dtype = NB_F32;
            a.global_amax = amax > 0.0f ? amax : 1.0f;
            a.scale = c == 2 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 448.0f);
            snprintf(mode, sizeof mode, "dynamic, content %d", c);
            check_nv_tail(NB_FMT_NVFP4, x, h, n, &a, want, mode);
            if (c == 0) {   /* a power-of-two s2 on mixed blocks too */
                a.scale = ldexpf(1.0f, t);
                check_nv_tail(NB_FMT_NVFP4, x, h, n, &a, want, "dynamic, content 0, s2 2^t");
            }
            for (int64_t b = 0; b < nb; b++) {
                float m = want ? 1.0f : row_absmax(x + b * 16, 16);
                int r = (int)(nbt_rnd32() % 4);
                bam[b] = r == 0 ? m : r == 1 ? m * 1.5f : r == 2 ? 0.0f : (float)(nbt_unif() * 4.0) * m;
            }
            a.block_amax = bam;
            a.global_amax = row_absmax(bam, nb);
            if (a.global_amax == 0.0f) a.global_amax = 1.0f;
            a.scale = nb_nvfp4_scale2(a.global_amax, 448.0f);
            snprintf(mode, sizeof mode, "static, content %d", c);
            check_nv_tail(NB_FMT_NVFP4, x, h, n, &a, want, mode);
            a.scale = nb_nvfp4_scale2(a.global_amax, 256.0f);
            snprintf(mode, sizeof mode, "four_over_six static, content %d", c);
            check_nv_tail(NB_FMT_NVFP4_46, x, h, n, &a, want, mode);
        }
    }
    const int64_t per_len = (HAVE512 ? 3 : 1) * (3 * 5 + 1);   /* kernels x (3 modes x 5 clean contents + one more s2) */
    printf("nvfp4 bf16 row tails: %lld rows compared bit for bit, %lld NaN/Inf rows reported (%lld lengths)\n",
           (long long)n_nv_tail_rows, (long long)n_nv_tail_bad, (long long)lens);
    CHECK_EQ_INT(n_nv_tail_rows, lens * per_len);
    CHECK_EQ_INT(n_nv_tail_bad, lens * (HAVE512 ? 3 : 1) * 3);
    free(x); free(bam); free(h);
}

/* ---- NVFP4 drivers on BF16 tensors ----------------------------------------------------------------- */

/* Calibrated-looking block amax for nblocks BF16 blocks of 16 at h: each block's largest magnitude,
 * every third one times 1.5 (a four_over_six pick), as the NVFP4 driver tests feed the static paths. */
static void bf16_block_amax(const uint16_t *h, int64_t nblocks, float *bd) {
    for (int64_t b = 0; b < nblocks; b++) {
        float m = 0.0f;
        for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(nb_bf16_to_f32(h[b * 16 + i])));
        bd[b] = b % 3 ? m : m * 1.5f;
    }
}

/* NVFP4 with `path` installed, against the reference path, on BF16 tensors whose rows are not whole
 * 16-block groups: rows of 576 and 896 (SmolLM2-135M) and 64 (stories260K), large enough for the
 * driver's threshold table (2^20 elements or more) and small (the plain AVX-512 kernel, or the AVX2
 * f32 rows); dynamic, calibrated amax, static and four_over_six static. A NaN in a row's last element
 * (a block only the overlapping last group covers) is named by the one-pass formats. */
static void test_nvfp4_tail_driver(nb_ctx *ctx, const char *path) {
    static const int64_t shapes[5][2] = {{1824, 576}, {1200, 896}, {16400, 64}, {37, 576}, {45, 64}};
    for (int si = 0; si < 5; si++) {
        const int64_t rows = shapes[si][0], n = shapes[si][1], bshape[2] = {rows, n / 16};
        nb_tensor *x = NULL, *bam = NULL;
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 2, shapes[si], &x));
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, bshape, &bam));
        if (!x || !bam) return;
        uint16_t *h = nb_tensor_data(x);
        float *bd = nb_tensor_data(bam), row[896];
        for (int64_t r = 0; r < rows; r++) {
            gen_row(row, n, 16, r % 4 == 0 ? -1 : 0, (int)(r % 24) - 12);
            for (int64_t i = 0; i < n; i++) h[r * n + i] = nb_f32_to_bf16(isfinite(row[i]) && fabsf(row[i]) < 1e30f ? row[i] : 1.0f);
        }
        bf16_block_amax(h, rows * (n / 16), bd);
        for (int k = 0; k < 5; k++) {   /* 4: four_over_six's per-block pick */
            nb_qparams p;
            nb_qparams_init(&p, k >= 3 ? NB_FMT_NVFP4_46 : NB_FMT_NVFP4);
            if (k == 1) p.amax = 7.5e5f;
            if (k == 2 || k == 3) p.block_amax = bam;
            char what[48];
            snprintf(what, sizeof what, "%lldx%lld case %d", (long long)rows, (long long)n, k);
            check_quantize_path(ctx, x, &p, path, 1, "nvfp4 row-tail driver", what);
        }
        const int64_t r = rows - 2, at = r * n + n - 1;
        h[at] = 0xFF80;
        for (int k = 0; k < 3; k++) {
            nb_qparams p;
            nb_qparams_init(&p, k == 2 ? NB_FMT_NVFP4_46 : NB_FMT_NVFP4);
            if (k == 0) p.amax = 7.5e5f;
            else p.block_amax = bam;
            p.name = "tail.weight";
            nb_qtensor *q = NULL;
            char msg[96];
            snprintf(msg, sizeof msg, "tail.weight: -Inf at flat index %lld (element [%lld, %lld])", (long long)at,
                     (long long)r, (long long)(n - 1));
            CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, path));
            CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_NUMERIC, msg);
            CHECK(q == NULL);
        }
        nb_tensor_release(x);
        nb_tensor_release(bam);
    }
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
}

/* NVFP4 on a BF16 tensor large enough (4M elements) for the driver's threshold table, with `path`
 * installed (avx512: the AVX-512 table kernel, avx2: the AVX2 one): dynamic, static and
 * four_over_six static, against the reference path; a NaN in it is still named. */
static void test_nvfp4_table_driver(nb_ctx *ctx, const char *path) {
    const int64_t bshape[2] = {1024, 256};
    nb_tensor *x = driver_tensor(ctx, 16), *bam = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, bshape, &bam));
    if (!x || !bam) return;
    uint16_t *h = nb_tensor_data(x);
    float *bd = nb_tensor_data(bam);
    bf16_block_amax(h, 1024 * 256, bd);
    for (int k = 0; k < 4; k++) {   /* 3: four_over_six's per-block pick (no block amax) */
        nb_qparams p;
        nb_qparams_init(&p, k >= 2 ? NB_FMT_NVFP4_46 : NB_FMT_NVFP4);
        if (k == 1 || k == 2) p.block_amax = bam;
        char what[16];
        snprintf(what, sizeof what, "case %d", k);
        check_quantize_path(ctx, x, &p, path, 0, "nvfp4 table driver", what);
    }
    h[777 * 4096 + 3] = 0x7FC0;
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.block_amax = bam;
    p.name = "big.weight";
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, path));
    CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_NUMERIC, "big.weight: NaN at flat index 3182595 (element [777, 3])");
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
    nb_tensor_release(x);
    nb_tensor_release(bam);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx) != NB_OK) return 1;
    nb_rng_seed(&nbt_rng, 0x5eedf00dULL);
    if (!nbq_cpu_has_avx2()) {   /* every kernel here needs AVX2 */
        printf("test_quant_fast_nvfp4: no AVX2 on this CPU, skipped\n");
        nb_ctx_release(ctx);
        return 77;
    }
    HAVE512 = nbq_cpu_has_avx512();
    test_nv_table_mixed();
    test_nv46_pick();
    test_nvfp4_row_tails();
    test_nvfp4_table_driver(ctx, "avx2");
    if (HAVE512) test_nvfp4_table_driver(ctx, "avx512");
    test_nvfp4_tail_driver(ctx, "avx2");
    if (HAVE512) test_nvfp4_tail_driver(ctx, "avx512");
    nb_ctx_release(ctx);
    return nbt_done("test_quant_fast_nvfp4");
}

/* The CUDA quantization kernels against the scalar reference rows, bit for bit: quantize (data and
 * scale bytes), fake quant and dequantize of every format, static and dynamic, F32/BF16/F16 in and
 * out, on random and adversarial rows, plus every MXFP8 binade edge; and the same entry points the
 * CPU uses (nb_quantize, nb_quantize_into, nb_fake_quant, nb_qtensor_dequantize) on device tensors
 * against those calls on the host. Without a GPU (or without a CUDA build) it checks that each
 * entry point fails with NB_ERR_DEVICE, then exits 77 (skipped). */
#include "nbtest.h"
#include <stdint.h>

#include "nibble/quant_cuda.h"
#include "quant/quant_internal.h"

/* ---- without a device ------------------------------------------------------------------------------ */

static int no_device(nb_ctx *ctx) {
    const char *why = nb_cuda_built() ? "no CUDA device is available" : "built without CUDA";
    nb_cuda_qargs a;
    nb_cuda_qargs_init(&a);
    CHECK_EQ_INT(a.div_dtype, NB_F32);
    float x[32] = {1.0f}, y[32];
    uint8_t q[32], s[2];
    CHECK_FAIL(ctx, nb_cuda_quantize_host(ctx, NB_FMT_NVFP4, x, NB_F32, 1, 32, &a, q, s), NB_ERR_DEVICE, why);
    CHECK_FAIL(ctx, nb_cuda_dequantize_host(ctx, NB_FMT_MXFP8, q, s, 1, 32, &a, y, NB_F32), NB_ERR_DEVICE, why);
    CHECK_FAIL(ctx, nb_cuda_fake_quant_host(ctx, NB_FMT_FP8_TENSOR, x, NB_F32, 1, 32, &a, y, NB_F32), NB_ERR_DEVICE, why);
    CHECK_FAIL(ctx, nb_cuda_quantize(ctx, NB_FMT_NVFP4_46, x, NB_BF16, 1, 32, &a, q, s, NULL), NB_ERR_DEVICE, why);
    CHECK_FAIL(ctx, nb_cuda_dequantize(ctx, NB_FMT_NVFP4, q, s, 1, 32, &a, y, NB_F16, NULL), NB_ERR_DEVICE, why);
    CHECK_FAIL(ctx, nb_cuda_fake_quant(ctx, NB_FMT_MXFP8, x, NB_F32, 1, 32, &a, y, NB_F32, NULL), NB_ERR_DEVICE, why);
    /* the tensor entry points: no device tensor can be made (test_backend dispatches a pretended one) */
    int64_t sh[2] = {1, 32};
    nb_tensor *t = NULL, *d = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, sh, x, &t));
    CHECK_FAIL(ctx, nb_tensor_to_device(ctx, t, 0, &d), NB_ERR_DEVICE, "cuda device 0");
    CHECK_FAIL(ctx, nb_tensor_new_on(ctx, NB_DEVICE_CTX, NB_BF16, 2, sh, &d), NB_ERR_DEVICE, "cuda device 0");
    CHECK(d == NULL);
    nb_tensor_release(t);
    if (nbt_failures) return nbt_done("test_quant_cuda");
    printf("SKIP: %s; every CUDA quantization entry point returned NB_ERR_DEVICE (%d checks)\n", why, nbt_checks);
    return 77;
}

/* ---- rows ----------------------------------------------------------------------------------------------- */

enum { KINDS = 11 };

static void gen_block(float *x, int len, int kind, int t) {
    double sc = ldexp(1.0, (int)(nbt_unif() * 60) - 30);
    for (int i = 0; i < len; i++) {
        double v;
        switch (kind) {
        case 0: v = nb_rng_normal(&nbt_rng) * sc; break;
        case 1: v = 0.0; break;
        case 2: v = (i & 1) ? -0.0 : -(double)ldexpf(1.0f, -149) * (nbt_rnd32() % 4); break;
        case 3: v = ldexp((double)((int)(nbt_rnd32() % 49) - 24) * 0.25, t); break;
        case 4: v = nb_rng_normal(&nbt_rng) * 1e30; break;
        case 5: v = nb_rng_normal(&nbt_rng) * 1e-39; break;
        case 6: v = nb_rng_normal(&nbt_rng) * 1e-20; break;
        case 7: v = (double)nbt_u2f(nbt_rnd32() & 0x807FFFFFu); break;
        case 8: v = (double)nb_e4m3_to_f32((uint8_t)(nbt_rnd32() % 0x7E)) * ((nbt_rnd32() & 1) ? 1.5 : 1.0) *
                    ((nbt_rnd32() & 1) ? -1 : 1) * ldexp(1.0, (int)(nbt_rnd32() % 8) - 4); break;
        case 9: v = (double)nbt_u2f((nbt_rnd32() & 0x80000000u) | (nbt_rnd32() % 0x7F7FFFFFu)); break;
        default: v = (double)(int)(nbt_rnd32() % 13 - 6) * sc; break;
        }
        x[i] = (float)v;
    }
    if (kind == 3) x[nbt_rnd32() % (unsigned)len] = (float)ldexp(6.0, t);
}

/* rows x n floats; 16-bit input dtypes are representable exactly by storing and reloading */
static void gen(float *x, int64_t rows, int64_t n, int block, nb_dtype xdt, int t) {
    for (int64_t b = 0; b < rows * n / block; b++) gen_block(x + b * block, block, (int)(nbt_rnd32() % KINDS), t);
    for (int64_t i = 0; i < rows * n; i++) {
        if (xdt == NB_F16 && !(fabsf(x[i]) <= 65504.0f)) x[i] = 1.0f;
        if (xdt == NB_BF16 && !(fabsf(x[i]) <= 3.38e38f)) x[i] = 1.0f;
    }
}

static int64_t esz(nb_dtype dt) { return dt == NB_F32 ? 4 : 2; }
static int64_t n_cases = 0;

/* One configuration: the host reference row by row vs the kernels through the host wrappers. */
static void run_case(nb_ctx *ctx, nb_qformat f, const float *xf, int64_t rows, int64_t n, nb_dtype xdt, nb_dtype ydt,
                     const nb_cuda_qargs *ca, const char *mode) {
    const nb_qformat_traits *tr = nb_qformat_info(f);
    int nv = f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46;
    int64_t qrow = nv ? n / 2 : n, srow = tr->block_size ? n / tr->block_size : 0;
    void *x = malloc((size_t)(rows * n * esz(xdt)));
    float *buf = malloc((size_t)n * 4), *yref = malloc((size_t)n * 4);
    uint8_t *q0 = malloc((size_t)(rows * qrow) + 1), *q1 = malloc((size_t)(rows * qrow) + 1);
    uint8_t *s0 = malloc((size_t)(rows * srow) + 1), *s1 = malloc((size_t)(rows * srow) + 1);
    void *y0 = malloc((size_t)(rows * n * esz(ydt))), *y1 = malloc((size_t)(rows * n * esz(ydt)));
    for (int64_t r = 0; r < rows; r++) nbq_store_row(x, xdt, r, n, xf + r * n);
    for (int64_t r = 0; r < rows; r++) {
        nb_qrow_args a;
        memset(&a, 0, sizeof a);
        a.scale = f == NB_FMT_FP8_CHANNEL ? ca->row_scale[r] : ca->scale;
        a.global_amax = ca->global_amax;
        a.block_amax = ca->block_amax && nv ? ca->block_amax + r * (n / 16) : NULL;
        a.mx_floor = ca->mx_floor;
        a.div_dtype = ca->div_dtype;
        nbq_load_row(x, xdt, r, n, buf);
        /* the scalar references, whatever the dispatcher installed */
        switch (f) {
        case NB_FMT_NVFP4: nb_nvfp4_quantize_row_ref(buf, n, &a, q0 + r * qrow, s0 + r * srow); nb_nvfp4_fake_row_ref(buf, n, &a, yref); break;
        case NB_FMT_NVFP4_46: nb_nvfp4_46_quantize_row_ref(buf, n, &a, q0 + r * qrow, s0 + r * srow); nb_nvfp4_46_fake_row_ref(buf, n, &a, yref); break;
        case NB_FMT_MXFP8: nb_mxfp8_quantize_row_ref(buf, n, &a, q0 + r * qrow, s0 + r * srow); nb_mxfp8_fake_row_ref(buf, n, &a, yref); break;
        default: nb_fp8_quantize_row_ref(buf, n, &a, q0 + r * qrow, NULL); nb_fp8_fake_row_ref(buf, n, &a, yref); break;
        }
        nbq_store_row(y0, ydt, r, n, yref);
    }
    CHECK_OK(ctx, nb_cuda_quantize_host(ctx, f, x, xdt, rows, n, ca, q1, s1));
    CHECK_SAME(tr->name, q0, q1, rows * qrow, "quantize data (%s, %s in)", mode, nb_dtype_info(xdt)->name);
    CHECK_SAME(tr->name, s0, s1, rows * srow, "quantize scales (%s, %s in)", mode, nb_dtype_info(xdt)->name);
    CHECK_OK(ctx, nb_cuda_fake_quant_host(ctx, f, x, xdt, rows, n, ca, y1, ydt));
    CHECK_SAME(tr->name, y0, y1, rows * n * esz(ydt), "fake quant (%s, %s in, %s out)", mode, nb_dtype_info(xdt)->name,
               nb_dtype_info(ydt)->name);
    /* dequantize: the quantized bytes, then arbitrary bytes (NaN scale codes, E8M0 255, every code) */
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            for (int64_t i = 0; i < rows * qrow; i++) q0[i] = (uint8_t)nbt_rnd32();
            for (int64_t i = 0; i < rows * srow; i++) s0[i] = (uint8_t)nbt_rnd32();
        }
        for (int64_t r = 0; r < rows; r++) {
            nb_qrow_args a;
            memset(&a, 0, sizeof a);
            a.scale = f == NB_FMT_FP8_CHANNEL ? ca->row_scale[r] : ca->scale;
            const uint8_t *qr = q0 + r * qrow, *sr = srow ? s0 + r * srow : NULL;
            if (nv) nb_nvfp4_dequantize_row_ref(qr, sr, n, &a, yref);
            else if (f == NB_FMT_MXFP8) nb_mxfp8_dequantize_row_ref(qr, sr, n, &a, yref);
            else nb_fp8_dequantize_row_ref(qr, sr, n, &a, yref);
            nbq_store_row(y0, ydt, r, n, yref);
        }
        CHECK_OK(ctx, nb_cuda_dequantize_host(ctx, f, q0, s0, rows, n, ca, y1, ydt));
        CHECK_SAME(tr->name, y0, y1, rows * n * esz(ydt), "dequantize (%s bytes, %s out)", pass ? "random" : "quantized",
                   nb_dtype_info(ydt)->name);
    }
    n_cases++;
    free(x); free(buf); free(yref); free(q0); free(q1); free(s0); free(s1); free(y0); free(y1);
}

static float absmax(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* FP8 per channel: each row's amax / 448 (1 for an all-zero row), into rs; returns rs. */
static const float *fp8_row_scales(const float *x, int64_t rows, int64_t n, float *rs) {
    for (int64_t r = 0; r < rows; r++) {
        rs[r] = absmax(x + r * n, n) / 448.0f;
        if (rs[r] == 0.0f) rs[r] = 1.0f;
    }
    return rs;
}

static void test_formats(nb_ctx *ctx) {
    static const nb_dtype dts[3] = {NB_F32, NB_BF16, NB_F16};
    const int64_t rows = 24, n = 2048;
    float *x = malloc((size_t)(rows * n) * 4), *bam = malloc((size_t)(rows * n / 16) * 4), *rs = malloc((size_t)rows * 4);
    for (int trial = 0; trial < 36; trial++) {
        nb_dtype xdt = dts[trial % 3], ydt = dts[(trial / 3) % 3];
        int t = (int)(nbt_rnd32() % 30) - 15, mode = trial % 4;
        gen(x, rows, n, 16, xdt, t);
        if (xdt != NB_F32) {   /* what the kernels will see */
            void *tmp = malloc((size_t)(rows * n) * 2);
            nbq_store_row(tmp, xdt, 0, rows * n, x);
            nbq_load_row(tmp, xdt, 0, rows * n, x);
            free(tmp);
        }
        float amax = absmax(x, rows * n);
        nb_cuda_qargs a;
        /* NVFP4 dynamic: the driver's s2, a power of two (ties), 0 / subnormal (NaN scales), arbitrary */
        nb_cuda_qargs_init(&a);
        a.global_amax = amax;
        a.scale = mode == 0 ? nb_nvfp4_scale2(amax, 448.0f) : mode == 1 ? ldexpf(1.0f, t)
                : mode == 2 ? ((trial & 4) ? 0.0f : nbt_u2f(nbt_rnd32() & 0x7FFFFFu)) : (float)nbt_unif() * 4.0f;
        run_case(ctx, NB_FMT_NVFP4, x, rows, n, xdt, ydt, &a, "nvfp4 dynamic");
        /* static: calibrated block amax (as is, x1.5, 0, arbitrary) */
        for (int64_t b = 0; b < rows * n / 16; b++) {
            float m = absmax(x + b * 16, 16);
            int r = (int)(nbt_rnd32() % 4);
            bam[b] = r == 0 ? m : r == 1 ? m * 1.5f : r == 2 ? 0.0f : (float)(nbt_unif() * 4.0);
        }
        a.block_amax = bam;
        a.global_amax = mode == 1 ? ldexpf(2688.0f, t) : absmax(bam, rows * n / 16) + 1e-30f;
        a.scale = mode == 1 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 448.0f);
        run_case(ctx, NB_FMT_NVFP4, x, rows, n, xdt, ydt, &a, "nvfp4 static");
        a.global_amax = mode == 1 ? ldexpf(1536.0f, t) : a.global_amax;
        a.scale = mode == 1 ? ldexpf(1.0f, t) : nb_nvfp4_scale2(a.global_amax, 256.0f);
        run_case(ctx, NB_FMT_NVFP4_46, x, rows, n, xdt, ydt, &a, "four_over_six static");
        a.block_amax = NULL;
        a.global_amax = mode == 1 ? ldexpf(1536.0f, t) : amax + 1e-30f;
        a.scale = mode == 3 ? (float)nbt_unif() * 3.0f : nb_nvfp4_scale2(a.global_amax, 256.0f);
        run_case(ctx, NB_FMT_NVFP4_46, x, rows, n, xdt, ydt, &a, "four_over_six pick");
        /* MXFP8 ceil and floor */
        nb_cuda_qargs_init(&a);
        a.mx_floor = trial & 1;
        run_case(ctx, NB_FMT_MXFP8, x, rows, n, xdt, ydt, &a, a.mx_floor ? "mxfp8 floor" : "mxfp8 ceil");
        /* FP8 per tensor with each div dtype; per channel */
        nb_cuda_qargs_init(&a);
        a.scale = mode == 1 ? ldexpf(1.0f, t) : amax / 448.0f;
        if (a.scale == 0.0f) a.scale = 1.0f;
        a.div_dtype = dts[(trial / 9) % 3];
        run_case(ctx, NB_FMT_FP8_TENSOR, x, rows, n, xdt, ydt, &a, "fp8 tensor");
        nb_cuda_qargs_init(&a);
        a.row_scale = fp8_row_scales(x, rows, n, rs);
        run_case(ctx, NB_FMT_FP8_CHANNEL, x, rows, n, xdt, ydt, &a, "fp8 channel");
    }
    free(x); free(bam); free(rs);
}

/* Every MXFP8 block amax near the start of each binade of amax/448 (the ceil rule's hard cases). */
static void test_mx_edges(nb_ctx *ctx) {
    const int per = 160, kmin = -140, kmax = 119;
    const int64_t nblk = (int64_t)(kmax - kmin + 1) * per, n = 32 * 64, rows = (nblk + 63) / 64;
    float *x = calloc((size_t)(rows * n), 4);
    int64_t b = 0;
    for (int k = kmin; k <= kmax; k++)
        for (int j = -16; j < per - 16; j++, b++) {
            float amax = nbt_u2f(nbt_f2u(ldexpf(448.0f, k)) + (uint32_t)j);
            x[b * 32] = (j & 1) ? -amax : amax;
            for (int i = 1; i < 32; i++) x[b * 32 + i] = amax * (float)nbt_unif();
        }
    nb_cuda_qargs a;
    for (int fl = 0; fl < 2; fl++) {
        nb_cuda_qargs_init(&a);
        a.mx_floor = fl;
        run_case(ctx, NB_FMT_MXFP8, x, rows, n, NB_F32, NB_F32, &a, fl ? "mxfp8 edges floor" : "mxfp8 edges ceil");
    }
    free(x);
}

/* FP8 rows whose length is not a multiple of 8: the element-per-thread kernels, not the vector ones
 * (block formats always have n % 8 == 0 and, through the host wrappers, aligned pointers). */
static void test_fp8_odd_rows(nb_ctx *ctx) {
    const int64_t rows = 7, n = 1003;
    float *x = malloc((size_t)(rows * n) * 4), rs[7];
    for (int trial = 0; trial < 6; trial++) {
        nb_dtype xdt = trial % 2 ? NB_BF16 : NB_F32;
        gen(x, rows, n, 1, xdt, (int)(nbt_rnd32() % 10) - 5);
        if (xdt == NB_BF16)
            for (int64_t i = 0; i < rows * n; i++) x[i] = nb_bf16_to_f32(nb_f32_to_bf16(x[i]));
        nb_cuda_qargs a;
        nb_cuda_qargs_init(&a);
        a.scale = absmax(x, rows * n) / 448.0f;
        if (a.scale == 0.0f) a.scale = 1.0f;
        a.div_dtype = trial < 3 ? NB_F32 : NB_BF16;
        run_case(ctx, NB_FMT_FP8_TENSOR, x, rows, n, xdt, NB_F32, &a, "fp8 tensor, odd rows");
        nb_cuda_qargs_init(&a);
        a.row_scale = fp8_row_scales(x, rows, n, rs);
        run_case(ctx, NB_FMT_FP8_CHANNEL, x, rows, n, xdt, NB_BF16, &a, "fp8 channel, odd rows");
    }
    free(x);
}

/* FP8 quotients on and next to the rounding boundaries, where the kernels' multiply-by-1/s shortcut
 * must hand over to the division: x = RN(m * s) +- k ulp for every E4M3 midpoint and value m (and,
 * with a BF16 or F16 division, every midpoint of that dtype near them), for scales of every kind. */
static void test_fp8_boundaries(nb_ctx *ctx) {
    static const nb_dtype dts[3] = {NB_F32, NB_BF16, NB_F16};
    const int64_t n = 2048, rows = 16;
    float *x = malloc((size_t)(rows * n) * 4), rs[16];
    for (int trial = 0; trial < 9; trial++) {
        float s = trial == 0 ? 1.0f : trial == 1 ? ldexpf(1.0f, -7) : trial == 2 ? 3.0f / 448.0f
                : (float)(nbt_unif() * 2.0 + 0.01) * ldexpf(1.0f, (int)(nbt_rnd32() % 20) - 10);
        for (int64_t i = 0; i < rows * n; i++) {
            uint8_t c = (uint8_t)(nbt_rnd32() % 0x7F);
            float m = nb_e4m3_to_f32(c);
            if (nbt_rnd32() & 1) m = (m + nb_e4m3_to_f32((uint8_t)(c + 1))) * 0.5f;   /* the midpoint above c */
            if (nbt_rnd32() % 3 == 0) m = nb_bf16_to_f32((uint16_t)(nb_f32_to_bf16(m) + (nbt_rnd32() % 3) - 1)) +
                                         ldexpf(m, -9);   /* near a BF16 midpoint */
            float v = m * s;
            uint32_t u = nbt_f2u(v) + (uint32_t)((int)(nbt_rnd32() % 9) - 4);
            x[i] = nbt_u2f(u) * ((nbt_rnd32() & 1) ? -1.0f : 1.0f);
            if (!(fabsf(x[i]) < 3e38f)) x[i] = 0.0f;
        }
        for (int d = 0; d < 3; d++) {
            nb_cuda_qargs a;
            nb_cuda_qargs_init(&a);
            a.scale = s;
            a.div_dtype = dts[d];
            run_case(ctx, NB_FMT_FP8_TENSOR, x, rows, n, NB_F32, NB_F32, &a, "fp8 boundaries");
        }
        for (int64_t r = 0; r < rows; r++) rs[r] = s * (float)(1 + (r % 3 == 0 ? 0 : nbt_unif()));
        nb_cuda_qargs a;
        nb_cuda_qargs_init(&a);
        a.row_scale = rs;
        run_case(ctx, NB_FMT_FP8_CHANNEL, x, rows, n, NB_F32, NB_F32, &a, "fp8 channel boundaries");
    }
    free(x);
}

/* NaN and +-Inf inside rows (the API refuses them before quantizing, the kernels must still match the
 * reference): quantize data and scale bytes of NVFP4 dynamic / static, MXFP8 and FP8 from F32 and BF16. */
static void test_nonfinite(nb_ctx *ctx) {
    const int64_t rows = 8, n = 1024;
    float *x = malloc((size_t)(rows * n) * 4), *bam = malloc((size_t)(rows * n / 16) * 4);
    uint8_t *q0 = malloc((size_t)(rows * n)), *q1 = malloc((size_t)(rows * n));
    uint8_t *s0 = malloc((size_t)(rows * n / 16)), *s1 = malloc((size_t)(rows * n / 16));
    void *xb = malloc((size_t)(rows * n) * 4);
    float buf[1024], *buf2 = malloc((size_t)(rows * n) * 4);
    static const nb_qformat fmts[4] = {NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_MXFP8, NB_FMT_FP8_TENSOR};
    for (int trial = 0; trial < 8; trial++) {
        nb_dtype xdt = trial & 1 ? NB_BF16 : NB_F32;
        for (int64_t i = 0; i < rows * n; i++) {
            uint32_t k = nbt_rnd32() % 64;
            x[i] = k == 0 ? NAN : k == 1 ? -NAN : k == 2 ? INFINITY : k == 3 ? -INFINITY : (float)nb_rng_normal(&nbt_rng);
        }
        for (int64_t b = 0; b < rows * n / 16; b++) bam[b] = (float)(nbt_unif() * 3.0);
        for (int fi = 0; fi < 4; fi++) {
            nb_qformat f = fmts[fi];
            /* MXFP8 gets NaN only: the reference's E8M0 exponent of an infinite amax is undefined ((int) of
             * ceilf(log2(inf))) */
            for (int64_t i = 0; i < rows * n; i++) buf2[i] = f == NB_FMT_MXFP8 && isinf(x[i]) ? NAN : x[i];
            nbq_store_row(xb, xdt, 0, rows * n, buf2);
            nb_cuda_qargs a;
            nb_cuda_qargs_init(&a);
            a.scale = f == NB_FMT_FP8_TENSOR ? 2.5f / 448.0f : nb_nvfp4_scale2(3.0f, 448.0f);
            a.global_amax = 3.0f;
            a.block_amax = fi == 1 ? bam : NULL;
            const nb_qformat_traits *tr = nb_qformat_info(f);
            int64_t qrow = f == NB_FMT_NVFP4 ? n / 2 : n, srow = tr->block_size ? n / tr->block_size : 0;
            for (int64_t r = 0; r < rows; r++) {
                nb_qrow_args ra;
                memset(&ra, 0, sizeof ra);
                ra.scale = a.scale;
                ra.global_amax = a.global_amax;
                ra.block_amax = a.block_amax ? a.block_amax + r * (n / 16) : NULL;
                ra.div_dtype = NB_F32;
                nbq_load_row(xb, xdt, r, n, buf);
                if (f == NB_FMT_NVFP4) nb_nvfp4_quantize_row_ref(buf, n, &ra, q0 + r * qrow, s0 + r * srow);
                else if (f == NB_FMT_MXFP8) nb_mxfp8_quantize_row_ref(buf, n, &ra, q0 + r * qrow, s0 + r * srow);
                else nb_fp8_quantize_row_ref(buf, n, &ra, q0 + r * qrow, NULL);
            }
            CHECK_OK(ctx, nb_cuda_quantize_host(ctx, f, xb, xdt, rows, n, &a, q1, s1));
            CHECK_SAME(tr->name, q0, q1, rows * qrow, "non-finite quantize data (%s in, block amax %d)",
                       nb_dtype_info(xdt)->name, fi == 1);
            CHECK_SAME(tr->name, s0, s1, rows * srow, "non-finite quantize scales (%s in)", nb_dtype_info(xdt)->name);
            n_cases++;
        }
    }
    free(x); free(bam); free(q0); free(q1); free(s0); free(s1); free(xb); free(buf2);
}

static void test_errors(nb_ctx *ctx) {
    nb_cuda_qargs a;
    nb_cuda_qargs_init(&a);
    float x[48] = {0};
    uint8_t q[48], s[3];
    CHECK_FAIL(ctx, nb_cuda_quantize_host(ctx, NB_FMT_NVFP4, x, NB_F32, 1, 24, &a, q, s), NB_ERR_SHAPE,
               "not divisible by the block size 16");
    CHECK_FAIL(ctx, nb_cuda_quantize_host(ctx, NB_FMT_NONE, x, NB_F32, 1, 16, &a, q, s), NB_ERR_INVALID,
               "unknown or empty quantization format");
    CHECK_FAIL(ctx, nb_cuda_quantize_host(ctx, NB_FMT_FP8_CHANNEL, x, NB_F32, 1, 16, &a, q, s), NB_ERR_INVALID,
               "row_scale is required");
    CHECK_FAIL(ctx, nb_cuda_fake_quant_host(ctx, NB_FMT_FP8_TENSOR, x, NB_E4M3, 1, 16, &a, x, NB_F32), NB_ERR_UNSUPPORTED,
               "f32, bf16 or f16 only");
}

/* ---- the tensor entry points on device tensors ---------------------------------------------------------- */

/* A host tensor back from the device. */
static nb_tensor *to_host(nb_ctx *ctx, const nb_tensor *t) {
    nb_tensor *h = NULL;
    CHECK_OK(ctx, nb_tensor_to_device(ctx, t, NB_DEVICE_HOST, &h));
    return h;
}

static int same_bytes(nb_ctx *ctx, const nb_tensor *host, const nb_tensor *dev) {
    if (!host || !dev) return host == dev;
    nb_tensor *h = to_host(ctx, dev);
    int same = h && h->device == -1 && dev->device >= 0 && nb_tensor_nbytes(h) == nb_tensor_nbytes(host) &&
               !memcmp(nb_tensor_data(h), nb_tensor_data(host), (size_t)nb_tensor_nbytes(host));
    nb_tensor_release(h);
    return same;
}

static int same_qtensor(nb_ctx *ctx, const nb_qtensor *h, const nb_qtensor *d) {
    return h && d && h->format == d->format && same_bytes(ctx, h->data, d->data) && same_bytes(ctx, h->scale, d->scale) &&
           same_bytes(ctx, h->scale2, d->scale2);
}

/* nb_quantize / nb_quantize_into / nb_fake_quant / nb_qtensor_dequantize with x on the device against
 * the same calls on the host copy (whose paths are bit-equal to the references), every format, F32
 * and BF16 inputs, dynamic and static NVFP4, both MXFP8 rules, FP8 per tensor and per row. */
static void test_tensor_entry_points(nb_ctx *ctx) {
    enum { R = 37, N = 256 };
    int64_t sh[2] = {R, N}, bsh[2] = {R, N / NB_NVFP4_BLOCK};
    float *xf = malloc(sizeof(float) * R * N), *bam = malloc(sizeof(float) * R * (N / NB_NVFP4_BLOCK));
    int64_t n_calls = 0;
    for (int dt = 0; dt < 2; dt++) {
        nb_dtype xdt = dt ? NB_BF16 : NB_F32;
        for (int64_t i = 0; i < R * N; i++) xf[i] = (float)(nb_rng_normal(&nbt_rng) * ldexp(1.0, (int)(i / N % 9) - 4));
        for (int64_t b = 0; b < R * (N / NB_NVFP4_BLOCK); b++) {
            float m = 0.0f;
            for (int k = 0; k < NB_NVFP4_BLOCK; k++) m = fmaxf(m, fabsf(xf[b * NB_NVFP4_BLOCK + k]));
            bam[b] = m * 1.25f;   /* calibrated on other data: larger than this block's */
        }
        nb_tensor *xh32 = NULL, *xh = NULL, *xd = NULL, *bt = NULL;
        CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, sh, xf, &xh32));
        CHECK_OK(ctx, nb_tensor_to(ctx, xh32, xdt, &xh));
        CHECK_OK(ctx, nb_tensor_to_device(ctx, xh, 0, &xd));
        CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, bsh, bam, &bt));
        if (!xd || !bt) break;
        CHECK(xd->device == 0 && nb_buffer_kind_of(xd->buf) == NB_BUF_DEVICE && same_bytes(ctx, xh, xd));
        for (int c = 0; c < 7; c++) {
            static const nb_qformat F[7] = {NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_NVFP4_46, NB_FMT_MXFP8, NB_FMT_MXFP8,
                                            NB_FMT_FP8_TENSOR, NB_FMT_FP8_CHANNEL};
            nb_qparams p;
            nb_qparams_init(&p, F[c]);
            if (c == 1) p.block_amax = bt;   /* static NVFP4: the calibrated state stays on the host */
            if (c == 4) p.mx_floor = 1;
            p.name = "w";
            nb_qtensor *qh = NULL, *qd = NULL;
            CHECK_OK(ctx, nb_quantize(ctx, xh, &p, &qh));
            CHECK_OK(ctx, nb_quantize(ctx, xd, &p, &qd));
            CHECK_MSG(qd && qd->data->device == 0 && qd->scale->device == 0, "case %d: quantized tensor not on the device", c);
            CHECK_MSG(same_qtensor(ctx, qh, qd), "case %d (%s, %s input): device quantize differs from the host's", c,
                      nb_qformat_info(F[c])->name, nb_dtype_info(xdt)->name);
            if (qd) CHECK_OK(ctx, nb_quantize_into(ctx, xd, &p, qd));
            CHECK_MSG(same_qtensor(ctx, qh, qd), "case %d: nb_quantize_into on the device differs", c);
            for (int yt = 0; yt < 2; yt++) {
                nb_dtype ydt = yt ? NB_BF16 : NB_F32;
                nb_tensor *yh = NULL, *yd = NULL, *dh = NULL, *dd = NULL;
                CHECK_OK(ctx, nb_tensor_new(ctx, ydt, 2, sh, &yh));
                CHECK_OK(ctx, nb_tensor_new_on(ctx, 0, ydt, 2, sh, &yd));
                CHECK_OK(ctx, nb_fake_quant(ctx, xh, &p, yh));
                CHECK_OK(ctx, nb_fake_quant(ctx, xd, &p, yd));
                CHECK_MSG(same_bytes(ctx, yh, yd), "case %d: device fake quant (%s out) differs", c, nb_dtype_info(ydt)->name);
                CHECK_OK(ctx, nb_qtensor_dequantize(ctx, qh, ydt, &dh));
                if (qd) CHECK_OK(ctx, nb_qtensor_dequantize(ctx, qd, ydt, &dd));
                CHECK_MSG(dd && dd->device == 0 && same_bytes(ctx, dh, dd), "case %d: device dequantize differs", c);
                if (c == 0 && yt == 0) {   /* an output elsewhere is refused, naming both places */
                    CHECK_FAIL(ctx, nb_fake_quant(ctx, xd, &p, yh), NB_ERR_DEVICE,
                               "w: the input is on CUDA device 0, the output on the host");
                    CHECK_FAIL(ctx, nb_qtensor_dequantize_into(ctx, qd, yh), NB_ERR_DEVICE,
                               "dequantize: the input is on CUDA device 0, the output on the host");
                    CHECK_FAIL(ctx, nb_quantize_into(ctx, xh, &p, qd), NB_ERR_DEVICE,
                               "w: the input is on the host, the output on CUDA device 0");
                }
                n_calls += 2;
                nb_tensor_release(yh);
                nb_tensor_release(yd);
                nb_tensor_release(dh);
                nb_tensor_release(dd);
            }
            nb_qtensor_release(qh);
            nb_qtensor_release(qd);
        }
        /* a NaN is found and named as on the host (the plan is resolved from a host copy) */
        xf[5 * N + 3] = NAN;
        nb_tensor *xn = NULL, *xnd = NULL;
        CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, sh, xf, &xn));
        CHECK_OK(ctx, nb_tensor_to_device(ctx, xn, 0, &xnd));
        nb_qparams p;
        nb_qparams_init(&p, NB_FMT_FP8_TENSOR);
        nb_qtensor *qn = NULL;
        if (xnd) CHECK_FAIL(ctx, nb_quantize(ctx, xnd, &p, &qn), NB_ERR_NUMERIC, "NaN");
        CHECK(qn == NULL);
        nb_tensor_release(xn);
        nb_tensor_release(xnd);
        nb_tensor_release(xh32);
        nb_tensor_release(xh);
        nb_tensor_release(xd);
        nb_tensor_release(bt);
    }
    printf("device-tensor entry points compared with the host's: %lld fake quant / dequantize pairs\n", (long long)n_calls);
    free(xf);
    free(bam);
}

int main(void) {
    nb_ctx *ctx = NULL;
    CHECK_OK(ctx, nb_ctx_new(2, &ctx));
    if (nb_cuda_device_count() == 0) return no_device(ctx);
    printf("CUDA devices: %d\n", nb_cuda_device_count());
    nb_rng_seed(&nbt_rng, 0xc0dac0daULL);
    test_errors(ctx);
    test_mx_edges(ctx);
    test_formats(ctx);
    test_fp8_odd_rows(ctx);
    test_fp8_boundaries(ctx);
    test_nonfinite(ctx);
    test_tensor_entry_points(ctx);
    printf("configurations compared bit for bit with the scalar reference: %lld\n", (long long)n_cases);
    nb_ctx_release(ctx);
    return nbt_done("test_quant_cuda");
}

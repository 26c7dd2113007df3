/* The backend table of a context: chosen at creation from nb_ctx_options, with NIBBLE_SIMD,
 * NIBBLE_QUANT_PATH, NIBBLE_THREADS and NIBBLE_GEMM read then and never again; an option that is set
 * wins over the environment; two contexts with different SIMD levels and quantizer paths run side by
 * side in one process (in two threads at once) and each runs its own kernels, the quantizers giving
 * the same bits on both; and a tensor on a CUDA device where none can run is a clear NB_ERR_DEVICE. */
#define _POSIX_C_SOURCE 200809L   /* setenv, unsetenv */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "nbtest.h"
#include "backend.h"
#include "cpu/features.h"

static const char *const LEVELS[3] = {"scalar", "avx2", "avx512"};
static const char *const QPATHS[3] = {"reference", "avx2", "avx512"};

static void clear_env(void) {
    unsetenv("NIBBLE_SIMD");
    unsetenv("NIBBLE_QUANT_PATH");
    unsetenv("NIBBLE_THREADS");
    unsetenv("NIBBLE_GEMM");
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 256 ? n : 256) : 1;
}

/* ---- 1. the environment is read at creation, and only there --------------------------------------- */

static void test_env_at_creation(void) {
    char line[512];
    clear_env();
    setenv("NIBBLE_SIMD", "scalar", 1);
    setenv("NIBBLE_QUANT_PATH", "reference", 1);
    setenv("NIBBLE_THREADS", "3", 1);
    setenv("NIBBLE_GEMM", "openblas", 1);
    nb_ctx *a = NULL;
    CHECK_OK(a, nb_ctx_new(0, &a));
    if (!a) return;
    CHECK(!strcmp(nb_simd_level(a), "scalar"));
    CHECK(!strcmp(nb_quant_cpu_path(a), "reference"));
    CHECK_EQ_INT(nb_ctx_threads(a), 3);
    nb_ctx_describe_backend(a, line, sizeof line);
    CHECK_MSG(strstr(line, "cpu: simd scalar, quantizers reference, gemm openblas, 3 threads; cuda: ") == line, "%s", line);

    /* a different environment later changes nothing in a (its threads default included), and the
     * next context takes the new one */
    setenv("NIBBLE_SIMD", "auto", 1);
    setenv("NIBBLE_QUANT_PATH", "bogus", 1);
    setenv("NIBBLE_THREADS", "1", 1);
    unsetenv("NIBBLE_GEMM");
    CHECK(!strcmp(nb_simd_level(a), "scalar"));
    CHECK(!strcmp(nb_quant_cpu_path(a), "reference"));
    CHECK_OK(a, nb_ctx_set_threads(a, 0));
    CHECK_EQ_INT(nb_ctx_threads(a), 3);
    nb_ctx_describe_backend(a, line, sizeof line);
    CHECK_MSG(strstr(line, "gemm openblas") != NULL, "%s", line);
    int64_t sh[2] = {2, 32};
    nb_tensor *x = NULL, *y = NULL;
    CHECK_OK(a, nb_tensor_new(a, NB_F32, 2, sh, &x));
    CHECK_OK(a, nb_tensor_new(a, NB_F32, 2, sh, &y));
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    CHECK_OK(a, nb_fake_quant(a, x, &p, y));   /* the bad NIBBLE_QUANT_PATH came after a */

    nb_ctx *b = NULL;
    CHECK_OK(b, nb_ctx_new(0, &b));
    if (b) {
        CHECK(!strcmp(nb_simd_level(b), LEVELS[nb_cpu_simd_best()]));
        CHECK(!strcmp(nb_quant_cpu_path(b), QPATHS[nb_cpu_quant_best()]));   /* auto runs, and refuses: */
        CHECK_EQ_INT(nb_ctx_threads(b), 1);
        CHECK_FAIL(b, nb_fake_quant(b, x, &p, y), NB_ERR_INVALID, "NIBBLE_QUANT_PATH='bogus' is not a quantizer path");
        CHECK_OK(b, nb_quant_set_cpu_path(b, "reference"));   /* the program's choice replaces it */
        CHECK_OK(b, nb_fake_quant(b, x, &p, y));
        nb_ctx_describe_backend(b, line, sizeof line);
        CHECK_MSG(strstr(line, "gemm pool, 1 thread;") != NULL, "%s", line);
        nb_ctx_release(b);
    }
    nb_tensor_release(x);
    nb_tensor_release(y);
    nb_ctx_release(a);
    clear_env();
}

/* ---- 2. options win over the environment; bad options refuse the context ------------------------- */

static void test_options(void) {
    clear_env();
    setenv("NIBBLE_SIMD", "scalar", 1);
    setenv("NIBBLE_QUANT_PATH", "reference", 1);
    setenv("NIBBLE_THREADS", "3", 1);
    nb_ctx_options o;
    nb_ctx_options_init(&o);
    CHECK(o.threads == 0 && !o.simd && !o.quant_path && !o.gemm && o.cuda_device == 0 && !o.cuda_stream && !o.no_env);
    o.simd = "auto";
    o.quant_path = "auto";
    o.threads = 2;
    nb_ctx *c = NULL;
    CHECK_OK(c, nb_ctx_new_opts(&o, &c));
    if (c) {
        CHECK(!strcmp(nb_simd_level(c), LEVELS[nb_cpu_simd_best()]));
        CHECK(!strcmp(nb_quant_cpu_path(c), QPATHS[nb_cpu_quant_best()]));
        CHECK_EQ_INT(nb_ctx_threads(c), 2);
        /* the setter: this context only, with the option's messages */
        CHECK_OK(c, nb_ctx_set_simd(c, "scalar"));
        CHECK(!strcmp(nb_simd_level(c), "scalar"));
        CHECK_FAIL(c, nb_ctx_set_simd(c, "avx9"), NB_ERR_INVALID,
                   "simd option 'avx9' is not a SIMD level: expected auto, avx512, avx2 or scalar");
        CHECK(!strcmp(nb_simd_level(c), "scalar"));
        CHECK_OK(c, nb_ctx_set_threads(c, 0));   /* NIBBLE_THREADS as read at creation */
        CHECK_EQ_INT(nb_ctx_threads(c), 3);
        nb_ctx_release(c);
    }
    /* no_env: a variable that would refuse the context is not even read */
    setenv("NIBBLE_SIMD", "avx9", 1);
    setenv("NIBBLE_QUANT_PATH", "bogus", 1);
    nb_ctx_options_init(&o);
    o.no_env = 1;
    c = NULL;
    CHECK_OK(c, nb_ctx_new_opts(&o, &c));
    if (c) {
        CHECK(!strcmp(nb_simd_level(c), LEVELS[nb_cpu_simd_best()]));
        CHECK(!strcmp(nb_quant_cpu_path(c), QPATHS[nb_cpu_quant_best()]));
        CHECK_EQ_INT(nb_ctx_threads(c), online_cpus());
        nb_ctx_release(c);
    }
    clear_env();
    /* options that name nothing refuse the context, with the message on this thread */
    static const struct { const char *simd, *qpath, *gemm; nb_status st; const char *msg; } bad[] = {
        {"avx9", NULL, NULL, NB_ERR_INVALID, "simd option 'avx9' is not a SIMD level: expected auto, avx512, avx2 or scalar"},
        {NULL, "sse9", NULL, NB_ERR_INVALID, "quantizer path 'sse9': expected auto, avx512, avx2 or reference"},
        {NULL, NULL, "mkl", NB_ERR_INVALID, "gemm option 'mkl': expected pool or openblas"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nb_ctx_options_init(&o);
        o.simd = bad[i].simd;
        o.quant_path = bad[i].qpath;
        o.gemm = bad[i].gemm;
        c = NULL;
        nb_status s = nb_ctx_new_opts(&o, &c);
        CHECK_MSG(s == bad[i].st && !c && !strcmp(nb_ctx_last_error(NULL), bad[i].msg), "%s: %s", nb_status_name(s),
                  nb_ctx_last_error(NULL));
    }
    if (nb_cpu_simd_best() < NB_SIMD_AVX512) {
        nb_ctx_options_init(&o);
        o.simd = "avx512";
        c = NULL;
        CHECK_FAIL(NULL, nb_ctx_new_opts(&o, &c), NB_ERR_UNSUPPORTED, "simd option 'avx512': this CPU (or this build) lacks AVX-512F");
    }
}

/* ---- 3. two contexts side by side ------------------------------------------------------------------ */

enum { ROWS = 64, COLS = 512, OPS_N = 4099, RMS_ROWS = 33, RMS_D = 200 };

typedef struct side {
    nb_ctx *ctx;
    const nb_tensor *x;               /* BF16 [ROWS, COLS], shared read-only */
    const float *g, *u, *rx, *rw;     /* op inputs, shared read-only */
    nb_qtensor *q[NB_FMT_COUNT];
    nb_tensor *fake[NB_FMT_COUNT];
    float *swi, *rms;
    nb_status st;
} side;

/* Everything a side computes, on its own context; run in a thread while the other side runs. */
static void *side_run(void *arg) {
    side *s = arg;
    for (int f = NB_FMT_NVFP4; f < NB_FMT_COUNT && !s->st; f++) {
        nb_qparams p;
        nb_qparams_init(&p, (nb_qformat)f);
        if ((s->st = nb_quantize(s->ctx, s->x, &p, &s->q[f]))) break;
        if ((s->st = nb_tensor_new(s->ctx, NB_BF16, 2, s->x->shape, &s->fake[f]))) break;
        s->st = nb_fake_quant(s->ctx, s->x, &p, s->fake[f]);
    }
    if (!s->st) s->st = nb_op_swiglu_fwd(s->ctx, s->g, s->u, s->swi, OPS_N);
    if (!s->st) s->st = nb_op_rmsnorm_fwd(s->ctx, s->rx, s->rw, s->rms, NULL, RMS_ROWS, RMS_D, 1e-5f);
    return NULL;
}

static int same_tensor(const nb_tensor *a, const nb_tensor *b) {
    return a && b && nb_tensor_nbytes(a) == nb_tensor_nbytes(b) &&
           !memcmp(nb_tensor_data(a), nb_tensor_data(b), (size_t)nb_tensor_nbytes(a));
}

static void test_side_by_side(void) {
    clear_env();
    int best = nb_cpu_simd_best(), qbest = nb_cpu_quant_best();
    nb_ctx_options o;
    nb_ctx_options_init(&o);
    o.no_env = 1;
    o.threads = 2;
    o.simd = "scalar";
    o.quant_path = "reference";
    side s[2];
    memset(s, 0, sizeof s);
    CHECK_OK(NULL, nb_ctx_new_opts(&o, &s[0].ctx));
    o.simd = LEVELS[best];
    o.quant_path = QPATHS[qbest];
    CHECK_OK(NULL, nb_ctx_new_opts(&o, &s[1].ctx));
    if (!s[0].ctx || !s[1].ctx) return;
    CHECK(!strcmp(nb_simd_level(s[0].ctx), "scalar") && !strcmp(nb_quant_cpu_path(s[0].ctx), "reference"));
    CHECK(!strcmp(nb_simd_level(s[1].ctx), LEVELS[best]) && !strcmp(nb_quant_cpu_path(s[1].ctx), QPATHS[qbest]));
    if (best == NB_SIMD_SCALAR && qbest == NB_SIMD_SCALAR)
        printf("this CPU runs only the scalar paths: both contexts run the same kernels\n");

    /* shared inputs: a BF16 weight (the BF16 kernels of the avx512 path take it), op operands */
    nb_rng r;
    nb_rng_seed(&r, 16);
    int64_t sh[2] = {ROWS, COLS};
    nb_tensor *x = NULL;
    CHECK_OK(s[0].ctx, nb_tensor_new(s[0].ctx, NB_BF16, 2, sh, &x));
    if (!x) return;
    uint16_t *xb = nb_tensor_data(x);
    for (int64_t i = 0; i < ROWS * COLS; i++) xb[i] = nb_f32_to_bf16((float)(nb_rng_normal(&r) * (1 + i % 7)));
    float *g = malloc(sizeof(float) * OPS_N), *u = malloc(sizeof(float) * OPS_N);
    float *rx = malloc(sizeof(float) * RMS_ROWS * RMS_D), *rw = malloc(sizeof(float) * RMS_D);
    for (int i = 0; i < OPS_N; i++) g[i] = (float)nb_rng_normal(&r) * 4, u[i] = (float)nb_rng_normal(&r);
    for (int i = 0; i < RMS_ROWS * RMS_D; i++) rx[i] = (float)nb_rng_normal(&r);
    for (int i = 0; i < RMS_D; i++) rw[i] = (float)(1 + 0.1 * nb_rng_normal(&r));
    for (int k = 0; k < 2; k++) {
        s[k].x = x;
        s[k].g = g, s[k].u = u, s[k].rx = rx, s[k].rw = rw;
        s[k].swi = malloc(sizeof(float) * OPS_N);
        s[k].rms = malloc(sizeof(float) * RMS_ROWS * RMS_D);
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++) CHECK(pthread_create(&th[k], NULL, side_run, &s[k]) == 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) CHECK_MSG(s[k].st == NB_OK, "side %d: %s", k, nb_ctx_last_error(s[k].ctx));

    /* the quantizers: every path is bit-equal to the references, so the bytes agree */
    for (int f = NB_FMT_NVFP4; f < NB_FMT_COUNT; f++) {
        nb_qtensor *a = s[0].q[f], *b = s[1].q[f];
        CHECK_MSG(a && b && same_tensor(a->data, b->data) && same_tensor(a->scale, b->scale) &&
                  (!a->scale2 || same_tensor(a->scale2, b->scale2)), "format %d: quantized bytes differ between the contexts", f);
        CHECK_MSG(same_tensor(s[0].fake[f], s[1].fake[f]), "format %d: fake quant differs between the contexts", f);
    }
    /* the row kernels: each context ran its own level's table, while the other ran its own (the
     * levels round differently, so each is held to its table called directly) */
    float *want = malloc(sizeof(float) * OPS_N);
    for (int k = 0; k < 2; k++) {
        nb_simd_table_for(k ? best : NB_SIMD_SCALAR)->swiglu(g, u, want, OPS_N);
        CHECK_MSG(!memcmp(want, s[k].swi, sizeof(float) * OPS_N), "context %d: swiglu is not its %s rows'", k,
                  nb_simd_level(s[k].ctx));
    }
    /* rmsnorm: the same context alone gives the same bits as it gave beside the other */
    float *rms = malloc(sizeof(float) * RMS_ROWS * RMS_D);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(s[k].ctx, nb_op_rmsnorm_fwd(s[k].ctx, rx, rw, rms, NULL, RMS_ROWS, RMS_D, 1e-5f));
        CHECK_MSG(!memcmp(rms, s[k].rms, sizeof(float) * RMS_ROWS * RMS_D), "context %d: rmsnorm differs alone", k);
    }
    free(rms);
    free(want);
    for (int k = 0; k < 2; k++) {
        for (int f = 0; f < NB_FMT_COUNT; f++) {
            nb_qtensor_release(s[k].q[f]);
            nb_tensor_release(s[k].fake[f]);
        }
        free(s[k].swi);
        free(s[k].rms);
    }
    free(g), free(u), free(rx), free(rw);
    nb_tensor_release(x);
    /* a row function swapped on one context is not the other's */
    CHECK_OK(s[0].ctx, nb_qformat_set_rows(s[0].ctx, NB_FMT_FP8_TENSOR, nb_fp8_quantize_row_ref, NULL, NULL));
    CHECK(nb_qformat_rows(s[0].ctx, NB_FMT_FP8_TENSOR)->quantize == nb_fp8_quantize_row_ref);
    if (qbest > NB_SIMD_SCALAR) {
        CHECK(nb_qformat_rows(s[1].ctx, NB_FMT_FP8_TENSOR)->quantize != nb_fp8_quantize_row_ref);
        CHECK_OK(s[1].ctx, nb_qformat_set_rows(s[1].ctx, NB_FMT_FP8_TENSOR, nb_fp8_quantize_row_ref, NULL, NULL));
        CHECK(!strcmp(nb_quant_cpu_path(s[1].ctx), "mixed"));
        CHECK(!strcmp(nb_quant_cpu_path(s[0].ctx), "reference"));
    }
    CHECK(nb_qformat_ref_rows(NB_FMT_MXFP8)->fake == nb_mxfp8_fake_row_ref && !nb_qformat_ref_rows(NB_FMT_NONE) &&
          !nb_qformat_rows(s[0].ctx, NB_FMT_COUNT));
    nb_ctx_release(s[0].ctx);
    nb_ctx_release(s[1].ctx);
}

/* ---- 4. device tensors where no CUDA kernel can run ----------------------------------------------------- */

static void test_no_device(nb_ctx *ctx) {
    if (nb_cuda_built() && nb_cuda_device_count() > 0) {
        printf("a CUDA device is present: test_quant_cuda runs the device entry points\n");
        return;
    }
    const char *why = nb_cuda_built() ? "0 devices are available" : "built without CUDA";
    int64_t sh[2] = {2, 32};
    nb_tensor *x = NULL, *y = NULL, *d = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &x));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &y));
    if (!x || !y) return;
    CHECK_FAIL(ctx, nb_tensor_to_device(ctx, x, 0, &d), NB_ERR_DEVICE, "cuda device 0");
    CHECK(d == NULL);
    CHECK_FAIL(ctx, nb_tensor_new_on(ctx, NB_DEVICE_CTX, NB_F32, 2, sh, &d), NB_ERR_DEVICE, "cuda device 0");
    CHECK_FAIL(ctx, nb_tensor_new_on(ctx, -3, NB_F32, 2, sh, &d), NB_ERR_INVALID, "device -3");
    /* a tensor that says it is on device 0 (as one made where a GPU was would): the entry points
     * dispatch on the device and say why they cannot run there */
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_MXFP8);
    p.name = "w";
    x->device = 0;
    CHECK_FAIL(ctx, nb_fake_quant(ctx, x, &p, y), NB_ERR_DEVICE, "w: the input is on CUDA device 0, the output on the host");
    y->device = 0;
    CHECK_FAIL(ctx, nb_fake_quant(ctx, x, &p, y), NB_ERR_DEVICE, why);
    CHECK_FAIL(ctx, nb_fake_quant(ctx, x, &p, y), NB_ERR_DEVICE, "w: the input is on CUDA device 0");
    nb_qtensor *q = NULL;
    CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_DEVICE, why);
    CHECK(q == NULL);
    CHECK_OK(ctx, nb_qtensor_new(ctx, NB_FMT_MXFP8, 2, sh, &q));
    CHECK_FAIL(ctx, nb_quantize_into(ctx, x, &p, q), NB_ERR_DEVICE, "w: the input is on CUDA device 0, the output on the host");
    CHECK_FAIL(ctx, nb_qtensor_dequantize_into(ctx, q, y), NB_ERR_DEVICE, "dequantize: the input is on the host, the output on CUDA device 0");
    /* the host-memory operations refuse it rather than read a device address */
    nb_tensor *c = NULL;
    CHECK_FAIL(ctx, nb_tensor_contiguous(ctx, x, &c), NB_ERR_DEVICE, "contiguous: the tensor is on CUDA device 0");
    CHECK_FAIL(ctx, nb_tensor_to(ctx, x, NB_BF16, &c), NB_ERR_DEVICE, "to: the tensor is on CUDA device 0");
    CHECK_FAIL(ctx, nb_tensor_set(ctx, x, (int64_t[]){0, 0}, 1.0), NB_ERR_DEVICE, "set: the tensor is on CUDA device 0");
    CHECK(c == NULL && isnan(nb_tensor_get(x, (int64_t[]){0, 0})));
    x->device = y->device = -1;
    nb_qtensor_release(q);
    nb_tensor_release(x);
    nb_tensor_release(y);
}

int main(void) {
    test_env_at_creation();
    test_options();
    test_side_by_side();
    nb_ctx *ctx = NULL;
    CHECK_OK(ctx, nb_ctx_new(1, &ctx));
    if (ctx) test_no_device(ctx);
    nb_ctx_release(ctx);
    return nbt_done("test_backend");
}

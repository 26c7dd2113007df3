/* CUDA quantizer throughput: nb_cuda_quantize on a BF16 weight already on the GPU, for NVFP4,
 * four_over_six (static), MXFP8 and FP8 (per tensor, per channel), as a ratio to a device-to-device
 * cudaMemcpy of the same input bytes timed in this process (the peer: the GPU's copy bandwidth),
 * and as GB/s of input read. Per-tensor amaxes are given (calibrated), as the export path has them.
 * Before timing, each format's bytes are compared with the CPU's nb_quantize on the same tensor:
 * a mismatch is reported and the exit code is 1. Built only when CUDA is; exits 77 without a GPU.
 * Usage: bench_quant_cuda [--rows R] [--cols C] [--reps N]   (default 8192 x 8192, 20 reps) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/nibble.h"

#define CU(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef struct bcase {
    const char *label;
    nb_qformat fmt;
    int static_blocks;   /* four_over_six export path: per-block amax given */
} bcase;

static const bcase CASES[] = {
    {"nvfp4", NB_FMT_NVFP4, 0},   {"nvfp4_46", NB_FMT_NVFP4_46, 1}, {"mxfp8", NB_FMT_MXFP8, 0},
    {"fp8", NB_FMT_FP8_TENSOR, 0}, {"fp8_channel", NB_FMT_FP8_CHANNEL, 0},
};

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median of n event timings (ms) */
static float median(float *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_f);
    return t[n / 2];
}

static int64_t first_diff(const uint8_t *a, const uint8_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return -1;
}

int main(int argc, char **argv) {
    int64_t rows = 8192, cols = 8192;
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) cols = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--rows R] [--cols C] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (rows < 1 || cols < 32 || cols % 32 || reps < 1) {
        fprintf(stderr, "bench_quant_cuda: rows >= 1, cols a multiple of 32, reps >= 1\n");
        return 2;
    }
    if (nb_cuda_device_count() == 0) {
        printf("bench_quant_cuda: %s: nothing to measure\n", nb_cuda_built() ? "no CUDA device" : "built without CUDA");
        return 77;
    }
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(0, &ctx)) return 1;
    const int64_t numel = rows * cols, nblk16 = numel / 16;
    int64_t shape[2] = {rows, cols}, bshape[2] = {rows, cols / 16};
    nb_tensor *x = NULL, *bam = NULL;
    if (nb_tensor_new(ctx, NB_BF16, 2, shape, &x) || nb_tensor_new(ctx, NB_F32, 2, bshape, &bam)) return 1;
    uint16_t *xh = nb_tensor_data(x);
    float *bh = nb_tensor_data(bam), *rs = malloc((size_t)rows * sizeof *rs);
    nb_rng rng;
    nb_rng_seed(&rng, 1234);
    float amax = 0.0f;
    for (int64_t i = 0; i < numel; i++) {
        xh[i] = nb_f32_to_bf16((float)(nb_rng_normal(&rng) * 0.02));
        float a = fabsf(nb_bf16_to_f32(xh[i]));
        amax = a > amax ? a : amax;
    }
    for (int64_t b = 0; b < nblk16; b++) {   /* the per-block amax bench_quant.c gives four_over_six */
        float m = 0.0f;
        for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(nb_bf16_to_f32(xh[b * 16 + i])));
        bh[b] = b % 3 ? m : m * 1.5f;
    }
    float gam = 0.0f;
    for (int64_t b = 0; b < nblk16; b++) gam = fmaxf(gam, bh[b]);
    for (int64_t r = 0; r < rows; r++) {
        float m = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = fmaxf(m, fabsf(nb_bf16_to_f32(xh[r * cols + c])));
        rs[r] = m / 448.0f;
    }
    void *xd, *yd, *qd, *sd, *bd, *rd;
    CU(cudaMalloc(&xd, (size_t)numel * 2));
    CU(cudaMalloc(&yd, (size_t)numel * 2));
    CU(cudaMalloc(&qd, (size_t)numel));
    CU(cudaMalloc(&sd, (size_t)nblk16));
    CU(cudaMalloc(&bd, (size_t)nblk16 * 4));
    CU(cudaMalloc(&rd, (size_t)rows * 4));
    CU(cudaMemcpy(xd, xh, (size_t)numel * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(bd, bh, (size_t)nblk16 * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(rd, rs, (size_t)rows * 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float *t = malloc((size_t)reps * sizeof *t);
    const double gb = (double)numel * 2 / 1e9;

    /* the peer: a device-to-device copy of the same bytes */
    for (int r = -3; r < reps; r++) {
        CU(cudaEventRecord(e0, NULL));
        CU(cudaMemcpyAsync(yd, xd, (size_t)numel * 2, cudaMemcpyDeviceToDevice, NULL));
        CU(cudaEventRecord(e1, NULL));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&t[r], e0, e1));
    }
    const float copy_ms = median(t, reps);
    int dev = 0;
    struct cudaDeviceProp prop;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    printf("nibble bench_quant_cuda: %lld x %lld bf16 (%.1f MiB) on %s, %d runs each (median)\n", (long long)rows,
           (long long)cols, numel * 2 / 1048576.0, prop.name, reps);
    printf("cudaMemcpy D2D of the same bytes: %.4f ms = %.0f GB/s of input (%.0f GB/s read + write)\n\n", copy_ms,
           gb / copy_ms * 1e3, 2 * gb / copy_ms * 1e3);
    printf("%-12s %10s %10s %7s  %s\n", "format", "ms", "GB/s in", "ratio", "bytes vs CPU nb_quantize");

    uint8_t *qh = malloc((size_t)numel), *sh = malloc((size_t)nblk16);
    int bad = 0;
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        const bcase *bc = &CASES[c];
        nb_qparams p;
        nb_qparams_init(&p, bc->fmt);
        nb_cuda_qargs a;
        nb_cuda_qargs_init(&a);
        if (bc->fmt == NB_FMT_NVFP4) {
            p.amax = amax;
            a.scale = nb_nvfp4_scale2(amax, 448.0f);
        } else if (bc->fmt == NB_FMT_NVFP4_46) {
            p.block_amax = bam;
            p.global_amax = gam;
            a.global_amax = gam;
            a.scale = nb_nvfp4_scale2(gam, 256.0f);
            a.block_amax = bd;
        } else if (bc->fmt == NB_FMT_FP8_TENSOR) {
            p.amax = amax;
            a.scale = amax / 448.0f;
            a.div_dtype = NB_BF16;   /* nb_quantize's default for a BF16 input: ModelOpt's export rounding */
        } else if (bc->fmt == NB_FMT_FP8_CHANNEL) {
            a.row_scale = rd;
        }
        const nb_qformat_traits *tr = nb_qformat_info(bc->fmt);
        const int64_t qbytes = bc->fmt == NB_FMT_NVFP4 || bc->fmt == NB_FMT_NVFP4_46 ? numel / 2 : numel;
        const int64_t sbytes = tr->block_size ? numel / tr->block_size : 0;
        uint8_t *sdev = sbytes ? sd : NULL;
        /* correctness first: the same bytes as the CPU path */
        nb_qtensor *cpu = NULL;
        if (nb_quantize(ctx, x, &p, &cpu)) {
            fprintf(stderr, "%s: nb_quantize: %s\n", bc->label, nb_ctx_last_error(ctx));
            return 1;
        }
        if (nb_cuda_quantize(ctx, bc->fmt, xd, NB_BF16, rows, cols, &a, qd, sdev, NULL)) {
            fprintf(stderr, "%s: nb_cuda_quantize: %s\n", bc->label, nb_ctx_last_error(ctx));
            return 1;
        }
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(qh, qd, (size_t)qbytes, cudaMemcpyDeviceToHost));
        if (sbytes) CU(cudaMemcpy(sh, sd, (size_t)sbytes, cudaMemcpyDeviceToHost));
        int64_t dq = first_diff(qh, nb_tensor_data(cpu->data), qbytes);
        int64_t ds = sbytes ? first_diff(sh, nb_tensor_data(cpu->scale), sbytes) : -1;
        nb_qtensor_release(cpu);
        char verdict[96];
        if (dq < 0 && ds < 0) snprintf(verdict, sizeof verdict, "equal (%lld + %lld bytes)", (long long)qbytes, (long long)sbytes);
        else {
            bad = 1;
            snprintf(verdict, sizeof verdict, "DIFFER: data at byte %lld, scales at %lld", (long long)dq, (long long)ds);
        }
        for (int r = -3; r < reps; r++) {
            CU(cudaEventRecord(e0, NULL));
            nb_status s = nb_cuda_quantize(ctx, bc->fmt, xd, NB_BF16, rows, cols, &a, qd, sdev, NULL);
            CU(cudaEventRecord(e1, NULL));
            CU(cudaEventSynchronize(e1));
            if (s) {
                fprintf(stderr, "%s: nb_cuda_quantize: %s\n", bc->label, nb_ctx_last_error(ctx));
                return 1;
            }
            if (r >= 0) CU(cudaEventElapsedTime(&t[r], e0, e1));
        }
        float ms = median(t, reps);
        printf("%-12s %10.4f %10.0f %7.3f  %s\n", bc->label, ms, gb / ms * 1e3, copy_ms / ms, verdict);
    }
    printf("\nratio = cudaMemcpy time / quantize time (the copy writes as many bytes as it reads; the quantizers\n"
           "write 0.28-0.5 of them)\n");
    free(qh);
    free(sh);
    free(t);
    free(rs);
    cudaFree(xd);
    cudaFree(yd);
    cudaFree(qd);
    cudaFree(sd);
    cudaFree(bd);
    cudaFree(rd);
    nb_tensor_release(x);
    nb_tensor_release(bam);
    nb_ctx_release(ctx);
    return bad;
}

/* Quantizer throughput on a 4096x4096 BF16 weight: nb_quantize for NVFP4 (dynamic, four_over_six
 * static and per-block pick), MXFP8 and FP8 (per tensor, per channel), AVX2 path vs scalar
 * reference, as GB/s of input read and as a ratio to memcpy of the same bytes on the same threads,
 * measured in this process. Also splits one quantize into its passes to show where time goes.
 * Usage: bench_quant [--threads N] [--reps N] [--input raw_bf16_4096x4096.bin] [--formats a,b,..]
 *                    [--paths avx2,reference] [--quick] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nibble/nibble.h"
#include "nibble/quant_fast.h"
#include "quant/fast_internal.h"

enum { ROWS = 4096, COLS = 4096 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (all pool threads; the pool sleeps, never spins, while idle). On a
 * shared machine this is the work done, which time slices by other processes do not inflate. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct timing {
    double wall, best, cpu;   /* median wall, best wall, median process CPU time (seconds) */
} timing;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median (and, through *best, the minimum: the least disturbed run on a shared machine). */
static double median_best(double *t, int n, double *best) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    if (best) *best = t[0];
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* ---- memcpy peer: the same bytes split over the same pool ---------------------------------- */

typedef struct copy_job {
    uint8_t *dst;
    const uint8_t *src;
    int64_t bytes, chunk;
} copy_job;

static void copy_range(void *arg, int64_t b, int64_t e) {
    copy_job *j = arg;
    for (int64_t c = b; c < e; c++) {
        int64_t lo = c * j->chunk, hi = lo + j->chunk < j->bytes ? lo + j->chunk : j->bytes;
        memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo));
    }
}

static timing time_memcpy(nb_ctx *ctx, void *dst, const void *src, int64_t bytes, int reps) {
    int threads = nb_ctx_threads(ctx);
    copy_job j = {dst, src, bytes, (bytes + threads - 1) / threads};
    double *t = malloc((size_t)reps * sizeof *t), *c = malloc((size_t)reps * sizeof *c);
    copy_range(&j, 0, threads);   /* fault in */
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        nb_parallel_for(ctx, threads, 1, copy_range, &j);
        t[r] = now_s() - t0;
        c[r] = cpu_s() - c0;
    }
    timing tm;
    tm.wall = median_best(t, reps, &tm.best);
    tm.cpu = median_best(c, reps, NULL);
    free(t);
    free(c);
    return tm;
}

/* ---- quantize cases ------------------------------------------------------------------------- */

typedef struct bcase {
    const char *label;
    nb_qformat fmt;
    int static_blocks;   /* NVFP4_46 with calibrated per-block amax (the export path) */
} bcase;

static const bcase CASES[] = {
    {"nvfp4", NB_FMT_NVFP4, 0},
    {"nvfp4_46", NB_FMT_NVFP4_46, 1},
    {"nvfp4_46_pick", NB_FMT_NVFP4_46, 0},
    {"mxfp8", NB_FMT_MXFP8, 0},
    {"fp8", NB_FMT_FP8_TENSOR, 0},
    {"fp8_channel", NB_FMT_FP8_CHANNEL, 0},
};

static timing time_quantize(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, int reps) {
    double *t = malloc((size_t)reps * sizeof *t), *c = malloc((size_t)reps * sizeof *c);
    for (int r = -2; r < reps; r++) {
        nb_qtensor *q = NULL;
        double t0 = now_s(), c0 = cpu_s();
        nb_status s = nb_quantize(ctx, x, p, &q);
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (s) {
            fprintf(stderr, "nb_quantize: %s\n", nb_ctx_last_error(ctx));
            exit(1);
        }
        nb_qtensor_release(q);
        if (r >= 0) {
            t[r] = dt;
            c[r] = dc;
        }
    }
    timing tm;
    tm.wall = median_best(t, reps, &tm.best);
    tm.cpu = median_best(c, reps, NULL);
    free(t);
    free(c);
    return tm;
}

/* ---- where time goes: the passes of one quantize, timed alone ------------------------------------ */

typedef struct pass_job {
    const uint16_t *x;
    float *f;
    const nb_qformat_traits *tr;
    nb_qrow_args a;
    uint8_t *q, *s;
    int mode;   /* 0 absmax, 1 bf16->f32 rows, 2 rows on f32 */
    float part[64];
} pass_job;

static void pass_range(void *arg, int64_t b, int64_t e) {
    pass_job *j = arg;
    if (j->mode == 0) {
        int nf;
        j->part[b * 63 / ROWS] = nbq_fast_absmax(j->x + b * COLS, NB_BF16, (e - b) * COLS, &nf);
        return;
    }
    for (int64_t r = b; r < e; r++) {
        if (j->mode == 1) nbq_fast_load_f32(j->x + r * COLS, NB_BF16, COLS, j->f + r * COLS);
        else j->tr->quantize_row(j->f + r * COLS, COLS, &j->a, j->q + r * COLS, j->s + r * (COLS / 16));
    }
}

static double time_pass(nb_ctx *ctx, pass_job *j, int reps) {
    double *t = malloc((size_t)reps * sizeof *t);
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        nb_parallel_for(ctx, ROWS, 1, pass_range, j);
        if (r >= 0) t[r] = now_s() - t0;
    }
    double m = median_best(t, reps, NULL);
    free(t);
    return m;
}

static int wanted(const char *list, const char *label) {
    if (!list) return 1;
    size_t n = strlen(label);
    for (const char *p = list; (p = strstr(p, label)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 15, quick = 0;
    const char *input = NULL, *formats = NULL, *pathlist = "avx2,reference";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--input") && i + 1 < argc) input = argv[++i];
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) formats = argv[++i];
        else if (!strcmp(argv[i], "--paths") && i + 1 < argc) pathlist = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--input raw.bin] [--formats nvfp4,mxfp8,..] [--paths avx2,reference] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(threads, &ctx)) return 1;
    const int64_t shape[2] = {ROWS, COLS};
    nb_tensor *x = NULL;
    if (nb_tensor_new(ctx, NB_BF16, 2, shape, &x)) return 1;
    uint16_t *xd = nb_tensor_data(x);
    const int64_t bytes = (int64_t)ROWS * COLS * 2;
    if (input) {
        FILE *f = fopen(input, "rb");
        if (!f || fread(xd, 1, (size_t)bytes, f) != (size_t)bytes) {
            fprintf(stderr, "cannot read %lld bytes of bf16 from %s\n", (long long)bytes, input);
            return 1;
        }
        fclose(f);
    } else {
        nb_rng *rng = nb_ctx_rng(ctx);
        nb_rng_seed(rng, 1234);
        for (int64_t i = 0; i < (int64_t)ROWS * COLS; i++) xd[i] = nb_f32_to_bf16((float)(0.02 * nb_rng_normal(rng)));
    }
    uint8_t *dst = malloc((size_t)bytes);
    timing cp = time_memcpy(ctx, dst, xd, bytes, reps * 2);
    double gb = (double)bytes / 1e9;
    printf("nibble bench_quant: %dx%d bf16 (%.1f MiB), %d threads, %d runs each; CPU path at load: %s\n", ROWS, COLS,
           (double)bytes / 1048576.0, threads, reps, nb_quant_cpu_path());
    printf("memcpy of the same bytes: median %.3f ms = %.1f GB/s, best %.3f ms = %.1f GB/s, cpu %.3f ms\n", cp.wall * 1e3,
           gb / cp.wall, cp.best * 1e3, gb / cp.best, cp.cpu * 1e3);
    printf("GB/s in = input bytes / best wall time; ratio = memcpy / quantize time: medians, bests, and process CPU\n"
           "times (all threads: the work done, robust to other load on the machine)\n\n");
    printf("%-15s %-10s %9s %9s %9s %9s %7s %7s %7s\n", "format", "path", "ms", "best ms", "cpu ms", "GB/s in", "ratio",
           "best", "cpu");

    /* per-block amax for the four_over_six export path: max calibration, every 3rd block at x1.5 */
    nb_tensor *bam = NULL;
    const int64_t bshape[2] = {ROWS, COLS / 16};
    if (nb_tensor_new(ctx, NB_F32, 2, bshape, &bam)) return 1;
    float *bd = nb_tensor_data(bam);
    for (int64_t b = 0; b < (int64_t)ROWS * COLS / 16; b++) {
        float m = 0.0f;
        for (int i = 0; i < 16; i++) {
            float v = fabsf(nb_bf16_to_f32(xd[b * 16 + i]));
            m = v > m ? v : m;
        }
        bd[b] = b % 3 ? m : m * 1.5f;
    }
    const char *paths[2] = {"avx2", "reference"};
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        if (!wanted(formats, CASES[c].label)) continue;
        nb_qparams p;
        nb_qparams_init(&p, CASES[c].fmt);
        if (CASES[c].static_blocks) p.block_amax = bam;
        for (int k = 0; k < 2; k++) {
            if (!wanted(pathlist, paths[k])) continue;
            if (nb_quant_set_cpu_path(ctx, paths[k])) {
                printf("%-15s %-10s %s\n", CASES[c].label, paths[k], nb_ctx_last_error(ctx));
                continue;
            }
            int r = k == 1 ? (quick ? 1 : 3) : reps;
            timing tq = time_quantize(ctx, x, &p, r);
            printf("%-15s %-10s %9.3f %9.3f %9.3f %9.2f %7.3f %7.3f %7.3f\n", CASES[c].label, paths[k], tq.wall * 1e3,
                   tq.best * 1e3, tq.cpu * 1e3, gb / tq.best, cp.wall / tq.wall, cp.best / tq.best, cp.cpu / tq.cpu);
        }
    }
    nb_quant_set_cpu_path(ctx, "auto");

    /* where the time of one nvfp4 quantize goes (AVX2 path) */
    if (wanted(formats, "nvfp4")) {
        pass_job j;
        memset(&j, 0, sizeof j);
        j.x = xd;
        j.f = malloc((size_t)ROWS * COLS * sizeof(float));
        j.q = malloc((size_t)ROWS * COLS);
        j.s = malloc((size_t)ROWS * COLS / 16);
        j.tr = nb_qformat_info(NB_FMT_NVFP4);
        j.mode = 1;
        time_pass(ctx, &j, 1);
        int nf;
        float amax = nbq_fast_absmax(xd, NB_BF16, (int64_t)ROWS * COLS, &nf);
        j.a.scale = nb_nvfp4_scale2(amax, 448.0f);
        j.a.global_amax = amax;
        j.a.div_dtype = NB_F32;
        printf("\nnvfp4 passes (avx2, %d threads), each timed alone:\n", threads);
        j.mode = 0;
        printf("  absmax + NaN/Inf scan of the bf16 tensor: %.3f ms\n", time_pass(ctx, &j, reps) * 1e3);
        j.mode = 1;
        printf("  bf16 -> f32 rows:                          %.3f ms\n", time_pass(ctx, &j, reps) * 1e3);
        j.mode = 2;
        printf("  row functions on f32 rows:                 %.3f ms\n", time_pass(ctx, &j, reps) * 1e3);
        free(j.f);
        free(j.q);
        free(j.s);
    }
    free(dst);
    nb_tensor_release(bam);
    nb_tensor_release(x);
    nb_ctx_release(ctx);
    return 0;
}

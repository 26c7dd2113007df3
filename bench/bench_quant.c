/* Quantizer throughput on a BF16 weight (4096x4096 unless --rows / --cols say otherwise): nb_quantize for NVFP4 (dynamic, four_over_six
 * static and per-block pick), MXFP8 and FP8 (per tensor, per channel), AVX-512 / AVX2 paths vs the
 * scalar reference, as GB/s of input read and as a ratio to memcpy of the same bytes on the same
 * threads, measured in this process. Each case runs twice: "new" (nb_quantize allocates the output
 * each time) and "into" (nb_quantize_into reuses one output, like memcpy's pre-faulted destination).
 * "_cal" cases pass the per-tensor amax (as a calibrated quantizer does), so no amax pass runs.
 * Also prints the bytes each case must move and the amax pass timed alone. With NIBBLE_BENCH_JSON set
 * (bench/record.lua) it also writes its table there, as bench/results/quant.json.
 * Usage: bench_quant [--threads N] [--reps N] [--rows R] [--cols C] [--input raw_bf16_RxC.bin]
 *                    [--formats a,b,..] [--paths avx512,avx2,reference] [--quick]
 * --cols must be a multiple of 32 (the MXFP8 block); rows of 576 or 896 (SmolLM2-135M's widths) show the
 * kernels' row tails, which 4096 never has. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/nibble.h"
#include "nibble/quant_fast.h"
#include "cpu/fast_internal.h"
#include "bench_common.h"

static int64_t ROWS = 4096, COLS = 4096;

typedef struct timing {
    double wall, best, cpu;   /* median wall, best wall, median process CPU time (seconds) */
} timing;

/* The timing of reps runs from their wall times t and CPU times c (malloc'd; this frees them). */
static timing timing_of(double *t, double *c, int reps) {
    timing tm;
    tm.wall = bench_median(t, reps, &tm.best);
    tm.cpu = bench_median(c, reps, NULL);
    free(t);
    free(c);
    return tm;
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
        double t0 = bench_now(), c0 = bench_cpu();
        nb_parallel_for(ctx, threads, 1, copy_range, &j);
        t[r] = bench_now() - t0;
        c[r] = bench_cpu() - c0;
    }
    return timing_of(t, c, reps);
}

/* ---- quantize cases ------------------------------------------------------------------------- */

typedef struct bcase {
    const char *label;
    nb_qformat fmt;
    int static_blocks;   /* 1: calibrated per-block amax (static block scales, the export path); 2: calibrated amax */
} bcase;

static const bcase CASES[] = {
    {"nvfp4", NB_FMT_NVFP4, 0},
    {"nvfp4_cal", NB_FMT_NVFP4, 2},
    {"nvfp4_static", NB_FMT_NVFP4, 1},
    {"nvfp4_46", NB_FMT_NVFP4_46, 1},
    {"nvfp4_46_pick", NB_FMT_NVFP4_46, 0},
    {"mxfp8", NB_FMT_MXFP8, 0},
    {"fp8", NB_FMT_FP8_TENSOR, 0},
    {"fp8_cal", NB_FMT_FP8_TENSOR, 2},
    {"fp8_channel", NB_FMT_FP8_CHANNEL, 0},
};

/* Bytes a case must move at least: read the bf16 input (twice when the per-tensor amax comes from
 * the data: one pass for amax and NaN/Inf, one to quantize), write data and scales. */
static double case_bytes(const bcase *c, int64_t numel) {
    double in = 2.0 * (double)numel, out;
    int two_pass = (c->fmt == NB_FMT_NVFP4 && c->static_blocks == 0) || (c->fmt == NB_FMT_FP8_TENSOR && c->static_blocks == 0);
    if (c->fmt == NB_FMT_NVFP4 || c->fmt == NB_FMT_NVFP4_46) out = numel / 2.0 + numel / 16.0;
    else if (c->fmt == NB_FMT_MXFP8) out = numel + numel / 32.0;
    else out = (double)numel;
    if (c->static_blocks == 1) in += 4.0 * numel / 16.0;   /* the f32 per-block amax */
    return in * (two_pass ? 2 : 1) + out;
}

static timing time_quantize(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, int reps, int into) {
    double *t = malloc((size_t)reps * sizeof *t), *c = malloc((size_t)reps * sizeof *c);
    nb_qtensor *keep = NULL;
    if (into && nb_quantize(ctx, x, p, &keep)) {
        fprintf(stderr, "nb_quantize: %s\n", nb_ctx_last_error(ctx));
        exit(1);
    }
    for (int r = -2; r < reps; r++) {
        nb_qtensor *q = NULL;
        double t0 = bench_now(), c0 = bench_cpu();
        nb_status s = into ? nb_quantize_into(ctx, x, p, keep) : nb_quantize(ctx, x, p, &q);
        double dt = bench_now() - t0, dc = bench_cpu() - c0;
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
    nb_qtensor_release(keep);
    return timing_of(t, c, reps);
}

/* ---- the amax pass alone: max |x| and the NaN/Inf scan over the whole tensor, threaded -------- */

typedef struct amax_job {
    const uint16_t *x;
    int64_t per, numel;
    float part[64];
} amax_job;

static void amax_range(void *arg, int64_t b, int64_t e) {
    amax_job *j = arg;
    for (int64_t c = b; c < e; c++) {
        int nf;
        int64_t lo = c * j->per, hi = c == 63 ? j->numel : lo + j->per;   /* the last part takes the remainder */
        j->part[c] = nbq_fast_absmax(j->x + lo, NB_BF16, hi - lo, &nf);
    }
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
    const char *input = NULL, *formats = NULL, *pathlist = "avx512,avx2,reference";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) ROWS = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) COLS = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--input") && i + 1 < argc) input = argv[++i];
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) formats = argv[++i];
        else if (!strcmp(argv[i], "--paths") && i + 1 < argc) pathlist = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--rows R] [--cols C] [--input raw.bin] [--formats nvfp4,mxfp8,..] [--paths avx512,avx2,reference] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (ROWS < 1 || COLS < 32 || COLS % 32) {
        fprintf(stderr, "--rows must be positive and --cols a positive multiple of 32\n");
        return 2;
    }
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
    printf("nibble bench_quant: %lldx%lld bf16 (%.1f MiB), %d threads, %d runs each; CPU path at the context's creation: %s\n", (long long)ROWS, (long long)COLS,
           (double)bytes / 1048576.0, threads, reps, nb_quant_cpu_path(ctx));
    printf("memcpy of the same bytes (destination pre-faulted, reused): median %.3f ms = %.1f GB/s, best %.3f ms = %.1f GB/s, "
           "cpu %.3f ms\n",
           cp.wall * 1e3, gb / cp.wall, cp.best * 1e3, gb / cp.best, cp.cpu * 1e3);
    printf("memcpy moves %.0f MiB (read + write): %.1f GB/s of traffic at its best\n", 2.0 * bytes / 1048576.0,
           2.0 * gb / cp.best);
    printf("GB/s in = input bytes / best wall time; ratio = memcpy / quantize time: medians, bests, and process CPU\n"
           "times (all threads: the work done, robust to other load on the machine). out: new = nb_quantize allocates\n"
           "the output each call, into = nb_quantize_into reuses one (as memcpy reuses its destination). MiB = the\n"
           "least traffic the case needs (input read once, or twice with an amax pass, plus outputs); min ms = that\n"
           "traffic at memcpy's best GB/s\n\n");
    printf("%-14s %-9s %-4s %8s %8s %8s %7s %6s %6s %6s %5s %6s\n", "format", "path", "out", "ms", "best ms", "cpu ms",
           "GB/s in", "ratio", "best", "cpu", "MiB", "min ms");
    bench_json js;
    char title[160], caption[200];
    snprintf(title, sizeof title, "Quantizer throughput against memcpy (%lldx%lld BF16)", (long long)ROWS, (long long)COLS);
    if (bench_json_open(&js, "quant", title, threads) < 0) {
        fprintf(stderr, "bench_quant: cannot write $NIBBLE_BENCH_JSON\n");
        return 1;
    }
    static const char *const cols[] = {"format", "path", "out", "ms", "best ms", "cpu ms", "GB/s in", "ratio",
                                       "ratio (best)", "ratio (cpu)", "MiB", "min ms"};
    snprintf(caption, sizeof caption, "nb_quantize, median of %d runs (reference path: %d); ratio = memcpy time / quantize time",
             reps, quick ? 1 : 3);
    bench_json_table(&js, caption, 12, cols);

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
    int nf;
    const float data_amax = nbq_fast_absmax(xd, NB_BF16, (int64_t)ROWS * COLS, &nf);
    const double traffic_gbs = 2.0 * gb / cp.best;
    const char *paths[3] = {"avx512", "avx2", "reference"}, *skipped[3];
    int nskipped = 0;
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        if (!wanted(formats, CASES[c].label)) continue;
        nb_qparams p;
        nb_qparams_init(&p, CASES[c].fmt);
        if (CASES[c].static_blocks == 1) p.block_amax = bam;
        if (CASES[c].static_blocks == 2) p.amax = data_amax;   /* calibrated: what max calibration stores */
        double mib = case_bytes(&CASES[c], (int64_t)ROWS * COLS) / 1048576.0;
        for (int k = 0; k < 3; k++) {
            if (!wanted(pathlist, paths[k])) continue;
            if (nb_quant_set_cpu_path(ctx, paths[k])) {
                printf("%-14s %-9s %s\n", CASES[c].label, paths[k], nb_ctx_last_error(ctx));
                int seen = 0;
                for (int i = 0; i < nskipped; i++) seen |= skipped[i] == paths[k];
                if (!seen) skipped[nskipped++] = paths[k];   /* at most the 3 paths */
                continue;
            }
            for (int into = 0; into < 2; into++) {
                if (k == 2 && into) continue;
                int r = k == 2 ? (quick ? 1 : 3) : reps;
                timing tq = time_quantize(ctx, x, &p, r, into);
                const double v[9] = {tq.wall * 1e3, tq.best * 1e3, tq.cpu * 1e3, gb / tq.best, cp.wall / tq.wall,
                                     cp.best / tq.best, cp.cpu / tq.cpu, mib, mib * 1048576.0 / 1e9 / traffic_gbs * 1e3};
                static const char *const vf[9] = {"%.3f", "%.3f", "%.3f", "%.2f", "%.3f", "%.3f", "%.3f", "%.0f", "%.3f"};
                char cell[9][24];
                const char *cells[12] = {CASES[c].label, paths[k], into ? "into" : "new"};
                for (int i = 0; i < 9; i++) {
                    snprintf(cell[i], sizeof cell[i], vf[i], v[i]);
                    cells[3 + i] = cell[i];
                }
                printf("%-14s %-9s %-4s %8s %8s %8s %7s %6s %6s %6s %5s %6s\n", cells[0], cells[1], cells[2], cells[3],
                       cells[4], cells[5], cells[6], cells[7], cells[8], cells[9], cells[10], cells[11]);
                bench_json_row(&js, 12, cells);
            }
        }
    }
    nb_quant_set_cpu_path(ctx, "auto");

    /* the amax pass that nvfp4 and fp8 (amax from the data) run before quantizing */
    {
        amax_job j;
        j.x = xd;
        j.numel = (int64_t)ROWS * COLS;
        j.per = j.numel / 64;
        double *t = malloc((size_t)reps * sizeof *t);
        for (int r = -1; r < reps; r++) {
            double t0 = bench_now();
            nb_parallel_for(ctx, 64, 1, amax_range, &j);
            if (r >= 0) t[r] = bench_now() - t0;
        }
        double best, med = bench_median(t, reps, &best);
        printf("\namax + NaN/Inf pass alone (reads the %.1f MiB once, %d threads): median %.3f ms, best %.3f ms "
               "(= %.2f of memcpy's best time)\n", (double)bytes / 1048576.0, threads, med * 1e3, best * 1e3, best / cp.best);
        bench_json_note(&js, "memcpy of the same bytes (destination pre-faulted, reused): median %.3f ms = %.1f GB/s, best "
                        "%.3f ms = %.1f GB/s of input (%.1f GB/s of read + write traffic)", cp.wall * 1e3, gb / cp.wall,
                        cp.best * 1e3, gb / cp.best, 2.0 * gb / cp.best);
        bench_json_note(&js, "amax + NaN/Inf pass alone (reads the input once): median %.3f ms, best %.3f ms (%.2f of "
                        "memcpy's best time)", med * 1e3, best * 1e3, best / cp.best);
        bench_json_note(&js, "CPU path chosen at the context's creation: %s; out: new = nb_quantize allocates the output each call, into = "
                        "nb_quantize_into reuses one; MiB = the least traffic the case needs (the input once, or twice "
                        "when the amax comes from the data, plus the outputs); min ms = that traffic at memcpy's best rate",
                        nb_quant_cpu_path(ctx));
        for (int i = 0; i < nskipped; i++) bench_json_note(&js, "path %s: not available on this CPU", skipped[i]);
        free(t);
    }
    if (bench_json_close(&js)) {
        fprintf(stderr, "bench_quant: cannot write $NIBBLE_BENCH_JSON\n");
        return 1;
    }
    free(dst);
    nb_tensor_release(bam);
    nb_tensor_release(x);
    nb_ctx_release(ctx);
    return 0;
}

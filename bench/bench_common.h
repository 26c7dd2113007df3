/* Timing helpers the bench programs share: the wall and process-CPU clocks and the median (and best)
 * of repeated runs. A header, not a bench_*.c: bench/CMakeLists.txt makes every bench_*.c a program. */
#ifndef NIBBLE_BENCH_COMMON_H
#define NIBBLE_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nibble/blas.h"

static inline double bench_clock(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Wall time in seconds (monotonic). */
static inline double bench_now(void) { return bench_clock(CLOCK_MONOTONIC); }

/* CPU time of the whole process (all threads) in seconds: on a shared machine it counts the work done,
 * which time slices given to other processes do not inflate (a thread spinning while it waits does
 * count; nibble's pool sleeps when idle). */
static inline double bench_cpu(void) { return bench_clock(CLOCK_PROCESS_CPUTIME_ID); }

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n), which it sorts; through *best (if given) the minimum, the least disturbed run.
 * Medians, not means: the machine is shared, and a mean follows whatever else ran meanwhile. */
static inline double bench_median(double *v, int n, double *best) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    if (best) *best = v[0];
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A JSON string (quotes, backslashes and control characters escaped). */
static inline void bench_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* `, "blas": LIBRARY, "blas_core": KERNELS, "gemm": LINE` for a bench's JSON line: which GEMM kernels the
 * numbers were measured on (the line nibble --version prints). */
static inline void bench_print_blas_json(nb_ctx *ctx) {
    nb_blas_info info;
    char line[1024];
    if (nb_blas_get(ctx, &info) != NB_OK) return;
    nb_blas_describe(&info, line, sizeof line);
    printf(", \"blas\": ");
    bench_json_str(stdout, info.library);
    printf(", \"blas_core\": ");
    bench_json_str(stdout, info.core);
    printf(", \"gemm\": ");
    bench_json_str(stdout, line);
}

#endif

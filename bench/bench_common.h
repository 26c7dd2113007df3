/* What the bench programs share: the wall and process-CPU clocks, the median (and best) of repeated
 * runs, and the result fragment bench/record.lua collects (bench/results.lua has the format). A header,
 * not a bench_*.c: bench/CMakeLists.txt makes every bench_*.c a program. */
#ifndef NIBBLE_BENCH_COMMON_H
#define NIBBLE_BENCH_COMMON_H

#include <stdarg.h>
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

/* ---- the result fragment ---------------------------------------------------------------------
 * When the environment names a file in NIBBLE_BENCH_JSON (bench/record.lua does), a bench writes there
 * {"bench", "title", "threads", "tables": [{"caption", "columns", "rows"}], "notes"}: its tables with
 * every cell as the bench formatted it, so bench/RESULTS.md shows the digits the console showed.
 * Calls: open, then per table bench_json_table and its rows, then notes, then close. */
typedef struct bench_json {
    FILE *f;
    int tables, rows, notes, in_notes;
} bench_json;

static inline void bench_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* 1 when NIBBLE_BENCH_JSON is set and its file opened (then j is open), 0 when it is not set, -1 on error. */
static inline int bench_json_open(bench_json *j, const char *bench, const char *title, int threads) {
    const char *path = getenv("NIBBLE_BENCH_JSON");
    j->f = NULL;
    j->tables = j->rows = j->notes = j->in_notes = 0;
    if (!path || !*path) return 0;
    if (!(j->f = fopen(path, "w"))) return -1;
    fputs("{\"bench\": ", j->f);
    bench_json_str(j->f, bench);
    fputs(", \"title\": ", j->f);
    bench_json_str(j->f, title);
    fprintf(j->f, ", \"threads\": %d, \"tables\": [", threads);
    return 1;
}

static inline void bench_json_end_table(bench_json *j) {
    if (j->tables > 0) fputs("]}", j->f);
}

static inline void bench_json_table(bench_json *j, const char *caption, int ncols, const char *const *cols) {
    if (!j->f) return;
    bench_json_end_table(j);
    fputs(j->tables++ ? ", {\"caption\": " : "{\"caption\": ", j->f);
    bench_json_str(j->f, caption);
    fputs(", \"columns\": [", j->f);
    for (int i = 0; i < ncols; i++) {
        if (i) fputs(", ", j->f);
        bench_json_str(j->f, cols[i]);
    }
    fputs("], \"rows\": [", j->f);
    j->rows = 0;
}

static inline void bench_json_row(bench_json *j, int ncells, const char *const *cells) {
    if (!j->f) return;
    fputs(j->rows++ ? ", [" : "[", j->f);
    for (int i = 0; i < ncells; i++) {
        if (i) fputs(", ", j->f);
        bench_json_str(j->f, cells[i]);
    }
    fputc(']', j->f);
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void bench_json_note(bench_json *j, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    if (!j->f) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!j->in_notes) {
        bench_json_end_table(j);
        fputs("], \"notes\": [", j->f);
        j->in_notes = 1;
    }
    if (j->notes++) fputs(", ", j->f);
    bench_json_str(j->f, buf);
}

/* Ends the object and closes the file: 0, or -1 when a write failed. */
static inline int bench_json_close(bench_json *j) {
    if (!j->f) return 0;
    if (!j->in_notes) {
        bench_json_end_table(j);
        fputs("], \"notes\": [", j->f);
    }
    fputs("]}\n", j->f);
    int bad = ferror(j->f);
    bad |= fclose(j->f);
    j->f = NULL;
    return bad ? -1 : 0;
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

/* sgemm GFLOPS at the models' shapes for every GEMM library nibble could use, side by side, against a
 * peak estimated from the CPU's features and clock: OpenBLAS as libnibble runs it (kernel set checked
 * against CPUID) and on forced kernel sets, nibble's own nb_gemm (the model's path), BLIS, oneDNN
 * (FP32, and BF16 inputs with FP32 accumulation). Each library runs in a child process of its own
 * (one BLAS thread pool per process); the parent gathers their rows and writes bench/results/gemm.json.
 * Usage: bench_gemm [--threads 1,2] [--min-time S] [--only NAME,...] [--json PATH]
 * (NIBBLE_BENCH_JSON, when set, names the output file instead of --json: bench/record.lua sets it). */
#include <ctype.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nibble/nibble.h"
#include "cpu/blas_internal.h"
#include "model/internal.h"
#include "bench_common.h"

/* ---- the shapes: y = x W^T over T = 4 x 256 tokens, and the two backward products ---------- */

enum { T_TOKENS = 4 * 256 };
typedef struct { const char *model, *name; int in, out, count; } layer;
/* count: how many such products one forward of the model makes (layers x matrices) */
static const layer LAYERS[] = {
    {"llama58M", "attn 512x512", 512, 512, 8 * 4},
    {"llama58M", "ffn up/gate 512->1376", 512, 1376, 8 * 2},
    {"llama58M", "ffn down 1376->512", 1376, 512, 8},
    {"llama58M", "lm_head 512->32000", 512, 32000, 1},
    {"smollm2-135M", "q/o 576x576", 576, 576, 30 * 2},
    {"smollm2-135M", "k/v 576->192", 576, 192, 30 * 2},
    {"smollm2-135M", "mlp up/gate 576->1536", 576, 1536, 30 * 2},
    {"smollm2-135M", "mlp down 1536->576", 1536, 576, 30},
    {"smollm2-135M", "lm_head 576->49152", 576, 49152, 1},
};
enum { N_LAYERS = sizeof LAYERS / sizeof *LAYERS };
static const char *const ORIENT[3] = {"fwd x.W^T", "bwd dY.W", "bwd dY^T.x"};

/* M, N, K and transposes of orientation o for a layer (row-major, as nb_gemm is called). */
static void dims(const layer *L, int o, int *M, int *N, int *K, int *ta, int *tb) {
    if (o == 0) { *M = T_TOKENS; *N = L->out; *K = L->in; *ta = 0; *tb = 1; }        /* y = x W^T */
    else if (o == 1) { *M = T_TOKENS; *N = L->in; *K = L->out; *ta = 0; *tb = 0; }   /* dx = dy W */
    else { *M = L->out; *N = L->in; *K = T_TOKENS; *ta = 1; *tb = 0; }               /* dW = dy^T x */
}

/* ---- the configurations (each one child process) --------------------------------------------- */

typedef struct { const char *name, *kind, *env; } config;
static const config CONFIGS[] = {
    {"openblas", "blas", ""},                                    /* as libnibble runs it, default env */
    {"nb_gemm", "nb", ""},                                       /* nibble's path: slices on its pool */
    {"openblas-Cooperlake", "blas", "OPENBLAS_CORETYPE=Cooperlake"},
    {"openblas-SkylakeX", "blas", "OPENBLAS_CORETYPE=SkylakeX"},
    {"openblas-Haswell", "blas", "OPENBLAS_CORETYPE=Haswell"},
    {"openblas-Prescott", "blas", "OPENBLAS_CORETYPE=Prescott"},
    {"blis", "blas", "NIBBLE_BLAS=libblis.so.4"},
    {"dnnl-f32", "dnnl", ""},
    {"dnnl-f32-avx2", "dnnl", "DNNL_MAX_CPU_ISA=AVX2"},
    {"dnnl-bf16", "dnnl16", ""},
};
enum { N_CONFIGS = sizeof CONFIGS / sizeof *CONFIGS };

/* ---- child: time one library ---------------------------------------------------------------- */

typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                             int64_t, float, float *, int64_t);
typedef int (*dnnl_bf16_fn)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t,
                            const uint16_t *, int64_t, float, float *, int64_t);
typedef const struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } *dnnl_ver_fn_ret;
typedef dnnl_ver_fn_ret (*dnnl_version_fn)(void);
typedef int (*dnnl_isa_fn)(void);

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);   /* round to nearest even */
}

static int child(const char *kind, int threads, double min_time) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(threads, &ctx) != NB_OK) { fprintf(stderr, "bench_gemm: %s\n", nb_blas_error()); return 1; }
    dnnl_sgemm_fn dsg = NULL;
    dnnl_bf16_fn dbf = NULL;
    int is_dnnl = !strcmp(kind, "dnnl") || !strcmp(kind, "dnnl16");
    if (is_dnnl) {
        void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) { printf("skip\t%s\n", dlerror()); return 0; }
        void *p = dlsym(h, "dnnl_sgemm"), *q = dlsym(h, "dnnl_gemm_bf16bf16f32"), *v = dlsym(h, "dnnl_version");
        void *isa = dlsym(h, "dnnl_get_effective_cpu_isa");
        memcpy(&dsg, &p, sizeof p);
        memcpy(&dbf, &q, sizeof q);
        dnnl_version_fn ver;
        dnnl_isa_fn isaf;
        memcpy(&ver, &v, sizeof v);
        memcpy(&isaf, &isa, sizeof isa);
        printf("lib\toneDNN %d.%d.%d\tisa 0x%x\n", ver()->major, ver()->minor, ver()->patch, isaf ? (unsigned)isaf() : 0u);
    } else {
        nb_blas_info info;
        nb_blas_get(ctx, &info);
        printf("lib\t%s\t%s\n", info.library, info.core);
        if (!strcmp(kind, "blas")) nb_blas_set_threads(threads);
    }
    size_t maxe = 0;
    for (int i = 0; i < N_LAYERS; i++) {
        size_t e = (size_t)LAYERS[i].out * (size_t)(LAYERS[i].in > T_TOKENS ? LAYERS[i].in : T_TOKENS);
        if (e > maxe) maxe = e;
    }
    float *A = malloc(maxe * 4), *B = malloc(maxe * 4), *C = malloc(maxe * 4);
    uint16_t *A16 = malloc(maxe * 2), *B16 = malloc(maxe * 2);
    for (size_t i = 0; i < maxe; i++) {
        A[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        B[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
        A16[i] = to_bf16(A[i]);
        B16[i] = to_bf16(B[i]);
        C[i] = 0;
    }
    for (int li = 0; li < N_LAYERS; li++)
        for (int o = 0; o < 3; o++) {
            int M, N, K, ta, tb;
            dims(&LAYERS[li], o, &M, &N, &K, &ta, &tb);
            int lda = ta ? M : K, ldb = tb ? K : N;
            double best = 1e30, best_cpu = 1e30, spent = 0;
            for (int rep = 0; rep < 2 || spent < min_time; rep++) {
                double t0 = bench_now(), c0 = bench_cpu();
                if (!strcmp(kind, "nb"))
                    nb_gemm(ctx, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
                else if (!strcmp(kind, "blas"))
                    nb_blas_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
                else if (!strcmp(kind, "dnnl"))
                    dsg(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
                else
                    dbf(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A16, lda, B16, ldb, 0.0f, C, N);
                double t = bench_now() - t0, c = bench_cpu() - c0;
                if (rep > 0 && t < best) best = t;   /* rep 0 warms caches and thread pools */
                if (rep > 0 && c < best_cpu) best_cpu = c;
                spent += t;
            }
            double fl = 2.0 * M * N * (double)K * 1e-9;
            printf("row\t%d\t%d\t%.6g\t%.6g\n", li, o, fl / best, fl / best_cpu);
        }
    free(A); free(B); free(C); free(A16); free(B16);
    nb_ctx_release(ctx);
    return 0;
}

/* ---- parent ------------------------------------------------------------------------------------ */

typedef struct {
    int ok;
    char lib[160];
    double g[N_LAYERS][3];    /* GFLOPS by the wall clock */
    double gc[N_LAYERS][3];   /* GFLOPS per CPU-second (all the process's threads) */
} result;

static int run_child(const char *self, const config *c, int threads, double min_time, result *r) {
    char cmd[2048];
    /* oneDNN (OpenMP) takes its thread count from OMP_NUM_THREADS; the BLASes from the child itself */
    snprintf(cmd, sizeof cmd, "env %s OMP_NUM_THREADS=%d '%s' --child %s --threads %d --min-time %g", c->env, threads,
             self, c->kind, threads, min_time);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[512];
    memset(r, 0, sizeof *r);
    int rows = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "lib\t", 4)) {
            snprintf(r->lib, sizeof r->lib, "%s", line + 4);
            for (char *q = r->lib; *q; q++) if (*q == '\t') *q = ' ';
        } else if (!strncmp(line, "skip\t", 5)) {
            snprintf(r->lib, sizeof r->lib, "skipped: %s", line + 5);
        } else {
            int li, o;
            double g, gc;
            if (sscanf(line, "row\t%d\t%d\t%lf\t%lf", &li, &o, &g, &gc) == 4 && li >= 0 && li < N_LAYERS && o >= 0 &&
                o < 3) {
                r->g[li][o] = g;
                r->gc[li][o] = gc;
                rows++;
            }
        }
    }
    int rc = pclose(p);
    r->ok = rc == 0 && rows == N_LAYERS * 3;
    return r->ok;
}

/* FLOP-weighted GFLOPS of one training step's products (forward and both backward) of a model, by the
 * wall clock or (cpu) per CPU-second. */
static double model_gflops(const result *r, const char *model, int cpu) {
    double flops = 0, secs = 0;
    for (int li = 0; li < N_LAYERS; li++) {
        if (strcmp(LAYERS[li].model, model)) continue;
        for (int o = 0; o < 3; o++) {
            double f = 2.0 * T_TOKENS * LAYERS[li].in * (double)LAYERS[li].out * LAYERS[li].count;
            flops += f;
            secs += f / ((cpu ? r->gc[li][o] : r->g[li][o]) * 1e9);
        }
    }
    return flops / secs * 1e-9;
}

/* Clock: /sys cpufreq's maximum where the kernel exposes it, else /proc/cpuinfo's "cpu MHz" (on a VM
 * that is the nominal clock the hypervisor reports), else the "@ x.xxGHz" of the brand string. */
static double cpu_ghz(char *how, size_t n) {
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    long khz = 0;
    if (f) {
        if (fscanf(f, "%ld", &khz) != 1) khz = 0;
        fclose(f);
        if (khz > 0) { snprintf(how, n, "cpufreq cpuinfo_max_freq"); return khz / 1e6; }
    }
    f = fopen("/proc/cpuinfo", "r");
    double mhz = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "cpu MHz", 7) && sscanf(strchr(line, ':') + 1, "%lf", &mhz) == 1) break;
    if (f) fclose(f);
    if (mhz > 0) { snprintf(how, n, "/proc/cpuinfo cpu MHz"); return mhz / 1e3; }
    nb_cpu_features c;
    nb_cpu_detect(&c);
    const char *at = strstr(c.brand, "@ ");
    double ghz = 0;
    if (at && sscanf(at + 2, "%lfGHz", &ghz) == 1) { snprintf(how, n, "brand string"); return ghz; }
    snprintf(how, n, "unknown (assumed 2.0 GHz)");
    return 2.0;
}

static void sh_out(const char *cmd, char *out, size_t n) {
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(out, (int)n, p)) out[0] = 0;
    pclose(p);
    out[strcspn(out, "\n")] = 0;
}

int main(int argc, char **argv) {
    const char *kind = NULL, *json = "bench/results/gemm.json", *only = NULL;
    int threads_list[8] = {1, 2}, n_threads = 2, threads = 1;
    double min_time = 0.15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--child") && i + 1 < argc) kind = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = 0;
            for (char *s = argv[++i]; *s && n_threads < 8;) {
                threads_list[n_threads++] = atoi(s);
                s += strcspn(s, ",");
                if (*s) s++;
            }
            threads = threads_list[0];
        } else if (!strcmp(argv[i], "--min-time") && i + 1 < argc) min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else { fprintf(stderr, "usage: bench_gemm [--threads 1,2] [--min-time S] [--only NAME,...] [--json PATH]\n"); return 1; }
    }
    if (kind) return child(kind, threads, min_time);
    /* under bench/record.lua the record goes where it says (it completes command, commit, date, machine) */
    const char *rec = getenv("NIBBLE_BENCH_JSON");
    if (rec && *rec) json = rec;

    char self[1024];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) { fprintf(stderr, "bench_gemm: cannot find its own path\n"); return 1; }
    self[sl] = 0;

    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx) != NB_OK) { fprintf(stderr, "bench_gemm: %s\n", nb_blas_error()); return 1; }
    nb_blas_info info;
    nb_blas_get(ctx, &info);
    char line[1024], flags[256], clock_how[64];
    nb_blas_describe(&info, line, sizeof line);
    printf("%s\n", line);
    nb_cpu_flags_str(info.cpu.flags, flags, sizeof flags);
    double ghz = cpu_ghz(clock_how, sizeof clock_how);
    uint32_t f = info.cpu.flags;
    /* fp32 lanes per FMA per cycle by the widest vector the CPU executes at full width; two FMA ports on
     * every core since Haswell (some Xeon Silver/Bronze SKUs have one 512-bit port: then the peak is half).
     * AMD before Zen 5 (family 25 = Zen 3/4) runs AVX-512 on 256-bit datapaths: 8 lanes per port. */
    int amd_256 = !strcmp(info.cpu.vendor, "AuthenticAMD") && info.cpu.family < 26;
    int lanes = ((f & NB_CPU_AVX512F) && !amd_256) ? 16 : (f & NB_CPU_FMA) ? 8 : 4;
    int fma_units = 2;
    double peak1 = fma_units * lanes * 2.0 * ghz;   /* GFLOPS per core: 2 flops per FMA lane */
    printf("peak estimate: %d FMA units x %d fp32 lanes x 2 flops x %.2f GHz (%s) = %.1f GFLOPS per core\n", fma_units,
           lanes, ghz, clock_how, peak1);

    static result R[8][N_CONFIGS];
    int used[N_CONFIGS] = {0};
    for (int c = 0; c < N_CONFIGS; c++) {
        if (only) {
            char pat[128];
            snprintf(pat, sizeof pat, ",%s,", CONFIGS[c].name);
            char lst[1024];
            snprintf(lst, sizeof lst, ",%s,", only);
            if (!strstr(lst, pat)) continue;
        }
        used[c] = 1;
        for (int t = 0; t < n_threads; t++) {
            run_child(self, &CONFIGS[c], threads_list[t], min_time, &R[t][c]);
            int ok = R[t][c].ok;
            printf("%-20s %d thread%s  %-42s llama58M %6.1f (%6.1f per CPU-s)  smollm2-135M %6.1f (%6.1f) GFLOPS%s\n",
                   CONFIGS[c].name, threads_list[t], threads_list[t] > 1 ? "s" : " ", R[t][c].lib,
                   ok ? model_gflops(&R[t][c], "llama58M", 0) : 0, ok ? model_gflops(&R[t][c], "llama58M", 1) : 0,
                   ok ? model_gflops(&R[t][c], "smollm2-135M", 0) : 0, ok ? model_gflops(&R[t][c], "smollm2-135M", 1) : 0,
                   ok ? "" : "  (failed)");
            fflush(stdout);
        }
    }

    FILE *out = fopen(json, "w");
    if (!out) { fprintf(stderr, "bench_gemm: cannot write %s\n", json); return 1; }
    char commit[64], date[64], cmd[2048] = "";
    sh_out("git rev-parse HEAD 2>/dev/null", commit, sizeof commit);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(cmd);
        snprintf(cmd + l, sizeof cmd - l, "%s%s", i ? " " : "", argv[i]);
    }
    fprintf(out, "{\"bench\": \"gemm\", \"title\": ");
    bench_json_str(out, "sgemm GFLOPS at the models' shapes (4x256 tokens), per GEMM library and kernel set");
    fprintf(out, ", \"command\": ");
    bench_json_str(out, cmd);
    fprintf(out, ", \"commit\": ");
    bench_json_str(out, commit);
    fprintf(out, ", \"date\": \"%s\", \"machine\": {\"cpu\": ", date);
    char cpu[160];
    snprintf(cpu, sizeof cpu, "%s (%s family %d model %d)", info.cpu.brand, info.cpu.vendor, info.cpu.family,
             info.cpu.model);
    bench_json_str(out, cpu);
    fprintf(out, ", \"features\": ");
    bench_json_str(out, flags);
    fprintf(out, ", \"threads\": %d, \"blas\": ", threads_list[n_threads - 1]);
    bench_json_str(out, info.library);
    fprintf(out, ", \"blas_core\": ");
    bench_json_str(out, info.core);
    fprintf(out, "}, \"tables\": [");
    /* summary: one row per configuration and thread count */
    fprintf(out, "{\"caption\": ");
    bench_json_str(out, "Training-step products (forward + both backward), FLOP-weighted over each model's layers: GFLOPS "
                  "by the wall clock, per CPU-second, and the latter as % of one core's peak");
    fprintf(out, ", \"columns\": [\"library\", \"kernels as run\", \"threads\", \"llama58M GFLOPS\", \"per CPU-s\", "
                 "\"%% peak\", \"smollm2-135M GFLOPS\", \"per CPU-s\", \"%% peak\"], \"rows\": [");
    int first = 1;
    for (int c = 0; c < N_CONFIGS; c++)
        for (int t = 0; t < n_threads; t++) {
            if (!used[c] || !R[t][c].ok) continue;
            double a = model_gflops(&R[t][c], "llama58M", 0), b = model_gflops(&R[t][c], "smollm2-135M", 0);
            double ac = model_gflops(&R[t][c], "llama58M", 1), bc = model_gflops(&R[t][c], "smollm2-135M", 1);
            fprintf(out, "%s[", first ? "" : ", ");
            first = 0;
            bench_json_str(out, CONFIGS[c].name);
            fprintf(out, ", ");
            bench_json_str(out, R[t][c].lib);
            fprintf(out, ", %d, %.1f, %.1f, %.0f, %.1f, %.1f, %.0f]", threads_list[t], a, ac, 100 * ac / peak1, b, bc,
                    100 * bc / peak1);
        }
    fprintf(out, "]}");
    for (int t = 0; t < n_threads; t++) {
        fprintf(out, ", {\"caption\": \"GFLOPS per CPU-second per product, %d thread%s\", \"columns\": [\"model\", \"product\", "
                     "\"orientation\", \"M\", \"N\", \"K\"", threads_list[t], threads_list[t] > 1 ? "s" : "");
        for (int c = 0; c < N_CONFIGS; c++)
            if (used[c]) { fprintf(out, ", "); bench_json_str(out, CONFIGS[c].name); }
        fprintf(out, "], \"rows\": [");
        for (int li = 0; li < N_LAYERS; li++)
            for (int o = 0; o < 3; o++) {
                int M, N, K, ta, tb;
                dims(&LAYERS[li], o, &M, &N, &K, &ta, &tb);
                fprintf(out, "%s[", li || o ? ", " : "");
                bench_json_str(out, LAYERS[li].model);
                fprintf(out, ", ");
                bench_json_str(out, LAYERS[li].name);
                fprintf(out, ", ");
                bench_json_str(out, ORIENT[o]);
                fprintf(out, ", %d, %d, %d", M, N, K);
                for (int c = 0; c < N_CONFIGS; c++)
                    if (used[c]) {
                        if (R[t][c].ok) fprintf(out, ", %.1f", R[t][c].gc[li][o]);
                        else fprintf(out, ", null");
                    }
                fprintf(out, "]");
            }
        fprintf(out, "]}");
    }
    fprintf(out, "], \"notes\": [");
    char note[1024];
    snprintf(note, sizeof note, "Peak estimate: %d FMA units x %d fp32 lanes x 2 flops x %.2f GHz (clock from %s) = %.1f "
             "GFLOPS per core; AVX2-only kernels can reach half of it, SSE a quarter.", fma_units, lanes, ghz, clock_how,
             peak1);
    bench_json_str(out, note);
    fprintf(out, ", ");
    bench_json_str(out, line);
    fprintf(out, ", ");
    bench_json_str(out, "Per CPU-second: FLOPs over the CPU time of the whole process (all its threads), the "
                  "figure that time slices lost to other jobs on a shared machine do not lower; with 1 thread it "
                  "estimates the uncontended speed.");
    fprintf(out, ", ");
    bench_json_str(out, "Each figure is the best of repeated calls (at least 2 after a warm-up, and at least --min-time "
                  "seconds) on a shared machine; 'openblas' and 'nb_gemm' run with the environment as given (no "
                  "OPENBLAS_CORETYPE: the kernels libnibble chose), the openblas-<core> columns force a kernel set; "
                  "nb_gemm splits a product over nibble's own threads (the model's path), the others use the "
                  "library's threads; dnnl-bf16 takes BF16 inputs already converted, with FP32 accumulation.");
    fprintf(out, "]}\n");
    fclose(out);
    printf("wrote %s\n", json);
    nb_ctx_release(ctx);
    return 0;
}

/* Loads the BLAS (dlopen, once per process) and makes sure it runs the kernels the CPU can run.
 * OpenBLAS picks its kernel set from the CPU model number in its load-time constructor and, for a
 * model newer than it knows, silently falls back to generic SSE3 kernels (0.3.21 on a family 6
 * model 207 Xeon: Prescott, a fifth of the SkylakeX speed). Loading it ourselves lets us check that
 * pick against CPUID before any product runs and switch the kernel table if it is weaker
 * (gotoblas_dynamic_quit + gotoblas_dynamic_init with OPENBLAS_CORETYPE set: the exported re-entry of
 * OpenBLAS's own DYNAMIC_ARCH selection, safe because nobody else holds the library yet). */
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nibble/blas.h"
#include "cpu/blas_internal.h"

/* ---- the decision ---------------------------------------------------------------------------- */

/* OpenBLAS's x86-64 kernel sets ranked by their sgemm, the only routine nibble calls: 1 SSE, 2 AVX
 * (Piledriver and Steamroller have FMA but not AVX2), 3 AVX2+FMA, 4 AVX-512. Cooperlake and
 * SapphireRapids add BF16/AMX routines (sbgemm) but run SkylakeX's sgemm kernel, so they rank with it:
 * a BLAS that picked SkylakeX on a BF16 CPU is not switched (nothing to gain, measured in
 * bench_gemm). */
static const struct { const char *name; int tier; } CORES[] = {
    {"Katmai", 1},     {"Coppermine", 1},  {"Northwood", 1},      {"Prescott", 1},    {"Banias", 1},
    {"Atom", 1},       {"Core2", 1},       {"Penryn", 1},         {"Dunnington", 1},  {"Nehalem", 1},
    {"Athlon", 1},     {"Opteron", 1},     {"Opteron_SSE3", 1},   {"Barcelona", 1},   {"Nano", 1},
    {"Bobcat", 1},     {"Sandybridge", 2}, {"Bulldozer", 2},      {"Piledriver", 2},  {"Steamroller", 2},
    {"Haswell", 3},    {"Excavator", 3},   {"Zen", 3},            {"SkylakeX", 4},    {"Cooperlake", 4},
    {"SapphireRapids", 4}};
enum { N_CORES = sizeof CORES / sizeof *CORES };

static int core_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < N_CORES; i++)
        if (!strcasecmp(name, CORES[i].name)) return i;
    return -1;
}

static int in_list(const char *name, const char *list) {
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        while (*p == ' ') p++;
        const char *q = p;
        while (*q && *q != ' ') q++;
        if ((size_t)(q - p) == n && !strncasecmp(p, name, n)) return 1;
        p = q;
    }
    return 0;
}

/* The strongest kernel set of `available` that `flags` can run (NULL: none stronger than SSE): the
 * candidates strongest first, so a BLAS without AVX-512 kernels still gets its AVX2 ones. */
static const char *best_core(const nb_cpu_features *cpu, const char *available) {
    uint32_t f = cpu->flags;
    const char *cand[4];
    int n = 0;
    const uint32_t avx512 = NB_CPU_AVX512F | NB_CPU_AVX512BW | NB_CPU_AVX512VL | NB_CPU_AVX512DQ;
    /* AVX-512 means SkylakeX, also on BF16/AMX CPUs: Cooperlake and SapphireRapids run the same sgemm,
     * and OpenBLAS 0.3.21's OPENBLAS_CORETYPE parser stops before their names (it says "Core not
     * found: Cooperlake" and lands on Cooperlake only through its own feature fallback) */
    if ((f & avx512) == avx512 && (f & NB_CPU_FMA)) cand[n++] = "SkylakeX";
    if ((f & (NB_CPU_AVX2 | NB_CPU_FMA)) == (NB_CPU_AVX2 | NB_CPU_FMA)) {
        int amd = !strcmp(cpu->vendor, "AuthenticAMD") || !strcmp(cpu->vendor, "HygonGenuine");
        cand[n++] = amd ? "Zen" : "Haswell";
        cand[n++] = amd ? "Haswell" : "Zen";
    }
    if (f & NB_CPU_AVX) cand[n++] = "Sandybridge";
    for (int i = 0; i < n; i++)
        if (in_list(cand[i], available)) return cand[i];
    return NULL;
}

const char *nb_blas_pick_core(const char *reported, const nb_cpu_features *cpu, const char *available) {
    int r = core_index(reported);
    if (r < 0 || !cpu) return NULL;   /* a name we do not know: a newer BLAS, leave its choice alone */
    const char *best = best_core(cpu, available);
    int b = core_index(best);
    return b >= 0 && CORES[b].tier > CORES[r].tier ? CORES[b].name : NULL;
}

/* ---- loading --------------------------------------------------------------------------------- */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
typedef void (*set_threads_fn)(int);
typedef void (*bli_set_threads_fn)(int64_t);
typedef char *(*str_fn)(void);
typedef void (*void_fn)(void);
typedef int64_t (*bli_arch_id_fn)(void);
typedef const char *(*bli_arch_str_fn)(int64_t);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static nb_blas_info g_info;
static char g_error[512];
static sgemm_fn g_sgemm;
static set_threads_fn g_set_threads;
static bli_set_threads_fn g_bli_set_threads;
static str_fn g_corename;

/* dlsym returns void *; the cast to a function pointer goes through memcpy to stay ISO C. */
static void *sym(void *h, const char *name) { return dlsym(h, name); }
#define NB_FN(dst, h, name) do { void *p_ = sym((h), (name)); memcpy(&(dst), &p_, sizeof p_); } while (0)

static void copy_str(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src ? src : ""); }

/* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64" -> "OpenBLAS 0.3.21 DYNAMIC_ARCH":
 * the build's target name is not the kernel set that runs, so it is left out of what we print. */
static void openblas_name(const char *config, char *out, size_t n) {
    char v[64] = "";
    sscanf(config, "OpenBLAS %63s", v);
    snprintf(out, n, "OpenBLAS %s%s", v[0] ? v : "?", strstr(config, "DYNAMIC_ARCH") ? " DYNAMIC_ARCH" : "");
}

static void available_cores(void *h, char *out, size_t n) {
    out[0] = 0;
    size_t len = 0;
    for (int i = 0; i < N_CORES; i++) {
        char s[64] = "sgemm_kernel_";
        size_t k = strlen(s);
        for (const char *p = CORES[i].name; *p && k < sizeof s - 1; p++) s[k++] = (char)toupper((unsigned char)*p);
        s[k] = 0;
        if (!sym(h, s)) continue;
        int w = snprintf(out + len, n - len, "%s%s", len ? " " : "", CORES[i].name);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
    }
}

static void load_once(void) {
    nb_blas_info *I = &g_info;
    nb_cpu_detect(&I->cpu);
    const char *lib = getenv("NIBBLE_BLAS");
    if (!lib || !*lib) lib = "libopenblas.so.0";
    const char *user_core = getenv("OPENBLAS_CORETYPE");
    if (user_core && !*user_core) user_core = NULL;
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    int preloaded = h != NULL;
    if (!h) {
        const char *pretend = getenv("NIBBLE_BLAS_PRETEND_CORE");
        int pretending = pretend && *pretend && !user_core;
        if (pretending) setenv("OPENBLAS_CORETYPE", pretend, 1);
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (pretending) unsetenv("OPENBLAS_CORETYPE");
    }
    if (!h) {
        const char *e = dlerror();
        snprintf(g_error, sizeof g_error,
                 "cannot load the BLAS %s (%s): install libopenblas0 (scripts/install-deps.sh) or name a CBLAS "
                 "library in NIBBLE_BLAS", lib, e ? e : "not found");
        return;
    }
    NB_FN(g_sgemm, h, "cblas_sgemm");
    if (!g_sgemm) {
        snprintf(g_error, sizeof g_error, "the BLAS %s has no cblas_sgemm", lib);
        return;
    }
    Dl_info dl;
    void *addr;
    memcpy(&addr, &g_sgemm, sizeof addr);
    /* the file behind the alternatives' symlinks says which variant runs (openblas-pthread, -openmp) */
    char real[4096];
    const char *file = dladdr(addr, &dl) && dl.dli_fname ? dl.dli_fname : lib;
    copy_str(I->path, sizeof I->path, realpath(file, real) ? real : file);

    str_fn config = NULL;
    NB_FN(config, h, "openblas_get_config");
    NB_FN(g_corename, h, "openblas_get_corename");
    NB_FN(g_set_threads, h, "openblas_set_num_threads");
    if (config && g_corename) {
        openblas_name(config(), I->library, sizeof I->library);
        copy_str(I->picked, sizeof I->picked, g_corename());
        char avail[512];
        available_cores(h, avail, sizeof avail);
        void_fn quit = NULL, init = NULL;
        NB_FN(quit, h, "gotoblas_dynamic_quit");
        NB_FN(init, h, "gotoblas_dynamic_init");
        const char *best = best_core(&I->cpu, avail);
        copy_str(I->best, sizeof I->best, best);
        const char *pick = nb_blas_pick_core(I->picked, &I->cpu, avail);
        if (!quit || !init || !avail[0]) {
            I->how = NB_BLAS_FIXED;
        } else if (user_core) {
            I->how = NB_BLAS_USER_FORCED;
        } else if (pick && preloaded) {
            I->how = NB_BLAS_HOST_FALLBACK;
        } else if (pick) {
            setenv("OPENBLAS_CORETYPE", pick, 1);
            quit();
            init();
            unsetenv("OPENBLAS_CORETYPE");
            I->how = strcasecmp(g_corename(), pick) ? NB_BLAS_SWITCH_FAILED : NB_BLAS_SWITCHED;
        } else {
            I->how = NB_BLAS_OWN_CHOICE;
        }
        copy_str(I->core, sizeof I->core, g_corename());
        return;
    }
    /* BLIS (dispatches on CPU features itself) or another CBLAS */
    str_fn bli_version = NULL;
    bli_arch_id_fn bli_arch = NULL;
    bli_arch_str_fn bli_arch_name = NULL;
    NB_FN(bli_version, h, "bli_info_get_version_str");
    NB_FN(bli_arch, h, "bli_arch_query_id");
    NB_FN(bli_arch_name, h, "bli_arch_string");
    NB_FN(g_bli_set_threads, h, "bli_thread_set_num_threads");
    I->how = NB_BLAS_FIXED;
    if (bli_version) {
        snprintf(I->library, sizeof I->library, "BLIS %s", bli_version());
        if (bli_arch && bli_arch_name) copy_str(I->core, sizeof I->core, bli_arch_name(bli_arch()));
        I->how = NB_BLAS_OWN_CHOICE;
    } else {
        copy_str(I->library, sizeof I->library, lib);
        copy_str(I->core, sizeof I->core, "unknown");
    }
    copy_str(I->picked, sizeof I->picked, I->core);
}

int nb_blas_ready(void) {
    pthread_once(&g_once, load_once);
    return g_sgemm != NULL;
}

nb_status nb_blas_load(nb_ctx *ctx) {
    if (nb_blas_ready()) return NB_OK;
    return ctx ? nb_fail(ctx, NB_ERR_NOT_FOUND, "%s", g_error) : NB_ERR_NOT_FOUND;
}

const char *nb_blas_error(void) { return g_error; }

nb_status nb_blas_get(nb_ctx *ctx, nb_blas_info *out) {
    memset(out, 0, sizeof *out);
    nb_status s = nb_blas_load(ctx);
    if (s != NB_OK) return s;
    *out = g_info;
    if (g_corename) copy_str(out->core, sizeof out->core, g_corename());   /* as it runs now */
    return NB_OK;
}

int nb_blas_describe(const nb_blas_info *I, char *buf, size_t n) {
    char how[256];
    switch (I->how) {
    case NB_BLAS_SWITCHED:
        snprintf(how, sizeof how, "switched from %s, the weaker set the BLAS picked for this CPU", I->picked);
        break;
    case NB_BLAS_USER_FORCED:
        if (core_index(I->best) >= 0 && core_index(I->core) >= 0 &&
            CORES[core_index(I->best)].tier > CORES[core_index(I->core)].tier)
            snprintf(how, sizeof how, "forced by OPENBLAS_CORETYPE; this CPU can run %s", I->best);
        else
            snprintf(how, sizeof how, "forced by OPENBLAS_CORETYPE");
        break;
    case NB_BLAS_HOST_FALLBACK:
        snprintf(how, sizeof how,
                 "NOT the best for this CPU: the program loaded the BLAS before libnibble; start it with "
                 "OPENBLAS_CORETYPE=%s", I->best);
        break;
    case NB_BLAS_SWITCH_FAILED:
        snprintf(how, sizeof how, "NOT the best for this CPU: switching from %s to %s did not take; start the program "
                 "with OPENBLAS_CORETYPE=%s", I->picked, I->best, I->best);
        break;
    case NB_BLAS_FIXED: snprintf(how, sizeof how, "fixed by the BLAS build"); break;
    default: snprintf(how, sizeof how, "the BLAS's own choice"); break;
    }
    char flags[256];
    nb_cpu_flags_str(I->cpu.flags, flags, sizeof flags);
    return snprintf(buf, n, "gemm: %s (%s), kernels %s (%s); cpu: %s (%s family %d model %d); features: %s",
                    I->library, I->path, I->core, how, I->cpu.brand[0] ? I->cpu.brand : "unknown",
                    I->cpu.vendor[0] ? I->cpu.vendor : "unknown", I->cpu.family, I->cpu.model,
                    flags[0] ? flags : "none");
}

/* ---- the calls ops.c makes ------------------------------------------------------------------- */

void nb_blas_set_threads(int n) {
    if (!nb_blas_ready()) return;
    if (g_set_threads) g_set_threads(n);
    else if (g_bli_set_threads) g_bli_set_threads(n);
}

void nb_blas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc) {
    if (!nb_blas_ready()) abort();   /* unreachable: every context loads it first (nb_ctx_new) */
    /* CBLAS enum values: CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112 */
    g_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

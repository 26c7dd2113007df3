/* A C program that embeds libnibble, started in one process per way the BLAS can arrive: with
 * OPENBLAS_CORETYPE unset, forced (Prescott, Haswell), with OpenBLAS pretending to have picked Prescott
 * by itself (NIBBLE_BLAS_PRETEND_CORE: what 0.3.21 does on a family 6 model 207 Xeon), loaded by the
 * program before libnibble on Prescott, and not loadable at all. Each checks what nb_blas_get says,
 * the environment it leaves, and that products are exact on the kernels it ends on. */
#include <dlfcn.h>
#include <unistd.h>

#include "nbtest.h"
#include "nibble/blas.h"
#include "model/internal.h"

/* Integers in [-8, 8]: every product and partial sum (|sum| <= K * 64 = 8256 < 2^24) is an exact
 * float, so any summation order gives the double reference exactly: the tolerance is 0. */
static void check_products(nb_ctx *ctx) {
    enum { M = 131, N = 150, K = 129 };
    static float A[M * K], B[K * N], C[M * N];
    for (int i = 0; i < M * K; i++) A[i] = (float)((i * 7 + 3) % 17 - 8);
    for (int i = 0; i < K * N; i++) B[i] = (float)((i * 5 + 1) % 17 - 8);
    for (int o = 0; o < 3; o++) {
        /* o = 0: C = A B; o = 1: C = A (B^T)^T with B read as [N, K]; o = 2: C = (A^T)^T B, A read as [K, M] */
        int ta = o == 2, tb = o == 1;
        int lda = ta ? M : K, ldb = tb ? K : N;
        for (int i = 0; i < M * N; i++) C[i] = 1e9f;   /* beta = 0 must overwrite, not scale */
        nb_gemm(ctx, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        int bad = 0;
        for (int i = 0; i < M && !bad; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                if ((double)C[i * N + j] != s) {
                    CHECK_MSG(0, "orientation %d: C[%d,%d] = %.9g, want %.9g", o, i, j, C[i * N + j], s);
                    bad = 1;
                    break;
                }
            }
        CHECK(!bad);
    }
}

/* Can this CPU run a stronger kernel set than Prescott (SSE3)? */
static int better_than_prescott(const nb_blas_info *info) {
    return info->best[0] && nb_blas_pick_core("Prescott", &info->cpu, info->best) != NULL;
}

static int child(const char *mode) {
    if (!strcmp(mode, "host-prescott")) {
        /* the program loads OpenBLAS itself, on Prescott, before libnibble's first context */
        setenv("OPENBLAS_CORETYPE", "Prescott", 1);
        void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_GLOBAL);
        unsetenv("OPENBLAS_CORETYPE");
        CHECK_MSG(h != NULL, "dlopen: %s", dlerror());
    }
    nb_ctx *ctx = NULL;
    nb_status s = nb_ctx_new(2, &ctx);
    if (!strcmp(mode, "missing")) {
        CHECK_EQ_INT(s, NB_ERR_NOT_FOUND);
        CHECK(ctx == NULL);
        CHECK_MSG(strstr(nb_blas_error(), "cannot load the BLAS /nonexistent/libnothing.so (") != NULL, "%s",
                  nb_blas_error());
        nb_blas_info info;
        CHECK_EQ_INT(nb_blas_get(NULL, &info), NB_ERR_NOT_FOUND);
        return nbt_done(mode);
    }
    CHECK_OK(ctx, s);
    if (!ctx) return nbt_done(mode);
    CHECK(!strcmp(nb_blas_error(), ""));
    nb_blas_info info;
    CHECK_OK(ctx, nb_blas_get(ctx, &info));
    char line[1024];
    nb_blas_describe(&info, line, sizeof line);
    printf("%s: %s\n", mode, line);
    const char *env = getenv("OPENBLAS_CORETYPE");
    if (info.how == NB_BLAS_FIXED) {
        printf("SKIP: %s has no run-time kernel choice\n", info.library);
        nb_ctx_release(ctx);
        return 77;
    }
    if (!strcmp(mode, "unset")) {
        CHECK(info.how == NB_BLAS_OWN_CHOICE || info.how == NB_BLAS_SWITCHED);
        CHECK_MSG(nb_blas_pick_core(info.core, &info.cpu, info.best[0] ? info.best : "none") == NULL,
                  "kernels %s on a CPU that runs %s", info.core, info.best);
        if (info.how == NB_BLAS_OWN_CHOICE) CHECK(!strcmp(info.core, info.picked));
        CHECK(env == NULL);   /* the environment is left as it was found */
    } else if (!strcmp(mode, "forced-prescott") || !strcmp(mode, "forced-haswell")) {
        const char *want = strstr(mode, "prescott") ? "Prescott" : "Haswell";
        CHECK_EQ_INT(info.how, NB_BLAS_USER_FORCED);
        CHECK_MSG(!strcmp(info.core, want) && !strcmp(info.picked, want), "%s / %s", info.core, info.picked);
        CHECK(env && !strcmp(env, want));
        char frag[96];
        snprintf(frag, sizeof frag, "kernels %s (forced by OPENBLAS_CORETYPE", want);
        CHECK_MSG(strstr(line, frag) != NULL, "%s", line);
    } else if (!strcmp(mode, "pretend-prescott")) {
        CHECK(!strcmp(info.picked, "Prescott"));
        if (better_than_prescott(&info)) {
            CHECK_EQ_INT(info.how, NB_BLAS_SWITCHED);
            CHECK_MSG(!strcmp(info.core, info.best), "%s vs %s", info.core, info.best);
            char frag[128];
            snprintf(frag, sizeof frag, "kernels %s (switched from Prescott, ", info.best);
            CHECK_MSG(strstr(line, frag) != NULL, "%s", line);
        } else {
            CHECK_EQ_INT(info.how, NB_BLAS_OWN_CHOICE);
            CHECK(!strcmp(info.core, "Prescott"));
        }
        CHECK(env == NULL);   /* set for the switch only */
    } else if (!strcmp(mode, "host-prescott")) {
        CHECK(!strcmp(info.core, "Prescott"));   /* not switched under the program's feet */
        if (better_than_prescott(&info)) {
            CHECK_EQ_INT(info.how, NB_BLAS_HOST_FALLBACK);
            char frag[160];
            snprintf(frag, sizeof frag, "kernels Prescott (NOT the best for this CPU: the program loaded the BLAS "
                     "before libnibble; start it with OPENBLAS_CORETYPE=%s)", info.best);
            CHECK_MSG(strstr(line, frag) != NULL, "%s", line);
        } else {
            CHECK_EQ_INT(info.how, NB_BLAS_OWN_CHOICE);
        }
    } else {
        CHECK_MSG(0, "unknown mode %s", mode);
    }
    check_products(ctx);
    nb_ctx_release(ctx);
    return nbt_done(mode);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { printf("cannot find /proc/self/exe\n"); return 1; }
    self[n] = 0;
    nb_cpu_features cpu;
    nb_cpu_detect(&cpu);
    const struct { const char *mode, *env; int needs_avx2; } runs[] = {
        {"unset", "", 0},
        {"forced-prescott", "OPENBLAS_CORETYPE=Prescott", 0},
        {"forced-haswell", "OPENBLAS_CORETYPE=Haswell", 1},   /* Haswell's kernels need AVX2 and FMA */
        {"pretend-prescott", "NIBBLE_BLAS_PRETEND_CORE=Prescott", 0},
        {"host-prescott", "", 0},
        {"missing", "NIBBLE_BLAS=/nonexistent/libnothing.so", 0},
    };
    int skipped = 0;
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (runs[i].needs_avx2 && (cpu.flags & (NB_CPU_AVX2 | NB_CPU_FMA)) != (NB_CPU_AVX2 | NB_CPU_FMA)) {
            printf("%s: not run, this CPU has no AVX2+FMA\n", runs[i].mode);
            continue;
        }
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE -u NIBBLE_BLAS_PRETEND_CORE -u NIBBLE_BLAS %s '%s' --child %s",
                 runs[i].env, self, runs[i].mode);
        fflush(stdout);
        int rc = system(cmd);
        int code = rc >= 0 && WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
        if (code == 77) { skipped++; continue; }
        CHECK_MSG(code == 0, "%s: exit %d", runs[i].mode, code);
    }
    if (skipped) { printf("SKIP: the BLAS has no run-time kernel choice\n"); return 77; }
    return nbt_done("test_blas_embed");
}

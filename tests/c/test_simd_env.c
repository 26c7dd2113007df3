/* NIBBLE_SIMD, the model runtime's SIMD-level override: what each value selects on CPUs of every level
 * (nb_simd_select, with the exact messages), and in a child process of this test per value, that
 * nb_ctx_new honours it (the row-kernel table in use is the level asked for) or fails with that message
 * (nb_ctx_last_error(NULL)): never a silent fallback to another level. */
#define _POSIX_C_SOURCE 200809L   /* popen, readlink: the environment cases run this test again */
#include <unistd.h>

#include "nbtest.h"
#include "model/internal.h"

/* Child mode: create a context under the environment's NIBBLE_SIMD and print what happened. */
static int env_child(void) {
    nb_ctx *c = NULL;
    nb_status s = nb_ctx_new(1, &c);
    printf("status=%s level=%s msg=%s\n", nb_status_name(s), nb_simd_level(c), s ? nb_ctx_last_error(NULL) : "");
    nb_ctx_release(c);
    return 0;
}

static const char *const LACKS_AVX2 = "NIBBLE_SIMD='avx2': this CPU (or this build) lacks AVX2+FMA; valid values here "
                                      "are auto, scalar";
static const char *const LACKS_AVX512 = "NIBBLE_SIMD='avx512': this CPU (or this build) lacks AVX-512F; valid values "
                                        "here are auto, avx2, scalar";
static const char *const NOT_A_LEVEL = "NIBBLE_SIMD='AVX2' is not a SIMD level: expected auto, avx512, avx2 or scalar "
                                       "(unset it for auto)";

static void test_select(nb_ctx *ctx) {
    static const struct { const char *value; int cpu; nb_status st; const char *level; } cases[] = {
        {NULL, 2, NB_OK, "avx512"},   {"", 1, NB_OK, "avx2"},        {"auto", 0, NB_OK, "scalar"},
        {"scalar", 2, NB_OK, "scalar"}, {"avx2", 2, NB_OK, "avx2"},  {"avx512", 2, NB_OK, "avx512"},
        {"avx2", 1, NB_OK, "avx2"},   {"scalar", 0, NB_OK, "scalar"},
        {"avx512", 1, NB_ERR_UNSUPPORTED, "avx2"}, {"avx2", 0, NB_ERR_UNSUPPORTED, "scalar"},
        {"avx512", 0, NB_ERR_UNSUPPORTED, "scalar"}, {"AVX2", 2, NB_ERR_INVALID, "avx512"},
        {"sse", 0, NB_ERR_INVALID, "scalar"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *level = NULL;
        nb_ctx_clear_error(ctx);
        nb_status s = nb_simd_select(ctx, cases[i].value, cases[i].cpu, &level);
        CHECK_MSG(s == cases[i].st && level && !strcmp(level, cases[i].level), "NIBBLE_SIMD=%s on a level-%d CPU: %s %s",
                  cases[i].value ? cases[i].value : "(unset)", cases[i].cpu, nb_status_name(s), level ? level : "-");
        CHECK_MSG(s || !*nb_ctx_last_error(ctx), "an accepted value left a message: %s", nb_ctx_last_error(ctx));
    }
    const char *level;
    CHECK_FAIL(ctx, nb_simd_select(ctx, "avx2", 0, &level), NB_ERR_UNSUPPORTED, LACKS_AVX2);
    CHECK_FAIL(ctx, nb_simd_select(ctx, "avx512", 1, &level), NB_ERR_UNSUPPORTED, LACKS_AVX512);
    CHECK_FAIL(ctx, nb_simd_select(ctx, "avx512", 0, &level), NB_ERR_UNSUPPORTED, "lacks AVX-512F; valid values here are auto, scalar");
    CHECK_FAIL(ctx, nb_simd_select(ctx, "AVX2", 2, &level), NB_ERR_INVALID, NOT_A_LEVEL);
}

/* Each value in a fresh process (as a user sets it). */
static void test_env(nb_ctx *ctx, const char *self) {
    /* the best level here, from the same CPU tests the table uses (nb_simd_force falls back to it) */
    int cpu = !strcmp(nb_simd_force(ctx, "avx512"), "avx512") ? 2 : !strcmp(nb_simd_force(ctx, "avx2"), "avx2") ? 1 : 0;
    static const char *const best[3] = {"scalar", "avx2", "avx512"};
    static const char *const values[] = {"", "auto", "scalar", "avx2", "avx512", "AVX2", "avx-512"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char cmd[4400], out[4096] = {0}, want[512];
        snprintf(cmd, sizeof cmd, "NIBBLE_SIMD='%s' '%s' --env-child 2>&1", values[i], self);
        FILE *f = popen(cmd, "r");
        CHECK_MSG(f != NULL, "popen %s", cmd);
        if (!f) continue;
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        CHECK_MSG(pclose(f) == 0, "NIBBLE_SIMD='%s': child failed: %s", values[i], out);
        const char *level = NULL;
        nb_status st = nb_simd_select(NULL, values[i], cpu, &level);
        if (st) {   /* the message nb_simd_select gives, and no context */
            nb_ctx *c = NULL;
            nb_ctx_new(1, &c);
            nb_simd_select(c, values[i], cpu, &level);
            snprintf(want, sizeof want, "status=%s level=%s msg=%s\n", nb_status_name(st), best[cpu], nb_ctx_last_error(c));
            nb_ctx_release(c);
        } else {
            snprintf(want, sizeof want, "status=NB_OK level=%s msg=\n", level);
        }
        CHECK_MSG(!strcmp(out, want), "NIBBLE_SIMD='%s': got %s wanted %s", values[i], out, want);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--env-child") == 0) return env_child();
    nb_ctx *ctx = NULL;
    CHECK_OK(ctx, nb_ctx_new(1, &ctx));
    if (!ctx) return nbt_done("test_simd_env");
    test_select(ctx);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK_MSG(n > 0, "/proc/self/exe unreadable: the environment cases need to run this test again");
    if (n > 0) {
        self[n] = 0;
        test_env(ctx, self);
    }
    nb_ctx_release(ctx);
    return nbt_done("test_simd_env");
}

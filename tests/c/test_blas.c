/* The BLAS kernel-set decision (nb_blas_pick_core, a pure function of the core the BLAS reports, the
 * CPU's flags and the kernel sets it has) on the CPUs that matter, among them the family 6 model 207
 * Xeon where OpenBLAS 0.3.21 picks Prescott; the flag names; and, live, that the BLAS this process
 * runs is not weaker than what its CPU can run. The load paths (env unset, forced, pretended, loaded
 * by the host first) run in processes of their own: test_blas_embed.c. */
#include "nbtest.h"
#include "nibble/blas.h"

/* The kernel sets Debian 12's OpenBLAS 0.3.21 has (`nm -D libopenblas.so.0 | grep sgemm_kernel_`). */
static const char *const DEBIAN_0321 =
    "Prescott Atom Core2 Penryn Dunnington Nehalem Opteron Opteron_SSE3 Barcelona Nano Sandybridge Bobcat "
    "Bulldozer Piledriver Haswell Steamroller Excavator Zen SkylakeX Cooperlake";

static const uint32_t SSE3 = NB_CPU_SSE3, AVX = NB_CPU_SSE3 | NB_CPU_AVX,
                      AVX2 = NB_CPU_SSE3 | NB_CPU_AVX | NB_CPU_FMA | NB_CPU_AVX2,
                      AVX512 = NB_CPU_SSE3 | NB_CPU_AVX | NB_CPU_FMA | NB_CPU_AVX2 | NB_CPU_AVX512F | NB_CPU_AVX512BW |
                               NB_CPU_AVX512VL | NB_CPU_AVX512DQ | NB_CPU_AVX512_VNNI;

static nb_cpu_features cpu(const char *vendor, int family, int model, uint32_t flags) {
    nb_cpu_features c;
    memset(&c, 0, sizeof c);
    snprintf(c.vendor, sizeof c.vendor, "%s", vendor);
    c.family = family;
    c.model = model;
    c.flags = flags;
    return c;
}

static int same(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }
#define CHECK_PICK(reported, c, avail, want) do { const char *_g = nb_blas_pick_core((reported), (c), (avail)); \
    CHECK_MSG(same(_g, (want)), "pick(%s) = %s, wanted %s", (reported) ? (reported) : "NULL", _g ? _g : "NULL", \
              (want) ? (want) : "NULL"); } while (0)

static void test_model_207(void) {
    /* family 6 model 207 (Emerald Rapids): AVX-512 with VNNI, BF16, FP16 and AMX, as its CPUID reads */
    nb_cpu_features x = cpu("GenuineIntel", 6, 207,
                            AVX512 | NB_CPU_AVX512_BF16 | NB_CPU_AVX512_FP16 | NB_CPU_AMX_TILE | NB_CPU_AMX_BF16 |
                                NB_CPU_AMX_INT8);
    CHECK_PICK("Prescott", &x, DEBIAN_0321, "SkylakeX");   /* what 0.3.21 does to it, corrected */
    CHECK_PICK("PRESCOTT", &x, DEBIAN_0321, "SkylakeX");   /* names are case-insensitive, as OpenBLAS's */
    CHECK_PICK("Nehalem", &x, DEBIAN_0321, "SkylakeX");
    CHECK_PICK("Sandybridge", &x, DEBIAN_0321, "SkylakeX");
    CHECK_PICK("Haswell", &x, DEBIAN_0321, "SkylakeX");
    /* AVX-512 picks are as good for sgemm: left alone */
    CHECK_PICK("SkylakeX", &x, DEBIAN_0321, NULL);
    CHECK_PICK("Cooperlake", &x, DEBIAN_0321, NULL);
    CHECK_PICK("SapphireRapids", &x, DEBIAN_0321, NULL);
    /* never Cooperlake or SapphireRapids as the target (same sgemm; 0.3.21 cannot force their names);
     * a BLAS without AVX-512 kernels gets its AVX2 ones, then AVX */
    CHECK_PICK("Prescott", &x, "Prescott SkylakeX Cooperlake SapphireRapids", "SkylakeX");
    CHECK_PICK("Prescott", &x, "Prescott Sandybridge Haswell", "Haswell");
    CHECK_PICK("Prescott", &x, "Prescott Sandybridge", "Sandybridge");
    CHECK_PICK("Prescott", &x, "Prescott", NULL);
    CHECK_PICK("Prescott", &x, NULL, "SkylakeX");            /* NULL: every known set */
}

static void test_other_cpus(void) {
    nb_cpu_features skx = cpu("GenuineIntel", 6, 85, AVX512);   /* Skylake-SP: no BF16 */
    CHECK_PICK("Prescott", &skx, DEBIAN_0321, "SkylakeX");
    CHECK_PICK("Haswell", &skx, DEBIAN_0321, "SkylakeX");
    CHECK_PICK("SkylakeX", &skx, DEBIAN_0321, NULL);

    /* AVX-512 F without BW/VL/DQ (Knights Landing): not SkylakeX's kernels, AVX2's */
    nb_cpu_features knl = cpu("GenuineIntel", 6, 87, AVX2 | NB_CPU_AVX512F);
    CHECK_PICK("Prescott", &knl, DEBIAN_0321, "Haswell");

    nb_cpu_features hsw = cpu("GenuineIntel", 6, 63, AVX2);
    CHECK_PICK("Prescott", &hsw, DEBIAN_0321, "Haswell");
    CHECK_PICK("Sandybridge", &hsw, DEBIAN_0321, "Haswell");
    CHECK_PICK("Haswell", &hsw, DEBIAN_0321, NULL);
    CHECK_PICK("Zen", &hsw, DEBIAN_0321, NULL);   /* same tier: the BLAS's choice stands */

    nb_cpu_features zen3 = cpu("AuthenticAMD", 25, 33, AVX2);
    CHECK_PICK("Prescott", &zen3, DEBIAN_0321, "Zen");
    CHECK_PICK("Barcelona", &zen3, DEBIAN_0321, "Zen");
    CHECK_PICK("Zen", &zen3, DEBIAN_0321, NULL);
    CHECK_PICK("Prescott", &zen3, "Prescott Haswell", "Haswell");
    nb_cpu_features hygon = cpu("HygonGenuine", 24, 0, AVX2);
    CHECK_PICK("Prescott", &hygon, DEBIAN_0321, "Zen");

    /* Zen 4 has AVX-512 with BF16: 0.3.21 calls it Zen (AVX2 kernels); later OpenBLAS runs SkylakeX's */
    nb_cpu_features zen4 = cpu("AuthenticAMD", 25, 97, AVX512 | NB_CPU_AVX512_BF16);
    CHECK_PICK("Zen", &zen4, DEBIAN_0321, "SkylakeX");

    nb_cpu_features snb = cpu("GenuineIntel", 6, 42, AVX);
    CHECK_PICK("Prescott", &snb, DEBIAN_0321, "Sandybridge");
    CHECK_PICK("Sandybridge", &snb, DEBIAN_0321, NULL);

    /* AVX2 without the OS saving YMM state arrives here with no AVX flags at all (nb_cpu_detect masks
     * them), and an SSE-only CPU has nothing better than what it got */
    nb_cpu_features old = cpu("GenuineIntel", 6, 23, SSE3);
    CHECK_PICK("Prescott", &old, DEBIAN_0321, NULL);
    CHECK_PICK("Core2", &old, DEBIAN_0321, NULL);

    /* a name this code does not know is a newer BLAS's: never overridden; no name, no opinion */
    CHECK_PICK("Zen5", &zen4, DEBIAN_0321, NULL);
    CHECK_PICK("GraniteRapids", &skx, DEBIAN_0321, NULL);
    CHECK_PICK(NULL, &skx, DEBIAN_0321, NULL);
    CHECK(nb_blas_pick_core("Prescott", NULL, DEBIAN_0321) == NULL);
}

static void test_flag_names(void) {
    char buf[256];
    nb_cpu_flags_str(AVX512 | NB_CPU_AVX512_BF16 | NB_CPU_AMX_TILE, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "sse3 avx fma avx2 avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16 amx_tile"),
              "%s", buf);
    nb_cpu_flags_str(0, buf, sizeof buf);
    CHECK(!strcmp(buf, ""));
    nb_cpu_flags_str(AVX2, buf, 9);   /* truncated at a whole name */
    CHECK_MSG(!strcmp(buf, "sse3 avx"), "%s", buf);
}

/* The process as started (whatever OPENBLAS_CORETYPE is): what nb_blas_get reports is consistent. */
static void test_live(void) {
    nb_ctx *ctx = NULL;
    CHECK_OK(ctx, nb_ctx_new(1, &ctx));
    if (!ctx) return;
    nb_blas_info info;
    CHECK_OK(ctx, nb_blas_get(ctx, &info));
    nb_cpu_features c;
    nb_cpu_detect(&c);
    CHECK(!memcmp(&c, &info.cpu, sizeof c));
#if defined(__x86_64__)
    /* every x86-64 has SSE2 and (since 2005) SSE3; the vendor string is 12 letters */
    CHECK_EQ_INT(strlen(info.cpu.vendor), 12);
    CHECK(info.cpu.flags & NB_CPU_SSE3);
    CHECK(info.cpu.family >= 6);
    /* AVX-512 flags only ever come with AVX2 and FMA (the OS saves ZMM only with YMM) */
    if (info.cpu.flags & NB_CPU_AVX512F) CHECK((info.cpu.flags & AVX2) == AVX2);
#endif
    CHECK(info.library[0] && info.path[0] && info.core[0]);
    const char *forced = getenv("OPENBLAS_CORETYPE");
    if (info.how != NB_BLAS_FIXED) {
        if (forced && *forced) {
            CHECK_EQ_INT(info.how, NB_BLAS_USER_FORCED);
        } else {
            /* nothing weaker than the CPU can run is left in place */
            CHECK_MSG(nb_blas_pick_core(info.core, &info.cpu, info.best[0] ? info.best : "none") == NULL,
                      "kernels %s on a CPU that runs %s", info.core, info.best);
        }
    }
    char line[1024];
    int n = nb_blas_describe(&info, line, sizeof line);
    CHECK_EQ_INT(n, strlen(line));
    char want[128];
    snprintf(want, sizeof want, "gemm: %s (%s), kernels %s (", info.library, info.path, info.core);
    CHECK_MSG(!strncmp(line, want, strlen(want)), "%s", line);
    nb_ctx_release(ctx);
}

int main(void) {
    test_model_207();
    test_other_cpus();
    test_flag_names();
    test_live();
    return nbt_done("test_blas");
}

/* The GEMM library under every nibble matrix product, and the CPU it runs on.
 * libnibble loads the BLAS itself (dlopen, at the first nb_ctx_new) so that it can check the kernel
 * set the BLAS picked against the CPU's own feature bits and, where the BLAS fell back to generic
 * kernels (OpenBLAS 0.3.21 runs Prescott SSE3 kernels on CPUs newer than it knows), switch to the
 * kernels the CPU can run before the first product. The BLAS is one per process, so this state is
 * process-wide (the one exception to "nothing is global"). */
#ifndef NIBBLE_BLAS_H
#define NIBBLE_BLAS_H

#include <stddef.h>
#include <stdint.h>
#include "nibble/ctx.h"

/* CPU feature bits, already masked by what the OS saves (XGETBV): AVX needs the YMM state,
 * AVX-512 the ZMM and opmask state. */
enum {
    NB_CPU_SSE3 = 1 << 0,
    NB_CPU_AVX = 1 << 1,
    NB_CPU_FMA = 1 << 2,
    NB_CPU_AVX2 = 1 << 3,
    NB_CPU_AVX512F = 1 << 4,
    NB_CPU_AVX512BW = 1 << 5,
    NB_CPU_AVX512VL = 1 << 6,
    NB_CPU_AVX512DQ = 1 << 7,
    NB_CPU_AVX512_VNNI = 1 << 8,
    NB_CPU_AVX512_BF16 = 1 << 9,
    NB_CPU_AVX512_FP16 = 1 << 10,
    NB_CPU_AMX_TILE = 1 << 11,
    NB_CPU_AMX_BF16 = 1 << 12,
    NB_CPU_AMX_INT8 = 1 << 13,
    NB_CPU_F16C = 1 << 14,
    NB_CPU_AVX512_VBMI = 1 << 15
};

typedef struct nb_cpu_features {
    char vendor[16];   /* CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ... */
    char brand[64];    /* CPUID 0x80000002..4, spaces trimmed ("" if absent) */
    int family, model; /* display family and model (extended fields folded in) */
    uint32_t flags;    /* NB_CPU_* */
} nb_cpu_features;

/* How the kernel set in use came to be. */
typedef enum nb_blas_how {
    NB_BLAS_OWN_CHOICE = 0,    /* the BLAS's own pick, and nothing better for this CPU */
    NB_BLAS_SWITCHED = 1,      /* the BLAS fell back to weaker kernels; libnibble switched them */
    NB_BLAS_USER_FORCED = 2,   /* OPENBLAS_CORETYPE was set: honoured as it is */
    NB_BLAS_HOST_FALLBACK = 3, /* loaded by the host program before libnibble, on weaker kernels than the
                                * CPU can run; left alone (another thread may be using it) */
    NB_BLAS_FIXED = 4,         /* a BLAS with no run-time kernel choice (not a DYNAMIC_ARCH OpenBLAS) */
    NB_BLAS_SWITCH_FAILED = 5  /* the switch was tried and OpenBLAS still reports its weaker pick */
} nb_blas_how;

typedef struct nb_blas_info {
    char library[128]; /* e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY" (openblas_get_config) */
    char path[256];    /* the shared object that was loaded */
    char core[32];     /* kernel set in use now (openblas_get_corename) */
    char picked[32];   /* the kernel set the BLAS picked by itself */
    char best[32];     /* the best kernel set of this BLAS for this CPU's features ("" = no opinion) */
    int how;           /* nb_blas_how */
    nb_cpu_features cpu;
} nb_blas_info;

/* This CPU's features (CPUID and XGETBV; all zero on other architectures). The one CPUID reader of
 * libnibble (core/src/cpu/features.c): the BLAS check, the SIMD rows and the quantizer paths use it. */
NB_API void nb_cpu_detect(nb_cpu_features *out);
/* Space-separated lower-case names of the flags set, e.g. "sse3 avx fma avx2 avx512f ...". */
NB_API void nb_cpu_flags_str(uint32_t flags, char *buf, size_t n);

/* The decision, a pure function: the kernel set to switch to when `reported` (the core the BLAS
 * picked) is weaker than what `cpu`'s flags can run, else NULL. `available` lists the kernel sets
 * this BLAS has (space-separated OpenBLAS core names, case-insensitive; NULL: all known ones).
 * AVX-512 F/BW/VL/DQ -> SkylakeX (also with BF16/AMX: Cooperlake and SapphireRapids have the same
 * sgemm, and 0.3.21 cannot be forced to them by name); AVX2+FMA -> Zen on AMD, Haswell elsewhere;
 * AVX -> Sandybridge; the strongest of these the BLAS has. Kernel sets are ranked by their sgemm,
 * so only a weaker one is switched. A core name it does not know is never overridden (a newer BLAS
 * knows better). */
NB_API const char *nb_blas_pick_core(const char *reported, const nb_cpu_features *cpu, const char *available);

/* Why the BLAS could not be loaded ("" when it was, or before the first try): nb_ctx_new fails with
 * NB_ERR_NOT_FOUND then, and has no context to put the message in. */
NB_API const char *nb_blas_error(void);
/* The BLAS in use (loads it if no context did yet). NB_ERR_NOT_FOUND when it cannot be loaded. */
NB_API nb_status nb_blas_get(nb_ctx *ctx, nb_blas_info *out);
/* One line a user can act on:
 * "gemm: OpenBLAS 0.3.21 ..., kernels SkylakeX (the BLAS's own choice); cpu: <brand> (GenuineIntel
 * family 6 model 143), features: sse3 avx fma avx2 avx512f ...". Returns the length it needed. */
NB_API int nb_blas_describe(const nb_blas_info *info, char *buf, size_t n);

/* Environment, read once at the first load:
 *   OPENBLAS_CORETYPE   set: OpenBLAS uses that kernel set and libnibble leaves it (NB_BLAS_USER_FORCED).
 *   NIBBLE_BLAS         the CBLAS shared object to load instead of libopenblas.so.0 (e.g. BLIS's
 *                       libblis.so.4, for comparisons).
 *   NIBBLE_BLAS_PRETEND_CORE  testing: load OpenBLAS on this kernel set as if it had picked it by
 *                       itself (as OpenBLAS 0.3.21 picks Prescott on a family 6 model 207 Xeon), so
 *                       the detection and the switch run on any machine. */

#endif

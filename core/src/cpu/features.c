/* The one reader of the CPU's features (CPUID and XGETBV): the BLAS check (blas.c), the model
 * runtime's SIMD rows (simd.c) and the quantizer paths (fast_dispatch.c) all ask here. The CPU does
 * not change while the process runs, so the answer is read once and never written again. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cpu/features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define NB_X86 1
#endif

#ifdef NB_X86
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

void nb_cpu_detect(nb_cpu_features *out) {
    memset(out, 0, sizeof *out);
#ifdef NB_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    unsigned maxleaf = a;
    memcpy(out->vendor, &b, 4);
    memcpy(out->vendor + 4, &d, 4);
    memcpy(out->vendor + 8, &c, 4);
    __get_cpuid(1, &a, &b, &c, &d);
    int fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
    if (fam == 0xf) fam += (a >> 20) & 0xff;
    if (fam == 6 || fam >= 0xf) mod |= ((a >> 16) & 0xf) << 4;
    out->family = fam;
    out->model = mod;
    uint32_t f = 0;
    int osxsave = (c >> 27) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    int ymm = (xcr0 & 0x6) == 0x6;       /* SSE and AVX state saved by the OS */
    int zmm = (xcr0 & 0xe6) == 0xe6;     /* + opmask, ZMM_Hi256, Hi16_ZMM */
    int tiles = (xcr0 & 0x60000) == 0x60000;   /* XTILECFG + XTILEDATA */
    if (c & 1) f |= NB_CPU_SSE3;
    if (ymm && (c >> 28 & 1)) f |= NB_CPU_AVX;
    if (ymm && (c >> 12 & 1)) f |= NB_CPU_FMA;
    if (ymm && (c >> 29 & 1)) f |= NB_CPU_F16C;
    if (maxleaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        unsigned b7 = b, c7 = c, d7 = d;
        if (ymm && (b7 >> 5 & 1)) f |= NB_CPU_AVX2;
        if (zmm) {
            if (b7 >> 16 & 1) f |= NB_CPU_AVX512F;
            if (b7 >> 17 & 1) f |= NB_CPU_AVX512DQ;
            if (b7 >> 30 & 1) f |= NB_CPU_AVX512BW;
            if (b7 >> 31 & 1) f |= NB_CPU_AVX512VL;
            if (c7 >> 11 & 1) f |= NB_CPU_AVX512_VNNI;
            if (c7 >> 1 & 1) f |= NB_CPU_AVX512_VBMI;
            if (d7 >> 23 & 1) f |= NB_CPU_AVX512_FP16;
            __cpuid_count(7, 1, a, b, c, d);
            if (a >> 5 & 1) f |= NB_CPU_AVX512_BF16;
        }
        if (tiles) {
            if (d7 >> 24 & 1) f |= NB_CPU_AMX_TILE;
            if (d7 >> 22 & 1) f |= NB_CPU_AMX_BF16;
            if (d7 >> 25 & 1) f |= NB_CPU_AMX_INT8;
        }
    }
    out->flags = f;
    if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char s[49];
        memcpy(s, r, 48);
        s[48] = 0;
        const char *p = s;
        while (*p == ' ') p++;
        snprintf(out->brand, sizeof out->brand, "%s", p);
        size_t n = strlen(out->brand);
        while (n && out->brand[n - 1] == ' ') out->brand[--n] = 0;
    }
#endif
}

static const char *const FLAG_NAMES[] = {"sse3",        "avx",         "fma",         "avx2",     "avx512f",
                                         "avx512bw",    "avx512vl",    "avx512dq",    "avx512_vnni", "avx512_bf16",
                                         "avx512_fp16", "amx_tile",    "amx_bf16",    "amx_int8",    "f16c",        "avx512_vbmi"};

void nb_cpu_flags_str(uint32_t flags, char *buf, size_t n) {
    if (!n) return;
    buf[0] = 0;
    size_t len = 0;
    for (size_t i = 0; i < sizeof FLAG_NAMES / sizeof *FLAG_NAMES; i++) {
        if (!(flags >> i & 1)) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? " " : "", FLAG_NAMES[i]);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
    }
}

static nb_cpu_features g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;
static void cpu_once(void) { nb_cpu_detect(&g_cpu); }

const nb_cpu_features *nb_cpu(void) {
    pthread_once(&g_cpu_once, cpu_once);
    return &g_cpu;
}

/* The SIMD paths are x86-64 code built with GCC or Clang's target attributes; elsewhere only the
 * scalar ones exist, whatever the features. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NB_SIMD_BUILT 1
static int has(uint32_t want) { return (nb_cpu()->flags & want) == want; }
#endif

int nb_cpu_simd_best(void) {
#ifdef NB_SIMD_BUILT
    if (has(NB_CPU_AVX2 | NB_CPU_FMA | NB_CPU_AVX512F)) return NB_SIMD_AVX512;
    if (has(NB_CPU_AVX2 | NB_CPU_FMA)) return NB_SIMD_AVX2;
#endif
    return NB_SIMD_SCALAR;
}

int nb_cpu_quant_best(void) {
#ifdef NB_SIMD_BUILT
    const uint32_t avx2 = NB_CPU_AVX2 | NB_CPU_FMA | NB_CPU_F16C;
    if (has(avx2 | NB_CPU_AVX512F | NB_CPU_AVX512BW | NB_CPU_AVX512VL | NB_CPU_AVX512DQ)) return NB_SIMD_AVX512;
    if (has(avx2)) return NB_SIMD_AVX2;
#endif
    return NB_SIMD_SCALAR;
}

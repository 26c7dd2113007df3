/* Chooses the quantizer row functions for this CPU when libnibble loads (AVX-512 BF16 kernels on top
 * of the AVX2+FMA+F16C rows, AVX2 alone, else the scalar references), and holds the pieces the fast paths share: the exact MXFP8 ceil-rule table
 * and the bulk dtype helpers (AVX2 or plain C). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/fast_internal.h"
#include "nibble/quant_fast.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define NBQ_X86 1
#else
#define NBQ_X86 0
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- CPU detection ----------------------------------------------------------------------------- */

int nbq_cpu_has_avx2(void) {
#if NBQ_X86
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v >= 0) return v;
    __builtin_cpu_init();   /* needed when called from a constructor */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    return v;
#else
    return 0;
#endif
}

/* ---- MXFP8 ceil rule without libm -------------------------------------------------------------- */

static uint32_t MX_TAB[NBQ_MX_TABLE];
static pthread_once_t MX_ONCE = PTHREAD_ONCE_INIT;

/* The reference's expression on the descale d itself (mxfp8.c): ceil(f32(log2(double(d)))). */
static int ref_ceil_log2(uint32_t u) {
    float l = (float)log2((double)u2f(u));
    return (int)ceilf(l);
}

/* First bit pattern in the binade of 2^k (k = -127: the subnormals [2^-127, 2^-126)) where the
 * reference's exponent becomes k+1. Near the start of a binade log2 is tiny and the f32 rounding of
 * k + log2(m) can give back k, so scan the first patterns; the rest of the binade (monotone: log2
 * only grows) is searched by bisection. */
static void mx_build(void) {
    for (int k = -127; k <= 127; k++) {
        uint32_t lo = k >= -126 ? (uint32_t)(k + 127) << 23 : 0x00400000u;
        uint32_t hi = k >= -126 ? lo + 0x7FFFFFu : 0x007FFFFFu;
        uint32_t thr = UINT32_MAX, u = lo;
        for (; u <= hi && u < lo + 4096; u++)
            if (ref_ceil_log2(u) > k) { thr = u; break; }
        if (thr == UINT32_MAX && u <= hi && ref_ceil_log2(hi) > k) {
            uint32_t l = u, h = hi;   /* ref(l-1) == k, ref(h) > k */
            while (l < h) {
                uint32_t mid = l + (h - l) / 2;
                if (ref_ceil_log2(mid) > k) h = mid;
                else l = mid + 1;
            }
            thr = l;
        }
        MX_TAB[k + 127] = thr;
    }
}

const uint32_t *nbq_mx_ceil_table(void) {
    pthread_once(&MX_ONCE, mx_build);
    return MX_TAB;
}

uint8_t nbq_mx_scale_byte_fast(float block_amax, int ocp_floor) {
    int c = nbn_mxfp8_scale_byte_tab(block_amax, ocp_floor, ocp_floor ? NULL : nbq_mx_ceil_table());
    return c >= 0 ? (uint8_t)c : nb_mxfp8_scale_byte(block_amax, ocp_floor);   /* Inf / NaN: the reference's answer */
}

/* ---- bulk dtype helpers --------------------------------------------------------------------------- */

static void plain_load(const void *src, nb_dtype dt, int64_t n, float *out) {
    if (dt == NB_F32) {
        memcpy(out, src, (size_t)n * sizeof(float));
    } else if (dt == NB_BF16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) out[i] = u2f((uint32_t)s[i] << 16);
    } else {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) out[i] = nb_f16_to_f32(s[i]);
    }
}

static void plain_store(void *dst, nb_dtype dt, int64_t n, const float *in) {
    if (dt == NB_F32) {
        memmove(dst, in, (size_t)n * sizeof(float));
    } else if (dt == NB_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nb_f32_to_bf16(in[i]);
    } else {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nb_f32_to_f16(in[i]);
    }
}

static float plain_absmax(const void *src, nb_dtype dt, int64_t n, int *nonfinite) {
    uint32_t m = 0, lim;
    if (dt == NB_F32) {
        const uint32_t *u = src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t v = u[i] & 0x7FFFFFFFu;
            m = v > m ? v : m;
        }
        lim = 0x7F800000u;
    } else {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t v = h[i] & 0x7FFFu;
            m = v > m ? v : m;
        }
        lim = dt == NB_BF16 ? 0x7F80u : 0x7C00u;
    }
    *nonfinite = m >= lim;
    if (m >= lim) return 0.0f;
    if (dt == NB_F32) return u2f(m);
    return dt == NB_BF16 ? u2f(m << 16) : nb_f16_to_f32((uint16_t)m);
}

void nbq_fast_load_f32(const void *src, nb_dtype dt, int64_t n, float *out) {
#if NBQ_X86
    if (nbq_cpu_has_avx2()) { nbq_avx2_load_f32(src, dt, n, out); return; }
#endif
    plain_load(src, dt, n, out);
}

void nbq_fast_store_f32(void *dst, nb_dtype dt, int64_t n, const float *in) {
#if NBQ_X86
    if (nbq_cpu_has_avx2()) { nbq_avx2_store_f32(dst, dt, n, in); return; }
#endif
    plain_store(dst, dt, n, in);
}

float nbq_fast_absmax(const void *src, nb_dtype dt, int64_t n, int *nonfinite) {
#if NBQ_X86
    if (nbq_cpu_has_avx2()) return nbq_avx2_absmax(src, dt, n, nonfinite);
#endif
    return plain_absmax(src, dt, n, nonfinite);
}

/* The same pass split over the context's threads (256 chunks at most; small inputs run inline). */
typedef struct absmax_mt_job {
    const uint8_t *src;
    nb_dtype dt;
    int64_t n, chunk, esize;
    float part[256];
    int nonfinite[256];
} absmax_mt_job;

static void absmax_mt_range(void *arg, int64_t b, int64_t e) {
    absmax_mt_job *j = arg;
    for (int64_t c = b; c < e; c++) {
        int64_t lo = c * j->chunk, hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
        j->part[c] = nbq_fast_absmax(j->src + lo * j->esize, j->dt, hi - lo, &j->nonfinite[c]);
    }
}

float nbq_fast_absmax_mt(nb_ctx *ctx, const void *src, nb_dtype dt, int64_t n, int *nonfinite) {
    if (n < (1 << 18)) return nbq_fast_absmax(src, dt, n, nonfinite);
    absmax_mt_job j;
    j.src = src;
    j.dt = dt;
    j.n = n;
    j.esize = dt == NB_F32 ? 4 : 2;
    int64_t nchunks = 256;
    j.chunk = (n + nchunks - 1) / nchunks;
    nchunks = (n + j.chunk - 1) / j.chunk;
    nb_parallel_for(ctx, nchunks, 1, absmax_mt_range, &j);
    float m = 0.0f;
    *nonfinite = 0;
    for (int64_t c = 0; c < nchunks; c++) {
        *nonfinite |= j.nonfinite[c];
        m = j.part[c] > m ? j.part[c] : m;
    }
    return *nonfinite ? 0.0f : m;
}

typedef struct row_absmax_job {
    const uint8_t *src;
    nb_dtype dt;
    int64_t n, esize;
    float *out;
} row_absmax_job;

static void row_absmax_range(void *arg, int64_t b, int64_t e) {
    row_absmax_job *j = arg;
    for (int64_t r = b; r < e; r++) {
        int nonfinite;
        j->out[r] = nbq_fast_absmax(j->src + r * j->n * j->esize, j->dt, j->n, &nonfinite);
    }
}

void nbq_fast_row_absmax_mt(nb_ctx *ctx, const void *src, nb_dtype dt, int64_t rows, int64_t n, float *out) {
    row_absmax_job j = {src, dt, n, dt == NB_F32 ? 4 : 2, out};
    nb_parallel_for(ctx, rows, n >= 16384 ? 1 : 16384 / (n ? n : 1), row_absmax_range, &j);
}

nb_status nbq_check_finite_params(nb_ctx *ctx, const nb_tensor *x, const char *what, const nb_qparams *p,
                                  nb_qparams *out) {
    *out = *p;
    int nonfinite = 0;
    float m = nbq_fast_absmax_mt(ctx, nb_tensor_data(x), x->dtype, nb_tensor_numel(x), &nonfinite);
    if (nonfinite) return nbq_check_finite(ctx, x, what);   /* names the first NaN/Inf */
    int nvfp4_dynamic = nbq_is_nvfp4(p->format) && !p->block_amax;
    if ((nvfp4_dynamic || p->format == NB_FMT_FP8_TENSOR) && nbq_from_data(p->amax)) out->amax = m;
    return NB_OK;
}

/* ---- choosing the rows ------------------------------------------------------------------------------ */

/* The "avx512" path: the AVX2 rows plus nb_quantize's AVX-512 BF16-input kernels. Process-wide, like
 * the traits table it sits beside. */
static int BF16_KERNELS = 0;

/* f's installed quantize row is the AVX2 one (the "avx2" or "avx512" path, not replaced by
 * nb_qformat_set_rows): the condition for every kernel that bypasses the rows. */
static int avx2_row_installed(nb_qformat f) {
#if NBQ_X86
    const nb_qformat_traits *t = nb_qformat_info(f);
    if (!t) return 0;
    switch (f) {
    case NB_FMT_NVFP4: return t->quantize_row == nbq_avx2_nvfp4_quantize_row;
    case NB_FMT_NVFP4_46: return t->quantize_row == nbq_avx2_nvfp4_46_quantize_row;
    case NB_FMT_MXFP8: return t->quantize_row == nbq_avx2_mxfp8_quantize_row;
    case NB_FMT_FP8_TENSOR:
    case NB_FMT_FP8_CHANNEL: return t->quantize_row == nbq_avx2_fp8_quantize_row;
    default: return 0;
    }
#else
    (void)f;
    return 0;
#endif
}

int nbq_bf16_kernels_for(nb_qformat f) {
    return __atomic_load_n(&BF16_KERNELS, __ATOMIC_RELAXED) && avx2_row_installed(f);
}

int nbq_avx2_nv_table_for(nb_qformat f) {
    return (f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46) && avx2_row_installed(f);
}

int nbq_avx2_bf16_for(nb_qformat f) {
    return (f == NB_FMT_MXFP8 || f == NB_FMT_FP8_TENSOR || f == NB_FMT_FP8_CHANNEL) && avx2_row_installed(f);
}

static nb_status install_avx2(nb_ctx *ctx) {
#if NBQ_X86
    nb_status s;
    __atomic_store_n(&BF16_KERNELS, 0, __ATOMIC_RELAXED);
    if ((s = nb_qformat_set_rows(ctx, NB_FMT_NVFP4, nbq_avx2_nvfp4_quantize_row, nbq_avx2_nvfp4_dequantize_row,
                                 nbq_avx2_nvfp4_fake_row)))
        return s;
    if ((s = nb_qformat_set_rows(ctx, NB_FMT_NVFP4_46, nbq_avx2_nvfp4_46_quantize_row, nbq_avx2_nvfp4_dequantize_row,
                                 nbq_avx2_nvfp4_46_fake_row)))
        return s;
    if ((s = nb_qformat_set_rows(ctx, NB_FMT_MXFP8, nbq_avx2_mxfp8_quantize_row, nbq_avx2_mxfp8_dequantize_row,
                                 nbq_avx2_mxfp8_fake_row)))
        return s;
    for (nb_qformat f = NB_FMT_FP8_TENSOR; f <= NB_FMT_FP8_CHANNEL; f++)
        if ((s = nb_qformat_set_rows(ctx, f, nbq_avx2_fp8_quantize_row, nbq_avx2_fp8_dequantize_row, nbq_avx2_fp8_fake_row)))
            return s;
    return NB_OK;
#else
    return nb_fail(ctx, NB_ERR_UNSUPPORTED, "quantizer path avx2: not built for this architecture");
#endif
}

static nb_status install_avx512(nb_ctx *ctx) {
    nb_status s = install_avx2(ctx);
    if (!s) __atomic_store_n(&BF16_KERNELS, 1, __ATOMIC_RELAXED);
    return s;
}

static nb_status install_reference(nb_ctx *ctx) {
    __atomic_store_n(&BF16_KERNELS, 0, __ATOMIC_RELAXED);
    for (nb_qformat f = NB_FMT_NVFP4; f < NB_FMT_COUNT; f++) {
        nb_status s = nb_qformat_set_rows(ctx, f, NULL, NULL, NULL);
        if (s) return s;
    }
    return NB_OK;
}

/* What NIBBLE_QUANT_PATH asked for at load when it could not be honoured: 0, NB_ERR_INVALID (not a
 * path name) or NB_ERR_UNSUPPORTED (a path this CPU or build lacks), with the value. An explicit
 * nb_quant_set_cpu_path clears it (the program's own choice replaces the environment's). */
static int ENV_STATUS;
static char ENV_VALUE[64];

nb_status nbq_env_path_status(nb_ctx *ctx) {
    int st = __atomic_load_n(&ENV_STATUS, __ATOMIC_ACQUIRE);
    if (!st) return NB_OK;
    if (st == NB_ERR_INVALID)
        return nb_fail(ctx, NB_ERR_INVALID, "NIBBLE_QUANT_PATH='%s' is not a quantizer path: expected auto, avx512, avx2 or "
                       "reference (unset it for auto)", ENV_VALUE);
    return nb_fail(ctx, NB_ERR_UNSUPPORTED, "NIBBLE_QUANT_PATH='%s': this CPU (or this build) lacks that quantizer path; "
                   "valid values are auto, avx512, avx2 or reference", ENV_VALUE);
}

/* The path by name without touching the environment's status. */
static nb_status set_path(nb_ctx *ctx, const char *path) {
    if (strcmp(path, "reference") == 0) return install_reference(ctx);
    if (strcmp(path, "avx2") == 0) {
        if (!nbq_cpu_has_avx2())
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, "quantizer path avx2: this CPU lacks AVX2, FMA or F16C");
        return install_avx2(ctx);
    }
    if (strcmp(path, "avx512") == 0) {
        if (!nbq_cpu_has_avx512())
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, "quantizer path avx512: this CPU lacks AVX-512 F/BW/VL/DQ (or AVX2)");
        return install_avx512(ctx);
    }
    if (strcmp(path, "auto") == 0)
        return nbq_cpu_has_avx512() ? install_avx512(ctx) : nbq_cpu_has_avx2() ? install_avx2(ctx) : install_reference(ctx);
    return nb_fail(ctx, NB_ERR_INVALID, "quantizer path '%s': expected auto, avx512, avx2 or reference", path);
}

nb_status nb_quant_set_cpu_path(nb_ctx *ctx, const char *path) {
    nb_status s = set_path(ctx, path ? path : "auto");
    if (!s) __atomic_store_n(&ENV_STATUS, 0, __ATOMIC_RELEASE);
    return s;
}

const char *nb_quant_cpu_path(void) {
    int avx2 = 0, ref = 0, total = 0;
    for (nb_qformat f = NB_FMT_NVFP4; f < NB_FMT_COUNT; f++) {
        const nb_qformat_traits *t = nb_qformat_info(f);
        total++;
#if NBQ_X86
        if (t->quantize_row == nbq_avx2_nvfp4_quantize_row || t->quantize_row == nbq_avx2_nvfp4_46_quantize_row ||
            t->quantize_row == nbq_avx2_mxfp8_quantize_row || t->quantize_row == nbq_avx2_fp8_quantize_row)
            avx2++;
#endif
        if (t->quantize_row == nb_nvfp4_quantize_row_ref || t->quantize_row == nb_nvfp4_46_quantize_row_ref ||
            t->quantize_row == nb_mxfp8_quantize_row_ref || t->quantize_row == nb_fp8_quantize_row_ref)
            ref++;
    }
    if (avx2 == total) return __atomic_load_n(&BF16_KERNELS, __ATOMIC_RELAXED) ? "avx512" : "avx2";
    return ref == total ? "reference" : "mixed";
}

/* At load time: the process-wide traits table gets the best rows this CPU runs. */
/* NIBBLE_QUANT_PATH (unset or empty = auto) names the path; a value that is not a path, or a path
 * this CPU lacks, installs auto and leaves an error that every quantize returns (nbq_env_path_status). */
__attribute__((constructor)) static void nbq_fast_init(void) {
    const char *env = getenv("NIBBLE_QUANT_PATH");
    if (!env || !*env) env = "auto";
    nb_status s = set_path(NULL, env);
    if (!s) return;
    snprintf(ENV_VALUE, sizeof ENV_VALUE, "%.60s", env);
    set_path(NULL, "auto");
    __atomic_store_n(&ENV_STATUS, (int)s, __ATOMIC_RELEASE);
}

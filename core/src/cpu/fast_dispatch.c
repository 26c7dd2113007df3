/* Chooses a context's quantizer row functions (AVX-512 BF16 kernels on top of the AVX2+FMA+F16C rows,
 * AVX2 alone, else the scalar references) into its backend table, and holds the pieces the fast paths
 * share: the exact MXFP8 ceil-rule table and the bulk dtype helpers (AVX2 or plain C). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/fast_internal.h"
#include "nibble/quant_fast.h"
#include "backend.h"
#include "cpu/features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NBQ_X86 1
#else
#define NBQ_X86 0
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- CPU features (features.c reads them) -------------------------------------------------------- */

int nbq_cpu_has_avx2(void) { return nb_cpu_quant_best() >= NB_SIMD_AVX2; }
int nbq_cpu_has_avx512(void) { return nb_cpu_quant_best() >= NB_SIMD_AVX512; }

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

static const nb_qrow_fns REF_ROWS[NB_FMT_COUNT] = {
    [NB_FMT_NVFP4] = {nb_nvfp4_quantize_row_ref, nb_nvfp4_dequantize_row_ref, nb_nvfp4_fake_row_ref},
    [NB_FMT_NVFP4_46] = {nb_nvfp4_46_quantize_row_ref, nb_nvfp4_dequantize_row_ref, nb_nvfp4_46_fake_row_ref},
    [NB_FMT_MXFP8] = {nb_mxfp8_quantize_row_ref, nb_mxfp8_dequantize_row_ref, nb_mxfp8_fake_row_ref},
    [NB_FMT_FP8_TENSOR] = {nb_fp8_quantize_row_ref, nb_fp8_dequantize_row_ref, nb_fp8_fake_row_ref},
    [NB_FMT_FP8_CHANNEL] = {nb_fp8_quantize_row_ref, nb_fp8_dequantize_row_ref, nb_fp8_fake_row_ref},
};

#if NBQ_X86
static const nb_qrow_fns AVX2_ROWS[NB_FMT_COUNT] = {
    [NB_FMT_NVFP4] = {nbq_avx2_nvfp4_quantize_row, nbq_avx2_nvfp4_dequantize_row, nbq_avx2_nvfp4_fake_row},
    [NB_FMT_NVFP4_46] = {nbq_avx2_nvfp4_46_quantize_row, nbq_avx2_nvfp4_dequantize_row, nbq_avx2_nvfp4_46_fake_row},
    [NB_FMT_MXFP8] = {nbq_avx2_mxfp8_quantize_row, nbq_avx2_mxfp8_dequantize_row, nbq_avx2_mxfp8_fake_row},
    [NB_FMT_FP8_TENSOR] = {nbq_avx2_fp8_quantize_row, nbq_avx2_fp8_dequantize_row, nbq_avx2_fp8_fake_row},
    [NB_FMT_FP8_CHANNEL] = {nbq_avx2_fp8_quantize_row, nbq_avx2_fp8_dequantize_row, nbq_avx2_fp8_fake_row},
};
#endif

const nb_qrow_fns *nb_qformat_ref_rows(nb_qformat f) {
    return (unsigned)f < NB_FMT_COUNT && f != NB_FMT_NONE ? &REF_ROWS[f] : NULL;
}

const nb_qrow_fns *nb_qformat_rows(const nb_ctx *ctx, nb_qformat f) {
    return (unsigned)f < NB_FMT_COUNT && f != NB_FMT_NONE ? &nb_backend_of(ctx)->rows[f] : NULL;
}

nb_status nb_qformat_set_rows(nb_ctx *ctx, nb_qformat f, nb_qrow_quantize_fn quantize,
                              nb_qrow_dequantize_fn dequantize, nb_qrow_fake_fn fake) {
    if ((unsigned)f >= NB_FMT_COUNT || f == NB_FMT_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "set_rows: no row functions for format %d", (int)f);
    if (!ctx) return NB_ERR_INVALID;
    nb_qrow_fns *r = &nb_ctx_backend(ctx)->rows[f];
    r->quantize = quantize ? quantize : REF_ROWS[f].quantize;
    r->dequantize = dequantize ? dequantize : REF_ROWS[f].dequantize;
    r->fake = fake ? fake : REF_ROWS[f].fake;
    return NB_OK;
}

/* f's quantize row on ctx is the AVX2 one (the "avx2" or "avx512" path, not replaced by
 * nb_qformat_set_rows): the condition for every kernel that bypasses the rows. */
static int avx2_row_installed(const nb_ctx *ctx, nb_qformat f) {
#if NBQ_X86
    if ((unsigned)f >= NB_FMT_COUNT || f == NB_FMT_NONE) return 0;
    return nb_backend_of(ctx)->rows[f].quantize == AVX2_ROWS[f].quantize;
#else
    (void)ctx;
    (void)f;
    return 0;
#endif
}

int nbq_bf16_kernels_for(const nb_ctx *ctx, nb_qformat f) {
    return nb_backend_of(ctx)->bf16_kernels && avx2_row_installed(ctx, f);
}

int nbq_avx2_nv_table_for(const nb_ctx *ctx, nb_qformat f) {
    return (f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46) && avx2_row_installed(ctx, f);
}

int nbq_avx2_bf16_for(const nb_ctx *ctx, nb_qformat f) {
    return (f == NB_FMT_MXFP8 || f == NB_FMT_FP8_TENSOR || f == NB_FMT_FP8_CHANNEL) && avx2_row_installed(ctx, f);
}

static void install(nb_backend *b, const nb_qrow_fns *rows, int bf16_kernels) {
    for (int f = 0; f < NB_FMT_COUNT; f++) b->rows[f] = rows[f];
    b->bf16_kernels = bf16_kernels;
}

nb_status nbq_backend_set_path(nb_ctx *ctx, nb_backend *b, const char *path) {
    int best = nb_cpu_quant_best();
    if (!path || strcmp(path, "auto") == 0) path = best == NB_SIMD_AVX512 ? "avx512" : best == NB_SIMD_AVX2 ? "avx2" : "reference";
    if (strcmp(path, "reference") == 0) {
        install(b, REF_ROWS, 0);
        return NB_OK;
    }
    if (strcmp(path, "avx2") == 0 || strcmp(path, "avx512") == 0) {
        int want = path[3] == '5' ? NB_SIMD_AVX512 : NB_SIMD_AVX2;
        if (best < want)
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, want == NB_SIMD_AVX2 ? "quantizer path avx2: this CPU lacks AVX2, FMA or F16C"
                           : "quantizer path avx512: this CPU lacks AVX-512 F/BW/VL/DQ (or AVX2)");
#if NBQ_X86
        install(b, AVX2_ROWS, want == NB_SIMD_AVX512);
#endif
        return NB_OK;
    }
    return nb_fail(ctx, NB_ERR_INVALID, "quantizer path '%s': expected auto, avx512, avx2 or reference", path);
}

/* What NIBBLE_QUANT_PATH asked for at the context's creation when it could not be honoured. */
nb_status nbq_env_path_status(nb_ctx *ctx) {
    const nb_backend *b = nb_backend_of(ctx);
    if (!b->quant_env_status) return NB_OK;
    if (b->quant_env_status == NB_ERR_INVALID)
        return nb_fail(ctx, NB_ERR_INVALID, "NIBBLE_QUANT_PATH='%s' is not a quantizer path: expected auto, avx512, avx2 or "
                       "reference (unset it for auto)", b->quant_env_value);
    return nb_fail(ctx, NB_ERR_UNSUPPORTED, "NIBBLE_QUANT_PATH='%s': this CPU (or this build) lacks that quantizer path; "
                   "valid values are auto, avx512, avx2 or reference", b->quant_env_value);
}

nb_status nb_quant_set_cpu_path(nb_ctx *ctx, const char *path) {
    if (!ctx) return NB_ERR_INVALID;
    nb_backend *b = nb_ctx_backend(ctx);
    nb_status s = nbq_backend_set_path(ctx, b, path ? path : "auto");
    if (!s) b->quant_env_status = NB_OK;   /* the program's own choice replaces the environment's */
    return s;
}

const char *nb_quant_cpu_path(const nb_ctx *ctx) {
    const nb_backend *b = nb_backend_of(ctx);
    int avx2 = 0, ref = 0, total = 0;
    for (nb_qformat f = NB_FMT_NVFP4; f < NB_FMT_COUNT; f++) {
        total++;
#if NBQ_X86
        avx2 += b->rows[f].quantize == AVX2_ROWS[f].quantize;
#endif
        ref += b->rows[f].quantize == REF_ROWS[f].quantize;
    }
    if (avx2 == total) return b->bf16_kernels ? "avx512" : "avx2";
    return ref == total ? "reference" : "mixed";
}

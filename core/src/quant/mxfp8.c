/* MXFP8 scalar reference rows: E4M3 elements with one E8M0 scale per 32 (FORMATS.md §5).
 * Default is ModelOpt's ceil rule, e = ceil(log2(amax/448)); the OCP floor rule
 * e = floor(log2 amax) - 8 is an option. Elements are scaled by 2^-e, clamped to ±448 (saturating).
 * The scale byte here is the libm reference the integer form in quant/numerics.h (the fast paths' and
 * the CUDA kernels') is held to; the element arithmetic is numerics.h's. */
#include <math.h>

#include "quant/numerics.h"
#include "quant/quant_internal.h"

uint8_t nb_mxfp8_scale_byte(float block_amax, int ocp_floor) {
    int e;
    if (ocp_floor) {
        if (!(block_amax > 0.0f)) return 0;          /* zero block: exponent -127 */
        int ex;
        frexpf(block_amax, &ex);                     /* amax = m * 2^ex, m in [0.5, 1): floor(log2) = ex-1 */
        e = ex - 1 - 8;                              /* 8 = exponent of E4M3's max normal 448 */
    } else {
        float descale = block_amax / 448.0f;         /* f32, as torch: amax.float() / E4M3_MAX */
        if (!(descale > 0.0f)) return 0;             /* torch.where(descale > 0, log2, -127) */
        /* torch.log2 in f32 (correctly rounded on CPU): a value a hair above a power of two can
         * round down to the integer, and ceil then keeps it; emulate that rounding exactly. */
        float l = (float)log2((double)descale);
        e = (int)ceilf(l);
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}


/* quantize_with_scale: w * 2^(127-code) (exact power of two in f32), clamp ±448, RNE to E4M3. */
static void block_quant(const float *x, uint8_t code, uint8_t *q) {
    float sf = nbn_pow2(127 - (int)code);
    for (int i = 0; i < NB_MXFP8_BLOCK; i++) q[i] = nbn_mxfp8_code(x[i], sf);   /* clamps to ±448 first */
}

void nb_mxfp8_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    for (int64_t b = 0; b < n / NB_MXFP8_BLOCK; b++) {
        const float *xb = x + b * NB_MXFP8_BLOCK;
        uint8_t code = nb_mxfp8_scale_byte(nbn_block_absmax(xb, NB_MXFP8_BLOCK), a->mx_floor);
        s[b] = code;
        block_quant(xb, code, q + b * NB_MXFP8_BLOCK);
    }
}

void nb_mxfp8_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y) {
    for (int64_t b = 0; b < n / NB_MXFP8_BLOCK; b++) {
        float d = nbn_pow2((int)s[b] - 127);
        for (int i = 0; i < NB_MXFP8_BLOCK; i++) y[b * NB_MXFP8_BLOCK + i] = nbn_mul(nbn_e4m3_to_f32(q[b * NB_MXFP8_BLOCK + i]), d);
    }
}

void nb_mxfp8_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    uint8_t q[NB_MXFP8_BLOCK];
    for (int64_t b = 0; b < n / NB_MXFP8_BLOCK; b++) {
        const float *xb = x + b * NB_MXFP8_BLOCK;
        uint8_t code = nb_mxfp8_scale_byte(nbn_block_absmax(xb, NB_MXFP8_BLOCK), a->mx_floor);
        block_quant(xb, code, q);
        float d = nbn_pow2((int)code - 127);
        for (int i = 0; i < NB_MXFP8_BLOCK; i++) y[b * NB_MXFP8_BLOCK + i] = nbn_mul(nbn_e4m3_to_f32(q[i]), d);
    }
}

/* NVFP4 and four_over_six scalar reference rows: ModelOpt's export arithmetic in its exact fp32
 * operation order (FORMATS.md §1.3, §2.3). Fast CPU and CUDA paths are tested against these.
 * Fake quant is the same code with the dequantized value written instead of the packed code. */
#include <math.h>

#include "quant/quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF   /* every product and quotient is rounded to f32 on its own, as torch does */
#endif

const float nb_e2m1_deq[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* _cast_per_block_scale_to_fp8: clamp to [2^-9, 448] so the cast neither underflows to 0 nor
 * overflows to NaN. nibble uses this rule in fake quant too (ModelOpt's fake quant lets a block
 * scale underflow to 0 and zeroes the block): what was trained is what ships. */
static uint8_t scale_to_e4m3(float v) {
    if (v < 0x1p-9f) v = 0x1p-9f;
    if (v > 448.0f) v = 448.0f;
    return nb_f32_to_e4m3(v);
}

float nb_nvfp4_scale2(float amax, float norm) {
    float d = 6.0f * norm;   /* E2M1_MAX * m: exact (2688 or 1536) */
    return amax / d;
}

uint8_t nb_nvfp4_block_scale_dynamic(float block_amax, float s2) {
    float d = 6.0f * s2;
    float pbs = block_amax / d;
    if (pbs == 0.0f) pbs = 1.0f;   /* all-zero block -> scale byte 0x38 */
    return scale_to_e4m3(pbs);
}

uint8_t nb_nvfp4_block_scale_static(float block_amax, float global_amax, float norm) {
    float pbs = block_amax / 6.0f;
    if (pbs == 0.0f) pbs = 1.0f;
    float pbs_max = global_amax / 6.0f;
    float r = pbs * norm;
    r = r / pbs_max;
    return scale_to_e4m3(r);
}

static float block_absmax(const float *x) {
    float m = 0.0f;
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    return m;
}

/* Effective per-element divisor p = f32(float(scale byte) * s2), as ModelOpt's quantize computes it. */
static float block_divisor(uint8_t sb, float s2) {
    float f = nb_e4m3_to_f32(sb);
    return f * s2;
}

static void block_codes(const float *x, float p, uint8_t *codes) {
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        float v = x[i] / p;
        codes[i] = nb_f32_to_e2m1(v);
    }
}

/* Squared error of the block dequantized with divisor p (f32 difference and square, summed in
 * double; ModelOpt sums f32 in torch's reduction order, which only matters at exact-ulp ties). */
static double block_sse(const float *x, float p) {
    uint8_t c[NB_NVFP4_BLOCK];
    block_codes(x, p, c);
    double s = 0.0;
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        float y = nb_e2m1_deq[c[i]] * p;
        float e = x[i] - y;
        float e2 = e * e;
        s += (double)e2;
    }
    return s;
}

int nb_nvfp4_46_pick_block(const float *x, float block_amax, float global_amax) {
    float s2 = nb_nvfp4_scale2(global_amax, 256.0f);
    float amax4 = block_amax * 1.5f;   /* candidate multiplier 1.5: the block max lands on 4 */
    float p6 = block_divisor(nb_nvfp4_block_scale_static(block_amax, global_amax, 256.0f), s2);
    float p4 = block_divisor(nb_nvfp4_block_scale_static(amax4, global_amax, 256.0f), s2);
    return block_sse(x, p4) < block_sse(x, p6);
}

/* One block's scale byte for the row's mode. norm 448 = NVFP4, 256 = four_over_six. */
static uint8_t row_block_scale(const float *xb, int64_t b, const nb_qrow_args *a, float norm, int pick46) {
    if (a->block_amax) return nb_nvfp4_block_scale_static(a->block_amax[b], a->global_amax, norm);
    float bamax = block_absmax(xb);
    if (pick46) {
        if (nb_nvfp4_46_pick_block(xb, bamax, a->global_amax)) bamax = bamax * 1.5f;
        return nb_nvfp4_block_scale_static(bamax, a->global_amax, norm);
    }
    return nb_nvfp4_block_scale_dynamic(bamax, a->scale);
}

static void quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float norm,
                         int pick46) {
    uint8_t c[NB_NVFP4_BLOCK];
    for (int64_t b = 0; b < n / NB_NVFP4_BLOCK; b++) {
        const float *xb = x + b * NB_NVFP4_BLOCK;
        uint8_t sb = row_block_scale(xb, b, a, norm, pick46);
        s[b] = sb;
        block_codes(xb, block_divisor(sb, a->scale), c);
        uint8_t *qb = q + b * (NB_NVFP4_BLOCK / 2);
        for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) qb[j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
    }
}

static void fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y, float norm, int pick46) {
    uint8_t c[NB_NVFP4_BLOCK];
    for (int64_t b = 0; b < n / NB_NVFP4_BLOCK; b++) {
        const float *xb = x + b * NB_NVFP4_BLOCK;
        float p = block_divisor(row_block_scale(xb, b, a, norm, pick46), a->scale);
        block_codes(xb, p, c);
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) y[b * NB_NVFP4_BLOCK + i] = nb_e2m1_deq[c[i]] * p;
    }
}

void nb_nvfp4_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    quantize_row(x, n, a, q, s, 448.0f, 0);
}

void nb_nvfp4_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    fake_row(x, n, a, y, 448.0f, 0);
}

void nb_nvfp4_46_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    quantize_row(x, n, a, q, s, 256.0f, 1);
}

void nb_nvfp4_46_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    fake_row(x, n, a, y, 256.0f, 1);
}

/* Loaders' dequant: code value * f32(float(scale byte) * weight_scale_2) (same for four_over_six). */
void nb_nvfp4_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y) {
    for (int64_t b = 0; b < n / NB_NVFP4_BLOCK; b++) {
        float p = block_divisor(s[b], a->scale);
        const uint8_t *qb = q + b * (NB_NVFP4_BLOCK / 2);
        float *yb = y + b * NB_NVFP4_BLOCK;
        for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) {
            yb[2 * j] = nb_e2m1_deq[qb[j] & 0xF] * p;
            yb[2 * j + 1] = nb_e2m1_deq[qb[j] >> 4] * p;
        }
    }
}

/* NVFP4 and four_over_six scalar reference rows: ModelOpt's export arithmetic in its exact fp32
 * operation order (FORMATS.md §1.3, §2.3), from the block arithmetic in quant/numerics.h (every product
 * and quotient rounded to f32 on its own, as torch does). Fast CPU and CUDA paths are tested against these.
 * Fake quant is the same code with the dequantized value written instead of the packed code. */
#include "quant/numerics.h"
#include "quant/quant_internal.h"

const float nb_e2m1_deq[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float nb_nvfp4_scale2(float amax, float norm) { return nbn_nvfp4_scale2(amax, norm); }

uint8_t nb_nvfp4_block_scale_dynamic(float block_amax, float s2) { return nbn_nvfp4_block_scale_dynamic(block_amax, s2); }

uint8_t nb_nvfp4_block_scale_static(float block_amax, float global_amax, float norm) {
    return nbn_nvfp4_block_scale_static(block_amax, global_amax, norm);
}

int nb_nvfp4_46_pick_block(const float *x, float block_amax, float global_amax) {
    return nbn_nvfp4_46_pick_block(x, block_amax, global_amax);
}

static void block_codes(const float *x, float p, uint8_t *codes) {
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) codes[i] = nbn_nvfp4_code(x[i], p);
}

/* One block's scale byte for the row's mode. norm 448 = NVFP4, 256 = four_over_six. */
static uint8_t row_block_scale(const float *xb, int64_t b, const nb_qrow_args *a, float norm, int pick46) {
    return nbn_nvfp4_block_scale(xb, a->block_amax ? a->block_amax + b : NULL, a->global_amax, a->scale, norm, pick46);
}

static void quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float norm,
                         int pick46) {
    uint8_t c[NB_NVFP4_BLOCK];
    for (int64_t b = 0; b < n / NB_NVFP4_BLOCK; b++) {
        const float *xb = x + b * NB_NVFP4_BLOCK;
        uint8_t sb = row_block_scale(xb, b, a, norm, pick46);
        s[b] = sb;
        block_codes(xb, nbn_nvfp4_divisor(sb, a->scale), c);
        uint8_t *qb = q + b * (NB_NVFP4_BLOCK / 2);
        for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) qb[j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
    }
}

static void fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y, float norm, int pick46) {
    uint8_t c[NB_NVFP4_BLOCK];
    for (int64_t b = 0; b < n / NB_NVFP4_BLOCK; b++) {
        const float *xb = x + b * NB_NVFP4_BLOCK;
        float p = nbn_nvfp4_divisor(row_block_scale(xb, b, a, norm, pick46), a->scale);
        block_codes(xb, p, c);
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) y[b * NB_NVFP4_BLOCK + i] = nbn_mul(nbn_e2m1_deq(c[i]), p);
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
        float p = nbn_nvfp4_divisor(s[b], a->scale);
        const uint8_t *qb = q + b * (NB_NVFP4_BLOCK / 2);
        float *yb = y + b * NB_NVFP4_BLOCK;
        for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) {
            yb[2 * j] = nbn_mul(nbn_e2m1_deq(qb[j] & 0xF), p);
            yb[2 * j + 1] = nbn_mul(nbn_e2m1_deq(qb[j] >> 4), p);
        }
    }
}

/* FORMATS.md §10 test vectors TV1-TV6, bit for bit: NVFP4 dynamic (ties, saturation, -0, zero
 * blocks), four_over_six (M=6 vs M=4), MXFP8 (ModelOpt ceil and OCP floor exponents) and FP8
 * per-tensor with ModelOpt's bf16 division. Each is checked through quantize, fake quant and
 * dequantize, so the vectors pin the row functions and the drivers together. */
#include <stdint.h>
#include <string.h>

#include "nbtest.h"

static nb_ctx *ctx;

static nb_tensor *bf16_row(const float *v, int64_t n) {
    uint16_t h[64];
    for (int64_t i = 0; i < n; i++) h[i] = nb_f32_to_bf16(v[i]);
    int64_t shape[2] = {1, n};
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_BF16, 2, shape, h, &t));
    return t;
}

static int bytes_eq(const nb_tensor *t, const uint8_t *want, int64_t n, const char *what) {
    const uint8_t *got = nb_tensor_data(t);
    if (nb_tensor_nbytes(t) != n) {
        fprintf(stderr, "%s: %lld bytes, want %lld\n", what, (long long)nb_tensor_nbytes(t), (long long)n);
        return 0;
    }
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "%s: byte %lld is %02X, want %02X\n", what, (long long)i, got[i], want[i]);
            return 0;
        }
    return 1;
}

/* fake quant must equal dequantize(quantize) bit for bit (f32 output) */
static void check_fake_equals_dequant(const nb_tensor *x, const nb_qparams *p, const char *what) {
    nb_qtensor *q = NULL;
    nb_tensor *d = NULL, *f = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, p, &q));
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &d));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, x->ndim, x->shape, &f));
    CHECK_OK(ctx, nb_fake_quant(ctx, x, p, f));
    CHECK_MSG(memcmp(nb_tensor_data(d), nb_tensor_data(f), (size_t)nb_tensor_nbytes(d)) == 0, "%s: fake != dequant", what);
    nb_tensor_release(d);
    nb_tensor_release(f);
    nb_qtensor_release(q);
}

static void tv1(void) {
    const float v[32] = {0, .25f, .75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 6, -.25f, -.75f, -1.75f, -3.5f, -5, 0.3f, -6,
                         2688, -1344, 896, 448, 100, 300, -700, 1104, 1600, 2000, -2208, 0, 50, -120, 1504, -2688};
    nb_tensor *x = bf16_row(v, 32);
    CHECK(nb_bf16_to_f32(nb_f32_to_bf16(0.3f)) == 0.30078125f);
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.amax = 2688.0f;
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    const uint8_t w[16] = {0x00, 0x22, 0x44, 0x66, 0x87, 0xCA, 0xEE, 0xF1, 0xD7, 0x24, 0x10, 0x4B, 0x66, 0x0E, 0x90, 0xF5};
    const uint8_t s[2] = {0x38, 0x7E};
    CHECK(bytes_eq(q->data, w, 16, "TV1 weight"));
    CHECK(bytes_eq(q->scale, s, 2, "TV1 weight_scale"));
    CHECK_EQ_INT(nbt_f2u(*(float *)nb_tensor_data(q->scale2)), 0x3F800000u);
    CHECK_EQ_INT(q->data->dtype, NB_U8);
    CHECK_EQ_INT(q->data->shape[1], 16);
    CHECK_EQ_INT(q->scale->dtype, NB_E4M3);
    CHECK_EQ_INT(q->scale->shape[1], 2);
    CHECK_EQ_INT(q->scale2->ndim, 0);
    /* amax from the data gives the same (max |x| = 2688) */
    nb_qtensor *q2 = NULL;
    nb_qparams p2;
    nb_qparams_init(&p2, NB_FMT_NVFP4);
    CHECK_OK(ctx, nb_quantize(ctx, x, &p2, &q2));
    CHECK(bytes_eq(q2->data, w, 16, "TV1 weight (amax from data)"));
    /* the dequantized -0.25 (code 8) is +0.0, as ModelOpt's e2m1_values table */
    nb_tensor *d = NULL;
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &d));
    const float *dv = nb_tensor_data(d);
    CHECK_EQ_INT(nbt_f2u(dv[9]), 0u);
    CHECK(dv[0] == 0.0f && dv[2] == 1.0f && dv[3] == 1.0f && dv[4] == 2.0f && dv[5] == 2.0f && dv[6] == 4.0f);
    CHECK(dv[7] == 4.0f && dv[8] == 6.0f && dv[15] == -6.0f && dv[16] == 2688.0f && dv[17] == -1344.0f);
    check_fake_equals_dequant(x, &p, "TV1");
    nb_tensor_release(d);
    nb_qtensor_release(q);
    nb_qtensor_release(q2);
    nb_tensor_release(x);
}

static void tv2(void) {
    const uint16_t h[16] = {0x3C4A, 0xBD3B, 0x3DA2, 0xBA9D, 0x3CF7, 0x3D63, 0xBD89, 0x3B5F,
                            0xBCAD, 0x3D25, 0xBC21, 0x3D7A, 0x3C76, 0xBD08, 0x3D44, 0xBD90};
    int64_t shape[2] = {1, 16};
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_BF16, 2, shape, h, &x));
    CHECK_EQ_INT(nbt_f2u(nb_nvfp4_scale2(0.1015625f, 448.0f)), 0x381E79E8u);
    CHECK_EQ_INT(nb_nvfp4_block_scale_dynamic(0.0791015625f, nb_nvfp4_scale2(0.1015625f, 448.0f)), 0x7B);
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.amax = 0.1015625f;
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    const uint8_t w[8] = {0xD2, 0x87, 0x64, 0x1F, 0x5B, 0x69, 0xC2, 0xF6};
    const uint8_t s[1] = {0x7B};
    CHECK(bytes_eq(q->data, w, 8, "TV2 weight"));
    CHECK(bytes_eq(q->scale, s, 1, "TV2 weight_scale"));
    CHECK_EQ_INT(nbt_f2u(*(float *)nb_tensor_data(q->scale2)), 0x381E79E8u);
    /* p = f32(352 * s2) = 0x3C59E79F: code 7 (element 2, 0.0791 -> 6) dequantizes to 6p */
    nb_tensor *d = NULL;
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &d));
    float pdiv = 352.0f * nb_nvfp4_scale2(0.1015625f, 448.0f);
    CHECK_EQ_INT(nbt_f2u(pdiv), 0x3C59E79Fu);
    CHECK(((float *)nb_tensor_data(d))[2] == 6.0f * pdiv);
    check_fake_equals_dequant(x, &p, "TV2");
    nb_tensor_release(d);
    nb_qtensor_release(q);
    nb_tensor_release(x);
}

static void tv3(void) {
    float v[32] = {0};
    for (int i = 16; i < 32; i++) v[i] = (float)(i - 20) * 0.125f;
    nb_tensor *x = bf16_row(v, 32);
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    const uint8_t *s = nb_tensor_data(q->scale);
    CHECK_EQ_INT(s[0], 0x38);
    const uint8_t zero[8] = {0};
    CHECK(memcmp(nb_tensor_data(q->data), zero, 8) == 0);
    CHECK_EQ_INT(nb_nvfp4_block_scale_dynamic(0.0f, 1.0f), 0x38);
    /* static path: a zero block gets r = 448/(G/6) clamped; G = 6 -> 0x7E; codes stay 0 */
    CHECK_EQ_INT(nb_nvfp4_block_scale_static(0.0f, 6.0f, 448.0f), 0x7E);
    check_fake_equals_dequant(x, &p, "TV3");
    nb_qtensor_release(q);
    nb_tensor_release(x);
}

static void tv4(void) {
    const float v[16] = {6, 5, 5, 5, -5, -5, 5, 5, 2.5f, 1, 0.5f, 0, 3, 4, -4.5f, 5.5f};
    nb_tensor *x = bf16_row(v, 16);
    const uint8_t w4[8] = {0x56, 0x55, 0xDD, 0x55, 0x13, 0x01, 0x54, 0x6D};
    const uint8_t w6[8] = {0x67, 0x66, 0xEE, 0x66, 0x24, 0x01, 0x65, 0x7E};
    CHECK_EQ_INT(nbt_f2u(nb_nvfp4_scale2(6.0f, 256.0f)), 0x3B800000u);
    CHECK_EQ_INT(nb_nvfp4_block_scale_static(6.0f, 6.0f, 256.0f), 0x78);
    CHECK_EQ_INT(nb_nvfp4_block_scale_static(9.0f, 6.0f, 256.0f), 0x7C);
    float xf[16];
    for (int i = 0; i < 16; i++) xf[i] = nb_bf16_to_f32(nb_f32_to_bf16(v[i]));
    CHECK_EQ_INT(nb_nvfp4_46_pick_block(xf, 6.0f, 6.0f), 1);

    /* (a) the inline choice (dynamic four_over_six, global amax 6) */
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4_46);
    p.amax = 6.0f;
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK(bytes_eq(q->data, w4, 8, "TV4 weight (M=4)"));
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(q->scale))[0], 0x7C);
    CHECK_EQ_INT(nbt_f2u(*(float *)nb_tensor_data(q->scale2)), 0x3B800000u);
    CHECK_EQ_INT(nb_qformat_info(q->format)->disk_format, NB_FMT_NVFP4);
    nb_qtensor_release(q);

    /* (b) the M=6 candidate: static at 256 with block amax 6; SSE 7.75 */
    int64_t one[2] = {1, 1};
    float a6 = 6.0f, a9 = 9.0f;
    nb_tensor *b6 = NULL, *b9 = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, one, &a6, &b6));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, one, &a9, &b9));
    nb_qparams_init(&p, NB_FMT_NVFP4_46);
    p.block_amax = b6;
    p.global_amax = 6.0f;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK(bytes_eq(q->data, w6, 8, "TV4 weight (M=6)"));
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(q->scale))[0], 0x78);
    nb_tensor *d = NULL;
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &d));
    double sse = 0;
    for (int i = 0; i < 16; i++) sse += (xf[i] - ((float *)nb_tensor_data(d))[i]) * (double)(xf[i] - ((float *)nb_tensor_data(d))[i]);
    CHECK_NEAR(sse, 7.75, 1e-12);
    nb_tensor_release(d);
    nb_qtensor_release(q);
    /* (c) the M=4 candidate, as the calibrator stores it: block amax 9, G 6; SSE 2.4375 */
    p.block_amax = b9;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK(bytes_eq(q->data, w4, 8, "TV4 weight (static M=4)"));
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &d));
    sse = 0;
    for (int i = 0; i < 16; i++) sse += (xf[i] - ((float *)nb_tensor_data(d))[i]) * (double)(xf[i] - ((float *)nb_tensor_data(d))[i]);
    CHECK_NEAR(sse, 2.4375, 1e-12);
    /* standard loaders: code * 384 * 2^-8 = code * 1.5 */
    CHECK(((float *)nb_tensor_data(d))[0] == 6.0f && ((float *)nb_tensor_data(d))[1] == 4.5f);
    check_fake_equals_dequant(x, &p, "TV4 static");
    nb_tensor_release(d);
    nb_qtensor_release(q);

    /* (d) through a quantizer and the four_over_six calibrator */
    nb_quantizer_config cfg;
    nb_quantizer_config_init(&cfg, NB_FMT_NVFP4_46);
    CHECK_EQ_INT(cfg.is_static, 1);
    nb_quantizer *qz = NULL;
    CHECK_OK(ctx, nb_quantizer_new(ctx, "tv4.weight_quantizer", &cfg, &qz));
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, qz, x, NB_CALIB_FOUR_OVER_SIX));
    nb_tensor *ba = NULL, *ga = NULL;
    CHECK_OK(ctx, nb_quantizer_get_state(ctx, qz, "block_amax", &ba));
    CHECK_OK(ctx, nb_quantizer_get_state(ctx, qz, "global_amax", &ga));
    CHECK(*(float *)nb_tensor_data(ba) == 9.0f);
    CHECK(*(float *)nb_tensor_data(ga) == 6.0f);
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, qz, x, &q));
    CHECK(bytes_eq(q->data, w4, 8, "TV4 weight (quantizer)"));
    float s2 = 0;
    CHECK_OK(ctx, nb_quantizer_scale(ctx, qz, &s2));
    CHECK_EQ_INT(nbt_f2u(s2), 0x3B800000u);
    nb_qtensor_release(q);
    nb_tensor_release(ba);
    nb_tensor_release(ga);
    nb_quantizer_release(qz);

    /* (e) the same block as plain NVFP4: s2 = 6/2688, byte 0x7E, M=6 codes */
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.amax = 6.0f;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK(bytes_eq(q->data, w6, 8, "TV4 as plain NVFP4"));
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(q->scale))[0], 0x7E);
    CHECK_EQ_INT(nbt_f2u(*(float *)nb_tensor_data(q->scale2)), 0x3B124925u);
    nb_qtensor_release(q);
    nb_tensor_release(b6);
    nb_tensor_release(b9);
    nb_tensor_release(x);
}

static void tv5(void) {
    float v[32] = {480, -300, 17, 0.5f, -1, 2, 3, 100};
    for (int i = 0; i < 24; i++) v[8 + i] = 0.25f * (float)i;
    nb_tensor *x = bf16_row(v, 32);
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_MXFP8);
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    const uint8_t w[32] = {0x77, 0xF1, 0x50, 0x28, 0xB0, 0x38, 0x3C, 0x64, 0x00, 0x20, 0x28, 0x2C, 0x30, 0x32, 0x34, 0x36,
                           0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F, 0x40, 0x40, 0x41, 0x42, 0x42, 0x42, 0x43, 0x44};
    CHECK(bytes_eq(q->data, w, 32, "TV5 weight"));
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(q->scale))[0], 0x80);
    CHECK_EQ_INT(q->data->dtype, NB_E4M3);
    CHECK_EQ_INT(q->scale->dtype, NB_U8);
    nb_tensor *d = NULL;
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &d));
    const float *dv = nb_tensor_data(d);
    CHECK(dv[0] == 480 && dv[1] == -288 && dv[2] == 16 && dv[7] == 96 && dv[8 + 17] == 4.0f && dv[31] == 6.0f);
    check_fake_equals_dequant(x, &p, "TV5");
    nb_tensor_release(d);
    nb_qtensor_release(q);
    /* OCP floor: 0x7F, 480 saturates to 448 */
    p.mx_floor = 1;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    const uint8_t wf[8] = {0x7E, 0xF9, 0x58, 0x30, 0xB8, 0x40, 0x44, 0x6C};
    CHECK(bytes_eq(q->scale, (const uint8_t[]){0x7F}, 1, "TV5 OCP scale"));
    CHECK(memcmp(nb_tensor_data(q->data), wf, 8) == 0);
    check_fake_equals_dequant(x, &p, "TV5 OCP");
    nb_qtensor_release(q);
    nb_tensor_release(x);
    /* the exponent rules at the disagreement points */
    CHECK_EQ_INT(nb_mxfp8_scale_byte(56.0f, 0), 0x7C);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(56.0f, 1), 0x7C);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(448.0f, 0), 0x7F);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(448.0f, 1), 0x7F);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(100.0f, 0), 0x7D);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(100.0f, 1), 0x7D);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(0.0f, 0), 0x00);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(480.0f, 0), 0x80);
    CHECK_EQ_INT(nb_mxfp8_scale_byte(480.0f, 1), 0x7F);
}

static void tv6(void) {
    const float v[4] = {3.0f, -1.5f, 1.0f, 2.890625f};
    nb_tensor *x = bf16_row(v, 4);
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_FP8_TENSOR);
    p.amax = 3.0f;
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK(bytes_eq(q->data, (const uint8_t[]){0x7E, 0xF6, 0x71, 0x7E}, 4, "TV6 weight (bf16 model)"));
    CHECK_EQ_INT(nbt_f2u(*(float *)nb_tensor_data(q->scale)), 0x3BDB6DB7u);
    CHECK_EQ_INT(q->scale->ndim, 0);
    check_fake_equals_dequant(x, &p, "TV6");
    nb_qtensor_release(q);
    /* the ideal f32 quotient gives 0x7D for 2.890625 */
    p.fp8_div_dtype = NB_F32;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(q->data))[3], 0x7D);
    nb_qtensor_release(q);
    /* the same weights held in f32 take the f32 path by default (ModelOpt on an fp32 model) */
    nb_tensor *xf = NULL;
    CHECK_OK(ctx, nb_tensor_to(ctx, x, NB_F32, &xf));
    p.fp8_div_dtype = -1;
    CHECK_OK(ctx, nb_quantize(ctx, xf, &p, &q));
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(q->data))[3], 0x7D);
    nb_qtensor_release(q);
    nb_tensor_release(xf);
    nb_tensor_release(x);
}

int main(void) {
    CHECK_OK(ctx, nb_ctx_new(2, &ctx));
    /* pass 0: the row functions the library installed (fast paths, if any); pass 1: scalar references */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (int f = 1; f < NB_FMT_COUNT; f++) CHECK_OK(ctx, nb_qformat_set_rows(ctx, (nb_qformat)f, NULL, NULL, NULL));
        tv1();
        tv2();
        tv3();
        tv4();
        tv5();
        tv6();
    }
    nb_ctx_release(ctx);
    return nbt_done("test_quant_vectors");
}

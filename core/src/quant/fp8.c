/* FP8 E4M3 per-tensor and per-row scalar reference rows (FORMATS.md §3.4, §6.4).
 * ModelOpt exports q = e4m3(w / s) with s = f32(amax/448). For a bf16/fp16 model and a per-tensor
 * (0-d) scale, torch computes that quotient in f32 and rounds it to the model dtype before the cast;
 * div_dtype reproduces that (measured with torch 2.15: the scale itself is NOT rounded to bf16,
 * unlike torch 1.13's behaviour recorded in FORMATS §6.4). Per-channel scales are dimensioned
 * tensors, so their quotient stays f32. The e4m3 cast saturates at ±448 (torch >= 2.13 does too). */
#include "quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static inline float scaled(float x, float s, int32_t div_dtype) {
    float v = x / s;
    if (div_dtype == NB_BF16) v = nb_bf16_to_f32(nb_f32_to_bf16(v));
    else if (div_dtype == NB_F16) v = nb_f16_to_f32(nb_f32_to_f16(v));
    return v;
}

void nb_fp8_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    for (int64_t i = 0; i < n; i++) q[i] = nb_f32_to_e4m3(scaled(x[i], a->scale, a->div_dtype));
}

/* Loaders' dequant: float(q) * weight_scale (f32). */
void nb_fp8_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y) {
    for (int64_t i = 0; i < n; i++) {
        float v = nb_e4m3_to_f32(q[i]);
        y[i] = v * a->scale;
    }
}

void nb_fp8_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    for (int64_t i = 0; i < n; i++) {
        float v = nb_e4m3_to_f32(nb_f32_to_e4m3(scaled(x[i], a->scale, a->div_dtype)));
        y[i] = v * a->scale;
    }
}

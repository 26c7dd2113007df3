/* FP8 E4M3 per-tensor and per-row scalar reference rows (FORMATS.md §3.4, §6.4).
 * ModelOpt exports q = e4m3(w / s) with s = f32(amax/448). For a bf16/fp16 model and a per-tensor
 * (0-d) scale, torch computes that quotient in f32 and rounds it to the model dtype before the cast;
 * div_dtype reproduces that (measured with torch 2.15: the scale itself is NOT rounded to bf16,
 * unlike torch 1.13's behaviour recorded in FORMATS §6.4). Per-channel scales are dimensioned
 * tensors, so their quotient stays f32. The e4m3 cast saturates at ±448 (torch >= 2.13 does too).
 *
 * Activations (W8A8 input_scale, the FP8 KV cache) go through the same rows with div_dtype F32:
 * y = e4m3(x / s) * s, x / s one correctly rounded f32 division (not a multiplication by 1/s),
 * saturated to ±448, rounded to nearest even. compressed-tensors' _quantize_dequantize computes the
 * same (x / scale, clamp(-448, 448), .to(float8_e4m3fn), times scale), bit for bit on the same x.
 * Its PPL with transformers still differs from nibble's read-back of the same export (stories260K,
 * 20 windows: 3.786941 vs 3.788011) because x is not the same: transformers computes the rotary
 * angle pos * inv_freq as an f32 product (off by up to half an ulp: 1.5e-5 rad at positions
 * 256..511), nibble in double (model/llama.c rope_tables). The attention outputs then differ by
 * ~1e-6, which flips the FP8 rounding of the few activations that close to a midpoint, and one flip
 * moves a 512-token window's NLL by up to ~0.01 in this 64-wide model. With the angle in double,
 * transformers gives 3.788669, and 17 of the 20 windows agree to float32 rounding instead of 3 (the
 * rest, and other BLAS kernels' sums, flip a few midpoints either way: tests/golden/gen_client_golden.py,
 * lua.client_golden). */
#include "quant/numerics.h"
#include "quant/quant_internal.h"

/* The element arithmetic (the quotient, its rounding to div_dtype, the saturating cast) is
 * quant/numerics.h's nbn_fp8_code, which the fast paths and the CUDA kernels share. */
void nb_fp8_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    for (int64_t i = 0; i < n; i++) q[i] = nbn_fp8_code(x[i], a->scale, a->div_dtype);
}

/* Loaders' dequant: float(q) * weight_scale (f32). */
void nb_fp8_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = nbn_mul(nbn_e4m3_to_f32(q[i]), a->scale);
}

void nb_fp8_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = nbn_mul(nbn_e4m3_to_f32(nbn_fp8_code(x[i], a->scale, a->div_dtype)), a->scale);
}

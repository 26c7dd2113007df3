/* The scalar element and scale arithmetic of every format (FORMATS.md §1-§6), written once for C and
 * CUDA: the dtype conversions (BF16, F16, E4M3, E5M2, E8M0, E2M1), the NVFP4 / four_over_six block
 * scales and the 4/6 pick, the MXFP8 power-of-two scales and table-driven E8M0 byte, the FP8 quotient.
 * The C references (dtype.c, quant/nvfp4.c, mxfp8.c, fp8.c), the scalar lanes of the x86 fast paths
 * (cpu/fast_x86.h, the threshold table of fast_avx512.c) and the CUDA kernels (kernels/quant_*.cu) all
 * call these functions, so a kernel is bit-equal to its reference because it runs the same source.
 *
 * Exactness: every product, quotient and sum is rounded to f32 on its own (never contracted into an
 * FMA). In C that is the compiler's setting (ISO C mode for gcc; the pragma below for clang, which
 * stays in force for the rest of the includer: every includer wants it). In device code the nbn_*
 * operators are the __f*_rn intrinsics, which nvcc never contracts; nbn_mul / nbn_div / nbn_sub also
 * give back the NaN an x86 CPU produces (see nbn_x86_nan), the *_rn forms leave a NaN's bits to the
 * hardware and serve where no NaN can arise or its bits are discarded.
 *
 * Everything here is static inline in C and __host__ __device__ inline under nvcc; nothing needs libm
 * beyond fabsf, and nothing reads memory but its arguments. */
#ifndef NIBBLE_QUANT_NUMERICS_H
#define NIBBLE_QUANT_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "nibble/dtype.h"
#include "nibble/quant.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define NBN_FN __host__ __device__ __forceinline__
#define NBN_TABLE const   /* a function's constant table: device code cannot read a host static */
#else
#define NBN_FN static inline
#define NBN_TABLE static const
#endif

#if defined(__clang__) && !defined(__CUDACC__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- bits and rounded operations ---------------------------------------------------------------- */

/* Bit casts, leading zeros, and a op b rounded to nearest even on its own (the *_rn forms leave a NaN
 * result's bits to the hardware). */
#ifdef __CUDA_ARCH__
NBN_FN uint32_t nbn_f2u(float f) { return __float_as_uint(f); }
NBN_FN float nbn_u2f(uint32_t u) { return __uint_as_float(u); }
NBN_FN int nbn_clz32(uint32_t u) { return __clz((int)u); }   /* u != 0 */
NBN_FN float nbn_mul_rn(float a, float b) { return __fmul_rn(a, b); }
NBN_FN float nbn_div_rn(float a, float b) { return __fdiv_rn(a, b); }
NBN_FN float nbn_add_rn(float a, float b) { return __fadd_rn(a, b); }
NBN_FN float nbn_sub_rn(float a, float b) { return __fsub_rn(a, b); }
NBN_FN double nbn_dadd_rn(double a, double b) { return __dadd_rn(a, b); }
#else
NBN_FN uint32_t nbn_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
NBN_FN float nbn_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
NBN_FN int nbn_clz32(uint32_t u) { return __builtin_clz(u); }   /* u != 0 */
NBN_FN float nbn_mul_rn(float a, float b) { return a * b; }
NBN_FN float nbn_div_rn(float a, float b) { return a / b; }
NBN_FN float nbn_add_rn(float a, float b) { return a + b; }
NBN_FN float nbn_sub_rn(float a, float b) { return a - b; }
NBN_FN double nbn_dadd_rn(double a, double b) { return a + b; }
#endif

/* The x86 SSE NaN of an operation a op b with result r, which the CPU references produce and the tests
 * compare bit for bit: a NaN operand comes back quieted with its sign and payload (the first one), an
 * invalid operation (0*inf, 0/0, inf-inf) gives the "default NaN" 0xFFC00000. A GPU would return its
 * canonical 0x7FFFFFFF instead; a CPU's own result is the reference's already. */
NBN_FN float nbn_x86_nan(float a, float b, float r) {
#ifdef __CUDA_ARCH__
    if (r == r) return r;
    if (a != a) return nbn_u2f(nbn_f2u(a) | 0x00400000u);
    if (b != b) return nbn_u2f(nbn_f2u(b) | 0x00400000u);
    return nbn_u2f(0xFFC00000u);
#else
    (void)a;
    (void)b;
    return r;
#endif
}

/* The operations of the references: rounded on their own, a NaN result's bits as x86 gives them. */
NBN_FN float nbn_mul(float a, float b) { return nbn_x86_nan(a, b, nbn_mul_rn(a, b)); }
NBN_FN float nbn_div(float a, float b) { return nbn_x86_nan(a, b, nbn_div_rn(a, b)); }
NBN_FN float nbn_sub(float a, float b) { return nbn_x86_nan(a, b, nbn_sub_rn(a, b)); }

/* 2^e as an exact f32 for e in [-127, 128] (ldexpf(1, e): 2^-127 is the subnormal 0x00400000, 2^128
 * is inf; below -127 gives 0). */
NBN_FN float nbn_pow2(int e) {
    if (e > 127) return nbn_u2f(0x7F800000u);
    if (e >= -126) return nbn_u2f((uint32_t)(e + 127) << 23);
    return nbn_u2f(e == -127 ? 0x00400000u : 0u);
}

/* ---- BF16 / F16 (PyTorch c10 semantics) --------------------------------------------------------- */

/* RNE on the bit pattern; NaN -> 0x7FC0. */
NBN_FN uint16_t nbn_f32_to_bf16(float x) {
    if (x != x) return 0x7FC0;
    uint32_t u = nbn_f2u(x);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

NBN_FN float nbn_bf16_to_f32(uint16_t h) { return nbn_u2f((uint32_t)h << 16); }

/* c10::detail::fp16_ieee_from_fp32_value: a scaling trick that makes the FPU do the RNE. */
NBN_FN uint16_t nbn_f32_to_f16(float f) {
    const float scale_to_inf = nbn_u2f(0x77800000u);
    const float scale_to_zero = nbn_u2f(0x08800000u);
    float base = nbn_mul_rn(nbn_mul_rn(fabsf(f), scale_to_inf), scale_to_zero);
    const uint32_t w = nbn_f2u(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = nbn_add_rn(nbn_u2f((bias >> 1) + 0x07800000u), base);
    const uint32_t bits = nbn_f2u(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

NBN_FN float nbn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return nbn_u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = nbn_mul_rn((float)m, 0x1p-24f);   /* exact */
        return sign ? -v : v;
    }
    return nbn_u2f(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- FP8 E4M3FN / E5M2 --------------------------------------------------------------------------- */

/* c10::detail::fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value, one body for both (the arguments
 * are constants, so each use compiles to its own format's code): mbits mantissa bits, exponent bias
 * `bias`, magnitudes from the bit pattern fp8_max on overflow to 0x7F (E4M3FN's NaN; E5M2, has_inf:
 * Inf 0x7C, NaN 0x7F above an f32 Inf). Subnormals by one float add that leaves the FPU to round to
 * nearest even, normals by adding half an ulp minus one plus the kept mantissa's low bit. */
NBN_FN uint8_t nbn_f32_to_fp8_raw(float f, int mbits, int bias, uint32_t fp8_max, int has_inf) {
    const uint32_t denorm_mask = (uint32_t)((127 - bias) + (23 - mbits) + 1) << 23;
    const int shift = 23 - mbits;
    uint32_t f_bits = nbn_f2u(f);
    uint8_t result;
    const uint32_t sign = f_bits & 0x80000000u;
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = has_inf && f_bits <= 0x7F800000u ? 0x7C : 0x7F;
    } else if (f_bits < ((uint32_t)(128 - bias) << 23)) {
        f_bits = nbn_f2u(nbn_add_rn(nbn_u2f(f_bits), nbn_u2f(denorm_mask)));
        result = (uint8_t)(f_bits - denorm_mask);
    } else {
        uint32_t mant_odd = (f_bits >> shift) & 1;
        f_bits += ((uint32_t)(bias - 127) << 23) + ((1u << (shift - 1)) - 1);
        f_bits += mant_odd;
        result = (uint8_t)(f_bits >> shift);
    }
    return (uint8_t)(result | (sign >> 24));
}

/* E4M3FN: RNE, non-saturating (>= 480 -> NaN 0x7F). */
NBN_FN uint8_t nbn_f32_to_e4m3_raw(float f) { return nbn_f32_to_fp8_raw(f, 3, 7, 1087u << 20, 0); }

/* The value of an FP8 code (exact in f32), one body for both formats as above: normals by exponent
 * rebias, subnormals m * 2^(1-bias-mbits); the all-ones exponent is Inf / NaN (E5M2, has_inf) or, with
 * all-ones mantissa, NaN (E4M3FN). A NaN keeps its sign (the C library's NAN / -NAN, 0x7FC00000 /
 * 0xFFC00000). */
NBN_FN float nbn_fp8_to_f32(uint8_t b, int mbits, int bias, int has_inf) {
    const uint32_t emax = (1u << (7 - mbits)) - 1, mmask = (1u << mbits) - 1;
    const uint32_t e = (b >> mbits) & emax, m = b & mmask;
    const uint32_t sign = (uint32_t)(b & 0x80) << 24;
    if (e == emax && (has_inf || m == mmask)) return nbn_u2f(sign | (m ? 0x7FC00000u : 0x7F800000u));
    if (e == 0) return nbn_u2f(sign | nbn_f2u(nbn_mul_rn((float)m, nbn_pow2(1 - bias - mbits))));
    return nbn_u2f(sign | ((e + 127 - (uint32_t)bias) << 23) | (m << (23 - mbits)));
}

/* |x| clamped to max (a NaN passes through). */
NBN_FN float nbn_clamp_abs(float x, float max) {
    if (x > max) x = max;
    if (x < -max) x = -max;
    return x;
}

/* NaN -> 0x7F, clamp to ±448 (saturating, as torch >= 2.13), then RNE. */
NBN_FN uint8_t nbn_f32_to_e4m3(float x) { return x != x ? (uint8_t)0x7F : nbn_f32_to_e4m3_raw(nbn_clamp_abs(x, 448.0f)); }

NBN_FN float nbn_e4m3_to_f32(uint8_t b) { return nbn_fp8_to_f32(b, 3, 7, 0); }

/* E5M2: RNE; >= 2^16 -> Inf, NaN -> 0x7F. */
NBN_FN uint8_t nbn_f32_to_e5m2_raw(float f) { return nbn_f32_to_fp8_raw(f, 2, 15, 143u << 23, 1); }

/* NaN -> 0x7F, clamp to ±57344, then RNE. */
NBN_FN uint8_t nbn_f32_to_e5m2(float x) { return x != x ? (uint8_t)0x7F : nbn_f32_to_e5m2_raw(nbn_clamp_abs(x, 57344.0f)); }

NBN_FN float nbn_e5m2_to_f32(uint8_t b) { return nbn_fp8_to_f32(b, 2, 15, 1); }

/* ---- E8M0 (UE8M0) -------------------------------------------------------------------------------- */

/* c10 Float8_e8m0fnu(float): guard/round/sticky RNE on the exponent, sign ignored. */
NBN_FN uint8_t nbn_f32_to_e8m0(float x) {
    uint32_t f_bits = nbn_f2u(x);
    uint32_t exponent = (f_bits >> 23) & 0xFF;
    if (exponent == 0xFF) return 0xFF;
    uint32_t g = (f_bits & 0x400000) != 0;
    uint32_t r = (f_bits & 0x200000) != 0;
    uint32_t s = (f_bits & 0x1FFFFF) != 0;
    uint32_t lsb = exponent > 0;
    if (g && (r || s || lsb)) exponent += 1;
    return (uint8_t)exponent;
}

/* 2^(b-127) exactly (b = 0: the subnormal 2^-127); 0xFF is NaN. */
NBN_FN float nbn_e8m0_to_f32(uint8_t b) {
    if (b == 0xFF) return nbn_u2f(0x7FC00000u);
    return nbn_pow2((int)b - 127);
}

/* ---- E2M1 ---------------------------------------------------------------------------------------- */

/* ModelOpt NVFP4QTensor._cast_fp4: searchsorted over the midpoints of {0, .5, 1, 1.5, 2, 3, 4, 6},
 * ties to even, saturating, code 8 (the sign) for x < 0. A NaN compares false everywhere: code 0. */
NBN_FN uint8_t nbn_f32_to_e2m1(float x) {
    float a = fabsf(x);
    uint8_t ord = (uint8_t)((a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) +
                            (a > 5.0f));
    ord = (uint8_t)(ord + (a == 0.75f || a == 1.75f || a == 3.5f));
    return (uint8_t)(((x < 0.0f) ? 8 : 0) | ord);
}

/* The value of code c (low 4 bits): code 8 is -0.0 (nb_e2m1_to_f32). */
NBN_FN float nbn_e2m1_to_f32(uint8_t c) {
    NBN_TABLE float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7];
    return (c & 8) ? -v : v;
}

/* ModelOpt's e2m1_values, the dequantization: code 8 (-0) is +0.0, so fake quant and dequantize agree
 * bitwise (the table nb_e2m1_deq[16]). */
NBN_FN float nbn_e2m1_deq(uint8_t c) {
    NBN_TABLE float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7];
    return (c & 8) && (c & 7) ? -v : v;
}

/* ---- block formats ------------------------------------------------------------------------------ */

/* max |x| of a block of n elements (a NaN element is skipped). */
NBN_FN float nbn_block_absmax(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    return m;
}

/* ---- NVFP4 and four_over_six (nvfp4.c: ModelOpt's export arithmetic in its fp32 operation order) -- */

/* weight_scale_2 = amax / (6 * norm); 6 * norm is exact (2688 for NVFP4's 448, 1536 for 4/6's 256). */
NBN_FN float nbn_nvfp4_scale2(float amax, float norm) { return nbn_div(amax, nbn_mul(6.0f, norm)); }

/* _cast_per_block_scale_to_fp8: clamp to [2^-9, 448] so the cast neither underflows to 0 nor overflows
 * to NaN (a NaN stays NaN: both tests are false), then E4M3. nibble uses this rule in fake quant too
 * (ModelOpt's fake quant lets a block scale underflow to 0 and zeroes the block): what was trained is
 * what ships. */
NBN_FN uint8_t nbn_nvfp4_scale_to_e4m3(float v) {
    if (v < 0x1p-9f) v = 0x1p-9f;
    if (v > 448.0f) v = 448.0f;
    return nbn_f32_to_e4m3(v);
}

/* Dynamic block scale: amax_b / f32(6 * s2); an all-zero block gets 1 (scale byte 0x38). */
NBN_FN uint8_t nbn_nvfp4_block_scale_dynamic(float block_amax, float s2) {
    float d = nbn_mul(6.0f, s2);
    float pbs = nbn_div(block_amax, d);
    if (pbs == 0.0f) pbs = 1.0f;
    return nbn_nvfp4_scale_to_e4m3(pbs);
}

/* Static block scale: f32(f32(pbs * norm) / f32(G / 6)), pbs = amax_b / 6 (1 for a zero block). */
NBN_FN uint8_t nbn_nvfp4_block_scale_static(float block_amax, float global_amax, float norm) {
    float pbs = nbn_div(block_amax, 6.0f);
    if (pbs == 0.0f) pbs = 1.0f;
    float pbs_max = nbn_div(global_amax, 6.0f);
    float r = nbn_mul(pbs, norm);
    r = nbn_div(r, pbs_max);
    return nbn_nvfp4_scale_to_e4m3(r);
}

/* The effective per-element divisor p = f32(float(scale byte) * s2), as ModelOpt's quantize computes it. */
NBN_FN float nbn_nvfp4_divisor(uint8_t sb, float s2) { return nbn_mul(nbn_e4m3_to_f32(sb), s2); }

/* An element's E2M1 code with divisor p. */
NBN_FN uint8_t nbn_nvfp4_code(float x, float p) { return nbn_f32_to_e2m1(nbn_div(x, p)); }

/* Squared error of the block dequantized with divisor p (f32 difference and square, summed in double;
 * ModelOpt sums f32 in torch's reduction order, which only matters at exact-ulp ties). */
NBN_FN double nbn_nvfp4_block_sse(const float *x, float p) {
    double s = 0.0;
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        float y = nbn_mul(nbn_e2m1_deq(nbn_nvfp4_code(x[i], p)), p);
        float e = nbn_sub(x[i], y);
        s = nbn_dadd_rn(s, (double)nbn_mul(e, e));
    }
    return s;
}

/* four_over_six's per-block pick: 1 when scaling the block max to 4 (block amax times 1.5) gives a
 * smaller squared error than scaling it to 6, with the pick's own s2 = G / 1536. */
NBN_FN int nbn_nvfp4_46_pick_block(const float *x, float block_amax, float global_amax) {
    float s2 = nbn_nvfp4_scale2(global_amax, 256.0f);
    float amax4 = nbn_mul(block_amax, 1.5f);
    float p6 = nbn_nvfp4_divisor(nbn_nvfp4_block_scale_static(block_amax, global_amax, 256.0f), s2);
    float p4 = nbn_nvfp4_divisor(nbn_nvfp4_block_scale_static(amax4, global_amax, 256.0f), s2);
    return nbn_nvfp4_block_sse(x, p4) < nbn_nvfp4_block_sse(x, p6);
}

/* The scale byte of block xb: static from its calibrated amax when block_amax is set, else from the
 * data (the four_over_six pick when pick46, with global amax G, or dynamic with s2). norm: 448 NVFP4,
 * 256 four_over_six. */
NBN_FN uint8_t nbn_nvfp4_block_scale(const float *xb, const float *block_amax, float global_amax, float s2,
                                     float norm, int pick46) {
    if (block_amax) return nbn_nvfp4_block_scale_static(*block_amax, global_amax, norm);
    float m = nbn_block_absmax(xb, NB_NVFP4_BLOCK);
    if (pick46) {
        if (nbn_nvfp4_46_pick_block(xb, m, global_amax)) m = nbn_mul(m, 1.5f);
        return nbn_nvfp4_block_scale_static(m, global_amax, norm);
    }
    return nbn_nvfp4_block_scale_dynamic(m, s2);
}

/* NVFP4 by thresholds (fast_avx512.c, fast_avx2_nvfp4.c, quant_nvfp4.cu): with s2 fixed, a block's
 * divisor takes one of 126 values; scale byte sb has a usable row when its divisor p is positive and
 * at most 2^16 (no bf16 quotient then underflows, and the codes follow from magnitudes alone). */
NBN_FN int nbn_e2m1_table_ok(int sb, float p) { return sb >= 1 && sb <= 0x7E && p > 0.0f && p <= 0x1p16f; }

/* The smallest bf16 magnitude pattern whose quotient by p passes the j-th E2M1 rounding boundary (0.25,
 * 1.25, 2.5, 5 when above; 0.75, 1.75, 3.5 when at or above: the ties to even), by binary search with
 * the reference's own division; 0x7F80 when none does. An element's code is the count of boundaries
 * its magnitude reaches. */
NBN_FN uint32_t nbn_e2m1_threshold(float p, int j) {
    NBN_TABLE float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float b = bounds[j];
    uint32_t lo = 0, hi = 0x7F80;
    while (lo < hi) {
        const uint32_t mid = (lo + hi) / 2;
        const float v = nbn_div_rn(nbn_bf16_to_f32((uint16_t)mid), p);
        if ((j & 1) ? v >= b : v > b) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* ---- MXFP8 (mxfp8.c) ----------------------------------------------------------------------------- */

/* An element: x * 2^(127-code) (sf, an exact power of two), clamped to ±448, RNE to E4M3. */
NBN_FN uint8_t nbn_mxfp8_code(float x, float sf) { return nbn_f32_to_e4m3(nbn_mul(x, sf)); }

/* The E8M0 scale byte of a block from its amax by integer operations: the OCP floor rule
 * floor(log2 amax) - 8 from the exponent bits, or ModelOpt's ceil rule ceil(f32(log2(amax / 448)))
 * from tab (the first f32 pattern of each binade of the descale where the reference's exponent steps
 * up: nbq_mx_ceil_table, built from the reference's own expression; unread for the floor rule). A NaN
 * or zero amax gives 0; an infinite one -1, for the caller to decide (the CPU asks the libm reference,
 * the device writes 0xFF). */
NBN_FN int nbn_mxfp8_scale_byte_tab(float block_amax, int ocp_floor, const uint32_t *tab) {
    int e;
    if (ocp_floor) {
        if (!(block_amax > 0.0f)) return 0;
        uint32_t u = nbn_f2u(block_amax);
        if (u >= 0x7F800000u) return -1;
        e = (u >= 0x00800000u ? (int)(u >> 23) - 127 : (31 - nbn_clz32(u)) - 149) - 8;   /* floor(log2) - 8 */
        if (e < -127) e = -127;
    } else {
        float descale = nbn_div(block_amax, 448.0f);
        if (!(descale > 0.0f)) return 0;
        uint32_t u = nbn_f2u(descale);
        if (u < 0x00400000u) return 0;   /* d < 2^-127: the exponent clamps to -127 */
        if (u >= 0x7F800000u) return -1;
        int k = u >= 0x00800000u ? (int)(u >> 23) - 127 : -127;
        e = k + (u >= tab[k + 127]);
    }
    if (e > 127) e = 127;
    return e + 127;
}

/* ---- FP8 per tensor / per row (fp8.c) ------------------------------------------------------------ */

/* x / s in f32, rounded to the model dtype div_dtype (NB_BF16 / NB_F16; NB_F32 keeps it) as torch does
 * for a bf16/fp16 model and a 0-d scale. */
NBN_FN float nbn_fp8_scaled(float x, float s, int div_dtype) {
    float v = nbn_div(x, s);
    if (div_dtype == NB_BF16) v = nbn_bf16_to_f32(nbn_f32_to_bf16(v));
    else if (div_dtype == NB_F16) v = nbn_f16_to_f32(nbn_f32_to_f16(v));
    return v;
}

/* An element's E4M3 code: e4m3(x / s), saturating. */
NBN_FN uint8_t nbn_fp8_code(float x, float s, int div_dtype) { return nbn_f32_to_e4m3(nbn_fp8_scaled(x, s, div_dtype)); }

#endif

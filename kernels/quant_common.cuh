// Device copies of the scalar quantization math (core/src/dtype.c, core/src/quant/{nvfp4,mxfp8,fp8}.c,
// core/src/cpu/fast_dispatch.c): the same bit tricks and the same f32 operations, each rounded on
// its own (__fmul_rn / __fdiv_rn / __fadd_rn never contract into FMA, and nvcc keeps IEEE division
// and denormals unless told otherwise), so every kernel is bit-equal to the CPU reference.
#ifndef NIBBLE_QUANT_COMMON_CUH
#define NIBBLE_QUANT_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "nibble/dtype.h"
#include "nibble/quant.h"
#include "nibble/quant_cuda.h"
}

#define NBQ_DEV __device__ __forceinline__

// Kernel-side copy of nb_cuda_qargs plus the MXFP8 ceil table (passed by value: ~1 KiB).
struct nbq_kargs {
    float scale;
    float global_amax;
    const float *block_amax;
    const float *row_scale;
    int32_t mx_floor;
    int32_t div_dtype;
    uint32_t mx_table[255];
};

NBQ_DEV uint32_t nbq_f2u(float f) { return __float_as_uint(f); }
NBQ_DEV float nbq_u2f(uint32_t u) { return __uint_as_float(u); }

// x86 SSE NaN results, which the CPU reference produces and the tests compare bit for bit: a NaN
// operand comes back quieted with its sign and payload, an invalid operation (0*inf, 0/0) gives the
// "default NaN" 0xFFC00000. The GPU would return its canonical 0x7FFFFFFF instead.
NBQ_DEV float nbq_x86_nan(float a, float b, float r) {
    if (r == r) return r;
    if (a != a) return __uint_as_float(__float_as_uint(a) | 0x00400000u);
    if (b != b) return __uint_as_float(__float_as_uint(b) | 0x00400000u);
    return __uint_as_float(0xFFC00000u);
}
NBQ_DEV float nbq_mul(float a, float b) { return nbq_x86_nan(a, b, __fmul_rn(a, b)); }
NBQ_DEV float nbq_div(float a, float b) { return nbq_x86_nan(a, b, __fdiv_rn(a, b)); }
NBQ_DEV float nbq_sub(float a, float b) { return nbq_x86_nan(a, b, __fsub_rn(a, b)); }

// ---- dtype conversions (dtype.c) ---------------------------------------------------------------

NBQ_DEV uint16_t nbq_f32_to_bf16(float x) {
    if (x != x) return 0x7FC0;
    uint32_t u = nbq_f2u(x);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

NBQ_DEV float nbq_bf16_to_f32(uint16_t h) { return nbq_u2f((uint32_t)h << 16); }

// c10::detail::fp16_ieee_from_fp32_value, as nb_f32_to_f16.
NBQ_DEV uint16_t nbq_f32_to_f16(float f) {
    const float scale_to_inf = nbq_u2f(0x77800000u);
    const float scale_to_zero = nbq_u2f(0x08800000u);
    float base = __fmul_rn(__fmul_rn(fabsf(f), scale_to_inf), scale_to_zero);
    const uint32_t w = nbq_f2u(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = __fadd_rn(nbq_u2f((bias >> 1) + 0x07800000u), base);
    const uint32_t bits = nbq_f2u(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

NBQ_DEV float nbq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return nbq_u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = __fmul_rn((float)m, 0x1p-24f);   // ldexpf(m, -24): exact
        return sign ? -v : v;
    }
    return nbq_u2f(sign | ((e + 112) << 23) | (m << 13));
}

// c10::detail::fp8e4m3fn_from_fp32_value (nb_f32_to_e4m3_raw).
NBQ_DEV uint8_t nbq_f32_to_e4m3_raw(float f) {
    const uint32_t fp8_max = 1087u << 20;
    const uint32_t denorm_mask = 141u << 23;
    uint32_t f_bits = nbq_f2u(f);
    uint8_t result;
    const uint32_t sign = f_bits & 0x80000000u;
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = 0x7F;
    } else if (f_bits < (121u << 23)) {
        f_bits = nbq_f2u(__fadd_rn(nbq_u2f(f_bits), nbq_u2f(denorm_mask)));
        result = (uint8_t)(f_bits - denorm_mask);
    } else {
        uint32_t mant_odd = (f_bits >> 20) & 1;
        f_bits += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu;
        f_bits += mant_odd;
        result = (uint8_t)(f_bits >> 20);
    }
    return (uint8_t)(result | (sign >> 24));
}

// nb_f32_to_e4m3: NaN -> 0x7F, clamp to ±448, then RNE.
NBQ_DEV uint8_t nbq_f32_to_e4m3(float x) {
    if (x != x) return 0x7F;
    if (x > 448.0f) x = 448.0f;
    if (x < -448.0f) x = -448.0f;
    return nbq_f32_to_e4m3_raw(x);
}

// nbq_f32_to_e4m3 for a value that is not NaN, without branches (both of the raw conversion's
// roundings, then a select): the hot loops' form.
NBQ_DEV uint32_t nbq_e4m3_nonnan(float x) {
    const uint32_t b = nbq_f2u(x), sign = (b >> 24) & 0x80u;
    const uint32_t a = min(b & 0x7FFFFFFFu, 0x43E00000u);   // clamp to 448 (Inf included)
    const uint32_t nrm = (a + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    const uint32_t den = nbq_f2u(__fadd_rn(nbq_u2f(a), nbq_u2f(141u << 23))) - (141u << 23);
    return ((a < (121u << 23) ? den : nrm) & 0xFFu) | sign;
}

// The E4M3 codes of a (low byte) and b (high byte), neither NaN: on sm_89+ one conversion instruction
// (cvt.rn.satfinite.e4m3x2.f32: nearest even, magnitudes past 448 and Inf saturate to 448, exactly
// nbq_f32_to_e4m3 for every non-NaN input), elsewhere nbq_e4m3_nonnan twice.
NBQ_DEV uint32_t nbq_e4m3x2_nonnan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(b), "f"(a));
    return d;
#else
    return nbq_e4m3_nonnan(a) | (nbq_e4m3_nonnan(b) << 8);
#endif
}

// nb_e4m3_to_f32 (every value is exact in f32; NaN as the C library's NAN / -NAN).
NBQ_DEV float nbq_e4m3_to_f32(uint8_t b) {
    uint32_t e = (b >> 3) & 0xF, m = b & 7;
    uint32_t sign = (uint32_t)(b & 0x80) << 24;
    if (e == 15 && m == 7) return nbq_u2f(sign | 0x7FC00000u);
    if (e == 0) return nbq_u2f(sign | nbq_f2u(__fmul_rn((float)m, 0x1p-9f)));
    return nbq_u2f(sign | ((e + 120) << 23) | (m << 20));
}

// nb_f32_to_e2m1 (ModelOpt _cast_fp4: thresholds with ties to even, saturating, code 8 for x < 0).
NBQ_DEV uint8_t nbq_f32_to_e2m1(float x) {
    float a = fabsf(x);
    uint8_t ord = (uint8_t)((a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f));
    ord = (uint8_t)(ord + (a == 0.75f || a == 1.75f || a == 3.5f));
    return (uint8_t)(((x < 0.0f) ? 8 : 0) | ord);
}

// nb_e2m1_deq: code 8 (-0) dequantizes to +0.0.
NBQ_DEV float nbq_e2m1_deq(uint8_t c) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7];
    return (c & 8) && (c & 7) ? -v : v;
}

// ---- element loads / stores --------------------------------------------------------------------

NBQ_DEV float nbq_load(const void *x, int dt, int64_t i) {
    if (dt == NB_F32) return ((const float *)x)[i];
    if (dt == NB_BF16) return nbq_bf16_to_f32(((const uint16_t *)x)[i]);
    return nbq_f16_to_f32(((const uint16_t *)x)[i]);
}

NBQ_DEV void nbq_store(void *y, int dt, int64_t i, float v) {
    if (dt == NB_F32) ((float *)y)[i] = v;
    else if (dt == NB_BF16) ((uint16_t *)y)[i] = nbq_f32_to_bf16(v);
    else ((uint16_t *)y)[i] = nbq_f32_to_f16(v);
}

// Eight consecutive elements from element i (i a multiple of 8, x 16-byte aligned for 16-bit
// dtypes and 32-byte aligned for F32): one or two 16-byte loads instead of eight scalar ones. The
// template form keeps a kernel compiled for one input dtype free of the others' conversions.
template <int XDT> NBQ_DEV void nbq_load8_t(const void *x, int64_t i, float v[8]) {
    if (XDT == NB_F32) {
        const float4 a = ((const float4 *)x)[i / 4], b = ((const float4 *)x)[i / 4 + 1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        return;
    }
    const uint4 u = ((const uint4 *)x)[i / 8];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint16_t lo = (uint16_t)(w[k] & 0xFFFFu), hi = (uint16_t)(w[k] >> 16);
        v[2 * k] = XDT == NB_BF16 ? nbq_bf16_to_f32(lo) : nbq_f16_to_f32(lo);
        v[2 * k + 1] = XDT == NB_BF16 ? nbq_bf16_to_f32(hi) : nbq_f16_to_f32(hi);
    }
}

NBQ_DEV void nbq_load8(const void *x, int dt, int64_t i, float v[8]) {
    if (dt == NB_F32) nbq_load8_t<NB_F32>(x, i, v);
    else if (dt == NB_BF16) nbq_load8_t<NB_BF16>(x, i, v);
    else nbq_load8_t<NB_F16>(x, i, v);
}

// Work items (groups of 8 or 16 elements) per thread in the vector quantize kernels, their loads
// issued together: one 16-byte load per thread at a time leaves an H200 latency-bound at about half of
// a device copy's bandwidth.
enum { NBQ_UNROLL = 2 };

// The vector quantize kernels' loads: this thread's NBQ_UNROLL groups of eight from span start base
// (group base + k * blockDim.x + threadIdx.x, as far as total), all issued before any is used.
template <int XDT> NBQ_DEV void nbq_load_groups(const void *x, int64_t base, int64_t total, float v[NBQ_UNROLL][8]) {
#pragma unroll
    for (int k = 0; k < NBQ_UNROLL; k++) {
        const int64_t g = base + k * (int64_t)blockDim.x + threadIdx.x;
        if (g < total) nbq_load8_t<XDT>(x, g * 8, v[k]);
    }
}

// Whether the vector kernels may run: every element count a multiple of 8 per row, and the
// pointers aligned for nbq_load8 and the 8-byte stores (cudaMalloc gives 256 bytes).
static inline bool nbq_vec_ok(const void *x, int xdt, const void *q, int64_t n) {
    const uintptr_t ax = xdt == NB_F32 ? 32 : 16;
    return n % 8 == 0 && (uintptr_t)x % ax == 0 && (uintptr_t)q % 8 == 0;
}

// ---- NVFP4 (nvfp4.c) ---------------------------------------------------------------------------

NBQ_DEV float nbq_nvfp4_scale2(float amax, float norm) { return nbq_div(amax, nbq_mul(6.0f, norm)); }

NBQ_DEV uint8_t nbq_scale_to_e4m3(float v) {
    if (v < 0x1p-9f) v = 0x1p-9f;
    if (v > 448.0f) v = 448.0f;
    return nbq_f32_to_e4m3(v);
}

NBQ_DEV uint8_t nbq_block_scale_dynamic(float block_amax, float s2) {
    float d = nbq_mul(6.0f, s2);
    float pbs = nbq_div(block_amax, d);
    if (pbs == 0.0f) pbs = 1.0f;
    return nbq_scale_to_e4m3(pbs);
}

NBQ_DEV uint8_t nbq_block_scale_static(float block_amax, float global_amax, float norm) {
    float pbs = nbq_div(block_amax, 6.0f);
    if (pbs == 0.0f) pbs = 1.0f;
    float pbs_max = nbq_div(global_amax, 6.0f);
    float r = nbq_mul(pbs, norm);
    r = nbq_div(r, pbs_max);
    return nbq_scale_to_e4m3(r);
}

NBQ_DEV float nbq_block_divisor(uint8_t sb, float s2) { return nbq_mul(nbq_e4m3_to_f32(sb), s2); }

NBQ_DEV double nbq_block_sse(const float *x, float p) {
    double s = 0.0;
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        uint8_t c = nbq_f32_to_e2m1(nbq_div(x[i], p));
        float y = nbq_mul(nbq_e2m1_deq(c), p);
        float e = nbq_sub(x[i], y);
        float e2 = nbq_mul(e, e);
        s = __dadd_rn(s, (double)e2);
    }
    return s;
}

NBQ_DEV int nbq_46_pick_block(const float *x, float block_amax, float global_amax) {
    float s2 = nbq_nvfp4_scale2(global_amax, 256.0f);
    float amax4 = nbq_mul(block_amax, 1.5f);
    float p6 = nbq_block_divisor(nbq_block_scale_static(block_amax, global_amax, 256.0f), s2);
    float p4 = nbq_block_divisor(nbq_block_scale_static(amax4, global_amax, 256.0f), s2);
    return nbq_block_sse(x, p4) < nbq_block_sse(x, p6);
}

// The scale byte of block b of row r (mode: 0 dynamic, 1 static, 2 four_over_six pick).
NBQ_DEV uint8_t nbq_nvfp4_block_scale(const float *xb, const nbq_kargs &a, int64_t r, int64_t b, int64_t nblk, float norm,
                                      int pick46) {
    if (a.block_amax) return nbq_block_scale_static(a.block_amax[r * nblk + b], a.global_amax, norm);
    float m = 0.0f;
    for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
        float v = fabsf(xb[i]);
        if (v > m) m = v;
    }
    if (pick46) {
        if (nbq_46_pick_block(xb, m, a.global_amax)) m = nbq_mul(m, 1.5f);
        return nbq_block_scale_static(m, a.global_amax, norm);
    }
    return nbq_block_scale_dynamic(m, a.scale);
}

// ---- MXFP8 (fast_dispatch.c nbq_mx_scale_byte_fast, held to nb_mxfp8_scale_byte by the CPU tests) ---

NBQ_DEV uint8_t nbq_mx_scale_byte(float block_amax, const nbq_kargs &a) {
    int e;
    if (a.mx_floor) {
        if (!(block_amax > 0.0f)) return 0;
        uint32_t u = nbq_f2u(block_amax);
        if (u >= 0x7F800000u) return 0xFF;   // non-finite input: not supported on the device
        e = (u >= 0x00800000u ? (int)(u >> 23) - 127 : (31 - __clz((int)u)) - 149) - 8;
        if (e < -127) e = -127;
    } else {
        float descale = nbq_div(block_amax, 448.0f);
        if (!(descale > 0.0f)) return 0;
        uint32_t u = nbq_f2u(descale);
        if (u < 0x00400000u) return 0;
        if (u >= 0x7F800000u) return 0xFF;
        int k = u >= 0x00800000u ? (int)(u >> 23) - 127 : -127;
        e = k + (u >= a.mx_table[k + 127]);
    }
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

// ldexpf(1, e) for e in [-127, 128] (2^-127 subnormal, 2^128 inf).
NBQ_DEV float nbq_pow2(int e) {
    if (e > 127) return nbq_u2f(0x7F800000u);
    if (e >= -126) return nbq_u2f((uint32_t)(e + 127) << 23);
    return nbq_u2f(e == -127 ? 0x00400000u : 0u);
}

// ---- FP8 (fp8.c) ---------------------------------------------------------------------------------

NBQ_DEV float nbq_fp8_scaled(float x, float s, int div_dtype) {
    float v = nbq_div(x, s);
    if (div_dtype == NB_BF16) v = nbq_bf16_to_f32(nbq_f32_to_bf16(v));
    else if (div_dtype == NB_F16) v = nbq_f16_to_f32(nbq_f32_to_f16(v));
    return v;
}

// nbq_f32_to_e4m3(nbq_fp8_scaled(x, s, DD)) without the division, given r = nbq_fp8_recip(s). q0 =
// RN(x * r) is within 3 ulp of RN(x / s) (r is within half an ulp of 1/s), and both round alike to
// the next step's precision unless q0's bits below it lie within 4 ulp of a tie: the 20 bits E4M3
// drops (F32 division, in E4M3's normal range) or the 16 bits bf16 drops (BF16 division; the E4M3 code
// of that bf16 value is then the reference's own step). Near a tie, E4M3-subnormal F32 quotients,
// NaN, Inf, a scale without a normal reciprocal (r is NaN) and F16 divisions take the division.

// The division, out of line so the kernels' hot loop stays small (a handful of elements per million).
__device__ __noinline__ uint8_t nbq_fp8_code_slow(float x, float s, int div_dtype);

// q0 = RN(x * r) as the value the E4M3 step sees, when it is the reference's (see above); else NaN.
template <int DD> NBQ_DEV float nbq_fp8_fast_value(float x, float r) {
    const float q0 = __fmul_rn(x, r);
    const uint32_t b = nbq_f2u(q0), u = b & 0x7FFFFFFFu;
    if (DD == NB_BF16) {   // finite and clear of a bf16 tie: RNE to bf16 by the bits
        if (((u & 0xFFFFu) - 0x8000u + 4u) > 8u && u < 0x7F800000u)
            return nbq_u2f((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
    } else if (DD == NB_F32) {   // in E4M3's normal range (or zero) and clear of an E4M3 tie
        if ((((u & 0xFFFFFu) - 0x80000u + 4u) > 8u && u >= 0x3C800000u && u < 0x7F800000u) || u == 0) return q0;
    }
    return nbq_u2f(0x7FC00000u);
}

// The codes of x0 (low byte) and x1 (high byte): one conversion for the pair when both take the
// multiply, else each its own way.
template <int DD> NBQ_DEV uint32_t nbq_fp8_code2(float x0, float x1, float s, float r) {
    const float v0 = nbq_fp8_fast_value<DD>(x0, r), v1 = nbq_fp8_fast_value<DD>(x1, r);
    if (v0 == v0 && v1 == v1) return nbq_e4m3x2_nonnan(v0, v1);
    const uint32_t c0 = v0 == v0 ? nbq_e4m3_nonnan(v0) : nbq_fp8_code_slow(x0, s, DD);
    const uint32_t c1 = v1 == v1 ? nbq_e4m3_nonnan(v1) : nbq_fp8_code_slow(x1, s, DD);
    return c0 | (c1 << 8);
}

template <int DD> NBQ_DEV uint8_t nbq_fp8_code(float x, float s, float r) {
    const float v = nbq_fp8_fast_value<DD>(x, r);
    return v == v ? (uint8_t)nbq_e4m3_nonnan(v) : nbq_fp8_code_slow(x, s, DD);
}

// The r of nbq_fp8_code, given r = RN(1/s) (__frcp_rn on the device, IEEE 1.0f / s on the host): r
// where s and r are normal floats, else NaN (every element then takes the division).
__host__ __device__ __forceinline__ float nbq_fp8_recip_ok(float s, float r) {
    const float as = fabsf(s), ar = fabsf(r);
    return (as >= 0x1p-126f && as <= 0x1.fffffep127f && ar >= 0x1p-126f && ar <= 0x1.fffffep127f) ? r : nanf("");
}
NBQ_DEV float nbq_fp8_recip(float s) { return nbq_fp8_recip_ok(s, __frcp_rn(s)); }

// ---- launchers (one per format file); op: 0 quantize, 1 dequantize, 2 fake quant --------------------

enum { NBQ_OP_QUANTIZE = 0, NBQ_OP_DEQUANTIZE = 1, NBQ_OP_FAKE = 2 };

struct nbq_launch {
    int op;
    const void *x;      // quantize / fake input
    int xdt;
    const uint8_t *qin; // dequantize input
    const uint8_t *sin;
    uint8_t *q;         // quantize output
    uint8_t *s;
    void *y;            // dequantize / fake output
    int ydt;
    int64_t rows, n;
    cudaStream_t stream;
};

// Grid for `total` one-thread work items (grid-stride loops cover any excess).
static inline unsigned nbq_grid(int64_t total, int threads) {
    int64_t g = (total + threads - 1) / threads;
    if (g < 1) g = 1;
    if (g > (1 << 30)) g = 1 << 30;
    return (unsigned)g;
}

cudaError_t nbq_launch_nvfp4(const nbq_launch &l, const nbq_kargs &a, float norm, int pick46);
cudaError_t nbq_launch_mxfp8(const nbq_launch &l, const nbq_kargs &a);
cudaError_t nbq_launch_fp8(const nbq_launch &l, const nbq_kargs &a);

#endif

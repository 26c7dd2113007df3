// Device-only pieces of the quantize kernels: the kernel arguments, element loads and stores, the
// vector-load helpers, the branchless / packed E4M3 conversions of the hot loops, the kernels' block
// adaptors and the launchers. The arithmetic itself is core/src/quant/numerics.h, the source the CPU
// references are built from (there __host__ __device__; its nbn_* operators are the __f*_rn
// intrinsics, each rounded on its own, never contracted into FMA, with x86's NaN results), so every
// kernel is bit-equal to the CPU reference.
#ifndef NIBBLE_QUANT_COMMON_CUH
#define NIBBLE_QUANT_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "quant/numerics.h"
extern "C" {
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

// nbn_f32_to_e4m3 for a value that is not NaN, without branches (both of the raw conversion's
// roundings, then a select): the hot loops' form.
NBQ_DEV uint32_t nbq_e4m3_nonnan(float x) {
    const uint32_t b = nbn_f2u(x), sign = (b >> 24) & 0x80u;
    const uint32_t a = min(b & 0x7FFFFFFFu, 0x43E00000u);   // clamp to 448 (Inf included)
    const uint32_t nrm = (a + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    const uint32_t den = nbn_f2u(__fadd_rn(nbn_u2f(a), nbn_u2f(141u << 23))) - (141u << 23);
    return ((a < (121u << 23) ? den : nrm) & 0xFFu) | sign;
}

// The E4M3 codes of a (low byte) and b (high byte), neither NaN: on sm_89+ one conversion instruction
// (cvt.rn.satfinite.e4m3x2.f32: nearest even, magnitudes past 448 and Inf saturate to 448, exactly
// nbn_f32_to_e4m3 for every non-NaN input), elsewhere nbq_e4m3_nonnan twice.
NBQ_DEV uint32_t nbq_e4m3x2_nonnan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(b), "f"(a));
    return d;
#else
    return nbq_e4m3_nonnan(a) | (nbq_e4m3_nonnan(b) << 8);
#endif
}

// ---- element loads / stores --------------------------------------------------------------------

NBQ_DEV float nbq_load(const void *x, int dt, int64_t i) {
    if (dt == NB_F32) return ((const float *)x)[i];
    if (dt == NB_BF16) return nbn_bf16_to_f32(((const uint16_t *)x)[i]);
    return nbn_f16_to_f32(((const uint16_t *)x)[i]);
}

NBQ_DEV void nbq_store(void *y, int dt, int64_t i, float v) {
    if (dt == NB_F32) ((float *)y)[i] = v;
    else if (dt == NB_BF16) ((uint16_t *)y)[i] = nbn_f32_to_bf16(v);
    else ((uint16_t *)y)[i] = nbn_f32_to_f16(v);
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
        v[2 * k] = XDT == NB_BF16 ? nbn_bf16_to_f32(lo) : nbn_f16_to_f32(lo);
        v[2 * k + 1] = XDT == NB_BF16 ? nbn_bf16_to_f32(hi) : nbn_f16_to_f32(hi);
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

// ---- NVFP4 (nbn_nvfp4_block_scale) ------------------------------------------------------------

// The scale byte of block b of row r (block_amax indexed [r * nblk + b] when calibrated).
NBQ_DEV uint8_t nbq_nvfp4_block_scale(const float *xb, const nbq_kargs &a, int64_t r, int64_t b, int64_t nblk, float norm,
                                      int pick46) {
    return nbn_nvfp4_block_scale(xb, a.block_amax ? a.block_amax + r * nblk + b : nullptr, a.global_amax, a.scale, norm,
                                 pick46);
}

// ---- MXFP8 (nbn_mxfp8_scale_byte_tab, held to nb_mxfp8_scale_byte by the CPU tests) ---------------

// A non-finite amax, which the CPU hands to the libm reference, is not supported on the device: 0xFF.
NBQ_DEV uint8_t nbq_mx_scale_byte(float block_amax, const nbq_kargs &a) {
    const int c = nbn_mxfp8_scale_byte_tab(block_amax, a.mx_floor, a.mx_table);
    return c >= 0 ? (uint8_t)c : (uint8_t)0xFF;
}

// ---- FP8 (nbn_fp8_code) --------------------------------------------------------------------------

// nbn_fp8_code(x, s, DD) without the division, given r = nbq_fp8_recip(s). q0 =
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
    const uint32_t b = nbn_f2u(q0), u = b & 0x7FFFFFFFu;
    if (DD == NB_BF16) {   // finite and clear of a bf16 tie: RNE to bf16 by the bits
        if (((u & 0xFFFFu) - 0x8000u + 4u) > 8u && u < 0x7F800000u)
            return nbn_u2f((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
    } else if (DD == NB_F32) {   // in E4M3's normal range (or zero) and clear of an E4M3 tie
        if ((((u & 0xFFFFFu) - 0x80000u + 4u) > 8u && u >= 0x3C800000u && u < 0x7F800000u) || u == 0) return q0;
    }
    return nbn_u2f(0x7FC00000u);
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

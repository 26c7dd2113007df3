// MXFP8 kernels: one thread per 32-element block; E8M0 scale by ModelOpt's ceil rule (table-driven,
// exact) or the OCP floor rule, elements scaled by an exact power of two, clamped, RNE to E4M3
// (core/src/quant/mxfp8.c).
#include "quant_common.cuh"

__global__ void nbq_mxfp8_quant_kernel(const void *x, int xdt, int64_t rows, int64_t n, nbq_kargs a, uint8_t *q,
                                       uint8_t *s, void *y, int ydt) {
    const int64_t nblk = n / NB_MXFP8_BLOCK, total = rows * nblk;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = g * NB_MXFP8_BLOCK;   // rows are contiguous: block g starts at g*32
        float xb[NB_MXFP8_BLOCK];
        float m = 0.0f;
        for (int i = 0; i < NB_MXFP8_BLOCK; i++) {
            xb[i] = nbq_load(x, xdt, base + i);
            float v = fabsf(xb[i]);
            if (v > m) m = v;
        }
        const uint8_t code = nbq_mx_scale_byte(m, a);
        const float sf = nbn_pow2(127 - (int)code), d = nbn_pow2((int)code - 127);
        if (!y) s[g] = code;
        for (int i = 0; i < NB_MXFP8_BLOCK; i++) {
            const uint8_t e = nbn_mxfp8_code(xb[i], sf);
            if (y) nbq_store(y, ydt, base + i, nbn_mul(nbn_e4m3_to_f32(e), d));
            else q[base + i] = e;
        }
    }
}

__global__ void nbq_mxfp8_dequant_kernel(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t n, void *y, int ydt) {
    const int64_t nblk = n / NB_MXFP8_BLOCK, total = rows * nblk;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const float d = nbn_pow2((int)s[g] - 127);
        const int64_t base = g * NB_MXFP8_BLOCK;
        for (int i = 0; i < NB_MXFP8_BLOCK; i++) nbq_store(y, ydt, base + i, nbn_mul(nbn_e4m3_to_f32(q[base + i]), d));
    }
}

// Quantize with four threads per 32-element block, eight elements each, NBQ_UNROLL such groups per
// thread with their loads issued together: vector loads, the block max by two warp shuffles, one
// 8-byte store per group and the scale byte from the first of the four (needs nbq_vec_ok). Every
// thread of a warp runs the same iterations (the shuffles need them all; rows * n / 8 is a multiple
// of 4 and so is the block size, so a block's four threads are active together).
template <int XDT>
__global__ void nbq_mxfp8_quant8_kernel(const void *x, int64_t rows, int64_t n, nbq_kargs a, uint8_t *q,
                                        uint8_t *s) {
    const int64_t total = rows * (n / 8), span = (int64_t)blockDim.x * NBQ_UNROLL;
    for (int64_t base = blockIdx.x * span; base < total; base += (int64_t)gridDim.x * span) {
        float v[NBQ_UNROLL][8];
        nbq_load_groups<XDT>(x, base, total, v);
#pragma unroll
        for (int k = 0; k < NBQ_UNROLL; k++) {
            const int64_t g = base + k * (int64_t)blockDim.x + threadIdx.x;
            const bool on = g < total;
            float m = 0.0f;
            if (on)
                for (int i = 0; i < 8; i++) {
                    const float t = fabsf(v[k][i]);
                    if (t > m) m = t;
                }
            for (int off = 1; off < 4; off <<= 1) {
                const float o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
                if (o > m) m = o;
            }
            if (!on) continue;
            const uint8_t code = nbq_mx_scale_byte(m, a);
            const float sf = nbn_pow2(127 - (int)code);
            if ((g & 3) == 0) s[g / 4] = code;
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < 8; i += 2) {   // x * 2^-e as the reference (its NaN payload aside: NaN codes 0x7F)
                const float t0 = __fmul_rn(v[k][i], sf), t1 = __fmul_rn(v[k][i + 1], sf);
                uint32_t c = nbq_e4m3x2_nonnan(t0 == t0 ? t0 : 0.0f, t1 == t1 ? t1 : 0.0f);
                if (t0 != t0) c = (c & 0xFF00u) | 0x7Fu;
                if (t1 != t1) c = (c & 0x00FFu) | 0x7F00u;
                w[i / 4] |= c << (8 * (i % 4));
            }
            ((uint2 *)q)[g] = make_uint2(w[0], w[1]);
        }
    }
}

cudaError_t nbq_launch_mxfp8(const nbq_launch &l, const nbq_kargs &a) {
    const int threads = 128;
    if (l.op == NBQ_OP_QUANTIZE && nbq_vec_ok(l.x, l.xdt, l.q, l.n)) {
        const unsigned grid = nbq_grid(l.rows * (l.n / 8), threads * NBQ_UNROLL);
        if (l.xdt == NB_BF16) nbq_mxfp8_quant8_kernel<NB_BF16><<<grid, threads, 0, l.stream>>>(l.x, l.rows, l.n, a, l.q, l.s);
        else if (l.xdt == NB_F16) nbq_mxfp8_quant8_kernel<NB_F16><<<grid, threads, 0, l.stream>>>(l.x, l.rows, l.n, a, l.q, l.s);
        else nbq_mxfp8_quant8_kernel<NB_F32><<<grid, threads, 0, l.stream>>>(l.x, l.rows, l.n, a, l.q, l.s);
        return cudaGetLastError();
    }
    const unsigned grid = nbq_grid(l.rows * (l.n / NB_MXFP8_BLOCK), threads);
    if (l.op == NBQ_OP_DEQUANTIZE)
        nbq_mxfp8_dequant_kernel<<<grid, threads, 0, l.stream>>>(l.qin, l.sin, l.rows, l.n, l.y, l.ydt);
    else
        nbq_mxfp8_quant_kernel<<<grid, threads, 0, l.stream>>>(l.x, l.xdt, l.rows, l.n, a, l.q, l.s,
                                                               l.op == NBQ_OP_FAKE ? l.y : nullptr, l.ydt);
    return cudaGetLastError();
}

// NVFP4 and four_over_six kernels: one thread per 16-element block, the exact arithmetic of the
// scalar reference rows (core/src/quant/nvfp4.c) through the device copies in quant_common.cuh.
#include "quant_common.cuh"

__global__ void nbq_nvfp4_quant_kernel(const void *x, int xdt, int64_t rows, int64_t n, nbq_kargs a, float norm,
                                       int pick46, uint8_t *q, uint8_t *s, void *y, int ydt) {
    const int64_t nblk = n / NB_NVFP4_BLOCK, total = rows * nblk;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = g / nblk, b = g % nblk, base = r * n + b * NB_NVFP4_BLOCK;
        float xb[NB_NVFP4_BLOCK];
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) xb[i] = nbq_load(x, xdt, base + i);
        const uint8_t sb = nbq_nvfp4_block_scale(xb, a, r, b, nblk, norm, pick46);
        const float p = nbq_block_divisor(sb, a.scale);
        uint8_t c[NB_NVFP4_BLOCK];
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) c[i] = nbq_f32_to_e2m1(nbq_div(xb[i], p));
        if (y) {
            for (int i = 0; i < NB_NVFP4_BLOCK; i++) nbq_store(y, ydt, base + i, nbq_mul(nbq_e2m1_deq(c[i]), p));
        } else {
            s[g] = sb;
            for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) q[g * 8 + j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
        }
    }
}

__global__ void nbq_nvfp4_dequant_kernel(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t n, float s2, void *y,
                                         int ydt) {
    const int64_t nblk = n / NB_NVFP4_BLOCK, total = rows * nblk;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const float p = nbq_block_divisor(s[g], s2);
        const int64_t base = g * NB_NVFP4_BLOCK;
        for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) {
            const uint8_t byte = q[g * 8 + j];
            nbq_store(y, ydt, base + 2 * j, nbq_mul(nbq_e2m1_deq(byte & 0xF), p));
            nbq_store(y, ydt, base + 2 * j + 1, nbq_mul(nbq_e2m1_deq(byte >> 4), p));
        }
    }
}

// Quantize, one 16-element block per thread as above, with two vector loads and one 8-byte store
// (needs nbq_vec_ok); the scale byte is the same nbq_nvfp4_block_scale. (Two threads per block with a
// shuffle for the max ran no faster on an H200: the per-element arithmetic, not the loads, sets the
// pace.)
__global__ void nbq_nvfp4_quant16_kernel(const void *x, int xdt, int64_t rows, int64_t n, nbq_kargs a, float norm,
                                         int pick46, uint8_t *q, uint8_t *s) {
    const int64_t nblk = n / NB_NVFP4_BLOCK, total = rows * nblk;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        float xb[NB_NVFP4_BLOCK];
        nbq_load8(x, xdt, g * NB_NVFP4_BLOCK, xb);
        nbq_load8(x, xdt, g * NB_NVFP4_BLOCK + 8, xb + 8);
        const uint8_t sb = nbq_nvfp4_block_scale(xb, a, 0, g, nblk, norm, pick46);   // block_amax[g]: rows are contiguous
        const float p = nbq_block_divisor(sb, a.scale);
        uint32_t w[2] = {0, 0};
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) w[i / 8] |= (uint32_t)nbq_f32_to_e2m1(nbq_div(xb[i], p)) << (4 * (i % 8));
        s[g] = sb;
        ((uint2 *)q)[g] = make_uint2(w[0], w[1]);
    }
}

cudaError_t nbq_launch_nvfp4(const nbq_launch &l, const nbq_kargs &a, float norm, int pick46) {
    const int threads = 128;
    if (l.op == NBQ_OP_QUANTIZE && nbq_vec_ok(l.x, l.xdt, l.q, l.n)) {
        nbq_nvfp4_quant16_kernel<<<nbq_grid(l.rows * (l.n / NB_NVFP4_BLOCK), threads), threads, 0, l.stream>>>(
            l.x, l.xdt, l.rows, l.n, a, norm, pick46, l.q, l.s);
        return cudaGetLastError();
    }
    const unsigned grid = nbq_grid(l.rows * (l.n / NB_NVFP4_BLOCK), threads);
    if (l.op == NBQ_OP_DEQUANTIZE)
        nbq_nvfp4_dequant_kernel<<<grid, threads, 0, l.stream>>>(l.qin, l.sin, l.rows, l.n, a.scale, l.y, l.ydt);
    else
        nbq_nvfp4_quant_kernel<<<grid, threads, 0, l.stream>>>(l.x, l.xdt, l.rows, l.n, a, norm, pick46, l.q, l.s,
                                                               l.op == NBQ_OP_FAKE ? l.y : nullptr, l.ydt);
    return cudaGetLastError();
}

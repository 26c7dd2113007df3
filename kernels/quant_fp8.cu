// FP8 E4M3 per-tensor / per-row kernels: one thread per element, q = e4m3(w / s) with ModelOpt's
// optional rounding of the quotient to the model dtype, dequant e4m3 * s (core/src/quant/fp8.c).
#include "quant_common.cuh"

__global__ void nbq_fp8_kernel(int op, const void *x, int xdt, const uint8_t *qin, int64_t rows, int64_t n, float scale,
                               const float *row_scale, int div_dtype, uint8_t *q, void *y, int ydt) {
    const int64_t total = rows * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const float sc = row_scale ? row_scale[i / n] : scale;
        if (op == NBQ_OP_DEQUANTIZE) {
            nbq_store(y, ydt, i, nbq_mul(nbq_e4m3_to_f32(qin[i]), sc));
            continue;
        }
        const uint8_t e = nbq_f32_to_e4m3(nbq_fp8_scaled(nbq_load(x, xdt, i), sc, div_dtype));
        if (op == NBQ_OP_FAKE) nbq_store(y, ydt, i, nbq_mul(nbq_e4m3_to_f32(e), sc));
        else q[i] = e;
    }
}

// Quantize, eight consecutive elements of one row per thread: vector loads, one 8-byte store, the
// row's scale looked up once per eight (needs n % 8 == 0 and aligned pointers: nbq_vec_ok).
__global__ void nbq_fp8_quant8_kernel(const void *x, int xdt, int64_t rows, int64_t n, float scale,
                                      const float *row_scale, int div_dtype, uint8_t *q) {
    const int64_t per_row = n / 8, total = rows * per_row;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const float sc = row_scale ? row_scale[g / per_row] : scale;
        float v[8];
        nbq_load8(x, xdt, g * 8, v);
        uint32_t w[2] = {0, 0};
        for (int k = 0; k < 8; k++) w[k / 4] |= (uint32_t)nbq_f32_to_e4m3(nbq_fp8_scaled(v[k], sc, div_dtype)) << (8 * (k % 4));
        ((uint2 *)q)[g] = make_uint2(w[0], w[1]);
    }
}

cudaError_t nbq_launch_fp8(const nbq_launch &l, const nbq_kargs &a) {
    const int threads = 256;
    if (l.op == NBQ_OP_QUANTIZE && nbq_vec_ok(l.x, l.xdt, l.q, l.n)) {
        nbq_fp8_quant8_kernel<<<nbq_grid(l.rows * (l.n / 8), threads), threads, 0, l.stream>>>(
            l.x, l.xdt, l.rows, l.n, a.scale, a.row_scale, a.div_dtype, l.q);
        return cudaGetLastError();
    }
    const unsigned grid = nbq_grid(l.rows * l.n, threads);
    nbq_fp8_kernel<<<grid, threads, 0, l.stream>>>(l.op, l.x, l.xdt, l.qin, l.rows, l.n, a.scale, a.row_scale, a.div_dtype,
                                                    l.q, l.y, l.ydt);
    return cudaGetLastError();
}

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

cudaError_t nbq_launch_fp8(const nbq_launch &l, const nbq_kargs &a) {
    const int threads = 256;
    const unsigned grid = nbq_grid(l.rows * l.n, threads);
    nbq_fp8_kernel<<<grid, threads, 0, l.stream>>>(l.op, l.x, l.xdt, l.qin, l.rows, l.n, a.scale, a.row_scale, a.div_dtype,
                                                    l.q, l.y, l.ydt);
    return cudaGetLastError();
}

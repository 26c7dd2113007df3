// FP8 E4M3 per-tensor / per-row kernels: q = e4m3(w / s) with ModelOpt's optional rounding of the
// quotient to the model dtype, dequant e4m3 * s (core/src/quant/fp8.c). The codes come from
// nbq_fp8_code (a multiply by 1/s, the division only next to a rounding tie), one kernel per division
// dtype; r is the host's RN(1/s) for a per-tensor scale, or per row.
#include "quant_common.cuh"

__device__ __noinline__ uint8_t nbq_fp8_code_slow(float x, float s, int div_dtype) {
    return nbn_fp8_code(x, s, div_dtype);
}

template <int DD>
__global__ void nbq_fp8_kernel(int op, const void *x, int xdt, const uint8_t *qin, int64_t rows, int64_t n, float scale,
                               float recip, const float *row_scale, uint8_t *q, void *y, int ydt) {
    const int64_t total = rows * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const float sc = row_scale ? row_scale[i / n] : scale;
        if (op == NBQ_OP_DEQUANTIZE) {
            nbq_store(y, ydt, i, nbn_mul(nbn_e4m3_to_f32(qin[i]), sc));
            continue;
        }
        const float r = row_scale ? nbq_fp8_recip(sc) : recip;
        const uint8_t e = nbq_fp8_code<DD>(nbq_load(x, xdt, i), sc, r);
        if (op == NBQ_OP_FAKE) nbq_store(y, ydt, i, nbn_mul(nbn_e4m3_to_f32(e), sc));
        else q[i] = e;
    }
}

// Quantize, NBQ_UNROLL groups of eight consecutive elements of one row per thread: vector loads (all
// of a thread's issued before its first conversion, so enough bytes are in flight to cover the memory
// latency), one 8-byte store per group, the row's scale looked up once per eight (needs n % 8 == 0 and
// aligned pointers: nbq_vec_ok). A warp's k-th groups are contiguous.
template <int XDT, int DD>
__global__ void nbq_fp8_quant8_kernel(const void *x, int64_t rows, int64_t n, float scale, float recip,
                                      const float *row_scale, uint8_t *q) {
    const int64_t per_row = n / 8, total = rows * per_row, span = (int64_t)blockDim.x * NBQ_UNROLL;
    for (int64_t base = blockIdx.x * span; base < total; base += (int64_t)gridDim.x * span) {
        float v[NBQ_UNROLL][8];
        nbq_load_groups<XDT>(x, base, total, v);
#pragma unroll
        for (int k = 0; k < NBQ_UNROLL; k++) {
            const int64_t g = base + k * (int64_t)blockDim.x + threadIdx.x;
            if (g >= total) break;
            float sc = scale;
            if (row_scale)   // the row by a 32-bit division where the index fits (a 64-bit one is a long sequence)
                sc = row_scale[total <= 0xFFFFFFFFll ? (int64_t)((uint32_t)g / (uint32_t)per_row) : g / per_row];
            const float r = row_scale ? nbq_fp8_recip(sc) : recip;
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < 8; i += 2) w[i / 4] |= nbq_fp8_code2<DD>(v[k][i], v[k][i + 1], sc, r) << (8 * (i % 4));
            ((uint2 *)q)[g] = make_uint2(w[0], w[1]);
        }
    }
}

template <int DD> static cudaError_t launch_fp8(const nbq_launch &l, const nbq_kargs &a) {
    const int threads = 256;
    const float recip = nbq_fp8_recip_ok(a.scale, 1.0f / a.scale);
    if (l.op == NBQ_OP_QUANTIZE && nbq_vec_ok(l.x, l.xdt, l.q, l.n)) {
        const unsigned grid = nbq_grid(l.rows * (l.n / 8), threads * NBQ_UNROLL);
        if (l.xdt == NB_BF16)
            nbq_fp8_quant8_kernel<NB_BF16, DD><<<grid, threads, 0, l.stream>>>(l.x, l.rows, l.n, a.scale, recip, a.row_scale, l.q);
        else if (l.xdt == NB_F16)
            nbq_fp8_quant8_kernel<NB_F16, DD><<<grid, threads, 0, l.stream>>>(l.x, l.rows, l.n, a.scale, recip, a.row_scale, l.q);
        else
            nbq_fp8_quant8_kernel<NB_F32, DD><<<grid, threads, 0, l.stream>>>(l.x, l.rows, l.n, a.scale, recip, a.row_scale, l.q);
        return cudaGetLastError();
    }
    const unsigned grid = nbq_grid(l.rows * l.n, threads);
    nbq_fp8_kernel<DD><<<grid, threads, 0, l.stream>>>(l.op, l.x, l.xdt, l.qin, l.rows, l.n, a.scale, recip, a.row_scale,
                                                        l.q, l.y, l.ydt);
    return cudaGetLastError();
}

cudaError_t nbq_launch_fp8(const nbq_launch &l, const nbq_kargs &a) {
    if (a.div_dtype == NB_BF16) return launch_fp8<NB_BF16>(l, a);
    if (a.div_dtype == NB_F16) return launch_fp8<NB_F16>(l, a);
    return launch_fp8<NB_F32>(l, a);
}

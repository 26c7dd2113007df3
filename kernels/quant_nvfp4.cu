// NVFP4 and four_over_six kernels: one thread per 16-element block, the exact arithmetic of the
// scalar reference rows (core/src/quant/nvfp4.c), from the same block arithmetic (quant/numerics.h).
#include "quant_common.cuh"

__global__ void nbq_nvfp4_quant_kernel(const void *x, int xdt, int64_t rows, int64_t n, nbq_kargs a, float norm,
                                       int pick46, uint8_t *q, uint8_t *s, void *y, int ydt) {
    const int64_t nblk = n / NB_NVFP4_BLOCK, total = rows * nblk;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = g / nblk, b = g % nblk, base = r * n + b * NB_NVFP4_BLOCK;
        float xb[NB_NVFP4_BLOCK];
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) xb[i] = nbq_load(x, xdt, base + i);
        const uint8_t sb = nbq_nvfp4_block_scale(xb, a, r, b, nblk, norm, pick46);
        const float p = nbn_nvfp4_divisor(sb, a.scale);
        uint8_t c[NB_NVFP4_BLOCK];
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) c[i] = nbn_nvfp4_code(xb[i], p);
        if (y) {
            for (int i = 0; i < NB_NVFP4_BLOCK; i++) nbq_store(y, ydt, base + i, nbn_mul(nbn_e2m1_deq(c[i]), p));
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
        const float p = nbn_nvfp4_divisor(s[g], s2);
        const int64_t base = g * NB_NVFP4_BLOCK;
        for (int j = 0; j < NB_NVFP4_BLOCK / 2; j++) {
            const uint8_t byte = q[g * 8 + j];
            nbq_store(y, ydt, base + 2 * j, nbn_mul(nbn_e2m1_deq(byte & 0xF), p));
            nbq_store(y, ydt, base + 2 * j + 1, nbn_mul(nbn_e2m1_deq(byte >> 4), p));
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
        const float p = nbn_nvfp4_divisor(sb, a.scale);
        uint32_t w[2] = {0, 0};
        for (int i = 0; i < NB_NVFP4_BLOCK; i++) w[i / 8] |= (uint32_t)nbn_nvfp4_code(xb[i], p) << (4 * (i % 8));
        s[g] = sb;
        ((uint2 *)q)[g] = make_uint2(w[0], w[1]);
    }
}

enum { NBQ_TAB_UNROLL = 2 };   // blocks per thread in nbq_nvfp4_tab16_kernel, their loads issued together

// BF16 quantize by the threshold table of core/src/cpu/fast_avx512.c (nbq_nv_table): for each scale
// byte sb whose divisor p = e4m3(sb) * s2 is positive and at most 2^16 (nbn_e2m1_table_ok),
// th[sb][j] + 1 is the smallest bf16 magnitude whose quotient by p reaches the j-th E2M1 rounding
// boundary (nbn_e2m1_threshold: binary search with the reference's own division, the same function
// as the CPU table's). An element's code is then the count of thresholds its magnitude passes
// (nbq_e2m1_count2, two elements at a time), and its sign bit (set for negative non-zero x: with
// p <= 2^16 no bf16 quotient underflows to -0). Each thread block builds the table in shared memory (126 x 7 searches of 16 divisions), then
// takes 16-element blocks like nbq_nvfp4_quant16_kernel, NBQ_TAB_UNROLL of them per thread with their
// loads issued together; a block with a NaN or a scale byte outside the table runs the reference
// arithmetic.
// Codes of the two bf16 magnitudes in m2 (halves, sign bits clear, no NaN) against a scale byte's
// thresholds th (each duplicated in both halves): seven packed bf16 compares (1.0 where the magnitude
// is above), summed onto 128.0 so each half's low bits are the count. One instruction per element and
// threshold where the integer compares took two at half rate.
// (Before sm_90, which has no bf16x2 compare: integer compares of each half.)
NBQ_DEV uint32_t nbq_e2m1_count2(uint32_t m2, const uint32_t *th) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t acc = 0x43004300u;   // (128.0, 128.0) in bf16: 128 + k is exact for k <= 7
#pragma unroll
    for (int j = 0; j < 7; j++) {
        uint32_t gt;
        asm("set.gt.bf16x2.bf16x2 %0, %1, %2;" : "=r"(gt) : "r"(m2), "r"(th[j]));
        asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(acc) : "r"(acc), "r"(gt));
    }
    return acc & 0x000F000Fu;
#else
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 7; j++) {
        lo += (m2 & 0xFFFFu) > (th[j] & 0xFFFFu);
        hi += (m2 >> 16) > (th[j] >> 16);
    }
    return lo | (hi << 16);
#endif
}

// The largest non-NaN magnitude pattern of 16 bf16 values (two per word), as the reference's max that
// skips NaN: packed bf16 max (max.bf16x2 returns the other operand when one is NaN) on sm_90, integer
// compares of each half before.
NBQ_DEV uint32_t nbq_bf16_block_max(const uint32_t wv[8]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t m = wv[0] & 0x7FFF7FFFu;
#pragma unroll
    for (int i = 1; i < 8; i++) asm("max.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(wv[i] & 0x7FFF7FFFu));
    const uint32_t lo = m & 0xFFFFu, hi = m >> 16;   // a NaN half is left only where all eight were NaN
    const uint32_t a = lo > 0x7F80u ? 0u : lo, b = hi > 0x7F80u ? 0u : hi;
    return a > b ? a : b;
#else
    uint32_t mx = 0;
    for (int i = 0; i < 8; i++) {
        const uint32_t m0 = wv[i] & 0x7FFFu, m1 = (wv[i] >> 16) & 0x7FFFu;
        mx = max(mx, max(m0 > 0x7F80u ? 0u : m0, m1 > 0x7F80u ? 0u : m1));
    }
    return mx;
#endif
}

__global__ void nbq_nvfp4_tab16_kernel(const uint16_t *x, int64_t rows, int64_t n, nbq_kargs a, float norm, uint8_t *q,
                                       uint8_t *s) {
    __shared__ __align__(16) uint32_t th[128][8];   // T_j - 1 in both halves; [7] unused
    __shared__ uint8_t ok[128];
    for (int i = threadIdx.x; i < 128; i += blockDim.x) {
        ok[i] = nbn_e2m1_table_ok(i, nbn_nvfp4_divisor((uint8_t)i, a.scale));
        th[i][7] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 128 * 7; i += blockDim.x) {
        const int sb = i / 7, j = i % 7;
        if (!ok[sb]) continue;
        // the threshold is >= 1: a zero magnitude never passes
        th[sb][j] = (nbn_e2m1_threshold(nbn_nvfp4_divisor((uint8_t)sb, a.scale), j) - 1) * 0x00010001u;
    }
    __syncthreads();
    const int64_t total = rows * (n / NB_NVFP4_BLOCK), span = (int64_t)blockDim.x * NBQ_TAB_UNROLL;
    for (int64_t base = blockIdx.x * span; base < total; base += (int64_t)gridDim.x * span) {
        uint4 u[NBQ_TAB_UNROLL][2];   // each thread's blocks loaded before the first is coded
#pragma unroll
        for (int k = 0; k < NBQ_TAB_UNROLL; k++) {
            const int64_t g = base + k * (int64_t)blockDim.x + threadIdx.x;
            if (g < total) {
                u[k][0] = ((const uint4 *)x)[2 * g];
                u[k][1] = ((const uint4 *)x)[2 * g + 1];
            }
        }
#pragma unroll
        for (int k = 0; k < NBQ_TAB_UNROLL; k++) {
            const int64_t g = base + k * (int64_t)blockDim.x + threadIdx.x;
            if (g >= total) break;
            const uint32_t wv[8] = {u[k][0].x, u[k][0].y, u[k][0].z, u[k][0].w, u[k][1].x, u[k][1].y, u[k][1].z, u[k][1].w};
            const uint32_t mx = nbq_bf16_block_max(wv);
            uint32_t nan = 0;   // a magnitude above Inf's pattern: m + 0x7F reaches bit 15 (no carry out of a half)
#pragma unroll
            for (int i = 0; i < 8; i++) nan |= ((wv[i] & 0x7FFF7FFFu) + 0x007F007Fu) & 0x80008000u;
            const uint8_t sb = a.block_amax ? nbn_nvfp4_block_scale_static(a.block_amax[g], a.global_amax, norm)
                                            : nbn_nvfp4_block_scale_dynamic(nbn_bf16_to_f32((uint16_t)mx), a.scale);
            uint32_t w[2] = {0, 0};
            if (!nan && ok[sb & 0x7F] && !(sb & 0x80)) {
                const uint4 t0 = *(const uint4 *)&th[sb][0], t1 = *(const uint4 *)&th[sb][4];
                const uint32_t t[7] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z};
#pragma unroll
                for (int i = 0; i < 8; i++) {   // elements 2i, 2i+1: one byte
                    const uint32_t m2 = wv[i] & 0x7FFF7FFFu;
                    // the sign bit where x < 0 and x != 0 (m + 0x7FFF reaches bit 15 iff m >= 1, no carry out)
                    const uint32_t sg = wv[i] & (m2 + 0x7FFF7FFFu) & 0x80008000u;
                    const uint32_t c = nbq_e2m1_count2(m2, t) | (sg >> 12);
                    w[i / 4] |= ((c | (c >> 12)) & 0xFFu) << (8 * (i % 4));
                }
            } else {
                const float p = nbn_nvfp4_divisor(sb, a.scale);
                for (int i = 0; i < NB_NVFP4_BLOCK; i++) {
                    const uint16_t hv = (uint16_t)(wv[i / 2] >> (16 * (i % 2)));
                    w[i / 8] |= (uint32_t)nbn_nvfp4_code(nbn_bf16_to_f32(hv), p) << (4 * (i % 8));
                }
            }
            s[g] = sb;
            ((uint2 *)q)[g] = make_uint2(w[0], w[1]);
        }
    }
}

// Thread blocks for the table kernel: enough to fill the device once (each builds its own table).
static unsigned nbq_tab_grid(int64_t total, int threads) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 132;
    const unsigned need = nbq_grid(total, threads), cap = (unsigned)sms * (2048u / (unsigned)threads);
    return need < cap ? need : cap;
}

cudaError_t nbq_launch_nvfp4(const nbq_launch &l, const nbq_kargs &a, float norm, int pick46) {
    const int threads = 128;
    if (l.op == NBQ_OP_QUANTIZE && l.xdt == NB_BF16 && !pick46 && nbq_vec_ok(l.x, l.xdt, l.q, l.n)) {
        const int64_t total = l.rows * (l.n / NB_NVFP4_BLOCK);
        nbq_nvfp4_tab16_kernel<<<nbq_tab_grid((total + NBQ_TAB_UNROLL - 1) / NBQ_TAB_UNROLL, 256), 256, 0, l.stream>>>((const uint16_t *)l.x, l.rows, l.n, a, norm,
                                                                               l.q, l.s);
        return cudaGetLastError();
    }
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

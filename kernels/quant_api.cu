// The public C API of the CUDA quantization kernels (nibble/quant_cuda.h): argument checks with
// nibble's messages, the per-tensor parameters copied into the kernel arguments (with the exact
// MXFP8 ceil table from the CPU side), and host wrappers that stage arrays through device memory.
#include <cuda_runtime.h>
#include <string.h>

#include "quant_common.cuh"

extern "C" {
#include "nibble/cuda.h"
#include "nibble/ctx.h"
const uint32_t *nbq_mx_ceil_table(void);   // core/src/cpu/fast_dispatch.c
}

static const char *OPS[3] = {"quantize", "dequantize", "fake quant"};

static int64_t esize(nb_dtype dt) { return dt == NB_F32 ? 4 : 2; }
static int float_dtype(nb_dtype dt) { return dt == NB_F32 || dt == NB_BF16 || dt == NB_F16; }

static nb_status check_args(nb_ctx *ctx, int op, nb_qformat f, nb_dtype dt, int64_t rows, int64_t n,
                            const nb_cuda_qargs *a) {
    const char *what = OPS[op];
    const nb_qformat_traits *tr = nb_qformat_info(f);
    if (!tr || f == NB_FMT_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "cuda %s: unknown or empty quantization format %d", what, (int)f);
    if (!a) return nb_fail(ctx, NB_ERR_INVALID, "cuda %s %s: args are NULL", what, tr->name);
    if (rows < 0 || n < 0)
        return nb_fail(ctx, NB_ERR_SHAPE, "cuda %s %s: negative shape [%lld, %lld]", what, tr->name, (long long)rows,
                       (long long)n);
    if (tr->block_size && n % tr->block_size)
        return nb_fail(ctx, NB_ERR_SHAPE, "cuda %s %s: last dimension %lld is not divisible by the block size %d", what,
                       tr->name, (long long)n, tr->block_size);
    if (!float_dtype(dt))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "cuda %s %s: dtype %s (f32, bf16 or f16 only)", what, tr->name,
                       nb_dtype_info(dt) ? nb_dtype_info(dt)->name : "?");
    if (f == NB_FMT_FP8_CHANNEL && !a->row_scale)
        return nb_fail(ctx, NB_ERR_INVALID, "cuda %s fp8_channel: row_scale is required", what);
    if ((f == NB_FMT_FP8_TENSOR || f == NB_FMT_FP8_CHANNEL) && !float_dtype((nb_dtype)a->div_dtype))
        return nb_fail(ctx, NB_ERR_INVALID, "cuda %s %s: div_dtype must be f32, bf16 or f16", what, tr->name);
    if (nb_cuda_device_count() == 0)
        return nb_fail(ctx, NB_ERR_DEVICE, "cuda %s %s: no CUDA device is available", what, tr->name);
    return NB_OK;
}

static nb_status cuda_fail(nb_ctx *ctx, int op, nb_qformat f, const char *stage, cudaError_t e) {
    return nb_fail(ctx, NB_ERR_DEVICE, "cuda %s %s: %s: %s", OPS[op], nb_qformat_info(f)->name, stage,
                   cudaGetErrorString(e));
}

static nb_status launch(nb_ctx *ctx, nb_qformat f, const nbq_launch &l, const nb_cuda_qargs *a) {
    if (l.rows == 0 || l.n == 0) return NB_OK;
    nbq_kargs k;
    memset(&k, 0, sizeof k);
    k.scale = a->scale;
    k.global_amax = a->global_amax;
    k.block_amax = a->block_amax;
    k.row_scale = f == NB_FMT_FP8_CHANNEL ? a->row_scale : nullptr;
    k.mx_floor = a->mx_floor;
    k.div_dtype = a->div_dtype;
    cudaError_t e = cudaSuccess;
    switch (f) {
    case NB_FMT_NVFP4:
        e = nbq_launch_nvfp4(l, k, 448.0f, 0);
        break;
    case NB_FMT_NVFP4_46:
        e = nbq_launch_nvfp4(l, k, 256.0f, a->block_amax ? 0 : 1);
        break;
    case NB_FMT_MXFP8:
        memcpy(k.mx_table, nbq_mx_ceil_table(), sizeof k.mx_table);
        e = nbq_launch_mxfp8(l, k);
        break;
    default:
        e = nbq_launch_fp8(l, k);
        break;
    }
    if (e != cudaSuccess) return cuda_fail(ctx, l.op, f, "kernel launch", e);
    return NB_OK;
}

extern "C" nb_status nb_cuda_quantize(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                                      const nb_cuda_qargs *a, uint8_t *q, uint8_t *s, void *stream) {
    nb_status st = check_args(ctx, NBQ_OP_QUANTIZE, f, xdt, rows, n, a);
    if (st) return st;
    if (rows == 0 || n == 0) return NB_OK;
    if (!x || !q || (nb_qformat_info(f)->block_size && !s))
        return nb_fail(ctx, NB_ERR_INVALID, "cuda quantize %s: x, q (and s for block formats) are required",
                       nb_qformat_info(f)->name);
    nbq_launch l;
    memset(&l, 0, sizeof l);
    l.op = NBQ_OP_QUANTIZE;
    l.x = x;
    l.xdt = xdt;
    l.q = q;
    l.s = s;
    l.rows = rows;
    l.n = n;
    l.stream = (cudaStream_t)stream;
    return launch(ctx, f, l, a);
}

extern "C" nb_status nb_cuda_dequantize(nb_ctx *ctx, nb_qformat f, const uint8_t *q, const uint8_t *s, int64_t rows,
                                        int64_t n, const nb_cuda_qargs *a, void *y, nb_dtype ydt, void *stream) {
    nb_status st = check_args(ctx, NBQ_OP_DEQUANTIZE, f, ydt, rows, n, a);
    if (st) return st;
    if (rows == 0 || n == 0) return NB_OK;
    if (!q || !y || (nb_qformat_info(f)->block_size && !s))
        return nb_fail(ctx, NB_ERR_INVALID, "cuda dequantize %s: q, y (and s for block formats) are required",
                       nb_qformat_info(f)->name);
    nbq_launch l;
    memset(&l, 0, sizeof l);
    l.op = NBQ_OP_DEQUANTIZE;
    l.qin = q;
    l.sin = s;
    l.y = y;
    l.ydt = ydt;
    l.rows = rows;
    l.n = n;
    l.stream = (cudaStream_t)stream;
    return launch(ctx, f, l, a);
}

extern "C" nb_status nb_cuda_fake_quant(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                                        const nb_cuda_qargs *a, void *y, nb_dtype ydt, void *stream) {
    nb_status st = check_args(ctx, NBQ_OP_FAKE, f, xdt, rows, n, a);
    if (st) return st;
    if (!float_dtype(ydt))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "cuda fake quant %s: output dtype must be f32, bf16 or f16",
                       nb_qformat_info(f)->name);
    if (rows == 0 || n == 0) return NB_OK;
    if (!x || !y) return nb_fail(ctx, NB_ERR_INVALID, "cuda fake quant %s: x and y are required", nb_qformat_info(f)->name);
    nbq_launch l;
    memset(&l, 0, sizeof l);
    l.op = NBQ_OP_FAKE;
    l.x = x;
    l.xdt = xdt;
    l.y = y;
    l.ydt = ydt;
    l.rows = rows;
    l.n = n;
    l.stream = (cudaStream_t)stream;
    return launch(ctx, f, l, a);
}

// ---- host wrappers ------------------------------------------------------------------------------

// Device staging buffers, freed together.
struct staging {
    void *p[6];
    int k;
};

static cudaError_t stage_alloc(staging &st, void **out, size_t bytes) {
    *out = nullptr;
    if (bytes == 0) return cudaSuccess;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaSuccess) st.p[st.k++] = *out;
    return e;
}

static void stage_free(staging &st) {
    for (int i = 0; i < st.k; i++) cudaFree(st.p[i]);
    st.k = 0;
}

static int64_t qbytes(nb_qformat f, int64_t rows, int64_t n) {
    return (f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46) ? rows * (n / 2) : rows * n;
}

static int64_t sbytes(nb_qformat f, int64_t rows, int64_t n) {
    int b = nb_qformat_info(f)->block_size;
    return b ? rows * (n / b) : 0;
}

// Copies the host-side block_amax / row_scale of `a` to the device; `d` gets device pointers.
static cudaError_t stage_args(staging &st, nb_qformat f, int64_t rows, int64_t n, const nb_cuda_qargs *a,
                              nb_cuda_qargs *d) {
    *d = *a;
    cudaError_t e = cudaSuccess;
    if (a->block_amax && (f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46)) {
        size_t b = (size_t)(rows * (n / NB_NVFP4_BLOCK)) * sizeof(float);
        void *p;
        if ((e = stage_alloc(st, &p, b)) != cudaSuccess) return e;
        if (b && (e = cudaMemcpy(p, a->block_amax, b, cudaMemcpyHostToDevice)) != cudaSuccess) return e;
        d->block_amax = (const float *)p;
    } else {
        d->block_amax = nullptr;
    }
    if (a->row_scale && f == NB_FMT_FP8_CHANNEL) {
        size_t b = (size_t)rows * sizeof(float);
        void *p;
        if ((e = stage_alloc(st, &p, b)) != cudaSuccess) return e;
        if (b && (e = cudaMemcpy(p, a->row_scale, b, cudaMemcpyHostToDevice)) != cudaSuccess) return e;
        d->row_scale = (const float *)p;
    }
    return cudaSuccess;
}

#define STAGE(call, what) do { cudaError_t _e = (call); if (_e != cudaSuccess) { \
    stage_free(st); return cuda_fail(ctx, op, f, (what), _e); } } while (0)

extern "C" nb_status nb_cuda_quantize_host(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows,
                                           int64_t n, const nb_cuda_qargs *a, uint8_t *q, uint8_t *s) {
    const int op = NBQ_OP_QUANTIZE;
    nb_status r = check_args(ctx, op, f, xdt, rows, n, a);
    if (r) return r;
    staging st = {};
    nb_cuda_qargs d;
    void *dx, *dq, *ds;
    size_t xb = (size_t)(rows * n * esize(xdt)), qb = (size_t)qbytes(f, rows, n), sb = (size_t)sbytes(f, rows, n);
    STAGE(stage_args(st, f, rows, n, a, &d), "copying the parameters");
    STAGE(stage_alloc(st, &dx, xb), "cudaMalloc");
    STAGE(stage_alloc(st, &dq, qb), "cudaMalloc");
    STAGE(stage_alloc(st, &ds, sb), "cudaMalloc");
    if (xb) STAGE(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice), "copying x to the device");
    if ((r = nb_cuda_quantize(ctx, f, dx, xdt, rows, n, &d, (uint8_t *)dq, (uint8_t *)ds, nullptr))) {
        stage_free(st);
        return r;
    }
    if (qb) STAGE(cudaMemcpy(q, dq, qb, cudaMemcpyDeviceToHost), "copying q back");
    if (sb) STAGE(cudaMemcpy(s, ds, sb, cudaMemcpyDeviceToHost), "copying s back");
    stage_free(st);
    return NB_OK;
}

extern "C" nb_status nb_cuda_dequantize_host(nb_ctx *ctx, nb_qformat f, const uint8_t *q, const uint8_t *s, int64_t rows,
                                             int64_t n, const nb_cuda_qargs *a, void *y, nb_dtype ydt) {
    const int op = NBQ_OP_DEQUANTIZE;
    nb_status r = check_args(ctx, op, f, ydt, rows, n, a);
    if (r) return r;
    staging st = {};
    nb_cuda_qargs d;
    void *dq, *ds, *dy;
    size_t yb = (size_t)(rows * n * esize(ydt)), qb = (size_t)qbytes(f, rows, n), sb = (size_t)sbytes(f, rows, n);
    STAGE(stage_args(st, f, rows, n, a, &d), "copying the parameters");
    STAGE(stage_alloc(st, &dq, qb), "cudaMalloc");
    STAGE(stage_alloc(st, &ds, sb), "cudaMalloc");
    STAGE(stage_alloc(st, &dy, yb), "cudaMalloc");
    if (qb) STAGE(cudaMemcpy(dq, q, qb, cudaMemcpyHostToDevice), "copying q to the device");
    if (sb) STAGE(cudaMemcpy(ds, s, sb, cudaMemcpyHostToDevice), "copying s to the device");
    if ((r = nb_cuda_dequantize(ctx, f, (const uint8_t *)dq, (const uint8_t *)ds, rows, n, &d, dy, ydt, nullptr))) {
        stage_free(st);
        return r;
    }
    if (yb) STAGE(cudaMemcpy(y, dy, yb, cudaMemcpyDeviceToHost), "copying y back");
    stage_free(st);
    return NB_OK;
}

extern "C" nb_status nb_cuda_fake_quant_host(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows,
                                             int64_t n, const nb_cuda_qargs *a, void *y, nb_dtype ydt) {
    const int op = NBQ_OP_FAKE;
    nb_status r = check_args(ctx, op, f, xdt, rows, n, a);
    if (r) return r;
    if (!float_dtype(ydt))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "cuda fake quant %s: output dtype must be f32, bf16 or f16",
                       nb_qformat_info(f)->name);
    staging st = {};
    nb_cuda_qargs d;
    void *dx, *dy;
    size_t xb = (size_t)(rows * n * esize(xdt)), yb = (size_t)(rows * n * esize(ydt));
    STAGE(stage_args(st, f, rows, n, a, &d), "copying the parameters");
    STAGE(stage_alloc(st, &dx, xb), "cudaMalloc");
    STAGE(stage_alloc(st, &dy, yb), "cudaMalloc");
    if (xb) STAGE(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice), "copying x to the device");
    if ((r = nb_cuda_fake_quant(ctx, f, dx, xdt, rows, n, &d, dy, ydt, nullptr))) {
        stage_free(st);
        return r;
    }
    if (yb) STAGE(cudaMemcpy(y, dy, yb, cudaMemcpyDeviceToHost), "copying y back");
    stage_free(st);
    return NB_OK;
}

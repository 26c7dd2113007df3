// CUDA device discovery (the one place the core asks whether a GPU is present) and the device memory
// of the context's backend: allocation, copies, stream synchronization. Tests of CUDA kernels call
// nb_cuda_device_count() and exit 77 (skipped) when it is 0.
#include <cuda_runtime.h>

extern "C" {
#include "nibble/cuda.h"   // its NB_API marks the definition below as exported from libnibble
}

extern "C" int nb_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

// ---- device memory for the context's backend (core/src/backend.h) --------------------------------

extern "C" {
#include "nibble/ctx.h"
}

extern "C" nb_status nbk_device_alloc(nb_ctx *ctx, int device, size_t bytes, void **out) {
    *out = nullptr;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = nullptr;
        return nb_fail(ctx, NB_ERR_DEVICE, "cuda device %d: cannot allocate %zu bytes: %s", device, bytes,
                       cudaGetErrorString(e));
    }
    return NB_OK;
}

extern "C" nb_status nbk_set_device(nb_ctx *ctx, int device) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return nb_fail(ctx, NB_ERR_DEVICE, "cuda device %d: %s", device, cudaGetErrorString(e));
    }
    return NB_OK;
}

extern "C" void nbk_device_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" nb_status nbk_memcpy(nb_ctx *ctx, void *dst, const void *src, size_t bytes, int dir, void *stream) {
    static const cudaMemcpyKind KIND[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    static const char *const WHAT[3] = {"host to device", "device to host", "device to device"};
    if (bytes == 0) return NB_OK;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, KIND[dir], s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return nb_fail(ctx, NB_ERR_DEVICE, "cuda copy of %zu bytes %s: %s", bytes, WHAT[dir], cudaGetErrorString(e));
    }
    return NB_OK;
}

extern "C" nb_status nbk_stream_sync(nb_ctx *ctx, void *stream) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return nb_fail(ctx, NB_ERR_DEVICE, "cuda: the stream failed: %s", cudaGetErrorString(e));
    }
    return NB_OK;
}

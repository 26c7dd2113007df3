/* The backend table every nb_ctx carries: which CPU kernels this context runs (the model runtime's
 * SIMD level, the quantizer row functions, the BF16 kernels, the GEMM threading) and its CUDA device,
 * stream and workspace. ctx.c chooses it at nb_ctx_new from nb_ctx_options, reading the documented
 * environment variables there and nowhere else; only the context's own setters change it. Two
 * contexts never share one, so two settings can run side by side in one process. */
#ifndef NIBBLE_BACKEND_H
#define NIBBLE_BACKEND_H

#include <stddef.h>
#include "nibble/quant.h"
#include "cpu/simd.h"

typedef struct nb_backend {
    /* CPU */
    int simd_level;                   /* NB_SIMD_*: the model runtime's row kernels */
    const nb_simd_table *simd;        /* nb_simd_table_for(simd_level) */
    nb_qrow_fns rows[NB_FMT_COUNT];   /* the quantizer rows of each format (NULL for NB_FMT_NONE) */
    int bf16_kernels;                 /* the "avx512" quantizer path: AVX-512 BF16-input kernels on */
    int gemm_openblas;                /* 1: OpenBLAS's own threads (NIBBLE_GEMM=openblas); 0: our pool */
    int env_threads;                  /* NIBBLE_THREADS at creation (0: unset): nb_ctx_set_threads(ctx, 0) */
    /* A NIBBLE_QUANT_PATH that could not be honoured (auto is installed instead): every quantize on
     * this context fails with it until nb_quant_set_cpu_path chooses a path. */
    nb_status quant_env_status;
    char quant_env_value[64];
    /* CUDA */
    int cuda_device;                  /* device for new device tensors */
    void *cuda_stream;                /* cudaStream_t the kernels run on (NULL: the default stream) */
    void *cuda_workspace;             /* device scratch, grown on demand, freed with the context */
    size_t cuda_workspace_bytes;
    int cuda_workspace_device;        /* the device the workspace is on */
} nb_backend;

/* ctx's backend; with NULL, the default one (the best paths this CPU has, no environment). */
const nb_backend *nb_backend_of(const nb_ctx *ctx);
/* The same, writable: the context's setters and the CUDA workspace only (ctx not NULL). */
nb_backend *nb_ctx_backend(nb_ctx *ctx);

/* fast_dispatch.c: install a quantizer path ("auto", "avx512", "avx2", "reference") into b; errors
 * go to ctx (which may be NULL). */
nb_status nbq_backend_set_path(nb_ctx *ctx, nb_backend *b, const char *path);

/* CUDA memory for the backend (kernels/device.cu; cuda_stub.c without CUDA: NB_ERR_DEVICE). */
nb_status nbk_device_alloc(nb_ctx *ctx, int device, size_t bytes, void **out);
void nbk_device_free(void *p);
/* Make `device` current for the kernels launched next on this thread. */
nb_status nbk_set_device(nb_ctx *ctx, int device);
/* dir 0: host -> device, 1: device -> host, 2: device -> device. Synchronous on the stream. */
nb_status nbk_memcpy(nb_ctx *ctx, void *dst, const void *src, size_t bytes, int dir, void *stream);
/* Wait for the work queued on stream; NB_ERR_DEVICE with CUDA's message when it failed. */
nb_status nbk_stream_sync(nb_ctx *ctx, void *stream);
/* A device call holds the context's CUDA lock from staging its arguments in the workspace until its
 * stream is synchronized: two threads sharing a context never overwrite each other's (ctx.c). */
void nbk_lock(nb_ctx *ctx);
void nbk_unlock(nb_ctx *ctx);
/* At least `bytes` of the context's device workspace on `device` (ctx.c; under nbk_lock). */
nb_status nbk_workspace(nb_ctx *ctx, int device, size_t bytes, void **out);

#endif

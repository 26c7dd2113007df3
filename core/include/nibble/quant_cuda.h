/* CUDA quantization kernels: quantize, dequantize and fake quant of every nb_qformat, bit-equal to
 * the scalar reference rows of nibble/quant.h (tests/c/test_quant_cuda.c holds them to it on a GPU).
 * Tensors are viewed as [rows, n] with n the last dimension (a multiple of the format's block).
 * The plain entry points take device pointers and run asynchronously on `stream` (a cudaStream_t;
 * NULL = the default stream); the *_host wrappers copy host arrays in, run, copy the results back
 * and synchronize. Inputs must be finite: the CPU drivers check that, these entry points do not.
 * Built without CUDA, or with no usable GPU, every call returns NB_ERR_DEVICE saying which.
 * Pipelines reach these kernels through the tensor entry points of nibble/quant.h (nb_quantize,
 * nb_fake_quant, nb_qtensor_dequantize on device tensors), which resolve the parameters as the CPU does
 * and run on the context's CUDA stream; this raw-pointer API is the kernels' own. */
#ifndef NIBBLE_QUANT_CUDA_H
#define NIBBLE_QUANT_CUDA_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/dtype.h"
#include "nibble/quant.h"

/* Per-tensor parameters, as the CPU plan resolves them (nb_qrow_args for a whole tensor). */
typedef struct nb_cuda_qargs {
    float scale;              /* NVFP4: weight_scale_2 (s2); FP8_TENSOR: weight_scale; unused otherwise */
    float global_amax;        /* NVFP4 static and four_over_six: the per-tensor amax G behind s2 */
    const float *block_amax;  /* NVFP4 static: [rows, n/16] calibrated per-block amax; NULL = dynamic */
    const float *row_scale;   /* FP8_CHANNEL: [rows] weight scales (required); NULL otherwise */
    int32_t mx_floor;         /* MXFP8: OCP floor rule instead of ModelOpt's ceil */
    int32_t div_dtype;        /* FP8_TENSOR: NB_F32, NB_BF16 or NB_F16 (ModelOpt's w/s rounding) */
} nb_cuda_qargs;

/* Zeroed args with div_dtype NB_F32. */
NB_API void nb_cuda_qargs_init(nb_cuda_qargs *a);

/* x: [rows, n] of xdt (F32, BF16 or F16). q: data bytes [rows, n/2] (NVFP4) or [rows, n] (E4M3);
 * s: block scales [rows, n/16] (E4M3) or [rows, n/32] (E8M0 as U8); NULL for FP8. */
NB_API nb_status nb_cuda_quantize(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                           const nb_cuda_qargs *a, uint8_t *q, uint8_t *s, void *stream);
/* y: [rows, n] of ydt (F32, BF16 or F16; 16-bit outputs rounded to nearest even). */
NB_API nb_status nb_cuda_dequantize(nb_ctx *ctx, nb_qformat f, const uint8_t *q, const uint8_t *s, int64_t rows, int64_t n,
                             const nb_cuda_qargs *a, void *y, nb_dtype ydt, void *stream);
/* y = dequantize(quantize(x)); y may be x when the dtypes match. */
NB_API nb_status nb_cuda_fake_quant(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                             const nb_cuda_qargs *a, void *y, nb_dtype ydt, void *stream);

/* Host-memory conveniences: every pointer (also a->block_amax and a->row_scale) is a host pointer. */
NB_API nb_status nb_cuda_quantize_host(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                                const nb_cuda_qargs *a, uint8_t *q, uint8_t *s);
NB_API nb_status nb_cuda_dequantize_host(nb_ctx *ctx, nb_qformat f, const uint8_t *q, const uint8_t *s, int64_t rows,
                                  int64_t n, const nb_cuda_qargs *a, void *y, nb_dtype ydt);
NB_API nb_status nb_cuda_fake_quant_host(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                                  const nb_cuda_qargs *a, void *y, nb_dtype ydt);

#endif

/* The CUDA quantization API (nibble/quant_cuda.h) when libnibble is built without the kernels:
 * every entry point fails with NB_ERR_DEVICE and says how to get them. With CUDA the kernels' objects
 * live in the static nibble_cuda library, kept by the device dispatch of the quantizers (qdevice.c). */
#include <string.h>

#include "nibble/quant_cuda.h"

void nb_cuda_qargs_init(nb_cuda_qargs *a) {
    memset(a, 0, sizeof *a);
    a->div_dtype = NB_F32;
}

#ifndef NIBBLE_HAVE_CUDA

static nb_status no_cuda(nb_ctx *ctx, const char *op) {
    return nb_fail(ctx, NB_ERR_DEVICE,
                   "cuda %s: this libnibble was built without CUDA (configure with -DNIBBLE_CUDA=ON where nvcc is found)",
                   op);
}

nb_status nb_cuda_quantize(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                           const nb_cuda_qargs *a, uint8_t *q, uint8_t *s, void *stream) {
    return no_cuda(ctx, "quantize");
}

nb_status nb_cuda_dequantize(nb_ctx *ctx, nb_qformat f, const uint8_t *q, const uint8_t *s, int64_t rows, int64_t n,
                             const nb_cuda_qargs *a, void *y, nb_dtype ydt, void *stream) {
    return no_cuda(ctx, "dequantize");
}

nb_status nb_cuda_fake_quant(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                             const nb_cuda_qargs *a, void *y, nb_dtype ydt, void *stream) {
    return no_cuda(ctx, "fake quant");
}

nb_status nb_cuda_quantize_host(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                                const nb_cuda_qargs *a, uint8_t *q, uint8_t *s) {
    return no_cuda(ctx, "quantize");
}

nb_status nb_cuda_dequantize_host(nb_ctx *ctx, nb_qformat f, const uint8_t *q, const uint8_t *s, int64_t rows,
                                  int64_t n, const nb_cuda_qargs *a, void *y, nb_dtype ydt) {
    return no_cuda(ctx, "dequantize");
}

nb_status nb_cuda_fake_quant_host(nb_ctx *ctx, nb_qformat f, const void *x, nb_dtype xdt, int64_t rows, int64_t n,
                                  const nb_cuda_qargs *a, void *y, nb_dtype ydt) {
    return no_cuda(ctx, "fake quant");
}

#endif

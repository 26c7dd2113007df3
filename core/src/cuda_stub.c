/* CUDA availability, and the device memory of the context's backend when libnibble is built without
 * the kernels (NIBBLE_CUDA=OFF or no nvcc): no devices, and every device call is NB_ERR_DEVICE. */
#include "nibble/cuda.h"
#include "backend.h"

#ifdef NIBBLE_HAVE_CUDA
int nb_cuda_built(void) { return 1; }
#else
int nb_cuda_built(void) { return 0; }
int nb_cuda_device_count(void) { return 0; }

static const char NO_CUDA[] = "this libnibble was built without CUDA (configure with -DNIBBLE_CUDA=ON where nvcc is found)";

nb_status nbk_device_alloc(nb_ctx *ctx, int device, size_t bytes, void **out) {
    (void)bytes;
    *out = NULL;
    return nb_fail(ctx, NB_ERR_DEVICE, "cuda device %d: %s", device, NO_CUDA);
}

nb_status nbk_set_device(nb_ctx *ctx, int device) {
    return nb_fail(ctx, NB_ERR_DEVICE, "cuda device %d: %s", device, NO_CUDA);
}

void nbk_device_free(void *p) { (void)p; }

nb_status nbk_memcpy(nb_ctx *ctx, void *dst, const void *src, size_t bytes, int dir, void *stream) {
    (void)dst, (void)src, (void)bytes, (void)dir, (void)stream;
    return nb_fail(ctx, NB_ERR_DEVICE, "cuda copy: %s", NO_CUDA);
}

nb_status nbk_stream_sync(nb_ctx *ctx, void *stream) {
    (void)stream;
    return nb_fail(ctx, NB_ERR_DEVICE, "cuda: %s", NO_CUDA);
}
#endif

/* CUDA availability when libnibble is built without the kernels (NIBBLE_CUDA=OFF or no nvcc). */
#include "nibble/cuda.h"

#ifdef NIBBLE_HAVE_CUDA
int nb_cuda_built(void) { return 1; }
#else
int nb_cuda_built(void) { return 0; }
int nb_cuda_device_count(void) { return 0; }
#endif

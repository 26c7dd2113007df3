/* CUDA availability. Built without CUDA (or on a machine with no GPU) these report 0 devices,
 * and every CUDA entry point returns NB_ERR_DEVICE with a message that says so. */
#ifndef NIBBLE_CUDA_H
#define NIBBLE_CUDA_H

#include "nibble/status.h"

/* 1 if this libnibble was built with the CUDA kernels. */
NB_API int nb_cuda_built(void);
/* Number of usable CUDA devices (0 when not built with CUDA or no GPU/driver). */
NB_API int nb_cuda_device_count(void);

#endif

// CUDA device discovery: the one place the core asks whether a GPU is present.
// Tests of CUDA kernels call nb_cuda_device_count() and exit 77 (skipped) when it is 0.
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

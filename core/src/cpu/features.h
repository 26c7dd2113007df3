/* Private interface of the CPU feature reader (features.c): the detected features, read once per
 * process, and the best SIMD level each family of CPU kernels can run on them. */
#ifndef NIBBLE_CPU_FEATURES_H
#define NIBBLE_CPU_FEATURES_H

#include "nibble/blas.h"

/* SIMD levels, weakest first. For the model runtime's rows avx2 means AVX2+FMA and avx512 adds
 * AVX-512F; for the quantizer paths avx2 also needs F16C and avx512 AVX-512 F/BW/VL/DQ. */
enum { NB_SIMD_SCALAR = 0, NB_SIMD_AVX2 = 1, NB_SIMD_AVX512 = 2 };

/* This CPU's features (nb_cpu_detect, once). */
const nb_cpu_features *nb_cpu(void);
/* The best level this CPU and this build run: the model runtime's rows, the quantizer paths. */
int nb_cpu_simd_best(void);
int nb_cpu_quant_best(void);

#endif

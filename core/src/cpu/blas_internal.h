/* The BLAS calls the rest of libnibble makes (blas.c loads the library; see nibble/blas.h). */
#ifndef NIBBLE_BLAS_INTERNAL_H
#define NIBBLE_BLAS_INTERNAL_H

#include "nibble/ctx.h"

/* Load the BLAS once per process (nb_ctx_new calls it); the error names the library. */
nb_status nb_blas_load(nb_ctx *ctx);
int nb_blas_ready(void);
void nb_blas_set_threads(int n);
/* Row-major C = alpha op(A) op(B) + beta C (cblas_sgemm of the loaded library). */
void nb_blas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc);

#endif

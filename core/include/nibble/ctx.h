/* nb_ctx: the context every fallible nibble call takes first.
 * It owns the thread pool, the native-memory counters, the default RNG, the interrupt flag, the last
 * error message and the backend table (which CPU kernels run, which CUDA device and stream). Nothing
 * in nibble is global: two contexts never share state (the BLAS library, loaded once per process, is
 * the one exception: nibble/blas.h). */
#ifndef NIBBLE_CTX_H
#define NIBBLE_CTX_H

#include <stddef.h>
#include <stdint.h>
#include "nibble/status.h"

typedef struct nb_ctx nb_ctx;

/* xoshiro256** state; seeded with splitmix64 so any 64-bit seed is fine. */
typedef struct nb_rng {
    uint64_t s[4];
} nb_rng;

typedef struct nb_mem_stats {
    int64_t live_bytes;   /* bytes currently allocated through nb_alloc */
    int64_t peak_bytes;   /* high-water mark of live_bytes */
    int64_t n_allocs;     /* number of nb_alloc calls so far */
} nb_mem_stats;

/* How a context computes: its backend table, chosen once at creation. A field left unset (0 or NULL,
 * as nb_ctx_options_init leaves them) takes the environment variable named beside it, read at
 * nb_ctx_new_opts and never again, else the default; a field that is set wins over the environment.
 * Two contexts with different settings run side by side in one process. */
typedef struct nb_ctx_options {
    int threads;             /* <= 0: NIBBLE_THREADS, else the number of online CPUs */
    const char *simd;        /* model runtime's row kernels: "auto", "avx512", "avx2" or "scalar";
                              * NULL: NIBBLE_SIMD, else auto (the best this CPU has) */
    const char *quant_path;  /* quantizer rows: "auto", "avx512", "avx2" or "reference" (nibble/quant_fast.h);
                              * NULL: NIBBLE_QUANT_PATH, else auto */
    const char *gemm;        /* "pool" (each product split over the context's threads) or "openblas"
                              * (OpenBLAS's own threads); NULL: NIBBLE_GEMM, else pool */
    int cuda_device;         /* CUDA device of the tensors nb_tensor_to_device makes with device -2 */
    void *cuda_stream;       /* cudaStream_t the CUDA kernels run on (NULL: the default stream) */
    const char *comm;        /* communicator backend (nibble/comm.h): "auto" (mpi when launched by mpirun, else
                              * self), "self" or "mpi"; NULL: NIBBLE_COMM, else auto */
    double comm_timeout_s;   /* a collective waiting longer fails with NB_ERR_COMM; <= 0: NIBBLE_COMM_TIMEOUT,
                              * else 300 s */
    int no_env;              /* 1: read no environment variable (only the fields and the defaults) */
} nb_ctx_options;

/* Defaults: every field unset (0 / NULL), CUDA device 0. */
NB_API void nb_ctx_options_init(nb_ctx_options *o);
/* Create a context from options (NULL: the defaults). Fails (NB_ERR_INVALID for a name that is not a
 * level or path, NB_ERR_UNSUPPORTED for one this CPU or build lacks) when NIBBLE_SIMD or a field names
 * one; the message is then nb_ctx_last_error(NULL) on the calling thread. A NIBBLE_QUANT_PATH that
 * cannot be honoured does not fail creation: auto is installed and every quantize on the context fails
 * with the message until nb_quant_set_cpu_path chooses a path (nibble/quant_fast.h). */
NB_API nb_status nb_ctx_new_opts(const nb_ctx_options *o, nb_ctx **out);
/* nb_ctx_new_opts with the defaults and `threads`. */
NB_API nb_status nb_ctx_new(int threads, nb_ctx **out);
/* Contexts are refcounted: buffers hold a reference so they may outlive the caller's handle. */
NB_API void nb_ctx_retain(nb_ctx *ctx);
NB_API void nb_ctx_release(nb_ctx *ctx);

/* Message of the last failing call on this context ("" if none); with NULL, the message of this
 * thread's last failed nb_ctx_new ("no context" if none). */
NB_API const char *nb_ctx_last_error(const nb_ctx *ctx);
NB_API nb_status nb_ctx_last_status(const nb_ctx *ctx);
NB_API void nb_ctx_clear_error(nb_ctx *ctx);
/* Record an error (printf-style message) and return `code`, so callers can `return nb_fail(...)`. */
NB_API nb_status nb_fail(nb_ctx *ctx, nb_status code, const char *fmt, ...)
#if defined(__GNUC__) && !defined(NB_FFI_CDEF)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

NB_API int nb_ctx_threads(const nb_ctx *ctx);
/* threads <= 0: NIBBLE_THREADS as read at creation, else the number of online CPUs. */
NB_API nb_status nb_ctx_set_threads(nb_ctx *ctx, int threads);
/* Switch this context's model-runtime row kernels ("auto", "avx512", "avx2", "scalar"; errors as
 * nb_ctx_new_opts). Other contexts keep theirs; call it while no operation runs on this context. */
NB_API nb_status nb_ctx_set_simd(nb_ctx *ctx, const char *level);
/* One line naming the context's backend, e.g. "cpu: simd avx512, quantizers avx512, gemm pool,
 * 2 threads; cuda: device 0 (built, 1 device)". Returns the length it needed. */
NB_API int nb_ctx_describe_backend(const nb_ctx *ctx, char *buf, size_t n);

/* Native memory accounting (Lua cannot see C memory; the binding nudges its GC from these). */
NB_API void nb_ctx_mem(const nb_ctx *ctx, nb_mem_stats *out);
/* 64-byte aligned, zero-filled, counted allocation. NULL (and an error on ctx) on failure. */
NB_API void *nb_alloc(nb_ctx *ctx, size_t bytes);
NB_API void nb_dealloc(nb_ctx *ctx, void *p, size_t bytes);

/* The context's default RNG. */
NB_API nb_rng *nb_ctx_rng(nb_ctx *ctx);
NB_API void nb_rng_seed(nb_rng *r, uint64_t seed);
NB_API uint64_t nb_rng_next(nb_rng *r);
NB_API double nb_rng_uniform(nb_rng *r);   /* [0, 1) with 53 random bits */
NB_API double nb_rng_normal(nb_rng *r);    /* standard normal (Box-Muller) */

/* Interrupts: safe to call from a signal handler. Long operations poll it and return
 * NB_ERR_INTERRUPTED; nb_ctx_clear_interrupt resets it. */
NB_API void nb_ctx_interrupt(nb_ctx *ctx);
NB_API int nb_ctx_interrupted(const nb_ctx *ctx);
NB_API void nb_ctx_clear_interrupt(nb_ctx *ctx);

/* Run fn(arg, begin, end) over [0, n) split into at most nb_ctx_threads chunks of at least
 * `grain` items each, on the context's persistent pool. Returns when all chunks are done.
 * fn must not call nb_parallel_for on the same context (nested calls run serially). */
typedef void (*nb_range_fn)(void *arg, int64_t begin, int64_t end);
NB_API void nb_parallel_for(nb_ctx *ctx, int64_t n, int64_t grain, nb_range_fn fn, void *arg);

/* Library version string, e.g. "0.1.0". */
NB_API const char *nb_version(void);

#endif

/* nb_ctx: the context every fallible nibble call takes first.
 * It owns the thread pool, the native-memory counters, the default RNG, the interrupt flag
 * and the last error message. Nothing in nibble is global: two contexts never share state. */
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

/* Create a context. threads <= 0 picks the number of online CPUs. Fails (NB_ERR_INVALID or
 * NB_ERR_UNSUPPORTED) when NIBBLE_SIMD names a level that is not one or that this CPU lacks; the
 * message is then nb_ctx_last_error(NULL) on the calling thread. */
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
NB_API nb_status nb_ctx_set_threads(nb_ctx *ctx, int threads);

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

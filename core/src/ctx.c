/* nb_ctx: errors, counted allocation, RNG, interrupt flag, the persistent thread pool and the backend
 * table (backend.h) and the communicator (comm/), chosen here from the options and the environment, which
 * is read nowhere else.
 * The pool runs one nb_parallel_for at a time: workers wait on a generation counter, take a
 * static chunk each, and the caller runs chunk 0 itself and then waits for the rest. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nibble/ctx.h"
#include "nibble/cuda.h"
#include "nibble/ops.h"   /* nb_simd_level: its NB_API declaration gives the definition its visibility */
#include "nibble/quant_fast.h"
#include "backend.h"
#include "comm/comm_internal.h"
#include "cpu/blas_internal.h"

#ifndef NIBBLE_VERSION
#define NIBBLE_VERSION "0.0.0"
#endif

enum { NB_MAX_THREADS = 256, NB_ERRLEN = 1024 };

typedef struct nb_pool {
    pthread_t threads[NB_MAX_THREADS];
    int n_workers;              /* threads besides the caller */
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    uint64_t generation;
    int pending;
    int stop;
    int busy;                   /* an nb_parallel_for is running (nested calls go serial) */
    /* the current job */
    nb_range_fn fn;
    void *arg;
    int64_t n, chunk;
} nb_pool;

struct nb_ctx {
    int refcount;
    int threads;
    nb_status last_status;
    char last_error[NB_ERRLEN];
    nb_mem_stats mem;
    pthread_mutex_t mem_mu;
    nb_rng rng;
    volatile sig_atomic_t interrupted;
    nb_pool *pool;
    nb_backend backend;
    nb_comm comm;               /* rank, size and the collectives' backend (comm/comm.c) */
    pthread_mutex_t cuda_mu;    /* one device call at a time: they share the workspace */
};

const char *nb_version(void) { return NIBBLE_VERSION; }

const char *nb_status_name(nb_status s) {
    switch (s) {
    case NB_OK: return "NB_OK";
    case NB_ERR_INVALID: return "NB_ERR_INVALID";
    case NB_ERR_NOMEM: return "NB_ERR_NOMEM";
    case NB_ERR_IO: return "NB_ERR_IO";
    case NB_ERR_FORMAT: return "NB_ERR_FORMAT";
    case NB_ERR_UNSUPPORTED: return "NB_ERR_UNSUPPORTED";
    case NB_ERR_SHAPE: return "NB_ERR_SHAPE";
    case NB_ERR_NOT_FOUND: return "NB_ERR_NOT_FOUND";
    case NB_ERR_UNCALIBRATED: return "NB_ERR_UNCALIBRATED";
    case NB_ERR_NUMERIC: return "NB_ERR_NUMERIC";
    case NB_ERR_INTERRUPTED: return "NB_ERR_INTERRUPTED";
    case NB_ERR_DEVICE: return "NB_ERR_DEVICE";
    case NB_ERR_INTERNAL: return "NB_ERR_INTERNAL";
    case NB_ERR_COMM: return "NB_ERR_COMM";
    }
    return "NB_ERR_UNKNOWN";
}

/* ---- thread pool --------------------------------------------------------------------------- */

static void run_chunk(nb_pool *p, int k) {
    int64_t b = (int64_t)k * p->chunk;
    int64_t e = b + p->chunk;
    if (e > p->n) e = p->n;
    if (b < e) p->fn(p->arg, b, e);
}

typedef struct { nb_pool *pool; int index; } worker_arg;

static void *worker_main(void *varg) {
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    nb_pool *p = wa.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunk(p, wa.index + 1);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_free(nb_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

static nb_pool *pool_new(int threads) {
    nb_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    /* Workers inherit a mask that blocks the host's asynchronous signals (SIGINT, SIGTERM, ...):
     * a handler must run on a thread the host controls (one that can stop a blocking read or set a
     * Lua hook), never on a pool worker. Faults (SEGV, BUS, FPE, ILL, TRAP, ABRT, SYS) stay open so
     * crash handlers (ASan's included) still see them. */
    sigset_t block, old;
    sigfillset(&block);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&block, faults[i]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    for (int i = 0; i < threads - 1; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) break;
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) { free(wa); break; }
        p->n_workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

void nb_parallel_for(nb_ctx *ctx, int64_t n, int64_t grain, nb_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    nb_pool *p = ctx ? ctx->pool : NULL;
    int64_t max_chunks = (n + grain - 1) / grain;
    int workers = p ? p->n_workers : 0;
    if (!p || workers == 0 || max_chunks < 2) { fn(arg, 0, n); return; }
    pthread_mutex_lock(&p->mu);
    if (p->busy) { pthread_mutex_unlock(&p->mu); fn(arg, 0, n); return; }
    int64_t nchunks = max_chunks < workers + 1 ? max_chunks : workers + 1;
    p->busy = 1;
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = (n + nchunks - 1) / nchunks;
    p->pending = workers;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    p->busy = 0;
    pthread_mutex_unlock(&p->mu);
}

/* ---- context ------------------------------------------------------------------------------- */

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The message of this thread's last failed nb_ctx_new (there is no context to hold it):
 * nb_ctx_last_error(NULL) returns it. */
static _Thread_local char g_new_error[NB_ERRLEN];

/* The backend of calls made without a context: the best paths this CPU has, no environment. Written
 * once (the CPU does not change), read-only after. */
static nb_backend g_default_backend;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

static void backend_defaults(nb_backend *b) {
    memset(b, 0, sizeof *b);
    b->simd_level = nb_cpu_simd_best();
    b->simd = nb_simd_table_for(b->simd_level);
    nbq_backend_set_path(NULL, b, "auto");
}

static void default_once(void) { backend_defaults(&g_default_backend); }

const nb_backend *nb_backend_of(const nb_ctx *ctx) {
    if (ctx) return &ctx->backend;
    pthread_once(&g_default_once, default_once);
    return &g_default_backend;
}

nb_backend *nb_ctx_backend(nb_ctx *ctx) { return &ctx->backend; }

nb_comm *nbc_comm_of(const nb_ctx *ctx) { return ctx ? (nb_comm *)&ctx->comm : NULL; }

const nb_simd_table *nb_ctx_simd(const nb_ctx *ctx) { return nb_backend_of(ctx)->simd; }

const char *nb_simd_level(const nb_ctx *ctx) { return nb_ctx_simd(ctx)->name; }

/* An option's value, or the environment variable's when the option is unset (and the environment is read). */
static const char *choose(const char *option, const char *env, const nb_ctx_options *o, int *from_env) {
    *from_env = 0;
    if (option) return option;
    if (o->no_env) return NULL;
    const char *v = getenv(env);
    *from_env = v != NULL;
    return v;
}

static nb_status set_simd(nb_ctx *ctx, const char *value, int from_env) {
    const char *level;
    nb_status s = nb_simd_select(ctx, value, nb_cpu_simd_best(), &level);
    if (s && !from_env) {   /* the message names the option, not the variable */
        char msg[NB_ERRLEN];
        const char *m = strchr(ctx->last_error, '\'');
        snprintf(msg, sizeof msg, "simd option %s", m ? m : ctx->last_error);
        char *unset = strstr(msg, " (unset it for auto)");
        if (unset) *unset = 0;
        return nb_fail(ctx, s, "%s", msg);
    }
    if (s) return s;
    ctx->backend.simd_level = nb_simd_level_of(level);
    ctx->backend.simd = nb_simd_table_for(ctx->backend.simd_level);
    return NB_OK;
}

nb_status nb_ctx_set_simd(nb_ctx *ctx, const char *level) {
    if (!ctx) return NB_ERR_INVALID;
    return set_simd(ctx, level ? level : "auto", 0);
}

const char *nb_simd_force(nb_ctx *ctx, const char *name) {
    int l = nb_simd_level_of(name);
    if (l >= 0 && l <= nb_cpu_simd_best()) {
        ctx->backend.simd_level = l;
        ctx->backend.simd = nb_simd_table_for(l);
    }
    return ctx->backend.simd->name;
}

/* The backend from the options and the environment: the one place NIBBLE_THREADS, NIBBLE_SIMD,
 * NIBBLE_QUANT_PATH and NIBBLE_GEMM are read. */
static nb_status backend_init(nb_ctx *c, const nb_ctx_options *o) {
    nb_backend *b = &c->backend;
    backend_defaults(b);
    int from_env;
    const char *v = choose(NULL, "NIBBLE_THREADS", o, &from_env);
    b->env_threads = v && atoi(v) > 0 ? atoi(v) : 0;
    v = choose(o->simd, "NIBBLE_SIMD", o, &from_env);
    nb_status s = set_simd(c, v, from_env);
    if (s) return s;
    v = choose(o->quant_path, "NIBBLE_QUANT_PATH", o, &from_env);
    if (v && *v && (s = nbq_backend_set_path(c, b, v))) {
        if (!from_env) return s;
        /* a bad NIBBLE_QUANT_PATH: auto runs, and every quantize on this context says why it will not */
        b->quant_env_status = s;
        snprintf(b->quant_env_value, sizeof b->quant_env_value, "%.60s", v);
        nb_ctx_clear_error(c);
    }
    v = choose(o->gemm, "NIBBLE_GEMM", o, &from_env);
    if (v && !from_env && strcmp(v, "pool") && strcmp(v, "openblas"))
        return nb_fail(c, NB_ERR_INVALID, "gemm option '%.60s': expected pool or openblas", v);
    b->gemm_openblas = v && !strcmp(v, "openblas");
    b->cuda_device = o->cuda_device;
    b->cuda_stream = o->cuda_stream;
    return NB_OK;
}

/* The communicator from the options and the environment: NIBBLE_COMM, NIBBLE_COMM_TIMEOUT and mpirun's
 * rank variables (OpenMPI's, and the PMI / PMIx ones other launchers set) are read here. */
static nb_status comm_init(nb_ctx *c, const nb_ctx_options *o) {
    int from_env, t_env;
    const char *v = choose(o->comm, "NIBBLE_COMM", o, &from_env);
    const char *t = o->comm_timeout_s > 0 ? NULL : choose(NULL, "NIBBLE_COMM_TIMEOUT", o, &t_env);
    double timeout = o->comm_timeout_s > 0 ? o->comm_timeout_s : t && atof(t) > 0 ? atof(t) : 300.0;
    int launched = !o->no_env && (getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK") || getenv("PMIX_RANK"));
    return nbc_comm_init(c, &c->comm, v, from_env ? "NIBBLE_COMM" : "comm option", launched, timeout);
}

void nbk_lock(nb_ctx *ctx) { pthread_mutex_lock(&ctx->cuda_mu); }
void nbk_unlock(nb_ctx *ctx) { pthread_mutex_unlock(&ctx->cuda_mu); }

nb_status nbk_workspace(nb_ctx *ctx, int device, size_t bytes, void **out) {
    nb_backend *b = &ctx->backend;
    if (b->cuda_workspace && b->cuda_workspace_bytes >= bytes && b->cuda_workspace_device == device) {
        *out = b->cuda_workspace;
        return NB_OK;
    }
    nbk_device_free(b->cuda_workspace);
    b->cuda_workspace = NULL;
    b->cuda_workspace_bytes = 0;
    size_t want = bytes < 4096 ? 4096 : bytes;
    nb_status s = nbk_device_alloc(ctx, device, want, &b->cuda_workspace);
    if (s) return s;
    b->cuda_workspace_bytes = want;
    b->cuda_workspace_device = device;
    *out = b->cuda_workspace;
    return NB_OK;
}

void nb_ctx_options_init(nb_ctx_options *o) { memset(o, 0, sizeof *o); }

nb_status nb_ctx_new_opts(const nb_ctx_options *opts, nb_ctx **out) {
    *out = NULL;
    g_new_error[0] = 0;
    nb_ctx_options o;
    if (opts) o = *opts;
    else nb_ctx_options_init(&o);
    nb_ctx *c = calloc(1, sizeof *c);
    if (!c) return NB_ERR_NOMEM;
    c->refcount = 1;
    pthread_mutex_init(&c->mem_mu, NULL);
    pthread_mutex_init(&c->cuda_mu, NULL);
    nb_rng_seed(&c->rng, 0x6e6962626c65ull);  /* "nibble" */
    nb_status s = backend_init(c, &o);
    if (s == NB_OK) s = nb_ctx_set_threads(c, o.threads);
    /* the BLAS is loaded (and its kernels checked) before anything can multiply */
    if (s == NB_OK) s = nb_blas_load(c);
    if (s == NB_OK) s = comm_init(c, &o);
    if (s != NB_OK) {
        snprintf(g_new_error, sizeof g_new_error, "%s", c->last_error);
        nb_ctx_release(c);
        return s;
    }
    *out = c;
    return NB_OK;
}

nb_status nb_ctx_new(int threads, nb_ctx **out) {
    nb_ctx_options o;
    nb_ctx_options_init(&o);
    o.threads = threads;
    return nb_ctx_new_opts(&o, out);
}

int nb_ctx_describe_backend(const nb_ctx *ctx, char *buf, size_t n) {
    const nb_backend *b = nb_backend_of(ctx);
    int ndev = nb_cuda_device_count();
    char cuda[96];
    if (!nb_cuda_built()) snprintf(cuda, sizeof cuda, "not built");
    else snprintf(cuda, sizeof cuda, "device %d (built, %d device%s)", b->cuda_device, ndev, ndev == 1 ? "" : "s");
    return snprintf(buf, n, "cpu: simd %s, quantizers %s, gemm %s, %d thread%s; cuda: %s", b->simd->name,
                    nb_quant_cpu_path(ctx), b->gemm_openblas ? "openblas" : "pool", ctx ? ctx->threads : 1,
                    ctx && ctx->threads == 1 ? "" : "s", cuda);
}

void nb_ctx_retain(nb_ctx *ctx) { if (ctx) __atomic_add_fetch(&ctx->refcount, 1, __ATOMIC_RELAXED); }

void nb_ctx_release(nb_ctx *ctx) {
    if (!ctx || __atomic_sub_fetch(&ctx->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    pool_free(ctx->pool);
    nbc_comm_free(&ctx->comm);
    if (ctx->backend.cuda_workspace) nbk_device_free(ctx->backend.cuda_workspace);
    pthread_mutex_destroy(&ctx->mem_mu);
    pthread_mutex_destroy(&ctx->cuda_mu);
    free(ctx);
}

const char *nb_ctx_last_error(const nb_ctx *ctx) {
    if (ctx) return ctx->last_error;
    return g_new_error[0] ? g_new_error : "no context";
}
nb_status nb_ctx_last_status(const nb_ctx *ctx) { return ctx ? ctx->last_status : NB_ERR_INVALID; }
void nb_ctx_clear_error(nb_ctx *ctx) { ctx->last_error[0] = 0; ctx->last_status = NB_OK; }

nb_status nb_fail(nb_ctx *ctx, nb_status code, const char *fmt, ...) {
    if (!ctx) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
    va_end(ap);
    ctx->last_status = code;
    return code;
}

int nb_ctx_threads(const nb_ctx *ctx) { return ctx->threads; }

nb_status nb_ctx_set_threads(nb_ctx *ctx, int threads) {
    if (threads <= 0) threads = ctx->backend.env_threads > 0 ? ctx->backend.env_threads : online_cpus();
    if (threads > NB_MAX_THREADS) threads = NB_MAX_THREADS;
    if (ctx->pool && ctx->threads == threads) return NB_OK;
    pool_free(ctx->pool);
    ctx->pool = NULL;
    ctx->threads = threads;
    if (threads > 1) {
        ctx->pool = pool_new(threads);
        if (!ctx->pool) return nb_fail(ctx, NB_ERR_NOMEM, "cannot create a pool of %d threads", threads);
        ctx->threads = ctx->pool->n_workers + 1;
    }
    return NB_OK;
}

void nb_ctx_mem(const nb_ctx *ctx, nb_mem_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&ctx->mem_mu);
    *out = ctx->mem;
    pthread_mutex_unlock((pthread_mutex_t *)&ctx->mem_mu);
}

/* nb_alloc without the zero fill, for outputs that are written in full (declared in tensor.c, which
 * uses it for nb_buffer_new_uninit). */
void *nb_alloc_uninit(nb_ctx *ctx, size_t bytes);

void *nb_alloc(nb_ctx *ctx, size_t bytes) {
    void *p = nb_alloc_uninit(ctx, bytes);
    if (p) memset(p, 0, bytes ? (bytes + 63) & ~(size_t)63 : 64);
    return p;
}

void *nb_alloc_uninit(nb_ctx *ctx, size_t bytes) {
    void *p = NULL;
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz == 0) sz = 64;
    if (posix_memalign(&p, 64, sz) != 0 || !p) {
        if (ctx) nb_fail(ctx, NB_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    if (ctx) {
        pthread_mutex_lock(&ctx->mem_mu);
        ctx->mem.live_bytes += (int64_t)bytes;
        ctx->mem.n_allocs++;
        if (ctx->mem.live_bytes > ctx->mem.peak_bytes) ctx->mem.peak_bytes = ctx->mem.live_bytes;
        pthread_mutex_unlock(&ctx->mem_mu);
    }
    return p;
}

void nb_dealloc(nb_ctx *ctx, void *p, size_t bytes) {
    if (!p) return;
    free(p);
    if (ctx) {
        pthread_mutex_lock(&ctx->mem_mu);
        ctx->mem.live_bytes -= (int64_t)bytes;
        pthread_mutex_unlock(&ctx->mem_mu);
    }
}

/* ---- RNG: xoshiro256** seeded by splitmix64 ----------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

nb_rng *nb_ctx_rng(nb_ctx *ctx) { return &ctx->rng; }

void nb_rng_seed(nb_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t nb_rng_next(nb_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double nb_rng_uniform(nb_rng *r) { return (double)(nb_rng_next(r) >> 11) * 0x1.0p-53; }

double nb_rng_normal(nb_rng *r) {
    double u1 = nb_rng_uniform(r), u2 = nb_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void nb_ctx_interrupt(nb_ctx *ctx) { ctx->interrupted = 1; }
int nb_ctx_interrupted(const nb_ctx *ctx) { return ctx->interrupted != 0; }
void nb_ctx_clear_interrupt(nb_ctx *ctx) { ctx->interrupted = 0; }

/* The mpi communicator backend (OpenMPI): each context duplicates MPI_COMM_WORLD, so two contexts'
 * collectives never match each other's. MPI is initialized once per process (the one process-wide
 * state here, as MPI itself is) by the first context that asks, and finalized at exit. Every
 * collective is a non-blocking request polled until it completes or the context's timeout passes:
 * MPI has no timed collective, and a rank that failed before a collective must not leave the others
 * waiting for ever. A timed-out request cannot be cancelled: the communicator is then marked broken
 * (its collectives refuse) and keeps the request; if it has still not completed when the context is
 * released, the process aborts the job at exit (MPI_Finalize would wait for it for ever). */
#include "comm/comm_internal.h"

#ifndef NIBBLE_HAVE_MPI

int nb_comm_mpi_built(void) { return 0; }
nb_status nbc_mpi_init(nb_ctx *ctx, nb_comm *c) {
    (void)c;
    return nb_fail(ctx, NB_ERR_UNSUPPORTED, "comm: the mpi backend is absent from this build");
}
void nbc_mpi_free(nb_comm *c) { (void)c; }
nb_status nbc_mpi_allreduce(nb_ctx *ctx, nb_comm *c, void *buf, int64_t count, nb_dtype dt, nb_comm_op op) {
    (void)c, (void)buf, (void)count, (void)dt, (void)op;
    return nbc_mpi_init(ctx, NULL);
}
nb_status nbc_mpi_allgather(nb_ctx *ctx, nb_comm *c, const void *send, void *recv, int64_t bytes) {
    (void)c, (void)send, (void)recv, (void)bytes;
    return nbc_mpi_init(ctx, NULL);
}
nb_status nbc_mpi_broadcast(nb_ctx *ctx, nb_comm *c, void *buf, int64_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
    return nbc_mpi_init(ctx, NULL);
}
nb_status nbc_mpi_barrier(nb_ctx *ctx, nb_comm *c) { (void)c; return nbc_mpi_init(ctx, NULL); }

#else

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>

int nb_comm_mpi_built(void) { return 1; }

static pthread_mutex_t g_mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_mpi_ours;            /* this library called MPI_Init (so it finalizes) */
static int g_mpi_stuck;           /* released communicators with a request that never completed */

static void mpi_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    if (__atomic_load_n(&g_mpi_stuck, __ATOMIC_ACQUIRE)) MPI_Abort(MPI_COMM_WORLD, 1);
    else MPI_Finalize();
}

static nb_status mpi_fail(nb_ctx *ctx, nb_comm *c, int err, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = 0;
    if (c) c->broken = 1;
    return nb_fail(ctx, NB_ERR_COMM, "comm: %s failed on rank %d: %s", what, c ? c->rank : 0,
                   len ? msg : "MPI error");
}

nb_status nbc_mpi_init(nb_ctx *ctx, nb_comm *c) {
    int inited = 0, fin = 0, e = MPI_SUCCESS;
    pthread_mutex_lock(&g_mpi_mu);
    MPI_Finalized(&fin);
    if (!fin) MPI_Initialized(&inited);
    if (!fin && !inited) {
        int provided = 0;
        e = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (e == MPI_SUCCESS) {
            g_mpi_ours = 1;
            atexit(mpi_at_exit);
        }
    }
    pthread_mutex_unlock(&g_mpi_mu);
    if (fin) return nb_fail(ctx, NB_ERR_COMM, "comm: MPI was already finalized in this process");
    if (e != MPI_SUCCESS) return mpi_fail(ctx, NULL, e, "MPI_Init");
    MPI_Comm *h = malloc(sizeof *h);
    if (!h) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    if ((e = MPI_Comm_dup(MPI_COMM_WORLD, h)) != MPI_SUCCESS) {
        free(h);
        return mpi_fail(ctx, NULL, e, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(*h, MPI_ERRORS_RETURN);
    MPI_Comm_rank(*h, &c->rank);
    MPI_Comm_size(*h, &c->size);
    c->handle = h;
    c->mpi = 1;
    return NB_OK;
}

void nbc_mpi_free(nb_comm *c) {
    MPI_Comm *h = c->handle;
    int fin = 0, done = 1;
    MPI_Finalized(&fin);
    if (c->pending && !fin && MPI_Test(c->pending, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
    /* a communicator with a request still pending (a timed-out collective) is left to the abort */
    if (!done) __atomic_add_fetch(&g_mpi_stuck, 1, __ATOMIC_RELEASE);
    else if (h && !fin) MPI_Comm_free(h);
    free(c->pending);
    free(h);
    c->handle = c->pending = NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Poll the request until it completes or the timeout passes. Spins first (collectives of a few bytes
 * complete within microseconds), then sleeps up to 1 ms a poll so that a waiting rank leaves its core
 * to the ranks still computing. */
static nb_status wait_for(nb_ctx *ctx, nb_comm *c, MPI_Request *r, const char *what) {
    double t0 = now_s();
    long sleep_ns = 0;
    for (int polls = 0;; polls++) {
        int done = 0;
        int e = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) return mpi_fail(ctx, c, e, what);
        if (done) return NB_OK;
        if (now_s() - t0 > c->timeout_s) {
            c->broken = 1;
            if ((c->pending = malloc(sizeof *r))) memcpy(c->pending, r, sizeof *r);
            else __atomic_add_fetch(&g_mpi_stuck, 1, __ATOMIC_RELEASE);   /* lost: abort at exit */
            return nb_fail(ctx, NB_ERR_COMM, "comm: %s timed out on rank %d of %d after %g s (another rank failed, "
                           "died or never reached it)", what, c->rank, c->size, c->timeout_s);
        }
        if (polls > 1000) {
            sleep_ns = sleep_ns ? (sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2) : 1000;
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
}

static nb_status too_big(nb_ctx *ctx, const char *what, int64_t n) {
    return nb_fail(ctx, NB_ERR_INVALID, "comm: %s of %lld elements (at most %d a call)", what, (long long)n, INT_MAX);
}

nb_status nbc_mpi_allreduce(nb_ctx *ctx, nb_comm *c, void *buf, int64_t count, nb_dtype dt, nb_comm_op op) {
    if (count > INT_MAX) return too_big(ctx, "all-reduce", count);
    MPI_Datatype t = dt == NB_F32 ? MPI_FLOAT : dt == NB_F64 ? MPI_DOUBLE : MPI_INT64_T;
    MPI_Request r;
    int e = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, t, op == NB_COMM_MAX ? MPI_MAX : MPI_SUM,
                           *(MPI_Comm *)c->handle, &r);
    if (e != MPI_SUCCESS) return mpi_fail(ctx, c, e, "all-reduce");
    return wait_for(ctx, c, &r, "all-reduce");
}

nb_status nbc_mpi_allgather(nb_ctx *ctx, nb_comm *c, const void *send, void *recv, int64_t bytes) {
    if (bytes > INT_MAX) return too_big(ctx, "all-gather", bytes);
    MPI_Request r;
    int e = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, *(MPI_Comm *)c->handle, &r);
    if (e != MPI_SUCCESS) return mpi_fail(ctx, c, e, "all-gather");
    return wait_for(ctx, c, &r, "all-gather");
}

nb_status nbc_mpi_broadcast(nb_ctx *ctx, nb_comm *c, void *buf, int64_t bytes, int root) {
    if (bytes > INT_MAX) return too_big(ctx, "broadcast", bytes);
    MPI_Request r;
    int e = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, *(MPI_Comm *)c->handle, &r);
    if (e != MPI_SUCCESS) return mpi_fail(ctx, c, e, "broadcast");
    return wait_for(ctx, c, &r, "broadcast");
}

nb_status nbc_mpi_barrier(nb_ctx *ctx, nb_comm *c) {
    MPI_Request r;
    int e = MPI_Ibarrier(*(MPI_Comm *)c->handle, &r);
    if (e != MPI_SUCCESS) return mpi_fail(ctx, c, e, "barrier");
    return wait_for(ctx, c, &r, "barrier");
}

#endif

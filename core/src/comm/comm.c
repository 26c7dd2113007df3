/* nb_comm: argument checks, the self backend (one rank: every collective is the identity) and the
 * dispatch to the mpi backend (comm/mpi.c). */
#include <string.h>

#include "comm/comm_internal.h"

int nb_comm_rank(const nb_ctx *ctx) { nb_comm *c = nbc_comm_of(ctx); return c ? c->rank : 0; }
int nb_comm_size(const nb_ctx *ctx) { nb_comm *c = nbc_comm_of(ctx); return c && c->size > 0 ? c->size : 1; }
const char *nb_comm_backend(const nb_ctx *ctx) { nb_comm *c = nbc_comm_of(ctx); return c && c->mpi ? "mpi" : "self"; }

nb_status nbc_comm_init(nb_ctx *ctx, nb_comm *c, const char *backend, const char *origin, int launched,
                        double timeout_s) {
    memset(c, 0, sizeof *c);
    c->size = 1;
    c->timeout_s = timeout_s;
    int want_mpi;
    if (!backend || !*backend || !strcmp(backend, "auto")) want_mpi = launched;
    else if (!strcmp(backend, "self")) want_mpi = 0;
    else if (!strcmp(backend, "mpi")) want_mpi = 1;
    else return nb_fail(ctx, NB_ERR_INVALID, "%s '%.60s': expected auto, self or mpi", origin, backend);
    if (!want_mpi) return NB_OK;
    if (!nb_comm_mpi_built())
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: the mpi communicator is absent from this build (MPI was not "
                       "found when it was configured: install openmpi-bin and libopenmpi-dev, then reconfigure)",
                       launched ? "launched by mpirun" : origin);
    return nbc_mpi_init(ctx, c);
}

void nbc_comm_free(nb_comm *c) {
    if (c->mpi) nbc_mpi_free(c);
    c->mpi = 0;
}

static nb_status usable(nb_ctx *ctx, const char *what) {
    if (!ctx) return NB_ERR_INVALID;
    if (nbc_comm_of(ctx)->broken)
        return nb_fail(ctx, NB_ERR_COMM, "comm: %s after an earlier collective failed on rank %d (the ranks no "
                       "longer agree on what comes next)", what, nb_comm_rank(ctx));
    return NB_OK;
}

nb_status nb_comm_allreduce(nb_ctx *ctx, void *buf, int64_t count, nb_dtype dtype, nb_comm_op op) {
    nb_status s = usable(ctx, "all-reduce");
    if (s) return s;
    if (dtype != NB_F32 && dtype != NB_F64 && dtype != NB_I64)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "comm: all-reduce of %s (f32, f64 and i64 only)",
                       nb_dtype_info(dtype) ? nb_dtype_info(dtype)->name : "an unknown dtype");
    if (op != NB_COMM_SUM && op != NB_COMM_MAX) return nb_fail(ctx, NB_ERR_INVALID, "comm: all-reduce op %d", (int)op);
    if (count < 0 || (count > 0 && !buf)) return nb_fail(ctx, NB_ERR_INVALID, "comm: all-reduce of %lld elements at %p",
                                                         (long long)count, buf);
    nb_comm *c = nbc_comm_of(ctx);
    return c->mpi && count > 0 ? nbc_mpi_allreduce(ctx, c, buf, count, dtype, op) : NB_OK;
}

nb_status nb_comm_allgather(nb_ctx *ctx, const void *send, void *recv, int64_t bytes) {
    nb_status s = usable(ctx, "all-gather");
    if (s) return s;
    if (bytes < 0 || (bytes > 0 && (!send || !recv)))
        return nb_fail(ctx, NB_ERR_INVALID, "comm: all-gather of %lld bytes per rank from %p into %p", (long long)bytes,
                       send, recv);
    nb_comm *c = nbc_comm_of(ctx);
    if (c->mpi) return nbc_mpi_allgather(ctx, c, send, recv, bytes);
    if (bytes > 0 && recv != send) memmove(recv, send, (size_t)bytes);
    return NB_OK;
}

nb_status nb_comm_broadcast(nb_ctx *ctx, void *buf, int64_t bytes, int root) {
    nb_status s = usable(ctx, "broadcast");
    if (s) return s;
    if (root < 0 || root >= nb_comm_size(ctx))
        return nb_fail(ctx, NB_ERR_INVALID, "comm: broadcast from rank %d of %d", root, nb_comm_size(ctx));
    if (bytes < 0 || (bytes > 0 && !buf))
        return nb_fail(ctx, NB_ERR_INVALID, "comm: broadcast of %lld bytes at %p", (long long)bytes, buf);
    nb_comm *c = nbc_comm_of(ctx);
    return c->mpi ? nbc_mpi_broadcast(ctx, c, buf, bytes, root) : NB_OK;
}

nb_status nb_comm_barrier(nb_ctx *ctx) {
    nb_status s = usable(ctx, "barrier");
    if (s) return s;
    nb_comm *c = nbc_comm_of(ctx);
    return c->mpi ? nbc_mpi_barrier(ctx, c) : NB_OK;
}

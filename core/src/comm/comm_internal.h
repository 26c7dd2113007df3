/* The communicator inside every nb_ctx (nibble/comm.h): its state, and the mpi backend's entry points
 * (comm/mpi.c; without MPI in the build they fail with NB_ERR_UNSUPPORTED). ctx.c chooses the backend
 * from the options and the environment and calls nbc_comm_init; comm.c dispatches the collectives. */
#ifndef NIBBLE_COMM_INTERNAL_H
#define NIBBLE_COMM_INTERNAL_H

#include "nibble/comm.h"

typedef struct nb_comm {
    int rank, size;
    int mpi;            /* 1: the mpi backend */
    int broken;         /* a collective timed out or failed: the ranks no longer agree on what comes next */
    void *handle;       /* mpi: a heap MPI_Comm, this context's duplicate of MPI_COMM_WORLD */
    void *pending;      /* mpi: the heap MPI_Request of a collective that timed out (it cannot be cancelled) */
    double timeout_s;   /* the longest a collective waits */
} nb_comm;

/* ctx's communicator (NULL for a NULL ctx). */
nb_comm *nbc_comm_of(const nb_ctx *ctx);
/* Set up c: backend "auto" / NULL (mpi when `launched`, i.e. mpirun's variables are set), "self" or
 * "mpi"; `origin` names where the name came from for the error message ("comm option", "NIBBLE_COMM"). */
nb_status nbc_comm_init(nb_ctx *ctx, nb_comm *c, const char *backend, const char *origin, int launched,
                        double timeout_s);
void nbc_comm_free(nb_comm *c);

/* comm/mpi.c */
nb_status nbc_mpi_init(nb_ctx *ctx, nb_comm *c);
void nbc_mpi_free(nb_comm *c);
nb_status nbc_mpi_allreduce(nb_ctx *ctx, nb_comm *c, void *buf, int64_t count, nb_dtype dt, nb_comm_op op);
nb_status nbc_mpi_allgather(nb_ctx *ctx, nb_comm *c, const void *send, void *recv, int64_t bytes);
nb_status nbc_mpi_broadcast(nb_ctx *ctx, nb_comm *c, void *buf, int64_t bytes, int root);
nb_status nbc_mpi_barrier(nb_ctx *ctx, nb_comm *c);

#endif

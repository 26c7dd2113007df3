/* nb_comm: the communicator every context carries (rank, size and collectives over host buffers), so
 * that one program runs as N ranks under mpirun. Backends: "self" (one rank: every collective is the
 * identity) and "mpi" (OpenMPI; present when the build found MPI). The backend is chosen at
 * nb_ctx_new_opts (nb_ctx_options.comm): "mpi" when the process was launched by mpirun (its
 * OMPI_COMM_WORLD_RANK or PMI_RANK / PMIX_RANK variables) or asked for, else "self". Collectives on
 * the mpi backend are non-blocking requests polled against the context's timeout, so a rank that
 * died or never arrives gives NB_ERR_COMM with a message rather than a hang. */
#ifndef NIBBLE_COMM_H
#define NIBBLE_COMM_H

#include <stdint.h>
#include "nibble/status.h"
#include "nibble/ctx.h"
#include "nibble/dtype.h"

typedef enum nb_comm_op {
    NB_COMM_SUM = 0,
    NB_COMM_MAX = 1
} nb_comm_op;

/* This process's rank (0 ... size-1) and the number of ranks; 0 and 1 on the self backend. */
NB_API int nb_comm_rank(const nb_ctx *ctx);
NB_API int nb_comm_size(const nb_ctx *ctx);
/* "self" or "mpi". */
NB_API const char *nb_comm_backend(const nb_ctx *ctx);
/* Whether this build can run the mpi backend (it found MPI at configure time). */
NB_API int nb_comm_mpi_built(void);

/* In place over `count` elements of dtype NB_F32, NB_F64 or NB_I64 (NB_ERR_UNSUPPORTED for another
 * dtype): every rank ends with the element-wise sum or maximum over the ranks. */
NB_API nb_status nb_comm_allreduce(nb_ctx *ctx, void *buf, int64_t count, nb_dtype dtype, nb_comm_op op);
/* recv[r * bytes ... (r+1) * bytes) = rank r's send (bytes each); recv holds size * bytes. */
NB_API nb_status nb_comm_allgather(nb_ctx *ctx, const void *send, void *recv, int64_t bytes);
/* buf (bytes) of rank `root` copied to every rank. */
NB_API nb_status nb_comm_broadcast(nb_ctx *ctx, void *buf, int64_t bytes, int root);
NB_API nb_status nb_comm_barrier(nb_ctx *ctx);

#endif

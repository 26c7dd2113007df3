/* The communicator of a context (nibble/comm.h). Run plainly it checks the self backend (one rank:
 * collectives are the identity, argument errors named); run under mpirun with the expected rank count
 * as argv[1] (tests/CMakeLists.txt registers -n 2 and -n 3) it checks that the context chose the mpi
 * backend and that all-reduce (sum, max on f32/f64/i64), all-gather, broadcast and barrier give the
 * exact values, and that a collective one rank waits for alone times out with NB_ERR_COMM naming the
 * rank instead of hanging. */
#define _POSIX_C_SOURCE 200809L   /* nanosleep */
#include <time.h>

#include "nbtest.h"

static void self_backend(void) {
    nb_ctx_options o;
    nb_ctx_options_init(&o);
    o.threads = 1;
    o.comm = "self";
    nb_ctx *ctx = NULL;
    CHECK_OK(NULL, nb_ctx_new_opts(&o, &ctx));
    if (!ctx) return;
    CHECK_EQ_INT(nb_comm_rank(ctx), 0);
    CHECK_EQ_INT(nb_comm_size(ctx), 1);
    CHECK(!strcmp(nb_comm_backend(ctx), "self"));
    double d[3] = {1.5, -2.0, 7.0};
    CHECK_OK(ctx, nb_comm_allreduce(ctx, d, 3, NB_F64, NB_COMM_SUM));
    CHECK(d[0] == 1.5 && d[1] == -2.0 && d[2] == 7.0);
    int32_t send[2] = {5, 6}, recv[2] = {0, 0};
    CHECK_OK(ctx, nb_comm_allgather(ctx, send, recv, sizeof send));
    CHECK(recv[0] == 5 && recv[1] == 6);
    CHECK_OK(ctx, nb_comm_broadcast(ctx, send, sizeof send, 0));
    CHECK_OK(ctx, nb_comm_barrier(ctx));
    CHECK_FAIL(ctx, nb_comm_broadcast(ctx, send, sizeof send, 1), NB_ERR_INVALID, "comm: broadcast from rank 1 of 1");
    CHECK_FAIL(ctx, nb_comm_allreduce(ctx, send, 2, NB_I32, NB_COMM_SUM), NB_ERR_UNSUPPORTED,
               "comm: all-reduce of i32 (f32, f64 and i64 only)");
    nb_ctx_release(ctx);
    o.comm = "nccl";
    CHECK_FAIL(NULL, nb_ctx_new_opts(&o, &ctx), NB_ERR_INVALID, "comm option 'nccl': expected auto, self or mpi");
    CHECK(ctx == NULL);
}

static void mpi_backend(int expect) {
    nb_ctx *ctx = NULL;
    CHECK_OK(NULL, nb_ctx_new(1, &ctx));   /* auto: launched by mpirun */
    if (!ctx) return;
    int r = nb_comm_rank(ctx), n = nb_comm_size(ctx);
    CHECK(!strcmp(nb_comm_backend(ctx), "mpi"));
    CHECK_EQ_INT(n, expect);
    CHECK(r >= 0 && r < n);
    /* sums of small integers and halves are exact in f32 whatever the reduction order */
    float f[2] = {(float)r + 0.5f, -(float)r};
    CHECK_OK(ctx, nb_comm_allreduce(ctx, f, 2, NB_F32, NB_COMM_SUM));
    CHECK(f[0] == (float)(n * (n - 1) / 2) + 0.5f * (float)n && f[1] == -(float)(n * (n - 1) / 2));
    double d[2] = {(double)r * 0.25, -(double)r};
    CHECK_OK(ctx, nb_comm_allreduce(ctx, d, 2, NB_F64, NB_COMM_MAX));
    CHECK(d[0] == (double)(n - 1) * 0.25 && d[1] == 0.0);
    int64_t big[2] = {((int64_t)1 << 40) + r, r};   /* i64 sums are exact at any magnitude */
    CHECK_OK(ctx, nb_comm_allreduce(ctx, big, 2, NB_I64, NB_COMM_SUM));
    CHECK(big[0] == ((int64_t)n << 40) + n * (n - 1) / 2 && big[1] == n * (n - 1) / 2);
    int64_t mx = 100 - r;
    CHECK_OK(ctx, nb_comm_allreduce(ctx, &mx, 1, NB_I64, NB_COMM_MAX));
    CHECK_EQ_INT(mx, 100);
    int32_t mine[2] = {r, 10 * r}, all[16];
    CHECK_OK(ctx, nb_comm_allgather(ctx, mine, all, sizeof mine));
    for (int k = 0; k < n; k++) CHECK(all[2 * k] == k && all[2 * k + 1] == 10 * k);
    char msg[32];
    snprintf(msg, sizeof msg, "from rank %d", r);
    CHECK_OK(ctx, nb_comm_broadcast(ctx, msg, sizeof msg, n - 1));
    char want[32];
    snprintf(want, sizeof want, "from rank %d", n - 1);
    CHECK(!strcmp(msg, want));
    CHECK_OK(ctx, nb_comm_barrier(ctx));
    CHECK_FAIL(ctx, nb_comm_broadcast(ctx, msg, 1, n), NB_ERR_INVALID, "comm: broadcast from rank");

    /* a second context has a communicator of its own, here with a 0.3 s timeout: rank 0 reaches a
     * barrier 1.5 s before the others, so its wait times out with a named error (and its collectives
     * then refuse); the others arrive later and complete it, so the job still ends cleanly */
    nb_ctx_options o;
    nb_ctx_options_init(&o);
    o.threads = 1;
    o.comm_timeout_s = 0.3;
    nb_ctx *late = NULL;
    CHECK_OK(NULL, nb_ctx_new_opts(&o, &late));
    if (late) {
        if (r == 0) {
            char need[96];
            snprintf(need, sizeof need, "comm: barrier timed out on rank 0 of %d after 0.3 s", n);
            CHECK_FAIL(late, nb_comm_barrier(late), NB_ERR_COMM, need);
            CHECK_FAIL(late, nb_comm_barrier(late), NB_ERR_COMM, "after an earlier collective failed on rank 0");
        } else {
            struct timespec ts = {1, 500000000};
            nanosleep(&ts, NULL);
            CHECK_OK(late, nb_comm_barrier(late));
        }
        CHECK_OK(ctx, nb_comm_barrier(ctx));   /* the first context is unaffected */
        nb_ctx_release(late);
    }
    nb_ctx_release(ctx);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        if (!nb_comm_mpi_built()) {
            printf("SKIP: this build has no MPI (install openmpi-bin libopenmpi-dev and reconfigure)\n");
            return 77;
        }
        mpi_backend(atoi(argv[1]));
    } else {
        self_backend();
    }
    return nbt_done("test_comm");
}

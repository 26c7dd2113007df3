/* Context, buffers and tensor views: memory accounting, refcounts, views/slices/transposes,
 * conversions, packed (E2M1) offsets, mmap buffers, the thread pool and the RNG. */
#include "nbtest.h"
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static void test_ctx(nb_ctx *ctx) {
    CHECK(nb_ctx_threads(ctx) >= 1);
    CHECK_EQ_INT(nb_fail(ctx, NB_ERR_SHAPE, "dim %d bad", 3), NB_ERR_SHAPE);
    CHECK(strcmp(nb_ctx_last_error(ctx), "dim 3 bad") == 0);
    CHECK_EQ_INT(nb_ctx_last_status(ctx), NB_ERR_SHAPE);
    nb_ctx_clear_error(ctx);
    CHECK(strcmp(nb_ctx_last_error(ctx), "") == 0);
    CHECK(strcmp(nb_status_name(NB_ERR_UNCALIBRATED), "NB_ERR_UNCALIBRATED") == 0);
    nb_rng a, b;
    nb_rng_seed(&a, 7);
    nb_rng_seed(&b, 7);
    for (int i = 0; i < 10; i++) CHECK(nb_rng_next(&a) == nb_rng_next(&b));
    nb_rng_seed(&a, 0);   /* xoshiro256** reference: splitmix64(0) seeding, first output */
    uint64_t first = nb_rng_next(&a);
    nb_rng_seed(&b, 1);
    CHECK(first != nb_rng_next(&b));
    double sum = 0, sq = 0;
    for (int i = 0; i < 100000; i++) { double z = nb_rng_normal(&a); sum += z; sq += z * z; }
    CHECK_NEAR(sum / 100000, 0.0, 0.02);
    CHECK_NEAR(sq / 100000, 1.0, 0.02);
    CHECK(!nb_ctx_interrupted(ctx));
    nb_ctx_interrupt(ctx);
    CHECK(nb_ctx_interrupted(ctx));
    nb_ctx_clear_interrupt(ctx);
    CHECK(!nb_ctx_interrupted(ctx));
}

typedef struct { int64_t *out; } fill_arg;
static void fill_fn(void *varg, int64_t b, int64_t e) {
    fill_arg *a = varg;
    for (int64_t i = b; i < e; i++) a->out[i] += i * 3;
}

static void test_parallel(nb_ctx *ctx) {
    enum { N = 100003 };
    int64_t *v = calloc(N, sizeof *v);
    fill_arg a = {v};
    for (int rep = 0; rep < 50; rep++) nb_parallel_for(ctx, N, 1000, fill_fn, &a);
    int bad = 0;
    for (int64_t i = 0; i < N; i++) if (v[i] != 50 * i * 3) bad++;
    CHECK_EQ_INT(bad, 0);
    nb_parallel_for(ctx, 0, 1, fill_fn, &a);   /* empty range is a no-op */
    free(v);
}

/* Each chunk records whether its thread blocks SIGINT (pool workers must; the caller runs a chunk
 * too and keeps its own mask). */
typedef struct { int chunks, blocked; pthread_mutex_t mu; } mask_arg;
static void mask_fn(void *varg, int64_t b, int64_t e) {
    (void)b; (void)e;
    mask_arg *a = varg;
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    struct timespec ts = {0, 20 * 1000 * 1000};   /* let every worker take a chunk */
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&a->mu);
    a->chunks++;
    a->blocked += sigismember(&cur, SIGINT) == 1 && sigismember(&cur, SIGSEGV) == 0;
    pthread_mutex_unlock(&a->mu);
}

static void test_worker_signals(void) {
    nb_ctx *c4 = NULL;
    CHECK_EQ_INT(nb_ctx_new(4, &c4), NB_OK);
    mask_arg a = {0, 0, PTHREAD_MUTEX_INITIALIZER};
    nb_parallel_for(c4, 4, 1, mask_fn, &a);
    CHECK_EQ_INT(a.chunks, 4);
    CHECK_EQ_INT(a.blocked, 3);   /* three workers; the calling thread's mask is untouched */
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    CHECK(!sigismember(&cur, SIGINT));
    nb_ctx_release(c4);
}

static void test_tensors(nb_ctx *ctx) {
    nb_mem_stats m0, m1;
    nb_ctx_mem(ctx, &m0);
    nb_tensor *t = NULL, *v = NULL, *s = NULL, *tr = NULL, *c = NULL, *bf = NULL;
    int64_t shape[2] = {3, 4};
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, shape, &t));
    nb_ctx_mem(ctx, &m1);
    CHECK_EQ_INT(m1.live_bytes - m0.live_bytes, 48);
    CHECK_EQ_INT(nb_tensor_numel(t), 12);
    CHECK_EQ_INT(t->strides[0], 16);
    CHECK_EQ_INT(t->strides[1], 4);
    float *d = nb_tensor_data(t);
    for (int i = 0; i < 12; i++) d[i] = (float)i;
    int64_t idx[2] = {2, 1};
    CHECK(nb_tensor_get(t, idx) == 9.0);
    CHECK_OK(ctx, nb_tensor_set(ctx, t, idx, 90.5));
    CHECK(d[9] == 90.5f);
    int64_t bad[2] = {3, 0};
    CHECK(isnan(nb_tensor_get(t, bad)));
    CHECK_FAIL(ctx, nb_tensor_set(ctx, t, bad, 1), NB_ERR_INVALID, "out of range");

    int64_t vs[2] = {-1, 6};
    CHECK_OK(ctx, nb_tensor_view(ctx, t, 2, vs, &v));
    CHECK_EQ_INT(v->shape[0], 2);
    CHECK_EQ_INT(v->shape[1], 6);
    int64_t vbad[1] = {5};
    nb_tensor *nope = NULL;
    CHECK_FAIL(ctx, nb_tensor_view(ctx, t, 1, vbad, &nope), NB_ERR_SHAPE, "12 elements");
    CHECK(nope == NULL);

    CHECK_OK(ctx, nb_tensor_slice(ctx, t, 1, 1, 2, &s));
    CHECK(!nb_tensor_is_contiguous(s));
    int64_t i01[2] = {1, 0};
    CHECK(nb_tensor_get(s, i01) == 5.0);
    CHECK_FAIL(ctx, nb_tensor_slice(ctx, t, 1, 3, 2, &nope), NB_ERR_INVALID, "out of range");

    CHECK_OK(ctx, nb_tensor_transpose(ctx, t, 0, 1, &tr));
    CHECK_EQ_INT(tr->shape[0], 4);
    int64_t i30[2] = {3, 0};
    CHECK(nb_tensor_get(tr, i30) == 3.0);
    CHECK_OK(ctx, nb_tensor_contiguous(ctx, tr, &c));
    CHECK(nb_tensor_is_contiguous(c));
    float *cd = nb_tensor_data(c);
    CHECK(cd[0] == 0 && cd[1] == 4 && cd[2] == 8 && cd[3] == 1);
    CHECK_OK(ctx, nb_tensor_to(ctx, s, NB_BF16, &bf));
    CHECK_EQ_INT(bf->dtype, NB_BF16);
    uint16_t *bd = nb_tensor_data(bf);
    CHECK_EQ_INT(bd[0], nb_f32_to_bf16(1.0f));
    CHECK_EQ_INT(bd[3], nb_f32_to_bf16(6.0f));

    /* views keep the buffer alive after the original is released */
    nb_tensor_release(t);
    CHECK(((float *)nb_tensor_data(v))[9] == 90.5f);
    nb_tensor_release(v);
    nb_tensor_release(s);
    nb_tensor_release(tr);
    nb_tensor_release(c);
    nb_tensor_release(bf);
    nb_ctx_mem(ctx, &m1);
    CHECK_EQ_INT(m1.live_bytes, m0.live_bytes);
}

static void test_packed(nb_ctx *ctx) {
    nb_tensor *p = NULL, *row = NULL, *f = NULL, *nope = NULL;
    int64_t shape[2] = {100, 100};
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_E2M1, 2, shape, &p));
    CHECK_EQ_INT(nb_tensor_numel(p), 10000);     /* logical elements */
    CHECK_EQ_INT(nb_tensor_nbytes(p), 5000);     /* packed bytes */
    CHECK_EQ_INT(p->strides[0], 50);
    CHECK_EQ_INT(p->strides[1], 0);
    CHECK_EQ_INT(nb_tensor_packed_offset(p, 0), 0);
    CHECK_EQ_INT(nb_tensor_packed_offset(p, 1), 0);
    CHECK_EQ_INT(nb_tensor_packed_offset(p, 2), 1);
    CHECK_EQ_INT(nb_tensor_packed_offset(p, 9999), 4999);
    int64_t ix[2] = {1, 3};
    CHECK_OK(ctx, nb_tensor_set(ctx, p, ix, -3.0));
    CHECK(nb_tensor_get(p, ix) == -3.0);
    CHECK_EQ_INT(((uint8_t *)nb_tensor_data(p))[51], 0xD0);   /* element 103: odd -> high nibble, code 0xD */
    CHECK_OK(ctx, nb_tensor_slice(ctx, p, 0, 1, 1, &row));
    CHECK_EQ_INT(row->offset, 50);
    CHECK_FAIL(ctx, nb_tensor_slice(ctx, p, 1, 1, 2, &nope), NB_ERR_SHAPE, "even");
    CHECK_OK(ctx, nb_tensor_to(ctx, row, NB_F32, &f));
    CHECK(((float *)nb_tensor_data(f))[3] == -3.0f);
    int64_t odd[1] = {3};
    CHECK_FAIL(ctx, nb_tensor_new(ctx, NB_E2M1, 1, odd, &nope), NB_ERR_SHAPE, "even last dimension");
    CHECK_EQ_INT(nb_tensor_packed_offset(f, 3), 12);
    nb_tensor_release(p);
    nb_tensor_release(row);
    nb_tensor_release(f);
}

static void test_mmap(nb_ctx *ctx) {
    char path[] = "/tmp/nb_test_mmap_XXXXXX";
    int fd = mkstemp(path);
    float vals[4] = {1, 2, 3, 4};
    CHECK(write(fd, "hdr!", 4) == 4);
    CHECK(write(fd, vals, sizeof vals) == sizeof vals);
    close(fd);
    nb_buffer *b = NULL;
    CHECK_OK(ctx, nb_buffer_mmap(ctx, path, &b));
    CHECK_EQ_INT(nb_buffer_size(b), 20);
    CHECK_EQ_INT(nb_buffer_kind_of(b), NB_BUF_MMAP);
    nb_tensor *t = NULL;
    int64_t sh[1] = {4};
    CHECK_OK(ctx, nb_tensor_wrap(ctx, b, NB_F32, 1, sh, 4, &t));
    int64_t i2[1] = {2};
    CHECK(nb_tensor_get(t, i2) == 3.0);
    CHECK_FAIL(ctx, nb_tensor_set(ctx, t, i2, 1.0), NB_ERR_INVALID, "read-only");
    nb_tensor *nope = NULL;
    int64_t big[1] = {5};
    CHECK_FAIL(ctx, nb_tensor_wrap(ctx, b, NB_F32, 1, big, 4, &nope), NB_ERR_INVALID, "does not fit");
    nb_buffer_release(b);           /* the tensor keeps the mapping alive */
    CHECK(nb_tensor_get(t, i2) == 3.0);
    nb_tensor_release(t);
    unlink(path);
    CHECK_FAIL(ctx, nb_buffer_mmap(ctx, "/nonexistent/file", &b), NB_ERR_IO, "/nonexistent/file");
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx) != NB_OK) return 1;
    test_ctx(ctx);
    test_parallel(ctx);
    test_worker_signals();
    test_tensors(ctx);
    test_packed(ctx);
    test_mmap(ctx);
    nb_ctx_release(ctx);
    return nbt_done("test_tensor");
}

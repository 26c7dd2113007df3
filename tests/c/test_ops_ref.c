/* The float64 scalar reference ops (nb_ref_*) against central finite differences: for each op,
 * L = sum(out * R) with a random R, and every analytic input/weight gradient must match
 * (L(x+h) - L(x-h)) / 2h. Also a few exact forward values worked by hand. */
#include <stdlib.h>

#include "nbtest.h"

static nb_rng rng;
static double rnd(void) { return 2.0 * nb_rng_uniform(&rng) - 1.0; }
static double *rvec(int64_t n) {
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = rnd();
    return v;
}
static double *zvec(int64_t n) { return calloc((size_t)n, sizeof(double)); }
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Compare grad g[0..n) of input x against finite differences of f (a closure via a callback). */
typedef double (*loss_fn)(void *ctx);
static double max_fd_err(double *x, const double *g, int64_t n, loss_fn f, void *c, double *scale_out) {
    const double h = 1e-6;
    double err = 0, scale = 1e-3;
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = f(c);
        x[i] = x0 - h;
        double lm = f(c);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - g[i]) > err) err = fabs(fd - g[i]);
        if (fabs(fd) > scale) scale = fabs(fd);
    }
    if (scale_out) *scale_out = scale;
    return err;
}
#define CHECK_GRAD(x, g, n, f, c) do { double _sc; double _e = max_fd_err((x), (g), (n), (f), (c), &_sc); \
    CHECK_MSG(_e <= 1e-7 * _sc + 1e-9, "%s: max |fd - analytic| = %.3g (scale %.3g)", #g, _e, _sc); } while (0)

/* ---- rmsnorm ---- */
typedef struct { double *x, *w, *R; int64_t n, d; } rms_c;
static double rms_loss(void *p) {
    rms_c *c = p;
    double *y = zvec(c->n * c->d);
    nb_ref_rmsnorm_fwd(c->x, c->w, y, c->n, c->d, 1e-5);
    double l = dot(y, c->R, c->n * c->d);
    free(y);
    return l;
}
static void test_rmsnorm(void) {
    rms_c c = {rvec(3 * 7), rvec(7), rvec(3 * 7), 3, 7};
    double *dx = zvec(21), *dw = zvec(7);
    nb_ref_rmsnorm_bwd(c.x, c.w, c.R, dx, dw, 3, 7, 1e-5);
    CHECK_GRAD(c.x, dx, 21, rms_loss, &c);
    CHECK_GRAD(c.w, dw, 7, rms_loss, &c);
    /* exact value: x = (3, 4), w = 1: rms = sqrt(12.5) */
    double x[2] = {3, 4}, w[2] = {1, 2}, y[2];
    nb_ref_rmsnorm_fwd(x, w, y, 1, 2, 0.0);
    CHECK_NEAR(y[0], 3 / sqrt(12.5), 1e-15);
    CHECK_NEAR(y[1], 8 / sqrt(12.5), 1e-15);
    free(c.x); free(c.w); free(c.R); free(dx); free(dw);
}

/* ---- rope ---- */
typedef struct { double *x, *R, *inv; int64_t n, T, pos0, nh, hd; } rope_c;
static double rope_loss(void *p) {
    rope_c *c = p;
    int64_t m = c->n * c->nh * c->hd;
    double *y = malloc(sizeof(double) * (size_t)m);
    memcpy(y, c->x, sizeof(double) * (size_t)m);
    nb_ref_rope_fwd(y, c->n, c->T, c->pos0, c->nh, c->hd, c->inv);
    double l = dot(y, c->R, m);
    free(y);
    return l;
}
static void test_rope(void) {
    double inv[3] = {1.0, 0.1, 0.01};
    rope_c c = {rvec(4 * 2 * 6), rvec(4 * 2 * 6), inv, 4, 2, 5, 2, 6};
    double *g = malloc(sizeof(double) * 48);
    memcpy(g, c.R, sizeof(double) * 48);
    nb_ref_rope_bwd(g, 4, 2, 5, 2, 6, inv);
    CHECK_GRAD(c.x, g, 48, rope_loss, &c);
    /* exact: position 1, frequency 1 rotates (1, 0) by 1 radian; the pairing is (k, k + hd/2) */
    double v[2] = {1, 0}, one = 1.0;
    nb_ref_rope_fwd(v, 1, 1, 1, 1, 2, &one);
    CHECK_NEAR(v[0], cos(1.0), 1e-15);
    CHECK_NEAR(v[1], sin(1.0), 1e-15);
    free(c.x); free(c.R); free(g);
}

/* ---- attention ---- */
typedef struct { nb_attn_dims a; double *q, *k, *v, *R; } att_c;
static double att_loss(void *p) {
    att_c *c = p;
    int64_t m = c->a.B * c->a.Tq * c->a.H * c->a.hd;
    double *o = zvec(m);
    nb_ref_attention_fwd(&c->a, c->q, c->k, c->v, o);
    double l = dot(o, c->R, m);
    free(o);
    return l;
}
static void test_attention_case(int64_t B, int64_t Tq, int64_t Tk, int64_t kv_rows, int64_t H, int64_t KVH,
                                int64_t hd, int64_t pos0, int64_t window) {
    att_c c;
    c.a = (nb_attn_dims){B, Tq, Tk, kv_rows, H, KVH, hd, pos0, window, (float)(1.0 / sqrt((double)hd))};
    int64_t nq = B * Tq * H * hd, nk = B * kv_rows * KVH * hd;
    c.q = rvec(nq);
    c.k = rvec(nk);
    c.v = rvec(nk);
    c.R = rvec(nq);
    double *dq = zvec(nq), *dk = zvec(nk), *dv = zvec(nk);
    nb_ref_attention_bwd(&c.a, c.q, c.k, c.v, c.R, dq, dk, dv);
    CHECK_GRAD(c.q, dq, nq, att_loss, &c);
    CHECK_GRAD(c.k, dk, nk, att_loss, &c);
    CHECK_GRAD(c.v, dv, nk, att_loss, &c);
    free(c.q); free(c.k); free(c.v); free(c.R); free(dq); free(dk); free(dv);
}
static void test_attention(void) {
    test_attention_case(2, 5, 5, 5, 4, 2, 4, 0, 0);    /* GQA 2:1 */
    test_attention_case(1, 6, 6, 6, 2, 2, 2, 0, 3);    /* sliding window */
    test_attention_case(1, 2, 7, 9, 3, 1, 4, 5, 0);    /* decode against a cache: keys 0..6 */
    /* exact: one query, two equal-score keys -> the mean of the values */
    nb_attn_dims a = {1, 1, 2, 2, 1, 1, 2, 1, 0, 1.0f};
    double q[2] = {0, 0}, k[4] = {1, 2, 3, 4}, v[4] = {1, 10, 3, 20}, o[2];
    nb_ref_attention_fwd(&a, q, k, v, o);
    CHECK_NEAR(o[0], 2.0, 1e-15);
    CHECK_NEAR(o[1], 15.0, 1e-15);
    /* query at position 0 sees only key 0 */
    a.q_pos0 = 0;
    nb_ref_attention_fwd(&a, q, k, v, o);
    CHECK_NEAR(o[0], 1.0, 1e-15);
    CHECK_NEAR(o[1], 10.0, 1e-15);
}

/* ---- swiglu ---- */
typedef struct { double *g, *u, *R; int64_t n; } swi_c;
static double swi_loss(void *p) {
    swi_c *c = p;
    double *a = zvec(c->n);
    nb_ref_swiglu_fwd(c->g, c->u, a, c->n);
    double l = dot(a, c->R, c->n);
    free(a);
    return l;
}
static void test_swiglu(void) {
    swi_c c = {rvec(20), rvec(20), rvec(20), 20};
    for (int i = 0; i < 20; i++) c.g[i] *= 4;
    double *dg = zvec(20), *du = zvec(20);
    nb_ref_swiglu_bwd(c.g, c.u, c.R, dg, du, 20);
    CHECK_GRAD(c.g, dg, 20, swi_loss, &c);
    CHECK_GRAD(c.u, du, 20, swi_loss, &c);
    double g = 1.0, u = 2.0, a;
    nb_ref_swiglu_fwd(&g, &u, &a, 1);
    CHECK_NEAR(a, 2.0 / (1.0 + exp(-1.0)), 1e-15);
    free(c.g); free(c.u); free(c.R); free(dg); free(du);
}

/* ---- linear ---- */
typedef struct { double *x, *w, *b, *R; int64_t n, in, out; } lin_c;
static double lin_loss(void *p) {
    lin_c *c = p;
    double *y = zvec(c->n * c->out);
    nb_ref_linear_fwd(c->x, c->w, c->b, y, c->n, c->in, c->out);
    double l = dot(y, c->R, c->n * c->out);
    free(y);
    return l;
}
static void test_linear(void) {
    lin_c c = {rvec(3 * 5), rvec(4 * 5), rvec(4), rvec(3 * 4), 3, 5, 4};
    double *dx = zvec(15), *dw = zvec(20), *db = zvec(4);
    nb_ref_linear_bwd(c.x, c.w, c.R, dx, dw, db, 3, 5, 4);
    CHECK_GRAD(c.x, dx, 15, lin_loss, &c);
    CHECK_GRAD(c.w, dw, 20, lin_loss, &c);
    CHECK_GRAD(c.b, db, 4, lin_loss, &c);
    free(c.x); free(c.w); free(c.b); free(c.R); free(dx); free(dw); free(db);
}

/* ---- embedding ---- */
typedef struct { double *t, *R; const int32_t *tok; int64_t n, d; } emb_c;
static double emb_loss(void *p) {
    emb_c *c = p;
    double *y = zvec(c->n * c->d);
    nb_ref_embedding_fwd(c->t, c->tok, c->n, c->d, y);
    double l = dot(y, c->R, c->n * c->d);
    free(y);
    return l;
}
static void test_embedding(void) {
    static const int32_t tok[5] = {3, 0, 3, 1, 3};
    emb_c c = {rvec(4 * 3), rvec(5 * 3), tok, 5, 3};
    double *dt = zvec(12);
    nb_ref_embedding_bwd(tok, c.R, 5, 3, dt);
    CHECK_GRAD(c.t, dt, 12, emb_loss, &c);
    CHECK_NEAR(dt[2 * 3], 0.0, 0);   /* row 2 never used */
    free(c.t); free(c.R); free(dt);
}

/* ---- cross-entropy ---- */
typedef struct { double *l; const int32_t *t; int64_t n, V; } ce_c;
static double ce_loss(void *p) {
    ce_c *c = p;
    return nb_ref_cross_entropy(c->l, c->t, c->n, c->V, -100, 1.0, NULL);
}
static void test_ce(void) {
    static const int32_t t[3] = {2, -100, 0};
    ce_c c = {rvec(3 * 5), t, 3, 5};
    double *d = zvec(15);
    nb_ref_cross_entropy(c.l, t, 3, 5, -100, 1.0, d);
    CHECK_GRAD(c.l, d, 15, ce_loss, &c);
    double l2[2] = {0, 0};
    int32_t t2 = 1;
    CHECK_NEAR(nb_ref_cross_entropy(l2, &t2, 1, 2, -100, 1.0, NULL), log(2.0), 1e-15);
    free(c.l); free(d);
}

int main(void) {
    nb_rng_seed(&rng, 12345);
    test_rmsnorm();
    test_rope();
    test_attention();
    test_swiglu();
    test_linear();
    test_embedding();
    test_ce();
    return nbt_done("test_ops_ref");
}

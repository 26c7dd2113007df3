/* Whole-model gradients on tiny random models of every supported shape (llama GQA, qwen3 q/k norm
 * with biases and tied embeddings, qwen2 biases, mistral sliding window, llama3 RoPE scaling):
 * 1. the float64 reference model's backward against central finite differences of its forward;
 * 2. the fast float32 forward/backward against the reference (logits and every parameter's grad);
 * 3. recompute on/off, logits chunking, row selection, hidden-state gradients, lm_step. */
#include <stdlib.h>

#include "nbtest.h"
#include "model/internal.h"

static nb_rng rng;

typedef struct {
    const char *name;
    nb_model_config cfg;
} variant;

static variant variants[5];
static int n_variants;

static void make_variants(void) {
    nb_model_config c;
    nb_model_config_init(&c);
    c.vocab_size = 19; c.hidden_size = 16; c.intermediate_size = 24; c.n_layers = 2;
    c.n_heads = 4; c.n_kv_heads = 2; c.head_dim = 4;
    variants[n_variants++] = (variant){"llama-gqa", c};

    nb_model_config q3 = c;
    q3.arch = NB_ARCH_QWEN3; q3.hidden_size = 12; q3.n_heads = 2; q3.n_kv_heads = 1; q3.head_dim = 8;
    q3.qk_norm = 1; q3.qkv_bias = 1; q3.o_bias = 1; q3.tied = 1; q3.rms_eps = 1e-6; q3.rope_theta = 1e6;
    variants[n_variants++] = (variant){"qwen3-qknorm-bias-tied", q3};

    nb_model_config q2 = c;
    q2.arch = NB_ARCH_QWEN2; q2.qkv_bias = 1; q2.n_kv_heads = 1;
    variants[n_variants++] = (variant){"qwen2-bias", q2};

    nb_model_config mi = c;
    mi.arch = NB_ARCH_MISTRAL; mi.sliding_window = 3;
    variants[n_variants++] = (variant){"mistral-window3", mi};

    nb_model_config l3 = c;
    l3.rope_kind = NB_ROPE_LLAMA3; l3.rope_factor = 8; l3.rope_low_freq_factor = 1; l3.rope_high_freq_factor = 4;
    l3.rope_original_max_position = 32; l3.rope_theta = 500000; l3.mlp_bias = 1; l3.tied = 1; l3.n_layers = 3;
    variants[n_variants++] = (variant){"llama3-rope-mlpbias-tied", l3};
}

static double *params_d(const nb_model *m) {
    nb_tensor *f = nb_model_flat_params(m);
    int64_t n = nb_tensor_numel(f);
    double *d = malloc(sizeof(double) * (size_t)n);
    const float *s = nb_tensor_data(f);
    for (int64_t i = 0; i < n; i++) d[i] = s[i];
    return d;
}

static double ref_loss(const nb_model *m, const double *P, const int32_t *tok, int64_t B, int64_t T, const double *R) {
    int64_t n = B * T * m->cfg.vocab_size;
    double *lg = malloc(sizeof(double) * (size_t)n);
    nb_ref_model_forward(m, P, tok, B, T, lg);
    double l = 0;
    for (int64_t i = 0; i < n; i++) l += lg[i] * R[i];
    free(lg);
    return l;
}

/* Max over parameters of |fast - ref| / max(|ref| over that parameter, floor). */
static double grad_err(const nb_model *m, const double *G, const char **worst) {
    double e = 0;
    for (int64_t i = 0; i < nb_model_param_count(m); i++) {
        const nb_tensor *g = nb_model_grad(m, i);
        const float *gd = nb_tensor_data(g);
        int64_t off = nb_model_param_offset(m, i), n = nb_tensor_numel(g);
        double mx = 1e-3, d = 0;
        for (int64_t k = 0; k < n; k++) {
            if (fabs(G[off + k]) > mx) mx = fabs(G[off + k]);
            if (fabs(gd[k] - G[off + k]) > d) d = fabs(gd[k] - G[off + k]);
        }
        if (d / mx > e) { e = d / mx; *worst = nb_model_param_name(m, i); }
    }
    return e;
}

static int32_t *rand_tokens(int64_t n, int64_t V) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(nb_rng_next(&rng) % (uint64_t)V);
    return t;
}

static void test_variant(nb_ctx *ctx, const variant *vr) {
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &vr->cfg, &m));
    if (!m) return;
    CHECK_OK(ctx, nb_model_init_random(ctx, m, 42, 0.3));
    int64_t B = 2, T = 6, V = vr->cfg.vocab_size, N = B * T, nflat = nb_tensor_numel(nb_model_flat_params(m));
    int32_t *tok = rand_tokens(N, V);
    double *P = params_d(m), *R = malloc(sizeof(double) * (size_t)(N * V)), *G = calloc((size_t)nflat, sizeof(double));
    for (int64_t i = 0; i < N * V; i++) R[i] = 2.0 * nb_rng_uniform(&rng) - 1.0;

    /* 1. reference backward vs finite differences, every parameter */
    nb_ref_model_backward(m, P, tok, B, T, R, G);
    double worst = 0, scale = 1e-3;
    for (int64_t i = 0; i < nb_model_param_count(m); i++) {
        int64_t off = nb_model_param_offset(m, i), n = nb_tensor_numel(nb_model_param(m, i));
        for (int64_t k = 0; k < n; k++) {
            double x0 = P[off + k], h = 1e-5;
            P[off + k] = x0 + h;
            double lp = ref_loss(m, P, tok, B, T, R);
            P[off + k] = x0 - h;
            double lm = ref_loss(m, P, tok, B, T, R);
            P[off + k] = x0;
            double fd = (lp - lm) / (2 * h);
            if (fabs(fd - G[off + k]) > worst) worst = fabs(fd - G[off + k]);
            if (fabs(fd) > scale) scale = fabs(fd);
        }
    }
    CHECK_MSG(worst <= 1e-7 * scale, "%s: reference grad vs finite differences: %.3g (scale %.3g)", vr->name, worst, scale);

    /* 2. fast forward and backward vs the reference */
    float *lg = malloc(sizeof(float) * (size_t)(N * V)), *Rf = malloc(sizeof(float) * (size_t)(N * V));
    double *lgd = malloc(sizeof(double) * (size_t)(N * V));
    for (int64_t i = 0; i < N * V; i++) Rf[i] = (float)R[i];
    nb_ref_model_forward(m, P, tok, B, T, lgd);
    nb_forward_opts fo = {0};
    fo.logits = lg;
    fo.train = 1;
    nb_model_set_recompute(m, NB_RECOMPUTE_ALWAYS);
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
    double le = 0;
    for (int64_t i = 0; i < N * V; i++) le = fmax(le, fabs(lg[i] - lgd[i]));
    CHECK_MSG(le < 2e-5, "%s: logits differ from the reference by %.3g", vr->name, le);
    nb_backward_opts bo = {0};
    bo.dlogits = Rf;
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
    const char *wn = "";
    double ge = grad_err(m, G, &wn);
    CHECK_MSG(ge < 1e-4, "%s: fast grads differ from the reference: %.3g at %s", vr->name, ge, wn);

    /* 3a. without recompute: the same bits */
    nb_tensor *gflat = nb_model_flat_grads(m);
    float *g1 = malloc(sizeof(float) * (size_t)nflat);
    memcpy(g1, nb_tensor_data(gflat), sizeof(float) * (size_t)nflat);
    nb_model_zero_grad(m);
    nb_model_set_recompute(m, NB_RECOMPUTE_NEVER);
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
    CHECK_MSG(!memcmp(g1, nb_tensor_data(gflat), sizeof(float) * (size_t)nflat), "%s: recompute changes grads", vr->name);
    nb_model_set_recompute(m, NB_RECOMPUTE_AUTO);
    /* gradients accumulate: a second backward doubles them */
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
    /* relative to the largest gradient: a compiler that contracts g += a*b into an FMA (clang by
     * default) rounds the second sum once instead of twice, a few ulps of the largest values */
    double acc = 0, gmax = 0;
    for (int64_t i = 0; i < nflat; i++) {
        acc = fmax(acc, fabs(((float *)nb_tensor_data(gflat))[i] - 2 * g1[i]));
        gmax = fmax(gmax, fabs(2 * g1[i]));
    }
    CHECK_MSG(acc <= 1e-6 * gmax, "%s: grads do not accumulate (%.3g, largest %.3g)", vr->name, acc, gmax);
    /* one backward per forward */
    CHECK_FAIL(ctx, nb_model_backward(ctx, m, &bo, NULL), NB_ERR_INVALID, "train = 1 first");

    /* 3b. LM loss through the chunked loss callback (2 rows per chunk) and lm_step */
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) tg[i] = (i % T == T - 1) ? -100 : tok[i + 1];
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += tg[i] != -100;
    double *dl = calloc((size_t)(N * V), sizeof(double));
    double ref_ce = nb_ref_cross_entropy(lgd, tg, N, V, -100, 1.0 / (double)cnt, dl);
    memset(G, 0, sizeof(double) * (size_t)nflat);
    nb_ref_model_backward(m, P, tok, B, T, dl, G);
    nb_model_zero_grad(m);
    double mean = 0;
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, B, T, NULL, &mean));
    CHECK_NEAR(mean, ref_ce / (double)cnt, 1e-5);
    ge = grad_err(m, G, &wn);
    CHECK_MSG(ge < 1e-4, "%s: lm_step grads differ from the reference: %.3g at %s", vr->name, ge, wn);
    nb_model_zero_grad(m);
    nb_forward_opts fo2 = {0};
    fo2.train = 1;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo2));
    nb_lm_loss L = {tg, -100, (float)(1.0 / (double)cnt), 0, 0};
    nb_backward_opts bo2 = {0};
    bo2.loss = nb_lm_loss_fn;
    bo2.user = &L;
    double lsum = 0;
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo2, &lsum));
    CHECK_NEAR(lsum, ref_ce, 1e-4);
    CHECK_EQ_INT(L.count, cnt);
    ge = grad_err(m, G, &wn);
    CHECK_MSG(ge < 1e-4, "%s: loss-callback grads differ: %.3g at %s", vr->name, ge, wn);

    /* 3c. hidden[n_layers] is the final-norm output, so dhidden[L] = dlogits W must give the
     * same grads as dlogits for every parameter but the lm_head's own weight */
    int64_t Lc = vr->cfg.n_layers, D = vr->cfg.hidden_size;
    float **hid = calloc((size_t)(Lc + 1), sizeof(float *));
    const float **dhid = calloc((size_t)(Lc + 1), sizeof(float *));
    hid[Lc] = malloc(sizeof(float) * (size_t)(N * D));
    float *dh = calloc((size_t)(N * D), sizeof(float));
    const float *W = nb_tensor_data(nb_model_param(m, nb_model_find_param(m, "lm_head.weight")));
    for (int64_t i = 0; i < N; i++)
        for (int64_t v = 0; v < V; v++)
            for (int64_t k = 0; k < D; k++) dh[i * D + k] += Rf[i * V + v] * W[v * D + k];
    nb_model_zero_grad(m);
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
    memcpy(g1, nb_tensor_data(gflat), sizeof(float) * (size_t)nflat);
    nb_model_zero_grad(m);
    nb_forward_opts fo3 = {0};
    fo3.train = 1;
    fo3.hidden = hid;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo3));
    dhid[Lc] = dh;
    nb_backward_opts bo3 = {0};
    bo3.dhidden = dhid;
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo3, NULL));
    int64_t plm = nb_model_find_param(m, "lm_head.weight");
    double he = 0;
    for (int64_t i = 0; i < nb_model_param_count(m); i++) {
        if (i == plm) continue;
        int64_t off = nb_model_param_offset(m, i), n = nb_tensor_numel(nb_model_param(m, i));
        const float *g = nb_tensor_data(gflat);
        double mx = 1e-3;
        for (int64_t k = 0; k < n; k++) mx = fmax(mx, fabs(g1[off + k]));
        for (int64_t k = 0; k < n; k++) he = fmax(he, fabs(g[off + k] - g1[off + k]) / mx);
    }
    CHECK_MSG(he < 1e-4, "%s: dhidden[L] grads differ: %.3g", vr->name, he);
    /* hidden[L] equals the final-norm output the logits came from: logits = hidden[L] W^T */
    double hl = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t v = 0; v < V; v++) {
            double s = 0;
            for (int64_t k = 0; k < D; k++) s += (double)hid[Lc][i * D + k] * W[v * D + k];
            hl = fmax(hl, fabs(s - lgd[i * V + v]));
        }
    CHECK_MSG(hl < 2e-5, "%s: hidden[L] W^T != logits (%.3g)", vr->name, hl);

    free(hid[Lc]); free(hid); free(dhid); free(dh);
    free(tg); free(dl); free(g1); free(lg); free(Rf); free(lgd);
    free(tok); free(P); free(R); free(G);
    nb_model_free(m);
}

/* Intermediate hidden states: the gradient of sum(hidden[1] * Rh) w.r.t. a layer-0 weight, against
 * float32 finite differences (a loose but independent check), and layer-1 weights get none. */
static void test_hidden_mid(nb_ctx *ctx) {
    nb_model_config c = variants[0].cfg;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
    nb_model_init_random(ctx, m, 7, 0.3);
    int64_t B = 1, T = 5, N = B * T, D = c.hidden_size;
    int32_t *tok = rand_tokens(N, c.vocab_size);
    float *Rh = malloc(sizeof(float) * (size_t)(N * D)), *h1 = malloc(sizeof(float) * (size_t)(N * D));
    for (int64_t i = 0; i < N * D; i++) Rh[i] = (float)(2.0 * nb_rng_uniform(&rng) - 1.0);
    float *hid[3] = {NULL, h1, NULL};
    const float *dhid[3] = {NULL, Rh, NULL};
    nb_forward_opts fo = {0};
    fo.train = 1;
    fo.hidden = hid;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
    nb_backward_opts bo = {0};
    bo.dhidden = dhid;
    nb_model_zero_grad(m);
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
    int64_t pq = nb_model_find_param(m, "model.layers.0.self_attn.q_proj.weight");
    int64_t pd1 = nb_model_find_param(m, "model.layers.1.mlp.down_proj.weight");
    float *w = nb_tensor_data(nb_model_param(m, pq));
    const float *g = nb_tensor_data(nb_model_grad(m, pq));
    double worst = 0, scale = 1e-3;
    nb_forward_opts fh = {0};
    fh.hidden = hid;
    for (int k = 0; k < 20; k++) {
        float w0 = w[k], h = 1e-2f;
        double l[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            w[k] = w0 + (sgn ? -h : h);
            nb_model_forward(ctx, m, tok, B, T, &fh);
            double s = 0;
            for (int64_t i = 0; i < N * D; i++) s += (double)h1[i] * Rh[i];
            l[sgn] = s;
        }
        w[k] = w0;
        double fd = (l[0] - l[1]) / (2.0 * h);
        worst = fmax(worst, fabs(fd - g[k]));
        scale = fmax(scale, fabs(fd));
    }
    CHECK_MSG(worst < 2e-3 * scale + 1e-4, "dhidden[1]: q_proj grad vs float finite differences %.3g (scale %.3g)", worst,
              scale);
    const float *gd = nb_tensor_data(nb_model_grad(m, pd1));
    double z = 0;
    for (int64_t k = 0; k < nb_tensor_numel(nb_model_grad(m, pd1)); k++) z = fmax(z, fabs(gd[k]));
    CHECK_NEAR(z, 0.0, 0.0);
    free(tok); free(Rh); free(h1);
    nb_model_free(m);
}

/* Frozen parameters get no gradient; the rest are unchanged by freezing. */
static void test_requires_grad(nb_ctx *ctx) {
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &variants[0].cfg, &m));
    nb_model_init_random(ctx, m, 3, 0.3);
    int32_t *tok = rand_tokens(8, variants[0].cfg.vocab_size);
    double loss1 = 0, loss2 = 0;
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, 2, 4, NULL, &loss1));
    int64_t pg = nb_model_find_param(m, "model.layers.1.mlp.gate_proj.weight");
    int64_t n = nb_tensor_numel(nb_model_grad(m, pg));
    float *g1 = malloc(sizeof(float) * (size_t)n);
    memcpy(g1, nb_tensor_data(nb_model_grad(m, pg)), sizeof(float) * (size_t)n);
    nb_model_zero_grad(m);
    CHECK_EQ_INT(nb_model_set_requires_grad(m, "*.self_attn.*", 0), 8);
    CHECK_EQ_INT(nb_model_set_requires_grad(m, "model.embed_tokens.weight", 0), 1);
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, 2, 4, NULL, &loss2));
    CHECK_NEAR(loss1, loss2, 0);
    CHECK(!memcmp(g1, nb_tensor_data(nb_model_grad(m, pg)), sizeof(float) * (size_t)n));
    int64_t pq = nb_model_find_param(m, "model.layers.0.self_attn.q_proj.weight");
    const float *gq = nb_tensor_data(nb_model_grad(m, pq));
    double z = 0;
    for (int64_t k = 0; k < nb_tensor_numel(nb_model_grad(m, pq)); k++) z = fmax(z, fabs(gq[k]));
    CHECK_NEAR(z, 0.0, 0.0);
    CHECK_EQ_INT(nb_model_param_requires_grad(m, pq), 0);
    CHECK_EQ_INT(nb_model_param_requires_grad(m, pg), 1);
    free(g1); free(tok);
    nb_model_free(m);
}

int main(void) {
    nb_rng_seed(&rng, 2024);
    make_variants();
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    for (int i = 0; i < n_variants; i++) test_variant(ctx, &variants[i]);
    test_hidden_mid(ctx);
    test_requires_grad(ctx);
    nb_ctx_release(ctx);
    return nbt_done("test_model_grad");
}

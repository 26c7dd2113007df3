/* Linear hooks (what PTQ calibration and QAD plug into): a weight hook changes the forward exactly
 * as editing the weight would, is called once per forward, and its gradient goes straight through
 * to the master weight; an input hook sees every linear's input once per forward and once more
 * (NB_PASS_RECOMPUTE) per recomputing backward, and its gradient passes through; hooks on a tied
 * lm_head leave the embedding alone; hook errors propagate with their message. */
#include <stdlib.h>

#include "nbtest.h"

static nb_model_config tiny(void) {
    nb_model_config c;
    nb_model_config_init(&c);
    c.vocab_size = 23; c.hidden_size = 16; c.intermediate_size = 24; c.n_layers = 2;
    c.n_heads = 4; c.n_kv_heads = 2; c.head_dim = 4;
    return c;
}

static nb_model *make(nb_ctx *ctx, const nb_model_config *c) {
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, c, &m));
    if (m) nb_model_init_random(ctx, m, 99, 0.3);
    return m;
}

typedef struct { float scale; int calls; } whook;
static nb_status scale_weight(nb_ctx *ctx, void *user, const float *w, float *w_out, int64_t rows, int64_t cols) {
    whook *h = user;
    h->calls++;
    for (int64_t i = 0; i < rows * cols; i++) w_out[i] = h->scale * w[i];
    return NB_OK;
}

typedef struct { float scale; int fwd, recompute; int64_t rows, cols; } ihook;
static nb_status scale_input(nb_ctx *ctx, void *user, float *x, int64_t rows, int64_t cols, int32_t pass) {
    ihook *h = user;
    if (pass == NB_PASS_FORWARD) h->fwd++;
    else if (pass == NB_PASS_RECOMPUTE) h->recompute++;
    h->rows = rows;
    h->cols = cols;
    if (h->scale != 1.0f)
        for (int64_t i = 0; i < rows * cols; i++) x[i] *= h->scale;
    return NB_OK;
}

static nb_status failing(nb_ctx *ctx, void *user, const float *w, float *w_out, int64_t rows, int64_t cols) {
    return nb_fail(ctx, NB_ERR_NUMERIC, "quantizer of %s: amax is NaN", (const char *)user);
}

static double maxdiff(const float *a, const float *b, int64_t n, double k) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(a[i] - k * b[i]));
    return e;
}

static void fwd_bwd(nb_ctx *ctx, nb_model *m, const int32_t *tok, int64_t B, int64_t T, const float *R, float *logits) {
    nb_model_zero_grad(m);
    nb_forward_opts fo = {0};
    fo.logits = logits;
    fo.train = 1;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
    nb_backward_opts bo = {0};
    bo.dlogits = R;
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    nb_model_config c = tiny();
    const int64_t B = 2, T = 7, N = B * T, V = c.vocab_size;
    int32_t tok[14];
    for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % (int)V;
    float *R = malloc(sizeof(float) * (size_t)(N * V)), *l1 = malloc(sizeof(float) * (size_t)(N * V)),
          *l2 = malloc(sizeof(float) * (size_t)(N * V));
    for (int i = 0; i < N * V; i++) R[i] = (float)sin(0.7 * i);

    /* 1. weight hook = editing the weight; STE gradient = gradient w.r.t. the edited weight */
    nb_model *a = make(ctx, &c), *b = make(ctx, &c);
    int64_t mq = nb_model_find_module(a, "model.layers.0.self_attn.q_proj");
    int64_t pq = nb_model_find_param(a, "model.layers.0.self_attn.q_proj.weight");
    whook wh = {0.5f, 0};
    nb_linear_hook hk = {&wh, scale_weight, NULL};
    CHECK_OK(ctx, nb_model_set_linear_hook(ctx, a, mq, &hk));
    float *wb = nb_tensor_data(nb_model_param(b, pq));
    for (int64_t i = 0; i < nb_tensor_numel(nb_model_param(b, pq)); i++) wb[i] *= 0.5f;
    fwd_bwd(ctx, a, tok, B, T, R, l1);
    CHECK_EQ_INT(wh.calls, 1);   /* once per forward: not again for the recompute or the backward */
    fwd_bwd(ctx, b, tok, B, T, R, l2);
    CHECK(maxdiff(l1, l2, N * V, 1.0) < 1e-6);
    int64_t nflat = nb_tensor_numel(nb_model_flat_grads(a));
    CHECK(maxdiff(nb_tensor_data(nb_model_flat_grads(a)), nb_tensor_data(nb_model_flat_grads(b)), nflat, 1.0) < 1e-5);
    /* the master weight itself is untouched */
    CHECK(maxdiff(nb_tensor_data(nb_model_param(a, pq)), wb, 16 * 16, 2.0) < 1e-7);
    CHECK_OK(ctx, nb_model_set_linear_hook(ctx, a, mq, NULL));
    nb_model_free(a);
    nb_model_free(b);

    /* 2. input hooks: an identity observer on every linear sees each input once per forward and
     * once per recomputed layer in the backward; gradients are unchanged */
    /* modes: always, never, auto with a budget too small (recomputes), auto by default (keeps) */
    for (int mode = 0; mode < 4; mode++) {
        int recompute = mode == 0 || mode == 2;
        a = make(ctx, &c);
        b = make(ctx, &c);
        nb_model_set_recompute(a, mode == 0 ? NB_RECOMPUTE_ALWAYS : mode == 1 ? NB_RECOMPUTE_NEVER : NB_RECOMPUTE_AUTO);
        if (mode == 2) nb_model_set_activation_budget(a, 1000);
        ihook obs[16];
        memset(obs, 0, sizeof obs);
        int k = 0;
        for (int64_t i = 0; i < nb_model_module_count(a); i++) {
            if (nb_model_module_kind(a, i) != NB_MODULE_LINEAR) continue;
            obs[k].scale = 1.0f;
            nb_linear_hook h = {&obs[k++], NULL, scale_input};
            CHECK_OK(ctx, nb_model_set_linear_hook(ctx, a, i, &h));
        }
        CHECK_EQ_INT(k, 15);
        fwd_bwd(ctx, a, tok, B, T, R, l1);
        fwd_bwd(ctx, b, tok, B, T, R, l2);
        CHECK(maxdiff(l1, l2, N * V, 1.0) == 0);
        CHECK(maxdiff(nb_tensor_data(nb_model_flat_grads(a)), nb_tensor_data(nb_model_flat_grads(b)), nflat, 1.0) < 1e-6);
        for (int i = 0; i < k; i++) {
            CHECK_EQ_INT(obs[i].fwd, 1);
            /* the lm_head is never recomputed; layer linears once each when recomputing */
            CHECK_EQ_INT(obs[i].recompute, (recompute && i < 14) ? 1 : 0);
            CHECK_EQ_INT(obs[i].rows, N);
        }
        CHECK_EQ_INT(obs[6].cols, c.intermediate_size);   /* layer 0 down_proj */
        CHECK_EQ_INT(obs[3].cols, c.n_heads * c.head_dim); /* layer 0 o_proj */
        nb_model_free(a);
        nb_model_free(b);
    }

    /* 3. a non-identity input hook on the lm_head: logits double, the lm_head weight grad doubles
     * (it sees the hooked input), every other gradient passes through unchanged */
    a = make(ctx, &c);
    b = make(ctx, &c);
    ihook dbl = {2.0f, 0, 0, 0, 0};
    nb_linear_hook hd = {&dbl, NULL, scale_input};
    CHECK_OK(ctx, nb_model_set_linear_hook(ctx, a, nb_model_find_module(a, "lm_head"), &hd));
    fwd_bwd(ctx, a, tok, B, T, R, l1);
    fwd_bwd(ctx, b, tok, B, T, R, l2);
    CHECK(maxdiff(l1, l2, N * V, 2.0) < 1e-5);
    for (int64_t i = 0; i < nb_model_param_count(a); i++) {
        int is_lm = !strcmp(nb_model_param_name(a, i), "lm_head.weight");
        const float *ga = nb_tensor_data(nb_model_grad(a, i)), *gb = nb_tensor_data(nb_model_grad(b, i));
        double e = maxdiff(ga, gb, nb_tensor_numel(nb_model_grad(a, i)), is_lm ? 2.0 : 1.0);
        CHECK_MSG(e < 1e-5, "input-hook STE: grad of %s differs by %.3g", nb_model_param_name(a, i), e);
    }
    nb_model_free(a);
    nb_model_free(b);

    /* 4. tied lm_head: its weight hook scales the logits only, the embedding stays the master */
    nb_model_config ct = c;
    ct.tied = 1;
    a = make(ctx, &ct);
    b = make(ctx, &ct);
    whook wl = {0.25f, 0};
    nb_linear_hook hl = {&wl, scale_weight, NULL};
    CHECK_OK(ctx, nb_model_set_linear_hook(ctx, a, nb_model_find_module(a, "lm_head"), &hl));
    CHECK_OK(ctx, nb_model_logits(ctx, a, tok, B, T, l1));
    CHECK_OK(ctx, nb_model_logits(ctx, b, tok, B, T, l2));
    CHECK(maxdiff(l1, l2, N * V, 0.25) < 1e-6);
    CHECK_EQ_INT(wl.calls, 1);

    /* 5. errors */
    const char *who = "model.layers.1.mlp.up_proj";
    nb_linear_hook bad = {(void *)who, failing, NULL};
    CHECK_OK(ctx, nb_model_set_linear_hook(ctx, a, nb_model_find_module(a, who), &bad));
    CHECK_FAIL(ctx, nb_model_logits(ctx, a, tok, B, T, l1), NB_ERR_NUMERIC, "quantizer of model.layers.1.mlp.up_proj: amax is NaN");
    CHECK_FAIL(ctx, nb_model_set_linear_hook(ctx, a, nb_model_find_module(a, "model.norm"), &bad), NB_ERR_INVALID,
               "model.norm) is not a linear module");
    nb_model_free(a);
    nb_model_free(b);

    free(R); free(l1); free(l2);
    nb_ctx_release(ctx);
    return nbt_done("test_model_hooks");
}

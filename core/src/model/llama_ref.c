/* The whole decoder in float64 composed from the scalar reference ops, keeping every activation:
 * the oracle that the fast float32 forward/backward (transformer.c) is compared with, and that is itself
 * checked against finite differences on tiny random models (tests/c/test_model_grad.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

typedef struct {
    double *x, *h1, *q, *k, *v, *qpre, *kpre, *att, *xmid, *h2, *g, *u, *a;
} ref_layer;

typedef struct {
    int64_t N;
    double *emb;               /* layer 0 input */
    ref_layer *L;
    double *xL, *hf;
} ref_state;

static double *dz(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static const double *P_(const nb_model *m, const double *P, int64_t p) { return p >= 0 ? P + m->params[p].offset : NULL; }
static double *G_(const nb_model *m, double *G, int64_t p) { return p >= 0 ? G + m->params[p].offset : NULL; }

static void ref_lin(const nb_model *m, const double *P, const nb_linear *lin, const double *x, double *y, int64_t n) {
    nb_ref_linear_fwd(x, P_(m, P, lin->pw), P_(m, P, lin->pb), y, n, lin->in, lin->out);
}

static void ref_forward(const nb_model *m, const double *P, const int32_t *tokens, int64_t B, int64_t T, ref_state *S,
                        double *logits) {
    const nb_model_config *c = &m->cfg;
    int64_t N = B * T, D = c->hidden_size, F = c->intermediate_size, H = c->n_heads, KVH = c->n_kv_heads;
    int64_t hd = c->head_dim, qd = H * hd, kvd = KVH * hd, Lc = c->n_layers;
    S->N = N;
    S->L = calloc((size_t)Lc, sizeof *S->L);
    double *x = dz(N * D);
    nb_ref_embedding_fwd(P_(m, P, m->p_embed), tokens, N, D, x);
    for (int64_t l = 0; l < Lc; l++) {
        const nb_layer *Ly = &m->layers[l];
        ref_layer *R = &S->L[l];
        R->x = x;
        R->h1 = dz(N * D);
        nb_ref_rmsnorm_fwd(x, P_(m, P, Ly->p_attn_norm), R->h1, N, D, c->rms_eps);
        R->q = dz(N * qd);
        R->k = dz(N * kvd);
        R->v = dz(N * kvd);
        if (c->qk_norm) {
            R->qpre = dz(N * qd);
            R->kpre = dz(N * kvd);
            ref_lin(m, P, &Ly->lin[0], R->h1, R->qpre, N);
            ref_lin(m, P, &Ly->lin[1], R->h1, R->kpre, N);
            nb_ref_rmsnorm_fwd(R->qpre, P_(m, P, Ly->p_q_norm), R->q, N * H, hd, c->rms_eps);
            nb_ref_rmsnorm_fwd(R->kpre, P_(m, P, Ly->p_k_norm), R->k, N * KVH, hd, c->rms_eps);
        } else {
            ref_lin(m, P, &Ly->lin[0], R->h1, R->q, N);
            ref_lin(m, P, &Ly->lin[1], R->h1, R->k, N);
        }
        ref_lin(m, P, &Ly->lin[2], R->h1, R->v, N);
        nb_ref_rope_fwd(R->q, N, T, 0, H, hd, m->inv_freq);
        nb_ref_rope_fwd(R->k, N, T, 0, KVH, hd, m->inv_freq);
        nb_attn_dims ad = {B, T, T, T, H, KVH, hd, 0, Ly->window, (float)(1.0 / sqrt((double)hd))};
        R->att = dz(N * qd);
        nb_ref_attention_fwd(&ad, R->q, R->k, R->v, R->att);
        R->xmid = dz(N * D);
        ref_lin(m, P, &Ly->lin[3], R->att, R->xmid, N);
        for (int64_t i = 0; i < N * D; i++) R->xmid[i] += x[i];
        R->h2 = dz(N * D);
        nb_ref_rmsnorm_fwd(R->xmid, P_(m, P, Ly->p_mlp_norm), R->h2, N, D, c->rms_eps);
        R->g = dz(N * F);
        R->u = dz(N * F);
        R->a = dz(N * F);
        ref_lin(m, P, &Ly->lin[4], R->h2, R->g, N);
        ref_lin(m, P, &Ly->lin[5], R->h2, R->u, N);
        nb_ref_swiglu_fwd(R->g, R->u, R->a, N * F);
        double *xn = dz(N * D);
        ref_lin(m, P, &Ly->lin[6], R->a, xn, N);
        for (int64_t i = 0; i < N * D; i++) xn[i] += R->xmid[i];
        x = xn;
    }
    S->xL = x;
    S->hf = dz(N * D);
    nb_ref_rmsnorm_fwd(x, P_(m, P, m->p_norm), S->hf, N, D, c->rms_eps);
    if (logits) nb_ref_linear_fwd(S->hf, P_(m, P, m->lm_head.pw), NULL, logits, N, D, c->vocab_size);
}

static void ref_free(const nb_model *m, ref_state *S) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        ref_layer *R = &S->L[l];
        double *all[] = {R->x, R->h1, R->q, R->k, R->v, R->qpre, R->kpre, R->att, R->xmid, R->h2, R->g, R->u, R->a};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    }
    free(S->L);
    free(S->xL);
    free(S->hf);
}

void nb_ref_model_forward(const nb_model *m, const double *params, const int32_t *tokens, int64_t B, int64_t T,
                          double *logits) {
    ref_state S;
    ref_forward(m, params, tokens, B, T, &S, logits);
    ref_free(m, &S);
}

void nb_ref_model_backward(const nb_model *m, const double *P, const int32_t *tokens, int64_t B, int64_t T,
                           const double *dlogits, double *G) {
    const nb_model_config *c = &m->cfg;
    int64_t N = B * T, D = c->hidden_size, F = c->intermediate_size, H = c->n_heads, KVH = c->n_kv_heads;
    int64_t hd = c->head_dim, qd = H * hd, kvd = KVH * hd, Lc = c->n_layers;
    ref_state S;
    ref_forward(m, P, tokens, B, T, &S, NULL);
    double *dhf = dz(N * D), *dx = dz(N * D);
    nb_ref_linear_bwd(S.hf, P_(m, P, m->lm_head.pw), dlogits, dhf, G_(m, G, m->lm_head.pw), NULL, N, D, c->vocab_size);
    nb_ref_rmsnorm_bwd(S.xL, P_(m, P, m->p_norm), dhf, dx, G_(m, G, m->p_norm), N, D, c->rms_eps);
    for (int64_t l = Lc - 1; l >= 0; l--) {
        const nb_layer *Ly = &m->layers[l];
        ref_layer *R = &S.L[l];
        /* MLP: xout = xmid + down(a) */
        double *da = dz(N * F), *dg = dz(N * F), *du = dz(N * F), *dh2 = dz(N * D);
        const nb_linear *ln = Ly->lin;
        nb_ref_linear_bwd(R->a, P_(m, P, ln[6].pw), dx, da, G_(m, G, ln[6].pw), G_(m, G, ln[6].pb), N, F, D);
        nb_ref_swiglu_bwd(R->g, R->u, da, dg, du, N * F);
        nb_ref_linear_bwd(R->h2, P_(m, P, ln[4].pw), dg, dh2, G_(m, G, ln[4].pw), G_(m, G, ln[4].pb), N, D, F);
        nb_ref_linear_bwd(R->h2, P_(m, P, ln[5].pw), du, dh2, G_(m, G, ln[5].pw), G_(m, G, ln[5].pb), N, D, F);
        nb_ref_rmsnorm_bwd(R->xmid, P_(m, P, Ly->p_mlp_norm), dh2, dx, G_(m, G, Ly->p_mlp_norm), N, D, c->rms_eps);
        /* attention: xmid = x + o(att) */
        double *datt = dz(N * qd), *dq = dz(N * qd), *dk = dz(N * kvd), *dv = dz(N * kvd), *dh1 = dz(N * D);
        nb_ref_linear_bwd(R->att, P_(m, P, ln[3].pw), dx, datt, G_(m, G, ln[3].pw), G_(m, G, ln[3].pb), N, qd, D);
        nb_attn_dims ad = {B, T, T, T, H, KVH, hd, 0, Ly->window, (float)(1.0 / sqrt((double)hd))};
        nb_ref_attention_bwd(&ad, R->q, R->k, R->v, datt, dq, dk, dv);
        nb_ref_rope_bwd(dq, N, T, 0, H, hd, m->inv_freq);
        nb_ref_rope_bwd(dk, N, T, 0, KVH, hd, m->inv_freq);
        if (c->qk_norm) {
            double *dqp = dz(N * qd), *dkp = dz(N * kvd);
            nb_ref_rmsnorm_bwd(R->qpre, P_(m, P, Ly->p_q_norm), dq, dqp, G_(m, G, Ly->p_q_norm), N * H, hd, c->rms_eps);
            nb_ref_rmsnorm_bwd(R->kpre, P_(m, P, Ly->p_k_norm), dk, dkp, G_(m, G, Ly->p_k_norm), N * KVH, hd, c->rms_eps);
            free(dq);
            free(dk);
            dq = dqp;
            dk = dkp;
        }
        nb_ref_linear_bwd(R->h1, P_(m, P, ln[0].pw), dq, dh1, G_(m, G, ln[0].pw), G_(m, G, ln[0].pb), N, D, qd);
        nb_ref_linear_bwd(R->h1, P_(m, P, ln[1].pw), dk, dh1, G_(m, G, ln[1].pw), G_(m, G, ln[1].pb), N, D, kvd);
        nb_ref_linear_bwd(R->h1, P_(m, P, ln[2].pw), dv, dh1, G_(m, G, ln[2].pw), G_(m, G, ln[2].pb), N, D, kvd);
        nb_ref_rmsnorm_bwd(R->x, P_(m, P, Ly->p_attn_norm), dh1, dx, G_(m, G, Ly->p_attn_norm), N, D, c->rms_eps);
        free(da); free(dg); free(du); free(dh2);
        free(datt); free(dq); free(dk); free(dv); free(dh1);
    }
    nb_ref_embedding_bwd(tokens, dx, N, D, G_(m, G, m->p_embed));
    free(dhf);
    free(dx);
    ref_free(m, &S);
}

/* Forward and backward, in float32, of the transformer block every architecture family shares
 * (llama, mistral, qwen2, qwen3, mixtral, qwen3_moe: model/arch/ sets which biases, norms, windows
 * and experts a model has). One code path: RMSNorm -> q/k/v (+bias) -> [q/k RMSNorm] -> RoPE
 * (rotate-half) -> causal GQA attention -> o -> residual -> RMSNorm -> SwiGLU MLP, or in a sparse
 * layer a router and top-k SwiGLU experts -> residual; final RMSNorm; lm_head. The experts' tokens
 * are grouped by expert so that each expert's linears run as one GEMM over all of its tokens.
 * The backward either reuses every layer's activations or recomputes one layer at a time from the
 * saved layer inputs (nb_model_set_recompute; by default whichever fits the activation budget), and
 * treats the linear hooks as straight-through. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

enum { LQ = 0, LK = 1, LV = 2, LO = 3, LG = 4, LU = 5, LD = 6 };

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

/* ---- linears with hooks -------------------------------------------------------------------- */

static const float *lin_weight(const nb_model *m, const nb_linear *lin) {
    return lin->has_hook && lin->hook.weight && lin->w_eff ? lin->w_eff : nb_model_pdata(m, lin->pw);
}

/* Run every weight hook once for this forward; the result is kept for the backward. */
static nb_status run_weight_hooks(nb_ctx *ctx, nb_model *m) {
    for (int64_t i = 0; i < m->n_modules; i++) {
        nb_linear *lin = m->modules[i].lin;
        if (!lin || !lin->has_hook || !lin->hook.weight) continue;
        if (!lin->w_eff) {
            lin->w_eff = malloc(sizeof(float) * (size_t)(lin->in * lin->out));
            if (!lin->w_eff) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (hooked weight of %s)", m->modules[i].name);
        }
        nb_status s = lin->hook.weight(ctx, lin->hook.user, nb_model_pdata(m, lin->pw), lin->w_eff, lin->out, lin->in);
        if (s) {
            if (!nb_ctx_last_error(ctx)[0]) nb_fail(ctx, s, "weight hook of %s failed", m->modules[i].name);
            return s;
        }
    }
    return NB_OK;
}

/* y (+)= x W^T + b. When the linear has an input hook, x is first copied into xbuf and the hook
 * runs on the copy; *xused receives what the product actually read. */
static nb_status lin_fwd(nb_ctx *ctx, nb_model *m, const nb_linear *lin, const float *x, float *xbuf, int64_t n,
                         float *y, int accumulate, int pass, float **xused) {
    const float *xu = x;
    if (lin->has_hook && lin->hook.input) {
        memcpy(xbuf, x, sizeof(float) * (size_t)(n * lin->in));
        nb_status s = lin->hook.input(ctx, lin->hook.user, xbuf, n, lin->in, pass);
        if (s) {
            if (!nb_ctx_last_error(ctx)[0])
                nb_fail(ctx, s, "input hook of %s failed", m->modules[lin->module].name);
            return s;
        }
        xu = xbuf;
    }
    if (xused) *xused = (float *)xu;
    nb_gemm(ctx, 0, 1, n, lin->out, lin->in, 1.0f, xu, lin->in, lin_weight(m, lin), lin->in, accumulate ? 1.0f : 0.0f,
            y, lin->out);
    if (lin->pb >= 0) nb_bias_add(ctx, y, nb_model_pdata(m, lin->pb), n, lin->out);
    return NB_OK;
}

/* dx (+)= dy W_used, dW += dy^T x_used, db += sum dy (straight-through for both hooks). */
static void lin_bwd(nb_ctx *ctx, nb_model *m, const nb_linear *lin, const float *xused, const float *dy, float *dx,
                    int accumulate, int64_t n) {
    nb_op_linear_bwd(ctx, xused, lin_weight(m, lin), dy, dx, accumulate, nb_model_gdata(m, lin->pw),
                     nb_model_gdata(m, lin->pb), n, lin->in, lin->out);
}

nb_status nb_model_set_kv_hook(nb_ctx *ctx, nb_model *m, const nb_kv_hook *hook) {
    (void)ctx;
    if (!hook || !hook->kv) memset(&m->kv_hook, 0, sizeof m->kv_hook);
    else m->kv_hook = *hook;
    m->have_train = 0;   /* activations saved under another hook no longer match */
    return NB_OK;
}

/* ---- activation records -------------------------------------------------------------------- */

/* Lays out one layer's activation record for B x T tokens; with A NULL only returns its size
 * (floats), otherwise grows A's arena and points A's fields into it. */
static size_t act_layout(nb_ctx *ctx, nb_model *m, int64_t l, nb_layer_act *A, int64_t B, int64_t T, nb_status *st) {
    nb_layer_act dummy;
    int size_only = A == NULL;
    if (size_only) A = &dummy;
    const nb_model_config *c = &m->cfg;
    size_t N = (size_t)(B * T), D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size;
    size_t qd = (size_t)(c->n_heads * c->head_dim), kvd = (size_t)(c->n_kv_heads * c->head_dim);
    const nb_layer *L = &m->layers[l];
    size_t ins[NB_LIN_PER_LAYER] = {D, D, D, qd, D, D, F};
    size_t sizes[32], k = 0;
    float **ptrs[32];
#define SLOT(p, n) do { ptrs[k] = &(p); sizes[k] = (n); k++; } while (0)
    SLOT(A->h1, N * D);
    SLOT(A->rstd1, N);
    for (int r = 0; r < NB_LIN_PER_LAYER; r++) {
        if (L->lin[r].has_hook && L->lin[r].hook.input) SLOT(A->xbuf[r], N * ins[r]);
        else A->xbuf[r] = NULL;
    }
    SLOT(A->q, N * qd);
    SLOT(A->k, N * kvd);
    SLOT(A->v, N * kvd);
    if (c->qk_norm) {
        SLOT(A->qpre, N * qd);
        SLOT(A->kpre, N * kvd);
        SLOT(A->rstdq, N * (size_t)c->n_heads);
        SLOT(A->rstdk, N * (size_t)c->n_kv_heads);
    } else {
        A->qpre = A->kpre = A->rstdq = A->rstdk = NULL;
    }
    SLOT(A->att, N * qd);
    SLOT(A->lse, N * (size_t)c->n_heads);
    SLOT(A->xmid, N * D);
    SLOT(A->h2, N * D);
    SLOT(A->rstd2, N);
    float *ints[4] = {NULL, NULL, NULL, NULL};
    A->xbr = A->probs = A->topw = A->xg = A->y = NULL;
    A->xbe[0] = A->xbe[1] = A->xbe[2] = NULL;
    if (L->moe) {
        size_t E = (size_t)c->n_experts, NK = N * (size_t)c->n_experts_per_tok, Fe = (size_t)c->moe_intermediate_size;
        F = (size_t)c->n_experts_per_tok * Fe;   /* g, u, a: one row of Fe per expert slot */
        if (L->router.has_hook && L->router.hook.input) SLOT(A->xbr, N * D);
        SLOT(A->probs, N * E);
        SLOT(A->topw, NK);
        SLOT(ints[0], NK);
        SLOT(ints[1], NK);
        SLOT(ints[2], NK);
        SLOT(ints[3], E + 1);
        SLOT(A->xg, NK * D);
        size_t eins[3] = {D, D, Fe};
        for (int r = 0; r < 3; r++) {
            int hooked = 0;
            for (size_t ex = 0; ex < E; ex++) hooked |= L->ex[3 * ex + r].has_hook && L->ex[3 * ex + r].hook.input;
            if (hooked) SLOT(A->xbe[r], NK * eins[r]);
        }
        SLOT(A->y, NK * D);
    }
    SLOT(A->g, N * F);
    SLOT(A->u, N * F);
    SLOT(A->a, N * F);
#undef SLOT
    size_t total = 0;
    for (size_t i = 0; i < k; i++) total += al16(sizes[i]);
    if (size_only) return total;
    *st = nb_grow(m, ctx, &A->arena, &A->arena_floats, total);
    if (*st) return 0;
    float *p = A->arena;
    for (size_t i = 0; i < k; i++) {
        *ptrs[i] = p;
        p += al16(sizes[i]);
    }
    A->topi = (int32_t *)ints[0];   /* int32 and float share size and alignment */
    A->slot = (int32_t *)ints[1];
    A->tok = (int32_t *)ints[2];
    A->offs = (int32_t *)ints[3];
    return total;
}

static nb_status act_prepare(nb_ctx *ctx, nb_model *m, int64_t l, nb_layer_act *A, int64_t B, int64_t T) {
    nb_status s = NB_OK;
    act_layout(ctx, m, l, A, B, T, &s);
    return s;
}

static nb_status acts_prepare(nb_ctx *ctx, nb_model *m, int64_t n_records) {
    if (m->n_acts < n_records) {
        nb_layer_act *a = realloc(m->acts, sizeof *a * (size_t)n_records);
        if (!a) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (activation records)");
        memset(a + m->n_acts, 0, sizeof *a * (size_t)(n_records - m->n_acts));
        m->acts = a;
        m->n_acts = n_records;
    }
    return NB_OK;
}

/* ---- mixture of experts -------------------------------------------------------------------- */

/* What an expert linear's product read: its hooked copy, or the shared per-slot tensor. */
static const float *ex_in(const nb_linear *lin, float *hooked, const float *plain, int64_t off) {
    return lin->has_hook && lin->hook.input ? hooked + off * lin->in : plain + off * lin->in;
}

/* The sparse MLP of layer L on A->h2 [N][D]: router softmax, top-k (ties to the lower index, the
 * weights renormalised when norm_topk_prob), tokens grouped by expert, the experts' SwiGLU per group;
 * with xout non-NULL (holding the residual) adds sum_j w_j y_j to it. */
static nb_status moe_fwd(nb_ctx *ctx, nb_model *m, nb_layer *L, nb_layer_act *A, int64_t N, float *xout, int pass) {
    const nb_model_config *c = &m->cfg;
    int64_t D = c->hidden_size, E = c->n_experts, k = c->n_experts_per_tok, Fe = c->moe_intermediate_size;
    nb_status s;
    if ((s = lin_fwd(ctx, m, &L->router, A->h2, A->xbr, N, A->probs, 0, pass, NULL))) return s;
    for (int64_t t = 0; t < N; t++) {
        float *p = A->probs + t * E, mx = p[0];
        for (int64_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int64_t e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int64_t e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        int32_t *ti = A->topi + t * k;
        float *tw = A->topw + t * k, tot = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < (int32_t)E; e++) {
                int taken = 0;
                for (int64_t q = 0; q < j; q++) taken |= ti[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ti[j] = best;
            tw[j] = p[best];
            tot += p[best];
        }
        if (c->norm_topk_prob)
            for (int64_t j = 0; j < k; j++) tw[j] /= tot;
    }
    /* group: offs[e] .. offs[e+1]-1 are expert e's slots, in token order */
    int32_t *offs = A->offs;
    memset(offs, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < N * k; i++) offs[A->topi[i] + 1]++;
    for (int64_t e = 0; e < E; e++) offs[e + 1] += offs[e];
    for (int64_t i = 0; i < N * k; i++) {
        int32_t a = offs[A->topi[i]]++;
        A->slot[i] = a;
        A->tok[a] = (int32_t)(i / k);
    }
    for (int64_t e = E; e > 0; e--) offs[e] = offs[e - 1];
    offs[0] = 0;
    for (int64_t a = 0; a < N * k; a++) memcpy(A->xg + a * D, A->h2 + (int64_t)A->tok[a] * D, sizeof(float) * (size_t)D);
    for (int64_t e = 0; e < E; e++) {
        int64_t off = offs[e], n = offs[e + 1] - off;
        if (!n) continue;
        nb_linear *g = &L->ex[3 * e], *u = g + 1;
        if ((s = lin_fwd(ctx, m, g, A->xg + off * D, A->xbe[0] ? A->xbe[0] + off * D : NULL, n, A->g + off * Fe, 0,
                         pass, NULL)))
            return s;
        if ((s = lin_fwd(ctx, m, u, A->xg + off * D, A->xbe[1] ? A->xbe[1] + off * D : NULL, n, A->u + off * Fe, 0,
                         pass, NULL)))
            return s;
    }
    if ((s = nb_op_swiglu_fwd(ctx, A->g, A->u, A->a, N * k * Fe))) return s;
    for (int64_t e = 0; e < E; e++) {
        int64_t off = offs[e], n = offs[e + 1] - off;
        if (!n) continue;
        if ((s = lin_fwd(ctx, m, &L->ex[3 * e + 2], A->a + off * Fe, A->xbe[2] ? A->xbe[2] + off * Fe : NULL, n,
                         A->y + off * D, 0, pass, NULL)))
            return s;
    }
    if (xout)
        for (int64_t t = 0; t < N; t++)
            for (int64_t j = 0; j < k; j++) {
                const float *y = A->y + (int64_t)A->slot[t * k + j] * D;
                float w = A->topw[t * k + j], *o = xout + t * D;
                for (int64_t d = 0; d < D; d++) o[d] += w * y[d];
            }
    return NB_OK;
}

typedef struct {
    float *dA, *dh, *datt, *dq, *dk, *dv, *dqpre, *dkpre;
    float *dY, *dXg, *dlog;   /* MoE: per slot [N*k][D] twice, router logits [N][E] */
    double *dw;               /* MoE: [N][k] gradients of the routing weights */
} bwd_scratch;

/* dx: dL/d(layer output); writes dL/dh2 into S->dh (experts and router). */
static nb_status moe_bwd(nb_ctx *ctx, nb_model *m, nb_layer *L, nb_layer_act *A, int64_t N, const float *dx,
                         const bwd_scratch *S) {
    const nb_model_config *c = &m->cfg;
    int64_t D = c->hidden_size, E = c->n_experts, k = c->n_experts_per_tok, Fe = c->moe_intermediate_size;
    nb_status s;
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t a = A->slot[t * k + j];
            const float *y = A->y + a * D, *g = dx + t * D;
            float w = A->topw[t * k + j], *dy = S->dY + a * D;
            double dot = 0;
            for (int64_t d = 0; d < D; d++) {
                dot += (double)g[d] * y[d];
                dy[d] = w * g[d];
            }
            S->dw[t * k + j] = dot;
        }
    const int32_t *offs = A->offs;
    for (int64_t e = 0; e < E; e++) {
        int64_t off = offs[e], n = offs[e + 1] - off;
        if (!n) continue;
        const nb_linear *dn = &L->ex[3 * e + 2];
        lin_bwd(ctx, m, dn, ex_in(dn, A->xbe[2], A->a, off), S->dY + off * D, S->dA + off * Fe, 0, n);
    }
    if ((s = nb_op_swiglu_bwd(ctx, A->g, A->u, S->dA, A->g, A->u, N * k * Fe))) return s;   /* g,u <- dg,du */
    for (int64_t e = 0; e < E; e++) {
        int64_t off = offs[e], n = offs[e + 1] - off;
        if (!n) continue;
        const nb_linear *g = &L->ex[3 * e], *u = g + 1;
        lin_bwd(ctx, m, g, ex_in(g, A->xbe[0], A->xg, off), A->g + off * Fe, S->dXg + off * D, 0, n);
        lin_bwd(ctx, m, u, ex_in(u, A->xbe[1], A->xg, off), A->u + off * Fe, S->dXg + off * D, 1, n);
    }
    memset(S->dh, 0, sizeof(float) * (size_t)(N * D));
    for (int64_t a = 0; a < N * k; a++) {
        float *dh = S->dh + (int64_t)A->tok[a] * D;
        const float *src = S->dXg + a * D;
        for (int64_t d = 0; d < D; d++) dh[d] += src[d];
    }
    /* router: through the (renormalised) top-k weights and the softmax */
    for (int64_t t = 0; t < N; t++) {
        const float *p = A->probs + t * E;
        const int32_t *ti = A->topi + t * k;
        const double *dw = S->dw + t * k;
        double tot = 0, wdw = 0, pdp = 0;
        for (int64_t j = 0; j < k; j++) {
            tot += p[ti[j]];
            wdw += dw[j] * A->topw[t * k + j];
        }
        float *dl = S->dlog + t * E;
        for (int64_t e = 0; e < E; e++) dl[e] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            double d = c->norm_topk_prob ? (dw[j] - wdw) / tot : dw[j];
            pdp += d * p[ti[j]];
            dl[ti[j]] = (float)d;   /* dL/dp for the chosen experts, 0 elsewhere */
        }
        for (int64_t e = 0; e < E; e++) dl[e] = (float)((double)p[e] * ((double)dl[e] - pdp));
    }
    const nb_linear *r = &L->router;
    lin_bwd(ctx, m, r, r->has_hook && r->hook.input ? A->xbr : A->h2, S->dlog, S->dh, 1, N);
    return NB_OK;
}

/* ---- one layer ----------------------------------------------------------------------------- */

typedef struct {
    int64_t B, T;
    const float *cos_t, *sin_t;
    nb_kv_cache *cache;
    int64_t pos0;
    int pass;
} fwd_env;

/* x -> xout (xout may equal x; xout NULL skips the final down projection, which a recompute for
 * the backward does not need). */
static nb_status layer_fwd(nb_ctx *ctx, nb_model *m, int64_t l, nb_layer_act *A, const float *x, float *xout,
                           const fwd_env *e) {
    const nb_model_config *c = &m->cfg;
    nb_layer *L = &m->layers[l];
    int64_t N = e->B * e->T, D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim;
    int64_t F = c->intermediate_size;
    nb_status s;
    if ((s = nb_op_rmsnorm_fwd(ctx, x, nb_model_pdata(m, L->p_attn_norm), A->h1, A->rstd1, N, D, (float)c->rms_eps)))
        return s;
    float *qdst = c->qk_norm ? A->qpre : A->q, *kdst = c->qk_norm ? A->kpre : A->k;
    if ((s = lin_fwd(ctx, m, &L->lin[LQ], A->h1, A->xbuf[LQ], N, qdst, 0, e->pass, &A->xin[LQ]))) return s;
    if ((s = lin_fwd(ctx, m, &L->lin[LK], A->h1, A->xbuf[LK], N, kdst, 0, e->pass, &A->xin[LK]))) return s;
    if ((s = lin_fwd(ctx, m, &L->lin[LV], A->h1, A->xbuf[LV], N, A->v, 0, e->pass, &A->xin[LV]))) return s;
    if (c->qk_norm) {
        if ((s = nb_op_rmsnorm_fwd(ctx, A->qpre, nb_model_pdata(m, L->p_q_norm), A->q, A->rstdq, N * H, hd,
                                   (float)c->rms_eps)))
            return s;
        if ((s = nb_op_rmsnorm_fwd(ctx, A->kpre, nb_model_pdata(m, L->p_k_norm), A->k, A->rstdk, N * KVH, hd,
                                   (float)c->rms_eps)))
            return s;
    }
    if ((s = nb_op_rope_fwd(ctx, A->q, N, e->T, H, hd, e->cos_t, e->sin_t))) return s;
    if ((s = nb_op_rope_fwd(ctx, A->k, N, e->T, KVH, hd, e->cos_t, e->sin_t))) return s;
    if (m->kv_hook.kv) {
        /* what the attention reads and a KV cache stores: quantized keys/values, observed or fake-quantized */
        if ((s = m->kv_hook.kv(ctx, m->kv_hook.user, l, A->k, A->v, N, KVH * hd, e->pass))) {
            if (!nb_ctx_last_error(ctx)[0]) nb_fail(ctx, s, "K/V hook of layer %lld failed", (long long)l);
            return s;
        }
    }

    nb_attn_dims ad = {e->B, e->T, e->T, e->T, H, KVH, hd, 0, L->window, (float)(1.0 / sqrt((double)hd))};
    const float *K = A->k, *V = A->v;
    if (e->cache) {
        nb_kv_cache *kc = e->cache;
        int64_t kvd = KVH * hd;
        float *ck = kc->k + l * kc->B * kc->max_len * kvd, *cv = kc->v + l * kc->B * kc->max_len * kvd;
        for (int64_t b = 0; b < e->B; b++) {
            memcpy(ck + (b * kc->max_len + e->pos0) * kvd, A->k + b * e->T * kvd, sizeof(float) * (size_t)(e->T * kvd));
            memcpy(cv + (b * kc->max_len + e->pos0) * kvd, A->v + b * e->T * kvd, sizeof(float) * (size_t)(e->T * kvd));
        }
        ad.Tk = e->pos0 + e->T;
        ad.kv_rows = kc->max_len;
        ad.q_pos0 = e->pos0;
        K = ck;
        V = cv;
    }
    if ((s = nb_op_attention_fwd(ctx, &ad, A->q, K, V, A->att, A->lse))) return s;

    memcpy(A->xmid, x, sizeof(float) * (size_t)(N * D));
    if ((s = lin_fwd(ctx, m, &L->lin[LO], A->att, A->xbuf[LO], N, A->xmid, 1, e->pass, &A->xin[LO]))) return s;
    if ((s = nb_op_rmsnorm_fwd(ctx, A->xmid, nb_model_pdata(m, L->p_mlp_norm), A->h2, A->rstd2, N, D,
                               (float)c->rms_eps)))
        return s;
    if (L->moe) {
        /* the recompute (xout NULL) needs the experts' outputs too: the router's gradient reads them */
        if (xout && xout != A->xmid) memcpy(xout, A->xmid, sizeof(float) * (size_t)(N * D));
        return moe_fwd(ctx, m, L, A, N, xout, e->pass);
    }
    if ((s = lin_fwd(ctx, m, &L->lin[LG], A->h2, A->xbuf[LG], N, A->g, 0, e->pass, &A->xin[LG]))) return s;
    if ((s = lin_fwd(ctx, m, &L->lin[LU], A->h2, A->xbuf[LU], N, A->u, 0, e->pass, &A->xin[LU]))) return s;
    if ((s = nb_op_swiglu_fwd(ctx, A->g, A->u, A->a, N * F))) return s;
    if (!xout) {
        /* still let an input hook of down_proj see the recomputed values, and record its input */
        if (L->lin[LD].has_hook && L->lin[LD].hook.input) {
            memcpy(A->xbuf[LD], A->a, sizeof(float) * (size_t)(N * F));
            s = L->lin[LD].hook.input(ctx, L->lin[LD].hook.user, A->xbuf[LD], N, F, e->pass);
            if (s) return s;
            A->xin[LD] = A->xbuf[LD];
        } else {
            A->xin[LD] = A->a;
        }
        return NB_OK;
    }
    if (xout != A->xmid) memcpy(xout, A->xmid, sizeof(float) * (size_t)(N * D));
    return lin_fwd(ctx, m, &L->lin[LD], A->a, A->xbuf[LD], N, xout, 1, e->pass, &A->xin[LD]);
}

/* dx holds dL/d(layer output) on entry and dL/d(layer input) on return. */
static nb_status layer_bwd(nb_ctx *ctx, nb_model *m, int64_t l, nb_layer_act *A, const float *x, float *dx,
                           const fwd_env *e, const bwd_scratch *S) {
    const nb_model_config *c = &m->cfg;
    nb_layer *L = &m->layers[l];
    int64_t N = e->B * e->T, D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim;
    int64_t F = c->intermediate_size;
    nb_status s;
    /* MLP */
    if (L->moe) {
        if ((s = moe_bwd(ctx, m, L, A, N, dx, S))) return s;
    } else {
        lin_bwd(ctx, m, &L->lin[LD], A->xin[LD], dx, S->dA, 0, N);
        if ((s = nb_op_swiglu_bwd(ctx, A->g, A->u, S->dA, A->g, A->u, N * F))) return s;   /* g,u <- dg,du */
        lin_bwd(ctx, m, &L->lin[LG], A->xin[LG], A->g, S->dh, 0, N);
        lin_bwd(ctx, m, &L->lin[LU], A->xin[LU], A->u, S->dh, 1, N);
    }
    if ((s = nb_op_rmsnorm_bwd(ctx, A->xmid, nb_model_pdata(m, L->p_mlp_norm), A->rstd2, S->dh, dx,
                               nb_model_gdata(m, L->p_mlp_norm), N, D)))
        return s;
    /* attention */
    lin_bwd(ctx, m, &L->lin[LO], A->xin[LO], dx, S->datt, 0, N);
    nb_attn_dims ad = {e->B, e->T, e->T, e->T, H, KVH, hd, 0, L->window, (float)(1.0 / sqrt((double)hd))};
    if ((s = nb_op_attention_bwd(ctx, &ad, A->q, A->k, A->v, A->att, A->lse, S->datt, S->dq, S->dk, S->dv))) return s;
    if ((s = nb_op_rope_bwd(ctx, S->dq, N, e->T, H, hd, e->cos_t, e->sin_t))) return s;
    if ((s = nb_op_rope_bwd(ctx, S->dk, N, e->T, KVH, hd, e->cos_t, e->sin_t))) return s;
    const float *dq = S->dq, *dk = S->dk;
    if (c->qk_norm) {
        memset(S->dqpre, 0, sizeof(float) * (size_t)(N * H * hd));
        memset(S->dkpre, 0, sizeof(float) * (size_t)(N * KVH * hd));
        if ((s = nb_op_rmsnorm_bwd(ctx, A->qpre, nb_model_pdata(m, L->p_q_norm), A->rstdq, S->dq, S->dqpre,
                                   nb_model_gdata(m, L->p_q_norm), N * H, hd)))
            return s;
        if ((s = nb_op_rmsnorm_bwd(ctx, A->kpre, nb_model_pdata(m, L->p_k_norm), A->rstdk, S->dk, S->dkpre,
                                   nb_model_gdata(m, L->p_k_norm), N * KVH, hd)))
            return s;
        dq = S->dqpre;
        dk = S->dkpre;
    }
    lin_bwd(ctx, m, &L->lin[LQ], A->xin[LQ], dq, S->dh, 0, N);
    lin_bwd(ctx, m, &L->lin[LK], A->xin[LK], dk, S->dh, 1, N);
    lin_bwd(ctx, m, &L->lin[LV], A->xin[LV], S->dv, S->dh, 1, N);
    return nb_op_rmsnorm_bwd(ctx, x, nb_model_pdata(m, L->p_attn_norm), A->rstd1, S->dh, dx,
                             nb_model_gdata(m, L->p_attn_norm), N, D);
}

/* ---- forward ------------------------------------------------------------------------------- */

static void rope_tables(const nb_model *m, int64_t pos0, int64_t T, float *cos_t, float *sin_t) {
    int64_t half = m->cfg.head_dim / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)(pos0 + t) * m->inv_freq[i];
            cos_t[t * half + i] = (float)cos(a);
            sin_t[t * half + i] = (float)sin(a);
        }
}

static int64_t sel_row(int64_t r, int64_t T, int64_t start) {
    int64_t per = T - start;
    return (r / per) * T + start + r % per;
}

static int64_t default_chunk_rows(int64_t V) {
    int64_t r = (int64_t)(8 << 20) / (V > 0 ? V : 1);
    return r < 1 ? 1 : r;
}

nb_status nb_model_forward(nb_ctx *ctx, nb_model *m, const int32_t *tokens, int64_t B, int64_t T,
                           const nb_forward_opts *opts) {
    static const nb_forward_opts none = {0};
    if (!opts) opts = &none;
    const nb_model_config *c = &m->cfg;
    int64_t D = c->hidden_size, V = c->vocab_size, Lc = c->n_layers, half = c->head_dim / 2;
    if (B <= 0 || T <= 0) return nb_fail(ctx, NB_ERR_INVALID, "forward: B and T must be positive (got %lld, %lld)",
                                         (long long)B, (long long)T);
    if (opts->logits_start < 0 || opts->logits_start >= T)
        return nb_fail(ctx, NB_ERR_INVALID, "forward: logits_start %lld is outside [0, %lld)",
                       (long long)opts->logits_start, (long long)T);
    if (opts->train && opts->cache) return nb_fail(ctx, NB_ERR_INVALID, "forward: train and a KV cache do not mix");
    nb_kv_cache *kc = opts->cache;
    int64_t pos0 = 0;
    if (kc) {
        if (kc->B != B || kc->n_layers != Lc || kc->kv_dim != c->n_kv_heads * c->head_dim)
            return nb_fail(ctx, NB_ERR_SHAPE, "forward: the KV cache was made for another batch size or model");
        if (kc->len + T > kc->max_len)
            return nb_fail(ctx, NB_ERR_INVALID, "forward: KV cache full (%lld + %lld tokens > %lld)",
                           (long long)kc->len, (long long)T, (long long)kc->max_len);
        pos0 = kc->len;
    }
    int64_t N = B * T;
    for (int64_t i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return nb_fail(ctx, NB_ERR_INVALID, "forward: token id %d at index %lld is outside the vocabulary [0, %lld)",
                           (int)tokens[i], (long long)i, (long long)V);
    m->have_train = 0;
    nb_status s = run_weight_hooks(ctx, m);
    if (s) return s;

    int train = opts->train != 0;
    int keep_all = train && m->recompute == NB_RECOMPUTE_NEVER;
    if (train && m->recompute == NB_RECOMPUTE_AUTO) {
        double bytes = 0;
        for (int64_t l = 0; l < Lc; l++) bytes += 4.0 * (double)act_layout(ctx, m, l, NULL, B, T, NULL);
        keep_all = bytes <= (double)m->act_budget;
    }
    /* forward scratch: RoPE tables, then the residual stream (inference only) */
    size_t need = 2 * al16((size_t)(T * half)) + (train ? 0 : (size_t)(N * D));
    if ((s = nb_grow(m, ctx, &m->ws, &m->ws_floats, need))) return s;
    float *cos_t = m->ws, *sin_t = m->ws + al16((size_t)(T * half));
    rope_tables(m, pos0, T, cos_t, sin_t);
    float *x;
    if (train) {
        if ((s = nb_grow(m, ctx, &m->xs, &m->xs_floats, (size_t)((Lc + 1) * N * D)))) return s;
        x = m->xs;
    } else {
        x = sin_t + al16((size_t)(T * half));
    }
    if ((s = acts_prepare(ctx, m, keep_all ? Lc : 1))) return s;
    if ((s = nb_op_embedding_fwd(ctx, nb_model_pdata(m, m->p_embed), V, tokens, N, D, x))) return s;
    if (opts->hidden && opts->hidden[0]) memcpy(opts->hidden[0], x, sizeof(float) * (size_t)(N * D));

    fwd_env e = {B, T, cos_t, sin_t, kc, pos0, NB_PASS_FORWARD};
    for (int64_t l = 0; l < Lc; l++) {
        if (nb_ctx_interrupted(ctx)) return nb_fail(ctx, NB_ERR_INTERRUPTED, "forward interrupted");
        nb_layer_act *A = &m->acts[keep_all ? l : 0];
        if ((s = act_prepare(ctx, m, l, A, B, T))) return s;
        float *xin = train ? m->xs + l * N * D : x, *xout = train ? m->xs + (l + 1) * N * D : x;
        if ((s = layer_fwd(ctx, m, l, A, xin, xout, &e))) return s;
        if (l + 1 < Lc && opts->hidden && opts->hidden[l + 1])
            memcpy(opts->hidden[l + 1], xout, sizeof(float) * (size_t)(N * D));
    }
    if (kc) kc->len += T;
    const float *xL = train ? m->xs + Lc * N * D : x;

    /* final norm over every row (cheap, and the backward needs its rstd) */
    if ((s = nb_grow(m, ctx, &m->hf, &m->hf_floats, (size_t)(N * D)))) return s;
    if ((s = nb_grow(m, ctx, &m->rstdf, &m->rstdf_floats, (size_t)N))) return s;
    if ((s = nb_op_rmsnorm_fwd(ctx, xL, nb_model_pdata(m, m->p_norm), m->hf, m->rstdf, N, D, (float)c->rms_eps)))
        return s;
    if (opts->hidden && opts->hidden[Lc]) memcpy(opts->hidden[Lc], m->hf, sizeof(float) * (size_t)(N * D));

    /* rows that get logits, and the lm_head input (gathered and hooked when needed) */
    int64_t start = opts->logits_start, nsel = B * (T - start);
    nb_linear *lm = &m->lm_head;
    int hooked_in = lm->has_hook && lm->hook.input;
    int want_logits = opts->logits || opts->on_logits;
    const float *hsel = m->hf;
    if ((start > 0 || hooked_in) && (want_logits || train)) {
        if ((s = nb_grow(m, ctx, &m->hsel, &m->hsel_floats, (size_t)(nsel * D)))) return s;
        for (int64_t r = 0; r < nsel; r++)
            memcpy(m->hsel + r * D, m->hf + sel_row(r, T, start) * D, sizeof(float) * (size_t)D);
        if (hooked_in && (s = lm->hook.input(ctx, lm->hook.user, m->hsel, nsel, D, NB_PASS_FORWARD))) {
            if (!nb_ctx_last_error(ctx)[0]) nb_fail(ctx, s, "input hook of lm_head failed");
            return s;
        }
        hsel = m->hsel;
    }
    if (want_logits) {
        const float *W = lin_weight(m, lm);
        int64_t R = opts->chunk_rows > 0 ? opts->chunk_rows : default_chunk_rows(V);
        if (!opts->on_logits) R = nsel;   /* straight into the caller's buffer */
        else if (!opts->logits && (s = nb_grow(m, ctx, &m->logit_buf, &m->logit_floats, (size_t)(R * V)))) return s;
        for (int64_t r0 = 0; r0 < nsel; r0 += R) {
            int64_t nr = nsel - r0 < R ? nsel - r0 : R;
            float *dst = opts->logits ? opts->logits + r0 * V : m->logit_buf;
            nb_gemm(ctx, 0, 1, nr, V, D, 1.0f, hsel + r0 * D, D, W, D, 0.0f, dst, V);
            if (opts->on_logits && (s = opts->on_logits(ctx, opts->user, r0, nr, V, dst))) {
                if (!nb_ctx_last_error(ctx)[0]) nb_fail(ctx, s, "logits callback failed");
                return s;
            }
        }
    }
    if (train) {
        int32_t *tk = realloc(m->ttokens, sizeof(int32_t) * (size_t)N);
        if (!tk) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (tokens)");
        memcpy(tk, tokens, sizeof(int32_t) * (size_t)N);
        m->ttokens = tk;
        m->tB = B;
        m->tT = T;
        m->tstart = start;
        m->have_train = 1;
        m->kept_all = keep_all;
    }
    return NB_OK;
}

nb_status nb_model_logits(nb_ctx *ctx, nb_model *m, const int32_t *tokens, int64_t B, int64_t T, float *logits) {
    nb_forward_opts o = {0};
    o.logits = logits;
    return nb_model_forward(ctx, m, tokens, B, T, &o);
}

/* ---- backward ------------------------------------------------------------------------------ */

nb_status nb_model_backward(nb_ctx *ctx, nb_model *m, const nb_backward_opts *opts, double *loss_out) {
    static const nb_backward_opts none = {0};
    if (!opts) opts = &none;
    if (loss_out) *loss_out = 0.0;
    if (!m->have_train)
        return nb_fail(ctx, NB_ERR_INVALID, "backward: run nb_model_forward with train = 1 first (once per backward)");
    const nb_model_config *c = &m->cfg;
    int64_t B = m->tB, T = m->tT, start = m->tstart, N = B * T, D = c->hidden_size, V = c->vocab_size;
    int64_t Lc = c->n_layers, F = c->intermediate_size;
    int64_t qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, nsel = B * (T - start);
    nb_status s = nb_model_alloc_grads(ctx, m);
    if (s) return s;
    m->have_train = 0;   /* the saved activations are consumed (overwritten) below */

    size_t nD = al16((size_t)(N * D));
    size_t NK = c->n_experts > 0 ? (size_t)(N * c->n_experts_per_tok) : 0, Fe = (size_t)c->moe_intermediate_size;
    size_t nA = (size_t)(N * F) > NK * Fe ? (size_t)(N * F) : NK * Fe;
    size_t moe_need = NK ? 2 * al16(NK * (size_t)D) + al16((size_t)(N * c->n_experts)) + 2 * al16(NK) : 0;
    size_t need = 2 * nD                                      /* dx, dhf */
                  + al16(nA) + nD                              /* dA, dh */
                  + moe_need                                   /* dY, dXg, dlog, dw (doubles) */
                  + 2 * al16((size_t)(N * qd)) + 2 * al16((size_t)(N * kvd))   /* datt dq dk dv */
                  + (c->qk_norm ? al16((size_t)(N * qd)) + al16((size_t)(N * kvd)) : 0)
                  + al16((size_t)(nsel * D));                  /* dhsel */
    if ((s = nb_grow(m, ctx, &m->bws, &m->bws_floats, need))) return s;
    float *p = m->bws;
    float *dx = p; p += nD;
    float *dhf = p; p += nD;
    bwd_scratch S;
    S.dA = p; p += al16(nA);
    S.dY = S.dXg = S.dlog = NULL;
    S.dw = NULL;
    if (NK) {
        S.dY = p; p += al16(NK * (size_t)D);
        S.dXg = p; p += al16(NK * (size_t)D);
        S.dlog = p; p += al16((size_t)(N * c->n_experts));
        S.dw = (double *)(void *)p; p += 2 * al16(NK);   /* 64-byte aligned, two floats a double */
    }
    S.dh = p; p += nD;
    S.datt = p; p += al16((size_t)(N * qd));
    S.dq = p; p += al16((size_t)(N * qd));
    S.dk = p; p += al16((size_t)(N * kvd));
    S.dv = p; p += al16((size_t)(N * kvd));
    S.dqpre = S.dkpre = NULL;
    if (c->qk_norm) {
        S.dqpre = p; p += al16((size_t)(N * qd));
        S.dkpre = p; p += al16((size_t)(N * kvd));
    }
    float *dhsel = p;

    /* lm_head and the loss, chunk by chunk */
    memset(dhf, 0, sizeof(float) * (size_t)(N * D));
    nb_linear *lm = &m->lm_head;
    int hooked_in = lm->has_hook && lm->hook.input;
    const float *hsel = (start > 0 || hooked_in) ? m->hsel : m->hf;
    double loss = 0.0;
    if (opts->dlogits || opts->loss) {
        const float *W = lin_weight(m, lm);
        float *dW = nb_model_gdata(m, lm->pw);
        int64_t R = default_chunk_rows(V);
        if (!opts->dlogits && (s = nb_grow(m, ctx, &m->logit_buf, &m->logit_floats, (size_t)(R * V)))) return s;
        for (int64_t r0 = 0; r0 < nsel; r0 += R) {
            int64_t nr = nsel - r0 < R ? nsel - r0 : R;
            const float *dl;
            if (opts->dlogits) {
                dl = opts->dlogits + r0 * V;
            } else {
                nb_gemm(ctx, 0, 1, nr, V, D, 1.0f, hsel + r0 * D, D, W, D, 0.0f, m->logit_buf, V);
                double part = 0.0;
                if ((s = opts->loss(ctx, opts->user, r0, nr, V, m->logit_buf, &part))) {
                    if (!nb_ctx_last_error(ctx)[0]) nb_fail(ctx, s, "loss callback failed");
                    return s;
                }
                loss += part;
                dl = m->logit_buf;
            }
            if (dW) nb_gemm(ctx, 1, 0, V, D, nr, 1.0f, dl, V, hsel + r0 * D, D, 1.0f, dW, D);
            nb_gemm(ctx, 0, 0, nr, D, V, 1.0f, dl, V, W, D, 0.0f, dhsel + r0 * D, D);
        }
        for (int64_t r = 0; r < nsel; r++) {
            float *dst = dhf + sel_row(r, T, start) * D;
            const float *src = dhsel + r * D;
            for (int64_t k = 0; k < D; k++) dst[k] += src[k];
        }
    }
    if (opts->dhidden && opts->dhidden[Lc])
        for (int64_t i = 0; i < N * D; i++) dhf[i] += opts->dhidden[Lc][i];
    memset(dx, 0, sizeof(float) * (size_t)(N * D));
    if ((s = nb_op_rmsnorm_bwd(ctx, m->xs + Lc * N * D, nb_model_pdata(m, m->p_norm), m->rstdf, dhf, dx,
                               nb_model_gdata(m, m->p_norm), N, D)))
        return s;

    /* layers, last to first */
    int64_t half = c->head_dim / 2;
    fwd_env e = {B, T, m->ws, m->ws + al16((size_t)(T * half)), NULL, 0, NB_PASS_RECOMPUTE};
    for (int64_t l = Lc - 1; l >= 0; l--) {
        if (nb_ctx_interrupted(ctx)) return nb_fail(ctx, NB_ERR_INTERRUPTED, "backward interrupted");
        if (l + 1 < Lc && opts->dhidden && opts->dhidden[l + 1])
            for (int64_t i = 0; i < N * D; i++) dx[i] += opts->dhidden[l + 1][i];
        nb_layer_act *A;
        if (!m->kept_all) {
            A = &m->acts[0];
            if ((s = act_prepare(ctx, m, l, A, B, T))) return s;
            if ((s = layer_fwd(ctx, m, l, A, m->xs + l * N * D, NULL, &e))) return s;
        } else {
            A = &m->acts[l];
        }
        if ((s = layer_bwd(ctx, m, l, A, m->xs + l * N * D, dx, &e, &S))) return s;
    }
    if (opts->dhidden && opts->dhidden[0])
        for (int64_t i = 0; i < N * D; i++) dx[i] += opts->dhidden[0][i];
    float *dE = nb_model_gdata(m, m->p_embed);
    if (dE && (s = nb_op_embedding_bwd(ctx, m->ttokens, dx, N, D, dE))) return s;
    if (loss_out) *loss_out = loss;
    return NB_OK;
}

/* ---- language-modelling loss --------------------------------------------------------------- */

nb_status nb_lm_loss_fn(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab, float *logits,
                        double *loss) {
    nb_lm_loss *L = user;
    double before = L->loss_sum;
    nb_status s = nb_op_cross_entropy(ctx, logits, L->targets + row0, nrows, vocab, L->ignore_index, L->grad_scale,
                                      &L->loss_sum, &L->count, logits);
    if (loss) *loss += L->loss_sum - before;
    return s;
}

nb_status nb_model_lm_step(nb_ctx *ctx, nb_model *m, const int32_t *tokens, int64_t B, int64_t T,
                           const int32_t *targets, double *mean_loss) {
    if (mean_loss) *mean_loss = NAN;
    if (B <= 0 || T <= 0) return nb_fail(ctx, NB_ERR_INVALID, "lm_step: B and T must be positive");
    int32_t *tg = NULL;
    if (!targets) {
        tg = malloc(sizeof(int32_t) * (size_t)(B * T));
        if (!tg) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (targets)");
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) tg[b * T + t] = t + 1 < T ? tokens[b * T + t + 1] : -100;
        targets = tg;
    }
    int64_t count = 0;
    for (int64_t i = 0; i < B * T; i++) count += targets[i] != -100;
    nb_status s = NB_OK;
    if (count == 0) {
        s = nb_fail(ctx, NB_ERR_INVALID, "lm_step: every target is ignored");
    } else {
        nb_forward_opts fo = {0};
        fo.train = 1;
        s = nb_model_forward(ctx, m, tokens, B, T, &fo);
        if (!s) {
            nb_lm_loss L = {targets, -100, (float)(1.0 / (double)count), 0.0, 0};
            nb_backward_opts bo = {0};
            bo.loss = nb_lm_loss_fn;
            bo.user = &L;
            s = nb_model_backward(ctx, m, &bo, NULL);
            if (!s && mean_loss) *mean_loss = L.loss_sum / (double)L.count;
        }
    }
    free(tg);
    return s;
}

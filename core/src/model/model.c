/* The nb_model object: its config, the flat float32 parameter (and gradient) buffers with one
 * HF-named tensor view per parameter, the module tree, globs, linear hooks, random init and the
 * KV cache. The compute lives in transformer.c, loading in load.c (and arch/, one file per architecture
 * family), evaluation in eval.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch/arch.h"
#include "model/internal.h"

static const char *const k_lin_names[NB_LIN_PER_LAYER] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                          "mlp.down_proj"};

void nb_model_config_init(nb_model_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = NB_ARCH_LLAMA;
    c->vocab_size = 32;
    c->hidden_size = 16;
    c->intermediate_size = 24;
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 4;
    c->max_position = 2048;
    c->rms_eps = 1e-5;
    c->rope_theta = 10000.0;
    c->rope_kind = NB_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->bos_token_id = 1;
    c->n_eos = 1;
    c->eos_token_ids[0] = 2;
}

nb_status nb_model_validate_config(nb_ctx *ctx, const nb_model_config *c) {
#define POS(f) if (c->f <= 0) return nb_fail(ctx, NB_ERR_INVALID, "model config: " #f " must be positive (got %lld)", (long long)c->f)
    POS(vocab_size);
    POS(hidden_size);
    POS(intermediate_size);
    POS(n_layers);
    POS(n_heads);
    POS(n_kv_heads);
    POS(head_dim);
#undef POS
    if (!nb_arch_family_of(c->arch))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "model config: unknown arch %d", (int)c->arch);
    if (c->n_heads % c->n_kv_heads)
        return nb_fail(ctx, NB_ERR_INVALID, "model config: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                       (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->head_dim % 2) return nb_fail(ctx, NB_ERR_INVALID, "model config: head_dim %lld is odd", (long long)c->head_dim);
    if (!(c->rms_eps > 0)) return nb_fail(ctx, NB_ERR_INVALID, "model config: rms_norm_eps must be positive");
    if (!(c->rope_theta > 0)) return nb_fail(ctx, NB_ERR_INVALID, "model config: rope_theta must be positive");
    if (c->rope_kind < 0 || c->rope_kind > NB_ROPE_FREQ_FACTORS)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "model config: unknown rope kind %d", (int)c->rope_kind);
    if ((c->rope_kind == NB_ROPE_LINEAR || c->rope_kind == NB_ROPE_LLAMA3) && !(c->rope_factor > 0))
        return nb_fail(ctx, NB_ERR_INVALID, "model config: rope_scaling factor must be positive");
    if (c->rope_kind == NB_ROPE_LLAMA3 &&
        (!(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_position <= 0))
        return nb_fail(ctx, NB_ERR_INVALID,
                       "model config: llama3 rope_scaling needs high_freq_factor > low_freq_factor and original_max_position_embeddings > 0");
    if (c->sliding_window < 0) return nb_fail(ctx, NB_ERR_INVALID, "model config: sliding_window is negative");
    if (c->n_eos < 0 || c->n_eos > NB_MODEL_MAX_EOS) return nb_fail(ctx, NB_ERR_INVALID, "model config: n_eos out of range");
    if (c->n_experts < 0) return nb_fail(ctx, NB_ERR_INVALID, "model config: n_experts is negative");
    if (c->n_experts > 0) {
        if (!nb_arch_family_of(c->arch)->moe_block)
            return nb_fail(ctx, NB_ERR_INVALID, "model config: arch %s has no experts (n_experts must be 0)",
                           nb_arch_family_of(c->arch)->name);
        if (c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts)
            return nb_fail(ctx, NB_ERR_INVALID, "model config: n_experts_per_tok %d is outside [1, n_experts = %d]",
                           (int)c->n_experts_per_tok, (int)c->n_experts);
        if (c->moe_intermediate_size <= 0)
            return nb_fail(ctx, NB_ERR_INVALID, "model config: moe_intermediate_size must be positive");
        if (c->decoder_sparse_step < 0) return nb_fail(ctx, NB_ERR_INVALID, "model config: decoder_sparse_step is negative");
    } else if (nb_arch_family_of(c->arch)->moe_block) {
        return nb_fail(ctx, NB_ERR_INVALID, "model config: arch %s needs n_experts > 0", nb_arch_family_of(c->arch)->name);
    }
    return NB_OK;
}

int nb_model_layer_is_moe(const nb_model_config *c, int64_t l) {
    int64_t step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    if (c->n_experts <= 0 || (l + 1) % step) return 0;
    return !(l < 256 && (c->mlp_only_layers[l / 64] >> (l % 64) & 1));
}

/* ---- building the parameter and module tables ---------------------------------------------- */

static nb_status add_param(nb_ctx *ctx, nb_model *m, const char *name, int ndim, int64_t d0, int64_t d1, int64_t *idx) {
    if (m->n_params == m->cap_params) {
        int64_t cap = m->cap_params ? 2 * m->cap_params : 64;
        nb_param_rec *p = realloc(m->params, sizeof *p * (size_t)cap);
        if (!p) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (parameter table)");
        m->params = p;
        m->cap_params = cap;
    }
    nb_param_rec *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    p->name = strdup(name);
    if (!p->name) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (parameter name)");
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    p->numel = ndim > 1 ? d0 * d1 : d0;
    p->requires_grad = 1;
    p->src_dtype = NB_F32;
    *idx = m->n_params++;
    return NB_OK;
}

static nb_status add_module(nb_ctx *ctx, nb_model *m, const char *name, int kind, nb_linear *lin) {
    if (m->n_modules == m->cap_modules) {
        int64_t cap = m->cap_modules ? 2 * m->cap_modules : 64;
        nb_module_rec *r = realloc(m->modules, sizeof *r * (size_t)cap);
        if (!r) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (module table)");
        m->modules = r;
        m->cap_modules = cap;
    }
    nb_module_rec *r = &m->modules[m->n_modules];
    r->name = strdup(name);
    if (!r->name) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (module name)");
    r->kind = kind;
    r->lin = lin;
    if (lin) lin->module = m->n_modules;
    m->n_modules++;
    return NB_OK;
}

static nb_status add_linear(nb_ctx *ctx, nb_model *m, nb_linear *lin, const char *name, int layer, int role,
                            int64_t in, int64_t out, int bias) {
    char buf[320];
    nb_status s;
    memset(lin, 0, sizeof *lin);
    lin->layer = layer;
    lin->role = role;
    lin->expert = -1;
    lin->in = in;
    lin->out = out;
    lin->pb = -1;
    snprintf(buf, sizeof buf, "%s.weight", name);
    if ((s = add_param(ctx, m, buf, 2, out, in, &lin->pw))) return s;
    if (bias) {
        snprintf(buf, sizeof buf, "%s.bias", name);
        if ((s = add_param(ctx, m, buf, 1, out, 0, &lin->pb))) return s;
    }
    return NB_OK;
}

nb_status nb_model_alloc_params(nb_ctx *ctx, nb_model *m) {
    const nb_model_config *c = &m->cfg;
    int64_t D = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
    int64_t qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    char buf[256];
    nb_status s;
    const nb_arch_family *fam = nb_arch_family_of(c->arch);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (layers)");

    if ((s = add_param(ctx, m, "model.embed_tokens.weight", 2, c->vocab_size, D, &m->p_embed))) return s;
    for (int64_t l = 0; l < c->n_layers; l++) {
        nb_layer *L = &m->layers[l];
        L->p_q_norm = L->p_k_norm = -1;
        L->window = c->sliding_window;
        int64_t ins[NB_LIN_PER_LAYER] = {D, D, D, qd, D, D, F};
        int64_t outs[NB_LIN_PER_LAYER] = {qd, kvd, kvd, D, F, F, D};
        int bias[NB_LIN_PER_LAYER] = {c->qkv_bias, c->qkv_bias, c->qkv_bias, c->o_bias, c->mlp_bias, c->mlp_bias,
                                      c->mlp_bias};
        L->moe = nb_model_layer_is_moe(c, l);
        for (int r = 0; r < NB_LIN_PER_LAYER; r++) {
            if (L->moe && r >= NB_LINEAR_GATE) {
                memset(&L->lin[r], 0, sizeof L->lin[r]);
                L->lin[r].pw = L->lin[r].pb = -1;
                continue;
            }
            snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)l, k_lin_names[r]);
            if ((s = add_linear(ctx, m, &L->lin[r], buf, (int)l, r, ins[r], outs[r], bias[r]))) return s;
            if (r == NB_LINEAR_O && c->qk_norm) {
                snprintf(buf, sizeof buf, "model.layers.%lld.self_attn.q_norm.weight", (long long)l);
                if ((s = add_param(ctx, m, buf, 1, hd, 0, &L->p_q_norm))) return s;
                snprintf(buf, sizeof buf, "model.layers.%lld.self_attn.k_norm.weight", (long long)l);
                if ((s = add_param(ctx, m, buf, 1, hd, 0, &L->p_k_norm))) return s;
            }
        }
        if (L->moe) {
            int64_t E = c->n_experts, Fe = c->moe_intermediate_size;
            L->ex = calloc((size_t)(3 * E), sizeof *L->ex);
            if (!L->ex) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (experts)");
            snprintf(buf, sizeof buf, "model.layers.%lld.%s.gate", (long long)l, fam->moe_block);
            if ((s = add_linear(ctx, m, &L->router, buf, (int)l, NB_LINEAR_ROUTER, D, E, 0))) return s;
            int64_t eins[3] = {D, D, Fe}, eouts[3] = {Fe, Fe, D};
            for (int64_t e = 0; e < E; e++)
                for (int r = 0; r < 3; r++) {
                    snprintf(buf, sizeof buf, "model.layers.%lld.%s.experts.%lld.%s", (long long)l, fam->moe_block,
                             (long long)e, fam->expert_names[r]);
                    if ((s = add_linear(ctx, m, &L->ex[3 * e + r], buf, (int)l, NB_LINEAR_EXPERT_GATE + r, eins[r],
                                        eouts[r], 0)))
                        return s;
                    L->ex[3 * e + r].expert = (int32_t)e;
                }
        }
        snprintf(buf, sizeof buf, "model.layers.%lld.input_layernorm.weight", (long long)l);
        if ((s = add_param(ctx, m, buf, 1, D, 0, &L->p_attn_norm))) return s;
        snprintf(buf, sizeof buf, "model.layers.%lld.post_attention_layernorm.weight", (long long)l);
        if ((s = add_param(ctx, m, buf, 1, D, 0, &L->p_mlp_norm))) return s;
    }
    if ((s = add_param(ctx, m, "model.norm.weight", 1, D, 0, &m->p_norm))) return s;
    if (c->tied) {
        memset(&m->lm_head, 0, sizeof m->lm_head);
        m->lm_head.layer = -1;
        m->lm_head.expert = -1;
        m->lm_head.role = NB_LINEAR_LM_HEAD;
        m->lm_head.in = D;
        m->lm_head.out = c->vocab_size;
        m->lm_head.pw = m->p_embed;
        m->lm_head.pb = -1;
    } else if ((s = add_linear(ctx, m, &m->lm_head, "lm_head", -1, NB_LINEAR_LM_HEAD, D, c->vocab_size, 0))) {
        return s;
    }

    /* one flat buffer, every parameter 64-byte aligned inside it */
    int64_t off = 0;
    for (int64_t i = 0; i < m->n_params; i++) {
        m->params[i].offset = off;
        off += (m->params[i].numel + 15) & ~(int64_t)15;
    }
    m->flat_numel = off;
    nb_buffer *buf_flat = NULL;
    if ((s = nb_buffer_new(ctx, (size_t)(off > 0 ? off : 1) * sizeof(float), &buf_flat))) return s;
    m->flat = nb_buffer_data(buf_flat);
    int64_t fshape[1] = {off};
    s = nb_tensor_wrap(ctx, buf_flat, NB_F32, 1, fshape, 0, &m->flat_t);
    for (int64_t i = 0; !s && i < m->n_params; i++) {
        nb_param_rec *p = &m->params[i];
        s = nb_tensor_wrap(ctx, buf_flat, NB_F32, p->ndim, p->shape, p->offset * (int64_t)sizeof(float), &p->t);
    }
    nb_buffer_release(buf_flat);
    if (s) return s;

    /* module tree, in HF named_modules() order */
    if ((s = add_module(ctx, m, "model", NB_MODULE_CONTAINER, NULL))) return s;
    if ((s = add_module(ctx, m, "model.embed_tokens", NB_MODULE_EMBEDDING, NULL))) return s;
    if ((s = add_module(ctx, m, "model.layers", NB_MODULE_CONTAINER, NULL))) return s;
    for (int64_t l = 0; l < c->n_layers; l++) {
        nb_layer *L = &m->layers[l];
        snprintf(buf, sizeof buf, "model.layers.%lld", (long long)l);
        if ((s = add_module(ctx, m, buf, NB_MODULE_CONTAINER, NULL))) return s;
        snprintf(buf, sizeof buf, "model.layers.%lld.self_attn", (long long)l);
        if ((s = add_module(ctx, m, buf, NB_MODULE_CONTAINER, NULL))) return s;
        for (int r = 0; r < 4; r++) {
            snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)l, k_lin_names[r]);
            if ((s = add_module(ctx, m, buf, NB_MODULE_LINEAR, &L->lin[r]))) return s;
        }
        if (c->qk_norm) {
            snprintf(buf, sizeof buf, "model.layers.%lld.self_attn.q_norm", (long long)l);
            if ((s = add_module(ctx, m, buf, NB_MODULE_RMSNORM, NULL))) return s;
            snprintf(buf, sizeof buf, "model.layers.%lld.self_attn.k_norm", (long long)l);
            if ((s = add_module(ctx, m, buf, NB_MODULE_RMSNORM, NULL))) return s;
        }
        if (L->moe) {
            const char *blk = fam->moe_block;
            snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)l, blk);
            if ((s = add_module(ctx, m, buf, NB_MODULE_CONTAINER, NULL))) return s;
            snprintf(buf, sizeof buf, "model.layers.%lld.%s.gate", (long long)l, blk);
            if ((s = add_module(ctx, m, buf, NB_MODULE_LINEAR, &L->router))) return s;
            snprintf(buf, sizeof buf, "model.layers.%lld.%s.experts", (long long)l, blk);
            if ((s = add_module(ctx, m, buf, NB_MODULE_CONTAINER, NULL))) return s;
            for (int64_t e = 0; e < c->n_experts; e++) {
                snprintf(buf, sizeof buf, "model.layers.%lld.%s.experts.%lld", (long long)l, blk, (long long)e);
                if ((s = add_module(ctx, m, buf, NB_MODULE_CONTAINER, NULL))) return s;
                for (int r = 0; r < 3; r++) {
                    snprintf(buf, sizeof buf, "model.layers.%lld.%s.experts.%lld.%s", (long long)l, blk, (long long)e,
                             fam->expert_names[r]);
                    if ((s = add_module(ctx, m, buf, NB_MODULE_LINEAR, &L->ex[3 * e + r]))) return s;
                }
            }
        }
        snprintf(buf, sizeof buf, "model.layers.%lld.mlp", (long long)l);
        if (!L->moe && (s = add_module(ctx, m, buf, NB_MODULE_CONTAINER, NULL))) return s;
        for (int r = 4; !L->moe && r < NB_LIN_PER_LAYER; r++) {
            snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)l, k_lin_names[r]);
            if ((s = add_module(ctx, m, buf, NB_MODULE_LINEAR, &L->lin[r]))) return s;
        }
        snprintf(buf, sizeof buf, "model.layers.%lld.input_layernorm", (long long)l);
        if ((s = add_module(ctx, m, buf, NB_MODULE_RMSNORM, NULL))) return s;
        snprintf(buf, sizeof buf, "model.layers.%lld.post_attention_layernorm", (long long)l);
        if ((s = add_module(ctx, m, buf, NB_MODULE_RMSNORM, NULL))) return s;
    }
    if ((s = add_module(ctx, m, "model.norm", NB_MODULE_RMSNORM, NULL))) return s;
    if ((s = add_module(ctx, m, "lm_head", NB_MODULE_LINEAR, &m->lm_head))) return s;

    /* RMSNorm weights start at one so that a fresh model is a sensible network */
    for (int64_t i = 0; i < m->n_params; i++) {
        const char *n = m->params[i].name;
        if (strstr(n, "norm.weight")) {
            float *d = m->flat + m->params[i].offset;
            for (int64_t k = 0; k < m->params[i].numel; k++) d[k] = 1.0f;
        }
    }
    nb_model_compute_inv_freq(m);
    return m->inv_freq ? NB_OK : nb_fail(ctx, NB_ERR_NOMEM, "out of memory (rope table)");
}

/* Effective inverse frequencies, in double: HF computes them in float32, the reference logits in
 * float64; doing it in double keeps us within float32 rounding of both. */
void nb_model_compute_inv_freq(nb_model *m) {
    const nb_model_config *c = &m->cfg;
    int64_t half = c->head_dim / 2;
    if (!m->inv_freq) m->inv_freq = calloc((size_t)half, sizeof(double));
    if (!m->inv_freq) return;
    for (int64_t i = 0; i < half; i++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->head_dim);
        if (c->rope_kind == NB_ROPE_FREQ_FACTORS && m->rope_ff) {
            f /= m->rope_ff[i];
        } else if (c->rope_kind == NB_ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_kind == NB_ROPE_LLAMA3) {
            double old = (double)c->rope_original_max_position;
            double low_wl = old / c->rope_low_freq_factor, high_wl = old / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / c->rope_factor;
            } else if (!(wl < high_wl)) {
                double sm = (old / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - sm) * f / c->rope_factor + sm * f;
            }
        }
        m->inv_freq[i] = f;
    }
}

nb_status nb_model_new(nb_ctx *ctx, const nb_model_config *cfg, nb_model **out) {
    *out = NULL;
    nb_status s = nb_model_validate_config(ctx, cfg);
    if (s) return s;
    nb_model *m = calloc(1, sizeof *m);
    if (!m) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (model)");
    nb_ctx_retain(ctx);
    m->ctx = ctx;
    m->cfg = *cfg;
    m->format = NB_MODEL_MEMORY;
    m->path = strdup("");
    m->recompute = NB_RECOMPUTE_AUTO;
    m->act_budget = (int64_t)1 << 30;
    if ((s = nb_model_alloc_params(ctx, m))) {
        nb_model_free(m);
        return s;
    }
    *out = m;
    return NB_OK;
}

nb_status nb_model_init_random(nb_ctx *ctx, nb_model *m, uint64_t seed, double std) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    for (int64_t i = 0; i < m->n_params; i++) {
        nb_param_rec *p = &m->params[i];
        float *d = m->flat + p->offset;
        int norm = strstr(p->name, "norm.weight") != NULL;
        for (int64_t k = 0; k < p->numel; k++) d[k] = (float)((norm ? 1.0 : 0.0) + std * nb_rng_normal(&r));
    }
    (void)ctx;
    return NB_OK;
}

#define FREE_WS(buf, n) nb_dealloc(m->ctx, (buf), (n) * sizeof(float))

void nb_model_free(nb_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n_params; i++) {
        free(m->params[i].name);
        nb_tensor_release(m->params[i].t);
        nb_tensor_release(m->params[i].g);
    }
    free(m->params);
    for (int64_t i = 0; i < m->n_modules; i++) {
        nb_linear *lin = m->modules[i].lin;
        if (lin) free(lin->w_eff);
        free(m->modules[i].name);
    }
    free(m->modules);
    nb_tensor_release(m->flat_t);
    nb_tensor_release(m->gflat_t);
    for (int64_t l = 0; m->layers && l < m->cfg.n_layers; l++) free(m->layers[l].ex);
    free(m->layers);
    free(m->inv_freq);
    free(m->rope_ff);
    free(m->path);
    free(m->ttokens);
    FREE_WS(m->xs, m->xs_floats);
    FREE_WS(m->hf, m->hf_floats);
    FREE_WS(m->rstdf, m->rstdf_floats);
    FREE_WS(m->hsel, m->hsel_floats);
    for (int64_t i = 0; i < m->n_acts; i++) FREE_WS(m->acts[i].arena, m->acts[i].arena_floats);
    free(m->acts);
    FREE_WS(m->ws, m->ws_floats);
    FREE_WS(m->bws, m->bws_floats);
    FREE_WS(m->logit_buf, m->logit_floats);
    nb_ctx *ctx = m->ctx;
    free(m);
    nb_ctx_release(ctx);
}

/* Grow-only workspaces: allocated through the model's context so that nibble's memory counters
 * (and the Lua GC nudge) see activations; never shrunk while the model lives. */
nb_status nb_grow(nb_model *m, nb_ctx *ctx, float **buf, size_t *have, size_t need) {
    if (need <= *have && *buf) return NB_OK;
    nb_dealloc(m->ctx, *buf, *have * sizeof(float));
    *buf = NULL;
    *have = 0;
    if (need == 0) need = 1;
    float *p = nb_alloc(m->ctx, need * sizeof(float));
    if (!p) {
        nb_ctx_clear_error(m->ctx);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory allocating %zu bytes of activations", need * sizeof(float));
    }
    *buf = p;
    *have = need;
    return NB_OK;
}

/* ---- accessors ----------------------------------------------------------------------------- */

const nb_model_config *nb_model_get_config(const nb_model *m) { return &m->cfg; }
int32_t nb_model_format_of(const nb_model *m) { return m->format; }
const char *nb_model_path(const nb_model *m) { return m->path ? m->path : ""; }
const char *nb_model_arch_name(const nb_model *m) {
    const nb_arch_family *f = nb_arch_family_of(m->cfg.arch);
    return f ? f->name : "?";
}

int64_t nb_model_param_count(const nb_model *m) { return m->n_params; }
const char *nb_model_param_name(const nb_model *m, int64_t i) {
    return i >= 0 && i < m->n_params ? m->params[i].name : NULL;
}
int64_t nb_model_find_param(const nb_model *m, const char *name) {
    for (int64_t i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    if (m->cfg.tied && !strcmp(name, "lm_head.weight")) return m->p_embed;
    return -1;
}
nb_tensor *nb_model_param(const nb_model *m, int64_t i) { return i >= 0 && i < m->n_params ? m->params[i].t : NULL; }
nb_tensor *nb_model_grad(const nb_model *m, int64_t i) { return i >= 0 && i < m->n_params ? m->params[i].g : NULL; }
int32_t nb_model_param_src_dtype(const nb_model *m, int64_t i) {
    return i >= 0 && i < m->n_params ? m->params[i].src_dtype : -1;
}
int64_t nb_model_param_offset(const nb_model *m, int64_t i) {
    return i >= 0 && i < m->n_params ? m->params[i].offset : -1;
}
nb_tensor *nb_model_flat_params(const nb_model *m) { return m->flat_t; }
nb_tensor *nb_model_flat_grads(const nb_model *m) { return m->gflat_t; }

float *nb_model_pdata(const nb_model *m, int64_t p) { return p >= 0 ? m->flat + m->params[p].offset : NULL; }
float *nb_model_gdata(const nb_model *m, int64_t p) {
    return p >= 0 && m->gflat && m->params[p].requires_grad ? m->gflat + m->params[p].offset : NULL;
}

nb_status nb_model_alloc_grads(nb_ctx *ctx, nb_model *m) {
    if (m->gflat) return NB_OK;
    nb_buffer *b = NULL;
    nb_status s = nb_buffer_new(ctx, (size_t)(m->flat_numel > 0 ? m->flat_numel : 1) * sizeof(float), &b);
    if (s) return s;
    int64_t shape[1] = {m->flat_numel};
    s = nb_tensor_wrap(ctx, b, NB_F32, 1, shape, 0, &m->gflat_t);
    for (int64_t i = 0; !s && i < m->n_params; i++) {
        nb_param_rec *p = &m->params[i];
        s = nb_tensor_wrap(ctx, b, NB_F32, p->ndim, p->shape, p->offset * (int64_t)sizeof(float), &p->g);
    }
    if (!s) m->gflat = nb_buffer_data(b);
    nb_buffer_release(b);
    return s;
}

void nb_model_zero_grad(nb_model *m) {
    if (m->gflat) memset(m->gflat, 0, sizeof(float) * (size_t)m->flat_numel);
}

int64_t nb_model_set_requires_grad(nb_model *m, const char *pattern, int32_t requires_grad) {
    int64_t n = 0;
    for (int64_t i = 0; i < m->n_params; i++)
        if (nb_glob_match(pattern, m->params[i].name)) {
            m->params[i].requires_grad = requires_grad ? 1 : 0;
            n++;
        }
    return n;
}
int32_t nb_model_param_requires_grad(const nb_model *m, int64_t i) {
    return i >= 0 && i < m->n_params ? m->params[i].requires_grad : 0;
}

int64_t nb_model_module_count(const nb_model *m) { return m->n_modules; }
const char *nb_model_module_name(const nb_model *m, int64_t i) {
    return i >= 0 && i < m->n_modules ? m->modules[i].name : NULL;
}
int32_t nb_model_module_kind(const nb_model *m, int64_t i) {
    return i >= 0 && i < m->n_modules ? m->modules[i].kind : -1;
}
int64_t nb_model_find_module(const nb_model *m, const char *name) {
    for (int64_t i = 0; i < m->n_modules; i++)
        if (!strcmp(m->modules[i].name, name)) return i;
    return -1;
}

void nb_model_set_recompute(nb_model *m, int32_t mode) {
    m->recompute = mode == NB_RECOMPUTE_NEVER || mode == NB_RECOMPUTE_AUTO ? mode : NB_RECOMPUTE_ALWAYS;
}
void nb_model_set_activation_budget(nb_model *m, int64_t bytes) { m->act_budget = bytes > 0 ? bytes : 0; }

/* ---- glob ---------------------------------------------------------------------------------- */

/* Matches one bracket expression at *pp against ch; advances *pp past it. -1 if malformed. */
static int match_class(const char **pp, char ch) {
    const char *p = *pp + 1;
    int neg = 0, ok = 0;
    if (*p == '!' || *p == '^') { neg = 1; p++; }
    int first = 1;
    while (*p && (*p != ']' || first)) {
        char lo = *p, hi = *p;
        if (lo == '\\' && p[1]) lo = hi = *++p;
        if (p[1] == '-' && p[2] && p[2] != ']') {
            hi = p[2];
            if (hi == '\\' && p[3]) { hi = p[3]; p++; }
            p += 2;
        }
        if (ch >= lo && ch <= hi) ok = 1;
        p++;
        first = 0;
    }
    if (*p != ']') return -1;
    *pp = p + 1;
    return ok != neg;
}

int nb_glob_match(const char *pat, const char *s) {
    const char *star_p = NULL, *star_s = NULL;
    while (*s) {
        if (*pat == '*') {
            while (*pat == '*') pat++;
            if (!*pat) return 1;
            star_p = pat;
            star_s = s;
            continue;
        }
        int ok;
        const char *next = pat;
        if (*pat == '?') {
            ok = 1;
            next = pat + 1;
        } else if (*pat == '[') {
            const char *q = pat;
            int r = match_class(&q, *s);
            if (r < 0) { ok = (*s == '['); next = pat + 1; }
            else { ok = r; next = q; }
        } else if (*pat == '\\' && pat[1]) {
            ok = pat[1] == *s;
            next = pat + 2;
        } else {
            ok = *pat && *pat == *s;
            next = pat + 1;
        }
        if (ok) {
            pat = next;
            s++;
        } else if (star_p) {
            pat = star_p;
            s = ++star_s;
        } else {
            return 0;
        }
    }
    while (*pat == '*') pat++;
    return *pat == 0;
}

/* ---- linear modules and hooks -------------------------------------------------------------- */

nb_status nb_model_linear_info(nb_ctx *ctx, const nb_model *m, int64_t module, nb_linear_info *out) {
    if (module < 0 || module >= m->n_modules || !m->modules[module].lin)
        return nb_fail(ctx, NB_ERR_INVALID, "module %lld is not a linear module", (long long)module);
    const nb_linear *l = m->modules[module].lin;
    out->in_features = l->in;
    out->out_features = l->out;
    out->layer = l->layer;
    out->role = l->role;
    out->has_bias = l->pb >= 0;
    out->tied = l->role == NB_LINEAR_LM_HEAD && m->cfg.tied;
    out->weight_param = l->pw;
    out->bias_param = l->pb;
    out->expert = l->expert;
    return NB_OK;
}

nb_status nb_model_set_linear_hook(nb_ctx *ctx, nb_model *m, int64_t module, const nb_linear_hook *hook) {
    if (module < 0 || module >= m->n_modules || !m->modules[module].lin)
        return nb_fail(ctx, NB_ERR_INVALID, "module %lld (%s) is not a linear module", (long long)module,
                       module >= 0 && module < m->n_modules ? m->modules[module].name : "?");
    nb_linear *l = m->modules[module].lin;
    if (!hook || (!hook->weight && !hook->input)) {
        memset(&l->hook, 0, sizeof l->hook);
        l->has_hook = 0;
        free(l->w_eff);
        l->w_eff = NULL;
        return NB_OK;
    }
    l->hook = *hook;
    l->has_hook = 1;
    if (!hook->weight) {
        free(l->w_eff);
        l->w_eff = NULL;
    }
    m->have_train = 0;   /* activations saved without the hook no longer match */
    return NB_OK;
}

/* ---- KV cache ------------------------------------------------------------------------------ */

nb_status nb_kv_cache_new(nb_ctx *ctx, const nb_model *m, int64_t B, int64_t max_len, nb_kv_cache **out) {
    *out = NULL;
    if (B <= 0 || max_len <= 0) return nb_fail(ctx, NB_ERR_INVALID, "kv cache: B and max_len must be positive");
    nb_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (kv cache)");
    c->B = B;
    c->max_len = max_len;
    c->n_layers = m->cfg.n_layers;
    c->kv_dim = m->cfg.n_kv_heads * m->cfg.head_dim;
    size_t n = (size_t)(c->n_layers * B * max_len * c->kv_dim);
    c->k = nb_alloc(ctx, n * sizeof(float));
    c->v = c->k ? nb_alloc(ctx, n * sizeof(float)) : NULL;
    if (!c->v) {
        nb_dealloc(ctx, c->k, n * sizeof(float));
        free(c);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (kv cache of %zu floats)", 2 * n);
    }
    nb_ctx_retain(ctx);
    c->ctx = ctx;
    *out = c;
    return NB_OK;
}

void nb_kv_cache_free(nb_kv_cache *c) {
    if (!c) return;
    size_t n = (size_t)(c->n_layers * c->B * c->max_len * c->kv_dim);
    nb_dealloc(c->ctx, c->k, n * sizeof(float));
    nb_dealloc(c->ctx, c->v, n * sizeof(float));
    nb_ctx_release(c->ctx);
    free(c);
}

int64_t nb_kv_cache_len(const nb_kv_cache *c) { return c->len; }
void nb_kv_cache_reset(nb_kv_cache *c) { c->len = 0; }

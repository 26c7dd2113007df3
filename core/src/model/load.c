/* Loading models: a Hugging Face directory (config.json + safetensors, one file or sharded) or a
 * GGUF file (the families of model/arch/ read from GGUF), into the float32 parameters of an nb_model
 * with HF names. The fields every family has are read here, each family's own in model/arch/. GGUF llama q/k rows come in the interleaved RoPE layout and are permuted back to HF's
 * rotate-half layout here, so one forward serves both. Every disagreement between config and
 * weights is an error that names the field or tensor. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "nibble/gguf.h"
#include "nibble/export.h"
#include "nibble/safetensors.h"
#include "io/json_int.h"
#include "model/arch/arch.h"
#include "model/internal.h"

/* ---- a tensor source: HF safetensors or GGUF, addressed by HF name -------------------------- */

typedef struct {
    int is_gguf;
    const char *path;
    nb_st *st;
    nb_gguf *g;
    int permute_qk;           /* GGUF llama: interleaved -> rotate-half */
    char *used;               /* one flag per file tensor */
    int64_t n_file;
} src_t;

static const struct { const char *hf, *gg; } k_layer_map[] = {
    {"self_attn.q_proj.", "attn_q."},       {"self_attn.k_proj.", "attn_k."},
    {"self_attn.v_proj.", "attn_v."},       {"self_attn.o_proj.", "attn_output."},
    {"self_attn.q_norm.", "attn_q_norm."},  {"self_attn.k_norm.", "attn_k_norm."},
    {"input_layernorm.", "attn_norm."},     {"post_attention_layernorm.", "ffn_norm."},
    {"mlp.gate_proj.", "ffn_gate."},        {"mlp.up_proj.", "ffn_up."},
    {"mlp.down_proj.", "ffn_down."},
};

/* GGUF name of an HF parameter name (buf), or NULL if it has none. */
static const char *gguf_name(const char *hf, char *buf, size_t cap) {
    if (!strcmp(hf, "model.embed_tokens.weight")) return "token_embd.weight";
    if (!strcmp(hf, "model.norm.weight")) return "output_norm.weight";
    if (!strcmp(hf, "lm_head.weight")) return "output.weight";
    long long l;
    int used = 0;
    if (sscanf(hf, "model.layers.%lld.%n", &l, &used) == 1 && used > 0) {
        const char *rest = hf + used;
        for (size_t i = 0; i < sizeof k_layer_map / sizeof k_layer_map[0]; i++) {
            size_t n = strlen(k_layer_map[i].hf);
            if (!strncmp(rest, k_layer_map[i].hf, n)) {
                snprintf(buf, cap, "blk.%lld.%s%s", l, k_layer_map[i].gg, rest + n);
                return buf;
            }
        }
    }
    return NULL;
}

static int64_t src_find(src_t *S, const char *hf, const char **file_name, char *buf, size_t cap) {
    if (!S->is_gguf) {
        *file_name = hf;
        return nb_st_find(S->st, hf);
    }
    const char *g = gguf_name(hf, buf, cap);
    *file_name = g ? g : hf;
    return g ? nb_gguf_find_tensor(S->g, g) : -1;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* interleaved (GGUF/Meta) -> rotate-half (HF) rows of one q or k weight [n_heads*hd, cols] */
static nb_status unpermute_rows(nb_ctx *ctx, float *w, int64_t n_heads, int64_t hd, int64_t cols) {
    int64_t half = hd / 2;
    float *tmp = malloc(sizeof(float) * (size_t)(hd * cols));
    if (!tmp) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (q/k permutation)");
    for (int64_t h = 0; h < n_heads; h++) {
        float *blk = w + h * hd * cols;
        for (int64_t i = 0; i < half; i++)
            for (int64_t c = 0; c < 2; c++)
                memcpy(tmp + (c * half + i) * cols, blk + (2 * i + c) * cols, sizeof(float) * (size_t)cols);
        memcpy(blk, tmp, sizeof(float) * (size_t)(hd * cols));
    }
    free(tmp);
    return NB_OK;
}

/* Fetch one parameter from the file into the flat buffer, checking presence, shape and dtype. */
static nb_status load_param(nb_ctx *ctx, nb_model *m, src_t *S, int64_t p) {
    nb_param_rec *P = &m->params[p];
    char gbuf[320], have[96], want[96];
    size_t L = strlen(P->name);
    if (!S->is_gguf && P->ndim == 2 && L > 7 && L < sizeof gbuf + 7 && !strcmp(P->name + L - 7, ".weight")) {
        /* an exported checkpoint (ModelOpt / compressed-tensors): dequantized as the serving loaders do */
        nb_readback_info rb;
        snprintf(gbuf, sizeof gbuf, "%.*s", (int)(L - 7), P->name);
        nb_status s = nb_readback_probe(ctx, S->st, gbuf, &rb);
        if (s) return s;
        if (rb.format != NB_FMT_NONE) {
            s = nb_readback_weight(ctx, S->st, gbuf, P->shape[0], P->shape[1], m->flat + P->offset, S->used);
            if (!s) P->src_dtype = -1;
            return s;
        }
    }
    const char *fname;
    int64_t idx = src_find(S, P->name, &fname, gbuf, sizeof gbuf);
    if (idx < 0) {
        if (S->is_gguf)
            return nb_fail(ctx, NB_ERR_NOT_FOUND, "missing tensor '%s' (%s) in %s", fname, P->name, S->path);
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "missing tensor '%s' in %s", P->name, S->path);
    }
    S->used[idx] = 1;
    nb_tensor *t = NULL;
    nb_status s = S->is_gguf ? nb_gguf_get(ctx, S->g, fname, &t) : nb_st_get(ctx, S->st, fname, &t);
    if (s) return s;
    int64_t wshape[2] = {P->shape[0], P->shape[1]};
    int same = t->ndim == P->ndim && t->shape[0] == wshape[0] && (P->ndim == 1 || t->shape[1] == wshape[1]);
    if (!same) {
        shape_str(have, sizeof have, t->ndim, t->shape);
        shape_str(want, sizeof want, P->ndim, wshape);
        nb_tensor_release(t);
        return nb_fail(ctx, NB_ERR_SHAPE, "tensor '%s' has shape %s, expected %s from the config", fname, have, want);
    }
    int32_t src_dt = t->dtype;
    if (S->is_gguf) {
        const nb_gguf_tensor_info *ti = nb_gguf_tensor_at(S->g, idx);
        if (ti->type != NB_GGML_F32 && ti->type != NB_GGML_F16 && ti->type != NB_GGML_BF16) src_dt = -1;
    }
    if (t->dtype != NB_F32 && t->dtype != NB_F16 && t->dtype != NB_BF16) {
        const nb_dtype_traits *tr = nb_dtype_info(t->dtype);
        nb_tensor_release(t);
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; only F32, BF16 and F16 weights are read", fname,
                       tr ? tr->st_name : "?");
    }
    float *dst = m->flat + P->offset;
    s = nb_convert(dst, NB_F32, nb_tensor_data(t), t->dtype, P->numel);
    nb_tensor_release(t);
    if (s) return nb_fail(ctx, s, "cannot convert tensor '%s' to float32", fname);
    P->src_dtype = src_dt;
    if (S->permute_qk) {
        if (strstr(P->name, "self_attn.q_proj.weight"))
            return unpermute_rows(ctx, dst, m->cfg.n_heads, m->cfg.head_dim, P->shape[1]);
        if (strstr(P->name, "self_attn.k_proj.weight"))
            return unpermute_rows(ctx, dst, m->cfg.n_kv_heads, m->cfg.head_dim, P->shape[1]);
    }
    return NB_OK;
}

static nb_status load_all(nb_ctx *ctx, nb_model *m, src_t *S) {
    for (int64_t p = 0; p < m->n_params; p++) {
        nb_status s = load_param(ctx, m, S, p);
        if (s) return s;
    }
    return NB_OK;
}

/* The first file tensor nothing consumed (ignoring buffers HF sometimes saves), or NULL. */
static const char *unused_tensor(src_t *S) {
    for (int64_t i = 0; i < S->n_file; i++) {
        if (S->used[i]) continue;
        const char *n = S->is_gguf ? nb_gguf_tensor_at(S->g, i)->name : nb_st_entry_at(S->st, i)->name;
        if (strstr(n, "rotary_emb.inv_freq")) continue;
        if (!S->is_gguf && nb_readback_kv_scale_layer(n, NULL) >= 0) continue;   /* KV cache scales: nibble.qmodel reads them */
        return n;
    }
    return NULL;
}

/* ---- Hugging Face config.json --------------------------------------------------------------- */

static char *read_file(nb_ctx *ctx, const char *path, nb_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = nb_fail(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        *st = nb_fail(ctx, NB_ERR_IO, "cannot read %s", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *st = NB_OK;
    return buf;
}

/* A token id: an integer in [0, 2^31), or -1 (none) when it is anything else. */
static int32_t jtoken(const cJSON *v) {
    int64_t x;
    return nb_json_int(v, 0, INT32_MAX, &x) ? (int32_t)x : -1;
}

/* rope_parameters (transformers >= 5) or rope_theta + rope_scaling (older) */
static nb_status parse_rope(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    const cJSON *rp = nb_cfg_get(o, "rope_parameters");
    const cJSON *rs = nb_cfg_get(o, "rope_scaling");
    cfg->rope_theta = nb_cfg_num(c, o, "rope_theta", 10000.0);
    const cJSON *sc = NULL;
    if (rp) {
        if (!cJSON_IsObject(rp)) return nb_fail(c->ctx, NB_ERR_FORMAT, "%s: rope_parameters must be an object", c->path);
        cfg->rope_theta = nb_cfg_num(c, rp, "rope_theta", cfg->rope_theta);
        sc = rp;
    }
    if (rs) {
        if (!cJSON_IsObject(rs)) return nb_fail(c->ctx, NB_ERR_FORMAT, "%s: rope_scaling must be an object or null", c->path);
        sc = rs;
    }
    cfg->rope_kind = NB_ROPE_DEFAULT;
    cfg->rope_factor = 1.0;
    if (sc) {
        const char *type = nb_cfg_str(sc, "rope_type");
        if (!type) type = nb_cfg_str(sc, "type");
        if (!type) type = "default";
        double prf = nb_cfg_num(c, sc, "partial_rotary_factor", 1.0);
        if (prf != 1.0)
            return nb_fail(c->ctx, NB_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported (only 1)", c->path, prf);
        if (!strcmp(type, "default")) {
            cfg->rope_kind = NB_ROPE_DEFAULT;
        } else if (!strcmp(type, "linear")) {
            cfg->rope_kind = NB_ROPE_LINEAR;
            cfg->rope_factor = nb_cfg_num(c, sc, "factor", 0.0);
        } else if (!strcmp(type, "llama3")) {
            cfg->rope_kind = NB_ROPE_LLAMA3;
            cfg->rope_factor = nb_cfg_num(c, sc, "factor", 0.0);
            cfg->rope_low_freq_factor = nb_cfg_num(c, sc, "low_freq_factor", 0.0);
            cfg->rope_high_freq_factor = nb_cfg_num(c, sc, "high_freq_factor", 0.0);
            cfg->rope_original_max_position = nb_cfg_int(c, sc, "original_max_position_embeddings", 1, 0);
        } else {
            return nb_fail(c->ctx, NB_ERR_UNSUPPORTED,
                           "%s: rope_scaling type '%s' is not supported (supported: default, linear, llama3)", c->path, type);
        }
    }
    return c->err;
}

static nb_status parse_hf_config(nb_ctx *ctx, const char *path, const char *text, nb_model_config *cfg, int *tie_known) {
    nb_cfg_reader c = {ctx, path, cJSON_Parse(text), NB_OK};
    if (!c.root || !cJSON_IsObject(c.root)) {
        cJSON_Delete(c.root);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *o = c.root;
    nb_status s = NB_OK;
    nb_model_config_init(cfg);
    const char *mt = nb_cfg_str(o, "model_type");
    const nb_arch_family *fam = nb_arch_family_named(mt);
    if (!mt) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s: missing required field 'model_type'", path); goto done; }
    if (!fam) {
        char names[128];
        nb_arch_names(names, sizeof names, 0);
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unsupported model_type '%s' (supported: %s)", path, mt, names);
        goto done;
    }
    cfg->arch = fam->arch;
    const cJSON *archs = nb_cfg_get(o, "architectures");
    if (archs && cJSON_IsArray(archs)) {
        const cJSON *a0;
        cJSON_ArrayForEach(a0, archs) {
            if (!cJSON_IsString(a0)) continue;
            if (strcmp(a0->valuestring, fam->hf_class) != 0) {
                s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unsupported architectures entry '%s' for model_type '%s'", path,
                            a0->valuestring, mt);
                goto done;
            }
        }
    }
    const cJSON *qcfg = nb_cfg_get(o, "quantization_config");
    const char *qmethod = qcfg ? nb_cfg_str(qcfg, "quant_method") : NULL;
    if (qcfg && !(qmethod && (!strcmp(qmethod, "modelopt") || !strcmp(qmethod, "compressed-tensors")))) {
        /* nibble's own exports (ModelOpt, compressed-tensors) are read back dequantized; others are not */
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: quantization_config with quant_method '%s' is not supported "
                    "(only modelopt and compressed-tensors checkpoints are read back)", path, qmethod ? qmethod : "?");
        goto done;
    }
    const char *act = nb_cfg_str(o, "hidden_act");
    if (!act) act = nb_cfg_str(o, "hidden_activation");
    if (act && strcmp(act, "silu") != 0) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only silu)", path, act);
        goto done;
    }
    cfg->vocab_size = nb_cfg_int(&c, o, "vocab_size", 1, 0);
    cfg->hidden_size = nb_cfg_int(&c, o, "hidden_size", 1, 0);
    cfg->intermediate_size = nb_cfg_int(&c, o, "intermediate_size", 1, 0);
    cfg->n_layers = nb_cfg_int(&c, o, "num_hidden_layers", 1, 0);
    cfg->n_heads = nb_cfg_int(&c, o, "num_attention_heads", 1, 0);
    cfg->n_kv_heads = nb_cfg_int(&c, o, "num_key_value_heads", 0, cfg->n_heads);
    if (c.err) { s = c.err; goto done; }
    if (cfg->n_heads <= 0) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s: num_attention_heads must be positive", path); goto done; }
    cfg->head_dim = nb_cfg_int(&c, o, "head_dim", 0, cfg->hidden_size / cfg->n_heads);
    if (!nb_cfg_get(o, "head_dim") && cfg->hidden_size % cfg->n_heads) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", path,
                    (long long)cfg->hidden_size, (long long)cfg->n_heads);
        goto done;
    }
    cfg->max_position = nb_cfg_int(&c, o, "max_position_embeddings", 0, 0);
    cfg->rms_eps = nb_cfg_num(&c, o, "rms_norm_eps", 1e-6);
    if ((s = parse_rope(&c, o, cfg))) goto done;
    double prf = nb_cfg_num(&c, o, "partial_rotary_factor", 1.0);
    if (prf != 1.0) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported (only 1)", path, prf);
        goto done;
    }
    /* biases, q/k norm, sliding windows: the family's own fields */
    if ((s = fam->hf_config(&c, o, cfg))) goto done;
    const cJSON *bos = nb_cfg_get(o, "bos_token_id");
    cfg->bos_token_id = bos ? jtoken(bos) : -1;
    const cJSON *eos = nb_cfg_get(o, "eos_token_id");
    cfg->n_eos = 0;
    if (eos && cJSON_IsNumber(eos)) {
        if (jtoken(eos) >= 0) cfg->eos_token_ids[cfg->n_eos++] = jtoken(eos);
    } else if (eos && cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) if (jtoken(e) >= 0 && cfg->n_eos < NB_MODEL_MAX_EOS) cfg->eos_token_ids[cfg->n_eos++] =
            jtoken(e);
    }
    const cJSON *tie = nb_cfg_get(o, "tie_word_embeddings");
    *tie_known = tie ? (cJSON_IsTrue(tie) ? 1 : 0) : -1;
    if (c.err) s = c.err;
done:
    cJSON_Delete(c.root);
    return s;
}

/* ---- building a loaded model ---------------------------------------------------------------- */

/* Sizes come from the config before any tensor is read, so they are held to the weights file before
 * anything is allocated: the big matrices alone (embedding, and per layer q, k, v, o, gate, up, down)
 * hold at most 8 elements per byte of tensor data, since no stored type is narrower than 1 bit. */
static nb_status check_size(nb_ctx *ctx, const nb_model_config *c, int64_t data_bytes, const char *cfg_name,
                            const char *path) {
    nb_status s = nb_model_validate_config(ctx, c);
    if (s) return s;
    int64_t D = c->hidden_size, qd, kvd, att, mlp, per, n, emb, cap;
    int ovf = __builtin_mul_overflow(c->n_heads, c->head_dim, &qd) || __builtin_mul_overflow(c->n_kv_heads, c->head_dim, &kvd) ||
              __builtin_add_overflow(qd, kvd, &att) || __builtin_mul_overflow(att, D, &att) ||
              __builtin_mul_overflow(att, 2, &att) || __builtin_mul_overflow(c->intermediate_size, D, &mlp) ||
              __builtin_mul_overflow(mlp, 3, &mlp) || __builtin_add_overflow(att, mlp, &per) ||
              __builtin_mul_overflow(per, c->n_layers, &n) || __builtin_mul_overflow(c->vocab_size, D, &emb) ||
              __builtin_add_overflow(n, emb, &n);
    if (__builtin_mul_overflow(data_bytes, 8, &cap)) cap = INT64_MAX;
    if (ovf)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: %s describes a model whose weight count overflows 64 bits", path, cfg_name);
    if (n > cap)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: %s describes a model of %lld weights, more than the %lld bytes of tensor data "
                       "can hold", path, cfg_name, (long long)n, (long long)data_bytes);
    return NB_OK;
}

static nb_status new_shell(nb_ctx *ctx, const nb_model_config *cfg, int format, const char *path, nb_model **out) {
    nb_status s = nb_model_new(ctx, cfg, out);
    if (s) return s;
    (*out)->format = format;
    free((*out)->path);
    (*out)->path = strdup(path);
    return (*out)->path ? NB_OK : nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
}

static nb_status load_hf(nb_ctx *ctx, const char *dir, nb_model **out) {
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    nb_status s;
    char *text = read_file(ctx, cpath, &s);
    if (!text) return s;
    nb_model_config cfg;
    int tie = -1;
    s = parse_hf_config(ctx, cpath, text, &cfg, &tie);
    free(text);
    if (s) return s;
    nb_st *st = NULL;
    if ((s = nb_st_open(ctx, dir, &st))) {
        struct stat sb;
        char bin[4096];
        snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
        if (stat(bin, &sb) == 0)
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s holds pytorch_model.bin only: nibble reads safetensors, never pickle", dir);
        return s;
    }
    /* tied embeddings are decided by the files: no lm_head.weight means tied */
    int has_lm = nb_st_find(st, "lm_head.weight") >= 0 || (tie != 1 && nb_st_find(st, "lm_head.weight_packed") >= 0);
    if (tie == 0 && !has_lm) {
        nb_st_close(st);
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "missing tensor 'lm_head.weight' in %s (config.json says tie_word_embeddings: false)",
                       dir);
    }
    cfg.tied = !has_lm || tie == 1;
    int64_t bytes = 0;
    for (int64_t i = 0; i < nb_st_count(st); i++) bytes += nb_st_entry_at(st, i)->end - nb_st_entry_at(st, i)->begin;
    if ((s = check_size(ctx, &cfg, bytes, "config.json", dir))) { nb_st_close(st); return s; }
    nb_model *m = NULL;
    if ((s = new_shell(ctx, &cfg, NB_MODEL_HF, dir, &m))) { nb_st_close(st); return s; }
    src_t S = {0, dir, st, NULL, 0, NULL, nb_st_count(st)};
    S.used = calloc((size_t)(S.n_file ? S.n_file : 1), 1);
    if (!S.used) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    if (!s) s = load_all(ctx, m, &S);
    if (!s && has_lm && cfg.tied) {
        /* config says tied and the file also has lm_head.weight: fine only when it is the same matrix */
        int64_t i = nb_st_find(st, "lm_head.weight");
        S.used[i] = 1;
        nb_tensor *t = NULL;
        if (!(s = nb_st_get(ctx, st, "lm_head.weight", &t))) {
            int64_t n = cfg.vocab_size * cfg.hidden_size;
            float *tmp = malloc(sizeof(float) * (size_t)n);
            if (nb_tensor_numel(t) != n || !tmp || nb_convert(tmp, NB_F32, nb_tensor_data(t), t->dtype, n) != NB_OK ||
                memcmp(tmp, nb_model_pdata(m, m->p_embed), sizeof(float) * (size_t)n) != 0)
                s = nb_fail(ctx, NB_ERR_FORMAT,
                            "config.json says tie_word_embeddings: true but lm_head.weight differs from model.embed_tokens.weight in %s",
                            dir);
            free(tmp);
            nb_tensor_release(t);
        }
    }
    const char *extra = s ? NULL : unused_tensor(&S);
    if (extra)
        s = nb_fail(ctx, NB_ERR_FORMAT, "unexpected tensor '%s' in %s: config.json (%s, %lld layers%s) has no place for it",
                    extra, dir, nb_model_arch_name(m), (long long)cfg.n_layers,
                    cfg.qkv_bias || cfg.o_bias || cfg.mlp_bias ? ", with biases" : ", no biases");
    free(S.used);
    nb_st_close(st);
    if (s) { nb_model_free(m); return s; }
    *out = m;
    return NB_OK;
}

/* ---- GGUF ----------------------------------------------------------------------------------- */

static int64_t gkey(nb_gguf *g, const char *arch, const char *suffix) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, suffix);
    return nb_gguf_find_key(g, k);
}

/* The config of a GGUF file from its metadata (and, for biases, tied output and RoPE factors, its
 * tensor table); arch receives general.architecture, *rf the index of rope_freqs.weight or -1. */
static nb_status gguf_config(nb_ctx *ctx, nb_gguf *g, const char *path, nb_model_config *cfgp, char *arch,
                             int64_t *rf_out) {
    nb_status s = NB_OK;
    nb_model_config cfg;
    nb_model_config_init(&cfg);
    int64_t k = nb_gguf_find_key(g, "general.architecture");
    uint64_t len = 0;
    const char *a = k >= 0 && nb_gguf_kv_type(g, k) == NB_GGUF_STRING ? nb_gguf_kv_str(g, k, &len) : NULL;
    if (!a) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s: missing general.architecture", path); goto done; }
    snprintf(arch, 64, "%.*s", (int)(len < 63 ? len : 63), a);
    const nb_arch_family *fam = nb_arch_family_named(arch);
    if (!fam || !fam->gguf) {
        char names[128];
        nb_arch_names(names, sizeof names, 1);
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unsupported GGUF architecture '%s' (supported: %s)", path, arch, names);
        goto done;
    }
    cfg.arch = fam->arch;
#define REQ(field, key) do { int64_t _i = gkey(g, arch, key); \
        if (_i < 0) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s: missing GGUF key '%s.%s'", path, arch, key); goto done; } \
        cfg.field = nb_gguf_kv_int(g, _i); } while (0)
    REQ(n_layers, "block_count");
    REQ(hidden_size, "embedding_length");
    REQ(intermediate_size, "feed_forward_length");
    REQ(n_heads, "attention.head_count");
#undef REQ
    int64_t i;
    cfg.n_kv_heads = (i = gkey(g, arch, "attention.head_count_kv")) >= 0 ? nb_gguf_kv_int(g, i) : cfg.n_heads;
    if (cfg.n_heads <= 0) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s: head_count must be positive", path); goto done; }
    cfg.head_dim = (i = gkey(g, arch, "attention.key_length")) >= 0 ? nb_gguf_kv_int(g, i) : cfg.hidden_size / cfg.n_heads;
    if ((i = gkey(g, arch, "rope.dimension_count")) >= 0 && nb_gguf_kv_int(g, i) != cfg.head_dim) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: partial rotary embeddings (%s.rope.dimension_count %lld < head dim %lld) are not supported",
                    path, arch, (long long)nb_gguf_kv_int(g, i), (long long)cfg.head_dim);
        goto done;
    }
    cfg.rms_eps = (i = gkey(g, arch, "attention.layer_norm_rms_epsilon")) >= 0 ? nb_gguf_kv_float(g, i) : 1e-5;
    cfg.rope_theta = (i = gkey(g, arch, "rope.freq_base")) >= 0 ? nb_gguf_kv_float(g, i) : 10000.0;
    cfg.max_position = (i = gkey(g, arch, "context_length")) >= 0 ? nb_gguf_kv_int(g, i) : 0;
    if ((i = gkey(g, arch, "rope.scaling.type")) >= 0) {
        const char *st = nb_gguf_kv_str(g, i, &len);
        char ty[32];
        snprintf(ty, sizeof ty, "%.*s", (int)(len < 31 ? len : 31), st ? st : "");
        if (!strcmp(ty, "linear")) {
            int64_t f = gkey(g, arch, "rope.scaling.factor");
            cfg.rope_kind = NB_ROPE_LINEAR;
            cfg.rope_factor = f >= 0 ? nb_gguf_kv_float(g, f) : 1.0;
        } else if (strcmp(ty, "none") != 0) {
            s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type '%s' is not supported (none, linear)", path, arch, ty);
            goto done;
        }
    }
    int64_t emb = nb_gguf_find_tensor(g, "token_embd.weight");
    if (emb < 0) { s = nb_fail(ctx, NB_ERR_NOT_FOUND, "missing tensor 'token_embd.weight' in %s", path); goto done; }
    cfg.vocab_size = (i = gkey(g, arch, "vocab_size")) >= 0 ? nb_gguf_kv_int(g, i) : nb_gguf_tensor_at(g, emb)->ne[1];
    cfg.bos_token_id = (i = nb_gguf_find_key(g, "tokenizer.ggml.bos_token_id")) >= 0 ? (int32_t)nb_gguf_kv_int(g, i) : -1;
    cfg.n_eos = 0;
    if ((i = nb_gguf_find_key(g, "tokenizer.ggml.eos_token_id")) >= 0) cfg.eos_token_ids[cfg.n_eos++] = (int32_t)nb_gguf_kv_int(g, i);
    if ((i = nb_gguf_find_key(g, "tokenizer.ggml.eot_token_id")) >= 0 && cfg.n_eos < NB_MODEL_MAX_EOS &&
        (cfg.n_eos == 0 || cfg.eos_token_ids[0] != (int32_t)nb_gguf_kv_int(g, i)))
        cfg.eos_token_ids[cfg.n_eos++] = (int32_t)nb_gguf_kv_int(g, i);
    fam->gguf_config(g, &cfg);   /* biases, q/k norm */
    cfg.tied = nb_gguf_find_tensor(g, "output.weight") < 0;
    int64_t rf = nb_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf >= 0) cfg.rope_kind = NB_ROPE_FREQ_FACTORS;
    *rf_out = rf;
done:
    *cfgp = cfg;
    return s;
}

static nb_status load_gguf(nb_ctx *ctx, const char *path, nb_model **out) {
    nb_gguf *g = NULL;
    nb_status s = nb_gguf_open(ctx, path, &g);
    if (s) return s;
    nb_model *m = NULL;
    nb_model_config cfg;
    src_t S = {1, path, NULL, g, 0, NULL, nb_gguf_tensor_count(g)};
    char arch[64] = "";
    int64_t rf = -1;
    if ((s = gguf_config(ctx, g, path, &cfg, arch, &rf))) goto fail;
    int64_t data_bytes = nb_gguf_file_size(g) - nb_gguf_data_offset(g);   /* < 0: aligned past a file with no data */
    if ((s = check_size(ctx, &cfg, data_bytes > 0 ? data_bytes : 0, "the GGUF metadata", path))) goto fail;
    if ((s = new_shell(ctx, &cfg, NB_MODEL_GGUF, path, &m))) goto fail;
    S.used = calloc((size_t)(S.n_file ? S.n_file : 1), 1);
    if (!S.used) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto fail; }
    S.permute_qk = nb_arch_family_of(cfg.arch)->gguf_interleaved_qk;
    if ((s = load_all(ctx, m, &S))) goto fail;
    if (rf >= 0) {
        S.used[rf] = 1;
        nb_tensor *t = NULL;
        if ((s = nb_gguf_get(ctx, g, "rope_freqs.weight", &t))) goto fail;
        int64_t half = cfg.head_dim / 2;
        if (nb_tensor_numel(t) != half || t->dtype != NB_F32) {
            nb_tensor_release(t);
            s = nb_fail(ctx, NB_ERR_SHAPE, "tensor 'rope_freqs.weight' must be %lld float32 values", (long long)half);
            goto fail;
        }
        m->rope_ff = malloc(sizeof(double) * (size_t)half);
        if (!m->rope_ff) { nb_tensor_release(t); s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto fail; }
        const float *f = nb_tensor_data(t);
        for (int64_t j = 0; j < half; j++) m->rope_ff[j] = f[j];
        nb_tensor_release(t);
        nb_model_compute_inv_freq(m);
    }
    const char *extra = unused_tensor(&S);
    if (extra) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "unexpected tensor '%s' in %s: the metadata (%s, %lld blocks) has no place for it", extra,
                    path, arch, (long long)cfg.n_layers);
        goto fail;
    }
    free(S.used);
    nb_gguf_close(g);
    *out = m;
    return NB_OK;
fail:
    free(S.used);
    nb_model_free(m);
    nb_gguf_close(g);
    return s;
}

/* ---- the config alone ----------------------------------------------------------------------- */

static nb_status hf_read_config(nb_ctx *ctx, const char *dir, nb_model_config *cfg) {
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    nb_status s;
    char *text = read_file(ctx, cpath, &s);
    if (!text) return s;
    int tie = -1;
    s = parse_hf_config(ctx, cpath, text, cfg, &tie);
    free(text);
    if (s) return s;
    /* tied or not is decided by the files, as nb_model_load decides it: the safetensors headers only */
    nb_st *st = NULL;
    if ((s = nb_st_open(ctx, dir, &st))) return s;
    int has_lm = nb_st_find(st, "lm_head.weight") >= 0 || (tie != 1 && nb_st_find(st, "lm_head.weight_packed") >= 0);
    nb_st_close(st);
    if (tie == 0 && !has_lm)
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "missing tensor 'lm_head.weight' in %s (config.json says tie_word_embeddings: false)",
                       dir);
    cfg->tied = !has_lm || tie == 1;
    return nb_model_validate_config(ctx, cfg);
}

/* What a model path names: a Hugging Face directory (also given as one of its .safetensors files:
 * *dir is then that file's directory) or a GGUF file (recognised by its magic). */
typedef enum { SRC_HF, SRC_GGUF } model_src;

/* An export's staging folder (OUT.nibble-tmp-PID/, holding an INCOMPLETE note and the files in its
 * export/ subfolder) may hold every file of a model when a process dies just before the final rename:
 * a reader given it, its export/ subfolder or a file in either refuses it rather than read half a
 * checkpoint. */
nb_status nb_model_check_finished(nb_ctx *ctx, const char *path) {
    char dir[4096], note[4200];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s", path);
    if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    }
    size_t L = strlen(dir);
    while (L > 1 && dir[L - 1] == '/') dir[--L] = 0;
    snprintf(note, sizeof note, "%s/INCOMPLETE", dir);
    int hit = stat(note, &sb) == 0;
    if (!hit && L >= 6 && !strcmp(dir + L - 6, "export") && (L == 6 || dir[L - 7] == '/')) {
        snprintf(note, sizeof note, "%.*sINCOMPLETE", (int)(L - 6), dir);
        hit = stat(note, &sb) == 0;
    }
    if (!hit) return NB_OK;
    return nb_fail(ctx, NB_ERR_FORMAT, "%s is an unfinished nibble export (%s says so): not a model; run the export "
                   "again", path, note);
}

static nb_status model_source(nb_ctx *ctx, const char *path, char dir[4096], model_src *kind) {
    struct stat sb;
    if (stat(path, &sb) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    snprintf(dir, 4096, "%s", path);
    *kind = SRC_HF;
    if (S_ISDIR(sb.st_mode)) return nb_model_check_finished(ctx, path);
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    if (n == 4 && !memcmp(magic, "GGUF", 4)) { *kind = SRC_GGUF; return NB_OK; }
    size_t pl = strlen(path);
    if (pl > 12 && !strcmp(path + pl - 12, ".safetensors")) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, 4096, ".");
        return nb_model_check_finished(ctx, path);
    }
    return nb_fail(ctx, NB_ERR_FORMAT, "%s is neither a model directory (config.json + safetensors) nor a GGUF file", path);
}

nb_status nb_model_read_config(nb_ctx *ctx, const char *path, nb_model_config *cfg) {
    nb_model_config_init(cfg);
    char dir[4096];
    model_src kind;
    nb_status s = model_source(ctx, path, dir, &kind);
    if (s) return s;
    if (kind == SRC_HF) return hf_read_config(ctx, dir, cfg);
    nb_gguf *g = NULL;
    if ((s = nb_gguf_open(ctx, path, &g))) return s;
    char arch[64] = "";
    int64_t rf = -1;
    s = gguf_config(ctx, g, path, cfg, arch, &rf);
    nb_gguf_close(g);
    return s ? s : nb_model_validate_config(ctx, cfg);
}

nb_status nb_model_load(nb_ctx *ctx, const char *path, nb_model **out) {
    *out = NULL;
    char dir[4096];
    model_src kind;
    nb_status s = model_source(ctx, path, dir, &kind);
    if (s) return s;
    return kind == SRC_GGUF ? load_gguf(ctx, path, out) : load_hf(ctx, dir, out);
}

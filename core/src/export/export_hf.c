/* Export of a quantized model as a Hugging Face checkpoint in the ModelOpt layout (FORMATS.md §3:
 * weight / weight_scale / weight_scale_2 / input_scale, hf_quant_config.json, quantization_config in
 * config.json) or the compressed-tensors layout (§4: weight_packed, inverted global scales). Every
 * quantized weight goes through its nb_quantizer, the one that fake-quantized it in training. Files are
 * written into a temporary sibling directory that replaces the target only when all is written, and
 * only a missing target, an empty directory or a previous nibble export is ever replaced
 * (nb_export_check_target): a user's folder, a file or a source model is refused before any work. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/json_py.h"
#include "nibble/safetensors.h"
#include "nibble/tokenizer.h"
#include "ptq/qmodel_internal.h"

void nb_export_opts_init(nb_export_opts *o) {
    memset(o, 0, sizeof *o);
    o->layout = NB_LAYOUT_MODELOPT;
    o->dtype = -1;
}

/* ---- small helpers -------------------------------------------------------------------------- */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) { nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static nb_status copy_file(nb_ctx *ctx, const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return nb_fail(ctx, NB_ERR_IO, "cannot read %s: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) { fclose(in); return nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", dst, strerror(errno)); }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) { ok = 0; break; }
    if (ferror(in)) ok = 0;
    fclose(in);
    if (fclose(out) != 0) ok = 0;
    return ok ? NB_OK : nb_fail(ctx, NB_ERR_IO, "cannot copy %s to %s", src, dst);
}

/* dir + "/" + name into out; 0 if it fit. */
static int join_path(char *out, size_t cap, const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    if (a + 1 + b + 1 > cap) return -1;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return 0;
}

/* The files write_all copies from the source directory (or writes for a GGUF's tokenizer). */
static const char *const copied_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "generation_config.json", "tokenizer.model", "chat_template.jinja", NULL};

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static nb_status scalar_f32(nb_ctx *ctx, float v, int ndim, nb_dtype dt, nb_tensor **out) {
    int64_t shape[1] = {1};
    nb_status s = nb_tensor_new(ctx, dt, ndim, shape, out);
    if (s) return s;
    int64_t idx[1] = {0};
    return nb_tensor_set(ctx, *out, idx, (double)v);
}

/* The dtype an unquantized tensor is written in. */
static nb_dtype out_dtype(const nb_qmodel *qm, int64_t param, const nb_export_opts *o) {
    if (o->dtype >= 0) return (nb_dtype)o->dtype;
    int32_t src = nb_model_param_src_dtype(qm->m, param);
    return (src == NB_F32 || src == NB_F16 || src == NB_BF16) ? (nb_dtype)src : NB_BF16;
}

static const char *torch_dtype_name(nb_dtype dt) {
    switch (dt) {
    case NB_F32: return "float32";
    case NB_F16: return "float16";
    default: return "bfloat16";
    }
}

/* ---- per-module quant_algo and the JSON ----------------------------------------------------- */

static const char *quant_algo_of(const nb_qspec *s) {
    switch (s->weight_format) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46: return s->input_format == NB_FMT_NVFP4 ? "NVFP4" : "W4A16_NVFP4";
    case NB_FMT_MXFP8: return "MXFP8";
    case NB_FMT_FP8_TENSOR: return "FP8";
    case NB_FMT_FP8_CHANNEL: return "FP8_PER_CHANNEL_PER_TOKEN";
    default: return NULL;
    }
}

static int group_size_of(const nb_qspec *s) {
    const nb_qformat_traits *t = nb_qformat_info((nb_qformat)s->weight_format);
    return t ? t->block_size : 0;
}

typedef struct strset {
    char **v;
    int64_t n, cap;
} strset;

static int strset_has(const strset *s, const char *x) {
    for (int64_t i = 0; i < s->n; i++) if (strcmp(s->v[i], x) == 0) return 1;
    return 0;
}

static int strset_add(strset *s, const char *x, size_t len) {
    char *d = malloc(len + 1);
    if (!d) return -1;
    memcpy(d, x, len);
    d[len] = 0;
    if (strset_has(s, d)) { free(d); return 0; }
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 64;
        char **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) { free(d); return -1; }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = d;
    return 0;
}

static void strset_free(strset *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ModelOpt's _prefix_wildcard_summarize_exclude_modules: the shortest dot-boundary prefix wildcards
 * ("name*", or "name.*" for a {name, name.*} pair) that match no quantized layer. */
static int summarize_excludes(char **unq, int64_t n_unq, char **quant, int64_t n_quant, strset *res) {
    strset neg = {0};
    int rc = 0;
    for (int64_t i = 0; i < n_quant && !rc; i++) {
        size_t L = strlen(quant[i]);
        rc |= strset_add(&neg, quant[i], L);
        char *tmp = malloc(L + 2);
        if (!tmp) { rc = -1; break; }
        for (size_t k = 0; k <= L && !rc; k++) {
            memcpy(tmp, quant[i], k);
            tmp[k] = '*';
            rc |= strset_add(&neg, tmp, k + 1);
        }
        free(tmp);
    }
    for (int64_t u = 0; u < n_unq && !rc; u++) {
        const char *name = unq[u];
        size_t L = strlen(name);
        char *a = malloc(L + 3), *b = malloc(L + 3);
        if (!a || !b) { free(a); free(b); rc = -1; break; }
        int chosen = 0;   /* 0 none, 1 single a, 2 pair (a, b) */
        int covered = 0;
        for (size_t i = 0; i <= L; i++) {
            int last = (i == L);
            if (!last && name[i] != '.') continue;
            /* candidates at a dot: [name[:i]*] then [name[:i], name[:i].*]; at the end: [name] */
            for (int pair = 0; pair < (last ? 1 : 2); pair++) {
                int na;
                if (last) { memcpy(a, name, L); a[L] = 0; na = 1; }
                else if (!pair) { memcpy(a, name, i); a[i] = '*'; a[i + 1] = 0; na = 1; }
                else { memcpy(a, name, i); a[i] = 0; memcpy(b, name, i); memcpy(b + i, ".*", 3); na = 2; }
                if (strset_has(&neg, a) || (na == 2 && strset_has(&neg, b))) continue;
                if (strset_has(res, a) && (na == 1 || strset_has(res, b))) { covered = 1; break; }
                chosen = na;
                break;
            }
            if (chosen || covered) break;
        }
        if (chosen == 1) rc |= strset_add(res, a, strlen(a));
        else if (chosen == 2) rc |= strset_add(res, b, strlen(b));   /* emit only "prefix.*" */
        free(a);
        free(b);
    }
    strset_free(&neg);
    if (!rc && res->n > 1) qsort(res->v, (size_t)res->n, sizeof *res->v, cmp_str);
    return rc;
}

typedef struct export_plan {
    char **quant_names;   /* quantized module names */
    int64_t n_quant;
    char **unq_names;     /* linear modules left unquantized (have a "quantizer" in ModelOpt's sense) */
    int64_t n_unq;
    const char *algo;     /* single algo, or "MIXED_PRECISION"; NULL when only the KV cache is quantized */
    int group_size;       /* for the single-algo case */
    int mixed;
    int kv;               /* the KV cache is quantized (FP8): k_scale / v_scale written */
} export_plan;

/* kv_cache_quant_algo of a KV format (only FP8 exists in nibble) */
static const char *kv_algo_of(int32_t fmt) { return fmt == NB_FMT_FP8_TENSOR ? "FP8" : NULL; }

static cJSON *modelopt_hf_quant_config(const nb_qmodel *qm, const export_plan *p, const int *included, strset *excl) {
    cJSON *root = cJSON_CreateObject();
    cJSON *prod = cJSON_AddObjectToObject(root, "producer");
    cJSON_AddStringToObject(prod, "name", "nibble");
    cJSON_AddStringToObject(prod, "version", nb_version());
    cJSON *q = cJSON_AddObjectToObject(root, "quantization");
    if (p->algo) cJSON_AddStringToObject(q, "quant_algo", p->algo);
    else cJSON_AddNullToObject(q, "quant_algo");
    /* get_quant_config: the key is always there, "FP8" when the attention's k/v_bmm_quantizers are on */
    if (p->kv) cJSON_AddStringToObject(q, "kv_cache_quant_algo", kv_algo_of(qm->kv_format));
    else cJSON_AddNullToObject(q, "kv_cache_quant_algo");
    if (p->mixed) {
        cJSON *layers = cJSON_AddObjectToObject(q, "quantized_layers");
        for (int64_t i = 0; i < qm->n; i++) {
            if (!included[i]) continue;
            const nb_qspec *s = &qm->mods[i].spec;
            cJSON *l = cJSON_AddObjectToObject(layers, qm->mods[i].name);
            cJSON_AddStringToObject(l, "quant_algo", quant_algo_of(s));
            if (group_size_of(s) > 0) cJSON_AddNumberToObject(l, "group_size", group_size_of(s));
        }
    } else {
        if (p->group_size > 0) cJSON_AddNumberToObject(q, "group_size", p->group_size);
        cJSON *ex = cJSON_AddArrayToObject(q, "exclude_modules");
        for (int64_t i = 0; i < excl->n; i++) cJSON_AddItemToArray(ex, cJSON_CreateString(excl->v[i]));
    }
    return root;
}

static cJSON *modelopt_group(const char *algo, int gs) {
    cJSON *g = cJSON_CreateObject();
    int fp4 = strcmp(algo, "NVFP4") == 0 || strcmp(algo, "W4A16_NVFP4") == 0;
    int bits = fp4 ? 4 : 8;
    if (strcmp(algo, "W4A16_NVFP4") != 0) {
        cJSON *in = cJSON_AddObjectToObject(g, "input_activations");
        cJSON_AddFalseToObject(in, "dynamic");
        cJSON_AddNumberToObject(in, "num_bits", bits);
        cJSON_AddStringToObject(in, "type", "float");
        if (gs > 0) cJSON_AddNumberToObject(in, "group_size", gs);
    }
    cJSON *w = cJSON_AddObjectToObject(g, "weights");
    cJSON_AddFalseToObject(w, "dynamic");
    cJSON_AddNumberToObject(w, "num_bits", bits);
    cJSON_AddStringToObject(w, "type", "float");
    if (strcmp(algo, "FP8_PER_CHANNEL_PER_TOKEN") == 0) cJSON_AddStringToObject(w, "strategy", "channel");
    if (gs > 0) cJSON_AddNumberToObject(w, "group_size", gs);
    return g;
}

/* convert_hf_quant_config_format: the quantization_config ModelOpt embeds in config.json. */
static cJSON *modelopt_quantization_config(const nb_qmodel *qm, const export_plan *p, const int *included,
                                           const strset *excl) {
    cJSON *qc = cJSON_CreateObject();
    cJSON *groups = cJSON_CreateObject();
    if (p->mixed) {
        /* one group per distinct (algo, group_size), in first-seen order; targets are sorted names */
        const char *algos[16];
        int gss[16], ng = 0;
        for (int64_t i = 0; i < qm->n; i++) {
            if (!included[i]) continue;
            const char *a = quant_algo_of(&qm->mods[i].spec);
            int gs = group_size_of(&qm->mods[i].spec), k;
            for (k = 0; k < ng; k++) if (strcmp(algos[k], a) == 0 && gss[k] == gs) break;
            if (k == ng && ng < 16) { algos[ng] = a; gss[ng] = gs; ng++; }
        }
        for (int k = 0; k < ng; k++) {
            cJSON *g = modelopt_group(algos[k], gss[k]);
            strset names = {0};
            for (int64_t i = 0; i < qm->n; i++)
                if (included[i] && strcmp(quant_algo_of(&qm->mods[i].spec), algos[k]) == 0 &&
                    group_size_of(&qm->mods[i].spec) == gss[k])
                    strset_add(&names, qm->mods[i].name, strlen(qm->mods[i].name));
            if (names.n > 1) qsort(names.v, (size_t)names.n, sizeof *names.v, cmp_str);
            cJSON *t = cJSON_AddArrayToObject(g, "targets");
            for (int64_t i = 0; i < names.n; i++) cJSON_AddItemToArray(t, cJSON_CreateString(names.v[i]));
            strset_free(&names);
            char key[32];
            snprintf(key, sizeof key, "group_%d", k);
            cJSON_AddItemToObject(groups, key, g);
        }
    } else if (p->algo && (!strcmp(p->algo, "FP8") || !strcmp(p->algo, "NVFP4") || !strcmp(p->algo, "W4A16_NVFP4"))) {
        cJSON *g = modelopt_group(p->algo, p->group_size);
        cJSON *t = cJSON_AddArrayToObject(g, "targets");
        cJSON_AddItemToArray(t, cJSON_CreateString("Linear"));
        cJSON_AddItemToObject(groups, "group_0", g);
    } else {
        /* convert_hf_quant_config_format writes no config_groups for a single MXFP8 or
         * FP8_PER_CHANNEL_PER_TOKEN checkpoint (only inside MIXED_PRECISION) */
        cJSON_Delete(groups);
        groups = NULL;
    }
    if (groups) cJSON_AddItemToObject(qc, "config_groups", groups);
    if (p->mixed) {
        cJSON *layers = cJSON_AddObjectToObject(qc, "quantized_layers");
        for (int64_t i = 0; i < qm->n; i++) {
            if (!included[i]) continue;
            cJSON *l = cJSON_AddObjectToObject(layers, qm->mods[i].name);
            cJSON_AddStringToObject(l, "quant_algo", quant_algo_of(&qm->mods[i].spec));
            if (group_size_of(&qm->mods[i].spec) > 0)
                cJSON_AddNumberToObject(l, "group_size", group_size_of(&qm->mods[i].spec));
        }
    }
    cJSON *ign = cJSON_AddArrayToObject(qc, "ignore");
    if (!p->mixed)
        for (int64_t i = 0; i < excl->n; i++) cJSON_AddItemToArray(ign, cJSON_CreateString(excl->v[i]));
    if (p->algo) cJSON_AddStringToObject(qc, "quant_algo", p->algo);
    if (p->kv) {
        /* convert_hf_quant_config_format: kv_cache_quant_algo "FP8" becomes this scheme */
        cJSON *kv = cJSON_AddObjectToObject(qc, "kv_cache_scheme");
        cJSON_AddFalseToObject(kv, "dynamic");
        cJSON_AddNumberToObject(kv, "num_bits", 8);
        cJSON_AddStringToObject(kv, "type", "float");
    }
    cJSON *prod = cJSON_AddObjectToObject(qc, "producer");
    cJSON_AddStringToObject(prod, "name", "nibble");
    cJSON_AddStringToObject(prod, "version", nb_version());
    cJSON_AddStringToObject(qc, "quant_method", "modelopt");
    return qc;
}

/* compressed-tensors QuantizationArgs for one side of a scheme. */
static cJSON *ct_args(int32_t fmt, int input) {
    cJSON *a = cJSON_CreateObject();
    if (fmt == NB_FMT_NVFP4 || fmt == NB_FMT_NVFP4_46) {
        if (input) cJSON_AddStringToObject(a, "dynamic", "local");
        else cJSON_AddFalseToObject(a, "dynamic");
        cJSON_AddNumberToObject(a, "group_size", 16);
        cJSON_AddNumberToObject(a, "num_bits", 4);
        if (input) cJSON_AddStringToObject(a, "observer", "static_minmax");
        cJSON_AddStringToObject(a, "scale_dtype", "torch.float8_e4m3fn");
        cJSON_AddStringToObject(a, "strategy", "tensor_group");
    } else if (fmt == NB_FMT_MXFP8) {
        if (input) cJSON_AddTrueToObject(a, "dynamic");
        else cJSON_AddFalseToObject(a, "dynamic");
        cJSON_AddNumberToObject(a, "group_size", 32);
        cJSON_AddNumberToObject(a, "num_bits", 8);
        cJSON_AddStringToObject(a, "scale_dtype", "torch.uint8");
        cJSON_AddStringToObject(a, "strategy", "group");
    } else {
        cJSON_AddFalseToObject(a, "dynamic");
        cJSON_AddNullToObject(a, "group_size");
        cJSON_AddNumberToObject(a, "num_bits", 8);
        if (input) cJSON_AddStringToObject(a, "observer", "static_minmax");
        cJSON_AddStringToObject(a, "strategy", fmt == NB_FMT_FP8_CHANNEL ? "channel" : "tensor");
    }
    cJSON_AddTrueToObject(a, "symmetric");
    cJSON_AddStringToObject(a, "type", "float");
    return a;
}

static const char *ct_format_name(int32_t fmt) {
    switch (fmt) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46: return "nvfp4-pack-quantized";
    case NB_FMT_MXFP8: return "mxfp8-quantized";
    default: return "float-quantized";
    }
}

static cJSON *ct_quantization_config(const nb_qmodel *qm, const int *included, int kv) {
    cJSON *qc = cJSON_CreateObject();
    cJSON *groups = cJSON_AddObjectToObject(qc, "config_groups");
    /* one group per distinct (weight format, input format); targets: "Linear" for a single group
     * that covers every quantized module, else the module names */
    int32_t wf[16], inf[16], ng = 0;
    for (int64_t i = 0; i < qm->n; i++) {
        if (!included[i]) continue;
        const nb_qspec *s = &qm->mods[i].spec;
        int32_t w = s->weight_format == NB_FMT_NVFP4_46 ? NB_FMT_NVFP4 : s->weight_format;
        int k;
        for (k = 0; k < ng; k++) if (wf[k] == w && inf[k] == s->input_format) break;
        if (k == ng && ng < 16) { wf[ng] = w; inf[ng] = s->input_format; ng++; }
    }
    for (int k = 0; k < ng; k++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "format", ct_format_name(wf[k]));
        if (inf[k] != NB_FMT_NONE) cJSON_AddItemToObject(g, "input_activations", ct_args(inf[k], 1));
        else cJSON_AddNullToObject(g, "input_activations");
        cJSON_AddNullToObject(g, "output_activations");
        cJSON *t = cJSON_AddArrayToObject(g, "targets");
        if (ng == 1) {
            cJSON_AddItemToArray(t, cJSON_CreateString("Linear"));
        } else {
            for (int64_t i = 0; i < qm->n; i++) {
                const nb_qspec *s = &qm->mods[i].spec;
                int32_t w = s->weight_format == NB_FMT_NVFP4_46 ? NB_FMT_NVFP4 : s->weight_format;
                if (included[i] && w == wf[k] && s->input_format == inf[k])
                    cJSON_AddItemToArray(t, cJSON_CreateString(qm->mods[i].name));
            }
        }
        cJSON_AddItemToObject(g, "weights", ct_args(wf[k], 0));
        char key[32];
        snprintf(key, sizeof key, "group_%d", k);
        cJSON_AddItemToObject(groups, key, g);
    }
    cJSON_AddStringToObject(qc, "format", ng == 1 ? ct_format_name(wf[0]) : "mixed-precision");
    cJSON_AddNullToObject(qc, "global_compression_ratio");
    cJSON *ign = cJSON_AddArrayToObject(qc, "ignore");
    for (int64_t i = 0; i < qm->n; i++)
        if (!included[i]) cJSON_AddItemToArray(ign, cJSON_CreateString(qm->mods[i].name));
    if (kv) {
        /* llm-compressor's FP8 KV cache: static per-tensor FP8 scales on each attention module */
        cJSON *a = cJSON_CreateObject();
        cJSON_AddFalseToObject(a, "dynamic");
        cJSON_AddNullToObject(a, "group_size");
        cJSON_AddNumberToObject(a, "num_bits", 8);
        cJSON_AddStringToObject(a, "strategy", "tensor");
        cJSON_AddTrueToObject(a, "symmetric");
        cJSON_AddStringToObject(a, "type", "float");
        cJSON_AddItemToObject(qc, "kv_cache_scheme", a);
    } else {
        cJSON_AddNullToObject(qc, "kv_cache_scheme");
    }
    cJSON_AddStringToObject(qc, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(qc, "quantization_status", "compressed");
    return qc;
}

/* config.json for a model that came without one (GGUF, memory): the HF fields transformers needs. */
static cJSON *synth_config(const nb_qmodel *qm, nb_dtype dt) {
    const nb_model_config *c = nb_model_get_config(qm->m);
    static const char *arch_cls[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    const char *type = nb_model_arch_name(qm->m);
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(arch_cls[c->arch >= 0 && c->arch < 4 ? c->arch : 0]));
    cJSON_AddBoolToObject(j, "attention_bias", c->qkv_bias != 0);
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", c->bos_token_id);
    if (c->n_eos == 1) cJSON_AddNumberToObject(j, "eos_token_id", c->eos_token_ids[0]);
    else if (c->n_eos > 1) {
        cJSON *e = cJSON_AddArrayToObject(j, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(e, cJSON_CreateNumber(c->eos_token_ids[i]));
    }
    cJSON_AddNumberToObject(j, "head_dim", (double)c->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c->intermediate_size);
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)(c->max_position > 0 ? c->max_position : 2048));
    cJSON_AddBoolToObject(j, "mlp_bias", c->mlp_bias != 0);
    cJSON_AddStringToObject(j, "model_type", type);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->n_heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->n_layers);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->n_kv_heads);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_eps);
    if (c->rope_kind == NB_ROPE_LLAMA3) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddNumberToObject(r, "factor", c->rope_factor);
        cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_high_freq_factor);
        cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_low_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", (double)c->rope_original_max_position);
        cJSON_AddStringToObject(r, "rope_type", "llama3");
    } else if (c->rope_kind == NB_ROPE_LINEAR) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddNumberToObject(r, "factor", c->rope_factor);
        cJSON_AddStringToObject(r, "rope_type", "linear");
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tied != 0);
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype_name(dt));
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    return j;
}

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cJSON *j = NULL;
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        j = cJSON_Parse(buf);
    }
    free(buf);
    fclose(f);
    return j;
}

/* ---- tensors -------------------------------------------------------------------------------- */

static nb_status add_named(nb_ctx *ctx, nb_st_writer *w, const char *module, const char *suffix, const nb_tensor *t) {
    char name[1200];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    return nb_st_writer_add(ctx, w, name, t);
}

/* llm-compressor keeps FP8 scales in the model dtype. Rounding a scale to BF16 would make the checkpoint
 * dequantize with another scale than the one its codes (and the calibrated student) used, so nibble
 * writes them as F32 [1] / [o, 1], which vLLM and compressed-tensors upcast to anyway. */
static nb_dtype ct_fp8_scale_dtype(void) { return NB_F32; }

static nb_status add_quantized(nb_ctx *ctx, nb_st_writer *w, const nb_qmodel *qm, const nb_qmod *q, const nb_export_opts *o) {
    nb_tensor *wt = nb_model_param(qm->m, q->info.weight_param);
    nb_qtensor *qt = NULL;
    nb_status s = nb_quantizer_quantize(ctx, q->wq, wt, &qt);
    if (s) return s;
    int ct = o->layout == NB_LAYOUT_COMPRESSED_TENSORS;
    int32_t f = q->spec.weight_format;
    nb_tensor *extra = NULL;
    if (f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46) {
        s = add_named(ctx, w, q->name, ct ? "weight_packed" : "weight", qt->data);
        if (!s) s = add_named(ctx, w, q->name, "weight_scale", qt->scale);
        if (!s) {
            float s2 = *(const float *)nb_tensor_data(qt->scale2);
            /* CT stores the inverse of ModelOpt's per-tensor scale (FORMATS §4.1) */
            if (ct) s = scalar_f32(ctx, 1.0f / s2, 1, NB_F32, &extra);
            if (!s) s = add_named(ctx, w, q->name, ct ? "weight_global_scale" : "weight_scale_2", ct ? extra : qt->scale2);
            nb_tensor_release(extra);
            extra = NULL;
        }
    } else if (f == NB_FMT_FP8_TENSOR && ct) {
        float sc = *(const float *)nb_tensor_data(qt->scale);
        s = add_named(ctx, w, q->name, "weight", qt->data);
        if (!s) s = scalar_f32(ctx, sc, 1, ct_fp8_scale_dtype(), &extra);
        if (!s) s = add_named(ctx, w, q->name, "weight_scale", extra);
        nb_tensor_release(extra);
        extra = NULL;
    } else if (f == NB_FMT_FP8_CHANNEL && ct) {
        /* CT's channel strategy: weight_scale [o, 1] (it broadcasts over columns) */
        nb_tensor *conv = NULL;
        int64_t shape[2] = {q->info.out_features, 1};
        s = add_named(ctx, w, q->name, "weight", qt->data);
        if (!s) s = nb_tensor_to(ctx, qt->scale, ct_fp8_scale_dtype(), &conv);
        if (!s) s = nb_tensor_view(ctx, conv, 2, shape, &extra);
        if (!s) s = add_named(ctx, w, q->name, "weight_scale", extra);
        nb_tensor_release(conv);
        nb_tensor_release(extra);
        extra = NULL;
    } else {
        s = add_named(ctx, w, q->name, "weight", qt->data);
        if (!s) s = add_named(ctx, w, q->name, "weight_scale", qt->scale);
    }
    if (!s && q->iq && nb_quantizer_enabled(q->iq)) {
        float is;
        s = nb_quantizer_scale(ctx, q->iq, &is);
        if (!s) {
            int nvfp4_in = q->spec.input_format == NB_FMT_NVFP4;
            if (ct && nvfp4_in) s = scalar_f32(ctx, 1.0f / is, 1, NB_F32, &extra);
            else if (ct) s = scalar_f32(ctx, is, 1, ct_fp8_scale_dtype(), &extra);
            else s = scalar_f32(ctx, is, 0, NB_F32, &extra);
            if (!s) s = add_named(ctx, w, q->name, ct && nvfp4_in ? "input_global_scale" : "input_scale", extra);
            nb_tensor_release(extra);
        }
    }
    nb_qtensor_release(qt);
    return s;
}

static nb_status add_skipped(nb_ctx *ctx, nb_qmodel *qm, const char *name) {
    char **grown = realloc(qm->skipped, (size_t)(qm->n_skipped + 1) * sizeof *grown);
    if (!grown) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    qm->skipped = grown;
    size_t n = strlen(name) + 1;
    qm->skipped[qm->n_skipped] = malloc(n);
    if (!qm->skipped[qm->n_skipped]) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    memcpy(qm->skipped[qm->n_skipped++], name, n);
    return NB_OK;
}

/* Which modules ship quantized, and whether the KV cache does; the guard (or allow_uncalibrated) decides. */
static nb_status decide(nb_ctx *ctx, nb_qmodel *qm, const nb_export_opts *o, int *included, int *kv) {
    for (int64_t i = 0; i < qm->n_skipped; i++) free(qm->skipped[i]);
    free(qm->skipped);
    qm->skipped = NULL;
    qm->n_skipped = 0;
    for (int64_t i = 0; i < qm->n; i++) {
        nb_qmod *q = &qm->mods[i];
        included[i] = q->wq && nb_quantizer_enabled(q->wq);
        if (!included[i]) continue;
        nb_status s = nb_qmodel_check_module(ctx, q);
        if (s == NB_ERR_UNCALIBRATED && o->allow_uncalibrated) {
            included[i] = 0;
            if ((s = add_skipped(ctx, qm, q->name))) return s;
            nb_ctx_clear_error(ctx);
        } else if (s) {
            return s;
        }
    }
    /* the KV cache: one dtype for every layer (vLLM, ModelOpt), so all layers' scales or none */
    *kv = 0;
    int n_on = 0, n_missing = 0;
    for (int64_t k = 0; qm->kvq && k < 2 * qm->n_layers; k++) n_on += nb_quantizer_enabled(qm->kvq[k]) != 0;
    if (n_on == 0) return NB_OK;
    for (int64_t k = 0; k < 2 * qm->n_layers; k++) {
        if (!nb_quantizer_enabled(qm->kvq[k])) {
            char attn[200];
            nb_qmodel_attn_name(k / 2, attn, sizeof attn);
            return nb_fail(ctx, NB_ERR_INVALID, "%s: %c_bmm_quantizer is disabled while other layers quantize the KV "
                           "cache (the KV cache has one dtype in every layer)", attn, k % 2 ? 'v' : 'k');
        }
        nb_status s = nb_qmodel_check_kv(ctx, qm, k);
        if (s == NB_ERR_UNCALIBRATED && o->allow_uncalibrated) {
            n_missing++;
            nb_ctx_clear_error(ctx);
            if ((s = add_skipped(ctx, qm, nb_quantizer_name(qm->kvq[k])))) return s;
        } else if (s) {
            return s;
        }
    }
    *kv = n_missing == 0;
    return NB_OK;
}

/* A GGUF holds its tokenizer: when no source directory supplied a tokenizer.json, write the GGUF's
 * as HF files (tokenizer.json, tokenizer_config.json, special_tokens_map.json) and a
 * generation_config.json with its BOS/EOS, so that transformers, vLLM and `nibble eval` can use the
 * export. A GGUF without a tokenizer, or with one nibble cannot convert, is exported without one,
 * as before. */
static nb_status write_gguf_tokenizer(nb_ctx *ctx, const char *gguf_path, const char *tmp) {
    char path[4096];
    if (join_path(path, sizeof path, tmp, "tokenizer.json") != 0) return nb_fail(ctx, NB_ERR_INVALID, "path too long");
    if (file_exists(path)) return NB_OK;
    nb_tokenizer *tok = NULL;
    nb_status s = nb_tokenizer_load(ctx, gguf_path, &tok);
    if (s == NB_ERR_NOT_FOUND || s == NB_ERR_UNSUPPORTED) {
        nb_ctx_clear_error(ctx);
        return NB_OK;
    }
    if (s) return s;
    /* written aside first: a tokenizer_config.json or special_tokens_map.json the source directory
     * supplied (with a tokenizer.model) is kept, only the missing files are added */
    char aside[4096], from[4096];
    if (join_path(aside, sizeof aside, tmp, ".tokenizer") != 0) {
        nb_tokenizer_free(tok);
        return nb_fail(ctx, NB_ERR_INVALID, "path too long");
    }
    s = nb_tokenizer_save_json(ctx, tok, aside);
    if (s == NB_ERR_UNSUPPORTED) {
        /* nothing was written: the checks come before the files */
        nb_ctx_clear_error(ctx);
        nb_tokenizer_free(tok);
        rm_rf(aside);
        return NB_OK;
    }
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", NULL};
    for (int k = 0; !s && files[k]; k++) {
        join_path(from, sizeof from, aside, files[k]);
        join_path(path, sizeof path, tmp, files[k]);
        if (!file_exists(path) && rename(from, path) != 0)
            s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", from, path, strerror(errno));
    }
    rm_rf(aside);
    join_path(path, sizeof path, tmp, "generation_config.json");
    if (!s && !file_exists(path)) {
        cJSON *g = cJSON_CreateObject();
        if (nb_tokenizer_bos(tok) >= 0) cJSON_AddNumberToObject(g, "bos_token_id", nb_tokenizer_bos(tok));
        if (nb_tokenizer_eos(tok) >= 0) cJSON_AddNumberToObject(g, "eos_token_id", nb_tokenizer_eos(tok));
        if (nb_json_py_write_file(path, g, 2, 0, 1) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
        cJSON_Delete(g);
    }
    nb_tokenizer_free(tok);
    return s;
}

/* k_scale / v_scale of every layer: ModelOpt puts them on k_proj / v_proj as 0-d F32 (its
 * _KV_CACHE_REPLACEMENTS: k_bmm_quantizer._amax -> k_proj.k_scale = amax / 448); llm-compressor on the
 * attention module (self_attn.k_scale), [1], here F32 like nibble's other compressed-tensors FP8 scales. */
static nb_status add_kv_scales(nb_ctx *ctx, nb_st_writer *w, const nb_qmodel *qm, const nb_export_opts *o) {
    int ct = o->layout == NB_LAYOUT_COMPRESSED_TENSORS;
    nb_status s = NB_OK;
    for (int64_t k = 0; !s && k < 2 * qm->n_layers; k++) {
        char attn[200], name[300];
        float sc;
        nb_qmodel_attn_name(k / 2, attn, sizeof attn);
        if (ct) snprintf(name, sizeof name, "%s.%c_scale", attn, k % 2 ? 'v' : 'k');
        else snprintf(name, sizeof name, "%s.%s", attn, k % 2 ? "v_proj.v_scale" : "k_proj.k_scale");
        nb_tensor *t = NULL;
        s = nb_quantizer_scale(ctx, qm->kvq[k], &sc);
        if (!s) s = scalar_f32(ctx, sc, ct ? 1 : 0, ct ? ct_fp8_scale_dtype() : NB_F32, &t);
        if (!s) s = nb_st_writer_add(ctx, w, name, t);
        nb_tensor_release(t);
    }
    return s;
}

static nb_status write_all(nb_ctx *ctx, nb_qmodel *qm, const char *tmp, const nb_export_opts *o, const int *included,
                           int kv) {
    nb_status s = NB_OK;
    /* map weight parameters to their quantized module */
    int64_t np = nb_model_param_count(qm->m);
    int64_t *owner = malloc((size_t)(np > 0 ? np : 1) * sizeof *owner);
    if (!owner) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < np; i++) owner[i] = -1;
    for (int64_t i = 0; i < qm->n; i++) if (included[i]) owner[qm->mods[i].info.weight_param] = i;

    nb_st_writer *w = NULL;
    if ((s = nb_st_writer_new(ctx, &w))) { free(owner); return s; }
    s = nb_st_writer_meta(ctx, w, "format", "pt");
    /* the mark nb_export_check_target looks for: free-form metadata, which every loader ignores */
    if (!s) s = nb_st_writer_meta(ctx, w, "producer", "nibble");
    if (!s) s = nb_st_writer_meta(ctx, w, "producer_version", nb_version());
    nb_dtype main_dt = NB_BF16;
    for (int64_t p = 0; p < np && !s; p++) {
        if (nb_ctx_interrupted(ctx)) { s = nb_fail(ctx, NB_ERR_INTERRUPTED, "export interrupted"); break; }
        if (owner[p] >= 0) { s = add_quantized(ctx, w, qm, &qm->mods[owner[p]], o); continue; }
        nb_tensor *t = nb_model_param(qm->m, p), *c = NULL;
        nb_dtype dt = out_dtype(qm, p, o);
        if (p == 0) main_dt = dt;
        s = nb_tensor_to(ctx, t, dt, &c);
        if (!s) s = nb_st_writer_add(ctx, w, nb_model_param_name(qm->m, p), c);
        nb_tensor_release(c);
    }
    free(owner);
    if (!s && kv) s = add_kv_scales(ctx, w, qm, o);
    if (!s) s = nb_st_writer_write_sharded(ctx, w, tmp, o->max_shard_bytes > 0 ? o->max_shard_bytes : 10000000000LL);
    nb_st_writer_free(w);
    if (s) return s;

    /* the plan for the JSON files */
    export_plan p = {0};
    p.quant_names = calloc((size_t)(qm->n + 1), sizeof(char *));
    p.unq_names = calloc((size_t)(qm->n + 1), sizeof(char *));
    if (!p.quant_names || !p.unq_names) { free(p.quant_names); free(p.unq_names); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); }
    for (int64_t i = 0; i < qm->n; i++) {
        if (included[i]) {
            const char *a = quant_algo_of(&qm->mods[i].spec);
            if (!p.algo) { p.algo = a; p.group_size = group_size_of(&qm->mods[i].spec); }
            else if (strcmp(p.algo, a) != 0 || p.group_size != group_size_of(&qm->mods[i].spec)) p.mixed = 1;
            p.quant_names[p.n_quant++] = qm->mods[i].name;
        } else {
            p.unq_names[p.n_unq++] = qm->mods[i].name;
        }
    }
    if (p.mixed) p.algo = "MIXED_PRECISION";
    p.kv = kv;
    /* ModelOpt lists every module that carries a quantizer, disabled ones included, and it puts
     * (disabled) quantizers on embeddings too: model.embed_tokens is in its exclude_modules */
    int64_t n_emb = 0;
    for (int64_t i = 0; i < nb_model_module_count(qm->m); i++)
        if (nb_model_module_kind(qm->m, i) == NB_MODULE_EMBEDDING) n_emb++;
    if (n_emb && o->layout == NB_LAYOUT_MODELOPT) {
        char **grown = realloc(p.unq_names, (size_t)(qm->n + n_emb + 1) * sizeof(char *));
        if (!grown) { free(p.quant_names); free(p.unq_names); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); }
        p.unq_names = grown;
        for (int64_t i = 0; i < nb_model_module_count(qm->m); i++)
            if (nb_model_module_kind(qm->m, i) == NB_MODULE_EMBEDDING)
                p.unq_names[p.n_unq++] = (char *)nb_model_module_name(qm->m, i);
    }
    strset excl = {0};
    if (summarize_excludes(p.unq_names, p.n_unq, p.quant_names, p.n_quant, &excl)) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");

    char path[4096], src[4096];
    const char *srcdir = o->source_dir;
    char mdir[4096] = "";
    if (!srcdir && nb_model_format_of(qm->m) == NB_MODEL_HF) {
        snprintf(mdir, sizeof mdir, "%s", nb_model_path(qm->m));
        struct stat st;
        if (stat(mdir, &st) == 0 && !S_ISDIR(st.st_mode)) {
            char *slash = strrchr(mdir, '/');
            if (slash) *slash = 0; else snprintf(mdir, sizeof mdir, ".");
        }
        srcdir = mdir;
    }
    cJSON *config = NULL;
    if (!s && srcdir) {
        join_path(src, sizeof src, srcdir, "config.json");
        config = read_json(src);
        if (!config && file_exists(src)) s = nb_fail(ctx, NB_ERR_FORMAT, "%s is not valid JSON", src);
    }
    if (!s && !config) config = synth_config(qm, main_dt);
    if (!s && config) {
        cJSON_DeleteItemFromObject(config, "quantization_config");
        int quantized = p.n_quant > 0 || p.kv;
        if (o->layout == NB_LAYOUT_MODELOPT) {
            if (quantized) {
                cJSON *hq = modelopt_hf_quant_config(qm, &p, included, &excl);
                join_path(path, sizeof path, tmp, "hf_quant_config.json");
                if (nb_json_py_write_file(path, hq, 4, 0, 0) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
                cJSON_Delete(hq);
                cJSON_AddItemToObject(config, "quantization_config", modelopt_quantization_config(qm, &p, included, &excl));
            }
            join_path(path, sizeof path, tmp, "config.json");
            if (!s && nb_json_py_write_file(path, config, 4, 0, 0) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
        } else {
            if (quantized) cJSON_AddItemToObject(config, "quantization_config", ct_quantization_config(qm, included, p.kv));
            join_path(path, sizeof path, tmp, "config.json");
            if (nb_json_py_write_file(path, config, 2, 1, 1) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
        }
    }
    cJSON_Delete(config);
    strset_free(&excl);
    free(p.quant_names);
    free(p.unq_names);
    /* tokenizer and generation files travel with the weights */
    for (int k = 0; !s && srcdir && copied_files[k]; k++) {
        join_path(src, sizeof src, srcdir, copied_files[k]);
        if (!file_exists(src)) continue;
        join_path(path, sizeof path, tmp, copied_files[k]);
        s = copy_file(ctx, src, path);
    }
    if (!s && nb_model_format_of(qm->m) == NB_MODEL_GGUF) s = write_gguf_tokenizer(ctx, nb_model_path(qm->m), tmp);
    return s;
}

/* ---- the target directory ---------------------------------------------------------------- */

/* model-DDDDD-of-DDDDD.safetensors, as nb_st_writer_write_sharded names shards */
static int is_shard_name(const char *n) {
    if (strncmp(n, "model-", 6) != 0) return 0;
    const char *p = n + 6;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    if (strncmp(p, "-of-", 4) != 0) return 0;
    p += 4;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    return strcmp(p, ".safetensors") == 0;
}

/* A file name an export writes (write_all, the safetensors writer); 2 for the weights' entry point. */
static int export_name(const char *n) {
    if (!strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json")) return 2;
    if (!strcmp(n, "config.json") || !strcmp(n, "hf_quant_config.json") || is_shard_name(n)) return 1;
    for (int k = 0; copied_files[k]; k++) if (!strcmp(n, copied_files[k])) return 1;
    return 0;
}

/* Does nibble say it wrote the checkpoint in dir? The safetensors mark, or (exports from before the
 * mark) the producer ModelOpt-layout exports put in config.json's quantization_config. Any failure to
 * read either counts as "no". */
static int has_nibble_mark(nb_ctx *ctx, const char *dir) {
    nb_st *st = NULL;
    int marked = 0;
    if (nb_st_open(ctx, dir, &st) == NB_OK) {
        const char *p = nb_st_metadata(st, "producer");
        marked = p && strcmp(p, "nibble") == 0;
        nb_st_close(st);
    } else {
        nb_ctx_clear_error(ctx);
    }
    if (marked) return 1;
    char path[4096];
    if (join_path(path, sizeof path, dir, "config.json") != 0) return 0;
    cJSON *cfg = read_json(path);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    const cJSON *prod = cJSON_GetObjectItemCaseSensitive(qc, "producer");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(prod, "name");
    marked = cJSON_IsString(name) && strcmp(name->valuestring, "nibble") == 0;
    cJSON_Delete(cfg);
    return marked;
}

#define NOT_OURS "remove it or choose another output directory"

nb_status nb_export_check_target(nb_ctx *ctx, const char *dir) {
    if (!dir || !*dir) return nb_fail(ctx, NB_ERR_INVALID, "export: the output directory is an empty path");
    size_t L = strlen(dir);
    while (L > 1 && dir[L - 1] == '/') L--;
    char target[4096], parent[4096];
    if (L + 64 >= sizeof target) return nb_fail(ctx, NB_ERR_INVALID, "export: path too long: %s", dir);
    snprintf(target, sizeof target, "%.*s", (int)L, dir);
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    if (!strcmp(base, ".") || !strcmp(base, "..") || !strcmp(target, "/"))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s is not a directory an export can replace: name a new "
                       "output directory", target);
    if (!slash) snprintf(parent, sizeof parent, ".");
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash == target ? 1 : slash - target), target);

    /* the export is a sibling temp directory renamed into place: the parent must take it */
    struct stat st;
    if (stat(parent, &st) != 0)
        return nb_fail(ctx, NB_ERR_IO, "export: cannot write %s: its parent directory %s: %s", target, parent,
                       strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return nb_fail(ctx, NB_ERR_IO, "export: cannot write %s: %s is not a directory", target, parent);
    if (access(parent, W_OK | X_OK) != 0)
        return nb_fail(ctx, NB_ERR_IO, "export: cannot write %s: its parent directory %s: %s", target, parent,
                       strerror(errno));

    if (lstat(target, &st) != 0) {
        if (errno == ENOENT) return NB_OK;
        return nb_fail(ctx, NB_ERR_IO, "export: cannot inspect %s: %s", target, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is a symbolic link: %s (or name the directory "
                       "it points to)", target, NOT_OURS);
    if (S_ISREG(st.st_mode))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is a file, not a directory: %s", target, NOT_OURS);
    if (!S_ISDIR(st.st_mode))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a directory: %s", target, NOT_OURS);

    DIR *d = opendir(target);
    if (!d) return nb_fail(ctx, NB_ERR_IO, "export: cannot list %s: %s", target, strerror(errno));
    /* the smallest foreign name, so the message does not depend on readdir's order */
    char foreign[512] = "", path[4096];
    int n = 0, has_config = 0, has_weights = 0;
    struct dirent *e;
    while ((errno = 0, e = readdir(d))) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
        n++;
        int kind = export_name(nm);
        struct stat es;
        int regular = join_path(path, sizeof path, target, nm) == 0 && lstat(path, &es) == 0 && S_ISREG(es.st_mode);
        if (kind && regular) {
            has_config |= !strcmp(nm, "config.json");
            has_weights |= kind == 2;
            continue;
        }
        char shown[512];
        int isdir = !regular && join_path(path, sizeof path, target, nm) == 0 && lstat(path, &es) == 0 &&
                    S_ISDIR(es.st_mode);
        snprintf(shown, sizeof shown, "%s%s", nm, isdir ? "/" : "");
        if (!foreign[0] || strcmp(shown, foreign) < 0) snprintf(foreign, sizeof foreign, "%s", shown);
    }
    int rd_err = errno;
    closedir(d);
    if (rd_err) return nb_fail(ctx, NB_ERR_IO, "export: cannot list %s: %s", target, strerror(rd_err));
    if (n == 0) return NB_OK;
    if (foreign[0])
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a nibble export (it holds %s): %s", target,
                       foreign, NOT_OURS);
    if (!has_config || !has_weights)
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a nibble export (it holds no %s): %s",
                       target, !has_config ? "config.json" : "model.safetensors", NOT_OURS);
    if (!has_nibble_mark(ctx, target))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a nibble export (a model directory nibble "
                       "did not write: its weights do not name nibble as producer): %s", target, NOT_OURS);
    return NB_OK;
}

/* A sibling of target that does not exist yet: target + tag + pid (+ a counter). Never removes
 * anything already there, as the name might be someone's. */
static int free_sibling(char *out, size_t cap, const char *target, const char *tag, int make) {
    for (int k = 0; k < 1000; k++) {
        if (k == 0) snprintf(out, cap, "%s.%s-%ld", target, tag, (long)getpid());
        else snprintf(out, cap, "%s.%s-%ld-%d", target, tag, (long)getpid(), k);
        if (make) {
            if (mkdir(out, 0755) == 0) return 0;
            if (errno != EEXIST) return -1;
        } else {
            struct stat st;
            if (lstat(out, &st) != 0 && errno == ENOENT) return 0;
        }
    }
    errno = EEXIST;
    return -1;
}

nb_status nb_qmodel_export(nb_ctx *ctx, nb_qmodel *qm, const char *dir, const nb_export_opts *opts) {
    nb_export_opts o;
    if (opts) o = *opts; else nb_export_opts_init(&o);
    if (o.layout != NB_LAYOUT_MODELOPT && o.layout != NB_LAYOUT_COMPRESSED_TENSORS)
        return nb_fail(ctx, NB_ERR_INVALID, "unknown export layout %d", o.layout);
    nb_status s = nb_export_check_target(ctx, dir);
    if (s) return s;
    int *included = calloc((size_t)(qm->n + 1), sizeof *included);
    if (!included) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    int kv = 0;
    s = decide(ctx, qm, &o, included, &kv);
    if (s) { free(included); return s; }

    size_t L = strlen(dir);
    while (L > 1 && dir[L - 1] == '/') L--;
    char target[4096], tmp[4200], old[4200];
    snprintf(target, sizeof target, "%.*s", (int)L, dir);
    if (free_sibling(tmp, sizeof tmp, target, "nibble-tmp", 1) != 0) {
        free(included);
        return nb_fail(ctx, NB_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    s = write_all(ctx, qm, tmp, &o, included, kv);
    free(included);
    /* asked again: something may have appeared at the target while the export was written */
    if (!s) s = nb_export_check_target(ctx, target);
    if (s) { rm_rf(tmp); return s; }
    struct stat st;
    int had = lstat(target, &st) == 0;
    if (had && free_sibling(old, sizeof old, target, "nibble-old", 0) != 0) {
        int e = errno;
        rm_rf(tmp);
        return nb_fail(ctx, NB_ERR_IO, "cannot find a free name to move the old %s aside: %s", target, strerror(e));
    }
    if (had && rename(target, old) != 0) {
        int e = errno;
        rm_rf(tmp);
        return nb_fail(ctx, NB_ERR_IO, "cannot move the old %s aside: %s", target, strerror(e));
    }
    if (rename(tmp, target) != 0) {
        int e = errno;
        if (had) rename(old, target);
        rm_rf(tmp);
        return nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", tmp, target, strerror(e));
    }
    /* only an empty directory or a previous nibble export was moved aside */
    if (had) rm_rf(old);
    return NB_OK;
}

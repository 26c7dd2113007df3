/* The JSON an export writes for the ModelOpt layout (hf_quant_config.json, config.json's
 * quantization_config: FORMATS.md §3) and the compressed-tensors layout (§4), the config.json
 * synthesized for a model that came without one, and the reader for an existing config.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "export/export_internal.h"
#include "model/arch/arch.h"
#include "nibble/formats.h"

/* ---- per-module quant_algo and the JSON ----------------------------------------------------- */

const char *nbx_quant_algo_of(const nb_qspec *s) {
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)s->weight_format);
    if (!d) return NULL;
    return s->input_format != NB_FMT_NONE ? d->quant_algo_act : d->quant_algo;
}

int nbx_group_size_of(const nb_qspec *s) {
    const nb_qformat_traits *t = nb_qformat_info((nb_qformat)s->weight_format);
    return t ? t->block_size : 0;
}

static int strset_has(const nbx_strset *s, const char *x) {
    for (int64_t i = 0; i < s->n; i++) if (strcmp(s->v[i], x) == 0) return 1;
    return 0;
}

static int strset_add(nbx_strset *s, const char *x, size_t len) {
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

void nbx_strset_free(nbx_strset *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ModelOpt's _prefix_wildcard_summarize_exclude_modules: the shortest dot-boundary prefix wildcards
 * ("name*", or "name.*" for a {name, name.*} pair) that match no quantized layer. */
int nbx_summarize_excludes(char **unq, int64_t n_unq, char **quant, int64_t n_quant, nbx_strset *res) {
    nbx_strset neg = {0};
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
    nbx_strset_free(&neg);
    if (!rc && res->n > 1) qsort(res->v, (size_t)res->n, sizeof *res->v, cmp_str);
    return rc;
}

/* kv_cache_quant_algo of a KV format (only FP8 exists in nibble) */
static const char *kv_algo_of(int32_t fmt) {
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)fmt);
    return d ? d->quant_algo : NULL;
}

cJSON *nbx_modelopt_hf_quant_config(const nb_qmodel *qm, const nbx_plan *p, const int *included, nbx_strset *excl) {
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
            cJSON_AddStringToObject(l, "quant_algo", nbx_quant_algo_of(s));
            if (nbx_group_size_of(s) > 0) cJSON_AddNumberToObject(l, "group_size", nbx_group_size_of(s));
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
cJSON *nbx_modelopt_quantization_config(const nb_qmodel *qm, const nbx_plan *p, const int *included,
                                        const nbx_strset *excl) {
    cJSON *qc = cJSON_CreateObject();
    cJSON *groups = cJSON_CreateObject();
    if (p->mixed) {
        /* one group per distinct (algo, group_size), in first-seen order; targets are sorted names */
        const char *algos[16];
        int gss[16], ng = 0;
        for (int64_t i = 0; i < qm->n; i++) {
            if (!included[i]) continue;
            const char *a = nbx_quant_algo_of(&qm->mods[i].spec);
            int gs = nbx_group_size_of(&qm->mods[i].spec), k;
            for (k = 0; k < ng; k++) if (strcmp(algos[k], a) == 0 && gss[k] == gs) break;
            if (k == ng && ng < 16) { algos[ng] = a; gss[ng] = gs; ng++; }
        }
        for (int k = 0; k < ng; k++) {
            cJSON *g = modelopt_group(algos[k], gss[k]);
            nbx_strset names = {0};
            for (int64_t i = 0; i < qm->n; i++)
                if (included[i] && strcmp(nbx_quant_algo_of(&qm->mods[i].spec), algos[k]) == 0 &&
                    nbx_group_size_of(&qm->mods[i].spec) == gss[k])
                    strset_add(&names, qm->mods[i].name, strlen(qm->mods[i].name));
            if (names.n > 1) qsort(names.v, (size_t)names.n, sizeof *names.v, cmp_str);
            cJSON *t = cJSON_AddArrayToObject(g, "targets");
            for (int64_t i = 0; i < names.n; i++) cJSON_AddItemToArray(t, cJSON_CreateString(names.v[i]));
            nbx_strset_free(&names);
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
            cJSON_AddStringToObject(l, "quant_algo", nbx_quant_algo_of(&qm->mods[i].spec));
            if (nbx_group_size_of(&qm->mods[i].spec) > 0)
                cJSON_AddNumberToObject(l, "group_size", nbx_group_size_of(&qm->mods[i].spec));
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

/* compressed-tensors QuantizationArgs for one side of a scheme, from the format's row. */
static cJSON *ct_args(int32_t fmt, int input) {
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)fmt);
    cJSON *a = cJSON_CreateObject();
    const char *dyn = input ? d->ct_input_dynamic : "false";
    if (strcmp(dyn, "true") == 0) cJSON_AddTrueToObject(a, "dynamic");
    else if (strcmp(dyn, "false") == 0) cJSON_AddFalseToObject(a, "dynamic");
    else cJSON_AddStringToObject(a, "dynamic", dyn);
    if (d->ct_group_size > 0) cJSON_AddNumberToObject(a, "group_size", d->ct_group_size);
    else cJSON_AddNullToObject(a, "group_size");
    cJSON_AddNumberToObject(a, "num_bits", d->ct_num_bits);
    if (input && d->ct_input_observer) cJSON_AddStringToObject(a, "observer", d->ct_input_observer);
    if (d->ct_scale_dtype) cJSON_AddStringToObject(a, "scale_dtype", d->ct_scale_dtype);
    cJSON_AddStringToObject(a, "strategy", d->ct_strategy);
    cJSON_AddTrueToObject(a, "symmetric");
    cJSON_AddStringToObject(a, "type", "float");
    return a;
}

static const char *ct_format_name(int32_t fmt) { return nb_format_desc_of((nb_qformat)fmt)->ct_format; }

/* The format a module's bytes are stored in (four_over_six ships as NVFP4). */
static int32_t disk_format(int32_t fmt) {
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)fmt);
    return d ? (int32_t)d->disk_format : fmt;
}

cJSON *nbx_ct_quantization_config(const nb_qmodel *qm, const int *included, int kv) {
    cJSON *qc = cJSON_CreateObject();
    cJSON *groups = cJSON_AddObjectToObject(qc, "config_groups");
    /* one group per distinct (weight format, input format); targets: "Linear" for a single group
     * that covers every quantized module, else the module names */
    int32_t wf[16], inf[16], ng = 0;
    for (int64_t i = 0; i < qm->n; i++) {
        if (!included[i]) continue;
        const nb_qspec *s = &qm->mods[i].spec;
        int32_t w = disk_format(s->weight_format);
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
                int32_t w = disk_format(s->weight_format);
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

static const char *torch_dtype_name(nb_dtype dt) {
    switch (dt) {
    case NB_F32: return "float32";
    case NB_F16: return "float16";
    default: return "bfloat16";
    }
}

/* config.json says the dtype the unquantized tensors are in: torch_dtype (what transformers 4 and vLLM
 * read) and, where the source already had it, transformers 5's dtype; loaders build the model in it. */
void nbx_set_torch_dtype(cJSON *config, nb_dtype dt) {
    static const char *const keys[] = {"torch_dtype", "dtype"};
    for (int k = 0; k < 2; k++) {
        if (k == 1 && !cJSON_GetObjectItemCaseSensitive(config, keys[k])) continue;
        cJSON *v = cJSON_CreateString(torch_dtype_name(dt));
        if (cJSON_GetObjectItemCaseSensitive(config, keys[k])) cJSON_ReplaceItemInObjectCaseSensitive(config, keys[k], v);
        else cJSON_AddItemToObject(config, keys[k], v);
    }
}

/* config.json for a model that came without one (GGUF, memory): the HF fields transformers needs. */
cJSON *nbx_synth_config(const nb_qmodel *qm, nb_dtype dt) {
    const nb_model_config *c = nb_model_get_config(qm->m);
    const nb_arch_family *fam = nb_arch_family_of(c->arch);
    const char *type = nb_model_arch_name(qm->m);
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(fam ? fam->hf_class : "LlamaForCausalLM"));
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
    if (c->n_experts > 0) {   /* the experts' fields as each family's config class names them */
        int mixtral = c->arch == NB_ARCH_MIXTRAL;
        cJSON_AddNumberToObject(j, mixtral ? "num_local_experts" : "num_experts", c->n_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", c->n_experts_per_tok);
        if (!mixtral) {
            cJSON_AddNumberToObject(j, "moe_intermediate_size", (double)c->moe_intermediate_size);
            cJSON_AddBoolToObject(j, "norm_topk_prob", c->norm_topk_prob != 0);
            cJSON_AddNumberToObject(j, "decoder_sparse_step", c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1);
            cJSON *only = cJSON_AddArrayToObject(j, "mlp_only_layers");
            for (int l = 0; l < 256; l++)
                if (c->mlp_only_layers[l / 64] >> (l % 64) & 1) cJSON_AddItemToArray(only, cJSON_CreateNumber(l));
        }
    }
    return j;
}

nb_status nbx_read_json(nb_ctx *ctx, const char *path, cJSON **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return NB_OK;
        return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    /* the size from fstat, not ftell: ftell on a directory says LONG_MAX */
    struct stat sb;
    const char *why = NULL;
    if (fstat(fileno(f), &sb) != 0) why = strerror(errno);
    else if (S_ISDIR(sb.st_mode)) why = "it is a directory";
    else if (!S_ISREG(sb.st_mode)) why = "not a regular file";
    if (why) {
        fclose(f);
        return nb_fail(ctx, NB_ERR_IO, "cannot read %s: %s", path, why);
    }
    long long n = (long long)sb.st_size;
    if (n > NBX_JSON_MAX_BYTES) {
        fclose(f);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s is %lld bytes: a JSON side file over %d MiB is refused", path, n,
                       NBX_JSON_MAX_BYTES >> 20);
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || got != (size_t)n) {
        free(buf);
        return nb_fail(ctx, NB_ERR_IO, "cannot read %s: %s", path, bad ? strerror(errno) : "the file shrank while read");
    }
    buf[n] = 0;
    *out = cJSON_ParseWithLength(buf, (size_t)n);
    free(buf);
    if (!*out) return nb_fail(ctx, NB_ERR_FORMAT, "%s is not valid JSON", path);
    return NB_OK;
}

/* Export of a quantized model as a Hugging Face checkpoint in the ModelOpt layout (FORMATS.md §3:
 * weight / weight_scale / weight_scale_2 / input_scale) or the compressed-tensors layout (§4:
 * weight_packed, inverted global scales): the tensors and the driver. Every quantized weight goes
 * through its nb_quantizer, the one that fake-quantized it in training, and every float tensor is
 * checked finite. Files are written into target.nibble-tmp-PID/export/ (beside an INCOMPLETE note),
 * fsynced, and swapped into place only when all is written, under target's lock; only a target
 * nb_export_check_target accepts is ever replaced (export_target.c). The JSON files come from
 * export_config.c. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "nibble/formats.h"
#include "export/export_internal.h"
#include "io/durable.h"
#include "io/json_py.h"
#include "quant/quant_internal.h"
#include "nibble/safetensors.h"
#include "nibble/tokenizer.h"

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

/* The one dtype every unquantized tensor is written in (and config.json's torch_dtype): the asked
 * one, else the source's half precision (F16 when the model's float parameters are mostly F16, BF16
 * when mostly BF16), else BF16: F32 checkpoints and GGUF files ship as BF16, the dtype vLLM,
 * TensorRT-LLM and compressed-tensors (which decompresses NVFP4 / MXFP8 weights into BF16) run. */
static nb_dtype export_dtype(const nb_qmodel *qm, const nb_export_opts *o) {
    if (o->dtype >= 0) return (nb_dtype)o->dtype;
    if (nb_model_format_of(qm->m) == NB_MODEL_GGUF) return NB_BF16;
    int64_t n16 = 0, nbf = 0;
    for (int64_t p = 0; p < nb_model_param_count(qm->m); p++) {
        int64_t n = nb_tensor_numel(nb_model_param(qm->m, p));
        int32_t src = nb_model_param_src_dtype(qm->m, p);
        if (src == NB_F16) n16 += n;
        else if (src == NB_BF16) nbf += n;
    }
    return n16 > nbf ? NB_F16 : NB_BF16;
}

/* ---- tensors -------------------------------------------------------------------------------- */

/* Remember a tensor written with NaN/Inf values (allow_nonfinite), for the caller's report. */
static nb_status note_nonfinite(nb_ctx *ctx, nb_qmodel *qm, const char *name) {
    char **grown = realloc(qm->nonfinite, (size_t)(qm->n_nonfinite + 1) * sizeof *grown);
    if (!grown) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    qm->nonfinite = grown;
    size_t n = strlen(name) + 1;
    if (!(qm->nonfinite[qm->n_nonfinite] = malloc(n))) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    memcpy(qm->nonfinite[qm->n_nonfinite++], name, n);
    return NB_OK;
}

/* Every tensor the export writes goes through here: a float tensor holding NaN/Inf is refused, naming
 * it and the element (quantized modules' weights were refused so by their quantizer already), or
 * written and reported when allow_nonfinite. */
static nb_status add_tensor(nb_ctx *ctx, nb_st_writer *w, nb_qmodel *qm, const nb_export_opts *o, const char *name,
                            const nb_tensor *t) {
    if (t->dtype == NB_F32 || t->dtype == NB_BF16 || t->dtype == NB_F16) {
        nb_tensor *c = NULL;
        nb_status s = nb_tensor_is_contiguous(t) ? NB_OK : nb_tensor_contiguous(ctx, t, &c);
        char what[1300];
        snprintf(what, sizeof what, "export: %s", name);
        if (!s) s = nbq_check_finite_why(ctx, c ? c : t, what,
                                         ": an export writes finite values only (allow_nonfinite = true writes it as it is)");
        nb_tensor_release(c);
        if (s == NB_ERR_NUMERIC && o->allow_nonfinite) {
            nb_ctx_clear_error(ctx);
            s = note_nonfinite(ctx, qm, name);
        }
        if (s) return s;
    }
    return nb_st_writer_add(ctx, w, name, t);
}

static nb_status add_named(nb_ctx *ctx, nb_st_writer *w, nb_qmodel *qm, const nb_export_opts *o, const char *module,
                           const char *suffix, const nb_tensor *t) {
    char name[1200];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    return add_tensor(ctx, w, qm, o, name, t);
}

/* llm-compressor keeps FP8 scales in the model dtype. Rounding a scale to BF16 would make the checkpoint
 * dequantize with another scale than the one its codes (and the calibrated student) used, so nibble
 * writes them as F32 [1] / [o, 1], which vLLM and compressed-tensors upcast to anyway. */
static nb_dtype ct_fp8_scale_dtype(void) { return NB_F32; }

static nb_status add_quantized(nb_ctx *ctx, nb_st_writer *w, nb_qmodel *qm, const nb_qmod *q, const nb_export_opts *o) {
    nb_tensor *wt = nb_model_param(qm->m, q->info.weight_param);
    nb_qtensor *qt = NULL;
    nb_status s = nb_quantizer_quantize(ctx, q->wq, wt, &qt);
    if (s) return s;
    int ct = o->layout == NB_LAYOUT_COMPRESSED_TENSORS;
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)q->spec.weight_format);
    nb_tensor *extra = NULL;
    if (d->has_scale2) {
        s = add_named(ctx, w, qm, o, q->name, ct ? d->ct_weight : d->mo_weight, qt->data);
        if (!s) s = add_named(ctx, w, qm, o, q->name, ct ? d->ct_scale : d->mo_scale, qt->scale);
        if (!s) {
            float s2 = *(const float *)nb_tensor_data(qt->scale2);
            /* CT stores the inverse of ModelOpt's per-tensor scale (FORMATS §4.1) */
            if (ct && d->ct_inverse_scales) s = scalar_f32(ctx, 1.0f / s2, 1, NB_F32, &extra);
            if (!s) s = add_named(ctx, w, qm, o, q->name, ct ? d->ct_scale2 : d->mo_scale2, ct ? extra : qt->scale2);
            nb_tensor_release(extra);
            extra = NULL;
        }
    } else if (ct && d->block_size == 0 && !d->per_row) {   /* FP8 per tensor */
        float sc = *(const float *)nb_tensor_data(qt->scale);
        s = add_named(ctx, w, qm, o, q->name, "weight", qt->data);
        if (!s) s = scalar_f32(ctx, sc, 1, ct_fp8_scale_dtype(), &extra);
        if (!s) s = add_named(ctx, w, qm, o, q->name, "weight_scale", extra);
        nb_tensor_release(extra);
        extra = NULL;
    } else if (ct && d->per_row) {   /* FP8 per channel */
        /* CT's channel strategy: weight_scale [o, 1] (it broadcasts over columns) */
        nb_tensor *conv = NULL;
        int64_t shape[2] = {q->info.out_features, 1};
        s = add_named(ctx, w, qm, o, q->name, "weight", qt->data);
        if (!s) s = nb_tensor_to(ctx, qt->scale, ct_fp8_scale_dtype(), &conv);
        if (!s) s = nb_tensor_view(ctx, conv, 2, shape, &extra);
        if (!s) s = add_named(ctx, w, qm, o, q->name, "weight_scale", extra);
        nb_tensor_release(conv);
        nb_tensor_release(extra);
        extra = NULL;
    } else {
        s = add_named(ctx, w, qm, o, q->name, "weight", qt->data);
        if (!s) s = add_named(ctx, w, qm, o, q->name, "weight_scale", qt->scale);
    }
    if (!s && q->iq && nb_quantizer_enabled(q->iq)) {
        float is;
        s = nb_quantizer_scale(ctx, q->iq, &is);
        if (!s) {
            const nb_format_desc *in = nb_format_desc_of((nb_qformat)q->spec.input_format);
            if (ct && in->ct_inverse_scales) s = scalar_f32(ctx, 1.0f / is, 1, NB_F32, &extra);
            else if (ct) s = scalar_f32(ctx, is, 1, ct_fp8_scale_dtype(), &extra);
            else s = scalar_f32(ctx, is, 0, NB_F32, &extra);
            if (!s) s = add_named(ctx, w, qm, o, q->name, ct ? in->ct_input : in->mo_input, extra);
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
    for (int64_t i = 0; i < qm->n_nonfinite; i++) free(qm->nonfinite[i]);
    free(qm->nonfinite);
    qm->nonfinite = NULL;
    qm->n_nonfinite = 0;
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
    if (nbx_join_path(path, sizeof path, tmp, "tokenizer.json") != 0) return nb_fail(ctx, NB_ERR_INVALID, "path too long");
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
    if (nbx_join_path(aside, sizeof aside, tmp, ".tokenizer") != 0) {
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
        nbx_join_path(from, sizeof from, aside, files[k]);
        nbx_join_path(path, sizeof path, tmp, files[k]);
        if (!file_exists(path) && rename(from, path) != 0)
            s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", from, path, strerror(errno));
    }
    rm_rf(aside);
    nbx_join_path(path, sizeof path, tmp, "generation_config.json");
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
static nb_status add_kv_scales(nb_ctx *ctx, nb_st_writer *w, nb_qmodel *qm, const nb_export_opts *o) {
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
        if (!s) s = add_tensor(ctx, w, qm, o, name, t);
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
    nb_dtype main_dt = export_dtype(qm, o);
    for (int64_t p = 0; p < np && !s; p++) {
        if (nb_ctx_interrupted(ctx)) { s = nb_fail(ctx, NB_ERR_INTERRUPTED, "export interrupted"); break; }
        if (owner[p] >= 0) { s = add_quantized(ctx, w, qm, &qm->mods[owner[p]], o); continue; }
        nb_tensor *t = nb_model_param(qm->m, p), *c = NULL;
        s = nb_tensor_to(ctx, t, main_dt, &c);
        if (!s) s = add_tensor(ctx, w, qm, o, nb_model_param_name(qm->m, p), c);
        nb_tensor_release(c);
    }
    free(owner);
    if (!s && kv) s = add_kv_scales(ctx, w, qm, o);
    if (!s) s = nb_st_writer_write_sharded(ctx, w, tmp, o->max_shard_bytes > 0 ? o->max_shard_bytes : 10000000000LL);
    nb_st_writer_free(w);
    if (s) return s;

    /* the plan for the JSON files */
    nbx_plan p = {0};
    p.quant_names = calloc((size_t)(qm->n + 1), sizeof(char *));
    p.unq_names = calloc((size_t)(qm->n + 1), sizeof(char *));
    if (!p.quant_names || !p.unq_names) { free(p.quant_names); free(p.unq_names); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); }
    for (int64_t i = 0; i < qm->n; i++) {
        if (included[i]) {
            const char *a = nbx_quant_algo_of(&qm->mods[i].spec);
            if (!p.algo) { p.algo = a; p.group_size = nbx_group_size_of(&qm->mods[i].spec); }
            else if (strcmp(p.algo, a) != 0 || p.group_size != nbx_group_size_of(&qm->mods[i].spec)) p.mixed = 1;
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
    nbx_strset excl = {0};
    if (nbx_summarize_excludes(p.unq_names, p.n_unq, p.quant_names, p.n_quant, &excl)) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");

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
        nbx_join_path(src, sizeof src, srcdir, "config.json");
        s = nbx_read_json(ctx, src, &config);
    }
    if (!s && !config) config = nbx_synth_config(qm, main_dt);
    if (!s && config) nbx_set_torch_dtype(config, main_dt);
    if (!s && config) {
        cJSON_DeleteItemFromObject(config, "quantization_config");
        int quantized = p.n_quant > 0 || p.kv;
        if (o->layout == NB_LAYOUT_MODELOPT) {
            if (quantized) {
                cJSON *hq = nbx_modelopt_hf_quant_config(qm, &p, included, &excl);
                nbx_join_path(path, sizeof path, tmp, "hf_quant_config.json");
                if (nb_json_py_write_file(path, hq, 4, 0, 0) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
                cJSON_Delete(hq);
                cJSON_AddItemToObject(config, "quantization_config", nbx_modelopt_quantization_config(qm, &p, included, &excl));
            }
            nbx_join_path(path, sizeof path, tmp, "config.json");
            if (!s && nb_json_py_write_file(path, config, 4, 0, 0) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
        } else {
            if (quantized) cJSON_AddItemToObject(config, "quantization_config", nbx_ct_quantization_config(qm, included, p.kv));
            nbx_join_path(path, sizeof path, tmp, "config.json");
            if (nb_json_py_write_file(path, config, 2, 1, 1) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s", path);
        }
    }
    cJSON_Delete(config);
    nbx_strset_free(&excl);
    free(p.quant_names);
    free(p.unq_names);
    /* tokenizer and generation files travel with the weights */
    for (int k = 0; !s && srcdir && nbx_copied_files[k]; k++) {
        nbx_join_path(src, sizeof src, srcdir, nbx_copied_files[k]);
        if (!file_exists(src)) continue;
        nbx_join_path(path, sizeof path, tmp, nbx_copied_files[k]);
        s = nb_copy_file_durable(ctx, src, path);
    }
    if (!s && nb_model_format_of(qm->m) == NB_MODEL_GGUF) s = write_gguf_tokenizer(ctx, nb_model_path(qm->m), tmp);
    return s;
}

nb_status nb_qmodel_export(nb_ctx *ctx, nb_qmodel *qm, const char *dir, const nb_export_opts *opts) {
    nb_export_opts o;
    if (opts) o = *opts; else nb_export_opts_init(&o);
    if (o.layout != NB_LAYOUT_MODELOPT && o.layout != NB_LAYOUT_COMPRESSED_TENSORS)
        return nb_fail(ctx, NB_ERR_INVALID, "unknown export layout %d", o.layout);
    if (o.dtype >= 0 && o.dtype != NB_BF16 && o.dtype != NB_F16 && o.dtype != NB_F32) {
        const nb_dtype_traits *dt = nb_dtype_info((nb_dtype)o.dtype);
        return nb_fail(ctx, NB_ERR_INVALID, "export dtype %s: unquantized tensors are written as bf16, f16 or f32",
                       dt ? dt->name : "(unknown)");
    }
    nb_status s = nb_export_check_target(ctx, dir);
    if (s) return s;
    int *included = calloc((size_t)(qm->n + 1), sizeof *included);
    if (!included) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    int kv = 0;
    s = decide(ctx, qm, &o, included, &kv);
    if (s) { free(included); return s; }

    size_t L = strlen(dir);
    while (L > 1 && dir[L - 1] == '/') L--;
    char target[4096], stage[4200], payload[4300], note[4300];
    snprintf(target, sizeof target, "%.*s", (int)L, dir);
    /* one export per target at a time; the lock also creates the missing parent folders */
    nb_lockfile lock = {0};
    if ((s = nb_lock_path(ctx, target, "export", NBX_BUSY, &lock))) { free(included); return s; }
    nbx_remove_stale(target, rm_rf);
    nb_xfsz_guard xg;
    nb_xfsz_guard_begin(&xg);
    int made = 0;   /* the staging folder is ours to remove */
    if (nbx_free_sibling(stage, sizeof stage, target, "nibble-tmp", 1) != 0) {
        s = nb_fail(ctx, NB_ERR_IO, "cannot create %s: %s", stage, strerror(errno));
        goto out;
    }
    made = 1;
    /* the staging folder is not a model: the files go one level down, next to a note that says what
     * this is, and only that subfolder is renamed into place */
    nbx_join_path(note, sizeof note, stage, "INCOMPLETE");
    nbx_join_path(payload, sizeof payload, stage, "export");
    char text[4600];
    int n = snprintf(text, sizeof text, "an unfinished nibble export of %s (process %ld): not a model; the next export "
                     "to %s removes it once that process has ended\n", target, (long)getpid(), target);
    s = nb_write_file_durable(ctx, note, text, (size_t)n);
    if (!s && mkdir(payload, 0755) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot create %s: %s", payload, strerror(errno));
    if (!s) s = write_all(ctx, qm, payload, &o, included, kv);
    if (!s) s = nb_fsync_dir_files(ctx, payload);
    /* asked again: something may have appeared at the target while the export was written */
    if (!s) s = nbx_check_target(ctx, target, 0);
    if (s) goto out;
    struct stat st;
    if (lstat(target, &st) == 0) {
        /* one step: the target is the old export or the new one, never missing; the old one ends up
         * inside the staging folder, removed with it */
        if (renameat2(AT_FDCWD, payload, AT_FDCWD, target, RENAME_EXCHANGE) != 0) {
            if (errno != EINVAL && errno != ENOSYS) {
                s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", payload, target, strerror(errno));
                goto out;
            }
            /* a file system without the exchange: move the old one into the staging folder first */
            char old[4300];
            nbx_join_path(old, sizeof old, stage, "old");
            if (rename(target, old) != 0) {
                s = nb_fail(ctx, NB_ERR_IO, "cannot move the old %s aside: %s", target, strerror(errno));
                goto out;
            }
            if (rename(payload, target) != 0) {
                int e = errno;
                if (rename(old, target) != 0) made = 0;   /* the old export stays where it is now */
                s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", payload, target, strerror(e));
                goto out;
            }
        }
    } else if (rename(payload, target) != 0) {
        s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", payload, target, strerror(errno));
        goto out;
    }
    s = nb_fsync_parent(ctx, target);
out:
    /* only an empty directory or a previous nibble export was swapped into the staging folder */
    if (made) rm_rf(stage);
    nb_xfsz_guard_end(&xg);
    nb_unlock_path(&lock);
    free(included);
    return s;
}

/* What the last export left out or wrote non-finite (kept in the qmodel: the export fills them). */
int64_t nb_qmodel_export_skipped_count(const nb_qmodel *qm) { return qm->n_skipped; }
const char *nb_qmodel_export_skipped(const nb_qmodel *qm, int64_t i) {
    return (i >= 0 && i < qm->n_skipped) ? qm->skipped[i] : NULL;
}
int64_t nb_qmodel_export_nonfinite_count(const nb_qmodel *qm) { return qm->n_nonfinite; }
const char *nb_qmodel_export_nonfinite(const nb_qmodel *qm, int64_t i) {
    return (i >= 0 && i < qm->n_nonfinite) ? qm->nonfinite[i] : NULL;
}

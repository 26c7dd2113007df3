/* nibble's own checkpoint of a quantized model: one safetensors file holding every master weight
 * ("param/<name>"), every quantizer's calibrated state ("quant/<quantizer name>.<attr>") and, in
 * __metadata__, the per-module specs as JSON. Restoring then exporting gives the same bytes as
 * exporting before the save, because the export reads nothing else. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json_int.h"
#include "nibble/safetensors.h"
#include "qmodel/qmodel_internal.h"

enum { NB_CKPT_VERSION = 1 };

static int any_grouped(const nb_qmodel *qm) {
    for (int64_t i = 0; i < qm->n; i++)
        if (qm->mods[i].wq && nb_quantizer_group(qm->mods[i].wq)) return 1;
    return 0;
}

static nb_status add_state(nb_ctx *ctx, nb_st_writer *w, const nb_quantizer *q) {
    if (!q) return NB_OK;
    for (int k = 0; nb_quantizer_state_name(k); k++) {
        const char *attr = nb_quantizer_state_name(k);
        if (!nb_quantizer_has_state(q, attr)) continue;
        nb_tensor *t = NULL;
        nb_status s = nb_quantizer_get_state(ctx, q, attr, &t);
        if (s) return s;
        char name[1200];
        snprintf(name, sizeof name, "quant/%s.%s", nb_quantizer_name(q), attr);
        s = nb_st_writer_add(ctx, w, name, t);
        nb_tensor_release(t);
        if (s) return s;
    }
    return NB_OK;
}

nb_status nb_qmodel_save(nb_ctx *ctx, const nb_qmodel *qm, const char *path) {
    cJSON *specs = cJSON_CreateObject();
    for (int64_t i = 0; i < qm->n; i++) {
        const nb_qmod *q = &qm->mods[i];
        cJSON *o = cJSON_AddObjectToObject(specs, q->name);
        cJSON_AddNumberToObject(o, "weight_format", q->spec.weight_format);
        cJSON_AddNumberToObject(o, "weight_static", q->spec.weight_static);
        cJSON_AddNumberToObject(o, "input_format", q->spec.input_format);
        cJSON_AddNumberToObject(o, "mx_floor", q->spec.mx_floor);
        cJSON_AddNumberToObject(o, "pass_through_bwd", q->spec.pass_through_bwd);
        cJSON_AddBoolToObject(o, "weight_enabled", q->wq && nb_quantizer_enabled(q->wq));
        cJSON_AddBoolToObject(o, "input_enabled", q->iq && nb_quantizer_enabled(q->iq));
        if (q->reason) cJSON_AddStringToObject(o, "reason", q->reason);
    }
    char *specs_text = cJSON_PrintUnformatted(specs);
    cJSON_Delete(specs);
    if (!specs_text) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    nb_st_writer *w = NULL;
    nb_status s = nb_st_writer_new(ctx, &w);
    char ver[16];
    snprintf(ver, sizeof ver, "%d", NB_CKPT_VERSION);
    if (!s) s = nb_st_writer_meta(ctx, w, "nibble_checkpoint", ver);
    if (!s) s = nb_st_writer_meta(ctx, w, "arch", nb_model_arch_name(qm->m));
    if (!s) s = nb_st_writer_meta(ctx, w, "fused", any_grouped(qm) ? "1" : "0");
    if (!s) s = nb_st_writer_meta(ctx, w, "specs", specs_text);
    if (!s && qm->kv_format != NB_FMT_NONE) {
        /* the KV cache format, and which of its quantizers are on ("kv_enabled": one 0/1 per K, V of each layer) */
        char fmt[16], *en = malloc((size_t)(2 * qm->n_layers + 1));
        if (!en) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
        for (int64_t k = 0; en && k < 2 * qm->n_layers; k++) en[k] = nb_quantizer_enabled(qm->kvq[k]) ? '1' : '0';
        if (en) en[2 * qm->n_layers] = 0;
        snprintf(fmt, sizeof fmt, "%d", (int)qm->kv_format);
        if (!s) s = nb_st_writer_meta(ctx, w, "kv_format", fmt);
        if (!s) s = nb_st_writer_meta(ctx, w, "kv_enabled", en);
        free(en);
    }
    free(specs_text);
    for (int64_t p = 0; p < nb_model_param_count(qm->m) && !s; p++) {
        char name[1200];
        snprintf(name, sizeof name, "param/%s", nb_model_param_name(qm->m, p));
        s = nb_st_writer_add(ctx, w, name, nb_model_param(qm->m, p));
    }
    for (int64_t i = 0; i < qm->n && !s; i++) {
        s = add_state(ctx, w, qm->mods[i].wq);
        if (!s) s = add_state(ctx, w, qm->mods[i].iq);
    }
    for (int64_t k = 0; !s && qm->kvq && k < 2 * qm->n_layers; k++) s = add_state(ctx, w, qm->kvq[k]);
    if (!s) s = nb_st_writer_write(ctx, w, path);
    nb_st_writer_free(w);
    return s;
}

/* A spec field: absent gives `def`; a number must be an integer in [lo, hi] (true/false count as 1/0);
 * anything else is refused naming the file, the module and the field. */
static nb_status spec_int(nb_ctx *ctx, const char *path, const char *mod, const cJSON *o, const char *key,
                          int64_t lo, int64_t hi, int32_t def, int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    int64_t x = def;
    if (cJSON_IsBool(v)) x = cJSON_IsTrue(v);
    else if (v && !nb_json_int(v, lo, hi, &x))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: specs metadata: %s.%s is not an integer in [%lld, %lld]", path, mod,
                       key, (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return NB_OK;
}

static nb_status restore_state(nb_ctx *ctx, nb_st *st, nb_quantizer *q) {
    if (!q) return NB_OK;
    nb_status s = nb_quantizer_clear_state(ctx, q, NULL);
    for (int k = 0; !s && nb_quantizer_state_name(k); k++) {
        char name[1200];
        snprintf(name, sizeof name, "quant/%s.%s", nb_quantizer_name(q), nb_quantizer_state_name(k));
        if (nb_st_find(st, name) < 0) continue;
        nb_tensor *t = NULL;
        s = nb_st_get(ctx, st, name, &t);
        if (!s) s = nb_quantizer_set_state(ctx, q, nb_quantizer_state_name(k), t);
        nb_tensor_release(t);
    }
    return s;
}

nb_status nb_qmodel_restore(nb_ctx *ctx, nb_qmodel *qm, const char *path) {
    nb_st *st = NULL;
    nb_status s = nb_st_open(ctx, path, &st);
    if (s) return s;
    const char *ver = nb_st_metadata(st, "nibble_checkpoint");
    const char *arch = nb_st_metadata(st, "arch");
    const char *specs_text = nb_st_metadata(st, "specs");
    cJSON *specs = NULL;
    if (!ver || !specs_text) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s is not a nibble checkpoint (no nibble_checkpoint/specs metadata)", path);
    } else if (!nb_text_int(ver, NB_CKPT_VERSION, NB_CKPT_VERSION, &(int64_t){0})) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: checkpoint version %s, this nibble reads %d", path, ver, NB_CKPT_VERSION);
    } else if (arch && strcmp(arch, nb_model_arch_name(qm->m)) != 0) {
        s = nb_fail(ctx, NB_ERR_INVALID, "%s holds a %s model, not %s", path, arch, nb_model_arch_name(qm->m));
    } else if (!(specs = cJSON_Parse(specs_text))) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: the specs metadata is not valid JSON", path);
    }
    /* weights first: every parameter must be there with its shape */
    for (int64_t p = 0; !s && p < nb_model_param_count(qm->m); p++) {
        char name[1200];
        snprintf(name, sizeof name, "param/%s", nb_model_param_name(qm->m, p));
        nb_tensor *t = NULL;
        s = nb_st_get(ctx, st, name, &t);
        if (s == NB_ERR_NOT_FOUND) s = nb_fail(ctx, NB_ERR_FORMAT, "%s has no %s", path, name);
        if (!s) s = nb_tensor_copy(ctx, nb_model_param(qm->m, p), t);
        nb_tensor_release(t);
    }
    /* then specs and quantizer state */
    for (int64_t i = 0; !s && i < qm->n; i++) {
        nb_qmod *q = &qm->mods[i];
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(specs, q->name);
        if (!cJSON_IsObject(o)) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s has no spec for %s", path, q->name); break; }
        nb_qspec spec;
        nb_qspec_init(&spec);
        int32_t wen = 1, ien = 1;
        s = spec_int(ctx, path, q->name, o, "weight_format", 0, NB_FMT_COUNT - 1, NB_FMT_NONE, &spec.weight_format);
        if (!s) s = spec_int(ctx, path, q->name, o, "weight_static", 0, 1, 0, &spec.weight_static);
        if (!s) s = spec_int(ctx, path, q->name, o, "input_format", 0, NB_FMT_COUNT - 1, NB_FMT_NONE, &spec.input_format);
        if (!s) s = spec_int(ctx, path, q->name, o, "mx_floor", 0, 1, 0, &spec.mx_floor);
        if (!s) s = spec_int(ctx, path, q->name, o, "pass_through_bwd", 0, 1, 1, &spec.pass_through_bwd);
        if (!s) s = spec_int(ctx, path, q->name, o, "weight_enabled", 0, 1, 1, &wen);
        if (!s) s = spec_int(ctx, path, q->name, o, "input_enabled", 0, 1, 1, &ien);
        if (s) break;
        if (spec.weight_format == NB_FMT_NONE) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "reason");
            s = nb_qmodel_exclude(ctx, qm, q->name, cJSON_IsString(r) ? r->valuestring : "excluded");
            continue;
        }
        s = nb_qmodel_set(ctx, qm, q->name, &spec);
        if (!s && q->wq) nb_quantizer_set_enabled(q->wq, wen);
        if (!s && q->iq) nb_quantizer_set_enabled(q->iq, ien);
    }
    const char *fused = nb_st_metadata(st, "fused");
    if (!s && fused && strcmp(fused, "1") == 0) s = nb_qmodel_fuse_siblings(ctx, qm, NULL);
    for (int64_t i = 0; !s && i < qm->n; i++) {
        s = restore_state(ctx, st, qm->mods[i].wq);
        if (!s) s = restore_state(ctx, st, qm->mods[i].iq);
    }
    /* the KV cache (a checkpoint without kv_format has none) */
    const char *kvf = nb_st_metadata(st, "kv_format"), *kve = nb_st_metadata(st, "kv_enabled");
    int64_t kv_fmt = NB_FMT_NONE;
    if (!s && kvf && !nb_text_int(kvf, 0, NB_FMT_COUNT - 1, &kv_fmt))
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: kv_format metadata '%s' is not a format number in [0, %d]", path, kvf,
                    NB_FMT_COUNT - 1);
    if (!s) s = nb_qmodel_set_kv(ctx, qm, (int32_t)kv_fmt);
    if (!s && kvf && kve && (int64_t)strlen(kve) != 2 * qm->n_layers)
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: kv_enabled has %zu flags for %lld layers", path, strlen(kve),
                    (long long)qm->n_layers);
    for (int64_t k = 0; !s && qm->kvq && k < 2 * qm->n_layers; k++) {
        if (kve) nb_quantizer_set_enabled(qm->kvq[k], kve[k] == '1');
        s = restore_state(ctx, st, qm->kvq[k]);
    }
    cJSON_Delete(specs);
    nb_st_close(st);
    return s;
}

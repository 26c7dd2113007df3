/* Quantizers attached to a model's linear modules: specs, fused-sibling groups, calibration
 * observers and fake quant installed as the model's linear hooks, and the export guard.
 * Export and nibble's own checkpoint live in export/ (they share qmodel_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/comm.h"
#include "nibble/formats.h"
#include "nibble/qmodel.h"
#include "qmodel/qmodel_internal.h"
#include "quant/quant_internal.h"

void nb_qspec_init(nb_qspec *s) {
    memset(s, 0, sizeof *s);
    s->weight_format = NB_FMT_NONE;
    s->input_format = NB_FMT_NONE;
    s->pass_through_bwd = 1;
}

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void set_reason(nb_qmod *q, const char *reason) {
    free(q->reason);
    q->reason = reason ? dupstr(reason) : NULL;
}

static void drop_quantizers(nb_qmod *q) {
    nb_quantizer_release(q->wq);
    nb_quantizer_release(q->iq);
    q->wq = q->iq = NULL;
    if (q->icalib) nb_calib_free(q->icalib);
    q->icalib = NULL;
}

nb_status nb_qmodel_new(nb_ctx *ctx, nb_model *m, nb_qmodel **out) {
    *out = NULL;
    nb_qmodel *qm = calloc(1, sizeof *qm);
    if (!qm) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qmodel)");
    qm->m = m;
    qm->ctx = ctx;
    qm->kv_format = NB_FMT_NONE;
    qm->n_layers = nb_model_get_config(m)->n_layers;
    int64_t nmod = nb_model_module_count(m);
    qm->mods = calloc((size_t)(nmod > 0 ? nmod : 1), sizeof *qm->mods);
    if (!qm->mods) { free(qm); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qmodel modules)"); }
    for (int64_t i = 0; i < nmod; i++) {
        if (nb_model_module_kind(m, i) != NB_MODULE_LINEAR) continue;
        nb_qmod *q = &qm->mods[qm->n];
        nb_status s = nb_model_linear_info(ctx, m, i, &q->info);
        if (s) { nb_qmodel_free(qm); return s; }
        q->module = i;
        q->name = dupstr(nb_model_module_name(m, i));
        q->owner = qm;
        q->ctx = ctx;
        nb_qspec_init(&q->spec);
        set_reason(q, "no rule");
        if (!q->name || !q->reason) { qm->n++; nb_qmodel_free(qm); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); }
        qm->n++;
    }
    *out = qm;
    return NB_OK;
}

static void free_list(char **list, int64_t n) {
    for (int64_t i = 0; i < n; i++) free(list[i]);
    free(list);
}

static void drop_kv(nb_qmodel *qm) {
    for (int64_t k = 0; qm->kvq && k < 2 * qm->n_layers; k++) nb_quantizer_release(qm->kvq[k]);
    for (int64_t k = 0; qm->kvcalib && k < 2 * qm->n_layers; k++)
        if (qm->kvcalib[k]) nb_calib_free(qm->kvcalib[k]);
    free(qm->kvq);
    free(qm->kvcalib);
    qm->kvq = NULL;
    qm->kvcalib = NULL;
    qm->kv_format = NB_FMT_NONE;
}

void nb_qmodel_free(nb_qmodel *qm) {
    if (!qm) return;
    if (qm->kv_hook_installed) nb_model_set_kv_hook(qm->ctx, qm->m, NULL);
    drop_kv(qm);
    for (int64_t i = 0; i < qm->n; i++) {
        nb_qmod *q = &qm->mods[i];
        if (qm->hooks_installed) nb_model_set_linear_hook(q->ctx, qm->m, q->module, NULL);
        drop_quantizers(q);
        free(q->name);
        free(q->reason);
    }
    free(qm->mods);
    free_list(qm->uncovered, qm->n_uncovered);
    free_list(qm->skipped, qm->n_skipped);
    free_list(qm->nonfinite, qm->n_nonfinite);
    free(qm);
}

void nb_qmodel_detach(nb_qmodel *qm) {
    if (qm) qm->hooks_installed = qm->kv_hook_installed = 0;
}

nb_model *nb_qmodel_model(const nb_qmodel *qm) { return qm->m; }
int64_t nb_qmodel_count(const nb_qmodel *qm) { return qm->n; }
const char *nb_qmodel_name(const nb_qmodel *qm, int64_t i) { return (i >= 0 && i < qm->n) ? qm->mods[i].name : NULL; }
const nb_qspec *nb_qmodel_spec(const nb_qmodel *qm, int64_t i) { return (i >= 0 && i < qm->n) ? &qm->mods[i].spec : NULL; }
const char *nb_qmodel_reason(const nb_qmodel *qm, int64_t i) { return (i >= 0 && i < qm->n) ? qm->mods[i].reason : NULL; }
nb_quantizer *nb_qmodel_weight_quantizer(const nb_qmodel *qm, int64_t i) { return (i >= 0 && i < qm->n) ? qm->mods[i].wq : NULL; }
nb_quantizer *nb_qmodel_input_quantizer(const nb_qmodel *qm, int64_t i) { return (i >= 0 && i < qm->n) ? qm->mods[i].iq : NULL; }

int64_t nb_qmodel_find(const nb_qmodel *qm, const char *name) {
    for (int64_t i = 0; i < qm->n; i++)
        if (strcmp(qm->mods[i].name, name) == 0) return i;
    return -1;
}

static nb_status find_or_fail(nb_ctx *ctx, const nb_qmodel *qm, const char *name, int64_t *idx) {
    *idx = nb_qmodel_find(qm, name);
    if (*idx >= 0) return NB_OK;
    if (nb_model_find_module(qm->m, name) >= 0)
        return nb_fail(ctx, NB_ERR_INVALID, "%s is not a linear module: only linear layers are quantized", name);
    return nb_fail(ctx, NB_ERR_NOT_FOUND, "the model has no module named %s", name);
}

nb_status nb_qmodel_exclude(nb_ctx *ctx, nb_qmodel *qm, const char *name, const char *reason) {
    int64_t i;
    nb_status s = find_or_fail(ctx, qm, name, &i);
    if (s) return s;
    nb_qmod *q = &qm->mods[i];
    drop_quantizers(q);
    nb_qspec_init(&q->spec);
    set_reason(q, reason ? reason : "excluded");
    return NB_OK;
}

static int fmt_family_input_ok(int32_t f) {
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)f);
    return f == NB_FMT_NONE || (d && d->input_ok);
}

/* The dtype ModelOpt's FP8 export divides in: the weight's stored dtype (FORMATS §6.4). */
static int32_t fp8_div_dtype_of(const nb_qmodel *qm, const nb_qmod *q) {
    int32_t src = nb_model_param_src_dtype(qm->m, q->info.weight_param);
    return (src == NB_BF16 || src == NB_F16) ? src : NB_F32;
}

nb_status nb_qmodel_set(nb_ctx *ctx, nb_qmodel *qm, const char *name, const nb_qspec *spec) {
    int64_t i;
    nb_status s = find_or_fail(ctx, qm, name, &i);
    if (s) return s;
    nb_qmod *q = &qm->mods[i];
    if (spec->weight_format == NB_FMT_NONE) return nb_qmodel_exclude(ctx, qm, name, "no format");
    const nb_qformat_traits *wt = nb_qformat_info((nb_qformat)spec->weight_format);
    if (!wt || spec->weight_format == NB_FMT_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "%s: unknown weight format %d", name, spec->weight_format);
    if (!fmt_family_input_ok(spec->input_format))
        return nb_fail(ctx, NB_ERR_INVALID, "%s: unsupported input format %s", name,
                       nb_qformat_info((nb_qformat)spec->input_format) ? nb_qformat_info((nb_qformat)spec->input_format)->name : "?");
    if (q->info.tied)
        return nb_fail(ctx, NB_ERR_INVALID, "%s is tied to model.embed_tokens (tie_word_embeddings): quantizing it "
                       "would quantize the embeddings too", name);
    if (wt->block_size > 0 && q->info.in_features % wt->block_size != 0)
        return nb_fail(ctx, NB_ERR_SHAPE, "%s: in_features %lld is not divisible by the %s block size %d", name,
                       (long long)q->info.in_features, wt->name, wt->block_size);
    const nb_qformat_traits *it = nb_qformat_info((nb_qformat)spec->input_format);
    if (spec->input_format != NB_FMT_NONE && it->block_size > 0 && q->info.in_features % it->block_size != 0)
        return nb_fail(ctx, NB_ERR_SHAPE, "%s: in_features %lld is not divisible by the %s input block size %d", name,
                       (long long)q->info.in_features, it->name, it->block_size);
    drop_quantizers(q);
    nb_quantizer_config wc;
    nb_quantizer_config_init(&wc, (nb_qformat)spec->weight_format);
    if (nb_format_desc_of((nb_qformat)spec->weight_format)->state_static) wc.is_static |= spec->weight_static;
    wc.mx_floor = spec->mx_floor;
    wc.pass_through_bwd = spec->pass_through_bwd;
    if (spec->weight_format == NB_FMT_FP8_TENSOR) wc.fp8_div_dtype = fp8_div_dtype_of(qm, q);
    char qname[1024];
    snprintf(qname, sizeof qname, "%s.weight_quantizer", name);
    if ((s = nb_quantizer_new(ctx, qname, &wc, &q->wq))) return s;
    if (spec->input_format != NB_FMT_NONE) {
        nb_quantizer_config ic;
        nb_quantizer_config_init(&ic, (nb_qformat)spec->input_format);
        ic.is_static = 0;
        ic.pass_through_bwd = spec->pass_through_bwd;
        ic.fp8_div_dtype = NB_F32;
        snprintf(qname, sizeof qname, "%s.input_quantizer", name);
        if ((s = nb_quantizer_new(ctx, qname, &ic, &q->iq))) { drop_quantizers(q); return s; }
    }
    q->spec = *spec;
    if (wc.is_static) q->spec.weight_static = 1;   /* four_over_six is static whatever the spec says */
    set_reason(q, NULL);
    return NB_OK;
}

/* ---- the KV cache ---------------------------------------------------------------------------- */

void nb_qmodel_attn_name(int64_t layer, char *buf, size_t cap) {
    snprintf(buf, cap, "model.layers.%lld.self_attn", (long long)layer);
}

nb_status nb_qmodel_set_kv(nb_ctx *ctx, nb_qmodel *qm, int32_t format) {
    if (qm->calibrating) return nb_fail(ctx, NB_ERR_INVALID, "KV cache quantization cannot change during calibration");
    int known = format == NB_FMT_NONE;   /* a KV preset's format (nibble/formats.h) */
    for (int i = 0; i < nb_preset_count(); i++)
        known |= nb_preset_at(i)->kind == NB_PRESET_KV && (int32_t)nb_preset_at(i)->weight_format == format;
    if (!known) {
        const nb_qformat_traits *t = nb_qformat_info((nb_qformat)format);
        return nb_fail(ctx, NB_ERR_INVALID, "KV cache format %s is not supported (only fp8: one FP8 E4M3 scale per "
                       "layer for K and for V, ModelOpt's FP8 KV cache)", t ? t->name : "?");
    }
    /* the old quantizers' fake quant goes with them (set_fake again after this) */
    if (qm->kv_hook_installed) {
        nb_model_set_kv_hook(ctx, qm->m, NULL);
        qm->kv_hook_installed = 0;
    }
    drop_kv(qm);
    if (format == NB_FMT_NONE) return NB_OK;
    int64_t n = 2 * qm->n_layers;
    qm->kvq = calloc((size_t)(n > 0 ? n : 1), sizeof *qm->kvq);
    qm->kvcalib = calloc((size_t)(n > 0 ? n : 1), sizeof *qm->kvcalib);
    if (!qm->kvq || !qm->kvcalib) { drop_kv(qm); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (KV quantizers)"); }
    nb_quantizer_config c;
    nb_quantizer_config_init(&c, (nb_qformat)format);
    c.fp8_div_dtype = NB_F32;   /* activations: no weight-dtype rounding of the scale (FORMATS §6.4 is weights only) */
    c.is_static = 0;
    for (int64_t k = 0; k < n; k++) {
        char name[256], attn[200];
        nb_qmodel_attn_name(k / 2, attn, sizeof attn);
        snprintf(name, sizeof name, "%s.%c_bmm_quantizer", attn, k % 2 ? 'v' : 'k');
        nb_status s = nb_quantizer_new(ctx, name, &c, &qm->kvq[k]);
        if (s) { drop_kv(qm); return s; }
    }
    qm->kv_format = format;
    return NB_OK;
}

int32_t nb_qmodel_kv_format(const nb_qmodel *qm) { return qm->kv_format; }

nb_quantizer *nb_qmodel_kv_quantizer(const nb_qmodel *qm, int64_t layer, int32_t which) {
    if (!qm->kvq || layer < 0 || layer >= qm->n_layers || (which != 0 && which != 1)) return NULL;
    return qm->kvq[2 * layer + which];
}

/* ---- fused siblings ------------------------------------------------------------------------- */

static int same_weight_kind(const nb_qmod *a, const nb_qmod *b) {
    return a->wq && b->wq && a->spec.weight_format == b->spec.weight_format &&
           a->spec.weight_static == b->spec.weight_static && a->spec.input_format == b->spec.input_format;
}

static int groupable(int32_t f) {
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)f);
    return d && d->groupable;
}

static nb_status make_group(nb_ctx *ctx, nb_qmod **members, int n, int input, const char *label, int64_t *count) {
    nb_qgroup *g = NULL;
    char gname[1024];
    snprintf(gname, sizeof gname, "%s.%s", label, input ? "input" : "weight");
    nb_status s = nb_qgroup_new(ctx, gname, &g);
    if (s) return s;
    for (int k = 0; k < n && !s; k++) s = nb_qgroup_add(ctx, g, input ? members[k]->iq : members[k]->wq);
    nb_qgroup_release(g);
    if (!s) (*count)++;
    return s;
}

/* Fused siblings: q/k/v and gate/up of each layer, and each expert's gate/up (w1/w3) pair of a
 * mixture of experts (vLLM's fused MoE kernels take one global scale per expert for w13). */
nb_status nb_qmodel_fuse_siblings(nb_ctx *ctx, nb_qmodel *qm, int64_t *n_groups) {
    static const int32_t sets[3][3] = {{NB_LINEAR_Q, NB_LINEAR_K, NB_LINEAR_V},
                                       {NB_LINEAR_GATE, NB_LINEAR_UP, -1},
                                       {NB_LINEAR_EXPERT_GATE, NB_LINEAR_EXPERT_UP, -1}};
    static const char *labels[2] = {"self_attn.qkv", "mlp.gate_up"};
    int64_t made = 0;
    const nb_model_config *cfg = nb_model_get_config(qm->m);
    for (int64_t layer = 0; layer < cfg->n_layers; layer++) {
        for (int set = 0; set < 3; set++) {
            for (int32_t ex = set < 2 ? -1 : 0; ex < (set < 2 ? 0 : cfg->n_experts); ex++) {
                nb_qmod *members[3];
                int n = 0, want = sets[set][2] < 0 ? 2 : 3;
                for (int r = 0; r < want; r++)
                    for (int64_t i = 0; i < qm->n && n < want; i++)
                        if (qm->mods[i].info.layer == layer && qm->mods[i].info.role == sets[set][r] &&
                            qm->mods[i].info.expert == ex)
                            members[n++] = &qm->mods[i];
                if (n != want) continue;
                int ok = groupable(members[0]->spec.weight_format);
                for (int k = 1; k < n; k++) ok = ok && same_weight_kind(members[0], members[k]);
                if (!ok || !members[0]->wq) continue;
                char label[256];
                if (set < 2) {
                    snprintf(label, sizeof label, "model.layers.%lld.%s", (long long)layer, labels[set]);
                } else {   /* model.layers.L.<block>.experts.E.gate_up */
                    const char *dot = strrchr(members[0]->name, '.');
                    snprintf(label, sizeof label, "%.*s.gate_up", (int)(dot - members[0]->name), members[0]->name);
                }
                /* ModelOpt skips the fusion for plain FP8 weights (each keeps its weight_scale; vLLM
                 * requantizes to the max at load); their input scales are equal anyway (one input) */
                if (nb_format_desc_of((nb_qformat)members[0]->spec.weight_format)->fuse_weights &&
                    !nb_quantizer_group(members[0]->wq)) {
                    nb_status s = make_group(ctx, members, n, 0, label, &made);
                    if (s) return s;
                }
                if (members[0]->iq && groupable(members[0]->spec.input_format) && !nb_quantizer_group(members[0]->iq)) {
                    nb_status s = make_group(ctx, members, n, 1, label, &made);
                    if (s) return s;
                }
            }
        }
    }
    if (n_groups) *n_groups = made;
    return NB_OK;
}

/* ---- hooks --------------------------------------------------------------------------------- */

/* A tensor view over caller memory (no copy, no ownership). */
static nb_status wrap_f32(nb_ctx *ctx, float *p, int64_t rows, int64_t cols, nb_tensor **out) {
    nb_buffer *b = NULL;
    nb_status s = nb_buffer_wrap(ctx, p, (size_t)(rows * cols) * sizeof(float), NULL, NULL, &b);
    if (s) return s;
    int64_t shape[2] = {rows, cols};
    s = nb_tensor_wrap(ctx, b, NB_F32, 2, shape, 0, out);
    nb_buffer_release(b);
    return s;
}

static nb_status hook_weight_fake(nb_ctx *ctx, void *user, const float *w, float *w_out, int64_t rows, int64_t cols) {
    nb_qmod *q = user;
    nb_tensor *tw = NULL, *to = NULL;
    nb_status s = wrap_f32(ctx, (float *)w, rows, cols, &tw);
    if (!s) s = wrap_f32(ctx, w_out, rows, cols, &to);
    if (!s) s = nb_quantizer_fake(ctx, q->wq, tw, to);
    nb_tensor_release(tw);
    nb_tensor_release(to);
    return s;
}

static nb_status hook_input_fake(nb_ctx *ctx, void *user, float *x, int64_t rows, int64_t cols, int32_t pass) {
    (void)pass;
    nb_qmod *q = user;
    nb_tensor *tx = NULL;
    nb_status s = wrap_f32(ctx, x, rows, cols, &tx);
    if (!s) s = nb_quantizer_fake(ctx, q->iq, tx, tx);
    nb_tensor_release(tx);
    return s;
}

static nb_status hook_input_observe(nb_ctx *ctx, void *user, float *x, int64_t rows, int64_t cols, int32_t pass) {
    nb_qmod *q = user;
    if (pass == NB_PASS_RECOMPUTE || !q->icalib) return NB_OK;
    nb_tensor *tx = NULL;
    nb_status s = wrap_f32(ctx, x, rows, cols, &tx);
    if (!s) s = nb_calib_collect(ctx, q->icalib, tx);
    nb_tensor_release(tx);
    if (!s) q->seen_rows += rows;
    return s;
}

/* The K/V hook: observe (calibrating) or fake-quantize (fake on) layer l's keys and values. */
static nb_status hook_kv(nb_ctx *ctx, void *user, int64_t layer, float *k, float *v, int64_t rows, int64_t cols,
                         int32_t pass) {
    nb_qmodel *qm = user;
    if (!qm->kvq || layer < 0 || layer >= qm->n_layers) return NB_OK;
    for (int w = 0; w < 2; w++) {
        nb_quantizer *q = qm->kvq[2 * layer + w];
        nb_calib *c = qm->kvcalib[2 * layer + w];
        if (qm->calibrating ? (pass == NB_PASS_RECOMPUTE || !c) : !nb_quantizer_enabled(q)) continue;
        nb_tensor *t = NULL;
        nb_status s = wrap_f32(ctx, w ? v : k, rows, cols, &t);
        if (!s) s = qm->calibrating ? nb_calib_collect(ctx, c, t) : nb_quantizer_fake(ctx, q, t, t);
        nb_tensor_release(t);
        if (s) return s;
    }
    return NB_OK;
}

static nb_status install_kv_hook(nb_ctx *ctx, nb_qmodel *qm) {
    nb_kv_hook h = {qm, hook_kv};
    nb_status s = nb_model_set_kv_hook(ctx, qm->m, &h);
    if (!s) qm->kv_hook_installed = 1;
    return s;
}

static nb_status clear_hooks(nb_ctx *ctx, nb_qmodel *qm) {
    if (qm->kv_hook_installed) {
        nb_status s = nb_model_set_kv_hook(ctx, qm->m, NULL);
        if (s) return s;
        qm->kv_hook_installed = 0;
    }
    for (int64_t i = 0; i < qm->n; i++) {
        nb_status s = nb_model_set_linear_hook(ctx, qm->m, qm->mods[i].module, NULL);
        if (s) return s;
    }
    qm->hooks_installed = 0;
    qm->fake = 0;
    return NB_OK;
}

nb_status nb_qmodel_set_fake(nb_ctx *ctx, nb_qmodel *qm, int32_t on) {
    if (qm->calibrating) return nb_fail(ctx, NB_ERR_INVALID, "fake quant cannot be switched during calibration");
    nb_status s = clear_hooks(ctx, qm);
    if (s || !on) return s;
    for (int64_t i = 0; i < qm->n; i++) {
        nb_qmod *q = &qm->mods[i];
        nb_linear_hook h = {q, NULL, NULL};
        if (q->wq && nb_quantizer_enabled(q->wq)) {
            if ((s = nb_quantizer_check(ctx, q->wq))) return s;
            h.weight = hook_weight_fake;
        }
        if (q->iq && nb_quantizer_enabled(q->iq)) {
            if ((s = nb_quantizer_check(ctx, q->iq))) return s;
            h.input = hook_input_fake;
        }
        if (!h.weight && !h.input) continue;
        if ((s = nb_model_set_linear_hook(ctx, qm->m, q->module, &h))) return s;
        qm->hooks_installed = 1;
    }
    int any_kv = 0;
    for (int64_t k = 0; qm->kvq && k < 2 * qm->n_layers; k++) {
        if (!nb_quantizer_enabled(qm->kvq[k])) continue;
        if ((s = nb_qmodel_check_kv(ctx, qm, k))) return s;
        any_kv = 1;
    }
    if (any_kv && (s = install_kv_hook(ctx, qm))) return s;
    qm->fake = 1;
    return NB_OK;
}

int32_t nb_qmodel_fake(const nb_qmodel *qm) { return qm->fake; }

/* ---- calibration ----------------------------------------------------------------------------- */

static void clear_uncovered(nb_qmodel *qm) {
    free_list(qm->uncovered, qm->n_uncovered);
    qm->uncovered = NULL;
    qm->n_uncovered = 0;
}

nb_status nb_qmodel_calibrate_begin(nb_ctx *ctx, nb_qmodel *qm, const nb_calib_config *cfg) {
    nb_status s = clear_hooks(ctx, qm);
    if (s) return s;
    qm->calib_cfg = *cfg;
    clear_uncovered(qm);
    nb_calib_config max_cfg;
    nb_calib_config_init(&max_cfg, NB_CALIB_MAX);
    for (int64_t i = 0; i < qm->n; i++) {
        nb_qmod *q = &qm->mods[i];
        q->seen_rows = 0;
        if (!q->iq || !nb_quantizer_enabled(q->iq)) continue;
        if ((s = nb_quantizer_clear_state(ctx, q->iq, NULL))) return s;
        if ((s = nb_calib_new(ctx, q->iq, &max_cfg, &q->icalib))) return s;
        nb_linear_hook h = {q, NULL, hook_input_observe};
        if ((s = nb_model_set_linear_hook(ctx, qm->m, q->module, &h))) return s;
        qm->hooks_installed = 1;
    }
    int any_kv = 0;
    for (int64_t k = 0; qm->kvq && k < 2 * qm->n_layers; k++) {
        if (!nb_quantizer_enabled(qm->kvq[k])) continue;
        if ((s = nb_quantizer_clear_state(ctx, qm->kvq[k], NULL))) return s;
        if ((s = nb_calib_new(ctx, qm->kvq[k], &max_cfg, &qm->kvcalib[k]))) return s;
        any_kv = 1;
    }
    if (any_kv && (s = install_kv_hook(ctx, qm))) return s;
    qm->calibrating = 1;
    return NB_OK;
}

nb_status nb_qmodel_calibrate_weights(nb_ctx *ctx, nb_qmodel *qm, const nb_calib_config *cfg) {
    nb_calib_config max_cfg;
    nb_calib_config_init(&max_cfg, NB_CALIB_MAX);
    /* pass 1: max everywhere, so fused groups know their shared global amax */
    for (int pass = 0; pass < 2; pass++) {
        const nb_calib_config *c = pass == 0 ? &max_cfg : cfg;
        if (pass == 1 && cfg->method == NB_CALIB_MAX) break;
        for (int64_t i = 0; i < qm->n; i++) {
            nb_qmod *q = &qm->mods[i];
            if (!q->wq || !nb_quantizer_enabled(q->wq)) continue;
            nb_qformat_traits const *t = nb_qformat_info((nb_qformat)q->spec.weight_format);
            /* the second pass searches an amax: four_over_six is NVFP4's per-block choice, and MXFP8
             * has no calibrated amax at all (its block scales come from the data), so both keep max */
            if (pass == 1 && t->block_size == 0 && cfg->method == NB_CALIB_FOUR_OVER_SIX) continue;
            if (pass == 1 && !nb_format_desc_of((nb_qformat)q->spec.weight_format)->state_dynamic[0]) continue;
            nb_tensor *w = nb_model_param(qm->m, q->info.weight_param);
            nb_calib *cal = NULL;
            nb_status s = nb_calib_new(ctx, q->wq, c, &cal);
            if (!s) s = nb_calib_collect(ctx, cal, w);
            if (!s) s = nb_calib_finish(ctx, cal);
            nb_calib_free(cal);
            if (s) return s;
        }
    }
    return NB_OK;
}

/* Data-parallel calibration: each rank ran its share of the batches, so the input and KV observers are
 * merged over the ranks (amax MAX, batch counts summed) before any scale is computed; every rank then
 * holds the state one rank would have from all the batches. The weights are calibrated from the master
 * weights, the same on every rank. */
static nb_status merge_ranks(nb_ctx *ctx, nb_qmodel *qm) {
    if (nb_comm_size(ctx) <= 1) return NB_OK;
    int64_t cap = qm->n + (qm->kvcalib ? 2 * qm->n_layers : 0), n = 0;
    nb_calib **cals = malloc((size_t)(cap ? cap : 1) * sizeof *cals);
    if (!cals) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < qm->n; i++)
        if (qm->mods[i].icalib) cals[n++] = qm->mods[i].icalib;
    for (int64_t k = 0; qm->kvcalib && k < 2 * qm->n_layers; k++)
        if (qm->kvcalib[k]) cals[n++] = qm->kvcalib[k];
    nb_status s = nbq_calib_allreduce(ctx, cals, n);
    free(cals);
    return s;
}

nb_status nb_qmodel_calibrate_end(nb_ctx *ctx, nb_qmodel *qm) {
    if (!qm->calibrating) return nb_fail(ctx, NB_ERR_INVALID, "calibrate_end without calibrate_begin");
    nb_status s = merge_ranks(ctx, qm);
    for (int64_t i = 0; i < qm->n; i++) {   /* after a failure, the calibrators are only freed */
        nb_qmod *q = &qm->mods[i];
        if (!q->icalib) continue;
        if (!s && nb_calib_batches(q->icalib) > 0) {
            s = nb_calib_finish(ctx, q->icalib);
        } else if (!s) {
            char **grown = realloc(qm->uncovered, (size_t)(qm->n_uncovered + 1) * sizeof *grown);
            if (!grown) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
            else {
                qm->uncovered = grown;
                qm->uncovered[qm->n_uncovered++] = dupstr(q->name);
            }
        }
        nb_calib_free(q->icalib);
        q->icalib = NULL;
    }
    for (int64_t k = 0; qm->kvcalib && k < 2 * qm->n_layers; k++) {
        nb_calib *c = qm->kvcalib[k];
        if (!c) continue;
        if (!s && nb_calib_batches(c) > 0) {
            s = nb_calib_finish(ctx, c);
        } else if (!s) {
            char **grown = realloc(qm->uncovered, (size_t)(qm->n_uncovered + 1) * sizeof *grown);
            if (!grown) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
            else {
                qm->uncovered = grown;
                qm->uncovered[qm->n_uncovered++] = dupstr(nb_quantizer_name(qm->kvq[k]));
            }
        }
        nb_calib_free(c);
        qm->kvcalib[k] = NULL;
    }
    qm->calibrating = 0;
    nb_status s2 = clear_hooks(ctx, qm);
    if (s) return s;
    if (s2) return s2;
    return nb_qmodel_calibrate_weights(ctx, qm, &qm->calib_cfg);
}

int64_t nb_qmodel_uncovered_count(const nb_qmodel *qm) { return qm->n_uncovered; }
const char *nb_qmodel_uncovered(const nb_qmodel *qm, int64_t i) {
    return (i >= 0 && i < qm->n_uncovered) ? qm->uncovered[i] : NULL;
}

/* ---- the guard ----------------------------------------------------------------------------- */

nb_status nb_qmodel_check_module(nb_ctx *ctx, const nb_qmod *q) {
    const char *miss;
    if (q->wq && nb_quantizer_enabled(q->wq) && (miss = nb_quantizer_missing(q->wq)))
        return nb_fail(ctx, NB_ERR_UNCALIBRATED, "%s: weight_quantizer is enabled but has no calibrated %s "
                       "(calibrate first, or export with allow_uncalibrated = true to leave it unquantized)", q->name, miss);
    if (q->iq && nb_quantizer_enabled(q->iq) && (miss = nb_quantizer_missing(q->iq)))
        return nb_fail(ctx, NB_ERR_UNCALIBRATED, "%s: input_quantizer is enabled but has no calibrated %s "
                       "(it saw no calibration tokens; calibrate on data that reaches it, or export with "
                       "allow_uncalibrated = true to leave it unquantized)", q->name, miss);
    return NB_OK;
}

nb_status nb_qmodel_check_kv(nb_ctx *ctx, const nb_qmodel *qm, int64_t k) {
    const nb_quantizer *q = qm->kvq ? qm->kvq[k] : NULL;
    const char *miss;
    if (!q || !nb_quantizer_enabled(q) || !(miss = nb_quantizer_missing(q))) return NB_OK;
    char attn[200];
    nb_qmodel_attn_name(k / 2, attn, sizeof attn);
    return nb_fail(ctx, NB_ERR_UNCALIBRATED, "%s: %c_bmm_quantizer (FP8 KV cache, %c_scale) is enabled but has no "
                   "calibrated %s (KV cache scales come from calibration forward passes: calibrate on data, or export "
                   "with allow_uncalibrated = true to leave the KV cache unquantized)", attn, k % 2 ? 'v' : 'k',
                   k % 2 ? 'v' : 'k', miss);
}

nb_status nb_qmodel_check(nb_ctx *ctx, const nb_qmodel *qm) {
    for (int64_t i = 0; i < qm->n; i++) {
        nb_status s = nb_qmodel_check_module(ctx, &qm->mods[i]);
        if (s) return s;
    }
    for (int64_t k = 0; qm->kvq && k < 2 * qm->n_layers; k++) {
        nb_status s = nb_qmodel_check_kv(ctx, qm, k);
        if (s) return s;
    }
    return NB_OK;
}

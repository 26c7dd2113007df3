/* Quantizer objects: a format and options, an enabled flag, the calibrated state (amax,
 * block_amax, global_amax) and an optional shared-state group for fused siblings. Fake quant,
 * export quantization and the straight-through backward all read the same state, and a missing
 * state is a named NB_ERR_UNCALIBRATED, never a silent fallback. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/formats.h"
#include "quant/quant_internal.h"

enum { ST_AMAX = 0, ST_BLOCK_AMAX = 1, ST_GLOBAL_AMAX = 2, ST_COUNT = 3 };
static const char *const STATE_NAMES[ST_COUNT] = {"amax", "block_amax", "global_amax"};

struct nb_quantizer {
    int refcount;
    char *name;
    nb_quantizer_config cfg;
    nb_tensor *state[ST_COUNT];
    nb_qgroup *group;            /* strong: the group lives while a member does */
};

struct nb_qgroup {
    int refcount;
    char *name;
    nb_quantizer **members;      /* weak: a member leaves the group when it is destroyed */
    int n, cap;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The quantizer's format row (nibble/formats.h): its calibrated state and granularity. */
static const nb_format_desc *desc(const nb_quantizer *q) { return nb_format_desc_of(q->cfg.format); }

static int is_static_nvfp4(const nb_quantizer *q) { return q->cfg.is_static && desc(q)->state_static; }

/* ---- construction ------------------------------------------------------------------------------ */

void nb_quantizer_config_init(nb_quantizer_config *cfg, nb_qformat f) {
    memset(cfg, 0, sizeof *cfg);
    cfg->format = f;
    cfg->is_static = f == NB_FMT_NVFP4_46;
    cfg->fp8_div_dtype = -1;
    cfg->pass_through_bwd = 1;
    cfg->enabled = 1;
}

nb_status nb_quantizer_new(nb_ctx *ctx, const char *name, const nb_quantizer_config *cfg, nb_quantizer **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_new: out is NULL");
    *out = NULL;
    if (!name) name = "quantizer";
    if (!cfg) return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': config is NULL (nb_quantizer_config_init makes one)", name);
    const nb_qformat_traits *tr = nb_qformat_info(cfg->format);
    if (!tr || cfg->format == NB_FMT_NONE)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': unknown or empty format %d", name, (int)cfg->format);
    if (cfg->is_static && !nb_format_desc_of(cfg->format)->state_static)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': only NVFP4 has a static (per-block calibrated) mode, not %s",
                       name, tr->name);
    if (cfg->fp8_div_dtype >= 0 && cfg->fp8_div_dtype != NB_F32 && cfg->fp8_div_dtype != NB_BF16 &&
        cfg->fp8_div_dtype != NB_F16)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': fp8_div_dtype must be -1, f32, bf16 or f16", name);
    nb_quantizer *q = calloc(1, sizeof *q);
    if (!q || !(q->name = dup_str(name))) {
        free(q);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (quantizer)");
    }
    q->refcount = 1;
    q->cfg = *cfg;
    *out = q;
    return NB_OK;
}

void nb_quantizer_retain(nb_quantizer *q) { if (q) q->refcount++; }

void nb_quantizer_release(nb_quantizer *q) {
    if (!q || --q->refcount > 0) return;
    if (q->group) nb_qgroup_remove(NULL, q->group, q);
    for (int i = 0; i < ST_COUNT; i++) nb_tensor_release(q->state[i]);
    free(q->name);
    free(q);
}

const char *nb_quantizer_name(const nb_quantizer *q) { return q->name; }
void nb_quantizer_get_config(const nb_quantizer *q, nb_quantizer_config *out) { *out = q->cfg; }
void nb_quantizer_set_enabled(nb_quantizer *q, int enabled) { q->cfg.enabled = enabled != 0; }
int nb_quantizer_enabled(const nb_quantizer *q) { return q->cfg.enabled; }

/* ---- state ----------------------------------------------------------------------------------------- */

const char *nb_quantizer_state_name(int i) { return (i >= 0 && i < ST_COUNT) ? STATE_NAMES[i] : NULL; }

static int state_index(const char *attr) {
    for (int i = 0; attr && i < ST_COUNT; i++)
        if (strcmp(attr, STATE_NAMES[i]) == 0) return i;
    return -1;
}

/* Which attributes a quantizer of this configuration uses at all. */
static int uses_state(const nb_quantizer *q, int k) {
    return nb_format_uses_state(desc(q), q->cfg.is_static, STATE_NAMES[k]);
}

int nb_quantizer_has_state(const nb_quantizer *q, const char *attr) {
    int k = state_index(attr);
    return k >= 0 && q->state[k] != NULL;
}

nb_status nb_quantizer_get_state(nb_ctx *ctx, const nb_quantizer *q, const char *attr, nb_tensor **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_get_state: out is NULL");
    *out = NULL;
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_get_state: quantizer is NULL");
    int k = state_index(attr);
    if (k < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "quantizer '%s': no state attribute '%s'", q->name, attr ? attr : "(null)");
    if (!q->state[k]) return nb_fail(ctx, NB_ERR_UNCALIBRATED, "quantizer '%s' has no calibrated %s", q->name, attr);
    return nb_tensor_contiguous(ctx, q->state[k], out);
}

/* set_state's checks and copy; `replace` (calibrators writing a new result) skips the comparison with
 * the shape already there, since calibrating on another tensor legitimately changes it. */
static nb_status put_state(nb_ctx *ctx, nb_quantizer *q, const char *attr, const nb_tensor *value, int replace) {
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_set_state: quantizer is NULL");
    int k = state_index(attr);
    if (k < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "quantizer '%s': no state attribute '%s'", q->name, attr ? attr : "(null)");
    if (!uses_state(q, k))
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' (%s%s) has no '%s' state", q->name,
                       nb_qformat_info(q->cfg.format)->name, q->cfg.is_static ? ", static" : "", attr);
    if (!value) return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': %s value is NULL", q->name, attr);
    int64_t n = nb_tensor_numel(value);
    int scalar = k == ST_GLOBAL_AMAX || (k == ST_AMAX && !desc(q)->per_row);
    if (scalar && n != 1)
        return nb_fail(ctx, NB_ERR_SHAPE, "quantizer '%s': %s is one value, got %lld", q->name, attr, (long long)n);
    if (n < 1) return nb_fail(ctx, NB_ERR_SHAPE, "quantizer '%s': %s is empty", q->name, attr);
    const nb_tensor *old = q->state[k];
    if (!scalar && old && !replace) {
        int same = old->ndim == value->ndim;
        for (int d = 0; same && d < old->ndim; d++) same = old->shape[d] == value->shape[d];
        if (!same) {
            char os[160], vs[160];
            nbq_shape_str(old, 0, NULL, os, sizeof os);
            nbq_shape_str(value, 0, NULL, vs, sizeof vs);
            return nb_fail(ctx, NB_ERR_SHAPE,
                           "quantizer '%s': %s %s does not match the %s %s it has (clear its state first to change the shape)",
                           q->name, attr, vs, attr, os);
        }
    }
    nb_tensor *t = NULL;
    nb_status s = scalar ? nb_tensor_new(ctx, NB_F32, 0, NULL, &t) : nb_tensor_new(ctx, NB_F32, value->ndim, value->shape, &t);
    if (s) return s;
    if (scalar) {
        int64_t zero[NB_MAX_DIMS] = {0};
        *(float *)nb_tensor_data(t) = (float)nb_tensor_get(value, zero);
    } else if ((s = nb_tensor_copy(ctx, t, value))) {
        nb_tensor_release(t);
        return s;
    }
    const float *v = nb_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(v[i]) || v[i] < 0.0f) {
            char num[32];
            s = nb_fail(ctx, NB_ERR_NUMERIC, "quantizer '%s': %s[%lld] = %s is not a finite amax >= 0", q->name, attr,
                        (long long)i, nbq_num(v[i], num, sizeof num));
            nb_tensor_release(t);
            return s;
        }
    }
    nb_tensor_release(q->state[k]);
    q->state[k] = t;
    return NB_OK;
}

nb_status nb_quantizer_set_state(nb_ctx *ctx, nb_quantizer *q, const char *attr, const nb_tensor *value) {
    return put_state(ctx, q, attr, value, 0);
}

nb_status nbq_quantizer_replace_state(nb_ctx *ctx, nb_quantizer *q, const char *attr, const nb_tensor *value) {
    return put_state(ctx, q, attr, value, 1);
}

nb_status nb_quantizer_clear_state(nb_ctx *ctx, nb_quantizer *q, const char *attr) {
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_clear_state: quantizer is NULL");
    if (!attr) {
        for (int i = 0; i < ST_COUNT; i++) { nb_tensor_release(q->state[i]); q->state[i] = NULL; }
        return NB_OK;
    }
    int k = state_index(attr);
    if (k < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "quantizer '%s': no state attribute '%s'", q->name, attr);
    nb_tensor_release(q->state[k]);
    q->state[k] = NULL;
    return NB_OK;
}

/* The per-tensor attribute a group shares: global_amax for static NVFP4, amax otherwise. */
static int shared_attr(const nb_quantizer *q) { return is_static_nvfp4(q) ? ST_GLOBAL_AMAX : ST_AMAX; }

/* The member of q's group (or q) lacking the shared attribute, or NULL. */
static const nb_quantizer *group_lacking(const nb_quantizer *q) {
    int k = shared_attr(q);
    if (!q->group) return q->state[k] ? NULL : q;
    if (!q->state[k]) return q;
    for (int i = 0; i < q->group->n; i++)
        if (!q->group->members[i]->state[k]) return q->group->members[i];
    return NULL;
}

const char *nb_quantizer_missing(const nb_quantizer *q) {
    if (!q->cfg.enabled) return NULL;
    if (!desc(q)->state_dynamic[0]) return NULL;   /* nothing calibrated (MXFP8: scales from the data) */
    if (desc(q)->per_row) return q->state[ST_AMAX] ? NULL : "amax";   /* per row: never shared */
    if (is_static_nvfp4(q) && !q->state[ST_BLOCK_AMAX]) return "block_amax";
    return group_lacking(q) ? STATE_NAMES[shared_attr(q)] : NULL;
}

nb_status nb_quantizer_check(nb_ctx *ctx, const nb_quantizer *q) {
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_check: quantizer is NULL");
    const char *m = nb_quantizer_missing(q);
    if (!m) return NB_OK;
    const nb_quantizer *who = (strcmp(m, "block_amax") == 0 || desc(q)->per_row) ? q : group_lacking(q);
    if (who && who != q)
        return nb_fail(ctx, NB_ERR_UNCALIBRATED,
                       "quantizer '%s' has no calibrated %s: its shared group '%s' member '%s' is uncalibrated", q->name,
                       m, q->group->name, who->name);
    return nb_fail(ctx, NB_ERR_UNCALIBRATED, "quantizer '%s' has no calibrated %s", q->name, m);
}

nb_status nb_quantizer_global_amax(nb_ctx *ctx, const nb_quantizer *q, float *out) {
    if (!q || !out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_global_amax: %s is NULL", q ? "out" : "quantizer");
    if (!desc(q)->groupable)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': %s has no per-tensor amax", q->name,
                       nb_qformat_info(q->cfg.format)->name);
    const nb_quantizer *who = group_lacking(q);
    int k = shared_attr(q);
    if (who) {
        if (who != q)
            return nb_fail(ctx, NB_ERR_UNCALIBRATED,
                           "quantizer '%s' has no calibrated %s: its shared group '%s' member '%s' is uncalibrated",
                           q->name, STATE_NAMES[k], q->group->name, who->name);
        return nb_fail(ctx, NB_ERR_UNCALIBRATED, "quantizer '%s' has no calibrated %s", q->name, STATE_NAMES[k]);
    }
    float m = *(const float *)nb_tensor_data(q->state[k]);
    if (q->group)
        for (int i = 0; i < q->group->n; i++) {
            float v = *(const float *)nb_tensor_data(q->group->members[i]->state[k]);
            if (v > m) m = v;
        }
    *out = m;
    return NB_OK;
}

nb_status nb_quantizer_scale(nb_ctx *ctx, const nb_quantizer *q, float *out) {
    if (!q || !out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_scale: %s is NULL", q ? "out" : "quantizer");
    float a;
    nb_status s = nb_quantizer_global_amax(ctx, q, &a);
    if (s) return s;
    a = nbq_sanitized_amax(q->cfg.format, a);   /* as quantize does: a positive scale (ModelOpt's sanitize) */
    if (nbq_is_nvfp4(q->cfg.format)) *out = nb_nvfp4_scale2(a, nb_qformat_info(q->cfg.format)->scale_norm);
    else *out = a / 448.0f;
    return NB_OK;
}

nb_status nb_quantizer_params(nb_ctx *ctx, const nb_quantizer *q, nb_qparams *out) {
    if (!q || !out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_params: %s is NULL", q ? "out" : "quantizer");
    nb_qparams_init(out, q->cfg.format);
    out->name = q->name;
    out->mx_floor = q->cfg.mx_floor;
    out->fp8_div_dtype = q->cfg.fp8_div_dtype;
    nb_status s = nb_quantizer_check(ctx, q);
    if (s) return s;
    switch (q->cfg.format) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46:
        if (q->cfg.is_static) {
            out->block_amax = q->state[ST_BLOCK_AMAX];
            return nb_quantizer_global_amax(ctx, q, &out->global_amax);
        }
        return nb_quantizer_global_amax(ctx, q, &out->amax);
    case NB_FMT_FP8_TENSOR: return nb_quantizer_global_amax(ctx, q, &out->amax);
    case NB_FMT_FP8_CHANNEL: out->channel_amax = q->state[ST_AMAX]; return NB_OK;
    default: return NB_OK;
    }
}

/* ---- use -------------------------------------------------------------------------------------------- */

nb_status nb_quantizer_quantize(nb_ctx *ctx, const nb_quantizer *q, const nb_tensor *x, nb_qtensor **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_quantize: out is NULL");
    *out = NULL;
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_quantize: quantizer is NULL");
    if (!q->cfg.enabled)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' is disabled: there is nothing to quantize with", q->name);
    nb_status s = nbq_check_input(ctx, x, q->cfg.format, q->name);
    if (s) return s;
    nb_qparams p;
    if ((s = nb_quantizer_params(ctx, q, &p))) return s;
    return nb_quantize(ctx, x, &p, out);
}

nb_status nb_quantizer_fake(nb_ctx *ctx, const nb_quantizer *q, const nb_tensor *x, nb_tensor *out) {
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_fake: quantizer is NULL");
    if (!x || !out) return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' fake: %s is NULL", q->name, x ? "output" : "input");
    if (!q->cfg.enabled) return out == x ? NB_OK : nb_tensor_copy(ctx, out, x);
    nb_status s = nbq_check_input(ctx, x, q->cfg.format, q->name);
    if (s) return s;
    nb_qparams p;
    if ((s = nb_quantizer_params(ctx, q, &p))) return s;
    return nb_fake_quant(ctx, x, &p, out);
}

typedef struct bwd_job {
    const void *x, *g;
    nb_dtype xdt, gdt;
    void *gi;
    nb_dtype gidt;
    int64_t n;
    float amax;              /* per tensor */
    const float *row_amax;   /* per row */
    const float *blk_amax;   /* per block of 16 */
    int failed;
} bwd_job;

static void bwd_range(void *arg, int64_t begin, int64_t end) {
    bwd_job *j = arg;
    float *xb = malloc((size_t)j->n * 2 * sizeof(float));
    if (!xb) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
    float *gb = xb + j->n;
    for (int64_t r = begin; r < end; r++) {
        nbq_load_row(j->x, j->xdt, r, j->n, xb);
        nbq_load_row(j->g, j->gdt, r, j->n, gb);
        for (int64_t i = 0; i < j->n; i++) {
            float bound = j->blk_amax ? j->blk_amax[r * (j->n / NB_NVFP4_BLOCK) + i / NB_NVFP4_BLOCK]
                          : j->row_amax ? j->row_amax[r] : j->amax;
            if (!(fabsf(xb[i]) <= bound)) gb[i] = 0.0f;   /* torch.where(|x| <= amax, g, 0) */
        }
        nbq_store_row(j->gi, j->gidt, r, j->n, gb);
    }
    free(xb);
}

static int float_dtype(nb_dtype d) { return d == NB_F32 || d == NB_BF16 || d == NB_F16; }

nb_status nb_quantizer_backward(nb_ctx *ctx, const nb_quantizer *q, const nb_tensor *x, const nb_tensor *grad_out,
                                nb_tensor *grad_in) {
    if (!q) return nb_fail(ctx, NB_ERR_INVALID, "nb_quantizer_backward: quantizer is NULL");
    if (!x || !grad_out || !grad_in) return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' backward: NULL tensor", q->name);
    if (x->ndim != grad_out->ndim || x->ndim != grad_in->ndim)
        return nb_fail(ctx, NB_ERR_SHAPE, "quantizer '%s' backward: x, grad_out and grad_in must have the same shape", q->name);
    for (int i = 0; i < x->ndim; i++)
        if (x->shape[i] != grad_out->shape[i] || x->shape[i] != grad_in->shape[i])
            return nb_fail(ctx, NB_ERR_SHAPE, "quantizer '%s' backward: dim %d differs between x and the gradients", q->name, i);
    /* a gradient in an integer dtype would be truncated by the copy: refused on every path */
    if (!float_dtype(x->dtype) || !float_dtype(grad_out->dtype) || !float_dtype(grad_in->dtype))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "quantizer '%s' backward: f32, bf16 or f16 tensors only (x %s, grad_out %s, "
                       "grad_in %s)", q->name, nb_dtype_info(x->dtype)->name, nb_dtype_info(grad_out->dtype)->name,
                       nb_dtype_info(grad_in->dtype)->name);
    if (!q->cfg.enabled || q->cfg.pass_through_bwd || !desc(q)->state_dynamic[0])   /* no amax to clip at */
        return grad_in == grad_out ? NB_OK : nb_tensor_copy(ctx, grad_in, grad_out);
    if (!nb_tensor_is_contiguous(grad_in) || !nb_buffer_writable(grad_in->buf))
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' backward: grad_in must be contiguous and writable", q->name);
    nb_status s = nbq_check_input(ctx, x, q->cfg.format, q->name);
    if (s) return s;
    nb_qparams p;
    if ((s = nb_quantizer_params(ctx, q, &p))) return s;
    int64_t n = x->shape[x->ndim - 1], rows = n ? nb_tensor_numel(x) / n : 0;
    if (p.block_amax && (s = nbq_check_state_shape(ctx, p.block_amax, x, n / NB_NVFP4_BLOCK, "block_amax", q->name)))
        return s;
    if (p.channel_amax && (s = nbq_check_state_shape(ctx, p.channel_amax, x, 1, "amax", q->name))) return s;
    nb_tensor *xc = NULL, *gc = NULL;
    if ((s = nbq_contiguous(ctx, x, &xc))) return s;
    if ((s = nbq_contiguous(ctx, grad_out, &gc))) { nb_tensor_release(xc); return s; }
    bwd_job j = {.x = nb_tensor_data(xc), .xdt = xc->dtype, .g = nb_tensor_data(gc), .gdt = gc->dtype,
                 .gi = nb_tensor_data(grad_in), .gidt = grad_in->dtype, .n = n, .amax = p.amax,
                 .row_amax = p.channel_amax ? nb_tensor_data(p.channel_amax) : NULL,
                 .blk_amax = p.block_amax ? nb_tensor_data(p.block_amax) : NULL};
    if (p.block_amax == NULL && nbq_is_nvfp4(q->cfg.format)) j.amax = p.amax;
    nb_parallel_for(ctx, rows, n >= 16384 ? 1 : 16384 / (n ? n : 1), bwd_range, &j);
    nb_tensor_release(xc);
    nb_tensor_release(gc);
    if (j.failed) return nb_fail(ctx, NB_ERR_NOMEM, "quantizer '%s' backward: out of memory", q->name);
    return NB_OK;
}

/* ---- shared-state groups ----------------------------------------------------------------------------- */

nb_status nb_qgroup_new(nb_ctx *ctx, const char *name, nb_qgroup **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_qgroup_new: out is NULL");
    *out = NULL;
    nb_qgroup *g = calloc(1, sizeof *g);
    if (!g || !(g->name = dup_str(name ? name : "group"))) {
        free(g);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (quantizer group)");
    }
    g->refcount = 1;
    *out = g;
    return NB_OK;
}

void nb_qgroup_retain(nb_qgroup *g) { if (g) g->refcount++; }

void nb_qgroup_release(nb_qgroup *g) {
    if (!g || --g->refcount > 0) return;
    free(g->members);
    free(g->name);
    free(g);
}

const char *nb_qgroup_name(const nb_qgroup *g) { return g->name; }
int nb_qgroup_size(const nb_qgroup *g) { return g->n; }
nb_quantizer *nb_qgroup_member(const nb_qgroup *g, int i) { return (i >= 0 && i < g->n) ? g->members[i] : NULL; }
nb_qgroup *nb_quantizer_group(const nb_quantizer *q) { return q->group; }

nb_status nb_qgroup_add(nb_ctx *ctx, nb_qgroup *g, nb_quantizer *q) {
    if (!g || !q) return nb_fail(ctx, NB_ERR_INVALID, "nb_qgroup_add: %s is NULL", g ? "quantizer" : "group");
    if (q->group == g) return NB_OK;   /* already a member: adding it again changes nothing */
    if (q->group)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' is already in shared group '%s'", q->name, q->group->name);
    nb_qformat f = q->cfg.format;
    if (!desc(q)->groupable)
        return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s': %s has no per-tensor amax to share in group '%s'", q->name,
                       nb_qformat_info(f)->name, g->name);
    if (g->n > 0) {
        const nb_quantizer *m = g->members[0];
        if (m->cfg.format != f || m->cfg.is_static != q->cfg.is_static)
            return nb_fail(ctx, NB_ERR_INVALID, "quantizer '%s' (%s%s) cannot join group '%s' of %s%s quantizers", q->name,
                           nb_qformat_info(f)->name, q->cfg.is_static ? " static" : "", g->name,
                           nb_qformat_info(m->cfg.format)->name, m->cfg.is_static ? " static" : "");
    }
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 4;
        nb_quantizer **m = realloc(g->members, (size_t)cap * sizeof *m);
        if (!m) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (quantizer group)");
        g->members = m;
        g->cap = cap;
    }
    g->members[g->n++] = q;
    q->group = g;
    nb_qgroup_retain(g);
    return NB_OK;
}

nb_status nb_qgroup_remove(nb_ctx *ctx, nb_qgroup *g, nb_quantizer *q) {
    if (!g || !q) return nb_fail(ctx, NB_ERR_INVALID, "nb_qgroup_remove: %s is NULL", g ? "quantizer" : "group");
    for (int i = 0; i < g->n; i++) {
        if (g->members[i] != q) continue;
        memmove(g->members + i, g->members + i + 1, (size_t)(g->n - i - 1) * sizeof *g->members);
        g->n--;
        q->group = NULL;
        nb_qgroup_release(g);
        return NB_OK;
    }
    return ctx ? nb_fail(ctx, NB_ERR_NOT_FOUND, "quantizer '%s' is not in group '%s'", q->name, g->name) : NB_ERR_NOT_FOUND;
}

nb_status nbq_group_amax_with(nb_ctx *ctx, const nb_quantizer *q, float own, const char *who, float *out) {
    float m = own;
    int k = shared_attr(q);
    for (int i = 0; q->group && i < q->group->n; i++) {
        const nb_quantizer *o = q->group->members[i];
        if (o == q) continue;
        if (!o->state[k])
            return nb_fail(ctx, NB_ERR_UNCALIBRATED,
                           "%s for '%s': its shared group '%s' member '%s' has no %s: the group shares one %s, so run a "
                           "max pass on every member first", who, q->name, q->group->name, o->name, STATE_NAMES[k],
                           STATE_NAMES[k]);
        float v = *(const float *)nb_tensor_data(o->state[k]);
        if (v > m) m = v;
    }
    *out = m;
    return NB_OK;
}

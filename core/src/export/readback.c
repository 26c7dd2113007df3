/* Read-back of exported checkpoints: recognise how a linear module's weight was stored (ModelOpt or
 * compressed-tensors layout; NVFP4, MXFP8, FP8) and dequantize it as the serving loaders do, so that
 * `nibble eval` measures what ships. The model loader calls this for every weight that is not a plain
 * float tensor; the arithmetic is the quantizer's own dequantize row (quant/qtensor.c). */
#include <stdio.h>
#include <string.h>

#include "nibble/export.h"
#include "nibble/formats.h"

static int64_t find2(nb_st *st, const char *module, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", module, suffix);
    return nb_st_find(st, buf);
}

static const nb_st_entry *entry(nb_st *st, const char *module, const char *suffix, int64_t *idx) {
    char name[1200];
    int64_t i = find2(st, module, suffix, name, sizeof name);
    if (idx) *idx = i;
    return i >= 0 ? nb_st_entry_at(st, i) : NULL;
}

static int64_t numel_of(const nb_st_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

static int is_float_dt(nb_dtype dt) { return dt == NB_F32 || dt == NB_BF16 || dt == NB_F16; }

/* The stored format (a row of nibble/formats.h that is its own disk format) with data dtype wdt whose
 * scales sdt can be: its E4M3 block scales, its U8 exponents (also read as E8M0), or float per-tensor
 * scales (F32 in the row; BF16/F16 in compressed-tensors) with per_row telling tensor from channel. */
static const nb_format_desc *disk_row(nb_dtype wdt, nb_dtype sdt, int per_row) {
    for (int f = 1; f < NB_FMT_COUNT; f++) {
        const nb_format_desc *d = nb_format_desc_of((nb_qformat)f);
        if (!d || d->disk_format != d->id || d->data_dtype != wdt) continue;
        if (d->scale_dtype == NB_F32 ? (is_float_dt(sdt) && d->per_row == per_row)
                                     : (sdt == d->scale_dtype || (d->scale_dtype == NB_U8 && sdt == NB_E8M0)))
            return d;
    }
    return NULL;
}

/* "NVFP4", "MXFP8", "FP8": a row's name as the messages write formats. */
static const char *upper(const nb_format_desc *d, char *buf, size_t cap) {
    size_t i = 0;
    for (; d->name[i] && d->name[i] != '_' && i + 1 < cap; i++)
        buf[i] = (char)(d->name[i] >= 'a' && d->name[i] <= 'z' ? d->name[i] - 32 : d->name[i]);
    buf[i] = 0;
    return buf;
}

/* One float value of a 0-d / [1] tensor, in float32 (BF16/F16 scales widen exactly). */
static nb_status read_scalar(nb_ctx *ctx, nb_st *st, const char *module, const char *suffix, float *out) {
    char name[1200];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    nb_tensor *t = NULL;
    nb_status s = nb_st_get(ctx, st, name, &t);
    if (s) return s;
    if (nb_tensor_numel(t) != 1 || !is_float_dt(t->dtype)) {
        nb_tensor_release(t);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s must hold one float value", name);
    }
    s = nb_convert(out, NB_F32, nb_tensor_data(t), t->dtype, 1);
    nb_tensor_release(t);
    return s;
}

nb_status nb_readback_probe(nb_ctx *ctx, nb_st *st, const char *module, nb_readback_info *info) {
    memset(info, 0, sizeof *info);
    info->format = NB_FMT_NONE;
    info->input_format = NB_FMT_NONE;
    info->layout = NB_LAYOUT_MODELOPT;
    const nb_st_entry *w = entry(st, module, "weight", NULL);
    const nb_st_entry *wp = entry(st, module, "weight_packed", NULL);
    if (wp) {
        w = wp;
        info->layout = NB_LAYOUT_COMPRESSED_TENSORS;
    }
    if (!w || is_float_dt(w->dtype)) return NB_OK;
    const nb_st_entry *sc = entry(st, module, "weight_scale", NULL);
    if (!sc) return nb_fail(ctx, NB_ERR_FORMAT, "%s: the weight is %s but there is no %s.weight_scale", module,
                            nb_dtype_info(w->dtype)->st_name, module);
    if (w->ndim != 2 || sc->ndim > 2)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: a quantized weight must be 2-d (has %d dims)", module, (int)w->ndim);
    int64_t rows = w->shape[0];
    const nb_format_desc *d = disk_row(w->dtype, sc->dtype, 0);
    char up[16];
    if (d && d->has_scale2) {
        const nb_st_entry *s2 = entry(st, module, d->mo_scale2, NULL);
        const nb_st_entry *gs = entry(st, module, d->ct_scale2, NULL);
        if (gs) info->layout = NB_LAYOUT_COMPRESSED_TENSORS;
        if (!s2 && !gs)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: %s weight without %s (ModelOpt) or %s (compressed-tensors)", module,
                           upper(d, up, sizeof up), d->mo_scale2, d->ct_scale2);
        int64_t per_byte = d->elem_dtype == NB_E2M1 ? 2 : 1;   /* two E2M1 codes a byte */
        if (sc->ndim != 2 || sc->shape[0] != rows || sc->shape[1] * d->block_size != w->shape[1] * per_byte)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: %s weight_scale must be [%lld, %lld]", module, upper(d, up, sizeof up),
                           (long long)rows, (long long)(w->shape[1] * per_byte / d->block_size));
        info->format = d->id;
    } else if (d && d->block_size > 0 && sc->ndim == 2) {
        if (sc->shape[0] != rows || sc->shape[1] * d->block_size != w->shape[1])
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: %s weight_scale must be [%lld, %lld]", module, upper(d, up, sizeof up),
                           (long long)rows, (long long)(w->shape[1] / d->block_size));
        info->format = d->id;
    } else if (d && d->block_size == 0) {
        const nb_format_desc *row = disk_row(w->dtype, sc->dtype, 1);
        int64_t n = numel_of(sc);
        if (n == 1) info->format = d->id;
        else if (n == rows && row) info->format = row->id;
        else return nb_fail(ctx, NB_ERR_FORMAT, "%s: %s weight_scale has %lld values (1 or one per row expected)", module,
                            upper(d, up, sizeof up), (long long)n);
        if (info->format == (int32_t)d->id && (sc->ndim != 0 || sc->dtype != NB_F32))
            info->layout = NB_LAYOUT_COMPRESSED_TENSORS;   /* CT keeps [1] scales in the model dtype */
    } else {
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: weight %s with weight_scale %s is not a layout nibble reads", module,
                       nb_dtype_info(w->dtype)->st_name, nb_dtype_info(sc->dtype)->st_name);
    }
    /* the activation scale, in ModelOpt's convention */
    nb_status s;
    float v;
    /* compressed-tensors' inverse input scale (input_global_scale) names NVFP4 inputs; a plain
     * input_scale is NVFP4's beside NVFP4 weights, else FP8 per tensor's */
    const nb_format_desc *inv = NULL, *wd = nb_format_desc_of((nb_qformat)info->format);
    for (int f = 1; f < NB_FMT_COUNT && !inv; f++) {
        const nb_format_desc *d2 = nb_format_desc_of((nb_qformat)f);
        if (d2 && d2->disk_format == d2->id && d2->input_ok && d2->ct_inverse_scales) inv = d2;
    }
    const nb_format_desc *in = wd->has_scale2 ? wd : disk_row(NB_E4M3, NB_F32, 0);
    if (inv && entry(st, module, inv->ct_input, NULL)) {
        if ((s = read_scalar(ctx, st, module, inv->ct_input, &v))) return s;
        info->input_format = inv->id;
        info->input_scale = 1.0f / v;
    } else if (entry(st, module, in->mo_input, NULL)) {
        if ((s = read_scalar(ctx, st, module, in->mo_input, &v))) return s;
        info->input_format = in->id;
        info->input_scale = v;
    }
    return NB_OK;
}

static void mark(nb_st *st, const char *module, const char *suffix, char *used) {
    char name[1200];
    int64_t i = find2(st, module, suffix, name, sizeof name);
    if (used && i >= 0) used[i] = 1;
}

nb_status nb_readback_weight(nb_ctx *ctx, nb_st *st, const char *module, int64_t rows, int64_t cols, float *out,
                             char *used) {
    nb_readback_info info;
    nb_status s = nb_readback_probe(ctx, st, module, &info);
    if (s) return s;
    if (info.format == NB_FMT_NONE) return nb_fail(ctx, NB_ERR_INVALID, "%s: the weight is not quantized", module);
    char name[1200];
    int packed = find2(st, module, "weight_packed", name, sizeof name) >= 0;
    if (!packed) snprintf(name, sizeof name, "%s.weight", module);
    nb_tensor *data = NULL, *scale = NULL, *scale2 = NULL, *tmp = NULL, *outt = NULL;
    nb_qtensor *q = NULL;
    if ((s = nb_st_get(ctx, st, name, &data))) goto done;
    const nb_format_desc *d = nb_format_desc_of((nb_qformat)info.format);
    int64_t want_cols = d->elem_dtype == NB_E2M1 ? data->shape[1] * 2 : data->shape[1];
    if (data->shape[0] != rows || want_cols != cols) {
        s = nb_fail(ctx, NB_ERR_SHAPE, "%s has shape [%lld, %lld] (logical [%lld, %lld]); the config needs [%lld, %lld]", name,
                    (long long)data->shape[0], (long long)data->shape[1], (long long)data->shape[0], (long long)want_cols,
                    (long long)rows, (long long)cols);
        goto done;
    }
    if (data->dtype != d->data_dtype) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: unexpected U8 data", name);
        goto done;
    }
    snprintf(name, sizeof name, "%s.weight_scale", module);
    if ((s = nb_st_get(ctx, st, name, &scale))) goto done;
    if (d->has_scale2) {
        float v;
        int ct = entry(st, module, d->ct_scale2, NULL) != NULL;
        if ((s = read_scalar(ctx, st, module, ct ? d->ct_scale2 : d->mo_scale2, &v))) goto done;
        /* compressed-tensors stores the inverse; its loaders divide once in float32 */
        float s2 = ct && d->ct_inverse_scales ? 1.0f / v : v;
        int64_t one = 1;
        if ((s = nb_tensor_new(ctx, NB_F32, 0, &one, &scale2))) goto done;
        *(float *)nb_tensor_data(scale2) = s2;
    } else if (d->scale_dtype == NB_F32) {   /* FP8: float scales of any width, read as F32 */
        if (scale->dtype != NB_F32 || !nb_tensor_is_contiguous(scale)) {
            if ((s = nb_tensor_to(ctx, scale, NB_F32, &tmp))) goto done;
            nb_tensor_release(scale);
            scale = tmp;
            tmp = NULL;
        }
    }   /* MXFP8 scales stored as E8M0 are the same bytes the qtensor reads as U8 biased exponents */
    if ((s = nb_qtensor_wrap(ctx, (nb_qformat)info.format, data, scale, scale2, &q))) goto done;
    int64_t shape[2] = {rows, cols};
    nb_buffer *b = NULL;
    if ((s = nb_buffer_wrap(ctx, out, (size_t)(rows * cols) * sizeof(float), NULL, NULL, &b))) goto done;
    s = nb_tensor_wrap(ctx, b, NB_F32, 2, shape, 0, &outt);
    nb_buffer_release(b);
    if (s) goto done;
    if ((s = nb_qtensor_dequantize_into(ctx, q, outt))) goto done;
    mark(st, module, packed ? "weight_packed" : "weight", used);
    static const char *const extra[] = {"weight_scale", "weight_scale_2", "weight_global_scale", "input_scale",
                                        "input_global_scale", "k_scale", "v_scale", NULL};
    for (int k = 0; extra[k]; k++) mark(st, module, extra[k], used);
done:
    nb_qtensor_release(q);
    nb_tensor_release(outt);
    nb_tensor_release(data);
    nb_tensor_release(scale);
    nb_tensor_release(scale2);
    nb_tensor_release(tmp);
    return s;
}

/* ---- KV cache scales ------------------------------------------------------------------------- */

int64_t nb_readback_kv_scale_layer(const char *name, int32_t *which) {
    long long l;
    int used = 0;
    if (sscanf(name, "model.layers.%lld.self_attn.%n", &l, &used) != 1 || used == 0 || l < 0) return -1;
    const char *rest = name + used;
    static const char *const forms[4] = {"k_proj.k_scale", "v_proj.v_scale", "k_scale", "v_scale"};
    for (int f = 0; f < 4; f++)
        if (!strcmp(rest, forms[f])) {
            if (which) *which = f % 2;
            return (int64_t)l;
        }
    return -1;
}

nb_status nb_readback_kv_scale(nb_ctx *ctx, nb_st *st, int64_t layer, int32_t which, float *scale, int32_t *layout) {
    char attn[200];
    snprintf(attn, sizeof attn, "model.layers.%lld.self_attn", (long long)layer);
    const char *mo = which ? "v_proj.v_scale" : "k_proj.k_scale", *ct = which ? "v_scale" : "k_scale";
    int is_ct = entry(st, attn, mo, NULL) == NULL;
    if (is_ct && !entry(st, attn, ct, NULL))
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "%s has no %s (nor %s)", attn, mo, ct);
    if (layout) *layout = is_ct ? NB_LAYOUT_COMPRESSED_TENSORS : NB_LAYOUT_MODELOPT;
    nb_status s = read_scalar(ctx, st, attn, is_ct ? ct : mo, scale);
    if (!s && !(*scale > 0.0f && *scale < 3.4e38f))
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s.%s is %g: a KV cache scale must be positive and finite", attn, is_ct ? ct : mo,
                    (double)*scale);
    return s;
}

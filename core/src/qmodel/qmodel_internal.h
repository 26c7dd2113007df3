/* The qmodel's private layout, shared by qmodel/ (quantizers, calibration, fake quant, nibble checkpoints) and
 * export/ (ModelOpt / compressed-tensors layouts, read-back). */
#ifndef NIBBLE_QMODEL_INTERNAL_H
#define NIBBLE_QMODEL_INTERNAL_H

#include "nibble/qmodel.h"

typedef struct nb_qmod {
    char *name;               /* HF module name */
    int64_t module;           /* index in the model's module list */
    nb_linear_info info;
    nb_qspec spec;
    char *reason;             /* why unquantized (NULL when quantized) */
    nb_quantizer *wq, *iq;    /* weight / input quantizers (NULL when absent) */
    nb_calib *icalib;         /* input observer while calibrating */
    int64_t seen_rows;        /* tokens the input observer saw */
    nb_qmodel *owner;
    nb_ctx *ctx;
} nb_qmod;

struct nb_qmodel {
    nb_model *m;
    int64_t n;
    nb_qmod *mods;
    int32_t fake, calibrating, hooks_installed;
    nb_calib_config calib_cfg;
    char **uncovered;
    int64_t n_uncovered;
    char **skipped;           /* modules the last export left out (allow_uncalibrated) */
    int64_t n_skipped;
    char **nonfinite;         /* tensors the last export wrote with NaN/Inf (allow_nonfinite) */
    int64_t n_nonfinite;
    /* KV cache quantization (nb_qmodel_set_kv): layer l's K quantizer at kvq[2l], its V at kvq[2l+1] */
    int32_t kv_format;        /* NB_FMT_NONE: off */
    int64_t n_layers;
    nb_quantizer **kvq;
    nb_calib **kvcalib;       /* observers while calibrating */
    int32_t kv_hook_installed;
    nb_ctx *ctx;
};

nb_status nb_qmodel_check_module(nb_ctx *ctx, const nb_qmod *q);
/* The guard for one K or V quantizer (index into kvq). */
nb_status nb_qmodel_check_kv(nb_ctx *ctx, const nb_qmodel *qm, int64_t k);
/* "model.layers.N.self_attn" of layer l into buf. */
void nb_qmodel_attn_name(int64_t layer, char *buf, size_t cap);

#endif

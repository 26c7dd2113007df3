/* Quantized models: quantizers attached to a model's linear modules (per-module formats, as a
 * recipe resolved them), fused siblings sharing global scales, calibration through input hooks,
 * fake quant for QAD and student eval through weight and input hooks, the export guard, and nibble's
 * own checkpoint (save/restore of weights plus every quantizer's state). Export and read-back of the
 * serving layouts are in nibble/export.h. The same nb_quantizer computes the fake quant that trains
 * and the bytes that ship. */
#ifndef NIBBLE_QMODEL_H
#define NIBBLE_QMODEL_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/model.h"
#include "nibble/quant.h"
#include "nibble/safetensors.h"

typedef struct nb_qmodel nb_qmodel;

/* What one linear module gets. */
typedef struct nb_qspec {
    int32_t weight_format;      /* nb_qformat; NB_FMT_NONE leaves the module unquantized */
    int32_t weight_static;      /* NVFP4: calibrated per-block amax (nvfp4_static, four_over_six) */
    int32_t input_format;       /* nb_qformat of the activations (W4A4 NVFP4, FP8); NB_FMT_NONE = weights only */
    int32_t mx_floor;           /* MXFP8: OCP floor exponent rule instead of ModelOpt's ceil */
    int32_t pass_through_bwd;   /* STE: 1 = plain pass-through (ModelOpt >= 0.43), 0 = zero outside amax */
} nb_qspec;

/* NB_FMT_NONE everywhere, pass_through_bwd 1. */
NB_API void nb_qspec_init(nb_qspec *s);

/* A quantized view of m (borrowed: the model must outlive the qmodel). Every linear module starts
 * unquantized with the reason "no rule". */
NB_API nb_status nb_qmodel_new(nb_ctx *ctx, nb_model *m, nb_qmodel **out);
NB_API void nb_qmodel_free(nb_qmodel *qm);
/* Forget the model: a later nb_qmodel_free does not touch it (for a host whose finalizers may run
 * in any order at shutdown, after the model was already freed). */
NB_API void nb_qmodel_detach(nb_qmodel *qm);
NB_API nb_model *nb_qmodel_model(const nb_qmodel *qm);

/* Quantize module `name` (a linear module's HF name) as spec says. NB_ERR_SHAPE when the format's
 * block does not divide in_features, NB_ERR_INVALID for a tied lm_head or an unknown format. */
NB_API nb_status nb_qmodel_set(nb_ctx *ctx, nb_qmodel *qm, const char *name, const nb_qspec *spec);
/* Leave a module unquantized, saying why (listed in exclude_modules / ignore on export). */
NB_API nb_status nb_qmodel_exclude(nb_ctx *ctx, nb_qmodel *qm, const char *name, const char *reason);

/* The linear modules, in model order. */
NB_API int64_t nb_qmodel_count(const nb_qmodel *qm);
NB_API const char *nb_qmodel_name(const nb_qmodel *qm, int64_t i);
NB_API int64_t nb_qmodel_find(const nb_qmodel *qm, const char *name);        /* -1 if not a linear module */
NB_API const nb_qspec *nb_qmodel_spec(const nb_qmodel *qm, int64_t i);
NB_API const char *nb_qmodel_reason(const nb_qmodel *qm, int64_t i);          /* why unquantized, or NULL */
NB_API nb_quantizer *nb_qmodel_weight_quantizer(const nb_qmodel *qm, int64_t i); /* borrowed; NULL if none */
NB_API nb_quantizer *nb_qmodel_input_quantizer(const nb_qmodel *qm, int64_t i);  /* borrowed; NULL if none */

/* Share one per-tensor amax among fused siblings that have the same weight format: q/k/v and
 * gate/up of each layer and each expert's gate/up (w1/w3) pair (weight quantizers and input
 * quantizers alike). Returns the number of
 * groups made in *n_groups (may be NULL). Call after the last nb_qmodel_set. */
NB_API nb_status nb_qmodel_fuse_siblings(nb_ctx *ctx, nb_qmodel *qm, int64_t *n_groups);

/* --- calibration ---------------------------------------------------------------------------------
 * begin installs max observers on every enabled input quantizer (as input hooks) and on the KV
 * quantizers (the K/V hook); the caller then runs forward passes over the calibration data; end
 * calibrates every weight quantizer from the master weights with `cfg` (max, mse or four_over_six),
 * writes the observed input and K/V amaxes, and removes the hooks. Input quantizers that saw no token
 * stay uncalibrated and are listed (by module name; KV quantizers by quantizer name). */
NB_API nb_status nb_qmodel_calibrate_begin(nb_ctx *ctx, nb_qmodel *qm, const nb_calib_config *cfg);
NB_API nb_status nb_qmodel_calibrate_end(nb_ctx *ctx, nb_qmodel *qm);
/* Calibrate only the weights (weight-only formats need no data). */
NB_API nb_status nb_qmodel_calibrate_weights(nb_ctx *ctx, nb_qmodel *qm, const nb_calib_config *cfg);
NB_API int64_t nb_qmodel_uncovered_count(const nb_qmodel *qm);
NB_API const char *nb_qmodel_uncovered(const nb_qmodel *qm, int64_t i);         /* module names */

/* --- KV cache ---------------------------------------------------------------------------------- */
/* Quantize what every attention layer's KV cache holds (format NB_FMT_FP8_TENSOR; NB_FMT_NONE turns
 * it off): one per-tensor quantizer for the keys and one for the values of each layer, named as
 * ModelOpt names them ("model.layers.N.self_attn.k_bmm_quantizer" / "v_bmm_quantizer"). They see K
 * after RoPE and V (the model's K/V hook): calibration records their amax (max over all tokens and
 * heads), fake quant quantizes them in the forward, the guard requires the amax, export writes
 * k_scale / v_scale = amax / 448 (FORMATS §3.4) and the checkpoint saves them. */
NB_API nb_status nb_qmodel_set_kv(nb_ctx *ctx, nb_qmodel *qm, int32_t format);
NB_API int32_t nb_qmodel_kv_format(const nb_qmodel *qm);                       /* NB_FMT_NONE when off */
/* Borrowed; NULL when off or out of range. which: 0 = keys, 1 = values. */
NB_API nb_quantizer *nb_qmodel_kv_quantizer(const nb_qmodel *qm, int64_t layer, int32_t which);

/* --- fake quant (QAD student, student eval) --------------------------------------------------- */
/* on: every enabled quantizer fake-quantizes in the forward (weights once per forward, inputs per
 * call) and passes gradients straight through; off: plain model. Scales stay as calibrated. */
NB_API nb_status nb_qmodel_set_fake(nb_ctx *ctx, nb_qmodel *qm, int32_t on);
/* 1 while fake quant is on (set_fake(1) since the last set_fake(0) or calibration), else 0. */
NB_API int32_t nb_qmodel_fake(const nb_qmodel *qm);

/* --- the export guard --------------------------------------------------------------------------- */
/* NB_OK when every enabled quantizer is calibrated; else NB_ERR_UNCALIBRATED naming the first module
 * and attribute ("model.layers.0.self_attn.q_proj: weight_quantizer has no global_amax";
 * "model.layers.0.self_attn: k_bmm_quantizer ... has no calibrated amax" for the KV cache). */
NB_API nb_status nb_qmodel_check(nb_ctx *ctx, const nb_qmodel *qm);

/* --- nibble's own checkpoint ------------------------------------------------------------------ */
/* One safetensors file: every master parameter ("param/<name>", F32), every quantizer state tensor
 * ("quant/<module>.<weight|input>_quantizer.<attr>", F32; "quant/model.layers.N.self_attn.
 * <k|v>_bmm_quantizer.amax" for the KV cache) and the specs and KV format in __metadata__. restore
 * needs a qmodel over a model of the same architecture; it replaces specs, state and weights. */
NB_API nb_status nb_qmodel_save(nb_ctx *ctx, const nb_qmodel *qm, const char *path);
NB_API nb_status nb_qmodel_restore(nb_ctx *ctx, nb_qmodel *qm, const char *path);

#endif

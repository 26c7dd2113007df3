/* Export of a quantized model to the layouts the servers read (the ModelOpt HF layout and
 * compressed-tensors), atomically and durably, and read-back: recognising and dequantizing an exported
 * checkpoint's modules the way the serving loaders do (model loading uses it for exported folders). */
#ifndef NIBBLE_EXPORT_H
#define NIBBLE_EXPORT_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/qmodel.h"
#include "nibble/safetensors.h"

/* --- export ----------------------------------------------------------------------------------- */
enum { NB_LAYOUT_MODELOPT = 0, NB_LAYOUT_COMPRESSED_TENSORS = 1 };

typedef struct nb_export_opts {
    int32_t layout;               /* NB_LAYOUT_* */
    int32_t allow_uncalibrated;   /* exclude uncalibrated modules (reported) instead of failing */
    int64_t max_shard_bytes;      /* 0 = 10 GB, as ModelOpt's save_pretrained */
    int32_t dtype;                /* NB_BF16, NB_F16 or NB_F32: the dtype of every unquantized tensor and
                                     config.json's torch_dtype; -1 = the source's when it is mostly F16
                                     or BF16, else BF16 (F32 checkpoints, GGUF files) */
    const char *source_dir;       /* HF dir to take config.json / tokenizer / generation files from;
                                     NULL = the model's own directory (nothing for GGUF or memory models) */
    int32_t allow_nonfinite;      /* write NaN/Inf values (reported) instead of failing */
} nb_export_opts;

NB_API void nb_export_opts_init(nb_export_opts *o);
/* Write the checkpoint into dir atomically and durably. Missing parent folders of dir are created.
 * The files are written into dir.nibble-tmp-<pid>/export/, beside an INCOMPLETE file saying what the
 * folder is, so an unfinished export is never a folder that looks like a model; every file and the
 * folder are fsynced, export/ is swapped into place by one rename (an exchange when dir exists) and
 * the parent folder fsynced; on any failure nothing is left behind, and staging folders that killed
 * processes left for the same dir are removed. dir.nibble-lock is flock'd meanwhile: a second
 * process exporting to the same dir is refused (NB_ERR_IO, "export: <dir> is in use by another
 * nibble process (pid N): ..."). dir must pass nb_export_check_target, which is asked before
 * anything is written and again just before the rename: an existing dir is only ever replaced when
 * it is empty or a previous nibble export. Every float tensor written must be finite: a NaN or Inf
 * is NB_ERR_NUMERIC naming the tensor and element, unless opts->allow_nonfinite (then the tensor is
 * listed by nb_qmodel_export_nonfinite). A file-size limit is NB_ERR_IO ("File too large"), not
 * SIGXFSZ. */
NB_API nb_status nb_qmodel_export(nb_ctx *ctx, nb_qmodel *qm, const char *dir, const nb_export_opts *opts);

/* May an export be written to dir? Ask before hours of calibration or QAD; nb_qmodel_export asks
 * it too. Writes nothing.
 *
 * NB_OK when dir does not exist (the nearest existing folder above it must be a writable directory;
 * the export creates the missing ones), when dir is
 * an empty directory, or when dir is a directory a previous nibble export wrote, which is then
 * replaced as a whole. A previous nibble export is recognised by two things together:
 *   1. every entry in it is a regular file (no subdirectory, no symbolic link) with a name an export
 *      writes: config.json, hf_quant_config.json, generation_config.json, tokenizer.json,
 *      tokenizer_config.json, special_tokens_map.json, tokenizer.model, chat_template.jinja,
 *      model.safetensors, model.safetensors.index.json, model-DDDDD-of-DDDDD.safetensors; and
 *      config.json and the weights (model.safetensors or the index) are among them;
 *   2. nibble is named as its producer: the safetensors __metadata__ of its weights (of the first
 *      shard) has "producer": "nibble" (every export writes it, in both layouts, next to "format":
 *      "pt" and "producer_version"), or config.json's quantization_config has "producer": {"name":
 *      "nibble", ...} (what ModelOpt-layout exports carried before the safetensors mark).
 * So a plain Hugging Face model directory (such as the source model's own), a directory holding
 * anything else (notes.txt, a subdirectory, a README.md added to an export) and a regular file are
 * all refused, and nothing in them is touched. So is a dir another process is exporting to now
 * (its dir.nibble-lock is held).
 *
 * Errors: NB_ERR_INVALID naming dir and why ("export: /x/out exists and is not a nibble export (it
 * holds notes.txt): remove it or choose another output directory"; "... exists and is a file, not a
 * directory: ..."; "... is a symbolic link: ..."); NB_ERR_IO when the parent directory is missing,
 * not a directory or not writable, or when dir cannot be listed. */
NB_API nb_status nb_export_check_target(nb_ctx *ctx, const char *dir);
/* Modules the last export excluded because allow_uncalibrated was set (and, when a K/V quantizer was
 * uncalibrated, the KV quantizers by name: the export then carries no KV cache quantization at all). */
NB_API int64_t nb_qmodel_export_skipped_count(const nb_qmodel *qm);
NB_API const char *nb_qmodel_export_skipped(const nb_qmodel *qm, int64_t i);
/* Tensors the last export wrote with NaN/Inf values because allow_nonfinite was set. */
NB_API int64_t nb_qmodel_export_nonfinite_count(const nb_qmodel *qm);
NB_API const char *nb_qmodel_export_nonfinite(const nb_qmodel *qm, int64_t i);

/* --- read-back of exported checkpoints -------------------------------------------------------- */
/* How one linear module is stored in an exported checkpoint (either layout), recognised from its
 * tensors alone: NVFP4 (`weight` or `weight_packed` U8 [o, i/2] + `weight_scale` F8_E4M3 [o, i/16] +
 * `weight_scale_2` F32, or CT's inverse `weight_global_scale`), MXFP8 (`weight` F8_E4M3 + `weight_scale`
 * U8 [o, i/32]), FP8 per tensor or per channel (`weight` F8_E4M3 + `weight_scale` F32/BF16/F16 with one
 * value or one per row). */
typedef struct nb_readback_info {
    int32_t format;          /* nb_qformat of the weight; NB_FMT_NONE: a plain float weight */
    int32_t layout;          /* NB_LAYOUT_*: compressed-tensors when the names or inverse scales say so */
    int32_t input_format;    /* NB_FMT_NVFP4 / NB_FMT_FP8_TENSOR when an input scale is stored, else NONE */
    float input_scale;       /* in ModelOpt's convention (amax/448 for FP8, amax/(6*448) for NVFP4); 0 if none */
} nb_readback_info;

/* Fill *info for module `module` (an HF module name such as "model.layers.0.mlp.up_proj"). A module
 * whose weight is quantized but whose scales are missing or misshapen is NB_ERR_FORMAT, naming it. */
NB_API nb_status nb_readback_probe(nb_ctx *ctx, nb_st *st, const char *module, nb_readback_info *info);
/* Dequantize the module's weight [rows, cols] into out (float32, row-major) the way the serving
 * loaders do: NVFP4 e2m1 * e4m3 scale * weight_scale_2 (CT: * (1 / weight_global_scale)), MXFP8
 * e4m3 * 2^(code - 127), FP8 e4m3 * weight_scale. The arithmetic is the quantizer's own dequantize
 * row, so a ModelOpt-layout read-back equals the fake quant that calibrated it bit for bit.
 * used (may be NULL) has one flag per file tensor (nb_st_entry_at order): every tensor of the
 * module it consumed (scales, input scales) is set to 1. */
NB_API nb_status nb_readback_weight(nb_ctx *ctx, nb_st *st, const char *module, int64_t rows, int64_t cols, float *out,
                             char *used);
/* KV cache scales in an exported checkpoint: ModelOpt's "model.layers.N.self_attn.k_proj.k_scale" /
 * "...v_proj.v_scale" (0-d F32) or compressed-tensors' "model.layers.N.self_attn.k_scale" / "v_scale".
 * kv_scale_layer: the layer N a tensor name is such a scale of (which: 0 = K, 1 = V; may be NULL), or -1.
 * kv_scale: layer N's K or V scale (amax / 448, as the loaders multiply the FP8 cache by it), and the
 * layout it was found in; NB_ERR_NOT_FOUND when the checkpoint has none, NB_ERR_FORMAT when it is not
 * one positive finite value. */
NB_API int64_t nb_readback_kv_scale_layer(const char *name, int32_t *which);
NB_API nb_status nb_readback_kv_scale(nb_ctx *ctx, nb_st *st, int64_t layer, int32_t which, float *scale, int32_t *layout);

#endif

/* Format and preset descriptors: one row per quantization format and one per recipe preset, the single
 * place that says what a format is (block size, dtypes, maxbound, calibrated state, ModelOpt quant_algo,
 * compressed-tensors scheme) and what a preset asks for (weight / input / KV format, static or dynamic,
 * the calibration algorithms it takes). The recipe layer, the CLI's usage text and validation messages,
 * the quantizer and both exporters read these rows (Lua through the FFI), so adding a format means adding
 * rows here plus its kernels. The numbers are FORMATS.md's (§1 NVFP4, §2 four_over_six, §3 ModelOpt
 * export, §4 compressed-tensors, §5 MXFP8, §6 FP8). The row functions live in nb_qformat_traits (quant.h). */
#ifndef NIBBLE_FORMATS_H
#define NIBBLE_FORMATS_H

#include <stdint.h>
#include "nibble/dtype.h"
#include "nibble/quant.h"
#include "nibble/status.h"

/* One quantization format (an nb_qformat id). Strings are static; NULL means "none" / JSON null. */
typedef struct nb_format_desc {
    nb_qformat id;
    const char *name;             /* nb_qformat_traits' name: "nvfp4", "nvfp4_46", "mxfp8", "fp8", "fp8_channel" */
    const char *summary;          /* one line for --help and messages */
    nb_qformat disk_format;       /* the format the bytes are stored in (nvfp4_46 ships as nvfp4) */
    int32_t block_size;           /* elements per block scale along the last dim; 0 = per tensor / per row */
    nb_dtype elem_dtype;          /* NB_E2M1 or NB_E4M3 */
    nb_dtype data_dtype;          /* on disk: NB_U8 (two E2M1 codes a byte) or NB_E4M3 */
    nb_dtype scale_dtype;         /* on disk: NB_E4M3 block scales, NB_U8 (E8M0 exponents), NB_F32 per tensor / row */
    int32_t has_scale2;           /* a per-tensor F32 weight_scale_2 beside the block scales */
    float maxbound;               /* largest element (6 or 448): what a zero amax becomes */
    float scale_norm;             /* NVFP4: the largest block scale (448, or 256 for four_over_six); 0 otherwise */
    int32_t per_row;              /* one scale per output row (amax F32 [..., 1]) */
    int32_t input_ok;             /* can quantize activations (an input quantizer) */
    int32_t groupable;            /* fused siblings can share its per-tensor amax (one weight_scale_2 / input_scale) */
    int32_t fuse_weights;         /* ModelOpt fuses sibling weights' amax (NVFP4; plain FP8 keeps one scale each) */
    const char *state_dynamic;    /* calibrated state of a dynamic quantizer: "amax", or "" (none: MXFP8) */
    const char *state_static;     /* of a static one: "block_amax global_amax"; NULL = no static form */
    uint32_t calib_methods;       /* bit (1u << nb_calib_method) for each calibration its quantizers search */
    /* ModelOpt (hf_quant_config.json, FORMATS §3) */
    const char *quant_algo;       /* weight-only module */
    const char *quant_algo_act;   /* module whose inputs are quantized too */
    /* compressed-tensors (FORMATS §4) */
    const char *ct_format;        /* "nvfp4-pack-quantized", "mxfp8-quantized", "float-quantized" */
    int32_t ct_num_bits;
    int32_t ct_group_size;        /* 0 = null */
    const char *ct_strategy;      /* "tensor_group", "group", "tensor", "channel" */
    const char *ct_scale_dtype;   /* "torch.float8_e4m3fn", "torch.uint8", NULL = not written */
    const char *ct_input_dynamic; /* the input scheme's "dynamic": "local" (a string), "true" or "false" */
    const char *ct_input_observer;/* the input scheme's "observer", NULL = not written */
    int32_t ct_inverse_scales;    /* CT stores 1/s of ModelOpt's per-tensor scales (weight_global_scale, input_global_scale) */
    /* tensor names of one module: ModelOpt layout, then compressed-tensors */
    const char *mo_weight, *mo_scale, *mo_scale2, *mo_input;
    const char *ct_weight, *ct_scale, *ct_scale2, *ct_input;
} nb_format_desc;

/* What a recipe preset asks for. */
typedef enum nb_preset_kind {
    NB_PRESET_LINEAR = 0,  /* a quantize rule's format: weights (and inputs) of linear modules */
    NB_PRESET_KV     = 1   /* a kv_cache value: keys and values of every attention layer */
} nb_preset_kind;

typedef struct nb_preset_desc {
    const char *name;             /* "nvfp4_w4a16", ... (kv: "fp8") */
    nb_preset_kind kind;
    const char *summary;          /* one line for --help */
    nb_qformat weight_format;     /* kv: the cache's format */
    int32_t weight_static;        /* calibrated per-block amax (nvfp4_static, four_over_six) */
    nb_qformat input_format;      /* NB_FMT_NONE = weight-only */
    const char *weight_kind;      /* "dynamic", "static", "per_tensor", "per_channel" (plans, docs) */
    nb_calib_method algorithm;    /* the default calibration algorithm (what its unit sets) */
    const char *four_over_six;    /* the preset algorithm four_over_six turns this one into; NULL = none */
} nb_preset_desc;

/* Formats by id: NULL for NB_FMT_NONE and out of range. */
NB_API const nb_format_desc *nb_format_desc_of(nb_qformat f);
/* Does a quantizer of format d (static or dynamic) keep the state attribute attr ("amax", "block_amax",
 * "global_amax"): one of the words of d's state_static / state_dynamic? 0 for a NULL d or attr. */
NB_API int nb_format_uses_state(const nb_format_desc *d, int is_static, const char *attr);
/* Presets, in the order --help lists them: 0 .. nb_preset_count()-1 (NULL past the end). */
NB_API int nb_preset_count(void);
NB_API const nb_preset_desc *nb_preset_at(int i);
/* A preset by name and kind; NULL when there is none. */
NB_API const nb_preset_desc *nb_preset_find(const char *name, nb_preset_kind kind);
/* ModelOpt quant_algo of a preset (its weight format's, with or without quantized inputs). */
NB_API const char *nb_preset_quant_algo(const nb_preset_desc *p);
/* The preset a calibration algorithm gives p: p itself, or (four_over_six on NVFP4) its 4/6 variant;
 * NULL when the algorithm cannot apply to p's weights (then p's format keeps max calibration). */
NB_API const nb_preset_desc *nb_preset_with_algorithm(const nb_preset_desc *p, nb_calib_method m);

/* Other spellings of a format name, the only place they are listed: alias i (0..) and the format it
 * names; NULL past the end. nb_qformat_from_name accepts them. */
NB_API const char *nb_qformat_alias(int i, nb_qformat *format);

/* Calibration algorithms by name ("max", "mse", "four_over_six"): -1 if unknown; and back (NULL if out
 * of range). NB_CALIB_COUNT of them. */
enum { NB_CALIB_COUNT = 3 };
NB_API int nb_calib_method_from_name(const char *name);
NB_API const char *nb_calib_method_name(nb_calib_method m);

#endif

/* Quantization: the format traits table, quantized tensors, quantizers with calibrated state,
 * calibrators (max, MSE, four_over_six), fake quant with a straight-through backward.
 * Numerics follow ModelOpt's export path bit for bit (FORMATS.md §1, §2, §5, §6, §8.3). Fake quant is
 * dequantize(quantize(x)) from the same row code, so what was trained is what ships.
 *
 * A zero amax (an all-zero tensor, a dead output row, activations that were all zero) is replaced by
 * the format's maxbound, as ModelOpt's TensorQuantizer._sanitize_export_amax does: 448 for FP8 (per
 * tensor or per row: scale 1.0) and 6 for the NVFP4 family (weight_scale_2 = 6/(6*448) = 1/448, or
 * 6/(6*256) for four_over_six). The scale stays positive, the codes are 0 and fake quant gives zeros.
 * (ModelOpt 0.47's own weight export skips that step for FP8 per tensor and dynamic NVFP4 and writes a
 * 0 scale with NaN codes; tests/golden/gen_quant_zero_golden.py records both.) A NaN/Inf amax stays an
 * error. Every entry point returns NB_ERR_INVALID for a NULL argument it needs. */
#ifndef NIBBLE_QUANT_H
#define NIBBLE_QUANT_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/dtype.h"
#include "nibble/tensor.h"

/* Stable format ids (stored in nibble checkpoints and recipes): append, never renumber. */
typedef enum nb_qformat {
    NB_FMT_NONE        = 0,  /* not quantized */
    NB_FMT_NVFP4       = 1,  /* E2M1 x16 + E4M3 block scale + F32 weight_scale_2 = A/(6*448) */
    NB_FMT_NVFP4_46    = 2,  /* four_over_six: NVFP4 bytes on disk, block scales normalized to 256 (s2 = G/1536) */
    NB_FMT_MXFP8       = 3,  /* E4M3 x32 + E8M0 block scale (stored as U8 biased exponent) */
    NB_FMT_FP8_TENSOR  = 4,  /* E4M3 + one F32 weight_scale = amax/448 */
    NB_FMT_FP8_CHANNEL = 5,  /* E4M3 + F32 weight_scale per row (output channel) = amax_row/448 */
    NB_FMT_COUNT       = 6
} nb_qformat;

enum { NB_NVFP4_BLOCK = 16, NB_MXFP8_BLOCK = 32 };

/* Per-row arguments of the row functions. The driver fills them per tensor (per row for
 * FP8_CHANNEL and static NVFP4); row functions never allocate and never fail. */
typedef struct nb_qrow_args {
    float scale;              /* NVFP4: weight_scale_2 (s2); FP8: weight_scale of the tensor/row; MXFP8: unused */
    float global_amax;        /* NVFP4: the per-tensor amax behind s2 (A dynamic, G static); FP8: amax */
    const float *block_amax;  /* NVFP4 static: this row's calibrated per-block amax (n/16 floats); NULL = dynamic */
    int32_t mx_floor;         /* MXFP8: OCP floor exponent rule instead of ModelOpt's ceil rule */
    int32_t div_dtype;        /* FP8_TENSOR: dtype ModelOpt's w/s is rounded to (NB_F32 = none, NB_BF16, NB_F16) */
} nb_qrow_args;

/* Row functions: n elements of the last dimension (a multiple of the block size).
 * quantize writes the data bytes (n/2 for NVFP4, n for E4M3) and the block scales (n/block bytes;
 * nothing for FP8); dequantize is the loaders' w = elem * scale; fake = dequantize(quantize(x)). */
typedef void (*nb_qrow_quantize_fn)(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
typedef void (*nb_qrow_dequantize_fn)(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
typedef void (*nb_qrow_fake_fn)(const float *x, int64_t n, const nb_qrow_args *a, float *y);

typedef struct nb_qformat_traits {
    const char *name;          /* "none", "nvfp4", "nvfp4_46", "mxfp8", "fp8", "fp8_channel" */
    nb_qformat disk_format;    /* the format the bytes are in (NVFP4_46 -> NVFP4) */
    int32_t block_size;        /* elements per block scale along the last dim; 0 = per tensor / per row */
    nb_dtype elem_dtype;       /* NB_E2M1 or NB_E4M3 */
    nb_dtype data_dtype;       /* stored data dtype: NB_U8 (two E2M1 codes per byte) or NB_E4M3 */
    nb_dtype scale_dtype;      /* block scale: NB_E4M3 (NVFP4), NB_U8 (E8M0 biased exponent); NB_F32 for FP8 */
    float elem_max;            /* 6 or 448 */
    float scale_norm;          /* NVFP4: largest block scale (448, or 256 for four_over_six); 0 otherwise */
} nb_qformat_traits;

/* A format's row functions. Which ones run is the context's (its backend chose them at creation from
 * the CPU and nb_ctx_options.quant_path; nibble/quant_fast.h), not the format's. */
typedef struct nb_qrow_fns {
    nb_qrow_quantize_fn quantize;
    nb_qrow_dequantize_fn dequantize;
    nb_qrow_fake_fn fake;
} nb_qrow_fns;

/* Traits of a format; NULL when out of range. */
NB_API const nb_qformat_traits *nb_qformat_info(nb_qformat f);
/* Format by name ("nvfp4", "nvfp4_46", "mxfp8", "fp8", "fp8_channel", "none") or one of the aliases
 * nibble/formats.h lists (nb_qformat_alias); -1 if unknown. */
NB_API int nb_qformat_from_name(const char *name);
/* Swap a format's row functions on this context (fast paths that are bit-equal to the references;
 * NULL restores the scalar reference). Other contexts keep theirs. */
NB_API nb_status nb_qformat_set_rows(nb_ctx *ctx, nb_qformat f, nb_qrow_quantize_fn quantize,
                              nb_qrow_dequantize_fn dequantize, nb_qrow_fake_fn fake);
/* The row functions ctx runs for f (ctx NULL: the best this CPU has); NULL for NB_FMT_NONE or a
 * format out of range. */
NB_API const nb_qrow_fns *nb_qformat_rows(const nb_ctx *ctx, nb_qformat f);
/* The scalar reference rows of f (what every fast path is tested against); NULL as above. */
NB_API const nb_qrow_fns *nb_qformat_ref_rows(nb_qformat f);

/* --- scalar reference row functions (what every fast path is tested against) ------------------ */
NB_API void nb_nvfp4_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
NB_API void nb_nvfp4_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
NB_API void nb_nvfp4_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y);
/* four_over_six: with block_amax the static path at 256; without, each block picks M=6 or M=4 itself. */
NB_API void nb_nvfp4_46_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
NB_API void nb_nvfp4_46_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y);
NB_API void nb_mxfp8_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
NB_API void nb_mxfp8_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
NB_API void nb_mxfp8_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y);
NB_API void nb_fp8_quantize_row_ref(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
NB_API void nb_fp8_dequantize_row_ref(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
NB_API void nb_fp8_fake_row_ref(const float *x, int64_t n, const nb_qrow_args *a, float *y);

/* --- scalar scale helpers (ModelOpt's fp32 operation order) ------------------------------------ */
/* weight_scale_2 / input_scale of NVFP4: f32(amax / (6*norm)), norm 448 (or 256 for four_over_six). */
NB_API float nb_nvfp4_scale2(float amax, float norm);
/* E4M3 block-scale byte, dynamic path: pbs = amax_b/f32(6*s2), 0 -> 1.0, clamp [2^-9, 448]. */
NB_API uint8_t nb_nvfp4_block_scale_dynamic(float block_amax, float s2);
/* E4M3 block-scale byte, static path: r = f32(f32(pbs*norm)/f32(G/6)), pbs = amax_b/6 (0 -> 1.0), clamp. */
NB_API uint8_t nb_nvfp4_block_scale_static(float block_amax, float global_amax, float norm);
/* four_over_six choice for one block of 16 values: returns 1 when M=4 (amax x1.5) has the strictly
 * lower squared error, 0 when M=6 stays (ties keep 6). */
NB_API int nb_nvfp4_46_pick_block(const float *x, float block_amax, float global_amax);
/* MXFP8 E8M0 byte of a block amax: ModelOpt ceil(log2(amax/448)) or OCP floor(log2 amax) - 8, +127. */
NB_API uint8_t nb_mxfp8_scale_byte(float block_amax, int ocp_floor);
/* torch.linspace(start, stop, steps) in float32, element i (the candidate multipliers of MSE search):
 * step = f32(stop-start)/(steps-1), then start + step*i (first half) or stop - step*(steps-1-i), fused. */
NB_API float nb_linspace_f32(double start, double stop, int64_t steps, int64_t i);
/* ModelOpt's candidate count: ceil((stop - start) / step) + 1 in double (Python float) arithmetic. */
NB_API int64_t nb_mse_steps(double start, double stop, double step);

/* --- quantized tensors ------------------------------------------------------------------------ */
typedef struct nb_qtensor {
    nb_qformat format;
    int32_t ndim;
    int64_t shape[NB_MAX_DIMS];  /* logical (unpacked) shape */
    nb_tensor *data;             /* NVFP4: U8 [..., n/2]; MXFP8 / FP8: E4M3 [..., n] */
    nb_tensor *scale;            /* NVFP4: E4M3 [..., n/16]; MXFP8: U8 [..., n/32]; FP8: F32 [] (tensor) or [...] (per row) */
    nb_tensor *scale2;           /* NVFP4: F32 [] weight_scale_2; NULL for the other formats */
    int32_t refcount;
} nb_qtensor;

/* Allocate a zeroed quantized tensor of the given logical shape (the last dim must divide the block;
 * nb_quantize_into fills it). */
NB_API nb_status nb_qtensor_new(nb_ctx *ctx, nb_qformat f, int ndim, const int64_t *shape, nb_qtensor **out);
/* Wrap existing tensors (e.g. read from a checkpoint); shapes and dtypes are checked; retains them. */
NB_API nb_status nb_qtensor_wrap(nb_ctx *ctx, nb_qformat f, nb_tensor *data, nb_tensor *scale, nb_tensor *scale2,
                          nb_qtensor **out);
NB_API void nb_qtensor_retain(nb_qtensor *q);
NB_API void nb_qtensor_release(nb_qtensor *q);
NB_API int64_t nb_qtensor_numel(const nb_qtensor *q);
/* Dequantize into a new tensor of dtype dt (F32, BF16 or F16): elem * block scale * s2, in f32, then dt. */
NB_API nb_status nb_qtensor_dequantize(nb_ctx *ctx, const nb_qtensor *q, nb_dtype dt, nb_tensor **out);
/* Dequantize into an existing tensor of the same logical shape. */
NB_API nb_status nb_qtensor_dequantize_into(nb_ctx *ctx, const nb_qtensor *q, nb_tensor *out);

/* --- quantize with explicit parameters (no quantizer object) ----------------------------------- */
/* A negative amax / global_amax, or a NULL channel_amax, means "from the data" (as ModelOpt's
 * NVFP4QTensor.quantize does when no scale is given). */
typedef struct nb_qparams {
    nb_qformat format;
    float amax;                     /* per-tensor amax: NVFP4 dynamic (A) or FP8_TENSOR; < 0 = max|x| */
    float global_amax;              /* NVFP4 static: G (used when block_amax is set); < 0 = max(block_amax) */
    const nb_tensor *block_amax;    /* NVFP4 static: F32 [..., n/16] calibrated per-block amax; NULL = dynamic */
    const nb_tensor *channel_amax;  /* FP8_CHANNEL: F32 [..., 1] (or [...]) per-row amax; NULL = from x */
    int32_t mx_floor;               /* MXFP8: OCP floor rule */
    int32_t fp8_div_dtype;          /* FP8_TENSOR: -1 = the input's dtype (ModelOpt: bf16 w / bf16(s)); or NB_F32/NB_BF16/NB_F16 */
    const char *name;               /* names the tensor in error messages (NULL = "tensor") */
} nb_qparams;

/* Parameters for a format: amaxes "from the data" (-1), no block amax, fp8_div_dtype -1. */
NB_API void nb_qparams_init(nb_qparams *p, nb_qformat f);
/* Quantize x (F32, BF16 or F16, any shape with ndim >= 1) into a new quantized tensor.
 * Errors: NB_ERR_SHAPE (last dim vs block; a block_amax / channel_amax that does not fit x: it must
 * have x's shape with the last dim n/16 (or 1), or be flat (1-D) with that many values),
 * NB_ERR_NUMERIC (first NaN/Inf in x, flat index; a NaN/Inf or negative amax). A zero amax is the
 * maxbound (see the top of this file). NB_ERR_INVALID / NB_ERR_UNSUPPORTED when NIBBLE_QUANT_PATH
 * named no usable path when ctx was created (nibble/quant_fast.h). */
/* x on a CUDA device (nibble/tensor.h): the quantized tensor is made on that device by the CUDA kernels
 * (bit-equal to the CPU rows), the plan resolved as on the host (NaN/Inf, amax and state errors alike);
 * nb_quantize_into, nb_fake_quant and nb_qtensor_dequantize(_into) dispatch the same way, and want their
 * outputs on the input's device. Without CUDA (or that device) a device tensor is NB_ERR_DEVICE. */
NB_API nb_status nb_quantize(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, nb_qtensor **out);
/* nb_quantize into an existing quantized tensor of the same format and logical shape (from
 * nb_qtensor_new or an earlier nb_quantize), reusing its buffers: every byte of its data and scales
 * is rewritten. Same errors as nb_quantize, plus NB_ERR_INVALID / NB_ERR_SHAPE for an output that
 * does not fit; after an error its contents are unspecified. */
NB_API nb_status nb_quantize_into(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, nb_qtensor *q);
/* out = dequantize(quantize(x)) with the same bits, written in out's dtype (F32/BF16/F16, same
 * shape; out may be x itself). */
NB_API nb_status nb_fake_quant(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, nb_tensor *out);

/* --- quantizers ---------------------------------------------------------------------------------- */
typedef struct nb_quantizer nb_quantizer;
typedef struct nb_qgroup nb_qgroup;

typedef struct nb_quantizer_config {
    nb_qformat format;
    int32_t is_static;         /* NVFP4 / NVFP4_46: calibrated per-block amax (static) or block scales from the data */
    int32_t mx_floor;          /* MXFP8: OCP floor rule instead of ModelOpt's ceil */
    int32_t fp8_div_dtype;     /* FP8_TENSOR: -1 = input dtype (ModelOpt export quirk, FORMATS §6.4), or a dtype */
    int32_t pass_through_bwd;  /* STE: 1 = gradient passes unchanged (ModelOpt >= 0.43), 0 = zero where |x| > amax */
    int32_t enabled;           /* a disabled quantizer's fake quant is the identity */
} nb_quantizer_config;

/* Defaults for a format: dynamic, ceil rule, fp8_div_dtype -1, pass_through_bwd 1, enabled 1
 * (NVFP4_46 defaults to static: four_over_six is a calibrated per-block choice). */
NB_API void nb_quantizer_config_init(nb_quantizer_config *cfg, nb_qformat f);
NB_API nb_status nb_quantizer_new(nb_ctx *ctx, const char *name, const nb_quantizer_config *cfg, nb_quantizer **out);
NB_API void nb_quantizer_retain(nb_quantizer *q);
NB_API void nb_quantizer_release(nb_quantizer *q);
NB_API const char *nb_quantizer_name(const nb_quantizer *q);
NB_API void nb_quantizer_get_config(const nb_quantizer *q, nb_quantizer_config *out);
NB_API void nb_quantizer_set_enabled(nb_quantizer *q, int enabled);
NB_API int nb_quantizer_enabled(const nb_quantizer *q);

/* Calibrated state, by attribute name:
 *   "amax"        F32 []            per-tensor amax (NVFP4 dynamic, FP8_TENSOR, input quantizers)
 *                 F32 [..., 1]      per-row amax (FP8_CHANNEL)
 *   "block_amax"  F32 [..., n/16]   per-block amax (NVFP4 static; four_over_six folds its choice in)
 *   "global_amax" F32 []            per-tensor amax behind weight_scale_2 (NVFP4 static)
 * Which are required: nb_quantizer_missing. Values must be finite and >= 0. */
NB_API const char *nb_quantizer_state_name(int i);               /* 0..2, NULL past the end */
NB_API int nb_quantizer_has_state(const nb_quantizer *q, const char *attr);
/* A new F32 tensor holding a copy; NB_ERR_UNCALIBRATED if absent, NB_ERR_NOT_FOUND if unknown. */
NB_API nb_status nb_quantizer_get_state(nb_ctx *ctx, const nb_quantizer *q, const char *attr, nb_tensor **out);
/* Copy (converted to F32) into the state. A per-block / per-row attribute that is already there can
 * only be replaced by one of the same shape (NB_ERR_SHAPE naming both; clear it first to change the
 * shape); calibration replaces state of any shape. A quantize with a state calibrated for a tensor of
 * another shape is NB_ERR_SHAPE (see nb_quantize). */
NB_API nb_status nb_quantizer_set_state(nb_ctx *ctx, nb_quantizer *q, const char *attr, const nb_tensor *value);
/* Drop one attribute, or all of them (attr NULL). */
NB_API nb_status nb_quantizer_clear_state(nb_ctx *ctx, nb_quantizer *q, const char *attr);
/* The first required attribute that is missing ("amax", "global_amax", "block_amax"), looking
 * through the shared group; NULL when calibrated (or when the format needs no state). */
NB_API const char *nb_quantizer_missing(const nb_quantizer *q);
/* NB_OK when calibrated, else NB_ERR_UNCALIBRATED naming the quantizer and the attribute. */
NB_API nb_status nb_quantizer_check(nb_ctx *ctx, const nb_quantizer *q);
/* The effective per-tensor amax (the group's maximum when shared): "amax" for NVFP4 dynamic and
 * FP8_TENSOR, "global_amax" for NVFP4 static. */
NB_API nb_status nb_quantizer_global_amax(nb_ctx *ctx, const nb_quantizer *q, float *out);
/* The per-tensor scale export writes: NVFP4 weight_scale_2 or input_scale (A/(6*norm)), FP8
 * weight_scale or input_scale (amax/448); an amax of 0 counts as the maxbound (6 or 448), as in
 * quantize, so this is never 0. */
NB_API nb_status nb_quantizer_scale(nb_ctx *ctx, const nb_quantizer *q, float *out);
/* The quantizer's current parameters (block_amax / channel_amax point into its state). */
NB_API nb_status nb_quantizer_params(nb_ctx *ctx, const nb_quantizer *q, nb_qparams *out);

/* Real quantization (export); fails with NB_ERR_UNCALIBRATED when state is missing and
 * NB_ERR_INVALID when the quantizer is disabled. */
NB_API nb_status nb_quantizer_quantize(nb_ctx *ctx, const nb_quantizer *q, const nb_tensor *x, nb_qtensor **out);
/* Fake quant for training: out = dequantize(quantize(x)) (identity copy when disabled). */
NB_API nb_status nb_quantizer_fake(nb_ctx *ctx, const nb_quantizer *q, const nb_tensor *x, nb_tensor *out);
/* Straight-through backward: grad_in = grad_out, or grad_out * (|x| <= amax) when pass_through_bwd
 * is 0 (amax per tensor, per row or per block as calibrated; MXFP8 always passes through). */
NB_API nb_status nb_quantizer_backward(nb_ctx *ctx, const nb_quantizer *q, const nb_tensor *x, const nb_tensor *grad_out,
                                nb_tensor *grad_in);

/* Shared-state groups: fused siblings (q/k/v, gate/up, w1/w3) share one per-tensor amax (so one
 * weight_scale_2), and sibling input quantizers one input amax. Every member reads the maximum
 * over the members; a member without it makes the whole group uncalibrated. Members hold the group.
 * An MSE / four_over_six search on a static member uses that shared global amax, so every other
 * member needs its max pass first (NB_ERR_UNCALIBRATED naming the one that lacks it). */
NB_API nb_status nb_qgroup_new(nb_ctx *ctx, const char *name, nb_qgroup **out);
NB_API void nb_qgroup_retain(nb_qgroup *g);
NB_API void nb_qgroup_release(nb_qgroup *g);
NB_API const char *nb_qgroup_name(const nb_qgroup *g);
/* Add q (same format and static-ness as the other members; NVFP4 family or FP8_TENSOR only).
 * Adding a member again changes nothing. */
NB_API nb_status nb_qgroup_add(nb_ctx *ctx, nb_qgroup *g, nb_quantizer *q);
NB_API nb_status nb_qgroup_remove(nb_ctx *ctx, nb_qgroup *g, nb_quantizer *q);
NB_API int nb_qgroup_size(const nb_qgroup *g);
NB_API nb_quantizer *nb_qgroup_member(const nb_qgroup *g, int i);   /* borrowed */
NB_API nb_qgroup *nb_quantizer_group(const nb_quantizer *q);         /* borrowed; NULL if none */

/* --- calibrators ------------------------------------------------------------------------------ */
typedef enum nb_calib_method {
    NB_CALIB_MAX           = 0,  /* amax = max |x| (per tensor / row / block as the quantizer needs) */
    NB_CALIB_MSE           = 1,  /* ModelOpt mse: amax x linspace(start, stop) minimizing the summed squared error */
    NB_CALIB_FOUR_OVER_SIX = 2   /* per block M=6 vs M=4 (= mse with multipliers {1.0, 1.5}); NVFP4_46 static only:
                                  * a dynamic NVFP4_46 quantizer picks per block when it quantizes, so max is its calibration */
} nb_calib_method;

/* The error the MSE search minimizes is computed with a fake quant: ModelOpt's own fake-quant
 * arithmetic (default; so the calibrated amax, and the exported bytes, match ModelOpt's), or nibble's
 * export arithmetic. They differ where ModelOpt's fake quant lets a block scale underflow to 0 and in
 * fp32 operation order (FORMATS §1.3). ModelOpt's dynamic-NVFP4 fake quant is CUDA-only, so a dynamic
 * NVFP4 search always uses the export arithmetic. */
typedef enum nb_mse_metric {
    NB_MSE_MODELOPT = 0,
    NB_MSE_EXPORT   = 1
} nb_mse_metric;

typedef struct nb_calib_config {
    nb_calib_method method;
    nb_mse_metric metric;
    double start_multiplier;  /* ModelOpt defaults: 0.25 */
    double stop_multiplier;   /* 4.0 */
    double step_size;         /* 0.1 -> ceil((stop-start)/step) + 1 candidates */
} nb_calib_config;

typedef struct nb_calib nb_calib;

NB_API void nb_calib_config_init(nb_calib_config *cfg, nb_calib_method m);
/* An observer for q. MSE / four_over_six search multiples of the max the observer itself saw over all
 * its batches (ModelOpt: max calibration, then the search), never of q's current state, so repeating a
 * search on the same data gives the same state. They keep a copy of every batch until finish (the
 * centre is known only then); nb_quantizer_calibrate reads its x without a copy. At most 65536
 * candidates. The quantizer is retained. */
NB_API nb_status nb_calib_new(nb_ctx *ctx, nb_quantizer *q, const nb_calib_config *cfg, nb_calib **out);
/* Accumulate one batch (amax maxima, or the per-candidate squared errors). */
NB_API nb_status nb_calib_collect(nb_ctx *ctx, nb_calib *c, const nb_tensor *x);
/* Write the result into the quantizer's state (static NVFP4 also gets global_amax = the data's max,
 * by max and by the searches); NB_ERR_INVALID if nothing was collected. A searched per-tensor / per-row amax is
 * stored rounded to the calibration tensor's dtype, as ModelOpt's _amax buffer keeps the weight's
 * dtype (static NVFP4 block amax stays f32). Candidates whose amax overflows f32 are skipped. */
NB_API nb_status nb_calib_finish(nb_ctx *ctx, nb_calib *c);
NB_API int64_t nb_calib_batches(const nb_calib *c);
/* MSE: the chosen candidate index per amax element (-1 before finish); n receives the count. */
NB_API const int32_t *nb_calib_choice(const nb_calib *c, int64_t *n);
NB_API void nb_calib_free(nb_calib *c);
/* One-shot: new + collect(x) + finish. */
NB_API nb_status nb_quantizer_calibrate(nb_ctx *ctx, nb_quantizer *q, const nb_tensor *x, nb_calib_method m);

#endif

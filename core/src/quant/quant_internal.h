/* Private helpers shared by the quantization sources (core/src/quant/): ModelOpt's E2M1
 * dequant table, the E4M3 block-scale cast, and the drivers' row helpers. Not installed. */
#ifndef NIBBLE_QUANT_INTERNAL_H
#define NIBBLE_QUANT_INTERNAL_H

#include "nibble/quant.h"

/* ModelOpt's e2m1_values: code 8 (-0) dequantizes to +0.0, so fake quant and dequantize agree bitwise.
 * nbn_e2m1_deq (quant/numerics.h) as a table, for the vector kernels' loads. */
extern const float nb_e2m1_deq[16];

/* Per-tensor amax "from the data" sentinel is any negative value. */
static inline int nbq_from_data(float v) { return v < 0.0f; }

/* Is the format an NVFP4 variant (packed E2M1 data, E4M3 block scales, F32 scale2)? */
static inline int nbq_is_nvfp4(nb_qformat f) { return f == NB_FMT_NVFP4 || f == NB_FMT_NVFP4_46; }

/* The maxbound a zero per-tensor / per-row amax becomes (ModelOpt's _sanitize_export_amax): 6 for the
 * NVFP4 family (E2M1 with E4M3 block scales), 448 for FP8 E4M3. */
static inline float nbq_maxbound(nb_qformat f) { return nbq_is_nvfp4(f) ? 6.0f : 448.0f; }
/* ModelOpt's _sanitize_export_amax: an amax of 0 (an all-zero tensor, a dead row) is the maxbound, so
 * the scale stays positive and the codes are 0 (quant.h). */
static inline float nbq_sanitized_amax(nb_qformat f, float a) { return a == 0.0f ? nbq_maxbound(f) : a; }

/* A float for messages: "NaN", "+Inf", "-Inf" or %g (printf's "-nan" says nothing useful). */
const char *nbq_num(float v, char *buf, size_t n);
/* "{d0, d1, ...}" of t (or of ndim/shape when t is NULL); returns the length written. */
int nbq_shape_str(const nb_tensor *t, int ndim, const int64_t *shape, char *buf, size_t n);
/* Does a calibrated state tensor t (per_row values for each row of x: n/16 block amax, or 1 per-row
 * amax) fit x? It must have x's shape with the last dim per_row (FP8 row amax: also x's leading dims),
 * or be flat (1-D, ModelOpt's own layout) with the right count. NB_ERR_SHAPE naming both shapes. */
nb_status nbq_check_state_shape(nb_ctx *ctx, const nb_tensor *t, const nb_tensor *x, int64_t per_row, const char *attr,
                                const char *what);
/* NB_OK, or the error a bad NIBBLE_QUANT_PATH left at ctx's creation (fast_dispatch.c): every quantize
 * entry point returns it, so a mistyped path is never silently replaced by another. */
nb_status nbq_env_path_status(nb_ctx *ctx);

/* nb_quantizer_set_state without the comparison with the shape already there: a calibrator writing
 * its result (calibrating on another tensor legitimately changes the shape). */
nb_status nbq_quantizer_replace_state(nb_ctx *ctx, nb_quantizer *q, const char *attr, const nb_tensor *value);
/* The per-tensor amax q's shared group would have with q's own value replaced by `own`: the maximum of
 * own and the other members' (global_amax for static NVFP4, amax otherwise); own alone without a
 * group. NB_ERR_UNCALIBRATED naming a member that lacks it ("<who> for '<q>': ..."). */
nb_status nbq_group_amax_with(nb_ctx *ctx, const nb_quantizer *q, float own, const char *who, float *out);

/* Load row `row` (n contiguous elements of a contiguous F32/BF16/F16 tensor) as f32. */
void nbq_load_row(const void *base, nb_dtype dt, int64_t row, int64_t n, float *out);
/* Store n f32 values into row `row` of a contiguous F32/BF16/F16 tensor (RNE to 16-bit types). */
void nbq_store_row(void *base, nb_dtype dt, int64_t row, int64_t n, const float *in);
/* Index of the first NaN/Inf in a contiguous F32/BF16/F16 tensor, or -1. */
int64_t nbq_find_nonfinite(const void *base, nb_dtype dt, int64_t n);
/* max |x| of a contiguous F32/BF16/F16 tensor (threaded). */
float nbq_absmax(nb_ctx *ctx, const void *base, nb_dtype dt, int64_t n);

/* The shape checks every entry point shares: float dtype, ndim >= 1, last dim divisible by the
 * format's block. `what` names the tensor in messages. */
nb_status nbq_check_input(nb_ctx *ctx, const nb_tensor *x, nb_qformat f, const char *what);
/* The same checks with x on any device (the entry points that dispatch CUDA tensors); nbq_check_input
 * refuses device tensors (calibration and the quantizers' state run on the host). */
nb_status nbq_check_input_any(nb_ctx *ctx, const nb_tensor *x, nb_qformat f, const char *what);
/* A contiguous tensor with x's contents (x itself, retained, when already contiguous). */
nb_status nbq_contiguous(nb_ctx *ctx, const nb_tensor *x, nb_tensor **out);

/* A resolved quantization: the format's traits, the row geometry and every per-tensor value the
 * rows need, validated once (shared by quantize, fake quant, calibration and the quantizers). */
typedef struct nbq_plan {
    nb_qformat fmt;
    const nb_qformat_traits *tr;
    nb_qrow_fns fn;               /* the row functions the context runs for fmt */
    int64_t rows, n;              /* x viewed as [rows, n], n = last dim */
    nb_qrow_args base;            /* per-tensor args (scale, global_amax, mx_floor, div_dtype) */
    const float *block_amax;      /* NVFP4 static: [rows, n/16] (borrowed) */
    float *row_scale;             /* FP8_CHANNEL: [rows] weight scales (owned) */
    float *row_amax;              /* FP8_CHANNEL: [rows] amax (owned) */
} nbq_plan;

/* Resolve p against a contiguous, finite x (NULL x: only usable when nothing is "from the data"). */
nb_status nbq_plan_init(nb_ctx *ctx, nbq_plan *plan, const nb_tensor *x, const nb_qparams *p);
void nbq_plan_row(const nbq_plan *plan, int64_t row, nb_qrow_args *a);
void nbq_plan_free(nbq_plan *plan);
/* The NaN/Inf check with the named message (NB_ERR_NUMERIC). x must be contiguous. */
nb_status nbq_check_finite(nb_ctx *ctx, const nb_tensor *x, const char *what);
/* The same check with another reason after the element ("; quantization needs finite values"). */
nb_status nbq_check_finite_why(nb_ctx *ctx, const nb_tensor *x, const char *what, const char *why);
/* Fake-quantize contiguous x into contiguous out (same shape; out may be x) with a resolved plan. */
nb_status nbq_fake_plan(nb_ctx *ctx, const nbq_plan *plan, const nb_tensor *x, nb_tensor *out);
/* Fake-quantize x into a float buffer [rows*n] (no dtype rounding; calibration's view). */
nb_status nbq_fake_plan_f32(nb_ctx *ctx, const nbq_plan *plan, const nb_tensor *x, float *out);

/* --- CUDA device tensors (qdevice.c): the entry points dispatch on the tensor's device ---------- */
struct nb_cuda_qargs;
/* t (the `role`: "input", "output") may be used on its device: CUDA built, the device present, t
 * contiguous. NB_ERR_DEVICE (NB_ERR_UNSUPPORTED for a strided tensor) naming `what` otherwise. */
nb_status nbq_device_check(nb_ctx *ctx, const nb_tensor *t, const char *what, const char *role);
/* The CPU plan of device tensor x (from a host copy) and the kernel arguments, staged on x's device
 * (in the context's workspace: call under nbk_lock, held until the kernel has run). */
nb_status nbq_device_plan(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nbq_plan *plan,
                          struct nb_cuda_qargs *ca);
/* Quantize x into q (both on x's device), fake-quantize x into out, dequantize q into out. */
nb_status nbq_device_quantize(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nb_qtensor *q);
nb_status nbq_device_fake(nb_ctx *ctx, const nb_tensor *x, const nb_qparams *p, const char *what, nb_tensor *out);
nb_status nbq_device_dequantize(nb_ctx *ctx, const nb_qtensor *q, nb_tensor *out);

/* Merge the max observers cals[0..n) across the ranks of ctx's communicator (calib.c): batch counts
 * summed, running maxima all-reduced with MAX; a no-op on one rank. Every rank passes the same list. */
nb_status nbq_calib_allreduce(nb_ctx *ctx, nb_calib **cals, int64_t n);

#endif

/* Optimizer pieces for QAD: AdamW over FP32 master weights (bit-exact with torch.optim.AdamW's CPU path),
 * global-norm gradient clipping (torch.nn.utils.clip_grad_norm_), gradient accumulation and the
 * warmup + cosine learning-rate schedule with a min_lr floor (transformers / Megatron).
 *
 * AdamW step for one parameter with f32 tensors p, g, m, v, its own step count t (incremented first) and
 * the step's lr, every operation rounded to f32 in this order (what torch 2.15's single-tensor Adam does;
 * constants computed in double and then rounded to f32, written (f32) below):
 *   p = p · (f32)(1 − lr·wd)                                   decoupled weight decay (skipped when wd = 0)
 *   m = fma(w, g − m, m)             with w = (f32)(1 − β1)     torch.lerp, when |w| < 0.5
 *   m = fma(w − 1, g − m, g)                                   torch.lerp otherwise
 *   v = fma((f32)(1 − β2) · g, g, v · (f32)β2)                 mul_ then addcmul_
 *   d = sqrt(v) / (f32)sqrt_c + (f32)eps,  sqrt_c = pow(1 − β2^t, 0.5)
 *   p = p + ((f32)(−lr / (1 − β1^t)) · m) / d                  addcdiv_
 * β^t is pow(β, t) in double (Python's float **). A parameter whose grad is NULL in a step is left alone and
 * its step count does not advance (torch skips params with grad None). Resuming from saved m, v and step
 * counts gives bit-identical results. */
#ifndef NIBBLE_OPTIM_H
#define NIBBLE_OPTIM_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/tensor.h"

typedef struct nb_adamw_cfg {
    double lr;            /* default 1e-3 (the value nb_adamw_step uses when given lr < 0) */
    double beta1;         /* default 0.9 */
    double beta2;         /* default 0.999 */
    double eps;           /* default 1e-8 */
    double weight_decay;  /* default 1e-2 (torch.optim.AdamW's default) */
} nb_adamw_cfg;

typedef struct nb_adamw nb_adamw;

NB_API void nb_adamw_cfg_init(nb_adamw_cfg *cfg);

/* An optimizer over n parameters (contiguous, writable f32 host tensors; retained until nb_adamw_free).
 * m and v start at zero, step counts at 0. */
NB_API nb_status nb_adamw_new(nb_ctx *ctx, const nb_adamw_cfg *cfg, int32_t n, nb_tensor *const *params, nb_adamw **out);
NB_API void nb_adamw_free(nb_adamw *opt);
NB_API int32_t nb_adamw_count(const nb_adamw *opt);
/* Per-parameter weight decay (e.g. 0 for norms and biases); default cfg.weight_decay. */
NB_API nb_status nb_adamw_set_weight_decay(nb_ctx *ctx, nb_adamw *opt, int32_t i, double weight_decay);
/* Per-parameter learning-rate multiplier (a torch param group whose lr is scale times the others'): the
 * step's lr for parameter i is lr · scale, weight decay included; scale >= 0, default 1. */
NB_API nb_status nb_adamw_set_lr_scale(nb_ctx *ctx, nb_adamw *opt, int32_t i, double scale);

/* One step with learning rate lr (lr < 0: cfg.lr). grads[i] is the f32 gradient of params[i], same number of
 * elements, or NULL to skip that parameter. */
NB_API nb_status nb_adamw_step(nb_ctx *ctx, nb_adamw *opt, const nb_tensor *const *grads, double lr);

/* Optimizer state of parameter i, for checkpoints: m (exp_avg) and v (exp_avg_sq) as the optimizer's own f32
 * tensors (borrowed: valid while opt lives; retain them to keep them longer) and the step count. */
NB_API nb_status nb_adamw_get_state(nb_ctx *ctx, const nb_adamw *opt, int32_t i, nb_tensor **m, nb_tensor **v,
                             int64_t *step);
/* Restore parameter i's state: copies m and v (f32, same element count) and sets the step count. */
NB_API nb_status nb_adamw_set_state(nb_ctx *ctx, nb_adamw *opt, int32_t i, const nb_tensor *m, const nb_tensor *v,
                             int64_t step);

/* clip_grad_norm_ over n f32 gradients (NULL entries are skipped): total = sqrt(Σ ‖g_i‖²) accumulated in
 * double; then, as torch does in f32, c = min(1, (1 / (f32(total) + 1e-6f)) · f32(max_norm)) and g_i *= c.
 * *total_norm (may be NULL) gets the norm before clipping. A non-finite norm leaves the gradients alone and
 * returns NB_ERR_NUMERIC (torch's error_if_nonfinite = True): the caller skips the step. */
NB_API nb_status nb_clip_grad_norm(nb_ctx *ctx, int32_t n, nb_tensor *const *grads, double max_norm, double *total_norm);

/* Gradient accumulation: acc += scale · g (f32, same element count; contiguous). */
NB_API nb_status nb_grad_accumulate(nb_ctx *ctx, nb_tensor *acc, const nb_tensor *g, double scale);

/* Learning-rate schedule: linear warmup from 0, then half a cosine from lr down to min_lr.
 *   step < warmup:          lr · step / max(1, warmup)
 *   warmup ≤ step ≤ total:  lr · (f · (1 − r) + r),  f = 0.5 · (1 + cos(π · (step − warmup) / max(1, total − warmup))),
 *                           r = min_lr / lr
 *   step > total:           min_lr (Megatron holds min_lr; transformers' lambda would rise again)
 * This is transformers' get_cosine_with_min_lr_schedule_with_warmup(num_cycles = 0.5, min_lr) value for value
 * (and Megatron's cosine decay: min_lr + (lr − min_lr)·f). `step` counts optimizer steps already taken, so the
 * first step uses nb_lr_at(s, 0), which is 0 when warmup > 0 (as with LambdaLR). HF's warmup_ratio gives
 * warmup = ceil(ratio · total). */
typedef struct nb_lr_schedule {
    double lr;
    double min_lr;
    int64_t warmup_steps;
    int64_t total_steps;
} nb_lr_schedule;

NB_API double nb_lr_at(const nb_lr_schedule *s, int64_t step);

#endif

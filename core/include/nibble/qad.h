/* Quantization-aware distillation (QAD): the training step that distils a fake-quantized student
 * (an nb_qmodel with frozen calibrated scales, STE backward) from its full-precision teacher, with
 * AdamW over the FP32 master weights, gradient accumulation, clipping, the warmup + cosine schedule,
 * and checkpoints that resume bit for bit (DESIGN.md §5, FORMATS.md §8).
 *
 * One micro-batch (nb_qad_micro_step):
 *   1. teacher forward, inference only: no activations kept, no logits; only its final-norm hidden
 *      states [rows, hidden] are captured;
 *   2. student forward (train) through the fake-quant hooks;
 *   3. student backward with a loss callback: for each chunk of rows the backward recomputes the
 *      student's logits, the callback computes the same rows of the teacher's logits with the
 *      teacher's lm_head and feeds both to nb_distill_chunk, which overwrites the student logits
 *      with d loss / d logits. So at most one chunk of student and one of teacher logits exist at a
 *      time, whatever the vocabulary (top-k uses the same chunks: the teacher's k largest per row).
 *   The mean is over the counted tokens of every micro-batch of the optimizer step (mask and
 *   ignore_index applied), so grad_accum micro-batches of b rows give the gradient of one batch of
 *   grad_accum * b rows.
 * One optimizer step (nb_qad_optimizer_step): clip the global gradient norm, AdamW with the lr the
 * schedule gives for the steps already taken, zero the gradients, optionally recalibrate the weight
 * quantizers. A non-finite gradient norm skips the update but still counts the step
 * (nb_qad_metrics.skipped = 1), so a run keeps going and stays deterministic.
 *
 * Determinism: the same inputs, seed and thread count give the same bytes; a run resumed from a
 * checkpoint equals one that was never interrupted (the checkpoint holds master weights, quantizer
 * state, AdamW moments and step counts, the step, the dataloader cursor and the context RNG). */
#ifndef NIBBLE_QAD_H
#define NIBBLE_QAD_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/model.h"
#include "nibble/qmodel.h"
#include "nibble/distill.h"
#include "nibble/data.h"
#include "nibble/quant.h"

typedef struct nb_qad nb_qad;

typedef struct nb_qad_cfg {
    nb_distill_cfg loss;        /* kd kind, temperature, t2, top_k, lm_loss, kd_loss_scale (nb_distill_cfg_init) */
    int64_t steps;              /* optimizer steps of the run (the schedule's length); > 0; default 100 */
    double lr;                  /* peak learning rate; default 1e-5 (ModelOpt's QAD recipes) */
    double min_lr;              /* floor of the cosine; default 0 */
    int64_t warmup;             /* linear warmup steps; default 0 */
    int32_t grad_accum;         /* micro-batches per optimizer step; default 1 */
    double clip;                /* max global gradient norm; <= 0: no clipping; default 1 (HF max_grad_norm) */
    double weight_decay;        /* AdamW decoupled weight decay of 2-D weights; default 0 (HF default) */
    double beta1, beta2, eps;   /* AdamW; default 0.9, 0.999, 1e-8 */
    int32_t sft_mask;           /* 1 (default): a token counts only where the data's mask is 1 (SFT: the
                                   completion / assistant tokens); 0: every target counts */
    int64_t recalibrate;        /* 0 (default): quantizer scales stay frozen; N > 0: after every N-th step
                                   re-run the weight calibration with recalib (weight-only students only) */
    nb_calib_config recalib;    /* method for recalibrate; default max */
    double lr_scale_unquantized;/* learning-rate multiplier of the trained parameters no enabled weight
                                   quantizer covers (embeddings, norms, layers left in full precision: a
                                   second AdamW param group); >= 0, default 1 (one lr for all, as ModelOpt) */
} nb_qad_cfg;

typedef struct nb_qad_metrics {
    int64_t step;               /* optimizer steps done, this one included */
    double loss;                /* the optimized loss (lm_coef · CE + kd_coef · KD) */
    double kd;                  /* the distillation term (mean over counted tokens) */
    double ce;                  /* the student's cross-entropy against the data (logged even without lm_loss) */
    double lr;                  /* learning rate this step used */
    double grad_norm;           /* global gradient norm before clipping */
    int64_t tokens;             /* counted (loss) tokens this step */
    int64_t seen;               /* tokens processed this step (rows · seq_len over the micro-batches) */
    double seconds;             /* wall time of the step */
    double tokens_per_s;        /* seen / seconds */
    int32_t skipped;            /* 1: the gradient norm was not finite and the update was skipped */
    int32_t recalibrated;       /* 1: the weight quantizers were recalibrated after this step */
} nb_qad_metrics;

/* Defaults as written above. */
NB_API void nb_qad_cfg_init(nb_qad_cfg *cfg);

/* A QAD run. teacher: the full-precision model (frozen; only its forward runs; not the student's
 * model; same vocabulary and hidden size). student: a calibrated qmodel over another model; fake quant
 * is switched on here (NB_ERR_UNCALIBRATED names a quantizer without state). data: the training batches
 * (rows of seq_len tokens; may be NULL when the caller feeds nb_qad_micro_step itself). Every student
 * parameter that requires grad is trained (nb_model_set_requires_grad freezes some beforehand).
 * teacher, student and data are borrowed: they must outlive the run. */
NB_API nb_status nb_qad_new(nb_ctx *ctx, const nb_qad_cfg *cfg, nb_model *teacher, nb_qmodel *student, nb_dataloader *data,
                     nb_qad **out);
NB_API void nb_qad_free(nb_qad *q);
NB_API const nb_qad_cfg *nb_qad_get_cfg(const nb_qad *q);
NB_API int64_t nb_qad_step_count(const nb_qad *q);     /* optimizer steps taken (restored by a resume) */
NB_API int32_t nb_qad_done(const nb_qad *q);           /* 1 when step_count >= cfg.steps */

/* One optimizer step on the next grad_accum batches of the dataloader. On an error before the update
 * (an interrupt included) the parameters, optimizer and dataloader cursor are as they were before the
 * call, so a checkpoint taken then resumes exactly; an interrupt that arrives during the AdamW update
 * completes the step and returns NB_ERR_INTERRUPTED with *out filled. */
NB_API nb_status nb_qad_step(nb_ctx *ctx, nb_qad *q, nb_qad_metrics *out);

/* The pieces of nb_qad_step, for pipelines that bring their own batches.
 * micro_step: forward + backward of one micro-batch, accumulating into the student's gradients.
 * tokens/targets [B, T] i32, mask [B, T] u8 (NULL = all 1; ignored when cfg.sft_mask = 0);
 * denom: the divisor of the means (the counted tokens of every micro-batch of this optimizer step),
 * or <= 0 for this micro-batch's own count. *out (may be NULL) receives this micro-batch's share
 * (loss, kd, lm divided by denom, tokens). */
NB_API nb_status nb_qad_micro_step(nb_ctx *ctx, nb_qad *q, const int32_t *tokens, const int32_t *targets,
                            const uint8_t *mask, int64_t B, int64_t T, double denom, nb_distill_result *out);
/* Clip, AdamW at the scheduled lr, zero the gradients, recalibrate when due; step_count + 1.
 * out->loss/kd/ce/tokens are left as the caller set them; the rest is filled. */
NB_API nb_status nb_qad_optimizer_step(nb_ctx *ctx, nb_qad *q, nb_qad_metrics *out);
/* The counted tokens of a micro-batch under this run's mask rule (for the denom of micro_step). */
NB_API int64_t nb_qad_count_tokens(const nb_qad *q, const int32_t *targets, const uint8_t *mask, int64_t n);
/* The learning rate of optimizer step `step` (0-based: steps already taken). */
NB_API double nb_qad_lr_at(const nb_qad *q, int64_t step);

/* --- checkpoints -------------------------------------------------------------------------------
 * A checkpoint is a directory: student.safetensors (nb_qmodel_save: master weights, quantizer state,
 * specs), trainer.safetensors (AdamW m and v per parameter; metadata: step, AdamW step counts, the
 * dataloader cursor, the context RNG, the settings the run depends on) and manifest.json (each file's
 * size and FNV-1a hash, written last). nb_qad_save writes it at dir/step-<step> through a temporary
 * sibling (.step-<step>.tmp-<pid>) that is fsynced and renamed into place, then replaces dir/latest
 * (a one-line file naming it) the same way, then removes older step-* directories beyond `keep`
 * (<= 0: keep 2); dir is fsynced after each rename. A kill at any moment leaves the newest complete
 * step folder findable by nb_qad_latest. A file-size limit is NB_ERR_IO ("File too large"), not
 * SIGXFSZ. Call it with the context's interrupt flag cleared (writers stop on it). */
NB_API nb_status nb_qad_save(nb_ctx *ctx, nb_qad *q, const char *dir, int32_t keep);
/* Restore from the checkpoint nb_qad_latest finds. NB_ERR_NOT_FOUND when there is none; NB_ERR_INVALID,
 * naming the setting, when it was written by a run with different settings (loss, lr schedule, steps,
 * grad_accum, clip, weight decay, mask rule, dataloader). */
NB_API nb_status nb_qad_restore(nb_ctx *ctx, nb_qad *q, const char *dir);
/* Whether a run of cfg may resume from the checkpoint nb_qad_latest finds in dir, before any run exists:
 * the settings a checkpoint records (loss, lr schedule, steps, grad_accum, clip, optimizer, mask rule,
 * recalibration: the one list of QAD settings) against cfg's. NB_ERR_INVALID "cannot resume from
 * <checkpoint>: the run's settings changed (<name>: the checkpoint has X, this run Y)" naming the first
 * that differs; NB_ERR_NOT_FOUND when there is no checkpoint. nb_qad_restore checks them again, and the
 * trained parameters and dataloader too. */
NB_API nb_status nb_qad_check_settings(nb_ctx *ctx, const nb_qad_cfg *cfg, const char *dir);
/* Path of the checkpoint to resume from, into buf: dir itself when it is a step folder, else the
 * newest dir/step-* folder its manifest.json verifies (sizes and hashes; a folder from before
 * manifests only when dir/latest names it), whatever dir/latest says. NB_ERR_NOT_FOUND when none. */
NB_API nb_status nb_qad_latest(nb_ctx *ctx, const char *dir, char *buf, int64_t buf_len);

/* One run per checkpoint folder: an exclusive flock on dir.nibble-lock (created, with the folder above
 * dir when missing), held until nb_qad_unlock_dir or the process ends. Another process holding it is
 * NB_ERR_IO "qad: checkpoint_dir: <dir> is in use by another nibble process (pid N): wait for it to
 * finish or give another checkpoint_dir". */
typedef struct nb_qad_lock nb_qad_lock;
NB_API nb_status nb_qad_lock_dir(nb_ctx *ctx, const char *dir, nb_qad_lock **out);
NB_API void nb_qad_unlock_dir(nb_qad_lock *l);

#endif

/* Distillation losses for QAD: KL(teacher‖student), reverse KL, teacher top-k KL and the student's
 * cross-entropy, with per-token masks, forward values and d(loss)/d(student logits), chunked over rows
 * so that a long sequence with a 150k vocabulary never needs its full logits twice (FORMATS.md §8.1).
 *
 * Rows. Every tensor is per row (token): student logits [n, V] f32, teacher logits [n, V] f32 or the
 * teacher's top k (values [n, k] f32 raw logits, indices [n, k] i32), labels [n] i32/i64 (the *next*
 * token: the caller does the causal shift, as ModelOpt's QADTrainer does), weights [n] f32/u8/bool.
 * Row n counts with weight w_n = weights[n] (1 when absent), set to 0 when labels[n] == ignore_index.
 *
 * Per-token terms, with z = logits / T, p = softmax(z_student), q = softmax(z_teacher):
 *   NB_KD_FORWARD  kd_n = Σ_v q_v (log q_v − log p_v)                  (KL(teacher‖student); ModelOpt default)
 *   NB_KD_REVERSE  kd_n = Σ_v p_v (log p_v − log q_v)                  (KL(student‖teacher); Megatron reverse=True)
 *   times T² when cfg.t2_scale (mtd.LogitsDistillationLoss does this; Megatron's LogitsKLLoss does not).
 *   ce_n = −log softmax(student logits at T = 1)[label]               (F.cross_entropy)
 * Top k (cfg.top_k = k > 0) keeps the teacher's k largest logits S (ties: lower index first):
 *   NB_TOPK_RENORM        both softmaxed over S alone: modelopt 0.47 TopKLogitsKLLoss (`logit_kl_topk`).
 *   NB_TOPK_STUDENT_FULL  teacher softmaxed over S, student log-softmax over the full vocabulary, summed over
 *                         S: KL(q_S ‖ p) with q_S the teacher truncated to S and renormalized. Forward only.
 *   NB_TOPK_GHOST         both full-vocabulary log-probs on S plus one residual bucket holding 1 − Σ_S
 *                         (ModelOpt main TopLogitsKLLoss); log Σ_S is clamped to ≤ −FLT_EPSILON as there.
 *                         Needs the teacher's full-vocab logsumexp(t/T): from the full teacher, or given.
 *
 * Reduction (exactly): kd = Σ_n w_n kd_n / D and lm = Σ_n w_n ce_n / D, with D = Σ_n w_n over the whole batch,
 * or 1 when that is 0 (so an all-masked batch gives 0, like `mask.sum().clamp(min=1)` in ModelOpt's
 * QADTrainer._standard_kd_loss). With 0/1 weights this is the mean over counted tokens.
 * Combination (FORMATS.md §8.1):
 *   lm_loss = 0:  loss = kd                       (HF QADTrainer: KD only; Megatron skip_lm_loss=True)
 *   lm_loss = 1:  loss = lm + kd_loss_scale · kd  (Megatron skip_lm_loss=False, static form)
 *   kd = NB_KD_NONE, lm_loss = 1: loss = lm      (plain SFT / CE)
 *   Megatron's balancer also rescales kd to the LM magnitude: loss = lm + kd_loss_scale · kd · sg(lm / kd).
 *   That needs both batch means before any gradient: run the chunks once with grad = NULL, then
 *   nb_distill_rescale_kd(), then run them again with grads.
 *   Other balancers set the state's lm_coef / kd_coef after nb_distill_begin (with lm_loss = 1), e.g.
 *   ModelOpt's StaticLossBalancer and Megatron's newer kd_loss_alpha: lm_coef = 1 − α, kd_coef = α.
 * All per-row math is double precision (the logits are read as f32, gradients written as f32); rows are
 * summed in row order, so results do not depend on the thread count or the chunking. Each chunk call uses
 * 5·V + 3·(k+1) doubles of scratch per thread (6 MB at V = 151936) plus 3 doubles per row, no [n, V] copy. */
#ifndef NIBBLE_DISTILL_H
#define NIBBLE_DISTILL_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/tensor.h"

typedef enum nb_kd_kind {
    NB_KD_NONE    = 0,   /* no distillation term */
    NB_KD_FORWARD = 1,   /* KL(teacher ‖ student) */
    NB_KD_REVERSE = 2    /* KL(student ‖ teacher) */
} nb_kd_kind;

typedef enum nb_topk_norm {
    NB_TOPK_RENORM       = 0,
    NB_TOPK_STUDENT_FULL = 1,
    NB_TOPK_GHOST        = 2
} nb_topk_norm;

typedef struct nb_distill_cfg {
    nb_kd_kind kd;            /* default NB_KD_FORWARD */
    double temperature;       /* > 0; default 1 */
    int32_t t2_scale;         /* 1: multiply kd_n by T² (default 1, as mtd.LogitsDistillationLoss) */
    int32_t top_k;            /* 0: full vocabulary (default); k > 0: the teacher's top k */
    nb_topk_norm topk_norm;   /* default NB_TOPK_RENORM */
    int32_t lm_loss;          /* 1: add the student's cross-entropy (needs labels); default 0 */
    double kd_loss_scale;     /* weight of kd when lm_loss = 1; default 1 */
    int32_t ignore_index;     /* label that excludes a row; default -100 */
} nb_distill_cfg;

/* One chunk of rows. Pointers may be NULL where stated; tensors must be host tensors whose last dim
 * is contiguous (rows may be strided, e.g. a slice of a bigger [N, V] tensor). */
typedef struct nb_distill_batch {
    const nb_tensor *student;    /* [n, V] f32 logits (required) */
    const nb_tensor *teacher;    /* [n, V] f32 logits; or NULL when topk_vals/topk_idx are given */
    const nb_tensor *topk_vals;  /* [n, k] f32 teacher logits (raw, not divided by T), used when teacher is NULL */
    const nb_tensor *topk_idx;   /* [n, k] i32 their vocabulary indices */
    const nb_tensor *topk_lse;   /* [n] f32/f64 logsumexp(teacher / T) over the full vocab (NB_TOPK_GHOST only) */
    const nb_tensor *labels;     /* [n] i32/i64 or NULL (required when lm_loss = 1) */
    const nb_tensor *weights;    /* [n] f32/u8/bool or NULL (all 1) */
} nb_distill_batch;

/* Running state of one batch: set up by nb_distill_begin, fed by nb_distill_chunk. Plain data, so the
 * caller may set denom itself (e.g. a token count over all gradient-accumulation micro-batches). */
typedef struct nb_distill_state {
    nb_distill_cfg cfg;
    double denom;        /* D: the divisor of both means */
    double lm_coef;      /* d loss / d lm (1 when lm_loss, else 0) */
    double kd_coef;      /* d loss / d kd (kd_loss_scale or 1, 0 for NB_KD_NONE; changed by nb_distill_rescale_kd) */
    double kd_sum;       /* Σ w_n kd_n over the rows seen (T² included when t2_scale) */
    double lm_sum;       /* Σ w_n ce_n over the rows seen (rows with labels only) */
    double weight_sum;   /* Σ w_n over the rows seen */
    int64_t tokens;      /* rows seen with w_n > 0 */
    int64_t rows;        /* rows seen */
} nb_distill_state;

typedef struct nb_distill_result {
    double loss;         /* lm_coef · lm + kd_coef · kd */
    double kd;           /* kd_sum / denom */
    double lm;           /* lm_sum / denom (computed whenever labels are given, for logging) */
    double weight_sum;
    int64_t tokens;
} nb_distill_result;

/* Defaults: forward KL, T = 1, t2_scale = 1, full vocab, no LM loss, kd_loss_scale 1, ignore_index -100. */
NB_API void nb_distill_cfg_init(nb_distill_cfg *cfg);

/* Start a batch of n_rows rows. labels/weights are those of the whole batch (or NULL) and fix D. */
NB_API nb_status nb_distill_begin(nb_ctx *ctx, const nb_distill_cfg *cfg, int64_t n_rows, const nb_tensor *labels,
                           const nb_tensor *weights, nb_distill_state *st);

/* Megatron's dynamic balance: kd_coef = kd_loss_scale · lm / kd when lm > 0 and kd > 0 (lm, kd: this batch's
 * means from a forward-only pass); otherwise kd_coef is left as it is. */
NB_API void nb_distill_rescale_kd(nb_distill_state *st, double lm, double kd);

/* Add one chunk of rows: accumulates the sums and, when grad is not NULL, writes d loss / d student logits
 * ([n, V] f32; may be the student tensor itself, to overwrite the logits in place). Rows with w_n = 0 get
 * zero gradients. Errors: shapes or dtypes (NB_ERR_SHAPE / NB_ERR_INVALID), a label outside [0, V)
 * (NB_ERR_INVALID), a non-finite loss in a counted row (NB_ERR_NUMERIC, naming the row in this chunk). */
NB_API nb_status nb_distill_chunk(nb_ctx *ctx, nb_distill_state *st, const nb_distill_batch *b, nb_tensor *grad);

/* The batch result from the sums so far. */
NB_API nb_status nb_distill_finish(nb_ctx *ctx, const nb_distill_state *st, nb_distill_result *out);

/* begin + one chunk + finish over a whole batch. */
NB_API nb_status nb_distill_loss(nb_ctx *ctx, const nb_distill_cfg *cfg, const nb_distill_batch *b, nb_tensor *grad,
                          nb_distill_result *out);

/* The teacher's top k per row (the memory-saving form: keep [n, k] instead of [n, V]): values (raw f32 logits,
 * descending; ties broken by lower index) into vals [n, k] f32, indices into idx [n, k] i32, and, when lse is
 * not NULL, logsumexp(teacher / temperature) over the full vocab into lse [n] f32/f64. */
NB_API nb_status nb_distill_topk(nb_ctx *ctx, const nb_tensor *teacher, int32_t k, double temperature, nb_tensor *vals,
                          nb_tensor *idx, nb_tensor *lse);

#endif

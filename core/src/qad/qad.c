/* The QAD training step: teacher forward (hidden states only), fake-quant student forward and
 * backward with the distillation loss computed chunk by chunk inside the backward's loss callback
 * (teacher logits made per chunk from its hidden states), gradient accumulation, clipping, AdamW on the
 * warmup + cosine schedule, optional weight recalibration. See nibble/qad.h for the contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nibble/ops.h"
#include "qad/qad_internal.h"

void nb_qad_cfg_init(nb_qad_cfg *c) {
    memset(c, 0, sizeof *c);
    nb_distill_cfg_init(&c->loss);
    c->steps = 100;
    c->lr = 1e-5;
    c->min_lr = 0.0;
    c->warmup = 0;
    c->grad_accum = 1;
    c->clip = 1.0;
    c->weight_decay = 0.0;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->sft_mask = 1;
    c->recalibrate = 0;
    nb_calib_config_init(&c->recalib, NB_CALIB_MAX);
    c->lr_scale_unquantized = 1.0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nb_status check_cfg(nb_ctx *ctx, const nb_qad_cfg *c) {
    if (c->steps <= 0) return nb_fail(ctx, NB_ERR_INVALID, "qad: steps must be > 0 (got %lld)", (long long)c->steps);
    if (!(c->lr >= 0.0) || !isfinite(c->lr)) return nb_fail(ctx, NB_ERR_INVALID, "qad: lr must be a finite number >= 0");
    if (!(c->min_lr >= 0.0) || !isfinite(c->min_lr))
        return nb_fail(ctx, NB_ERR_INVALID, "qad: min_lr must be a finite number >= 0");
    if (c->min_lr > c->lr)
        return nb_fail(ctx, NB_ERR_INVALID, "qad: min_lr %g is larger than lr %g", c->min_lr, c->lr);
    if (c->warmup < 0 || c->warmup > c->steps)
        return nb_fail(ctx, NB_ERR_INVALID, "qad: warmup must be in [0, steps] (got %lld of %lld)", (long long)c->warmup,
                       (long long)c->steps);
    if (c->grad_accum < 1) return nb_fail(ctx, NB_ERR_INVALID, "qad: grad_accum must be >= 1 (got %d)", (int)c->grad_accum);
    if (!isfinite(c->clip)) return nb_fail(ctx, NB_ERR_INVALID, "qad: clip must be finite (<= 0 turns clipping off)");
    if (!(c->weight_decay >= 0.0)) return nb_fail(ctx, NB_ERR_INVALID, "qad: weight_decay must be >= 0");
    if (c->recalibrate < 0) return nb_fail(ctx, NB_ERR_INVALID, "qad: recalibrate must be >= 0 (0 keeps scales frozen)");
    if (!(c->lr_scale_unquantized >= 0.0) || !isfinite(c->lr_scale_unquantized))
        return nb_fail(ctx, NB_ERR_INVALID, "qad: lr_scale_unquantized must be a finite number >= 0");
    return NB_OK;
}

/* The unquantized parameters' lr multiplier: every parameter except the weights of linear modules with an
 * enabled weight quantizer. */
static nb_status set_unquantized_lr(nb_ctx *ctx, nb_qad *q) {
    const int32_t n = q->n;
    uint8_t *quantized = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!quantized) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qad)");
    nb_status s = NB_OK;
    for (int64_t i = 0; i < nb_qmodel_count(q->qm); i++) {
        nb_quantizer *wq = nb_qmodel_weight_quantizer(q->qm, i);
        if (!wq || !nb_quantizer_enabled(wq)) continue;
        int64_t mi = nb_model_find_module(q->sm, nb_qmodel_name(q->qm, i));
        nb_linear_info li;
        if (mi < 0 || (s = nb_model_linear_info(ctx, q->sm, mi, &li))) break;
        if (li.weight_param >= 0 && li.weight_param < n) quantized[li.weight_param] = 1;
    }
    for (int32_t i = 0; !s && i < n; i++)
        if (!quantized[i]) s = nb_adamw_set_lr_scale(ctx, q->opt, i, q->cfg.lr_scale_unquantized);
    free(quantized);
    return s;
}

/* A student with input quantizers cannot recalibrate from the weights alone. */
static nb_status check_recalibrate(nb_ctx *ctx, const nb_qmodel *qm) {
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        nb_quantizer *iq = nb_qmodel_input_quantizer(qm, i);
        if (iq && nb_quantizer_enabled(iq))
            return nb_fail(ctx, NB_ERR_UNSUPPORTED,
                           "qad: recalibrate works for weight-only students; %s has an input quantizer, whose "
                           "recalibration would need calibration data (keep the scales frozen: recalibrate = 0)",
                           nb_qmodel_name(qm, i));
    }
    return NB_OK;
}

void nb_qad_free(nb_qad *q) {
    if (!q) return;
    if (q->batches) {
        for (int32_t i = 0; i < q->cfg.grad_accum; i++) nb_data_batch_release(&q->batches[i]);
        free(q->batches);
    }
    nb_adamw_free(q->opt);
    free(q->grads);
    free(q->thidden);
    free(q->th);
    free(q->tl);
    free(q);
}

nb_status nb_qad_new(nb_ctx *ctx, const nb_qad_cfg *cfg, nb_model *teacher, nb_qmodel *student, nb_dataloader *data,
                     nb_qad **out) {
    *out = NULL;
    if (!cfg || !teacher || !student) return nb_fail(ctx, NB_ERR_INVALID, "qad: cfg, teacher and student are required");
    nb_status s = check_cfg(ctx, cfg);
    if (s) return s;
    nb_model *sm = nb_qmodel_model(student);
    if (sm == teacher)
        return nb_fail(ctx, NB_ERR_INVALID, "qad: the teacher must be a separate model (load the weights twice): the "
                       "student's training changes its own weights");
    const nb_model_config *tc = nb_model_get_config(teacher), *sc = nb_model_get_config(sm);
    if (tc->vocab_size != sc->vocab_size)
        return nb_fail(ctx, NB_ERR_SHAPE, "qad: teacher vocabulary %lld differs from the student's %lld",
                       (long long)tc->vocab_size, (long long)sc->vocab_size);
    if (cfg->recalibrate > 0 && (s = check_recalibrate(ctx, student))) return s;
    /* fake quant on; refuses a student with an uncalibrated quantizer, naming it */
    if ((s = nb_qmodel_set_fake(ctx, student, 1))) return s;

    nb_qad *q = calloc(1, sizeof *q);
    if (!q) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qad)");
    q->cfg = *cfg;
    q->teacher = teacher;
    q->sm = sm;
    q->qm = student;
    q->ld = data;
    q->sched.lr = cfg->lr;
    q->sched.min_lr = cfg->min_lr;
    q->sched.warmup_steps = cfg->warmup;
    q->sched.total_steps = cfg->steps;

    /* teacher lm_head: the module's weight (the embeddings when tied) */
    int64_t lm = nb_model_find_module(teacher, "lm_head");
    nb_linear_info li;
    if (lm < 0) { nb_qad_free(q); return nb_fail(ctx, NB_ERR_NOT_FOUND, "qad: the teacher has no lm_head module"); }
    if ((s = nb_model_linear_info(ctx, teacher, lm, &li))) { nb_qad_free(q); return s; }
    q->tW = nb_tensor_data(nb_model_param(teacher, li.weight_param));
    q->tb = li.bias_param >= 0 ? nb_tensor_data(nb_model_param(teacher, li.bias_param)) : NULL;
    q->thidden = calloc((size_t)(tc->n_layers + 1), sizeof *q->thidden);
    q->batches = calloc((size_t)cfg->grad_accum, sizeof *q->batches);
    if (!q->thidden || !q->batches) { nb_qad_free(q); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qad)"); }

    /* every parameter goes into AdamW (frozen ones get NULL gradients and never move) */
    if ((s = nb_model_alloc_grads(ctx, sm))) { nb_qad_free(q); return s; }
    nb_model_zero_grad(sm);
    int64_t np = nb_model_param_count(sm);
    if (np > INT32_MAX) { nb_qad_free(q); return nb_fail(ctx, NB_ERR_UNSUPPORTED, "qad: too many parameters"); }
    q->n = (int32_t)np;
    nb_tensor **params = malloc(sizeof *params * (size_t)(np > 0 ? np : 1));
    q->grads = calloc((size_t)(np > 0 ? np : 1), sizeof *q->grads);
    if (!params || !q->grads) { free(params); nb_qad_free(q); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (qad)"); }
    for (int64_t i = 0; i < np; i++) {
        params[i] = nb_model_param(sm, i);
        q->grads[i] = nb_model_param_requires_grad(sm, i) ? nb_model_grad(sm, i) : NULL;
    }
    nb_adamw_cfg ac;
    nb_adamw_cfg_init(&ac);
    ac.lr = cfg->lr;
    ac.beta1 = cfg->beta1;
    ac.beta2 = cfg->beta2;
    ac.eps = cfg->eps;
    ac.weight_decay = cfg->weight_decay;
    s = nb_adamw_new(ctx, &ac, q->n, params, &q->opt);
    free(params);
    /* no decay on norms and biases (1-D), as HF's Trainer does */
    for (int32_t i = 0; !s && i < q->n; i++)
        if (nb_model_param(sm, i)->ndim < 2) s = nb_adamw_set_weight_decay(ctx, q->opt, i, 0.0);
    if (!s && cfg->lr_scale_unquantized != 1.0) s = set_unquantized_lr(ctx, q);
    if (s) { nb_qad_free(q); return s; }
    *out = q;
    return NB_OK;
}

const nb_qad_cfg *nb_qad_get_cfg(const nb_qad *q) { return &q->cfg; }
int64_t nb_qad_step_count(const nb_qad *q) { return q->step; }
int32_t nb_qad_done(const nb_qad *q) { return q->step >= q->cfg.steps; }
double nb_qad_lr_at(const nb_qad *q, int64_t step) { return nb_lr_at(&q->sched, step); }

int64_t nb_qad_count_tokens(const nb_qad *q, const int32_t *targets, const uint8_t *mask, int64_t n) {
    int64_t c = 0;
    int use_mask = q->cfg.sft_mask && mask;
    for (int64_t i = 0; i < n; i++)
        c += (!use_mask || mask[i]) && (!targets || targets[i] != q->cfg.loss.ignore_index);
    return c;
}

/* ---- the loss callback ------------------------------------------------------------------------- */

/* A tensor over caller memory (no copy; the memory outlives the tensor). */
static nb_status wrap(nb_ctx *ctx, const void *p, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    nb_buffer *b = NULL;
    nb_status s = nb_buffer_wrap(ctx, (void *)p, (size_t)n * (size_t)(nb_dtype_info(dt)->bits / 8), NULL, NULL, &b);
    if (s) return s;
    s = nb_tensor_wrap(ctx, b, dt, ndim, shape, 0, out);
    nb_buffer_release(b);
    return s;
}

static nb_status grow(nb_ctx *ctx, float **buf, size_t *have, size_t need) {
    if (*have >= need) return NB_OK;
    float *p = realloc(*buf, need * sizeof(float));
    if (!p) return nb_fail(ctx, NB_ERR_NOMEM, "qad: out of memory (%zu floats)", need);
    *buf = p;
    *have = need;
    return NB_OK;
}

static nb_status loss_chunk(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab, float *logits,
                            double *loss) {
    nb_qad *q = user;
    const nb_model_config *tc = nb_model_get_config(q->teacher);
    int64_t D = tc->hidden_size;
    if (row0 < 0 || row0 + nrows > q->rows) return nb_fail(ctx, NB_ERR_INTERNAL, "qad: loss rows out of range");
    nb_status s = grow(ctx, &q->tl, &q->tl_floats, (size_t)(nrows * vocab));
    if (s) return s;
    if ((s = nb_op_linear_fwd(ctx, q->th + row0 * D, q->tW, q->tb, q->tl, nrows, D, vocab))) return s;
    int64_t mat[2] = {nrows, vocab}, vec[1] = {nrows};
    nb_tensor *ts = NULL, *tt = NULL, *tlab = NULL, *tw = NULL;
    if (!(s = wrap(ctx, logits, NB_F32, 2, mat, &ts)) && !(s = wrap(ctx, q->tl, NB_F32, 2, mat, &tt)) &&
        !(s = wrap(ctx, q->targets + row0, NB_I32, 1, vec, &tlab))) {
        if (q->cfg.sft_mask && q->mask) s = wrap(ctx, q->mask + row0, NB_U8, 1, vec, &tw);
        if (!s) {
            nb_distill_batch b;
            memset(&b, 0, sizeof b);
            b.student = ts;
            b.teacher = tt;
            b.labels = tlab;
            b.weights = tw;
            double kd0 = q->st.kd_sum, lm0 = q->st.lm_sum;
            s = nb_distill_chunk(ctx, &q->st, &b, ts);
            if (!s && loss)
                *loss += (q->st.lm_coef * (q->st.lm_sum - lm0) + q->st.kd_coef * (q->st.kd_sum - kd0)) / q->st.denom;
        }
    }
    nb_tensor_release(ts);
    nb_tensor_release(tt);
    nb_tensor_release(tlab);
    nb_tensor_release(tw);
    return s;
}

/* ---- one micro-batch ------------------------------------------------------------------------- */

nb_status nb_qad_micro_step(nb_ctx *ctx, nb_qad *q, const int32_t *tokens, const int32_t *targets,
                            const uint8_t *mask, int64_t B, int64_t T, double denom, nb_distill_result *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!tokens || !targets || B <= 0 || T <= 0)
        return nb_fail(ctx, NB_ERR_INVALID, "qad: a micro-batch needs tokens and targets [B, T] with B, T > 0");
    const nb_model_config *tc = nb_model_get_config(q->teacher);
    int64_t N = B * T, D = tc->hidden_size;
    nb_status s = grow(ctx, &q->th, &q->th_floats, (size_t)(N * D));
    if (s) return s;

    /* 1. teacher: final hidden states only */
    nb_forward_opts fo;
    memset(&fo, 0, sizeof fo);
    q->thidden[tc->n_layers] = q->th;
    fo.hidden = q->thidden;
    if ((s = nb_model_forward(ctx, q->teacher, tokens, B, T, &fo))) return s;

    /* 2. student forward through the fake-quant hooks */
    memset(&fo, 0, sizeof fo);
    fo.train = 1;
    if ((s = nb_model_forward(ctx, q->sm, tokens, B, T, &fo))) return s;

    /* 3. backward with the distillation loss per chunk of rows */
    int64_t shape[1] = {N};
    nb_tensor *tlab = NULL, *tw = NULL;
    if ((s = wrap(ctx, targets, NB_I32, 1, shape, &tlab))) return s;
    if (q->cfg.sft_mask && mask && (s = wrap(ctx, mask, NB_U8, 1, shape, &tw))) { nb_tensor_release(tlab); return s; }
    s = nb_distill_begin(ctx, &q->cfg.loss, N, tlab, tw, &q->st);
    nb_tensor_release(tlab);
    nb_tensor_release(tw);
    if (s) return s;
    if (denom > 0.0) q->st.denom = denom;
    q->targets = targets;
    q->mask = mask;
    q->rows = N;
    nb_backward_opts bo;
    memset(&bo, 0, sizeof bo);
    bo.loss = loss_chunk;
    bo.user = q;
    s = nb_model_backward(ctx, q->sm, &bo, NULL);
    q->targets = NULL;
    q->mask = NULL;
    if (s) return s;
    if (out) s = nb_distill_finish(ctx, &q->st, out);
    return s;
}

/* ---- one optimizer step ------------------------------------------------------------------------ */

nb_status nb_qad_optimizer_step(nb_ctx *ctx, nb_qad *q, nb_qad_metrics *out) {
    nb_qad_metrics local;
    if (!out) {
        memset(&local, 0, sizeof local);
        out = &local;
    }
    double lr = nb_lr_at(&q->sched, q->step);
    double norm = 0.0;
    /* clip <= 0: max_norm = inf multiplies by exactly 1, so the norm is still measured */
    nb_status s = nb_clip_grad_norm(ctx, q->n, q->grads, q->cfg.clip > 0.0 ? q->cfg.clip : HUGE_VAL, &norm);
    int skipped = 0, interrupted = 0;
    if (s == NB_ERR_NUMERIC) {
        nb_ctx_clear_error(ctx);
        skipped = 1;
        s = NB_OK;
    }
    if (s) return s;
    if (!skipped) {
        s = nb_adamw_step(ctx, q->opt, (const nb_tensor *const *)q->grads, lr);
        if (s == NB_ERR_INTERRUPTED) interrupted = 1;   /* the update completed */
        else if (s) return s;
    }
    nb_model_zero_grad(q->sm);
    q->step++;
    out->step = q->step;
    out->lr = lr;
    out->grad_norm = norm;
    out->skipped = skipped;
    out->recalibrated = 0;
    if (q->cfg.recalibrate > 0 && q->step % q->cfg.recalibrate == 0) {
        if ((s = nb_qmodel_calibrate_weights(ctx, q->qm, &q->cfg.recalib))) return s;
        out->recalibrated = 1;
    }
    return interrupted ? nb_fail(ctx, NB_ERR_INTERRUPTED, "qad: interrupted (step %lld completed)", (long long)q->step)
                       : NB_OK;
}

nb_status nb_qad_step(nb_ctx *ctx, nb_qad *q, nb_qad_metrics *out) {
    nb_qad_metrics m;
    memset(&m, 0, sizeof m);
    if (out) memset(out, 0, sizeof *out);
    if (!q->ld) return nb_fail(ctx, NB_ERR_INVALID, "qad: this run has no dataloader (feed nb_qad_micro_step instead)");
    double t0 = now_s();
    nb_data_state before;
    nb_dataloader_state(q->ld, &before);
    int32_t A = q->cfg.grad_accum;
    nb_status s = NB_OK;
    int64_t total = 0;
    for (int32_t i = 0; i < A && !s; i++) {
        s = nb_dataloader_next(ctx, q->ld, &q->batches[i]);
        if (!s) {
            nb_data_batch *b = &q->batches[i];
            int64_t n = b->rows * b->tokens->shape[1];
            total += nb_qad_count_tokens(q, nb_tensor_data(b->targets), nb_tensor_data(b->mask), n);
        }
    }
    double denom = total > 0 ? (double)total : 1.0;
    for (int32_t i = 0; i < A && !s; i++) {
        nb_data_batch *b = &q->batches[i];
        nb_distill_result r;
        s = nb_qad_micro_step(ctx, q, nb_tensor_data(b->tokens), nb_tensor_data(b->targets), nb_tensor_data(b->mask),
                              b->rows, b->tokens->shape[1], denom, &r);
        if (!s) {
            m.loss += r.loss;
            m.kd += r.kd;
            m.ce += r.lm;
            m.tokens += r.tokens;
            m.seen += b->rows * b->tokens->shape[1];
        }
    }
    if (s) {
        /* leave everything as before the call, so a checkpoint now resumes exactly */
        nb_status keep = s;
        nb_model_zero_grad(q->sm);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", nb_ctx_last_error(ctx));
        if (nb_dataloader_restore(ctx, q->ld, &before) != NB_OK) return s;
        nb_fail(ctx, keep, "%s", msg);
        return keep;
    }
    s = nb_qad_optimizer_step(ctx, q, &m);
    if (s && s != NB_ERR_INTERRUPTED) return s;
    m.seconds = now_s() - t0;
    m.tokens_per_s = m.seconds > 0.0 ? (double)m.seen / m.seconds : 0.0;
    if (out) *out = m;
    return s;
}

/* Gradient utilities for the training loop: global-norm clipping with torch's clip_grad_norm_ arithmetic,
 * gradient accumulation, and the warmup + cosine learning-rate schedule with a min_lr floor
 * (transformers' get_cosine_with_min_lr_schedule_with_warmup; formulas in nibble/optim.h). */
#include <math.h>
#include <string.h>

#include "nibble/optim.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { NB_NORM_BLOCK = 8192 };

static nb_status check_grad(nb_ctx *ctx, const char *fn, int32_t i, const nb_tensor *t) {
    if (t->dtype != NB_F32)
        return nb_fail(ctx, NB_ERR_INVALID, "%s: grad %d must be f32, got %s", fn, (int)i,
                       nb_dtype_info(t->dtype) ? nb_dtype_info(t->dtype)->name : "?");
    if (t->device >= 0) return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: grad %d is a device tensor (host only)", fn, (int)i);
    if (!nb_tensor_is_contiguous(t)) return nb_fail(ctx, NB_ERR_INVALID, "%s: grad %d is not contiguous", fn, (int)i);
    return NB_OK;
}

/* Sum of squares in fixed blocks, so the total does not depend on the thread count. */
typedef struct sq_job {
    const float *x;
    int64_t n;
    double *part;
} sq_job;

static void run_sq(void *arg, int64_t begin, int64_t end) {
    sq_job *J = arg;
    for (int64_t b = begin; b < end; b++) {
        int64_t lo = b * NB_NORM_BLOCK, hi = lo + NB_NORM_BLOCK;
        if (hi > J->n) hi = J->n;
        double s = 0.0;
        for (int64_t i = lo; i < hi; i++) s += (double)J->x[i] * (double)J->x[i];
        J->part[b] = s;
    }
}

typedef struct scale_job {
    float *x;
    float c;
    const float *y;   /* accumulate: x += c·y */
} scale_job;

static void run_scale(void *arg, int64_t begin, int64_t end) {
    scale_job *J = arg;
    for (int64_t i = begin; i < end; i++) J->x[i] = J->x[i] * J->c;
}

static void run_axpy(void *arg, int64_t begin, int64_t end) {
    scale_job *J = arg;
    for (int64_t i = begin; i < end; i++) {
        float t = J->c * J->y[i];
        J->x[i] = J->x[i] + t;
    }
}

nb_status nb_clip_grad_norm(nb_ctx *ctx, int32_t n, nb_tensor *const *grads, double max_norm, double *total_norm) {
    if (total_norm) *total_norm = 0.0;
    if (n < 0 || (n > 0 && !grads)) return nb_fail(ctx, NB_ERR_INVALID, "clip_grad_norm: bad gradient list (n = %d)", (int)n);
    if (!(max_norm >= 0.0)) return nb_fail(ctx, NB_ERR_INVALID, "clip_grad_norm: max_norm must be >= 0, got %g", max_norm);
    nb_status s;
    int64_t max_blocks = 1;
    for (int32_t i = 0; i < n; i++) {
        if (!grads[i]) continue;
        if ((s = check_grad(ctx, "clip_grad_norm", i, grads[i]))) return s;
        if (!nb_buffer_writable(grads[i]->buf)) return nb_fail(ctx, NB_ERR_INVALID, "clip_grad_norm: grad %d is read-only", (int)i);
        int64_t nb = (nb_tensor_numel(grads[i]) + NB_NORM_BLOCK - 1) / NB_NORM_BLOCK;
        if (nb > max_blocks) max_blocks = nb;
    }
    double *part = nb_alloc(ctx, (size_t)max_blocks * sizeof(double));
    if (!part) return NB_ERR_NOMEM;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        if (!grads[i]) continue;
        sq_job J = {nb_tensor_data(grads[i]), nb_tensor_numel(grads[i]), part};
        int64_t nb = (J.n + NB_NORM_BLOCK - 1) / NB_NORM_BLOCK;
        nb_parallel_for(ctx, nb, 1, run_sq, &J);
        for (int64_t b = 0; b < nb; b++) sum += part[b];
    }
    nb_dealloc(ctx, part, (size_t)max_blocks * sizeof(double));
    double total = sqrt(sum);
    if (total_norm) *total_norm = total;
    if (!isfinite(total))
        return nb_fail(ctx, NB_ERR_NUMERIC, "clip_grad_norm: the total gradient norm is %g; gradients left unchanged", total);
    /* torch: clip_coef = max_norm / (total_norm + 1e-6) on an f32 tensor, i.e. reciprocal() * max_norm */
    float tn = (float)total;
    float den = tn + 1e-6f;
    float coef = (1.0f / den) * (float)max_norm;
    if (coef >= 1.0f) return NB_OK;   /* clamp(max = 1): multiplying by 1 changes nothing */
    for (int32_t i = 0; i < n; i++) {
        if (!grads[i]) continue;
        scale_job J = {nb_tensor_data(grads[i]), coef, NULL};
        nb_parallel_for(ctx, nb_tensor_numel(grads[i]), 1 << 15, run_scale, &J);
    }
    return NB_OK;
}

nb_status nb_grad_accumulate(nb_ctx *ctx, nb_tensor *acc, const nb_tensor *g, double scale) {
    nb_status s;
    if (!acc || !g) return nb_fail(ctx, NB_ERR_INVALID, "grad_accumulate: acc and g are required");
    if ((s = check_grad(ctx, "grad_accumulate", 0, acc)) || (s = check_grad(ctx, "grad_accumulate", 1, g))) return s;
    if (!nb_buffer_writable(acc->buf)) return nb_fail(ctx, NB_ERR_INVALID, "grad_accumulate: acc is read-only");
    if (nb_tensor_numel(acc) != nb_tensor_numel(g))
        return nb_fail(ctx, NB_ERR_SHAPE, "grad_accumulate: acc has %lld elements, g has %lld",
                       (long long)nb_tensor_numel(acc), (long long)nb_tensor_numel(g));
    scale_job J = {nb_tensor_data(acc), (float)scale, nb_tensor_data(g)};
    nb_parallel_for(ctx, nb_tensor_numel(acc), 1 << 15, run_axpy, &J);
    return NB_OK;
}

double nb_lr_at(const nb_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup_steps) {
        int64_t w = s->warmup_steps > 1 ? s->warmup_steps : 1;
        return s->lr * ((double)step / (double)w);
    }
    if (step > s->total_steps) return s->min_lr;
    int64_t span = s->total_steps - s->warmup_steps;
    if (span < 1) span = 1;
    double progress = (double)(step - s->warmup_steps) / (double)span;
    double factor = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
    double rate = s->lr != 0.0 ? s->min_lr / s->lr : 0.0;
    factor = factor * (1.0 - rate) + rate;
    if (factor < 0.0) factor = 0.0;
    return s->lr * factor;
}

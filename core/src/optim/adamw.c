/* AdamW over FP32 master weights, bit-exact with torch.optim.AdamW (CPU single-tensor path, torch 2.15):
 * the operation order and the f32 roundings are spelled out in nibble/optim.h. torch's CPU kernels fuse
 * lerp and addcmul into FMAs (its AVX2/AVX512 builds do), so we use fmaf exactly there and nowhere else. */
#include <math.h>
#include <string.h>

#include "nibble/ops.h"
#include "nibble/optim.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NB_ADAMW_X86 1
#include <immintrin.h>
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

struct nb_adamw {
    nb_ctx *ctx;
    nb_adamw_cfg cfg;
    int32_t n;
    nb_tensor **params, **m, **v;
    int64_t *step;
    double *wd, *lr_scale;
};

void nb_adamw_cfg_init(nb_adamw_cfg *cfg) {
    cfg->lr = 1e-3;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->weight_decay = 1e-2;
}

static nb_status check_f32(nb_ctx *ctx, const char *what, int32_t i, const nb_tensor *t, int writable) {
    if (t->dtype != NB_F32)
        return nb_fail(ctx, NB_ERR_INVALID, "adamw: %s %d must be f32, got %s", what, (int)i,
                       nb_dtype_info(t->dtype) ? nb_dtype_info(t->dtype)->name : "?");
    if (t->device >= 0) return nb_fail(ctx, NB_ERR_UNSUPPORTED, "adamw: %s %d is a device tensor (host only)", what, (int)i);
    if (!nb_tensor_is_contiguous(t)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: %s %d is not contiguous", what, (int)i);
    if (writable && !nb_buffer_writable(t->buf)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: %s %d is read-only", what, (int)i);
    return NB_OK;
}

static nb_status check_cfg(nb_ctx *ctx, const nb_adamw_cfg *c) {
    if (!(c->lr >= 0.0) || !isfinite(c->lr)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: lr must be >= 0, got %g", c->lr);
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: beta1 must be in [0, 1), got %g", c->beta1);
    if (!(c->beta2 >= 0.0 && c->beta2 < 1.0)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: beta2 must be in [0, 1), got %g", c->beta2);
    if (!(c->eps >= 0.0) || !isfinite(c->eps)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: eps must be >= 0, got %g", c->eps);
    if (!(c->weight_decay >= 0.0) || !isfinite(c->weight_decay))
        return nb_fail(ctx, NB_ERR_INVALID, "adamw: weight_decay must be >= 0, got %g", c->weight_decay);
    return NB_OK;
}

void nb_adamw_free(nb_adamw *opt) {
    if (!opt) return;
    nb_ctx *ctx = opt->ctx;
    for (int32_t i = 0; i < opt->n; i++) {
        if (opt->params) nb_tensor_release(opt->params[i]);
        if (opt->m) nb_tensor_release(opt->m[i]);
        if (opt->v) nb_tensor_release(opt->v[i]);
    }
    size_t n = (size_t)(opt->n > 0 ? opt->n : 1);
    nb_dealloc(ctx, opt->params, n * sizeof(nb_tensor *));
    nb_dealloc(ctx, opt->m, n * sizeof(nb_tensor *));
    nb_dealloc(ctx, opt->v, n * sizeof(nb_tensor *));
    nb_dealloc(ctx, opt->step, n * sizeof(int64_t));
    nb_dealloc(ctx, opt->wd, n * sizeof(double));
    nb_dealloc(ctx, opt->lr_scale, n * sizeof(double));
    nb_dealloc(ctx, opt, sizeof *opt);
    nb_ctx_release(ctx);
}

nb_status nb_adamw_new(nb_ctx *ctx, const nb_adamw_cfg *cfg, int32_t n, nb_tensor *const *params, nb_adamw **out) {
    *out = NULL;
    nb_adamw_cfg c;
    if (cfg) c = *cfg;
    else nb_adamw_cfg_init(&c);
    nb_status s = check_cfg(ctx, &c);
    if (s) return s;
    if (n < 0 || (n > 0 && !params)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: bad parameter list (n = %d)", (int)n);
    for (int32_t i = 0; i < n; i++) {
        if (!params[i]) return nb_fail(ctx, NB_ERR_INVALID, "adamw: param %d is NULL", (int)i);
        if ((s = check_f32(ctx, "param", i, params[i], 1))) return s;
    }
    nb_adamw *o = nb_alloc(ctx, sizeof *o);
    if (!o) return NB_ERR_NOMEM;
    nb_ctx_retain(ctx);
    o->ctx = ctx;
    o->cfg = c;
    size_t cnt = (size_t)(n > 0 ? n : 1);
    o->params = nb_alloc(ctx, cnt * sizeof(nb_tensor *));
    o->m = nb_alloc(ctx, cnt * sizeof(nb_tensor *));
    o->v = nb_alloc(ctx, cnt * sizeof(nb_tensor *));
    o->step = nb_alloc(ctx, cnt * sizeof(int64_t));
    o->wd = nb_alloc(ctx, cnt * sizeof(double));
    o->lr_scale = nb_alloc(ctx, cnt * sizeof(double));
    if (!o->params || !o->m || !o->v || !o->step || !o->wd || !o->lr_scale) { nb_adamw_free(o); return NB_ERR_NOMEM; }
    o->n = n;
    for (int32_t i = 0; i < n; i++) {
        nb_tensor_retain(params[i]);
        o->params[i] = params[i];
        o->wd[i] = c.weight_decay;
        o->lr_scale[i] = 1.0;
        int64_t numel = nb_tensor_numel(params[i]);
        if ((s = nb_tensor_new(ctx, NB_F32, 1, &numel, &o->m[i])) || (s = nb_tensor_new(ctx, NB_F32, 1, &numel, &o->v[i]))) {
            nb_adamw_free(o);
            return s;
        }
    }
    *out = o;
    return NB_OK;
}

int32_t nb_adamw_count(const nb_adamw *opt) { return opt ? opt->n : 0; }

nb_status nb_adamw_set_weight_decay(nb_ctx *ctx, nb_adamw *opt, int32_t i, double weight_decay) {
    if (i < 0 || i >= opt->n) return nb_fail(ctx, NB_ERR_INVALID, "adamw: param index %d out of range [0, %d)", (int)i, (int)opt->n);
    if (!(weight_decay >= 0.0) || !isfinite(weight_decay))
        return nb_fail(ctx, NB_ERR_INVALID, "adamw: weight_decay must be >= 0, got %g", weight_decay);
    opt->wd[i] = weight_decay;
    return NB_OK;
}

nb_status nb_adamw_set_lr_scale(nb_ctx *ctx, nb_adamw *opt, int32_t i, double scale) {
    if (i < 0 || i >= opt->n) return nb_fail(ctx, NB_ERR_INVALID, "adamw: param index %d out of range [0, %d)", (int)i, (int)opt->n);
    if (!(scale >= 0.0) || !isfinite(scale)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: lr scale must be >= 0, got %g", scale);
    opt->lr_scale[i] = scale;
    return NB_OK;
}

typedef struct step_job {
    float *p, *m, *v;
    const float *g;
    float wdmul, w, b2, omb2, bc2s, eps, negss;
    int do_wd, lerp_small;
} step_job;

/* The scalar reference: one element after another, fmaf exactly where torch fuses. */
static void step_range(const step_job *J, int64_t begin, int64_t end) {
    float *P = J->p, *M = J->m, *Vs = J->v;
    const float *G = J->g;
    const float w = J->w, wm1 = J->w - 1.0f;
    for (int64_t i = begin; i < end; i++) {
        float p = P[i], g = G[i], m = M[i], v = Vs[i];
        if (J->do_wd) p = p * J->wdmul;
        float d = g - m;
        m = J->lerp_small ? fmaf(w, d, m) : fmaf(wm1, d, g);   /* torch.lerp: fused on its CPU kernels */
        float vb = v * J->b2;
        float gs = J->omb2 * g;
        v = fmaf(gs, g, vb);                                    /* addcmul_: self + (value·t1)·t2, fused */
        float root = sqrtf(v);
        float den = root / J->bc2s;
        den = den + J->eps;
        float num = J->negss * m;
        float upd = num / den;
        P[i] = p + upd;
        M[i] = m;
        Vs[i] = v;
    }
}

static void run_step(void *arg, int64_t begin, int64_t end) { step_range(arg, begin, end); }

#ifdef NB_ADAMW_X86
/* The same operations, 8 or 16 lanes at a time: every one is a correctly rounded f32 operation (mul, sub,
 * add, div, sqrt) or a single-rounding FMA where the reference calls fmaf, so each element gets the
 * reference's bits on every path (tests/c/test_optim.c compares them); the tail runs the reference. The
 * built-in baseline (x86-64 without FMA) turns each fmaf into a libm call, 5-10 times slower than this. */
#define ADAMW_KERNEL(NAME, TARGET, W, V, LOAD, STORE, SET1, MUL, SUB, ADD, DIV, SQRT, FMA)                       \
    __attribute__((target(TARGET))) static void NAME(void *arg, int64_t begin, int64_t end) {                  \
        const step_job *J = arg;                                                                            \
        const V wv = SET1(J->w), wm1 = SET1(J->w - 1.0f), b2 = SET1(J->b2), omb2 = SET1(J->omb2);            \
        const V bc2s = SET1(J->bc2s), eps = SET1(J->eps), negss = SET1(J->negss), wdmul = SET1(J->wdmul);    \
        int64_t i = begin;                                                                                  \
        for (; i + W <= end; i += W) {                                                                      \
            V p = LOAD(J->p + i), g = LOAD(J->g + i), m = LOAD(J->m + i), v = LOAD(J->v + i);                \
            if (J->do_wd) p = MUL(p, wdmul);                                                                \
            V d = SUB(g, m);                                                                                \
            m = J->lerp_small ? FMA(wv, d, m) : FMA(wm1, d, g);                                             \
            V vb = MUL(v, b2);                                                                              \
            V gs = MUL(omb2, g);                                                                            \
            v = FMA(gs, g, vb);                                                                             \
            V den = ADD(DIV(SQRT(v), bc2s), eps);                                                           \
            V upd = DIV(MUL(negss, m), den);                                                                \
            STORE(J->p + i, ADD(p, upd));                                                                   \
            STORE(J->m + i, m);                                                                             \
            STORE(J->v + i, v);                                                                             \
        }                                                                                                   \
        step_range(J, i, end);                                                                              \
    }

ADAMW_KERNEL(run_step_avx2, "avx2,fma", 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_mul_ps,
             _mm256_sub_ps, _mm256_add_ps, _mm256_div_ps, _mm256_sqrt_ps, _mm256_fmadd_ps)
ADAMW_KERNEL(run_step_avx512, "avx512f,avx2,fma", 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
             _mm512_mul_ps, _mm512_sub_ps, _mm512_add_ps, _mm512_div_ps, _mm512_sqrt_ps, _mm512_fmadd_ps)
#undef ADAMW_KERNEL
#endif

/* The kernel for the context's SIMD level (NIBBLE_SIMD / nb_ctx_options, as the model's row kernels). */
static void (*step_kernel(const nb_ctx *ctx))(void *, int64_t, int64_t) {
#ifdef NB_ADAMW_X86
    const char *level = nb_simd_level(ctx);
    if (!strcmp(level, "avx512")) return run_step_avx512;
    if (!strcmp(level, "avx2")) return run_step_avx2;
#else
    (void)ctx;
#endif
    return run_step;
}

nb_status nb_adamw_step(nb_ctx *ctx, nb_adamw *opt, const nb_tensor *const *grads, double lr) {
    if (!opt) return nb_fail(ctx, NB_ERR_INVALID, "adamw: optimizer is NULL");
    if (lr < 0.0) lr = opt->cfg.lr;
    if (!isfinite(lr)) return nb_fail(ctx, NB_ERR_INVALID, "adamw: lr is not finite");
    if (opt->n > 0 && !grads) return nb_fail(ctx, NB_ERR_INVALID, "adamw: grads is NULL");
    nb_status s;
    for (int32_t i = 0; i < opt->n; i++) {
        if (!grads[i]) continue;
        if ((s = check_f32(ctx, "grad", i, grads[i], 0))) return s;
        if (nb_tensor_numel(grads[i]) != nb_tensor_numel(opt->params[i]))
            return nb_fail(ctx, NB_ERR_SHAPE, "adamw: grad %d has %lld elements, param has %lld", (int)i,
                           (long long)nb_tensor_numel(grads[i]), (long long)nb_tensor_numel(opt->params[i]));
    }
    const double b1 = opt->cfg.beta1, b2 = opt->cfg.beta2;
    void (*kernel)(void *, int64_t, int64_t) = step_kernel(ctx);
    for (int32_t i = 0; i < opt->n; i++) {
        if (!grads[i]) continue;
        int64_t t = ++opt->step[i];
        const double lr_i = lr * opt->lr_scale[i];   /* its param group's lr (exactly lr at scale 1) */
        /* Python-float arithmetic of torch's _single_tensor_adam, then the scalar -> f32 casts of its kernels */
        double bc1 = 1.0 - pow(b1, (double)t);
        double bc2 = 1.0 - pow(b2, (double)t);
        double step_size = lr_i / bc1;
        double bc2s = pow(bc2, 0.5);
        step_job J;
        J.p = nb_tensor_data(opt->params[i]);
        J.m = nb_tensor_data(opt->m[i]);
        J.v = nb_tensor_data(opt->v[i]);
        J.g = nb_tensor_data(grads[i]);
        J.do_wd = opt->wd[i] != 0.0;
        J.wdmul = (float)(1.0 - lr_i * opt->wd[i]);
        J.w = (float)(1.0 - b1);
        J.lerp_small = fabsf(J.w) < 0.5f;
        J.b2 = (float)b2;
        J.omb2 = (float)(1.0 - b2);
        J.bc2s = (float)bc2s;
        J.eps = (float)opt->cfg.eps;
        J.negss = (float)(-step_size);
        nb_parallel_for(ctx, nb_tensor_numel(opt->params[i]), 1 << 15, kernel, &J);
    }
    if (nb_ctx_interrupted(ctx)) return nb_fail(ctx, NB_ERR_INTERRUPTED, "adamw: interrupted (the step completed)");
    return NB_OK;
}

nb_status nb_adamw_get_state(nb_ctx *ctx, const nb_adamw *opt, int32_t i, nb_tensor **m, nb_tensor **v, int64_t *step) {
    if (!opt || i < 0 || i >= opt->n)
        return nb_fail(ctx, NB_ERR_INVALID, "adamw: param index %d out of range [0, %d)", (int)i, opt ? (int)opt->n : 0);
    if (m) *m = opt->m[i];
    if (v) *v = opt->v[i];
    if (step) *step = opt->step[i];
    return NB_OK;
}

nb_status nb_adamw_set_state(nb_ctx *ctx, nb_adamw *opt, int32_t i, const nb_tensor *m, const nb_tensor *v, int64_t step) {
    if (!opt || i < 0 || i >= opt->n)
        return nb_fail(ctx, NB_ERR_INVALID, "adamw: param index %d out of range [0, %d)", (int)i, opt ? (int)opt->n : 0);
    if (!m || !v) return nb_fail(ctx, NB_ERR_INVALID, "adamw: set_state needs m and v");
    if (step < 0) return nb_fail(ctx, NB_ERR_INVALID, "adamw: step %lld < 0", (long long)step);
    int64_t numel = nb_tensor_numel(opt->params[i]);
    nb_status s;
    if ((s = check_f32(ctx, "m", i, m, 0)) || (s = check_f32(ctx, "v", i, v, 0))) return s;
    if (nb_tensor_numel(m) != numel || nb_tensor_numel(v) != numel)
        return nb_fail(ctx, NB_ERR_SHAPE, "adamw: state of param %d must have %lld elements (m %lld, v %lld)", (int)i,
                       (long long)numel, (long long)nb_tensor_numel(m), (long long)nb_tensor_numel(v));
    memcpy(nb_tensor_data(opt->m[i]), nb_tensor_data(m), (size_t)numel * sizeof(float));
    memcpy(nb_tensor_data(opt->v[i]), nb_tensor_data(v), (size_t)numel * sizeof(float));
    opt->step[i] = step;
    return NB_OK;
}

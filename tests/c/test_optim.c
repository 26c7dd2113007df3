/* AdamW, clipping and the LR schedule against torch / transformers (tests/golden/gen_distill_golden.py):
 * AdamW trajectories bit for bit (params, exp_avg, exp_avg_sq, per-param step counts, a skipped grad, two
 * beta settings) on every SIMD path of the CPU (scalar, AVX2, AVX-512), the paths against each other bit
 * for bit on long random tensors, a save/restore in the middle that resumes bit-identically, clip_grad_norm_ within one f32
 * ulp of torch (torch's own f32 norm may differ from the exact one by an ulp), the cosine schedule value for
 * value, gradient accumulation, and error cases. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "nbtest.h"
#include "model/internal.h"

static cJSON *G;
static uint8_t *BLOB;

static void *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "short read %s\n", path); exit(1); }
    p[n] = 0;
    fclose(f);
    return p;
}

static const void *arr(const char *name, int64_t *numel) {
    cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(G, "arrays"), name);
    if (!a) { fprintf(stderr, "golden array %s missing\n", name); exit(1); }
    int64_t n = 1;
    cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(a, "shape")) n *= (int64_t)d->valuedouble;
    if (numel) *numel = n;
    return BLOB + (long)cJSON_GetObjectItem(a, "offset")->valuedouble;
}

static nb_tensor *f32_of(nb_ctx *ctx, const char *name) {
    int64_t n;
    const void *p = arr(name, &n);
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n, p, &t));
    return t;
}

static double jnum(cJSON *c, const char *k) { return cJSON_GetObjectItem(c, k)->valuedouble; }

static int same_bits(const nb_tensor *t, const char *name) {
    int64_t n;
    const void *p = arr(name, &n);
    if (n != nb_tensor_numel(t)) return 0;
    int ok = !memcmp(nb_tensor_data(t), p, (size_t)n * sizeof(float));
    if (!ok) {
        const float *a = nb_tensor_data(t), *b = p;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&a[i], &b[i], 4)) { fprintf(stderr, "%s[%lld]: %.9g vs torch %.9g\n", name, (long long)i, a[i], b[i]); break; }
    }
    return ok;
}

/* Run steps [from, to) of trajectory `tag` on opt with params p[2]; check every step bit for bit. */
static void run_steps(nb_ctx *ctx, cJSON *traj, nb_adamw *opt, nb_tensor **p, int from, int to) {
    const char *tag = cJSON_GetObjectItem(traj, "tag")->valuestring;
    cJSON *steps = cJSON_GetObjectItem(traj, "steps");
    char nm[96];
    for (int k = from; k < to; k++) {
        cJSON *st = cJSON_GetArrayItem(steps, k);
        snprintf(nm, sizeof nm, "adam.%s.g0.%d", tag, k);
        nb_tensor *g0 = f32_of(ctx, nm);
        snprintf(nm, sizeof nm, "adam.%s.g1.%d", tag, k);
        nb_tensor *g1 = f32_of(ctx, nm);
        const nb_tensor *grads[2] = {g0, cJSON_IsTrue(cJSON_GetObjectItem(st, "skip1")) ? NULL : g1};
        CHECK_OK(ctx, nb_adamw_step(ctx, opt, grads, jnum(st, "lr")));
        nb_tensor *m, *v;
        int64_t step;
        for (int i = 0; i < 2; i++) {
            CHECK_OK(ctx, nb_adamw_get_state(ctx, opt, i, &m, &v, &step));
            snprintf(nm, sizeof nm, "adam.%s.p%d.%d", tag, i, k);
            CHECK_MSG(same_bits(p[i], nm), "%s differs from torch", nm);
            snprintf(nm, sizeof nm, "adam.%s.m%d.%d", tag, i, k);
            CHECK_MSG(same_bits(m, nm), "%s differs from torch", nm);
            snprintf(nm, sizeof nm, "adam.%s.v%d.%d", tag, i, k);
            CHECK_MSG(same_bits(v, nm), "%s differs from torch", nm);
            CHECK_EQ_INT(step, (int64_t)jnum(st, i == 0 ? "step0" : "step1"));
        }
        nb_tensor_release(g0);
        nb_tensor_release(g1);
    }
}

static nb_adamw *make_opt(nb_ctx *ctx, cJSON *traj, nb_tensor **p) {
    nb_adamw_cfg cfg;
    nb_adamw_cfg_init(&cfg);
    cfg.lr = jnum(traj, "lr");
    cfg.beta1 = jnum(traj, "beta1");
    cfg.beta2 = jnum(traj, "beta2");
    cfg.eps = jnum(traj, "eps");
    cfg.weight_decay = jnum(traj, "weight_decay0");
    nb_adamw *opt = NULL;
    CHECK_OK(ctx, nb_adamw_new(ctx, &cfg, 2, p, &opt));
    CHECK_OK(ctx, nb_adamw_set_weight_decay(ctx, opt, 1, jnum(traj, "weight_decay1")));
    return opt;
}

static void test_adamw(nb_ctx *ctx) {
    cJSON *traj;
    int n = 0;
    cJSON_ArrayForEach(traj, cJSON_GetObjectItem(G, "adamw")) {
        const char *tag = cJSON_GetObjectItem(traj, "tag")->valuestring;
        char nm[96];
        nb_tensor *p[2];
        snprintf(nm, sizeof nm, "adam.%s.p0", tag); p[0] = f32_of(ctx, nm);
        snprintf(nm, sizeof nm, "adam.%s.p1", tag); p[1] = f32_of(ctx, nm);
        nb_adamw *opt = make_opt(ctx, traj, p);
        CHECK_EQ_INT(nb_adamw_count(opt), 2);
        run_steps(ctx, traj, opt, p, 0, 5);
        nb_adamw_free(opt);
        nb_tensor_release(p[0]);
        nb_tensor_release(p[1]);

        /* interrupted run: 3 steps, save params + m + v + steps to fresh buffers, drop everything, restore, 2 more */
        snprintf(nm, sizeof nm, "adam.%s.p0", tag); p[0] = f32_of(ctx, nm);
        snprintf(nm, sizeof nm, "adam.%s.p1", tag); p[1] = f32_of(ctx, nm);
        opt = make_opt(ctx, traj, p);
        run_steps(ctx, traj, opt, p, 0, 3);
        nb_tensor *save_p[2], *save_m[2], *save_v[2];
        int64_t save_step[2];
        for (int i = 0; i < 2; i++) {
            nb_tensor *m, *v;
            CHECK_OK(ctx, nb_adamw_get_state(ctx, opt, i, &m, &v, &save_step[i]));
            CHECK_OK(ctx, nb_tensor_contiguous(ctx, p[i], &save_p[i]));
            CHECK_OK(ctx, nb_tensor_contiguous(ctx, m, &save_m[i]));
            CHECK_OK(ctx, nb_tensor_contiguous(ctx, v, &save_v[i]));
        }
        nb_adamw_free(opt);
        nb_tensor_release(p[0]);
        nb_tensor_release(p[1]);
        opt = make_opt(ctx, traj, save_p);
        for (int i = 0; i < 2; i++) CHECK_OK(ctx, nb_adamw_set_state(ctx, opt, i, save_m[i], save_v[i], save_step[i]));
        run_steps(ctx, traj, opt, save_p, 3, 5);
        nb_adamw_free(opt);
        for (int i = 0; i < 2; i++) {
            nb_tensor_release(save_p[i]);
            nb_tensor_release(save_m[i]);
            nb_tensor_release(save_v[i]);
        }
        n++;
    }
    CHECK_EQ_INT(n, 2);
}

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void test_clip(nb_ctx *ctx) {
    cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(G, "clip")) {
        char nm[64];
        nb_tensor *g[2];
        snprintf(nm, sizeof nm, "clip.%d.g0", k); g[0] = f32_of(ctx, nm);
        snprintf(nm, sizeof nm, "clip.%d.g1", k); g[1] = f32_of(ctx, nm);
        double total = 0.0;
        CHECK_OK(ctx, nb_clip_grad_norm(ctx, 2, g, jnum(c, "max_norm"), &total));
        CHECK_NEAR(total, jnum(c, "total_norm_exact"), 1e-13 * total);
        CHECK_NEAR(total, jnum(c, "total_norm_torch_f32"), 2e-7 * total);
        /* torch's f32 norm may be an ulp off the exact one; ours is the exact one rounded */
        double tn_torch = jnum(c, "total_norm_torch_f32");
        int dn = abs((int)((int64_t)bits((float)total) - (int64_t)bits((float)tn_torch)));
        CHECK_MSG(dn <= 1, "clip case %d: f32 norm %d ulp from torch's", k, dn);
        float coef = (1.0f / ((float)total + 1e-6f)) * (float)jnum(c, "max_norm");
        int worst = 0, exact = 1;
        for (int i = 0; i < 2; i++) {
            int64_t n;
            snprintf(nm, sizeof nm, "clip.%d.out%d", k, i);
            const float *ref = arr(nm, &n);
            snprintf(nm, sizeof nm, "clip.%d.g%d", k, i);
            const float *in = arr(nm, NULL);
            const float *x = nb_tensor_data(g[i]);
            for (int64_t j = 0; j < n; j++) {
                int d = abs((int)((int64_t)bits(x[j]) - (int64_t)bits(ref[j])));
                if (d > worst) worst = d;
                float want = coef < 1.0f ? in[j] * coef : in[j];   /* torch's arithmetic on our norm */
                exact &= bits(x[j]) == bits(want);
            }
        }
        CHECK_MSG(exact, "clip case %d: not g * min(1, (1 / (norm + 1e-6f)) * max_norm)", k);
        /* an ulp in the norm moves the coefficient by about an ulp, and the product by up to two */
        CHECK_MSG(worst <= (dn ? 2 : 0), "clip case %d: clipped grads %d ulp from torch (norm %d ulp apart)", k, worst, dn);
        if (jnum(c, "max_norm") > jnum(c, "total_norm_exact")) CHECK_EQ_INT(worst, 0);   /* unchanged */
        nb_tensor_release(g[0]);
        nb_tensor_release(g[1]);
        k++;
    }
    CHECK_EQ_INT(k, 3);

    /* a non-finite norm: error, gradients untouched; NULL entries are skipped */
    float x[3] = {1.0f, INFINITY, 2.0f};
    int64_t n3 = 3;
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n3, x, &t));
    nb_tensor *gl[2] = {NULL, t};
    double total = 0.0;
    CHECK_FAIL(ctx, nb_clip_grad_norm(ctx, 2, gl, 1.0, &total), NB_ERR_NUMERIC, "total gradient norm is inf");
    CHECK(isinf(total));
    CHECK(!memcmp(nb_tensor_data(t), x, sizeof x));
    nb_tensor_release(t);
}

static void test_schedule(void) {
    cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(G, "schedule")) {
        nb_lr_schedule s = {jnum(c, "lr"), jnum(c, "min_lr"), (int64_t)jnum(c, "warmup"), (int64_t)jnum(c, "total")};
        int64_t step = 0;
        cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(c, "values")) {
            double got = nb_lr_at(&s, step);
            CHECK_MSG(fabs(got - v->valuedouble) <= 1e-15 * s.lr, "schedule %d step %lld: %.17g vs transformers %.17g", k,
                      (long long)step, got, v->valuedouble);
            step++;
        }
        CHECK_EQ_INT(step, s.total_steps + 1);
        CHECK(nb_lr_at(&s, s.total_steps + 1) == s.min_lr);    /* held after the end (Megatron) */
        CHECK(nb_lr_at(&s, s.total_steps + 1000) == s.min_lr);
        k++;
    }
    CHECK_EQ_INT(k, 3);
    nb_lr_schedule w = {1e-5, 5e-6, 4, 100};
    CHECK(nb_lr_at(&w, 0) == 0.0);
    CHECK(nb_lr_at(&w, 2) == 1e-5 * 0.5);
    CHECK(nb_lr_at(&w, 4) == 1e-5);
    CHECK_NEAR(nb_lr_at(&w, 52), 7.5e-6, 1e-18);   /* halfway down the cosine: (lr + min_lr) / 2 */
    CHECK_NEAR(nb_lr_at(&w, 100), 5e-6, 1e-18);
}

static void test_accumulate_and_errors(nb_ctx *ctx) {
    float a[4] = {1, 2, 3, 4}, b[4] = {0.5f, -1, 0.25f, 8};
    int64_t n = 4, n5 = 5;
    nb_tensor *ta = NULL, *tb = NULL, *t5 = NULL, *th = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n, a, &ta));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n, b, &tb));
    CHECK_OK(ctx, nb_grad_accumulate(ctx, ta, tb, 0.5));
    const float *r = nb_tensor_data(ta);
    CHECK(r[0] == 1.25f && r[1] == 1.5f && r[2] == 3.125f && r[3] == 8.0f);
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, &n5, &t5));
    CHECK_FAIL(ctx, nb_grad_accumulate(ctx, ta, t5, 1.0), NB_ERR_SHAPE, "acc has 4 elements, g has 5");

    nb_adamw *opt = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F16, 1, &n, &th));
    CHECK_FAIL(ctx, nb_adamw_new(ctx, NULL, 1, &th, &opt), NB_ERR_INVALID, "param 0 must be f32, got f16");
    nb_adamw_cfg cfg;
    nb_adamw_cfg_init(&cfg);
    cfg.beta2 = 1.0;
    CHECK_FAIL(ctx, nb_adamw_new(ctx, &cfg, 1, &ta, &opt), NB_ERR_INVALID, "beta2 must be in [0, 1)");
    CHECK_OK(ctx, nb_adamw_new(ctx, NULL, 1, &ta, &opt));
    const nb_tensor *g5[1] = {t5};
    CHECK_FAIL(ctx, nb_adamw_step(ctx, opt, g5, 1e-3), NB_ERR_SHAPE, "grad 0 has 5 elements, param has 4");
    CHECK_FAIL(ctx, nb_adamw_set_state(ctx, opt, 0, t5, t5, 1), NB_ERR_SHAPE, "must have 4 elements");
    CHECK_FAIL(ctx, nb_adamw_get_state(ctx, opt, 2, NULL, NULL, NULL), NB_ERR_INVALID, "param index 2 out of range [0, 1)");
    /* lr < 0 means cfg.lr; the first step moves each weight by about lr (Adam's normalized step) */
    const nb_tensor *gb[1] = {tb};
    float before[4];
    memcpy(before, nb_tensor_data(ta), sizeof before);
    CHECK_OK(ctx, nb_adamw_step(ctx, opt, gb, -1.0));
    for (int i = 0; i < 4; i++) {
        float expect = before[i] * (float)(1.0 - 1e-3 * 1e-2) - (b[i] > 0 ? 1e-3f : -1e-3f);
        CHECK_NEAR(r[i], expect, 1e-6 * fabs(expect));
    }
    nb_adamw_free(opt);

    /* a per-parameter lr scale is that parameter stepped at lr * scale (weight decay included): two
     * parameters of one optimizer against the same parameter in an optimizer stepped at the scaled lr */
    float p0[4] = {1, -2, 3, -4}, p1[4] = {1, -2, 3, -4}, p2[4] = {1, -2, 3, -4};
    nb_tensor *tp[3] = {NULL, NULL, NULL};
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n, p0, &tp[0]));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n, p1, &tp[1]));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 1, &n, p2, &tp[2]));
    nb_adamw *o2 = NULL, *o3 = NULL;
    CHECK_OK(ctx, nb_adamw_new(ctx, NULL, 2, tp, &o2));
    CHECK_OK(ctx, nb_adamw_new(ctx, NULL, 1, &tp[2], &o3));
    CHECK_FAIL(ctx, nb_adamw_set_lr_scale(ctx, o2, 1, -0.5), NB_ERR_INVALID, "lr scale must be >= 0, got -0.5");
    CHECK_FAIL(ctx, nb_adamw_set_lr_scale(ctx, o2, 2, 1.0), NB_ERR_INVALID, "param index 2 out of range [0, 2)");
    CHECK_OK(ctx, nb_adamw_set_lr_scale(ctx, o2, 1, 2.5));
    const nb_tensor *g2[2] = {tb, tb};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(ctx, nb_adamw_step(ctx, o2, g2, 1e-2));
        CHECK_OK(ctx, nb_adamw_step(ctx, o3, gb, 1e-2 * 2.5));
    }
    const float *r0 = nb_tensor_data(tp[0]), *r1 = nb_tensor_data(tp[1]), *r2 = nb_tensor_data(tp[2]);
    CHECK(memcmp(r1, r2, 4 * sizeof *r1) == 0);   /* scaled: bit for bit the lr * 2.5 run */
    CHECK(r0[0] != r1[0]);                          /* unscaled moved less */
    for (int i = 0; i < 4; i++) CHECK_NEAR(fabsf(r0[i] - p0[i]) * 2.5f, fabsf(r1[i] - p1[i]), 1e-3);
    nb_adamw_free(o2);
    nb_adamw_free(o3);
    for (int k = 0; k < 3; k++) nb_tensor_release(tp[k]);
    nb_tensor_release(ta); nb_tensor_release(tb); nb_tensor_release(t5); nb_tensor_release(th);
}

/* Every SIMD path against the scalar reference, bit for bit, on tensors whose lengths leave every tail
 * (n % 16 from 0 to 15 past full vectors), with magnitudes from 1e-30 to 1e3, zeros, both lerp forms
 * (beta1 0.9: w = 0.1 < 0.5; beta1 0.3: w = 0.7) and weight decay on and off, over several steps. */
static void test_adamw_paths(nb_ctx *ctx) {
    const char *paths[2] = {"avx2", "avx512"};
    const int64_t lens[4] = {1, 15, 16 * 37 + 9, 100003};
    for (int pi = 0; pi < 2; pi++) {
        if (strcmp(nb_simd_force(ctx, paths[pi]), paths[pi]) != 0) { printf("adamw paths: no %s on this CPU\n", paths[pi]); continue; }
        for (int li = 0; li < 4; li++)
            for (int cfgi = 0; cfgi < 2; cfgi++) {
                int64_t n = lens[li];
                nb_tensor *p[2] = {NULL, NULL}, *g = NULL;
                CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, &n, &p[0]));
                CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, &n, &p[1]));
                CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, &n, &g));
                float *p0 = nb_tensor_data(p[0]), *p1 = nb_tensor_data(p[1]), *gd = nb_tensor_data(g);
                nb_rng r;
                nb_rng_seed(&r, 11 + (uint64_t)li);
                for (int64_t i = 0; i < n; i++) {
                    double e = (double)(nb_rng_next(&r) % 34) - 30.0;   /* 1e-30 .. 1e3 */
                    p0[i] = p1[i] = (float)((nb_rng_uniform(&r) - 0.5) * 2.0);
                    gd[i] = i % 13 == 5 ? 0.0f : (float)((nb_rng_uniform(&r) - 0.5) * pow(10.0, e));
                }
                nb_adamw_cfg cfg;
                nb_adamw_cfg_init(&cfg);
                cfg.beta1 = cfgi ? 0.3 : 0.9;
                cfg.weight_decay = cfgi ? 0.0 : 0.1;
                nb_adamw *o[2] = {NULL, NULL};
                CHECK_OK(ctx, nb_adamw_new(ctx, &cfg, 1, &p[0], &o[0]));
                CHECK_OK(ctx, nb_adamw_new(ctx, &cfg, 1, &p[1], &o[1]));
                const nb_tensor *gs[1] = {g};
                for (int step = 0; step < 3; step++) {
                    nb_simd_force(ctx, "scalar");
                    CHECK_OK(ctx, nb_adamw_step(ctx, o[0], gs, 1e-2));
                    nb_simd_force(ctx, paths[pi]);
                    CHECK_OK(ctx, nb_adamw_step(ctx, o[1], gs, 1e-2));
                    for (int64_t i = 0; i < n; i++) gd[i] = gd[i] * -0.75f + 1e-3f * (float)(i % 7);
                }
                nb_tensor *m[2], *v[2];
                for (int k = 0; k < 2; k++) CHECK_OK(ctx, nb_adamw_get_state(ctx, o[k], 0, &m[k], &v[k], NULL));
                size_t bytes = (size_t)n * sizeof(float);
                CHECK_MSG(!memcmp(p0, p1, bytes), "adamw %s n=%lld cfg %d: params differ from the scalar path", paths[pi],
                          (long long)n, cfgi);
                CHECK_MSG(!memcmp(nb_tensor_data(m[0]), nb_tensor_data(m[1]), bytes), "adamw %s n=%lld: exp_avg differs",
                          paths[pi], (long long)n);
                CHECK_MSG(!memcmp(nb_tensor_data(v[0]), nb_tensor_data(v[1]), bytes), "adamw %s n=%lld: exp_avg_sq differs",
                          paths[pi], (long long)n);
                CHECK(p0[0] != 0.0f);
                nb_adamw_free(o[0]);
                nb_adamw_free(o[1]);
                nb_tensor_release(p[0]);
                nb_tensor_release(p[1]);
                nb_tensor_release(g);
            }
    }
    nb_simd_force(ctx, "avx2");   /* back to the best level the CPU has */
    nb_simd_force(ctx, "avx512");
}

int main(void) {
    char *js = read_all(nbt_src("tests/golden/data/distill_golden.json"));
    G = cJSON_Parse(js);
    free(js);
    if (!G) { fprintf(stderr, "bad golden json\n"); return 1; }
    BLOB = read_all(nbt_src("tests/golden/data/distill_golden.bin"));
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx) != NB_OK) return 1;
    /* the torch trajectories on every path this CPU has (37 and 5 elements: full vectors and tails) */
    const char *paths[3] = {"scalar", "avx2", "avx512"};
    for (int pi = 0; pi < 3; pi++) {
        if (strcmp(nb_simd_force(ctx, paths[pi]), paths[pi]) != 0) { printf("adamw goldens: no %s on this CPU\n", paths[pi]); continue; }
        test_adamw(ctx);
    }
    nb_simd_force(ctx, "avx2");   /* back to the best level the CPU has */
    nb_simd_force(ctx, "avx512");
    test_adamw_paths(ctx);
    test_clip(ctx);
    test_schedule();
    test_accumulate_and_errors(ctx);
    nb_ctx_release(ctx);
    cJSON_Delete(G);
    free(BLOB);
    return nbt_done("test_optim");
}

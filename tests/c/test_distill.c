/* Distillation losses against float64 torch autograd (tests/golden/gen_distill_golden.py): values and gradients
 * for forward/reverse KL, temperature with and without T², the three top-k forms, CE, masks and weights and the
 * lm/kd combinations; then chunking, in-place gradients and thread counts (bit-identical), the teacher top-k
 * extraction against torch.topk, the top-k-input path, and the error cases. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "nbtest.h"

/* ---- golden file access --------------------------------------------------------------------------- */

static cJSON *G;
static uint8_t *BLOB;
static long BLOB_LEN;

static void *read_all(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "short read %s\n", path); exit(1); }
    p[n] = 0;
    fclose(f);
    if (len) *len = n;
    return p;
}

static void load_golden(void) {
    char *js = read_all(nbt_src("tests/golden/data/distill_golden.json"), NULL);
    G = cJSON_Parse(js);
    free(js);
    if (!G) { fprintf(stderr, "bad golden json\n"); exit(1); }
    BLOB = read_all(nbt_src("tests/golden/data/distill_golden.bin"), &BLOB_LEN);
}

/* Array by name: pointer into the blob, element count, shape (up to 2 dims). */
static const void *arr(const char *name, int64_t *shape0, int64_t *shape1) {
    cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(G, "arrays"), name);
    if (!a) { fprintf(stderr, "golden array %s missing\n", name); exit(1); }
    cJSON *sh = cJSON_GetObjectItem(a, "shape");
    int nd = cJSON_GetArraySize(sh);
    if (shape0) *shape0 = nd > 0 ? (int64_t)cJSON_GetArrayItem(sh, 0)->valuedouble : 1;
    if (shape1) *shape1 = nd > 1 ? (int64_t)cJSON_GetArrayItem(sh, 1)->valuedouble : 1;
    return BLOB + (long)cJSON_GetObjectItem(a, "offset")->valuedouble;
}

static nb_tensor *tensor_of(nb_ctx *ctx, const char *name, nb_dtype dt) {
    int64_t sh[2];
    const void *p = arr(name, &sh[0], &sh[1]);
    cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(G, "arrays"), name);
    int nd = cJSON_GetArraySize(cJSON_GetObjectItem(a, "shape"));
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, dt, nd, sh, p, &t));
    return t;
}

static int jbool(cJSON *c, const char *k) { return cJSON_IsTrue(cJSON_GetObjectItem(c, k)); }
static double jnum(cJSON *c, const char *k) { return cJSON_GetObjectItem(c, k)->valuedouble; }
static const char *jstr(cJSON *c, const char *k) { return cJSON_GetObjectItem(c, k)->valuestring; }

static void cfg_of(cJSON *c, nb_distill_cfg *cfg) {
    nb_distill_cfg_init(cfg);
    const char *kd = jstr(c, "kd");
    cfg->kd = !strcmp(kd, "forward") ? NB_KD_FORWARD : !strcmp(kd, "reverse") ? NB_KD_REVERSE : NB_KD_NONE;
    cfg->temperature = jnum(c, "temperature");
    cfg->t2_scale = jbool(c, "t2");
    cfg->top_k = (int32_t)jnum(c, "top_k");
    const char *nm = jstr(c, "topk_norm");
    cfg->topk_norm = !strcmp(nm, "renorm") ? NB_TOPK_RENORM : !strcmp(nm, "ghost") ? NB_TOPK_GHOST : NB_TOPK_STUDENT_FULL;
    cfg->lm_loss = jbool(c, "lm_loss");
    cfg->kd_loss_scale = jnum(c, "kd_loss_scale");
}

typedef struct inputs {
    nb_tensor *s, *t, *labels, *weights;
} inputs;

static inputs inputs_of(nb_ctx *ctx, const char *which) {
    char b[64];
    inputs in;
    snprintf(b, sizeof b, "%s.student", which); in.s = tensor_of(ctx, b, NB_F32);
    snprintf(b, sizeof b, "%s.teacher", which); in.t = tensor_of(ctx, b, NB_F32);
    snprintf(b, sizeof b, "%s.labels", which); in.labels = tensor_of(ctx, b, NB_I32);
    snprintf(b, sizeof b, "%s.weights", which); in.weights = tensor_of(ctx, b, NB_F32);
    return in;
}

static void inputs_free(inputs *in) {
    nb_tensor_release(in->s); nb_tensor_release(in->t); nb_tensor_release(in->labels); nb_tensor_release(in->weights);
}

/* Gradient check: within half an f32 ulp of the float64 reference (plus a hair); returns the worst error. */
static double check_grad(const char *name, const nb_tensor *g, const double *ref, int64_t n) {
    const float *x = nb_tensor_data(g);
    double worst = 0.0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - ref[i]);
        if (e > worst) worst = e;
        if (e > 6e-8 * fabs(ref[i]) + 1e-13) {
            if (bad++ < 3) fprintf(stderr, "%s: grad[%lld] = %.9g, reference %.17g\n", name, (long long)i, x[i], ref[i]);
        }
    }
    CHECK_MSG(bad == 0, "%s: %d gradient entries off", name, bad);
    return worst;
}

/* ---- golden cases ---------------------------------------------------------------------------------- */

static void test_golden_cases(nb_ctx *ctx) {
    cJSON *cases = cJSON_GetObjectItem(G, "distill_cases");
    int ncase = 0;
    double worst_loss = 0.0, worst_grad = 0.0;
    cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = jstr(c, "name");
        inputs in = inputs_of(ctx, jstr(c, "data"));
        nb_distill_cfg cfg;
        cfg_of(c, &cfg);
        nb_distill_batch b = {0};
        b.student = in.s;
        b.teacher = in.t;
        b.labels = jbool(c, "labels") ? in.labels : NULL;
        b.weights = jbool(c, "weights") ? in.weights : NULL;
        nb_tensor *grad = NULL;
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, in.s->shape, &grad));
        nb_distill_result r;
        if (jbool(c, "dynamic")) {
            /* Megatron's balancer: a forward-only pass for the means, then the gradient pass */
            nb_distill_state st;
            CHECK_OK(ctx, nb_distill_begin(ctx, &cfg, in.s->shape[0], b.labels, b.weights, &st));
            CHECK_OK(ctx, nb_distill_chunk(ctx, &st, &b, NULL));
            CHECK_OK(ctx, nb_distill_finish(ctx, &st, &r));
            double lm = r.lm, kd = r.kd;
            CHECK_OK(ctx, nb_distill_begin(ctx, &cfg, in.s->shape[0], b.labels, b.weights, &st));
            nb_distill_rescale_kd(&st, lm, kd);
            CHECK_NEAR(st.kd_coef, jnum(c, "kd_coef"), 1e-12 * jnum(c, "kd_coef"));
            CHECK_OK(ctx, nb_distill_chunk(ctx, &st, &b, grad));
            CHECK_OK(ctx, nb_distill_finish(ctx, &st, &r));
        } else {
            CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b, grad, &r));
        }
        double ref = jnum(c, "loss");
        double el = fabs(r.loss - ref) / fabs(ref);
        if (el > worst_loss) worst_loss = el;
        CHECK_MSG(el <= 1e-12, "%s: loss %.17g, reference %.17g", name, r.loss, ref);
        CHECK_MSG(fabs(r.kd - jnum(c, "kd_mean")) <= 1e-12 * fabs(jnum(c, "kd_mean")) + 1e-15, "%s: kd %.17g vs %.17g",
                  name, r.kd, jnum(c, "kd_mean"));
        CHECK_MSG(fabs(r.lm - jnum(c, "lm_mean")) <= 1e-12 * fabs(jnum(c, "lm_mean")) + 1e-15, "%s: lm %.17g vs %.17g",
                  name, r.lm, jnum(c, "lm_mean"));
        double e = check_grad(name, grad, arr(jstr(c, "grad"), NULL, NULL), nb_tensor_numel(grad));
        if (e > worst_grad) worst_grad = e;
        nb_tensor_release(grad);
        inputs_free(&in);
        ncase++;
    }
    CHECK_EQ_INT(ncase, 21);
    printf("golden: %d cases, worst loss rel error %.3g, worst grad abs error %.3g\n", ncase, worst_loss, worst_grad);
}

/* Coefficients set by hand after begin (a convex balancer, 0.3·lm + 0.7·kd): the gradient is the same mix of
 * the CE-only and KD-only golden gradients, which share the labels and weights. */
static void test_custom_coefs(nb_ctx *ctx) {
    cJSON *ce = NULL, *kd = NULL, *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(G, "distill_cases")) {
        if (!strcmp(jstr(c, "name"), "ce_weights")) ce = c;
        if (!strcmp(jstr(c, "name"), "fwd_T2_t2")) kd = c;
    }
    inputs in = inputs_of(ctx, "small");
    nb_distill_cfg cfg;
    cfg_of(kd, &cfg);
    cfg.lm_loss = 1;
    nb_distill_batch b = {0};
    b.student = in.s;
    b.teacher = in.t;
    b.labels = in.labels;
    b.weights = in.weights;
    nb_distill_state st;
    CHECK_OK(ctx, nb_distill_begin(ctx, &cfg, 12, b.labels, b.weights, &st));
    st.lm_coef = 0.3;
    st.kd_coef = 0.7;
    nb_tensor *g = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, in.s->shape, &g));
    CHECK_OK(ctx, nb_distill_chunk(ctx, &st, &b, g));
    nb_distill_result r;
    CHECK_OK(ctx, nb_distill_finish(ctx, &st, &r));
    double want = 0.3 * jnum(ce, "loss") + 0.7 * jnum(kd, "loss");
    CHECK_NEAR(r.loss, want, 1e-12 * want);
    const double *gce = arr(jstr(ce, "grad"), NULL, NULL), *gkd = arr(jstr(kd, "grad"), NULL, NULL);
    double mix[600];
    for (int i = 0; i < 600; i++) mix[i] = 0.3 * gce[i] + 0.7 * gkd[i];
    check_grad("custom coefs", g, mix, 600);
    nb_tensor_release(g);
    inputs_free(&in);
}

/* The same case run whole, in row chunks into slices of one gradient, in place over the student, and with a
 * different thread count, must give the same bits. */
static void test_chunks_inplace_threads(nb_ctx *ctx) {
    cJSON *c;
    int done = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(G, "distill_cases")) {
        if (strcmp(jstr(c, "data"), "large")) continue;
        const char *name = jstr(c, "name");
        inputs in = inputs_of(ctx, "large");
        nb_distill_cfg cfg;
        cfg_of(c, &cfg);
        nb_distill_batch b = {0};
        b.student = in.s;
        b.teacher = in.t;
        b.labels = jbool(c, "labels") ? in.labels : NULL;
        b.weights = jbool(c, "weights") ? in.weights : NULL;
        const int64_t n = in.s->shape[0], V = in.s->shape[1];
        nb_tensor *g_whole = NULL, *g_chunk = NULL;
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, in.s->shape, &g_whole));
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, in.s->shape, &g_chunk));
        nb_distill_result whole, chunked, inplace, one_thread;
        CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b, g_whole, &whole));

        /* chunks of rows [0,3) [3,4) [4,8): the caller slices every per-row tensor alike */
        nb_distill_state st;
        CHECK_OK(ctx, nb_distill_begin(ctx, &cfg, n, b.labels, b.weights, &st));
        const int64_t cuts[] = {0, 3, 4, n};
        for (int k = 0; k < 3; k++) {
            int64_t r0 = cuts[k], len = cuts[k + 1] - cuts[k];
            nb_tensor *ss = NULL, *ts = NULL, *ls = NULL, *ws = NULL, *gs = NULL;
            CHECK_OK(ctx, nb_tensor_slice(ctx, in.s, 0, r0, len, &ss));
            CHECK_OK(ctx, nb_tensor_slice(ctx, in.t, 0, r0, len, &ts));
            CHECK_OK(ctx, nb_tensor_slice(ctx, in.labels, 0, r0, len, &ls));
            CHECK_OK(ctx, nb_tensor_slice(ctx, in.weights, 0, r0, len, &ws));
            CHECK_OK(ctx, nb_tensor_slice(ctx, g_chunk, 0, r0, len, &gs));
            nb_distill_batch cb = {0};
            cb.student = ss;
            cb.teacher = ts;
            cb.labels = b.labels ? ls : NULL;
            cb.weights = b.weights ? ws : NULL;
            CHECK_OK(ctx, nb_distill_chunk(ctx, &st, &cb, gs));
            nb_tensor_release(ss); nb_tensor_release(ts); nb_tensor_release(ls); nb_tensor_release(ws);
            nb_tensor_release(gs);
        }
        CHECK_OK(ctx, nb_distill_finish(ctx, &st, &chunked));
        CHECK_MSG(chunked.loss == whole.loss, "%s: chunked loss %.17g vs %.17g", name, chunked.loss, whole.loss);
        CHECK_EQ_INT(chunked.tokens, whole.tokens);
        CHECK(!memcmp(nb_tensor_data(g_chunk), nb_tensor_data(g_whole), (size_t)(n * V) * sizeof(float)));

        /* in place: the gradient overwrites the student logits */
        nb_tensor *s2 = NULL;
        CHECK_OK(ctx, nb_tensor_contiguous(ctx, in.s, &s2));
        nb_distill_batch b2 = b;
        b2.student = s2;
        CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b2, s2, &inplace));
        CHECK(inplace.loss == whole.loss);
        CHECK(!memcmp(nb_tensor_data(s2), nb_tensor_data(g_whole), (size_t)(n * V) * sizeof(float)));
        nb_tensor_release(s2);

        /* one thread instead of the context's pool */
        nb_ctx *c1 = NULL;
        CHECK_OK(ctx, nb_ctx_new(1, &c1));
        CHECK_OK(c1, nb_distill_loss(c1, &cfg, &b, g_chunk, &one_thread));
        CHECK(one_thread.loss == whole.loss);
        CHECK(!memcmp(nb_tensor_data(g_chunk), nb_tensor_data(g_whole), (size_t)(n * V) * sizeof(float)));
        nb_ctx_release(c1);

        nb_tensor_release(g_whole);
        nb_tensor_release(g_chunk);
        inputs_free(&in);
        done++;
    }
    CHECK_EQ_INT(done, 4);
}

/* nb_distill_topk against torch.topk; then the cached top-k form gives the full-teacher results. */
static void test_topk(nb_ctx *ctx) {
    inputs in = inputs_of(ctx, "small");
    const int64_t n = in.s->shape[0];
    int64_t sh[2] = {n, 5};
    nb_tensor *vals = NULL, *idx = NULL, *lse = NULL, *lse32 = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &vals));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_I32, 2, sh, &idx));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F64, 1, &n, &lse));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, &n, &lse32));
    CHECK_OK(ctx, nb_distill_topk(ctx, in.t, 5, 2.0, vals, idx, lse));
    CHECK(!memcmp(nb_tensor_data(vals), arr("topk.vals", NULL, NULL), (size_t)(n * 5) * sizeof(float)));
    CHECK(!memcmp(nb_tensor_data(idx), arr("topk.idx", NULL, NULL), (size_t)(n * 5) * sizeof(int32_t)));
    const double *lref = arr("topk.lse_T2", NULL, NULL);
    for (int64_t i = 0; i < n; i++) CHECK_NEAR(((double *)nb_tensor_data(lse))[i], lref[i], 1e-13 * fabs(lref[i]));
    CHECK_OK(ctx, nb_distill_topk(ctx, in.t, 5, 2.0, vals, idx, lse32));
    for (int64_t i = 0; i < n; i++) CHECK(((float *)nb_tensor_data(lse32))[i] == (float)lref[i]);

    /* ties go to the lower index, as the header says */
    float tie[6] = {1, 3, 2, 3, 3, 0};
    int64_t tsh[2] = {1, 6}, osh[2] = {1, 3};
    nb_tensor *tt = NULL, *tv = NULL, *ti = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, tsh, tie, &tt));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, osh, &tv));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_I32, 2, osh, &ti));
    CHECK_OK(ctx, nb_distill_topk(ctx, tt, 3, 1.0, tv, ti, NULL));
    const int32_t *tiv = nb_tensor_data(ti);
    CHECK(tiv[0] == 1 && tiv[1] == 3 && tiv[2] == 4);
    nb_tensor_release(tt); nb_tensor_release(tv); nb_tensor_release(ti);

    cJSON *c;
    int done = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(G, "distill_cases")) {
        const char *name = jstr(c, "name");
        if (strcmp(jstr(c, "data"), "small") || jnum(c, "top_k") != 5) continue;
        nb_distill_cfg cfg;
        cfg_of(c, &cfg);
        CHECK_OK(ctx, nb_distill_topk(ctx, in.t, 5, cfg.temperature, vals, idx, lse));
        nb_distill_batch b = {0};
        b.student = in.s;
        b.topk_vals = vals;
        b.topk_idx = idx;
        b.topk_lse = lse;
        b.labels = jbool(c, "labels") ? in.labels : NULL;
        b.weights = jbool(c, "weights") ? in.weights : NULL;
        nb_tensor *grad = NULL;
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, in.s->shape, &grad));
        nb_distill_result r;
        CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b, grad, &r));
        CHECK_MSG(fabs(r.loss - jnum(c, "loss")) <= 1e-12 * fabs(jnum(c, "loss")), "%s (cached top-k): %.17g vs %.17g",
                  name, r.loss, jnum(c, "loss"));
        check_grad(name, grad, arr(jstr(c, "grad"), NULL, NULL), nb_tensor_numel(grad));
        nb_tensor_release(grad);
        done++;
    }
    CHECK_EQ_INT(done, 6);
    nb_tensor_release(vals); nb_tensor_release(idx); nb_tensor_release(lse); nb_tensor_release(lse32);
    inputs_free(&in);
}

/* Hand-checkable values: identical teacher and student give 0 and zero gradients; an all-masked batch gives 0. */
static void test_small_facts(nb_ctx *ctx) {
    float x[2 * 4] = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f, 3.0f, -2.0f, 1.0f};
    int64_t sh[2] = {2, 4};
    nb_tensor *s = NULL, *g = NULL, *lab = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, sh, x, &s));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &g));
    nb_distill_cfg cfg;
    nb_distill_cfg_init(&cfg);
    nb_distill_batch b = {0};
    b.student = s;
    b.teacher = s;
    nb_distill_result r;
    for (int kd = 1; kd <= 2; kd++) {
        cfg.kd = (nb_kd_kind)kd;
        CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b, g, &r));
        CHECK_NEAR(r.loss, 0.0, 1e-15);
        for (int i = 0; i < 8; i++) CHECK_NEAR(((float *)nb_tensor_data(g))[i], 0.0, 1e-9);
    }
    /* CE of row [3, 3, -2, 1] at label 0: log(2 + e^-5 + e^-2) */
    int32_t labels[2] = {-100, 0};
    int64_t n2 = 2;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_I32, 1, &n2, labels, &lab));
    cfg.kd = NB_KD_NONE;
    cfg.lm_loss = 1;
    b.labels = lab;
    CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b, g, &r));
    CHECK_NEAR(r.loss, log(2.0 + exp(-5.0) + exp(-2.0)), 1e-14);
    CHECK_EQ_INT(r.tokens, 1);
    for (int i = 0; i < 4; i++) CHECK(((float *)nb_tensor_data(g))[i] == 0.0f);   /* the ignored row */
    /* everything masked: loss 0 (D clamps to 1), zero gradients */
    labels[1] = -100;
    memcpy(nb_tensor_data(lab), labels, sizeof labels);
    cfg.kd = NB_KD_FORWARD;
    CHECK_OK(ctx, nb_distill_loss(ctx, &cfg, &b, g, &r));
    CHECK(r.loss == 0.0 && r.tokens == 0);
    for (int i = 0; i < 8; i++) CHECK(((float *)nb_tensor_data(g))[i] == 0.0f);
    nb_tensor_release(s); nb_tensor_release(g); nb_tensor_release(lab);
}

static void test_errors(nb_ctx *ctx) {
    inputs in = inputs_of(ctx, "small");
    nb_distill_cfg cfg;
    nb_distill_cfg_init(&cfg);
    nb_distill_batch b = {0};
    b.student = in.s;
    b.teacher = in.t;
    nb_distill_result r;

    cfg.temperature = 0.0;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "temperature must be finite and > 0");
    nb_distill_cfg_init(&cfg);
    cfg.top_k = 5;
    cfg.topk_norm = NB_TOPK_STUDENT_FULL;
    cfg.kd = NB_KD_REVERSE;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "reverse KL is undefined with topk_norm student_full");
    nb_distill_cfg_init(&cfg);
    cfg.top_k = 51;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "top_k 51 is larger than the vocabulary (50)");
    nb_distill_cfg_init(&cfg);
    cfg.lm_loss = 1;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "lm_loss needs labels");
    cfg.kd = NB_KD_NONE;
    cfg.lm_loss = 0;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "no loss");
    nb_distill_cfg_init(&cfg);

    /* a label outside the vocabulary */
    nb_tensor *lab = NULL;
    CHECK_OK(ctx, nb_tensor_contiguous(ctx, in.labels, &lab));
    ((int32_t *)nb_tensor_data(lab))[4] = 50;
    b.labels = lab;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "label 50 of row 4 is outside the vocabulary [0, 50)");
    b.labels = NULL;
    nb_tensor_release(lab);

    /* a negative weight */
    nb_tensor *w = NULL;
    CHECK_OK(ctx, nb_tensor_contiguous(ctx, in.weights, &w));
    ((float *)nb_tensor_data(w))[3] = -1.0f;
    b.weights = w;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "weight of row 3 is -1");
    b.weights = NULL;
    nb_tensor_release(w);

    /* shapes and dtypes */
    nb_tensor *ts = NULL, *f64 = NULL;
    CHECK_OK(ctx, nb_tensor_slice(ctx, in.t, 0, 0, 11, &ts));
    b.teacher = ts;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_SHAPE, "teacher is [11, 50], student is [12, 50]");
    nb_tensor_release(ts);
    CHECK_OK(ctx, nb_tensor_to(ctx, in.t, NB_F64, &f64));
    b.teacher = f64;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "teacher must be f32, got f64");
    nb_tensor_release(f64);
    b.teacher = NULL;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "no teacher");

    /* cached top-k with a bad index, and ghost without its logsumexp */
    int64_t sh[2] = {12, 5};
    nb_tensor *tv = NULL, *ti = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &tv));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_I32, 2, sh, &ti));
    CHECK_OK(ctx, nb_distill_topk(ctx, in.t, 5, 1.0, tv, ti, NULL));
    ((int32_t *)nb_tensor_data(ti))[7 * 5 + 2] = 77;
    cfg.top_k = 5;
    b.topk_vals = tv;
    b.topk_idx = ti;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "topk_idx of row 7 is outside [0, 50)");
    cfg.topk_norm = NB_TOPK_GHOST;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_INVALID, "ghost needs topk_lse");
    nb_tensor_release(tv);
    nb_tensor_release(ti);
    nb_distill_cfg_init(&cfg);
    b.topk_vals = NULL;
    b.topk_idx = NULL;

    /* NaN logits in a counted row */
    nb_tensor *s2 = NULL;
    CHECK_OK(ctx, nb_tensor_contiguous(ctx, in.s, &s2));
    ((float *)nb_tensor_data(s2))[6 * 50 + 9] = NAN;
    b.student = s2;
    b.teacher = in.t;
    CHECK_FAIL(ctx, nb_distill_loss(ctx, &cfg, &b, NULL, &r), NB_ERR_NUMERIC, "non-finite loss at row 6");
    nb_tensor_release(s2);
    inputs_free(&in);
}

int main(void) {
    load_golden();
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(3, &ctx) != NB_OK) return 1;
    test_golden_cases(ctx);
    test_custom_coefs(ctx);
    test_chunks_inplace_threads(ctx);
    test_topk(ctx);
    test_small_facts(ctx);
    test_errors(ctx);
    nb_ctx_release(ctx);
    cJSON_Delete(G);
    free(BLOB);
    return nbt_done("test_distill");
}

/* QAD on a tiny random Llama (always runs, no shared data): the chunked in-backward distillation gives
 * the gradient of the plain path (full logits + nb_distill_loss + backward with dlogits) for KL, reverse
 * KL with T and LM loss and masks, and top-k; gradient accumulation equals one big batch; scales stay
 * frozen unless recalibrate; same seed -> same bytes; a run interrupted through the ctx flag and one
 * killed with SIGKILL at a random moment (a child process checkpointing every step) resume to a student
 * and an export byte-identical to the uninterrupted run; settings mismatches and bad inputs are named. */
#include "nbtest.h"
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];

enum { SEQ = 16, BATCH = 4, STEPS = 12, NTOK = 3000 };

/* ---- fixtures ------------------------------------------------------------------------------------ */

static void tiny_config(nb_model_config *c) {
    nb_model_config_init(c);
    c->vocab_size = 96;
    c->hidden_size = 32;
    c->intermediate_size = 48;   /* down_proj's 48 inputs: a multiple of 16 */
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 8;
}

static nb_model *make_model(nb_ctx *ctx) {
    nb_model_config c;
    tiny_config(&c);
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
    if (m) CHECK_OK(ctx, nb_model_init_random(ctx, m, 11, 0.3));
    return m;
}

/* NVFP4 W4A16 (dynamic, max) on every linear but lm_head; optionally NVFP4 inputs too. */
static nb_qmodel *make_student(nb_ctx *ctx, nb_model *sm, int w4a4) {
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, sm, &qm));
    if (!qm) return NULL;
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_NVFP4;
    if (w4a4) spec.input_format = NB_FMT_NVFP4;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        if (strcmp(name, "lm_head") == 0) CHECK_OK(ctx, nb_qmodel_exclude(ctx, qm, name, "lm_head"));
        else CHECK_OK(ctx, nb_qmodel_set(ctx, qm, name, &spec));
    }
    CHECK_OK(ctx, nb_qmodel_fuse_siblings(ctx, qm, NULL));
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    if (w4a4) {
        int32_t toks[2 * SEQ];
        for (int i = 0; i < 2 * SEQ; i++) toks[i] = (i * 7 + 3) % 96;
        CHECK_OK(ctx, nb_qmodel_calibrate_begin(ctx, qm, &cc));
        CHECK_OK(ctx, nb_model_forward(ctx, sm, toks, 2, SEQ, NULL));
        CHECK_OK(ctx, nb_qmodel_calibrate_end(ctx, qm));
    } else {
        CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    }
    return qm;
}

/* A token stream with some structure (so there is something to learn) and a mask that drops every
 * fifth target (an SFT-like mask). */
static nb_dataset *make_data(nb_ctx *ctx) {
    static int32_t ids[NTOK];
    static uint8_t mask[NTOK];
    nb_rng r;
    nb_rng_seed(&r, 5);
    for (int i = 0; i < NTOK; i++) {
        ids[i] = i % 3 == 0 ? (int32_t)(nb_rng_next(&r) % 96) : (ids[i - 1] * 5 + 1) % 96;
        mask[i] = i % 5 != 0;
    }
    nb_dataset *ds = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &ds));
    if (ds) CHECK_OK(ctx, nb_dataset_add_tokens(ctx, ds, ids, mask, NTOK));
    return ds;
}

static void qad_config(nb_qad_cfg *c) {
    nb_qad_cfg_init(c);
    c->steps = STEPS;
    c->lr = 3e-3;
    c->min_lr = 3e-4;
    c->warmup = 2;
    c->grad_accum = 2;
    c->clip = 0.5;
    c->weight_decay = 0.01;
}

/* Everything a run needs, built from scratch as a new process would. */
typedef struct {
    nb_model *teacher, *sm;
    nb_qmodel *qm;
    nb_dataset *ds;
    nb_dataloader *ld;
    nb_qad *q;
} session;

static void session_open(nb_ctx *ctx, session *S, const nb_qad_cfg *cfg) {
    memset(S, 0, sizeof *S);
    S->teacher = make_model(ctx);
    S->sm = make_model(ctx);
    S->qm = make_student(ctx, S->sm, 0);
    S->ds = make_data(ctx);
    nb_dataloader_cfg dc;
    nb_dataloader_cfg_init(&dc);
    dc.seq_len = SEQ;
    dc.batch = BATCH;
    dc.seed = 42;
    dc.random_offset = 1;
    dc.shuffle = 1;
    CHECK_OK(ctx, nb_dataloader_new(ctx, S->ds, &dc, &S->ld));
    CHECK_OK(ctx, nb_qad_new(ctx, cfg, S->teacher, S->qm, S->ld, &S->q));
}

static void session_close(session *S) {
    nb_qad_free(S->q);
    nb_dataloader_free(S->ld);
    nb_dataset_release(S->ds);
    nb_qmodel_free(S->qm);
    nb_model_free(S->sm);
    nb_model_free(S->teacher);
}

static void export_to(nb_ctx *ctx, session *S, const char *dir) {
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    CHECK_OK(ctx, nb_qmodel_export(ctx, S->qm, dir, &eo));
    char p[512];
    snprintf(p, sizeof p, "%s.student.safetensors", dir);
    CHECK_OK(ctx, nb_qmodel_save(ctx, S->qm, p));
}

static char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    *len = n;
    return b;
}

static int same_file(const char *a, const char *b) {
    long la = -1, lb = -2;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = x && y && la == lb && la >= 0 && memcmp(x, y, (size_t)la) == 0;
    free(x);
    free(y);
    return same;
}

/* Every file of export a equals the one in b, and so do the saved students. */
static int same_export(const char *a, const char *b) {
    DIR *d = opendir(a);
    if (!d) return 0;
    int ok = 1, n = 0;
    struct dirent *e;
    char pa[512], pb[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        if (!same_file(pa, pb)) {
            fprintf(stderr, "export files differ: %s %s\n", pa, pb);
            ok = 0;
        }
        n++;
    }
    closedir(d);
    snprintf(pa, sizeof pa, "%s.student.safetensors", a);
    snprintf(pb, sizeof pb, "%s.student.safetensors", b);
    if (!same_file(pa, pb)) {
        fprintf(stderr, "students differ: %s %s\n", pa, pb);
        ok = 0;
    }
    return ok && n >= 2;
}

static void run_to_end(nb_ctx *ctx, session *S, const char *ckdir, int every) {
    while (!nb_qad_done(S->q)) {
        nb_qad_metrics m;
        nb_status s = nb_qad_step(ctx, S->q, &m);
        CHECK_OK(ctx, s);
        if (s) return;
        if (ckdir && every > 0 && m.step % every == 0) CHECK_OK(ctx, nb_qad_save(ctx, S->q, ckdir, 2));
    }
}

/* ---- gradients: the chunked path equals the plain one ------------------------------------------------- */

static void grads_case(nb_ctx *ctx, const char *label, const nb_distill_cfg *lc, int use_mask) {
    nb_qad_cfg cfg;
    nb_qad_cfg_init(&cfg);
    cfg.loss = *lc;
    cfg.sft_mask = use_mask;
    nb_model *teacher = make_model(ctx), *sm = make_model(ctx);
    nb_qmodel *qm = make_student(ctx, sm, 0);
    nb_qad *q = NULL;
    CHECK_OK(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q));
    if (!q) return;
    const int64_t B = 3, N = B * SEQ, V = 96;
    int32_t toks[3 * SEQ], tg[3 * SEQ];
    uint8_t mask[3 * SEQ];
    for (int i = 0; i < N; i++) {
        toks[i] = (i * 13 + 5) % 96;
        tg[i] = (i * 29 + 1) % 96;
        mask[i] = (i % 4) != 1;
    }
    tg[7] = -100;   /* ignore_index too */
    nb_distill_result r;
    CHECK_OK(ctx, nb_qad_micro_step(ctx, q, toks, tg, mask, B, SEQ, 0.0, &r));
    int64_t np = nb_tensor_numel(nb_model_flat_grads(sm));
    float *g1 = malloc(sizeof(float) * (size_t)np);
    memcpy(g1, nb_tensor_data(nb_model_flat_grads(sm)), sizeof(float) * (size_t)np);
    nb_model_zero_grad(sm);

    /* the plain path: full teacher and student logits, nb_distill_loss, backward from dlogits */
    float *tl = malloc(sizeof(float) * (size_t)(N * V)), *sl = malloc(sizeof(float) * (size_t)(N * V));
    CHECK_OK(ctx, nb_model_logits(ctx, teacher, toks, B, SEQ, tl));
    nb_forward_opts fo = {0};
    fo.train = 1;
    fo.logits = sl;
    CHECK_OK(ctx, nb_model_forward(ctx, sm, toks, B, SEQ, &fo));
    int64_t mshape[2] = {N, V}, vshape[1] = {N};
    nb_tensor *ts = NULL, *tt = NULL, *tlab = NULL, *tw = NULL, *grad = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, mshape, sl, &ts));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, mshape, tl, &tt));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_I32, 1, vshape, tg, &tlab));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_U8, 1, vshape, mask, &tw));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, mshape, &grad));
    nb_distill_batch b = {0};
    b.student = ts;
    b.teacher = tt;
    b.labels = tlab;
    b.weights = use_mask ? tw : NULL;
    nb_distill_result r2;
    CHECK_OK(ctx, nb_distill_loss(ctx, lc, &b, grad, &r2));
    nb_backward_opts bo = {0};
    bo.dlogits = nb_tensor_data(grad);
    CHECK_OK(ctx, nb_model_backward(ctx, sm, &bo, NULL));
    const float *g2 = nb_tensor_data(nb_model_flat_grads(sm));
    double md = 0, mg = 0;
    for (int64_t i = 0; i < np; i++) {
        md = fmax(md, fabs((double)g1[i] - g2[i]));
        mg = fmax(mg, fabs((double)g2[i]));
    }
    CHECK_MSG(md <= 1e-6 * mg && mg > 0, "%s: gradients differ by %g (max %g)", label, md, mg);
    CHECK_NEAR(r.loss, r2.loss, 1e-9 * fabs(r2.loss));
    CHECK_NEAR(r.kd, r2.kd, 1e-9 * fabs(r2.kd) + 1e-15);
    CHECK_NEAR(r.lm, r2.lm, 1e-9 * fabs(r2.lm));
    CHECK_EQ_INT(r.tokens, r2.tokens);
    CHECK_EQ_INT(nb_qad_count_tokens(q, tg, mask, N), r2.tokens);
    printf("%s: loss %.6f kd %.6f ce %.6f tokens %lld, max grad diff %.3g of %.3g\n", label, r.loss, r.kd, r.lm,
           (long long)r.tokens, md, mg);
    nb_tensor_release(ts); nb_tensor_release(tt); nb_tensor_release(tlab); nb_tensor_release(tw);
    nb_tensor_release(grad);
    free(g1); free(tl); free(sl);
    nb_qad_free(q);
    nb_qmodel_free(qm);
    nb_model_free(sm);
    nb_model_free(teacher);
}

static void test_gradients(nb_ctx *ctx) {
    nb_distill_cfg c;
    nb_distill_cfg_init(&c);
    grads_case(ctx, "forward KL", &c, 0);
    nb_distill_cfg_init(&c);
    c.kd = NB_KD_REVERSE;
    c.temperature = 2.0;
    c.lm_loss = 1;
    c.kd_loss_scale = 0.5;
    grads_case(ctx, "reverse KL, T=2, lm_loss, mask", &c, 1);
    nb_distill_cfg_init(&c);
    c.top_k = 5;
    grads_case(ctx, "top-5 KL, mask", &c, 1);
}

/* Two micro-batches with the step's token count as denominator = one batch of both. */
static void test_accumulation(nb_ctx *ctx) {
    nb_qad_cfg cfg;
    nb_qad_cfg_init(&cfg);
    nb_model *teacher = make_model(ctx), *sm = make_model(ctx);
    nb_qmodel *qm = make_student(ctx, sm, 0);
    nb_qad *q = NULL;
    CHECK_OK(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q));
    if (!q) return;
    int32_t toks[4 * SEQ], tg[4 * SEQ];
    uint8_t mask[4 * SEQ];
    for (int i = 0; i < 4 * SEQ; i++) {
        toks[i] = (i * 17 + 2) % 96;
        tg[i] = (i * 31 + 4) % 96;
        mask[i] = i < 2 * SEQ ? (i % 3 != 0) : 1;   /* unequal counts in the two halves */
    }
    int64_t total = nb_qad_count_tokens(q, tg, mask, 4 * SEQ);
    nb_distill_result a, b, whole;
    CHECK_OK(ctx, nb_qad_micro_step(ctx, q, toks, tg, mask, 2, SEQ, (double)total, &a));
    CHECK_OK(ctx, nb_qad_micro_step(ctx, q, toks + 2 * SEQ, tg + 2 * SEQ, mask + 2 * SEQ, 2, SEQ, (double)total, &b));
    int64_t np = nb_tensor_numel(nb_model_flat_grads(sm));
    float *g1 = malloc(sizeof(float) * (size_t)np);
    memcpy(g1, nb_tensor_data(nb_model_flat_grads(sm)), sizeof(float) * (size_t)np);
    nb_model_zero_grad(sm);
    CHECK_OK(ctx, nb_qad_micro_step(ctx, q, toks, tg, mask, 4, SEQ, 0.0, &whole));
    const float *g2 = nb_tensor_data(nb_model_flat_grads(sm));
    double md = 0, mg = 0;
    for (int64_t i = 0; i < np; i++) {
        md = fmax(md, fabs((double)g1[i] - g2[i]));
        mg = fmax(mg, fabs((double)g2[i]));
    }
    CHECK_MSG(md <= 1e-5 * mg && mg > 0, "accumulated gradients differ by %g (max %g)", md, mg);
    CHECK_NEAR(a.loss + b.loss, whole.loss, 1e-6 * whole.loss);
    CHECK_EQ_INT(a.tokens + b.tokens, whole.tokens);
    CHECK_EQ_INT(whole.tokens, total);
    free(g1);
    nb_qad_free(q);
    nb_qmodel_free(qm);
    nb_model_free(sm);
    nb_model_free(teacher);
}

/* ---- training: loss goes down, scales frozen, recalibrate, metrics ------------------------------------ */

/* 8 chunks of held-out tokens, and eval options that score them as they are */
static void held_out(int32_t *toks, nb_eval_opts *eo) {
    for (int i = 0; i < 8 * SEQ; i++) toks[i] = (i * 37 + 11) % 96;
    *eo = (nb_eval_opts){0};
    eo->n_ctx = SEQ;
    eo->bos = -2;
}

static double held_out_kld(nb_ctx *ctx, session *S) {
    int32_t toks[8 * SEQ];
    nb_eval_opts eo;
    held_out(toks, &eo);
    nb_eval_result r;
    CHECK_OK(ctx, nb_model_eval(ctx, S->sm, S->teacher, toks, 8 * SEQ, &eo, &r));
    return r.kld_mean;
}

/* The eval's progress callback: after each forward batch, with the chunks done and the total; the numbers
 * are those of an eval without it; a failing callback stops the eval with its status and message. */
typedef struct { int calls; int64_t done[8], total[8]; int fail_at; } progress_log;
static nb_status on_chunks(nb_ctx *ctx, void *user, int64_t done, int64_t total) {
    progress_log *p = user;
    if (p->calls < 8) p->done[p->calls] = done, p->total[p->calls] = total;
    if (++p->calls == p->fail_at) return nb_fail(ctx, NB_ERR_INTERRUPTED, "stopped by the progress callback");
    return NB_OK;
}

static void test_eval_progress(nb_ctx *ctx, session *S) {
    int32_t toks[8 * SEQ];
    nb_eval_opts eo;
    held_out(toks, &eo);
    eo.batch = 3;
    nb_eval_result plain, r;
    CHECK_OK(ctx, nb_model_eval(ctx, S->sm, S->teacher, toks, 8 * SEQ, &eo, &plain));
    progress_log p = {0};
    eo.on_chunks = on_chunks;
    eo.user = &p;
    CHECK_OK(ctx, nb_model_eval(ctx, S->sm, S->teacher, toks, 8 * SEQ, &eo, &r));
    CHECK_EQ_INT(p.calls, 3);   /* 8 chunks in batches of 3: 3, 6, 8 */
    CHECK_EQ_INT(p.done[0], 3);
    CHECK_EQ_INT(p.done[1], 6);
    CHECK_EQ_INT(p.done[2], 8);
    CHECK_EQ_INT(p.total[0], 8);
    CHECK_EQ_INT(p.total[2], 8);
    CHECK(r.nll == plain.nll && r.kld_mean == plain.kld_mean && r.top1_agree == plain.top1_agree);
    progress_log stop = {.fail_at = 2};
    eo.user = &stop;
    CHECK_FAIL(ctx, nb_model_eval(ctx, S->sm, S->teacher, toks, 8 * SEQ, &eo, &r), NB_ERR_INTERRUPTED,
               "stopped by the progress callback");
    CHECK_EQ_INT(stop.calls, 2);
}

static float weight_amax(nb_ctx *ctx, session *S, const char *module) {
    float a = -1;
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, nb_qmodel_weight_quantizer(S->qm, nb_qmodel_find(S->qm, module)), &a));
    return a;
}

static float max_abs_weight(session *S, const char *param) {
    nb_tensor *w = nb_model_param(S->sm, nb_model_find_param(S->sm, param));
    const float *d = nb_tensor_data(w);
    float m = 0;
    for (int64_t i = 0; i < nb_tensor_numel(w); i++) m = fmaxf(m, fabsf(d[i]));
    return m;
}

static void test_training(nb_ctx *ctx) {
    nb_qad_cfg cfg;
    qad_config(&cfg);
    cfg.steps = 30;
    cfg.lr = 1e-3;
    cfg.min_lr = cfg.lr / 10;
    session S;
    session_open(ctx, &S, &cfg);
    if (!S.q) return;
    const char *mod = "model.layers.1.mlp.down_proj";
    float amax0 = weight_amax(ctx, &S, mod);
    CHECK(amax0 == max_abs_weight(&S, "model.layers.1.mlp.down_proj.weight"));
    double k0 = held_out_kld(ctx, &S);
    test_eval_progress(ctx, &S);
    double first = 0, last = 0;
    nb_qad_metrics m;
    for (int i = 0; i < 30; i++) {
        CHECK_OK(ctx, nb_qad_step(ctx, S.q, &m));
        if (i < 3) first += m.kd / 3;
        if (i >= 27) last += m.kd / 3;
        if (i == 0) {
            CHECK_EQ_INT(m.step, 1);
            CHECK(m.lr == 0.0);   /* warmup starts at 0 */
            CHECK(m.grad_norm > 0 && isfinite(m.grad_norm));
            CHECK(m.seen == 2 * BATCH * SEQ);
            CHECK(m.tokens > 0 && m.tokens < m.seen);   /* the mask drops some */
            CHECK(m.tokens_per_s > 0);
            CHECK(m.ce > 0 && m.kd > 0);
            CHECK_NEAR(m.loss, m.kd, 1e-12);   /* KD only by default */
        }
        if (i == 1) CHECK_NEAR(m.lr, cfg.lr * 1 / 2, 1e-15);
        if (i == 2) CHECK_NEAR(m.lr, cfg.lr, 1e-15);
    }
    CHECK_EQ_INT(nb_qad_step_count(S.q), 30);
    CHECK(nb_qad_done(S.q));
    CHECK_NEAR(m.lr, nb_qad_lr_at(S.q, 29), 0);
    double k1 = held_out_kld(ctx, &S);
    printf("training: train KD %.5f -> %.5f, held-out KLD %.5f -> %.5f\n", first, last, k0, k1);
    CHECK_MSG(last < 0.8 * first, "train KD did not drop: %g -> %g", first, last);
    CHECK_MSG(k1 < 0.85 * k0, "held-out KLD did not drop: %g -> %g", k0, k1);
    /* frozen scales: the per-tensor amax is still the calibrated one, though the weights moved */
    CHECK(weight_amax(ctx, &S, mod) == amax0);
    CHECK(max_abs_weight(&S, "model.layers.1.mlp.down_proj.weight") != amax0);
    session_close(&S);

    /* recalibrate every 2 steps: after an even step the amax is the new weights' max */
    qad_config(&cfg);
    cfg.recalibrate = 2;
    session_open(ctx, &S, &cfg);
    if (!S.q) return;
    CHECK_OK(ctx, nb_qad_step(ctx, S.q, &m));
    CHECK(!m.recalibrated);
    CHECK(weight_amax(ctx, &S, mod) == amax0);
    CHECK_OK(ctx, nb_qad_step(ctx, S.q, &m));
    CHECK(m.recalibrated);
    CHECK(weight_amax(ctx, &S, mod) == max_abs_weight(&S, "model.layers.1.mlp.down_proj.weight"));
    CHECK(weight_amax(ctx, &S, mod) != amax0);
    session_close(&S);
}

/* lr_scale_unquantized: the parameters no weight quantizer covers (embeddings, norms, the excluded
 * lm_head) take lr * scale. AdamW's first step moves an element by lr * g / (|g| + eps), i.e. by ~lr
 * where |g| >> eps, so the largest move per parameter tells its lr; scale 0 freezes them. */
static int is_quantized_weight(session *S, int64_t p) {
    for (int64_t i = 0; i < nb_qmodel_count(S->qm); i++) {
        if (!nb_qmodel_weight_quantizer(S->qm, i)) continue;
        char name[160];
        snprintf(name, sizeof name, "%s.weight", nb_qmodel_name(S->qm, i));
        if (strcmp(name, nb_model_param_name(S->sm, p)) == 0) return 1;
    }
    return 0;
}

static void test_lr_groups(nb_ctx *ctx) {
    static const double scales[3] = {1.0, 3.0, 0.0};
    for (int k = 0; k < 3; k++) {
        nb_qad_cfg cfg;
        qad_config(&cfg);
        cfg.warmup = 0;
        cfg.weight_decay = 0.0;
        cfg.clip = 0.0;
        cfg.lr = 1e-3;
        cfg.lr_scale_unquantized = scales[k];
        session S;
        session_open(ctx, &S, &cfg);
        if (!S.q) return;
        const int64_t np = nb_model_param_count(S.sm);
        float **before = calloc((size_t)np, sizeof *before);
        for (int64_t p = 0; p < np; p++) {
            nb_tensor *t = nb_model_param(S.sm, p);
            before[p] = malloc((size_t)nb_tensor_numel(t) * sizeof(float));
            memcpy(before[p], nb_tensor_data(t), (size_t)nb_tensor_numel(t) * sizeof(float));
        }
        nb_qad_metrics m;
        CHECK_OK(ctx, nb_qad_step(ctx, S.q, &m));
        CHECK(m.lr == cfg.lr);
        int nq = 0, nu = 0;
        for (int64_t p = 0; p < np; p++) {
            nb_tensor *t = nb_model_param(S.sm, p);
            const float *d = nb_tensor_data(t);
            float moved = 0;
            for (int64_t i = 0; i < nb_tensor_numel(t); i++) moved = fmaxf(moved, fabsf(d[i] - before[p][i]));
            const int q = is_quantized_weight(&S, p);
            const double want = q ? cfg.lr : cfg.lr * scales[k];
            nq += q;
            nu += !q;
            CHECK_MSG(fabs(moved - want) <= 0.02 * cfg.lr, "scale %g: %s (%s) moved by %g, want ~%g", scales[k],
                      nb_model_param_name(S.sm, p), q ? "quantized" : "unquantized", (double)moved, want);
            free(before[p]);
        }
        free(before);
        /* 2 layers x 7 linears; embeddings, 2 x 2 norms, the final norm and the excluded lm_head */
        CHECK_MSG(nq == 14 && nu == 7, "%d quantized, %d unquantized", nq, nu);
        session_close(&S);
    }
    nb_qad_cfg cfg;
    qad_config(&cfg);
    cfg.lr_scale_unquantized = -1;
    nb_model *teacher = make_model(ctx), *sm = make_model(ctx);
    nb_qmodel *qm = make_student(ctx, sm, 0);
    nb_qad *q = NULL;
    CHECK_FAIL(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q), NB_ERR_INVALID, "lr_scale_unquantized must be a finite number >= 0");
    nb_qmodel_free(qm);
    nb_model_free(sm);
    nb_model_free(teacher);
}

/* ---- determinism and resume --------------------------------------------------------------------- */

static void test_resume_flag(nb_ctx *ctx, const char *ref) {
    nb_qad_cfg cfg;
    qad_config(&cfg);
    char ck[512], out[512];
    snprintf(ck, sizeof ck, "%s/ck_flag", tmpdir);
    snprintf(out, sizeof out, "%s/export_flag", tmpdir);
    /* run 5 steps, then Ctrl-C: the step fails, nothing moved, a checkpoint is written */
    session S;
    session_open(ctx, &S, &cfg);
    if (!S.q) return;
    nb_qad_metrics m;
    for (int i = 0; i < 5; i++) CHECK_OK(ctx, nb_qad_step(ctx, S.q, &m));
    nb_ctx_interrupt(ctx);
    CHECK_FAIL(ctx, nb_qad_step(ctx, S.q, &m), NB_ERR_INTERRUPTED, "interrupted");
    CHECK_EQ_INT(nb_qad_step_count(S.q), 5);
    nb_ctx_clear_interrupt(ctx);
    CHECK_OK(ctx, nb_qad_save(ctx, S.q, ck, 2));
    session_close(&S);
    /* a new process: resume and finish */
    session_open(ctx, &S, &cfg);
    if (!S.q) return;
    CHECK_OK(ctx, nb_qad_restore(ctx, S.q, ck));
    CHECK_EQ_INT(nb_qad_step_count(S.q), 5);
    run_to_end(ctx, &S, ck, 4);
    export_to(ctx, &S, out);
    session_close(&S);
    CHECK_MSG(same_export(ref, out), "resumed (ctx interrupt) export differs from the uninterrupted one");

    /* latest names the newest checkpoint; only `keep` = 2 remain */
    char name[512];
    CHECK_OK(ctx, nb_qad_latest(ctx, ck, name, sizeof name));
    CHECK(strstr(name, "step-00000012") != NULL);
    int n = 0;
    DIR *d = opendir(ck);
    struct dirent *e;
    while (d && (e = readdir(d))) n += strncmp(e->d_name, "step-", 5) == 0;
    if (d) closedir(d);
    CHECK_EQ_INT(n, 2);

    /* settings must match */
    cfg.lr = 1e-3;
    session_open(ctx, &S, &cfg);
    CHECK_FAIL(ctx, nb_qad_restore(ctx, S.q, ck), NB_ERR_INVALID, "lr: the checkpoint has 0.0030000000000000001, this run 0.001");
    session_close(&S);
    qad_config(&cfg);
    cfg.steps = 20;
    session_open(ctx, &S, &cfg);
    CHECK_FAIL(ctx, nb_qad_restore(ctx, S.q, ck), NB_ERR_INVALID, "steps: the checkpoint has 12, this run 20");
    session_close(&S);
    qad_config(&cfg);
    cfg.lr_scale_unquantized = 2;   /* a setting the checkpoint's (default) settings do not list */
    session_open(ctx, &S, &cfg);
    CHECK_FAIL(ctx, nb_qad_restore(ctx, S.q, ck), NB_ERR_INVALID, "lr_scale_unquantized=2");
    char empty[512];
    snprintf(empty, sizeof empty, "%s/no_ckpt", tmpdir);
    CHECK_FAIL(ctx, nb_qad_restore(ctx, S.q, empty), NB_ERR_NOT_FOUND, "no QAD checkpoint");
    session_close(&S);
    /* the same settings compared before any run exists (nb_qad_check_settings: what a preflight asks);
     * the count of trained parameters is left to the restore */
    qad_config(&cfg);
    CHECK_OK(ctx, nb_qad_check_settings(ctx, &cfg, ck));
    cfg.lr = 1e-3;
    CHECK_FAIL(ctx, nb_qad_check_settings(ctx, &cfg, ck), NB_ERR_INVALID,
               "the run's settings changed (lr: the checkpoint has 0.0030000000000000001, this run 0.001)");
    qad_config(&cfg);
    cfg.loss.kd = NB_KD_REVERSE;
    CHECK_FAIL(ctx, nb_qad_check_settings(ctx, &cfg, ck), NB_ERR_INVALID, "kd: the checkpoint has 1, this run 2");
    qad_config(&cfg);
    cfg.lr_scale_unquantized = 2;
    CHECK_FAIL(ctx, nb_qad_check_settings(ctx, &cfg, ck), NB_ERR_INVALID, "lr_scale_unquantized=2");
    qad_config(&cfg);
    CHECK_FAIL(ctx, nb_qad_check_settings(ctx, &cfg, empty), NB_ERR_NOT_FOUND, "no QAD checkpoint");

    /* hostile metadata: a step folder given directly (no manifest to verify) whose files say things a
     * lax parser (atoi, valueint) would take: each refused in one line naming file and field */
    {
        char bad[512], src[700], tr[700], stu[700], want2[1400];
        snprintf(bad, sizeof bad, "%s/ck_bad", tmpdir);
        CHECK(mkdir(bad, 0755) == 0);
        snprintf(tr, sizeof tr, "%s/trainer.safetensors", bad);
        snprintf(stu, sizeof stu, "%s/student.safetensors", bad);
        static const struct { const char *file, *from, *to, *field; nb_status code; } cases[] = {
            {"trainer", "\"nibble_qad\":\"1\"", "\"nibble_qad\":\"1x\"", "QAD checkpoint version 1x, this nibble reads 1",
             NB_ERR_UNSUPPORTED},
            {"trainer", "\"nibble_qad\":\"1\"", "\"nibble_qad\":\"4294967297\"",
             "QAD checkpoint version 4294967297, this nibble reads 1", NB_ERR_UNSUPPORTED},
            {"trainer", "\"step\":\"12\"", "\"step\":\"12abc\"", "step metadata '12abc' is not a step number",
             NB_ERR_FORMAT},
            {"trainer", "\"step\":\"12\"", "\"step\":\"-12\"", "step metadata '-12' is not a step number", NB_ERR_FORMAT},
            {"student", "\"nibble_checkpoint\":\"1\"", "\"nibble_checkpoint\":\" 1\"",
             "checkpoint version  1, this nibble reads 1", NB_ERR_UNSUPPORTED},
            {"student", "\\\"mx_floor\\\":0", "\\\"mx_floor\\\":1e36",
             "specs metadata: model.layers.0.self_attn.q_proj.mx_floor is not an integer in [0, 1]", NB_ERR_FORMAT},
            {"student", "\\\"weight_format\\\":", "\\\"weight_format\\\":4294967297,\\\"x\\\":",
             "specs metadata: model.layers.0.self_attn.q_proj.weight_format is not an integer in [0, 5]", NB_ERR_FORMAT},
            {"student", "\\\"pass_through_bwd\\\":1", "\\\"pass_through_bwd\\\":0.5",
             "specs metadata: model.layers.0.self_attn.q_proj.pass_through_bwd is not an integer in [0, 1]", NB_ERR_FORMAT},
        };
        cfg.lr_scale_unquantized = 1;
        session_open(ctx, &S, &cfg);
        for (size_t c = 0; S.q && c < sizeof cases / sizeof *cases; c++) {
            int tr_bad = cases[c].file[0] == 't';
            snprintf(src, sizeof src, "%s/step-00000012/trainer.safetensors", ck);
            CHECK(nbt_st_header_replace(src, tr, tr_bad ? cases[c].from : "\"", tr_bad ? cases[c].to : "\"") == 0);
            snprintf(src, sizeof src, "%s/step-00000012/student.safetensors", ck);
            CHECK(nbt_st_header_replace(src, stu, tr_bad ? "\"" : cases[c].from, tr_bad ? "\"" : cases[c].to) == 0);
            snprintf(want2, sizeof want2, "%s/%s.safetensors: %s", bad, cases[c].file, cases[c].field);
            CHECK_EQ_INT(nb_qad_restore(ctx, S.q, bad), cases[c].code);
            CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want2), "case %zu: got \"%s\"", c, nb_ctx_last_error(ctx));
        }
        /* the same copies untouched resume (the rewriting itself breaks nothing) */
        snprintf(src, sizeof src, "%s/step-00000012/trainer.safetensors", ck);
        CHECK(nbt_st_header_replace(src, tr, "\"", "\"") == 0);
        snprintf(src, sizeof src, "%s/step-00000012/student.safetensors", ck);
        CHECK(nbt_st_header_replace(src, stu, "\"", "\"") == 0);
        CHECK_OK(ctx, nb_qad_restore(ctx, S.q, bad));
        CHECK_EQ_INT(nb_qad_step_count(S.q), 12);
        session_close(&S);
    }

    /* a kill between step-12's rename and the `latest` update: latest still names step-8, and the
     * resume takes step-12 all the same (its manifest verifies it) */
    char p[700], want[700];
    snprintf(p, sizeof p, "%s/latest", ck);
    FILE *f = fopen(p, "wb");
    CHECK(f && fputs("step-00000008\n", f) >= 0);
    if (f) fclose(f);
    snprintf(want, sizeof want, "%s/step-00000012", ck);
    CHECK_OK(ctx, nb_qad_latest(ctx, ck, name, sizeof name));
    CHECK_MSG(!strcmp(name, want), "latest: %s", name);
    /* a step folder its manifest does not verify (a file cut short) is passed over for the one before */
    snprintf(p, sizeof p, "%s/step-00000012/trainer.safetensors", ck);
    CHECK(truncate(p, 1000) == 0);
    snprintf(want, sizeof want, "%s/step-00000008", ck);
    CHECK_OK(ctx, nb_qad_latest(ctx, ck, name, sizeof name));
    CHECK_MSG(!strcmp(name, want), "latest: %s", name);
    snprintf(p, sizeof p, "%s/step-00000008/student.safetensors", ck);
    CHECK(truncate(p, 1000) == 0);
    snprintf(want, sizeof want, "no complete QAD checkpoint in %s (2 step folder(s), none verified by its manifest.json)", ck);
    CHECK_FAIL(ctx, nb_qad_latest(ctx, ck, name, sizeof name), NB_ERR_NOT_FOUND, want);

    /* one run per checkpoint folder: a second lock (another open file, as another process has) is refused */
    nb_qad_lock *l1 = NULL, *l2 = NULL;
    CHECK_OK(ctx, nb_qad_lock_dir(ctx, ck, &l1));
    snprintf(want, sizeof want, "qad: checkpoint_dir: %s is in use by another nibble process (pid %ld): wait for it to "
             "finish or give another checkpoint_dir", ck, (long)getpid());
    CHECK_EQ_INT(nb_qad_lock_dir(ctx, ck, &l2), NB_ERR_IO);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"", nb_ctx_last_error(ctx));
    CHECK(l2 == NULL);
    nb_qad_unlock_dir(l1);
    snprintf(p, sizeof p, "%s.nibble-lock", ck);
    CHECK(access(p, F_OK) != 0);   /* released: the lock file goes */
    CHECK_OK(ctx, nb_qad_lock_dir(ctx, ck, &l2));
    nb_qad_unlock_dir(l2);
}


/* The child: a whole run that checkpoints every step, resumed from CK when it holds a checkpoint (killed
 * at some moment by the parent). With OUT (tests/crash/crash_points.sh's run, killed at each file-system
 * call of one save, then run again) it exports there at the end: the bytes of a run never killed. */
static int child_main(const char *ck, const char *out) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 2;
    nb_qad_cfg cfg;
    qad_config(&cfg);
    session S;
    session_open(ctx, &S, &cfg);
    if (!S.q) return 3;
    char name[512];
    if (nb_qad_latest(ctx, ck, name, sizeof name) == NB_OK) CHECK_OK(ctx, nb_qad_restore(ctx, S.q, ck));
    else nb_ctx_clear_error(ctx);
    printf("resumed from step %lld\n", (long long)nb_qad_step_count(S.q));
    run_to_end(ctx, &S, ck, 1);
    if (out) export_to(ctx, &S, out);
    session_close(&S);
    nb_ctx_release(ctx);
    return nbt_failures ? 1 : 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Step of the checkpoint dir/latest names (-1 when none yet). */
static long latest_step(const char *ck) {
    char p[600], buf[64] = {0};
    snprintf(p, sizeof p, "%s/latest", ck);
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strncmp(buf, "step-", 5) == 0 ? strtol(buf + 5, NULL, 10) : -1;
}

/* A child process runs the whole thing, checkpointing every step; once its checkpoint of a random step k
 * appears, it gets SIGKILL after a random 0-8 ms (mid-step, mid-save, anywhere). */
static void test_resume_kill(nb_ctx *ctx, const char *ref) {
    nb_qad_cfg cfg;
    qad_config(&cfg);
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    srand(seed);
    for (int trial = 0; trial < 3; trial++) {
        char ck[512], out[512];
        snprintf(ck, sizeof ck, "%s/ck_kill%d", tmpdir, trial);
        snprintf(out, sizeof out, "%s/export_kill%d", tmpdir, trial);
        long k = 1 + rand() % (STEPS - 2);
        long extra_us = rand() % 8000;
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", "test_qad", "--child", ck, (char *)NULL);
            _exit(127);
        }
        CHECK(pid > 0);
        int status = 0, done = 0;
        double t0 = now_s();
        while (latest_step(ck) < k && now_s() - t0 < 60) {
            if (waitpid(pid, &status, WNOHANG) == pid) { done = 1; break; }
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        struct timespec ts = {0, extra_us * 1000};
        nanosleep(&ts, NULL);
        if (!done) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
        session S;
        session_open(ctx, &S, &cfg);
        if (!S.q) return;
        char name[512];
        nb_status s = nb_qad_latest(ctx, ck, name, sizeof name);
        if (s == NB_OK) CHECK_OK(ctx, nb_qad_restore(ctx, S.q, ck));
        else nb_ctx_clear_error(ctx);
        int64_t from = nb_qad_step_count(S.q);
        run_to_end(ctx, &S, ck, 1);
        export_to(ctx, &S, out);
        session_close(&S);
        printf("kill trial %d (seed %u): SIGKILL %.1f ms after the step-%ld checkpoint, %s, resumed from step %lld\n",
               trial, seed, extra_us / 1000.0, k, WIFSIGNALED(status) ? "killed" : "it had finished", (long long)from);
        CHECK(from >= k);
        if (WIFSIGNALED(status)) CHECK(from < STEPS);   /* a fast machine may finish before the signal */
        CHECK_MSG(same_export(ref, out), "trial %d: resumed export differs from the uninterrupted one", trial);
    }
}

static void test_determinism(nb_ctx *ctx, char *ref) {
    nb_qad_cfg cfg;
    qad_config(&cfg);
    char ck[512], other[512];
    snprintf(ref, 512, "%s/export_ref", tmpdir);
    snprintf(other, sizeof other, "%s/export_again", tmpdir);
    snprintf(ck, sizeof ck, "%s/ck_timing", tmpdir);
    session S;
    session_open(ctx, &S, &cfg);
    if (!S.q) return;
    run_to_end(ctx, &S, NULL, 0);
    export_to(ctx, &S, ref);
    session_close(&S);
    /* same run again (and checkpointing every step, which must not change anything) */
    session_open(ctx, &S, &cfg);
    if (!S.q) return;
    run_to_end(ctx, &S, ck, 1);
    export_to(ctx, &S, other);
    session_close(&S);
    CHECK_MSG(same_export(ref, other), "two runs with the same seed differ");
}

/* ---- errors ------------------------------------------------------------------------------------ */

static void test_errors(nb_ctx *ctx) {
    nb_qad_cfg cfg;
    nb_qad_cfg_init(&cfg);
    nb_model *teacher = make_model(ctx), *sm = make_model(ctx);
    nb_qmodel *qm = make_student(ctx, sm, 1);
    nb_qad *q = NULL;
    CHECK_FAIL(ctx, nb_qad_new(ctx, &cfg, sm, qm, NULL, &q), NB_ERR_INVALID, "the teacher must be a separate model");
    cfg.recalibrate = 5;
    CHECK_FAIL(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q), NB_ERR_UNSUPPORTED,
               "recalibrate works for weight-only students; model.layers.0.self_attn.q_proj has an input quantizer");
    nb_qad_cfg_init(&cfg);
    cfg.min_lr = 1.0;
    CHECK_FAIL(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q), NB_ERR_INVALID, "min_lr 1 is larger than lr 1e-05");
    nb_qad_cfg_init(&cfg);
    cfg.steps = 0;
    CHECK_FAIL(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q), NB_ERR_INVALID, "steps must be > 0");
    nb_qad_cfg_init(&cfg);
    CHECK_OK(ctx, nb_qad_new(ctx, &cfg, teacher, qm, NULL, &q));
    nb_qad_metrics m;
    CHECK_FAIL(ctx, nb_qad_step(ctx, q, &m), NB_ERR_INVALID, "no dataloader");
    /* W4A4 students train too (input fake quant in the forward, straight-through backward) */
    int32_t toks[SEQ], tg[SEQ];
    for (int i = 0; i < SEQ; i++) { toks[i] = i * 3 % 96; tg[i] = (i * 3 + 3) % 96; }
    nb_distill_result r;
    CHECK_OK(ctx, nb_qad_micro_step(ctx, q, toks, tg, NULL, 1, SEQ, 0.0, &r));
    CHECK(r.kd > 0 && r.tokens == SEQ);
    CHECK_OK(ctx, nb_qad_optimizer_step(ctx, q, &m));
    CHECK_EQ_INT(m.step, 1);
    toks[3] = 96;
    CHECK_FAIL(ctx, nb_qad_micro_step(ctx, q, toks, tg, NULL, 1, SEQ, 0.0, &r), NB_ERR_INVALID, "outside the vocabulary");
    nb_qad_free(q);
    /* an uncalibrated student is refused, naming the quantizer */
    nb_qmodel *raw = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, sm, &raw));
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_NVFP4;
    CHECK_OK(ctx, nb_qmodel_set(ctx, raw, "model.layers.0.mlp.up_proj", &spec));
    nb_qad_cfg_init(&cfg);
    CHECK_FAIL(ctx, nb_qad_new(ctx, &cfg, teacher, raw, NULL, &q), NB_ERR_UNCALIBRATED, "model.layers.0.mlp.up_proj");
    nb_qmodel_free(raw);
    nb_qmodel_free(qm);
    nb_model_free(sm);
    nb_model_free(teacher);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_main(argv[2], NULL);
    if (argc == 4 && strcmp(argv[1], "--crash-run") == 0) return child_main(argv[2], argv[3]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_qad_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    test_gradients(ctx);
    test_accumulation(ctx);
    test_training(ctx);
    test_lr_groups(ctx);
    char ref[512];
    test_determinism(ctx, ref);
    test_resume_flag(ctx, ref);
    test_resume_kill(ctx, ref);
    test_errors(ctx);
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (nbt_failures == 0 && system(cmd) != 0) return 1;
    return nbt_done("test_qad");
}

/* QAD on stories260K (skips without ../shared/data): NVFP4 W4A16 (max) PTQ, then a short QAD on
 * TinyStories train text lowers the held-out KLD to the teacher and the PPL; the calibrated per-tensor
 * scales stay frozen while the weights move (re-deriving them from the final weights would give other
 * values); the ModelOpt export writes exactly those trained scales (weight_scale_2); and the student's
 * fake-quant logits equal, bit for bit, the logits of its exported checkpoint read back by nb_model_load. */
#include "nbtest.h"
#include <unistd.h>

static char tmpdir[256];

typedef struct {
    nb_model *teacher, *sm;
    nb_qmodel *qm;
} models;

static void setup(nb_ctx *ctx, const char *hf, models *M) {
    memset(M, 0, sizeof *M);
    CHECK_OK(ctx, nb_model_load(ctx, hf, &M->teacher));
    CHECK_OK(ctx, nb_model_load(ctx, hf, &M->sm));
    if (!M->teacher || !M->sm) return;
    CHECK_OK(ctx, nb_qmodel_new(ctx, M->sm, &M->qm));
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_NVFP4;
    for (int64_t i = 0; i < nb_qmodel_count(M->qm); i++) {
        const char *name = nb_qmodel_name(M->qm, i);
        if (strstr(name, "down_proj")) CHECK_OK(ctx, nb_qmodel_exclude(ctx, M->qm, name, "172 inputs"));
        else if (strcmp(name, "lm_head") == 0) CHECK_OK(ctx, nb_qmodel_exclude(ctx, M->qm, name, "tied"));
        else CHECK_OK(ctx, nb_qmodel_set(ctx, M->qm, name, &spec));
    }
    CHECK_OK(ctx, nb_qmodel_fuse_siblings(ctx, M->qm, NULL));
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, M->qm, &cc));
}

static nb_eval_result evaluate(nb_ctx *ctx, models *M, const nb_tokens *t) {
    nb_eval_opts eo = {0};
    eo.n_ctx = 128;
    eo.n_chunks = 24;
    eo.bos = -1;
    nb_eval_result r;
    memset(&r, 0, sizeof r);
    CHECK_OK(ctx, nb_model_eval(ctx, M->sm, M->teacher, t->ids, t->n, &eo, &r));
    return r;
}

static float f32_at(nb_ctx *ctx, nb_st *st, const char *name) {
    nb_tensor *t = NULL;
    if (nb_st_get(ctx, st, name, &t) != NB_OK) return -1.0f;
    float v = *(const float *)nb_tensor_data(t);
    nb_tensor_release(t);
    return v;
}

int main(void) {
    const char *train = nbt_data("text/tinystories_train_head_2MiB.txt");
    const char *valid = nbt_data("text/tinystories_valid_head_776KiB.txt");
    char hfdir[4096];
    snprintf(hfdir, sizeof hfdir, "%s", nbt_data("stories260K/hf/config.json"));
    *strrchr(hfdir, '/') = 0;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_qad_stories_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;

    models M;
    setup(ctx, hfdir, &M);
    if (!M.qm) return nbt_done("test_qad_stories");
    int64_t nq = nb_qmodel_count(M.qm);
    float *s0 = calloc((size_t)nq, sizeof(float));
    for (int64_t i = 0; i < nq; i++) {
        nb_quantizer *wq = nb_qmodel_weight_quantizer(M.qm, i);
        if (wq) CHECK_OK(ctx, nb_quantizer_scale(ctx, wq, &s0[i]));
    }

    nb_tokenizer *tok = NULL;
    CHECK_OK(ctx, nb_tokenizer_load(ctx, hfdir, &tok));
    nb_data_opts dopt;
    nb_data_opts_init(&dopt);
    dopt.separator = "<|endoftext|>";
    dopt.max_tokens = 80000;
    nb_dataset *ds = NULL;
    CHECK_OK(ctx, nb_dataset_load(ctx, tok, train, &dopt, &ds));
    nb_dataloader_cfg lc;
    nb_dataloader_cfg_init(&lc);
    lc.seq_len = 128;
    lc.batch = 4;
    lc.seed = 1;
    lc.random_offset = 1;
    lc.shuffle = 1;
    lc.drop_last = 1;
    nb_dataloader *ld = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &lc, &ld));

    /* held-out text: the start of the validation split */
    FILE *f = fopen(valid, "rb");
    char *text = malloc(120000);
    size_t tn = f ? fread(text, 1, 120000, f) : 0;
    if (f) fclose(f);
    nb_tokens ev = {0};
    CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, text, (int64_t)tn, 0, &ev));
    free(text);

    nb_qad_cfg cfg;
    nb_qad_cfg_init(&cfg);
    cfg.steps = 40;
    cfg.lr = 3e-4;
    cfg.min_lr = 3e-5;
    cfg.warmup = 2;
    nb_qad *q = NULL;
    CHECK_OK(ctx, nb_qad_new(ctx, &cfg, M.teacher, M.qm, ld, &q));
    if (!q) return nbt_done("test_qad_stories");
    nb_eval_result before = evaluate(ctx, &M, &ev);
    double kd_first = 0;
    nb_qad_metrics m;
    while (!nb_qad_done(q)) {
        CHECK_OK(ctx, nb_qad_step(ctx, q, &m));
        if (m.step == 1) kd_first = m.kd;
    }
    nb_eval_result after = evaluate(ctx, &M, &ev);
    printf("stories260K W4A16 QAD, 40 steps of 4x128: train KD %.4f -> %.4f; held-out PPL %.4f -> %.4f, "
           "KLD %.5f -> %.5f, top-1 %.2f%% -> %.2f%%\n", kd_first, m.kd, before.ppl, after.ppl, before.kld_mean,
           after.kld_mean, before.top1_agree, after.top1_agree);
    CHECK_MSG(after.kld_mean < 0.8 * before.kld_mean, "KLD %g -> %g", before.kld_mean, after.kld_mean);
    CHECK_MSG(after.ppl < before.ppl, "PPL %g -> %g", before.ppl, after.ppl);
    CHECK(after.top1_agree > before.top1_agree);

    /* frozen: every per-tensor scale is the calibrated one; the final weights would give others */
    int moved = 0;
    for (int64_t i = 0; i < nq; i++) {
        nb_quantizer *wq = nb_qmodel_weight_quantizer(M.qm, i);
        if (!wq) continue;
        float s = -1;
        CHECK_OK(ctx, nb_quantizer_scale(ctx, wq, &s));
        CHECK_MSG(s == s0[i], "%s: scale %.9g changed from %.9g", nb_qmodel_name(M.qm, i), s, s0[i]);
    }
    for (int64_t i = 0; i < nq; i++) {
        if (!nb_qmodel_weight_quantizer(M.qm, i)) continue;
        char pname[512];
        snprintf(pname, sizeof pname, "%s.weight", nb_qmodel_name(M.qm, i));
        nb_tensor *w = nb_model_param(M.sm, nb_model_find_param(M.sm, pname));
        const float *d = nb_tensor_data(w);
        float amax = 0;
        for (int64_t k = 0; k < nb_tensor_numel(w); k++) amax = fmaxf(amax, fabsf(d[k]));
        moved += nb_nvfp4_scale2(amax, 448.0f) != s0[i];
    }
    printf("%d of the quantized modules' own max|w| would now give another weight_scale_2\n", moved);
    CHECK(moved > 0);

    /* the export writes the trained scales, and reads back to the same logits */
    char out[512], name[600];
    snprintf(out, sizeof out, "%s/export", tmpdir);
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.dtype = NB_F32;   /* the trained unquantized tensors as the student holds them (default: BF16) */
    CHECK_OK(ctx, nb_qmodel_export(ctx, M.qm, out, &eo));
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, out, &st));
    for (int64_t i = 0; st && i < nq; i++) {
        if (!nb_qmodel_weight_quantizer(M.qm, i)) continue;
        snprintf(name, sizeof name, "%s.weight_scale_2", nb_qmodel_name(M.qm, i));
        CHECK_MSG(f32_at(ctx, st, name) == s0[i], "%s: exported %.9g, trained %.9g", name, f32_at(ctx, st, name), s0[i]);
    }
    if (st) nb_st_close(st);
    nb_model *rb = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, out, &rb));
    if (rb) {
        enum { B = 2, T = 128 };
        const int64_t V = nb_model_get_config(rb)->vocab_size;
        float *a = malloc(sizeof(float) * (size_t)(B * T * V)), *b = malloc(sizeof(float) * (size_t)(B * T * V));
        CHECK_OK(ctx, nb_model_logits(ctx, M.sm, ev.ids, B, T, a));   /* fake quant on (the QAD student) */
        CHECK_OK(ctx, nb_model_logits(ctx, rb, ev.ids, B, T, b));
        int64_t diff = 0;
        for (int64_t i = 0; i < B * T * V; i++) diff += a[i] != b[i];
        CHECK_MSG(diff == 0, "%lld of %lld read-back logits differ from the student's fake-quant logits", (long long)diff,
                  (long long)(B * T * V));
        /* and the read-back is not just the teacher */
        CHECK_OK(ctx, nb_model_logits(ctx, M.teacher, ev.ids, B, T, b));
        diff = 0;
        for (int64_t i = 0; i < B * T * V; i++) diff += a[i] != b[i];
        CHECK(diff > B * T * V / 2);
        free(a);
        free(b);
        nb_model_free(rb);
    }

    nb_tokens_free(&ev);
    free(s0);
    nb_qad_free(q);
    nb_dataloader_free(ld);
    nb_dataset_release(ds);
    nb_tokenizer_free(tok);
    nb_qmodel_free(M.qm);
    nb_model_free(M.sm);
    nb_model_free(M.teacher);
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (nbt_failures == 0 && system(cmd) != 0) return 1;
    return nbt_done("test_qad_stories");
}

/* libFuzzer target: the QAD checkpoint reader. Each input is tried as the three files a resume reads
 * from a checkpoint folder: trainer.safetensors (the AdamW moments, and in its metadata the version,
 * step, AdamW step counts, data cursor, RNG and settings) in a folder given directly, restored into a
 * fresh run; as the manifest.json of a step folder beside a valid trainer and student; and as the
 * `latest` file of a folder whose step folder has no manifest (checkpoints from before manifests,
 * which count only when `latest` names them): through nb_qad_latest's pick, then a restore. */
#include <sys/stat.h>

#include "fuzz.h"

enum { NTOK = 512 };

/* A run over the committed tiny Llama: teacher fz_model(), student a second load of it quantized by
 * fz_qmodel's rules, a dataloader over fixed tokens (so the data cursor is parsed too). */
typedef struct run {
    nb_model *sm;
    nb_qmodel *qm;
    nb_dataset *ds;
    nb_dataloader *ld;
    nb_qad *q;
} run;

static void run_open(run *r) {
    nb_ctx *ctx = fz_ctx();
    memset(r, 0, sizeof *r);
    fz_check(nb_model_load(ctx, fz_source("tests/golden/data/model_llama3"), &r->sm), "student model");
    fz_check(nb_qmodel_new(ctx, r->sm, &r->qm), "qmodel");
    for (int64_t i = 0; i < nb_qmodel_count(r->qm); i++) {
        nb_qspec s;
        nb_qspec_init(&s);
        s.weight_format = NB_FMT_NVFP4;
        fz_check(nb_qmodel_set(ctx, r->qm, nb_qmodel_name(r->qm, i), &s), "spec");
    }
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    fz_check(nb_qmodel_calibrate_weights(ctx, r->qm, &cc), "calibrate");
    static int32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (i * 7 + 3) % 96;
    fz_check(nb_dataset_new(ctx, &r->ds), "dataset");
    fz_check(nb_dataset_add_tokens(ctx, r->ds, ids, NULL, NTOK), "tokens");
    nb_dataloader_cfg dc;
    nb_dataloader_cfg_init(&dc);
    dc.seq_len = 16;
    dc.batch = 2;
    dc.seed = 7;
    dc.random_offset = 1;
    dc.shuffle = 1;
    fz_check(nb_dataloader_new(ctx, r->ds, &dc, &r->ld), "dataloader");
    nb_qad_cfg cfg;
    nb_qad_cfg_init(&cfg);
    cfg.steps = 4;
    fz_check(nb_qad_new(ctx, &cfg, fz_model(), r->qm, r->ld, &r->q), "qad");
}

static void run_close(run *r) {
    nb_qad_free(r->q);
    nb_dataloader_free(r->ld);
    nb_dataset_release(r->ds);
    nb_qmodel_free(r->qm);
    nb_model_free(r->sm);
}

/* A valid checkpoint (one step trained, saved), made once: its step folder's files are the fixture the
 * manifest and `latest` cases sit beside, and with NIBBLE_FUZZ_SEEDS the seeds. */
static const char *fixture(void) {
    static char step[1024];
    if (step[0]) return step;
    nb_ctx *ctx = fz_ctx();
    run r;
    run_open(&r);
    nb_qad_metrics m;
    fz_check(nb_qad_step(ctx, r.q, &m), "step");
    const char *ck = fz_mkdir("ck");
    fz_check(nb_qad_save(ctx, r.q, ck, 2), "save");
    run_close(&r);
    char name[4096];
    fz_check(nb_qad_latest(ctx, ck, name, sizeof name), "latest");
    snprintf(step, sizeof step, "%s", name);
    static const char *const files[] = {"trainer.safetensors", "manifest.json", NULL};
    for (int k = 0; files[k] && fz_seed_path(files[k]); k++) {
        char src[2048];
        snprintf(src, sizeof src, "%s/%s", step, files[k]);
        fz_copy(src, fz_seed_path(files[k]));
    }
    if (fz_seed_path("latest")) {
        char src[2048];
        snprintf(src, sizeof src, "%s/latest", ck);
        fz_copy(src, fz_seed_path("latest"));
    }
    return step;
}

static void copy_in(const char *from_dir, const char *name, const char *to_dir) {
    char src[2048], dst[2048];
    snprintf(src, sizeof src, "%s/%s", from_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", to_dir, name);
    fz_copy(src, dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    const char *step = fixture();
    static char direct[1024], stepdir[1024], folder[1024], old[1024];
    if (!direct[0]) {
        /* direct/: trainer.safetensors given as the checkpoint itself (no manifest checks it);
         * folder/: a checkpoint folder with one step folder, its manifest.json and `latest` fuzzed */
        snprintf(direct, sizeof direct, "%s", fz_mkdir("direct"));
        copy_in(step, "student.safetensors", direct);
        snprintf(folder, sizeof folder, "%s", fz_mkdir("folder"));
        snprintf(stepdir, sizeof stepdir, "%s", fz_mkdir("folder/step-00000001"));
        copy_in(step, "student.safetensors", stepdir);
        copy_in(step, "trainer.safetensors", stepdir);
        snprintf(old, sizeof old, "%s", fz_mkdir("old"));
        snprintf(stepdir, sizeof stepdir, "%s", fz_mkdir("old/step-00000001"));
        copy_in(step, "student.safetensors", stepdir);
        copy_in(step, "trainer.safetensors", stepdir);
    }
    char name[4096];
    run r;
    fz_write("direct/trainer.safetensors", data, size);
    run_open(&r);
    (void)nb_qad_restore(ctx, r.q, direct);
    run_close(&r);
    fz_write("folder/step-00000001/manifest.json", data, size);
    if (nb_qad_latest(ctx, folder, name, sizeof name) == NB_OK) {
        run_open(&r);
        (void)nb_qad_restore(ctx, r.q, folder);
        run_close(&r);
    }
    fz_write("old/latest", data, size);
    if (nb_qad_latest(ctx, old, name, sizeof name) == NB_OK) {
        run_open(&r);
        (void)nb_qad_restore(ctx, r.q, old);
        run_close(&r);
    }
    return 0;
}

/* QAD step throughput: one optimizer step = teacher forward + NVFP4 W4A16 fake-quant student forward +
 * KL(teacher‖student) on every position + backward + clip + AdamW, in tokens/s, on a model loaded from PATH
 * (twice: teacher and student). bench/bench_qad.sh runs this and the same step in PyTorch (bench_qad.py).
 * Usage: bench_qad --model PATH [--batch 4] [--seq 256] [--threads 2] [--iters 4] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/nibble.h"
#include "bench_common.h"

static int die(nb_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_qad: %s: %s\n", what, ctx ? nb_ctx_last_error(ctx) : "");
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int64_t B = 4, T = 256;
    int threads = 2, iters = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else { fprintf(stderr, "bench_qad: unknown argument %s\n", argv[i]); return 2; }
    }
    if (!path) { fprintf(stderr, "usage: bench_qad --model PATH [--batch B] [--seq T] [--threads N] [--iters K]\n"); return 2; }
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(threads, &ctx)) return die(NULL, "context");
    nb_model *teacher = NULL, *sm = NULL;
    if (nb_model_load(ctx, path, &teacher) || nb_model_load(ctx, path, &sm)) return die(ctx, "load");
    const nb_model_config *c = nb_model_get_config(sm);
    /* keep every layer's activations (PyTorch's autograd does) when they fit in 4 GiB */
    nb_model_set_activation_budget(sm, (int64_t)4 << 30);

    /* NVFP4 W4A16 on every linear whose width 16 divides, lm_head excluded (as PyTorch's side) */
    nb_qmodel *qm = NULL;
    if (nb_qmodel_new(ctx, sm, &qm)) return die(ctx, "qmodel");
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_NVFP4;
    int nq = 0;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        nb_linear_info li;
        if (nb_model_linear_info(ctx, sm, nb_model_find_module(sm, name), &li)) return die(ctx, "linear info");
        if (li.role == NB_LINEAR_LM_HEAD || li.in_features % 16) continue;
        if (nb_qmodel_set(ctx, qm, name, &spec)) return die(ctx, name);
        nq++;
    }
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    if (nb_qmodel_fuse_siblings(ctx, qm, NULL) || nb_qmodel_calibrate_weights(ctx, qm, &cc)) return die(ctx, "calibrate");

    /* random tokens, enough rows for every step */
    int64_t n = (int64_t)(iters + 2) * B * T + T + 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    nb_rng r;
    nb_rng_seed(&r, 1);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(nb_rng_next(&r) % (uint64_t)c->vocab_size);
    nb_dataset *ds = NULL;
    nb_dataloader *ld = NULL;
    nb_dataloader_cfg lc;
    nb_dataloader_cfg_init(&lc);
    lc.seq_len = T;
    lc.batch = B;
    lc.drop_last = 1;
    if (nb_dataset_new(ctx, &ds) || nb_dataset_add_tokens(ctx, ds, ids, NULL, n) || nb_dataloader_new(ctx, ds, &lc, &ld))
        return die(ctx, "data");
    nb_qad_cfg qc;
    nb_qad_cfg_init(&qc);
    qc.steps = iters + 1;
    qc.lr = 1e-5;
    nb_qad *q = NULL;
    if (nb_qad_new(ctx, &qc, teacher, qm, ld, &q)) return die(ctx, "qad");
    nb_qad_metrics m;
    if (nb_qad_step(ctx, q, &m)) return die(ctx, "step");   /* warm-up: buffers, optimizer state */
    double t0 = bench_now(), c0 = bench_cpu();
    double kd = 0;
    for (int i = 0; i < iters; i++) {
        if (nb_qad_step(ctx, q, &m)) return die(ctx, "step");
        kd = m.kd;
    }
    double dt = (bench_now() - t0) / iters;
    double cpu = (bench_cpu() - c0) / iters;   /* all threads */
    nb_mem_stats ms;
    nb_ctx_mem(ctx, &ms);
    printf("{\"impl\": \"nibble\", \"model\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"threads\": %d, "
           "\"quantized_linears\": %d, \"qad_tok_s\": %.1f, \"qad_tok_cpu_s\": %.1f, \"step_s\": %.3f, \"kd\": %.6f, \"peak_mb\": %.0f",
           path, (long long)B, (long long)T, nb_ctx_threads(ctx), nq, (double)(B * T) / dt, (double)(B * T) / cpu, dt, kd,
           (double)ms.peak_bytes / 1e6);
    bench_print_blas_json(ctx);
    printf("}\n");
    nb_qad_free(q);
    nb_dataloader_free(ld);
    nb_dataset_release(ds);
    free(ids);
    nb_qmodel_free(qm);
    nb_model_free(sm);
    nb_model_free(teacher);
    nb_ctx_release(ctx);
    return 0;
}

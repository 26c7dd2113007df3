/* Model runtime throughput: forward (all logits) and train step (forward + next-token cross-entropy
 * + backward into every parameter's gradient) in tokens/s, on a model loaded from PATH.
 * bench/bench_model.sh runs this and the same model in PyTorch (bench_model.py) and prints ratios.
 * Usage: bench_model --model PATH [--batch 4] [--seq 256] [--threads 2] [--iters 5]
 *                    [--recompute auto|always|never] [--forward-only | --train-only] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/nibble.h"
#include "bench_common.h"

static int die(nb_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_model: %s: %s\n", what, ctx ? nb_ctx_last_error(ctx) : "");
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int64_t B = 4, T = 256;
    int threads = 2, iters = 5, recompute = NB_RECOMPUTE_AUTO, fwd = 1, train = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recompute") && i + 1 < argc) {
            const char *v = argv[++i];
            recompute = !strcmp(v, "always") ? NB_RECOMPUTE_ALWAYS : !strcmp(v, "never") ? NB_RECOMPUTE_NEVER : NB_RECOMPUTE_AUTO;
        }
        else if (!strcmp(argv[i], "--forward-only")) train = 0;
        else if (!strcmp(argv[i], "--train-only")) fwd = 0;
        else { fprintf(stderr, "bench_model: unknown argument %s\n", argv[i]); return 2; }
    }
    if (!path) { fprintf(stderr, "usage: bench_model --model PATH [--batch B] [--seq T] [--threads N] [--iters K]\n"); return 2; }
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(threads, &ctx)) return die(NULL, "context");
    nb_model *m = NULL;
    double t_load = bench_now();
    if (nb_model_load(ctx, path, &m)) return die(ctx, "load");
    t_load = bench_now() - t_load;
    nb_model_set_recompute(m, recompute);
    const nb_model_config *c = nb_model_get_config(m);
    int64_t N = B * T, V = c->vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N);
    nb_rng rng;
    nb_rng_seed(&rng, 1);
    for (int64_t i = 0; i < N; i++) tok[i] = (int32_t)(nb_rng_next(&rng) % (uint64_t)V);
    float *logits = malloc(sizeof(float) * (size_t)(N * V));
    if (!logits) return die(NULL, "out of memory");
    /* CPU time too: on a shared machine, with one thread, tokens per CPU-second estimate the
     * uncontended speed better than wall time does */
    double fwd_s = 0, train_s = 0, loss = 0, fwd_cpu = 0, train_cpu = 0;
    if (fwd) {
        if (nb_model_logits(ctx, m, tok, B, T, logits)) return die(ctx, "forward");   /* warm-up */
        double t0 = bench_now(), c0 = bench_cpu();
        for (int it = 0; it < iters; it++)
            if (nb_model_logits(ctx, m, tok, B, T, logits)) return die(ctx, "forward");
        fwd_s = (bench_now() - t0) / iters;
        fwd_cpu = (bench_cpu() - c0) / iters;
    }
    if (train) {
        if (nb_model_lm_step(ctx, m, tok, B, T, NULL, &loss)) return die(ctx, "train step");
        double t0 = bench_now(), c0 = bench_cpu();
        for (int it = 0; it < iters; it++)
            if (nb_model_lm_step(ctx, m, tok, B, T, NULL, &loss)) return die(ctx, "train step");
        train_s = (bench_now() - t0) / iters;
        train_cpu = (bench_cpu() - c0) / iters;
    }
    nb_mem_stats ms;
    nb_ctx_mem(ctx, &ms);
    static const char *rnames[] = {"never", "always", "auto"};
    printf("{\"impl\": \"nibble\", \"model\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"threads\": %d, \"recompute\": \"%s\", "
           "\"fwd_tok_s\": %.1f, \"train_tok_s\": %.1f, \"fwd_tok_cpu_s\": %.1f, \"train_tok_cpu_s\": %.1f, "
           "\"loss\": %.6f, \"load_s\": %.3f, \"peak_mb\": %.1f",
           path, (long long)B, (long long)T, nb_ctx_threads(ctx), rnames[recompute], fwd ? N / fwd_s : 0.0,
           train ? N / train_s : 0.0, fwd ? N / fwd_cpu : 0.0, train ? N / train_cpu : 0.0, loss, t_load,
           (double)ms.peak_bytes / 1048576.0);
    bench_print_blas_json(ctx);
    printf("}\n");
    free(tok);
    free(logits);
    nb_model_free(m);
    nb_ctx_release(ctx);
    return 0;
}

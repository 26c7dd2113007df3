/* Prompt processing throughput ("pp512" in llama-bench's terms): one sequence of N prompt tokens
 * through nb_model_forward with logits for the last position only, no generation, in tokens/s.
 * Reports the median (and best) wall time over --iters timed runs after one warm-up, and the median
 * process CPU time (all threads) per run.
 * bench/bench_llamacpp.sh runs this and llama.cpp (via llama-cpp-python) on the same model and tokens.
 * Usage: bench_pp --model PATH [--tokens 512] [--threads 2] [--iters 5] [--seed 1] [--ids-out FILE]
 *                 [--logits-out FILE]
 * --ids-out writes the prompt's token ids, one per line, so the peer can time the very same prompt;
 * --logits-out the last position's logits (float32, native byte order) so it can check the result.
 * With NIBBLE_BENCH_JSON set (bench/record.lua) it also writes its row there, as bench/results/pp.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/nibble.h"
#include "bench_common.h"

static int die(nb_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_pp: %s: %s\n", what, ctx ? nb_ctx_last_error(ctx) : "");
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL, *ids_out = NULL, *logits_out = NULL;
    int64_t T = 512;
    int threads = 2, iters = 5;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--ids-out") && i + 1 < argc) ids_out = argv[++i];
        else if (!strcmp(argv[i], "--logits-out") && i + 1 < argc) logits_out = argv[++i];
        else { fprintf(stderr, "bench_pp: unknown argument %s\n", argv[i]); return 2; }
    }
    if (!path || T < 1 || iters < 1) {
        fprintf(stderr, "usage: bench_pp --model PATH [--tokens N] [--threads N] [--iters K] [--seed S] [--ids-out FILE] [--logits-out FILE]\n");
        return 2;
    }
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(threads, &ctx)) return die(NULL, "context");
    double t_load = bench_now();
    nb_model *m = NULL;
    if (nb_model_load(ctx, path, &m)) return die(ctx, "load");
    t_load = bench_now() - t_load;
    const nb_model_config *c = nb_model_get_config(m);
    int64_t V = c->vocab_size;
    /* random ids as llama-bench uses; the same seed gives bench_llamacpp.py the same list */
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!tok || !logits) return die(NULL, "out of memory");
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)(nb_rng_next(&rng) % (uint64_t)V);
    if (c->bos_token_id >= 0) tok[0] = c->bos_token_id;
    if (ids_out) {
        FILE *f = fopen(ids_out, "w");
        if (!f) { fprintf(stderr, "bench_pp: cannot write %s\n", ids_out); return 1; }
        for (int64_t i = 0; i < T; i++) fprintf(f, "%d\n", (int)tok[i]);
        fclose(f);
    }

    nb_forward_opts o = {0};
    o.logits = logits;
    o.logits_start = T - 1;   /* only the last position's logits, like llama.cpp without logits_all */
    if (nb_model_forward(ctx, m, tok, 1, T, &o)) return die(ctx, "forward");   /* warm-up */
    double *times = malloc(sizeof(double) * 2 * (size_t)iters), *cpu = times + iters;
    if (!times) return die(NULL, "out of memory");
    for (int it = 0; it < iters; it++) {
        double t0 = bench_now(), c0 = bench_cpu();
        if (nb_model_forward(ctx, m, tok, 1, T, &o)) return die(ctx, "forward");
        times[it] = bench_now() - t0;
        cpu[it] = bench_cpu() - c0;
    }
    /* medians: the machine is shared, and a mean follows whatever else ran meanwhile */
    double best, med = bench_median(times, iters, &best), cpu_med = bench_median(cpu, iters, NULL);
    if (logits_out) {
        FILE *f = fopen(logits_out, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)V, f) != (size_t)V) {
            fprintf(stderr, "bench_pp: cannot write %s\n", logits_out);
            return 1;
        }
        fclose(f);
    }
    int64_t am = 0;
    for (int64_t v = 1; v < V; v++) if (logits[v] > logits[am]) am = v;
    printf("{\"impl\": \"nibble\", \"model\": \"%s\", \"tokens\": %lld, \"threads\": %d, \"iters\": %d, "
           "\"load_s\": %.3f, \"median_s\": %.5f, \"best_s\": %.5f, \"cpu_median_s\": %.5f, \"pp_tok_s\": %.1f, "
           "\"best_tok_s\": %.1f, \"cpu_tok_s\": %.1f, \"last_argmax\": %lld}\n",
           path, (long long)T, nb_ctx_threads(ctx), iters, t_load, med, best, cpu_med, (double)T / med,
           (double)T / best, (double)T / cpu_med, (long long)am);
    bench_json js;
    if (bench_json_open(&js, "pp", "Prompt processing on the CPU (nibble alone)", nb_ctx_threads(ctx)) < 0) {
        fprintf(stderr, "bench_pp: cannot write $NIBBLE_BENCH_JSON\n");
        return 1;
    }
    static const char *const cols[] = {"model", "prompt tokens", "threads", "tok/s (median)", "tok/s (best)",
                                       "tok/s per CPU-second", "load s"};
    char cell[6][32];
    const char *cells[7] = {path, cell[0], cell[1], cell[2], cell[3], cell[4], cell[5]};
    snprintf(cell[0], sizeof cell[0], "%lld", (long long)T);
    snprintf(cell[1], sizeof cell[1], "%d", nb_ctx_threads(ctx));
    snprintf(cell[2], sizeof cell[2], "%.0f", (double)T / med);
    snprintf(cell[3], sizeof cell[3], "%.0f", (double)T / best);
    snprintf(cell[4], sizeof cell[4], "%.0f", (double)T / cpu_med);
    snprintf(cell[5], sizeof cell[5], "%.3f", t_load);
    char caption[160];
    snprintf(caption, sizeof caption, "one forward of %lld random prompt tokens (BOS first, seed %llu), last position's "
             "logits only; %d timed runs after a warm-up", (long long)T, (unsigned long long)seed, iters);
    bench_json_table(&js, caption, 7, cols);
    bench_json_row(&js, 7, cells);
    bench_json_note(&js, "tok/s = prompt tokens / wall time of one forward; per CPU-second = prompt tokens / process "
                    "CPU time (all threads) of one forward; the last position's argmax is token %lld", (long long)am);
    if (bench_json_close(&js)) {
        fprintf(stderr, "bench_pp: cannot write $NIBBLE_BENCH_JSON\n");
        return 1;
    }
    free(times);
    free(tok);
    free(logits);
    nb_model_free(m);
    nb_ctx_release(ctx);
    return 0;
}

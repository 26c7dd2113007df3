/* Decoding: picking a token from a row of logits (greedy, temperature, top-k, top-p) and generating
 * continuations of several prompts at once with one KV cache (nb_model_generate). The one decode loop
 * behind `nibble generate`, Model:generate, QAD's teacher sampling and the quickstart's data. */
#ifndef NIBBLE_GENERATE_H
#define NIBBLE_GENERATE_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/model.h"

typedef struct nb_sample_opts {
    int32_t greedy;             /* argmax (ties: the lowest id) */
    float temperature;          /* > 0 when sampling; <= 0 is greedy */
    int32_t top_k;              /* 0 = off */
    float top_p;                /* 1 = off */
} nb_sample_opts;

/* Pick the next token from one row of logits. One nb_rng_uniform draw from rng when sampling, none
 * when greedy (opts NULL, greedy, temperature <= 0 or rng NULL). */
NB_API int32_t nb_sample_logits(const float *logits, int64_t vocab, const nb_sample_opts *opts, nb_rng *rng);

/* Called with each token a row emits, on the calling thread, rows in order within a step. A status
 * other than NB_OK stops generation and nb_model_generate returns it. */
typedef nb_status (*nb_token_fn)(nb_ctx *ctx, void *user, int64_t row, int32_t token);

typedef struct nb_generate_opts {
    nb_sample_opts sample;
    uint64_t seed;              /* row b draws from its own stream seeded seed + b ... */
    const uint64_t *seeds;      /* ... or from seeds[b] when this is not NULL */
    int32_t stop_at_eos;        /* a row ends after emitting one of the config's EOS ids */
    const int32_t *stop;        /* NULL or n_stop more ids that end a row (e.g. a chat template's end of */
    int32_t n_stop;             /*   turn); the stopping id is part of the row's output */
    nb_token_fn on_token;       /* NULL or called per emitted token (streaming) */
    void *user;
} nb_generate_opts;

/* Continue B prompts (row b: prompt_lens[b] >= 1 ids, the rows one after another in prompts) by up to
 * n_new tokens each: out is [B, n_new] (row b's tokens at out + b * n_new), n_out[b] how many row b
 * emitted (n_new unless it stopped). Rows decode together in one KV cache, position by position: the
 * common prompt length is run at once, rows with longer prompts are fed the rest of their prompt
 * while shorter ones already sample, and rows that stopped leave the batch. A row's tokens do not
 * depend on which other rows are in the batch, only on its prompt, its seed and the options (up to
 * the float rounding of matrix products of other shapes). opts NULL: greedy, stop at EOS. */
NB_API nb_status nb_model_generate(nb_ctx *ctx, nb_model *m, const int32_t *prompts, const int64_t *prompt_lens,
                                   int64_t B, int64_t n_new, const nb_generate_opts *opts, int32_t *out,
                                   int64_t *n_out);

#endif

/* Token sampling (nb_sample_logits) and nb_model_generate's stopping rules: greedy picks the
 * lowest id among ties, temperature sampling follows softmax(logits / T) (frequencies over many
 * draws), top-k and top-p cut the candidates, a seed makes it reproducible, EOS stops generation,
 * and a batch of prompts of different lengths generates what each prompt generates alone. */
#include <stdlib.h>

#include "nbtest.h"

typedef struct { int n; int64_t row[5 * 24]; int32_t tok[5 * 24]; int fail_at; } seen_tokens;

static nb_status seen_token(nb_ctx *ctx, void *user, int64_t row, int32_t token) {
    seen_tokens *s = user;
    s->row[s->n] = row;
    s->tok[s->n++] = token;
    return s->n - 1 == s->fail_at ? nb_fail(ctx, NB_ERR_INTERRUPTED, "stop here") : NB_OK;
}

int main(void) {
    nb_rng rng;
    nb_rng_seed(&rng, 42);
    float l[5] = {1.0f, 3.0f, 3.0f, -2.0f, 0.0f};
    nb_sample_opts g = {0};
    g.greedy = 1;
    CHECK_EQ_INT(nb_sample_logits(l, 5, &g, &rng), 1);
    CHECK_EQ_INT(nb_sample_logits(l, 5, NULL, NULL), 1);

    /* logits log(1), log(2), log(3): probabilities 1/6, 2/6, 3/6 at temperature 1 */
    float p3[3] = {0.0f, logf(2.0f), logf(3.0f)};
    nb_sample_opts s = {0};
    s.temperature = 1.0f;
    s.top_p = 1.0f;
    int count[3] = {0, 0, 0};
    const int n = 30000;
    for (int i = 0; i < n; i++) count[nb_sample_logits(p3, 3, &s, &rng)]++;
    CHECK_NEAR(count[0] / (double)n, 1.0 / 6, 0.01);
    CHECK_NEAR(count[1] / (double)n, 2.0 / 6, 0.01);
    CHECK_NEAR(count[2] / (double)n, 3.0 / 6, 0.01);
    /* temperature 0.5 squares the odds: 1, 4, 9 over 14 */
    s.temperature = 0.5f;
    memset(count, 0, sizeof count);
    for (int i = 0; i < n; i++) count[nb_sample_logits(p3, 3, &s, &rng)]++;
    CHECK_NEAR(count[2] / (double)n, 9.0 / 14, 0.01);
    CHECK_NEAR(count[0] / (double)n, 1.0 / 14, 0.01);
    /* top-k 2 keeps ids 2 and 1 (odds 3:2), top-k 1 is the argmax */
    s.temperature = 1.0f;
    s.top_k = 2;
    memset(count, 0, sizeof count);
    for (int i = 0; i < n; i++) count[nb_sample_logits(p3, 3, &s, &rng)]++;
    CHECK_EQ_INT(count[0], 0);
    CHECK_NEAR(count[2] / (double)n, 0.6, 0.01);
    s.top_k = 1;
    for (int i = 0; i < 100; i++) CHECK_EQ_INT(nb_sample_logits(p3, 3, &s, &rng), 2);
    /* top-p 0.5: the most likely token alone already holds half the mass */
    s.top_k = 0;
    s.top_p = 0.5f;
    for (int i = 0; i < 100; i++) CHECK_EQ_INT(nb_sample_logits(p3, 3, &s, &rng), 2);
    /* top-p 0.8: ids 2 and 1 (0.5 + 0.33 >= 0.8), again 3:2 */
    s.top_p = 0.8f;
    memset(count, 0, sizeof count);
    for (int i = 0; i < n; i++) count[nb_sample_logits(p3, 3, &s, &rng)]++;
    CHECK_EQ_INT(count[0], 0);
    CHECK_NEAR(count[2] / (double)n, 0.6, 0.01);

    /* a 5000-token vocabulary: top-k 7 draws only the 7 largest, in their renormalized odds; top-p
     * 0.6 draws only from the smallest prefix (by probability) that holds 60% of the mass */
    {
        enum { BV = 5000 };
        static float big[BV];
        static int idx[BV];
        nb_rng r2;
        nb_rng_seed(&r2, 9);
        for (int i = 0; i < BV; i++) big[i] = (float)(3.0 * nb_rng_normal(&r2));
        for (int i = 0; i < BV; i++) idx[i] = i;
        for (int i = 0; i < 60; i++)   /* partial selection sort: the 60 largest first */
            for (int k = i + 1; k < BV; k++)
                if (big[idx[k]] > big[idx[i]]) { int t = idx[i]; idx[i] = idx[k]; idx[k] = t; }
        double z7 = 0, p[60];
        for (int i = 0; i < 7; i++) z7 += exp(big[idx[i]] - big[idx[0]]);
        nb_sample_opts sk = {0};
        sk.temperature = 1.0f;
        sk.top_k = 7;
        int cnt7[7] = {0}, outside = 0;
        for (int i = 0; i < 20000; i++) {
            int32_t t = nb_sample_logits(big, BV, &sk, &rng);
            int k = 0;
            while (k < 7 && idx[k] != t) k++;
            if (k == 7) outside++; else cnt7[k]++;
        }
        CHECK_EQ_INT(outside, 0);
        for (int k = 0; k < 7; k++) CHECK_NEAR(cnt7[k] / 20000.0, exp(big[idx[k]] - big[idx[0]]) / z7, 0.015);
        double z = 0;
        for (int i = 0; i < BV; i++) z += exp(big[i] - big[idx[0]]);
        double acc = 0;
        int keep = 0;
        for (int i = 0; i < 60 && acc < 0.6; i++) { p[i] = exp(big[idx[i]] - big[idx[0]]) / z; acc += p[i]; keep = i + 1; }
        sk.top_k = 0;
        sk.top_p = 0.6f;
        outside = 0;
        for (int i = 0; i < 5000; i++) {
            int32_t t = nb_sample_logits(big, BV, &sk, &rng);
            int k = 0;
            while (k < keep && idx[k] != t) k++;
            if (k == keep) outside++;
        }
        CHECK_EQ_INT(outside, 0);
        CHECK(keep > 1);
    }

    /* generation on a tiny random model: reproducible with a seed, EOS stops it */
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    nb_model_config c;
    nb_model_config_init(&c);
    c.vocab_size = 8;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
    CHECK_OK(ctx, nb_model_init_random(ctx, m, 5, 0.5));
    int32_t prompt[2] = {1, 4}, a[50], b[50];
    int64_t len2 = 2, na = 0, nb = 0;
    nb_generate_opts so = {0};
    so.sample.temperature = 1.0f;
    so.sample.top_p = 1.0f;
    so.seed = 77;
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, &len2, 1, 50, &so, a, &na));
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, &len2, 1, 50, &so, b, &nb));
    CHECK_EQ_INT(na, 50);
    CHECK_EQ_INT(nb, 50);
    CHECK(!memcmp(a, b, sizeof a));
    /* generate == greedy argmax of a full forward at every step */
    nb_generate_opts gr = {0};
    gr.sample.greedy = 1;
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, &len2, 1, 10, &gr, a, &na));
    CHECK_EQ_INT(na, 10);
    int32_t seq[12] = {1, 4};
    float lg[12 * 8];
    for (int t = 0; t < 10; t++) {
        CHECK_OK(ctx, nb_model_logits(ctx, m, seq, 1, 2 + t, lg));
        seq[2 + t] = nb_sample_logits(lg + (1 + t) * 8, 8, &gr.sample, NULL);
        CHECK_EQ_INT(a[t], seq[2 + t]);
    }
    /* opts NULL: greedy, stopping at EOS */
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, &len2, 1, 10, NULL, b, &nb));
    CHECK(nb >= 1 && nb <= 10);
    CHECK(!memcmp(a, b, sizeof(int32_t) * (size_t)nb));
    /* stop at EOS (id 2) when asked: the output ends with the first EOS */
    so.stop_at_eos = 1;
    int stopped = 0;
    for (uint64_t seed = 1; seed < 40 && !stopped; seed++) {
        so.seed = seed;
        CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, &len2, 1, 50, &so, a, &na));
        for (int64_t i = 0; i < na - 1; i++) CHECK(a[i] != 2);
        if (na < 50) { CHECK_EQ_INT(a[na - 1], 2); stopped = 1; }
    }
    CHECK(stopped);
    int64_t len0 = 0;
    CHECK_FAIL(ctx, nb_model_generate(ctx, m, prompt, &len0, 1, 5, &so, a, &na), NB_ERR_INVALID,
               "prompt of row 0 needs at least one token");
    CHECK_FAIL(ctx, nb_model_generate(ctx, m, prompt, &len2, 0, 5, &so, a, &na), NB_ERR_INVALID, "B must be at least 1");
    nb_model_free(m);

    /* a batch of prompts of different lengths decodes as each prompt alone: greedy, sampled (each row
     * its own stream, seed + row or seeds[row]), top-k / top-p, rows stopping at EOS or at a stop id
     * at different steps (they leave the batch) */
    c.vocab_size = 48;
    c.n_layers = 2;
    CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
    CHECK_OK(ctx, nb_model_init_random(ctx, m, 11, 0.3));
    enum { R = 5, N = 24 };
    int32_t prompts[] = {1, 7, 9, 30, 3, 1, 5, 1, 2, 3, 4, 5, 6, 40, 11, 17, 6};
    int64_t lens[R] = {3, 1, 2, 8, 3};
    int32_t stop_ids[2] = {13, 21};
    for (int variant = 0; variant < 5; variant++) {
        nb_generate_opts o = {0};
        o.sample.temperature = variant == 0 ? 0.0f : 1.2f;
        o.sample.top_k = variant == 2 ? 5 : 0;
        o.sample.top_p = variant == 3 ? 0.7f : 1.0f;
        o.seed = 1000 + (uint64_t)variant;
        uint64_t seeds[R] = {5, 4, 3, 2, 1};
        if (variant == 4) {
            o.seeds = seeds;
            o.stop_at_eos = 1;
            o.stop = stop_ids;
            o.n_stop = 2;
        }
        int32_t batch_out[R * N], one[N];
        int64_t batch_n[R], one_n;
        CHECK_OK(ctx, nb_model_generate(ctx, m, prompts, lens, R, N, &o, batch_out, batch_n));
        int64_t off = 0, shortest = N;
        for (int r = 0; r < R; r++) {
            nb_generate_opts o1 = o;
            o1.seed = o.seed + (uint64_t)r;
            o1.seeds = variant == 4 ? &seeds[r] : NULL;
            CHECK_OK(ctx, nb_model_generate(ctx, m, prompts + off, &lens[r], 1, N, &o1, one, &one_n));
            CHECK_MSG(one_n == batch_n[r] && !memcmp(one, batch_out + r * N, sizeof(int32_t) * (size_t)one_n),
                      "variant %d row %d: batched differs from alone", variant, r);
            shortest = one_n < shortest ? one_n : shortest;
            off += lens[r];
        }
        if (variant == 4) CHECK_MSG(shortest < N, "no row stopped early");   /* the batch shrank */
        if (variant == 1) CHECK(memcmp(batch_out, batch_out + N, sizeof(int32_t) * N) != 0);
    }

    /* on_token sees every emitted token, rows in order within a step; an error from it stops generation */
    {
        seen_tokens seen = {0};
        seen.fail_at = -1;
        nb_generate_opts o = {0};
        o.sample.greedy = 1;
        o.on_token = seen_token;
        o.user = &seen;
        int32_t got[R * N];
        int64_t got_n[R];
        CHECK_OK(ctx, nb_model_generate(ctx, m, prompts, lens, R, 4, &o, got, got_n));
        CHECK_EQ_INT(seen.n, R * 4);
        /* rows 1 (1 token) and 2 (2 tokens) start before row 0 and 4 (3), row 3 (8) last */
        CHECK_EQ_INT(seen.row[0], 1);
        CHECK_EQ_INT(seen.row[1], 1);
        CHECK_EQ_INT(seen.row[2], 2);
        CHECK_EQ_INT(seen.row[R * 4 - 1], 3);
        int per_row[R] = {0};
        for (int i = 0; i < seen.n; i++) {
            int64_t r = seen.row[i];
            CHECK_EQ_INT(seen.tok[i], got[r * 4 + per_row[r]++]);
        }
        seen.n = 0;
        seen.fail_at = 3;
        CHECK_FAIL(ctx, nb_model_generate(ctx, m, prompts, lens, R, 4, &o, got, got_n), NB_ERR_INTERRUPTED, "stop here");
        CHECK_EQ_INT(seen.n, 4);
    }
    nb_model_free(m);
    nb_ctx_release(ctx);
    return nbt_done("test_model_sample");
}

/* Token sampling (nb_sample_logits) and nb_model_generate's stopping rules: greedy picks the
 * lowest id among ties, temperature sampling follows softmax(logits / T) (frequencies over many
 * draws), top-k and top-p cut the candidates, a seed makes it reproducible, EOS stops generation. */
#include <stdlib.h>

#include "nbtest.h"

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
    int64_t na = 0, nb = 0;
    nb_sample_opts so = {0};
    so.temperature = 1.0f;
    so.top_p = 1.0f;
    so.seed = 77;
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, 2, 50, &so, a, &na));
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, 2, 50, &so, b, &nb));
    CHECK_EQ_INT(na, 50);
    CHECK_EQ_INT(nb, 50);
    CHECK(!memcmp(a, b, sizeof a));
    /* generate == greedy argmax of a full forward at every step */
    nb_sample_opts gr = {0};
    gr.greedy = 1;
    CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, 2, 10, &gr, a, &na));
    int32_t seq[12] = {1, 4};
    float lg[12 * 8];
    for (int t = 0; t < 10; t++) {
        CHECK_OK(ctx, nb_model_logits(ctx, m, seq, 1, 2 + t, lg));
        seq[2 + t] = nb_sample_logits(lg + (1 + t) * 8, 8, &gr, NULL);
        CHECK_EQ_INT(a[t], seq[2 + t]);
    }
    /* stop at EOS (id 2) when asked: the output ends with the first EOS */
    so.stop_at_eos = 1;
    int stopped = 0;
    for (uint64_t seed = 1; seed < 40 && !stopped; seed++) {
        so.seed = seed;
        CHECK_OK(ctx, nb_model_generate(ctx, m, prompt, 2, 50, &so, a, &na));
        for (int64_t i = 0; i < na - 1; i++) CHECK(a[i] != 2);
        if (na < 50) { CHECK_EQ_INT(a[na - 1], 2); stopped = 1; }
    }
    CHECK(stopped);
    CHECK_FAIL(ctx, nb_model_generate(ctx, m, prompt, 0, 5, &so, a, &na), NB_ERR_INVALID, "at least one token");
    nb_model_free(m);
    nb_ctx_release(ctx);
    return nbt_done("test_model_sample");
}

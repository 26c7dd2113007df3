/* stories260K, a real trained Llama: the logits of the first 512 validation tokens must match the
 * float64 reference (max abs error <= 1e-4) from both the GGUF (interleaved RoPE, permuted on load)
 * and the HF directory (rotate-half, tied embeddings); greedy decoding from BOS must reproduce the
 * reference ids; the same logits through the KV cache, through chunked callbacks, with batches and
 * threads; quantized GGUFs load (dequantized) and stay close. */
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static int32_t *json_ids(const char *path, const char *key, int *n) {
    char *t = nbt_slurp(path, NULL);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    cJSON *a = j ? cJSON_GetObjectItem(j, key) : NULL;
    *n = a ? cJSON_GetArraySize(a) : 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    cJSON_Delete(j);
    return ids;
}

static double max_abs(const float *a, const float *b, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

typedef struct { float *dst; int64_t V; int calls; } chunk_sink;
static nb_status sink(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab, float *logits) {
    chunk_sink *s = user;
    memcpy(s->dst + row0 * vocab, logits, sizeof(float) * (size_t)(nrows * vocab));
    s->calls++;
    return NB_OK;
}

static void check_model(nb_ctx *ctx, nb_model *m, const int32_t *ids, const float *ref, const char *what) {
    const int64_t T = 512, V = 512;
    float *lg = malloc(sizeof(float) * (size_t)(T * V));
    CHECK_OK(ctx, nb_model_logits(ctx, m, ids, 1, T, lg));
    double e = max_abs(lg, ref, T * V);
    printf("%s: max |logits - reference| = %.3g\n", what, e);
    CHECK_MSG(e <= 1e-4, "%s: max abs error %.3g > 1e-4", what, e);
    free(lg);
}

int main(void) {
    const char *gguf = nbt_data("stories260K/stories260K.gguf");
    const char *hf = nbt_data("stories260K/hf");
    int n_ids = 0, n_greedy = 0;
    int32_t *ids = json_ids(nbt_data("stories260K/reference/valid_chunk0.json"), "ids", &n_ids);
    CHECK_EQ_INT(n_ids, 512);
    size_t nb = 0;
    float *ref = nbt_slurp(nbt_data("stories260K/reference/valid_chunk0_logits_f32le.bin"), &nb);
    CHECK_EQ_INT(nb, 512 * 512 * 4);

    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    nb_model *mg = NULL, *mh = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, gguf, &mg));
    CHECK_OK(ctx, nb_model_load(ctx, hf, &mh));
    if (!mg || !mh) return nbt_done("test_model_stories");

    /* what was read */
    const nb_model_config *c = nb_model_get_config(mh);
    CHECK_EQ_INT(c->vocab_size, 512);
    CHECK_EQ_INT(c->hidden_size, 64);
    CHECK_EQ_INT(c->intermediate_size, 172);
    CHECK_EQ_INT(c->n_layers, 5);
    CHECK_EQ_INT(c->n_heads, 8);
    CHECK_EQ_INT(c->n_kv_heads, 4);
    CHECK_EQ_INT(c->head_dim, 8);
    CHECK_EQ_INT(c->tied, 1);
    CHECK_EQ_INT(c->bos_token_id, 1);
    CHECK_EQ_INT(c->eos_token_ids[0], 2);
    CHECK_EQ_INT(nb_model_format_of(mh), NB_MODEL_HF);
    CHECK_EQ_INT(nb_model_param_count(mh), 1 + 5 * 9 + 1);
    CHECK(!strcmp(nb_model_arch_name(mh), "llama"));
    /* the GGUF stores output.weight (a copy of token_embd), so it is untied there */
    CHECK_EQ_INT(nb_model_get_config(mg)->tied, 0);
    CHECK_EQ_INT(nb_model_format_of(mg), NB_MODEL_GGUF);
    CHECK_EQ_INT(nb_model_param_count(mg), 1 + 5 * 9 + 2);
    CHECK_EQ_INT(nb_model_get_config(mg)->bos_token_id, 1);
    /* GGUF q rows were permuted into HF's layout: the two files now hold the same matrices */
    const char *names[] = {"model.layers.2.self_attn.q_proj.weight", "model.layers.4.self_attn.k_proj.weight",
                           "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"};
    for (int i = 0; i < 4; i++) {
        nb_tensor *a = nb_model_param(mg, nb_model_find_param(mg, names[i]));
        nb_tensor *b = nb_model_param(mh, nb_model_find_param(mh, names[i]));
        CHECK_MSG(a && b && nb_tensor_numel(a) == nb_tensor_numel(b) &&
                      !memcmp(nb_tensor_data(a), nb_tensor_data(b), (size_t)nb_tensor_nbytes(a)),
                  "%s differs between GGUF and HF", names[i]);
    }
    CHECK_EQ_INT(nb_model_param_src_dtype(mh, 0), NB_F32);

    check_model(ctx, mg, ids, ref, "stories260K.gguf");
    check_model(ctx, mh, ids, ref, "stories260K/hf");

    /* the same logits: one thread, chunked callback (100 rows per call), batch of 2 */
    nb_ctx *ctx1 = NULL;
    nb_ctx_new(1, &ctx1);
    check_model(ctx1, mh, ids, ref, "hf, 1 thread");
    nb_ctx_release(ctx1);
    float *lg = malloc(sizeof(float) * 512 * 512 * 2);
    chunk_sink cs = {lg, 512, 0};
    nb_forward_opts fo = {0};
    fo.on_logits = sink;
    fo.user = &cs;
    fo.chunk_rows = 100;
    CHECK_OK(ctx, nb_model_forward(ctx, mh, ids, 1, 512, &fo));
    CHECK_EQ_INT(cs.calls, 6);
    CHECK(max_abs(lg, ref, 512 * 512) <= 1e-4);
    int32_t *ids2 = malloc(sizeof(int32_t) * 1024);
    memcpy(ids2, ids, 512 * sizeof(int32_t));
    memcpy(ids2 + 512, ids, 512 * sizeof(int32_t));
    CHECK_OK(ctx, nb_model_logits(ctx, mh, ids2, 2, 512, lg));
    CHECK(max_abs(lg, ref, 512 * 512) <= 1e-4);
    CHECK(max_abs(lg + 512 * 512, ref, 512 * 512) <= 1e-4);
    /* only the second half: rows of positions 256..511 */
    fo = (nb_forward_opts){0};
    fo.logits = lg;
    fo.logits_start = 256;
    CHECK_OK(ctx, nb_model_forward(ctx, mh, ids, 1, 512, &fo));
    CHECK(max_abs(lg, ref + 256 * 512, 256 * 512) <= 1e-4);

    /* KV cache: a 100-token prompt, then one token at a time */
    nb_kv_cache *kc = NULL;
    CHECK_OK(ctx, nb_kv_cache_new(ctx, mg, 1, 160, &kc));
    fo = (nb_forward_opts){0};
    fo.logits = lg;
    fo.cache = kc;
    CHECK_OK(ctx, nb_model_forward(ctx, mg, ids, 1, 100, &fo));
    CHECK(max_abs(lg, ref, 100 * 512) <= 1e-4);
    double ce = 0;
    for (int t = 100; t < 160; t++) {
        CHECK_OK(ctx, nb_model_forward(ctx, mg, ids + t, 1, 1, &fo));
        ce = fmax(ce, max_abs(lg, ref + t * 512, 512));
    }
    CHECK_MSG(ce <= 1e-4, "kv-cache decode differs by %.3g", ce);
    CHECK_EQ_INT(nb_kv_cache_len(kc), 160);
    CHECK_FAIL(ctx, nb_model_forward(ctx, mg, ids, 1, 1, &fo), NB_ERR_INVALID, "KV cache full");
    nb_kv_cache_free(kc);

    /* greedy generation from BOS reproduces the reference continuation */
    int32_t *greedy = json_ids(nbt_data("stories260K/reference/greedy_from_bos_200.json"), "ids", &n_greedy);
    CHECK_EQ_INT(n_greedy, 201);
    int32_t out[200];
    int64_t n_out = 0;
    nb_generate_opts so = {0};
    so.sample.greedy = 1;
    int32_t bos = 1;
    int64_t one = 1;
    for (int k = 0; k < 2; k++) {
        nb_model *m = k ? mg : mh;
        CHECK_OK(ctx, nb_model_generate(ctx, m, &bos, &one, 1, 200, &so, out, &n_out));
        CHECK_EQ_INT(n_out, 200);
        int first_diff = -1;
        for (int i = 0; i < 200 && first_diff < 0; i++)
            if (out[i] != greedy[i + 1]) first_diff = i;
        CHECK_MSG(first_diff < 0, "greedy (%s) differs from the reference at step %d", k ? "gguf" : "hf", first_diff);
    }

    /* quantized GGUFs: dequantized once at load; Q8_0 logits stay within 0.1 of F32 */
    nb_model *mq = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, nbt_data("stories260K/quantized/stories260K-q8_0.gguf"), &mq));
    if (mq) {
        CHECK_OK(ctx, nb_model_logits(ctx, mq, ids, 1, 512, lg));
        double e = max_abs(lg, ref, 512 * 512);
        printf("q8_0: max |logits - f32 reference| = %.3g\n", e);
        CHECK(e < 2.0 && e > 1e-4);
        CHECK_EQ_INT(nb_model_param_src_dtype(mq, nb_model_find_param(mq, "model.layers.0.self_attn.q_proj.weight")), -1);
        CHECK_EQ_INT(nb_model_param_src_dtype(mq, nb_model_find_param(mq, "model.layers.0.mlp.down_proj.weight")), NB_F16);
        nb_model_free(mq);
    }
    mq = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, nbt_data("stories260K/quantized/stories260K-nvfp4.gguf"), &mq));
    nb_model_free(mq);

    free(lg); free(ids2); free(greedy); free(ids); free(ref);
    nb_model_free(mg);
    nb_model_free(mh);
    nb_ctx_release(ctx);
    return nbt_done("test_model_stories");
}

/* Golden tests against transformers (tests/golden/gen_model_golden.py, float64): tiny random
 * Qwen3 (q/k norm, head_dim != hidden/heads, tied), Llama-3 style (llama3 RoPE scaling, GQA 4:1,
 * untied), Qwen2 (q/k/v biases) and Mistral (sliding window) models saved by save_pretrained, and
 * the Llama-3 and Qwen3 ones again as GGUF (permuted q/k, rope_freqs factors; qwen3 arch).
 * Logits within 1e-4, every output_hidden_states entry, and the gradient of the mean next-token
 * cross-entropy for every parameter (torch autograd) must match. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static void check_model(nb_ctx *ctx, const char *name, const char *dir_override) {
    char dir[512], path[700];
    snprintf(dir, sizeof dir, "%s", nbt_src("tests/golden/data/model_"));
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *js = nbt_slurp(path, NULL);
    CHECK_MSG(js != NULL, "cannot read %s", path);
    if (!js) return;
    cJSON *g = cJSON_Parse(js);
    free(js);
    int B = cJSON_GetObjectItem(g, "B")->valueint, T = cJSON_GetObjectItem(g, "T")->valueint;
    int L = cJSON_GetObjectItem(g, "n_layers")->valueint, D = cJSON_GetObjectItem(g, "hidden_size")->valueint;
    int V = cJSON_GetObjectItem(g, "vocab_size")->valueint, N = B * T;
    int tied = cJSON_IsTrue(cJSON_GetObjectItem(g, "tied"));
    double loss_ref = cJSON_GetObjectItem(g, "loss")->valuedouble;
    cJSON *ja = cJSON_GetObjectItem(g, "ids");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N; i++) ids[i] = cJSON_GetArrayItem(ja, i)->valueint;
    cJSON_Delete(g);

    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, dir_override ? dir_override : dir, &m));
    if (!m) { free(ids); return; }
    CHECK_EQ_INT(nb_model_get_config(m)->tied, tied);
    int is_gguf = dir_override && strstr(dir_override, ".gguf") != NULL;
    CHECK_EQ_INT(nb_model_format_of(m), is_gguf ? NB_MODEL_GGUF : NB_MODEL_HF);
    if (!strcmp(name, "llama3"))   /* llama3 scaling: from config.json, or as GGUF rope_freqs factors */
        CHECK_EQ_INT(nb_model_get_config(m)->rope_kind, is_gguf ? NB_ROPE_FREQ_FACTORS : NB_ROPE_LLAMA3);
    CHECK(!strcmp(nb_model_arch_name(m), !strcmp(name, "llama3") ? "llama" : name));

    /* logits and hidden states */
    size_t nb = 0;
    snprintf(path, sizeof path, "%s/logits_f32le.bin", dir);
    float *ref = nbt_slurp(path, &nb);
    CHECK_EQ_INT(nb, (long)N * V * 4);
    snprintf(path, sizeof path, "%s/hidden_f32le.bin", dir);
    float *href = nbt_slurp(path, &nb);
    CHECK_EQ_INT(nb, (long)(L + 1) * N * D * 4);
    float *lg = malloc(sizeof(float) * (size_t)(N * V));
    float **hid = calloc((size_t)(L + 1), sizeof(float *));
    for (int l = 0; l <= L; l++) hid[l] = malloc(sizeof(float) * (size_t)(N * D));
    nb_forward_opts fo = {0};
    fo.logits = lg;
    fo.hidden = hid;
    fo.train = 1;
    CHECK_OK(ctx, nb_model_forward(ctx, m, ids, B, T, &fo));
    double e = 0;
    for (int i = 0; i < N * V; i++) e = fmax(e, fabs(lg[i] - ref[i]));
    printf("%s%s: max |logits - transformers| = %.3g\n", name, is_gguf ? " (GGUF)" : dir_override ? " (old-style config)" : "", e);
    CHECK_MSG(e <= 1e-4, "%s: logits differ by %.3g", name, e);
    for (int l = 0; l <= L; l++) {
        double he = 0;
        for (int i = 0; i < N * D; i++) he = fmax(he, fabs(hid[l][i] - href[(size_t)l * N * D + i]));
        CHECK_MSG(he <= 1e-4, "%s: hidden state %d differs by %.3g", name, l, he);
    }

    /* gradients of the mean next-token cross-entropy */
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)N);
    int cnt = 0;
    for (int i = 0; i < N; i++) {
        tg[i] = (i % T == T - 1) ? -100 : ids[i + 1];
        cnt += tg[i] != -100;
    }
    nb_lm_loss ll = {tg, -100, 1.0f / (float)cnt, 0, 0};
    nb_backward_opts bo = {0};
    bo.loss = nb_lm_loss_fn;
    bo.user = &ll;
    CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
    CHECK_NEAR(ll.loss_sum / (double)ll.count, loss_ref, 1e-5);
    double mean = 0;
    nb_model_zero_grad(m);
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, ids, B, T, NULL, &mean));
    CHECK_NEAR(mean, loss_ref, 1e-5);
    snprintf(path, sizeof path, "%s/grads.safetensors", dir);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    CHECK_EQ_INT(nb_st_count(st), nb_model_param_count(m));
    for (int64_t i = 0; st && i < nb_model_param_count(m); i++) {
        const char *pn = nb_model_param_name(m, i);
        nb_tensor *gt = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, pn, &gt));
        if (!gt) continue;
        const float *gr = nb_tensor_data(gt), *gm = nb_tensor_data(nb_model_grad(m, i));
        int64_t n = nb_tensor_numel(gt);
        CHECK_EQ_INT(n, nb_tensor_numel(nb_model_grad(m, i)));
        double mx = 1e-6, d = 0;
        for (int64_t k = 0; k < n; k++) {
            mx = fmax(mx, fabs(gr[k]));
            d = fmax(d, fabs(gr[k] - gm[k]));
        }
        CHECK_MSG(d <= 1e-4 * mx + 1e-7, "%s: grad of %s differs by %.3g (max |grad| %.3g)", name, pn, d, mx);
        nb_tensor_release(gt);
    }
    nb_st_close(st);
    for (int l = 0; l <= L; l++) free(hid[l]);
    free(hid); free(lg); free(ref); free(href); free(tg); free(ids);
    nb_model_free(m);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    check_model(ctx, "qwen3", NULL);
    check_model(ctx, "llama3", NULL);
    check_model(ctx, "qwen2", NULL);
    check_model(ctx, "mistral", NULL);

    /* the same weights as GGUF files written the way convert_hf_to_gguf.py writes them */
    check_model(ctx, "llama3", nbt_src("tests/golden/data/model_llama3/model.gguf"));
    check_model(ctx, "qwen3", nbt_src("tests/golden/data/model_qwen3/model.gguf"));

    /* the llama3 model again with a transformers-4 style config (rope_theta + rope_scaling) */
    char tmp[] = "/tmp/nibble-test-golden-XXXXXX";
    if (mkdtemp(tmp)) {
        char path[600], *src = realpath(nbt_src("tests/golden/data/model_llama3/model.safetensors"), NULL);
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if (!src || symlink(src, path) != 0) perror("symlink");
        free(src);
        snprintf(path, sizeof path, "%s/config.json", tmp);
        FILE *f = fopen(path, "wb");
        fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 96, "
              "\"hidden_size\": 32, \"intermediate_size\": 48, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
              "\"num_key_value_heads\": 1, \"head_dim\": 8, \"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-06, "
              "\"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
              "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 256}, \"tie_word_embeddings\": false}",
              f);
        fclose(f);
        check_model(ctx, "llama3", tmp);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    nb_ctx_release(ctx);
    return nbt_done("test_model_golden");
}

/* Tiny random Mixtral and Qwen3-MoE models (with and without norm_topk_prob, a dense mlp_only
 * layer) made by transformers (tests/golden/moe/, from gen_moe_golden.py): nibble's logits within
 * 1e-4 of PyTorch's and the gradients of loss = sum(logits * loss_weights) within 1e-3 relative
 * (max abs error over each tensor's max abs value), every parameter, routers included. */
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static void check_case(nb_ctx *ctx, const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s", nbt_src("tests/golden/moe"));
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", name);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *txt = nbt_slurp(path, NULL);
    cJSON *g = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    CHECK_MSG(g != NULL, "%s unreadable", path);
    if (!g) return;
    int64_t B = (int64_t)cJSON_GetObjectItem(g, "B")->valuedouble, T = (int64_t)cJSON_GetObjectItem(g, "T")->valuedouble;
    cJSON *ids = cJSON_GetObjectItem(g, "ids");
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * T));
    for (int64_t i = 0; i < B * T; i++) tok[i] = (int32_t)cJSON_GetArrayItem(ids, (int)i)->valuedouble;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, dir, &m));
    if (m) {
        int64_t V = nb_model_get_config(m)->vocab_size;
        size_t nb = 0, nw = 0;
        snprintf(path, sizeof path, "%s/logits_f32le.bin", dir);
        float *ref = nbt_slurp(path, &nb);
        snprintf(path, sizeof path, "%s/loss_weights_f32le.bin", dir);
        float *lw = nbt_slurp(path, &nw);
        CHECK_EQ_INT(nb, (size_t)(B * T * V) * 4);
        CHECK_EQ_INT(nw, (size_t)(B * T * V) * 4);
        float *lg = malloc(sizeof(float) * (size_t)(B * T * V));
        nb_forward_opts fo = {0};
        fo.train = 1;
        fo.logits = lg;
        CHECK_OK(ctx, nb_model_forward(ctx, m, tok, B, T, &fo));
        double e = 0;
        for (int64_t i = 0; i < B * T * V; i++) e = fmax(e, fabs((double)lg[i] - ref[i]));
        printf("%s: max |logits - transformers| = %.3g\n", name, e);
        CHECK_MSG(e <= 1e-4, "%s: logits off by %.3g", name, e);
        nb_backward_opts bo = {0};
        bo.dlogits = lw;   /* d(sum logits * w)/d logits = w */
        CHECK_OK(ctx, nb_model_backward(ctx, m, &bo, NULL));
        nb_st *st = NULL;
        snprintf(path, sizeof path, "%s/grads.safetensors", dir);
        CHECK_OK(ctx, nb_st_open(ctx, path, &st));
        double worst = 0;
        const char *worst_name = "";
        int64_t seen = 0;
        for (int64_t i = 0; st && i < nb_st_count(st); i++) {
            const char *pn = nb_st_entry_at(st, i)->name;
            int64_t p = nb_model_find_param(m, pn);
            CHECK_MSG(p >= 0, "%s: no parameter %s", name, pn);
            if (p < 0) continue;
            nb_tensor *t = NULL;
            CHECK_OK(ctx, nb_st_get(ctx, st, pn, &t));
            const float *want = t ? nb_tensor_data(t) : NULL, *have = nb_tensor_data(nb_model_grad(m, p));
            int64_t n = nb_tensor_numel(nb_model_param(m, p));
            CHECK_EQ_INT(t ? nb_tensor_numel(t) : -1, n);
            double mx = 0, err = 0;
            for (int64_t k = 0; want && k < n; k++) {
                mx = fmax(mx, fabs((double)want[k]));
                err = fmax(err, fabs((double)have[k] - want[k]));
            }
            double rel = err / (mx > 0 ? mx : 1);
            if (rel > worst) { worst = rel; worst_name = pn; }
            CHECK_MSG(rel <= 1e-3, "%s: gradient of %s off by %.3g relative", name, pn, rel);
            nb_tensor_release(t);
            seen++;
        }
        CHECK_EQ_INT(seen, nb_model_param_count(m));
        printf("%s: %lld gradients, worst %.3g relative (%s)\n", name, (long long)seen, worst, worst_name);
        nb_st_close(st);
        free(lg);
        free(ref);
        free(lw);
        nb_model_free(m);
    }
    free(tok);
    cJSON_Delete(g);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx)) return 1;
    check_case(ctx, "mixtral");
    check_case(ctx, "qwen3moe_norm");
    check_case(ctx, "qwen3moe_nonorm");
    nb_ctx_release(ctx);
    return nbt_done("test_model_moe_golden");
}

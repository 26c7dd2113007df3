/* Mixtures of experts (mixtral, qwen3_moe). The self-checking fixture: stories260K (a trained Llama)
 * with its FFN copied into E experts and a random router, written as a Mixtral HF folder and loaded
 * back. With renormalised top-k routing every token's output is sum_j w_j FFN(x) with sum_j w_j = 1,
 * so the logits equal the dense model's to float32 rounding for every E and k, the experts' gradients
 * sum to the dense FFN's and the router's gradient vanishes. A small random qwen3_moe (sparse step,
 * a dense mlp_only layer, no renormalisation) checks the router and expert gradients against central
 * differences of the loss, and the module names and configs are checked as HF writes them. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbtest.h"

static char tmpdir[256];

static double max_abs(const float *a, const float *b, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

static double max_abs1(const float *a, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i]));
    return e;
}

static float *pdata(const nb_model *m, const char *name) {
    int64_t i = nb_model_find_param(m, name);
    return i >= 0 ? nb_tensor_data(nb_model_param(m, i)) : NULL;
}

static float *gdata(const nb_model *m, const char *name) {
    int64_t i = nb_model_find_param(m, name);
    nb_tensor *g = i >= 0 ? nb_model_grad(m, i) : NULL;
    return g ? nb_tensor_data(g) : NULL;
}

/* The dense parameter an expert copy comes from: experts.E.w1 -> mlp.gate_proj, w3 -> up, w2 -> down. */
static void dense_name(const char *moe, char *out, size_t cap) {
    const char *x = strstr(moe, "block_sparse_moe.experts.");
    if (!x) { snprintf(out, cap, "%s", moe); return; }
    const char *w = strrchr(moe, '.') - 2;   /* "w1.weight" */
    const char *proj = w[1] == '1' ? "gate_proj" : w[1] == '3' ? "up_proj" : "down_proj";
    snprintf(out, cap, "%.*smlp.%s.weight", (int)(x - moe), moe, proj);
}

/* Writes the Mixtral fixture with E experts, top-k, to dir and loads it. */
static nb_model *fixture(nb_ctx *ctx, const nb_model *dense, int E, int k, const char *dir) {
    nb_model_config c = *nb_model_get_config(dense);
    c.arch = NB_ARCH_MIXTRAL;
    c.n_experts = E;
    c.n_experts_per_tok = k;
    c.norm_topk_prob = 1;
    c.moe_intermediate_size = c.intermediate_size;
    c.decoder_sparse_step = 1;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
    if (!m) return NULL;
    nb_rng rng;
    nb_rng_seed(&rng, 1000u + (uint64_t)(E * 16 + k));
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    for (int64_t i = 0; i < nb_model_param_count(m); i++) {
        const char *n = nb_model_param_name(m, i);
        nb_tensor *t = nb_model_param(m, i);
        float *d = nb_tensor_data(t);
        int64_t numel = nb_tensor_numel(t);
        if (strstr(n, ".gate.weight")) {   /* the router: any weights (a wide spread, so routing varies) */
            for (int64_t q = 0; q < numel; q++) d[q] = (float)(2.0 * nb_rng_uniform(&rng) - 1.0);
        } else {
            char dn[256];
            dense_name(n, dn, sizeof dn);
            const float *src = pdata(dense, dn);
            CHECK_MSG(src != NULL, "no dense parameter %s for %s", dn, n);
            if (src) memcpy(d, src, sizeof(float) * (size_t)numel);
        }
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, n, t));
    }
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    nb_st_writer_free(w);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": %lld,\n"
               " \"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld,\n"
               " \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld,\n"
               " \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"sliding_window\": null,\n"
               " \"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"router_aux_loss_coef\": 0.02,\n"
               " \"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2}\n",
            (long long)c.vocab_size, (long long)c.hidden_size, (long long)c.intermediate_size, (long long)c.n_layers,
            (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.head_dim, E, k);
    fclose(f);
    nb_model *loaded = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, dir, &loaded));
    if (loaded) {
        /* what was written is what was read */
        CHECK_EQ_INT(nb_model_param_count(loaded), nb_model_param_count(m));
        for (int64_t i = 0; i < nb_model_param_count(m) && i < nb_model_param_count(loaded); i++)
            CHECK(!memcmp(nb_tensor_data(nb_model_param(m, i)), nb_tensor_data(nb_model_param(loaded, i)),
                          sizeof(float) * (size_t)nb_tensor_numel(nb_model_param(m, i))));
    }
    nb_model_free(m);
    return loaded;
}

static void check_fixture(nb_ctx *ctx, nb_model *dense, const int32_t *tok, int64_t B, int64_t T,
                          const float *dense_logits, int E, int k) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/mixtral_e%d_k%d", tmpdir, E, k);
    nb_model *m = fixture(ctx, dense, E, k, dir);
    if (!m) return;
    const nb_model_config *c = nb_model_get_config(m);
    CHECK_EQ_INT(c->arch, NB_ARCH_MIXTRAL);
    CHECK(!strcmp(nb_model_arch_name(m), "mixtral"));
    CHECK_EQ_INT(c->n_experts, E);
    CHECK_EQ_INT(c->n_experts_per_tok, k);
    CHECK_EQ_INT(c->norm_topk_prob, 1);
    int64_t V = c->vocab_size, D = c->hidden_size;
    float *lg = malloc(sizeof(float) * (size_t)(B * T * V));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, B, T, lg));
    double e = max_abs(lg, dense_logits, B * T * V), scale = max_abs1(dense_logits, B * T * V);
    /* Tolerance: the two models compute the same real function; they differ by the roundings of
     * w_j = p_j / sum p (sum_j w_j = 1 within k ulps) and of sum_j w_j y_j (k more additions), a
     * relative 2^-24 (k + 1) per FFN output, amplified through 5 layers like any float32 rounding of
     * the dense model; the dense model itself is within 1e-4 of the float64 reference on these logits
     * (test_model_stories), so 1e-4 absolute (about 1e-5 relative to logits of magnitude ~10) is that
     * same float32 budget. */
    printf("mixtral E=%d k=%d: max |logits - dense| = %.3g (max |logit| %.3g)\n", E, k, e, scale);
    CHECK_MSG(e <= 1e-4, "E=%d k=%d: logits differ from the dense model's by %.3g", E, k, e);

    /* gradients of the LM loss: the copies' sum is the dense FFN's gradient, the rest equal, the router ~0 */
    nb_model_zero_grad(m);
    double loss_m = 0, loss_d = 0;
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, B, T, NULL, &loss_m));
    nb_model_zero_grad(dense);
    CHECK_OK(ctx, nb_model_lm_step(ctx, dense, tok, B, T, NULL, &loss_d));
    CHECK_NEAR(loss_m, loss_d, 1e-5);
    double worst = 0, router = 0;
    for (int64_t i = 0; i < nb_model_param_count(dense); i++) {
        const char *dn = nb_model_param_name(dense, i);
        const float *gd = nb_tensor_data(nb_model_grad(dense, i));
        int64_t numel = nb_tensor_numel(nb_model_param(dense, i));
        double gscale = max_abs1(gd, numel) + 1e-30, err = 0;
        const char *mlp = strstr(dn, "mlp.");
        if (!mlp) {
            const float *gm = gdata(m, dn);
            CHECK_MSG(gm != NULL, "no gradient of %s", dn);
            if (gm) err = max_abs(gm, gd, numel) / gscale;
        } else {
            const char *wn = strstr(mlp, "gate_proj") ? "w1" : strstr(mlp, "up_proj") ? "w3" : "w2";
            float *sum = calloc((size_t)numel, sizeof(float));
            for (int ex = 0; ex < E; ex++) {
                char en[256];
                snprintf(en, sizeof en, "%.*sblock_sparse_moe.experts.%d.%s.weight", (int)(mlp - dn), dn, ex, wn);
                const float *ge = gdata(m, en);
                CHECK_MSG(ge != NULL, "no gradient of %s", en);
                for (int64_t q = 0; ge && q < numel; q++) sum[q] += ge[q];
            }
            err = max_abs(sum, gd, numel) / gscale;
            free(sum);
        }
        worst = fmax(worst, err);
        /* relative 1e-4: the summed copies and the dense FFN see the same dL/dy up to the forward's
         * float32 differences above (1e-5 relative), plus E - 1 additions of the copies */
        CHECK_MSG(err <= 1e-4, "E=%d k=%d: gradient of %s off by %.3g relative", E, k, dn, err);
    }
    for (int64_t l = 0; l < c->n_layers; l++) {
        char rn[128];
        snprintf(rn, sizeof rn, "model.layers.%lld.block_sparse_moe.gate.weight", (long long)l);
        const float *gr = gdata(m, rn);
        CHECK(gr != NULL);
        if (gr) router = fmax(router, max_abs1(gr, E * D));
    }
    /* dL/dw_j = <dL/dout, y_j> is the same for every chosen copy, and renormalised weights make the
     * router's gradient (dw_j - sum_m w_m dw_m) / S vanish; float32 leaves ~1e-7 of |dw| ~ 1 */
    printf("mixtral E=%d k=%d: max relative gradient error %.3g, max |router grad| %.3g\n", E, k, worst, router);
    CHECK_MSG(router <= 1e-5, "E=%d k=%d: router gradient %.3g should vanish", E, k, router);
    free(lg);
    nb_model_free(m);
}

/* ---- PTQ: NVFP4 W4A16 of the fixture and of the dense model ------------------------------------- */

/* Every linear but the router (and the tied lm_head) whose width NVFP4's 16-element blocks divide
 * to NVFP4 weights (stories260K's FFN width 172 is not: down_proj / w2 stay BF16), fused siblings,
 * weights calibrated, exported in ModelOpt's layout into out. */
static void export_nvfp4(nb_ctx *ctx, nb_model *m, const char *out, int64_t want_groups) {
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    if (!qm) return;
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_NVFP4;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *n = nb_qmodel_name(qm, i);
        size_t L = strlen(n);
        nb_linear_info li;
        CHECK_OK(ctx, nb_model_linear_info(ctx, m, nb_model_find_module(m, n), &li));
        if (!strcmp(n, "lm_head") || (L > 5 && !strcmp(n + L - 5, ".gate")) || li.in_features % 16) continue;
        CHECK_OK(ctx, nb_qmodel_set(ctx, qm, n, &spec));
    }
    int64_t groups = 0;
    CHECK_OK(ctx, nb_qmodel_fuse_siblings(ctx, qm, &groups));
    CHECK_EQ_INT(groups, want_groups);
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    nb_qmodel_free(qm);
}

static int same_tensor(nb_ctx *ctx, nb_st *a, const char *na, nb_st *b, const char *nb_) {
    nb_tensor *ta = NULL, *tb = NULL;
    CHECK_OK(ctx, nb_st_get(ctx, a, na, &ta));
    CHECK_OK(ctx, nb_st_get(ctx, b, nb_, &tb));
    int same = ta && tb && nb_tensor_nbytes(ta) == nb_tensor_nbytes(tb) &&
               !memcmp(nb_tensor_data(ta), nb_tensor_data(tb), (size_t)nb_tensor_nbytes(ta));
    nb_tensor_release(ta);
    nb_tensor_release(tb);
    return same;
}

/* Each expert's exported w1/w3 (weight, weight_scale, weight_scale_2) and w2 (BF16 weight) equal,
 * byte for byte, the dense model's gate/up/down: same weights, and each expert's w1/w3 pair shares
 * one global scale as the dense gate/up pair does. The router stays unquantized, under its HF name. */
static void check_ptq(nb_ctx *ctx, nb_model *dense) {
    char dir[512], out[600], dout[600];
    const int E = 3;
    snprintf(dir, sizeof dir, "%s/ptq_fixture", tmpdir);
    nb_model *m = fixture(ctx, dense, E, 2, dir);
    if (!m) return;
    int64_t Lc = nb_model_get_config(m)->n_layers;
    snprintf(out, sizeof out, "%s/ptq_moe_nvfp4", tmpdir);
    snprintf(dout, sizeof dout, "%s/ptq_dense_nvfp4", tmpdir);
    export_nvfp4(ctx, m, out, Lc * (1 + E));   /* qkv and each expert's w1/w3 per layer */
    export_nvfp4(ctx, dense, dout, Lc * 2);   /* qkv and gate/up per layer */
    nb_st *a = NULL, *b = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, out, &a));
    CHECK_OK(ctx, nb_st_open(ctx, dout, &b));
    if (a && b) {
        static const char *const wn[3] = {"w1", "w3", "w2"}, *const dn[3] = {"gate_proj", "up_proj", "down_proj"};
        static const char *const sfx[3] = {"weight", "weight_scale", "weight_scale_2"};
        int compared = 0, equal = 0;
        for (int64_t l = 0; l < Lc; l++)
            for (int e = 0; e < E; e++)
                for (int r = 0; r < 3; r++)
                    for (int q = 0; q < (r < 2 ? 3 : 1); q++) {
                        char x[256], y[256];
                        snprintf(x, sizeof x, "model.layers.%lld.block_sparse_moe.experts.%d.%s.%s", (long long)l, e, wn[r],
                                 sfx[q]);
                        snprintf(y, sizeof y, "model.layers.%lld.mlp.%s.%s", (long long)l, dn[r], sfx[q]);
                        compared++;
                        equal += same_tensor(ctx, a, x, b, y);
                    }
        CHECK_EQ_INT(equal, compared);
        CHECK_EQ_INT(compared, Lc * E * 7);
        /* the router: unquantized (BF16), its HF name, no scales */
        int64_t g = nb_st_find(a, "model.layers.0.block_sparse_moe.gate.weight");
        CHECK(g >= 0);
        if (g >= 0) CHECK_EQ_INT(nb_st_entry_at(a, g)->dtype, NB_BF16);
        CHECK(nb_st_find(a, "model.layers.0.block_sparse_moe.gate.weight_scale") < 0);
        CHECK(nb_st_find(a, "model.layers.0.mlp.gate_proj.weight") < 0);
        printf("ptq: %d expert tensors equal the dense model's NVFP4 bytes\n", equal);
    }
    nb_st_close(a);
    nb_st_close(b);
    nb_model_free(m);
}

/* ---- qwen3_moe: names, sparse layers, gradients against central differences ---------------------- */

static double lm_loss(nb_ctx *ctx, nb_model *m, const int32_t *tok, int64_t B, int64_t T) {
    double loss = 0;
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, B, T, NULL, &loss));
    return loss;
}

/* d loss along a random direction v of parameter `name`: central difference vs <grad, v>. */
static void fd_check(nb_ctx *ctx, nb_model *m, const char *name, const int32_t *tok, int64_t B, int64_t T,
                     uint64_t seed) {
    int64_t p = nb_model_find_param(m, name);
    CHECK_MSG(p >= 0, "no parameter %s", name);
    if (p < 0) return;
    float *w = nb_tensor_data(nb_model_param(m, p));
    int64_t n = nb_tensor_numel(nb_model_param(m, p));
    float *w0 = malloc(sizeof(float) * (size_t)n), *v = malloc(sizeof(float) * (size_t)n);
    memcpy(w0, w, sizeof(float) * (size_t)n);
    nb_rng rng;
    nb_rng_seed(&rng, seed);
    for (int64_t i = 0; i < n; i++) v[i] = (float)nb_rng_normal(&rng);
    nb_model_zero_grad(m);
    lm_loss(ctx, m, tok, B, T);
    const float *g = nb_tensor_data(nb_model_grad(m, p));
    double an = 0;
    for (int64_t i = 0; i < n; i++) an += (double)g[i] * v[i];
    const double h = 1e-3;
    for (int64_t i = 0; i < n; i++) w[i] = (float)(w0[i] + h * v[i]);
    double lp = lm_loss(ctx, m, tok, B, T);
    for (int64_t i = 0; i < n; i++) w[i] = (float)(w0[i] - h * v[i]);
    double lm = lm_loss(ctx, m, tok, B, T);
    memcpy(w, w0, sizeof(float) * (size_t)n);
    double fd = (lp - lm) / (2 * h);
    /* Tolerance: the loss is a mean of float32 log-softmaxes (~1e-7 relative of a loss ~4, so ~1e-6
     * absolute per evaluation, /2h = 5e-4 on fd), plus O(h^2) truncation. Top-k routing is piecewise:
     * for these tokens and weights no token's top-k changes within the step (other token sequences
     * tried put a router near a tie, and the difference then jumps by O(10): a switch, not an error) */
    printf("qwen3_moe norm_topk_prob=%d %s: analytic %.6g, central difference %.6g\n",
           (int)nb_model_get_config(m)->norm_topk_prob, name, an, fd);
    CHECK_MSG(fabs(an - fd) <= 1e-3 + 1e-2 * fabs(an), "%s: analytic %.6g vs central difference %.6g", name, an, fd);
    free(w0);
    free(v);
}

static void check_qwen3_moe(nb_ctx *ctx) {
    nb_model_config c;
    nb_model_config_init(&c);
    c.arch = NB_ARCH_QWEN3_MOE;
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.intermediate_size = 20;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 4;
    c.qk_norm = 1;
    c.rms_eps = 1e-6;
    c.n_experts = 5;
    c.n_experts_per_tok = 2;
    c.moe_intermediate_size = 12;
    c.decoder_sparse_step = 1;
    c.mlp_only_layers[0] = (uint64_t)1 << 2;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
    if (!m) return;
    CHECK_OK(ctx, nb_model_init_random(ctx, m, 11, 0.3));
    /* HF names: a sparse layer's router and experts, the mlp_only layer's dense mlp */
    static const char *const present[] = {"model.layers.0.mlp.gate", "model.layers.0.mlp.experts",
                                          "model.layers.0.mlp.experts.4", "model.layers.3.mlp.experts.0.gate_proj",
                                          "model.layers.1.mlp.experts.2.up_proj",
                                          "model.layers.1.mlp.experts.4.down_proj", "model.layers.2.mlp.gate_proj",
                                          "model.layers.2.mlp.down_proj", "model.layers.0.self_attn.q_norm"};
    for (size_t i = 0; i < sizeof present / sizeof present[0]; i++)
        CHECK_MSG(nb_model_find_module(m, present[i]) >= 0, "no module %s", present[i]);
    CHECK(nb_model_find_module(m, "model.layers.0.mlp.gate_proj") < 0);
    CHECK(nb_model_find_module(m, "model.layers.2.mlp.gate") < 0);
    nb_linear_info li;
    CHECK_OK(ctx, nb_model_linear_info(ctx, m, nb_model_find_module(m, "model.layers.1.mlp.experts.2.up_proj"), &li));
    CHECK_EQ_INT(li.role, NB_LINEAR_EXPERT_UP);
    CHECK_EQ_INT(li.expert, 2);
    CHECK_EQ_INT(li.layer, 1);
    CHECK_EQ_INT(li.in_features, 16);
    CHECK_EQ_INT(li.out_features, 12);
    CHECK_OK(ctx, nb_model_linear_info(ctx, m, nb_model_find_module(m, "model.layers.0.mlp.gate"), &li));
    CHECK_EQ_INT(li.role, NB_LINEAR_ROUTER);
    CHECK_EQ_INT(li.expert, -1);
    CHECK_EQ_INT(li.out_features, 5);
    CHECK_OK(ctx, nb_model_linear_info(ctx, m, nb_model_find_module(m, "model.layers.2.mlp.up_proj"), &li));
    CHECK_EQ_INT(li.role, NB_LINEAR_UP);
    CHECK_EQ_INT(li.out_features, 20);

    /* written as HF writes it and loaded back: the same config and logits, bit for bit */
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/qwen3_moe", tmpdir);
    mkdir(dir, 0755);
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    for (int64_t i = 0; i < nb_model_param_count(m); i++)
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, nb_model_param_name(m, i), nb_model_param(m, i)));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    nb_st_writer_free(w);
    const char *cfg_fmt =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 40,\n"
        " \"hidden_size\": 16, \"intermediate_size\": 20, \"moe_intermediate_size\": 12,\n"
        " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 4,\n"
        " \"num_experts\": 5, \"num_experts_per_tok\": %d, \"norm_topk_prob\": false,\n"
        " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [2], \"hidden_act\": \"silu\",\n"
        " \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}\n";
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, cfg_fmt, 2);
    fclose(f);
    nb_model *l = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, dir, &l));
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (int32_t)((i * 5 + 1) % 40);
    if (l) {
        const nb_model_config *lc = nb_model_get_config(l);
        CHECK_EQ_INT(lc->arch, NB_ARCH_QWEN3_MOE);
        CHECK_EQ_INT(lc->n_experts, 5);
        CHECK_EQ_INT(lc->n_experts_per_tok, 2);
        CHECK_EQ_INT(lc->norm_topk_prob, 0);
        CHECK_EQ_INT(lc->moe_intermediate_size, 12);
        CHECK_EQ_INT(lc->mlp_only_layers[0], 4);
        CHECK_EQ_INT(lc->qk_norm, 1);
        float a[16 * 40], b[16 * 40];
        CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 2, 8, a));
        CHECK_OK(ctx, nb_model_logits(ctx, l, tok, 2, 8, b));
        CHECK(!memcmp(a, b, sizeof a));
        nb_model_free(l);
    }
    f = fopen(path, "w");
    fprintf(f, cfg_fmt, 6);
    fclose(f);
    l = NULL;
    CHECK_FAIL(ctx, nb_model_load(ctx, dir, &l), NB_ERR_FORMAT, "num_experts_per_tok 6 must be in [1, num_experts = 5]");

    /* an export of the memory model (no config.json to copy: one is written from the config) in
     * float32 loads back as the same qwen3_moe, sparse and dense layers alike */
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.dtype = NB_F32;
    snprintf(path, sizeof path, "%s/qwen3_moe_export", tmpdir);
    if (qm) CHECK_OK(ctx, nb_qmodel_export(ctx, qm, path, &eo));
    nb_qmodel_free(qm);
    l = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, path, &l));
    if (l) {
        const nb_model_config *lc = nb_model_get_config(l);
        CHECK_EQ_INT(lc->arch, NB_ARCH_QWEN3_MOE);
        CHECK_EQ_INT(lc->n_experts, 5);
        CHECK_EQ_INT(lc->moe_intermediate_size, 12);
        CHECK_EQ_INT(lc->mlp_only_layers[0], 4);
        float a[16 * 40], b[16 * 40];
        CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 2, 8, a));
        CHECK_OK(ctx, nb_model_logits(ctx, l, tok, 2, 8, b));
        CHECK(!memcmp(a, b, sizeof a));
        nb_model_free(l);
    }

    /* router and experts' gradients, with and without renormalised top-k weights, both recompute modes */
    nb_model_free(m);
    static const char *const fd_params[] = {"model.layers.0.mlp.gate.weight", "model.layers.3.mlp.gate.weight",
                                            "model.layers.1.mlp.experts.1.gate_proj.weight",
                                            "model.layers.3.mlp.experts.4.down_proj.weight",
                                            "model.layers.0.mlp.experts.0.up_proj.weight",
                                            "model.layers.2.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"};
    for (int norm = 0; norm < 2; norm++) {
        c.norm_topk_prob = norm;
        m = NULL;
        CHECK_OK(ctx, nb_model_new(ctx, &c, &m));
        if (!m) return;
        CHECK_OK(ctx, nb_model_init_random(ctx, m, 11, 0.3));
        nb_model_set_recompute(m, norm ? NB_RECOMPUTE_ALWAYS : NB_RECOMPUTE_NEVER);
        for (size_t i = 0; i < sizeof fd_params / sizeof fd_params[0]; i++) fd_check(ctx, m, fd_params[i], tok, 2, 8, 100 + i);
        nb_model_free(m);
    }
}

int main(void) {
    const char *hf = nbt_data("stories260K/hf");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nibble-test-model-moe-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx)) return 1;
    nb_model *dense = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &dense));
    if (dense) {
        const int64_t B = 2, T = 24, V = nb_model_get_config(dense)->vocab_size;
        int32_t tok[48];
        nb_rng rng;
        nb_rng_seed(&rng, 7);
        for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(nb_rng_next(&rng) % (uint64_t)V);
        float *lg = malloc(sizeof(float) * (size_t)(B * T * V));
        CHECK_OK(ctx, nb_model_logits(ctx, dense, tok, B, T, lg));
        static const int cases[][2] = {{1, 1}, {2, 1}, {2, 2}, {3, 2}, {4, 1}, {4, 3}, {4, 4}, {8, 2}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            check_fixture(ctx, dense, tok, B, T, lg, cases[i][0], cases[i][1]);
        check_ptq(ctx, dense);
        free(lg);
        nb_model_free(dense);
    }
    check_qwen3_moe(ctx);
    nb_ctx_release(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return nbt_done("test_model_moe");
}

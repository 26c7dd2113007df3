/* Loading errors and formats: configs that name unsupported things, configs that disagree with the
 * weights (shape, layer count, biases, tying), missing or extra tensors, wrong dtypes, GGUF
 * metadata patched to lie; BF16 and sharded safetensors load to the same model; module, parameter
 * and glob queries. Every failure must be the named status with a message naming the culprit. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbtest.h"

static const char *k_config =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 64,"
    " \"intermediate_size\": 172, \"num_hidden_layers\": 5, \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
    " \"head_dim\": 8, \"hidden_act\": \"silu\", \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 10000.0, \"rope_scaling\": null, \"attention_bias\": false, \"mlp_bias\": false,"
    " \"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2 %s}";

static char tmpdir[256];
static int case_no = 0;

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* A model directory: config.json = k_config with `replace` substituted for `find` (or `extra`
 * appended), weights symlinked from the shared copy. */
static const char *make_dir(const char *find, const char *replace, const char *extra) {
    static char dir[512];
    char cfg[4096], path[600];
    snprintf(dir, sizeof dir, "%s/case%d", tmpdir, ++case_no);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, k_config, extra ? extra : "");
    if (find) {
        char *p = strstr(cfg, find);
        if (p) {
            char rest[4096];
            snprintf(rest, sizeof rest, "%s", p + strlen(find));
            snprintf(p, sizeof cfg - (size_t)(p - cfg), "%s%s", replace, rest);
        }
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *target = realpath(nbt_data("stories260K/hf/model.safetensors"), NULL);
    if (!target || symlink(target, path) != 0) perror("symlink");
    free(target);
    return dir;
}

static nb_status load(nb_ctx *ctx, const char *path) {
    nb_model *m = NULL;
    nb_status s = nb_model_load(ctx, path, &m);
    nb_model_free(m);
    return s;
}

/* Write the stories260K tensors (optionally converted, dropped or replaced) as a new directory. */
typedef struct { const char *drop; const char *retype; int dtype; int64_t shard; const char *extra_name; } wopts;
static const char *write_weights(nb_ctx *ctx, const wopts *o) {
    static char dir[512];
    char path[600], cfg[4096];
    snprintf(dir, sizeof dir, "%s/case%d", tmpdir, ++case_no);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, k_config, "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, nbt_data("stories260K/hf"), &st));
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    nb_tensor *keep[64];
    int nk = 0;
    for (int64_t i = 0; i < nb_st_count(st); i++) {
        const char *name = nb_st_entry_at(st, i)->name;
        if (o->drop && !strcmp(name, o->drop)) continue;
        nb_tensor *t = NULL, *c = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, name, &t));
        int dt = o->dtype;
        if (o->retype && !strcmp(name, o->retype)) dt = NB_I32;
        CHECK_OK(ctx, nb_tensor_to(ctx, t, (nb_dtype)dt, &c));
        nb_tensor_release(t);
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, name, c));
        keep[nk++] = c;
    }
    if (o->extra_name) {
        nb_tensor *t = NULL, *c = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, "model.embed_tokens.weight", &t));
        CHECK_OK(ctx, nb_tensor_to(ctx, t, NB_F32, &c));
        float *d = nb_tensor_data(c);
        d[0] += 1.0f;
        nb_tensor_release(t);
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, o->extra_name, c));
        keep[nk++] = c;
    }
    if (o->shard) CHECK_OK(ctx, nb_st_writer_write_sharded(ctx, w, dir, o->shard));
    else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    }
    nb_st_writer_free(w);
    for (int i = 0; i < nk; i++) nb_tensor_release(keep[i]);
    nb_st_close(st);
    return dir;
}

static const char *patched_gguf(const char *find, size_t flen, size_t off, const void *bytes, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/case%d.gguf", tmpdir, ++case_no);
    FILE *f = fopen(nbt_data("stories260K/stories260K.gguf"), "rb");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *d = malloc((size_t)len);
    if (fread(d, 1, (size_t)len, f) != (size_t)len) { fclose(f); free(d); return NULL; }
    fclose(f);
    char *p = memmem(d, (size_t)len, find, flen);
    CHECK(p != NULL);
    if (p) memcpy(p + flen + off, bytes, n);
    f = fopen(path, "wb");
    fwrite(d, 1, (size_t)len, f);
    fclose(f);
    free(d);
    return path;
}

static void test_config_errors(nb_ctx *ctx) {
    CHECK_OK(ctx, load(ctx, make_dir(NULL, NULL, NULL)));
    CHECK_FAIL(ctx, load(ctx, make_dir("\"llama\"", "\"gpt2\"", NULL)), NB_ERR_UNSUPPORTED,
               "unsupported model_type 'gpt2' (supported: llama, mistral, qwen2, qwen3, mixtral, qwen3_moe)");
    CHECK_FAIL(ctx, load(ctx, make_dir("LlamaForCausalLM", "LlamaForSequenceClassification", NULL)), NB_ERR_UNSUPPORTED,
               "unsupported architectures entry 'LlamaForSequenceClassification'");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"silu\"", "\"gelu\"", NULL)), NB_ERR_UNSUPPORTED, "hidden_act 'gelu'");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}", NULL)),
               NB_ERR_UNSUPPORTED, "rope_scaling type 'yarn'");
    CHECK_FAIL(ctx, load(ctx, make_dir(NULL, NULL, ", \"partial_rotary_factor\": 0.5")), NB_ERR_UNSUPPORTED,
               "partial_rotary_factor");
    CHECK_FAIL(ctx, load(ctx, make_dir(NULL, NULL, ", \"quantization_config\": {\"quant_method\": \"fp8\"}")),
               NB_ERR_UNSUPPORTED, "quantization_config");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"vocab_size\": 512,", "", NULL)), NB_ERR_FORMAT, "missing required field 'vocab_size'");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_hidden_layers\": 5", "\"num_hidden_layers\": \"five\"", NULL)), NB_ERR_FORMAT,
               "field 'num_hidden_layers' must be an integer");
    /* numbers that would overflow the cast to an integer (undefined behaviour) are refused by range */
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 1e36", NULL)), NB_ERR_FORMAT,
               "config.json: field 'num_hidden_layers' is 1e+36, outside [-2147483648, 2147483647]");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"hidden_size\": 64", "\"hidden_size\": -1e300", NULL)), NB_ERR_FORMAT,
               "config.json: field 'hidden_size' is -1e+300, outside [-2147483648, 2147483647]");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"rope_scaling\": null",
                                       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                                       "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 9.3e18}", NULL)),
               NB_ERR_FORMAT, "field 'original_max_position_embeddings' is 9.3e+18, outside [-2147483648, 2147483647]");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 5.5", NULL)), NB_ERR_FORMAT,
               "field 'num_hidden_layers' must be an integer");
    /* sizes within int32 but more weights than the file holds are refused before the model is
     * allocated: per layer 2*64*(64+32) + 3*64*172 = 45312 weights, times 10^6 layers, plus the
     * 512 x 64 embedding = 45312032768; 8 per byte of the 1040128 data bytes (260032 float32) is 8321024 */
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 1000000", NULL)), NB_ERR_FORMAT,
               "config.json describes a model of 45312032768 weights, more than the 1040128 bytes of tensor data can hold");
    /* a token id out of int32 range is no id (bos), and is skipped in an eos list */
    {
        nb_model_config cfg;
        CHECK_OK(ctx, nb_model_read_config(ctx, make_dir("\"bos_token_id\": 1, \"eos_token_id\": 2",
                                                         "\"bos_token_id\": 1e300, \"eos_token_id\": [-1e300, 2, 3.5]", NULL),
                                           &cfg));
        CHECK_EQ_INT(cfg.bos_token_id, -1);
        CHECK_EQ_INT(cfg.n_eos, 1);
        CHECK_EQ_INT(cfg.eos_token_ids[0], 2);
    }
    /* config disagrees with the weights */
    CHECK_FAIL(ctx, load(ctx, make_dir("\"hidden_size\": 64", "\"hidden_size\": 128", NULL)), NB_ERR_SHAPE,
               "tensor 'model.embed_tokens.weight' has shape [512, 64], expected [512, 128]");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"intermediate_size\": 172", "\"intermediate_size\": 100", NULL)), NB_ERR_SHAPE,
               "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [172, 64], expected [100, 64]");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 8", NULL)), NB_ERR_SHAPE,
               "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 64], expected [64, 64]");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 6", NULL)), NB_ERR_NOT_FOUND,
               "missing tensor 'model.layers.5.self_attn.q_proj.weight'");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 4", NULL)), NB_ERR_FORMAT,
               "unexpected tensor 'model.layers.4.");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"attention_bias\": false", "\"attention_bias\": true", NULL)), NB_ERR_NOT_FOUND,
               "missing tensor 'model.layers.0.self_attn.q_proj.bias'");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", NULL)),
               NB_ERR_NOT_FOUND, "missing tensor 'lm_head.weight'");
    CHECK_FAIL(ctx, load(ctx, make_dir("\"llama\"", "\"qwen3\"", NULL)), NB_ERR_UNSUPPORTED, "architectures entry 'LlamaForCausalLM'");
    CHECK_FAIL(ctx, load(ctx, make_dir("[\"LlamaForCausalLM\"], \"model_type\": \"llama\"", "[], \"model_type\": \"qwen3\"", NULL)),
               NB_ERR_NOT_FOUND,
               "missing tensor 'model.layers.0.self_attn.q_norm.weight'");
    /* no config.json, not a model at all, nothing there */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/empty", tmpdir);
    mkdir(dir, 0755);
    CHECK_FAIL(ctx, load(ctx, dir), NB_ERR_NOT_FOUND, "config.json");
    CHECK_FAIL(ctx, load(ctx, nbt_data("text/tinystories_valid_head_776KiB.txt")), NB_ERR_FORMAT,
               "neither a model directory");
    CHECK_FAIL(ctx, load(ctx, "/nonexistent/model"), NB_ERR_IO, "cannot open /nonexistent/model");
}

static void test_weight_files(nb_ctx *ctx) {
    wopts o = {0};
    o.dtype = NB_F32;
    o.drop = "model.layers.2.mlp.up_proj.weight";
    CHECK_FAIL(ctx, load(ctx, write_weights(ctx, &o)), NB_ERR_NOT_FOUND, "missing tensor 'model.layers.2.mlp.up_proj.weight'");
    o.drop = NULL;
    o.retype = "model.norm.weight";
    CHECK_FAIL(ctx, load(ctx, write_weights(ctx, &o)), NB_ERR_UNSUPPORTED,
               "tensor 'model.norm.weight' has dtype I32; only F32, BF16 and F16 weights are read");
    o.retype = NULL;
    o.extra_name = "lm_head.weight";   /* present, different, but config says tied */
    CHECK_FAIL(ctx, load(ctx, write_weights(ctx, &o)), NB_ERR_FORMAT, "lm_head.weight differs from model.embed_tokens.weight");
    o.extra_name = NULL;

    /* reference: the shared F32 model */
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (i * 37 + 1) % 512;
    float *ref = malloc(sizeof(float) * 64 * 512), *lg = malloc(sizeof(float) * 64 * 512);
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, nbt_data("stories260K/hf"), &m));
    CHECK_OK(ctx, nb_model_logits(ctx, m, ids, 1, 64, ref));
    nb_model_free(m);
    /* sharded into several files: the same model bit for bit */
    o.shard = 200000;
    const char *sharded = write_weights(ctx, &o);
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", sharded);
    CHECK(access(idx, F_OK) == 0);
    m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, sharded, &m));
    if (m) {
        CHECK_OK(ctx, nb_model_logits(ctx, m, ids, 1, 64, lg));
        CHECK(!memcmp(lg, ref, sizeof(float) * 64 * 512));
        nb_model_free(m);
    }
    /* BF16: converted once at load; the source dtype is recorded */
    o.shard = 0;
    o.dtype = NB_BF16;
    m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, write_weights(ctx, &o), &m));
    if (m) {
        CHECK_EQ_INT(nb_model_param_src_dtype(m, 0), NB_BF16);
        const float *w = nb_tensor_data(nb_model_param(m, 0));
        uint32_t bits;
        memcpy(&bits, &w[5], 4);
        CHECK_EQ_INT(bits & 0xFFFF, 0);   /* exactly representable in bf16 */
        CHECK_OK(ctx, nb_model_logits(ctx, m, ids, 1, 64, lg));
        double e = 0;
        for (int i = 0; i < 64 * 512; i++) e = fmax(e, fabs(lg[i] - ref[i]));
        printf("bf16 weights: max |logits - f32| = %.3g\n", e);
        CHECK(e > 0 && e < 0.5);
        nb_model_free(m);
    }
    free(ref);
    free(lg);
}

static void test_gguf_errors(nb_ctx *ctx) {
    CHECK_FAIL(ctx, load(ctx, patched_gguf("general.architecture", 20, 12, "falco", 5)), NB_ERR_UNSUPPORTED,
               "unsupported GGUF architecture 'falco' (supported: llama, qwen2, qwen3)");
    uint32_t six = 6, four = 4;
    CHECK_FAIL(ctx, load(ctx, patched_gguf("llama.block_count", 17, 4, &six, 4)), NB_ERR_NOT_FOUND,
               "missing tensor 'blk.5.attn_q.weight' (model.layers.5.self_attn.q_proj.weight)");
    CHECK_FAIL(ctx, load(ctx, patched_gguf("llama.block_count", 17, 4, &four, 4)), NB_ERR_FORMAT,
               "unexpected tensor 'blk.4.");
    /* 2^32 - 1 blocks: refused from the metadata before 4 G layer records are allocated; 45312 weights per
     * block times 4294967295, plus the 512 x 64 embedding; 8 per byte of the file's tensor data */
    uint32_t many = 0xFFFFFFFFu;
    CHECK_FAIL(ctx, load(ctx, patched_gguf("llama.block_count", 17, 4, &many, 4)), NB_ERR_FORMAT,
               "the GGUF metadata describes a model of 194613558103808 weights, more than the ");
    uint32_t ff = 100;
    CHECK_FAIL(ctx, load(ctx, patched_gguf("llama.feed_forward_length", 25, 4, &ff, 4)), NB_ERR_SHAPE,
               "tensor 'blk.0.ffn_gate.weight' has shape [172, 64], expected [100, 64]");
}

static void test_queries(nb_ctx *ctx) {
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, nbt_data("stories260K/hf"), &m));
    if (!m) return;
    /* model, embed_tokens, layers, 5 x (layer, self_attn, 4 linears, mlp, 3 linears, 2 norms), norm, lm_head */
    CHECK_EQ_INT(nb_model_module_count(m), 3 + 5 * 12 + 2);
    CHECK(!strcmp(nb_model_module_name(m, 0), "model"));
    int64_t q = nb_model_find_module(m, "model.layers.3.self_attn.q_proj");
    CHECK(q > 0);
    CHECK_EQ_INT(nb_model_module_kind(m, q), NB_MODULE_LINEAR);
    CHECK_EQ_INT(nb_model_module_kind(m, nb_model_find_module(m, "model.norm")), NB_MODULE_RMSNORM);
    CHECK_EQ_INT(nb_model_module_kind(m, nb_model_find_module(m, "model.embed_tokens")), NB_MODULE_EMBEDDING);
    CHECK_EQ_INT(nb_model_module_kind(m, nb_model_find_module(m, "model.layers.3.mlp")), NB_MODULE_CONTAINER);
    CHECK_EQ_INT(nb_model_find_module(m, "model.layers.5"), -1);
    nb_linear_info li;
    CHECK_OK(ctx, nb_model_linear_info(ctx, m, q, &li));
    CHECK_EQ_INT(li.in_features, 64);
    CHECK_EQ_INT(li.out_features, 64);
    CHECK_EQ_INT(li.layer, 3);
    CHECK_EQ_INT(li.role, NB_LINEAR_Q);
    CHECK_EQ_INT(li.has_bias, 0);
    CHECK(!strcmp(nb_model_param_name(m, li.weight_param), "model.layers.3.self_attn.q_proj.weight"));
    int64_t lm = nb_model_find_module(m, "lm_head");
    CHECK_OK(ctx, nb_model_linear_info(ctx, m, lm, &li));
    CHECK_EQ_INT(li.tied, 1);
    CHECK_EQ_INT(li.role, NB_LINEAR_LM_HEAD);
    CHECK_EQ_INT(li.weight_param, nb_model_find_param(m, "model.embed_tokens.weight"));
    CHECK_EQ_INT(nb_model_find_param(m, "lm_head.weight"), 0);
    CHECK_FAIL(ctx, nb_model_linear_info(ctx, m, 0, &li), NB_ERR_INVALID, "not a linear module");
    /* parameter views: HF names and shapes, one flat buffer */
    nb_tensor *t = nb_model_param(m, nb_model_find_param(m, "model.layers.0.mlp.down_proj.weight"));
    CHECK_EQ_INT(t->ndim, 2);
    CHECK_EQ_INT(t->shape[0], 64);
    CHECK_EQ_INT(t->shape[1], 172);
    CHECK(nb_tensor_data(t) == (float *)nb_tensor_data(nb_model_flat_params(m)) +
                                   nb_model_param_offset(m, nb_model_find_param(m, "model.layers.0.mlp.down_proj.weight")));
    CHECK(nb_model_grad(m, 0) == NULL);
    CHECK_OK(ctx, nb_model_alloc_grads(ctx, m));
    CHECK(nb_model_grad(m, 0) != NULL);
    /* globs: no path semantics, '*' crosses dots */
    int n = 0;
    for (int64_t i = 0; i < nb_model_module_count(m); i++) n += nb_glob_match("*.mlp.*", nb_model_module_name(m, i));
    CHECK_EQ_INT(n, 15);
    CHECK(nb_glob_match("model.layers.[0-2].self_attn.?_proj", "model.layers.1.self_attn.k_proj"));
    CHECK(!nb_glob_match("model.layers.[0-2].self_attn.?_proj", "model.layers.3.self_attn.k_proj"));
    CHECK(nb_glob_match("model.layers.[!0].*", "model.layers.4.mlp"));
    CHECK(!nb_glob_match("model.layers.[!0].*", "model.layers.0.mlp"));
    CHECK(nb_glob_match("*", ""));
    CHECK(nb_glob_match("lm_head", "lm_head"));
    CHECK(!nb_glob_match("lm_head", "lm_head2"));
    CHECK(nb_glob_match("a\\*b", "a*b"));
    CHECK(!nb_glob_match("a\\*b", "axb"));
    CHECK(nb_glob_match("*q_proj*weight", "model.layers.0.self_attn.q_proj.weight"));
    nb_model_free(m);
}

int main(void) {
    nbt_data("stories260K/hf/model.safetensors");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nibble-test-model-load-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    test_config_errors(ctx);
    test_weight_files(ctx);
    test_gguf_errors(ctx);
    test_queries(ctx);
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return nbt_done("test_model_load");
}

/* Quantized models end to end on stories260K: per-module specs, fused siblings sharing
 * weight_scale_2, the export guard (missing amax / global_amax named; allow_uncalibrated),
 * the ModelOpt layout (every tensor, dtype, shape and JSON field of FORMATS §3), the
 * compressed-tensors layout (§4), restore-then-export byte equality, interrupted export. */
#include "nbtest.h"
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>

static char tmpdir[256];

static char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = -1;
    b[n < 0 ? 0 : n] = 0;
    fclose(f);
    if (len) *len = n;
    return b;
}

static int same_file(const char *a, const char *b) {
    long la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, (size_t)la) == 0;
    free(x);
    free(y);
    return same;
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void path(char *out, const char *dir, const char *name) { snprintf(out, 512, "%s/%s", dir, name); }

/* W4A16 NVFP4 on every linear layer that can take it (down_proj is 172 wide; lm_head is tied). */
static void setup_w4a16(nb_ctx *ctx, nb_qmodel *qm, int32_t fmt) {
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = fmt;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        if (strstr(name, "down_proj")) {
            CHECK_FAIL(ctx, nb_qmodel_set(ctx, qm, name, &spec), NB_ERR_SHAPE, "in_features 172 is not divisible");
            CHECK_OK(ctx, nb_qmodel_exclude(ctx, qm, name, "in_features 172 not divisible by 16"));
        } else if (strcmp(name, "lm_head") == 0) {
            CHECK_FAIL(ctx, nb_qmodel_set(ctx, qm, name, &spec), NB_ERR_INVALID, "tied");
        } else {
            CHECK_OK(ctx, nb_qmodel_set(ctx, qm, name, &spec));
        }
    }
}

static float f32_of(nb_st *st, nb_ctx *ctx, const char *name) {
    nb_tensor *t = NULL;
    if (nb_st_get(ctx, st, name, &t) != NB_OK) return -1;
    float v = *(const float *)nb_tensor_data(t);
    nb_tensor_release(t);
    return v;
}

static void check_modelopt_export(nb_ctx *ctx, const char *dir) {
    char p[512];
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    if (!st) return;
    const nb_st_entry *e;
    int64_t i = nb_st_find(st, "model.layers.0.self_attn.q_proj.weight");
    CHECK(i >= 0);
    e = nb_st_entry_at(st, i);
    CHECK_EQ_INT(e->dtype, NB_U8);
    CHECK_EQ_INT(e->shape[0], 64);
    CHECK_EQ_INT(e->shape[1], 32);
    e = nb_st_entry_at(st, nb_st_find(st, "model.layers.0.self_attn.q_proj.weight_scale"));
    CHECK_EQ_INT(e->dtype, NB_E4M3);
    CHECK_EQ_INT(e->shape[0], 64);
    CHECK_EQ_INT(e->shape[1], 4);
    e = nb_st_entry_at(st, nb_st_find(st, "model.layers.0.self_attn.q_proj.weight_scale_2"));
    CHECK_EQ_INT(e->dtype, NB_F32);
    CHECK_EQ_INT(e->ndim, 0);
    CHECK(nb_st_find(st, "model.layers.0.self_attn.q_proj.input_scale") < 0);   /* W4A16: no input_scale */
    e = nb_st_entry_at(st, nb_st_find(st, "model.layers.1.mlp.down_proj.weight"));
    CHECK_EQ_INT(e->dtype, NB_BF16);                          /* excluded: the F32 source ships in BF16 (default) */
    CHECK(nb_st_find(st, "lm_head.weight") < 0);                                  /* tied */
    CHECK(nb_st_find(st, "model.embed_tokens.weight") >= 0);
    CHECK(strcmp(nb_st_metadata(st, "format"), "pt") == 0);
    /* fused siblings share weight_scale_2 */
    for (int l = 0; l < 5; l++) {
        char n[128];
        snprintf(n, sizeof n, "model.layers.%d.self_attn.q_proj.weight_scale_2", l);
        float q = f32_of(st, ctx, n);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.k_proj.weight_scale_2", l);
        float k = f32_of(st, ctx, n);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.v_proj.weight_scale_2", l);
        float v = f32_of(st, ctx, n);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight_scale_2", l);
        float g = f32_of(st, ctx, n);
        snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight_scale_2", l);
        float u = f32_of(st, ctx, n);
        CHECK(q > 0 && q == k && k == v);
        CHECK(g > 0 && g == u);
    }
    nb_st_close(st);
    /* the values: max |w| over the group / 2688 (q/k/v share), o_proj's own amax / 2688 */
    nb_st *src = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, nbt_data("stories260K/hf/model.safetensors"), &src));
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    float amax_qkv = 0, amax_o = 0;
    static const char *qkvo[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int k = 0; k < 4 && src; k++) {
        char n[128];
        snprintf(n, sizeof n, "model.layers.2.self_attn.%s.weight", qkvo[k]);
        nb_tensor *w = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, src, n, &w));
        const float *x = nb_tensor_data(w);
        for (int64_t j = 0; j < nb_tensor_numel(w); j++) {
            float a = fabsf(x[j]);
            if (k < 3 && a > amax_qkv) amax_qkv = a;
            if (k == 3 && a > amax_o) amax_o = a;
        }
        nb_tensor_release(w);
    }
    CHECK(f32_of(st, ctx, "model.layers.2.self_attn.k_proj.weight_scale_2") == amax_qkv / 2688.0f);
    CHECK(f32_of(st, ctx, "model.layers.2.self_attn.o_proj.weight_scale_2") == amax_o / 2688.0f);
    CHECK(amax_o != amax_qkv);
    nb_st_close(src);
    nb_st_close(st);

    path(p, dir, "hf_quant_config.json");
    char *txt = slurp(p, NULL);
    CHECK(txt != NULL);
    cJSON *j = cJSON_Parse(txt ? txt : "");
    cJSON *q = cJSON_GetObjectItem(j, "quantization");
    CHECK(cJSON_IsObject(q));
    CHECK(strcmp(cJSON_GetObjectItem(q, "quant_algo")->valuestring, "W4A16_NVFP4") == 0);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(q, "kv_cache_quant_algo")));
    CHECK_EQ_INT(cJSON_GetObjectItem(q, "group_size")->valueint, 16);
    cJSON *ex = cJSON_GetObjectItem(q, "exclude_modules");
    /* as ModelOpt 0.47 writes it: the embedding carries (disabled) quantizers there, so it is listed */
    CHECK_EQ_INT(cJSON_GetArraySize(ex), 7);
    CHECK(strcmp(cJSON_GetArrayItem(ex, 0)->valuestring, "lm_head") == 0);
    CHECK(strcmp(cJSON_GetArrayItem(ex, 1)->valuestring, "model.embed_tokens") == 0);
    CHECK(strcmp(cJSON_GetArrayItem(ex, 2)->valuestring, "model.layers.0.mlp.down_proj") == 0);
    /* key order as ModelOpt's json.dump(indent=4) */
    CHECK(txt && strstr(txt, "{\n    \"producer\": {\n        \"name\": \"nibble\",") == txt);
    CHECK(txt && strstr(txt, "\"quant_algo\": \"W4A16_NVFP4\",\n        \"kv_cache_quant_algo\": null,\n        \"group_size\": 16,\n        \"exclude_modules\": [\n            \"lm_head\",") != NULL);
    cJSON_Delete(j);
    free(txt);

    path(p, dir, "config.json");
    txt = slurp(p, NULL);
    j = cJSON_Parse(txt ? txt : "");
    cJSON *qc = cJSON_GetObjectItem(j, "quantization_config");
    CHECK(cJSON_IsObject(qc));
    /* the source's config.json said float32; the unquantized tensors are BF16, and so is torch_dtype */
    CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "torch_dtype")) &&
          strcmp(cJSON_GetObjectItem(j, "torch_dtype")->valuestring, "bfloat16") == 0);
    CHECK(strcmp(cJSON_GetObjectItem(qc, "quant_method")->valuestring, "modelopt") == 0);
    CHECK(strcmp(cJSON_GetObjectItem(qc, "quant_algo")->valuestring, "W4A16_NVFP4") == 0);
    cJSON *g0 = cJSON_GetObjectItem(cJSON_GetObjectItem(qc, "config_groups"), "group_0");
    CHECK(cJSON_GetObjectItem(g0, "input_activations") == NULL);
    CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(g0, "weights"), "num_bits")->valueint, 4);
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(qc, "ignore")), 7);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")));
    CHECK_EQ_INT(cJSON_GetObjectItem(j, "hidden_size")->valueint, 64);
    cJSON_Delete(j);
    free(txt);
    path(p, dir, "tokenizer.json");
    CHECK(exists(p));
    path(p, dir, "generation_config.json");
    CHECK(exists(p));
}

static void check_ct_export(nb_ctx *ctx, const char *dir, const char *mo_dir) {
    nb_st *st = NULL, *mo = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    CHECK_OK(ctx, nb_st_open(ctx, mo_dir, &mo));
    if (!st || !mo) return;
    CHECK(nb_st_find(st, "model.layers.2.mlp.up_proj.weight") < 0);
    nb_tensor *a = NULL, *b = NULL;
    CHECK_OK(ctx, nb_st_get(ctx, st, "model.layers.2.mlp.up_proj.weight_packed", &a));
    CHECK_OK(ctx, nb_st_get(ctx, mo, "model.layers.2.mlp.up_proj.weight", &b));
    CHECK(a && b && nb_tensor_nbytes(a) == nb_tensor_nbytes(b) &&
          memcmp(nb_tensor_data(a), nb_tensor_data(b), (size_t)nb_tensor_nbytes(a)) == 0);
    nb_tensor_release(a);
    nb_tensor_release(b);
    float gs = f32_of(st, ctx, "model.layers.2.mlp.up_proj.weight_global_scale");
    float s2 = f32_of(mo, ctx, "model.layers.2.mlp.up_proj.weight_scale_2");
    CHECK(gs == 1.0f / s2);
    const nb_st_entry *e = nb_st_entry_at(st, nb_st_find(st, "model.layers.2.mlp.up_proj.weight_global_scale"));
    CHECK_EQ_INT(e->ndim, 1);
    CHECK_EQ_INT(e->shape[0], 1);
    nb_st_close(st);
    nb_st_close(mo);
    char p[512];
    path(p, dir, "config.json");
    char *txt = slurp(p, NULL);
    cJSON *j = cJSON_Parse(txt ? txt : "");
    cJSON *qc = cJSON_GetObjectItem(j, "quantization_config");
    CHECK(strcmp(cJSON_GetObjectItem(qc, "quant_method")->valuestring, "compressed-tensors") == 0);
    CHECK(strcmp(cJSON_GetObjectItem(qc, "format")->valuestring, "nvfp4-pack-quantized") == 0);
    cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(qc, "config_groups"), "group_0"), "weights");
    CHECK(strcmp(cJSON_GetObjectItem(w, "strategy")->valuestring, "tensor_group") == 0);
    CHECK(!exists("hf_quant_config.json"));
    cJSON_Delete(j);
    free(txt);
}

int main(void) {
    const char *model_dir = nbt_data("stories260K/hf/model.safetensors");
    char hf[512];
    snprintf(hf, sizeof hf, "%s", model_dir);
    *strrchr(hf, '/') = 0;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_qmodel_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
    if (!m) return nbt_done("test_qmodel");
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    CHECK_EQ_INT(nb_qmodel_count(qm), 36);   /* 5 layers x 7 linears + lm_head */
    setup_w4a16(ctx, qm, NB_FMT_NVFP4);
    CHECK_FAIL(ctx, nb_qmodel_set(ctx, qm, "model.norm", &(nb_qspec){.weight_format = NB_FMT_NVFP4}), NB_ERR_INVALID,
               "not a linear module");
    CHECK_FAIL(ctx, nb_qmodel_set(ctx, qm, "model.layers.9.mlp.up_proj", &(nb_qspec){.weight_format = NB_FMT_NVFP4}),
               NB_ERR_NOT_FOUND, "no module named model.layers.9.mlp.up_proj");
    int64_t groups = 0;
    CHECK_OK(ctx, nb_qmodel_fuse_siblings(ctx, qm, &groups));
    CHECK_EQ_INT(groups, 10);   /* qkv + gate/up per layer, weight quantizers only (W4A16) */

    char out[512], out2[512], ct[512], ck[512], p1[512], p2[512];
    snprintf(out, sizeof out, "%s/mo", tmpdir);
    /* the guard: nothing calibrated yet */
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, out, NULL), NB_ERR_UNCALIBRATED,
               "model.layers.0.self_attn.q_proj: weight_quantizer is enabled but has no calibrated amax");
    CHECK(!exists(out));
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    CHECK_OK(ctx, nb_qmodel_check(ctx, qm));
    /* an interrupted export leaves nothing behind */
    nb_ctx_interrupt(ctx);
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, out, NULL), NB_ERR_INTERRUPTED, "interrupted");
    nb_ctx_clear_interrupt(ctx);
    CHECK(!exists(out));
    DIR *d = opendir(tmpdir);
    int entries = 0;
    for (struct dirent *de; d && (de = readdir(d));) if (de->d_name[0] != '.') entries++;
    if (d) closedir(d);
    CHECK_EQ_INT(entries, 0);

    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    check_modelopt_export(ctx, out);

    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    snprintf(ct, sizeof ct, "%s/ct", tmpdir);
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, ct, &eo));
    check_ct_export(ctx, ct, out);

    /* restore-then-export gives the same bytes */
    snprintf(ck, sizeof ck, "%s/ckpt.safetensors", tmpdir);
    CHECK_OK(ctx, nb_qmodel_save(ctx, qm, ck));
    nb_qmodel_free(qm);
    nb_model_free(m);
    m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    CHECK_OK(ctx, nb_qmodel_restore(ctx, qm, ck));
    CHECK_OK(ctx, nb_qmodel_check(ctx, qm));
    snprintf(out2, sizeof out2, "%s/mo2", tmpdir);
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out2, NULL));
    static const char *files[] = {"model.safetensors", "hf_quant_config.json", "config.json"};
    for (int k = 0; k < 3; k++) {
        path(p1, out, files[k]);
        path(p2, out2, files[k]);
        CHECK_MSG(same_file(p1, p2), "%s differs after restore", files[k]);
    }
    /* overwriting an existing export replaces it */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out2, NULL));
    path(p1, out, "model.safetensors");
    path(p2, out2, "model.safetensors");
    CHECK(same_file(p1, p2));

    /* allow_uncalibrated: one module loses its amax, the export leaves it out and says so */
    nb_quantizer *wq = nb_qmodel_weight_quantizer(qm, nb_qmodel_find(qm, "model.layers.3.self_attn.o_proj"));
    CHECK_OK(ctx, nb_quantizer_clear_state(ctx, wq, NULL));
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, out2, NULL), NB_ERR_UNCALIBRATED, "model.layers.3.self_attn.o_proj");
    eo.layout = NB_LAYOUT_MODELOPT;
    eo.allow_uncalibrated = 1;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out2, &eo));
    CHECK_EQ_INT(nb_qmodel_export_skipped_count(qm), 1);
    CHECK(strcmp(nb_qmodel_export_skipped(qm, 0), "model.layers.3.self_attn.o_proj") == 0);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, out2, &st));
    if (st) {
        const nb_st_entry *e = nb_st_entry_at(st, nb_st_find(st, "model.layers.3.self_attn.o_proj.weight"));
        CHECK_EQ_INT(e->dtype, NB_BF16);   /* left unquantized: written like every unquantized tensor */
        nb_st_close(st);
    }
    path(p2, out2, "hf_quant_config.json");
    char *txt = slurp(p2, NULL);
    CHECK(txt && strstr(txt, "\"model.layers.3.self_attn.o_proj\"") != NULL);
    free(txt);

    /* the source's config.json is read whole: one over 64 MiB (a sparse file: nothing is written) is
     * refused before any allocation, and one that cannot be read says why */
    {
        char src[512], cfgp[600], want[1400];
        snprintf(src, sizeof src, "%s/bigsrc", tmpdir);
        CHECK(mkdir(src, 0755) == 0);
        path(cfgp, src, "config.json");
        FILE *f = fopen(cfgp, "wb");
        CHECK(f && fclose(f) == 0);
        CHECK(truncate(cfgp, (64 << 20) + 1) == 0);
        eo.source_dir = src;
        snprintf(want, sizeof want, "%s is 67108865 bytes: a JSON side file over 64 MiB is refused", cfgp);
        CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out2, &eo), NB_ERR_FORMAT);
        CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"", nb_ctx_last_error(ctx));
        CHECK(unlink(cfgp) == 0 && mkdir(cfgp, 0755) == 0);   /* opens, cannot be read */
        snprintf(want, sizeof want, "cannot read %s: it is a directory", cfgp);
        CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out2, &eo), NB_ERR_IO);
        CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"", nb_ctx_last_error(ctx));
        CHECK(rmdir(cfgp) == 0);
        f = fopen(cfgp, "wb");
        CHECK(f && fputs("{\"a\": 1,", f) >= 0 && fclose(f) == 0);
        snprintf(want, sizeof want, "%s is not valid JSON", cfgp);
        CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, out2, &eo), NB_ERR_FORMAT, want);
        eo.source_dir = NULL;
    }

    nb_qmodel_free(qm);
    nb_model_free(m);
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return nbt_done("test_qmodel");
}

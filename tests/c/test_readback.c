/* Read-back of exported checkpoints on stories260K: what ships is what was calibrated. For each
 * format (NVFP4 W4A16, four_over_six, MXFP8, FP8 per tensor and per channel, MIXED_PRECISION) and
 * both layouts, the weights nb_model_load dequantizes from the export equal the student's fake-quant
 * weights, and the read-back logits equal the fake-quant logits (bit for bit in the ModelOpt layout;
 * compressed-tensors stores 1/weight_scale_2 and is held to 1e-5). Malformed exports are named. */
#include "nbtest.h"
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];
static char hf[512];

enum { T = 48 };
static int32_t tokens[T];

typedef struct {
    const char *name;
    int32_t attn_fmt, mlp_fmt;   /* q/k/v/o and gate/up formats (down_proj stays out: 172 wide) */
    int32_t input_fmt;           /* activations of every quantized module */
    nb_calib_method method;
    int logits_exact;            /* read-back logits must equal the fake-quant logits (weight-only) */
} scenario;

static void apply(nb_ctx *ctx, nb_qmodel *qm, const scenario *sc) {
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        if (strstr(name, "down_proj") || !strcmp(name, "lm_head")) {
            CHECK_OK(ctx, nb_qmodel_exclude(ctx, qm, name, "test"));
            continue;
        }
        nb_qspec s;
        nb_qspec_init(&s);
        s.weight_format = strstr(name, ".mlp.") ? sc->mlp_fmt : sc->attn_fmt;
        s.input_format = sc->input_fmt;
        CHECK_OK(ctx, nb_qmodel_set(ctx, qm, name, &s));
    }
    CHECK_OK(ctx, nb_qmodel_fuse_siblings(ctx, qm, NULL));
}

static double max_diff(const float *a, const float *b, int64_t n, int64_t *ndiff) {
    double m = 0;
    *ndiff = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > 0) (*ndiff)++;
        if (d > m || d != d) m = d;
    }
    return m;
}

static void run(nb_ctx *ctx, const scenario *sc) {
    nb_model *m = NULL, *rb = NULL, *rbct = NULL;
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
    if (!m) return;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    apply(ctx, qm, sc);
    nb_calib_config cc;
    nb_calib_config_init(&cc, sc->method);
    if (sc->input_fmt != NB_FMT_NONE) {
        CHECK_OK(ctx, nb_qmodel_calibrate_begin(ctx, qm, &cc));
        float *scratch = malloc(sizeof(float) * T * 512);
        CHECK_OK(ctx, nb_model_logits(ctx, m, tokens, 1, T, scratch));
        free(scratch);
        CHECK_OK(ctx, nb_qmodel_calibrate_end(ctx, qm));
        CHECK_EQ_INT(nb_qmodel_uncovered_count(qm), 0);
    } else {
        CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    }
    char mo[512], ct[512];
    snprintf(mo, sizeof mo, "%s/%s-mo", tmpdir, sc->name);
    snprintf(ct, sizeof ct, "%s/%s-ct", tmpdir, sc->name);
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    /* the unquantized tensors in the source's own dtype (F32, or BF16 for the bf16-src copy below; the
     * default rounds an F32 source to BF16, see default_dtype): then every read-back weight and logit
     * is the student's */
    eo.dtype = nb_model_param_src_dtype(m, nb_model_find_param(m, "model.embed_tokens.weight"));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, mo, &eo));
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, ct, &eo));
    CHECK_OK(ctx, nb_model_load(ctx, mo, &rb));
    CHECK_OK(ctx, nb_model_load(ctx, ct, &rbct));
    if (!rb || !rbct) goto out;

    /* weights: each quantized module's read-back weight is its fake-quant weight */
    int quantized = 0;
    double worst_ct = 0;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        nb_quantizer *wq = nb_qmodel_weight_quantizer(qm, i);
        const nb_linear_info *li = NULL;
        (void)li;
        char pname[600];
        snprintf(pname, sizeof pname, "%s.weight", nb_qmodel_name(qm, i));
        int64_t p = nb_model_find_param(m, pname);
        nb_tensor *w = nb_model_param(m, p);
        nb_tensor *w_mo = nb_model_param(rb, nb_model_find_param(rb, pname));
        nb_tensor *w_ct = nb_model_param(rbct, nb_model_find_param(rbct, pname));
        int64_t n = nb_tensor_numel(w), nd;
        if (!wq) {
            CHECK_MSG(max_diff(nb_tensor_data(w), nb_tensor_data(w_mo), n, &nd) == 0, "%s unquantized", pname);
            CHECK_EQ_INT(nb_model_param_src_dtype(rb, nb_model_find_param(rb, pname)), nb_model_param_src_dtype(m, p));
            continue;
        }
        quantized++;
        CHECK_EQ_INT(nb_model_param_src_dtype(rb, nb_model_find_param(rb, pname)), -1);
        nb_tensor *fake = NULL;
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, w->ndim, w->shape, &fake));
        CHECK_OK(ctx, nb_quantizer_fake(ctx, wq, w, fake));
        double d = max_diff(nb_tensor_data(fake), nb_tensor_data(w_mo), n, &nd);
        CHECK_MSG(d == 0, "%s %s: ModelOpt read-back differs from the fake quant by %g (%lld values)", sc->name, pname, d,
                  (long long)nd);
        d = max_diff(nb_tensor_data(fake), nb_tensor_data(w_ct), n, &nd);
        if (d > worst_ct) worst_ct = d;
        CHECK_MSG(d <= 1e-5, "%s %s: compressed-tensors read-back differs by %g", sc->name, pname, d);
        nb_tensor_release(fake);
    }
    CHECK_EQ_INT(quantized, 30);

    /* logits */
    if (sc->logits_exact) {
        float *a = malloc(sizeof(float) * T * 512), *b = malloc(sizeof(float) * T * 512),
              *c = malloc(sizeof(float) * T * 512);
        CHECK_OK(ctx, nb_qmodel_set_fake(ctx, qm, 1));
        CHECK_OK(ctx, nb_model_logits(ctx, m, tokens, 1, T, a));
        CHECK_OK(ctx, nb_qmodel_set_fake(ctx, qm, 0));
        CHECK_OK(ctx, nb_model_logits(ctx, rb, tokens, 1, T, b));
        CHECK_OK(ctx, nb_model_logits(ctx, rbct, tokens, 1, T, c));
        int64_t nd;
        double d = max_diff(a, b, T * 512, &nd);
        CHECK_MSG(d == 0, "%s: ModelOpt read-back logits differ by %g", sc->name, d);
        /* CT stores 1/weight_scale_2 and loaders invert it again: s2 may move by one ulp, so the
         * logits agree to float32 rounding relative to their size (|logit| ~ 10 here), not exactly */
        double amax = 0;
        for (int64_t i = 0; i < T * 512; i++) amax = fabs(a[i]) > amax ? fabs(a[i]) : amax;
        d = max_diff(a, c, T * 512, &nd);
        CHECK_MSG(d <= 1e-6 * amax, "%s: compressed-tensors read-back logits differ by %g (max |logit| %g)", sc->name, d, amax);
        printf("%s: read-back logits: ModelOpt exact, compressed-tensors max |diff| %g of max |logit| %g (weights %g)\n", sc->name, d, amax, worst_ct);
        /* and the fake quant changed something (the test could not pass by accident) */
        float *plain = malloc(sizeof(float) * T * 512);
        CHECK_OK(ctx, nb_model_logits(ctx, m, tokens, 1, T, plain));
        CHECK(max_diff(a, plain, T * 512, &nd) > 1e-3);
        free(plain);
        free(a);
        free(b);
        free(c);
    }
    /* the input scale travels: probe reports it in ModelOpt's convention for both layouts */
    if (sc->input_fmt != NB_FMT_NONE) {
        nb_st *st = NULL, *stc = NULL;
        CHECK_OK(ctx, nb_st_open(ctx, mo, &st));
        CHECK_OK(ctx, nb_st_open(ctx, ct, &stc));
        nb_readback_info ri, ric;
        const char *mod = "model.layers.2.self_attn.k_proj";
        CHECK_OK(ctx, nb_readback_probe(ctx, st, mod, &ri));
        CHECK_OK(ctx, nb_readback_probe(ctx, stc, mod, &ric));
        float want = 0;
        CHECK_OK(ctx, nb_quantizer_scale(ctx, nb_qmodel_input_quantizer(qm, nb_qmodel_find(qm, mod)), &want));
        CHECK_EQ_INT(ri.input_format, sc->input_fmt);
        CHECK_EQ_INT(ric.input_format, sc->input_fmt);
        CHECK_EQ_INT(ri.layout, NB_LAYOUT_MODELOPT);
        CHECK_EQ_INT(ric.layout, NB_LAYOUT_COMPRESSED_TENSORS);
        CHECK(ri.input_scale == want);
        CHECK_NEAR(ric.input_scale, want, want * 1e-6);
        nb_st_close(st);
        nb_st_close(stc);
    }
out:
    nb_model_free(rb);
    nb_model_free(rbct);
    nb_qmodel_free(qm);
    nb_model_free(m);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Exports nibble cannot read back are refused with the reason. */
static void malformed(nb_ctx *ctx) {
    char dir[512], p[600], cmd[1400];
    nb_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/w4a16-mo", tmpdir);
    /* another quant_method */
    snprintf(cmd, sizeof cmd, "cp -r %s %s/gptq && sed -i 's/\"quant_method\": \"modelopt\"/\"quant_method\": \"gptq\"/' "
             "%s/gptq/config.json", dir, tmpdir, tmpdir);
    CHECK(system(cmd) == 0);
    snprintf(p, sizeof p, "%s/gptq", tmpdir);
    CHECK_FAIL(ctx, nb_model_load(ctx, p, &m), NB_ERR_UNSUPPORTED, "quant_method 'gptq' is not supported");
    /* weight_scale missing: a quantized weight nobody can dequantize */
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    if (!st) return;
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    for (int64_t i = 0; i < nb_st_count(st); i++) {
        const char *name = nb_st_entry_at(st, i)->name;
        if (!strcmp(name, "model.layers.1.mlp.up_proj.weight_scale")) continue;
        nb_tensor *t = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, name, &t));
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, name, t));
        nb_tensor_release(t);
    }
    snprintf(cmd, sizeof cmd, "mkdir -p %s/noscale && cp %s/config.json %s/noscale/", tmpdir, dir, tmpdir);
    CHECK(system(cmd) == 0);
    snprintf(p, sizeof p, "%s/noscale/model.safetensors", tmpdir);
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, p));
    nb_st_writer_free(w);
    nb_st_close(st);
    snprintf(p, sizeof p, "%s/noscale", tmpdir);
    CHECK_FAIL(ctx, nb_model_load(ctx, p, &m), NB_ERR_FORMAT,
               "model.layers.1.mlp.up_proj: the weight is U8 but there is no model.layers.1.mlp.up_proj.weight_scale");
    (void)write_text;
}

/* The dtype of unquantized tensors: BF16 by default for this F32 source (F16 on request), each value
 * the RNE rounding of the source's (nb_f32_to_bf16 / nb_f32_to_f16, held to torch's conversion by
 * lua.client_golden), config.json's torch_dtype saying so; a dtype that is not bf16 / f16 / f32 is
 * refused. */
static void default_dtype(nb_ctx *ctx) {
    nb_model *m = NULL, *rb = NULL;
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
    if (!m) return;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    static const scenario w = {"w4a16", NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_NONE, NB_CALIB_MAX, 1};
    apply(ctx, qm, &w);
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    static const struct { int32_t dtype, want; const char *torch; } cases[] = {
        {-1, NB_BF16, "\"torch_dtype\": \"bfloat16\""}, {NB_F16, NB_F16, "\"torch_dtype\": \"float16\""}};
    for (int k = 0; k < 2; k++) {
        char dir[512], p[600];
        snprintf(dir, sizeof dir, "%s/dtype-%d", tmpdir, k);
        nb_export_opts eo;
        nb_export_opts_init(&eo);
        eo.dtype = cases[k].dtype;
        CHECK_OK(ctx, nb_qmodel_export(ctx, qm, dir, &eo));
        snprintf(p, sizeof p, "%s/config.json", dir);
        FILE *f = fopen(p, "rb");
        char buf[4096] = {0};
        if (f) { (void)!fread(buf, 1, sizeof buf - 1, f); fclose(f); }
        CHECK_MSG(strstr(buf, cases[k].torch) != NULL, "%s has no %s", p, cases[k].torch);
        CHECK(strstr(buf, "float32") == NULL);
        CHECK_OK(ctx, nb_model_load(ctx, dir, &rb));
        if (!rb) continue;
        int n = 0;
        for (int64_t i = 0; i < nb_model_param_count(m); i++) {
            const char *pname = nb_model_param_name(m, i);
            int64_t j = nb_model_find_param(rb, pname);
            if (nb_model_param_src_dtype(rb, j) == -1) continue;   /* quantized */
            CHECK_EQ_INT(nb_model_param_src_dtype(rb, j), cases[k].want);
            const float *a = nb_tensor_data(nb_model_param(m, i)), *b = nb_tensor_data(nb_model_param(rb, j));
            int64_t bad = 0;
            for (int64_t e = 0; e < nb_tensor_numel(nb_model_param(m, i)); e++) {
                float r = cases[k].want == NB_BF16 ? nb_bf16_to_f32(nb_f32_to_bf16(a[e])) : nb_f16_to_f32(nb_f32_to_f16(a[e]));
                bad += memcmp(&r, &b[e], sizeof r) != 0;
            }
            CHECK_MSG(bad == 0, "%s: %lld values are not the rounded source", pname, (long long)bad);
            n++;
        }
        CHECK_EQ_INT(n, 17);   /* embed_tokens, 11 RMSNorm weights, 5 down_proj (172 wide: no NVFP4 block) */
        nb_model_free(rb);
        rb = NULL;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dtype-e4m3", tmpdir);
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.dtype = NB_E4M3;
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, dir, &eo), NB_ERR_INVALID,
               "export dtype e4m3: unquantized tensors are written as bf16, f16 or f32");
    nb_qmodel_free(qm);
    nb_model_free(m);
}

int main(void) {
    const char *st = nbt_data("stories260K/hf/model.safetensors");
    snprintf(hf, sizeof hf, "%s", st);
    *strrchr(hf, '/') = 0;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_readback_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    for (int i = 0; i < T; i++) tokens[i] = i == 0 ? 1 : (int32_t)((i * 37 + 11) % 512);
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    static const scenario scs[] = {
        {"w4a16", NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_NONE, NB_CALIB_MAX, 1},
        {"w4a16_mse", NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_NONE, NB_CALIB_MSE, 1},
        {"four_over_six", NB_FMT_NVFP4_46, NB_FMT_NVFP4_46, NB_FMT_NONE, NB_CALIB_FOUR_OVER_SIX, 1},
        {"mxfp8", NB_FMT_MXFP8, NB_FMT_MXFP8, NB_FMT_NONE, NB_CALIB_MAX, 1},
        {"fp8_channel", NB_FMT_FP8_CHANNEL, NB_FMT_FP8_CHANNEL, NB_FMT_NONE, NB_CALIB_MAX, 1},
        {"mixed", NB_FMT_NVFP4, NB_FMT_MXFP8, NB_FMT_NONE, NB_CALIB_MAX, 1},
        {"fp8", NB_FMT_FP8_TENSOR, NB_FMT_FP8_TENSOR, NB_FMT_FP8_TENSOR, NB_CALIB_MAX, 0},
        {"nvfp4_w4a4", NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_NVFP4, NB_CALIB_MAX, 0},
    };
    for (size_t k = 0; k < sizeof scs / sizeof scs[0]; k++) run(ctx, &scs[k]);
    malformed(ctx);
    default_dtype(ctx);

    /* A BF16 checkpoint: ModelOpt's FP8 export divides in bf16 (w_bf16 / bf16(s), FORMATS §6.4); the
     * quantizer takes the same division from the weight's source dtype, so the student's fake quant
     * and the export still agree bit for bit (a BF16 copy of stories260K, written by nibble itself) */
    {
        nb_model *m = NULL;
        nb_qmodel *qm = NULL;
        CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
        CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
        nb_export_opts eo;
        nb_export_opts_init(&eo);
        eo.dtype = NB_BF16;
        snprintf(hf, sizeof hf, "%s/bf16-src", tmpdir);
        CHECK_OK(ctx, nb_qmodel_export(ctx, qm, hf, &eo));
        nb_qmodel_free(qm);
        nb_model_free(m);
        m = NULL;
        CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
        if (m) CHECK_EQ_INT(nb_model_param_src_dtype(m, nb_model_find_param(m, "model.layers.0.mlp.up_proj.weight")), NB_BF16);
        nb_model_free(m);
        static const scenario bf = {"fp8_bf16", NB_FMT_FP8_TENSOR, NB_FMT_FP8_TENSOR, NB_FMT_FP8_TENSOR, NB_CALIB_MAX, 0};
        static const scenario bfw = {"w4a16_bf16", NB_FMT_NVFP4, NB_FMT_NVFP4, NB_FMT_NONE, NB_CALIB_MAX, 1};
        run(ctx, &bf);
        run(ctx, &bfw);
    }
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return nbt_done("test_readback");
}

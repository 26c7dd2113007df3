/* The FP8 KV cache on stories260K: the model's K/V hook sees exactly the keys after RoPE and the values
 * (checked against an independent double-precision recomputation from the layer inputs) and costs
 * nothing when off; the qmodel's k/v_bmm_quantizers calibrate their amax from it, fake-quantize K and V
 * (= a hook that quantizes them by hand; a KV-cache decode stores the quantized values), guard the
 * export (missing amax named; allow_uncalibrated drops the KV quantization and says so), export
 * k_scale / v_scale = amax / 448 in both layouts with the JSON ModelOpt and compressed-tensors write,
 * survive save/restore (same bytes), and read back (nb_readback_kv_scale; the loader accepts them). */
#include "nbtest.h"
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>

enum { T = 24, LAYERS = 5, KVD = 32, HD = 8 };

static char tmpdir[256];

/* what a recording hook saw: K and V of every layer for one forward */
typedef struct {
    float k[LAYERS][T * KVD], v[LAYERS][T * KVD];
    int calls[LAYERS], recompute;
    int64_t rows, cols;
} rec_t;

static nb_status record_kv(nb_ctx *ctx, void *user, int64_t layer, float *k, float *v, int64_t rows, int64_t cols,
                           int32_t pass) {
    (void)ctx;
    rec_t *r = user;
    if (pass == NB_PASS_RECOMPUTE) { r->recompute++; return NB_OK; }
    r->rows = rows;
    r->cols = cols;
    r->calls[layer]++;
    if (rows * cols <= T * KVD) {
        memcpy(r->k[layer], k, sizeof(float) * (size_t)(rows * cols));
        memcpy(r->v[layer], v, sizeof(float) * (size_t)(rows * cols));
    }
    return NB_OK;
}

/* fake-quantize K and V by hand with per-layer amaxes (FP8 E4M3, scale amax/448) */
typedef struct { float amax[LAYERS][2]; } fq_t;

static nb_status fake_kv(nb_ctx *ctx, void *user, int64_t layer, float *k, float *v, int64_t rows, int64_t cols,
                         int32_t pass) {
    (void)pass;
    fq_t *f = user;
    for (int w = 0; w < 2; w++) {
        nb_qparams p;
        nb_qparams_init(&p, NB_FMT_FP8_TENSOR);
        p.amax = f->amax[layer][w];
        p.fp8_div_dtype = NB_F32;
        nb_tensor *t = NULL;
        int64_t shape[2] = {rows, cols};
        nb_status s = nb_tensor_from_data(ctx, NB_F32, 2, shape, w ? v : k, &t);
        if (!s) s = nb_fake_quant(ctx, t, &p, t);
        if (!s) memcpy(w ? v : k, nb_tensor_data(t), sizeof(float) * (size_t)(rows * cols));
        nb_tensor_release(t);
        if (s) return s;
    }
    return NB_OK;
}

static const float *pdata(nb_model *m, const char *name) {
    return nb_tensor_data(nb_model_param(m, nb_model_find_param(m, name)));
}

/* K (after RoPE) and V of layer l from its input x [T, 64], in double, HF conventions; with kb/vb,
 * also the float32 rounding bound of each element (see kv_bound) */
static void ref_kv_b(nb_model *m, int l, const float *x, double *k, double *v, int rope, double *kb, double *vb);
static void ref_kv(nb_model *m, int l, const float *x, double *k, double *v, int rope) {
    ref_kv_b(m, l, x, k, v, rope, NULL, NULL);
}

/* How far the runtime's float32 K and V may lie from the double values computed from the same layer
 * input x, in any summation order (u = 2^-24; first order in u):
 *   rstd = (sum_d x_d^2 / D + eps)^-1/2: D products and D-1 additions, err <= (D+1)u relative, halved
 *     by the square root, plus 4 roundings (divide, add, sqrt, reciprocal): <= ((D+1)/2 + 4)u;
 *   h_d = x_d rstd g_d: 2 more roundings: <= ((D+1)/2 + 6)u |h_d|;
 *   v_o = sum_d h_d w_od over D terms in any order: <= (D u + ((D+1)/2 + 6)u) S_o, S_o = sum_d |h_d w_od|;
 *   k'_i = k_i c - k_j s (RoPE) with c, s rounded to float (u each) and 3 roundings of the products and
 *     the difference: <= that bound on k_i and k_j plus 5u (|k_i| + |k_j|) <= (1.5D + 12)u (S_i + S_j).
 * So each element's bound is (1.5D + 12) u times its sum of |terms| (both rotated channels for K). */
static double kv_bound_coef(int64_t D) { return (1.5 * (double)D + 12.0) * 0x1p-24; }

static void ref_kv_b(nb_model *m, int l, const float *x, double *k, double *v, int rope, double *kb, double *vb) {
    const nb_model_config *c = nb_model_get_config(m);
    int64_t D = c->hidden_size;
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
    const float *g = pdata(m, n);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.k_proj.weight", l);
    const float *wk = pdata(m, n);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.v_proj.weight", l);
    const float *wv = pdata(m, n);
    double h[64];
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)x[t * D + d] * x[t * D + d];
        double rstd = 1.0 / sqrt(ss / (double)D + c->rms_eps);
        for (int64_t d = 0; d < D; d++) h[d] = x[t * D + d] * rstd * g[d];
        double ak[KVD];
        for (int o = 0; o < KVD; o++) {
            double sk = 0, sv = 0, av = 0;
            ak[o] = 0;
            for (int64_t d = 0; d < D; d++) {
                sk += h[d] * wk[o * D + d];
                sv += h[d] * wv[o * D + d];
                ak[o] += fabs(h[d] * wk[o * D + d]);
                av += fabs(h[d] * wv[o * D + d]);
            }
            k[t * KVD + o] = sk;
            v[t * KVD + o] = sv;
            if (vb) vb[t * KVD + o] = kv_bound_coef(D) * av;
        }
        for (int o = 0; kb && o < KVD; o++) {   /* RoPE mixes channel i with i +- HD/2 of its head */
            int pair = o % HD < HD / 2 ? o + HD / 2 : o - HD / 2;
            kb[t * KVD + o] = kv_bound_coef(D) * (ak[o] + (rope ? ak[pair] : 0));
        }
        for (int hh = 0; rope && hh < KVD / HD; hh++) {   /* rotate-half RoPE, theta 10000 */
            double *q = k + t * KVD + hh * HD;
            for (int i = 0; i < HD / 2; i++) {
                double f = pow(c->rope_theta, -2.0 * i / HD), a = t * f;
                double x0 = q[i], x1 = q[i + HD / 2];
                q[i] = x0 * cos(a) - x1 * sin(a);
                q[i + HD / 2] = x1 * cos(a) + x0 * sin(a);
            }
        }
    }
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static cJSON *read_json(const char *dir, const char *file) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    char *txt = nbt_slurp(p, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    return j;
}

static float kv_amax(nb_ctx *ctx, nb_qmodel *qm, int l, int w) {
    float a = -1;
    nb_quantizer *q = nb_qmodel_kv_quantizer(qm, l, w);
    if (!q || nb_quantizer_global_amax(ctx, q, &a) != NB_OK) return -1;
    return a;
}

static int same_file(const char *a, const char *b) {
    size_t la = 0, lb = 0;
    char *x = nbt_slurp(a, &la), *y = nbt_slurp(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

int main(void) {
    const char *st_path = nbt_data("stories260K/hf/model.safetensors");
    char hf[512];
    snprintf(hf, sizeof hf, "%s", st_path);
    *strrchr(hf, '/') = 0;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_qmodel_kv_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;
    nb_model *m = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
    if (!m) return nbt_done("test_qmodel_kv");
    const nb_model_config *c = nb_model_get_config(m);
    CHECK_EQ_INT(c->n_layers, LAYERS);
    CHECK_EQ_INT(c->n_kv_heads * c->head_dim, KVD);
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = t == 0 ? 1 : (t * 37 + 11) % 512;
    int64_t V = c->vocab_size;
    float *plain = malloc(sizeof(float) * (size_t)(T * V)), *lg = malloc(sizeof(float) * (size_t)(T * V));
    float *hid[LAYERS + 1];
    for (int l = 0; l <= LAYERS; l++) hid[l] = malloc(sizeof(float) * (size_t)(T * c->hidden_size));

    /* 1. the hook sees K after RoPE and V, once per layer and forward; off, or observing, changes nothing */
    nb_forward_opts fo = {0};
    fo.logits = plain;
    fo.hidden = hid;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, 1, T, &fo));
    rec_t *rec = calloc(1, sizeof *rec);
    nb_kv_hook h = {rec, record_kv};
    CHECK_OK(ctx, nb_model_set_kv_hook(ctx, m, &h));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 1, T, lg));
    CHECK(memcmp(lg, plain, sizeof(float) * (size_t)(T * V)) == 0);
    CHECK_EQ_INT(rec->rows, T);
    CHECK_EQ_INT(rec->cols, KVD);
    double *rk = malloc(sizeof(double) * T * KVD), *rv = malloc(sizeof(double) * T * KVD);
    double *kb = malloc(sizeof(double) * T * KVD), *vb = malloc(sizeof(double) * T * KVD);
    float kmax[LAYERS], vmax[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        CHECK_EQ_INT(rec->calls[l], 1);
        ref_kv_b(m, l, hid[l], rk, rv, 1, kb, vb);
        double ek = 0, ev = 0, pre = 0;   /* the largest error as a fraction of its element's bound */
        kmax[l] = vmax[l] = 0;
        for (int i = 0; i < T * KVD; i++) {
            ek = fmax(ek, fabs(rk[i] - rec->k[l][i]) / kb[i]);
            ev = fmax(ev, fabs(rv[i] - rec->v[l][i]) / vb[i]);
            kmax[l] = fmaxf(kmax[l], fabsf(rec->k[l][i]));
            vmax[l] = fmaxf(vmax[l], fabsf(rec->v[l][i]));
        }
        CHECK_MSG(ek <= 1 && ev <= 1, "layer %d: K error %g, V error %g of their rounding bounds", l, ek, ev);
        /* and not the keys before RoPE (position 5 onwards are rotated) */
        ref_kv(m, l, hid[l], rk, rv, 0);
        for (int i = 5 * KVD; i < T * KVD; i++) pre = fmax(pre, fabs(rk[i] - rec->k[l][i]));
        CHECK_MSG(pre > 1e-2, "layer %d: the hook's K equals the unrotated K (diff %g)", l, pre);
    }
    /* a backward recomputation calls the hook again with NB_PASS_RECOMPUTE */
    nb_model_set_recompute(m, NB_RECOMPUTE_ALWAYS);
    double loss = 0;
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, 1, T, NULL, &loss));
    CHECK_EQ_INT(rec->recompute, LAYERS);
    nb_model_set_recompute(m, NB_RECOMPUTE_AUTO);
    CHECK_OK(ctx, nb_model_set_kv_hook(ctx, m, NULL));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 1, T, lg));
    CHECK(memcmp(lg, plain, sizeof(float) * (size_t)(T * V)) == 0);

    /* 2. the qmodel's KV quantizers */
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    CHECK_EQ_INT(nb_qmodel_kv_format(qm), NB_FMT_NONE);
    CHECK(nb_qmodel_kv_quantizer(qm, 0, 0) == NULL);
    CHECK_FAIL(ctx, nb_qmodel_set_kv(ctx, qm, NB_FMT_NVFP4), NB_ERR_INVALID, "KV cache format nvfp4 is not supported");
    CHECK_OK(ctx, nb_qmodel_set_kv(ctx, qm, NB_FMT_FP8_TENSOR));
    CHECK_EQ_INT(nb_qmodel_kv_format(qm), NB_FMT_FP8_TENSOR);
    CHECK(strcmp(nb_quantizer_name(nb_qmodel_kv_quantizer(qm, 3, 1)), "model.layers.3.self_attn.v_bmm_quantizer") == 0);
    CHECK(nb_qmodel_kv_quantizer(qm, 5, 0) == NULL);
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_FP8_TENSOR;
    CHECK_OK(ctx, nb_qmodel_set(ctx, qm, "model.layers.1.mlp.up_proj", &spec));
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    /* the guard names the attention module and the quantizer */
    CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    CHECK_FAIL(ctx, nb_qmodel_check(ctx, qm), NB_ERR_UNCALIBRATED,
               "model.layers.0.self_attn: k_bmm_quantizer (FP8 KV cache, k_scale) is enabled but has no calibrated amax");
    CHECK_FAIL(ctx, nb_qmodel_set_fake(ctx, qm, 1), NB_ERR_UNCALIBRATED, "model.layers.0.self_attn: k_bmm_quantizer");
    char out[600], out2[600], ct[600], ck[600], p1[700], p2[700];
    snprintf(out, sizeof out, "%s/mo", tmpdir);
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, out, NULL), NB_ERR_UNCALIBRATED, "k_bmm_quantizer");
    CHECK(!exists(out));
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.allow_uncalibrated = 1;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, &eo));
    CHECK_EQ_INT(nb_qmodel_export_skipped_count(qm), 2 * LAYERS);
    CHECK(strcmp(nb_qmodel_export_skipped(qm, 1), "model.layers.0.self_attn.v_bmm_quantizer") == 0);
    cJSON *hq = read_json(out, "hf_quant_config.json");
    CHECK(hq && cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(hq, "quantization"), "kv_cache_quant_algo")));
    cJSON_Delete(hq);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, out, &st));
    if (st) {
        CHECK(nb_st_find(st, "model.layers.0.self_attn.k_proj.k_scale") < 0);
        nb_st_close(st);
    }

    /* calibration: the amax is the max |K| / |V| the hook saw (one batch: the same tokens) */
    CHECK_OK(ctx, nb_qmodel_calibrate_begin(ctx, qm, &cc));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 1, T, lg));
    CHECK(memcmp(lg, plain, sizeof(float) * (size_t)(T * V)) == 0);   /* observing only */
    CHECK_OK(ctx, nb_qmodel_calibrate_end(ctx, qm));
    CHECK_EQ_INT(nb_qmodel_uncovered_count(qm), 0);
    for (int l = 0; l < LAYERS; l++) {
        CHECK_EQ_INT(kv_amax(ctx, qm, l, 0) == kmax[l], 1);
        CHECK_EQ_INT(kv_amax(ctx, qm, l, 1) == vmax[l], 1);
    }
    CHECK_OK(ctx, nb_qmodel_check(ctx, qm));
    /* a calibration without any forward lists every KV quantizer as uncovered */
    nb_qmodel *qm2 = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm2));
    CHECK_OK(ctx, nb_qmodel_set_kv(ctx, qm2, NB_FMT_FP8_TENSOR));
    CHECK_OK(ctx, nb_qmodel_calibrate_begin(ctx, qm2, &cc));
    CHECK_OK(ctx, nb_qmodel_calibrate_end(ctx, qm2));
    CHECK_EQ_INT(nb_qmodel_uncovered_count(qm2), 2 * LAYERS);
    CHECK(strcmp(nb_qmodel_uncovered(qm2, 9), "model.layers.4.self_attn.v_bmm_quantizer") == 0);
    nb_qmodel_free(qm2);

    /* 3. fake quant = quantizing K and V by hand; decoding with a cache stores the quantized values */
    fq_t fq;
    for (int l = 0; l < LAYERS; l++) { fq.amax[l][0] = kmax[l]; fq.amax[l][1] = vmax[l]; }
    nb_kv_hook fh = {&fq, fake_kv};
    float *byhand = malloc(sizeof(float) * (size_t)(T * V));
    CHECK_OK(ctx, nb_model_set_kv_hook(ctx, m, &fh));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 1, T, byhand));
    CHECK_OK(ctx, nb_model_set_kv_hook(ctx, m, NULL));
    nb_quantizer_set_enabled(nb_qmodel_weight_quantizer(qm, nb_qmodel_find(qm, "model.layers.1.mlp.up_proj")), 0);
    CHECK_OK(ctx, nb_qmodel_set_fake(ctx, qm, 1));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 1, T, lg));
    CHECK(memcmp(lg, byhand, sizeof(float) * (size_t)(T * V)) == 0);
    double diff = 0;
    for (int64_t i = 0; i < T * V; i++) diff = fmax(diff, fabs(lg[i] - plain[i]));
    CHECK_MSG(diff > 1e-3, "FP8 K/V should change the logits (max diff %g)", diff);
    nb_kv_cache *kc = NULL;
    CHECK_OK(ctx, nb_kv_cache_new(ctx, m, 1, T, &kc));
    float *step = malloc(sizeof(float) * (size_t)V);
    nb_forward_opts dec = {0};
    dec.cache = kc;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok, 1, T - 1, &dec));
    dec.logits = step;
    CHECK_OK(ctx, nb_model_forward(ctx, m, tok + T - 1, 1, 1, &dec));
    double dd = 0;
    for (int64_t i = 0; i < V; i++) dd = fmax(dd, fabs(step[i] - lg[(T - 1) * V + i]));
    CHECK_MSG(dd < 1e-4, "decode with the cache vs full forward: max diff %g", dd);
    nb_kv_cache_free(kc);
    /* the QAD student path: a training step with K/V fake quant (straight-through), recomputed or kept */
    nb_model_set_recompute(m, NB_RECOMPUTE_ALWAYS);
    double l1 = 0, l2 = 0;
    nb_model_zero_grad(m);
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, 1, T, NULL, &l1));
    int64_t pk = nb_model_find_param(m, "model.layers.2.self_attn.k_proj.weight");
    float g1 = ((const float *)nb_tensor_data(nb_model_grad(m, pk)))[7];
    nb_model_set_recompute(m, NB_RECOMPUTE_NEVER);
    nb_model_zero_grad(m);
    CHECK_OK(ctx, nb_model_lm_step(ctx, m, tok, 1, T, NULL, &l2));
    float g2 = ((const float *)nb_tensor_data(nb_model_grad(m, pk)))[7];
    CHECK(isfinite(l1) && l1 == l2 && g1 == g2 && g1 != 0);
    nb_model_set_recompute(m, NB_RECOMPUTE_AUTO);
    CHECK_OK(ctx, nb_qmodel_set_fake(ctx, qm, 0));
    CHECK_OK(ctx, nb_model_logits(ctx, m, tok, 1, T, lg));
    CHECK(memcmp(lg, plain, sizeof(float) * (size_t)(T * V)) == 0);
    nb_quantizer_set_enabled(nb_qmodel_weight_quantizer(qm, nb_qmodel_find(qm, "model.layers.1.mlp.up_proj")), 1);

    /* 4. export: ModelOpt (k_proj.k_scale, 0-d F32) and compressed-tensors (self_attn.k_scale, [1] F32) */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    CHECK_EQ_INT(nb_qmodel_export_skipped_count(qm), 0);
    snprintf(ct, sizeof ct, "%s/ct", tmpdir);
    nb_export_opts_init(&eo);
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, ct, &eo));
    for (int layout = 0; layout < 2; layout++) {
        CHECK_OK(ctx, nb_st_open(ctx, layout ? ct : out, &st));
        if (!st) continue;
        for (int l = 0; l < LAYERS; l++)
            for (int w = 0; w < 2; w++) {
                char name[128];
                if (layout) snprintf(name, sizeof name, "model.layers.%d.self_attn.%c_scale", l, w ? 'v' : 'k');
                else snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, w ? "v_proj.v_scale" : "k_proj.k_scale");
                int64_t i = nb_st_find(st, name);
                CHECK_MSG(i >= 0, "no %s", name);
                if (i < 0) continue;
                const nb_st_entry *e = nb_st_entry_at(st, i);
                CHECK_EQ_INT(e->dtype, NB_F32);
                CHECK_EQ_INT(e->ndim, layout ? 1 : 0);
                float want = (w ? vmax[l] : kmax[l]) / 448.0f, got = -1;
                int32_t which = -1, lay = -1;
                CHECK_EQ_INT(nb_readback_kv_scale_layer(name, &which), l);
                CHECK_EQ_INT(which, w);
                CHECK_OK(ctx, nb_readback_kv_scale(ctx, st, l, w, &got, &lay));
                CHECK_EQ_INT(got == want, 1);
                CHECK_EQ_INT(lay, layout ? NB_LAYOUT_COMPRESSED_TENSORS : NB_LAYOUT_MODELOPT);
            }
        float none = 0;
        CHECK_FAIL(ctx, nb_readback_kv_scale(ctx, st, 7, 0, &none, NULL), NB_ERR_NOT_FOUND,
                   "model.layers.7.self_attn has no k_proj.k_scale");
        nb_st_close(st);
    }
    CHECK_EQ_INT(nb_readback_kv_scale_layer("model.layers.2.self_attn.k_proj.weight", NULL), -1);
    CHECK_EQ_INT(nb_readback_kv_scale_layer("model.layers.2.mlp.k_scale", NULL), -1);
    hq = read_json(out, "hf_quant_config.json");
    cJSON *q = cJSON_GetObjectItem(hq, "quantization");
    CHECK(q && strcmp(cJSON_GetObjectItem(q, "kv_cache_quant_algo")->valuestring, "FP8") == 0);
    CHECK(q && strcmp(q->child->string, "quant_algo") == 0 && strcmp(q->child->next->string, "kv_cache_quant_algo") == 0);
    cJSON_Delete(hq);
    cJSON *cfg = read_json(out, "config.json");
    cJSON *qc = cJSON_GetObjectItem(cfg, "quantization_config");
    char *kvs = cJSON_PrintUnformatted(cJSON_GetObjectItem(qc, "kv_cache_scheme"));
    CHECK(kvs && strcmp(kvs, "{\"dynamic\":false,\"num_bits\":8,\"type\":\"float\"}") == 0);
    free(kvs);
    CHECK(qc && strcmp(cJSON_GetObjectItem(qc, "kv_cache_scheme")->prev->string, "quant_algo") == 0);
    cJSON_Delete(cfg);
    cfg = read_json(ct, "config.json");
    qc = cJSON_GetObjectItem(cfg, "quantization_config");
    kvs = cJSON_PrintUnformatted(cJSON_GetObjectItem(qc, "kv_cache_scheme"));
    CHECK_MSG(kvs && strcmp(kvs, "{\"dynamic\":false,\"group_size\":null,\"num_bits\":8,\"strategy\":\"tensor\","
                                 "\"symmetric\":true,\"type\":\"float\"}") == 0, "%s", kvs ? kvs : "(none)");
    free(kvs);
    cJSON_Delete(cfg);
    /* the loader reads the exports back (the scales are not "unexpected tensors") */
    for (int layout = 0; layout < 2; layout++) {
        nb_model *back = NULL;
        CHECK_OK(ctx, nb_model_load(ctx, layout ? ct : out, &back));
        nb_model_free(back);
    }

    /* 5. save / restore: the KV state comes back and the export is the same, byte for byte */
    snprintf(ck, sizeof ck, "%s/ckpt.safetensors", tmpdir);
    snprintf(out2, sizeof out2, "%s/mo2", tmpdir);
    nb_quantizer_set_enabled(nb_qmodel_kv_quantizer(qm, 2, 1), 0);
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, out2, NULL), NB_ERR_INVALID,
               "model.layers.2.self_attn: v_bmm_quantizer is disabled while other layers quantize the KV cache");
    nb_quantizer_set_enabled(nb_qmodel_kv_quantizer(qm, 2, 1), 1);
    CHECK_OK(ctx, nb_qmodel_save(ctx, qm, ck));
    nb_qmodel *qr = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qr));
    CHECK_OK(ctx, nb_qmodel_restore(ctx, qr, ck));
    CHECK_EQ_INT(nb_qmodel_kv_format(qr), NB_FMT_FP8_TENSOR);
    for (int l = 0; l < LAYERS; l++) CHECK_EQ_INT(kv_amax(ctx, qr, l, 1) == vmax[l], 1);
    CHECK_EQ_INT(access(out2, F_OK) != 0, 1); /* the refused export left nothing behind */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qr, out2, NULL));
    static const char *files[] = {"model.safetensors", "hf_quant_config.json", "config.json"};
    for (int k = 0; k < 3; k++) {
        snprintf(p1, sizeof p1, "%s/%s", out, files[k]);
        snprintf(p2, sizeof p2, "%s/%s", out2, files[k]);
        CHECK_MSG(same_file(p1, p2), "%s differs after restore", files[k]);
    }
    /* a checkpoint without a KV cache restores to none */
    CHECK_OK(ctx, nb_qmodel_set_kv(ctx, qm, NB_FMT_NONE));
    CHECK_OK(ctx, nb_qmodel_save(ctx, qm, ck));
    CHECK_OK(ctx, nb_qmodel_restore(ctx, qr, ck));
    CHECK_EQ_INT(nb_qmodel_kv_format(qr), NB_FMT_NONE);
    nb_qmodel_free(qr);
    nb_qmodel_free(qm);

    free(step);
    free(byhand);
    free(rk);
    free(rv);
    free(kb);
    free(vb);
    free(rec);
    for (int l = 0; l <= LAYERS; l++) free(hid[l]);
    free(plain);
    free(lg);
    nb_model_free(m);
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return nbt_done("test_qmodel_kv");
}

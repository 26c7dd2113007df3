/* Quantizer edge cases from an audit: a repeated calibration gives the same state (the search is
 * centred on the data's max, not on the state it wrote before); a zero amax becomes the maxbound as in
 * ModelOpt's _sanitize_export_amax (bytes from tests/golden/gen_quant_zero_golden.py); calibrated
 * state used on a tensor of another shape is NB_ERR_SHAPE; four_over_six on a dynamic quantizer;
 * NIBBLE_QUANT_PATH values (the test runs itself again with each in the environment); NULL
 * arguments; set_state's shape rule and NaN message; the backward's dtypes; adding a member twice. */
#define _POSIX_C_SOURCE 200809L   /* popen, readlink: the NIBBLE_QUANT_PATH cases run this test again */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static nb_ctx *ctx;

/* ---- helpers ------------------------------------------------------------------------------------------- */

/* A [rows, n] tensor of dt with seeded normal values times `scale`. */
static nb_tensor *randn(nb_dtype dt, int64_t rows, int64_t n, float scale) {
    int64_t sh[2] = {rows, n};
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, dt, 2, sh, &t));
    for (int64_t i = 0; t && i < rows * n; i++)
        nb_store_elem(nb_tensor_data(t), dt, i, (double)((float)nb_rng_normal(&nbt_rng) * scale));
    return t;
}

static nb_tensor *state_of(const nb_quantizer *q, const char *attr) {
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_quantizer_get_state(ctx, q, attr, &t));
    return t;
}

static int same_tensor(const nb_tensor *a, const nb_tensor *b) {
    if (!a || !b || a->ndim != b->ndim || nb_tensor_nbytes(a) != nb_tensor_nbytes(b)) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return memcmp(nb_tensor_data(a), nb_tensor_data(b), (size_t)nb_tensor_nbytes(a)) == 0;
}

static int same_state(const nb_quantizer *a, const nb_quantizer *b) {
    int ok = 1;
    for (int k = 0; nb_quantizer_state_name(k); k++) {
        const char *attr = nb_quantizer_state_name(k);
        if (nb_quantizer_has_state(a, attr) != nb_quantizer_has_state(b, attr)) return 0;
        if (!nb_quantizer_has_state(a, attr)) continue;
        nb_tensor *x = state_of(a, attr), *y = state_of(b, attr);
        ok &= same_tensor(x, y);
        nb_tensor_release(x);
        nb_tensor_release(y);
    }
    return ok;
}

static int same_qtensor(const nb_qtensor *a, const nb_qtensor *b) {
    return a && b && same_tensor(a->data, b->data) && same_tensor(a->scale, b->scale) &&
           (!a->scale2 || same_tensor(a->scale2, b->scale2));
}

static float scalar_state(const nb_quantizer *q, const char *attr) {
    nb_tensor *t = state_of(q, attr);
    float v = t ? *(const float *)nb_tensor_data(t) : NAN;
    nb_tensor_release(t);
    return v;
}

/* A golden field's bytes compared with t's (CHECK_SAME names the first difference). */
static void check_bytes(const nb_tensor *t, const cJSON *o, const char *key, const char *what) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    CHECK_MSG(cJSON_IsString(v), "%s: golden has no %s", what, key);
    if (!cJSON_IsString(v) || !t) return;
    size_t n;
    uint8_t *want = nbt_b64_decode(v->valuestring, &n);
    CHECK_MSG((size_t)nb_tensor_nbytes(t) == n, "%s %s: %lld bytes, ModelOpt %zu", what, key, (long long)nb_tensor_nbytes(t), n);
    if ((size_t)nb_tensor_nbytes(t) == n) CHECK_SAME(key, nb_tensor_data(t), want, (int64_t)n, "%s", what);
    free(want);
}

/* ---- 1. a repeated calibration gives the same state -------------------------------------------------- */

static void test_calibrate_twice(void) {
    /* TV4 (FORMATS §2): four_over_six picks M=4, block_amax 6 * 1.5 = 9; a second calibration on the
     * same block must not search around 9 (it used to store 13.5) */
    static const float tv4[16] = {6, 5, 5, 5, -5, -5, 5, 5, 2.5f, 1, 0.5f, 0, 3, 4, -4.5f, 5.5f};
    int64_t sh[2] = {1, 16};
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 2, sh, &x));
    for (int i = 0; i < 16; i++) nb_store_elem(nb_tensor_data(x), NB_BF16, i, tv4[i]);
    nb_quantizer *q = nbt_quantizer(ctx, "tv4", NB_FMT_NVFP4_46, 1);
    nb_qtensor *a = NULL, *b = NULL;
    for (int round = 0; round < 3; round++) {
        CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, x, NB_CALIB_FOUR_OVER_SIX));
        CHECK(scalar_state(q, "block_amax") == 9.0f);
        CHECK(scalar_state(q, "global_amax") == 6.0f);
        nb_qtensor_release(b);
        b = NULL;
        CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, x, round ? &b : &a));
    }
    static const uint8_t w4[8] = {0x56, 0x55, 0xDD, 0x55, 0x13, 0x01, 0x54, 0x6D};   /* TV4's M=4 bytes */
    CHECK(a && memcmp(nb_tensor_data(a->data), w4, 8) == 0 && ((uint8_t *)nb_tensor_data(a->scale))[0] == 0x7C);
    CHECK(same_qtensor(a, b));
    nb_qtensor_release(a);
    nb_qtensor_release(b);
    nb_quantizer_release(q);
    nb_tensor_release(x);

    /* FP8 per tensor / per channel, static NVFP4 MSE: the same state bytes every time, and the same as
     * a fresh quantizer's, even after state that was garbage (a searched value, or 1000) */
    nb_tensor *w = randn(NB_BF16, 16, 64, 0.05f);
    struct { nb_qformat f; int st; nb_calib_method m; const char *attr; } cases[] = {
        {NB_FMT_FP8_TENSOR, 0, NB_CALIB_MSE, "amax"},
        {NB_FMT_FP8_CHANNEL, 0, NB_CALIB_MSE, "amax"},
        {NB_FMT_NVFP4, 1, NB_CALIB_MSE, "block_amax"},
        {NB_FMT_NVFP4, 0, NB_CALIB_MSE, "amax"},
        {NB_FMT_NVFP4_46, 1, NB_CALIB_FOUR_OVER_SIX, "block_amax"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nb_quantizer *q1 = nbt_quantizer(ctx, "w", cases[c].f, cases[c].st), *fresh = nbt_quantizer(ctx, "w", cases[c].f, cases[c].st);
        CHECK_OK(ctx, nb_quantizer_calibrate(ctx, fresh, w, cases[c].m));
        for (int round = 0; round < 2; round++) {
            CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q1, w, cases[c].m));
            CHECK_MSG(same_state(q1, fresh), "case %zu round %d: repeated calibration changed the state", c, round);
        }
        /* garbage in the state beforehand changes nothing */
        nb_tensor *s = state_of(q1, cases[c].attr);
        if (s) {
            for (int64_t i = 0; i < nb_tensor_numel(s); i++) ((float *)nb_tensor_data(s))[i] = 1000.0f;
            CHECK_OK(ctx, nb_quantizer_set_state(ctx, q1, cases[c].attr, s));
        }
        nb_tensor_release(s);
        CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q1, w, cases[c].m));
        CHECK_MSG(same_state(q1, fresh), "case %zu: state before the search leaked into it", c);
        nb_quantizer_release(q1);
        nb_quantizer_release(fresh);
    }

    /* an observer over several batches searches multiples of the max over all of them: the result is
     * the max over both batches (3.0 here) times linspace(0.25, 4, 39)[choice] */
    nb_tensor *b0 = randn(NB_F32, 4, 32, 0.1f), *b1 = randn(NB_F32, 4, 32, 0.1f);
    ((float *)nb_tensor_data(b1))[7] = -3.0f;
    q = nbt_quantizer(ctx, "act", NB_FMT_FP8_TENSOR, 0);
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MSE);
    nb_calib *ob = NULL;
    CHECK_OK(ctx, nb_calib_new(ctx, q, &cc, &ob));
    CHECK_OK(ctx, nb_calib_collect(ctx, ob, b0));
    CHECK_OK(ctx, nb_calib_collect(ctx, ob, b1));
    /* the observer copied the batches: refilling b1 before finish changes nothing */
    ((float *)nb_tensor_data(b1))[7] = 0.0f;
    CHECK_OK(ctx, nb_calib_finish(ctx, ob));
    int64_t nch = 0;
    const int32_t *ch = nb_calib_choice(ob, &nch);
    CHECK_EQ_INT(nch, 1);
    if (ch) CHECK(scalar_state(q, "amax") == 3.0f * nb_linspace_f32(0.25, 4.0, 39, ch[0]));
    nb_calib_free(ob);
    nb_quantizer_release(q);
    nb_tensor_release(b0);
    nb_tensor_release(b1);

    /* a static member of a group searches with the group's global amax: a sibling without its max pass
     * is named; after it, a repeated search gives the same state */
    nb_quantizer *g0 = nbt_quantizer(ctx, "gate", NB_FMT_NVFP4, 1), *g1 = nbt_quantizer(ctx, "up", NB_FMT_NVFP4, 1);
    nb_qgroup *grp = NULL;
    CHECK_OK(ctx, nb_qgroup_new(ctx, "gate_up", &grp));
    CHECK_OK(ctx, nb_qgroup_add(ctx, grp, g0));
    CHECK_OK(ctx, nb_qgroup_add(ctx, grp, g1));
    CHECK_FAIL(ctx, nb_quantizer_calibrate(ctx, g0, w, NB_CALIB_MSE), NB_ERR_UNCALIBRATED,
               "calibrator for 'gate': its shared group 'gate_up' member 'up' has no global_amax: the group shares one "
               "global_amax, so run a max pass on every member first");
    nb_tensor *w2 = randn(NB_BF16, 16, 64, 0.2f);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, g1, w2, NB_CALIB_MAX));
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, g0, w, NB_CALIB_MSE));
    nb_tensor *first = state_of(g0, "block_amax");
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, g0, w, NB_CALIB_MSE));
    nb_tensor *second = state_of(g0, "block_amax");
    CHECK(same_tensor(first, second));
    nb_tensor_release(first);
    nb_tensor_release(second);
    nb_quantizer_release(g0);
    nb_quantizer_release(g1);
    nb_qgroup_release(grp);
    nb_tensor_release(w2);
    nb_tensor_release(w);
}

/* ---- 2. zero amax = maxbound (ModelOpt's sanitize) ------------------------------------------------------- */

static nb_tensor *golden_tensor(const cJSON *entry) {
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    int64_t sh[NB_MAX_DIMS];
    int nd = cJSON_GetArraySize(shape);
    for (int i = 0; i < nd; i++) sh[i] = (int64_t)cJSON_GetArrayItem(shape, i)->valuedouble;
    size_t n;
    uint8_t *b = nbt_b64_decode(cJSON_GetObjectItemCaseSensitive(entry, "data")->valuestring, &n);
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_BF16, nd, sh, b, &t));
    free(b);
    return t;
}

static void test_zero_amax_golden(void) {
    char *txt = nbt_slurp(nbt_src("tests/golden/data/quant_zero_golden.json"), NULL);
    CHECK_MSG(txt != NULL, "cannot read tests/golden/data/quant_zero_golden.json");
    cJSON *doc = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (!doc) return;
    static const struct { const char *cfg; nb_qformat f; int st; } cfgs[] = {
        {"fp8", NB_FMT_FP8_TENSOR, 0}, {"fp8_channel", NB_FMT_FP8_CHANNEL, 0},
        {"nvfp4", NB_FMT_NVFP4, 0}, {"nvfp4_static", NB_FMT_NVFP4, 1}};
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(doc, "inputs");
    const cJSON *san = cJSON_GetObjectItemCaseSensitive(doc, "sanitized"), *raw = cJSON_GetObjectItemCaseSensitive(doc, "raw");
    const char *names[2] = {"dead_row", "zeros"};
    for (int i = 0; i < 2; i++) {
        nb_tensor *w = golden_tensor(cJSON_GetObjectItemCaseSensitive(inputs, names[i]));
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            char what[64];
            snprintf(what, sizeof what, "%s %s", names[i], cfgs[c].cfg);
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(san, names[i]), cfgs[c].cfg);
            nb_quantizer *q = nbt_quantizer(ctx, what, cfgs[c].f, cfgs[c].st);
            CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, w, NB_CALIB_MAX));
            nb_qtensor *qt = NULL;
            CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, w, &qt));
            if (qt) {
                check_bytes(qt->data, g, "weight", what);
                check_bytes(qt->scale, g, "weight_scale", what);
                if (qt->scale2) check_bytes(qt->scale2, g, "weight_scale_2", what);
                /* the per-tensor scale export writes is the one quantize used */
                float s = 0;
                if (cfgs[c].f != NB_FMT_FP8_CHANNEL) {
                    CHECK_OK(ctx, nb_quantizer_scale(ctx, q, &s));
                    CHECK(s == *(const float *)nb_tensor_data(qt->scale2 ? qt->scale2 : qt->scale));
                }
                /* fake quant == dequantize, and zeros stay zeros */
                nb_tensor *f = NULL, *d = NULL;
                CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, w->ndim, w->shape, &f));
                CHECK_OK(ctx, nb_quantizer_fake(ctx, q, w, f));
                CHECK_OK(ctx, nb_qtensor_dequantize(ctx, qt, NB_F32, &d));
                CHECK(same_tensor(f, d));
                int zeros = 1;
                int64_t lo = i == 0 ? 64 : 0, hi = i == 0 ? 128 : 256;   /* dead_row: row 1 */
                for (int64_t k = lo; f && k < hi; k++) zeros &= ((const float *)nb_tensor_data(f))[k] == 0.0f;
                CHECK_MSG(zeros, "%s: fake quant of the zero rows is not zero", what);
                nb_tensor_release(f);
                nb_tensor_release(d);
            }
            nb_qtensor_release(qt);
            nb_quantizer_release(q);
        }
        nb_tensor_release(w);
    }
    /* where ModelOpt 0.47's raw export is sane already (per-channel FP8's dead row), it is these bytes too */
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(raw, "dead_row"), "fp8_channel");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(san, "dead_row"), "fp8_channel");
    CHECK(cJSON_Compare(rc, sc, 1));
    /* input quantizers over all-zero activations: input_scale 1.0 (FP8) and 1/448 (NVFP4), ModelOpt's */
    const cJSON *isz = cJSON_GetObjectItemCaseSensitive(doc, "input_scale_zero_act");
    int64_t ash[2] = {8, 64};
    nb_tensor *act0 = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 2, ash, &act0));
    for (int k = 0; k < 2; k++) {
        nb_quantizer *iq = nbt_quantizer(ctx, "input_quantizer", k ? NB_FMT_NVFP4 : NB_FMT_FP8_TENSOR, 0);
        CHECK_OK(ctx, nb_quantizer_calibrate(ctx, iq, act0, NB_CALIB_MAX));
        float s = 0;
        CHECK_OK(ctx, nb_quantizer_scale(ctx, iq, &s));
        nb_tensor *st = NULL;
        CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 0, NULL, &s, &st));
        check_bytes(st, isz, k ? "nvfp4" : "fp8", "input_scale of all-zero activations");
        CHECK(s == (k ? 1.0f / 448.0f : 1.0f));
        nb_tensor_release(st);
        nb_quantizer_release(iq);
    }
    nb_tensor_release(act0);
    cJSON_Delete(doc);
}

/* The rule where ModelOpt cannot run on CPU (four_over_six) and for the standalone entry points. */
static void test_zero_amax_rule(void) {
    int64_t sh[2] = {2, 32};
    nb_tensor *z = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &z));
    /* four_over_six: G 0 -> 6, s2 = 6/1536 = 2^-8; a zero block at 256: r = 256 -> 0x78 (static) */
    nb_quantizer *q = nbt_quantizer(ctx, "46", NB_FMT_NVFP4_46, 1);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, z, NB_CALIB_FOUR_OVER_SIX));
    nb_qtensor *qt = NULL;
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, z, &qt));
    if (qt) {
        CHECK(*(const float *)nb_tensor_data(qt->scale2) == 0x1p-8f);
        int ok = 1;
        for (int i = 0; i < 32; i++) ok &= ((const uint8_t *)nb_tensor_data(qt->data))[i] == 0;
        for (int i = 0; i < 4; i++) ok &= ((const uint8_t *)nb_tensor_data(qt->scale))[i] == 0x78;
        CHECK_MSG(ok, "four_over_six all-zero bytes");
    }
    nb_qtensor_release(qt);
    nb_quantizer_release(q);
    /* standalone: amax 0 given explicitly is the same as from the data; NaN / Inf stay errors */
    static const nb_qformat fs[4] = {NB_FMT_NVFP4, NB_FMT_NVFP4_46, NB_FMT_FP8_TENSOR, NB_FMT_FP8_CHANNEL};
    for (int k = 0; k < 4; k++) {
        nb_qparams p;
        nb_qparams_init(&p, fs[k]);
        nb_qtensor *a = NULL, *b = NULL;
        CHECK_OK(ctx, nb_quantize(ctx, z, &p, &a));
        if (fs[k] != NB_FMT_FP8_CHANNEL) {
            p.amax = 0.0f;
            CHECK_OK(ctx, nb_quantize(ctx, z, &p, &b));
            CHECK(same_qtensor(a, b));
            nb_qtensor_release(b);   /* the refused calls below leave b NULL */
            b = NULL;
            p.amax = NAN;
            p.name = "w";
            CHECK_FAIL(ctx, nb_quantize(ctx, z, &p, &b), NB_ERR_NUMERIC, "w: amax is NaN");
            p.amax = INFINITY;
            CHECK_FAIL(ctx, nb_quantize(ctx, z, &p, &b), NB_ERR_NUMERIC, "w: amax is +Inf");
        }
        CHECK(a && (a->scale2 ? *(const float *)nb_tensor_data(a->scale2) : *(const float *)nb_tensor_data(a->scale)) ==
                       (fs[k] == NB_FMT_NVFP4 ? 6.0f / 2688.0f : fs[k] == NB_FMT_NVFP4_46 ? 6.0f / 1536.0f : 1.0f));
        nb_qtensor_release(a);
        nb_qtensor_release(b);
    }
    /* a NaN in set_state is named "NaN" (printf would say "-nan") */
    q = nbt_quantizer(ctx, "fp8q", NB_FMT_FP8_TENSOR, 0);
    float nan = NAN;
    nb_tensor *nt = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 0, NULL, &nan, &nt));
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, q, "amax", nt), NB_ERR_NUMERIC,
               "quantizer 'fp8q': amax[0] = NaN is not a finite amax >= 0");
    nb_tensor_release(nt);
    nb_quantizer_release(q);
    nb_tensor_release(z);
}

/* ---- 3. state calibrated for another shape ---------------------------------------------------------------- */

static void test_state_shape(void) {
    nb_tensor *w = randn(NB_BF16, 64, 64, 0.05f);
    nb_quantizer *q = nbt_quantizer(ctx, "q_proj.weight_quantizer", NB_FMT_NVFP4, 1);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, w, NB_CALIB_MAX));
    int64_t vs[2] = {32, 128};
    nb_tensor *v = NULL, *y = NULL;
    CHECK_OK(ctx, nb_tensor_view(ctx, w, 2, vs, &v));
    nb_qtensor *qt = NULL;
    const char *msg = "q_proj.weight_quantizer: block_amax {64, 4} does not fit this {32, 128} tensor, which needs {32, 8}";
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, q, v, &qt), NB_ERR_SHAPE, msg);
    CHECK(qt == NULL);
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, vs, &y));
    CHECK_FAIL(ctx, nb_quantizer_fake(ctx, q, v, y), NB_ERR_SHAPE, msg);
    nb_tensor_release(y);
    /* a transpose of a non-square weight */
    nb_tensor *r = randn(NB_BF16, 32, 64, 0.05f), *rt = NULL;
    CHECK_OK(ctx, nb_tensor_transpose(ctx, r, 0, 1, &rt));
    nb_quantizer *qr = nbt_quantizer(ctx, "k_proj.weight_quantizer", NB_FMT_NVFP4, 1);
    nb_quantizer_config cfg;
    nb_quantizer_get_config(qr, &cfg);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, qr, r, NB_CALIB_MAX));
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, qr, rt, &qt), NB_ERR_SHAPE,
               "block_amax {32, 4} does not fit this {64, 32} tensor, which needs {64, 2}");
    /* the clipped backward reads the same state */
    nb_quantizer *qb = NULL;
    cfg.pass_through_bwd = 0;
    CHECK_OK(ctx, nb_quantizer_new(ctx, "clipped", &cfg, &qb));
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, qb, w, NB_CALIB_MAX));
    nb_tensor *g = NULL, *gi = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, vs, &g));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, vs, &gi));
    CHECK_FAIL(ctx, nb_quantizer_backward(ctx, qb, v, g, gi), NB_ERR_SHAPE, "block_amax {64, 4} does not fit this {32, 128}");
    /* FP8 per channel: the row amax {64, 1} on a {32, 128} view */
    nb_quantizer *qc = nbt_quantizer(ctx, "o_proj.weight_quantizer", NB_FMT_FP8_CHANNEL, 0);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, qc, w, NB_CALIB_MAX));
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, qc, v, &qt), NB_ERR_SHAPE,
               "amax has 64 values, the tensor needs 32 (amax {64, 1} does not fit this {32, 128} tensor, which needs {32, 1})");
    /* set_state must keep the shape already there (quant.h); clearing first allows another */
    int64_t s33[2] = {3, 3};
    nb_tensor *b33 = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, s33, &b33));
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, q, "block_amax", b33), NB_ERR_SHAPE,
               "quantizer 'q_proj.weight_quantizer': block_amax {3, 3} does not match the block_amax {64, 4} it has");
    nb_tensor *ba = state_of(q, "block_amax");
    CHECK(ba && ba->shape[0] == 64 && ba->shape[1] == 4);   /* unchanged */
    /* a flat block_amax (ModelOpt's own layout) fits by count, with the same bytes */
    nb_quantizer *qf = nbt_quantizer(ctx, "flat", NB_FMT_NVFP4, 1);
    int64_t flat = 256;
    nb_tensor *bf = NULL;
    CHECK_OK(ctx, nb_tensor_view(ctx, ba, 1, &flat, &bf));
    CHECK_OK(ctx, nb_quantizer_set_state(ctx, qf, "block_amax", bf));
    float gv = scalar_state(q, "global_amax");
    nb_tensor *gt = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 0, NULL, &gv, &gt));
    CHECK_OK(ctx, nb_quantizer_set_state(ctx, qf, "global_amax", gt));
    nb_qtensor *q1 = NULL, *q2 = NULL;
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, w, &q1));
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, qf, w, &q2));
    CHECK(same_qtensor(q1, q2));
    CHECK_OK(ctx, nb_quantizer_clear_state(ctx, q, "block_amax"));
    CHECK_OK(ctx, nb_quantizer_set_state(ctx, q, "block_amax", b33));
    nb_qtensor_release(q1);
    nb_qtensor_release(q2);
    nb_tensor_release(bf);
    nb_tensor_release(gt);
    nb_tensor_release(ba);
    nb_tensor_release(b33);
    nb_tensor_release(g);
    nb_tensor_release(gi);
    nb_tensor_release(rt);
    nb_tensor_release(r);
    nb_tensor_release(v);
    nb_tensor_release(w);
    nb_quantizer_release(q);
    nb_quantizer_release(qr);
    nb_quantizer_release(qb);
    nb_quantizer_release(qc);
    nb_quantizer_release(qf);
}

/* ---- 5. four_over_six on a dynamic quantizer ------------------------------------------------------------- */

static void test_four_over_six_dynamic(void) {
    nb_tensor *w = randn(NB_BF16, 8, 64, 0.05f);
    nb_quantizer *q = nbt_quantizer(ctx, "dyn46", NB_FMT_NVFP4_46, 0);
    CHECK_FAIL(ctx, nb_quantizer_calibrate(ctx, q, w, NB_CALIB_FOUR_OVER_SIX), NB_ERR_INVALID,
               "calibrator for 'dyn46': four_over_six calibration stores a per-block M=6/M=4 choice, which only a static "
               "nvfp4_46 quantizer keeps; this one is dynamic (it picks per block when it quantizes), so calibrate it "
               "with max (its global amax), or make it static");
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, w, NB_CALIB_MAX));
    nb_qtensor *a = NULL, *b = NULL;
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, w, &a));
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4_46);   /* the inline per-block pick with G from the data */
    CHECK_OK(ctx, nb_quantize(ctx, w, &p, &b));
    CHECK(same_qtensor(a, b));
    nb_qtensor_release(a);
    nb_qtensor_release(b);
    nb_quantizer_release(q);
    /* other formats keep the old message */
    q = nbt_quantizer(ctx, "plain", NB_FMT_NVFP4, 1);
    CHECK_FAIL(ctx, nb_quantizer_calibrate(ctx, q, w, NB_CALIB_FOUR_OVER_SIX), NB_ERR_INVALID,
               "four_over_six needs a static nvfp4_46 quantizer, not nvfp4 static");
    nb_quantizer_release(q);
    nb_tensor_release(w);
}

/* ---- 6. NIBBLE_QUANT_PATH ------------------------------------------------------------------------------------ */

/* Child mode: one quantize (and a dequantize) under the environment's path, printed for the parent;
 * then the program's own nb_quant_set_cpu_path("auto") replaces a bad environment. */
static int env_child(void) {
    nb_ctx *c = NULL;
    if (nb_ctx_new(1, &c)) return 2;
    int64_t sh[2] = {2, 32};
    nb_tensor *x = NULL;
    nb_tensor_new(c, NB_F32, 2, sh, &x);
    for (int i = 0; i < 64; i++) ((float *)nb_tensor_data(x))[i] = (float)(i - 30) * 0.1f;
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    nb_qtensor *q = NULL;
    nb_status s = nb_quantize(c, x, &p, &q);
    printf("path=%s status=%s msg=%s\n", nb_quant_cpu_path(c), nb_status_name(s), s ? nb_ctx_last_error(c) : "");
    nb_tensor *d = NULL;
    nb_qtensor *q0 = NULL;
    nb_qtensor_new(c, NB_FMT_NVFP4, 2, sh, &q0);
    s = nb_qtensor_dequantize(c, q0, NB_F32, &d);
    printf("dequantize=%s\n", nb_status_name(s));
    nb_tensor_release(d);
    s = nb_quant_set_cpu_path(c, "auto");
    nb_qtensor_release(q);
    q = NULL;
    if (!s) s = nb_quantize(c, x, &p, &q);
    printf("after_set=%s\n", nb_status_name(s));
    nb_qtensor_release(q);
    nb_qtensor_release(q0);
    nb_tensor_release(x);
    nb_ctx_release(c);
    return 0;
}

static void test_env_path(const char *self) {
    static const struct { const char *value; const char *status; const char *path; } cases[] = {
        {"bogus", "NB_ERR_INVALID", NULL},
        {"AVX2", "NB_ERR_INVALID", NULL},
        {"reference", "NB_OK", "reference"},
        {"auto", "NB_OK", NULL},
        {"", "NB_OK", NULL},
        {"avx2", NULL, "avx2"},
        {"avx512", NULL, "avx512"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[4400], out[4096] = {0};
        snprintf(cmd, sizeof cmd, "NIBBLE_QUANT_PATH='%s' '%s' --env-child 2>&1", cases[i].value, self);
        FILE *f = popen(cmd, "r");
        CHECK_MSG(f != NULL, "popen %s", cmd);
        if (!f) continue;
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        int rc = pclose(f);
        CHECK_MSG(rc == 0, "%s: child exit %d: %s", cases[i].value, rc, out);
        const char *want = cases[i].status;
        int has_path = !strcmp(cases[i].value, "avx2") ? nb_quant_set_cpu_path(ctx, "avx2") == NB_OK
                     : !strcmp(cases[i].value, "avx512") ? nb_quant_set_cpu_path(ctx, "avx512") == NB_OK : 1;
        if (!want) want = has_path ? "NB_OK" : "NB_ERR_UNSUPPORTED";
        char line[256];
        snprintf(line, sizeof line, "status=%s ", want);
        CHECK_MSG(strstr(out, line) != NULL, "NIBBLE_QUANT_PATH='%s': wanted %s, got: %s", cases[i].value, want, out);
        if (strcmp(want, "NB_OK") != 0) {
            snprintf(line, sizeof line, "NIBBLE_QUANT_PATH='%s'", cases[i].value);
            CHECK_MSG(strstr(out, line) && strstr(out, "auto, avx512, avx2 or reference"), "message: %s", out);
            snprintf(line, sizeof line, "dequantize=%s", want);
            CHECK_MSG(strstr(out, line) != NULL, "dequantize under a bad path: %s", out);
        } else {
            CHECK_MSG(strstr(out, "dequantize=NB_OK") != NULL, "%s", out);
            if (cases[i].path) {
                snprintf(line, sizeof line, "path=%s ", cases[i].path);
                CHECK_MSG(strstr(out, line) != NULL, "NIBBLE_QUANT_PATH='%s' installed: %s", cases[i].value, out);
            }
        }
        CHECK_MSG(strstr(out, "after_set=NB_OK") != NULL, "an explicit path clears the environment's error: %s", out);
    }
    CHECK_OK(ctx, nb_quant_set_cpu_path(ctx, "auto"));
}

/* ---- 7. NULL arguments ---------------------------------------------------------------------------------------- */

static void test_null_args(void) {
    int64_t sh[2] = {2, 32};
    nb_tensor *x = randn(NB_F32, 2, 32, 1.0f), *y = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &y));
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    nb_qtensor *qt = NULL, *q0 = NULL;
    CHECK_OK(ctx, nb_qtensor_new(ctx, NB_FMT_NVFP4, 2, sh, &q0));
    CHECK_FAIL(ctx, nb_quantize(ctx, x, NULL, &qt), NB_ERR_INVALID, "nb_quantize: params are NULL");
    CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, NULL), NB_ERR_INVALID, "nb_quantize: out is NULL");
    CHECK_FAIL(ctx, nb_quantize(ctx, NULL, &p, &qt), NB_ERR_INVALID, "tensor: tensor is NULL");
    CHECK_FAIL(ctx, nb_quantize_into(ctx, x, NULL, q0), NB_ERR_INVALID, "nb_quantize_into: params are NULL");
    CHECK_FAIL(ctx, nb_quantize_into(ctx, x, &p, NULL), NB_ERR_INVALID, "quantized output is NULL");
    CHECK_FAIL(ctx, nb_fake_quant(ctx, x, NULL, y), NB_ERR_INVALID, "nb_fake_quant: params are NULL");
    CHECK_FAIL(ctx, nb_fake_quant(ctx, x, &p, NULL), NB_ERR_INVALID, "output tensor is NULL");
    CHECK_FAIL(ctx, nb_fake_quant(ctx, NULL, &p, y), NB_ERR_INVALID, "tensor is NULL");
    nb_tensor *d = NULL;
    CHECK_FAIL(ctx, nb_qtensor_dequantize(ctx, NULL, NB_F32, &d), NB_ERR_INVALID, "dequantize: quantized tensor is NULL");
    CHECK_FAIL(ctx, nb_qtensor_dequantize(ctx, q0, NB_F32, NULL), NB_ERR_INVALID, "dequantize: out is NULL");
    CHECK_FAIL(ctx, nb_qtensor_dequantize(ctx, q0, NB_I32, &d), NB_ERR_UNSUPPORTED, "output dtype i32");
    CHECK_FAIL(ctx, nb_qtensor_dequantize_into(ctx, NULL, y), NB_ERR_INVALID, "dequantize: quantized tensor is NULL");
    CHECK_FAIL(ctx, nb_qtensor_new(ctx, NB_FMT_NVFP4, 2, NULL, &qt), NB_ERR_INVALID, "nb_qtensor_new: shape is NULL");
    CHECK_FAIL(ctx, nb_qtensor_new(ctx, NB_FMT_NVFP4, 2, sh, NULL), NB_ERR_INVALID, "nb_qtensor_new: out is NULL");
    CHECK_FAIL(ctx, nb_qtensor_wrap(ctx, NB_FMT_NVFP4, q0->data, q0->scale, q0->scale2, NULL), NB_ERR_INVALID,
               "nb_qtensor_wrap: out is NULL");
    /* quantizers */
    nb_quantizer *q = NULL;
    CHECK_FAIL(ctx, nb_quantizer_new(ctx, "n", NULL, &q), NB_ERR_INVALID, "quantizer 'n': config is NULL");
    q = nbt_quantizer(ctx, "q", NB_FMT_NVFP4, 0);
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, NULL, x, &qt), NB_ERR_INVALID, "nb_quantizer_quantize: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, q, x, NULL), NB_ERR_INVALID, "nb_quantizer_quantize: out is NULL");
    CHECK_FAIL(ctx, nb_quantizer_fake(ctx, NULL, x, y), NB_ERR_INVALID, "nb_quantizer_fake: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_fake(ctx, q, NULL, y), NB_ERR_INVALID, "quantizer 'q' fake: input is NULL");
    CHECK_FAIL(ctx, nb_quantizer_fake(ctx, q, x, NULL), NB_ERR_INVALID, "quantizer 'q' fake: output is NULL");
    CHECK_FAIL(ctx, nb_quantizer_backward(ctx, NULL, x, y, y), NB_ERR_INVALID, "nb_quantizer_backward: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_calibrate(ctx, NULL, x, NB_CALIB_MAX), NB_ERR_INVALID, "nb_calib_new: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_calibrate(ctx, q, NULL, NB_CALIB_MAX), NB_ERR_INVALID, "q: tensor is NULL");
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, NULL, "amax", x), NB_ERR_INVALID, "nb_quantizer_set_state: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, q, "amax", NULL), NB_ERR_INVALID, "quantizer 'q': amax value is NULL");
    CHECK_FAIL(ctx, nb_quantizer_get_state(ctx, q, "amax", NULL), NB_ERR_INVALID, "nb_quantizer_get_state: out is NULL");
    CHECK_FAIL(ctx, nb_quantizer_clear_state(ctx, NULL, NULL), NB_ERR_INVALID, "nb_quantizer_clear_state: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_check(ctx, NULL), NB_ERR_INVALID, "nb_quantizer_check: quantizer is NULL");
    float f = 0;
    CHECK_FAIL(ctx, nb_quantizer_scale(ctx, q, NULL), NB_ERR_INVALID, "nb_quantizer_scale: out is NULL");
    CHECK_FAIL(ctx, nb_quantizer_global_amax(ctx, NULL, &f), NB_ERR_INVALID, "nb_quantizer_global_amax: quantizer is NULL");
    CHECK_FAIL(ctx, nb_quantizer_params(ctx, q, NULL), NB_ERR_INVALID, "nb_quantizer_params: out is NULL");
    /* calibrators and groups */
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    nb_calib *c = NULL;
    CHECK_FAIL(ctx, nb_calib_new(ctx, q, NULL, &c), NB_ERR_INVALID, "nb_calib_new: config is NULL");
    CHECK_FAIL(ctx, nb_calib_new(ctx, q, &cc, NULL), NB_ERR_INVALID, "nb_calib_new: out is NULL");
    CHECK_FAIL(ctx, nb_calib_collect(ctx, NULL, x), NB_ERR_INVALID, "nb_calib_collect: calibrator is NULL");
    CHECK_FAIL(ctx, nb_calib_finish(ctx, NULL), NB_ERR_INVALID, "nb_calib_finish: calibrator is NULL");
    CHECK_EQ_INT(nb_calib_batches(NULL), 0);
    nb_qgroup *g = NULL;
    CHECK_OK(ctx, nb_qgroup_new(ctx, "g", &g));
    CHECK_FAIL(ctx, nb_qgroup_add(ctx, g, NULL), NB_ERR_INVALID, "nb_qgroup_add: quantizer is NULL");
    CHECK_FAIL(ctx, nb_qgroup_add(ctx, NULL, q), NB_ERR_INVALID, "nb_qgroup_add: group is NULL");
    CHECK_FAIL(ctx, nb_qgroup_remove(ctx, g, NULL), NB_ERR_INVALID, "nb_qgroup_remove: quantizer is NULL");
    CHECK_FAIL(ctx, nb_qgroup_new(ctx, "g", NULL), NB_ERR_INVALID, "nb_qgroup_new: out is NULL");
    /* 8. adding a member twice changes nothing */
    CHECK_OK(ctx, nb_qgroup_add(ctx, g, q));
    CHECK_OK(ctx, nb_qgroup_add(ctx, g, q));
    CHECK_EQ_INT(nb_qgroup_size(g), 1);
    nb_qgroup_release(g);
    nb_quantizer_release(q);
    nb_qtensor_release(q0);
    nb_tensor_release(x);
    nb_tensor_release(y);
}

/* ---- 8. the backward refuses integer gradients on every path ---------------------------------------------- */

static void test_backward_dtypes(void) {
    int64_t sh[2] = {2, 32};
    nb_tensor *x = randn(NB_F32, 2, 32, 1.0f), *g = randn(NB_F32, 2, 32, 1.0f), *gi = NULL, *gb = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_I32, 2, sh, &gi));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 2, sh, &gb));
    for (int pt = 0; pt < 2; pt++) {
        nb_quantizer_config cfg;
        nb_quantizer_config_init(&cfg, NB_FMT_NVFP4);
        cfg.pass_through_bwd = pt;
        nb_quantizer *q = NULL;
        CHECK_OK(ctx, nb_quantizer_new(ctx, "q", &cfg, &q));
        CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, x, NB_CALIB_MAX));
        CHECK_FAIL(ctx, nb_quantizer_backward(ctx, q, x, g, gi), NB_ERR_UNSUPPORTED,
                   "quantizer 'q' backward: f32, bf16 or f16 tensors only (x f32, grad_out f32, grad_in i32)");
        CHECK_OK(ctx, nb_quantizer_backward(ctx, q, x, g, gb));   /* bf16 is a float dtype */
        nb_quantizer_release(q);
    }
    nb_tensor_release(x);
    nb_tensor_release(g);
    nb_tensor_release(gi);
    nb_tensor_release(gb);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--env-child") == 0) return env_child();
    nb_rng_seed(&nbt_rng, 20241130);
    CHECK_OK(ctx, nb_ctx_new(0, &ctx));
    test_calibrate_twice();
    test_zero_amax_golden();
    test_zero_amax_rule();
    test_state_shape();
    test_four_over_six_dynamic();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        test_env_path(self);
    } else {
        printf("NIBBLE_QUANT_PATH cases skipped: /proc/self/exe unreadable\n");
    }
    test_null_args();
    test_backward_dtypes();
    nb_ctx_release(ctx);
    return nbt_done("test_quant_edge");
}

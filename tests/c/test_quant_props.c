/* Properties of the quantizers on random and crafted tensors, through the scalar reference rows:
 * fake quant == dequantize(quantize) bitwise for every format and dtype; per-element error within
 * the format's bound; idempotence; packing order; the straight-through gradient; calibrators
 * (accumulation, MSE argmin with first-index ties, four_over_six); state save/restore; shared
 * groups; thread-count independence; bad input as named errors; swapping row functions. */
#include <stdint.h>
#include <string.h>

#include "nbtest.h"

static nb_ctx *ctx;
static nb_rng rng;

static nb_tensor *randn(nb_dtype dt, int nd, const int64_t *sh, float scale, int outliers) {
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, dt, nd, sh, &t));
    int64_t n = nb_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = nb_rng_normal(&rng) * scale;
        if (outliers && nb_rng_uniform(&rng) < 0.01) v *= 40.0;
        if (nb_rng_uniform(&rng) < 0.02) v = 0.0;
        nb_store_elem(nb_tensor_data(t), dt, i, v);
    }
    return t;
}

static float absmax_of(const nb_tensor *t) {
    float m = 0;
    for (int64_t i = 0; i < nb_tensor_numel(t); i++) m = fmaxf(m, fabsf((float)nb_load_elem(nb_tensor_data(t), t->dtype, i)));
    return m;
}

static int same_tensor_bytes(const nb_tensor *a, const nb_tensor *b) {
    return nb_tensor_nbytes(a) == nb_tensor_nbytes(b) &&
           memcmp(nb_tensor_data(a), nb_tensor_data(b), (size_t)nb_tensor_nbytes(a)) == 0;
}

static int same_qtensor(const nb_qtensor *a, const nb_qtensor *b);

/* NVFP4 code 8 (-0) dequantizes to +0 (ModelOpt's table), so requantizing gives code 0: equal here */
static int same_codes_mod_negzero(const nb_tensor *a, const nb_tensor *b) {
    if (nb_tensor_nbytes(a) != nb_tensor_nbytes(b)) return 0;
    const uint8_t *x = nb_tensor_data(a), *y = nb_tensor_data(b);
    for (int64_t i = 0; i < nb_tensor_nbytes(a); i++) {
        uint8_t lo1 = x[i] & 15, hi1 = x[i] >> 4, lo2 = y[i] & 15, hi2 = y[i] >> 4;
        if ((lo1 == 8 ? 0 : lo1) != (lo2 == 8 ? 0 : lo2) || (hi1 == 8 ? 0 : hi1) != (hi2 == 8 ? 0 : hi2)) return 0;
    }
    return 1;
}

static int same_qtensor_requant(const nb_qtensor *a, const nb_qtensor *b) {
    if (a->format != NB_FMT_NVFP4 && a->format != NB_FMT_NVFP4_46) return same_qtensor(a, b);
    return same_codes_mod_negzero(a->data, b->data) && same_tensor_bytes(a->scale, b->scale) &&
           same_tensor_bytes(a->scale2, b->scale2);
}

static int same_qtensor(const nb_qtensor *a, const nb_qtensor *b) {
    return same_tensor_bytes(a->data, b->data) && same_tensor_bytes(a->scale, b->scale) &&
           (!a->scale2 || same_tensor_bytes(a->scale2, b->scale2));
}

/* ---- fake == dequant, error bounds, idempotence ------------------------------------------------------ */

typedef struct fmt_case {
    const char *name;
    nb_qformat f;
    int is_static, mx_floor;
} fmt_case;

static const fmt_case CASES[] = {
    {"nvfp4", NB_FMT_NVFP4, 0, 0},          {"nvfp4 static", NB_FMT_NVFP4, 1, 0},
    {"nvfp4_46 static", NB_FMT_NVFP4_46, 1, 0}, {"mxfp8", NB_FMT_MXFP8, 0, 0},
    {"mxfp8 ocp", NB_FMT_MXFP8, 0, 1},      {"fp8", NB_FMT_FP8_TENSOR, 0, 0},
    {"fp8_channel", NB_FMT_FP8_CHANNEL, 0, 0},
};

/* The largest |x - y| a format allows for element i (from the quantized tensor's own scales). */
static double bound(const nb_qtensor *q, int64_t i, double x, int mx_floor) {
    int64_t n = q->shape[q->ndim - 1], row = i / n, col = i % n;
    switch (q->format) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46: {
        float s2 = *(float *)nb_tensor_data(q->scale2);
        uint8_t sb = ((uint8_t *)nb_tensor_data(q->scale))[row * (n / 16) + col / 16];
        double p = (double)(nb_e4m3_to_f32(sb) * s2);
        /* half the widest E2M1 gap (4 -> 6) is 1.0 step of p; beyond 6p only saturation */
        return fabs(x) > 6 * p ? fabs(x) - 6 * p + 1e-6 * fabs(x) : p * (1 + 1e-6);
    }
    case NB_FMT_MXFP8: {
        uint8_t c = ((uint8_t *)nb_tensor_data(q->scale))[row * (n / 32) + col / 32];
        double X = ldexp(1.0, c - 127);
        double sat = fabs(x) > 448 * X ? fabs(x) - 448 * X : 0;
        (void)mx_floor;
        return sat + fmax(fabs(x) * 0x1p-4, X * 0x1p-10) * (1 + 1e-6);
    }
    default: {
        double s = q->format == NB_FMT_FP8_TENSOR ? *(float *)nb_tensor_data(q->scale)
                                                  : ((float *)nb_tensor_data(q->scale))[row];
        /* e4m3 half-ulp 2^-4 relative (2^-10*s absolute below 2^-6), plus the bf16 rounding of w/s */
        return fmax(fabs(x) * (0x1p-4 + 0x1p-8), s * 0x1p-10) * (1 + 1e-6);
    }
    }
}

static void fake_equals_dequant_and_bounds(void) {
    const nb_dtype dts[3] = {NB_F32, NB_BF16, NB_F16};
    const int64_t shapes[3][3] = {{7, 64, 0}, {3, 5, 96}, {1, 256, 0}};
    const int nds[3] = {2, 3, 2};
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        for (int d = 0; d < 3; d++) {
            for (int s = 0; s < 3; s++) {
                char what[96];
                snprintf(what, sizeof what, "%s %s shape#%d", CASES[c].name, nb_dtype_info(dts[d])->name, s);
                nb_tensor *x = randn(dts[d], nds[s], shapes[s], d == 2 ? 0.5f : 0.05f, 1);
                nb_quantizer_config cfg;
                nb_quantizer_config_init(&cfg, CASES[c].f);
                cfg.is_static = CASES[c].is_static;
                cfg.mx_floor = CASES[c].mx_floor;
                nb_quantizer *q = NULL;
                CHECK_OK(ctx, nb_quantizer_new(ctx, what, &cfg, &q));
                if (CASES[c].f == NB_FMT_NVFP4_46) CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, x, NB_CALIB_FOUR_OVER_SIX));
                else CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, x, NB_CALIB_MAX));
                nb_qtensor *qt = NULL;
                CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, x, &qt));
                if (!qt) { nb_quantizer_release(q); nb_tensor_release(x); continue; }
                for (int od = 0; od < 3; od++) {
                    nb_tensor *f = NULL, *dq = NULL;
                    CHECK_OK(ctx, nb_tensor_new(ctx, dts[od], x->ndim, x->shape, &f));
                    CHECK_OK(ctx, nb_quantizer_fake(ctx, q, x, f));
                    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, qt, dts[od], &dq));
                    CHECK_MSG(same_tensor_bytes(f, dq), "%s: fake != dequantize(export) in %s", what, nb_dtype_info(dts[od])->name);
                    nb_tensor_release(f);
                    nb_tensor_release(dq);
                }
                /* error bound, element by element (f32 dequant) */
                nb_tensor *y = NULL;
                CHECK_OK(ctx, nb_qtensor_dequantize(ctx, qt, NB_F32, &y));
                int64_t n = nb_tensor_numel(x), bad = -1;
                for (int64_t i = 0; i < n && bad < 0; i++) {
                    double xv = nb_load_elem(nb_tensor_data(x), x->dtype, i), yv = ((float *)nb_tensor_data(y))[i];
                    if (!(fabs(xv - yv) <= bound(qt, i, xv, CASES[c].mx_floor))) bad = i;
                }
                CHECK_MSG(bad < 0, "%s: element %lld outside the error bound (x %.9g y %.9g bound %.9g)", what, (long long)bad, bad >= 0 ? nb_load_elem(nb_tensor_data(x), x->dtype, bad) : 0.0, bad >= 0 ? (double)((float *)nb_tensor_data(y))[bad] : 0.0, bad >= 0 ? bound(qt, bad, nb_load_elem(nb_tensor_data(x), x->dtype, bad), 0) : 0.0);
                /* idempotence: fake(fake(x)) == fake(x) (scales fixed by state, or recomputed from y) */
                if (CASES[c].f != NB_FMT_NVFP4 || CASES[c].is_static) {
                    nb_tensor *y2 = NULL;
                    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, x->ndim, x->shape, &y2));
                    CHECK_OK(ctx, nb_quantizer_fake(ctx, q, y, y2));
                    CHECK_MSG(same_tensor_bytes(y, y2), "%s: fake quant is not idempotent", what);
                    nb_tensor_release(y2);
                    if (CASES[c].is_static || CASES[c].f == NB_FMT_FP8_TENSOR || CASES[c].f == NB_FMT_FP8_CHANNEL) {
                        nb_qtensor *qt2 = NULL;
                        CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, y, &qt2));
                        CHECK_MSG(qt2 && same_qtensor_requant(qt, qt2), "%s: quantize(dequantize(q)) != q", what);
                        nb_qtensor_release(qt2);
                    }
                }
                nb_tensor_release(y);
                nb_qtensor_release(qt);
                nb_quantizer_release(q);
                nb_tensor_release(x);
            }
        }
    }
}

/* ---- packing -------------------------------------------------------------------------------------- */

static void packing_round_trip(void) {
    /* every code 0..15 in every position: x = e2m1(code) * p with a static scale that makes p = 1 */
    int64_t sh[2] = {16, 64};
    float xs[16 * 64];
    uint8_t codes[16 * 64];
    for (int i = 0; i < 16 * 64; i++) {
        uint8_t c = (uint8_t)(nb_rng_next(&rng) & 15);
        if (i % 64 == 5) c = 7;   /* each block row reaches 6 somewhere */
        codes[i] = c == 8 ? 0 : c;   /* -0 requantizes to code 0 */
        xs[i] = nb_e2m1_to_f32(c);
    }
    for (int b = 0; b < 16 * 4; b++) { xs[b * 16 + 5] = 6.0f; codes[b * 16 + 5] = 7; }
    nb_tensor *x = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, sh, xs, &x));
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.amax = 2688.0f;   /* s2 = 1, every block amax 6 -> scale byte 0x38, p = 1 */
    nb_qtensor *q = NULL;
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    const uint8_t *pk = nb_tensor_data(q->data);
    int ok = 1;
    for (int i = 0; i < 16 * 64; i += 2)
        if (pk[i / 2] != (uint8_t)(codes[i] | (codes[i + 1] << 4))) ok = 0;
    CHECK_MSG(ok, "packed bytes are not code[2j] | code[2j+1] << 4");
    /* the same bytes read as nibble's E2M1 dtype give the element values back */
    nb_tensor *v = NULL;
    CHECK_OK(ctx, nb_tensor_wrap(ctx, q->data->buf, NB_E2M1, 2, sh, q->data->offset, &v));
    ok = 1;
    for (int i = 0; i < 16 * 64; i++)
        if (nb_load_elem(nb_tensor_data(v), NB_E2M1, i) != (double)nb_e2m1_to_f32(codes[i])) ok = 0;
    CHECK_MSG(ok, "packed data does not read back through the E2M1 dtype");
    nb_tensor *y = NULL;
    CHECK_OK(ctx, nb_qtensor_dequantize(ctx, q, NB_F32, &y));
    CHECK(memcmp(nb_tensor_data(y), xs, 4) == 0 || ((float *)nb_tensor_data(y))[0] == xs[0]);
    ok = 1;
    for (int i = 0; i < 16 * 64; i++)
        if (((float *)nb_tensor_data(y))[i] != xs[i]) ok = 0;
    CHECK_MSG(ok, "grid values do not survive quantize/dequantize");
    nb_tensor_release(y);
    nb_tensor_release(v);
    nb_qtensor_release(q);
    nb_tensor_release(x);
}

/* ---- straight-through estimator -------------------------------------------------------------------- */

static void ste(void) {
    int64_t sh[2] = {4, 64};
    for (int k = 0; k < 4; k++) {
        nb_qformat f = k == 0 ? NB_FMT_NVFP4 : k == 1 ? NB_FMT_NVFP4 : k == 2 ? NB_FMT_FP8_CHANNEL : NB_FMT_MXFP8;
        nb_quantizer *q = nbt_quantizer(ctx, "ste", f, k == 1);
        nb_tensor *x = randn(NB_F32, 2, sh, 1.0f, 0), *g = randn(NB_F32, 2, sh, 1.0f, 0), *gi = NULL, *x2 = NULL;
        CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, x, NB_CALIB_MAX));
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &gi));
        CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh, &x2));
        const float *xv = nb_tensor_data(x), *gv = nb_tensor_data(g);
        float *x2v = nb_tensor_data(x2);
        for (int i = 0; i < 256; i++) x2v[i] = xv[i] * (i % 3 == 0 ? 3.0f : 0.5f);   /* some beyond amax */
        /* default: pass-through (ModelOpt >= 0.43) */
        CHECK_OK(ctx, nb_quantizer_backward(ctx, q, x2, g, gi));
        CHECK(same_tensor_bytes(g, gi));
        /* clipped STE: zero where |x| > amax (per tensor / per block / per row); MX always passes */
        nb_quantizer_config c;
        nb_quantizer_get_config(q, &c);
        nb_quantizer *q2 = NULL;
        c.pass_through_bwd = 0;
        CHECK_OK(ctx, nb_quantizer_new(ctx, "ste clipped", &c, &q2));
        for (int a = 0; a < 3; a++) {
            const char *nm = nb_quantizer_state_name(a);
            if (!nb_quantizer_has_state(q, nm)) continue;
            nb_tensor *st = NULL;
            CHECK_OK(ctx, nb_quantizer_get_state(ctx, q, nm, &st));
            CHECK_OK(ctx, nb_quantizer_set_state(ctx, q2, nm, st));
            nb_tensor_release(st);
        }
        CHECK_OK(ctx, nb_quantizer_backward(ctx, q2, x2, g, gi));
        const float *giv = nb_tensor_data(gi);
        int ok = 1, zeroed = 0;
        float amax = 0;
        if (k == 0) CHECK_OK(ctx, nb_quantizer_global_amax(ctx, q2, &amax));
        nb_tensor *ba = NULL;
        if (k == 1 || k == 2) CHECK_OK(ctx, nb_quantizer_get_state(ctx, q2, k == 1 ? "block_amax" : "amax", &ba));
        for (int i = 0; i < 256; i++) {
            float bnd = k == 0 ? amax : k == 1 ? ((float *)nb_tensor_data(ba))[i / 16] : k == 2 ? ((float *)nb_tensor_data(ba))[i / 64] : INFINITY;
            float want = fabsf(x2v[i]) <= bnd ? gv[i] : 0.0f;
            if (giv[i] != want) ok = 0;
            zeroed += giv[i] == 0.0f && gv[i] != 0.0f;
        }
        CHECK_MSG(ok, "clipped STE gradient wrong for case %d", k);
        CHECK_MSG(k == 3 ? zeroed == 0 : zeroed > 0, "case %d: %d gradients zeroed", k, zeroed);
        nb_tensor_release(ba);
        nb_quantizer_release(q2);
        nb_quantizer_release(q);
        nb_tensor_release(x);
        nb_tensor_release(x2);
        nb_tensor_release(g);
        nb_tensor_release(gi);
    }
}

/* ---- calibrators ---------------------------------------------------------------------------------- */

static void calibrators(void) {
    int64_t sh[2] = {8, 64}, sh3[2] = {24, 64};
    nb_tensor *b[3], *all = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh3, &all));
    for (int i = 0; i < 3; i++) {
        b[i] = randn(NB_F32, 2, sh, 1.0f + (float)i, 1);
        memcpy((float *)nb_tensor_data(all) + i * 8 * 64, nb_tensor_data(b[i]), 8 * 64 * 4);
    }
    /* per-tensor max over batches == max of the concatenation */
    nb_quantizer *q = nbt_quantizer(ctx, "act", NB_FMT_NVFP4, 0), *q2 = nbt_quantizer(ctx, "act all", NB_FMT_NVFP4, 0);
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    nb_calib *c = NULL;
    CHECK_OK(ctx, nb_calib_new(ctx, q, &cc, &c));
    CHECK_FAIL(ctx, nb_calib_finish(ctx, c), NB_ERR_INVALID, "no batch was collected");
    for (int i = 0; i < 3; i++) CHECK_OK(ctx, nb_calib_collect(ctx, c, b[i]));
    CHECK_EQ_INT(nb_calib_batches(c), 3);
    CHECK_OK(ctx, nb_calib_finish(ctx, c));
    nb_calib_free(c);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q2, all, NB_CALIB_MAX));
    float a1 = 0, a2 = 0;
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, q, &a1));
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, q2, &a2));
    CHECK(a1 == a2 && a1 > 0);
    /* the W4A4 input scale is amax / 2688 */
    float s = 0;
    CHECK_OK(ctx, nb_quantizer_scale(ctx, q, &s));
    CHECK(s == a1 / 2688.0f);
    nb_quantizer_release(q);
    nb_quantizer_release(q2);

    /* a per-block observer needs the same shape every batch */
    q = nbt_quantizer(ctx, "w", NB_FMT_NVFP4, 1);
    CHECK_OK(ctx, nb_calib_new(ctx, q, &cc, &c));
    CHECK_OK(ctx, nb_calib_collect(ctx, c, b[0]));
    CHECK_OK(ctx, nb_calib_collect(ctx, c, b[1]));
    CHECK_FAIL(ctx, nb_calib_collect(ctx, c, all), NB_ERR_SHAPE, "calibrator for 'w': this batch has 96 per-block amax values, earlier batches 32");
    CHECK_OK(ctx, nb_calib_finish(ctx, c));
    nb_calib_free(c);
    nb_tensor *ba = NULL;
    CHECK_OK(ctx, nb_quantizer_get_state(ctx, q, "block_amax", &ba));
    CHECK_EQ_INT(ba->ndim, 2);
    CHECK_EQ_INT(ba->shape[0], 8);
    CHECK_EQ_INT(ba->shape[1], 4);
    int ok = 1;
    for (int i = 0; i < 32; i++) {
        float m = 0;
        for (int j = 0; j < 16; j++) {
            m = fmaxf(m, fabsf(((float *)nb_tensor_data(b[0]))[i * 16 + j]));
            m = fmaxf(m, fabsf(((float *)nb_tensor_data(b[1]))[i * 16 + j]));
        }
        if (((float *)nb_tensor_data(ba))[i] != m) ok = 0;
    }
    CHECK_MSG(ok, "per-block max over two batches");
    nb_tensor_release(ba);
    nb_quantizer_release(q);

    /* MSE: the choice is the argmin of the summed squared error over the candidates, first index on
     * ties (export metric, recomputed here with nb_fake_quant) */
    q = nbt_quantizer(ctx, "fp8 w", NB_FMT_FP8_TENSOR, 0);
    nb_calib_config_init(&cc, NB_CALIB_MSE);
    cc.metric = NB_MSE_EXPORT;
    CHECK_OK(ctx, nb_calib_new(ctx, q, &cc, &c));
    CHECK_OK(ctx, nb_calib_collect(ctx, c, all));
    CHECK_OK(ctx, nb_calib_finish(ctx, c));
    int64_t nch = 0;
    const int32_t *ch = nb_calib_choice(c, &nch);
    CHECK_EQ_INT(nch, 1);
    int64_t steps = nb_mse_steps(0.25, 4.0, 0.1);
    CHECK_EQ_INT(steps, 39);
    float init = 0;
    for (int64_t i = 0; i < 24 * 64; i++) init = fmaxf(init, fabsf(((float *)nb_tensor_data(all))[i]));
    double best = INFINITY;
    int64_t arg = -1;
    nb_tensor *y = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh3, &y));
    for (int64_t k = 0; k < steps; k++) {
        nb_qparams p;
        nb_qparams_init(&p, NB_FMT_FP8_TENSOR);
        p.amax = init * nb_linspace_f32(0.25, 4.0, steps, k);
        CHECK_OK(ctx, nb_fake_quant(ctx, all, &p, y));
        double sse = 0;
        for (int64_t i = 0; i < 24 * 64; i++) {
            float e = ((float *)nb_tensor_data(all))[i] - ((float *)nb_tensor_data(y))[i];
            float e2 = e * e;
            sse += e2;
        }
        if (sse < best) { best = sse; arg = k; }
    }
    CHECK_EQ_INT(ch ? ch[0] : -2, arg);
    float got = 0;
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, q, &got));
    CHECK(got == init * nb_linspace_f32(0.25, 4.0, steps, arg));
    nb_calib_free(c);
    nb_quantizer_release(q);
    nb_tensor_release(y);

    /* ties: one value v alone; multipliers {1, 2} both quantize it exactly (448 and 224): index 0 */
    float tv[32] = {0};
    tv[3] = 0.75f;
    int64_t s1[2] = {1, 32};
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 2, s1, tv, &t));
    for (int m = 0; m < 2; m++) {
        q = nbt_quantizer(ctx, "tie", NB_FMT_FP8_TENSOR, 0);
        nb_calib_config_init(&cc, NB_CALIB_MSE);
        cc.metric = m ? NB_MSE_EXPORT : NB_MSE_MODELOPT;
        cc.start_multiplier = 1.0;
        cc.stop_multiplier = 2.0;
        cc.step_size = 1.0;
        CHECK_OK(ctx, nb_calib_new(ctx, q, &cc, &c));
        CHECK_OK(ctx, nb_calib_collect(ctx, c, t));
        CHECK_OK(ctx, nb_calib_finish(ctx, c));
        ch = nb_calib_choice(c, &nch);
        CHECK(ch && ch[0] == 0);
        CHECK_OK(ctx, nb_quantizer_global_amax(ctx, q, &got));
        CHECK(got == 0.75f);
        nb_calib_free(c);
        nb_quantizer_release(q);
    }
    nb_tensor_release(t);

    /* four_over_six: needs a static nvfp4_46 quantizer; its choice equals the inline dynamic one */
    q = nbt_quantizer(ctx, "plain", NB_FMT_NVFP4, 1);
    nb_calib_config_init(&cc, NB_CALIB_FOUR_OVER_SIX);
    CHECK_FAIL(ctx, nb_calib_new(ctx, q, &cc, &c), NB_ERR_INVALID, "four_over_six needs a static nvfp4_46 quantizer");
    nb_quantizer_release(q);
    q = nbt_quantizer(ctx, "46", NB_FMT_NVFP4_46, 1);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, all, NB_CALIB_FOUR_OVER_SIX));
    nb_tensor *f1 = NULL, *f2 = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh3, &f1));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, sh3, &f2));
    CHECK_OK(ctx, nb_quantizer_fake(ctx, q, all, f1));
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4_46);   /* dynamic: block amax from the data, G = max |x| */
    CHECK_OK(ctx, nb_fake_quant(ctx, all, &p, f2));
    CHECK_MSG(same_tensor_bytes(f1, f2), "calibrated four_over_six != inline selection");
    /* and it never has a larger error than plain M=6 at 256 (the choice is per block) */
    nb_tensor_release(f1);
    nb_tensor_release(f2);
    nb_quantizer_release(q);
    for (int i = 0; i < 3; i++) nb_tensor_release(b[i]);
    nb_tensor_release(all);
}

/* ---- state, restore, groups -------------------------------------------------------------------------- */

static void state_and_groups(void) {
    int64_t sh[3] = {2, 3, 32};
    nb_tensor *w = randn(NB_BF16, 3, sh, 0.02f, 1);
    nb_quantizer *q = nbt_quantizer(ctx, "model.layers.0.mlp.up_proj.weight_quantizer", NB_FMT_NVFP4_46, 1);
    CHECK_EQ_INT(nb_quantizer_check(ctx, q), NB_ERR_UNCALIBRATED);
    CHECK(strcmp(nb_quantizer_missing(q), "block_amax") == 0);
    nb_qtensor *qt = NULL;
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, q, w, &qt), NB_ERR_UNCALIBRATED,
               "quantizer 'model.layers.0.mlp.up_proj.weight_quantizer' has no calibrated block_amax");
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, q, w, NB_CALIB_FOUR_OVER_SIX));
    CHECK(nb_quantizer_missing(q) == NULL);
    nb_tensor *ba = NULL, *ga = NULL;
    CHECK_OK(ctx, nb_quantizer_get_state(ctx, q, "block_amax", &ba));
    CHECK_OK(ctx, nb_quantizer_get_state(ctx, q, "global_amax", &ga));
    CHECK_EQ_INT(ba->ndim, 3);
    CHECK_EQ_INT(ba->shape[2], 2);
    nb_tensor *none = NULL;
    CHECK_FAIL(ctx, nb_quantizer_get_state(ctx, q, "amax", &none), NB_ERR_UNCALIBRATED, "has no calibrated amax");
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, q, w, &qt));
    /* restore into a fresh quantizer: the same bytes */
    nb_quantizer *r = nbt_quantizer(ctx, "restored", NB_FMT_NVFP4_46, 1);
    CHECK_OK(ctx, nb_quantizer_set_state(ctx, r, "block_amax", ba));
    CHECK_FAIL(ctx, nb_quantizer_check(ctx, r), NB_ERR_UNCALIBRATED, "quantizer 'restored' has no calibrated global_amax");
    CHECK_OK(ctx, nb_quantizer_set_state(ctx, r, "global_amax", ga));
    nb_qtensor *qr = NULL;
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, r, w, &qr));
    CHECK(qr && same_qtensor(qt, qr));
    /* bad state */
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, r, "amax", ga), NB_ERR_INVALID, "has no 'amax' state");
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, r, "scale", ga), NB_ERR_NOT_FOUND, "no state attribute 'scale'");
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, r, "global_amax", ba), NB_ERR_SHAPE, "global_amax is one value");
    float neg = -1.0f;
    nb_tensor *nt = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 0, NULL, &neg, &nt));
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, r, "global_amax", nt), NB_ERR_NUMERIC, "global_amax[0] = -1 is not a finite amax >= 0");
    int64_t wrong[1] = {5};
    nb_tensor *wb = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, wrong, &wb));
    CHECK_FAIL(ctx, nb_quantizer_set_state(ctx, r, "block_amax", wb), NB_ERR_SHAPE,
               "block_amax {5} does not match the block_amax {2, 3, 2} it has");
    CHECK_OK(ctx, nb_quantizer_clear_state(ctx, r, "block_amax"));
    CHECK_OK(ctx, nb_quantizer_set_state(ctx, r, "block_amax", wb));
    nb_qtensor *qbad = NULL;
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, r, w, &qbad), NB_ERR_SHAPE, "block_amax has 5 values, the tensor needs 12");
    CHECK_OK(ctx, nb_quantizer_clear_state(ctx, r, NULL));
    CHECK(strcmp(nb_quantizer_missing(r), "block_amax") == 0);
    /* a disabled quantizer needs nothing, fakes the identity and refuses to export */
    nb_quantizer_set_enabled(r, 0);
    CHECK(nb_quantizer_missing(r) == NULL);
    nb_tensor *id = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 3, sh, &id));
    CHECK_OK(ctx, nb_quantizer_fake(ctx, r, w, id));
    CHECK(same_tensor_bytes(w, id));
    nb_qtensor *qd = NULL;
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, r, w, &qd), NB_ERR_INVALID, "quantizer 'restored' is disabled");
    nb_tensor_release(id);
    nb_tensor_release(nt);
    nb_tensor_release(wb);
    nb_qtensor_release(qt);
    nb_qtensor_release(qr);
    nb_tensor_release(ba);
    nb_tensor_release(ga);
    nb_quantizer_release(q);
    nb_quantizer_release(r);

    /* groups: the members read the maximum; a group lives while a member does */
    int64_t s2[2] = {4, 64};
    nb_tensor *wg = randn(NB_BF16, 2, s2, 0.01f, 0), *wu = randn(NB_BF16, 2, s2, 0.05f, 0);
    nb_quantizer *gate = nbt_quantizer(ctx, "gate_proj.weight_quantizer", NB_FMT_NVFP4, 0), *up = nbt_quantizer(ctx, "up_proj.weight_quantizer", NB_FMT_NVFP4, 0);
    nb_qgroup *g = NULL;
    CHECK_OK(ctx, nb_qgroup_new(ctx, "mlp.gate_up", &g));
    CHECK_OK(ctx, nb_qgroup_add(ctx, g, gate));
    CHECK_OK(ctx, nb_qgroup_add(ctx, g, up));
    nb_quantizer *st = nbt_quantizer(ctx, "static", NB_FMT_NVFP4, 1), *mx = nbt_quantizer(ctx, "mx", NB_FMT_MXFP8, 0);
    CHECK_FAIL(ctx, nb_qgroup_add(ctx, g, st), NB_ERR_INVALID, "cannot join group 'mlp.gate_up' of nvfp4 quantizers");
    CHECK_FAIL(ctx, nb_qgroup_add(ctx, g, mx), NB_ERR_INVALID, "mxfp8 has no per-tensor amax to share");
    nb_qgroup_release(g);
    CHECK_EQ_INT(nb_qgroup_size(nb_quantizer_group(gate)), 2);
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, gate, wg, NB_CALIB_MAX));
    CHECK_FAIL(ctx, nb_quantizer_check(ctx, gate), NB_ERR_UNCALIBRATED,
               "quantizer 'gate_proj.weight_quantizer' has no calibrated amax: its shared group 'mlp.gate_up' member "
               "'up_proj.weight_quantizer' is uncalibrated");
    CHECK_OK(ctx, nb_quantizer_calibrate(ctx, up, wu, NB_CALIB_MAX));
    float ag = 0, au = 0, sg = 0, su = 0;
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, gate, &ag));
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, up, &au));
    CHECK(ag == au);
    CHECK(ag == absmax_of(wu) || ag == absmax_of(wg));
    CHECK_OK(ctx, nb_quantizer_scale(ctx, gate, &sg));
    CHECK_OK(ctx, nb_quantizer_scale(ctx, up, &su));
    CHECK(sg == su);
    nb_qtensor *qg = NULL;
    CHECK_OK(ctx, nb_quantizer_quantize(ctx, gate, wg, &qg));
    CHECK(qg && *(float *)nb_tensor_data(qg->scale2) == su);
    nb_qtensor_release(qg);
    /* leaving the group: back to its own amax */
    g = nb_quantizer_group(gate);
    CHECK_OK(ctx, nb_qgroup_remove(ctx, g, gate));
    CHECK(nb_quantizer_group(gate) == NULL);
    CHECK_OK(ctx, nb_quantizer_global_amax(ctx, gate, &ag));
    CHECK(ag == absmax_of(wg));
    nb_quantizer_release(up);   /* the last member: the group goes with it */
    nb_quantizer_release(gate);
    nb_quantizer_release(st);
    nb_quantizer_release(mx);
    nb_tensor_release(wg);
    nb_tensor_release(wu);
    nb_tensor_release(w);
}

/* ---- errors ----------------------------------------------------------------------------------------- */

static void errors(void) {
    int64_t sh[2] = {4, 172};
    nb_tensor *x = randn(NB_BF16, 2, sh, 1.0f, 0);
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.name = "model.layers.0.mlp.down_proj.weight";
    nb_qtensor *q = NULL;
    CHECK_FAIL(ctx, nb_quantize(ctx, x, &p, &q), NB_ERR_SHAPE,
               "model.layers.0.mlp.down_proj.weight: last dimension (dim 1) is 172, not divisible by the nvfp4 block size 16");
    nb_qparams_init(&p, NB_FMT_MXFP8);
    int64_t s48[2] = {2, 48};
    nb_tensor *x48 = randn(NB_F32, 2, s48, 1.0f, 0);
    CHECK_FAIL(ctx, nb_quantize(ctx, x48, &p, &q), NB_ERR_SHAPE, "is 48, not divisible by the mxfp8 block size 32");
    /* FP8 has no block: any last dim */
    nb_qparams_init(&p, NB_FMT_FP8_TENSOR);
    CHECK_OK(ctx, nb_quantize(ctx, x, &p, &q));
    nb_qtensor_release(q);
    q = NULL;
    /* NaN / Inf: named, with the flat index and the element */
    int64_t s2[2] = {3, 32};
    nb_tensor *xn = randn(NB_BF16, 2, s2, 1.0f, 0);
    nb_store_elem(nb_tensor_data(xn), NB_BF16, 1 * 32 + 3, NAN);
    nb_qparams_init(&p, NB_FMT_NVFP4);
    p.name = "q_proj.weight";
    CHECK_FAIL(ctx, nb_quantize(ctx, xn, &p, &q), NB_ERR_NUMERIC, "q_proj.weight: NaN at flat index 35 (element [1, 3])");
    nb_store_elem(nb_tensor_data(xn), NB_BF16, 35, 1.0);
    nb_store_elem(nb_tensor_data(xn), NB_BF16, 2 * 32 + 31, -INFINITY);
    CHECK_FAIL(ctx, nb_quantize(ctx, xn, &p, &q), NB_ERR_NUMERIC, "q_proj.weight: -Inf at flat index 95 (element [2, 31])");
    nb_quantizer *qz = nbt_quantizer(ctx, "k_proj.weight_quantizer", NB_FMT_FP8_TENSOR, 0);
    CHECK_FAIL(ctx, nb_quantizer_calibrate(ctx, qz, xn, NB_CALIB_MAX), NB_ERR_NUMERIC,
               "k_proj.weight_quantizer: -Inf at flat index 95");
    CHECK_FAIL(ctx, nb_quantizer_quantize(ctx, qz, x48, &q), NB_ERR_UNCALIBRATED, "quantizer 'k_proj.weight_quantizer' has no calibrated amax");
    nb_tensor *y = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, s48, &y));
    CHECK_FAIL(ctx, nb_quantizer_fake(ctx, qz, x48, y), NB_ERR_UNCALIBRATED, "has no calibrated amax");
    nb_quantizer_release(qz);
    /* an all-zero tensor: amax 0 becomes the maxbound (ModelOpt's sanitize), so the scale is positive
     * and the codes are 0 (tests/c/test_quant_edge.c holds the bytes to ModelOpt's) */
    nb_tensor *z = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, s2, &z));
    nb_qparams_init(&p, NB_FMT_NVFP4);
    CHECK_OK(ctx, nb_quantize(ctx, z, &p, &q));
    CHECK(q && *(const float *)nb_tensor_data(q->scale2) == 6.0f / 2688.0f);
    nb_qtensor_release(q);
    nb_qparams_init(&p, NB_FMT_FP8_CHANNEL);
    CHECK_OK(ctx, nb_quantize(ctx, z, &p, &q));
    CHECK(q && ((const float *)nb_tensor_data(q->scale))[0] == 1.0f);
    nb_qtensor_release(q);
    /* but MXFP8 quantizes zeros (scale byte 0) */
    nb_qparams_init(&p, NB_FMT_MXFP8);
    CHECK_OK(ctx, nb_quantize(ctx, z, &p, &q));
    CHECK(q && ((uint8_t *)nb_tensor_data(q->scale))[0] == 0);
    nb_qtensor_release(q);
    /* wrong dtype, wrong output */
    nb_tensor *xi = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_I32, 2, s2, &xi));
    CHECK_FAIL(ctx, nb_quantize(ctx, xi, &p, &q), NB_ERR_UNSUPPORTED, "i32 input");
    nb_tensor *wrong = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 2, s48, &wrong));
    CHECK_FAIL(ctx, nb_fake_quant(ctx, z, &p, wrong), NB_ERR_SHAPE, "output dim");
    /* a non-contiguous view quantizes like its contiguous copy */
    int64_t s64[2] = {64, 64};
    nb_tensor *sq = randn(NB_BF16, 2, s64, 1.0f, 0), *tr_view = NULL, *tr_copy = NULL;
    CHECK_OK(ctx, nb_tensor_transpose(ctx, sq, 0, 1, &tr_view));
    CHECK_OK(ctx, nb_tensor_contiguous(ctx, tr_view, &tr_copy));
    nb_qtensor *qa = NULL, *qb = NULL;
    nb_qparams_init(&p, NB_FMT_NVFP4);
    CHECK_OK(ctx, nb_quantize(ctx, tr_view, &p, &qa));
    CHECK_OK(ctx, nb_quantize(ctx, tr_copy, &p, &qb));
    CHECK(qa && qb && same_qtensor(qa, qb));
    nb_qtensor_release(qa);
    nb_qtensor_release(qb);
    nb_tensor_release(sq);
    nb_tensor_release(tr_view);
    nb_tensor_release(tr_copy);
    nb_qformat_traits const *tr = nb_qformat_info(NB_FMT_COUNT);
    CHECK(tr == NULL);
    CHECK_EQ_INT(nb_qformat_from_name("four_over_six"), NB_FMT_NVFP4_46);
    CHECK_EQ_INT(nb_qformat_from_name("fp8_channel"), NB_FMT_FP8_CHANNEL);
    CHECK_EQ_INT(nb_qformat_from_name("int4"), -1);
    nb_tensor_release(x);
    nb_tensor_release(x48);
    nb_tensor_release(xn);
    nb_tensor_release(y);
    nb_tensor_release(z);
    nb_tensor_release(xi);
    nb_tensor_release(wrong);
}

/* ---- threads and row dispatch ---------------------------------------------------------------------- */

static int calls;
static void counting_quantize(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    nb_mxfp8_quantize_row_ref(x, n, a, q, s);
}

static void threads_and_dispatch(void) {
    int64_t sh[2] = {96, 1024};
    nb_tensor *x = randn(NB_BF16, 2, sh, 0.03f, 1);
    nb_ctx *c1 = NULL, *c4 = NULL;
    CHECK_OK(ctx, nb_ctx_new(1, &c1));
    CHECK_OK(ctx, nb_ctx_new(4, &c4));
    const nb_qformat fs[4] = {NB_FMT_NVFP4, NB_FMT_NVFP4_46, NB_FMT_MXFP8, NB_FMT_FP8_CHANNEL};
    for (int i = 0; i < 4; i++) {
        nb_quantizer *a = nbt_quantizer(ctx, "t1", fs[i], fs[i] == NB_FMT_NVFP4_46), *b = nbt_quantizer(ctx, "t4", fs[i], fs[i] == NB_FMT_NVFP4_46);
        nb_calib_method m = fs[i] == NB_FMT_NVFP4_46 ? NB_CALIB_FOUR_OVER_SIX : fs[i] == NB_FMT_MXFP8 ? NB_CALIB_MAX : NB_CALIB_MSE;
        CHECK_OK(c1, nb_quantizer_calibrate(c1, a, x, m));
        CHECK_OK(c4, nb_quantizer_calibrate(c4, b, x, m));
        nb_qtensor *qa = NULL, *qb = NULL;
        CHECK_OK(c1, nb_quantizer_quantize(c1, a, x, &qa));
        CHECK_OK(c4, nb_quantizer_quantize(c4, b, x, &qb));
        CHECK_MSG(qa && qb && same_qtensor(qa, qb), "format %d: 1 thread and 4 threads differ", (int)fs[i]);
        nb_qtensor_release(qa);
        nb_qtensor_release(qb);
        nb_quantizer_release(a);
        nb_quantizer_release(b);
    }
    /* the drivers call the context's row function: a swapped one is used, NULL restores */
    nb_qparams p;
    nb_qparams_init(&p, NB_FMT_MXFP8);
    nb_qtensor *q1 = NULL, *q2 = NULL;
    CHECK_OK(c4, nb_qformat_set_rows(c4, NB_FMT_MXFP8, counting_quantize, NULL, NULL));
    CHECK(nb_qformat_rows(c4, NB_FMT_MXFP8)->quantize == counting_quantize);
    CHECK_OK(c4, nb_quantize(c4, x, &p, &q1));
    CHECK_EQ_INT(calls, 96);
    CHECK_OK(c4, nb_qformat_set_rows(c4, NB_FMT_MXFP8, NULL, NULL, NULL));
    CHECK(nb_qformat_rows(c4, NB_FMT_MXFP8)->quantize == nb_mxfp8_quantize_row_ref);
    CHECK_OK(c4, nb_quantize(c4, x, &p, &q2));
    CHECK_EQ_INT(calls, 96);
    CHECK(q1 && q2 && same_qtensor(q1, q2));
    CHECK_FAIL(ctx, nb_qformat_set_rows(ctx, NB_FMT_NONE, NULL, NULL, NULL), NB_ERR_INVALID, "no row functions");
    nb_qtensor_release(q1);
    nb_qtensor_release(q2);
    nb_ctx_release(c1);
    nb_ctx_release(c4);
    nb_tensor_release(x);
}

int main(void) {
    CHECK_OK(ctx, nb_ctx_new(3, &ctx));
    nb_rng_seed(&rng, 20240605);
    /* hold the scalar references to these properties whatever fast path the library installed */
    for (int f = 1; f < NB_FMT_COUNT; f++) CHECK_OK(ctx, nb_qformat_set_rows(ctx, (nb_qformat)f, NULL, NULL, NULL));
    fake_equals_dequant_and_bounds();
    packing_round_trip();
    ste();
    calibrators();
    state_and_groups();
    errors();
    threads_and_dispatch();
    nb_ctx_release(ctx);
    return nbt_done("test_quant_props");
}

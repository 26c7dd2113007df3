/* Exact dtype conversions: FORMATS.md §10 TV7 spot values, exhaustive round trips of every
 * BF16/F16 bit pattern and every E4M3/E5M2/E8M0/E2M1 code, and brute-force RNE cross-checks. */
#include "nbtest.h"
#include <stdint.h>

/* Independent reference: nearest representable value by search, ties to the even code. */
static uint8_t brute_e4m3(float x) {
    if (isnan(x)) return 0x7F;
    double a = fabs((double)x);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7E; c++) {
        double d = fabs((double)nb_e4m3_to_f32((uint8_t)c) - a);
        if (d < bd || (d == bd && (c & 1) == 0)) { bd = d; best = c; }
    }
    if (a > 464.0) best = 0x7F;     /* PyTorch's raw cast: past the midpoint to 512 -> NaN */
    return (uint8_t)(best | (signbit(x) ? 0x80 : 0));
}

static uint16_t brute_bf16(float x) {
    uint32_t u = nbt_f2u(x);
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    /* the step past the largest finite bf16 is 2^128 (IEEE overflow rounds to inf) */
    double vh = ((hi & 0x7F800000u) == 0x7F800000u) ? copysign(ldexp(1, 128), x) : (double)nbt_u2f(hi);
    double dl = fabs((double)nbt_u2f(lo) - x), dh = fabs(vh - x);
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (uint16_t)((((lo >> 16) & 1) ? hi : lo) >> 16);
}

static void test_tv7(void) {
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(448.0f), 0x7E);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(464.0f), 0x7E);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(464.0001f), 0x7F);
    CHECK_EQ_INT(nb_f32_to_e4m3(464.0001f), 0x7E);       /* saturating encode clamps first */
    CHECK_EQ_INT(nb_f32_to_e4m3(1e9f), 0x7E);
    CHECK_EQ_INT(nb_f32_to_e4m3(-1e9f), 0xFE);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(1.0f), 0x38);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(0.5f), 0x30);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(240.0f), 0x77);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(ldexpf(1, -9)), 0x01);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(ldexpf(1, -10)), 0x00);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(1.5f * ldexpf(1, -10)), 0x01);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(ldexpf(1, -6)), 0x08);
    CHECK_EQ_INT(nb_f32_to_e4m3_raw(-0.0f), 0x80);
    CHECK_EQ_INT(nb_f32_to_bf16(1.00390625f), 0x3F80);
    CHECK_EQ_INT(nb_f32_to_bf16(1.01171875f), 0x3F82);
    CHECK_EQ_INT(nb_f32_to_bf16(NAN), 0x7FC0);
    CHECK_EQ_INT(nb_f32_to_bf16(-NAN), 0x7FC0);
    CHECK_EQ_INT(nb_f32_to_bf16(INFINITY), 0x7F80);
    /* TV6 building blocks: bf16 of the FP8 per-tensor scale 3/448 */
    CHECK_EQ_INT(nbt_f2u(3.0f / 448.0f), 0x3BDB6DB7);
    CHECK_EQ_INT(nb_f32_to_bf16(3.0f / 448.0f), 0x3BDB);
    /* F16 spot values */
    CHECK_EQ_INT(nb_f32_to_f16(1.0f), 0x3C00);
    CHECK_EQ_INT(nb_f32_to_f16(65504.0f), 0x7BFF);
    CHECK_EQ_INT(nb_f32_to_f16(65520.0f), 0x7C00);     /* rounds to inf */
    CHECK_EQ_INT(nb_f32_to_f16(ldexpf(1, -24)), 0x0001);
    CHECK_EQ_INT(nb_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie to even */
    CHECK_EQ_INT(nb_f32_to_f16(-2.0f), 0xC000);
    /* E5M2 */
    CHECK_EQ_INT(nb_f32_to_e5m2_raw(57344.0f), 0x7B);
    CHECK_EQ_INT(nb_f32_to_e5m2_raw(1e6f), 0x7C);
    CHECK_EQ_INT(nb_f32_to_e5m2(1e6f), 0x7B);
    CHECK_EQ_INT(nb_f32_to_e5m2_raw(1.0f), 0x3C);
    /* E8M0 (PyTorch float8_e8m0fnu): exponent with RNE on the mantissa */
    CHECK_EQ_INT(nb_f32_to_e8m0(1.0f), 127);
    CHECK_EQ_INT(nb_f32_to_e8m0(1.4f), 127);
    CHECK_EQ_INT(nb_f32_to_e8m0(1.5f), 128);   /* guard set, round & sticky clear, lsb (normal) 1 -> up */
    CHECK_EQ_INT(nb_f32_to_e8m0(0.25f), 125);
    CHECK_EQ_INT(nb_f32_to_e8m0(INFINITY), 0xFF);
    CHECK_EQ_INT(nb_f32_to_e8m0(0.0f), 0x00);
    CHECK(isnan(nb_e8m0_to_f32(0xFF)));
    CHECK(nb_e8m0_to_f32(0) == ldexpf(1, -127));
    /* E2M1 ModelOpt rounding (FORMATS §1.2): ties to even, saturation, -0 code for small negatives */
    const float in[] = {0, .25f, .75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 6, -.25f, -.75f, -1.75f, -3.5f, -5, 0.30078125f, -6, 100, -0.0f};
    const int want[] = {0, 0, 2, 2, 4, 4, 6, 6, 7, 8, 0xA, 0xC, 0xE, 0xE, 1, 0xF, 7, 0};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) CHECK_EQ_INT(nb_f32_to_e2m1(in[i]), want[i]);
}

static void test_exhaustive(void) {
    int bad_bf16 = 0, bad_f16 = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = nb_bf16_to_f32((uint16_t)h);
        uint16_t back = nb_f32_to_bf16(f);
        if (isnan(f) ? back != 0x7FC0 : back != h) bad_bf16++;
        float g = nb_f16_to_f32((uint16_t)h);
        uint16_t back16 = nb_f32_to_f16(g);
        if (isnan(g) ? (back16 & 0x7FFF) != 0x7E00 || (back16 & 0x8000) != (h & 0x8000) : back16 != h) bad_f16++;
        /* F16 decode must be exact: compare with ldexp arithmetic */
        int e = (h >> 10) & 31, m = h & 1023;
        if (e != 31) {
            double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m, -24);
            if (h & 0x8000) v = -v;
            if ((double)g != v) bad_f16++;
        }
    }
    CHECK_EQ_INT(bad_bf16, 0);
    CHECK_EQ_INT(bad_f16, 0);
    int bad8 = 0;
    for (int c = 0; c < 256; c++) {
        float f = nb_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) { if (!isnan(f)) bad8++; if (nb_f32_to_e4m3_raw(f) != c) bad8++; continue; }
        if (nb_f32_to_e4m3_raw(f) != c || nb_f32_to_e4m3(f) != c) bad8++;
        float g = nb_e5m2_to_f32((uint8_t)c);
        int expect5 = ((c & 0x7F) > 0x7C) ? (0x7F | (c & 0x80)) : c;
        if (nb_f32_to_e5m2_raw(g) != expect5) bad8++;
    }
    CHECK_EQ_INT(bad8, 0);
    for (int c = 0; c < 128; c++) {     /* e5m2 codes 128..255 were covered above with c & 0x80 */
        float g = nb_e5m2_to_f32((uint8_t)(c | 0x80));
        int expect5 = (c > 0x7C) ? 0xFF : (c | 0x80);
        CHECK_EQ_INT(nb_f32_to_e5m2_raw(g), expect5);
    }
    int bad_e8 = 0;
    for (int c = 0; c < 255; c++)
        if (nb_f32_to_e8m0(nb_e8m0_to_f32((uint8_t)c)) != c) bad_e8++;
    CHECK_EQ_INT(bad_e8, 0);
    CHECK_EQ_INT(nb_f32_to_e8m0(nb_e8m0_to_f32(0xFF)), 0xFF);
    for (int c = 0; c < 16; c++) {
        int want = (c == 8) ? 0 : c;   /* -0 decodes to -0.0, which ModelOpt encodes as +0 (x < 0 is false) */
        CHECK_EQ_INT(nb_f32_to_e2m1(nb_e2m1_to_f32((uint8_t)c)), want);
    }
}

static void test_brute_force(void) {
    nb_rng r;
    nb_rng_seed(&r, 42);
    int bad = 0, bad_bf = 0;
    for (int i = 0; i < 200000; i++) {
        /* random float with exponent spread over the e4m3 range and beyond */
        float x = (float)ldexp(nb_rng_uniform(&r) * 2 - 1, (int)(nb_rng_next(&r) % 30) - 14);
        if (nb_f32_to_e4m3_raw(x) != brute_e4m3(x)) bad++;
        uint32_t u = (uint32_t)nb_rng_next(&r);
        float y = nbt_u2f(u);
        if (!isnan(y) && !isinf(y) && nb_f32_to_bf16(y) != brute_bf16(y)) bad_bf++;
    }
    /* exact midpoints between neighbouring e4m3 values: ties must go to the even code */
    for (int c = 0; c < 0x7E; c++) {
        float mid = (nb_e4m3_to_f32((uint8_t)c) + nb_e4m3_to_f32((uint8_t)(c + 1))) / 2;
        if (nb_f32_to_e4m3_raw(mid) != brute_e4m3(mid)) bad++;
        if (nb_f32_to_e4m3_raw(mid) & 1) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_bf, 0);
}

static void test_convert(void) {
    const float src[8] = {0, 0.5f, -1, 1.5f, 6, -6, 0.25f, 3};
    uint8_t packed[4];
    CHECK_EQ_INT(nb_convert(packed, NB_E2M1, src, NB_F32, 8), NB_OK);
    CHECK_EQ_INT(packed[0], 0x10);   /* even element low nibble: 0 -> 0, 0.5 -> 1 */
    CHECK_EQ_INT(packed[1], 0x3A);
    CHECK_EQ_INT(packed[2], 0xF7);
    CHECK_EQ_INT(packed[3], 0x50);   /* 0.25 -> 0 (tie to even), 3 -> 5 */
    float back[8];
    CHECK_EQ_INT(nb_convert(back, NB_F32, packed, NB_E2M1, 8), NB_OK);
    CHECK(back[4] == 6 && back[5] == -6 && back[6] == 0 && back[7] == 3);
    CHECK_EQ_INT(nb_convert(packed, NB_E2M1, src, NB_F32, 7), NB_ERR_SHAPE);
    uint16_t bf[8];
    CHECK_EQ_INT(nb_convert(bf, NB_BF16, src, NB_F32, 8), NB_OK);
    CHECK_EQ_INT(bf[2], 0xBF80);
    CHECK_EQ_INT(nb_dtype_from_st_name("F8_E4M3"), NB_E4M3);
    CHECK_EQ_INT(nb_dtype_from_st_name("F8_E8M0"), NB_E8M0);
    CHECK_EQ_INT(nb_dtype_from_st_name("BF16"), NB_BF16);
    CHECK_EQ_INT(nb_dtype_from_st_name("U8"), NB_U8);
    CHECK_EQ_INT(nb_dtype_from_st_name("F6_E2M3"), -1);
    CHECK_EQ_INT(nb_dtype_nbytes(NB_E2M1, 10), 5);
    CHECK(strcmp(nb_dtype_info(NB_E4M3)->st_name, "F8_E4M3") == 0);
}

int main(void) {
    test_tv7();
    test_exhaustive();
    test_brute_force();
    test_convert();
    return nbt_done("test_dtype");
}

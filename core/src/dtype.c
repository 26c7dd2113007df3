/* The dtype traits table and exact scalar conversions (FORMATS.md §6, PyTorch c10 semantics).
 * These are the scalar references every vectorized or CUDA conversion is tested against. */
#include <math.h>
#include <string.h>

#include "nibble/dtype.h"

static const nb_dtype_traits TRAITS[NB_DTYPE_COUNT] = {
    [NB_F32]  = {"f32",  "F32",     32, 1, 1},
    [NB_F16]  = {"f16",  "F16",     16, 1, 1},
    [NB_BF16] = {"bf16", "BF16",    16, 1, 1},
    [NB_F64]  = {"f64",  "F64",     64, 1, 1},
    [NB_E4M3] = {"e4m3", "F8_E4M3",  8, 1, 1},
    [NB_E5M2] = {"e5m2", "F8_E5M2",  8, 1, 1},
    [NB_E8M0] = {"e8m0", "F8_E8M0",  8, 1, 0},
    [NB_E2M1] = {"e2m1", "F4",       4, 1, 1},
    [NB_U8]   = {"u8",   "U8",       8, 0, 0},
    [NB_I8]   = {"i8",   "I8",       8, 0, 1},
    [NB_I16]  = {"i16",  "I16",     16, 0, 1},
    [NB_U16]  = {"u16",  "U16",     16, 0, 0},
    [NB_I32]  = {"i32",  "I32",     32, 0, 1},
    [NB_U32]  = {"u32",  "U32",     32, 0, 0},
    [NB_I64]  = {"i64",  "I64",     64, 0, 1},
    [NB_U64]  = {"u64",  "U64",     64, 0, 0},
    [NB_BOOL] = {"bool", "BOOL",     8, 0, 0},
};

const nb_dtype_traits *nb_dtype_info(nb_dtype dt) {
    return ((unsigned)dt < NB_DTYPE_COUNT) ? &TRAITS[dt] : NULL;
}

int nb_dtype_from_name(const char *name) {
    for (int i = 0; i < NB_DTYPE_COUNT; i++)
        if (name && strcmp(TRAITS[i].name, name) == 0) return i;
    return -1;
}

int nb_dtype_from_st_name(const char *st_name) {
    for (int i = 0; i < NB_DTYPE_COUNT; i++)
        if (st_name && strcmp(TRAITS[i].st_name, st_name) == 0) return i;
    return -1;
}

int64_t nb_dtype_nbytes(nb_dtype dt, int64_t n) {
    const nb_dtype_traits *t = nb_dtype_info(dt);
    if (!t) return -1;
    return (n * t->bits + 7) / 8;
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- BF16 / F16 ---------------------------------------------------------------------------- */

uint16_t nb_f32_to_bf16(float x) {
    if (isnan(x)) return 0x7FC0;
    uint32_t u = f2u(x);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float nb_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* c10::detail::fp16_ieee_from_fp32_value: scaling trick that makes the FPU do the RNE. */
uint16_t nb_f32_to_f16(float f) {
    const float scale_to_inf = u2f(UINT32_C(0x77800000));
    const float scale_to_zero = u2f(UINT32_C(0x08800000));
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = f2u(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = u2f((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = f2u(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT32_C(0x7E00) : nonsign));
}

float nb_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- FP8 E4M3FN ---------------------------------------------------------------------------- */

/* c10::detail::fp8e4m3fn_from_fp32_value (RNE, non-saturating: >= 480 -> NaN). */
uint8_t nb_f32_to_e4m3_raw(float f) {
    const uint32_t fp8_max = UINT32_C(1087) << 20;
    const uint32_t denorm_mask = UINT32_C(141) << 23;
    uint32_t f_bits = f2u(f);
    uint8_t result;
    const uint32_t sign = f_bits & UINT32_C(0x80000000);
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = 0x7F;
    } else if (f_bits < (UINT32_C(121) << 23)) {
        f_bits = f2u(u2f(f_bits) + u2f(denorm_mask));
        result = (uint8_t)(f_bits - denorm_mask);
    } else {
        uint32_t mant_odd = (f_bits >> 20) & 1;
        f_bits += ((uint32_t)(7 - 127) << 23) + 0x7FFFF;
        f_bits += mant_odd;
        result = (uint8_t)(f_bits >> 20);
    }
    return (uint8_t)(result | (sign >> 24));
}

uint8_t nb_f32_to_e4m3(float x) {
    if (isnan(x)) return 0x7F;
    if (x > 448.0f) x = 448.0f;
    if (x < -448.0f) x = -448.0f;
    return nb_f32_to_e4m3_raw(x);
}

float nb_e4m3_to_f32(uint8_t b) {
    uint32_t e = (b >> 3) & 0xF, m = b & 7;
    float v;
    if (e == 15 && m == 7) return (b & 0x80) ? -NAN : NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf(1.0f + (float)m / 8.0f, (int)e - 7);
    return (b & 0x80) ? -v : v;
}

/* ---- FP8 E5M2 ------------------------------------------------------------------------------ */

uint8_t nb_f32_to_e5m2_raw(float f) {
    const uint32_t fp32_inf = UINT32_C(255) << 23;
    const uint32_t fp8_max = UINT32_C(143) << 23;
    const uint32_t denorm_mask = UINT32_C(134) << 23;
    uint32_t f_bits = f2u(f);
    uint8_t result;
    const uint32_t sign = f_bits & UINT32_C(0x80000000);
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = f_bits > fp32_inf ? 0x7F : 0x7C;
    } else if (f_bits < (UINT32_C(113) << 23)) {
        f_bits = f2u(u2f(f_bits) + u2f(denorm_mask));
        result = (uint8_t)(f_bits - denorm_mask);
    } else {
        uint32_t mant_odd = (f_bits >> 21) & 1;
        f_bits += ((uint32_t)(15 - 127) << 23) + 0xFFFFF;
        f_bits += mant_odd;
        result = (uint8_t)(f_bits >> 21);
    }
    return (uint8_t)(result | (sign >> 24));
}

uint8_t nb_f32_to_e5m2(float x) {
    if (isnan(x)) return 0x7F;
    if (x > 57344.0f) x = 57344.0f;
    if (x < -57344.0f) x = -57344.0f;
    return nb_f32_to_e5m2_raw(x);
}

float nb_e5m2_to_f32(uint8_t b) {
    uint32_t e = (b >> 2) & 0x1F, m = b & 3;
    float v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, -16);
    else v = ldexpf(1.0f + (float)m / 4.0f, (int)e - 15);
    return (b & 0x80) ? -v : v;
}

/* ---- E8M0 ---------------------------------------------------------------------------------- */

/* c10 Float8_e8m0fnu(float): guard/round/sticky RNE on the exponent, sign ignored. */
uint8_t nb_f32_to_e8m0(float x) {
    uint32_t f_bits = f2u(x);
    uint32_t exponent = (f_bits >> 23) & 0xFF;
    if (exponent == 0xFF) return 0xFF;
    uint32_t g = (f_bits & 0x400000) != 0;
    uint32_t r = (f_bits & 0x200000) != 0;
    uint32_t s = (f_bits & 0x1FFFFF) != 0;
    uint32_t lsb = exponent > 0;
    if (g && (r || s || lsb)) exponent += 1;
    return (uint8_t)exponent;
}

float nb_e8m0_to_f32(uint8_t b) {
    if (b == 0xFF) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

/* ---- E2M1 ---------------------------------------------------------------------------------- */

static const float E2M1_VALUES[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* ModelOpt NVFP4QTensor._cast_fp4: searchsorted over the midpoints, ties to even. */
uint8_t nb_f32_to_e2m1(float x) {
    float a = fabsf(x);
    uint8_t ord = (uint8_t)((a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) +
                            (a > 3.5f) + (a > 5.0f));
    ord = (uint8_t)(ord + (a == 0.75f || a == 1.75f || a == 3.5f));
    return (uint8_t)(((x < 0.0f) ? 8 : 0) | ord);
}

float nb_e2m1_to_f32(uint8_t code) {
    float v = E2M1_VALUES[code & 7];
    return (code & 8) ? -v : v;
}

/* ---- element access and bulk conversion ----------------------------------------------------- */

double nb_load_elem(const void *base, nb_dtype dt, int64_t i) {
    const uint8_t *p = base;
    switch (dt) {
    case NB_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
    case NB_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
    case NB_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return nb_f16_to_f32(h); }
    case NB_BF16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return nb_bf16_to_f32(h); }
    case NB_E4M3: return nb_e4m3_to_f32(p[i]);
    case NB_E5M2: return nb_e5m2_to_f32(p[i]);
    case NB_E8M0: return nb_e8m0_to_f32(p[i]);
    case NB_E2M1: return nb_e2m1_to_f32((uint8_t)((i & 1) ? p[i >> 1] >> 4 : p[i >> 1] & 0xF));
    case NB_U8: case NB_BOOL: return p[i];
    case NB_I8: return (int8_t)p[i];
    case NB_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case NB_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case NB_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case NB_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case NB_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case NB_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case NB_DTYPE_COUNT: break;
    }
    return NAN;
}

void nb_store_elem(void *base, nb_dtype dt, int64_t i, double v) {
    uint8_t *p = base;
    float f = (float)v;
    switch (dt) {
    case NB_F32: memcpy(p + 4 * i, &f, 4); return;
    case NB_F64: memcpy(p + 8 * i, &v, 8); return;
    case NB_F16: { uint16_t h = nb_f32_to_f16(f); memcpy(p + 2 * i, &h, 2); return; }
    case NB_BF16: { uint16_t h = nb_f32_to_bf16(f); memcpy(p + 2 * i, &h, 2); return; }
    case NB_E4M3: p[i] = nb_f32_to_e4m3(f); return;
    case NB_E5M2: p[i] = nb_f32_to_e5m2(f); return;
    case NB_E8M0: p[i] = nb_f32_to_e8m0(f); return;
    case NB_E2M1: {
        uint8_t c = nb_f32_to_e2m1(f);
        uint8_t *b = p + (i >> 1);
        *b = (i & 1) ? (uint8_t)((*b & 0x0F) | (c << 4)) : (uint8_t)((*b & 0xF0) | c);
        return;
    }
    case NB_U8: p[i] = (uint8_t)v; return;
    case NB_BOOL: p[i] = v != 0; return;
    case NB_I8: p[i] = (uint8_t)(int8_t)v; return;
    case NB_I16: { int16_t x = (int16_t)v; memcpy(p + 2 * i, &x, 2); return; }
    case NB_U16: { uint16_t x = (uint16_t)v; memcpy(p + 2 * i, &x, 2); return; }
    case NB_I32: { int32_t x = (int32_t)v; memcpy(p + 4 * i, &x, 4); return; }
    case NB_U32: { uint32_t x = (uint32_t)v; memcpy(p + 4 * i, &x, 4); return; }
    case NB_I64: { int64_t x = (int64_t)v; memcpy(p + 8 * i, &x, 8); return; }
    case NB_U64: { uint64_t x = (uint64_t)v; memcpy(p + 8 * i, &x, 8); return; }
    case NB_DTYPE_COUNT: return;
    }
}

nb_status nb_convert(void *dst, nb_dtype dt, const void *src, nb_dtype st, int64_t n) {
    if (!nb_dtype_info(dt) || !nb_dtype_info(st) || n < 0) return NB_ERR_INVALID;
    if ((dt == NB_E2M1 || st == NB_E2M1) && (n & 1)) return NB_ERR_SHAPE;
    if (dt == st) { memcpy(dst, src, (size_t)nb_dtype_nbytes(dt, n)); return NB_OK; }
    /* fast paths for the conversions the model runtime does all the time */
    if (dt == NB_F32 && st == NB_BF16) {
        const uint16_t *s = src; float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = u2f((uint32_t)s[i] << 16);
        return NB_OK;
    }
    if (dt == NB_BF16 && st == NB_F32) {
        const float *s = src; uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nb_f32_to_bf16(s[i]);
        return NB_OK;
    }
    if (dt == NB_F32 && st == NB_F16) {
        const uint16_t *s = src; float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nb_f16_to_f32(s[i]);
        return NB_OK;
    }
    if (dt == NB_E2M1) memset(dst, 0, (size_t)nb_dtype_nbytes(dt, n));
    for (int64_t i = 0; i < n; i++) nb_store_elem(dst, dt, i, nb_load_elem(src, st, i));
    return NB_OK;
}

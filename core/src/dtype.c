/* The dtype traits table, the public scalar conversions (FORMATS.md §6, PyTorch c10 semantics: their
 * arithmetic is quant/numerics.h, shared with the fast paths and the CUDA kernels) and element access.
 * These are the scalar references every vectorized or CUDA conversion is tested against. */
#include <math.h>
#include <string.h>

#include "nibble/dtype.h"
#include "quant/numerics.h"

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

/* ---- scalar conversions: the shared numerics (quant/numerics.h) ------------------------------ */

uint16_t nb_f32_to_bf16(float x) { return nbn_f32_to_bf16(x); }
float nb_bf16_to_f32(uint16_t h) { return nbn_bf16_to_f32(h); }
uint16_t nb_f32_to_f16(float f) { return nbn_f32_to_f16(f); }
float nb_f16_to_f32(uint16_t h) { return nbn_f16_to_f32(h); }
uint8_t nb_f32_to_e4m3_raw(float f) { return nbn_f32_to_e4m3_raw(f); }
uint8_t nb_f32_to_e4m3(float x) { return nbn_f32_to_e4m3(x); }
float nb_e4m3_to_f32(uint8_t b) { return nbn_e4m3_to_f32(b); }
uint8_t nb_f32_to_e5m2_raw(float f) { return nbn_f32_to_e5m2_raw(f); }
uint8_t nb_f32_to_e5m2(float x) { return nbn_f32_to_e5m2(x); }
float nb_e5m2_to_f32(uint8_t b) { return nbn_e5m2_to_f32(b); }
uint8_t nb_f32_to_e8m0(float x) { return nbn_f32_to_e8m0(x); }
float nb_e8m0_to_f32(uint8_t b) { return nbn_e8m0_to_f32(b); }
uint8_t nb_f32_to_e2m1(float x) { return nbn_f32_to_e2m1(x); }
float nb_e2m1_to_f32(uint8_t code) { return nbn_e2m1_to_f32(code); }

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
        for (int64_t i = 0; i < n; i++) d[i] = nbn_bf16_to_f32(s[i]);
        return NB_OK;
    }
    if (dt == NB_BF16 && st == NB_F32) {
        const float *s = src; uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nbn_f32_to_bf16(s[i]);
        return NB_OK;
    }
    if (dt == NB_F32 && st == NB_F16) {
        const uint16_t *s = src; float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nbn_f16_to_f32(s[i]);
        return NB_OK;
    }
    if (dt == NB_E2M1) memset(dst, 0, (size_t)nb_dtype_nbytes(dt, n));
    for (int64_t i = 0; i < n; i++) nb_store_elem(dst, dt, i, nb_load_elem(src, st, i));
    return NB_OK;
}

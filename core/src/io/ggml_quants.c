/* ggml tensor-type traits and dequantizers for reading GGUF files.
 * Each decoder restates ggml's reference dequantize_row_* (ggml-quants.c) with the same float
 * operations in the same order, so results are bit-identical to ggml and to gguf-py's quants.py. */
#include <string.h>

#include "nibble/gguf.h"

/* ggml's reference (and numpy) round d*q and then d*q - m separately: no FMA. Most products here
 * are exact anyway (an 11-bit fp16 scale times a code of at most 13 bits), but keep contraction off
 * so that stays true by construction; gcc in ISO C mode (-std=c11) does not contract by default. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { QK_K = 256 };

typedef void (*dq_fn)(const uint8_t *x, float *y, int64_t nblocks);

typedef struct {
    const char *name;
    int blck;     /* elements per block */
    int tsize;    /* bytes per block */
    dq_fn dq;
} ggml_traits;

static float f16_at(const uint8_t *p) { return nb_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* ---- 32-element blocks ------------------------------------------------------------------- */

/* Q4_0: d(f16), qs[16]; low nibbles are elements 0..15, high nibbles 16..31, offset 8. */
static void dq_q4_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = f16_at(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

/* Q4_1: d(f16), m(f16), qs[16]; value = q*d + m. */
static void dq_q4_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 20, y += 32) {
        const float d = f16_at(x), m = f16_at(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            const int x0 = qs[j] & 0x0F;
            const int x1 = qs[j] >> 4;
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Q5_0: d(f16), qh (32 fifth bits, LE u32), qs[16]; offset 16. */
static void dq_q5_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 22, y += 32) {
        const float d = f16_at(x);
        const uint32_t qh = le32(x + 2);
        const uint8_t *qs = x + 6;
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            const int32_t x0 = ((qs[j] & 0x0F) | xh0) - 16;
            const int32_t x1 = ((qs[j] >> 4) | xh1) - 16;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

/* Q5_1: d(f16), m(f16), qh, qs[16]; value = q*d + m. */
static void dq_q5_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 24, y += 32) {
        const float d = f16_at(x), m = f16_at(x + 2);
        const uint32_t qh = le32(x + 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            const int x0 = (qs[j] & 0x0F) | xh0;
            const int x1 = (qs[j] >> 4) | xh1;
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

/* Q8_0: d(f16), qs[32] int8. */
static void dq_q8_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const float d = f16_at(x);
        for (int j = 0; j < 32; j++) y[j] = (int8_t)x[2 + j] * d;
    }
}

/* E2M1 values doubled (ggml's kvalues_mxfp4); the block scales carry the compensating 1/2. */
static const int8_t kvalues_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* MXFP4: e (E8M0), qs[16]; scale 2^(e-127)/2 built from bits as ggml_e8m0_to_fp32_half does. */
static void dq_mxfp4(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 17, y += 32) {
        const uint32_t e = x[0];
        const float d = bits_f32(e < 2 ? 0x00200000u << e : (e - 1) << 23);
        for (int j = 0; j < 16; j++) {
            y[j] = kvalues_fp4[x[1 + j] & 0x0F] * d;
            y[j + 16] = kvalues_fp4[x[1 + j] >> 4] * d;
        }
    }
}

/* ggml_ue4m3_to_fp32: unsigned E4M3 (bias 7, bit 7 ignored), 0x00 and 0x7F decode as 0, halved. */
static float ue4m3_half(uint8_t b) {
    if (b == 0 || b == 0x7F) return 0.0f;
    const int e = (b >> 3) & 0xF, m = b & 7;
    /* every step below is exact: powers of two and at most 4 significant bits */
    const float raw = e == 0 ? (float)m * 0x1p-9f : (1.0f + (float)m / 8.0f) * bits_f32((uint32_t)(e - 7 + 127) << 23);
    return raw * 0.5f;
}

/* NVFP4 (ggml): 64 values = d[4] (UE4M3, one per 16) then qs[32]; sub-block s uses qs[8s..8s+7],
 * low nibble = element j, high nibble = element j + 8. No per-tensor scale inside the file. */
static void dq_nvfp4(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 36, y += 64) {
        for (int s = 0; s < 4; s++) {
            const float d = ue4m3_half(x[s]);
            const uint8_t *qs = x + 4 + 8 * s;
            float *yb = y + 16 * s;
            for (int j = 0; j < 8; j++) {
                yb[j] = kvalues_fp4[qs[j] & 0x0F] * d;
                yb[j + 8] = kvalues_fp4[qs[j] >> 4] * d;
            }
        }
    }
}

/* ---- K-quants: 256-element super-blocks ---------------------------------------------------- */

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d(f16), dmin(f16). */
static void dq_q2_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 84) {
        const uint8_t *sc = x, *q = x + 16;
        const float d = f16_at(x + 80), min = f16_at(x + 82);
        int is = 0;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                uint8_t s = sc[is++];
                float dl = d * (s & 0xF), ml = min * (s >> 4);
                for (int l = 0; l < 16; l++) {
                    const float p = dl * (int8_t)((q[l] >> shift) & 3);
                    *y++ = p - ml;
                }
                s = sc[is++];
                dl = d * (s & 0xF);
                ml = min * (s >> 4);
                for (int l = 0; l < 16; l++) {
                    const float p = dl * (int8_t)((q[l + 16] >> shift) & 3);
                    *y++ = p - ml;
                }
                shift += 2;
            }
            q += 32;
        }
    }
}

/* Q3_K: hmask[32], qs[64], scales[12] (16 6-bit scales, offset 32), d(f16). */
static void dq_q3_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 110) {
        const uint8_t *hm = x, *q = x + 32, *s12 = x + 96;
        const float d_all = f16_at(x + 108);
        int8_t scales[16];
        /* low 4 bits: bytes 0..7 (low nibble then high nibble); high 2 bits: bytes 8..11 */
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? s12[j] & 0xF : s12[j - 8] >> 4;
            const int hi = (s12[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            scales[j] = (int8_t)((lo | (hi << 4)) - 32);
        }
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                float dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m = (uint8_t)(m << 1);
            }
            q += 32;
        }
    }
}

/* The 12-byte packing of eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K: d(f16), dmin(f16), scales[12], qs[128]; 8 sub-blocks of 32: value = d*sc*q - dmin*m. */
static void dq_q4_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 144) {
        const float d = f16_at(x), min = f16_at(x + 2);
        const uint8_t *sc = x + 4, *q = x + 16;
        int is = 0;
        uint8_t s, m;
        for (int j = 0; j < QK_K; j += 64) {
            scale_min_k4(is + 0, sc, &s, &m);
            const float d1 = d * s, m1 = min * m;
            scale_min_k4(is + 1, sc, &s, &m);
            const float d2 = d * s, m2 = min * m;
            for (int l = 0; l < 32; l++) { const float p = d1 * (q[l] & 0xF); *y++ = p - m1; }
            for (int l = 0; l < 32; l++) { const float p = d2 * (q[l] >> 4); *y++ = p - m2; }
            q += 32;
            is += 2;
        }
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of sub-block k is bit k of qh[l]. */
static void dq_q5_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 176) {
        const float d = f16_at(x), min = f16_at(x + 2);
        const uint8_t *sc = x + 4, *qh = x + 16, *ql = x + 48;
        int is = 0;
        uint8_t s, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            scale_min_k4(is + 0, sc, &s, &m);
            const float d1 = d * s, m1 = min * m;
            scale_min_k4(is + 1, sc, &s, &m);
            const float d2 = d * s, m2 = min * m;
            for (int l = 0; l < 32; l++) {
                const float p = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0));
                *y++ = p - m1;
            }
            for (int l = 0; l < 32; l++) {
                const float p = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0));
                *y++ = p - m2;
            }
            ql += 32;
            is += 2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d(f16); offset 32. */
static void dq_q6_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 210) {
        const float d = f16_at(x + 208);
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                /* (d * scale) * q, left to right as in ggml */
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

/* ---- plain float types --------------------------------------------------------------------- */

static void dq_f32(const uint8_t *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * 4); }
static void dq_f16(const uint8_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f16_at(x + 2 * i);
}
static void dq_bf16(const uint8_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = nb_bf16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
}

/* Indexed by ggml_type; block/type sizes as ggml's type_traits (gguf-py GGML_QUANT_SIZES). */
static const ggml_traits traits[] = {
    [NB_GGML_F32] = {"F32", 1, 4, dq_f32},
    [NB_GGML_F16] = {"F16", 1, 2, dq_f16},
    [NB_GGML_Q4_0] = {"Q4_0", 32, 18, dq_q4_0},
    [NB_GGML_Q4_1] = {"Q4_1", 32, 20, dq_q4_1},
    [NB_GGML_Q5_0] = {"Q5_0", 32, 22, dq_q5_0},
    [NB_GGML_Q5_1] = {"Q5_1", 32, 24, dq_q5_1},
    [NB_GGML_Q8_0] = {"Q8_0", 32, 34, dq_q8_0},
    [NB_GGML_Q8_1] = {"Q8_1", 32, 36, NULL},
    [NB_GGML_Q2_K] = {"Q2_K", 256, 84, dq_q2_k},
    [NB_GGML_Q3_K] = {"Q3_K", 256, 110, dq_q3_k},
    [NB_GGML_Q4_K] = {"Q4_K", 256, 144, dq_q4_k},
    [NB_GGML_Q5_K] = {"Q5_K", 256, 176, dq_q5_k},
    [NB_GGML_Q6_K] = {"Q6_K", 256, 210, dq_q6_k},
    [NB_GGML_Q8_K] = {"Q8_K", 256, 292, NULL},
    [NB_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66, NULL},
    [NB_GGML_IQ2_XS] = {"IQ2_XS", 256, 74, NULL},
    [NB_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98, NULL},
    [NB_GGML_IQ1_S] = {"IQ1_S", 256, 50, NULL},
    [NB_GGML_IQ4_NL] = {"IQ4_NL", 32, 18, NULL},
    [NB_GGML_IQ3_S] = {"IQ3_S", 256, 110, NULL},
    [NB_GGML_IQ2_S] = {"IQ2_S", 256, 82, NULL},
    [NB_GGML_IQ4_XS] = {"IQ4_XS", 256, 136, NULL},
    [NB_GGML_I8] = {"I8", 1, 1, NULL},
    [NB_GGML_I16] = {"I16", 1, 2, NULL},
    [NB_GGML_I32] = {"I32", 1, 4, NULL},
    [NB_GGML_I64] = {"I64", 1, 8, NULL},
    [NB_GGML_F64] = {"F64", 1, 8, NULL},
    [NB_GGML_IQ1_M] = {"IQ1_M", 256, 56, NULL},
    [NB_GGML_BF16] = {"BF16", 1, 2, dq_bf16},
    [NB_GGML_TQ1_0] = {"TQ1_0", 256, 54, NULL},
    [NB_GGML_TQ2_0] = {"TQ2_0", 256, 66, NULL},
    [NB_GGML_MXFP4] = {"MXFP4", 32, 17, dq_mxfp4},
    [NB_GGML_NVFP4] = {"NVFP4", 64, 36, dq_nvfp4},
    [NB_GGML_Q1_0] = {"Q1_0", 128, 18, NULL},
};

static const ggml_traits *traits_of(int32_t type) {
    if (type < 0 || type >= (int32_t)(sizeof traits / sizeof traits[0]) || !traits[type].name) return NULL;
    return &traits[type];
}

int64_t nb_ggml_block_size(int32_t type) { const ggml_traits *t = traits_of(type); return t ? t->blck : 0; }
int64_t nb_ggml_type_size(int32_t type) { const ggml_traits *t = traits_of(type); return t ? t->tsize : 0; }
const char *nb_ggml_type_name(int32_t type) { const ggml_traits *t = traits_of(type); return t ? t->name : NULL; }
int nb_ggml_can_dequantize(int32_t type) { const ggml_traits *t = traits_of(type); return t && t->dq; }

nb_status nb_ggml_dequantize(nb_ctx *ctx, int32_t type, const void *src, float *dst, int64_t n) {
    const ggml_traits *t = traits_of(type);
    if (!t) return nb_fail(ctx, NB_ERR_INVALID, "dequantize: unknown ggml type %d", (int)type);
    if (!t->dq) return nb_fail(ctx, NB_ERR_UNSUPPORTED, "dequantize: ggml type %s is not supported", t->name);
    if (n < 0 || n % t->blck)
        return nb_fail(ctx, NB_ERR_SHAPE, "dequantize: %lld elements is not a multiple of the %s block size %d",
                       (long long)n, t->name, t->blck);
    if (n && (!src || !dst)) return nb_fail(ctx, NB_ERR_INVALID, "dequantize: NULL buffer");
    t->dq((const uint8_t *)src, dst, n / t->blck);
    return NB_OK;
}

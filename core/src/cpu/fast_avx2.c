/* AVX2 MXFP8 and FP8 kernels, bit-equal to mxfp8.c / fp8.c (same f32 operations in the same order, no FMA
 * contraction; target("avx2,fma,f16c") per function): f32 rows, BF16 rows on the bf16 patterns and by a per-scale
 * E4M3 VPSHUFB table, the element kernels the tests sweep, bulk dtype helpers. NVFP4: fast_avx2_nvfp4.c. */
#include <math.h>
#include <string.h>

#include "cpu/fast_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "cpu/fast_x86.h"

/* ---- MXFP8 --------------------------------------------------------------------------------------- */

/* Whole groups of 8 blocks a chunk at a time (pass 1 the scale bytes and factors, pass 2 the elements),
 * then the last blocks one by one. x is finite, so x * 2^k is never NaN. */
NB_AVX2 void nbq_avx2_mxfp8_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    int64_t nb = n / NB_MXFP8_BLOCK, ng = nb & ~(int64_t)7;
    float sfa[NBQ_MX_CHUNK];
    for (int64_t g0 = 0; g0 < ng; g0 += NBQ_MX_CHUNK) {
        int64_t g1 = g0 + NBQ_MX_CHUNK < ng ? g0 + NBQ_MX_CHUNK : ng;
        mx_factors(x, g0, g1, a, s, sfa, NULL);
        for (int64_t g = g0; g < g1; g++) {
            const float *xb = x + g * NB_MXFP8_BLOCK;
            __m256 f = _mm256_broadcast_ss(sfa + (g - g0));
            __m256i r = pack_bytes32(e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb), f)),
                                     e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), f)),
                                     e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), f)),
                                     e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), f)));
            _mm256_storeu_si256((__m256i *)(q + g * NB_MXFP8_BLOCK), r);
        }
    }
    for (int64_t g = ng; g < nb; g++) {
        const float *xb = x + g * NB_MXFP8_BLOCK;
        uint8_t code = nbq_mx_scale_byte_fast(block32_absmax(xb), a->mx_floor);
        s[g] = code;
        __m256 sf = f32(nbn_pow2(127 - (int)code));
        __m256i r = pack_bytes32(e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb), sf)),
                                 e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), sf)),
                                 e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), sf)),
                                 e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), sf)));
        _mm256_storeu_si256((__m256i *)(q + g * NB_MXFP8_BLOCK), r);
    }
}

NB_AVX2 void nbq_avx2_mxfp8_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a,
                                           float *y) {
    for (int64_t b = 0; b < n / NB_MXFP8_BLOCK; b++) {
        __m256 d = f32(nbn_pow2((int)s[b] - 127));
        const uint8_t *qb = q + b * NB_MXFP8_BLOCK;
        float *yb = y + b * NB_MXFP8_BLOCK;
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(yb + 8 * k, _mm256_mul_ps(e4m3_dec(load_bytes8(qb + 8 * k)), d));
    }
}

NB_AVX2 void nbq_avx2_mxfp8_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    int64_t nb = n / NB_MXFP8_BLOCK, ng = nb & ~(int64_t)7;
    float sfa[NBQ_MX_CHUNK], da[NBQ_MX_CHUNK];
    for (int64_t g0 = 0; g0 < ng; g0 += NBQ_MX_CHUNK) {
        int64_t g1 = g0 + NBQ_MX_CHUNK < ng ? g0 + NBQ_MX_CHUNK : ng;
        mx_factors(x, g0, g1, a, NULL, sfa, da);
        for (int64_t g = g0; g < g1; g++) {
            const float *xb = x + g * NB_MXFP8_BLOCK;
            float *yb = y + g * NB_MXFP8_BLOCK;
            __m256 f = _mm256_broadcast_ss(sfa + (g - g0)), d = _mm256_broadcast_ss(da + (g - g0));
            for (int k = 0; k < 4; k++) {
                __m256i c = e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), f));
                _mm256_storeu_ps(yb + 8 * k, _mm256_mul_ps(e4m3_dec(c), d));
            }
        }
    }
    for (int64_t g = ng; g < nb; g++) {
        const float *xb = x + g * NB_MXFP8_BLOCK;
        uint8_t code = nbq_mx_scale_byte_fast(block32_absmax(xb), a->mx_floor);
        __m256 sf = f32(nbn_pow2(127 - (int)code)), d = f32(nbn_pow2((int)code - 127));
        float *yb = y + g * NB_MXFP8_BLOCK;
        for (int k = 0; k < 4; k++) {
            __m256i c = e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), sf));
            _mm256_storeu_ps(yb + 8 * k, _mm256_mul_ps(e4m3_dec(c), d));
        }
    }
}

/* ---- FP8 per tensor / per row ---------------------------------------------------------------------- */

/* w / s, rounded to the model dtype for ModelOpt's per-tensor quirk (fp8.c `scaled`). */
NB_AVX2 __attribute__((always_inline)) static inline __m256 fp8_scaled(const float *x, __m256 s, const int32_t dd,
                                                                        const int nan_ok) {
    __m256 v = _mm256_div_ps(_mm256_loadu_ps(x), s);
    if (dd == NB_BF16) v = round_bf16_(v, nan_ok);
    else if (dd == NB_F16) v = round_f16(v);
    return v;
}

/* Whole 32-element steps of a row (quantize into q, or fake quant into y); returns the elements done. */
NB_AVX2 __attribute__((always_inline)) static inline int64_t fp8_steps(const float *x, int64_t n, __m256 sc,
                                                                        const int32_t dd, uint8_t *q, float *y,
                                                                        const int nan_ok) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i c0 = e4m3_enc_(fp8_scaled(x + i, sc, dd, nan_ok), nan_ok);
        __m256i c1 = e4m3_enc_(fp8_scaled(x + i + 8, sc, dd, nan_ok), nan_ok);
        __m256i c2 = e4m3_enc_(fp8_scaled(x + i + 16, sc, dd, nan_ok), nan_ok);
        __m256i c3 = e4m3_enc_(fp8_scaled(x + i + 24, sc, dd, nan_ok), nan_ok);
        if (y) {
            _mm256_storeu_ps(y + i, _mm256_mul_ps(e4m3_dec(c0), sc));
            _mm256_storeu_ps(y + i + 8, _mm256_mul_ps(e4m3_dec(c1), sc));
            _mm256_storeu_ps(y + i + 16, _mm256_mul_ps(e4m3_dec(c2), sc));
            _mm256_storeu_ps(y + i + 24, _mm256_mul_ps(e4m3_dec(c3), sc));
        } else {
            _mm256_storeu_si256((__m256i *)(q + i), pack_bytes32(c0, c1, c2, c3));
        }
    }
    return i;
}

/* One instance per (div dtype, NaN possible): a finite scale > 0 keeps x/s of finite x out of NaN. */
NB_AVX2 static int64_t fp8_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, float *y) {
    const __m256 sc = f32(a->scale);
    int nn = normal_scale(a->scale);
    switch (a->div_dtype) {
    case NB_BF16: return nn ? fp8_steps(x, n, sc, NB_BF16, q, y, 0) : fp8_steps(x, n, sc, NB_BF16, q, y, 1);
    case NB_F16: return nn ? fp8_steps(x, n, sc, NB_F16, q, y, 0) : fp8_steps(x, n, sc, NB_F16, q, y, 1);
    default: return nn ? fp8_steps(x, n, sc, NB_F32, q, y, 0) : fp8_steps(x, n, sc, NB_F32, q, y, 1);
    }
}

NB_AVX2 void nbq_avx2_fp8_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    int64_t i = fp8_row(x, n, a, q, NULL);
    if (i < n) nb_fp8_quantize_row_ref(x + i, n - i, a, q + i, s);
}

NB_AVX2 void nbq_avx2_fp8_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y) {
    const __m256 sc = f32(a->scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(e4m3_dec(load_bytes8(q + i)), sc));
    if (i < n) nb_fp8_dequantize_row_ref(q + i, s, n - i, a, y + i);
}

NB_AVX2 void nbq_avx2_fp8_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    int64_t i = fp8_row(x, n, a, NULL, y);
    if (i < n) nb_fp8_fake_row_ref(x + i, n - i, a, y + i);
}

/* ---- MXFP8 and FP8 from BF16 rows ------------------------------------------------------------------ */

/* Both formats end in one E4M3 code per bf16 element, computed on the 16-bit patterns two ymm (32
 * elements) at a time and packed to bytes by VPACKUSWB, whose per-128-bit-lane interleave one VPERMQ
 * undoes at the store. The packed byte is a biased code h (c + a bias), and unsigned-saturating byte
 * arithmetic finishes it: code = subs(adds(h, t), 0x81) = min(c, 0x7E) for FP8 (t from the table),
 * subs(h, 0x81) for MXFP8 (its bias is 0x81 already, the pack's saturation the clamp); 0x7E = 448,
 * and clamping after the rounding equals clamping before, as the rounding is monotone. Lanes the
 * shortcut cannot take (E4M3-subnormal results) show as h in a small range, one add and one byte
 * compare, and go to the reference one at a time. The sign is bit 7 of VPACKSSWB of the raw
 * patterns. */

enum { FP8_B = 104, FP8_SLOW = 48, MX_B = 0x81, MX_SLOW_LO = MX_B - 31, MX_SLOW_N = 40, MX_REF_CODE = 12,
       MX_C0 = 127 * 128 + 7 - (120 << 7) + 16 * MX_B };

/* Slow-lane bytes (pre-VPERMQ order, as the codes) -> a bit per element. */
NB_AVX2 static inline uint32_t lanes_of(__m256i slow) {
    return (uint32_t)_mm256_movemask_epi8(_mm256_permute4x64_epi64(slow, 0xD8));
}

/* 0xFF where lo <= h < lo + len (h unsigned): h - lo < len unsigned, as a signed compare of
 * h + (0x80 - lo) (off) with len - 128 (lim_s). */
NB_AVX2 static inline __m256i h_between(__m256i h, __m256i off, __m256i lim_s) {
    return _mm256_cmpgt_epi8(lim_s, _mm256_add_epi8(h, off));
}

/* Sign bytes of 32 patterns in packed order: 0x80 where bit 15 is set (VPACKSSWB saturates every
 * negative word to a byte with bit 7 set, every positive one to a byte without). */
NB_AVX2 static inline __m256i sign32(__m256i v0, __m256i v1, __m256i c80) {
    return _mm256_and_si256(_mm256_packs_epi16(v0, v1), c80);
}

/* Largest u16 of 16 lanes. */
NB_AVX2 static inline uint32_t hmax_u16(__m256i v) {
    __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    /* PHMINPOSUW finds the smallest complement: bits 15:0 of its result */
    return ~(uint32_t)_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi16(-1)))) & 0xFFFFu;
}

/* ---- FP8 by table --------------------------------------------------------------------------------- */

/* With one divisor sc per row, scaling x by 2^j scales the quotient and every rounding on the way
 * (f32, bf16 for ModelOpt's per-tensor quirk, E4M3) by 2^j while the quotient stays a normal E4M3
 * value, so code(x) = T[m] + 8 (E - e0) for x's biased exponent E and 7 mantissa bits m, where T[m]
 * is the code of the bf16 with exponent e0 = E(sc) + 2 and mantissa m (quotients in (2, 8)), computed
 * by the f32 row's own arithmetic (fast_avx512.c's fp8_table512 does the same with a 128-byte
 * VPERMI2B). AVX2 looks up 16 bytes at a time (VPSHUFB), so T is split with m = 8a + b:
 *     T[8a + b] = base[a] + (b >= theta[a]),  theta[a] in 1..8 (8: no step in that window),
 * looked up as base[a] + (m > mm1[a]) with mm1[a] = 8a + theta[a] - 1.
 * Why it always holds: x_m / sc = 4 (1 + m/128) / (1 + f) (sc = (1 + f) 2^e) grows by 1/(32 (1 + f))
 * per m step. The code passes c where the rounded quotient reaches the midpoint below c; the f32 and
 * bf16 roundings (monotone) move each such threshold by at most half a bf16 ulp plus half an f32
 * ulp (2^-7 + 2^-23 in [2, 4), twice that in [4, 8)), and the midpoints are 1/4 apart in [2, 4), 3/8
 * across 4, 1/2 in [4, 8). So two thresholds are at least 1/4 - 2^-6 - 2^-22 apart, over 7.4 (1 + f)
 * m steps, where a window of 8 values spans 7: a window holds at most one step, of one code. Every
 * build checks it all the same (the kernel falls back to the f32 row if a check ever failed); the
 * tests sample scales, and all 2^23 mantissas of sc with both division dtypes were checked once.
 *
 * The exponent term is one shift of the magnitude, mag >> 4 = 8E + (m >> 4): the tables hold
 * T''[m] = T[m] - (m >> 4) + 0x81 - FP8_B and h = (mag >> 4) - (8 e0 - FP8_B), so h + T'' = c + 0x81.
 *  - h saturated to 255 by the pack: c >= 255 + T'' - 0x81 > 0x7E (T'' >= 0x52): clamped, right.
 *  - h <= 0 (saturated to 0): E <= e0 - 13, the quotient is below 2^-10, its code 0, and so is
 *    subs(T'', 0x81) (T'' <= 0x69 as T is in [0x40, 0x50]). Zeros and bf16 subnormals land here.
 *  - h >= FP8_SLOW: E >= e0 - 7, the quotient is above 2^-6, a normal E4M3 value: the table is exact.
 *  - 0 < h < FP8_SLOW may be an E4M3 subnormal: those lanes take the reference.
 * sc in [2^-100, 2^100] keeps e0 in [29, 229], every x_m normal and h in int16 range. */
typedef struct fp8_tab {
    uint32_t su;     /* bits of the divisor the table is for */
    int32_t dd;      /* division dtype (NB_F32 or NB_BF16) */
    int state;       /* 0 empty, 1 ready, -1 the split failed (never seen): f32 rows */
    int16_t k;       /* 8 e0 - FP8_B */
    _Alignas(32) uint8_t base[32], mm1[32];   /* 16 entries, once per 128-bit lane */
} fp8_tab;

/* The f32 row's arithmetic (fp8_scaled, e4m3_enc) on x_m, m = 8a + b for the 8 windows a of `a8`. */
NB_AVX2 static inline __m256i fp8_tab_codes(__m256i a8, int b, __m256i ex, __m256 s, int32_t dd) {
    __m256 xm = _mm256_castsi256_ps(_mm256_or_si256(ex, _mm256_slli_epi32(_mm256_add_epi32(_mm256_slli_epi32(a8, 3), i32(b)), 16)));
    __m256 v = _mm256_div_ps(xm, s);
    if (dd == NB_BF16) v = round_bf16_(v, 0);
    return e4m3_enc_nn(v);
}

/* The tables by windows: lanes are the 16 windows a (two vectors of 8), one pass per b. base[a] =
 * T''[8a]; theta[a] counts the b whose code equals T[8a]; the split holds when T[8a+b] - T[8a] is 0
 * or 1 and never falls back to 0 as b grows. */
NB_AVX2 static void fp8_tab_build(float sc, int32_t dd, fp8_tab *t) {
    uint32_t su;
    memcpy(&su, &sc, 4);
    const int e0 = (int)(su >> 23) + 2;
    const __m256 s = f32(sc);
    const __m256i ex = i32(e0 << 23), one = i32(1);
    const __m256i a8[2] = {_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)};
    __m256i base[2], cnt[2], prev[2], bad = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        base[h] = fp8_tab_codes(a8[h], 0, ex, s, dd);
        cnt[h] = one;
        prev[h] = _mm256_setzero_si256();
    }
    for (int b = 1; b < 8; b++)
        for (int h = 0; h < 2; h++) {
            __m256i d = _mm256_sub_epi32(fp8_tab_codes(a8[h], b, ex, s, dd), base[h]);
            /* d must be 0 or 1 (d & ~1 == 0) and not below the previous d */
            bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_andnot_si256(one, d), _mm256_cmpgt_epi32(prev[h], d)));
            cnt[h] = _mm256_sub_epi32(cnt[h], _mm256_cmpeq_epi32(d, _mm256_setzero_si256()));
            prev[h] = d;
        }
    /* T'' = T - (m >> 4) + 0x81 - FP8_B with m >> 4 = a >> 1 at m = 8a; mm1 = 8a + theta - 1 */
    __m256i bb[2], mm[2];
    for (int h = 0; h < 2; h++) {
        bb[h] = _mm256_add_epi32(_mm256_sub_epi32(base[h], _mm256_srli_epi32(a8[h], 1)), i32(0x81 - FP8_B));
        mm[h] = _mm256_add_epi32(_mm256_slli_epi32(a8[h], 3), _mm256_sub_epi32(cnt[h], one));
    }
    /* 16 dwords -> 16 bytes in order, in both 128-bit lanes */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5);
    __m256i pb = _mm256_packus_epi32(bb[0], bb[1]), pm = _mm256_packus_epi32(mm[0], mm[1]);
    _mm256_store_si256((__m256i *)t->base, _mm256_permutevar8x32_epi32(_mm256_packus_epi16(pb, pb), order));
    _mm256_store_si256((__m256i *)t->mm1, _mm256_permutevar8x32_epi32(_mm256_packus_epi16(pm, pm), order));
    t->su = su;
    t->dd = dd;
    t->k = (int16_t)(8 * e0 - FP8_B);
    t->state = _mm256_testz_si256(bad, bad) ? 1 : -1;
}

/* The kernel's registers: the two tables and the constants (kept in one place so both loops and the
 * table check use the same lookup). */
typedef struct fp8_k {
    __m256i base, mm1, k, m7fff, m7f, m0f, c81, c80, c127, slow;
} fp8_k;

NB_AVX2 static inline void fp8_k_init(fp8_k *c, const fp8_tab *t) {
    c->base = _mm256_load_si256((const __m256i *)t->base);
    c->mm1 = _mm256_load_si256((const __m256i *)t->mm1);
    c->k = _mm256_set1_epi16(t->k);
    c->m7fff = _mm256_set1_epi16(0x7FFF);
    c->m7f = _mm256_set1_epi16(0x7F);
    c->m0f = _mm256_set1_epi8(0x0F);
    c->c81 = _mm256_set1_epi8((char)0x81);
    c->c80 = _mm256_set1_epi8((char)0x80);
    c->c127 = _mm256_set1_epi8(127);
    c->slow = _mm256_set1_epi8((char)(FP8_SLOW - 1 - 128));
}

/* T''[m] of 32 mantissa bytes m8 (0..127): base[m >> 3] + (m > mm1[m >> 3]). */
NB_AVX2 static inline __m256i fp8_lookup(__m256i m8, const fp8_k *c) {
    __m256i idx = _mm256_and_si256(_mm256_srli_epi16(m8, 3), c->m0f);
    return _mm256_sub_epi8(_mm256_shuffle_epi8(c->base, idx), _mm256_cmpgt_epi8(m8, _mm256_shuffle_epi8(c->mm1, idx)));
}

/* E4M3 codes of the 32 elements v0 (0-15), v1 (16-31), in packed order (the caller's VPERMQ puts them
 * in element order); *slow marks the lanes for the reference, *vm collects the magnitudes. */
NB_AVX2 __attribute__((always_inline)) static inline __m256i fp8_pair(__m256i v0, __m256i v1, const fp8_k *c,
                                                                       __m256i *vm, __m256i *slow) {
    __m256i mag0 = _mm256_and_si256(v0, c->m7fff), mag1 = _mm256_and_si256(v1, c->m7fff);
    *vm = _mm256_max_epu16(*vm, _mm256_max_epu16(mag0, mag1));
    __m256i h = _mm256_packus_epi16(_mm256_sub_epi16(_mm256_srli_epi16(mag0, 4), c->k),
                                    _mm256_sub_epi16(_mm256_srli_epi16(mag1, 4), c->k));
    __m256i m8 = _mm256_packus_epi16(_mm256_and_si256(v0, c->m7f), _mm256_and_si256(v1, c->m7f));
    __m256i code = _mm256_subs_epu8(_mm256_adds_epu8(h, fp8_lookup(m8, c)), c->c81);
    *slow = h_between(h, c->c127, c->slow);
    return _mm256_or_si256(code, sign32(v0, v1, c->c80));
}

/* A row of at least 32 elements (else none) by 32-element steps (two per iteration; one vector test
 * for both steps' slow lanes); with `next`, the magnitudes of the next row nx go into *nmax on the
 * way. Returns the elements done (n or 0). */
NB_AVX2 __attribute__((always_inline)) static inline int64_t fp8_tab_steps(const uint16_t *x, int64_t n, const fp8_tab *t,
                                                                            float sc, int32_t dd, uint8_t *q,
                                                                            __m256i *vmax, const uint16_t *nx,
                                                                            __m256i *nmax, const int next) {
    fp8_k c;
    fp8_k_init(&c, t);
    __m256i vm = *vmax, nm = next ? *nmax : _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(x + i)), v1 = _mm256_loadu_si256((const __m256i *)(x + i + 16));
        const __m256i v2 = _mm256_loadu_si256((const __m256i *)(x + i + 32)), v3 = _mm256_loadu_si256((const __m256i *)(x + i + 48));
        const uint16_t *pf = (next ? nx : x) + i + NBQ_PF_AHEAD;
        _mm_prefetch((const char *)pf, _MM_HINT_T0);
        _mm_prefetch((const char *)(pf + 32), _MM_HINT_T0);
        if (next) {
            __m256i a = _mm256_max_epu16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(nx + i)), c.m7fff),
                                         _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(nx + i + 16)), c.m7fff));
            __m256i b = _mm256_max_epu16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(nx + i + 32)), c.m7fff),
                                         _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(nx + i + 48)), c.m7fff));
            nm = _mm256_max_epu16(nm, _mm256_max_epu16(a, b));
        }
        __m256i s0, s1;
        __m256i c0 = fp8_pair(v0, v1, &c, &vm, &s0), c1 = fp8_pair(v2, v3, &c, &vm, &s1);
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permute4x64_epi64(c0, 0xD8));
        _mm256_storeu_si256((__m256i *)(q + i + 32), _mm256_permute4x64_epi64(c1, 0xD8));
        __m256i s = _mm256_or_si256(s0, s1);
        if (__builtin_expect(!_mm256_testz_si256(s, s), 0)) {
            fp8_ref_lanes(x + i, lanes_of(s0), sc, dd, q + i);
            fp8_ref_lanes(x + i + 32, lanes_of(s1), sc, dd, q + i + 32);
        }
    }
    /* the rest by 32-element steps, the last one ending at n: where n is not whole steps it overlaps
     * the step before (those elements are written twice, the same bytes: a code depends on its own
     * element only). The reference tail this replaces cost ~6 ns an element (rows of 4096 + 63, 31
     * of them by the reference: 0.137 against 0.092 ns/element; with the overlap 0.094). */
    for (; i < n && n >= 32; i += 32) {
        if (i + 32 > n) i = n - 32;
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(x + i)), v1 = _mm256_loadu_si256((const __m256i *)(x + i + 16));
        if (next)
            nm = _mm256_max_epu16(nm, _mm256_max_epu16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(nx + i)), c.m7fff),
                                                       _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(nx + i + 16)), c.m7fff)));
        __m256i s0;
        __m256i c0 = fp8_pair(v0, v1, &c, &vm, &s0);
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permute4x64_epi64(c0, 0xD8));
        if (!_mm256_testz_si256(s0, s0)) fp8_ref_lanes(x + i, lanes_of(s0), sc, dd, q + i);
    }
    *vmax = vm;
    if (next) *nmax = nm;
    return i;
}

NB_AVX2 static int64_t fp8_tab_row(const uint16_t *x, int64_t n, const fp8_tab *t, float sc, int32_t dd, uint8_t *q,
                                   __m256i *vmax) {
    return fp8_tab_steps(x, n, t, sc, dd, q, vmax, NULL, NULL, 0);
}

NB_AVX2 static int64_t fp8_tab_row_next(const uint16_t *x, int64_t n, const fp8_tab *t, float sc, int32_t dd, uint8_t *q,
                                        __m256i *vmax, const uint16_t *nx, __m256i *nmax) {
    return fp8_tab_steps(x, n, t, sc, dd, q, vmax, nx, nmax, 1);
}

/* The table for (sc, dd), or NULL when these arguments are not the kernel's. FP8 per tensor has one
 * scale for every row, so each thread keeps the last table it built; per channel builds one per row
 * (16 divisions and ~100 vector operations, ~10% of a 4096-element row). */
NB_AVX2 static const fp8_tab *fp8_tab_for(float sc, int32_t dd) {
    static _Thread_local fp8_tab cache;
    if (dd != NB_BF16 && dd != NB_F32) return NULL;
    if (!(sc >= 0x1p-100f && sc <= 0x1p100f)) return NULL;
    uint32_t su;
    memcpy(&su, &sc, 4);
    if (cache.state == 0 || cache.su != su || cache.dd != dd) fp8_tab_build(sc, dd, &cache);
    return cache.state > 0 ? &cache : NULL;
}

int nbq_avx2_fp8_table_ok(float sc, int32_t dd) {
    return fp8_tab_for(sc, dd) != NULL;
}

static uint32_t max_mag16(const uint16_t *x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) m = (uint32_t)(x[i] & 0x7FFF) > m ? (uint32_t)(x[i] & 0x7FFF) : m;
    return m;
}

/* 2 when the magnitudes seen (vm, and x[from, n)) include a NaN/Inf pattern (>= 0x7F80), else 0. */
NB_AVX2 static int row_status16(__m256i vm, const uint16_t *x, int64_t from, int64_t n) {
    uint32_t m = hmax_u16(vm), t = max_mag16(x + from, n - from);
    return (m > t ? m : t) >= 0x7F80u ? 2 : 0;
}

NB_AVX2 int nbq_avx2_fp8_row_next_bf16(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                       const uint16_t *next, uint32_t *next_max) {
    const fp8_tab *t = fp8_tab_for(a->scale, a->div_dtype);
    if (!t) {
        if (next) *next_max = max_mag16(next, n);
        return 1;
    }
    __m256i vm = _mm256_setzero_si256(), nm = _mm256_setzero_si256();
    int64_t i = next ? fp8_tab_row_next(x, n, t, a->scale, a->div_dtype, q, &vm, next, &nm)
                     : fp8_tab_row(x, n, t, a->scale, a->div_dtype, q, &vm);
    if (next) {
        uint32_t m = hmax_u16(nm), r = max_mag16(next + i, n - i);
        *next_max = m > r ? m : r;
    }
    if (i < n) fp8_ref_bf16(x + i, n - i, a->scale, a->div_dtype, q + i);   /* a row under 32 elements */
    return row_status16(vm, x, i, n);
}

/* ---- MXFP8 on the bf16 patterns --------------------------------------------------------------------- */

/* The E8M0 scale is a power of two, so x * 2^(127 - code) is x's bf16 pattern q = mag + (127 - code)
 * 128 with its exponent moved, and its E4M3 code is q rounded to nearest even at bit 4, rebiased (as
 * fast_avx512.c's mx_groups512): c = (q + 7 + lsb - (120 << 7)) >> 4, lsb = bit 4 of mag. In one add:
 *     h = (mag + lsb + C) >> 4 (arithmetic),  C = (127 - code) 128 + 7 - (120 << 7) + 16 MX_B,
 * is c + MX_B wherever c is a normal E4M3 code. With MX_B = 0x81, VPACKUSWB's saturation of h to
 * [0, 255] is the 448 clamp (255 - 0x81 = 0x7E is 448, and the codes are monotone, so clamping after
 * the rounding equals clamping before), and code = subs(h, 0x81) in one op (c <= 0 gives 0). No
 * 16-bit overflow: scaled values up to 512 (the floor rule's largest) give h <= 0x101, and code <=
 * 247 keeps mag + C above -28800.
 *  - Scaled values in [2^-10, 2^-6) (E4M3 subnormals) give c in [0, 8): the reference. So do the
 *    first normal ones (c = 8) and some below 2^-10 (c in [-31, 0); their code is 0): the lanes
 *    with h in [MX_SLOW_LO, MX_SLOW_LO + MX_SLOW_N), one add and one byte compare.
 *  - c < -31 gives code 0: values below 2^-10, and zeros when code >= 11 ((903 - 128 code) >> 4 < -31).
 *  - bf16 subnormal inputs are not patterns with a moved exponent: for code >= MX_REF_CODE their
 *    scaled values are below 2^-11 and c < -31 (mag + lsb + C <= 128 + 0xB97 - 12 128 = 1559, h <=
 *    0x61); blocks with a smaller code (block amax below ~2^-107) go to the reference whole. */

/* Largest magnitude pattern (0..0x7FFF) of each of the 8 blocks at xg (256 elements), dword b =
 * block b. */
NB_AVX2 static inline __m256i mx_bmax8(const uint16_t *xg) {
    const __m256i msk = _mm256_set1_epi16(0x7FFF);
    __m256i u[4], v[2];
    for (int j = 0; j < 4; j++) {   /* lane 0: block 2j, lane 1: block 2j+1 (8 words each) */
        const uint16_t *p = xg + 64 * j;
        __m256i a = _mm256_max_epu16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), msk),
                                     _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 16)), msk));
        __m256i b = _mm256_max_epu16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 32)), msk),
                                     _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 48)), msk));
        u[j] = _mm256_max_epu16(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
    }
    for (int i = 0; i < 2; i++)   /* lane 0: blocks 4i, 4i+2 (4 words each); lane 1: 4i+1, 4i+3 */
        v[i] = _mm256_max_epu16(_mm256_unpacklo_epi64(u[2 * i], u[2 * i + 1]), _mm256_unpackhi_epi64(u[2 * i], u[2 * i + 1]));
    __m256 p = _mm256_castsi256_ps(v[0]), r = _mm256_castsi256_ps(v[1]);   /* dwords: 0 2 4 6 | 1 3 5 7 */
    __m256i w = _mm256_max_epu16(_mm256_castps_si256(_mm256_shuffle_ps(p, r, _MM_SHUFFLE(2, 0, 2, 0))),
                                 _mm256_castps_si256(_mm256_shuffle_ps(p, r, _MM_SHUFFLE(3, 1, 3, 1))));
    w = _mm256_srli_epi32(_mm256_max_epu16(_mm256_slli_epi32(w, 16), w), 16);
    return _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The E8M0 byte of a block whose largest magnitude is the bf16 pattern P = E << 7 | j (finite):
 * amax / 448 = ((128 + j) / 224) 2^(E - 135), so for j < 96 log2 lies in (E - 136, E - 135), at least
 * 0.19 above E - 136 (no f32 rounding of amax / 448 or of the log2 undoes that: |log2| < 2^8, its ulp
 * <= 2^-16); for j = 96 it is E - 135 exactly; for j > 96 it is at least E - 135 + 0.0064. ModelOpt's
 * ceil rule is therefore e = E - 135 + (j > 96): code = ((P + 31) >> 7) - 8. The OCP floor rule is
 * floor(log2 amax) - 8: code = (P >> 7) - 8. Both clamp at 0 (zero blocks, amax below ~2^-119, bf16
 * subnormals); P <= 0x7F7F keeps them <= 247. tests/c/test_quant_fast_bf16.c checks every P against
 * nb_mxfp8_scale_byte. */
NB_AVX2 static inline __m256i mx_codes_bf16(__m256i P, int ocp_floor) {
    __m256i e = _mm256_srli_epi32(ocp_floor ? P : _mm256_add_epi32(P, i32(31)), 7);
    return _mm256_max_epi32(_mm256_sub_epi32(e, i32(8)), _mm256_setzero_si256());
}

/* The blocks of a BF16 row of at least 8 blocks (else none), 8 blocks a group: per group the scale
 * bytes (mx_codes_bf16 on the block maxima), then each block's 32 codes. A row that is not whole
 * groups ends with the group of its last 8 blocks, overlapping the one before (those blocks are
 * written twice, the same bytes: a block's bytes depend on its own elements only), as mx_groups512
 * does: the reference tail on f32 copies this replaces cost more than the row's vector blocks (one
 * thread in cache: rows of 2880, 2 tail blocks in 90, 0.214 -> 0.124 ns/element; rows of 896, 4 in
 * 28, 0.72 -> 0.13; rows of 4096 0.116). *vmax collects the block maxima (NaN/Inf: >= 0x7F80).
 * Returns the blocks done. */
NB_AVX2 static int64_t mx_groups(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s,
                                 __m256i *vmax) {
    const int64_t nb = n / NB_MXFP8_BLOCK;
    if (nb < 8) return 0;
    const __m256i m7fff = _mm256_set1_epi16(0x7FFF), one = _mm256_set1_epi16(1);
    const __m256i c81 = _mm256_set1_epi8((char)MX_B), c80 = _mm256_set1_epi8((char)0x80);
    const __m256i soff = _mm256_set1_epi8((char)(0x80 - MX_SLOW_LO)), slim = _mm256_set1_epi8((char)(MX_SLOW_N - 128));
    _Alignas(32) int32_t cc[8];
    __m256i vm = *vmax;
    for (int64_t g0 = 0; g0 < nb; g0 += 8) {
        const int64_t g = g0 + 8 <= nb ? g0 : nb - 8;
        const uint16_t *xg = x + g * NB_MXFP8_BLOCK;
        __m256i bam = mx_bmax8(xg);
        vm = _mm256_max_epu32(vm, bam);
        __m256i code = mx_codes_bf16(bam, a->mx_floor);
        store_bytes8(s + g, code);
        __m256i cw = _mm256_sub_epi32(i32(MX_C0), _mm256_slli_epi32(code, 7));   /* C, in both words */
        _mm256_store_si256((__m256i *)cc, _mm256_or_si256(_mm256_and_si256(cw, i32(0xFFFF)), _mm256_slli_epi32(cw, 16)));
        const int ref = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(i32(MX_REF_CODE), code)));
        for (int b = 0; b < 8; b++) {
            const uint16_t *xb = xg + b * NB_MXFP8_BLOCK;
            uint8_t *qb = q + (g + b) * NB_MXFP8_BLOCK;
            _mm_prefetch((const char *)(xb + NBQ_PF_AHEAD), _MM_HINT_T0);
            const __m256i C = _mm256_set1_epi32(cc[b]);
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)xb), v1 = _mm256_loadu_si256((const __m256i *)(xb + 16));
            __m256i h0 = _mm256_add_epi16(_mm256_and_si256(v0, m7fff), _mm256_and_si256(_mm256_srli_epi16(v0, 4), one));
            __m256i h1 = _mm256_add_epi16(_mm256_and_si256(v1, m7fff), _mm256_and_si256(_mm256_srli_epi16(v1, 4), one));
            __m256i h = _mm256_packus_epi16(_mm256_srai_epi16(_mm256_add_epi16(h0, C), 4), _mm256_srai_epi16(_mm256_add_epi16(h1, C), 4));
            __m256i c = _mm256_or_si256(_mm256_subs_epu8(h, c81), sign32(v0, v1, c80));
            _mm256_storeu_si256((__m256i *)qb, _mm256_permute4x64_epi64(c, 0xD8));
            __m256i sl = h_between(h, soff, slim);
            if (__builtin_expect(!_mm256_testz_si256(sl, sl), 0)) mx_ref_lanes(xb, lanes_of(sl), s[g + b], qb);
        }
        if (__builtin_expect(ref != 0, 0))
            for (int b = 0; b < 8; b++)
                if (ref >> b & 1) mx_ref_lanes(xg + b * NB_MXFP8_BLOCK, 0xFFFFFFFFu, s[g + b], q + (g + b) * NB_MXFP8_BLOCK);
    }
    *vmax = vm;
    return nb;
}

NB_AVX2 int nbq_avx2_quantize_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                   uint8_t *s) {
    switch (f) {
    case NB_FMT_MXFP8: {
        __m256i vm = _mm256_setzero_si256();
        int64_t g = mx_groups(x, n, a, q, s, &vm);
        uint32_t t[8];
        _mm256_storeu_si256((__m256i *)t, vm);
        uint32_t worst = 0;
        for (int k = 0; k < 8; k++) worst = t[k] > worst ? t[k] : worst;
        int64_t done = g * NB_MXFP8_BLOCK;
        if (done < n) {   /* a row under 8 blocks by the reference, on f32 copies (no whole block: nothing) */
            float tail[8 * NB_MXFP8_BLOCK];
            for (int64_t k = done; k < n; k++) tail[k - done] = nbn_bf16_to_f32(x[k]);
            nb_mxfp8_quantize_row_ref(tail, n - done, a, q + done, s + g);
        }
        return worst >= 0x7F80u || max_mag16(x + done, n - done) >= 0x7F80u ? 2 : 0;
    }
    case NB_FMT_FP8_TENSOR:
    case NB_FMT_FP8_CHANNEL:
        return nbq_avx2_fp8_row_next_bf16(x, n, a, q, NULL, NULL);
    default:
        return 1;
    }
}

/* ---- element kernels for the tests -------------------------------------------------------------- */

NB_AVX2 void nbq_avx2_e4m3_encode(const float *x, int64_t n, uint8_t *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store_bytes8(out + i, e4m3_enc(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) out[i] = nb_f32_to_e4m3(x[i]);
}

NB_AVX2 void nbq_avx2_e4m3_decode(const uint8_t *b, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, e4m3_dec(load_bytes8(b + i)));
    for (; i < n; i++) out[i] = nb_e4m3_to_f32(b[i]);
}

NB_AVX2 void nbq_avx2_e2m1_encode(const float *x, int64_t n, uint8_t *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store_bytes8(out + i, e2m1_enc(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) out[i] = nb_f32_to_e2m1(x[i]);
}

/* ---- bulk dtype helpers ------------------------------------------------------------------------- */

/* The drivers load a row, then run the row function on it; asking for the next row's bytes (rows are
 * contiguous) while converting this one lets the memory reads overlap the quantization instead of
 * alternating with it. Prefetches never fault, so running past the end of the tensor is harmless. */
NB_AVX2 static inline void prefetch_next(const void *src, int64_t bytes) {
    const char *p = (const char *)src + bytes;
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
}

NB_AVX2 void nbq_avx2_load_f32(const void *src, nb_dtype dt, int64_t n, float *out) {
    int64_t i = 0;
    if (n >= 256 && n <= 65536) prefetch_next(src, n * (dt == NB_F32 ? 4 : 2));
    if (dt == NB_F32) {
        memcpy(out, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (dt == NB_BF16) {
        for (; i + 16 <= n; i += 16) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(h + i));
            __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16);
            __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16);
            _mm256_storeu_si256((__m256i *)(out + i), lo);
            _mm256_storeu_si256((__m256i *)(out + i + 8), hi);
        }
        for (; i < n; i++) out[i] = nb_bf16_to_f32(h[i]);
    } else {
        /* F16C quiets signalling NaNs; nb_f16_to_f32 keeps the payload as is, so NaN lanes are rebuilt */
        for (; i + 8 <= n; i += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
            __m256i w = _mm256_cvtepu16_epi32(v);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, i32(0x7FFF)), i32(0x7C00));
            __m256i raw = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, i32(0x8000)), 16),
                                          _mm256_or_si256(i32(0x7F800000), _mm256_slli_epi32(_mm256_and_si256(w, i32(0x3FF)), 13)));
            __m256i r = _mm256_blendv_epi8(_mm256_castps_si256(_mm256_cvtph_ps(v)), raw, nan);
            _mm256_storeu_si256((__m256i *)(out + i), r);
        }
        for (; i < n; i++) out[i] = nb_f16_to_f32(h[i]);
    }
}

NB_AVX2 void nbq_avx2_store_f32(void *dst, nb_dtype dt, int64_t n, const float *in) {
    int64_t i = 0;
    if (dt == NB_F32) {
        memmove(dst, in, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    if (dt == NB_BF16) {
        for (; i + 16 <= n; i += 16) {
            __m256i a = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(_mm256_loadu_ps(in + i))), 16);
            __m256i b = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(_mm256_loadu_ps(in + i + 8))), 16);
            __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
            _mm256_storeu_si256((__m256i *)(h + i), p);
        }
        for (; i < n; i++) h[i] = nb_f32_to_bf16(in[i]);
    } else {
        /* F16C keeps the top of a NaN's payload; nb_f32_to_f16 gives every NaN 0x7E00 with its sign */
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(in + i);
            __m128i hv = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
            __m128i canon = _mm_or_si128(_mm_and_si128(hv, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7E00));
            _mm_storeu_si128((__m128i *)(h + i), _mm_blendv_epi8(hv, canon, nan16));
        }
        for (; i < n; i++) h[i] = nb_f32_to_f16(in[i]);
    }
}

/* max |x| as an integer max over the magnitude bits: for finite values the order of the bits is the
 * order of the values, and any bit pattern at or above the exponent-all-ones one is NaN/Inf. */
NB_AVX2 float nbq_avx2_absmax(const void *src, nb_dtype dt, int64_t n, int *nonfinite) {
    int64_t i = 0;
    uint32_t m = 0, lim;
    if (dt == NB_F32) {
        const uint32_t *u = src;
        __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
        const __m256i mask = i32(0x7FFFFFFF);
        for (; i + 16 <= n; i += 16) {
            acc0 = _mm256_max_epu32(acc0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(u + i)), mask));
            acc1 = _mm256_max_epu32(acc1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(u + i + 8)), mask));
        }
        uint32_t t[8];
        _mm256_storeu_si256((__m256i *)t, _mm256_max_epu32(acc0, acc1));
        for (int k = 0; k < 8; k++) m = t[k] > m ? t[k] : m;
        for (; i < n; i++) m = (u[i] & 0x7FFFFFFFu) > m ? (u[i] & 0x7FFFFFFFu) : m;
        lim = 0x7F800000u;
    } else {
        const uint16_t *h = src;
        __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
        const __m256i mask = _mm256_set1_epi16(0x7FFF);
        for (; i + 32 <= n; i += 32) {
            acc0 = _mm256_max_epu16(acc0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i)), mask));
            acc1 = _mm256_max_epu16(acc1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i + 16)), mask));
        }
        uint16_t t[16];
        _mm256_storeu_si256((__m256i *)t, _mm256_max_epu16(acc0, acc1));
        for (int k = 0; k < 16; k++) m = t[k] > m ? t[k] : m;
        for (; i < n; i++) m = (h[i] & 0x7FFFu) > m ? (h[i] & 0x7FFFu) : m;
        lim = dt == NB_BF16 ? 0x7F80u : 0x7C00u;
    }
    *nonfinite = m >= lim;
    if (m >= lim) return 0.0f;
    if (dt == NB_F32) {
        float f;
        memcpy(&f, &m, 4);
        return f;
    }
    return dt == NB_BF16 ? nb_bf16_to_f32((uint16_t)m) : nb_f16_to_f32((uint16_t)m);
}

#else /* not x86-64 with GNU C: no AVX2 path (the dispatcher never calls these) */

int nbq_avx2_quantize_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                           uint8_t *s) {
    (void)f; (void)x; (void)n; (void)a; (void)q; (void)s;
    return 1;
}

int nbq_avx2_fp8_row_next_bf16(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                               const uint16_t *next, uint32_t *next_max) {
    (void)x; (void)a; (void)q;
    if (next) {
        uint32_t m = 0;
        for (int64_t i = 0; i < n; i++) m = (uint32_t)(next[i] & 0x7FFF) > m ? (uint32_t)(next[i] & 0x7FFF) : m;
        *next_max = m;
    }
    return 1;
}

int nbq_avx2_fp8_table_ok(float sc, int32_t dd) {
    (void)sc; (void)dd;
    return 0;
}

#endif

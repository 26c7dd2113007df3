/* x86 SIMD helpers of the fast quantizer paths (fast_avx2*.c; kept apart for wider variants): the AVX2 element
 * kernels (E4M3 / E2M1 rounding by one float add, decoders, packing), the NVFP4 block-scale and MXFP8
 * scale-byte computations on 8 blocks at a time, the dtype roundings, and the scalar reference fallbacks
 * the BF16 kernel files (fast_avx2.c, fast_avx2_nvfp4.c, fast_avx512.c) call on their rare lanes: those
 * are quant/numerics.h's element arithmetic, the references' own. Include only from x86-64 GNU C
 * sources, inside their own #if. */
#ifndef NIBBLE_QUANT_FAST_X86_H
#define NIBBLE_QUANT_FAST_X86_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/fast_internal.h"

/* Bit-exactness needs every product and quotient rounded on its own: no contraction into FMA. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

#define NB_AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---- short NVFP4 rows ---------------------------------------------------------------------------- */

/* A BF16 row of nb (1-15) NVFP4 blocks as one 16-block group for the table kernels: xp[256] gets the row
 * then zero blocks, bp[16] the row's block amax then zeros when a has one; returns a's arguments for the
 * padded row. Zero blocks add nothing to a group's largest magnitude, and every branch a group can take
 * is exact, so the caller copies the row's nb blocks out of the group's output unchanged. */
static inline nb_qrow_args nbq_nv_pad_row(const uint16_t *x, int64_t nb, const nb_qrow_args *a, uint16_t *xp,
                                          float *bp) {
    memset(xp, 0, 256 * sizeof *xp);
    memcpy(xp, x, (size_t)nb * NB_NVFP4_BLOCK * sizeof *xp);
    nb_qrow_args t = *a;
    if (t.block_amax) {
        memset(bp, 0, 16 * sizeof *bp);
        memcpy(bp, a->block_amax, (size_t)nb * sizeof *bp);
        t.block_amax = bp;
    }
    return t;
}

/* ---- lane helpers ------------------------------------------------------------------------------ */

NB_AVX2 static inline __m256i i32(int v) { return _mm256_set1_epi32(v); }
NB_AVX2 static inline __m256 f32(float v) { return _mm256_set1_ps(v); }
NB_AVX2 static inline __m256 vabs(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

/* nb_f32_to_e4m3: NaN -> 0x7F, clamp to ±448, RNE on the E4M3 grid, sign from the sign bit (so -0 ->
 * 0x80). The rounding is one float add: a + M with M = 2^(max(e,-6)+20) (e = exponent of a) has an ulp
 * equal to the grid spacing of a's binade (2^-9 below 2^-6), so the hardware rounds a to the grid,
 * ties to even, and k = bits(a+M) - bits(M) counts grid steps: code = k + 8*(max(e,-6)+6). This is
 * the value c10's fp8e4m3fn_from_fp32_value computes (the tests sweep every bf16 pattern and more). */
NB_AVX2 static inline __m256i e4m3_enc_(__m256 x, const int nan_ok) {
    __m256 a = _mm256_min_ps(vabs(x), f32(448.0f));
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), i32(0x7F800000)), i32(121 << 23));
    __m256i m = _mm256_add_epi32(e, i32(20 << 23));
    __m256i k = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(m))), m);
    __m256i code = _mm256_add_epi32(k, _mm256_sub_epi32(_mm256_srli_epi32(m, 20), i32(8 * 141)));
    __m256i sign = _mm256_srli_epi32(_mm256_and_si256(_mm256_castps_si256(x), i32((int)0x80000000u)), 24);
    code = _mm256_or_si256(code, sign);
    if (!nan_ok) return code;
    return _mm256_blendv_epi8(code, i32(0x7F), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}

/* With NaN handling, and for lanes known to hold no NaN (finite inputs times finite scales). */
NB_AVX2 static inline __m256i e4m3_enc(__m256 x) { return e4m3_enc_(x, 1); }
NB_AVX2 static inline __m256i e4m3_enc_nn(__m256 x) { return e4m3_enc_(x, 0); }

/* nb_e4m3_to_f32 of one byte per int32 lane: normals by exponent rebias, subnormals m * 2^-9,
 * 0x7F/0xFF -> ±NaN (0x7FC00000 with the sign). */
NB_AVX2 static inline __m256 e4m3_dec(__m256i b) {
    __m256i mag = _mm256_and_si256(b, i32(0x7F));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, i32(0x80)), 24);
    __m256i nrm = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), i32(120 << 23));
    __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), f32(0x1p-9f)));
    __m256i r = _mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(i32(8), mag));
    r = _mm256_blendv_epi8(r, i32(0x7FC00000), _mm256_cmpeq_epi32(mag, i32(0x7F)));
    return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
}

/* nb_f32_to_e2m1 (ModelOpt _cast_fp4: RNE on {0,.5,1,1.5,2,3,4,6}, saturating, code 8 for v < 0).
 * E2M1 is a float format (bias 1, one mantissa bit, subnormal step 0.5), so the rounding is the same
 * one-add trick as e4m3_enc: M = 2^(max(e,0)+22), k = bits(a+M) - bits(M), code = k + 2*max(e,0);
 * |v| > 6 saturates to 6 first. A NaN quotient compares false everywhere in the reference: code 0. */
NB_AVX2 static inline __m256i e2m1_enc_(__m256 v, const int nan_ok) {
    __m256 a = _mm256_min_ps(vabs(v), f32(6.0f));
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), i32(0x7F800000)), i32(127 << 23));
    __m256i m = _mm256_add_epi32(e, i32(22 << 23));
    __m256i k = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(m))), m);
    __m256i code = _mm256_add_epi32(k, _mm256_sub_epi32(_mm256_srli_epi32(m, 22), i32(2 * 149)));
    __m256i neg = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ)), i32(8));
    code = _mm256_or_si256(code, neg);
    if (!nan_ok) return code;
    return _mm256_and_si256(code, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
}

NB_AVX2 static inline __m256i e2m1_enc(__m256 v) { return e2m1_enc_(v, 1); }

/* All 8 divisors finite and > 0: then x/p of finite x is never NaN. */
NB_AVX2 static inline int all_normal_divisors(__m256 p) {
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_cmp_ps(p, f32(INFINITY), _CMP_LT_OQ));
    return _mm256_movemask_ps(ok) == 0xFF;
}

/* nb_e2m1_deq[c]: code 8 (-0) is +0.0, so the negative table starts with +0. */
NB_AVX2 static inline __m256 e2m1_dec(__m256i c) {
    const __m256 pos = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 neg = _mm256_setr_ps(0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(pos, c), _mm256_permutevar8x32_ps(neg, c),
                            _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
}

/* 32 int32 lanes holding bytes -> 32 bytes in lane order. */
NB_AVX2 static inline __m256i pack_bytes32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
    __m256i a = _mm256_packus_epi32(c0, c1);
    __m256i b = _mm256_packus_epi32(c2, c3);
    __m256i p = _mm256_packus_epi16(a, b);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 E2M1 codes (int32 lanes) -> 16 bytes, even element in the low nibble (FORMATS §1.4). */
NB_AVX2 static inline __m128i pack_nibbles32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
    __m256i b = pack_bytes32(c0, c1, c2, c3);
    __m256i m = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x1001));   /* b[2j] + 16*b[2j+1] */
    __m256i p = _mm256_packus_epi16(m, m);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

/* 8 int32 lanes holding bytes -> 8 bytes. */
NB_AVX2 static inline void store_bytes8(uint8_t *dst, __m256i v) {
    __m256i p = _mm256_packus_epi32(v, v);
    p = _mm256_packus_epi16(p, p);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(p));
}

/* 8 bytes -> 8 int32 lanes. */
NB_AVX2 static inline __m256i load_bytes8(const uint8_t *src) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)src));
}

NB_AVX2 static inline float hmax(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* r[b] = max over the lanes of m[b], b = 0..7 (max is exact, so the order does not matter). */
NB_AVX2 static inline __m256 hmax8(const __m256 m[8]) {
    __m256 t0 = _mm256_max_ps(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));
    __m256 t1 = _mm256_max_ps(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));
    __m256 t2 = _mm256_max_ps(_mm256_unpacklo_ps(m[4], m[5]), _mm256_unpackhi_ps(m[4], m[5]));
    __m256 t3 = _mm256_max_ps(_mm256_unpacklo_ps(m[6], m[7]), _mm256_unpackhi_ps(m[6], m[7]));
    __m256 u0 = _mm256_max_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 u1 = _mm256_max_ps(_mm256_shuffle_ps(t2, t3, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(t2, t3, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_max_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

NB_AVX2 static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* ---- NVFP4 block scales (8 blocks per vector) -------------------------------------------------- */

/* _cast_per_block_scale_to_fp8: clamp to [2^-9, 448] with the operands ordered so a NaN stays NaN
 * (the reference's `v < lo` / `v > hi` tests are false for NaN), then the E4M3 cast. */
NB_AVX2 static inline __m256i scale_e4m3(__m256 v) {
    v = _mm256_max_ps(f32(0x1p-9f), v);
    v = _mm256_min_ps(f32(448.0f), v);
    return e4m3_enc(v);
}

NB_AVX2 static inline __m256 zero_to_one(__m256 v) {
    return _mm256_blendv_ps(v, f32(1.0f), _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ));
}

/* nbn_nvfp4_block_scale_dynamic: pbs = amax_b / f32(6*s2). */
NB_AVX2 static inline __m256i scale_dynamic(__m256 bam, float s2) {
    float d = nbn_mul(6.0f, s2);
    return scale_e4m3(zero_to_one(_mm256_div_ps(bam, f32(d))));
}

/* nbn_nvfp4_block_scale_static: r = f32(f32(pbs*norm) / f32(G/6)), pbs = amax_b/6. */
NB_AVX2 static inline __m256i scale_static(__m256 bam, float global_amax, float norm) {
    __m256 pbs = zero_to_one(_mm256_div_ps(bam, f32(6.0f)));
    float pbs_max = nbn_div(global_amax, 6.0f);
    __m256 r = _mm256_mul_ps(pbs, f32(norm));
    return scale_e4m3(_mm256_div_ps(r, f32(pbs_max)));
}

/* NVFP4 pass 1 over blocks [g0, g1) (g1 - g0 a multiple of 8): each block's scale byte (to s when
 * s is set) and divisor p = f32(float(byte) * s2) into pa[b - g0]. Scales first, for a whole chunk,
 * so the long scale chain (max, divide, E4M3 round trip) of one group overlaps the next group's
 * instead of stalling the element work. Returns 1 when every divisor is finite and > 0, so the
 * element pass can skip its NaN handling. */
NB_AVX2 static inline int nv_divisors(const float *x, int64_t g0, int64_t g1, const nb_qrow_args *a, float norm,
                                      uint8_t *s, float *pa) {
    const __m256 s2 = f32(a->scale);
    int normal = 1;
    for (int64_t g = g0; g < g1; g += 8) {
        const float *xg = x + g * NB_NVFP4_BLOCK;
        __m256i sb;
        if (a->block_amax) {
            sb = scale_static(_mm256_loadu_ps(a->block_amax + g), a->global_amax, norm);
        } else {
            __m256 m[8];
            for (int b = 0; b < 8; b++)
                m[b] = _mm256_max_ps(vabs(_mm256_loadu_ps(xg + 16 * b)), vabs(_mm256_loadu_ps(xg + 16 * b + 8)));
            sb = scale_dynamic(hmax8(m), a->scale);
        }
        __m256 p = _mm256_mul_ps(e4m3_dec(sb), s2);
        if (s) store_bytes8(s + g, sb);
        _mm256_storeu_ps(pa + (g - g0), p);
        normal &= all_normal_divisors(p);
    }
    return normal;
}

enum { NBQ_NV_CHUNK = 256 };   /* blocks per pass-1 chunk (4096 elements) */

/* The reference finishes the blocks past the last whole group (blocks are independent). */
static inline nb_qrow_args tail_args(const nb_qrow_args *a, int64_t blocks_done) {
    nb_qrow_args t = *a;
    if (t.block_amax) t.block_amax += blocks_done;
    return t;
}

/* ---- MXFP8 scale bytes ----------------------------------------------------------------------------- */

NB_AVX2 static inline float block32_absmax(const float *xb) {
    __m256 m0 = _mm256_max_ps(vabs(_mm256_loadu_ps(xb)), vabs(_mm256_loadu_ps(xb + 8)));
    __m256 m1 = _mm256_max_ps(vabs(_mm256_loadu_ps(xb + 16)), vabs(_mm256_loadu_ps(xb + 24)));
    return hmax(_mm256_max_ps(m0, m1));
}

/* The E8M0 codes of 8 blocks from their amax (lane b = block b): nbq_mx_scale_byte_fast in lanes for
 * the common case (descale / amax normal or zero); any other lane goes through the scalar function. */
NB_AVX2 static inline __m256i mx_codes8(__m256 bam, int ocp_floor, const uint32_t *tab) {
    __m256i code, special;
    if (ocp_floor) {
        __m256i u = _mm256_castps_si256(bam);
        __m256i zero = _mm256_cmpeq_epi32(u, _mm256_setzero_si256());
        code = _mm256_sub_epi32(_mm256_srli_epi32(u, 23), i32(8));           /* (E-127-8) + 127 */
        code = _mm256_min_epi32(_mm256_max_epi32(code, _mm256_setzero_si256()), i32(254));
        code = _mm256_andnot_si256(zero, code);
        special = _mm256_andnot_si256(zero, _mm256_cmpgt_epi32(i32(0x00800000), u));   /* subnormal amax */
    } else {
        __m256 d = _mm256_div_ps(bam, f32(448.0f));
        __m256i u = _mm256_castps_si256(d);
        __m256i zero = _mm256_cmpeq_epi32(u, _mm256_setzero_si256());
        __m256i idx = _mm256_srli_epi32(u, 23);                               /* k + 127 */
        __m256i thr = _mm256_i32gather_epi32((const int *)tab, _mm256_min_epi32(idx, i32(254)), 4);
        __m256i ge = _mm256_cmpeq_epi32(_mm256_max_epu32(u, thr), u);          /* u >= thr, unsigned */
        code = _mm256_sub_epi32(idx, ge);                                     /* e + 127 = k + 127 + (u >= thr) */
        code = _mm256_min_epi32(code, i32(254));
        code = _mm256_andnot_si256(zero, code);
        special = _mm256_andnot_si256(zero, _mm256_cmpgt_epi32(i32(0x00800000), u));   /* subnormal descale */
    }
    if (!_mm256_testz_si256(special, special)) {
        uint32_t c[8], sp[8];
        float am[8];
        _mm256_storeu_si256((__m256i *)c, code);
        _mm256_storeu_si256((__m256i *)sp, special);
        _mm256_storeu_ps(am, bam);
        for (int b = 0; b < 8; b++)
            if (sp[b]) c[b] = nbq_mx_scale_byte_fast(am[b], ocp_floor);
        code = _mm256_loadu_si256((const __m256i *)c);
    }
    return code;
}

/* 2^(127-code) per lane (code <= 254; 2^-127 is the subnormal 0x00400000). */
NB_AVX2 static inline __m256 mx_scale_factor(__m256i code) {
    __m256i bits = _mm256_slli_epi32(_mm256_sub_epi32(i32(254), code), 23);
    bits = _mm256_blendv_epi8(bits, i32(0x00400000), _mm256_cmpeq_epi32(code, i32(254)));
    return _mm256_castsi256_ps(bits);
}

/* MXFP8 pass 1 over blocks [g0, g1) (a multiple of 8 blocks of 32): the E8M0 bytes (to s when set),
 * the exact element factors 2^(127-code) into sfa and, when da is set, 2^(code-127) into da. */
NB_AVX2 static inline void mx_factors(const float *x, int64_t g0, int64_t g1, const nb_qrow_args *a, uint8_t *s,
                                      float *sfa, float *da) {
    const uint32_t *tab = nbq_mx_ceil_table();
    for (int64_t g = g0; g < g1; g += 8) {
        const float *xg = x + g * NB_MXFP8_BLOCK;
        __m256 m[8];
        for (int b = 0; b < 8; b++) {
            const float *xb = xg + b * NB_MXFP8_BLOCK;
            m[b] = _mm256_max_ps(_mm256_max_ps(vabs(_mm256_loadu_ps(xb)), vabs(_mm256_loadu_ps(xb + 8))),
                                 _mm256_max_ps(vabs(_mm256_loadu_ps(xb + 16)), vabs(_mm256_loadu_ps(xb + 24))));
        }
        __m256i code = mx_codes8(hmax8(m), a->mx_floor, tab);
        if (s) store_bytes8(s + g, code);
        _mm256_storeu_ps(sfa + (g - g0), mx_scale_factor(code));
        if (da) {
            /* 2^(code-127): exponent field = code for code >= 1; code 0 -> 2^-127 */
            __m256i dbits = _mm256_blendv_epi8(_mm256_slli_epi32(code, 23), i32(0x00400000),
                                               _mm256_cmpeq_epi32(code, _mm256_setzero_si256()));
            _mm256_storeu_si256((__m256i *)(da + (g - g0)), dbits);
        }
    }
}

enum { NBQ_MX_CHUNK = 128 };   /* blocks per pass-1 chunk (4096 elements) */

/* ---- FP8 ------------------------------------------------------------------------------------------- */

/* bf16(v) back in f32: (u + 0x7FFF + lsb) >> 16, NaN -> 0x7FC0 (nb_f32_to_bf16). */
NB_AVX2 static inline __m256 round_bf16_(__m256 v, const int nan_ok) {
    __m256i u = _mm256_castps_si256(v);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(i32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), i32(1))));
    r = _mm256_and_si256(r, i32((int)0xFFFF0000u));
    if (nan_ok) r = _mm256_blendv_epi8(r, i32(0x7FC00000), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    return _mm256_castsi256_ps(r);
}

NB_AVX2 static inline __m256 round_bf16(__m256 v) { return round_bf16_(v, 1); }

/* f16(v) back in f32: F16C's RNE conversion (overflow -> inf, subnormals rounded), as nb_f32_to_f16. */
NB_AVX2 static inline __m256 round_f16(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* A finite scale > 0 keeps x/s of finite x out of NaN. */
static inline int normal_scale(float s) { return s > 0.0f && s < INFINITY; }

/* ---- scalar fallbacks of the BF16 kernels (fast_avx2*.c, fast_avx512.c) --------------------------- */

/* Reference FP8 codes of bf16 elements (fp8.c's arithmetic on exact bf16 -> f32 values). */
static inline void fp8_ref_bf16(const uint16_t *x, int64_t n, float sc, int32_t dd, uint8_t *q) {
    for (int64_t i = 0; i < n; i++) q[i] = nbn_fp8_code(nbn_bf16_to_f32(x[i]), sc, dd);
}

/* The lanes of a 32-element step set in `lanes`, one by one by the reference (the others keep the
 * vector's codes): tiny quotients are rare, but a step holding one would otherwise pay 32 reference
 * elements, which made the reference ~10% of FP8's time on normally distributed weights. */
static inline void fp8_ref_lanes(const uint16_t *x, uint32_t lanes, float sc, int32_t dd, uint8_t *q) {
    for (; lanes; lanes &= lanes - 1) {
        int b = __builtin_ctz(lanes);
        fp8_ref_bf16(x + b, 1, sc, dd, q + b);
    }
}

/* mxfp8.c's element on the lanes of a block set in `lanes` (the others keep the vector's codes):
 * x * 2^(127-code) in f32, clamp, RNE. */
static inline void mx_ref_lanes(const uint16_t *x, uint32_t lanes, uint8_t code, uint8_t *q) {
    float sf = nbn_pow2(127 - (int)code);
    for (; lanes; lanes &= lanes - 1) {
        int i = __builtin_ctz(lanes);
        q[i] = nbn_mxfp8_code(nbn_bf16_to_f32(x[i]), sf);
    }
}

/* One NVFP4 block (16 elements) with divisor p, the reference's arithmetic (nvfp4.c). */
static inline void nv_block_ref(const uint16_t *x, float p, uint8_t *q) {
    for (int j = 0; j < 8; j++)
        q[j] = (uint8_t)(nbn_nvfp4_code(nbn_bf16_to_f32(x[2 * j]), p) | (nbn_nvfp4_code(nbn_bf16_to_f32(x[2 * j + 1]), p) << 4));
}

/* Whether the pick kernels can take a's row: the threshold table the driver builds for a->scale holds
 * both candidates' codes only when that is the pick's own s2, G / 1536. */
static inline int nv46_table_fits(const nb_qrow_args *a) {
    const float s46 = nbn_nvfp4_scale2(a->global_amax, 256.0f);
    return memcmp(&s46, &a->scale, sizeof s46) == 0;
}

/* The blocks in mask (bit b: block b) of a 16-block BF16 group, four_over_six with the per-block pick
 * from the data, by the reference row (its own block max and pick): the pick kernels' rare blocks.
 * Not inline, so `unused` for the includers without a pick kernel (fast_avx2.c). */
__attribute__((noinline, unused)) static void nv46_ref_blocks(const uint16_t *xg, unsigned mask, const nb_qrow_args *a,
                                                              uint8_t *qg, uint8_t *sg) {
    nb_qrow_args t = *a;
    t.block_amax = NULL;
    for (int b = 0; b < 16; b++) {
        if (!((mask >> b) & 1)) continue;
        float xf[NB_NVFP4_BLOCK];
        for (int k = 0; k < NB_NVFP4_BLOCK; k++) xf[k] = nbn_bf16_to_f32(xg[b * NB_NVFP4_BLOCK + k]);
        nb_nvfp4_46_quantize_row_ref(xf, NB_NVFP4_BLOCK, &t, qg + 8 * b, sg + b);
    }
}

#endif

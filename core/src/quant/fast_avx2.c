/* AVX2 row functions for every quantization format, bit-equal to the scalar references in
 * nvfp4.c / mxfp8.c / fp8.c: the same f32 operations (IEEE division, products, no FMA contraction),
 * in the same order, with the same clamps and the same round-to-nearest-even bit tricks, 8 lanes
 * at a time. Each function carries target("avx2,fma,f16c") so the rest of libnibble stays baseline
 * x86-64; fast_dispatch.c installs these only when the CPU has them. */
#include <math.h>
#include <string.h>

#include "fast_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* Bit-exactness needs every product and quotient rounded on its own: no contraction into FMA. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

#define NB_AVX2 __attribute__((target("avx2,fma,f16c")))

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
NB_AVX2 static inline __m256i e2m1_enc_nn(__m256 v) { return e2m1_enc_(v, 0); }

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

/* nb_nvfp4_block_scale_dynamic: pbs = amax_b / f32(6*s2). */
NB_AVX2 static inline __m256i scale_dynamic(__m256 bam, float s2) {
    float d = 6.0f * s2;
    return scale_e4m3(zero_to_one(_mm256_div_ps(bam, f32(d))));
}

/* nb_nvfp4_block_scale_static: r = f32(f32(pbs*norm) / f32(G/6)), pbs = amax_b/6. */
NB_AVX2 static inline __m256i scale_static(__m256 bam, float global_amax, float norm) {
    __m256 pbs = zero_to_one(_mm256_div_ps(bam, f32(6.0f)));
    float pbs_max = global_amax / 6.0f;
    __m256 r = _mm256_mul_ps(pbs, f32(norm));
    return scale_e4m3(_mm256_div_ps(r, f32(pbs_max)));
}

/* ---- NVFP4 rows -------------------------------------------------------------------------------- */

/* The codes (or fake-quant values) of 8 blocks with divisors p (lane b = block b). */
NB_AVX2 __attribute__((always_inline)) static inline void nv_blocks8(const float *xg, __m256 p, uint8_t *qg, float *yg,
                                                                     const int nan_ok) {
    for (int b = 0; b < 8; b += 2) {
        __m256 p0 = _mm256_permutevar8x32_ps(p, i32(b)), p1 = _mm256_permutevar8x32_ps(p, i32(b + 1));
        const float *xb = xg + 16 * b;
        __m256i c0 = e2m1_enc_(_mm256_div_ps(_mm256_loadu_ps(xb), p0), nan_ok);
        __m256i c1 = e2m1_enc_(_mm256_div_ps(_mm256_loadu_ps(xb + 8), p0), nan_ok);
        __m256i c2 = e2m1_enc_(_mm256_div_ps(_mm256_loadu_ps(xb + 16), p1), nan_ok);
        __m256i c3 = e2m1_enc_(_mm256_div_ps(_mm256_loadu_ps(xb + 24), p1), nan_ok);
        if (yg) {
            float *yb = yg + b * NB_NVFP4_BLOCK;
            _mm256_storeu_ps(yb, _mm256_mul_ps(e2m1_dec(c0), p0));
            _mm256_storeu_ps(yb + 8, _mm256_mul_ps(e2m1_dec(c1), p0));
            _mm256_storeu_ps(yb + 16, _mm256_mul_ps(e2m1_dec(c2), p1));
            _mm256_storeu_ps(yb + 24, _mm256_mul_ps(e2m1_dec(c3), p1));
        } else {
            _mm_storeu_si128((__m128i *)(qg + b * 8), pack_nibbles32(c0, c1, c2, c3));
        }
    }
}

/* Groups of 8 blocks: their scales as one vector, then each block's 16 quotients x / p with p
 * broadcast from its lane. Static rows (block_amax) use the calibrated amax; the others the data's. */
NB_AVX2 static int64_t nv_groups(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float *y,
                                 float norm) {
    int64_t nb = n / NB_NVFP4_BLOCK, g;
    const __m256 s2 = f32(a->scale);
    for (g = 0; g + 8 <= nb; g += 8) {
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
        int normal = all_normal_divisors(p);
        if (y && normal) nv_blocks8(xg, p, NULL, y + g * NB_NVFP4_BLOCK, 0);
        else if (y) nv_blocks8(xg, p, NULL, y + g * NB_NVFP4_BLOCK, 1);
        else if (normal) nv_blocks8(xg, p, q + g * 8, NULL, 0);
        else nv_blocks8(xg, p, q + g * 8, NULL, 1);
    }
    return g;   /* blocks done */
}

/* The reference finishes the blocks past the last whole group (blocks are independent). */
static nb_qrow_args tail_args(const nb_qrow_args *a, int64_t blocks_done) {
    nb_qrow_args t = *a;
    if (t.block_amax) t.block_amax += blocks_done;
    return t;
}

NB_AVX2 void nbq_avx2_nvfp4_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    int64_t g = nv_groups(x, n, a, q, s, NULL, 448.0f);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_quantize_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, q + g * 8, s + g);
    }
}

NB_AVX2 void nbq_avx2_nvfp4_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    int64_t g = nv_groups(x, n, a, NULL, NULL, y, 448.0f);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_fake_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, y + g * NB_NVFP4_BLOCK);
    }
}

/* Loaders' dequant: e2m1 value * f32(float(scale byte) * s2), a block per step. */
NB_AVX2 void nbq_avx2_nvfp4_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a,
                                           float *y) {
    int64_t nb = n / NB_NVFP4_BLOCK, b = 0;
    const __m256 s2 = f32(a->scale);
    for (; b + 8 <= nb; b += 8) {
        __m256 p = _mm256_mul_ps(e4m3_dec(load_bytes8(s + b)), s2);
        for (int k = 0; k < 8; k++) {
            __m256 pk = _mm256_permutevar8x32_ps(p, i32(k));
            __m128i bytes = _mm_loadl_epi64((const __m128i *)(q + (b + k) * 8));
            __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
            __m128i codes = _mm_unpacklo_epi8(lo, hi);   /* c0 c1 ... c15 */
            __m256i c0 = _mm256_cvtepu8_epi32(codes), c1 = _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8));
            float *yb = y + (b + k) * NB_NVFP4_BLOCK;
            _mm256_storeu_ps(yb, _mm256_mul_ps(e2m1_dec(c0), pk));
            _mm256_storeu_ps(yb + 8, _mm256_mul_ps(e2m1_dec(c1), pk));
        }
    }
    if (b < nb) nb_nvfp4_dequantize_row_ref(q + b * 8, s + b, n - b * NB_NVFP4_BLOCK, a, y + b * NB_NVFP4_BLOCK);
}

/* four_over_six without calibrated block amax: each block tries M=6 and M=4 (block max x1.5) and
 * keeps M=4 iff its squared error is strictly lower. The error is summed in double in element
 * order, so lanes here are blocks (8 blocks transposed) and the sum runs over the 16 elements
 * exactly as the reference's loop does. */
NB_AVX2 static int64_t nv46_groups(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float *y) {
    int64_t nb = n / NB_NVFP4_BLOCK, g;
    const float s46 = nb_nvfp4_scale2(a->global_amax, 256.0f);
    uint32_t ub, us;
    memcpy(&ub, &s46, 4);
    memcpy(&us, &a->scale, 4);
    const int same_p = ub == us;   /* the driver's case: the chosen candidate's codes are the answer */
    for (g = 0; g + 8 <= nb; g += 8) {
        const float *xg = x + g * NB_NVFP4_BLOCK;
        __m256 X[16];
        for (int b = 0; b < 8; b++) {
            X[b] = _mm256_loadu_ps(xg + 16 * b);
            X[8 + b] = _mm256_loadu_ps(xg + 16 * b + 8);
        }
        transpose8(X);
        transpose8(X + 8);   /* X[i] lane b = element i of block g+b */
        __m256 bam = vabs(X[0]);
        for (int i = 1; i < 16; i++) bam = _mm256_max_ps(bam, vabs(X[i]));
        __m256i sb6 = scale_static(bam, a->global_amax, 256.0f);
        __m256i sb4 = scale_static(_mm256_mul_ps(bam, f32(1.5f)), a->global_amax, 256.0f);
        __m256 p6 = _mm256_mul_ps(e4m3_dec(sb6), f32(s46)), p4 = _mm256_mul_ps(e4m3_dec(sb4), f32(s46));
        __m256i C4[16], C6[16];
        __m256d e4lo = _mm256_setzero_pd(), e4hi = _mm256_setzero_pd();
        __m256d e6lo = _mm256_setzero_pd(), e6hi = _mm256_setzero_pd();
        for (int i = 0; i < 16; i++) {
            C4[i] = e2m1_enc(_mm256_div_ps(X[i], p4));
            __m256 e = _mm256_sub_ps(X[i], _mm256_mul_ps(e2m1_dec(C4[i]), p4));
            e = _mm256_mul_ps(e, e);
            e4lo = _mm256_add_pd(e4lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            e4hi = _mm256_add_pd(e4hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
            C6[i] = e2m1_enc(_mm256_div_ps(X[i], p6));
            e = _mm256_sub_ps(X[i], _mm256_mul_ps(e2m1_dec(C6[i]), p6));
            e = _mm256_mul_ps(e, e);
            e6lo = _mm256_add_pd(e6lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            e6hi = _mm256_add_pd(e6hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
        /* 64-bit compare masks -> 32-bit lanes */
        const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        __m128 mlo = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_cmp_pd(e4lo, e6lo, _CMP_LT_OQ)), even));
        __m128 mhi = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_cmp_pd(e4hi, e6hi, _CMP_LT_OQ)), even));
        __m256i pick = _mm256_castps_si256(_mm256_insertf128_ps(_mm256_castps128_ps256(mlo), mhi, 1));
        __m256i sb = _mm256_blendv_epi8(sb6, sb4, pick);
        __m256 p = _mm256_mul_ps(e4m3_dec(sb), f32(a->scale));
        __m256i C[16];
        for (int i = 0; i < 16; i++)
            C[i] = same_p ? _mm256_blendv_epi8(C6[i], C4[i], pick) : e2m1_enc(_mm256_div_ps(X[i], p));
        if (s) store_bytes8(s + g, sb);
        if (y) {
            __m256 Y[16];
            for (int i = 0; i < 16; i++) Y[i] = _mm256_mul_ps(e2m1_dec(C[i]), p);
            transpose8(Y);
            transpose8(Y + 8);
            float *yg = y + g * NB_NVFP4_BLOCK;
            for (int b = 0; b < 8; b++) {
                _mm256_storeu_ps(yg + 16 * b, Y[b]);
                _mm256_storeu_ps(yg + 16 * b + 8, Y[8 + b]);
            }
        } else {
            __m256 R[8];
            for (int j = 0; j < 8; j++)
                R[j] = _mm256_castsi256_ps(_mm256_or_si256(C[2 * j], _mm256_slli_epi32(C[2 * j + 1], 4)));
            transpose8(R);   /* R[b] lane j = packed byte j of block g+b */
            uint8_t *qg = q + g * 8;
            _mm256_storeu_si256((__m256i *)qg, pack_bytes32(_mm256_castps_si256(R[0]), _mm256_castps_si256(R[1]),
                                                            _mm256_castps_si256(R[2]), _mm256_castps_si256(R[3])));
            _mm256_storeu_si256((__m256i *)(qg + 32), pack_bytes32(_mm256_castps_si256(R[4]), _mm256_castps_si256(R[5]),
                                                                   _mm256_castps_si256(R[6]), _mm256_castps_si256(R[7])));
        }
    }
    return g;
}

NB_AVX2 void nbq_avx2_nvfp4_46_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    int64_t g = a->block_amax ? nv_groups(x, n, a, q, s, NULL, 256.0f) : nv46_groups(x, n, a, q, s, NULL);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_46_quantize_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, q + g * 8, s + g);
    }
}

NB_AVX2 void nbq_avx2_nvfp4_46_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    int64_t g = a->block_amax ? nv_groups(x, n, a, NULL, NULL, y, 256.0f) : nv46_groups(x, n, a, NULL, NULL, y);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_46_fake_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, y + g * NB_NVFP4_BLOCK);
    }
}

/* ---- MXFP8 --------------------------------------------------------------------------------------- */

/* 2^(127-code) and 2^(code-127) as exact f32 (ldexpf of the reference; 2^-127 is subnormal, 2^128 inf). */
static inline float pow2_f32(int e) {
    uint32_t u = e >= -126 ? (uint32_t)(e + 127) << 23 : (e == -127 ? 0x00400000u : 0u);
    if (e > 127) u = 0x7F800000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

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

NB_AVX2 void nbq_avx2_mxfp8_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    const uint32_t *tab = nbq_mx_ceil_table();
    int64_t nb = n / NB_MXFP8_BLOCK, g = 0;
    for (; g + 8 <= nb; g += 8) {
        const float *xg = x + g * NB_MXFP8_BLOCK;
        __m256 m[8];
        for (int b = 0; b < 8; b++) {
            const float *xb = xg + b * NB_MXFP8_BLOCK;
            m[b] = _mm256_max_ps(_mm256_max_ps(vabs(_mm256_loadu_ps(xb)), vabs(_mm256_loadu_ps(xb + 8))),
                                 _mm256_max_ps(vabs(_mm256_loadu_ps(xb + 16)), vabs(_mm256_loadu_ps(xb + 24))));
        }
        __m256i code = mx_codes8(hmax8(m), a->mx_floor, tab);
        __m256 sf = mx_scale_factor(code);
        store_bytes8(s + g, code);
        for (int b = 0; b < 8; b++) {
            const float *xb = xg + b * NB_MXFP8_BLOCK;
            __m256 f = _mm256_permutevar8x32_ps(sf, i32(b));
            __m256i r = pack_bytes32(e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb), f)),
                                     e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), f)),
                                     e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), f)),
                                     e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), f)));
            _mm256_storeu_si256((__m256i *)(q + (g + b) * NB_MXFP8_BLOCK), r);
        }
    }
    for (; g < nb; g++) {
        const float *xb = x + g * NB_MXFP8_BLOCK;
        uint8_t code = nbq_mx_scale_byte_fast(block32_absmax(xb), a->mx_floor);
        s[g] = code;
        __m256 sf = f32(pow2_f32(127 - (int)code));
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
        __m256 d = f32(pow2_f32((int)s[b] - 127));
        const uint8_t *qb = q + b * NB_MXFP8_BLOCK;
        float *yb = y + b * NB_MXFP8_BLOCK;
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(yb + 8 * k, _mm256_mul_ps(e4m3_dec(load_bytes8(qb + 8 * k)), d));
    }
}

NB_AVX2 void nbq_avx2_mxfp8_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    const uint32_t *tab = nbq_mx_ceil_table();
    int64_t nb = n / NB_MXFP8_BLOCK, g = 0;
    for (; g + 8 <= nb; g += 8) {
        const float *xg = x + g * NB_MXFP8_BLOCK;
        __m256 m[8];
        for (int b = 0; b < 8; b++) {
            const float *xb = xg + b * NB_MXFP8_BLOCK;
            m[b] = _mm256_max_ps(_mm256_max_ps(vabs(_mm256_loadu_ps(xb)), vabs(_mm256_loadu_ps(xb + 8))),
                                 _mm256_max_ps(vabs(_mm256_loadu_ps(xb + 16)), vabs(_mm256_loadu_ps(xb + 24))));
        }
        __m256i code = mx_codes8(hmax8(m), a->mx_floor, tab);
        __m256 sf = mx_scale_factor(code);
        /* 2^(code-127): exponent field = code for code >= 1; code 0 -> 2^-127 */
        __m256i dbits = _mm256_blendv_epi8(_mm256_slli_epi32(code, 23), i32(0x00400000),
                                           _mm256_cmpeq_epi32(code, _mm256_setzero_si256()));
        __m256 dv = _mm256_castsi256_ps(dbits);
        for (int b = 0; b < 8; b++) {
            const float *xb = xg + b * NB_MXFP8_BLOCK;
            float *yb = y + (g + b) * NB_MXFP8_BLOCK;
            __m256 f = _mm256_permutevar8x32_ps(sf, i32(b)), d = _mm256_permutevar8x32_ps(dv, i32(b));
            for (int k = 0; k < 4; k++) {
                __m256i c = e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), f));
                _mm256_storeu_ps(yb + 8 * k, _mm256_mul_ps(e4m3_dec(c), d));
            }
        }
    }
    for (; g < nb; g++) {
        const float *xb = x + g * NB_MXFP8_BLOCK;
        uint8_t code = nbq_mx_scale_byte_fast(block32_absmax(xb), a->mx_floor);
        __m256 sf = f32(pow2_f32(127 - (int)code)), d = f32(pow2_f32((int)code - 127));
        float *yb = y + g * NB_MXFP8_BLOCK;
        for (int k = 0; k < 4; k++) {
            __m256i c = e4m3_enc_nn(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), sf));
            _mm256_storeu_ps(yb + 8 * k, _mm256_mul_ps(e4m3_dec(c), d));
        }
    }
}

/* ---- FP8 per tensor / per row ---------------------------------------------------------------------- */

/* bf16(v) back in f32: (u + 0x7FFF + lsb) >> 16, NaN -> 0x7FC0 (nb_f32_to_bf16). */
NB_AVX2 static inline __m256 round_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(i32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), i32(1))));
    r = _mm256_and_si256(r, i32((int)0xFFFF0000u));
    r = _mm256_blendv_epi8(r, i32(0x7FC00000), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    return _mm256_castsi256_ps(r);
}

/* f16(v) back in f32: F16C's RNE conversion (overflow -> inf, subnormals rounded), as nb_f32_to_f16. */
NB_AVX2 static inline __m256 round_f16(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* w / s, rounded to the model dtype for ModelOpt's per-tensor quirk (fp8.c `scaled`). */
NB_AVX2 static inline __m256 fp8_scaled(const float *x, __m256 s, int32_t div_dtype) {
    __m256 v = _mm256_div_ps(_mm256_loadu_ps(x), s);
    if (div_dtype == NB_BF16) v = round_bf16(v);
    else if (div_dtype == NB_F16) v = round_f16(v);
    return v;
}

NB_AVX2 static inline void fp8_q32(const float *x, __m256 sc, int32_t dd, uint8_t *q, const int nan_ok) {
    __m256i r = pack_bytes32(e4m3_enc_(fp8_scaled(x, sc, dd), nan_ok), e4m3_enc_(fp8_scaled(x + 8, sc, dd), nan_ok),
                             e4m3_enc_(fp8_scaled(x + 16, sc, dd), nan_ok), e4m3_enc_(fp8_scaled(x + 24, sc, dd), nan_ok));
    _mm256_storeu_si256((__m256i *)q, r);
}

/* A finite scale > 0 keeps x/s of finite x out of NaN. */
static inline int normal_scale(float s) { return s > 0.0f && s < INFINITY; }

NB_AVX2 void nbq_avx2_fp8_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    const __m256 sc = f32(a->scale);
    const int32_t dd = a->div_dtype;
    int64_t i = 0;
    if (normal_scale(a->scale))
        for (; i + 32 <= n; i += 32) fp8_q32(x + i, sc, dd, q + i, 0);
    else
        for (; i + 32 <= n; i += 32) fp8_q32(x + i, sc, dd, q + i, 1);
    if (i < n) nb_fp8_quantize_row_ref(x + i, n - i, a, q + i, s);
}

NB_AVX2 void nbq_avx2_fp8_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y) {
    const __m256 sc = f32(a->scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(e4m3_dec(load_bytes8(q + i)), sc));
    if (i < n) nb_fp8_dequantize_row_ref(q + i, s, n - i, a, y + i);
}

NB_AVX2 void nbq_avx2_fp8_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    const __m256 sc = f32(a->scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(e4m3_dec(e4m3_enc(fp8_scaled(x + i, sc, a->div_dtype))), sc));
    if (i < n) nb_fp8_fake_row_ref(x + i, n - i, a, y + i);
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

NB_AVX2 void nbq_avx2_load_f32(const void *src, nb_dtype dt, int64_t n, float *out) {
    int64_t i = 0;
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
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(h + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
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

int nbq_avx2_unavailable_ = 0;

#endif

/* AVX2 NVFP4 and four_over_six kernels, bit-equal to nvfp4.c's reference rows (same f32 operations in the same
 * order, no FMA contraction; target("avx2,fma,f16c") per function): the f32 rows with the per-block pick, and
 * nb_quantize's BF16 kernel by the threshold table. Lane helpers: fast_x86.h; MXFP8 / FP8: fast_avx2.c. */
#include <math.h>
#include <string.h>

#include "cpu/fast_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "cpu/fast_x86.h"

/* ---- NVFP4 rows -------------------------------------------------------------------------------- */

/* Pass 2: blocks [0, nblk) of xg with divisors pa, codes packed into qg or fake-quant values into yg. */
NB_AVX2 __attribute__((always_inline)) static inline void nv_blocks(const float *xg, int64_t nblk, const float *pa,
                                                                    uint8_t *qg, float *yg, const int nan_ok) {
    for (int64_t b = 0; b < nblk; b += 2) {
        __m256 p0 = _mm256_broadcast_ss(pa + b), p1 = _mm256_broadcast_ss(pa + b + 1);
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

/* Blocks [g0, g1) (whole groups of 8): pass 1 the scales (static rows from the calibrated block
 * amax, the others from the data), pass 2 each block's 16 quotients x / p. */
NB_AVX2 static inline void nv_chunk(const float *x, int64_t g0, int64_t g1, const nb_qrow_args *a, uint8_t *q,
                                    uint8_t *s, float *y, float norm, float *pa) {
    int normal = nv_divisors(x, g0, g1, a, norm, s, pa);
    const float *xg = x + g0 * NB_NVFP4_BLOCK;
    if (y && normal) nv_blocks(xg, g1 - g0, pa, NULL, y + g0 * NB_NVFP4_BLOCK, 0);
    else if (y) nv_blocks(xg, g1 - g0, pa, NULL, y + g0 * NB_NVFP4_BLOCK, 1);
    else if (normal) nv_blocks(xg, g1 - g0, pa, q + g0 * 8, NULL, 0);
    else nv_blocks(xg, g1 - g0, pa, q + g0 * 8, NULL, 1);
}

/* Every block of a row of at least 8 blocks (else none), in chunks of whole groups of 8; a row that is
 * not whole groups ends with the group of its last 8 blocks, overlapping the one before (a block's
 * bytes or values depend only on its elements, its block amax and the per-tensor values: the blocks
 * done twice get the same ones, and 1-7 leftover blocks cost one group instead of the reference).
 * Returns the blocks done. */
NB_AVX2 static int64_t nv_groups(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float *y,
                                 float norm) {
    const int64_t nblk = n / NB_NVFP4_BLOCK, nb = nblk & ~(int64_t)7;
    if (nb == 0) return 0;
    float pa[NBQ_NV_CHUNK];
    for (int64_t g0 = 0; g0 < nb; g0 += NBQ_NV_CHUNK) nv_chunk(x, g0, g0 + NBQ_NV_CHUNK < nb ? g0 + NBQ_NV_CHUNK : nb, a, q, s, y, norm, pa);
    if (nb < nblk) nv_chunk(x, nblk - 8, nblk, a, q, s, y, norm, pa);
    return nblk;
}

NB_AVX2 static int64_t nv_row_groups(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float *y,
                                     float norm, int pick);

NB_AVX2 void nbq_avx2_nvfp4_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    int64_t g = nv_row_groups(x, n, a, q, s, NULL, 448.0f, 0);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_quantize_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, q + g * 8, s + g);
    }
}

NB_AVX2 void nbq_avx2_nvfp4_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    int64_t g = nv_row_groups(x, n, a, NULL, NULL, y, 448.0f, 0);
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
    /* 8 blocks a step, the last step ending at the row's last block (a block's values depend only on
     * its bytes: the blocks done twice get the same values) */
    for (; b < nb && nb >= 8; b += 8) {
        if (b + 8 > nb) b = nb - 8;
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
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb < 8) return 0;
    const float s46 = nb_nvfp4_scale2(a->global_amax, 256.0f);
    uint32_t ub, us;
    memcpy(&ub, &s46, 4);
    memcpy(&us, &a->scale, 4);
    const int same_p = ub == us;   /* the driver's case: the chosen candidate's codes are the answer */
    /* groups of 8 blocks, the last one ending at the row's last block (overlapping, as nv_groups) */
    for (int64_t g0 = 0; g0 < nb; g0 += 8) {
        const int64_t g = g0 + 8 <= nb ? g0 : nb - 8;
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
    return nb;
}

/* The blocks of a row by nv_groups (pick 0; norm 448, or 256 for static four_over_six) or nv46_groups
 * (pick 1); returns the blocks done. A row of 1-7 blocks (stories260K's are 4) runs one group on a copy
 * padded with zero blocks (block amax 0 when static), of which only the row's blocks are copied out.
 * Every branch is exact, so the padding can only cost time (a padded divisor that is not normal takes
 * the chunk to nv_blocks' NaN-safe variant, as it would in a longer row); the per-block pick sees equal
 * errors on a zero block. 4096x64 BF16 rows on the "avx2" path (these f32 rows): 2.2 -> 0.43 ms. */
NB_AVX2 static int64_t nv_row_groups(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s, float *y,
                                     float norm, int pick) {
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb == 0 || nb >= 8) return pick ? nv46_groups(x, n, a, q, s, y) : nv_groups(x, n, a, q, s, y, norm);
    float xp[128], yp[128], bp[8];
    uint8_t qp[64], sp[8];
    memset(xp, 0, sizeof xp);
    memcpy(xp, x, (size_t)nb * NB_NVFP4_BLOCK * sizeof *xp);
    nb_qrow_args t = *a;
    if (t.block_amax) {
        memset(bp, 0, sizeof bp);
        memcpy(bp, a->block_amax, (size_t)nb * sizeof *bp);
        t.block_amax = bp;
    }
    if (pick) nv46_groups(xp, 128, &t, q ? qp : NULL, s ? sp : NULL, y ? yp : NULL);
    else nv_groups(xp, 128, &t, q ? qp : NULL, s ? sp : NULL, y ? yp : NULL, norm);
    if (q) memcpy(q, qp, (size_t)nb * 8);
    if (s) memcpy(s, sp, (size_t)nb);
    if (y) memcpy(y, yp, (size_t)nb * NB_NVFP4_BLOCK * sizeof *y);
    return nb;
}

NB_AVX2 void nbq_avx2_nvfp4_46_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s) {
    int64_t g = nv_row_groups(x, n, a, q, s, NULL, 256.0f, !a->block_amax);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_46_quantize_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, q + g * 8, s + g);
    }
}

NB_AVX2 void nbq_avx2_nvfp4_46_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y) {
    int64_t g = nv_row_groups(x, n, a, NULL, NULL, y, 256.0f, !a->block_amax);
    if (g * NB_NVFP4_BLOCK < n) {
        nb_qrow_args t = tail_args(a, g);
        nb_nvfp4_46_fake_row_ref(x + g * NB_NVFP4_BLOCK, n - g * NB_NVFP4_BLOCK, &t, y + g * NB_NVFP4_BLOCK);
    }
}

/* ---- NVFP4 from BF16 rows by the threshold table ------------------------------------------------- */

/* nbq_nv_table (fast_internal.h) gives an element's E2M1 code as the number of thresholds its bf16
 * magnitude passes. A ymm holds one 16-element block, and the block's threshold row (T_j - 1, twice)
 * already sits in both 128-bit lanes, so in-lane VPSHUFBs pick every lane's threshold; a binary
 * search over the monotone thresholds (T_3, then T_1 / T_5, then T_0 / T_2 / T_4 / T_6) needs three
 * compares where counting against all seven needs seven (and seven shuffles): 0.19 against 0.27
 * ns/element on one thread (32x4096 in L2). Blocks whose scale byte is outside the table's run take
 * the reference. */

/* Index words for VPSHUFB: word j of a 16-byte lane is bytes 2j, 2j+1. */
#define NV_W(j) (0x0100 + 0x0202 * (j))

/* E2M1 magnitude codes (16-bit lanes, 0..7) of the block at xb with threshold row `row`. The search's
 * offsets live in both bytes of a word, 8*b3 + 4*b2 (b3, b2: T_3, T_{1|5} passed), so the word index
 * of the last threshold is NV_W(0) + off, and off's high byte >> 1 is 4*b3 + 2*b2. With `track`, *vm
 * collects the magnitudes (static rows: their scales do not look at the data). */
NB_AVX2 __attribute__((always_inline)) static inline __m256i nv_codes16(const uint16_t *xb, const int16_t *row,
                                                                         __m256i *vm, const int track) {
    const __m256i mag = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)xb), _mm256_set1_epi16(0x7FFF));
    if (track) *vm = _mm256_max_epu16(*vm, mag);
    const __m256i R = _mm256_loadu_si256((const __m256i *)row);
    const __m256i m3 = _mm256_cmpgt_epi16(mag, _mm256_shuffle_epi8(R, _mm256_set1_epi16(NV_W(3))));
    const __m256i o3 = _mm256_and_si256(m3, _mm256_set1_epi16(0x0808));
    const __m256i m2 = _mm256_cmpgt_epi16(mag, _mm256_shuffle_epi8(R, _mm256_add_epi16(o3, _mm256_set1_epi16(NV_W(1)))));
    const __m256i off = _mm256_add_epi16(o3, _mm256_and_si256(m2, _mm256_set1_epi16(0x0404)));
    const __m256i m1 = _mm256_cmpgt_epi16(mag, _mm256_shuffle_epi8(R, _mm256_add_epi16(off, _mm256_set1_epi16(NV_W(0)))));
    return _mm256_sub_epi16(_mm256_srli_epi16(off, 9), m1);
}

/* Bytes b (packus of two blocks' magnitude codes, xb's 32 elements) with the sign bit 8 where
 * x > 0x8000 as unsigned: x < 0 and |x| > 0 (a nonzero quotient is never -0 for p <= 2^16). On bytes
 * after the pack: x ^ 0x8000 > 0 survives the signed saturation, so the test costs 3 operations per
 * 32 elements instead of 4 per 16 on words. */
NB_AVX2 static inline __m256i nv_sign32(const uint16_t *xb, __m256i b) {
    const __m256i S = _mm256_set1_epi16((short)0x8000);
    __m256i y = _mm256_packs_epi16(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)xb), S),
                                   _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xb + 16)), S));
    return _mm256_or_si256(b, _mm256_and_si256(_mm256_cmpgt_epi8(y, _mm256_setzero_si256()), _mm256_set1_epi8(8)));
}

/* Packed bytes of four blocks (xb, 64 elements) from their magnitude codes, even element in the low
 * nibble: 32 bytes at q. */
NB_AVX2 static inline void nv_store4(uint8_t *q, const uint16_t *xb, __m256i c0, __m256i c1, __m256i c2, __m256i c3) {
    const __m256i nib = _mm256_set1_epi16(0x1001);   /* byte pairs (1, 16): even + 16 * odd */
    __m256i m01 = _mm256_maddubs_epi16(nv_sign32(xb, _mm256_packus_epi16(c0, c1)), nib);   /* lane 0: bytes 0-3 of c0, c1 */
    __m256i m23 = _mm256_maddubs_epi16(nv_sign32(xb + 32, _mm256_packus_epi16(c2, c3)), nib);
    __m256i p = _mm256_packus_epi16(m01, m23);   /* dwords: c0 c1 c2 c3 bytes 0-3 | the same, bytes 4-7 */
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* The 16 block maxima of the 256 elements at xg as f32 bit patterns (bf16 << 16), blocks 0-7 in *b0
 * and 8-15 in *b1. Each first step takes the low and high halves of two blocks by 128-bit loads (one
 * block per lane), then in-lane unpacks halve the words per block twice. */
NB_AVX2 static inline void nv_bmax16(const uint16_t *xg, __m256i *b0, __m256i *b1) {
    const __m256i m = _mm256_set1_epi16(0x7FFF);
    __m256i u[8], v[4];
    for (int j = 0; j < 8; j++) {
        const uint16_t *p = xg + 32 * j;
        __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                             _mm_loadu_si128((const __m128i *)(p + 16)), 1);
        __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 8))),
                                             _mm_loadu_si128((const __m128i *)(p + 24)), 1);
        u[j] = _mm256_max_epu16(_mm256_and_si256(lo, m), _mm256_and_si256(hi, m));   /* block 2j | block 2j+1 */
    }
    for (int i = 0; i < 4; i++)   /* lane 0: blocks 4i, 4i+2 (4 words each); lane 1: 4i+1, 4i+3 */
        v[i] = _mm256_max_epu16(_mm256_unpacklo_epi64(u[2 * i], u[2 * i + 1]), _mm256_unpackhi_epi64(u[2 * i], u[2 * i + 1]));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int k = 0; k < 2; k++) {   /* dwords: blocks 8k, 8k+2, 8k+4, 8k+6 | 8k+1, 8k+3, 8k+5, 8k+7 */
        __m256 p = _mm256_castsi256_ps(v[2 * k]), q = _mm256_castsi256_ps(v[2 * k + 1]);
        __m256i w = _mm256_max_epu16(_mm256_castps_si256(_mm256_shuffle_ps(p, q, _MM_SHUFFLE(2, 0, 2, 0))),
                                     _mm256_castps_si256(_mm256_shuffle_ps(p, q, _MM_SHUFFLE(3, 1, 3, 1))));
        w = _mm256_slli_epi32(_mm256_max_epu16(w, _mm256_srli_epi32(w, 16)), 16);
        w = _mm256_permutevar8x32_epi32(w, order);
        if (k) *b1 = w;
        else *b0 = w;
    }
}

/* Scale bytes of the 16 blocks at xg (block index g), stored at sg; returns whether all are in the
 * table's run [lo, hi]. Dynamic rows: from the data's maxima (their largest into *vm, dwords);
 * static rows: from a->block_amax. */
NB_AVX2 __attribute__((always_inline)) static inline int nv_tab_scales(const uint16_t *xg, const nb_qrow_args *a,
                                                                        int64_t g, float norm, __m256i lo, __m256i hi,
                                                                        __m256i *vm, uint8_t *sg, const int stat) {
    __m256i sb0, sb1;
    if (stat) {
        sb0 = scale_static(_mm256_loadu_ps(a->block_amax + g), a->global_amax, norm);
        sb1 = scale_static(_mm256_loadu_ps(a->block_amax + g + 8), a->global_amax, norm);
    } else {
        __m256i m0, m1;
        nv_bmax16(xg, &m0, &m1);
        *vm = _mm256_max_epu32(*vm, _mm256_max_epu32(m0, m1));
        sb0 = scale_dynamic(_mm256_castsi256_ps(m0), a->scale);
        sb1 = scale_dynamic(_mm256_castsi256_ps(m1), a->scale);
    }
    __m256i p = _mm256_packus_epi32(sb0, sb1);   /* words: 0-3 8-11 | 4-7 12-15 */
    p = _mm256_packus_epi16(p, p);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128((__m128i *)sg, _mm256_castsi256_si128(p));
    __m256i out = _mm256_or_si256(_mm256_or_si256(_mm256_cmpgt_epi32(sb0, hi), _mm256_cmpgt_epi32(lo, sb0)),
                                  _mm256_or_si256(_mm256_cmpgt_epi32(sb1, hi), _mm256_cmpgt_epi32(lo, sb1)));
    return _mm256_testz_si256(out, out);
}

/* A group with some scale byte outside the table's run: every block by the table (a blank row for
 * such blocks: nbq_nv_table_build_range zeroes them), then those blocks again by the reference. */
NB_AVX2 __attribute__((noinline)) static void nv_group_mixed(const uint16_t *xg, const uint8_t *sg, float s2,
                                                             const nbq_nv_table *tab, uint8_t *qg, __m256i *vm,
                                                             int stat) {
    for (int b = 0; b < 16; b += 4) {
        const uint16_t *xb = xg + 16 * b;
        if (stat)
            nv_store4(qg + 8 * b, xb, nv_codes16(xb, tab->row[sg[b] & 0x7F], vm, 1), nv_codes16(xb + 16, tab->row[sg[b + 1] & 0x7F], vm, 1),
                      nv_codes16(xb + 32, tab->row[sg[b + 2] & 0x7F], vm, 1), nv_codes16(xb + 48, tab->row[sg[b + 3] & 0x7F], vm, 1));
        else
            nv_store4(qg + 8 * b, xb, nv_codes16(xb, tab->row[sg[b] & 0x7F], vm, 0), nv_codes16(xb + 16, tab->row[sg[b + 1] & 0x7F], vm, 0),
                      nv_codes16(xb + 32, tab->row[sg[b + 2] & 0x7F], vm, 0), nv_codes16(xb + 48, tab->row[sg[b + 3] & 0x7F], vm, 0));
    }
    for (int b = 0; b < 16; b++)
        if (!tab->ok[sg[b] & 0x7F] || (sg[b] & 0x80)) nv_block_ref(xg + 16 * b, nbn_nvfp4_divisor(sg[b], s2), qg + 8 * b);
}

/* Every block of a BF16 row of at least 16 blocks (else none) by the table, 16 blocks a group; returns
 * the blocks done. A row that is not whole groups ends with the group of its last 16 blocks, overlapping
 * the one before (a block's bytes depend only on its elements, its block amax and the per-tensor
 * values: the blocks done twice get the same bytes, and the 1-15 leftover blocks cost one group instead
 * of the reference's divisions). Software-pipelined like the AVX-512 kernel: group g+1's maxima and
 * scale bytes come before group g's codes, so the row loads read scale bytes stored an iteration
 * earlier instead of waiting on the scale chain (the last group's scale bytes for the blocks it shares
 * are stored again, equal, before the group before reads them). */
NB_AVX2 __attribute__((always_inline)) static inline int64_t nv_tab_groups(const uint16_t *x, int64_t n,
                                                                            const nb_qrow_args *a, float norm,
                                                                            const nbq_nv_table *tab, uint8_t *q,
                                                                            uint8_t *s, __m256i *vm, const int stat) {
    const int64_t nb = n / NB_NVFP4_BLOCK, last = nb - 16;   /* last: the start of the last group */
    if (nb < 16) return 0;
    const __m256i lo = i32(tab->ok_lo), hi = i32(tab->ok_hi);
    int ok = nv_tab_scales(x, a, 0, norm, lo, hi, vm, s, stat);
    for (int64_t g = 0;;) {
        const uint16_t *xg = x + g * NB_NVFP4_BLOCK;
        const uint8_t *sg = s + g;
        uint8_t *qg = q + g * 8;
        const int64_t gn = g + 16 <= last ? g + 16 : last;   /* the next group's start (when g < last) */
        int ok_next = g < last && nv_tab_scales(x + gn * NB_NVFP4_BLOCK, a, gn, norm, lo, hi, vm, s + gn, stat);
        if (__builtin_expect(!ok, 0)) {
            nv_group_mixed(xg, sg, a->scale, tab, qg, vm, stat);
        } else {
            for (int b = 0; b < 16; b += 4) {
                const uint16_t *xb = xg + 16 * b;
                nv_store4(qg + 8 * b, xb, nv_codes16(xb, tab->row[sg[b]], vm, stat), nv_codes16(xb + 16, tab->row[sg[b + 1]], vm, stat),
                          nv_codes16(xb + 32, tab->row[sg[b + 2]], vm, stat), nv_codes16(xb + 48, tab->row[sg[b + 3]], vm, stat));
            }
        }
        if (g == last) break;
        ok = ok_next;
        g = gn;
    }
    return nb;
}

NB_AVX2 static int64_t nv_tab_groups_dyn(const uint16_t *x, int64_t n, const nb_qrow_args *a, float norm,
                                         const nbq_nv_table *tab, uint8_t *q, uint8_t *s, __m256i *vm) {
    return nv_tab_groups(x, n, a, norm, tab, q, s, vm, 0);
}

NB_AVX2 static int64_t nv_tab_groups_stat(const uint16_t *x, int64_t n, const nb_qrow_args *a, float norm,
                                          const nbq_nv_table *tab, uint8_t *q, uint8_t *s, __m256i *vm) {
    return nv_tab_groups(x, n, a, norm, tab, q, s, vm, 1);
}

/* Lane k = the sum of v[k]'s 8 lanes (a VHADDPS tree, then the two 128-bit halves added). */
NB_AVX2 static inline __m256 nv46_hsum8(const __m256 v[8]) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* One candidate's squared-error terms of the block at xb (magnitude codes c, divisor p), 8 lanes:
 * e = f32(|x| - f32(value * p)) has the reference's |x - y| (the code's sign is x's), squared in f32. */
NB_AVX2 static inline __m256 nv46_block_sse(__m256i mag, __m256i c, __m256 p, __m256 deq8) {
    const __m256 x0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(mag)), 16));
    const __m256 x1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(mag, 1)), 16));
    const __m256 y0 = _mm256_mul_ps(_mm256_permutevar8x32_ps(deq8, _mm256_cvtepu16_epi32(_mm256_castsi256_si128(c))), p);
    const __m256 y1 = _mm256_mul_ps(_mm256_permutevar8x32_ps(deq8, _mm256_cvtepu16_epi32(_mm256_extracti128_si256(c, 1))), p);
    const __m256 e0 = _mm256_sub_ps(x0, y0), e1 = _mm256_sub_ps(x1, y1);
    return _mm256_add_ps(_mm256_mul_ps(e0, e0), _mm256_mul_ps(e1, e1));
}

/* four_over_six's per-block pick from the data by the threshold table: fast_avx512.c's
 * nv46_pick_groups512 (its comment has the margin argument) with one block per ymm. */
NB_AVX2 static int64_t nv46_pick_groups(const uint16_t *x, int64_t n, const nb_qrow_args *a, const nbq_nv_table *tab,
                                        uint8_t *q, uint8_t *s, __m256i *vm) {
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb < 16) return 0;
    const __m256 s2 = f32(a->scale), deq8 = _mm256_loadu_ps(nb_e2m1_deq);
    const __m256i lo = i32(tab->ok_lo), hi = i32(tab->ok_hi);
    int32_t i6[16], i4[16], ib[16];
    float p6[16], p4[16];
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
        const int64_t g = g0 + 16 <= nb ? g0 : nb - 16;   /* the last group ends at the row's end */
        const uint16_t *xg = x + g * NB_NVFP4_BLOCK;
        uint8_t *qg = q + g * 8;
        __m256i m[2], sb6[2], sb4[2];
        nv_bmax16(xg, &m[0], &m[1]);
        *vm = _mm256_max_epu32(*vm, _mm256_max_epu32(m[0], m[1]));
        __m256i out = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256 bam = _mm256_castsi256_ps(m[h]);
            sb6[h] = scale_static(bam, a->global_amax, 256.0f);
            sb4[h] = scale_static(_mm256_mul_ps(bam, f32(1.5f)), a->global_amax, 256.0f);
            out = _mm256_or_si256(out, _mm256_or_si256(_mm256_or_si256(_mm256_cmpgt_epi32(sb6[h], hi), _mm256_cmpgt_epi32(lo, sb6[h])),
                                                       _mm256_or_si256(_mm256_cmpgt_epi32(sb4[h], hi), _mm256_cmpgt_epi32(lo, sb4[h]))));
            _mm256_storeu_si256((__m256i *)(i6 + 8 * h), sb6[h]);
            _mm256_storeu_si256((__m256i *)(i4 + 8 * h), sb4[h]);
            _mm256_storeu_ps(p6 + 8 * h, _mm256_mul_ps(e4m3_dec(sb6[h]), s2));
            _mm256_storeu_ps(p4 + 8 * h, _mm256_mul_ps(e4m3_dec(sb4[h]), s2));
        }
        if (!_mm256_testz_si256(out, out)) {   /* rare: the reference for the whole group */
            nv46_ref_blocks(xg, 0xFFFF, a, qg, s + g);
            continue;
        }
        __m256i c6[16], c4[16];
        __m256 f6[16], f4[16];
        for (int b = 0; b < 16; b++) {
            const uint16_t *xb = xg + 16 * b;
            const __m256i mag = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)xb), _mm256_set1_epi16(0x7FFF));
            c6[b] = nv_codes16(xb, tab->row[i6[b]], vm, 0);
            c4[b] = nv_codes16(xb, tab->row[i4[b]], vm, 0);
            f6[b] = nv46_block_sse(mag, c6[b], _mm256_set1_ps(p6[b]), deq8);
            f4[b] = nv46_block_sse(mag, c4[b], _mm256_set1_ps(p4[b]), deq8);
        }
        unsigned pick4 = 0, keep6 = 0;
        for (int h = 0; h < 2; h++) {
            const __m256 e6 = nv46_hsum8(f6 + 8 * h), e4 = nv46_hsum8(f4 + 8 * h);
            const __m256 thr = _mm256_mul_ps(_mm256_add_ps(e4, e6), f32(0x1p-18f));
            const __m256 z = _mm256_setzero_ps();
            const __m256 m4 = _mm256_cmp_ps(_mm256_sub_ps(e6, e4), thr, _CMP_GT_OQ);
            const __m256 k6 = _mm256_or_ps(_mm256_cmp_ps(_mm256_sub_ps(e4, e6), thr, _CMP_GT_OQ),
                                           _mm256_and_ps(_mm256_cmp_ps(e4, z, _CMP_EQ_OQ), _mm256_cmp_ps(e6, z, _CMP_EQ_OQ)));
            pick4 |= (unsigned)_mm256_movemask_ps(m4) << (8 * h);
            keep6 |= (unsigned)_mm256_movemask_ps(k6) << (8 * h);
            _mm256_storeu_si256((__m256i *)(ib + 8 * h), _mm256_blendv_epi8(sb6[h], sb4[h], _mm256_castps_si256(m4)));
        }
        for (int b = 0; b < 16; b++) s[g + b] = (uint8_t)ib[b];
        for (int b = 0; b < 16; b += 4) {
            __m256i c[4];
            for (int k = 0; k < 4; k++) c[k] = (pick4 >> (b + k)) & 1 ? c4[b + k] : c6[b + k];
            nv_store4(qg + 8 * b, xg + 16 * b, c[0], c[1], c[2], c[3]);
        }
        const unsigned undecided = ~(pick4 | keep6) & 0xFFFFu;
        if (__builtin_expect(undecided != 0, 0)) nv46_ref_blocks(xg, undecided, a, qg, s + g);
    }
    return nb;
}

NB_AVX2 int nbq_avx2_nvfp4_table_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a,
                                      const nbq_nv_table *tab, uint8_t *q, uint8_t *s) {
    if (!tab || (f != NB_FMT_NVFP4 && f != NB_FMT_NVFP4_46)) return 1;
    const int pick = f == NB_FMT_NVFP4_46 && !a->block_amax;   /* the per-block pick */
    if (pick && !nv46_table_fits(a)) return 1;   /* the f32 rows */
    const float norm = f == NB_FMT_NVFP4 ? 448.0f : 256.0f;
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb >= 1 && nb < 16) {
        /* a row of 1-15 blocks: one group on a copy padded with zero blocks (block amax 0 when
         * static), of which only the row's blocks are copied out; zeros add nothing to the largest
         * magnitude. Every branch is exact, so the padding can only cost time (a padded scale byte
         * outside the table's run takes the group to nv_group_mixed). */
        uint16_t xp[256];
        float bp[16];
        uint8_t qp[128], sp[16];
        nb_qrow_args t = nbq_nv_pad_row(x, nb, a, xp, bp);
        int st = nbq_avx2_nvfp4_table_bf16(f, xp, 256, &t, tab, qp, sp);
        memcpy(q, qp, (size_t)nb * 8);
        memcpy(s, sp, (size_t)nb);
        for (int64_t i = nb * NB_NVFP4_BLOCK; i < n; i++) st = (x[i] & 0x7F80) == 0x7F80 ? 2 : st;
        return st;
    }
    __m256i vm = _mm256_setzero_si256();
    uint32_t worst;   /* the largest magnitude pattern seen (>= 0x7F80: NaN/Inf) */
    int64_t g;
    if (a->block_amax) {
        g = nv_tab_groups_stat(x, n, a, norm, tab, q, s, &vm);
        uint16_t t[16];
        _mm256_storeu_si256((__m256i *)t, vm);
        worst = 0;
        for (int k = 0; k < 16; k++) worst = t[k] > worst ? t[k] : worst;
    } else {   /* block maxima from the data (dword lanes, bf16 << 16) */
        g = pick ? nv46_pick_groups(x, n, a, tab, q, s, &vm) : nv_tab_groups_dyn(x, n, a, norm, tab, q, s, &vm);
        uint32_t t[8];
        _mm256_storeu_si256((__m256i *)t, vm);
        worst = 0;
        for (int k = 0; k < 8; k++) worst = t[k] > worst ? t[k] : worst;
        worst >>= 16;
    }
    int64_t rest = n - g * NB_NVFP4_BLOCK;   /* only past the last block when n is not whole blocks */
    if (rest > 0) {
        float tail[512];
        nb_qrow_args t = tail_args(a, g);
        for (int64_t k = 0; k < rest; k++) {
            uint16_t h = x[g * NB_NVFP4_BLOCK + k];
            tail[k] = nbn_bf16_to_f32(h);
            worst = (uint32_t)(h & 0x7FFF) > worst ? (uint32_t)(h & 0x7FFF) : worst;
        }
        if (f == NB_FMT_NVFP4) nb_nvfp4_quantize_row_ref(tail, rest, &t, q + g * 8, s + g);
        else nb_nvfp4_46_quantize_row_ref(tail, rest, &t, q + g * 8, s + g);
    }
    return worst >= 0x7F80u ? 2 : 0;
}

#else /* not x86-64 with GNU C: no AVX2 path (the dispatcher never calls these) */

int nbq_avx2_nvfp4_table_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a,
                              const nbq_nv_table *tab, uint8_t *q, uint8_t *s) {
    (void)f; (void)x; (void)n; (void)a; (void)tab; (void)q; (void)s;
    return 1;
}

#endif

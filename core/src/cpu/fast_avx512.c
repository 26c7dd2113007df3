/* AVX-512 quantize kernels that read BF16 rows directly (the dtype real weights come in), used by
 * nb_quantize's fused driver; bit-equal to the scalar references (tests/c/test_quant_fast*.c).
 * Speed comes from three exact shortcuts, each with a named fallback to the reference arithmetic:
 *  - E4M3 rounding of values that are bf16 numbers is done on the 16-bit patterns, 32 lanes at a
 *    time (MXFP8 scales by a power of two, so x * 2^k is x's bf16 pattern with its exponent moved).
 *  - Quotients x / p (NVFP4) and x / s (FP8) come from x * f32(1/p) and two FMA corrections
 *    (Markstein): exactly f32(x / p), without a division per element (the divider is the slowest
 *    unit; 47M bf16 x / p pairs were checked against the division besides the tests).
 *  - E4M3 rounding of an f32 value goes through bf16 rounded to odd (7 >= 3 + 2 mantissa bits, so
 *    the second rounding to nearest-even equals the direct one).
 * Lanes in E4M3's subnormal range, bf16 subnormal inputs and tiny quotients take the reference path
 * too. Block maxima are a reduction tree over 16 blocks (NVFP4) or 8 (MXFP8) at once on the integer
 * bf16 magnitudes.
 * NVFP4 on large tensors skips the quotients altogether: a per-tensor threshold table built with the
 * reference's own division (nbq_nv_table, fast_internal.h) gives each element's E2M1 code from three
 * compares of its bf16 magnitude; scale bytes outside the table's range take the reference. */
#include <math.h>
#include <string.h>

#include "cpu/fast_internal.h"
#include "cpu/features.h"

/* ---- NVFP4 threshold table (portable C: the reference's own arithmetic) ----------------------- */

void nbq_nv_table_build_range(float s2, nbq_nv_table *t, int sb_begin, int sb_end) {
    for (int sb = sb_begin; sb < sb_end; sb++) {
        t->ok[sb] = 0;
        memset(t->row[sb], 0, sizeof t->row[sb]);   /* read (and overwritten) by the mixed-group path */
        const float p = nbn_nvfp4_divisor((uint8_t)sb, s2);   /* nvfp4.c's divisor */
        if (!nbn_e2m1_table_ok(sb, p)) continue;
        t->ok[sb] = 1;
        for (int j = 0; j < 7; j++) t->row[sb][j] = t->row[sb][8 + j] = (int16_t)((int32_t)nbn_e2m1_threshold(p, j) - 1);
    }
}

void nbq_nv_table_finish(nbq_nv_table *t) {
    int lo = 128, hi = -1;
    for (int sb = 0; sb < 128; sb++)
        if (t->ok[sb]) {
            lo = sb < lo ? sb : lo;
            hi = sb;
        }
    for (int sb = lo; sb <= hi; sb++)
        if (!t->ok[sb]) lo = 128, hi = -1;   /* not one run: every block looks at ok[] itself */
    t->ok_lo = lo;
    t->ok_hi = hi;
}

void nbq_nv_table_build(float s2, nbq_nv_table *t) {
    nbq_nv_table_build_range(s2, t, 0, 128);
    nbq_nv_table_finish(t);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "cpu/fast_x86.h"   /* the scalar fallbacks this file shares with fast_avx2*.c */

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

#define NB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))


NB_AVX512 static inline __m512i i16(int v) { return _mm512_set1_epi16((short)v); }
NB_AVX512 static inline __m512i i32v(int v) { return _mm512_set1_epi32(v); }

/* ---- block maxima: 16 blocks at a time ------------------------------------------------------------ */

/* t[i] = magnitudes of blocks 2i (low 256 bits) and 2i+1 (high 256 bits), 16 u16 each. Returns the
 * 16 block maxima as f32 bit patterns (bf16 << 16), lane b = block b. The tree ends with lane
 * 4k+j holding block 4j+k; the final permute puts them in order. */
NB_AVX512 static inline __m512 tree16(const __m512i t[8]) {
    __m512i u[4], v[2];
    for (int j = 0; j < 4; j++) {
        __m512i c = t[2 * j], d = t[2 * j + 1];
        u[j] = _mm512_max_epu16(_mm512_shuffle_i64x2(c, d, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_i64x2(c, d, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int j = 0; j < 2; j++)
        v[j] = _mm512_max_epu16(_mm512_unpacklo_epi64(u[2 * j], u[2 * j + 1]), _mm512_unpackhi_epi64(u[2 * j], u[2 * j + 1]));
    __m512 p = _mm512_castsi512_ps(v[0]), q = _mm512_castsi512_ps(v[1]);
    __m512i w = _mm512_max_epu16(_mm512_castps_si512(_mm512_shuffle_ps(p, q, _MM_SHUFFLE(2, 0, 2, 0))),
                                 _mm512_castps_si512(_mm512_shuffle_ps(p, q, _MM_SHUFFLE(3, 1, 3, 1))));
    w = _mm512_max_epu16(w, _mm512_srli_epi32(w, 16));
    w = _mm512_slli_epi32(w, 16);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_castsi512_ps(_mm512_permutexvar_epi32(order, w));
}

/* ---- element encoders ------------------------------------------------------------------------------ */

/* E4M3 codes of 32 bf16 magnitudes `a` that are 0 or >= 2^-6 (the caller sends the E4M3 subnormal
 * range to the reference), sign from bit 15 of `sgn`: clamp to 448, RNE on the 4 low bits with the
 * carry into the exponent, rebias 127 -> 7; the saturating rebias leaves 0 for a = 0. */
NB_AVX512 static inline __m512i e4m3_normal16(__m512i a, __m512i sgn) {
    __m512i qc = _mm512_min_epu16(a, i16(0x43E0));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(qc, 4), i16(1));
    __m512i code = _mm512_srli_epi16(_mm512_subs_epu16(_mm512_add_epi16(qc, lsb), i16(0x3C00 - 7)), 4);
    return _mm512_ternarylogic_epi32(code, _mm512_srli_epi16(sgn, 8), i16(0x80), 0xF8);
}

/* bf16 rounded to odd of 16 f32 lanes, in the high half (odd elements) or low half (even elements)
 * of each 32-bit lane; combined they give 32 bf16 patterns in element order. */
NB_AVX512 static inline __m512i rto_pair(__m512i ue, __m512i uo) {
    __m512i he = _mm512_srli_epi32(ue, 16);
    he = _mm512_mask_or_epi32(he, _mm512_test_epi32_mask(ue, i32v(0xFFFF)), he, i32v(1));
    __m512i ho = _mm512_mask_or_epi32(uo, _mm512_test_epi32_mask(uo, i32v(0xFFFF)), uo, i32v(0x10000));
    return _mm512_ternarylogic_epi32(he, ho, i32v((int)0xFFFF0000u), 0xF8);   /* he | (ho & 0xFFFF0000) */
}

/* bf16 rounded to nearest even (nb_f32_to_bf16 on finite values), same layout as rto_pair. */
NB_AVX512 static inline __m512i rne_pair(__m512i ue, __m512i uo) {
    __m512i re = _mm512_add_epi32(ue, _mm512_add_epi32(i32v(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(ue, 16), i32v(1))));
    __m512i ro = _mm512_add_epi32(uo, _mm512_add_epi32(i32v(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(uo, 16), i32v(1))));
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(re, 16), ro, i32v((int)0xFFFF0000u), 0xF8);
}

/* E2M1 codes of 16 f32 quotients: nb_f32_to_e2m1 for finite values, by the one-add rounding of
 * fast_x86.h's e2m1_enc_ (a + M with ulp(M) the grid step of a's binade). */
NB_AVX512 static inline __m512i e2m1_f32(__m512 q) {
    __m512 a = _mm512_min_ps(_mm512_abs_ps(q), _mm512_set1_ps(6.0f));
    __m512i e = _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(a), i32v(0x7F800000)), i32v(127 << 23));
    __m512i m = _mm512_add_epi32(e, i32v(22 << 23));
    __m512i k = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(m))), m);
    __m512i code = _mm512_add_epi32(k, _mm512_sub_epi32(_mm512_srli_epi32(m, 22), i32v(2 * 149)));
    __mmask16 neg = _mm512_cmp_ps_mask(q, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_or_epi32(code, neg, code, i32v(8));
}

/* f32(x / p) without a division: y = f32(1/p), q0 = f32(x*y), then two of Markstein's corrections
 * q' = q + (x - q*p)*y, each residual one FMA. The first brings q within one ulp of x/p, and from
 * there Markstein's theorem (y within half an ulp of 1/p, q faithful) makes the second round to
 * f32(x / p) exactly. Needs the residuals normal: |x| >= 2^-60 (smaller lanes only need their sign,
 * which every step keeps) and p in [2^-90, 256]. */
NB_AVX512 static inline __m512 div_markstein(__m512 x, __m512 p, __m512 y) {
    __m512 q = _mm512_mul_ps(x, y);
    __m512 e = _mm512_fnmadd_ps(q, p, x);
    q = _mm512_fmadd_ps(e, y, q);
    e = _mm512_fnmadd_ps(q, p, x);
    return _mm512_fmadd_ps(e, y, q);
}

/* nb_e4m3_to_f32 of bytes in 32-bit lanes (finite codes). */
NB_AVX512 static inline __m512 e4m3_dec16(__m512i b) {
    __m512i mag = _mm512_and_si512(b, i32v(0x7F));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, i32v(0x80)), 24);
    __m512i nrm = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), i32v(120 << 23));
    __m512i sub = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f)));
    __m512i r = _mm512_mask_mov_epi32(nrm, _mm512_cmplt_epi32_mask(mag, i32v(8)), sub);
    r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(mag, i32v(0x7F)), i32v(0x7FC00000));
    return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

/* nb_f32_to_e4m3 of 16 f32 lanes (block scales): clamp, one-add RNE (fast_x86.h), NaN -> 0x7F. */
NB_AVX512 static inline __m512i e4m3_enc16(__m512 x) {
    __m512 a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(448.0f));
    __m512i e = _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(a), i32v(0x7F800000)), i32v(121 << 23));
    __m512i m = _mm512_add_epi32(e, i32v(20 << 23));
    __m512i k = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(m))), m);
    __m512i code = _mm512_add_epi32(k, _mm512_sub_epi32(_mm512_srli_epi32(m, 20), i32v(8 * 141)));
    __m512i sign = _mm512_srli_epi32(_mm512_and_si512(_mm512_castps_si512(x), i32v((int)0x80000000u)), 24);
    code = _mm512_or_si512(code, sign);
    return _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), i32v(0x7F));   /* NaN -> 0x7F */
}

/* _cast_per_block_scale_to_fp8 (clamp [2^-9, 448] keeping NaN, then E4M3) and the 0 -> 1.0 rule. */
NB_AVX512 static inline __m512i scale_e4m3_16(__m512 v) {
    v = _mm512_max_ps(_mm512_set1_ps(0x1p-9f), v);
    v = _mm512_min_ps(_mm512_set1_ps(448.0f), v);
    return e4m3_enc16(v);
}

NB_AVX512 static inline __m512 zero_to_one16(__m512 v) {
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ), _mm512_set1_ps(1.0f));
}

/* ---- NVFP4 ------------------------------------------------------------------------------------------ */

/* Reference codes of one pair of blocks (32 elements) with divisors p0, p1: the fallback. */
static void nv_pair_ref(const uint16_t *x, float p0, float p1, uint8_t *q) {
    nv_block_ref(x, p0, q);
    nv_block_ref(x + NB_NVFP4_BLOCK, p1, q + NB_NVFP4_BLOCK / 2);
}

/* Index words for VPSHUFB: word j of a 16-byte lane is bytes 2j, 2j+1. */
#define NV_W(j) (0x0100 + 0x0202 * (j))

/* Constants of nv_pair_tab, held in registers across a row (GCC otherwise rebuilds them from
 * general registers with port-5 broadcasts inside the loop). */
typedef struct nv_tab_k {
    __m512i m7fff, w3, w1, w5, w0, w4, w2d, one, two, four, eight, sgn, madd;
} nv_tab_k;

NB_AVX512 static inline void nv_tab_k_init(nv_tab_k *k) {
    k->m7fff = i16(0x7FFF);
    k->w3 = i16(NV_W(3)); k->w1 = i16(NV_W(1)); k->w5 = i16(NV_W(5));
    k->w0 = i16(NV_W(0)); k->w4 = i16(NV_W(4)); k->w2d = i16(NV_W(2) - NV_W(0));
    k->one = i16(1); k->two = i16(2); k->four = i16(4); k->eight = i16(8); k->sgn = i16(0x8000);
    k->madd = i32v(0x00100001);
}

/* Packed bytes of two blocks, xb[0..15] with threshold row r0 and xb[16..31] with r1
 * (nbq_nv_table.row: T_0-1 .. T_6-1, twice). The code is the count of boundaries passed, by a
 * binary search over the monotone thresholds: T_3, then T_1 or T_5, then T_0/T_2/T_4/T_6; each row
 * sits in both 128-bit lanes of its block, so one in-lane shuffle picks every lane's threshold.
 * AVX-512 mask compares (port 5), not VEX ones: with 512-bit work in flight, port 1 is fused into
 * port 0 for vectors, so 256-bit compares would share one port with everything else. 3 compares
 * and 3 shuffles per 32 elements, where counting against all 7 thresholds took 7 compares per 16. */
NB_AVX512 static inline __m512i nv_pair_codes(__m512i xv, const int16_t *r0, const int16_t *r1, const nv_tab_k *k) {
    const __m512i mag = _mm512_and_si512(xv, k->m7fff);
    const __m512i R = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0)),
                                         _mm256_loadu_si256((const __m256i *)r1), 1);
    __mmask32 k3 = _mm512_cmpgt_epu16_mask(mag, _mm512_shuffle_epi8(R, k->w3));
    __mmask32 k2 = _mm512_cmpgt_epu16_mask(mag, _mm512_shuffle_epi8(R, _mm512_mask_blend_epi16(k3, k->w1, k->w5)));
    __m512i j3 = _mm512_mask_blend_epi16(k3, k->w0, k->w4);
    j3 = _mm512_mask_add_epi16(j3, k2, j3, k->w2d);
    __mmask32 k1 = _mm512_cmpgt_epu16_mask(mag, _mm512_shuffle_epi8(R, j3));
    __mmask32 kn = _mm512_cmpgt_epu16_mask(xv, k->sgn);   /* x > 0x8000 unsigned: x < 0 and |x| > 0 */
    __m512i code = _mm512_maskz_mov_epi16(kn, k->eight);
    code = _mm512_mask_add_epi16(code, k3, code, k->four);
    code = _mm512_mask_add_epi16(code, k2, code, k->two);
    return _mm512_mask_add_epi16(code, k1, code, k->one);
}

/* The 16 packed bytes of 32 codes in 16-bit lanes: even + 16 * odd. */
NB_AVX512 static inline __m128i nv_pack_codes(__m512i code, const nv_tab_k *k) {
    return _mm512_cvtepi32_epi8(_mm512_madd_epi16(code, k->madd));
}

/* The E2M1 codes (16-bit lanes, sign in bit 3) of two blocks, packed: nv_pair_codes, nv_pack_codes. */
NB_AVX512 static inline __m128i nv_pair_tab(const uint16_t *xb, const int16_t *r0, const int16_t *r1, const nv_tab_k *k) {
    return nv_pack_codes(nv_pair_codes(_mm512_loadu_si512((const void *)xb), r0, r1, k), k);
}

/* nb_nvfp4_block_scale_static of 16 block amaxes (dword lanes): r = f32(f32(pbs*norm) / f32(G/6)),
 * pbs = amax_b/6. */
NB_AVX512 static inline __m512i nv_static16(__m512 bam, float norm, float global_amax) {
    __m512 pbs = zero_to_one16(_mm512_div_ps(bam, _mm512_set1_ps(6.0f)));
    __m512 r = _mm512_mul_ps(pbs, _mm512_set1_ps(norm));
    return scale_e4m3_16(_mm512_div_ps(r, _mm512_set1_ps(global_amax / 6.0f)));
}

/* Scale bytes (dword lanes) of blocks g..g+15 with maxima bam: nb_nvfp4_block_scale_dynamic, or the
 * static scale from a->block_amax. */
NB_AVX512 static inline __m512i nv_scales16(__m512 bam, const nb_qrow_args *a, int64_t g, float norm, __m512 d6) {
    if (a->block_amax) return nv_static16(_mm512_loadu_ps(a->block_amax + g), norm, a->global_amax);
    return scale_e4m3_16(zero_to_one16(_mm512_div_ps(bam, d6)));
}

/* Every block of a BF16 row of at least 16 blocks (else none), 16 blocks (256 elements) a group; returns
 * the blocks done. A row that is not whole groups ends with the group of its last 16 blocks, overlapping
 * the one before: a block's bytes depend only on its 16 elements, its block amax (static) and the
 * per-tensor values, so the blocks done twice get the same bytes, and the 1-15 leftover blocks cost one
 * group instead of the reference row (~50x the cost per element: nb_quantize of a 4096x576 BF16 tensor,
 * rows of 36 blocks of which 4 went to the reference, took 3.3 ms before, 0.87 after). norm 448 (NVFP4) or 256
 * (four_over_six, static only). *vmax collects the magnitudes seen (for the NaN/Inf check). */
NB_AVX512 static int64_t nv_groups512(const uint16_t *x, int64_t n, const nb_qrow_args *a, float norm, uint8_t *q,
                                      uint8_t *s, __m512i *vmax) {
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb < 16) return 0;
    const __m512 s2 = _mm512_set1_ps(a->scale);
    const __m512 d6 = _mm512_set1_ps(6.0f * a->scale);
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    float pa[16];
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
        const int64_t g = g0 + 16 <= nb ? g0 : nb - 16;   /* the last group ends at the row's end */
        const uint16_t *xg = x + g * NB_NVFP4_BLOCK;
        __m512i v[8];
        for (int i = 0; i < 8; i++) v[i] = _mm512_loadu_si512((const void *)(xg + 32 * i));
        __m512i t[8];
        for (int i = 0; i < 8; i++) {
            t[i] = _mm512_and_si512(v[i], i16(0x7FFF));
            *vmax = _mm512_max_epu16(*vmax, t[i]);
        }
        const __m512 bam = tree16(t);
        const __m512i sb = nv_scales16(bam, a, g, norm, d6);
        __m512 p = _mm512_mul_ps(e4m3_dec16(sb), s2);
        _mm_storeu_si128((__m128i *)(s + g), _mm512_cvtepi32_epi8(sb));
        __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), p);
        /* div_markstein's conditions: p in [2^-90, 256] (then a nonzero bf16 quotient is far from 0 too),
         * and no quotient near overflow (a clamped block scale can leave max|x| / p huge) */
        __mmask16 ok = _mm512_cmp_ps_mask(p, _mm512_set1_ps(0x1p-90f), _CMP_GE_OQ) &
                       _mm512_cmp_ps_mask(p, _mm512_set1_ps(256.0f), _CMP_LE_OQ) &
                       _mm512_cmp_ps_mask(_mm512_mul_ps(bam, r), _mm512_set1_ps(0x1p100f), _CMP_LT_OQ);
        _mm512_storeu_ps(pa, p);
        uint8_t *qg = q + g * 8;
        if (ok != 0xFFFF) {
            for (int i = 0; i < 8; i++) nv_pair_ref(xg + 32 * i, pa[2 * i], pa[2 * i + 1], qg + 16 * i);
            continue;
        }
        for (int i = 0; i < 8; i++) {
            __m512i idx = _mm512_add_epi32(pair_idx, i32v(2 * i));
            __m512 rr = _mm512_permutexvar_ps(idx, r), pp = _mm512_permutexvar_ps(idx, p);
            __m512 qe = div_markstein(_mm512_castsi512_ps(_mm512_slli_epi32(v[i], 16)), pp, rr);
            __m512 qo = div_markstein(_mm512_castsi512_ps(_mm512_and_si512(v[i], i32v((int)0xFFFF0000u))), pp, rr);
            __m512i ce = e2m1_f32(qe), co = e2m1_f32(qo);
            __m512i bytes = _mm512_or_si512(ce, _mm512_slli_epi32(co, 4));
            _mm_storeu_si128((__m128i *)(qg + 16 * i), _mm512_cvtepi32_epi8(bytes));
        }
    }
    return nb;
}

/* A group with some scale byte outside the table's run: the pairs by nv_pair_tab (with a blank row
 * for such blocks), then those blocks again by the reference. Rare: out of line. */
NB_AVX512 __attribute__((noinline)) static void nv_group_tab_mixed(const uint16_t *xg, const uint8_t *sg, float s2,
                                                                  const nbq_nv_table *tab, uint8_t *qg) {
    nv_tab_k tk;
    nv_tab_k_init(&tk);
    for (int b = 0; b < 16; b += 2)
        _mm_storeu_si128((__m128i *)(qg + 8 * b), nv_pair_tab(xg + 16 * b, tab->row[sg[b] & 0x7F], tab->row[sg[b + 1] & 0x7F], &tk));
    for (int b = 0; b < 16; b++)
        if (!tab->ok[sg[b] & 0x7F] || (sg[b] & 0x80)) nv_block_ref(xg + 16 * b, nbn_nvfp4_divisor(sg[b], s2), qg + 8 * b);
}

/* Scale bytes of the 16 blocks at xg (stored at sg) for nv_tab_groups512; returns whether all are
 * in the table's run. */
NB_AVX512 static inline int nv_tab_scales(const uint16_t *xg, const nb_qrow_args *a, int64_t g, float norm, __m512 d6,
                                          __m512i m7fff, __m512i lo, __m512i hi, __m512i *vm, uint8_t *sg) {
    __m512i t[8];
    for (int i = 0; i < 8; i++) {
        t[i] = _mm512_and_si512(_mm512_loadu_si512((const void *)(xg + 32 * i)), m7fff);
        *vm = _mm512_max_epu16(*vm, t[i]);
    }
    const __m512i sb = nv_scales16(tree16(t), a, g, norm, d6);
    _mm_storeu_si128((__m128i *)sg, _mm512_cvtepi32_epi8(sb));
    return (_mm512_cmpge_epi32_mask(sb, lo) & _mm512_cmple_epi32_mask(sb, hi)) == 0xFFFF;
}

/* nv_groups512 with the threshold table: the codes by nv_pair_tab, two blocks per step, when every
 * scale byte of the group is in the table's run (one test). Software-pipelined: group g+1's maxima
 * and scale bytes are computed before group g's codes, so the codes' row loads read scale bytes
 * stored an iteration earlier instead of waiting on the scale chain and its store. The same groups
 * as nv_groups512, the last one overlapping (its scale bytes for the blocks it shares with the group
 * before are stored again, equal, before that group's codes read them). */
NB_AVX512 static int64_t nv_tab_groups512(const uint16_t *x, int64_t n, const nb_qrow_args *a, float norm, uint8_t *q,
                                          uint8_t *s, __m512i *vmax, const nbq_nv_table *tab) {
    const int64_t nb = n / NB_NVFP4_BLOCK, last = nb - 16;   /* last: the start of the last group */
    if (nb < 16) return 0;
    const __m512 d6 = _mm512_set1_ps(6.0f * a->scale);
    __m512i lo = i32v(tab->ok_lo), hi = i32v(tab->ok_hi), m7fff = i16(0x7FFF);
    nv_tab_k tk;
    nv_tab_k_init(&tk);
    /* keep the constants in registers: GCC would rebuild them from general registers each group */
    __asm__("" : "+v"(tk.m7fff), "+v"(tk.w3), "+v"(tk.w1), "+v"(tk.w5), "+v"(tk.w0), "+v"(tk.w4), "+v"(tk.w2d));
    __asm__("" : "+v"(tk.one), "+v"(tk.two), "+v"(tk.four), "+v"(tk.eight), "+v"(tk.sgn), "+v"(tk.madd));
    __asm__("" : "+v"(lo), "+v"(hi), "+v"(m7fff));
    __m512i vm = *vmax;
    int ok = nv_tab_scales(x, a, 0, norm, d6, m7fff, lo, hi, &vm, s);
    for (int64_t g = 0;;) {
        const uint16_t *xg = x + g * NB_NVFP4_BLOCK;
        const uint8_t *sg = s + g;
        uint8_t *qg = q + g * 8;
        const int64_t gn = g + 16 <= last ? g + 16 : last;   /* the next group's start (when g < last) */
        int ok_next = g < last && nv_tab_scales(x + gn * NB_NVFP4_BLOCK, a, gn, norm, d6, m7fff, lo, hi, &vm, s + gn);
        if (!ok) nv_group_tab_mixed(xg, sg, a->scale, tab, qg);
        else
            for (int b = 0; b < 16; b += 2)
                _mm_storeu_si128((__m128i *)(qg + 8 * b), nv_pair_tab(xg + 16 * b, tab->row[sg[b]], tab->row[sg[b + 1]], &tk));
        if (g == last) break;
        ok = ok_next;
        g = gn;
    }
    *vmax = vm;
    return nb;
}

/* ---- four_over_six's per-block pick from the data ----------------------------------------------------- */

/* Sums of 16 f32 lanes per block: f[i] holds 8 partial terms of block 2i (lanes 0-7) and of block
 * 2i+1 (lanes 8-15); returns lane b = the sum of block b's 8 lanes, by a transposing tree. */
NB_AVX512 static inline __m512 nv46_block_sums(const __m512 f[8]) {
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i ib = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const __m512i ic = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    const __m512i id = _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 g[4], h[2];
    for (int j = 0; j < 4; j++)   /* blocks 4j..4j+3, 4 lanes each */
        g[j] = _mm512_add_ps(_mm512_permutex2var_ps(f[2 * j], ia, f[2 * j + 1]), _mm512_permutex2var_ps(f[2 * j], ib, f[2 * j + 1]));
    for (int j = 0; j < 2; j++)   /* blocks 8j..8j+7, 2 lanes each */
        h[j] = _mm512_add_ps(_mm512_permutex2var_ps(g[2 * j], ic, g[2 * j + 1]), _mm512_permutex2var_ps(g[2 * j], id, g[2 * j + 1]));
    return _mm512_add_ps(_mm512_permutex2var_ps(h[0], ie, h[1]), _mm512_permutex2var_ps(h[0], io, h[1]));
}

/* The squared-error terms of one candidate for the pair of blocks in xv (codes c, divisors pp: lane j
 * of the pair's block), as the reference forms them: y = f32(e2m1 value * p), e = f32(x - y), f32(e * e);
 * the even and odd elements' terms added (8 lanes per block). */
NB_AVX512 static inline __m512 nv46_pair_sse(__m512 xe, __m512 xo, __m512i c, __m512 pp, __m512 deq) {
    __m512 ye = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(c, i32v(0xF)), deq), pp);
    __m512 yo = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 16), deq), pp);
    __m512 ee = _mm512_sub_ps(xe, ye), eo = _mm512_sub_ps(xo, yo);
    return _mm512_add_ps(_mm512_mul_ps(ee, ee), _mm512_mul_ps(eo, eo));
}

/* four_over_six without calibrated block amax (nb_nvfp4_46_pick_block per block, then the chosen
 * candidate's static scale byte and codes), 16 blocks a group, the codes of both candidates (block max
 * on 6, and x1.5 on 4) from the threshold table, which holds them because the driver's s2 is the pick's
 * own G / 1536 (checked by the caller). The reference sums each candidate's 16 f32 squared errors in
 * double in element order and keeps 4 iff its sum is strictly lower. Here they are summed in f32 in
 * another order: any order of 16 nonnegative terms lands within 15 * 2^-24 (relative) of the exact
 * sum (2^-20.1), and the reference's within 15 * 2^-53, so a difference beyond 2^-18 of the two sums
 * (2^-19 after the worst rounding of a subnormal threshold; sums below 2^-125 are exact anyway) orders
 * the reference's sums the same way. Two zero sums are a tie in any order (keep 6). Any other block (a
 * near-tie: 1 in 9300 blocks of bench_quant's Gaussian BF16 weight; an overflowed sum) goes to the
 * reference, and so does a group with a scale byte outside the table's run. Returns the blocks done (rows
 * of at least 16 blocks; the last group overlaps). */
NB_AVX512 static int64_t nv46_pick_groups512(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                             uint8_t *s, __m512i *vmax, const nbq_nv_table *tab) {
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb < 16) return 0;
    const __m512 s2 = _mm512_set1_ps(a->scale);
    const __m512 deq = _mm512_loadu_ps(nb_e2m1_deq);
    const __m512i lo = i32v(tab->ok_lo), hi = i32v(tab->ok_hi);
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    nv_tab_k tk;
    nv_tab_k_init(&tk);
    __m512i vm = *vmax;
    uint8_t sb6a[16], sb4a[16];
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
        const int64_t g = g0 + 16 <= nb ? g0 : nb - 16;   /* the last group ends at the row's end */
        const uint16_t *xg = x + g * NB_NVFP4_BLOCK;
        uint8_t *qg = q + g * 8;
        __m512i v[8], t[8];
        for (int i = 0; i < 8; i++) {
            v[i] = _mm512_loadu_si512((const void *)(xg + 32 * i));
            t[i] = _mm512_and_si512(v[i], tk.m7fff);
            vm = _mm512_max_epu16(vm, t[i]);
        }
        const __m512 bam = tree16(t);
        const __m512i sb6 = nv_static16(bam, 256.0f, a->global_amax);
        const __m512i sb4 = nv_static16(_mm512_mul_ps(bam, _mm512_set1_ps(1.5f)), 256.0f, a->global_amax);
        __mmask16 in6 = _mm512_cmpge_epi32_mask(sb6, lo) & _mm512_cmple_epi32_mask(sb6, hi);
        __mmask16 in4 = _mm512_cmpge_epi32_mask(sb4, lo) & _mm512_cmple_epi32_mask(sb4, hi);
        if ((in6 & in4) != 0xFFFF) {   /* rare: the reference row for the whole group */
            nv46_ref_blocks(xg, 0xFFFF, a, qg, s + g);
            continue;
        }
        _mm_storeu_si128((__m128i *)sb6a, _mm512_cvtepi32_epi8(sb6));
        _mm_storeu_si128((__m128i *)sb4a, _mm512_cvtepi32_epi8(sb4));
        const __m512 p6 = _mm512_mul_ps(e4m3_dec16(sb6), s2), p4 = _mm512_mul_ps(e4m3_dec16(sb4), s2);
        __m512 f6[8], f4[8];
        __m512i c6[8], c4[8];
        for (int i = 0; i < 8; i++) {
            const __m512i idx = _mm512_add_epi32(pair_idx, i32v(2 * i));
            const __m512 xe = _mm512_castsi512_ps(_mm512_slli_epi32(v[i], 16));
            const __m512 xo = _mm512_castsi512_ps(_mm512_and_si512(v[i], i32v((int)0xFFFF0000u)));
            c6[i] = nv_pair_codes(v[i], tab->row[sb6a[2 * i]], tab->row[sb6a[2 * i + 1]], &tk);
            c4[i] = nv_pair_codes(v[i], tab->row[sb4a[2 * i]], tab->row[sb4a[2 * i + 1]], &tk);
            f6[i] = nv46_pair_sse(xe, xo, c6[i], _mm512_permutexvar_ps(idx, p6), deq);
            f4[i] = nv46_pair_sse(xe, xo, c4[i], _mm512_permutexvar_ps(idx, p4), deq);
        }
        const __m512 e6 = nv46_block_sums(f6), e4 = nv46_block_sums(f4);
        const __m512 thr = _mm512_mul_ps(_mm512_add_ps(e4, e6), _mm512_set1_ps(0x1p-18f));
        const __mmask16 pick4 = _mm512_cmp_ps_mask(_mm512_sub_ps(e6, e4), thr, _CMP_GT_OQ);
        const __mmask16 keep6 = _mm512_cmp_ps_mask(_mm512_sub_ps(e4, e6), thr, _CMP_GT_OQ) |
                                (_mm512_cmp_ps_mask(e4, _mm512_setzero_ps(), _CMP_EQ_OQ) &
                                 _mm512_cmp_ps_mask(e6, _mm512_setzero_ps(), _CMP_EQ_OQ));
        _mm_storeu_si128((__m128i *)(s + g), _mm512_cvtepi32_epi8(_mm512_mask_mov_epi32(sb6, pick4, sb4)));
        for (int i = 0; i < 8; i++) {
            const __mmask32 m = (__mmask32)(((pick4 >> (2 * i)) & 1) ? 0xFFFFu : 0u) |
                                (__mmask32)(((pick4 >> (2 * i + 1)) & 1) ? 0xFFFF0000u : 0u);
            _mm_storeu_si128((__m128i *)(qg + 16 * i), nv_pack_codes(_mm512_mask_mov_epi16(c6[i], m, c4[i]), &tk));
        }
        const __mmask16 undecided = (__mmask16)~(pick4 | keep6);
        if (__builtin_expect(undecided != 0, 0)) nv46_ref_blocks(xg, undecided, a, qg, s + g);
    }
    *vmax = vm;
    return nb;
}

/* ---- MXFP8 on the bf16 patterns ---------------------------------------------------------------------- */

/* The algorithm of fast_avx2.c's mx_groups (its comments hold the proofs), one block per zmm:
 *  - The E8M0 byte by a closed form from the block's largest magnitude pattern P: ModelOpt's ceil
 *    rule ((P + 31) >> 7) - 8, the OCP floor rule (P >> 7) - 8, both clamped at 0 (mx_codes_bf16).
 *  - x * 2^(127 - code) is x's pattern with its exponent moved, so an element's E4M3 code is one add
 *    on its magnitude pattern mag, rounded to nearest even at bit 4 (lsb = bit 4 of mag):
 *        h = (mag + lsb + C) >> 4 (arithmetic),  C = (127 - code) 128 + 7 - (120 << 7) + 16 MX_BIAS,
 *    is c + MX_BIAS wherever c is the normal E4M3 code. Here MX_BIAS = 0x81 (the AVX2 kernel's is
 *    32): VPACKUSWB saturates h to [0, 255], and 255 - 0x81 = 0x7E is 448, so the pack's saturation
 *    is the clamp and code = subs(h, 0x81) (one op; c <= 0 gives 0). No 16-bit overflow: the scaled
 *    values are at most 512 (h <= 0x101), and code <= 248 keeps mag + C above -28800.
 *  - The reference takes the lanes with c in [-31, 8] (E4M3-subnormal results, the first normal ones
 *    and some below 2^-10: the AVX2 kernel's set), i.e. h in [0x62, 0x89]: one byte compare.
 *  - bf16 subnormal inputs are not patterns with a moved exponent: for code >= MX_REF_CODE, mag +
 *    lsb + C <= 0x7F + 1 + 0xB97 - 12 * 128 = 1559, so h <= 0x61: code 0 (the scaled value is below
 *    2^-11) and not a reference lane. Zeros too (h <= 0x59). Blocks with a smaller code (block max
 *    below ~2^-107, zero blocks) go to the reference whole.
 * Per 64 elements (two blocks) the encode is 16 vector uops: VPTESTMW (lsb), add, masked add, shift
 * (x2), VPACKUSWB, subs, VPACKSSWB (the sign bytes), VPTERNLOG, VPERMQ, sub + compare (the reference
 * lanes), KORTEST; the block maxima add ~6 per 64 (a transpose-and-max tree over 8 blocks). */
enum { MX_BIAS = 0x81, MX_SLOW_LO = MX_BIAS - 31, MX_SLOW_N = 40, MX_REF_CODE = 12, MX_C0 = 127 * 128 + 7 - (120 << 7) + 16 * MX_BIAS };

/* Two 256-bit halves [max of x's block | max of y's block] (16 words each) from two blocks. */
NB_AVX512 static inline __m512i mx_merge256(__m512i x, __m512i y) {
    return _mm512_max_epu16(_mm512_shuffle_i64x2(x, y, 0x44), _mm512_shuffle_i64x2(x, y, 0xEE));
}

/* Four 128-bit lanes [x lo, x hi, y lo, y hi] (8 words each) from two mx_merge256 results. */
NB_AVX512 static inline __m512i mx_merge128(__m512i x, __m512i y) {
    return _mm512_max_epu16(_mm512_shuffle_i64x2(x, y, 0x88), _mm512_shuffle_i64x2(x, y, 0xDD));
}

/* The rare lanes of a block pair: pk is the packed h of blocks b, b+1 (VPACKUSWB order). */
NB_AVX512 __attribute__((noinline)) static void mx_pair_ref(const uint16_t *xb, __m512i pk, const uint8_t *codes,
                                                           uint8_t *qb) {
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    __m512i t = _mm512_sub_epi8(_mm512_permutexvar_epi64(order, pk), _mm512_set1_epi8((char)MX_SLOW_LO));
    uint64_t m = _mm512_cmplt_epu8_mask(t, _mm512_set1_epi8(MX_SLOW_N));
    if ((uint32_t)m) mx_ref_lanes(xb, (uint32_t)m, codes[0], qb);
    if (m >> 32) mx_ref_lanes(xb + NB_MXFP8_BLOCK, (uint32_t)(m >> 32), codes[1], qb + NB_MXFP8_BLOCK);
}

/* The blocks of a BF16 row of at least 8 blocks (else none), 8 blocks (256 elements) a group: their
 * maxima by a transpose-and-max tree on the magnitudes kept in registers, the 8 scale bytes by the
 * closed form, then the codes two blocks at a time. A row that is not whole groups ends with the
 * group of its last 8 blocks, overlapping the one before (those blocks are written twice, the same
 * bytes): the reference tail this replaces cost more than the row's vector blocks (rows of 2880,
 * 2 tail blocks in 90: 0.198 -> 0.089 ns/element in cache, one thread; rows of 896, 4 in 28: 0.73
 * -> 0.10; rows of 4096: 0.08). Returns the blocks done; *vmax collects the block maxima (NaN/Inf:
 * >= 0x7F80). */
NB_AVX512 static int64_t mx_groups512(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s,
                                      __m512i *vmax) {
    const int64_t nb = n / NB_MXFP8_BLOCK;
    if (nb < 8) return 0;
    __m512i c7fff = i16(0x7FFF), c10 = i16(0x10), one = i16(1), c81 = _mm512_set1_epi8((char)MX_BIAS);
    __m512i c80 = _mm512_set1_epi8((char)0x80), slo = _mm512_set1_epi8((char)MX_SLOW_LO), sn = _mm512_set1_epi8(MX_SLOW_N);
    __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    const __m512i round = i16(a->mx_floor ? 0 : 31), c8 = i16(8), cref = i16(MX_REF_CODE), cc0 = i16(MX_C0);
    /* opaque to GCC, so the constants stay in registers (the rare reference calls clobber them all) */
    __asm__("" : "+v"(c7fff), "+v"(c10), "+v"(one), "+v"(c81), "+v"(c80), "+v"(slo), "+v"(sn), "+v"(order));
    _Alignas(64) int32_t cc[16];
    __m512i vm = *vmax;
    for (int64_t g0 = 0; g0 < nb; g0 += 8) {
        const int64_t g = g0 + 8 <= nb ? g0 : nb - 8;
        const uint16_t *xg = x + g * NB_MXFP8_BLOCK;
        uint8_t *qg = q + g * NB_MXFP8_BLOCK;
        __m512i m[8];
        for (int b = 0; b < 8; b++) {
            _mm_prefetch((const char *)(xg + NBQ_PF_AHEAD + b * NB_MXFP8_BLOCK), _MM_HINT_T0);
            m[b] = _mm512_and_si512(_mm512_loadu_si512((const void *)(xg + b * NB_MXFP8_BLOCK)), c7fff);
        }
        /* lanes [0 2 4 6] and [1 3 5 7] (8 words each), then qword b = block b (4 words), then word
         * 0 of qword b = block b's largest magnitude P (the other words: maxima of parts of it) */
        __m512i n0 = mx_merge128(mx_merge256(m[0], m[2]), mx_merge256(m[4], m[6]));
        __m512i n1 = mx_merge128(mx_merge256(m[1], m[3]), mx_merge256(m[5], m[7]));
        __m512i P = _mm512_max_epu16(_mm512_unpacklo_epi64(n0, n1), _mm512_unpackhi_epi64(n0, n1));
        P = _mm512_max_epu16(P, _mm512_srli_epi64(P, 32));
        P = _mm512_max_epu16(P, _mm512_srli_epi64(P, 16));
        vm = _mm512_max_epu16(vm, P);
        /* the closed form in 16-bit lanes (P + 31 <= 0x801E: no wrap unsigned) */
        __m512i code = _mm512_max_epi16(_mm512_sub_epi16(_mm512_srli_epi16(_mm512_add_epi16(P, round), 7), c8), _mm512_setzero_si512());
        _mm_storel_epi64((__m128i *)(s + g), _mm512_cvtepi64_epi8(code));
        __m512i C = _mm512_sub_epi16(cc0, _mm512_slli_epi16(code, 7));
        /* dword 2b = block b's C in both words, for a broadcast load (a load uop, no shuffle) */
        _mm512_store_si512((void *)cc, _mm512_mask_blend_epi16(0xAAAAAAAAu, C, _mm512_slli_epi32(C, 16)));
        const int32_t *ccp = cc;
        __asm__("" : "+r"(ccp));   /* else GCC keeps C in a register and extracts each word (4 p5 uops a block) */
        const __mmask32 ref = _mm512_cmplt_epi16_mask(code, cref) & 0x11111111u;
        for (int b = 0; b < 8; b += 2) {
            const uint16_t *xb = xg + b * NB_MXFP8_BLOCK;
            /* C + lsb into the broadcast (a fresh register: no copy for the merge-masked add) */
            __m512i C0 = _mm512_set1_epi32(ccp[2 * b]), C1 = _mm512_set1_epi32(ccp[2 * b + 2]);
            C0 = _mm512_mask_add_epi16(C0, _mm512_test_epi16_mask(m[b], c10), C0, one);
            C1 = _mm512_mask_add_epi16(C1, _mm512_test_epi16_mask(m[b + 1], c10), C1, one);
            __m512i h0 = _mm512_srai_epi16(_mm512_add_epi16(m[b], C0), 4), h1 = _mm512_srai_epi16(_mm512_add_epi16(m[b + 1], C1), 4);
            __m512i pk = _mm512_packus_epi16(h0, h1);
            __m512i sg = _mm512_packs_epi16(_mm512_loadu_si512((const void *)xb), _mm512_loadu_si512((const void *)(xb + NB_MXFP8_BLOCK)));
            __m512i c = _mm512_ternarylogic_epi32(_mm512_subs_epu8(pk, c81), sg, c80, 0xF8);   /* code | (sg & 0x80) */
            _mm512_storeu_si512((void *)(qg + b * NB_MXFP8_BLOCK), _mm512_permutexvar_epi64(order, c));
            if (__builtin_expect(_mm512_cmplt_epu8_mask(_mm512_sub_epi8(pk, slo), sn) != 0, 0))
                mx_pair_ref(xb, pk, s + g + b, qg + b * NB_MXFP8_BLOCK);
        }
        if (__builtin_expect(ref != 0, 0))
            for (int b = 0; b < 8; b++)
                if (ref >> (4 * b) & 1) mx_ref_lanes(xg + b * NB_MXFP8_BLOCK, 0xFFFFFFFFu, s[g + b], qg + b * NB_MXFP8_BLOCK);
    }
    *vmax = vm;
    return nb;
}

/* ---- FP8 per tensor / per row ------------------------------------------------------------------------ */

/* (the scalar fallbacks fp8_ref_bf16 / fp8_ref_lanes are fast_x86.h's) */

/* Whole 32-element steps of a BF16 row with divisor sc (a normal f32 in [2^-100, 2^100]); dd NB_BF16
 * (ModelOpt's quotient rounded to bf16) or NB_F32. Returns the elements done. */
#define NB_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

/* The bf16 rounding of 32 f32 quotients by VCVTNE2PS2BF16 (RNE; it treats f32 subnormals as zero,
 * and those lanes, |q| < 2^-120, are already on the reference path), in element order. */
NB_AVX512BF16 static inline __m512i rne_pair_hw(__m512 qe, __m512 qo) {
    /* 16-bit lane 2j <- j (even element j), 2j+1 <- 16+j: as 32-bit lanes j | (16+j) << 16 */
    const __m512i j = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i inter = _mm512_or_si512(j, _mm512_slli_epi32(_mm512_add_epi32(j, _mm512_set1_epi32(16)), 16));
    return _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(qo, qe));
}

/* nb_cpu() reads the features once per process, so these per-row checks cost a load and a test. */
static int cpu_has_avx512bf16(void) { return (nb_cpu()->flags & NB_CPU_AVX512_BF16) != 0; }

NB_AVX512 __attribute__((always_inline)) static inline int64_t fp8_steps(const uint16_t *x, int64_t n, float sc,
                                                                        int32_t dd, uint8_t *q, __m512i *vmax,
                                                                        const int hw) {
    const __m512 r = _mm512_set1_ps(1.0f / sc), scv = _mm512_set1_ps(sc);   /* sc in [2^-100, 2^100] */
    /* Nonzero lanes outside these bf16 magnitudes take the reference path: |x| < 2^-60 (div_markstein's
     * residuals would be subnormal), |x/sc| < 2^-6 (E4M3 subnormals; this also keeps f32 subnormals
     * away from VCVTNE2PS2BF16, which flushes them), |x/sc| >= 2^100 (the quotient near overflow). */
    float lim = 0x1p-6f * sc * 1.0625f, hi = 0x1p100f * sc * 0.9375f;
    if (lim < 0x1p-60f) lim = 0x1p-60f;
    uint32_t lu, hu;
    memcpy(&lu, &lim, 4);
    memcpy(&hu, &hi, 4);
    const __m512i tiny = i16((int)((lu >> 16) + 1));
    const __m512i huge = i16(hu >= 0x7F800000u ? 0x7F80 : (int)(hu >> 16));
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        __m512i mag = _mm512_and_si512(v, i16(0x7FFF));
        *vmax = _mm512_max_epu16(*vmax, mag);
        __mmask32 slow = (_mm512_test_epi16_mask(mag, mag) & _mm512_cmplt_epu16_mask(mag, tiny)) |
                         _mm512_cmpgt_epu16_mask(mag, huge);
        /* the magnitudes: quotients >= 0, the sign comes back from x at the end (-0 included) */
        __m512 xe = _mm512_castsi512_ps(_mm512_slli_epi32(mag, 16)), xo = _mm512_castsi512_ps(_mm512_and_si512(mag, i32v((int)0xFFFF0000u)));
        __m512 qe = div_markstein(xe, scv, r), qo = div_markstein(xo, scv, r);
        __m512i ue = _mm512_castps_si512(qe), uo = _mm512_castps_si512(qo);
        __m512i h = dd != NB_BF16 ? rto_pair(ue, uo) : hw ? rne_pair_hw(qe, qo) : rne_pair(ue, uo);
        __m512i c = e4m3_normal16(h, v);
        _mm256_storeu_si256((__m256i *)(q + i), _mm512_cvtepi16_epi8(c));
        if (slow) fp8_ref_lanes(x + i, slow, sc, dd, q + i);
    }
    return i;
}

/* One instance per division dtype, so each loop holds only its own rounding. */
NB_AVX512 static int64_t fp8_steps512(const uint16_t *x, int64_t n, float sc, int32_t dd, uint8_t *q, __m512i *vmax) {
    if (dd == NB_BF16) return fp8_steps(x, n, sc, NB_BF16, q, vmax, 0);
    return fp8_steps(x, n, sc, NB_F32, q, vmax, 0);
}

NB_AVX512BF16 static int64_t fp8_steps512_bf16(const uint16_t *x, int64_t n, float sc, uint8_t *q, __m512i *vmax) {
    return fp8_steps(x, n, sc, NB_BF16, q, vmax, 1);
}

/* ---- FP8 by table: with one divisor per row, the E4M3 code is a function of the bf16 pattern ---- */

#define NB_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c")))

static int cpu_has_avx512vbmi(void) { return (nb_cpu()->flags & NB_CPU_AVX512_VBMI) != 0; }

/* Scaling x by 2^k scales x / sc by 2^k exactly, and every rounding on the way (f32, bf16, E4M3)
 * commutes with that while the quotient is a normal E4M3 value: then code(x) = T[m] + 8*(E - E0)
 * for x's 7 mantissa bits m and biased exponent E, where T[m] is the code of the bf16 with exponent
 * E0 and mantissa m, computed by the arithmetic path above (E0 puts those quotients in (2, 8)).
 * Codes past 448 clamp to 0x7E (the codes are monotone, so the clamp is a min). Quotients below
 * 2^-6 (E4M3 subnormals) and bf16 subnormals go to the reference through the same tiny test. So a
 * row costs 128 arithmetic quotients plus one byte lookup (VPERMI2B) per element.
 *
 * One 32-element step of the table kernel: the E4M3 codes in 16-bit lanes (sign included) and, in
 * *slow, the lanes the table cannot take (nonzero magnitudes below `tiny`: E4M3-subnormal quotients,
 * bf16 subnormals). The table holds T'[m] = T[m] - (m >> 4), so the exponent term comes from one
 * shift of the magnitude, mag >> 4 = 8*E + (m >> 4), with no mask. */
NB_AVX512VBMI __attribute__((always_inline)) static inline __m512i fp8_tab_codes(__m512i v, __m512i tlo, __m512i thi,
                                                                                __m512i k, __m512i tiny, __m512i c7fff,
                                                                                __m512i c7e, __m512i c80, __m512i *vm,
                                                                                __mmask32 *slow) {
    __m512i mag = _mm512_and_si512(v, c7fff);
    *vm = _mm512_max_epu16(*vm, mag);
    *slow = _mm512_mask_cmplt_epu16_mask(_mm512_test_epi16_mask(mag, mag), mag, tiny);
    /* T'[m] into the low byte of each 16-bit lane (the high bytes' lookups are zeroed); VPERMI2B reads
     * only bits 6:0 of an index byte, so the exponent bit above m needs no mask */
    __m512i t = _mm512_maskz_permutex2var_epi8(0x5555555555555555ull, tlo, v, thi);
    __m512i code = _mm512_min_epu16(_mm512_subs_epu16(_mm512_add_epi16(_mm512_srli_epi16(mag, 4), t), k), c7e);
    return _mm512_ternarylogic_epi32(code, _mm512_srli_epi16(v, 8), c80, 0xF8);
}

NB_AVX512VBMI static int64_t fp8_table512(const uint16_t *x, int64_t n, float sc, int32_t dd, uint8_t *q, __m512i *vmax,
                                          const uint16_t *nx, __m512i *nmax) {
    uint32_t su;
    memcpy(&su, &sc, 4);
    const int e0 = (int)(su >> 23) + 2;   /* biased exponent of the table's x: x / sc in (2, 8) */
    /* The table depends on (sc, dd) only: FP8 per tensor has one scale for every row, so each
     * thread keeps the last table it built (building costs ~15% of a 4096-element row). */
    static _Thread_local struct { uint32_t su; int32_t dd; int valid; uint8_t t8[128]; } cache;
    const uint8_t *t8 = cache.t8;
    if (!cache.valid || cache.su != su || cache.dd != dd) {
        uint16_t syn[128];
        for (int m = 0; m < 128; m++) syn[m] = (uint16_t)(e0 << 7 | m);
        __m512i unused = _mm512_setzero_si512();
        if (dd == NB_BF16 && cpu_has_avx512bf16()) fp8_steps512_bf16(syn, 128, sc, cache.t8, &unused);
        else fp8_steps512(syn, 128, sc, dd, cache.t8, &unused);
        for (int m = 0; m < 128; m++) cache.t8[m] = (uint8_t)(cache.t8[m] - (m >> 4));   /* codes 0x40..0x50 */
        cache.su = su;
        cache.dd = dd;
        cache.valid = 1;
    }
    const __m512i tlo = _mm512_loadu_si512((const void *)t8), thi = _mm512_loadu_si512((const void *)(t8 + 64));
    const __m512i k = i16(8 * e0);
    float lim = 0x1p-6f * sc * 1.0625f;
    if (lim < 0x1p-60f) lim = 0x1p-60f;
    uint32_t lu;
    memcpy(&lu, &lim, 4);
    __m512i tiny = i16((int)((lu >> 16) + 1));
    __m512i c7fff = i16(0x7FFF), c7e = i16(0x7E), c80 = i16(0x80);
    /* 64-byte output order of VPACKUSWB's per-lane interleave of two 32-element steps */
    __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    __m512i vm = *vmax, nm = nmax ? *nmax : _mm512_setzero_si512();
    /* opaque to GCC, so the constants stay in registers instead of being rebuilt in the loop (a
     * rare reference call clobbers every vector register, and GCC prefers rematerializing) */
    __asm__("" : "+v"(tiny), "+v"(c7fff), "+v"(c7e), "+v"(c80), "+v"(order));
    int64_t i = 0;
    /* two steps per iteration, packed to bytes by one VPACKUSWB + VPERMQ (codes <= 0xFE) instead of
     * two VPMOVWB: 12 instead of 15 vector uops per 32 elements, all of them on the two 512-bit ports */
    for (; i + 64 <= n; i += 64) {
        {   /* the stream read from memory: the next row for FP8 per channel (1.44 -> 1.17 ms median,
             * 4096x4096, 2 threads), else this row (no measurable change) */
            const uint16_t *pf = (nx ? nx : x) + i + NBQ_PF_AHEAD;
            _mm_prefetch((const char *)pf, _MM_HINT_T0);
            _mm_prefetch((const char *)(pf + 32), _MM_HINT_T0);
        }
        __m512i v0 = _mm512_loadu_si512((const void *)(x + i)), v1 = _mm512_loadu_si512((const void *)(x + i + 32));
        if (nx) {
            nm = _mm512_max_epu16(nm, _mm512_and_si512(_mm512_loadu_si512((const void *)(nx + i)), c7fff));
            nm = _mm512_max_epu16(nm, _mm512_and_si512(_mm512_loadu_si512((const void *)(nx + i + 32)), c7fff));
        }
        __mmask32 s0, s1;
        __m512i c0 = fp8_tab_codes(v0, tlo, thi, k, tiny, c7fff, c7e, c80, &vm, &s0);
        __m512i c1 = fp8_tab_codes(v1, tlo, thi, k, tiny, c7fff, c7e, c80, &vm, &s1);
        _mm512_storeu_si512((void *)(q + i), _mm512_permutexvar_epi64(order, _mm512_packus_epi16(c0, c1)));
        if (__builtin_expect((s0 | s1) != 0, 0)) {
            fp8_ref_lanes(x + i, s0, sc, dd, q + i);
            fp8_ref_lanes(x + i + 32, s1, sc, dd, q + i + 32);
        }
    }
    /* whole steps, then the row's last 32 elements as one more (overlapping) step: the elements it
     * repeats get the same bytes, and a short tail costs a step instead of 1-31 reference divisions */
    for (; i < n && n >= 32; i += 32) {
        if (i + 32 > n) i = n - 32;
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        if (nx) nm = _mm512_max_epu16(nm, _mm512_and_si512(_mm512_loadu_si512((const void *)(nx + i)), c7fff));
        __mmask32 slow;
        __m512i code = fp8_tab_codes(v, tlo, thi, k, tiny, c7fff, c7e, c80, &vm, &slow);
        _mm256_storeu_si256((__m256i *)(q + i), _mm512_cvtepi16_epi8(code));
        if (__builtin_expect(slow != 0, 0)) fp8_ref_lanes(x + i, slow, sc, dd, q + i);
    }
    *vmax = vm;
    if (nmax) *nmax = nm;
    return i;
}

/* ---- entry ---------------------------------------------------------------------------------------------- */

/* 2 when the row holds a NaN/Inf (any magnitude pattern >= 0x7F80), else 0. */
NB_AVX512 static int row_status(__m512i vmax, const uint16_t *x, int64_t from, int64_t n) {
    int bad = _mm512_cmpge_epu16_mask(vmax, i16(0x7F80)) != 0;
    for (int64_t i = from; i < n; i++) bad |= (x[i] & 0x7F80) == 0x7F80;
    return bad ? 2 : 0;
}

NB_AVX512 int nbq_avx512_nvfp4_table_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a,
                                          const nbq_nv_table *tab, uint8_t *q, uint8_t *s) {
    const int pick = f == NB_FMT_NVFP4_46 && !a->block_amax;   /* the per-block pick */
    if (pick && (!tab || !nv46_table_fits(a))) return 1;   /* the f32 rows */
    float tail[512];
    __m512i vmax = _mm512_setzero_si512();
    const float norm = f == NB_FMT_NVFP4 ? 448.0f : 256.0f;
    const int64_t nb = n / NB_NVFP4_BLOCK;
    if (nb >= 1 && nb < 16) {
        /* a row of 1-15 blocks (stories260K's are 4): one group on a copy padded with zero blocks
         * (block amax 0 when static), of which only the row's blocks are copied out; zeros leave vmax
         * alone. Every branch a group can take is exact, so the padding can only cost time: a padded
         * block whose divisor (1.0 * s2, the 0 -> 1.0 rule) the fast path cannot take sends the group
         * to the reference arithmetic (nv_pair_ref, nv_group_tab_mixed), as such a block would in a
         * longer row. 4096x64 BF16 rows, 2 threads: 2.3 -> 0.55 ms (0.006 -> 0.024 of memcpy). */
        uint16_t xp[256];
        float bp[16];
        uint8_t qp[128], sp[16];
        nb_qrow_args t = nbq_nv_pad_row(x, nb, a, xp, bp);
        if (pick) nv46_pick_groups512(xp, 256, &t, qp, sp, &vmax, tab);   /* zero blocks: both sums 0, keep 6 */
        else if (tab) nv_tab_groups512(xp, 256, &t, norm, qp, sp, &vmax, tab);
        else nv_groups512(xp, 256, &t, norm, qp, sp, &vmax);
        memcpy(q, qp, (size_t)nb * 8);
        memcpy(s, sp, (size_t)nb);
        return row_status(vmax, x, nb * NB_NVFP4_BLOCK, n);
    }
    int64_t g = pick  ? nv46_pick_groups512(x, n, a, q, s, &vmax, tab)
              : tab ? nv_tab_groups512(x, n, a, norm, q, s, &vmax, tab) : nv_groups512(x, n, a, norm, q, s, &vmax);
    int64_t rest = n - g * NB_NVFP4_BLOCK;   /* only past the last block when n is not whole blocks */
    if (rest > 0) {
        nb_qrow_args t = *a;
        if (t.block_amax) t.block_amax += g;
        for (int64_t k = 0; k < rest; k++) tail[k] = nbn_bf16_to_f32(x[g * NB_NVFP4_BLOCK + k]);
        if (f == NB_FMT_NVFP4) nb_nvfp4_quantize_row_ref(tail, rest, &t, q + g * 8, s + g);
        else nb_nvfp4_46_quantize_row_ref(tail, rest, &t, q + g * 8, s + g);
    }
    return row_status(vmax, x, g * NB_NVFP4_BLOCK, n);
}

NB_AVX512 int nbq_avx512_quantize_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                       uint8_t *s) {
    float tail[512];
    __m512i vmax = _mm512_setzero_si512();
    switch (f) {
    case NB_FMT_NVFP4:
    case NB_FMT_NVFP4_46:
        return nbq_avx512_nvfp4_table_bf16(f, x, n, a, NULL, q, s);
    case NB_FMT_MXFP8: {
        int64_t g = mx_groups512(x, n, a, q, s, &vmax);
        int64_t rest = n - g * NB_MXFP8_BLOCK;
        if (rest > 0) {
            for (int64_t k = 0; k < rest; k++) tail[k] = nbn_bf16_to_f32(x[g * NB_MXFP8_BLOCK + k]);
            nb_mxfp8_quantize_row_ref(tail, rest, a, q + g * NB_MXFP8_BLOCK, s + g);
        }
        return row_status(vmax, x, g * NB_MXFP8_BLOCK, n);
    }
    case NB_FMT_FP8_TENSOR:
    case NB_FMT_FP8_CHANNEL: {
        if (a->div_dtype != NB_BF16 && a->div_dtype != NB_F32) return 1;
        if (!(a->scale >= 0x1p-100f && a->scale <= 0x1p100f)) return 1;
        /* the table: per tensor, each thread builds it once (any row of 32 or more pays off); per
         * channel, once a row (rows of 1024 or more pay off) */
        int table = (n >= 1024 || (f == NB_FMT_FP8_TENSOR && n >= 32)) && cpu_has_avx512vbmi();
        int64_t i = table ? fp8_table512(x, n, a->scale, a->div_dtype, q, &vmax, NULL, NULL)
                    : a->div_dtype == NB_BF16 && cpu_has_avx512bf16() ? fp8_steps512_bf16(x, n, a->scale, q, &vmax)
                    : fp8_steps512(x, n, a->scale, a->div_dtype, q, &vmax);
        if (i < n) fp8_ref_bf16(x + i, n - i, a->scale, a->div_dtype, q + i);
        return row_status(vmax, x, i, n);
    }
    default:
        return 1;
    }
}

NB_AVX512 static uint32_t max16(__m512i v) {
    uint16_t t[32];
    _mm512_storeu_si512((void *)t, v);
    uint32_t m = 0;
    for (int k = 0; k < 32; k++) m = t[k] > m ? t[k] : m;
    return m;
}

NB_AVX512 int nbq_avx512_fp8_row_next_bf16(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                           const uint16_t *next, uint32_t *next_max) {
    if (!next || n < 1024 || !cpu_has_avx512vbmi() || (a->div_dtype != NB_BF16 && a->div_dtype != NB_F32) ||
        !(a->scale >= 0x1p-100f && a->scale <= 0x1p100f)) {
        int st = nbq_avx512_quantize_bf16(NB_FMT_FP8_CHANNEL, x, n, a, q, NULL);
        if (next) {
            uint32_t m = 0;
            for (int64_t i = 0; i < n; i++) m = (uint32_t)(next[i] & 0x7FFF) > m ? (uint32_t)(next[i] & 0x7FFF) : m;
            *next_max = m;
        }
        return st;
    }
    __m512i vmax = _mm512_setzero_si512(), nmax = _mm512_setzero_si512();
    int64_t i = fp8_table512(x, n, a->scale, a->div_dtype, q, &vmax, next, &nmax);
    uint32_t m = max16(nmax);
    for (int64_t k = i; k < n; k++) m = (uint32_t)(next[k] & 0x7FFF) > m ? (uint32_t)(next[k] & 0x7FFF) : m;
    *next_max = m;
    if (i < n) fp8_ref_bf16(x + i, n - i, a->scale, a->div_dtype, q + i);
    return row_status(vmax, x, i, n);
}

#else /* not x86-64 with GNU C */

int nbq_avx512_quantize_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                             uint8_t *s) {
    (void)f; (void)x; (void)n; (void)a; (void)q; (void)s;
    return 1;
}

int nbq_avx512_fp8_row_next_bf16(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                 const uint16_t *next, uint32_t *next_max) {
    (void)x; (void)n; (void)a; (void)q; (void)next; (void)next_max;
    return 1;
}

int nbq_avx512_nvfp4_table_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a,
                                const nbq_nv_table *tab, uint8_t *q, uint8_t *s) {
    (void)f; (void)x; (void)n; (void)a; (void)tab; (void)q; (void)s;
    return 1;
}

#endif

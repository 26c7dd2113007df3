/* Private interface of the fast quantizer paths (core/src/cpu/fast_*.c): the AVX2 row functions,
 * the exact table-driven MXFP8 scale byte shared by the AVX2 path and the CUDA kernels, and the
 * bulk dtype helpers the drivers can use. Tests include it to call each path directly. */
#ifndef NIBBLE_QUANT_FAST_INTERNAL_H
#define NIBBLE_QUANT_FAST_INTERNAL_H

#include "quant/numerics.h"   /* the scalar arithmetic the fast paths' rare lanes share with the references */
#include "quant/quant_internal.h"

/* --- MXFP8 scale byte without libm ------------------------------------------------------------ */
/* ModelOpt's ceil rule e = ceil(f32(log2(d))), d = f32(amax/448), is k or k+1 inside the binade
 * [2^k, 2^(k+1)) of d; it is k+1 from the first bit pattern of d where the reference says so.
 * Table entry k+127 (k = -127..127) holds that first f32 bit pattern (UINT32_MAX: never).
 * Built once from the reference's own expression; the tests hold the rule to nb_mxfp8_scale_byte. */
enum { NBQ_MX_TABLE = 255 };
const uint32_t *nbq_mx_ceil_table(void);
/* nb_mxfp8_scale_byte(amax, floor) from integer operations and the table (amax finite, >= 0). */
uint8_t nbq_mx_scale_byte_fast(float block_amax, int ocp_floor);

/* --- AVX2 rows (fast_avx2.c, NVFP4: fast_avx2_nvfp4.c); only call when nbq_cpu_has_avx2() ------- */
/* The CPU runs the AVX2 rows (AVX2+FMA+F16C; cpu/features.c reads the bits). */
int nbq_cpu_has_avx2(void);
void nbq_avx2_nvfp4_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
void nbq_avx2_nvfp4_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
void nbq_avx2_nvfp4_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y);
void nbq_avx2_nvfp4_46_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
void nbq_avx2_nvfp4_46_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y);
void nbq_avx2_mxfp8_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
void nbq_avx2_mxfp8_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
void nbq_avx2_mxfp8_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y);
void nbq_avx2_fp8_quantize_row(const float *x, int64_t n, const nb_qrow_args *a, uint8_t *q, uint8_t *s);
void nbq_avx2_fp8_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, const nb_qrow_args *a, float *y);
void nbq_avx2_fp8_fake_row(const float *x, int64_t n, const nb_qrow_args *a, float *y);

/* Element kernels of the AVX2 path on arrays (n any), exposed so tests can sweep bit patterns
 * against nb_f32_to_e4m3 / nb_e4m3_to_f32 / nb_f32_to_e2m1 / nb_f32_to_bf16 / nb_f32_to_f16. */
void nbq_avx2_e4m3_encode(const float *x, int64_t n, uint8_t *out);
void nbq_avx2_e4m3_decode(const uint8_t *b, int64_t n, float *out);
void nbq_avx2_e2m1_encode(const float *x, int64_t n, uint8_t *out);

/* --- bulk dtype helpers (dispatched: AVX2/F16C when present, plain C otherwise) ---------------- */
/* n contiguous F32/BF16/F16 elements -> f32 (exact). */
void nbq_fast_load_f32(const void *src, nb_dtype dt, int64_t n, float *out);
/* n f32 -> F32/BF16/F16 (RNE, as nb_f32_to_bf16 / nb_f32_to_f16). */
void nbq_fast_store_f32(void *dst, nb_dtype dt, int64_t n, const float *in);
/* One pass over n contiguous F32/BF16/F16 elements: max |x| over the finite ones, and whether
 * any element is NaN/Inf (then *nonfinite = 1 and the max is meaningless). */
float nbq_fast_absmax(const void *src, nb_dtype dt, int64_t n, int *nonfinite);
/* The same, split over ctx's threads (ctx may be NULL: one thread). */
float nbq_fast_absmax_mt(nb_ctx *ctx, const void *src, nb_dtype dt, int64_t n, int *nonfinite);

/* max |x| of each of `rows` rows of n contiguous elements (finite data), split over ctx's threads. */
void nbq_fast_row_absmax_mt(nb_ctx *ctx, const void *src, nb_dtype dt, int64_t rows, int64_t n, float *out);
/* nbq_check_finite and the data's per-tensor amax in one threaded pass: *out is *p with amax filled
 * in where p asks for it "from the data" (NVFP4 dynamic, FP8 per tensor), so plan_init skips its pass. */
nb_status nbq_check_finite_params(nb_ctx *ctx, const nb_tensor *x, const char *what, const nb_qparams *p,
                                  nb_qparams *out);

/* --- AVX-512 BF16-input quantize kernels (fast_avx512.c) ------------------------------------------- */
/* The CPU runs the AVX-512 kernels (AVX-512 F/BW/VL/DQ and the AVX2 rows). */
int nbq_cpu_has_avx512(void);
/* Quantize one BF16 row (n a multiple of the format's block) bit-equal to the format's reference
 * row. Returns 0 when done, 2 when the row holds a NaN/Inf (its output is then meaningless, but
 * written without harm), 1 when these arguments are not handled (NVFP4_46's per-block pick, FP8 with
 * an f16 division or a scale outside [2^-100, 2^100]): then run the f32 row. */
int nbq_avx512_quantize_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                             uint8_t *s);
/* FP8 per row (NB_FMT_FP8_CHANNEL's kernel) that also collects the next row's largest magnitude
 * pattern (x & 0x7FFF; 0x7F80 or more means NaN/Inf) into *next_max while this row is quantized, so
 * the per-channel driver's reads of row r+1 overlap row r's arithmetic instead of following it.
 * next may be NULL (last row). Returns as nbq_avx512_quantize_bf16; *next_max is set whenever next
 * is given, whatever the return. */
int nbq_avx512_fp8_row_next_bf16(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                                 const uint16_t *next, uint32_t *next_max);
/* NVFP4 by thresholds: with weight_scale_2 fixed per tensor, a block's divisor p = f32(e4m3(sb) * s2)
 * takes one of 126 values, and an element's E2M1 code is the number of boundaries its bf16 magnitude
 * reaches: code = #{j : |x| >= T_j(sb)}, T_j(sb) the smallest bf16 magnitude whose quotient
 * f32(|x| / p) passes boundary j (0.25, 1.25, 2.5, 5 when above; 0.75, 1.75, 3.5 when at or above).
 * The T_j rise with j, so the count is found by a binary search of three greater-than compares.
 * row[sb] holds T_j - 1 for j = 0..6 (word 7 unused), twice: one copy per 128-bit lane of a block.
 * ok[sb] = 0 where p is not finite and positive or above 2^16 (those blocks take the reference). */
typedef struct nbq_nv_table {
    _Alignas(32) int16_t row[128][16];
    uint8_t ok[128];
    int32_t ok_lo, ok_hi;   /* set by nbq_nv_table_finish: ok[sb] for all sb in [ok_lo, ok_hi] (may be empty) */
} nbq_nv_table;
/* Fill t for weight_scale_2 s2 by binary search with the reference's own division (126 x 7 searches,
 * ~70 us; the range form fills scale bytes [sb_begin, sb_end) so a driver can split it over threads,
 * then calls nbq_nv_table_finish once). */
void nbq_nv_table_build(float s2, nbq_nv_table *t);
void nbq_nv_table_build_range(float s2, nbq_nv_table *t, int sb_begin, int sb_end);
/* After the ranges: the run of usable scale bytes, so a kernel checks 16 blocks with one compare. */
void nbq_nv_table_finish(nbq_nv_table *t);
/* nbq_avx512_quantize_bf16 for NVFP4 / static NVFP4_46 rows with a table built for a->scale. */
int nbq_avx512_nvfp4_table_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a,
                                const nbq_nv_table *tab, uint8_t *q, uint8_t *s);
/* The same for the AVX2 path (fast_avx2_nvfp4.c, only call when nbq_cpu_has_avx2()): NVFP4 / static
 * NVFP4_46 BF16 rows bit-equal to the reference, from a table built for a->scale (tab required).
 * Returns as nbq_avx512_quantize_bf16: 1 for NVFP4_46 without block amax (or another format). */
int nbq_avx2_nvfp4_table_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a,
                              const nbq_nv_table *tab, uint8_t *q, uint8_t *s);
/* Whether nb_quantize on ctx may use nbq_avx2_nvfp4_table_bf16 for format f: f's quantize row on ctx
 * is the AVX2 one (the "avx2" or "avx512" path, not replaced by nb_qformat_set_rows). */
int nbq_avx2_nv_table_for(const nb_ctx *ctx, nb_qformat f);
/* MXFP8, FP8 per tensor and FP8 per channel BF16 rows on the AVX2 path (fast_avx2.c, only call when
 * nbq_cpu_has_avx2()), bit-equal to the reference rows: MXFP8 on the bf16 patterns (the E8M0 scale is
 * a power of two), FP8 by a per-(scale, division dtype) E4M3 table looked up with VPSHUFB. Returns as
 * nbq_avx512_quantize_bf16: 0 done, 2 the row holds a NaN/Inf, 1 not handled (NVFP4 formats, FP8 with
 * an f16 division or a scale outside [2^-100, 2^100]): then run the f32 row. */
int nbq_avx2_quantize_bf16(nb_qformat f, const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                           uint8_t *s);
/* nbq_avx512_fp8_row_next_bf16 for the AVX2 path: an FP8 row (per channel: the table is built for this
 * row's scale) that also collects the next row's largest magnitude pattern into *next_max (set whenever
 * next is given, whatever the return). */
int nbq_avx2_fp8_row_next_bf16(const uint16_t *x, int64_t n, const nb_qrow_args *a, uint8_t *q,
                               const uint16_t *next, uint32_t *next_max);
/* For the tests (AVX2 CPUs): 1 when the AVX2 FP8 table for divisor sc (normal, in [2^-100, 2^100]) and division
 * dtype dd (NB_F32 / NB_BF16) splits into the two 16-entry VPSHUFB tables (fast_avx2.c proves it
 * always does; the kernel checks every table it builds all the same and runs the f32 row if not). */
int nbq_avx2_fp8_table_ok(float sc, int32_t dd);
/* Whether nb_quantize may use nbq_avx2_quantize_bf16 / nbq_avx2_fp8_row_next_bf16 for format f: f is
 * MXFP8 or FP8 and its quantize row on ctx is the AVX2 one. */
int nbq_avx2_bf16_for(const nb_ctx *ctx, nb_qformat f);
/* Whether nb_quantize on ctx may use nbq_avx512_quantize_bf16 for format f: ctx runs the "avx512" path
 * and f still has its AVX2 rows there (nb_qformat_set_rows has not replaced them). */
int nbq_bf16_kernels_for(const nb_ctx *ctx, nb_qformat f);

void nbq_avx2_load_f32(const void *src, nb_dtype dt, int64_t n, float *out);
void nbq_avx2_store_f32(void *dst, nb_dtype dt, int64_t n, const float *in);
float nbq_avx2_absmax(const void *src, nb_dtype dt, int64_t n, int *nonfinite);

/* Elements ahead that the BF16 kernels (AVX2 and AVX-512) prefetch in the stream they read from memory (the row, or the next
 * row for FP8 per channel): 2 KiB, past the ends of rows and 4 KiB pages where the hardware streamer
 * stops (prefetches never fault, so running past the tensor is harmless). On a 4096x4096 tensor, 2
 * threads, AVX2: FP8 per tensor 2.7-3.1 -> 2.1-2.3 ms, per channel 3.2-3.9 -> 2.8-3.0 ms (a shared machine). */
enum { NBQ_PF_AHEAD = 1024 };

#endif

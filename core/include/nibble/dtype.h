/* Element types and their exact scalar conversions.
 * nb_dtype values are stable (they are stored in nibble checkpoints): append, never renumber.
 * Conversions follow PyTorch bit for bit (FORMATS.md §6): BF16 and F16 round to nearest even,
 * E4M3FN/E5M2 round to nearest even, E2M1 rounds to nearest even on its grid. */
#ifndef NIBBLE_DTYPE_H
#define NIBBLE_DTYPE_H

#include <stdint.h>
#include "nibble/status.h"

typedef enum nb_dtype {
    NB_F32  = 0,
    NB_F16  = 1,
    NB_BF16 = 2,
    NB_F64  = 3,
    NB_E4M3 = 4,   /* float8_e4m3fn: no inf, NaN = 0x7F/0xFF, max 448 */
    NB_E5M2 = 5,   /* float8_e5m2: IEEE-like, inf and NaN, max 57344 */
    NB_E8M0 = 6,   /* float8_e8m0fnu: 2^(b-127), 0xFF = NaN, no zero, no sign */
    NB_E2M1 = 7,   /* fp4 code (sign<<3 | magnitude index), two per byte, even element in the low nibble */
    NB_U8   = 8,
    NB_I8   = 9,
    NB_I16  = 10,
    NB_U16  = 11,
    NB_I32  = 12,
    NB_U32  = 13,
    NB_I64  = 14,
    NB_U64  = 15,
    NB_BOOL = 16,
    NB_DTYPE_COUNT = 17
} nb_dtype;

typedef struct nb_dtype_traits {
    const char *name;       /* nibble's name: "f32", "bf16", "e4m3", "e2m1", ... */
    const char *st_name;    /* safetensors dtype string ("F32", "F8_E4M3", "F4", ...) */
    int bits;               /* bits per logical element (4 for E2M1) */
    int is_float;
    int is_signed;
} nb_dtype_traits;

/* Traits of a dtype; NULL when out of range. */
NB_API const nb_dtype_traits *nb_dtype_info(nb_dtype dt);
/* Look a dtype up by nibble name or safetensors string (case-sensitive). Returns -1 if unknown. */
NB_API int nb_dtype_from_name(const char *name);
NB_API int nb_dtype_from_st_name(const char *st_name);
/* Bytes needed for n logical elements (rounded up for sub-byte dtypes). */
NB_API int64_t nb_dtype_nbytes(nb_dtype dt, int64_t n);

/* --- scalar conversions --------------------------------------------------------------- */
NB_API uint16_t nb_f32_to_bf16(float x);        /* RNE; any NaN -> 0x7FC0 (as PyTorch) */
NB_API float    nb_bf16_to_f32(uint16_t h);
NB_API uint16_t nb_f32_to_f16(float x);         /* RNE, overflow -> inf, NaN -> 0x7E00 with its sign (as PyTorch) */
NB_API float    nb_f16_to_f32(uint16_t h);
NB_API uint8_t  nb_f32_to_e4m3(float x);        /* clamp to [-448, 448] then RNE (what quantizers use); NaN -> 0x7F */
NB_API uint8_t  nb_f32_to_e4m3_raw(float x);    /* PyTorch's non-saturating cast: |x| > 464 -> 0x7F/0xFF (NaN) */
NB_API float    nb_e4m3_to_f32(uint8_t b);
NB_API uint8_t  nb_f32_to_e5m2(float x);        /* clamp to [-57344, 57344] then RNE; NaN -> 0x7F */
NB_API uint8_t  nb_f32_to_e5m2_raw(float x);    /* PyTorch's cast: overflow -> inf (0x7C/0xFC) */
NB_API float    nb_e5m2_to_f32(uint8_t b);
NB_API uint8_t  nb_f32_to_e8m0(float x);        /* PyTorch float8_e8m0fnu cast: sign ignored, RNE on the exponent, NaN/inf -> 0xFF, 0 -> 0x00 */
NB_API float    nb_e8m0_to_f32(uint8_t b);      /* 2^(b-127); 0xFF -> NaN */
NB_API uint8_t  nb_f32_to_e2m1(float x);        /* ModelOpt _cast_fp4: RNE on {0,.5,1,1.5,2,3,4,6}, saturate, code 8 for x<0 */
NB_API float    nb_e2m1_to_f32(uint8_t code);   /* low 4 bits used */

/* Convert n contiguous elements from src (type st) into dst (type dt). Packed E2M1 is
 * read/written two per byte (even element low nibble); n must then be even.
 * Converting into E2M1 quantizes each value with nb_f32_to_e2m1 (no scaling). */
NB_API nb_status nb_convert(void *dst, nb_dtype dt, const void *src, nb_dtype st, int64_t n);
/* Load element i of a contiguous array as double / store a double (used by get/set and tests). */
NB_API double nb_load_elem(const void *base, nb_dtype dt, int64_t i);
NB_API void   nb_store_elem(void *base, nb_dtype dt, int64_t i, double v);

#endif

/* GGUF (v2/v3) reader: metadata of every type, tensor directory, and tensors as F32/F16/BF16 views
 * or dequantized to F32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4, NVFP4 bit-exact with
 * ggml's reference dequantize_row_*). The file is mapped read-only; every header field is validated
 * when it is opened (NB_ERR_FORMAT naming the file and the key or tensor at fault). */
#ifndef NIBBLE_GGUF_H
#define NIBBLE_GGUF_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/tensor.h"

typedef struct nb_gguf nb_gguf;

typedef enum nb_gguf_type {          /* metadata value types, numbered as in the GGUF spec */
    NB_GGUF_UINT8 = 0, NB_GGUF_INT8 = 1, NB_GGUF_UINT16 = 2, NB_GGUF_INT16 = 3,
    NB_GGUF_UINT32 = 4, NB_GGUF_INT32 = 5, NB_GGUF_FLOAT32 = 6, NB_GGUF_BOOL = 7,
    NB_GGUF_STRING = 8, NB_GGUF_ARRAY = 9, NB_GGUF_UINT64 = 10, NB_GGUF_INT64 = 11,
    NB_GGUF_FLOAT64 = 12
} nb_gguf_type;

typedef enum nb_ggml_type {          /* tensor types, numbered as ggml's enum ggml_type */
    NB_GGML_F32 = 0, NB_GGML_F16 = 1, NB_GGML_Q4_0 = 2, NB_GGML_Q4_1 = 3,
    NB_GGML_Q5_0 = 6, NB_GGML_Q5_1 = 7, NB_GGML_Q8_0 = 8, NB_GGML_Q8_1 = 9,
    NB_GGML_Q2_K = 10, NB_GGML_Q3_K = 11, NB_GGML_Q4_K = 12, NB_GGML_Q5_K = 13,
    NB_GGML_Q6_K = 14, NB_GGML_Q8_K = 15, NB_GGML_IQ2_XXS = 16, NB_GGML_IQ2_XS = 17,
    NB_GGML_IQ3_XXS = 18, NB_GGML_IQ1_S = 19, NB_GGML_IQ4_NL = 20, NB_GGML_IQ3_S = 21,
    NB_GGML_IQ2_S = 22, NB_GGML_IQ4_XS = 23, NB_GGML_I8 = 24, NB_GGML_I16 = 25,
    NB_GGML_I32 = 26, NB_GGML_I64 = 27, NB_GGML_F64 = 28, NB_GGML_IQ1_M = 29,
    NB_GGML_BF16 = 30, NB_GGML_TQ1_0 = 34, NB_GGML_TQ2_0 = 35, NB_GGML_MXFP4 = 39,
    NB_GGML_NVFP4 = 40, NB_GGML_Q1_0 = 41
} nb_ggml_type;

enum { NB_GGUF_DEFAULT_ALIGNMENT = 32, NB_GGUF_MAX_DIMS = 4 };

typedef struct nb_gguf_tensor_info {
    const char *name;
    int32_t type;                     /* nb_ggml_type */
    int32_t ndim;                     /* 0..4 as stored (ne[i] = 1 beyond ndim) */
    int64_t ne[4];                    /* ggml order: ne[0] is the contiguous (row) dimension */
    int64_t offset;                   /* absolute file offset of the data */
    int64_t nbytes;
} nb_gguf_tensor_info;

/* Map and validate a GGUF file. v1 and big-endian files are NB_ERR_UNSUPPORTED; anything
 * malformed (bad magic, unknown version, truncation, absurd counts, unknown value or tensor type,
 * duplicate keys or tensor names, data past the end, a row not a multiple of the block size,
 * misaligned data) is NB_ERR_FORMAT. */
NB_API nb_status nb_gguf_open(nb_ctx *ctx, const char *path, nb_gguf **out);
NB_API void nb_gguf_close(nb_gguf *g);
NB_API uint32_t nb_gguf_version(const nb_gguf *g);
NB_API uint32_t nb_gguf_alignment(const nb_gguf *g);     /* general.alignment, default 32 */
NB_API int64_t nb_gguf_data_offset(const nb_gguf *g);    /* absolute file offset of the aligned data section */
NB_API int64_t nb_gguf_file_size(const nb_gguf *g);
NB_API nb_buffer *nb_gguf_buffer(const nb_gguf *g);      /* the read-only mapping (borrowed; retain to keep) */

/* Metadata, in file order. Out-of-range indices give 0 / NULL / -1. */
NB_API int64_t nb_gguf_kv_count(const nb_gguf *g);
NB_API const char *nb_gguf_kv_key(const nb_gguf *g, int64_t i);
NB_API int64_t nb_gguf_find_key(const nb_gguf *g, const char *key);        /* -1 if absent */
NB_API nb_gguf_type nb_gguf_kv_type(const nb_gguf *g, int64_t i);
/* Scalars: any integer/bool type widens to int64 (UINT64 above INT64_MAX keeps its bits: cast the
 * result to uint64_t), float types to double. kv_int of a float and kv_float of an integer convert;
 * strings and arrays give 0. */
NB_API int64_t nb_gguf_kv_int(const nb_gguf *g, int64_t i);
NB_API double nb_gguf_kv_float(const nb_gguf *g, int64_t i);
/* Strings are NUL-terminated copies, but may contain NUL bytes themselves: len is authoritative.
 * NULL (len 0) when the value is not a string. */
NB_API const char *nb_gguf_kv_str(const nb_gguf *g, int64_t i, uint64_t *len);
/* Arrays. arr_type is the element type (NB_GGUF_ARRAY for an array of arrays, whose elements are
 * validated and skipped: count only). Numeric and bool arrays are packed little-endian values,
 * copied and aligned to their element size; NULL for string and nested arrays. */
NB_API nb_gguf_type nb_gguf_arr_type(const nb_gguf *g, int64_t i);
NB_API int64_t nb_gguf_arr_count(const nb_gguf *g, int64_t i);
NB_API const void *nb_gguf_arr_data(const nb_gguf *g, int64_t i);
NB_API const char *nb_gguf_arr_str(const nb_gguf *g, int64_t i, int64_t j, uint64_t *len);

/* Tensor directory, in file order. */
NB_API int64_t nb_gguf_tensor_count(const nb_gguf *g);
NB_API const nb_gguf_tensor_info *nb_gguf_tensor_at(const nb_gguf *g, int64_t i);
NB_API int64_t nb_gguf_find_tensor(const nb_gguf *g, const char *name);     /* -1 if absent */
NB_API const void *nb_gguf_tensor_data(const nb_gguf *g, int64_t i);        /* raw bytes in the mapping */
/* The tensor in row-major shape (ne reversed). F32/F16/BF16 (and F64/I8/I16/I32/I64) come back as
 * zero-copy views of the mapping; quantized types are dequantized into a new F32 tensor.
 * NB_ERR_NOT_FOUND for an unknown name, NB_ERR_UNSUPPORTED for a type without a dequantizer. */
NB_API nb_status nb_gguf_get(nb_ctx *ctx, nb_gguf *g, const char *name, nb_tensor **out);

/* ggml type traits: elements per block and bytes per block (0 for an unknown type), name
 * ("Q4_K", ... or NULL), and whether nb_ggml_dequantize handles it. */
NB_API int64_t nb_ggml_block_size(int32_t type);
NB_API int64_t nb_ggml_type_size(int32_t type);
NB_API const char *nb_ggml_type_name(int32_t type);
NB_API int nb_ggml_can_dequantize(int32_t type);
/* Dequantize n elements (a multiple of the type's block size) of one row: F32/F16/BF16 convert,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, NVFP4 decode exactly as ggml's
 * reference dequantize_row_* does (same float operations in the same order). */
NB_API nb_status nb_ggml_dequantize(nb_ctx *ctx, int32_t type, const void *src, float *dst, int64_t n);

#endif

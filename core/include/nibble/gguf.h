/* GGUF (v2/v3) reader: metadata of every type, tensor directory, and tensors as F32/F16/BF16 views
 * or dequantized to F32 (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K bit-exact with ggml's reference). */
#ifndef NIBBLE_GGUF_H
#define NIBBLE_GGUF_H

#include <stdint.h>
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
    NB_GGML_Q6_K = 14, NB_GGML_Q8_K = 15, NB_GGML_BF16 = 30, NB_GGML_NVFP4 = 40
} nb_ggml_type;

typedef struct nb_gguf_tensor_info {
    const char *name;
    int32_t type;                     /* nb_ggml_type */
    int32_t ndim;
    int64_t ne[4];                    /* ggml order: ne[0] is the contiguous (row) dimension */
    int64_t offset;                   /* absolute file offset of the data */
    int64_t nbytes;
} nb_gguf_tensor_info;

nb_status nb_gguf_open(nb_ctx *ctx, const char *path, nb_gguf **out);
void nb_gguf_close(nb_gguf *g);
uint32_t nb_gguf_version(const nb_gguf *g);

int64_t nb_gguf_kv_count(const nb_gguf *g);
const char *nb_gguf_kv_key(const nb_gguf *g, int64_t i);
int64_t nb_gguf_find_key(const nb_gguf *g, const char *key);        /* -1 if absent */
nb_gguf_type nb_gguf_kv_type(const nb_gguf *g, int64_t i);
/* Scalars (any integer/bool type widens to int64, float types to double). */
int64_t nb_gguf_kv_int(const nb_gguf *g, int64_t i);
double nb_gguf_kv_float(const nb_gguf *g, int64_t i);
const char *nb_gguf_kv_str(const nb_gguf *g, int64_t i, uint64_t *len);   /* not NUL-safe: use len */
/* Arrays */
nb_gguf_type nb_gguf_arr_type(const nb_gguf *g, int64_t i);
int64_t nb_gguf_arr_count(const nb_gguf *g, int64_t i);
const void *nb_gguf_arr_data(const nb_gguf *g, int64_t i);            /* numeric arrays: packed LE values */
const char *nb_gguf_arr_str(const nb_gguf *g, int64_t i, int64_t j, uint64_t *len);

int64_t nb_gguf_tensor_count(const nb_gguf *g);
const nb_gguf_tensor_info *nb_gguf_tensor_at(const nb_gguf *g, int64_t i);
int64_t nb_gguf_find_tensor(const nb_gguf *g, const char *name);     /* -1 if absent */
/* The tensor in row-major shape (ne reversed). F32/F16/BF16 come back as zero-copy views;
 * quantized types are dequantized into a new F32 tensor. */
nb_status nb_gguf_get(nb_ctx *ctx, nb_gguf *g, const char *name, nb_tensor **out);
/* Dequantize n elements (a multiple of the type's block size) of one row. */
nb_status nb_ggml_dequantize(nb_ctx *ctx, int32_t type, const void *src, float *dst, int64_t n);
const char *nb_ggml_type_name(int32_t type);   /* "Q4_K", ... or NULL */

#endif

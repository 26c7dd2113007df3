/* Shared between the safetensors reader and writer: the format's dtype table (enum order = the
 * reference's sort order) and a small string-keyed hash map for name lookups. Not public. */
#ifndef NIBBLE_IO_SAFETENSORS_INTERNAL_H
#define NIBBLE_IO_SAFETENSORS_INTERNAL_H

#include <stdint.h>
#include "nibble/dtype.h"

typedef struct nb_st_dtype_row {
    const char *name;   /* safetensors dtype string */
    int bits;           /* bits per element */
    int nb;             /* nb_dtype, or -1 where nibble has none */
} nb_st_dtype_row;

/* Rows in the reference's `enum Dtype` order (increasing alignment): the row index is the rank
 * the writer sorts by (descending). */
extern const nb_st_dtype_row nb_st_dtypes[];
extern const int nb_st_dtype_rows;
/* Row index of a safetensors dtype string, or -1. */
int nb_st_dtype_lookup(const char *s);
/* Rank (row index) of an nb_dtype, or -1. */
int nb_st_dtype_rank(nb_dtype dt);

/* Open-addressing map from borrowed NUL-terminated keys to int64 values. */
typedef struct nb_strmap {
    const char **keys;
    int64_t *vals;
    int64_t cap, count;
} nb_strmap;

/* 1 = inserted, 0 = key present (*existing gets its value; nothing changes), -1 = out of memory. */
int nb_strmap_put(nb_strmap *m, const char *key, int64_t val, int64_t *existing);
/* Replace the value of a present key (no-op if absent). */
void nb_strmap_set(nb_strmap *m, const char *key, int64_t val);
int64_t nb_strmap_get(const nb_strmap *m, const char *key);   /* -1 if absent */
void nb_strmap_free(nb_strmap *m);

/* Strict UTF-8 check (what Rust's str::from_utf8 accepts). */
int nb_utf8_valid(const unsigned char *s, int64_t n);

#endif

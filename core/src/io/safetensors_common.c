/* Pieces shared by the safetensors reader and writer: the dtype table in the reference's enum
 * order, a string hash map and a strict UTF-8 validator. */
#include <stdlib.h>
#include <string.h>

#include "io/safetensors_internal.h"

/* safetensors/src/tensor.rs `enum Dtype`, in declaration order: the derived Ord is what the
 * reference serializer sorts by, so the order here is part of the file format. */
const nb_st_dtype_row nb_st_dtypes[] = {
    {"BOOL", 8, NB_BOOL},
    {"F4", 4, NB_E2M1},
    {"F6_E2M3", 6, -1},
    {"F6_E3M2", 6, -1},
    {"U8", 8, NB_U8},
    {"I8", 8, NB_I8},
    {"F8_E5M2", 8, NB_E5M2},
    {"F8_E4M3", 8, NB_E4M3},
    {"F8_E8M0", 8, NB_E8M0},
    {"F8_E4M3FNUZ", 8, -1},
    {"F8_E5M2FNUZ", 8, -1},
    {"I16", 16, NB_I16},
    {"U16", 16, NB_U16},
    {"F16", 16, NB_F16},
    {"BF16", 16, NB_BF16},
    {"I32", 32, NB_I32},
    {"U32", 32, NB_U32},
    {"F32", 32, NB_F32},
    {"C64", 64, -1},
    {"F64", 64, NB_F64},
    {"I64", 64, NB_I64},
    {"U64", 64, NB_U64},
};
const int nb_st_dtype_rows = (int)(sizeof nb_st_dtypes / sizeof nb_st_dtypes[0]);

int nb_st_dtype_lookup(const char *s) {
    for (int i = 0; i < nb_st_dtype_rows; i++)
        if (strcmp(nb_st_dtypes[i].name, s) == 0) return i;
    return -1;
}

int nb_st_dtype_rank(nb_dtype dt) {
    for (int i = 0; i < nb_st_dtype_rows; i++)
        if (nb_st_dtypes[i].nb == (int)dt) return i;
    return -1;
}

/* ---- string map ---------------------------------------------------------------------------- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int64_t slot_of(const nb_strmap *m, const char *key) {
    uint64_t mask = (uint64_t)m->cap - 1;
    for (uint64_t i = hash_str(key) & mask;; i = (i + 1) & mask)
        if (!m->keys[i] || strcmp(m->keys[i], key) == 0) return (int64_t)i;
}

static int grow(nb_strmap *m) {
    int64_t ncap = m->cap ? m->cap * 2 : 64;
    nb_strmap n = {calloc((size_t)ncap, sizeof(char *)), calloc((size_t)ncap, sizeof(int64_t)), ncap, 0};
    if (!n.keys || !n.vals) { free(n.keys); free(n.vals); return -1; }
    for (int64_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        int64_t j = slot_of(&n, m->keys[i]);
        n.keys[j] = m->keys[i];
        n.vals[j] = m->vals[i];
        n.count++;
    }
    free(m->keys);
    free(m->vals);
    *m = n;
    return 0;
}

int nb_strmap_put(nb_strmap *m, const char *key, int64_t val, int64_t *existing) {
    if ((m->count + 1) * 2 > m->cap && grow(m)) return -1;
    int64_t i = slot_of(m, key);
    if (m->keys[i]) {
        if (existing) *existing = m->vals[i];
        return 0;
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
    return 1;
}

void nb_strmap_set(nb_strmap *m, const char *key, int64_t val) {
    if (!m->cap) return;
    int64_t i = slot_of(m, key);
    if (m->keys[i]) {
        m->keys[i] = key;
        m->vals[i] = val;
    }
}

int64_t nb_strmap_get(const nb_strmap *m, const char *key) {
    if (!m->cap) return -1;
    int64_t i = slot_of(m, key);
    return m->keys[i] ? m->vals[i] : -1;
}

void nb_strmap_free(nb_strmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

int nb_utf8_valid(const unsigned char *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned lo = 0x80, hi = 0xBF;   /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) { len = 3; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) len = 3;
        else if (c == 0xED) { len = 3; hi = 0x9F; }   /* no UTF-16 surrogates */
        else if (c >= 0xEE && c <= 0xEF) len = 3;
        else if (c == 0xF0) { len = 4; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) { len = 4; hi = 0x8F; }
        else return 0;
        if (n - i < len) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

/* GGUF v2/v3 reader: maps the file, validates every header field up front (so later calls never
 * read outside the mapping), copies metadata into owned memory and hands tensors out as zero-copy
 * views (float and integer types) or dequantized F32 copies (ggml block types, ggml_quants.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nibble/gguf.h"

/* ---- owned memory: a chunked arena for NUL-terminated copies of keys and strings ------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    char data[];
} chunk;

typedef struct { const char *p; uint64_t n; } str_ref;

typedef struct {
    const char *key;
    uint64_t key_len;
    int32_t type;
    int32_t arr_type;
    union { int64_t i; double f; } num;   /* scalars */
    str_ref str;                          /* NB_GGUF_STRING */
    int64_t arr_count;
    void *arr_data;                       /* numeric/bool arrays (owned, aligned) */
    str_ref *arr_strs;                    /* string arrays (owned) */
} gguf_kv;

struct nb_gguf {
    char *path;
    nb_buffer *buf;
    const uint8_t *base;
    uint64_t size;
    uint32_t version;
    uint32_t alignment;
    int64_t data_offset;
    int64_t n_kv, kv_alloc;
    gguf_kv *kv;
    int64_t *kv_hash;                     /* open addressing: index+1, 0 = empty */
    int64_t kv_cap;
    int64_t n_tensors;
    nb_gguf_tensor_info *tensors;
    int64_t *tensor_hash;                 /* open addressing: index+1, 0 = empty */
    int64_t hash_cap;
    chunk *arena;
};

static char *arena_copy(nb_gguf *g, const uint8_t *p, uint64_t n) {
    chunk *c = g->arena;
    if (!c || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > 65536 ? (size_t)n + 1 : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = g->arena;
        c->used = 0;
        c->cap = cap;
        g->arena = c;
    }
    char *s = c->data + c->used;
    if (n) memcpy(s, p, (size_t)n);
    s[n] = 0;
    c->used += (size_t)n + 1;
    return s;
}

/* ---- bounds-checked reading ------------------------------------------------------------------ */

typedef struct {
    nb_ctx *ctx;
    const char *path;
    const uint8_t *p;
    uint64_t size, pos;
    char where[320];          /* what is being read, for messages: "header", "key #3 ('x')", ... */
} reader;

static nb_status truncated(reader *r, const char *field, uint64_t need) {
    return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: truncated in %s: %s needs %llu bytes at offset %llu, file has %llu",
                   r->path, r->where, field, (unsigned long long)need, (unsigned long long)r->pos,
                   (unsigned long long)r->size);
}

static nb_status need(reader *r, uint64_t n, const char *field) {
    if (n > r->size - r->pos) return truncated(r, field, n);
    return NB_OK;
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static nb_status rd_uint(reader *r, int n, const char *field, uint64_t *out) {
    nb_status s = need(r, (uint64_t)n, field);
    if (s) return s;
    *out = get_le(r->p + r->pos, n);
    r->pos += (uint64_t)n;
    return NB_OK;
}

static nb_status rd_u32(reader *r, const char *field, uint32_t *out) {
    uint64_t v = 0;
    nb_status s = rd_uint(r, 4, field, &v);
    *out = (uint32_t)v;
    return s;
}

/* A gguf_string: u64 length then bytes (not NUL-terminated in the file). */
static nb_status rd_str(reader *r, const char *field, const uint8_t **p, uint64_t *n) {
    uint64_t len = 0;
    nb_status s = rd_uint(r, 8, field, &len);
    if (s) return s;
    if (len > r->size - r->pos)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: %s in %s has length %llu past the end of the file (offset %llu, file has %llu bytes)",
                       r->path, field, r->where, (unsigned long long)len, (unsigned long long)r->pos,
                       (unsigned long long)r->size);
    *p = r->p + r->pos;
    *n = len;
    r->pos += len;
    return NB_OK;
}

/* ---- metadata -------------------------------------------------------------------------------- */

static int scalar_size(int32_t t) {
    switch (t) {
    case NB_GGUF_UINT8: case NB_GGUF_INT8: case NB_GGUF_BOOL: return 1;
    case NB_GGUF_UINT16: case NB_GGUF_INT16: return 2;
    case NB_GGUF_UINT32: case NB_GGUF_INT32: case NB_GGUF_FLOAT32: return 4;
    case NB_GGUF_UINT64: case NB_GGUF_INT64: case NB_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *type_name(int32_t t) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
                                  "string", "array", "uint64", "int64", "float64"};
    return t >= 0 && t <= 12 ? names[t] : "unknown";
}

static void decode_scalar(int32_t t, const uint8_t *p, gguf_kv *kv) {
    uint64_t u = get_le(p, scalar_size(t));
    switch (t) {
    case NB_GGUF_INT8: kv->num.i = (int8_t)u; break;
    case NB_GGUF_INT16: kv->num.i = (int16_t)u; break;
    case NB_GGUF_INT32: kv->num.i = (int32_t)u; break;
    case NB_GGUF_FLOAT32: { uint32_t b = (uint32_t)u; float f; memcpy(&f, &b, 4); kv->num.f = f; break; }
    case NB_GGUF_FLOAT64: { double d; memcpy(&d, &u, 8); kv->num.f = d; break; }
    default: kv->num.i = (int64_t)u; break;   /* unsigned types and bool; UINT64 keeps its bits */
    }
}

static nb_status bad_type(reader *r, const char *what, uint32_t t) {
    return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: unknown metadata %s %u in %s", r->path, what, t, r->where);
}

/* Skip (but validate) one array value whose type word has been read: used for arrays of arrays. */
static nb_status skip_array(reader *r, int depth) {
    uint32_t et;
    uint64_t count;
    nb_status s;
    if (depth > 8) return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: arrays nested more than 8 deep in %s", r->path, r->where);
    if ((s = rd_u32(r, "nested array element type", &et))) return s;
    if ((s = rd_uint(r, 8, "nested array count", &count))) return s;
    if (et > NB_GGUF_FLOAT64) return bad_type(r, "nested array element type", et);
    /* every element takes at least one byte (strings 8, nested arrays 12) */
    uint64_t min_elem = et == NB_GGUF_STRING ? 8 : et == NB_GGUF_ARRAY ? 12 : (uint64_t)scalar_size((int32_t)et);
    if (count > (r->size - r->pos) / min_elem)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: nested array count %llu in %s is larger than the rest of the file can hold",
                       r->path, (unsigned long long)count, r->where);
    if (et == NB_GGUF_STRING) {
        for (uint64_t j = 0; j < count; j++) {
            const uint8_t *p;
            uint64_t n;
            if ((s = rd_str(r, "string element", &p, &n))) return s;
        }
    } else if (et == NB_GGUF_ARRAY) {
        for (uint64_t j = 0; j < count; j++)
            if ((s = skip_array(r, depth + 1))) return s;
    } else {
        r->pos += count * min_elem;   /* checked above */
    }
    return NB_OK;
}

static nb_status read_kv(nb_gguf *g, reader *r, int64_t idx, gguf_kv *kv) {
    nb_status s;
    const uint8_t *kp;
    uint64_t kn;
    snprintf(r->where, sizeof r->where, "key #%lld", (long long)idx);
    if ((s = rd_str(r, "key", &kp, &kn))) return s;
    if (!(kv->key = arena_copy(g, kp, kn))) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
    kv->key_len = kn;
    if (strlen(kv->key) != kn)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: key #%lld ('%.200s') contains a NUL byte", r->path, (long long)idx, kv->key);
    snprintf(r->where, sizeof r->where, "key #%lld ('%.200s')", (long long)idx, kv->key);
    uint32_t t;
    if ((s = rd_u32(r, "value type", &t))) return s;
    if (t > NB_GGUF_FLOAT64) return bad_type(r, "value type", t);
    kv->type = (int32_t)t;
    if (t == NB_GGUF_STRING) {
        const uint8_t *p;
        uint64_t n;
        if ((s = rd_str(r, "string value", &p, &n))) return s;
        if (!(kv->str.p = arena_copy(g, p, n))) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
        kv->str.n = n;
        return NB_OK;
    }
    if (t != NB_GGUF_ARRAY) {
        int sz = scalar_size((int32_t)t);
        if ((s = need(r, (uint64_t)sz, "value"))) return s;
        decode_scalar((int32_t)t, r->p + r->pos, kv);
        r->pos += (uint64_t)sz;
        return NB_OK;
    }
    uint32_t et;
    uint64_t count;
    if ((s = rd_u32(r, "array element type", &et))) return s;
    if ((s = rd_uint(r, 8, "array count", &count))) return s;
    if (et > NB_GGUF_FLOAT64) return bad_type(r, "array element type", et);
    kv->arr_type = (int32_t)et;
    uint64_t min_elem = et == NB_GGUF_STRING ? 8 : et == NB_GGUF_ARRAY ? 12 : (uint64_t)scalar_size((int32_t)et);
    if (count > (r->size - r->pos) / min_elem)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: array count %llu in %s is larger than the rest of the file can hold (%llu bytes)",
                       r->path, (unsigned long long)count, r->where, (unsigned long long)(r->size - r->pos));
    kv->arr_count = (int64_t)count;
    if (et == NB_GGUF_STRING) {
        kv->arr_strs = malloc(count ? (size_t)count * sizeof *kv->arr_strs : 1);
        if (!kv->arr_strs) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
        for (uint64_t j = 0; j < count; j++) {
            const uint8_t *p;
            uint64_t n;
            if ((s = rd_str(r, "string element", &p, &n))) return s;
            if (!(kv->arr_strs[j].p = arena_copy(g, p, n)))
                return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
            kv->arr_strs[j].n = n;
        }
    } else if (et == NB_GGUF_ARRAY) {
        for (uint64_t j = 0; j < count; j++)
            if ((s = skip_array(r, 1))) return s;
    } else {
        size_t bytes = (size_t)(count * min_elem);
        kv->arr_data = aligned_alloc(8, (bytes + 7) / 8 * 8 + 8);
        if (!kv->arr_data) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
        memcpy(kv->arr_data, r->p + r->pos, bytes);   /* GGUF and the host are little-endian */
        r->pos += bytes;
    }
    return NB_OK;
}

/* ---- tensor directory ------------------------------------------------------------------------ */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static nb_status read_tensor_info(nb_gguf *g, reader *r, int64_t idx, nb_gguf_tensor_info *ti, uint64_t *rel_offset) {
    nb_status s;
    const uint8_t *np;
    uint64_t nn;
    snprintf(r->where, sizeof r->where, "tensor info #%lld", (long long)idx);
    if ((s = rd_str(r, "tensor name", &np, &nn))) return s;
    if (!(ti->name = arena_copy(g, np, nn))) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
    if (strlen(ti->name) != nn)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor #%lld has a name with a NUL byte ('%.200s')", r->path,
                       (long long)idx, ti->name);
    snprintf(r->where, sizeof r->where, "tensor info #%lld ('%.200s')", (long long)idx, ti->name);
    uint32_t nd;
    if ((s = rd_u32(r, "n_dims", &nd))) return s;
    if (nd > NB_GGUF_MAX_DIMS)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (at most %d)", r->path, ti->name, nd,
                       NB_GGUF_MAX_DIMS);
    ti->ndim = (int32_t)nd;
    for (int d = 0; d < NB_GGUF_MAX_DIMS; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v;
        if ((s = rd_uint(r, 8, "dimension", &v))) return s;
        if (v > (uint64_t)INT64_MAX)
            return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor '%s' has dimension %u = %llu out of range", r->path,
                           ti->name, d, (unsigned long long)v);
        ti->ne[d] = (int64_t)v;
    }
    uint32_t type;
    if ((s = rd_u32(r, "type", &type))) return s;
    if ((s = rd_uint(r, 8, "data offset", rel_offset))) return s;
    int64_t blck = nb_ggml_block_size((int32_t)type), tsize = nb_ggml_type_size((int32_t)type);
    if (!blck)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor '%s' has unknown ggml type %u", r->path, ti->name, type);
    ti->type = (int32_t)type;
    if (ti->ne[0] % blck)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor '%s' has row length %lld, not a multiple of the %s block size %lld",
                       r->path, ti->name, (long long)ti->ne[0], nb_ggml_type_name(ti->type), (long long)blck);
    /* bytes = ne0/blck * tsize * ne1 * ne2 * ne3, refusing anything that overflows int64 */
    int64_t nbytes = ti->ne[0] / blck, nel = ti->ne[0];
    int overflow = nbytes > INT64_MAX / tsize;
    if (!overflow) nbytes *= tsize;
    for (int d = 1; d < NB_GGUF_MAX_DIMS && !overflow; d++) {
        int64_t n = ti->ne[d];
        if (n && (nbytes > INT64_MAX / n || nel > INT64_MAX / n)) overflow = 1;
        else { nbytes *= n; nel *= n; }
    }
    if (overflow)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor '%s' has dimensions [%lld, %lld, %lld, %lld] whose size overflows",
                       r->path, ti->name, (long long)ti->ne[0], (long long)ti->ne[1], (long long)ti->ne[2],
                       (long long)ti->ne[3]);
    ti->nbytes = nbytes;
    return NB_OK;
}

/* Open-addressing table of names (index + 1; 0 = empty) with a power-of-two capacity. */
typedef const char *(*name_fn)(const nb_gguf *g, int64_t i);
static const char *kv_name(const nb_gguf *g, int64_t i) { return g->kv[i].key; }
static const char *tensor_name(const nb_gguf *g, int64_t i) { return g->tensors[i].name; }

static int64_t hash_find(const nb_gguf *g, const int64_t *tab, int64_t cap, name_fn name, const char *key) {
    if (!cap) return -1;
    uint64_t m = (uint64_t)cap - 1;
    for (uint64_t h = hash_name(key) & m;; h = (h + 1) & m) {
        int64_t v = tab[h];
        if (!v) return -1;
        if (!strcmp(name(g, v - 1), key)) return v - 1;
    }
}

/* Build the table; returns the index of the first duplicate's earlier twin in *dup (or -1). */
static int64_t *hash_build(const nb_gguf *g, int64_t n, name_fn name, int64_t *cap_out, int64_t *dup_a, int64_t *dup_b) {
    int64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    int64_t *tab = calloc((size_t)cap, sizeof *tab);
    *dup_a = *dup_b = -1;
    if (!tab) return NULL;
    *cap_out = cap;
    for (int64_t i = 0; i < n; i++) {
        int64_t prev = hash_find(g, tab, cap, name, name(g, i));
        if (prev >= 0) {
            *dup_a = prev;
            *dup_b = i;
            return tab;
        }
        uint64_t m = (uint64_t)cap - 1, h = hash_name(name(g, i)) & m;
        while (tab[h]) h = (h + 1) & m;
        tab[h] = i + 1;
    }
    return tab;
}

/* ---- open / close ---------------------------------------------------------------------------- */

static nb_status parse(nb_gguf *g, reader *r) {
    nb_status s;
    snprintf(r->where, sizeof r->where, "header");
    if ((s = need(r, 4, "magic"))) return s;
    if (memcmp(r->p, "GGUF", 4)) {
        char shown[5];
        for (int i = 0; i < 4; i++) shown[i] = r->p[i] >= 0x20 && r->p[i] < 0x7F ? (char)r->p[i] : '?';
        shown[4] = 0;
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: bad magic \"%s\" (%02x %02x %02x %02x), not a GGUF file", r->path,
                       shown, r->p[0], r->p[1], r->p[2], r->p[3]);
    }
    r->pos = 4;
    if ((s = rd_u32(r, "version", &g->version))) return s;
    uint32_t v = g->version;
    uint32_t swapped = (v >> 24) | ((v >> 8) & 0xFF00) | ((v << 8) & 0xFF0000) | (v << 24);
    if (v == 1)
        return nb_fail(r->ctx, NB_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (only versions 2 and 3)", r->path);
    if (swapped >= 1 && swapped <= 3)
        return nb_fail(r->ctx, NB_ERR_UNSUPPORTED, "%s: big-endian GGUF (version %u byte-swapped) is not supported", r->path,
                       swapped);
    if (v != 2 && v != 3)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: unsupported GGUF version %u (expected 2 or 3)", r->path, v);
    uint64_t n_tensors, n_kv;
    if ((s = rd_uint(r, 8, "tensor count", &n_tensors))) return s;
    if ((s = rd_uint(r, 8, "metadata count", &n_kv))) return s;
    /* a key-value pair takes at least 13 bytes (key length, type, one byte), a tensor info 24 */
    if (n_kv > (r->size - r->pos) / 13)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: header claims %llu metadata pairs, more than the file (%llu bytes) can hold",
                       r->path, (unsigned long long)n_kv, (unsigned long long)r->size);
    if (n_tensors > (r->size - r->pos) / 24)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: header claims %llu tensors, more than the file (%llu bytes) can hold",
                       r->path, (unsigned long long)n_tensors, (unsigned long long)r->size);

    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    if (!g->kv) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
    g->kv_alloc = (int64_t)n_kv;
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((s = read_kv(g, r, (int64_t)i, &g->kv[i]))) return s;
        g->n_kv = (int64_t)i + 1;
    }
    int64_t da, db;
    g->kv_hash = hash_build(g, g->n_kv, kv_name, &g->kv_cap, &da, &db);
    if (!g->kv_hash) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
    if (da >= 0)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: duplicate key '%s' (#%lld and #%lld)", r->path, g->kv[db].key,
                       (long long)da, (long long)db);

    g->alignment = NB_GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = nb_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        const gguf_kv *kv = &g->kv[ai];
        if (kv->type != NB_GGUF_UINT32)
            return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: general.alignment has type %s (expected uint32)", r->path,
                           type_name(kv->type));
        uint64_t a = (uint64_t)kv->num.i;
        if (a == 0 || (a & (a - 1)))
            return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: general.alignment %llu is not a power of two", r->path,
                           (unsigned long long)a);
        g->alignment = (uint32_t)a;
    }

    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    uint64_t *rel = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *rel);
    if (!g->tensors || !rel) { free(rel); return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path); }
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((s = read_tensor_info(g, r, (int64_t)i, &g->tensors[i], &rel[i]))) { free(rel); return s; }
        g->n_tensors = (int64_t)i + 1;
    }
    /* the data section starts at the next multiple of the alignment (absent when there are no tensors) */
    uint64_t a = g->alignment;
    uint64_t data = r->pos + (a - r->pos % a) % a;
    g->data_offset = (int64_t)data;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        nb_gguf_tensor_info *ti = &g->tensors[i];
        if (rel[i] % a) {
            s = nb_fail(r->ctx, NB_ERR_FORMAT, "%s: tensor '%s' has data offset %llu, not a multiple of the alignment %llu",
                        r->path, ti->name, (unsigned long long)rel[i], (unsigned long long)a);
            free(rel);
            return s;
        }
        uint64_t nb = (uint64_t)ti->nbytes;
        if (data > r->size || rel[i] > r->size - data || nb > r->size - data - rel[i]) {
            s = nb_fail(r->ctx, NB_ERR_FORMAT,
                        "%s: tensor '%s' data (%llu bytes at offset %llu + %llu) lies past the end of the file (%llu bytes)",
                        r->path, ti->name, (unsigned long long)nb, (unsigned long long)data, (unsigned long long)rel[i],
                        (unsigned long long)r->size);
            free(rel);
            return s;
        }
        ti->offset = (int64_t)(data + rel[i]);
    }
    free(rel);
    g->tensor_hash = hash_build(g, g->n_tensors, tensor_name, &g->hash_cap, &da, &db);
    if (!g->tensor_hash) return nb_fail(r->ctx, NB_ERR_NOMEM, "out of memory reading %s", r->path);
    if (da >= 0)
        return nb_fail(r->ctx, NB_ERR_FORMAT, "%s: duplicate tensor name '%s' (tensors #%lld and #%lld)", r->path,
                       g->tensors[db].name, (long long)da, (long long)db);
    return NB_OK;
}

nb_status nb_gguf_open(nb_ctx *ctx, const char *path, nb_gguf **out) {
    *out = NULL;
    if (!path) return nb_fail(ctx, NB_ERR_INVALID, "nb_gguf_open: NULL path");
    nb_gguf *g = calloc(1, sizeof *g);
    if (!g) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory opening %s", path);
    nb_status s = nb_buffer_mmap(ctx, path, &g->buf);
    if (s) { free(g); return s; }
    g->path = strdup(path);
    if (!g->path) { nb_gguf_close(g); return nb_fail(ctx, NB_ERR_NOMEM, "out of memory opening %s", path); }
    g->base = nb_buffer_data(g->buf);
    g->size = nb_buffer_size(g->buf);
    reader r = {.ctx = ctx, .path = path, .p = g->base, .size = g->size, .pos = 0};
    if ((s = parse(g, &r))) { nb_gguf_close(g); return s; }
    *out = g;
    return NB_OK;
}

void nb_gguf_close(nb_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->kv_alloc; i++) {   /* includes a pair that failed half-way */
        free(g->kv[i].arr_data);
        free(g->kv[i].arr_strs);
    }
    free(g->kv);
    free(g->kv_hash);
    free(g->tensors);
    free(g->tensor_hash);
    while (g->arena) {
        chunk *c = g->arena;
        g->arena = c->next;
        free(c);
    }
    nb_buffer_release(g->buf);
    free(g->path);
    free(g);
}

/* ---- accessors ------------------------------------------------------------------------------- */

uint32_t nb_gguf_version(const nb_gguf *g) { return g->version; }
uint32_t nb_gguf_alignment(const nb_gguf *g) { return g->alignment; }
int64_t nb_gguf_data_offset(const nb_gguf *g) { return g->data_offset; }
int64_t nb_gguf_file_size(const nb_gguf *g) { return (int64_t)g->size; }
nb_buffer *nb_gguf_buffer(const nb_gguf *g) { return g->buf; }

int64_t nb_gguf_kv_count(const nb_gguf *g) { return g->n_kv; }

static const gguf_kv *kv_at(const nb_gguf *g, int64_t i) { return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL; }

const char *nb_gguf_kv_key(const nb_gguf *g, int64_t i) { const gguf_kv *kv = kv_at(g, i); return kv ? kv->key : NULL; }

int64_t nb_gguf_find_key(const nb_gguf *g, const char *key) {
    if (!key) return -1;
    if (g->kv_hash) return hash_find(g, g->kv_hash, g->kv_cap, kv_name, key);
    for (int64_t i = 0; i < g->n_kv; i++)          /* during open, before the table exists */
        if (!strcmp(g->kv[i].key, key)) return i;
    return -1;
}

nb_gguf_type nb_gguf_kv_type(const nb_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    return kv ? (nb_gguf_type)kv->type : (nb_gguf_type)-1;
}

static int is_float_type(int32_t t) { return t == NB_GGUF_FLOAT32 || t == NB_GGUF_FLOAT64; }

int64_t nb_gguf_kv_int(const nb_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type == NB_GGUF_STRING || kv->type == NB_GGUF_ARRAY) return 0;
    if (is_float_type(kv->type)) {
        double f = kv->num.f;
        return f != f ? 0 : f >= 9.2233720368547758e18 ? INT64_MAX : f <= -9.2233720368547758e18 ? INT64_MIN : (int64_t)f;
    }
    return kv->num.i;
}

double nb_gguf_kv_float(const nb_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type == NB_GGUF_STRING || kv->type == NB_GGUF_ARRAY) return 0;
    if (is_float_type(kv->type)) return kv->num.f;
    if (kv->type == NB_GGUF_UINT64) return (double)(uint64_t)kv->num.i;
    return (double)kv->num.i;
}

const char *nb_gguf_kv_str(const nb_gguf *g, int64_t i, uint64_t *len) {
    const gguf_kv *kv = kv_at(g, i);
    int ok = kv && kv->type == NB_GGUF_STRING;
    if (len) *len = ok ? kv->str.n : 0;
    return ok ? kv->str.p : NULL;
}

nb_gguf_type nb_gguf_arr_type(const nb_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == NB_GGUF_ARRAY ? (nb_gguf_type)kv->arr_type : (nb_gguf_type)-1;
}

int64_t nb_gguf_arr_count(const nb_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == NB_GGUF_ARRAY ? kv->arr_count : 0;
}

const void *nb_gguf_arr_data(const nb_gguf *g, int64_t i) {
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == NB_GGUF_ARRAY ? kv->arr_data : NULL;
}

const char *nb_gguf_arr_str(const nb_gguf *g, int64_t i, int64_t j, uint64_t *len) {
    const gguf_kv *kv = kv_at(g, i);
    int ok = kv && kv->type == NB_GGUF_ARRAY && kv->arr_strs && j >= 0 && j < kv->arr_count;
    if (len) *len = ok ? kv->arr_strs[j].n : 0;
    return ok ? kv->arr_strs[j].p : NULL;
}

int64_t nb_gguf_tensor_count(const nb_gguf *g) { return g->n_tensors; }

const nb_gguf_tensor_info *nb_gguf_tensor_at(const nb_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t nb_gguf_find_tensor(const nb_gguf *g, const char *name) {
    return name ? hash_find(g, g->tensor_hash, g->hash_cap, tensor_name, name) : -1;
}

const void *nb_gguf_tensor_data(const nb_gguf *g, int64_t i) {
    const nb_gguf_tensor_info *ti = nb_gguf_tensor_at(g, i);
    return ti ? g->base + ti->offset : NULL;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static int view_dtype(int32_t type) {
    switch (type) {
    case NB_GGML_F32: return NB_F32;
    case NB_GGML_F16: return NB_F16;
    case NB_GGML_BF16: return NB_BF16;
    case NB_GGML_F64: return NB_F64;
    case NB_GGML_I8: return NB_I8;
    case NB_GGML_I16: return NB_I16;
    case NB_GGML_I32: return NB_I32;
    case NB_GGML_I64: return NB_I64;
    default: return -1;
    }
}

typedef struct {
    const uint8_t *src;
    float *dst;
    int64_t ne0, row_bytes;
    int32_t type;
} dq_job;

static void dq_rows(void *arg, int64_t begin, int64_t end) {
    const dq_job *j = arg;
    for (int64_t r = begin; r < end; r++)
        nb_ggml_dequantize(NULL, j->type, j->src + r * j->row_bytes, j->dst + r * j->ne0, j->ne0);
}

nb_status nb_gguf_get(nb_ctx *ctx, nb_gguf *g, const char *name, nb_tensor **out) {
    *out = NULL;
    int64_t i = nb_gguf_find_tensor(g, name);
    if (i < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "%s: no tensor named '%s'", g->path, name ? name : "(null)");
    const nb_gguf_tensor_info *ti = &g->tensors[i];
    int64_t shape[NB_GGUF_MAX_DIMS];
    for (int d = 0; d < ti->ndim; d++) shape[d] = ti->ne[ti->ndim - 1 - d];
    int dt = view_dtype(ti->type);
    if (dt >= 0) {
        int64_t esize = nb_dtype_info((nb_dtype)dt)->bits / 8;
        if (ti->offset % esize == 0) return nb_tensor_wrap(ctx, g->buf, (nb_dtype)dt, ti->ndim, shape, ti->offset, out);
        /* an alignment below the element size: copy rather than hand out a misaligned view */
        return nb_tensor_from_data(ctx, (nb_dtype)dt, ti->ndim, shape, g->base + ti->offset, out);
    }
    if (!nb_ggml_can_dequantize(ti->type))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %s, which nibble cannot dequantize", g->path,
                       ti->name, nb_ggml_type_name(ti->type));
    nb_status s = nb_tensor_new(ctx, NB_F32, ti->ndim, shape, out);
    if (s) return s;
    if (ti->ne[0] == 0) return NB_OK;
    dq_job job = {g->base + ti->offset, nb_tensor_data(*out), ti->ne[0],
                  ti->ne[0] / nb_ggml_block_size(ti->type) * nb_ggml_type_size(ti->type), ti->type};
    int64_t rows = nb_tensor_numel(*out) / ti->ne[0];
    int64_t grain = 65536 / ti->ne[0];
    nb_parallel_for(ctx, rows, grain < 1 ? 1 : grain, dq_rows, &job);
    return NB_OK;
}

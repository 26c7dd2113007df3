/* Malformed GGUF files, written from C into a temporary directory: every defect must give a named
 * error (status and a message naming the file and the key or tensor), never a crash or a read past
 * the mapping. Ends with every truncation and many single-byte corruptions of a valid file. */
#include <stdint.h>
#include <unistd.h>

#include "nbtest.h"

/* ---- a tiny GGUF byte builder ------------------------------------------------------------- */

typedef struct { uint8_t *p; size_t n, cap; } bb;

static void put(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void u8(bb *b, uint8_t v) { put(b, &v, 1); }
static void u32(bb *b, uint32_t v) { put(b, &v, 4); }   /* the test host is little-endian, as GGUF */
static void u64(bb *b, uint64_t v) { put(b, &v, 8); }
static void str(bb *b, const char *s) { u64(b, strlen(s)); put(b, s, strlen(s)); }
static void header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
static void kv_u32(bb *b, const char *k, uint32_t v) { str(b, k); u32(b, NB_GGUF_UINT32); u32(b, v); }
static void kv_str(bb *b, const char *k, const char *v) { str(b, k); u32(b, NB_GGUF_STRING); str(b, v); }
static void tinfo(bb *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, nd);
    for (uint32_t i = 0; i < nd; i++) u64(b, ne[i]);
    u32(b, type);
    u64(b, off);
}
static void pad(bb *b, size_t a) { while (b->n % a) u8(b, 0); }
static void fill(bb *b, size_t n, uint8_t v) { for (size_t i = 0; i < n; i++) u8(b, v); }

static char dir[64];
static char path[128];

static const char *write_file(const bb *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n) fwrite(b->p, 1, n, f);
    fclose(f);
    return path;
}

/* Open b (first n bytes) expecting failure with code and a message holding needle and the path. */
#define EXPECT_BAD(ctx, b, n, code, needle) do { nb_gguf *_g = NULL; \
    CHECK_FAIL(ctx, nb_gguf_open(ctx, write_file(b, n), &_g), code, needle); \
    CHECK(_g == NULL); nb_gguf_close(_g); \
    CHECK_MSG(strstr(nb_ctx_last_error(ctx), path) != NULL, "message does not name the file: %s", nb_ctx_last_error(ctx)); \
} while (0)

/* A valid file: 3 kv (string, u32, string array), tensors "a" F32 [2][4] and "q" Q8_0 [1][32].
 * Records where each part starts so the truncation cases can cut inside them. */
typedef struct { size_t kv1, kv2, ti0, ti1, data, end; } marks;

static void build_valid(bb *b, marks *m) {
    b->n = 0;
    header(b, 3, 2, 3);
    kv_str(b, "general.architecture", "llama");
    m->kv1 = b->n;
    kv_u32(b, "llama.block_count", 5);
    m->kv2 = b->n;
    str(b, "tokenizer.ggml.tokens");
    u32(b, NB_GGUF_ARRAY);
    u32(b, NB_GGUF_STRING);
    u64(b, 3);
    str(b, "<s>");
    str(b, "");
    str(b, "hello");
    m->ti0 = b->n;
    uint64_t ne_a[2] = {4, 2}, ne_q[2] = {32, 1};
    tinfo(b, "a", 2, ne_a, NB_GGML_F32, 0);
    m->ti1 = b->n;
    tinfo(b, "q", 2, ne_q, NB_GGML_Q8_0, 32);
    pad(b, 32);
    m->data = b->n;
    for (int i = 0; i < 8; i++) { float f = (float)i - 2.5f; put(b, &f, 4); }
    uint8_t q8[34] = {0x00, 0x38};                      /* d = 0.5 in fp16 */
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i - 16);
    put(b, q8, 34);
    m->end = b->n;
}

static void test_valid(nb_ctx *ctx, bb *b, const marks *m) {
    nb_gguf *g = NULL;
    CHECK_OK(ctx, nb_gguf_open(ctx, write_file(b, b->n), &g));
    if (!g) return;
    CHECK_EQ_INT(nb_gguf_kv_count(g), 3);
    CHECK_EQ_INT(nb_gguf_tensor_count(g), 2);
    CHECK_EQ_INT(nb_gguf_data_offset(g), m->data);
    CHECK_EQ_INT(nb_gguf_tensor_at(g, 1)->offset, m->data + 32);
    CHECK_EQ_INT(nb_gguf_tensor_at(g, 1)->nbytes, 34);
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_gguf_get(ctx, g, "q", &t));
    if (t) {
        const float *v = nb_tensor_data(t);
        CHECK(t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == 32 && v[0] == -8.0f && v[31] == 7.5f);
        nb_tensor_release(t);
    }
    CHECK_OK(ctx, nb_gguf_get(ctx, g, "a", &t));
    if (t) {
        int64_t idx[2] = {1, 3};
        CHECK(t->shape[0] == 2 && t->shape[1] == 4 && nb_tensor_get(t, idx) == 4.5);
        nb_tensor_release(t);
    }
    /* the mapping outlives the reader while a view holds it */
    CHECK_OK(ctx, nb_gguf_get(ctx, g, "a", &t));
    nb_gguf_close(g);
    if (t) {
        CHECK(((const float *)nb_tensor_data(t))[7] == 4.5f);
        nb_tensor_release(t);
    }
}

static void test_header(nb_ctx *ctx, bb *b, marks *m) {
    bb e = {0};
    EXPECT_BAD(ctx, &e, 0, NB_ERR_FORMAT, "truncated in header: magic");
    nb_gguf *g = NULL;
    CHECK_FAIL(ctx, nb_gguf_open(ctx, "/nonexistent/x.gguf", &g), NB_ERR_IO, "/nonexistent/x.gguf");

    build_valid(b, m);
    memcpy(b->p, "GGML", 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "bad magic \"GGML\"");
    memcpy(b->p, "\x89PNG", 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "bad magic \"?PNG\" (89 50 4e 47), not a GGUF file");
    memcpy(b->p, "GGUF", 4);

    uint32_t v = 1;
    memcpy(b->p + 4, &v, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_UNSUPPORTED, "GGUF version 1 is not supported");
    v = 99;
    memcpy(b->p + 4, &v, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "unsupported GGUF version 99 (expected 2 or 3)");
    v = 0;
    memcpy(b->p + 4, &v, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "unsupported GGUF version 0");
    v = 0x03000000;   /* a big-endian v3 file read as little-endian */
    memcpy(b->p + 4, &v, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_UNSUPPORTED, "big-endian GGUF (version 3 byte-swapped)");
    v = 2;            /* version 2 has the same layout: accepted */
    memcpy(b->p + 4, &v, 4);
    CHECK_OK(ctx, nb_gguf_open(ctx, write_file(b, b->n), &g));
    if (g) CHECK_EQ_INT(nb_gguf_version(g), 2);
    nb_gguf_close(g);

    EXPECT_BAD(ctx, b, 6, NB_ERR_FORMAT, "truncated in header: version needs 4 bytes at offset 4, file has 6");
    EXPECT_BAD(ctx, b, 12, NB_ERR_FORMAT, "truncated in header: tensor count needs 8 bytes at offset 8");
    EXPECT_BAD(ctx, b, 20, NB_ERR_FORMAT, "truncated in header: metadata count");

    /* absurd counts: more pairs / tensors than the file could possibly hold */
    bb h = {0};
    header(&h, 3, 0, 1000000);
    kv_u32(&h, "x", 1);
    EXPECT_BAD(ctx, &h, h.n, NB_ERR_FORMAT, "header claims 1000000 metadata pairs, more than the file");
    h.n = 0;
    header(&h, 3, UINT64_MAX, 0);
    EXPECT_BAD(ctx, &h, h.n, NB_ERR_FORMAT, "header claims 18446744073709551615 tensors");
    free(h.p);
}

static void test_kv(nb_ctx *ctx, bb *b, marks *m) {
    build_valid(b, m);
    EXPECT_BAD(ctx, b, m->kv1 + 5, NB_ERR_FORMAT, "truncated in key #1: key needs 8 bytes");
    EXPECT_BAD(ctx, b, m->kv1 + 8 + 17 + 2, NB_ERR_FORMAT, "truncated in key #1 ('llama.block_count'): value type");
    EXPECT_BAD(ctx, b, m->kv1 + 8 + 17 + 4 + 3, NB_ERR_FORMAT, "truncated in key #1 ('llama.block_count'): value needs 4 bytes");
    EXPECT_BAD(ctx, b, m->kv2 + 29 + 4 + 4 + 3, NB_ERR_FORMAT, "truncated in key #2 ('tokenizer.ggml.tokens'): array count");
    /* the elements ("<s>", "", "hello") start at kv2 + 45; with at least 8 bytes per element left
     * the count check passes, and the string reader finds the end in the third element */
    EXPECT_BAD(ctx, b, m->kv2 + 45 + 11 + 8 + 5, NB_ERR_FORMAT,
               "truncated in key #2 ('tokenizer.ggml.tokens'): string element needs 8 bytes");
    EXPECT_BAD(ctx, b, m->kv2 + 45 + 11 + 8 + 8 + 2, NB_ERR_FORMAT,
               "string element in key #2 ('tokenizer.ggml.tokens') has length 5 past the end of the file");

    /* a key string whose length runs past the end of the file */
    bb k = {0};
    header(&k, 3, 0, 1);
    u64(&k, 1000);
    fill(&k, 40, 'a');
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "key in key #0 has length 1000 past the end of the file");
    k.n = 0;
    header(&k, 3, 0, 1);
    u64(&k, UINT64_MAX);
    fill(&k, 40, 'a');
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "has length 18446744073709551615 past the end");
    /* a string value likewise */
    k.n = 0;
    header(&k, 3, 0, 1);
    str(&k, "general.name");
    u32(&k, NB_GGUF_STRING);
    u64(&k, 64);
    put(&k, "short", 5);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "string value in key #0 ('general.name') has length 64 past the end");
    /* an element of a string array likewise */
    build_valid(b, m);
    uint64_t big = 1u << 20;
    memcpy(b->p + m->kv2 + 8 + 21 + 4 + 4 + 8 + 8 + 3, &big, 8);   /* length of the second element */
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "string element in key #2 ('tokenizer.ggml.tokens') has length 1048576 past the end");

    /* huge array counts */
    build_valid(b, m);
    uint64_t huge = (uint64_t)1 << 62;
    memcpy(b->p + m->kv2 + 8 + 21 + 4 + 4, &huge, 8);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "array count 4611686018427387904 in key #2 ('tokenizer.ggml.tokens') is larger than the rest of the file");
    k.n = 0;
    header(&k, 3, 0, 1);
    str(&k, "scores");
    u32(&k, NB_GGUF_ARRAY);
    u32(&k, NB_GGUF_FLOAT32);
    u64(&k, 5);                 /* 20 bytes wanted, 16 present */
    fill(&k, 16, 0);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "array count 5 in key #0 ('scores') is larger than the rest of the file can hold (16 bytes)");

    /* unknown value types: of the pair, of an array's elements, of a nested array's elements */
    build_valid(b, m);
    uint32_t bad = 13;
    memcpy(b->p + m->kv1 + 8 + 17, &bad, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "unknown metadata value type 13 in key #1 ('llama.block_count')");
    bad = 0xFFFFFFFFu;
    memcpy(b->p + m->kv1 + 8 + 17, &bad, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "unknown metadata value type 4294967295");
    build_valid(b, m);
    bad = 77;
    memcpy(b->p + m->kv2 + 8 + 21 + 4, &bad, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "unknown metadata array element type 77 in key #2 ('tokenizer.ggml.tokens')");
    k.n = 0;
    header(&k, 3, 0, 1);
    str(&k, "nest");
    u32(&k, NB_GGUF_ARRAY);
    u32(&k, NB_GGUF_ARRAY);
    u64(&k, 1);
    u32(&k, 20);
    u64(&k, 0);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "unknown metadata nested array element type 20 in key #0 ('nest')");
    /* arrays nested too deep */
    k.n = 0;
    header(&k, 3, 0, 1);
    str(&k, "deep");
    u32(&k, NB_GGUF_ARRAY);
    for (int d = 0; d < 12; d++) { u32(&k, NB_GGUF_ARRAY); u64(&k, 1); }
    u32(&k, NB_GGUF_UINT8);
    u64(&k, 0);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "arrays nested more than 8 deep in key #0 ('deep')");

    /* duplicate keys, a NUL inside a key */
    k.n = 0;
    header(&k, 3, 0, 3);
    kv_u32(&k, "a.b", 1);
    kv_u32(&k, "c", 2);
    kv_u32(&k, "a.b", 3);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "duplicate key 'a.b' (#0 and #2)");
    k.n = 0;
    header(&k, 3, 0, 1);
    u64(&k, 3);
    put(&k, "a\0b", 3);
    u32(&k, NB_GGUF_UINT8);
    u8(&k, 1);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "key #0 ('a') contains a NUL byte");

    /* general.alignment: must be a uint32 power of two */
    k.n = 0;
    header(&k, 3, 0, 1);
    kv_u32(&k, "general.alignment", 24);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "general.alignment 24 is not a power of two");
    k.n = 0;
    header(&k, 3, 0, 1);
    kv_u32(&k, "general.alignment", 0);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "general.alignment 0 is not a power of two");
    k.n = 0;
    header(&k, 3, 0, 1);
    kv_str(&k, "general.alignment", "32");
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "general.alignment has type string (expected uint32)");

    /* valid edge cases: an empty array, an empty nested array, an array of arrays of strings */
    k.n = 0;
    header(&k, 3, 0, 3);
    str(&k, "empty");
    u32(&k, NB_GGUF_ARRAY);
    u32(&k, NB_GGUF_INT32);
    u64(&k, 0);
    str(&k, "nested");
    u32(&k, NB_GGUF_ARRAY);
    u32(&k, NB_GGUF_ARRAY);
    u64(&k, 2);
    u32(&k, NB_GGUF_STRING);
    u64(&k, 2);
    str(&k, "x");
    str(&k, "yz");
    u32(&k, NB_GGUF_ARRAY);
    u64(&k, 0);
    kv_u32(&k, "after", 42);
    nb_gguf *g = NULL;
    CHECK_OK(ctx, nb_gguf_open(ctx, write_file(&k, k.n), &g));
    if (g) {
        CHECK(nb_gguf_arr_count(g, 0) == 0 && nb_gguf_arr_type(g, 0) == NB_GGUF_INT32 && nb_gguf_arr_data(g, 0) != NULL);
        CHECK(nb_gguf_arr_count(g, 1) == 2 && nb_gguf_arr_type(g, 1) == NB_GGUF_ARRAY);
        CHECK_EQ_INT(nb_gguf_kv_int(g, nb_gguf_find_key(g, "after")), 42);
        CHECK_EQ_INT(nb_gguf_tensor_count(g), 0);
        nb_gguf_close(g);
    }
    free(k.p);
}

static void test_tensors(nb_ctx *ctx, bb *b, marks *m) {
    build_valid(b, m);
    EXPECT_BAD(ctx, b, m->ti0 + 4, NB_ERR_FORMAT, "truncated in tensor info #0: tensor name");
    EXPECT_BAD(ctx, b, m->ti1 + 8 + 1 + 4 + 8 + 3, NB_ERR_FORMAT, "truncated in tensor info #1 ('q'): dimension");
    EXPECT_BAD(ctx, b, m->ti1 + 8 + 1 + 4 + 16 + 2, NB_ERR_FORMAT, "truncated in tensor info #1 ('q'): type");
    EXPECT_BAD(ctx, b, m->ti1 + 8 + 1 + 4 + 16 + 4 + 1, NB_ERR_FORMAT, "truncated in tensor info #1 ('q'): data offset");
    /* the data section cut short: the last tensor lies past the end */
    EXPECT_BAD(ctx, b, m->end - 1, NB_ERR_FORMAT, "tensor 'q' data (34 bytes at offset 288 + 32) lies past the end of the file (353 bytes)");
    /* header cut right after the tensor infos: both tensors lie past the end */
    EXPECT_BAD(ctx, b, m->data - 3, NB_ERR_FORMAT, "tensor 'a' data (32 bytes");

    size_t q_type = m->ti1 + 8 + 1 + 4 + 16, q_off = q_type + 4, q_ne0 = m->ti1 + 8 + 1 + 4;
    uint32_t t = 4;     /* Q4_2, removed from ggml */
    memcpy(b->p + q_type, &t, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' has unknown ggml type 4");
    t = 1000;
    memcpy(b->p + q_type, &t, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' has unknown ggml type 1000");
    build_valid(b, m);
    uint64_t off = 1u << 20;
    memcpy(b->p + q_off, &off, 8);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' data (34 bytes at offset 288 + 1048576) lies past the end");
    off = UINT64_MAX - 31;   /* aligned, and offset + size wraps around */
    memcpy(b->p + q_off, &off, 8);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "lies past the end of the file");
    off = 36;
    memcpy(b->p + q_off, &off, 8);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' has data offset 36, not a multiple of the alignment 32");
    build_valid(b, m);
    uint64_t ne0 = 33;
    memcpy(b->p + q_ne0, &ne0, 8);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' has row length 33, not a multiple of the Q8_0 block size 32");
    ne0 = (uint64_t)1 << 63;
    memcpy(b->p + q_ne0, &ne0, 8);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' has dimension 0 = 9223372036854775808 out of range");
    build_valid(b, m);
    uint32_t nd = 5;
    memcpy(b->p + m->ti1 + 8 + 1, &nd, 4);
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "tensor 'q' has 5 dimensions (at most 4)");
    build_valid(b, m);
    b->p[m->ti1 + 8] = 'a';   /* rename "q" to "a" */
    EXPECT_BAD(ctx, b, b->n, NB_ERR_FORMAT, "duplicate tensor name 'a' (tensors #0 and #1)");

    bb k = {0};
    header(&k, 3, 1, 0);
    uint64_t ne[3] = {(uint64_t)1 << 40, (uint64_t)1 << 40, 4};
    tinfo(&k, "big", 3, ne, NB_GGML_F32, 0);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "tensor 'big' has dimensions [1099511627776, 1099511627776, 4, 1] whose size overflows");
    k.n = 0;
    header(&k, 3, 1, 0);
    u64(&k, 3);
    put(&k, "x\0y", 3);
    u32(&k, 1);
    u64(&k, 1);
    u32(&k, NB_GGML_F32);
    u64(&k, 0);
    EXPECT_BAD(ctx, &k, k.n, NB_ERR_FORMAT, "tensor #0 has a name with a NUL byte");

    /* valid: alignment 1 puts an F32 tensor at an odd offset: nb_gguf_get copies instead of viewing;
     * a 0-dim tensor is a scalar; an IQ type opens but cannot be dequantized */
    k.n = 0;
    header(&k, 3, 3, 1);
    kv_u32(&k, "general.alignment", 1);
    uint64_t ne2[1] = {2}, ne3[1] = {256};
    tinfo(&k, "odd", 1, ne2, NB_GGML_F32, 1);
    tinfo(&k, "scalar", 0, NULL, NB_GGML_F32, 9);
    tinfo(&k, "iq", 1, ne3, NB_GGML_IQ2_XS, 13);
    size_t data = k.n;
    u8(&k, 0xEE);             /* one byte so that "odd" starts at an odd offset */
    float fv[3] = {1.5f, -3.0f, 42.0f};
    put(&k, fv, 12);
    fill(&k, 74, 0);
    nb_gguf *g = NULL;
    CHECK_OK(ctx, nb_gguf_open(ctx, write_file(&k, k.n), &g));
    if (g) {
        CHECK_EQ_INT(nb_gguf_alignment(g), 1);
        CHECK_EQ_INT(nb_gguf_data_offset(g), data);
        CHECK_EQ_INT(nb_gguf_tensor_at(g, 0)->offset % 4, 1);
        nb_tensor *x = NULL;
        CHECK_OK(ctx, nb_gguf_get(ctx, g, "odd", &x));
        if (x) {
            CHECK_EQ_INT(nb_buffer_kind_of(x->buf), NB_BUF_HEAP);
            CHECK(((const float *)nb_tensor_data(x))[0] == 1.5f && ((const float *)nb_tensor_data(x))[1] == -3.0f);
            nb_tensor_release(x);
        }
        CHECK_OK(ctx, nb_gguf_get(ctx, g, "scalar", &x));
        if (x) {
            CHECK(x->ndim == 0 && nb_tensor_numel(x) == 1 && ((const float *)nb_tensor_data(x))[0] == 42.0f);
            nb_tensor_release(x);
        }
        CHECK_EQ_INT(nb_gguf_tensor_at(g, 2)->nbytes, 74);
        CHECK_FAIL(ctx, nb_gguf_get(ctx, g, "iq", &x), NB_ERR_UNSUPPORTED, "tensor 'iq' has ggml type IQ2_XS, which nibble cannot dequantize");
        nb_gguf_close(g);
    }
    free(k.p);
}

/* Every prefix of the valid file, and every byte replaced by a few values: no crash, and each
 * failure is a named format error (the ASan build checks that nothing reads outside the map). */
static void test_fuzz(nb_ctx *ctx, bb *b, marks *m) {
    build_valid(b, m);
    int bad_status = 0;
    for (size_t n = 0; n < b->n; n++) {
        nb_gguf *g = NULL;
        nb_status s = nb_gguf_open(ctx, write_file(b, n), &g);
        if (s != NB_ERR_FORMAT || g) bad_status++;
        nb_gguf_close(g);
    }
    CHECK_EQ_INT(bad_status, 0);
    static const uint8_t vals[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, 0x20};
    int opened = 0, failed = 0, other = 0;
    for (size_t i = 0; i < m->data; i++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            uint8_t keep = b->p[i];
            if (keep == vals[v]) continue;
            b->p[i] = vals[v];
            nb_gguf *g = NULL;
            nb_status s = nb_gguf_open(ctx, write_file(b, b->n), &g);
            b->p[i] = keep;
            if (s == NB_OK) {
                opened++;
                /* whatever opened must be readable end to end */
                for (int64_t t = 0; t < nb_gguf_tensor_count(g); t++) {
                    nb_tensor *x = NULL;
                    if (nb_gguf_get(ctx, g, nb_gguf_tensor_at(g, t)->name, &x) == NB_OK) {
                        volatile float sink = 0;
                        if (x->dtype == NB_F32)
                            for (int64_t e = 0; e < nb_tensor_numel(x); e++) sink += ((const float *)nb_tensor_data(x))[e];
                        (void)sink;
                    }
                    nb_tensor_release(x);
                }
                for (int64_t k = 0; k < nb_gguf_kv_count(g); k++) {
                    for (int64_t j = 0; j < nb_gguf_arr_count(g, k); j++) (void)nb_gguf_arr_str(g, k, j, NULL);
                    (void)nb_gguf_kv_str(g, k, NULL);
                }
                nb_gguf_close(g);
            } else if (s == NB_ERR_FORMAT || s == NB_ERR_UNSUPPORTED) {
                failed++;
                CHECK(g == NULL && strstr(nb_ctx_last_error(ctx), path));
            } else {
                other++;
            }
        }
    }
    printf("fuzz: %d corruptions opened, %d rejected, %d other\n", opened, failed, other);
    CHECK(failed > 500 && opened > 50);
    CHECK_EQ_INT(other, 0);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%.40s/nbggufXXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx) != NB_OK) return 1;
    bb b = {0};
    marks m;
    build_valid(&b, &m);
    test_valid(ctx, &b, &m);
    test_header(ctx, &b, &m);
    test_kv(ctx, &b, &m);
    test_tensors(ctx, &b, &m);
    test_fuzz(ctx, &b, &m);
    free(b.p);
    nb_ctx_release(ctx);
    unlink(path);
    rmdir(dir);
    return nbt_done("test_gguf_bad");
}

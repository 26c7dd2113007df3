/* A tiny test harness for nibble's C unit tests: CHECK macros that count and report failures,
 * test data path helpers that skip (exit 77, or a part) and say which file is absent, and the small
 * helpers bit-exact tests share (float bits, a seeded RNG, byte comparison with CHECK_SAME). */
#ifndef NBTEST_H
#define NBTEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nibble/nibble.h"

static int nbt_failures = 0;
static int nbt_checks = 0;

#define CHECK(cond) do { nbt_checks++; if (!(cond)) { nbt_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { nbt_checks++; if (!(cond)) { nbt_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_EQ_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); nbt_checks++; \
    if (_a != _b) { nbt_failures++; fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", \
    __FILE__, __LINE__, #a, #b, _a, _b); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double _a = (double)(a), _b = (double)(b); nbt_checks++; \
    if (!(fabs(_a - _b) <= (tol))) { nbt_failures++; fprintf(stderr, "%s:%d: |%s - %s| <= %g failed: %.9g vs %.9g\n", \
    __FILE__, __LINE__, #a, #b, (double)(tol), _a, _b); } } while (0)
/* A call that must succeed: prints the context's message if it does not. */
#define CHECK_OK(ctx, call) do { nb_status _s = (call); nbt_checks++; if (_s != NB_OK) { nbt_failures++; \
    fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, nb_status_name(_s), \
    nb_ctx_last_error(ctx)); } } while (0)
/* A call that must fail with `code` and a message containing `needle`. */
#define CHECK_FAIL(ctx, call, code, needle) do { nb_status _s = (call); nbt_checks++; \
    if (_s != (code) || !strstr(nb_ctx_last_error(ctx), (needle))) { nbt_failures++; \
    fprintf(stderr, "%s:%d: %s -> %s \"%s\", wanted %s containing \"%s\"\n", __FILE__, __LINE__, #call, \
    nb_status_name(_s), nb_ctx_last_error(ctx), nb_status_name(code), (needle)); } } while (0)

/* Exit code for main(): prints a summary line. */
static inline int nbt_done(const char *name) {
    printf("%s: %d checks, %d failed\n", name, nbt_checks, nbt_failures);
    return nbt_failures ? 1 : 0;
}

/* Path of a test data file (under $NIBBLE_SHARED_DATA, which ctest sets, else ../shared/data), or
 * NULL after printing that `part` of the test is skipped because the file is absent. scripts/test.sh
 * counts the "SKIP (test data" lines; scripts/fetch-test-data.sh lists and fetches the files. */
static inline const char *nbt_data_part(const char *rel, const char *part) {
    static char buf[8][4096];
    static int k = 0;
    const char *root = getenv("NIBBLE_SHARED_DATA");
    char *out = buf[k++ & 7];
    snprintf(out, 4096, "%s/%s", root ? root : "../shared/data", rel);
    FILE *f = fopen(out, "rb");
    if (!f) {
        printf("SKIP (test data%s%s): %s is absent (scripts/fetch-test-data.sh)\n", part ? ", part: " : "",
               part ? part : "", out);
        return NULL;
    }
    fclose(f);
    return out;
}

/* Path of a test data file, or skip the whole test (exit 77) saying which file is absent. */
static inline const char *nbt_data(const char *rel) {
    const char *p = nbt_data_part(rel, NULL);
    if (!p) exit(77);
    return p;
}

/* Path under the source tree (tests run from the source root; NIBBLE_SOURCE_DIR wins). */
static inline const char *nbt_src(const char *rel) {
    static char buf[8][4096];
    static int k = 0;
    const char *root = getenv("NIBBLE_SOURCE_DIR");
    char *out = buf[k++ & 7];
    snprintf(out, 4096, "%s/%s", root ? root : ".", rel);
    return out;
}

/* The whole file, NUL-terminated (so text can be parsed in place), or NULL when it cannot be read;
 * *n (if given) is its length. The caller frees it. */
static inline void *nbt_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (!b) return NULL;
    b[sz] = 0;
    if (n) *n = (size_t)sz;
    return b;
}

/* Copy the safetensors file src to dst with the first `from` in its JSON header replaced by `to` (the
 * header re-padded with spaces to a multiple of 8, its length prefix rewritten; tensor offsets are
 * relative to the data after the header, so they stay valid): a checkpoint whose metadata says what a
 * test wants. 0 on success, -1 when src cannot be read, holds no `from`, or dst cannot be written. */
static inline int nbt_st_header_replace(const char *src, const char *dst, const char *from, const char *to) {
    size_t n = 0;
    unsigned char *b = nbt_slurp(src, &n);
    uint64_t hl = 0;
    if (!b || n < 8) { free(b); return -1; }
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    char *h = (char *)b + 8, *at = NULL;
    if (hl > n - 8) { free(b); return -1; }
    char save = h[hl];
    h[hl] = 0;
    at = strstr(h, from);
    h[hl] = save;
    if (!at) { free(b); return -1; }
    size_t pre = (size_t)(at - h), lf = strlen(from), lt = strlen(to);
    size_t body = hl - lf + lt, padded;
    /* trailing spaces of the old header are padding: drop them before re-padding */
    while (body > pre + lt && h[body - lt + lf - 1] == ' ') body--;
    padded = (body + 7) & ~(size_t)7;
    FILE *f = fopen(dst, "wb");
    int ok = f != NULL;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    if (ok) ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h, 1, pre, f) == pre && fwrite(to, 1, lt, f) == lt;
    size_t rest = body - pre - lt;
    if (ok) ok = fwrite(at + lf, 1, rest, f) == rest;
    for (size_t i = body; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    if (ok) ok = fwrite(h + hl, 1, n - 8 - hl, f) == n - 8 - hl;
    if (f && fclose(f) != 0) ok = 0;
    free(b);
    return ok ? 0 : -1;
}

/* A float's bits and back (memcpy: no aliasing games), for bit-exact checks. */
static inline uint32_t nbt_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float nbt_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* One RNG for a test's random inputs (seed it in main with nb_rng_seed(&nbt_rng, ...)), so a failure
 * reproduces from the seed alone. */
static nb_rng nbt_rng;
static inline uint32_t nbt_rnd32(void) { return (uint32_t)nb_rng_next(&nbt_rng); }
static inline double nbt_unif(void) { return nb_rng_uniform(&nbt_rng); }

/* First differing byte of two buffers, or -1. */
static inline int64_t nbt_first_diff(const void *a, const void *b, int64_t nbytes) {
    const uint8_t *p = a, *q = b;
    for (int64_t i = 0; i < nbytes; i++)
        if (p[i] != q[i]) return i;
    return -1;
}

/* Two buffers that must hold the same bytes: names the first differing byte, then the caller's
 * printf-style description of the case. */
#define CHECK_SAME(what, a, b, nbytes, ...) do { int64_t _d = nbt_first_diff((a), (b), (nbytes)); nbt_checks++; \
    if (_d >= 0) { nbt_failures++; fprintf(stderr, "%s:%d: %s differs at byte %lld: ", __FILE__, __LINE__, (what), \
    (long long)_d); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* Base64 (the golden JSON files' byte fields) to a malloc'd buffer of *len bytes; characters outside
 * the alphabet are skipped, '=' ends it. */
static inline uint8_t *nbt_b64_decode(const char *s, size_t *len) {
    static int8_t T[256];
    static int init = 0;
    if (!init) {
        memset(T, -1, sizeof T);
        const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; i++) T[(uint8_t)a[i]] = (int8_t)i;
        init = 1;
    }
    size_t n = strlen(s);
    uint8_t *out = malloc(n / 4 * 3 + 3);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=') break;
        int8_t v = T[(uint8_t)s[i]];
        if (v < 0) continue;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    *len = o;
    return out;
}

/* A new quantizer of format f (static or dynamic) with the default config, checked. */
static inline nb_quantizer *nbt_quantizer(nb_ctx *ctx, const char *name, nb_qformat f, int is_static) {
    nb_quantizer_config cfg;
    nb_quantizer_config_init(&cfg, f);
    cfg.is_static = is_static;
    nb_quantizer *q = NULL;
    CHECK_OK(ctx, nb_quantizer_new(ctx, name, &cfg, &q));
    return q;
}

#endif

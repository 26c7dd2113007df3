/* Private parts of the tokenizer shared by its loaders (tokenizer.json, GGUF, tokenizer.model) and
 * the engine (tok_encode.c, tok_decode.c). A loader fills the vocabulary and the options with the
 * tok_* builders below (tok_vocab.c), then calls tok_finish to build the lookup tables. */
#ifndef NB_TOK_INTERNAL_H
#define NB_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "nibble/ctx.h"
#include "nibble/tokenizer.h"

enum { TOK_ALGO_SCORES = 1, TOK_ALGO_MERGES = 2 };            /* SentencePiece scores / BPE merge ranks */
enum { TOK_PREFIX_NEVER = 0, TOK_PREFIX_ALWAYS = 1, TOK_PREFIX_FIRST = 2 };
enum { TOK_SPLIT_ISOLATED = 0, TOK_SPLIT_REMOVED = 1, TOK_SPLIT_MERGED_PREV = 2, TOK_SPLIT_MERGED_NEXT = 3,
       TOK_SPLIT_CONTIGUOUS = 4 };
enum { TOK_MAX_PRE = 8 };
/* where the tokenizer came from */
enum { TOK_SRC_NONE = 0, TOK_SRC_JSON = 1, TOK_SRC_GGUF = 2, TOK_SRC_SPM = 3 };
/* per-token flags beside the type */
enum { TOK_F_LSTRIP = 1, TOK_F_RSTRIP = 2, TOK_F_EOG = 4, TOK_F_ADDED = 8, TOK_F_NORMALIZED = 16 };

typedef struct tok_entry {
    uint32_t text_off, text_len;     /* vocabulary spelling, in the arena */
    uint32_t bytes_off, bytes_len;   /* decoded bytes, in the arena (filled by tok_finish) */
    float score;
    int32_t type;                    /* nb_token_type */
} tok_entry;

/* One pre-tokenizer step: split every current piece with a regex. The pattern text is kept so the
 * tokenizer can be written back as a tokenizer.json (tok_save.c). */
typedef struct tok_pre_step {
    pcre2_code *re;
    int behavior;                    /* TOK_SPLIT_* */
    int invert;
    int literal;                     /* the pattern is plain text (HF's {"String": ...}) */
    char *pattern;                   /* NUL-terminated copy, counted on the tokenizer's ctx */
    size_t pattern_len;
} tok_pre_step;

/* Open-addressing map from a token's spelling to its id (the keys live in the vocabulary). */
typedef struct tok_strmap {
    int32_t *slots;                  /* id, or -1 when empty */
    uint64_t mask;
} tok_strmap;

/* Open-addressing map from a pair of ids to (rank, merged id). */
typedef struct tok_pairmap {
    uint64_t *keys;                  /* (a << 32) | b, UINT64_MAX when empty */
    int32_t *rank;
    int32_t *merged;
    uint64_t mask;
    int64_t count;
} tok_pairmap;

struct nb_tokenizer {
    nb_ctx *ctx;                     /* retained: the tokenizer's memory is counted on it */
    int algo;                        /* TOK_ALGO_* */
    int byte_level;                  /* GPT-2 bytes_to_unicode input mapping */
    int byte_fallback;               /* unknown characters become <0xXX> tokens */
    int ignore_merges;               /* a whole pre-token that is in the vocabulary is taken as is */
    int meta_words;                  /* SentencePiece-style text may be cut before each "▁word" */
    /* SentencePiece-style normalization of each text fragment */
    int norm_prefix;                 /* TOK_PREFIX_*: prepend ▁ (or ' ' before escaping) */
    int norm_prefix_if_absent;       /* Metaspace: do not prepend when the text already starts with ▁ */
    int norm_escape;                 /* ' ' -> ▁ */
    int norm_remove_extra_ws;        /* SentencePiece remove_extra_whitespaces */
    int norm_is_normalizer;          /* the above came from a tokenizer.json normalizer: added tokens with
                                        normalized=true are then matched in the normalized text */
    int bl_add_prefix_space;         /* ByteLevel add_prefix_space */
    int decode_strip_space;          /* drop the leading space the prefix put there */
    int decode_byte_fallback;        /* <0xXX> tokens decode to their byte (else to their spelling, as HF
                                        does when the decoder has no ByteFallback step) */
    int n_pre;
    tok_pre_step pre[TOK_MAX_PRE];

    int32_t n_vocab;
    tok_entry *ent;
    uint8_t *tflags;                 /* TOK_F_* per token */
    size_t ent_cap;                  /* entries allocated */
    char *arena;
    size_t arena_len, arena_cap;
    tok_strmap vmap;
    tok_pairmap pmap;
    int32_t byte_tok[256];           /* byte-level: token of byte b's character; else: <0xXX> token; -1 none */
    int16_t cp_to_byte[0x144];       /* inverse of bytes_to_unicode for code points < 0x144, -1 none */
    char b2u[256][3];                /* bytes_to_unicode as UTF-8 (NUL-terminated) */

    /* special / added tokens matched in raw text, bucketed by first byte, longest first */
    int32_t *spec_ids;
    int32_t spec_start[257];
    int32_t n_spec;

    int32_t bos, eos, unk, pad;      /* pad: tokenizer.ggml.padding_token_id, -1 when absent */
    int add_bos, add_eos;
    char kind[16];
    char pre_name[48];
    int source;                      /* TOK_SRC_* */
    int64_t max_len;                 /* the model's context length when the source says it (GGUF), else 0 */
    char *chat_template;             /* tokenizer.chat_template (GGUF), counted on ctx; NULL when absent */
    size_t chat_template_len;
};

/* ---- helpers shared by the builder (tok_vocab.c) and the engine ------------------------------ */
/* static inline: the hashes and the pair lookup sit in the encoder's inner loops */

/* murmur3's 64-bit finalizer: the pair map's hash of two ids, and the end of tok_hash */
static inline uint64_t tok_pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static inline uint64_t tok_hash(const char *s, size_t n) {
    /* FNV-1a over 8-byte words with a murmur finalizer: spellings are short, this is plenty */
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return tok_pair_hash((h ^ w) * 0x100000001b3ull);   /* the same finalizer */
}

static inline int tok_utf8_len(uint8_t c) {
    static const int8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Grow an uncounted scratch buffer (per-call work memory). */
static inline int tok_sgrow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static inline const char *tok_ent_text(const nb_tokenizer *t, int32_t id) { return t->arena + t->ent[id].text_off; }

static inline int tok_is_special_type(int32_t type) { return type == NB_TOKEN_CONTROL || type == NB_TOKEN_UNKNOWN; }

static inline int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    if (!m->keys) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = tok_pair_hash(key) & m->mask;
    for (;;) {
        uint64_t k = m->keys[h];
        if (k == UINT64_MAX) return 0;
        if (k == key) {
            *rank = m->rank[h];
            *merged = m->merged[h];
            return 1;
        }
        h = (h + 1) & m->mask;
    }
}

/* ---- builders used by the loaders ---------------------------------------------------------- */
nb_status tok_new(nb_ctx *ctx, nb_tokenizer **out);
/* Reserve room for n entries (ids 0..n-1, all empty / UNDEFINED until set). */
nb_status tok_reserve(nb_tokenizer *t, int32_t n);
/* Set token id's spelling (copied), score and type; grows the vocabulary as needed. */
nb_status tok_set(nb_tokenizer *t, int32_t id, const char *text, size_t len, float score, int32_t type);
/* Add a regex pre-tokenizer step (PCRE2, UTF + UCP); `literal` compiles the pattern as plain text. */
nb_status tok_add_pre(nb_tokenizer *t, const char *pattern, size_t len, int literal, int behavior, int invert);
/* Add the merge (a, b) with the given rank; both and their concatenation must be tokens. */
nb_status tok_add_merge(nb_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int32_t rank);
/* Reserve the merge table for about n merges (optional, avoids rehashing). */
nb_status tok_reserve_merges(nb_tokenizer *t, int64_t n);
/* Build the spelling map (must come before tok_add_merge), ... */
nb_status tok_build_vocab_map(nb_tokenizer *t);
/* ... and, after everything is set: byte tables, decoded bytes, special-token index, EOG flags. */
nb_status tok_finish(nb_tokenizer *t);
int32_t tok_lookup(const nb_tokenizer *t, const char *s, size_t len);
/* The GGUF pre-tokenizer name -> regex steps (llama.cpp's table); NB_ERR_UNSUPPORTED if unknown. */
nb_status tok_set_pre_by_name(nb_tokenizer *t, const char *name);

/* Keep a copy of the chat template (counted on the tokenizer's ctx). */
nb_status tok_set_chat_template(nb_tokenizer *t, const char *s, size_t len);

/* GPT-2's byte-level regex (what ByteLevel with use_regex applies). */
extern const char *const tok_re_gpt2;

/* Read a whole file into a malloc'd NUL-terminated buffer (NB_ERR_IO naming the path). */
nb_status tok_read_file(nb_ctx *ctx, const char *path, char **data, size_t *len);

#endif

/* The tokenizer engine: vocabulary and merge tables, special-token splitting, SentencePiece-style
 * normalization, regex pre-tokenization (PCRE2), BPE by merge ranks (HF tokenizers, llama.cpp
 * `gpt2`) or by piece scores (SentencePiece, llama.cpp `llama`), and decoding.
 * The loaders (tok_json.c, tok_gguf.c, tok_spm.c) only fill the tables through tok_internal.h. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

const char *const tok_re_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- small helpers ------------------------------------------------------------------------- */

static uint64_t tok_hash(const char *s, size_t n) {
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
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static uint64_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static inline int utf8_len(uint8_t c) {
    static const int8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Grow a counted allocation to hold at least `need` bytes (doubling). */
static int cgrow(nb_ctx *ctx, void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *q = nb_alloc(ctx, nc);
    if (!q) return -1;
    if (*p) {
        memcpy(q, *p, *cap);
        nb_dealloc(ctx, *p, *cap);
    }
    *p = q;
    *cap = nc;
    return 0;
}

/* Grow an uncounted scratch buffer (per-call work memory). */
static int sgrow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

nb_status tok_read_file(nb_ctx *ctx, const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return nb_fail(ctx, NB_ERR_IO, "cannot seek in %s: %s", path, strerror(errno));
    }
    long sz = ftell(f);
    if (sz < 0) {
        fclose(f);
        return nb_fail(ctx, NB_ERR_IO, "cannot size %s: %s", path, strerror(errno));
    }
    rewind(f);
    char *buf = malloc((size_t)sz + 1);
    if (!buf) {
        fclose(f);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory reading %s (%ld bytes)", path, sz);
    }
    size_t got = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    if (got != (size_t)sz) {
        free(buf);
        return nb_fail(ctx, NB_ERR_IO, "short read on %s", path);
    }
    buf[sz] = 0;
    *data = buf;
    *len = (size_t)sz;
    return NB_OK;
}

/* ---- nb_tokens ----------------------------------------------------------------------------- */

void nb_tokens_free(nb_tokens *t) {
    if (!t) return;
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

nb_status nb_tokens_reserve(nb_ctx *ctx, nb_tokens *t, int64_t cap) {
    if (!t || cap < 0) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokens_reserve: bad arguments");
    if (cap <= t->cap) return NB_OK;
    int32_t *q = realloc(t->ids, (size_t)cap * sizeof(int32_t));
    if (!q) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory for %lld token ids", (long long)cap);
    t->ids = q;
    t->cap = cap;
    return NB_OK;
}

/* ---- building ------------------------------------------------------------------------------ */

nb_status tok_new(nb_ctx *ctx, nb_tokenizer **out) {
    nb_tokenizer *t = nb_alloc(ctx, sizeof(*t));
    if (!t) return NB_ERR_NOMEM;
    nb_ctx_retain(ctx);
    t->ctx = ctx;
    t->bos = t->eos = t->unk = t->pad = -1;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    snprintf(t->pre_name, sizeof(t->pre_name), "none");
    *out = t;
    return NB_OK;
}

/* Counted realloc: new zero-filled block, old contents copied, old block released. */
static void *crealloc(nb_ctx *ctx, void *p, size_t old_bytes, size_t new_bytes) {
    void *q = nb_alloc(ctx, new_bytes);
    if (!q) return NULL;
    if (p) {
        memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
        nb_dealloc(ctx, p, old_bytes);
    }
    return q;
}

nb_status tok_reserve(nb_tokenizer *t, int32_t n) {
    if (n < 0 || (size_t)n <= t->ent_cap) return NB_OK;
    size_t nc = t->ent_cap ? t->ent_cap : 1024;
    while (nc < (size_t)n) nc *= 2;
    tok_entry *e = crealloc(t->ctx, t->ent, t->ent_cap * sizeof(tok_entry), nc * sizeof(tok_entry));
    if (!e) return NB_ERR_NOMEM;
    t->ent = e;
    uint8_t *f = crealloc(t->ctx, t->tflags, t->ent_cap, nc);
    if (!f) return NB_ERR_NOMEM;
    t->tflags = f;
    t->ent_cap = nc;   /* new entries are zero: empty UNDEFINED tokens */
    return NB_OK;
}

static int64_t arena_put(nb_tokenizer *t, const char *s, size_t n) {
    void *p = t->arena;
    if (cgrow(t->ctx, &p, &t->arena_cap, t->arena_len + n + 1)) return -1;
    t->arena = p;
    int64_t off = (int64_t)t->arena_len;
    if (n) memcpy(t->arena + off, s, n);
    t->arena[off + (int64_t)n] = 0;
    t->arena_len += n + 1;
    return off;
}

nb_status tok_set(nb_tokenizer *t, int32_t id, const char *text, size_t len, float score, int32_t type) {
    if (id < 0) return nb_fail(t->ctx, NB_ERR_FORMAT, "negative token id %d", id);
    if ((size_t)id >= t->ent_cap) {
        if (tok_reserve(t, id + 1) != NB_OK) return NB_ERR_NOMEM;
    }
    if (len > 0xFFFFFF) return nb_fail(t->ctx, NB_ERR_FORMAT, "token %d is %zu bytes long", id, len);
    int64_t off = arena_put(t, text, len);
    if (off < 0) return NB_ERR_NOMEM;
    if (off > (int64_t)UINT32_MAX) return nb_fail(t->ctx, NB_ERR_UNSUPPORTED, "vocabulary text exceeds 4 GiB");
    tok_entry *e = &t->ent[id];
    e->text_off = (uint32_t)off;
    e->text_len = (uint32_t)len;
    e->score = score;
    e->type = type;
    if (id >= t->n_vocab) t->n_vocab = id + 1;
    return NB_OK;
}

static inline const char *ent_text(const nb_tokenizer *t, int32_t id) { return t->arena + t->ent[id].text_off; }

nb_status tok_build_vocab_map(nb_tokenizer *t) {
    uint64_t cap = 16;
    while (cap < (uint64_t)t->n_vocab * 2) cap *= 2;
    if (t->vmap.slots) nb_dealloc(t->ctx, t->vmap.slots, (t->vmap.mask + 1) * sizeof(int32_t));
    t->vmap.slots = nb_alloc(t->ctx, cap * sizeof(int32_t));
    if (!t->vmap.slots) return NB_ERR_NOMEM;
    memset(t->vmap.slots, 0xff, cap * sizeof(int32_t));
    t->vmap.mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry *e = &t->ent[id];
        if (e->text_len == 0) continue;
        const char *s = ent_text(t, id);
        uint64_t h = tok_hash(s, e->text_len) & t->vmap.mask;
        for (;;) {
            int32_t o = t->vmap.slots[h];
            if (o < 0) {
                t->vmap.slots[h] = id;
                break;
            }
            /* a spelling seen twice maps to the later id, as llama.cpp's token_to_id does */
            if (t->ent[o].text_len == e->text_len && memcmp(ent_text(t, o), s, e->text_len) == 0) {
                t->vmap.slots[h] = id;
                break;
            }
            h = (h + 1) & t->vmap.mask;
        }
    }
    return NB_OK;
}

int32_t tok_lookup(const nb_tokenizer *t, const char *s, size_t len) {
    if (!t->vmap.slots || len == 0) return -1;
    uint64_t h = tok_hash(s, len) & t->vmap.mask;
    for (;;) {
        int32_t o = t->vmap.slots[h];
        if (o < 0) return -1;
        if (t->ent[o].text_len == len && memcmp(ent_text(t, o), s, len) == 0) return o;
        h = (h + 1) & t->vmap.mask;
    }
}

static nb_status pairmap_alloc(nb_tokenizer *t, uint64_t cap) {
    tok_pairmap *m = &t->pmap;
    m->keys = nb_alloc(t->ctx, cap * sizeof(uint64_t));
    m->rank = nb_alloc(t->ctx, cap * sizeof(int32_t));
    m->merged = nb_alloc(t->ctx, cap * sizeof(int32_t));
    if (!m->keys || !m->rank || !m->merged) return NB_ERR_NOMEM;
    memset(m->keys, 0xff, cap * sizeof(uint64_t));
    m->mask = cap - 1;
    m->count = 0;
    return NB_OK;
}

static void pairmap_release(nb_tokenizer *t) {
    tok_pairmap *m = &t->pmap;
    if (!m->keys) return;
    uint64_t cap = m->mask + 1;
    nb_dealloc(t->ctx, m->keys, cap * sizeof(uint64_t));
    nb_dealloc(t->ctx, m->rank, cap * sizeof(int32_t));
    nb_dealloc(t->ctx, m->merged, cap * sizeof(int32_t));
    memset(m, 0, sizeof(*m));
}

static void pairmap_put(tok_pairmap *m, uint64_t key, int32_t rank, int32_t merged) {
    uint64_t h = pair_hash(key) & m->mask;
    for (;;) {
        if (m->keys[h] == UINT64_MAX) {
            m->keys[h] = key;
            m->rank[h] = rank;
            m->merged[h] = merged;
            m->count++;
            return;
        }
        if (m->keys[h] == key) {          /* a repeated merge keeps its first (best) rank */
            if (rank < m->rank[h]) {
                m->rank[h] = rank;
                m->merged[h] = merged;
            }
            return;
        }
        h = (h + 1) & m->mask;
    }
}

static inline int pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    if (!m->keys) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = pair_hash(key) & m->mask;
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

nb_status tok_reserve_merges(nb_tokenizer *t, int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    if (t->pmap.keys && t->pmap.mask + 1 >= cap) return NB_OK;
    tok_pairmap old = t->pmap;
    memset(&t->pmap, 0, sizeof(t->pmap));
    if (pairmap_alloc(t, cap) != NB_OK) return NB_ERR_NOMEM;
    if (old.keys) {
        for (uint64_t i = 0; i <= old.mask; i++)
            if (old.keys[i] != UINT64_MAX) pairmap_put(&t->pmap, old.keys[i], old.rank[i], old.merged[i]);
        uint64_t oc = old.mask + 1;
        nb_dealloc(t->ctx, old.keys, oc * sizeof(uint64_t));
        nb_dealloc(t->ctx, old.rank, oc * sizeof(int32_t));
        nb_dealloc(t->ctx, old.merged, oc * sizeof(int32_t));
    }
    return NB_OK;
}

nb_status tok_add_merge(nb_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int32_t rank) {
    int32_t ia = tok_lookup(t, a, alen), ib = tok_lookup(t, b, blen);
    if (ia < 0 || ib < 0)
        return nb_fail(t->ctx, NB_ERR_FORMAT, "merge %d (\"%.*s\" \"%.*s\"): %s is not in the vocabulary", rank,
                       (int)alen, a, (int)blen, b, ia < 0 ? "the first part" : "the second part");
    char stackbuf[512];
    char *cat = alen + blen <= sizeof(stackbuf) ? stackbuf : malloc(alen + blen);
    if (!cat) return nb_fail(t->ctx, NB_ERR_NOMEM, "out of memory");
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    int32_t im = tok_lookup(t, cat, alen + blen);
    if (cat != stackbuf) free(cat);
    if (im < 0)
        return nb_fail(t->ctx, NB_ERR_FORMAT, "merge %d (\"%.*s\" \"%.*s\"): the merged token is not in the vocabulary",
                       rank, (int)alen, a, (int)blen, b);
    if ((uint64_t)(t->pmap.count + 1) * 2 > (t->pmap.keys ? t->pmap.mask + 1 : 0)) {
        if (tok_reserve_merges(t, (t->pmap.count + 1) * 2) != NB_OK) return NB_ERR_NOMEM;
    }
    pairmap_put(&t->pmap, ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, rank, im);
    return NB_OK;
}

nb_status tok_add_pre(nb_tokenizer *t, const char *pattern, size_t len, int literal, int behavior, int invert) {
    if (t->n_pre >= TOK_MAX_PRE)
        return nb_fail(t->ctx, NB_ERR_UNSUPPORTED, "more than %d pre-tokenizer steps", TOK_MAX_PRE);
    int err = 0;
    PCRE2_SIZE erroff = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return nb_fail(t->ctx, NB_ERR_FORMAT, "pre-tokenizer regex /%.*s/ does not compile at offset %zu: %s",
                       (int)len, pattern, (size_t)erroff, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* the interpreter still works if JIT is absent */
    char *copy = nb_alloc(t->ctx, len + 1);
    if (!copy) {
        pcre2_code_free(re);
        return NB_ERR_NOMEM;
    }
    if (len) memcpy(copy, pattern, len);
    copy[len] = 0;
    tok_pre_step *st = &t->pre[t->n_pre];
    st->re = re;
    st->behavior = behavior;
    st->invert = invert;
    st->literal = literal != 0;
    st->pattern = copy;
    st->pattern_len = len;
    t->n_pre++;
    return NB_OK;
}

nb_status tok_set_chat_template(nb_tokenizer *t, const char *s, size_t len) {
    if (t->chat_template) nb_dealloc(t->ctx, t->chat_template, t->chat_template_len + 1);
    t->chat_template = nb_alloc(t->ctx, len + 1);
    t->chat_template_len = 0;
    if (!t->chat_template) return NB_ERR_NOMEM;
    if (len) memcpy(t->chat_template, s, len);
    t->chat_template[len] = 0;
    t->chat_template_len = len;
    return NB_OK;
}

/* llama.cpp's pre-tokenizer table (llama-vocab.cpp), written with the original HF patterns: PCRE2
 * runs them as HF's regex engine does, and each step keeps the text between matches (Isolated). */
typedef struct { const char *names; const char *re[4]; int ignore_merges; } tok_pre_def;

#define RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2_NOWS "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

static const tok_pre_def tok_pre_table[] = {
    {",default,", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2_NOWS, "\\p{N}+", "[0-9][0-9][0-9]"}, 0},
    {",llama3,llama-v3,llama-bpe,falcon3,falcon-h1,pixtral,midm-2.0,lfm2,", {RE_LLAMA3}, 1},
    {",dbrx,smaug-bpe,chatglm-bpe,glm4,", {RE_LLAMA3}, 0},
    {",gpt-2,phi-2,jina-es,jina-de,gigachat,jina-v2-es,jina-v2-de,a.x-4.0,mellum,modern-bert,mpt,olmo,jais,"
     "trillion,granite-docling,jina-v1-en,jina-v2-code,roberta-bpe,exaone4,", {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}, 0},
    {",qwen2,deepseek-r1-qwen,kormo,stablelm2,hunyuan,solar-open,megrez,grok-2,", {RE_QWEN2}, 0},
    {",qwen35,", {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, 0},
    {",starcoder,refact,command-r,smollm,codeshell,exaone,minerva-7b,", {"\\p{N}", RE_GPT2_NOWS}, 0},
    {",falcon,", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2_NOWS, "[0-9][0-9][0-9]"}, 0},
    {",tekken,", {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, 1},
    {",gpt-4o,llama4,", {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, 0},
    {",poro-chat,bloom,gpt3-finnish,", {" ?[^(\\s|.,!?…。，、।۔،)]+"}, 0},
    {",viking,", {" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"}, 0},
};

nb_status tok_set_pre_by_name(nb_tokenizer *t, const char *name) {
    char key[64];
    if (strlen(name) + 3 > sizeof(key) || strchr(name, ','))
        return nb_fail(t->ctx, NB_ERR_UNSUPPORTED, "GGUF pre-tokenizer '%s' is not supported", name);
    snprintf(key, sizeof(key), ",%s,", name);
    for (size_t i = 0; i < sizeof(tok_pre_table) / sizeof(tok_pre_table[0]); i++) {
        const tok_pre_def *d = &tok_pre_table[i];
        if (!strstr(d->names, key)) continue;
        for (int k = 0; k < 4 && d->re[k]; k++) {
            nb_status s = tok_add_pre(t, d->re[k], strlen(d->re[k]), 0, TOK_SPLIT_ISOLATED, 0);
            if (s != NB_OK) return s;
        }
        t->ignore_merges = d->ignore_merges;
        snprintf(t->pre_name, sizeof(t->pre_name), "%s", name);
        return NB_OK;
    }
    return nb_fail(t->ctx, NB_ERR_UNSUPPORTED, "GGUF pre-tokenizer '%s' is not supported", name);
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes map
 * in order to U+0100.. so that every byte is a visible character. */
static void build_byte_tables(nb_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 0x144; i++) t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = printable ? b : 256 + n++;
        t->cp_to_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            t->b2u[b][0] = (char)cp;
            t->b2u[b][1] = 0;
        } else {
            t->b2u[b][0] = (char)(0xC0 | (cp >> 6));
            t->b2u[b][1] = (char)(0x80 | (cp & 0x3F));
            t->b2u[b][2] = 0;
        }
    }
}

static int is_byte_spelling(const char *s, size_t n, int *byte) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || !isxdigit((unsigned char)s[3]) ||
        !isxdigit((unsigned char)s[4]))
        return 0;
    char hx[3] = {s[3], s[4], 0};
    *byte = (int)strtol(hx, NULL, 16);
    return 1;
}

static int eog_spelling(const char *s, size_t n) {
    static const char *const names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                        "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<end_of_utterance>", NULL};
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return 1;
    return 0;
}

typedef struct spec_key { uint32_t first, len; int32_t id; } spec_key;

static int spec_cmp(const void *pa, const void *pb) {
    const spec_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;   /* longest first */
    return a->id < b->id ? -1 : (a->id > b->id);
}

static int is_special_type(int32_t type) { return type == NB_TOKEN_CONTROL || type == NB_TOKEN_UNKNOWN; }

nb_status tok_finish(nb_tokenizer *t) {
    nb_ctx *ctx = t->ctx;
    if (t->n_vocab <= 0) return nb_fail(ctx, NB_ERR_FORMAT, "the tokenizer has an empty vocabulary");
    /* HF spells an added token with normalized=true by its normalized content ("<tool>" becomes
     * "▁<tool>" under a Prepend normalizer): that spelling is what matches and what decodes */
    int respelled = 0;
    if (t->norm_is_normalizer && !t->byte_level) {
        for (int32_t id = 0; id < t->n_vocab; id++) {
            if (!(t->tflags[id] & TOK_F_NORMALIZED) || t->ent[id].text_len == 0) continue;
            size_t n = t->ent[id].text_len, m = 0;
            char *buf = malloc(n * 3 + 4);
            if (!buf) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
            if (t->norm_prefix != TOK_PREFIX_NEVER) {
                memcpy(buf, "\xe2\x96\x81", 3);
                m = 3;
            }
            for (size_t i = 0; i < n; i++) {
                char c = ent_text(t, id)[i];
                if (c == ' ' && t->norm_escape) {
                    memcpy(buf + m, "\xe2\x96\x81", 3);
                    m += 3;
                } else {
                    buf[m++] = c;
                }
            }
            int64_t off = arena_put(t, buf, m);
            free(buf);
            if (off < 0) return NB_ERR_NOMEM;
            t->ent[id].text_off = (uint32_t)off;
            t->ent[id].text_len = (uint32_t)m;
            respelled = 1;
        }
    }
    if ((!t->vmap.slots || respelled) && tok_build_vocab_map(t) != NB_OK) return NB_ERR_NOMEM;
    build_byte_tables(t);
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) {
            t->byte_tok[b] = tok_lookup(t, t->b2u[b], strlen(t->b2u[b]));
        } else {
            char sp[8];
            snprintf(sp, sizeof(sp), "<0x%02X>", b);
            t->byte_tok[b] = tok_lookup(t, sp, 6);
        }
    }
    /* decoded bytes of every token */
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        tok_entry *e = &t->ent[id];
        const char *s = ent_text(t, id);
        size_t n = e->text_len, m = 0;
        if (sgrow((void **)&tmp, &tmp_cap, n + 4, 1)) {
            free(tmp);
            return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
        }
        int byte;
        int normalized_added = (t->tflags[id] & TOK_F_NORMALIZED) && t->norm_is_normalizer;
        if (!t->byte_level && e->type != NB_TOKEN_CONTROL && is_byte_spelling(s, n, &byte) &&
            (e->type == NB_TOKEN_BYTE || t->byte_fallback)) {
            e->type = NB_TOKEN_BYTE;
            if (t->decode_byte_fallback) {
                tmp[m++] = (char)byte;
            } else {
                memcpy(tmp, s, n);
                m = n;
            }
        } else if (!normalized_added && (e->type == NB_TOKEN_CONTROL || e->type == NB_TOKEN_UNKNOWN ||
                                         e->type == NB_TOKEN_USER_DEFINED || (t->tflags[id] & TOK_F_ADDED))) {
            memcpy(tmp, s, n);
            m = n;
        } else if (t->byte_level) {
            for (size_t i = 0; i < n;) {
                int l = utf8_len((uint8_t)s[i]);
                if (i + (size_t)l > n) l = (int)(n - i);
                uint32_t cp = (uint8_t)s[i];
                if (l == 2) cp = ((cp & 0x1F) << 6) | ((uint8_t)s[i + 1] & 0x3F);
                if ((l == 1 || l == 2) && cp < 0x144 && t->cp_to_byte[cp] >= 0) {
                    tmp[m++] = (char)t->cp_to_byte[cp];
                } else {
                    memcpy(tmp + m, s + i, (size_t)l);
                    m += (size_t)l;
                }
                i += (size_t)l;
            }
        } else {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    tmp[m++] = ' ';
                    i += 3;
                } else {
                    tmp[m++] = s[i++];
                }
            }
        }
        int64_t off = arena_put(t, tmp, m);
        if (off < 0) {
            free(tmp);
            return NB_ERR_NOMEM;
        }
        e = &t->ent[id];
        e->bytes_off = (uint32_t)off;
        e->bytes_len = (uint32_t)m;
    }
    free(tmp);

    /* can the text be cut before every "▁word"? (see encode_words) */
    t->meta_words = !t->byte_level && !t->ignore_merges;
    for (int32_t id = 0; id < t->n_vocab && t->meta_words; id++) {
        const char *s = ent_text(t, id);
        uint32_t n = t->ent[id].text_len;
        for (uint32_t i = 1; i + 3 <= n; i++) {
            if (memcmp(s + i, "\xe2\x96\x81", 3) == 0 && (i < 3 || memcmp(s + i - 3, "\xe2\x96\x81", 3) != 0)) {
                t->meta_words = 0;
                break;
            }
        }
    }

    /* special and added tokens, matched in raw text before anything else */
    int32_t n_spec = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int32_t ty = t->ent[id].type;
        if (t->ent[id].text_len > 0 && (is_special_type(ty) || ty == NB_TOKEN_USER_DEFINED || (t->tflags[id] & TOK_F_ADDED)))
            n_spec++;
    }
    if (n_spec > 0) {
        t->spec_ids = nb_alloc(ctx, (size_t)n_spec * sizeof(int32_t));
        spec_key *keys = malloc((size_t)n_spec * sizeof(spec_key));
        if (!t->spec_ids || !keys) {
            free(keys);
            return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
        }
        int32_t k = 0;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            int32_t ty = t->ent[id].type;
            if (t->ent[id].text_len > 0 && (is_special_type(ty) || ty == NB_TOKEN_USER_DEFINED || (t->tflags[id] & TOK_F_ADDED))) {
                keys[k].first = (uint8_t)ent_text(t, id)[0];
                keys[k].len = t->ent[id].text_len;
                keys[k].id = id;
                k++;
            }
        }
        qsort(keys, (size_t)n_spec, sizeof(spec_key), spec_cmp);
        for (k = 0; k < n_spec; k++) t->spec_ids[k] = keys[k].id;
        free(keys);
    }
    t->n_spec = n_spec;
    memset(t->spec_start, 0, sizeof(t->spec_start));
    for (int32_t k = 0; k < n_spec; k++) t->spec_start[(uint8_t)ent_text(t, t->spec_ids[k])[0] + 1]++;
    for (int b = 0; b < 256; b++) t->spec_start[b + 1] += t->spec_start[b];

    for (int32_t id = 0; id < t->n_vocab; id++)
        if (id == t->eos || (t->ent[id].type == NB_TOKEN_CONTROL && eog_spelling(ent_text(t, id), t->ent[id].text_len)))
            t->tflags[id] |= TOK_F_EOG;
    return NB_OK;
}

void nb_tokenizer_free(nb_tokenizer *t) {
    if (!t) return;
    nb_ctx *ctx = t->ctx;
    for (int i = 0; i < t->n_pre; i++) {
        pcre2_code_free(t->pre[i].re);
        nb_dealloc(ctx, t->pre[i].pattern, t->pre[i].pattern_len + 1);
    }
    if (t->chat_template) nb_dealloc(ctx, t->chat_template, t->chat_template_len + 1);
    if (t->ent) nb_dealloc(ctx, t->ent, t->ent_cap * sizeof(tok_entry));
    if (t->tflags) nb_dealloc(ctx, t->tflags, t->ent_cap);
    if (t->arena) nb_dealloc(ctx, t->arena, t->arena_cap);
    if (t->vmap.slots) nb_dealloc(ctx, t->vmap.slots, (t->vmap.mask + 1) * sizeof(int32_t));
    pairmap_release(t);
    if (t->spec_ids) nb_dealloc(ctx, t->spec_ids, (size_t)t->n_spec * sizeof(int32_t));
    nb_dealloc(ctx, t, sizeof(*t));
    nb_ctx_release(ctx);
}

/* ---- accessors ----------------------------------------------------------------------------- */

int32_t nb_tokenizer_vocab_size(const nb_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t nb_tokenizer_bos(const nb_tokenizer *t) { return t ? t->bos : -1; }
int32_t nb_tokenizer_eos(const nb_tokenizer *t) { return t ? t->eos : -1; }
int32_t nb_tokenizer_unk(const nb_tokenizer *t) { return t ? t->unk : -1; }
int nb_tokenizer_add_bos(const nb_tokenizer *t) { return t && t->add_bos && t->bos >= 0; }
int nb_tokenizer_add_eos(const nb_tokenizer *t) { return t && t->add_eos && t->eos >= 0; }
const char *nb_tokenizer_kind(const nb_tokenizer *t) { return t ? t->kind : ""; }
const char *nb_tokenizer_pre(const nb_tokenizer *t) { return t ? t->pre_name : ""; }

const char *nb_tokenizer_token_text(const nb_tokenizer *t, int32_t id, uint32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->ent[id].text_len;
    return ent_text(t, id);
}

const char *nb_tokenizer_token_bytes(const nb_tokenizer *t, int32_t id, uint32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->ent[id].bytes_len;
    return t->arena + t->ent[id].bytes_off;
}

nb_token_type nb_tokenizer_token_type(const nb_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NB_TOKEN_UNDEFINED;
    return (nb_token_type)t->ent[id].type;
}

int32_t nb_tokenizer_find(const nb_tokenizer *t, const char *text, int64_t len) {
    if (!t || !text || len <= 0) return -1;
    return tok_lookup(t, text, (size_t)len);
}

int nb_tokenizer_is_eog(const nb_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    return (t->tflags[id] & TOK_F_EOG) != 0;
}

/* ---- encoding ------------------------------------------------------------------------------ */

typedef struct tok_bigram {
    double key;                       /* merge rank, or minus the piece score: smaller goes first */
    int32_t left, right, size, id;
} tok_bigram;

typedef struct tok_piece { int64_t off, len; } tok_piece;

typedef struct tok_cache_slot {
    uint64_t hash;
    int64_t key_off;                  /* into cache_keys; -1 when empty */
    int32_t key_len, ids_n;
    int64_t ids_off;                  /* into cache_ids */
} tok_cache_slot;

typedef struct tok_work {
    nb_ctx *ctx;
    const nb_tokenizer *t;
    nb_tokens *out;
    nb_status err;
    int parse_special;
    char *nbuf; size_t nbuf_cap;      /* normalized fragment */
    char *tmp; size_t tmp_cap;
    int32_t *s_id, *s_off, *s_len, *s_prev, *s_next; size_t s_cap;
    tok_bigram *heap; size_t heap_n, heap_cap;
    tok_piece *pa, *pb; size_t pa_cap, pb_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    tok_cache_slot *cache; size_t cache_cap, cache_n;
    char *cache_keys; size_t ck_len, ck_cap;
    int32_t *cache_ids; size_t ci_len, ci_cap;
} tok_work;

static void work_free(tok_work *w) {
    free(w->nbuf);
    free(w->tmp);
    free(w->s_id); free(w->s_off); free(w->s_len); free(w->s_prev); free(w->s_next);
    free(w->heap);
    free(w->pa); free(w->pb);
    if (w->md) pcre2_match_data_free(w->md);
    if (w->mctx) pcre2_match_context_free(w->mctx);
    if (w->jit) pcre2_jit_stack_free(w->jit);
    free(w->cache);
    free(w->cache_keys);
    free(w->cache_ids);
}

static int oom(tok_work *w) {
    if (w->err == NB_OK) w->err = nb_fail(w->ctx, NB_ERR_NOMEM, "out of memory while tokenizing");
    return -1;
}

static inline int emit(tok_work *w, int32_t id) {
    nb_tokens *o = w->out;
    if (o->n >= o->cap) {
        int64_t nc = o->cap ? o->cap * 2 : 256;
        int32_t *q = realloc(o->ids, (size_t)nc * sizeof(int32_t));
        if (!q) return oom(w);
        o->ids = q;
        o->cap = nc;
    }
    o->ids[o->n++] = id;
    return 0;
}

static int syms_reserve(tok_work *w, size_t n) {
    if (n <= w->s_cap) return 0;
    size_t nc = w->s_cap ? w->s_cap : 64;
    while (nc < n) nc *= 2;
    int32_t **arrs[5] = {&w->s_id, &w->s_off, &w->s_len, &w->s_prev, &w->s_next};
    for (int i = 0; i < 5; i++) {
        int32_t *q = realloc(*arrs[i], nc * sizeof(int32_t));
        if (!q) return oom(w);
        *arrs[i] = q;
    }
    w->s_cap = nc;
    return 0;
}

static inline int bg_less(const tok_bigram *a, const tok_bigram *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(tok_work *w, tok_bigram b) {
    if (sgrow((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof(tok_bigram))) return oom(w);
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_less(&b, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static tok_bigram heap_pop(tok_work *w) {
    tok_bigram top = w->heap[0];
    tok_bigram last = w->heap[--w->heap_n];
    size_t n = w->heap_n, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const tok_bigram *best = &last;
        if (l < n && bg_less(&w->heap[l], best)) { m = l; best = &w->heap[l]; }
        if (r < n && bg_less(&w->heap[r], best)) { m = r; }
        if (m == i) break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

/* SentencePiece types a merge may produce (control, unknown and byte pieces never come from merging). */
static inline int mergeable_type(int32_t ty) {
    return ty == NB_TOKEN_NORMAL || ty == NB_TOKEN_USER_DEFINED || ty == NB_TOKEN_UNUSED || ty == NB_TOKEN_UNDEFINED;
}

static int try_pair(tok_work *w, const char *text, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const nb_tokenizer *t = w->t;
    tok_bigram b;
    b.left = l;
    b.right = r;
    b.size = w->s_len[l] + w->s_len[r];
    if (t->algo == TOK_ALGO_SCORES) {
        int32_t id = tok_lookup(t, text + w->s_off[l], (size_t)b.size);
        if (id < 0 || !mergeable_type(t->ent[id].type)) return 0;
        b.key = -(double)t->ent[id].score;
        b.id = id;
    } else {
        int32_t rank, merged;
        if (w->s_id[l] < 0 || w->s_id[r] < 0 || !pairmap_get(&t->pmap, w->s_id[l], w->s_id[r], &rank, &merged)) return 0;
        b.key = (double)rank;
        b.id = merged;
    }
    return heap_push(w, b);
}

/* Merge the n symbols already in w->s_* (linked 0..n-1) until no pair applies. */
static int merge_symbols(tok_work *w, const char *text, int32_t n) {
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        if (try_pair(w, text, i, i + 1)) return -1;
    while (w->heap_n > 0) {
        tok_bigram b = heap_pop(w);
        int32_t l = b.left, r = b.right;
        /* stale: one side was merged away, or grew (the only ways a pair changes) */
        if (w->s_len[l] == 0 || w->s_len[r] == 0 || w->s_len[l] + w->s_len[r] != b.size) continue;
        w->s_id[l] = b.id;
        w->s_len[l] += w->s_len[r];
        w->s_len[r] = 0;
        w->s_next[l] = w->s_next[r];
        if (w->s_next[r] >= 0) w->s_prev[w->s_next[r]] = l;
        if (try_pair(w, text, w->s_prev[l], l)) return -1;
        if (try_pair(w, text, l, w->s_next[l])) return -1;
    }
    return 0;
}

static int emit_bytes_fallback(tok_work *w, const char *s, int32_t n) {
    const nb_tokenizer *t = w->t;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[(uint8_t)s[i]];
        if (id < 0) id = t->unk;
        if (id >= 0 && emit(w, id)) return -1;
    }
    return 0;
}

/* SentencePiece BPE by piece scores (llama.cpp's llm_tokenizer_spm, sentencepiece's bpe_model). */
static int encode_spm_scores(tok_work *w, const char *s, int64_t n) {
    const nb_tokenizer *t = w->t;
    if (n <= 0) return 0;
    if (syms_reserve(w, (size_t)n)) return -1;
    int32_t k = 0;
    for (int64_t i = 0; i < n;) {
        int l = utf8_len((uint8_t)s[i]);
        if (i + l > n) l = (int)(n - i);
        w->s_off[k] = (int32_t)i;
        w->s_len[k] = l;
        w->s_id[k] = -1;
        w->s_prev[k] = k - 1;
        w->s_next[k] = i + l >= n ? -1 : k + 1;
        k++;
        i += l;
    }
    if (merge_symbols(w, s, k)) return -1;
    for (int32_t i = 0; i >= 0; i = w->s_next[i]) {
        int32_t id = w->s_id[i];
        if (id < 0) {
            id = tok_lookup(t, s + w->s_off[i], (size_t)w->s_len[i]);
            if (id >= 0 && !mergeable_type(t->ent[id].type)) id = -1;
        }
        if (id >= 0) {
            if (emit(w, id)) return -1;
        } else if (t->byte_fallback) {
            if (emit_bytes_fallback(w, s + w->s_off[i], w->s_len[i])) return -1;
        } else if (t->unk >= 0) {
            if (emit(w, t->unk)) return -1;
        }
    }
    return 0;
}

/* BPE by merge ranks over characters (HF BPE with byte_fallback: Llama-2 / Mistral tokenizer.json). */
static int encode_bpe_chars(tok_work *w, const char *s, int64_t n) {
    const nb_tokenizer *t = w->t;
    if (n <= 0) return 0;
    if (t->ignore_merges) {
        int32_t id = tok_lookup(t, s, (size_t)n);
        if (id >= 0) return emit(w, id);
    }
    if (syms_reserve(w, (size_t)n)) return -1;
    int32_t k = 0;
    for (int64_t i = 0; i < n;) {
        int l = utf8_len((uint8_t)s[i]);
        if (i + l > n) l = (int)(n - i);
        int32_t id = tok_lookup(t, s + i, (size_t)l);
        int bytes = 0;
        if (id < 0 && t->byte_fallback) {
            bytes = 1;
            for (int j = 0; j < l; j++) bytes &= t->byte_tok[(uint8_t)s[i + j]] >= 0;
        }
        int nsym = bytes ? l : 1;
        for (int j = 0; j < nsym; j++) {
            w->s_off[k] = (int32_t)(i + j);
            w->s_len[k] = bytes ? 1 : l;
            w->s_id[k] = bytes ? t->byte_tok[(uint8_t)s[i + j]] : (id >= 0 ? id : t->unk);
            w->s_prev[k] = k - 1;
            w->s_next[k] = k + 1;
            k++;
        }
        i += l;
    }
    w->s_next[k - 1] = -1;
    if (merge_symbols(w, s, k)) return -1;
    for (int32_t i = 0; i >= 0; i = w->s_next[i])
        if (w->s_id[i] >= 0 && emit(w, w->s_id[i])) return -1;
    return 0;
}

/* Byte-level BPE of one pre-token (GPT-2 family). */
static int encode_bpe_bytes(tok_work *w, const char *s, int64_t n) {
    const nb_tokenizer *t = w->t;
    if (n <= 0) return 0;
    if (t->ignore_merges) {
        if (sgrow((void **)&w->tmp, &w->tmp_cap, (size_t)n * 2 + 1, 1)) return oom(w);
        size_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            const char *u = t->b2u[(uint8_t)s[i]];
            w->tmp[m++] = u[0];
            if (u[1]) w->tmp[m++] = u[1];
        }
        int32_t id = tok_lookup(t, w->tmp, m);
        if (id >= 0) return emit(w, id);
    }
    if (syms_reserve(w, (size_t)n)) return -1;
    for (int32_t i = 0; i < (int32_t)n; i++) {
        w->s_off[i] = i;
        w->s_len[i] = 1;
        w->s_id[i] = t->byte_tok[(uint8_t)s[i]];
        w->s_prev[i] = i - 1;
        w->s_next[i] = i + 1;
    }
    w->s_next[n - 1] = -1;
    if (merge_symbols(w, s, (int32_t)n)) return -1;
    for (int32_t i = 0; i >= 0; i = w->s_next[i]) {
        int32_t id = w->s_id[i] >= 0 ? w->s_id[i] : t->unk;
        if (id >= 0 && emit(w, id)) return -1;
    }
    return 0;
}

typedef int (*tok_enc_fn)(tok_work *w, const char *s, int64_t n);

/* Memoize an encoder per call on short pieces: text repeats its words, and a word's ids depend only
 * on its bytes. */
static int encode_cached(tok_work *w, const char *s, int64_t n, tok_enc_fn fn) {
    if (n <= 0) return 0;
    if (n > 256) return fn(w, s, n);
    uint64_t h = tok_hash(s, (size_t)n);
    if (w->cache_cap) {
        size_t i = h & (w->cache_cap - 1);
        while (w->cache[i].key_off >= 0) {
            tok_cache_slot *c = &w->cache[i];
            if (c->hash == h && c->key_len == n && memcmp(w->cache_keys + c->key_off, s, (size_t)n) == 0) {
                for (int32_t j = 0; j < c->ids_n; j++)
                    if (emit(w, w->cache_ids[c->ids_off + j])) return -1;
                return 0;
            }
            i = (i + 1) & (w->cache_cap - 1);
        }
    }
    int64_t first = w->out->n;
    if (fn(w, s, n)) return -1;
    if ((w->cache_n + 1) * 2 > w->cache_cap) {
        size_t nc = w->cache_cap ? w->cache_cap * 2 : 1024;
        tok_cache_slot *nt = malloc(nc * sizeof(tok_cache_slot));
        if (!nt) return oom(w);
        for (size_t i = 0; i < nc; i++) nt[i].key_off = -1;
        for (size_t i = 0; i < w->cache_cap; i++) {
            if (w->cache[i].key_off < 0) continue;
            size_t j = w->cache[i].hash & (nc - 1);
            while (nt[j].key_off >= 0) j = (j + 1) & (nc - 1);
            nt[j] = w->cache[i];
        }
        free(w->cache);
        w->cache = nt;
        w->cache_cap = nc;
    }
    int32_t cnt = (int32_t)(w->out->n - first);
    if (sgrow((void **)&w->cache_keys, &w->ck_cap, w->ck_len + (size_t)n, 1)) return oom(w);
    if (sgrow((void **)&w->cache_ids, &w->ci_cap, w->ci_len + (size_t)cnt + 1, sizeof(int32_t))) return oom(w);
    size_t i = h & (w->cache_cap - 1);
    while (w->cache[i].key_off >= 0) i = (i + 1) & (w->cache_cap - 1);
    tok_cache_slot *c = &w->cache[i];
    c->hash = h;
    c->key_off = (int64_t)w->ck_len;
    c->key_len = (int32_t)n;
    c->ids_off = (int64_t)w->ci_len;
    c->ids_n = cnt;
    memcpy(w->cache_keys + w->ck_len, s, (size_t)n);
    w->ck_len += (size_t)n;
    if (cnt > 0) memcpy(w->cache_ids + w->ci_len, w->out->ids + first, (size_t)cnt * sizeof(int32_t));
    w->ci_len += (size_t)cnt;
    w->cache_n++;
    return 0;
}

/* SentencePiece-style text: when no token has a ▁ after another character, no merge can cross
 * the start of a "▁word", so the text splits there into words that tokenize independently (and
 * repeat, so the cache applies). The result is identical: each word's merges happen in the same
 * relative order as in one pass over the whole text. */
static int encode_words(tok_work *w, const char *s, int64_t n, tok_enc_fn fn) {
    if (!w->t->meta_words) return encode_cached(w, s, n, fn);
    int64_t start = 0;
    for (int64_t i = 1; i + 3 <= n; i++) {
        if (memcmp(s + i, "\xe2\x96\x81", 3) != 0) continue;
        if (i >= 3 && memcmp(s + i - 3, "\xe2\x96\x81", 3) == 0) continue;
        if (encode_cached(w, s + start, i - start, fn)) return -1;
        start = i;
        i += 2;
    }
    return encode_cached(w, s + start, n - start, fn);
}

/* ---- pre-tokenization ---------------------------------------------------------------------- */

typedef struct seg_state {
    tok_piece **dst; size_t *dst_cap; size_t *dst_n;
    size_t first;                     /* first piece produced from the current subject */
    int prev_match;
    int behavior, invert;
} seg_state;

static int push_piece(tok_work *w, seg_state *st, int64_t off, int64_t len) {
    if (sgrow((void **)st->dst, st->dst_cap, *st->dst_n + 1, sizeof(tok_piece))) return oom(w);
    (*st->dst)[*st->dst_n].off = off;
    (*st->dst)[*st->dst_n].len = len;
    (*st->dst_n)++;
    return 0;
}

/* HF's SplitDelimiterBehavior fold over the (segment, is_match) sequence of one subject. */
static int seg_emit(tok_work *w, seg_state *st, int64_t s, int64_t e, int is_match) {
    if (st->invert) is_match = !is_match;
    int have_last = *st->dst_n > st->first;
    tok_piece *last = have_last ? &(*st->dst)[*st->dst_n - 1] : NULL;
    int r = 0;
    switch (st->behavior) {
    case TOK_SPLIT_REMOVED:
        if (!is_match) r = push_piece(w, st, s, e - s);
        break;
    case TOK_SPLIT_MERGED_PREV:
        if (is_match && !st->prev_match && have_last) last->len = e - last->off;
        else r = push_piece(w, st, s, e - s);
        break;
    case TOK_SPLIT_MERGED_NEXT:
        if (st->prev_match && have_last) last->len = e - last->off;
        else r = push_piece(w, st, s, e - s);
        break;
    case TOK_SPLIT_CONTIGUOUS:
        if (is_match && st->prev_match && have_last) last->len = e - last->off;
        else r = push_piece(w, st, s, e - s);
        break;
    default:
        r = push_piece(w, st, s, e - s);
        break;
    }
    st->prev_match = is_match;
    return r;
}

static int split_subject(tok_work *w, const tok_pre_step *step, const char *base, int64_t off, int64_t len,
                         seg_state *st) {
    st->first = *st->dst_n;
    st->prev_match = 0;
    const PCRE2_SPTR subj = (PCRE2_SPTR)(base + off);
    PCRE2_SIZE pos = 0, last = 0, n = (PCRE2_SIZE)len;
    while (pos <= n) {
        int rc = pcre2_match(step->re, subj, n, pos, 0, w->md, w->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            w->err = nb_fail(w->ctx, NB_ERR_INTERNAL, "pre-tokenizer regex failed: %s", (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        if (me <= ms) {               /* empty match: no split here, move on one character */
            if (ms >= n) break;
            pos = ms + (PCRE2_SIZE)utf8_len(subj[ms]);
            continue;
        }
        if (ms > last && seg_emit(w, st, off + (int64_t)last, off + (int64_t)ms, 0)) return -1;
        if (seg_emit(w, st, off + (int64_t)ms, off + (int64_t)me, 1)) return -1;
        last = pos = me;
    }
    if (last < n && seg_emit(w, st, off + (int64_t)last, off + (int64_t)n, 0)) return -1;
    return 0;
}

/* Split [0, len) of base through every pre-tokenizer step; the pieces end up in w->pa. */
static int pretokenize(tok_work *w, const char *base, int64_t len, size_t *n_pieces) {
    const nb_tokenizer *t = w->t;
    size_t na = 0, nb = 0;
    if (sgrow((void **)&w->pa, &w->pa_cap, 1, sizeof(tok_piece))) return oom(w);
    w->pa[0].off = 0;
    w->pa[0].len = len;
    na = 1;
    for (int k = 0; k < t->n_pre; k++) {
        seg_state st = {&w->pb, &w->pb_cap, &nb, 0, 0, t->pre[k].behavior, t->pre[k].invert};
        nb = 0;
        for (size_t i = 0; i < na; i++)
            if (split_subject(w, &t->pre[k], base, w->pa[i].off, w->pa[i].len, &st)) return -1;
        tok_piece *tp = w->pa; w->pa = w->pb; w->pb = tp;
        size_t tc = w->pa_cap; w->pa_cap = w->pb_cap; w->pb_cap = tc;
        na = nb;
    }
    *n_pieces = na;
    return 0;
}

/* Leftmost-longest special/added token match at or after pos; returns its id or -1. In the raw
 * pass (normalized = 0) tokens that HF matches in normalized text are skipped, and only they are
 * looked for in the normalized pass. */
static int32_t find_special(const nb_tokenizer *t, const char *s, int64_t n, int64_t pos, int parse_special,
                            int normalized, int64_t *mstart) {
    if (t->n_spec == 0) return -1;
    for (int64_t i = pos; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t a = t->spec_start[c], b = t->spec_start[c + 1];
        for (int32_t k = a; k < b; k++) {
            int32_t id = t->spec_ids[k];
            const tok_entry *e = &t->ent[id];
            if (!parse_special && is_special_type(e->type)) continue;
            int is_norm = t->norm_is_normalizer && (t->tflags[id] & TOK_F_NORMALIZED);
            if (is_norm != normalized) continue;
            if ((int64_t)e->text_len <= n - i && memcmp(s + i, ent_text(t, id), e->text_len) == 0) {
                *mstart = i;
                return id;
            }
        }
    }
    return -1;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Pre-tokenize and BPE one normalized stretch of text. */
static int encode_normalized(tok_work *w, const char *base, int64_t blen) {
    const nb_tokenizer *t = w->t;
    size_t np = 1;
    if (t->n_pre > 0) {
        if (pretokenize(w, base, blen, &np)) return -1;
    } else {
        if (sgrow((void **)&w->pa, &w->pa_cap, 1, sizeof(tok_piece))) return oom(w);
        w->pa[0].off = 0;
        w->pa[0].len = blen;
    }
    for (size_t i = 0; i < np; i++) {
        const char *p = base + w->pa[i].off;
        int64_t pl = w->pa[i].len;
        int r;
        if (t->algo == TOK_ALGO_SCORES) r = encode_words(w, p, pl, encode_spm_scores);
        else if (t->byte_level) r = encode_cached(w, p, pl, encode_bpe_bytes);
        else r = encode_words(w, p, pl, encode_bpe_chars);
        if (r) return -1;
    }
    return 0;
}

/* One stretch of plain text between special tokens. */
static int encode_fragment(tok_work *w, const char *s, int64_t n, int at_start) {
    const nb_tokenizer *t = w->t;
    const char *base = s;
    int64_t blen = n;
    if (!t->byte_level && (t->norm_prefix || t->norm_escape || t->norm_remove_extra_ws)) {
        int64_t b = 0, e = n;
        if (t->norm_remove_extra_ws) {
            while (b < e && s[b] == ' ') b++;
            while (e > b && s[e - 1] == ' ') e--;
        }
        if (b >= e) return 0;
        if (sgrow((void **)&w->nbuf, &w->nbuf_cap, (size_t)(e - b) * 3 + 4, 1)) return oom(w);
        size_t m = 0;
        int prefix = t->norm_prefix == TOK_PREFIX_ALWAYS || (t->norm_prefix == TOK_PREFIX_FIRST && at_start);
        if (prefix && t->norm_prefix_if_absent) {
            int starts_meta = (t->norm_escape && s[b] == ' ') ||
                              (e - b >= 3 && memcmp(s + b, "\xe2\x96\x81", 3) == 0);
            if (starts_meta) prefix = 0;
        }
        if (prefix) {
            memcpy(w->nbuf, "\xe2\x96\x81", 3);
            m = 3;
        }
        for (int64_t i = b; i < e; i++) {
            if (s[i] == ' ' && t->norm_remove_extra_ws && i > b && s[i - 1] == ' ') continue;
            if (s[i] == ' ' && t->norm_escape) {
                memcpy(w->nbuf + m, "\xe2\x96\x81", 3);
                m += 3;
            } else {
                w->nbuf[m++] = s[i];
            }
        }
        base = w->nbuf;
        blen = (int64_t)m;
    } else if (t->byte_level && t->bl_add_prefix_space && s[0] != ' ') {
        if (sgrow((void **)&w->nbuf, &w->nbuf_cap, (size_t)n + 1, 1)) return oom(w);
        w->nbuf[0] = ' ';
        memcpy(w->nbuf + 1, s, (size_t)n);
        base = w->nbuf;
        blen = n + 1;
    }
    if (!(t->norm_is_normalizer && !t->byte_level)) return encode_normalized(w, base, blen);
    /* added tokens with normalized=true are found in the normalized text (HF's second pass) */
    int64_t pos = 0;
    while (pos < blen) {
        int64_t ms = blen;
        int32_t id = find_special(t, base, blen, pos, w->parse_special, 1, &ms);
        int64_t fe = id >= 0 ? ms : blen;
        if (id >= 0 && (t->tflags[id] & TOK_F_LSTRIP))
            while (fe > pos && is_ws(base[fe - 1])) fe--;
        if (fe > pos && encode_normalized(w, base + pos, fe - pos)) return -1;
        if (id < 0) break;
        if (emit(w, id)) return -1;
        pos = ms + t->ent[id].text_len;
        if (t->tflags[id] & TOK_F_RSTRIP)
            while (pos < blen && is_ws(base[pos])) pos++;
    }
    return 0;
}

nb_status nb_tokenizer_encode(nb_ctx *ctx, const nb_tokenizer *t, const char *text, int64_t len, uint32_t flags,
                              nb_tokens *out) {
    if (!t || !out || len < 0 || (!text && len > 0))
        return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_encode: bad arguments");
    /* symbol positions are int32: 2 GiB per call is far beyond any sane chunk of text */
    if (len > INT32_MAX / 4)
        return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_encode: %lld bytes in one call (at most %d)", (long long)len,
                       INT32_MAX / 4);
    tok_work w;
    memset(&w, 0, sizeof(w));
    w.ctx = ctx;
    w.t = t;
    w.out = out;
    if (t->n_pre > 0) {
        w.md = pcre2_match_data_create(1, NULL);
        w.mctx = pcre2_match_context_create(NULL);
        w.jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!w.md || !w.mctx || !w.jit) {
            work_free(&w);
            return nb_fail(ctx, NB_ERR_NOMEM, "out of memory for regex match data");
        }
        pcre2_jit_stack_assign(w.mctx, NULL, w.jit);
    }
    int64_t n0 = out->n;
    int r = 0;
    if ((flags & NB_TOK_ADD_SPECIAL) && t->add_bos && t->bos >= 0) r = emit(&w, t->bos);
    int parse_special = (flags & NB_TOK_PARSE_SPECIAL) != 0;
    w.parse_special = parse_special;
    int64_t pos = 0;
    while (!r && pos < len) {
        int64_t ms = len;
        int32_t id = find_special(t, text, len, pos, parse_special, 0, &ms);
        int64_t fe = id >= 0 ? ms : len;
        if (id >= 0 && (t->tflags[id] & TOK_F_LSTRIP))
            while (fe > pos && is_ws(text[fe - 1])) fe--;
        if (fe > pos) r = encode_fragment(&w, text + pos, fe - pos, pos == 0);
        if (r || id < 0) break;
        r = emit(&w, id);
        pos = ms + t->ent[id].text_len;
        if (t->tflags[id] & TOK_F_RSTRIP)
            while (pos < len && is_ws(text[pos])) pos++;
    }
    if (!r && (flags & NB_TOK_ADD_SPECIAL) && t->add_eos && t->eos >= 0) r = emit(&w, t->eos);
    nb_status st = w.err;
    work_free(&w);
    if (r) {
        out->n = n0;
        return st != NB_OK ? st : nb_fail(ctx, NB_ERR_INTERNAL, "tokenizer failed");
    }
    return NB_OK;
}

nb_status nb_tokenizer_encode_into(nb_ctx *ctx, const nb_tokenizer *t, const char *text, int64_t len, uint32_t flags,
                                   int32_t *out, int64_t cap, int64_t *n_out) {
    if (n_out) *n_out = 0;
    if (cap < 0 || (!out && cap > 0)) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_encode_into: bad buffer");
    nb_tokens tk = {0};
    nb_status s = nb_tokenizer_encode(ctx, t, text, len, flags, &tk);
    if (s != NB_OK) return s;
    if (n_out) *n_out = tk.n;
    int64_t k = tk.n < cap ? tk.n : cap;
    if (k > 0) memcpy(out, tk.ids, (size_t)k * sizeof(int32_t));
    int64_t need = tk.n;
    nb_tokens_free(&tk);
    if (need > cap)
        return nb_fail(ctx, NB_ERR_SHAPE, "the text needs %lld token ids but the buffer holds %lld", (long long)need,
                       (long long)cap);
    return NB_OK;
}

/* ---- decoding ------------------------------------------------------------------------------ */

nb_status nb_tokenizer_decode(nb_ctx *ctx, const nb_tokenizer *t, const int32_t *ids, int64_t n, uint32_t flags,
                              char *out, int64_t cap, int64_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || n < 0 || (!ids && n > 0) || cap < 0 || (!out && cap > 0))
        return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_decode: bad arguments");
    int64_t total = 0;
    int at_start = 1;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab)
            return nb_fail(ctx, NB_ERR_INVALID, "token id %d at position %lld is outside the vocabulary [0, %d)", id,
                           (long long)i, t->n_vocab);
        const tok_entry *e = &t->ent[id];
        if ((flags & NB_TOK_SKIP_SPECIAL) && is_special_type(e->type)) continue;
        const char *b = t->arena + e->bytes_off;
        int64_t bl = e->bytes_len;
        /* the decoder's Strip / Metaspace step: the space the normalizer put first goes away */
        if (at_start && bl > 0) {
            at_start = 0;
            if (t->decode_strip_space && b[0] == ' ') {
                b++;
                bl--;
            }
        }
        if (out && total < cap) {
            int64_t k = cap - total < bl ? cap - total : bl;
            memcpy(out + total, b, (size_t)k);
        }
        total += bl;
    }
    if (n_out) *n_out = total;
    if (out && total < cap) out[total] = 0;
    if (total > cap && (out || cap > 0))
        return nb_fail(ctx, NB_ERR_SHAPE, "the decoded text is %lld bytes but the buffer holds %lld", (long long)total,
                       (long long)cap);
    return NB_OK;
}

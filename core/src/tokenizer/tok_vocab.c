/* Building and owning a tokenizer: the vocabulary arena and spelling map, the BPE merge-pair map,
 * pre-tokenizer regex steps (and llama.cpp's table of named ones), the chat template, and tok_finish,
 * which derives the byte tables, decoded bytes and special-token index; then freeing, the read-only
 * accessors and nb_tokens. The loaders (tok_json.c, tok_gguf.c, tok_spm.c) fill it through tok_internal.h. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

const char *const tok_re_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- small helpers ------------------------------------------------------------------------- */

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
        const char *s = tok_ent_text(t, id);
        uint64_t h = tok_hash(s, e->text_len) & t->vmap.mask;
        for (;;) {
            int32_t o = t->vmap.slots[h];
            if (o < 0) {
                t->vmap.slots[h] = id;
                break;
            }
            /* a spelling seen twice maps to the later id, as llama.cpp's token_to_id does */
            if (t->ent[o].text_len == e->text_len && memcmp(tok_ent_text(t, o), s, e->text_len) == 0) {
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
        if (t->ent[o].text_len == len && memcmp(tok_ent_text(t, o), s, len) == 0) return o;
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
    uint64_t h = tok_pair_hash(key) & m->mask;
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
                char c = tok_ent_text(t, id)[i];
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
        const char *s = tok_ent_text(t, id);
        size_t n = e->text_len, m = 0;
        if (tok_sgrow((void **)&tmp, &tmp_cap, n + 4, 1)) {
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
                int l = tok_utf8_len((uint8_t)s[i]);
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

    /* can the text be cut before every "▁word"? (see encode_words in tok_encode.c) */
    t->meta_words = !t->byte_level && !t->ignore_merges;
    for (int32_t id = 0; id < t->n_vocab && t->meta_words; id++) {
        const char *s = tok_ent_text(t, id);
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
        if (t->ent[id].text_len > 0 && (tok_is_special_type(ty) || ty == NB_TOKEN_USER_DEFINED || (t->tflags[id] & TOK_F_ADDED)))
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
            if (t->ent[id].text_len > 0 && (tok_is_special_type(ty) || ty == NB_TOKEN_USER_DEFINED || (t->tflags[id] & TOK_F_ADDED))) {
                keys[k].first = (uint8_t)tok_ent_text(t, id)[0];
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
    for (int32_t k = 0; k < n_spec; k++) t->spec_start[(uint8_t)tok_ent_text(t, t->spec_ids[k])[0] + 1]++;
    for (int b = 0; b < 256; b++) t->spec_start[b + 1] += t->spec_start[b];

    for (int32_t id = 0; id < t->n_vocab; id++)
        if (id == t->eos || (t->ent[id].type == NB_TOKEN_CONTROL && eog_spelling(tok_ent_text(t, id), t->ent[id].text_len)))
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
const char *nb_tokenizer_chat_template(const nb_tokenizer *t, size_t *len) {
    if (len) *len = t && t->chat_template ? t->chat_template_len : 0;
    return t ? t->chat_template : NULL;
}

const char *nb_tokenizer_token_text(const nb_tokenizer *t, int32_t id, uint32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->ent[id].text_len;
    return tok_ent_text(t, id);
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

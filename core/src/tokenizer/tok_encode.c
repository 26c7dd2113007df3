/* Text to token ids: special-token splitting, SentencePiece-style normalization, regex pre-tokenization
 * (PCRE2), then BPE by merge ranks (HF tokenizers, llama.cpp `gpt2`) or by piece scores (SentencePiece,
 * llama.cpp `llama`), memoized per word. It only reads the tables tok_vocab.c builds. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

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
    if (tok_sgrow((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof(tok_bigram))) return oom(w);
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
        if (w->s_id[l] < 0 || w->s_id[r] < 0 || !tok_pairmap_get(&t->pmap, w->s_id[l], w->s_id[r], &rank, &merged)) return 0;
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
        int l = tok_utf8_len((uint8_t)s[i]);
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
        int l = tok_utf8_len((uint8_t)s[i]);
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
        if (tok_sgrow((void **)&w->tmp, &w->tmp_cap, (size_t)n * 2 + 1, 1)) return oom(w);
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
    if (tok_sgrow((void **)&w->cache_keys, &w->ck_cap, w->ck_len + (size_t)n, 1)) return oom(w);
    if (tok_sgrow((void **)&w->cache_ids, &w->ci_cap, w->ci_len + (size_t)cnt + 1, sizeof(int32_t))) return oom(w);
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
    if (tok_sgrow((void **)st->dst, st->dst_cap, *st->dst_n + 1, sizeof(tok_piece))) return oom(w);
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
            pos = ms + (PCRE2_SIZE)tok_utf8_len(subj[ms]);
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
    if (tok_sgrow((void **)&w->pa, &w->pa_cap, 1, sizeof(tok_piece))) return oom(w);
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
            if (!parse_special && tok_is_special_type(e->type)) continue;
            int is_norm = t->norm_is_normalizer && (t->tflags[id] & TOK_F_NORMALIZED);
            if (is_norm != normalized) continue;
            if ((int64_t)e->text_len <= n - i && memcmp(s + i, tok_ent_text(t, id), e->text_len) == 0) {
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
        if (tok_sgrow((void **)&w->pa, &w->pa_cap, 1, sizeof(tok_piece))) return oom(w);
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
        if (tok_sgrow((void **)&w->nbuf, &w->nbuf_cap, (size_t)(e - b) * 3 + 4, 1)) return oom(w);
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
        if (tok_sgrow((void **)&w->nbuf, &w->nbuf_cap, (size_t)n + 1, 1)) return oom(w);
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

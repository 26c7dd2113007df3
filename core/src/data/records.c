/* Reading documents into a dataset: plain-text splitting (blank lines, separator, lines, whole file),
 * JSONL / JSON-array records (text, prompt+completion, chat messages), chat rendering (ChatML or a
 * plain template), and tokenization with per-token loss masks. Records are gathered in chunks and each
 * chunk is tokenized on the context's threads, one record per task, then appended in file order, so
 * the stream never depends on the thread count. The rules are documented in nibble/data.h. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "data/data_internal.h"

enum { CHUNK_RECORDS = 8192, CHUNK_BYTES = 16 << 20, WHERE_LEN = 1280 };

/* A piece of a record: text with one mask value, or (special >= 0) one token inserted by id. */
typedef struct seg {
    const char *s;
    int64_t len;
    int32_t special;
    uint8_t mask;
} seg;

typedef struct rec {
    int64_t first, count;     /* its segments */
    int64_t line;             /* 1-based source line (JSONL, text) or record number (JSON array) */
    uint8_t bos_mask, eos_mask;
} rec;

typedef struct rec_out {
    int32_t *ids;
    uint8_t *mask;
    int64_t n, cap;
    nb_status st;
} rec_out;

/* How records become tokens: resolved once per call from the tokenizer and the options. */
typedef struct enc_env {
    const nb_tokenizer *tok;
    int32_t bos, eos;          /* ids to add, or -1 */
    uint32_t flags;            /* encode flags for text */
    int32_t im_start, im_end;  /* ChatML control tokens, or -1 for the plain template */
    const char *text_field;
} enc_env;

/* One chunk of records waiting to be tokenized. Segments point into the mapped file or into parsed
 * JSON kept alive in roots until the chunk is done. */
typedef struct recset {
    seg *segs;
    int64_t n_segs, seg_cap;
    rec *recs;
    int64_t n_recs, rec_cap;
    cJSON **roots;
    int64_t n_roots, root_cap;
    int64_t bytes;
} recset;

static nb_status grow_tmp(nb_ctx *ctx, void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return NB_OK;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory reading data (%lld items)", (long long)c);
    *p = q;
    *cap = c;
    return NB_OK;
}

static void recset_clear(recset *rs) {
    for (int64_t i = 0; i < rs->n_roots; i++) cJSON_Delete(rs->roots[i]);
    rs->n_roots = rs->n_segs = rs->n_recs = rs->bytes = 0;
}

static void recset_free(recset *rs) {
    recset_clear(rs);
    free(rs->segs);
    free(rs->recs);
    free(rs->roots);
    memset(rs, 0, sizeof(*rs));
}

static nb_status add_seg(nb_ctx *ctx, recset *rs, const char *s, int64_t len, int32_t special, uint8_t mask) {
    nb_status st = grow_tmp(ctx, (void **)&rs->segs, &rs->seg_cap, rs->n_segs + 1, sizeof(seg));
    if (st) return st;
    rs->segs[rs->n_segs++] = (seg){ s, len, special, mask };
    rs->bytes += len;
    return NB_OK;
}

static nb_status begin_rec(nb_ctx *ctx, recset *rs, int64_t line, uint8_t bos_mask) {
    nb_status st = grow_tmp(ctx, (void **)&rs->recs, &rs->rec_cap, rs->n_recs + 1, sizeof(rec));
    if (st) return st;
    rs->recs[rs->n_recs++] = (rec){ rs->n_segs, 0, line, bos_mask, 1 };
    return NB_OK;
}

static void end_rec(recset *rs, uint8_t eos_mask) {
    rec *r = &rs->recs[rs->n_recs - 1];
    r->count = rs->n_segs - r->first;
    r->eos_mask = eos_mask;
}

static nb_status keep_root(nb_ctx *ctx, recset *rs, cJSON *root) {
    nb_status st = grow_tmp(ctx, (void **)&rs->roots, &rs->root_cap, rs->n_roots + 1, sizeof(cJSON *));
    if (st) { cJSON_Delete(root); return st; }
    rs->roots[rs->n_roots++] = root;
    return NB_OK;
}

/* ---- tokenization of one record --------------------------------------------------------------- */

static int out_push(rec_out *o, const int32_t *ids, int64_t n, uint8_t m) {
    if (n <= 0) return 1;   /* an empty segment first: o->ids may still be NULL, and NULL + 0 is undefined */
    if (o->n + n > o->cap) {
        int64_t c = o->cap ? o->cap : 256;
        while (c < o->n + n) c *= 2;
        int32_t *a = realloc(o->ids, (size_t)c * sizeof(int32_t));
        if (!a) return 0;
        o->ids = a;
        uint8_t *b = realloc(o->mask, (size_t)c);
        if (!b) return 0;
        o->mask = b;
        o->cap = c;
    }
    memcpy(o->ids + o->n, ids, (size_t)n * sizeof(int32_t));
    memset(o->mask + o->n, m, (size_t)n);
    o->n += n;
    return 1;
}

static int64_t common_prefix(const nb_tokens *a, const nb_tokens *b) {
    int64_t n = a->n < b->n ? a->n : b->n, i = 0;
    while (i < n && a->ids[i] == b->ids[i]) i++;
    return i;
}

/* [BOS] runs-of-text-and-specials [EOS]. A run of adjacent text segments is encoded as one string;
 * where its mask changes, the boundary is the common prefix of the text before it (see data.h). */
static nb_status encode_record(nb_ctx *ctx, const enc_env *env, const seg *segs, const rec *r, rec_out *o) {
    nb_status st = NB_OK;
    nb_tokens full = { 0 }, pre = { 0 };
    char *buf = NULL;
    int64_t bufcap = 0;
    o->n = 0;
    if (env->bos >= 0 && !out_push(o, &env->bos, 1, r->bos_mask)) goto nomem;
    int64_t i = r->first, end = r->first + r->count;
    while (i < end) {
        if (segs[i].special >= 0) {
            if (!out_push(o, &segs[i].special, 1, segs[i].mask)) goto nomem;
            i++;
            continue;
        }
        int64_t j = i, total = 0;
        int same = 1;
        while (j < end && segs[j].special < 0) {
            if (segs[j].mask != segs[i].mask) same = 0;
            total += segs[j].len;
            j++;
        }
        const char *text = segs[i].s;
        if (j - i > 1) {
            if (total + 1 > bufcap) {
                char *nb = realloc(buf, (size_t)total + 1);
                if (!nb) goto nomem;
                buf = nb;
                bufcap = total + 1;
            }
            int64_t at = 0;
            for (int64_t k = i; k < j; k++) {
                if (segs[k].len) memcpy(buf + at, segs[k].s, (size_t)segs[k].len);
                at += segs[k].len;
            }
            text = buf;
        }
        if (total > 0) {
            full.n = 0;
            st = nb_tokenizer_encode(ctx, env->tok, text, total, env->flags, &full);
            if (st) goto done;
        } else {
            full.n = 0;
        }
        if (same) {
            if (!out_push(o, full.ids, full.n, segs[i].mask)) goto nomem;
        } else {
            int64_t prev = 0, plen = 0;
            for (int64_t k = i; k < j; k++) {
                plen += segs[k].len;
                if (k + 1 < j && segs[k + 1].mask != segs[k].mask) {
                    int64_t b = 0;
                    if (plen > 0) {
                        pre.n = 0;
                        st = nb_tokenizer_encode(ctx, env->tok, text, plen, env->flags, &pre);
                        if (st) goto done;
                        b = common_prefix(&pre, &full);
                    }
                    if (b < prev) b = prev;
                    if (!out_push(o, full.ids + prev, b - prev, segs[k].mask)) goto nomem;
                    prev = b;
                }
            }
            if (!out_push(o, full.ids + prev, full.n - prev, segs[j - 1].mask)) goto nomem;
        }
        i = j;
    }
    if (env->eos >= 0 && !out_push(o, &env->eos, 1, r->eos_mask)) goto nomem;
    goto done;
nomem:
    st = nb_fail(ctx, NB_ERR_NOMEM, "out of memory tokenizing a record");
done:
    nb_tokens_free(&full);
    nb_tokens_free(&pre);
    free(buf);
    return st;
}

typedef struct tok_job {
    nb_ctx *ctx;
    const enc_env *env;
    const recset *rs;
    rec_out *outs;
} tok_job;

static void tok_range(void *arg, int64_t b, int64_t e) {
    tok_job *j = arg;
    for (int64_t r = b; r < e; r++) {
        j->outs[r].st = nb_ctx_interrupted(j->ctx) ? NB_ERR_INTERRUPTED
                                                   : encode_record(j->ctx, j->env, j->rs->segs, &j->rs->recs[r], &j->outs[r]);
    }
}

/* Tokenize a chunk and append its records in order. *stop is set when max_tokens is reached. */
static nb_status flush(nb_ctx *ctx, nb_dataset *ds, const enc_env *env, recset *rs, const char *path,
                       int numbered, int64_t n0, int64_t max_tokens, int *stop) {
    if (rs->n_recs == 0) return NB_OK;
    if (nb_ctx_interrupted(ctx)) return nb_fail(ctx, NB_ERR_INTERRUPTED, "interrupted while reading %s", path);
    rec_out *outs = calloc((size_t)rs->n_recs, sizeof(rec_out));
    if (!outs) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory tokenizing %s", path);
    tok_job job = { ctx, env, rs, outs };
    nb_parallel_for(ctx, rs->n_recs, 1, tok_range, &job);
    nb_status st = NB_OK;
    for (int64_t r = 0; r < rs->n_recs && !st; r++) {
        if (outs[r].st) {
            if (outs[r].st == NB_ERR_INTERRUPTED) {
                st = nb_fail(ctx, NB_ERR_INTERRUPTED, "interrupted while reading %s", path);
                break;
            }
            /* Workers may have raced on the context's message: redo this record alone for a clean one. */
            st = encode_record(ctx, env, rs->segs, &rs->recs[r], &outs[r]);
            if (!st) st = outs[r].st;
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", nb_ctx_last_error(ctx));
            st = nb_fail(ctx, st, numbered ? "%s: record %lld: %s" : "%s:%lld: %s", path,
                         (long long)rs->recs[r].line, msg);
            break;
        }
        st = nb_data_append_doc(ctx, ds, outs[r].ids, outs[r].mask, outs[r].n);
        if (!st && max_tokens > 0 && ds->n - n0 >= max_tokens) {
            *stop = 1;
            break;
        }
    }
    for (int64_t r = 0; r < rs->n_recs; r++) {
        free(outs[r].ids);
        free(outs[r].mask);
    }
    free(outs);
    recset_clear(rs);
    return st;
}

/* ---- JSON records ------------------------------------------------------------------------------ */

static nb_status content_segs(nb_ctx *ctx, recset *rs, const cJSON *content, uint8_t mask, const char *where,
                              int idx) {
    if (cJSON_IsString(content)) return add_seg(ctx, rs, content->valuestring, (int64_t)strlen(content->valuestring), -1, mask);
    if (cJSON_IsNull(content)) return NB_OK;
    if (cJSON_IsArray(content)) {
        int k = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsObject(part) || !cJSON_IsString(text) ||
                (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "text") == 0))) {
                return nb_fail(ctx, NB_ERR_FORMAT, "%s: messages[%d].content[%d] is not a text part "
                               "({\"type\": \"text\", \"text\": ...})", where, idx, k);
            }
            nb_status st = add_seg(ctx, rs, text->valuestring, (int64_t)strlen(text->valuestring), -1, mask);
            if (st) return st;
            k++;
        }
        return NB_OK;
    }
    return nb_fail(ctx, NB_ERR_FORMAT, "%s: messages[%d].content must be a string or a list of text parts", where, idx);
}

static void list_keys(const cJSON *obj, char *out, size_t cap) {
    size_t at = 0;
    int n = 0;
    out[0] = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        if (n == 8) { snprintf(out + at, cap - at, ", ..."); return; }
        int w = snprintf(out + at, cap - at, "%s\"%.40s\"", n ? ", " : "", it->string ? it->string : "");
        if (w < 0 || (size_t)w >= cap - at) return;
        at += (size_t)w;
        n++;
    }
    if (n == 0) snprintf(out, cap, "none");
}

/* Turn one parsed JSON object into a record of segments. Strings stay owned by the JSON tree. */
static nb_status record_from_json(nb_ctx *ctx, recset *rs, const enc_env *env, const cJSON *obj, int64_t line,
                                  const char *where) {
    if (!cJSON_IsObject(obj)) {
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: expected a JSON object (a record), got %s", where,
                       cJSON_IsArray(obj) ? "an array" : cJSON_IsString(obj) ? "a string" : "a scalar");
    }
    const int64_t seg0 = rs->n_segs, rec0 = rs->n_recs, bytes0 = rs->bytes;
    nb_status st = NB_OK;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(obj, "prompt");
    const cJSON *completion = cJSON_GetObjectItemCaseSensitive(obj, "completion");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, env->text_field);
    if (msgs) {
        if (!cJSON_IsArray(msgs)) {
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: \"messages\" must be a list of {\"role\", \"content\"} objects", where);
        }
        if (cJSON_GetArraySize(msgs) == 0) return nb_fail(ctx, NB_ERR_FORMAT, "%s: \"messages\" is empty", where);
        if ((st = begin_rec(ctx, rs, line, 0))) return st;
        uint8_t last = 0;
        int idx = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, msgs) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!cJSON_IsObject(m)) { st = nb_fail(ctx, NB_ERR_FORMAT, "%s: messages[%d] is not an object", where, idx); break; }
            if (!cJSON_IsString(role)) {
                st = nb_fail(ctx, NB_ERR_FORMAT, "%s: messages[%d] has no string \"role\"", where, idx);
                break;
            }
            if (!content) {
                st = nb_fail(ctx, NB_ERR_FORMAT, "%s: messages[%d] has no \"content\"", where, idx);
                break;
            }
            uint8_t mask = strcmp(role->valuestring, "assistant") == 0;
            const char *r = role->valuestring;
            int64_t rl = (int64_t)strlen(r);
            if (env->im_start >= 0) {
                /* <|im_start|>role\ncontent<|im_end|>\n : the turn's end token is trained, the "\n" after it is not */
                if ((st = add_seg(ctx, rs, NULL, 0, env->im_start, 0))) break;
                if ((st = add_seg(ctx, rs, r, rl, -1, 0))) break;
                if ((st = add_seg(ctx, rs, "\n", 1, -1, 0))) break;
                if ((st = content_segs(ctx, rs, content, mask, where, idx))) break;
                if ((st = add_seg(ctx, rs, NULL, 0, env->im_end, mask))) break;
                if ((st = add_seg(ctx, rs, "\n", 1, -1, 0))) break;
            } else {
                /* role: content\n : the "\n" ends the turn and is trained with it */
                if ((st = add_seg(ctx, rs, r, rl, -1, 0))) break;
                if ((st = add_seg(ctx, rs, ": ", 2, -1, 0))) break;
                if ((st = content_segs(ctx, rs, content, mask, where, idx))) break;
                if ((st = add_seg(ctx, rs, "\n", 1, -1, mask))) break;
            }
            last = mask;
            idx++;
        }
        if (!st) end_rec(rs, last);
    } else if (prompt || completion) {
        if (!cJSON_IsString(prompt) || !cJSON_IsString(completion)) {
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: a prompt/completion record needs both \"prompt\" and "
                           "\"completion\" as strings", where);
        }
        if ((st = begin_rec(ctx, rs, line, 0))) return st;
        if (!st) st = add_seg(ctx, rs, prompt->valuestring, (int64_t)strlen(prompt->valuestring), -1, 0);
        if (!st) st = add_seg(ctx, rs, completion->valuestring, (int64_t)strlen(completion->valuestring), -1, 1);
        if (!st) end_rec(rs, 1);
    } else if (text) {
        if (!cJSON_IsString(text)) return nb_fail(ctx, NB_ERR_FORMAT, "%s: \"%s\" is not a string", where, env->text_field);
        if ((st = begin_rec(ctx, rs, line, 1))) return st;
        st = add_seg(ctx, rs, text->valuestring, (int64_t)strlen(text->valuestring), -1, 1);
        if (!st) end_rec(rs, 1);
    } else {
        char keys[512];
        list_keys(obj, keys, sizeof keys);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: no usable field: expected \"%s\", \"messages\", or \"prompt\" and "
                       "\"completion\" (keys: %s)", where, env->text_field, keys);
    }
    if (st) {   /* drop the half-built record */
        rs->n_segs = seg0;
        rs->n_recs = rec0;
        rs->bytes = bytes0;
    }
    return st;
}

/* ---- plain text splitting ---------------------------------------------------------------------- */

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

static void trim(const char **p, int64_t *n) {
    const char *s = *p;
    int64_t len = *n;
    while (len > 0 && is_space((unsigned char)s[0])) { s++; len--; }
    while (len > 0 && is_space((unsigned char)s[len - 1])) len--;
    *p = s;
    *n = len;
}

static int64_t line_end(const char *p, int64_t n, int64_t pos) {
    const char *nl = memchr(p + pos, '\n', (size_t)(n - pos));
    return nl ? (int64_t)(nl - p) : n;
}

static int is_blank(const char *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) if (!is_space((unsigned char)s[i])) return 0;
    return 1;
}

static int64_t find_sep(const char *p, int64_t n, int64_t pos, const char *sep, int64_t sl) {
    while (pos + sl <= n) {
        const char *c = memchr(p + pos, sep[0], (size_t)(n - sl + 1 - pos));
        if (!c) return -1;
        int64_t at = (int64_t)(c - p);
        if (memcmp(c, sep, (size_t)sl) == 0) return at;
        pos = at + 1;
    }
    return -1;
}

typedef struct text_iter {
    const char *p;
    int64_t n, pos;
    int64_t line, line_at;  /* line: the 1-based line number of byte line_at (counted incrementally) */
    nb_text_split mode;
    const char *sep;
    int64_t sep_len;
} text_iter;

static int64_t count_lines(const char *p, int64_t a, int64_t b) {
    int64_t k = 0;
    for (int64_t i = a; i < b; i++) k += p[i] == '\n';
    return k;
}

/* The next non-empty document (trimmed) and the line it starts on; 0 at the end. */
static int text_next(text_iter *it, const char **doc, int64_t *len, int64_t *line) {
    const char *p = it->p;
    while (it->pos < it->n) {
        int64_t start = it->pos, stop;
        switch (it->mode) {
        case NB_SPLIT_WHOLE:
            stop = it->n;
            it->pos = it->n;
            break;
        case NB_SPLIT_LINE:
            stop = line_end(p, it->n, start);
            it->pos = stop < it->n ? stop + 1 : it->n;
            break;
        case NB_SPLIT_SEPARATOR: {
            int64_t at = find_sep(p, it->n, start, it->sep, it->sep_len);
            stop = at < 0 ? it->n : at;
            it->pos = at < 0 ? it->n : at + it->sep_len;
            break;
        }
        default: {   /* blank lines: the document runs until a blank line or the end */
            int64_t e = start;
            stop = start;
            while (e < it->n) {
                int64_t le = line_end(p, it->n, e);
                if (is_blank(p + e, le - e)) {
                    if (stop > start) { e = le < it->n ? le + 1 : it->n; break; }
                    start = le < it->n ? le + 1 : it->n;   /* leading blank lines */
                } else {
                    stop = le;
                }
                e = le < it->n ? le + 1 : it->n;
            }
            it->pos = e;
            if (stop < start) stop = start;
            break;
        }
        }
        const char *d = p + start;
        int64_t dl = stop - start;
        trim(&d, &dl);
        if (dl > 0) {
            int64_t at = (int64_t)(d - p);
            it->line += count_lines(p, it->line_at, at);
            it->line_at = at;
            *doc = d;
            *len = dl;
            *line = it->line;
            return 1;
        }
    }
    return 0;
}

/* ---- entry points ------------------------------------------------------------------------------ */

static nb_status make_env(nb_ctx *ctx, const nb_tokenizer *tok, const nb_data_opts *o, enc_env *env) {
    memset(env, 0, sizeof(*env));
    if (!tok) return nb_fail(ctx, NB_ERR_INVALID, "reading text data needs a tokenizer (got NULL)");
    if ((unsigned)o->format > NB_DATA_JSON) return nb_fail(ctx, NB_ERR_INVALID, "unknown data format %d", (int)o->format);
    if ((unsigned)o->split > NB_SPLIT_SEPARATOR) return nb_fail(ctx, NB_ERR_INVALID, "unknown text split %d", (int)o->split);
    if ((unsigned)o->chat_template > NB_CHAT_PLAIN)
        return nb_fail(ctx, NB_ERR_INVALID, "unknown chat template %d", (int)o->chat_template);
    if (o->split == NB_SPLIT_SEPARATOR && (!o->separator || !o->separator[0]))
        return nb_fail(ctx, NB_ERR_INVALID, "split by separator needs a non-empty separator string");
    if (o->max_tokens < 0) return nb_fail(ctx, NB_ERR_INVALID, "max_tokens must be >= 0, got %lld", (long long)o->max_tokens);
    env->tok = tok;
    int32_t bos = nb_tokenizer_bos(tok), eos = nb_tokenizer_eos(tok);
    int add_bos = o->add_bos < 0 ? nb_tokenizer_add_bos(tok) : o->add_bos;
    env->bos = add_bos && bos >= 0 ? bos : -1;
    env->eos = o->add_eos != 0 && eos >= 0 ? eos : -1;
    env->flags = o->parse_special ? NB_TOK_PARSE_SPECIAL : 0;
    env->text_field = o->text_field && o->text_field[0] ? o->text_field : "text";
    int32_t s = nb_tokenizer_find(tok, "<|im_start|>", 12), e = nb_tokenizer_find(tok, "<|im_end|>", 10);
    env->im_start = env->im_end = -1;
    if (o->chat_template == NB_CHAT_CHATML && (s < 0 || e < 0))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "chat template chatml: the tokenizer has no <|im_start|> / <|im_end|> tokens");
    if (o->chat_template != NB_CHAT_PLAIN && s >= 0 && e >= 0) {
        env->im_start = s;
        env->im_end = e;
    }
    return NB_OK;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    if (a < b) return 0;
    for (size_t i = 0; i < b; i++)
        if (tolower((unsigned char)s[a - b + i]) != suffix[i]) return 0;
    return 1;
}

typedef struct ds_mark { int64_t n, n_docs, n_masked; uint64_t hash; } ds_mark;

static ds_mark mark(const nb_dataset *ds) { return (ds_mark){ ds->n, ds->n_docs, ds->n_masked, ds->hash }; }
static void rollback(nb_dataset *ds, ds_mark m) {
    ds->n = m.n;
    ds->n_docs = m.n_docs;
    ds->n_masked = m.n_masked;
    ds->hash = m.hash;
}

static int64_t col_of(const char *line, const char *at) { return (int64_t)(at - line) + 1; }

static nb_status read_jsonl(nb_ctx *ctx, nb_dataset *ds, const enc_env *env, recset *rs, const char *path,
                            const char *p, int64_t n, int64_t max_tokens) {
    nb_status st = NB_OK;
    int64_t n0 = ds->n, pos = 0, line = 0;
    int stop = 0;
    char where[WHERE_LEN];
    while (pos < n && !st && !stop) {
        int64_t le = line_end(p, n, pos);
        const char *s = p + pos;
        int64_t len = le - pos;
        line++;
        pos = le < n ? le + 1 : n;
        if (is_blank(s, len)) continue;
        snprintf(where, sizeof where, "%s:%lld", path, (long long)line);
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithLengthOpts(s, (size_t)len, &end, 0);
        if (!root) {
            st = nb_fail(ctx, NB_ERR_FORMAT, "%s: invalid JSON (column %lld)", where,
                         (long long)(end ? col_of(s, end) : 1));
            break;
        }
        if (end && !is_blank(end, len - (int64_t)(end - s))) {
            while (is_space((unsigned char)*end)) end++;
            cJSON_Delete(root);
            st = nb_fail(ctx, NB_ERR_FORMAT, "%s: unexpected text after the JSON value (column %lld); JSONL "
                         "holds one record per line", where, (long long)col_of(s, end));
            break;
        }
        if ((st = keep_root(ctx, rs, root))) break;
        if ((st = record_from_json(ctx, rs, env, root, line, where))) break;
        if (rs->n_recs >= CHUNK_RECORDS || rs->bytes >= CHUNK_BYTES)
            st = flush(ctx, ds, env, rs, path, 0, n0, max_tokens, &stop);
    }
    if (!st && !stop) st = flush(ctx, ds, env, rs, path, 0, n0, max_tokens, &stop);
    return st;
}

static nb_status read_json_array(nb_ctx *ctx, nb_dataset *ds, const enc_env *env, recset *rs, const char *path,
                                 const char *p, int64_t n, int64_t max_tokens) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(p, (size_t)n, &end, 0);
    if (!root || (end && !is_blank(end, n - (int64_t)(end - p)))) {
        const char *at = end ? end : p;
        if (root) while (is_space((unsigned char)*at)) at++;
        int64_t line = 1 + count_lines(p, 0, (int64_t)(at - p));
        const char *ls = at;
        while (ls > p && ls[-1] != '\n') ls--;
        cJSON_Delete(root);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s:%lld: %s (column %lld)", path, (long long)line,
                       root ? "unexpected text after the JSON array" : "invalid JSON", (long long)col_of(ls, at));
    }
    nb_status st = NB_OK;
    int64_t n0 = ds->n, k = 0;
    int stop = 0;
    char where[WHERE_LEN];
    const cJSON *el;
    cJSON_ArrayForEach(el, root) {
        k++;
        snprintf(where, sizeof where, "%s: record %lld", path, (long long)k);
        if ((st = record_from_json(ctx, rs, env, el, k, where))) break;
        if (rs->n_recs >= CHUNK_RECORDS || rs->bytes >= CHUNK_BYTES) {
            st = flush(ctx, ds, env, rs, path, 1, n0, max_tokens, &stop);
            if (st || stop) break;
        }
    }
    if (!st && !stop) st = flush(ctx, ds, env, rs, path, 1, n0, max_tokens, &stop);
    recset_clear(rs);   /* the segments point into root */
    cJSON_Delete(root);
    return st;
}

static nb_status read_text(nb_ctx *ctx, nb_dataset *ds, const enc_env *env, recset *rs, const char *path,
                           const char *p, int64_t n, const nb_data_opts *o) {
    text_iter it = { p, n, 0, 1, 0, o->split, NULL, 0 };
    if (o->separator && o->separator[0]) {
        it.mode = NB_SPLIT_SEPARATOR;
        it.sep = o->separator;
        it.sep_len = (int64_t)strlen(o->separator);
    }
    nb_status st = NB_OK;
    int64_t n0 = ds->n;
    int stop = 0;
    const char *d;
    int64_t len, line;
    while (!st && !stop && text_next(&it, &d, &len, &line)) {
        if ((st = begin_rec(ctx, rs, line, 1))) break;
        if ((st = add_seg(ctx, rs, d, len, -1, 1))) break;
        end_rec(rs, 1);
        if (rs->n_recs >= CHUNK_RECORDS || rs->bytes >= CHUNK_BYTES)
            st = flush(ctx, ds, env, rs, path, 0, n0, o->max_tokens, &stop);
    }
    if (!st && !stop) st = flush(ctx, ds, env, rs, path, 0, n0, o->max_tokens, &stop);
    return st;
}

/* A binary file (a GGUF, a safetensors, a zip) read as text tokenizes without complaint into a stream of
 * byte tokens, and calibration or perplexity then runs on noise with exit 0. Text never holds a NUL byte
 * while every such format has them within its first bytes (little-endian lengths and versions), so one
 * NUL is the sign. Invalid UTF-8 is let through: the tokenizers take arbitrary bytes (byte fallback,
 * byte-level BPE), Latin-1 corpora are text, and sampled answers may end inside a UTF-8 sequence. */
nb_status nb_data_check_text(nb_ctx *ctx, const char *name, const char *data, int64_t len) {
    if (len < 0 || (!data && len > 0)) return nb_fail(ctx, NB_ERR_INVALID, "nb_data_check_text: bad arguments");
    const char *z = len > 0 ? memchr(data, 0, (size_t)len) : NULL;
    if (z) {
        return nb_fail(ctx, NB_ERR_FORMAT, "%s is not a text file (a NUL byte at offset %lld): give a text or JSONL file",
                       name ? name : "data", (long long)(z - data));
    }
    return NB_OK;
}

nb_status nb_dataset_add_file(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *path,
                              const nb_data_opts *opts) {
    if (!ds || !path) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_add_file: NULL dataset or path");
    if (ds->frozen) return nb_fail(ctx, NB_ERR_INVALID, "dataset is in use by a dataloader: it can take no more documents");
    nb_data_opts o;
    if (opts) o = *opts; else nb_data_opts_init(&o);
    enc_env env;
    nb_status st = make_env(ctx, tok, &o, &env);
    if (st) return st;
    nb_buffer *buf = NULL;
    if ((st = nb_buffer_mmap(ctx, path, &buf))) return st;
    const char *p = nb_buffer_data(buf);
    int64_t n = (int64_t)nb_buffer_size(buf);
    if ((st = nb_data_check_text(ctx, path, p, n))) {
        nb_buffer_release(buf);
        return st;
    }
    if (n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) { p += 3; n -= 3; }   /* UTF-8 byte order mark */
    nb_data_format fmt = o.format;
    if (fmt == NB_DATA_FORMAT_AUTO) {
        fmt = ends_with(path, ".jsonl") || ends_with(path, ".ndjson") ? NB_DATA_JSONL
            : ends_with(path, ".json") ? NB_DATA_JSON : NB_DATA_TEXT;
    }
    if (fmt == NB_DATA_JSON) {   /* an array, or else one record per line */
        int64_t i = 0;
        while (i < n && is_space((unsigned char)p[i])) i++;
        if (i == n || p[i] != '[') fmt = NB_DATA_JSONL;
    }
    ds_mark m0 = mark(ds);
    recset rs = { 0 };
    if (fmt == NB_DATA_TEXT) st = read_text(ctx, ds, &env, &rs, path, p, n, &o);
    else if (fmt == NB_DATA_JSONL) st = read_jsonl(ctx, ds, &env, &rs, path, p, n, o.max_tokens);
    else st = read_json_array(ctx, ds, &env, &rs, path, p, n, o.max_tokens);
    if (!st && ds->n_docs == m0.n_docs) {
        st = nb_fail(ctx, NB_ERR_FORMAT, "%s: no documents (the file is empty or holds only blank lines%s)", path,
                     fmt == NB_DATA_JSON ? " or an empty array" : "");
    }
    if (st) rollback(ds, m0);
    else ds->eos = nb_tokenizer_eos(tok);
    recset_free(&rs);
    nb_buffer_release(buf);
    return st;
}

nb_status nb_dataset_load(nb_ctx *ctx, const nb_tokenizer *tok, const char *path, const nb_data_opts *opts,
                          nb_dataset **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_load: out is NULL");
    *out = NULL;
    nb_dataset *ds = NULL;
    nb_status st = nb_dataset_new(ctx, &ds);
    if (st) return st;
    if ((st = nb_dataset_add_file(ctx, ds, tok, path, opts))) {
        nb_dataset_release(ds);
        return st;
    }
    *out = ds;
    return NB_OK;
}

nb_status nb_dataset_add_text(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *text, int64_t len,
                              const nb_data_opts *opts) {
    if (!ds || (!text && len > 0) || len < 0) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_add_text: bad arguments");
    if (ds->frozen) return nb_fail(ctx, NB_ERR_INVALID, "dataset is in use by a dataloader: it can take no more documents");
    nb_data_opts o;
    if (opts) o = *opts; else nb_data_opts_init(&o);
    enc_env env;
    nb_status st = make_env(ctx, tok, &o, &env);
    if (st) return st;
    recset rs = { 0 };
    ds_mark m0 = mark(ds);
    int stop = 0;
    st = begin_rec(ctx, &rs, 1, 1);
    if (!st) st = add_seg(ctx, &rs, text ? text : "", len, -1, 1);
    if (!st) {
        end_rec(&rs, 1);
        st = flush(ctx, ds, &env, &rs, "text", 0, ds->n, 0, &stop);
    }
    if (st) rollback(ds, m0);
    else ds->eos = nb_tokenizer_eos(tok);
    recset_free(&rs);
    return st;
}

nb_status nb_dataset_add_json(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *json, int64_t len,
                              const nb_data_opts *opts) {
    if (!ds || !json || len < 0) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_add_json: bad arguments");
    if (ds->frozen) return nb_fail(ctx, NB_ERR_INVALID, "dataset is in use by a dataloader: it can take no more documents");
    nb_data_opts o;
    if (opts) o = *opts; else nb_data_opts_init(&o);
    enc_env env;
    nb_status st = make_env(ctx, tok, &o, &env);
    if (st) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)len, &end, 0);
    if (!root) return nb_fail(ctx, NB_ERR_FORMAT, "record: invalid JSON (column %lld)", (long long)(end ? col_of(json, end) : 1));
    if (end && !is_blank(end, len - (int64_t)(end - json))) {
        while (is_space((unsigned char)*end)) end++;
        cJSON_Delete(root);
        return nb_fail(ctx, NB_ERR_FORMAT, "record: unexpected text after the JSON value (column %lld)",
                       (long long)col_of(json, end));
    }
    recset rs = { 0 };
    ds_mark m0 = mark(ds);
    int stop = 0;
    st = keep_root(ctx, &rs, root);
    if (!st) st = record_from_json(ctx, &rs, &env, root, 1, "record");
    if (!st) st = flush(ctx, ds, &env, &rs, "record", 0, ds->n, 0, &stop);
    if (st) rollback(ds, m0);
    else ds->eos = nb_tokenizer_eos(tok);
    recset_free(&rs);
    return st;
}

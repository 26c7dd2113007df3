/* Writes a loaded tokenizer back as a Hugging Face tokenizer.json (+ tokenizer_config.json and
 * special_tokens_map.json), so that a checkpoint exported from a GGUF carries a tokenizer that
 * transformers, vLLM and nibble itself can load. Byte-level BPE (GGUF `gpt2`) keeps its merges and
 * its pre-tokenizer regexes; SentencePiece by scores (GGUF `llama`, tokenizer.model) becomes BPE
 * with merges made from the scores the way transformers converts SentencePiece models. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tok_internal.h"

/* ---- a tiny JSON writer over a FILE ---------------------------------------------------------- */

/* A JSON string as serde_json writes it: UTF-8 kept as is, quotes, backslashes and control
 * characters escaped. */
static void put_body(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
}

static void put_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    put_body(f, s, n);
    fputc('"', f);
}

static int utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t l;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { l = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { l = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { l = 4; cp = c & 0x07; }
        else return 0;
        if (i + l > n) return 0;
        for (size_t k = 1; k < l; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((l == 2 && cp < 0x80) || (l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += l;
    }
    return 1;
}

static inline const char *txt(const nb_tokenizer *t, int32_t id) { return t->arena + t->ent[id].text_off; }

/* A token HF lists in added_tokens: control and unknown tokens (special) and user-defined ones. */
static int is_added(const nb_tokenizer *t, int32_t id) {
    int32_t ty = t->ent[id].type;
    return t->ent[id].text_len > 0 &&
           (ty == NB_TOKEN_CONTROL || ty == NB_TOKEN_UNKNOWN || ty == NB_TOKEN_USER_DEFINED);
}

/* Tokens that SentencePiece may build by merging (as try_pair in tok_encode.c allows). */
static int mergeable(int32_t ty) {
    return ty == NB_TOKEN_NORMAL || ty == NB_TOKEN_USER_DEFINED || ty == NB_TOKEN_UNUSED || ty == NB_TOKEN_UNDEFINED;
}

/* ---- merges ---------------------------------------------------------------------------------- */

typedef struct save_merge {
    float score;
    int32_t rank, merged, l, r;
    int32_t llen, rlen;              /* code points, for the SentencePiece order */
} save_merge;

static int32_t n_chars(const char *s, size_t n) {
    int32_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* transformers' generate_merges (used for SentencePiece models and GGUF `llama` vocabularies):
 * every piece's splits in (left id, right id) order, pieces in id order, then a stable sort by
 * (score, left length, right length), all descending, lengths in code points. */
static int cmp_spm(const void *pa, const void *pb) {
    const save_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->llen != b->llen) return a->llen > b->llen ? -1 : 1;
    if (a->rlen != b->rlen) return a->rlen > b->rlen ? -1 : 1;
    if (a->merged != b->merged) return a->merged < b->merged ? -1 : 1;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : (a->r > b->r);
}

static int cmp_rank(const void *pa, const void *pb) {
    const save_merge *a = pa, *b = pb;
    return a->rank < b->rank ? -1 : (a->rank > b->rank);
}

/* Byte-level BPE: the merge table as loaded, in rank order. */
static nb_status merges_from_ranks(nb_ctx *ctx, const nb_tokenizer *t, save_merge **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    if (!t->pmap.keys || t->pmap.count == 0) return NB_OK;
    save_merge *m = malloc((size_t)t->pmap.count * sizeof(save_merge));
    if (!m) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory for %lld merges", (long long)t->pmap.count);
    int64_t k = 0;
    for (uint64_t i = 0; i <= t->pmap.mask; i++) {
        uint64_t key = t->pmap.keys[i];
        if (key == UINT64_MAX) continue;
        m[k].score = 0;
        m[k].rank = t->pmap.rank[i];
        m[k].merged = t->pmap.merged[i];
        m[k].l = (int32_t)(key >> 32);
        m[k].r = (int32_t)(uint32_t)key;
        m[k].llen = m[k].rlen = 0;
        k++;
    }
    qsort(m, (size_t)k, sizeof(save_merge), cmp_rank);
    *out = m;
    *n = k;
    return NB_OK;
}

static int utf8_step(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

/* SentencePiece by scores: every split of a mergeable piece into two mergeable pieces is a merge,
 * ranked by the piece's score. Merging by these ranks picks, at each step, the pair whose result
 * scores best, which is what the score algorithm does. transformers' generate_merges takes splits
 * into any two pieces; control, unknown and byte pieces are left out here because the score
 * algorithm never merges into or out of them (on Llama's and stories260K's vocabularies no such
 * split exists, and the lists are identical). */
static nb_status merges_from_scores(nb_ctx *ctx, const nb_tokenizer *t, save_merge **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    size_t cap = 1024, k = 0;
    save_merge *m = malloc(cap * sizeof(save_merge));
    if (!m) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry *e = &t->ent[id];
        if (e->text_len < 2 || !mergeable(e->type)) continue;
        /* a spelling shared by two ids means the later one (tok_lookup's) */
        if (tok_lookup(t, txt(t, id), e->text_len) != id) continue;
        const char *s = txt(t, id);
        for (uint32_t cut = (uint32_t)utf8_step((unsigned char)s[0]); cut < e->text_len;
             cut += (uint32_t)utf8_step((unsigned char)s[cut])) {
            int32_t l = tok_lookup(t, s, cut), r = tok_lookup(t, s + cut, e->text_len - cut);
            if (l < 0 || r < 0 || !mergeable(t->ent[l].type) || !mergeable(t->ent[r].type)) continue;
            if (k == cap) {
                save_merge *q = realloc(m, cap * 2 * sizeof(save_merge));
                if (!q) {
                    free(m);
                    return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
                }
                m = q;
                cap *= 2;
            }
            m[k].score = e->score;
            m[k].rank = 0;
            m[k].merged = id;
            m[k].l = l;
            m[k].r = r;
            m[k].llen = n_chars(s, cut);
            m[k].rlen = n_chars(s + cut, e->text_len - cut);
            k++;
        }
    }
    qsort(m, k, sizeof(save_merge), cmp_spm);
    *out = m;
    *n = (int64_t)k;
    return NB_OK;
}

/* ---- tokenizer.json -------------------------------------------------------------------------- */

static const char *behavior_name(int b) {
    switch (b) {
    case TOK_SPLIT_REMOVED: return "Removed";
    case TOK_SPLIT_MERGED_PREV: return "MergedWithPrevious";
    case TOK_SPLIT_MERGED_NEXT: return "MergedWithNext";
    case TOK_SPLIT_CONTIGUOUS: return "Contiguous";
    default: return "Isolated";
    }
}

static void put_token_name(FILE *f, const nb_tokenizer *t, int32_t id) {
    if (id < 0) fputs("null", f);
    else put_str(f, txt(t, id), t->ent[id].text_len);
}

/* The post-processor's template: BOS / EOS around each sequence as add_bos / add_eos say. */
static void put_template(FILE *f, const nb_tokenizer *t, int bos, int eos) {
    fputs("{\n    \"type\": \"TemplateProcessing\",\n    \"single\": [", f);
    int first = 1;
    if (bos) {
        fputs("\n      {\"SpecialToken\": {\"id\": ", f);
        put_token_name(f, t, t->bos);
        fputs(", \"type_id\": 0}}", f);
        first = 0;
    }
    fprintf(f, "%s\n      {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}", first ? "" : ",");
    if (eos) {
        fputs(",\n      {\"SpecialToken\": {\"id\": ", f);
        put_token_name(f, t, t->eos);
        fputs(", \"type_id\": 0}}", f);
    }
    fputs("\n    ],\n    \"pair\": [", f);
    for (int seq = 0; seq < 2; seq++) {
        if (bos) {
            fprintf(f, "%s\n      {\"SpecialToken\": {\"id\": ", seq ? "," : "");
            put_token_name(f, t, t->bos);
            fprintf(f, ", \"type_id\": %d}}", seq);
        }
        fprintf(f, "%s\n      {\"Sequence\": {\"id\": \"%s\", \"type_id\": %d}}", (bos || seq) ? "," : "",
                seq ? "B" : "A", seq);
        if (eos) {
            fputs(",\n      {\"SpecialToken\": {\"id\": ", f);
            put_token_name(f, t, t->eos);
            fprintf(f, ", \"type_id\": %d}}", seq);
        }
    }
    fputs("\n    ],\n    \"special_tokens\": {", f);
    int32_t ids[2] = {bos ? t->bos : -1, eos ? t->eos : -1};
    int n = 0;
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0 || (k == 1 && ids[1] == ids[0])) continue;
        fprintf(f, "%s\n      ", n++ ? "," : "");
        put_token_name(f, t, ids[k]);
        fputs(": {\"id\": ", f);
        put_token_name(f, t, ids[k]);
        fprintf(f, ", \"ids\": [%d], \"tokens\": [", ids[k]);
        put_token_name(f, t, ids[k]);
        fputs("]}", f);
    }
    fputs("\n    }\n  }", f);
}

static void write_tokenizer_json(FILE *f, const nb_tokenizer *t, const save_merge *m, int64_t nm) {
    int spm = t->algo == TOK_ALGO_SCORES;
    int bos = t->add_bos && t->bos >= 0, eos = t->add_eos && t->eos >= 0;
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [", f);
    int first = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!is_added(t, id)) continue;
        fprintf(f, "%s\n    {\"id\": %d, \"content\": ", first ? "" : ",", id);
        put_str(f, txt(t, id), t->ent[id].text_len);
        fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                   "\"special\": %s}",
                t->ent[id].type == NB_TOKEN_USER_DEFINED ? "false" : "true");
        first = 0;
    }
    fputs(first ? "],\n" : "\n  ],\n", f);

    /* normalizer */
    if (spm && (t->norm_remove_extra_ws || t->norm_prefix || t->norm_escape)) {
        fputs("  \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [", f);
        const char *sep = "";
        if (t->norm_remove_extra_ws) {
            fputs("\n    {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\A +| +\\\\z\"}, \"content\": \"\"},"
                  "\n    {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, \"content\": \" \"}", f);
            sep = ",";
        }
        if (t->norm_prefix) {
            fprintf(f, "%s\n    {\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"}", sep);
            sep = ",";
        }
        if (t->norm_escape)
            fprintf(f, "%s\n    {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}",
                    sep);
        fputs("\n  ]},\n", f);
    } else {
        fputs("  \"normalizer\": null,\n", f);
    }

    /* pre-tokenizer: the regex splits, then (byte-level) the byte-to-character mapping */
    if (t->n_pre > 0 || t->byte_level) {
        fputs("  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [", f);
        for (int k = 0; k < t->n_pre; k++) {
            const tok_pre_step *st = &t->pre[k];
            fprintf(f, "%s\n    {\"type\": \"Split\", \"pattern\": {\"%s\": ", k ? "," : "", st->literal ? "String" : "Regex");
            put_str(f, st->pattern, st->pattern_len);
            fprintf(f, "}, \"behavior\": \"%s\", \"invert\": %s}", behavior_name(st->behavior), st->invert ? "true" : "false");
        }
        if (t->byte_level)
            fprintf(f, "%s\n    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
                       "\"use_regex\": false}",
                    t->n_pre ? "," : "");
        fputs("\n  ]},\n", f);
    } else {
        fputs("  \"pre_tokenizer\": null,\n", f);
    }

    /* post-processor */
    fputs("  \"post_processor\": ", f);
    if (t->byte_level) {
        const char *bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}";
        if (bos || eos) {
            fprintf(f, "{\"type\": \"Sequence\", \"processors\": [\n  %s,\n  ", bl);
            put_template(f, t, bos, eos);
            fputs("\n  ]},\n", f);
        } else {
            fprintf(f, "%s,\n", bl);
        }
    } else if (bos || eos) {
        put_template(f, t, bos, eos);
        fputs(",\n", f);
    } else {
        fputs("null,\n", f);
    }

    /* decoder */
    if (t->byte_level) {
        fputs("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
              "\"use_regex\": true},\n", f);
    } else {
        fputs("  \"decoder\": {\"type\": \"Sequence\", \"decoders\": [\n"
              "    {\"type\": \"Replace\", \"pattern\": {\"String\": \"\xe2\x96\x81\"}, \"content\": \" \"}", f);
        if (t->byte_fallback) fputs(",\n    {\"type\": \"ByteFallback\"}", f);
        fputs(",\n    {\"type\": \"Fuse\"}", f);
        if (t->decode_strip_space) fputs(",\n    {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}", f);
        fputs("\n  ]},\n", f);
    }

    /* model */
    fputs("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": ", f);
    put_token_name(f, t, spm ? t->unk : -1);
    fprintf(f, ",\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
               "    \"fuse_unk\": %s,\n    \"byte_fallback\": %s,\n    \"ignore_merges\": %s,\n    \"vocab\": {",
            spm ? "true" : "false", t->byte_fallback ? "true" : "false", t->ignore_merges ? "true" : "false");
    first = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n = t->ent[id].text_len;
        /* JSON object keys are unique: an empty or shadowed spelling has no entry */
        if (n == 0 || tok_lookup(t, txt(t, id), n) != id) continue;
        fputs(first ? "\n      " : ",\n      ", f);
        put_str(f, txt(t, id), n);
        fprintf(f, ": %d", id);
        first = 0;
    }
    fputs(first ? "},\n    \"merges\": [" : "\n    },\n    \"merges\": [", f);
    /* "a b" strings unless a part holds a space, then [a, b] pairs (tokenizers >= 0.20 reads both) */
    int pairs = 0;
    for (int64_t i = 0; i < nm && !pairs; i++)
        pairs = memchr(txt(t, m[i].l), ' ', t->ent[m[i].l].text_len) || memchr(txt(t, m[i].r), ' ', t->ent[m[i].r].text_len);
    for (int64_t i = 0; i < nm; i++) {
        fputs(i ? ",\n      " : "\n      ", f);
        const tok_entry *a = &t->ent[m[i].l], *b = &t->ent[m[i].r];
        if (pairs) {
            fputc('[', f);
            put_str(f, txt(t, m[i].l), a->text_len);
            fputs(", ", f);
            put_str(f, txt(t, m[i].r), b->text_len);
            fputc(']', f);
        } else {
            fputc('"', f);
            put_body(f, txt(t, m[i].l), a->text_len);
            fputc(' ', f);
            put_body(f, txt(t, m[i].r), b->text_len);
            fputc('"', f);
        }
    }
    fputs(nm ? "\n    ]\n  }\n}\n" : "]\n  }\n}\n", f);
}

/* ---- tokenizer_config.json / special_tokens_map.json ---------------------------------------- */

static void put_kv_token(FILE *f, const nb_tokenizer *t, const char *key, int32_t id, int comma) {
    fprintf(f, "  \"%s\": ", key);
    put_token_name(f, t, id);
    fputs(comma ? ",\n" : "\n", f);
}

static void write_tokenizer_config(FILE *f, const nb_tokenizer *t) {
    fprintf(f, "{\n  \"add_bos_token\": %s,\n  \"add_eos_token\": %s,\n", t->add_bos && t->bos >= 0 ? "true" : "false",
            t->add_eos && t->eos >= 0 ? "true" : "false");
    put_kv_token(f, t, "bos_token", t->bos, 1);
    put_kv_token(f, t, "eos_token", t->eos, 1);
    put_kv_token(f, t, "unk_token", t->unk, 1);
    put_kv_token(f, t, "pad_token", t->pad, 1);
    /* without this transformers' decode may edit spaces around punctuation */
    fputs("  \"clean_up_tokenization_spaces\": false,\n", f);
    if (t->chat_template) {
        fputs("  \"chat_template\": ", f);
        put_str(f, t->chat_template, t->chat_template_len);
        fputs(",\n", f);
    }
    /* the model's context when known, else transformers' own "no limit" value */
    if (t->max_len > 0) fprintf(f, "  \"model_max_length\": %lld,\n", (long long)t->max_len);
    else fputs("  \"model_max_length\": 1000000000000000019884624838656,\n", f);
    fputs("  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n", f);
}

static void write_special_tokens_map(FILE *f, const nb_tokenizer *t) {
    const char *keys[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    int32_t ids[4] = {t->bos, t->eos, t->unk, t->pad};
    int n = 0;
    fputs("{", f);
    for (int k = 0; k < 4; k++) {
        if (ids[k] < 0) continue;
        fprintf(f, "%s\n  \"%s\": ", n++ ? "," : "", keys[k]);
        put_token_name(f, t, ids[k]);
    }
    fputs(n ? "\n}\n" : "}\n", f);
}

/* ---- files ----------------------------------------------------------------------------------- */

typedef enum { SAVE_TOKENIZER, SAVE_CONFIG, SAVE_SPECIAL } save_what;

/* Write one file through a temporary name, so a failed save never leaves a truncated file. */
static nb_status write_file(nb_ctx *ctx, const char *dir, const char *name, const nb_tokenizer *t, save_what what,
                            const save_merge *m, int64_t nm) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return nb_fail(ctx, NB_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 16);   /* stdio's default buffer is small for a 10 MB file */
    if (what == SAVE_TOKENIZER) write_tokenizer_json(f, t, m, nm);
    else if (what == SAVE_CONFIG) write_tokenizer_config(f, t);
    else write_special_tokens_map(f, t);
    int bad = ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        remove(tmp);
        return nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        remove(tmp);
        return nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return NB_OK;
}

/* What JSON cannot hold or HF cannot express, named before anything is written. */
static nb_status check_savable(nb_ctx *ctx, const nb_tokenizer *t) {
    if (t->source == TOK_SRC_JSON)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED,
                       "the tokenizer was loaded from a tokenizer.json: copy that file instead of writing it back");
    if (t->algo == TOK_ALGO_MERGES && !t->byte_level)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "writing a SentencePiece-style BPE tokenizer with merges is not supported");
    if (t->algo != TOK_ALGO_MERGES && t->algo != TOK_ALGO_SCORES)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "the tokenizer has no BPE model to write");
    if (t->bl_add_prefix_space || t->norm_prefix == TOK_PREFIX_FIRST || t->norm_prefix_if_absent)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "the tokenizer's prefix-space rule has no tokenizer.json form here");
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (!utf8_valid(txt(t, id), t->ent[id].text_len))
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, "token %d is not valid UTF-8, which tokenizer.json cannot hold", id);
    for (int k = 0; k < t->n_pre; k++)
        if (!utf8_valid(t->pre[k].pattern, t->pre[k].pattern_len))
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, "pre-tokenizer pattern %d is not valid UTF-8", k);
    if (t->chat_template && !utf8_valid(t->chat_template, t->chat_template_len))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "the chat template is not valid UTF-8");
    return NB_OK;
}

nb_status nb_tokenizer_save_json(nb_ctx *ctx, const nb_tokenizer *tok, const char *dir) {
    if (!tok || !dir || !*dir) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_save_json: bad arguments");
    if (strlen(dir) > 4000) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_save_json: the path is too long");
    nb_status s = check_savable(ctx, tok);
    if (s != NB_OK) return s;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return nb_fail(ctx, NB_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return nb_fail(ctx, NB_ERR_IO, "%s is not a directory", dir);
    }
    save_merge *m = NULL;
    int64_t nm = 0;
    s = tok->algo == TOK_ALGO_SCORES ? merges_from_scores(ctx, tok, &m, &nm) : merges_from_ranks(ctx, tok, &m, &nm);
    if (s == NB_OK) s = write_file(ctx, dir, "tokenizer.json", tok, SAVE_TOKENIZER, m, nm);
    free(m);
    if (s == NB_OK) s = write_file(ctx, dir, "tokenizer_config.json", tok, SAVE_CONFIG, NULL, 0);
    if (s == NB_OK) s = write_file(ctx, dir, "special_tokens_map.json", tok, SAVE_SPECIAL, NULL, 0);
    return s;
}

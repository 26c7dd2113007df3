/* Loads a SentencePiece tokenizer.model: a small protobuf reader for ModelProto (pieces with score
 * and type, TrainerSpec's model type / byte fallback / special ids, NormalizerSpec's whitespace
 * options). Only BPE-type models without a normalization charsmap are accepted; they tokenize with
 * the piece-score algorithm, as sentencepiece and llama.cpp do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct pb_reader {
    const uint8_t *p, *end;
    int bad;
} pb_reader;

static uint64_t pb_varint(pb_reader *r) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) {
            r->bad = 1;
            return 0;
        }
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    r->bad = 1;
    return 0;
}

/* Read one field header; returns 0 at the end of the message. */
static int pb_next(pb_reader *r, uint32_t *field, uint32_t *wt) {
    if (r->bad || r->p >= r->end) return 0;
    uint64_t key = pb_varint(r);
    if (r->bad) return 0;
    *field = (uint32_t)(key >> 3);
    *wt = (uint32_t)(key & 7);
    return 1;
}

/* The bytes of a length-delimited field. */
static pb_reader pb_sub(pb_reader *r) {
    pb_reader s = {NULL, NULL, 1};
    uint64_t n = pb_varint(r);
    if (r->bad || n > (uint64_t)(r->end - r->p)) {
        r->bad = 1;
        return s;
    }
    s.p = r->p;
    s.end = r->p + n;
    s.bad = 0;
    r->p += n;
    return s;
}

static void pb_skip(pb_reader *r, uint32_t wt) {
    switch (wt) {
    case 0: (void)pb_varint(r); break;
    case 1: if (r->end - r->p < 8) r->bad = 1; else r->p += 8; break;
    case 2: (void)pb_sub(r); break;
    case 5: if (r->end - r->p < 4) r->bad = 1; else r->p += 4; break;
    default: r->bad = 1; break;
    }
}

static float pb_float(pb_reader *r) {
    float f = 0;
    if (r->end - r->p < 4) {
        r->bad = 1;
        return 0;
    }
    uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    memcpy(&f, &u, 4);
    r->p += 4;
    return f;
}

typedef struct spm_opts {
    int model_type, byte_fallback, ws_suffix;
    int32_t unk, bos, eos;
    int add_dummy_prefix, remove_extra_ws, escape_ws;
    size_t charsmap_len;
    char norm_name[64];
} spm_opts;

static void parse_trainer(pb_reader r, spm_opts *o, int *bad) {
    uint32_t f, wt;
    while (pb_next(&r, &f, &wt)) {
        if (wt == 0 && (f == 3 || f == 24 || f == 35 || (f >= 40 && f <= 42))) {
            int64_t v = (int64_t)pb_varint(&r);
            if (f == 3) o->model_type = (int)v;
            else if (f == 24) o->ws_suffix = v != 0;
            else if (f == 35) o->byte_fallback = v != 0;
            else if (f == 40) o->unk = (int32_t)v;
            else if (f == 41) o->bos = (int32_t)v;
            else o->eos = (int32_t)v;
        } else {
            pb_skip(&r, wt);
        }
    }
    if (r.bad) *bad = 1;
}

static void parse_normalizer(pb_reader r, spm_opts *o, int *bad) {
    uint32_t f, wt;
    while (pb_next(&r, &f, &wt)) {
        if (f == 1 && wt == 2) {
            pb_reader s = pb_sub(&r);
            size_t n = (size_t)(s.end - s.p);
            if (n >= sizeof(o->norm_name)) n = sizeof(o->norm_name) - 1;
            if (!s.bad) memcpy(o->norm_name, s.p, n);
            o->norm_name[n] = 0;
        } else if (f == 2 && wt == 2) {
            pb_reader s = pb_sub(&r);
            o->charsmap_len = (size_t)(s.end - s.p);
        } else if (wt == 0 && f >= 3 && f <= 5) {
            int v = pb_varint(&r) != 0;
            if (f == 3) o->add_dummy_prefix = v;
            else if (f == 4) o->remove_extra_ws = v;
            else o->escape_ws = v;
        } else {
            pb_skip(&r, wt);
        }
    }
    if (r.bad) *bad = 1;
}

nb_status nb_tokenizer_from_spm(nb_ctx *ctx, const char *path, nb_tokenizer **out) {
    if (!out || !path) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_from_spm: bad arguments");
    *out = NULL;
    char *data = NULL;
    size_t len = 0;
    nb_status s = tok_read_file(ctx, path, &data, &len);
    if (s != NB_OK) return s;
    /* proto2 defaults */
    spm_opts o = {1, 0, 0, 0, 1, 2, 1, 1, 1, 0, ""};
    nb_tokenizer *t = NULL;
    if ((s = tok_new(ctx, &t)) != NB_OK) goto done;
    pb_reader r = {(const uint8_t *)data, (const uint8_t *)data + len, 0};
    uint32_t f, wt;
    int32_t n = 0;
    int bad = 0;
    while (!bad && pb_next(&r, &f, &wt)) {
        if (f == 1 && wt == 2) {
            pb_reader pr = pb_sub(&r);
            const uint8_t *piece = NULL;
            size_t plen = 0;
            float score = 0;
            int32_t type = NB_TOKEN_NORMAL;
            uint32_t pf, pwt;
            while (pb_next(&pr, &pf, &pwt)) {
                if (pf == 1 && pwt == 2) {
                    pb_reader ps = pb_sub(&pr);
                    piece = ps.p;
                    plen = (size_t)(ps.end - ps.p);
                } else if (pf == 2 && pwt == 5) {
                    score = pb_float(&pr);
                } else if (pf == 3 && pwt == 0) {
                    type = (int32_t)pb_varint(&pr);
                } else {
                    pb_skip(&pr, pwt);
                }
            }
            if (pr.bad || !piece) {
                bad = 1;
                break;
            }
            if ((s = tok_set(t, n, (const char *)piece, plen, score, type)) != NB_OK) goto done;
            n++;
        } else if (f == 2 && wt == 2) {
            parse_trainer(pb_sub(&r), &o, &bad);
        } else if (f == 3 && wt == 2) {
            parse_normalizer(pb_sub(&r), &o, &bad);
        } else {
            pb_skip(&r, wt);
        }
    }
    if (bad || r.bad || n == 0) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s is not a SentencePiece model (malformed protobuf%s)", path,
                    n == 0 && !bad && !r.bad ? ", no pieces" : "");
        goto done;
    }
    if (o.model_type != 2) {
        static const char *const names[] = {"?", "UNIGRAM", "BPE", "WORD", "CHAR"};
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: SentencePiece model type %s is not supported (only BPE is)", path,
                    o.model_type >= 1 && o.model_type <= 4 ? names[o.model_type] : "unknown");
        goto done;
    }
    if (o.charsmap_len > 0) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: SentencePiece normalizer '%s' (a precompiled charsmap) is not supported",
                    path, o.norm_name);
        goto done;
    }
    if (o.ws_suffix) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: treat_whitespace_as_suffix is not supported", path);
        goto done;
    }
    t->algo = TOK_ALGO_SCORES;
    t->byte_fallback = o.byte_fallback;
    t->norm_escape = o.escape_ws;
    t->norm_prefix = o.add_dummy_prefix ? TOK_PREFIX_ALWAYS : TOK_PREFIX_NEVER;
    t->norm_remove_extra_ws = o.remove_extra_ws;
    t->decode_strip_space = o.add_dummy_prefix;
    t->decode_byte_fallback = 1;
    t->unk = o.unk >= 0 && o.unk < n ? o.unk : -1;
    t->bos = o.bos >= 0 && o.bos < n ? o.bos : -1;
    t->eos = o.eos >= 0 && o.eos < n ? o.eos : -1;
    t->add_bos = 1;   /* the Llama convention, as llama.cpp applies it to every SentencePiece vocabulary */
    t->add_eos = 0;
    snprintf(t->kind, sizeof(t->kind), "spm");
    t->source = TOK_SRC_SPM;
    s = tok_finish(t);
done:
    free(data);
    if (s != NB_OK) {
        nb_tokenizer_free(t);
        return s;
    }
    *out = t;
    return NB_OK;
}

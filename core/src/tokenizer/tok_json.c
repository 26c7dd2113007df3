/* Loads a Hugging Face tokenizer.json (BPE model) into the tokenizer engine, with BOS/EOS rules from
 * the tokenizer_config.json and config.json beside it. Normalizers, pre-tokenizers, decoders and
 * post-processors are mapped onto the engine's options; anything it cannot reproduce exactly is a
 * named NB_ERR_UNSUPPORTED rather than a silently different tokenization. Known gaps, accepted
 * because real tokenizers do not depend on them: an NFC normalizer is not applied (the text is
 * taken as NFC already), added tokens' single_word is ignored, and BPE fuse_unk is ignored (it
 * only matters without byte fallback). Decoding gives the exact bytes: transformers'
 * clean_up_tokenization_spaces is a Python-side edit we do not apply. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "io/json_int.h"
#include "tokenizer/tok_internal.h"

static const char META[] = "\xe2\x96\x81";   /* ▁ U+2581, SentencePiece's space */

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* 1 / 0 for a boolean field, `dflt` when absent or null. */
static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static nb_status parse_json_file(nb_ctx *ctx, const char *path, cJSON **out, int missing_ok) {
    *out = NULL;
    char *data = NULL;
    size_t len = 0;
    if (missing_ok) {
        struct stat st;
        if (stat(path, &st) != 0) return NB_OK;
    }
    nb_status s = tok_read_file(ctx, path, &data, &len);
    if (s != NB_OK) return s;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    if (!j) {
        long off = end ? (long)(end - data) : -1;
        if (!end) {
            const char *ep = cJSON_GetErrorPtr();
            if (ep >= data && ep <= data + len) off = (long)(ep - data);
        }
        free(data);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s is not valid JSON (error near byte %ld)", path, off);
    }
    free(data);
    *out = j;
    return NB_OK;
}

static nb_status unsupported(nb_ctx *ctx, const char *path, const char *what, const char *name) {
    return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s '%s' is not supported", path, what, name ? name : "(no type)");
}

static nb_status parse_normalizer(nb_tokenizer *t, const char *path, const cJSON *n) {
    nb_ctx *ctx = t->ctx;
    if (!n || cJSON_IsNull(n)) return NB_OK;
    const char *type = jstr(n, "type");
    if (!type) return nb_fail(ctx, NB_ERR_FORMAT, "%s: a normalizer has no type", path);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            nb_status s = parse_normalizer(t, path, it);
            if (s != NB_OK) return s;
        }
        return NB_OK;
    }
    if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p || strcmp(p, META) != 0) return unsupported(ctx, path, "Prepend normalizer with prepend", p);
        t->norm_prefix = TOK_PREFIX_ALWAYS;
        t->norm_is_normalizer = 1;
        return NB_OK;
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = jstr(pat, "String"), *to = jstr(n, "content"), *re = jstr(pat, "Regex");
        /* SentencePiece's remove_extra_whitespaces, as transformers' converter spells it: spaces
         * (only spaces) trimmed at both ends, runs of them folded into one. It must come before
         * the ' ' -> '▁' escape for the patterns to see the spaces. */
        if (re && to && !t->norm_escape && !t->norm_prefix &&
            ((!strcmp(re, "\\A +| +\\z") && !strcmp(to, "")) || (!strcmp(re, " {2,}") && !strcmp(to, " ")))) {
            t->norm_remove_extra_ws = 1;
            t->norm_is_normalizer = 1;
            return NB_OK;
        }
        if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, META) != 0)
            return unsupported(ctx, path, "Replace normalizer other than ' ' -> '\xe2\x96\x81', from", from);
        t->norm_escape = 1;
        t->norm_is_normalizer = 1;
        return NB_OK;
    }
    /* NFC is accepted but not applied: text is taken to be NFC already (almost all text is) */
    if (!strcmp(type, "NFC")) return NB_OK;
    return unsupported(ctx, path, "normalizer", type);
}

static int split_behavior(const char *b) {
    if (!b || !strcmp(b, "Isolated")) return TOK_SPLIT_ISOLATED;
    if (!strcmp(b, "Removed")) return TOK_SPLIT_REMOVED;
    if (!strcmp(b, "MergedWithPrevious")) return TOK_SPLIT_MERGED_PREV;
    if (!strcmp(b, "MergedWithNext")) return TOK_SPLIT_MERGED_NEXT;
    if (!strcmp(b, "Contiguous")) return TOK_SPLIT_CONTIGUOUS;
    return -1;
}

static nb_status parse_pre(nb_tokenizer *t, const char *path, const cJSON *p) {
    nb_ctx *ctx = t->ctx;
    if (!p || cJSON_IsNull(p)) return NB_OK;
    const char *type = jstr(p, "type");
    if (!type) return nb_fail(ctx, NB_ERR_FORMAT, "%s: a pre_tokenizer has no type", path);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            nb_status s = parse_pre(t, path, it);
            if (s != NB_OK) return s;
        }
        return NB_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        int beh = split_behavior(jstr(p, "behavior"));
        if (beh < 0) return unsupported(ctx, path, "Split behavior", jstr(p, "behavior"));
        if (!re && !lit) return nb_fail(ctx, NB_ERR_FORMAT, "%s: a Split pre_tokenizer has no pattern", path);
        const char *s = re ? re : lit;
        return tok_add_pre(t, s, strlen(s), re == NULL, beh, jbool(p, "invert", 0));
    }
    if (!strcmp(type, "ByteLevel")) {
        t->byte_level = 1;
        if (jbool(p, "add_prefix_space", 0)) {
            if (t->n_pre > 0)
                return unsupported(ctx, path, "ByteLevel add_prefix_space after another pre_tokenizer", "ByteLevel");
            t->bl_add_prefix_space = 1;
        }
        if (jbool(p, "use_regex", 1)) return tok_add_pre(t, tok_re_gpt2, strlen(tok_re_gpt2), 0, TOK_SPLIT_ISOLATED, 0);
        return NB_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = jstr(p, "replacement");
        if (rep && strcmp(rep, META) != 0) return unsupported(ctx, path, "Metaspace replacement", rep);
        if (t->n_pre > 0) return unsupported(ctx, path, "Metaspace after another pre_tokenizer", "Metaspace");
        const char *scheme = jstr(p, "prepend_scheme");
        int mode = jbool(p, "add_prefix_space", 1) ? TOK_PREFIX_ALWAYS : TOK_PREFIX_NEVER;
        if (scheme) {
            if (!strcmp(scheme, "always")) mode = TOK_PREFIX_ALWAYS;
            else if (!strcmp(scheme, "first")) mode = TOK_PREFIX_FIRST;
            else if (!strcmp(scheme, "never")) mode = TOK_PREFIX_NEVER;
            else return unsupported(ctx, path, "Metaspace prepend_scheme", scheme);
        }
        t->norm_escape = 1;
        t->norm_prefix = mode;
        t->norm_prefix_if_absent = 1;
        if (jbool(p, "split", 1)) return tok_add_pre(t, META, 3, 1, TOK_SPLIT_MERGED_NEXT, 0);
        return NB_OK;
    }
    if (!strcmp(type, "Digits")) {
        const char *re = jbool(p, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+";
        return tok_add_pre(t, re, strlen(re), 0, TOK_SPLIT_ISOLATED, 0);
    }
    return unsupported(ctx, path, "pre_tokenizer", type);
}

static void parse_decoder(nb_tokenizer *t, const cJSON *d) {
    if (!d || cJSON_IsNull(d)) return;
    const char *type = jstr(d, "type");
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(d, "decoders")) parse_decoder(t, it);
    } else if (!strcmp(type, "Strip")) {
        const char *c = jstr(d, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start");
        if (c && !strcmp(c, " ") && cJSON_IsNumber(start) && start->valuedouble >= 1) t->decode_strip_space = 1;
    } else if (!strcmp(type, "ByteFallback")) {
        t->decode_byte_fallback = 1;
    } else if (!strcmp(type, "Metaspace")) {
        const char *scheme = jstr(d, "prepend_scheme");
        int strip = scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", 1);
        if (strip) t->decode_strip_space = 1;
    }
}

/* A token id from JSON: an integer in [0, 2^31), else -1 (none). */
static int32_t json_id(const cJSON *v) {
    int64_t x;
    return nb_json_int(v, 0, INT32_MAX, &x) ? (int32_t)x : -1;
}

typedef struct tmpl_info { int n_pre, n_post; int32_t pre_id, post_id; } tmpl_info;

static int32_t template_token_id(nb_tokenizer *t, const cJSON *pp, const char *name) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(st, name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "ids");
    if (cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == 1 && cJSON_IsNumber(cJSON_GetArrayItem(ids, 0)))
        return json_id(cJSON_GetArrayItem(ids, 0));
    return tok_lookup(t, name, strlen(name));
}

static nb_status parse_post(nb_tokenizer *t, const char *path, const cJSON *pp, tmpl_info *ti) {
    if (!pp || cJSON_IsNull(pp)) return NB_OK;
    const char *type = jstr(pp, "type");
    if (!type) return NB_OK;
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            nb_status s = parse_post(t, path, it, ti);
            if (s != NB_OK) return s;
        }
    } else if (!strcmp(type, "TemplateProcessing")) {
        int seen_seq = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "single")) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
                seen_seq = 1;
            } else if (sp) {
                const char *name = jstr(sp, "id");
                int32_t id = name ? template_token_id(t, pp, name) : -1;
                if (id < 0) return nb_fail(t->ctx, NB_ERR_FORMAT, "%s: post_processor token '%s' is unknown", path,
                                           name ? name : "?");
                if (seen_seq) { ti->n_post++; ti->post_id = id; }
                else { ti->n_pre++; ti->pre_id = id; }
            }
        }
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(pp, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(pp, "sep");
        if (cJSON_IsArray(cls) && cJSON_IsNumber(cJSON_GetArrayItem(cls, 1))) {
            ti->n_pre++;
            ti->pre_id = json_id(cJSON_GetArrayItem(cls, 1));
        }
        if (cJSON_IsArray(sep) && cJSON_IsNumber(cJSON_GetArrayItem(sep, 1))) {
            ti->n_post++;
            ti->post_id = json_id(cJSON_GetArrayItem(sep, 1));
        }
    }
    return NB_OK;
}

/* "<s>" or {"content": "<s>", ...} in tokenizer_config.json -> id, or -1. */
static int32_t config_token(nb_tokenizer *t, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
    return s ? tok_lookup(t, s, strlen(s)) : -1;
}

static int32_t config_id(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
    return json_id(v);
}

/* The chat template, as transformers finds it: chat_template.jinja beside the tokenizer, else
 * tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which "default"). */
static nb_status load_chat_template(nb_tokenizer *t, const char *dir, const cJSON *cfg) {
    char jpath[4200];
    struct stat st;
    snprintf(jpath, sizeof(jpath), "%s/chat_template.jinja", dir);
    if (stat(jpath, &st) == 0 && S_ISREG(st.st_mode)) {
        char *data = NULL;
        size_t len = 0;
        nb_status s = tok_read_file(t->ctx, jpath, &data, &len);
        if (s != NB_OK) return s;
        s = tok_set_chat_template(t, data, len);
        free(data);
        return s;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsArray(ct)) {
        const cJSON *it, *found = NULL;
        cJSON_ArrayForEach(it, ct) {
            const char *name = jstr(it, "name");
            if (name && strcmp(name, "default") == 0) found = cJSON_GetObjectItemCaseSensitive(it, "template");
        }
        ct = found;
    }
    if (cJSON_IsString(ct)) return tok_set_chat_template(t, ct->valuestring, strlen(ct->valuestring));
    return NB_OK;
}

static nb_status load_model(nb_tokenizer *t, const char *path, const cJSON *root) {
    nb_ctx *ctx = t->ctx;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return nb_fail(ctx, NB_ERR_FORMAT, "%s has no \"model\" object", path);
    const char *mtype = jstr(model, "type");
    if (mtype && strcmp(mtype, "BPE") != 0) return unsupported(ctx, path, "tokenizer model type (only BPE is)", mtype);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return nb_fail(ctx, NB_ERR_FORMAT, "%s: model.vocab is missing or not an object", path);
    if (!mtype && !merges) return unsupported(ctx, path, "tokenizer model without type or merges", "?");
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if (csp && *csp) return unsupported(ctx, path, "BPE continuing_subword_prefix", csp);
    if (eow && *eow) return unsupported(ctx, path, "BPE end_of_word_suffix", eow);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0) return unsupported(ctx, path, "BPE dropout", "> 0");
    t->algo = TOK_ALGO_MERGES;
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);

    /* ids index the token table, so they are bounded by what the file declares (vocab entries plus
     * added tokens; real files number them densely from 0) before the table is allocated */
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int64_t n_decl = (int64_t)cJSON_GetArraySize(vocab) + (cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0);
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int64_t id;
        if (!nb_json_int(it, 0, INT32_MAX, &id))
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: vocab entry \"%s\" has no valid id", path, it->string);
        if (id >= n_decl)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: vocab entry \"%s\" has id %lld, but the file declares only %lld tokens "
                           "(vocab entries + added_tokens)", path, it->string, (long long)id, (long long)n_decl);
    }
    cJSON_ArrayForEach(it, added) {
        int64_t id;
        if (!nb_json_int(cJSON_GetObjectItemCaseSensitive(it, "id"), 0, INT32_MAX, &id) || !jstr(it, "content"))
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: an added_tokens entry lacks id or content", path);
        if (id >= n_decl)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: added token \"%s\" has id %lld, but the file declares only %lld tokens "
                           "(vocab entries + added_tokens)", path, jstr(it, "content"), (long long)id, (long long)n_decl);
    }
    nb_status s = tok_reserve(t, (int32_t)n_decl);
    if (s != NB_OK) return s;
    cJSON_ArrayForEach(it, vocab) {
        s = tok_set(t, (int32_t)it->valuedouble, it->string, strlen(it->string), 0.0f, NB_TOKEN_NORMAL);
        if (s != NB_OK) return s;
    }
    cJSON_ArrayForEach(it, added) {
        const char *content = jstr(it, "content");
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        int special = jbool(it, "special", 0);
        s = tok_set(t, id, content, strlen(content), 0.0f, special ? NB_TOKEN_CONTROL : NB_TOKEN_USER_DEFINED);
        if (s != NB_OK) return s;
        t->tflags[id] |= TOK_F_ADDED | (jbool(it, "lstrip", 0) ? TOK_F_LSTRIP : 0) | (jbool(it, "rstrip", 0) ? TOK_F_RSTRIP : 0) |
                         (jbool(it, "normalized", !special) ? TOK_F_NORMALIZED : 0);
    }
    s = tok_build_vocab_map(t);
    if (s != NB_OK) return s;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        t->unk = tok_lookup(t, unk, strlen(unk));
        if (t->unk >= 0) t->ent[t->unk].type = NB_TOKEN_UNKNOWN;
    }

    int nm = cJSON_GetArraySize(merges);
    if (nm > 0 && (s = tok_reserve_merges(t, nm)) != NB_OK) return s;
    int32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(it)) {
            /* "a b": split at the first space after the first character (llama.cpp does the same) */
            const char *m = it->valuestring;
            const char *sp = *m ? strchr(m + 1, ' ') : NULL;
            if (!sp) return nb_fail(ctx, NB_ERR_FORMAT, "%s: merge %d \"%s\" is not two tokens", path, rank, m);
            a = m; al = (size_t)(sp - m);
            b = sp + 1; bl = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring; al = strlen(a);
            b = cJSON_GetArrayItem(it, 1)->valuestring; bl = strlen(b);
        } else {
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [a, b]", path, rank);
        }
        s = tok_add_merge(t, a, al, b, bl, rank);
        if (s != NB_OK) {
            char msg[512];
            snprintf(msg, sizeof(msg), "%s", nb_ctx_last_error(ctx));
            return nb_fail(ctx, s, "%s: %s", path, msg);
        }
        rank++;
    }
    return NB_OK;
}

nb_status nb_tokenizer_from_json(nb_ctx *ctx, const char *path_or_dir, nb_tokenizer **out) {
    if (!out || !path_or_dir) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_from_json: bad arguments");
    *out = NULL;
    char path[4096], dir[4096];
    struct stat st;
    if (stat(path_or_dir, &st) != 0)
        return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path_or_dir, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof(dir), "%s", path_or_dir);
        snprintf(path, sizeof(path), "%s/tokenizer.json", path_or_dir);
    } else {
        snprintf(path, sizeof(path), "%s", path_or_dir);
        snprintf(dir, sizeof(dir), "%s", path_or_dir);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof(dir), ".");
    }
    cJSON *root = NULL, *tcfg = NULL, *mcfg = NULL;
    nb_tokenizer *t = NULL;
    nb_status s = parse_json_file(ctx, path, &root, 0);
    if (s != NB_OK) return s;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    }
    s = tok_new(ctx, &t);
    if (s != NB_OK) goto done;
    if ((s = load_model(t, path, root)) != NB_OK) goto done;
    if ((s = parse_normalizer(t, path, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) != NB_OK) goto done;
    if ((s = parse_pre(t, path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) != NB_OK) goto done;
    parse_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    tmpl_info ti = {0, 0, -1, -1};
    if ((s = parse_post(t, path, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &ti)) != NB_OK) goto done;
    if (ti.n_pre > 1 || ti.n_post > 1) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: the post_processor adds %d tokens before and %d after the text "
                    "(only one BOS and one EOS are supported)", path, ti.n_pre, ti.n_post);
        goto done;
    }
    snprintf(t->kind, sizeof(t->kind), "%s", t->byte_level ? "byte-bpe" : "bpe");
    snprintf(t->pre_name, sizeof(t->pre_name), "%s", t->n_pre > 0 ? "json" : "none");

    /* BOS/EOS: tokenizer_config.json wins, then the post_processor template, then config.json */
    char cpath[4200];
    snprintf(cpath, sizeof(cpath), "%s/tokenizer_config.json", dir);
    if ((s = parse_json_file(ctx, cpath, &tcfg, 1)) != NB_OK) goto done;
    snprintf(cpath, sizeof(cpath), "%s/config.json", dir);
    if ((s = parse_json_file(ctx, cpath, &mcfg, 1)) != NB_OK) goto done;
    int32_t bos = config_token(t, tcfg, "bos_token"), eos = config_token(t, tcfg, "eos_token");
    if (bos < 0) bos = ti.n_pre ? ti.pre_id : config_id(mcfg, "bos_token_id");
    if (eos < 0) eos = ti.n_post ? ti.post_id : config_id(mcfg, "eos_token_id");
    t->bos = bos < t->n_vocab ? bos : -1;
    t->eos = eos < t->n_vocab ? eos : -1;
    t->add_bos = jbool(tcfg, "add_bos_token", ti.n_pre > 0);
    t->add_eos = jbool(tcfg, "add_eos_token", ti.n_post > 0);
    if (t->unk < 0) t->unk = config_token(t, tcfg, "unk_token");
    if ((s = load_chat_template(t, dir, tcfg)) != NB_OK) goto done;
    t->source = TOK_SRC_JSON;
    s = tok_finish(t);
done:
    cJSON_Delete(root);
    cJSON_Delete(tcfg);
    cJSON_Delete(mcfg);
    if (s != NB_OK) {
        nb_tokenizer_free(t);
        return s;
    }
    *out = t;
    return NB_OK;
}

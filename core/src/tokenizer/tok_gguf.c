/* Loads the tokenizer embedded in a GGUF (tokenizer.ggml.* keys) the way llama.cpp reads it:
 * `llama` is SentencePiece by piece scores with byte fallback, `gpt2` is byte-level BPE with the
 * merges and the pre-tokenizer regexes named by tokenizer.ggml.pre. Also nb_tokenizer_load, which
 * picks the loader from a path. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "nibble/gguf.h"
#include "tokenizer/tok_internal.h"

/* An integer key, or dflt when absent or not a number. */
static int64_t kv_int(const nb_gguf *g, const char *key, int64_t dflt) {
    int64_t i = nb_gguf_find_key(g, key);
    if (i < 0) return dflt;
    nb_gguf_type ty = nb_gguf_kv_type(g, i);
    if (ty == NB_GGUF_STRING || ty == NB_GGUF_ARRAY) return dflt;
    return nb_gguf_kv_int(g, i);
}

/* A special-token id key: in range, or dflt (llama.cpp ignores out-of-range ids such as 0xFFFFFFFF). */
static int32_t kv_token(const nb_gguf *g, const char *key, int32_t dflt, int32_t n) {
    int64_t v = kv_int(g, key, -1);
    if (nb_gguf_find_key(g, key) < 0) return dflt;
    return v >= 0 && v < n ? (int32_t)v : dflt;
}

static nb_status load_gguf(nb_tokenizer *t, nb_gguf *g) {
    nb_ctx *ctx = t->ctx;
    int64_t km = nb_gguf_find_key(g, "tokenizer.ggml.model");
    if (km < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "the GGUF has no tokenizer (tokenizer.ggml.model is missing)");
    uint64_t mlen = 0;
    const char *model = nb_gguf_kv_str(g, km, &mlen);
    if (!model) return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.model is not a string");
    int spm = !strcmp(model, "llama"), bpe = !strcmp(model, "gpt2");
    if (!spm && !bpe)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "GGUF tokenizer model '%s' is not supported (llama and gpt2 are)", model);

    int64_t kt = nb_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (kt < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "the GGUF has no tokenizer.ggml.tokens");
    if (nb_gguf_kv_type(g, kt) != NB_GGUF_ARRAY || nb_gguf_arr_type(g, kt) != NB_GGUF_STRING)
        return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.tokens is not an array of strings");
    int64_t n = nb_gguf_arr_count(g, kt);
    if (n <= 0 || n > INT32_MAX) return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.tokens has %lld entries", (long long)n);

    const float *scores = NULL;
    int64_t ks = nb_gguf_find_key(g, "tokenizer.ggml.scores");
    if (ks >= 0) {
        if (nb_gguf_kv_type(g, ks) != NB_GGUF_ARRAY || nb_gguf_arr_type(g, ks) != NB_GGUF_FLOAT32 ||
            nb_gguf_arr_count(g, ks) != n)
            return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.scores is not %lld float32 values", (long long)n);
        scores = nb_gguf_arr_data(g, ks);
    }
    const int32_t *types = NULL;
    int64_t ky = nb_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (ky >= 0) {
        nb_gguf_type at = nb_gguf_arr_type(g, ky);
        if (nb_gguf_kv_type(g, ky) != NB_GGUF_ARRAY || (at != NB_GGUF_INT32 && at != NB_GGUF_UINT32) ||
            nb_gguf_arr_count(g, ky) != n)
            return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.token_type is not %lld int32 values", (long long)n);
        types = nb_gguf_arr_data(g, ky);
    }
    nb_status s = tok_reserve(t, (int32_t)n);
    if (s != NB_OK) return s;
    for (int64_t i = 0; i < n; i++) {
        uint64_t len = 0;
        const char *txt = nb_gguf_arr_str(g, kt, i, &len);
        int32_t ty = types ? types[i] : NB_TOKEN_NORMAL;
        if (ty < 0 || ty > NB_TOKEN_BYTE) ty = NB_TOKEN_UNDEFINED;
        s = tok_set(t, (int32_t)i, txt ? txt : "", txt ? (size_t)len : 0, scores ? scores[i] : 0.0f, ty);
        if (s != NB_OK) return s;
    }
    if ((s = tok_build_vocab_map(t)) != NB_OK) return s;
    int32_t nv = (int32_t)n;

    if (spm) {
        t->algo = TOK_ALGO_SCORES;
        t->byte_fallback = 1;
        t->norm_escape = 1;
        int prefix = kv_int(g, "tokenizer.ggml.add_space_prefix", 1) != 0;
        t->norm_prefix = prefix ? TOK_PREFIX_ALWAYS : TOK_PREFIX_NEVER;
        t->decode_strip_space = prefix;
        t->decode_byte_fallback = 1;
        t->norm_remove_extra_ws = kv_int(g, "tokenizer.ggml.remove_extra_whitespaces", 0) != 0;
        t->bos = kv_token(g, "tokenizer.ggml.bos_token_id", 1 < nv ? 1 : -1, nv);
        t->eos = kv_token(g, "tokenizer.ggml.eos_token_id", 2 < nv ? 2 : -1, nv);
        t->unk = kv_token(g, "tokenizer.ggml.unknown_token_id", 0, nv);
        t->add_bos = 1;
        snprintf(t->kind, sizeof(t->kind), "spm");
    } else {
        t->algo = TOK_ALGO_MERGES;
        t->byte_level = 1;
        int64_t kp = nb_gguf_find_key(g, "tokenizer.ggml.pre");
        const char *pre = kp >= 0 ? nb_gguf_kv_str(g, kp, NULL) : NULL;
        if ((s = tok_set_pre_by_name(t, pre ? pre : "default")) != NB_OK) return s;
        /* llama.cpp adds BOS by default for these pre-tokenizers only */
        t->add_bos = !strcmp(t->pre_name, "llama3") || !strcmp(t->pre_name, "llama-v3") ||
                     !strcmp(t->pre_name, "llama-bpe") || !strcmp(t->pre_name, "falcon3") ||
                     !strcmp(t->pre_name, "falcon-h1") || !strcmp(t->pre_name, "pixtral") ||
                     !strcmp(t->pre_name, "midm-2.0") || !strcmp(t->pre_name, "lfm2") ||
                     !strcmp(t->pre_name, "tekken");
        t->bos = kv_token(g, "tokenizer.ggml.bos_token_id", -1, nv);
        t->eos = kv_token(g, "tokenizer.ggml.eos_token_id", -1, nv);
        t->unk = kv_token(g, "tokenizer.ggml.unknown_token_id", -1, nv);
        int64_t kmg = nb_gguf_find_key(g, "tokenizer.ggml.merges");
        if (kmg < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "the GGUF has no tokenizer.ggml.merges");
        if (nb_gguf_kv_type(g, kmg) != NB_GGUF_ARRAY || nb_gguf_arr_type(g, kmg) != NB_GGUF_STRING)
            return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.merges is not an array of strings");
        int64_t nm = nb_gguf_arr_count(g, kmg);
        if ((s = tok_reserve_merges(t, nm)) != NB_OK) return s;
        for (int64_t i = 0; i < nm; i++) {
            uint64_t len = 0;
            const char *m = nb_gguf_arr_str(g, kmg, i, &len);
            const char *sp = len > 1 ? memchr(m + 1, ' ', (size_t)len - 1) : NULL;
            if (!sp) return nb_fail(ctx, NB_ERR_FORMAT, "tokenizer.ggml.merges[%lld] is not two tokens", (long long)i);
            size_t al = (size_t)(sp - m);
            s = tok_add_merge(t, m, al, sp + 1, (size_t)len - al - 1, (int32_t)i);
            /* a merge that cannot make a token never changes llama.cpp's output either: skip it */
            if (s == NB_ERR_FORMAT) {
                nb_ctx_clear_error(ctx);
                continue;
            }
            if (s != NB_OK) return s;
        }
        snprintf(t->kind, sizeof(t->kind), "byte-bpe");
    }
    if (t->unk >= 0 && t->ent[t->unk].type == NB_TOKEN_NORMAL) t->ent[t->unk].type = NB_TOKEN_UNKNOWN;
    t->pad = kv_token(g, "tokenizer.ggml.padding_token_id", -1, nv);
    /* what a tokenizer.json written from this one needs: the context length and the chat template */
    int64_t ka = nb_gguf_find_key(g, "general.architecture");
    const char *arch = ka >= 0 ? nb_gguf_kv_str(g, ka, NULL) : NULL;
    if (arch && strlen(arch) < 200) {
        char key[256];
        snprintf(key, sizeof(key), "%s.context_length", arch);
        int64_t cl = kv_int(g, key, 0);
        t->max_len = cl > 0 ? cl : 0;
    }
    int64_t kc = nb_gguf_find_key(g, "tokenizer.chat_template");
    if (kc >= 0 && nb_gguf_kv_type(g, kc) == NB_GGUF_STRING) {
        uint64_t cl = 0;
        const char *ct = nb_gguf_kv_str(g, kc, &cl);
        if (ct && (s = tok_set_chat_template(t, ct, (size_t)cl)) != NB_OK) return s;
    }
    t->source = TOK_SRC_GGUF;
    if (nb_gguf_find_key(g, "tokenizer.ggml.add_bos_token") >= 0)
        t->add_bos = kv_int(g, "tokenizer.ggml.add_bos_token", 0) != 0;
    t->add_eos = kv_int(g, "tokenizer.ggml.add_eos_token", 0) != 0;
    return tok_finish(t);
}

nb_status nb_tokenizer_from_gguf(nb_ctx *ctx, nb_gguf *g, nb_tokenizer **out) {
    if (!g || !out) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_from_gguf: bad arguments");
    *out = NULL;
    nb_tokenizer *t = NULL;
    nb_status s = tok_new(ctx, &t);
    if (s != NB_OK) return s;
    if ((s = load_gguf(t, g)) != NB_OK) {
        nb_tokenizer_free(t);
        return s;
    }
    *out = t;
    return NB_OK;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

nb_status nb_tokenizer_load(nb_ctx *ctx, const char *path, nb_tokenizer **out) {
    if (!path || !out) return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_load: bad arguments");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char p[4200];
        snprintf(p, sizeof(p), "%s/tokenizer.json", path);
        if (stat(p, &st) == 0) return nb_tokenizer_from_json(ctx, path, out);
        snprintf(p, sizeof(p), "%s/tokenizer.model", path);
        if (stat(p, &st) == 0) return nb_tokenizer_from_spm(ctx, p, out);
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "%s has neither tokenizer.json nor tokenizer.model", path);
    }
    if (ends_with(path, ".gguf")) {
        nb_gguf *g = NULL;
        nb_status s = nb_gguf_open(ctx, path, &g);
        if (s != NB_OK) return s;
        s = nb_tokenizer_from_gguf(ctx, g, out);
        nb_gguf_close(g);
        return s;
    }
    if (ends_with(path, ".model")) return nb_tokenizer_from_spm(ctx, path, out);
    return nb_tokenizer_from_json(ctx, path, out);
}

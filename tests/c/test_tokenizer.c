/* Tokenizer tests that need no shared data: HF tokenizers' ids for small trained tokenizers covering
 * every tokenizer.json feature we map (tests/golden/gen_tokenizer_golden.py), decode round trips,
 * special-token flags, buffers, and the named errors for bad or unsupported files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static int ids_equal(const nb_tokens *t, const cJSON *arr) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != t->n) return 0;
    for (int64_t i = 0; i < t->n; i++)
        if ((int32_t)cJSON_GetArrayItem(arr, (int)i)->valuedouble != t->ids[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const nb_tokens *t, const cJSON *arr) {
    fprintf(stderr, "  %s expected:", what);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) fprintf(stderr, " %d", (int)it->valuedouble);
    fprintf(stderr, "\n  %s got:     ", what);
    for (int64_t i = 0; i < t->n; i++) fprintf(stderr, " %d", t->ids[i]);
    fprintf(stderr, "\n");
}

/* Every synthetic tokenizer against HF tokenizers' ids, with and without special handling. */
static void test_golden(nb_ctx *ctx) {
    size_t n = 0;
    char *js = nbt_slurp(nbt_src("tests/golden/data/tokenizers/cases.json"), &n);
    CHECK(js != NULL);
    if (!js) return;
    cJSON *root = cJSON_ParseWithLength(js, n);
    CHECK(root != NULL);
    const cJSON *c;
    int total = 0, ok = 0, ok_sp = 0, ok_np = 0, ok_dec = 0;
    char cur[64] = "";
    nb_tokenizer *tok = NULL;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "tok")->valuestring;
        char dir[512];
        snprintf(dir, sizeof(dir), "tests/golden/data/tokenizers/%s", name);
        if (access(nbt_src(dir), F_OK) != 0) continue;    /* the real-vocabulary cases: test_tokenizer_vocab.c */
        if (strcmp(cur, name) != 0) {
            nb_tokenizer_free(tok);
            tok = NULL;
            snprintf(cur, sizeof(cur), "%s", name);
            CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_src(dir), &tok));
        }
        if (!tok) continue;
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int64_t len = (int64_t)strlen(text);
        nb_tokens a = {0}, b = {0}, d = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, text, len, NB_TOK_PARSE_SPECIAL, &a));
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, text, len, NB_TOK_PARSE_SPECIAL | NB_TOK_ADD_SPECIAL, &b));
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, text, len, 0, &d));
        total++;
        int e1 = ids_equal(&a, cJSON_GetObjectItem(c, "ids"));
        int e2 = ids_equal(&b, cJSON_GetObjectItem(c, "ids_special"));
        int e3 = ids_equal(&d, cJSON_GetObjectItem(c, "ids_noparse"));
        ok += e1;
        ok_sp += e2;
        ok_np += e3;
        if (!e1 || !e2 || !e3) {
            fprintf(stderr, "%s: [%s]\n", name, text);
            if (!e1) print_ids("ids", &a, cJSON_GetObjectItem(c, "ids"));
            if (!e2) print_ids("ids_special", &b, cJSON_GetObjectItem(c, "ids_special"));
            if (!e3) print_ids("ids_noparse", &d, cJSON_GetObjectItem(c, "ids_noparse"));
        }
        /* decode of HF's ids gives HF's text */
        const cJSON *ids = cJSON_GetObjectItem(c, "ids");
        int nid = cJSON_GetArraySize(ids);
        int32_t *v = malloc(sizeof(int32_t) * (size_t)(nid + 1));
        for (int i = 0; i < nid; i++) v[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
        char buf[4096];
        int64_t nd = -1;
        CHECK_OK(ctx, nb_tokenizer_decode(ctx, tok, v, nid, 0, buf, sizeof(buf), &nd));
        const char *want = cJSON_GetObjectItem(c, "decoded")->valuestring;
        int de = nd == (int64_t)strlen(want) && memcmp(buf, want, (size_t)nd) == 0;
        ok_dec += de;
        if (!de) fprintf(stderr, "%s: decode [%s] gave [%.*s], HF [%s]\n", name, text, (int)nd, buf, want);
        free(v);
        nb_tokens_free(&a);
        nb_tokens_free(&b);
        nb_tokens_free(&d);
    }
    nb_tokenizer_free(tok);
    printf("golden tokenizers: %d/%d ids, %d/%d with BOS/EOS, %d/%d without special parsing, %d/%d decodes equal to HF\n",
           ok, total, ok_sp, total, ok_np, total, ok_dec, total);
    CHECK(total >= 140);
    CHECK_EQ_INT(ok, total);
    CHECK_EQ_INT(ok_sp, total);
    CHECK_EQ_INT(ok_np, total);
    CHECK_EQ_INT(ok_dec, total);
    cJSON_Delete(root);
    free(js);
}

/* Byte-level tokenizers are lossless: decode(encode(x)) == x, invalid UTF-8 included. */
static void test_roundtrip(nb_ctx *ctx) {
    static const char *const texts[] = {"Hello world", "  two  spaces\t\ttabs\n\n\nlines  ", "caf\xc3\xa9 \xe2\x82\xac 100",
                                        "bad \xff\xfe utf8 \xc3", "\xe6\x88\x91\xe6\x83\xb3 \xf0\x9f\xa6\x99", "", " "};
    nb_tokenizer *tok = NULL;
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_src("tests/golden/data/tokenizers/split_prev_digits"), &tok));
    if (!tok) return;
    int ok = 0, n = (int)(sizeof(texts) / sizeof(texts[0]));
    for (int i = 0; i < n; i++) {
        nb_tokens t = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, texts[i], (int64_t)strlen(texts[i]), 0, &t));
        char buf[512];
        int64_t nd = 0;
        CHECK_OK(ctx, nb_tokenizer_decode(ctx, tok, t.ids, t.n, 0, buf, sizeof(buf), &nd));
        ok += nd == (int64_t)strlen(texts[i]) && memcmp(buf, texts[i], (size_t)nd) == 0;
        nb_tokens_free(&t);
    }
    CHECK_EQ_INT(ok, n);
    nb_tokenizer_free(tok);
}

/* Flags, accessors, buffers. */
static void test_api(nb_ctx *ctx) {
    nb_tokenizer *tok = NULL;
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_src("tests/golden/data/tokenizers/spm_norm"), &tok));
    if (!tok) return;
    CHECK(strcmp(nb_tokenizer_kind(tok), "bpe") == 0);
    int32_t start = nb_tokenizer_find(tok, "<|start|>", 9), end = nb_tokenizer_find(tok, "<|end|>", 7);
    CHECK(start >= 0 && end >= 0);
    /* the post_processor template decides BOS/EOS when there is no tokenizer_config.json */
    CHECK_EQ_INT(nb_tokenizer_bos(tok), start);
    CHECK_EQ_INT(nb_tokenizer_eos(tok), end);
    CHECK_EQ_INT(nb_tokenizer_add_bos(tok), 1);
    CHECK_EQ_INT(nb_tokenizer_add_eos(tok), 1);
    CHECK(nb_tokenizer_is_eog(tok, end));
    CHECK(!nb_tokenizer_is_eog(tok, start));
    CHECK_EQ_INT(nb_tokenizer_token_type(tok, start), NB_TOKEN_CONTROL);
    /* a non-special added token with normalized=true is spelled as HF spells it: normalized */
    CHECK_EQ_INT(nb_tokenizer_find(tok, "<tool>", 6), -1);
    CHECK_EQ_INT(nb_tokenizer_token_type(tok, nb_tokenizer_find(tok, "\xe2\x96\x81<tool>", 9)), NB_TOKEN_USER_DEFINED);
    int32_t nl = nb_tokenizer_find(tok, "<0x0A>", 6);
    CHECK_EQ_INT(nb_tokenizer_token_type(tok, nl), NB_TOKEN_BYTE);
    uint32_t bl = 0;
    const char *bytes = nb_tokenizer_token_bytes(tok, nl, &bl);
    CHECK(bl == 1 && bytes[0] == '\n');
    CHECK(nb_tokenizer_token_text(tok, -1, &bl) == NULL && bl == 0);
    CHECK_EQ_INT(nb_tokenizer_token_type(tok, nb_tokenizer_vocab_size(tok)), NB_TOKEN_UNDEFINED);

    /* encode_into: too small a buffer says how much is needed */
    const char *text = "Hello world, hello tokens";
    int32_t small[3], big[64];
    int64_t need = 0, got = 0;
    CHECK_FAIL(ctx, nb_tokenizer_encode_into(ctx, tok, text, (int64_t)strlen(text), NB_TOK_ADD_SPECIAL, small, 3, &need),
               NB_ERR_SHAPE, "needs");
    CHECK(need > 3);
    CHECK_OK(ctx, nb_tokenizer_encode_into(ctx, tok, text, (int64_t)strlen(text), NB_TOK_ADD_SPECIAL, big, 64, &got));
    CHECK_EQ_INT(got, need);
    CHECK_EQ_INT(big[0], start);
    CHECK_EQ_INT(big[got - 1], end);
    CHECK(memcmp(small, big, sizeof(small)) == 0);
    /* appending: a second encode adds after the first */
    nb_tokens t = {0};
    CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, text, (int64_t)strlen(text), NB_TOK_ADD_SPECIAL, &t));
    CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, text, (int64_t)strlen(text), NB_TOK_ADD_SPECIAL, &t));
    CHECK_EQ_INT(t.n, 2 * got);
    CHECK(t.n == 2 * got && memcmp(t.ids + got, big, (size_t)got * sizeof(int32_t)) == 0);

    /* decode: size query, skip_special, too small a buffer, bad ids */
    int64_t nd = -1;
    CHECK_OK(ctx, nb_tokenizer_decode(ctx, tok, big, got, 0, NULL, 0, &nd));
    char buf[256];
    int64_t nd2 = -1;
    CHECK_OK(ctx, nb_tokenizer_decode(ctx, tok, big, got, 0, buf, sizeof(buf), &nd2));
    CHECK_EQ_INT(nd, nd2);
    CHECK(strcmp(buf, "<|start|> Hello world, hello tokens<|end|>") == 0);
    CHECK_OK(ctx, nb_tokenizer_decode(ctx, tok, big, got, NB_TOK_SKIP_SPECIAL, buf, sizeof(buf), &nd2));
    CHECK(strcmp(buf, text) == 0);
    CHECK_FAIL(ctx, nb_tokenizer_decode(ctx, tok, big, got, 0, buf, 5, &nd2), NB_ERR_SHAPE, "buffer holds 5");
    CHECK_EQ_INT(nd2, nd);
    int32_t bad[2] = {big[1], 1 << 30};
    CHECK_FAIL(ctx, nb_tokenizer_decode(ctx, tok, bad, 2, 0, buf, sizeof(buf), &nd2), NB_ERR_INVALID,
               "outside the vocabulary");
    CHECK_FAIL(ctx, nb_tokenizer_encode(ctx, tok, NULL, 5, 0, &t), NB_ERR_INVALID, "bad arguments");
    nb_tokens_free(&t);
    CHECK(t.ids == NULL && t.n == 0);
    nb_tokenizer_free(tok);
}

static const char *write_tmp(const char *dir, const char *name, const char *data, size_t n) {
    static char path[8][1024];
    static int k = 0;
    char *p = path[k++ & 7];
    snprintf(p, 1024, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
    return p;
}

static void test_errors(nb_ctx *ctx) {
    nb_tokenizer *tok = NULL;
    char dir[] = "/tmp/nbtok_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, "/nonexistent/tokenizer.json", &tok), NB_ERR_IO, "/nonexistent/tokenizer.json");
    CHECK_FAIL(ctx, nb_tokenizer_load(ctx, "/nonexistent/model.gguf", &tok), NB_ERR_IO, "/nonexistent/model.gguf");
    CHECK_FAIL(ctx, nb_tokenizer_from_spm(ctx, "/nonexistent/tokenizer.model", &tok), NB_ERR_IO, "cannot open");
    CHECK_FAIL(ctx, nb_tokenizer_load(ctx, dir, &tok), NB_ERR_NOT_FOUND, "neither tokenizer.json nor tokenizer.model");
    const char *p = write_tmp(dir, "bad.json", "{\"model\": {\"type\": \"BPE\", ", 27);
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_FORMAT, "is not valid JSON");
    const char *uni = "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]]}}";
    p = write_tmp(dir, "uni.json", uni, strlen(uni));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_UNSUPPORTED, "tokenizer model type (only BPE is) 'Unigram'");
    const char *wp = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}";
    p = write_tmp(dir, "wp.json", wp, strlen(wp));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_UNSUPPORTED, "'WordPiece'");
    const char *bert = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
                       " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}";
    p = write_tmp(dir, "bert.json", bert, strlen(bert));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_UNSUPPORTED, "pre_tokenizer 'BertPreTokenizer'");
    const char *lower = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                        " \"normalizer\": {\"type\": \"Lowercase\"}}";
    p = write_tmp(dir, "lower.json", lower, strlen(lower));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_UNSUPPORTED, "normalizer 'Lowercase'");
    const char *merge = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}";
    p = write_tmp(dir, "merge.json", merge, strlen(merge));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_FORMAT, "the merged token is not in the vocabulary");
    const char *re = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}}";
    p = write_tmp(dir, "re.json", re, strlen(re));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_FORMAT, "does not compile");
    const char *novocab = "{\"model\": {\"type\": \"BPE\", \"merges\": []}}";
    p = write_tmp(dir, "novocab.json", novocab, strlen(novocab));
    CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_FORMAT, "model.vocab is missing");


    /* ids bounded by what the file declares (vocab entries + added_tokens) before the token table is
     * allocated: the 66-byte file below once asked for 12.9 GB. A fresh context's peak shows what the
     * refused load allocated: the tokenizer struct and a table rounded up to 1024 entries (about
     * 1024 x (16 + 1) bytes), far below 1 MiB; the id 333333330 would need 5.7 GB. */
    const char *big = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":333333330},\"merges\":[]}}";
    CHECK_EQ_INT(strlen(big), 66);
    p = write_tmp(dir, "bigid.json", big, strlen(big));
    nb_ctx *fresh = NULL;
    CHECK_OK(ctx, nb_ctx_new(1, &fresh));
    if (fresh) {
        char want[600];
        snprintf(want, sizeof want, "%s: vocab entry \"b\" has id 333333330, but the file declares only 2 tokens "
                 "(vocab entries + added_tokens)", p);
        CHECK_FAIL(fresh, nb_tokenizer_from_json(fresh, p, &tok), NB_ERR_FORMAT, want);
        CHECK_MSG(strcmp(nb_ctx_last_error(fresh), want) == 0, "message: %s", nb_ctx_last_error(fresh));
        nb_mem_stats fm;
        nb_ctx_mem(fresh, &fm);
        CHECK_MSG(fm.peak_bytes < (1 << 20), "peak %lld bytes", (long long)fm.peak_bytes);
        nb_ctx_release(fresh);
    }
    /* an added token past the vocabulary counts as declared; one past the total does not */
    const char *added = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]},"
                        "\"added_tokens\":[{\"id\":2,\"content\":\"<s>\",\"special\":true}]}";
    p = write_tmp(dir, "added.json", added, strlen(added));
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, p, &tok));
    if (tok) CHECK_EQ_INT(nb_tokenizer_vocab_size(tok), 3);
    nb_tokenizer_free(tok);
    tok = NULL;
    /* an id past the declared total; ids that are no int32 (fractional, or a double whose cast would be
     * undefined behaviour); a post_processor id of 1e300, which is no id either */
    static const struct { const char *name, *json, *err; } idcases[] = {
        {"added5.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]},"
                        "\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true}]}",
         "added token \"<s>\" has id 5, but the file declares only 3 tokens (vocab entries + added_tokens)"},
        {"frac.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0.5},\"merges\":[]}}",
         "vocab entry \"b\" has no valid id"},
        {"huge.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                      "\"added_tokens\":[{\"id\":1e300,\"content\":\"<s>\"}]}",
         "an added_tokens entry lacks id or content"},
        {"tmpl.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"<s>\":0,\"a\":1},\"merges\":[]},"
                      "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                      "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[1e300]}}}}",
         "tmpl.json: post_processor token '<s>' is unknown"},
    };
    for (size_t i = 0; i < sizeof idcases / sizeof idcases[0]; i++) {
        p = write_tmp(dir, idcases[i].name, idcases[i].json, strlen(idcases[i].json));
        CHECK_FAIL(ctx, nb_tokenizer_from_json(ctx, p, &tok), NB_ERR_FORMAT, idcases[i].err);
    }

    /* tokenizer.model: garbage, a unigram model, a BPE model with a charsmap */
    p = write_tmp(dir, "junk.model", "\x0a\xff\xff\xff", 4);
    CHECK_FAIL(ctx, nb_tokenizer_from_spm(ctx, p, &tok), NB_ERR_FORMAT, "is not a SentencePiece model");
    /* pieces {"<unk>" 0 UNKNOWN}, {"a" -1}; trainer_spec model_type=UNIGRAM(1) */
    static const char unigram[] = "\x0a\x09\x0a\x05<unk>\x18\x02\x0a\x08\x0a\x01" "a\x15\x00\x00\x80\xbf\x12\x02\x18\x01";
    p = write_tmp(dir, "uni.model", unigram, sizeof(unigram) - 1);
    CHECK_FAIL(ctx, nb_tokenizer_from_spm(ctx, p, &tok), NB_ERR_UNSUPPORTED, "model type UNIGRAM is not supported");
    static const char charsmap[] = "\x0a\x08\x0a\x01" "a\x15\x00\x00\x80\xbf\x12\x02\x18\x02"
                                   "\x1a\x0b\x0a\x05nfkc!\x12\x02xy";
    p = write_tmp(dir, "nfkc.model", charsmap, sizeof(charsmap) - 1);
    CHECK_FAIL(ctx, nb_tokenizer_from_spm(ctx, p, &tok), NB_ERR_UNSUPPORTED, "normalizer 'nfkc!'");
    /* and a valid two-piece BPE model loads and tokenizes: "ab" -> "▁ab"? no: pieces a, b, ab only */
    static const char tiny[] = "\x0a\x09\x0a\x05<unk>\x18\x02"          /* 0 <unk> UNKNOWN */
                               "\x0a\x08\x0a\x01" "a\x15\x00\x00\x80\xbf"  /* 1 a   -1 */
                               "\x0a\x08\x0a\x01" "b\x15\x00\x00\x00\xc0"  /* 2 b   -2 */
                               "\x0a\x09\x0a\x02" "ab\x15\x00\x00\x40\xc0" /* 3 ab  -3 */
                               "\x12\x05\x18\x02\x98\x02\x00"            /* BPE, byte_fallback 0 */
                               "\x1a\x02\x18\x00";                       /* add_dummy_prefix false */
    p = write_tmp(dir, "tiny.model", tiny, sizeof(tiny) - 1);
    CHECK_OK(ctx, nb_tokenizer_from_spm(ctx, p, &tok));
    if (tok) {
        nb_tokens t = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, "abxa", 4, 0, &t));
        CHECK(t.n == 3 && t.ids[0] == 3 && t.ids[1] == 0 && t.ids[2] == 1);
        CHECK(strcmp(nb_tokenizer_kind(tok), "spm") == 0);
        nb_tokens_free(&t);
        nb_tokenizer_free(tok);
        tok = NULL;
    }

    /* GGUF: no tokenizer, an unsupported model, an unknown pre-tokenizer */
    struct { const char *name, *model, *pre, *err; nb_status code; } gcases[] = {
        {"none.gguf", NULL, NULL, "tokenizer.ggml.model is missing", NB_ERR_NOT_FOUND},
        {"bert.gguf", "bert", NULL, "GGUF tokenizer model 'bert' is not supported", NB_ERR_UNSUPPORTED},
        {"pre.gguf", "gpt2", "my-new-pre", "GGUF pre-tokenizer 'my-new-pre' is not supported", NB_ERR_UNSUPPORTED},
    };
    for (int i = 0; i < 3; i++) {
        unsigned char g[1024];
        size_t n = 0;
        uint64_t nkv = 1 + (gcases[i].model != NULL) * 3 + (gcases[i].pre != NULL);
#define PUT(ptr, len) do { memcpy(g + n, (ptr), (len)); n += (len); } while (0)
#define PUT_U32(v) do { uint32_t _v = (v); PUT(&_v, 4); } while (0)
#define PUT_U64(v) do { uint64_t _v = (v); PUT(&_v, 8); } while (0)
#define PUT_STR(s) do { PUT_U64(strlen(s)); PUT((s), strlen(s)); } while (0)
        PUT("GGUF", 4);
        PUT_U32(3);
        PUT_U64(0);
        PUT_U64(nkv);
        PUT_STR("general.architecture");
        PUT_U32(8);
        PUT_STR("llama");
        if (gcases[i].model) {
            PUT_STR("tokenizer.ggml.model");
            PUT_U32(8);
            PUT_STR(gcases[i].model);
            PUT_STR("tokenizer.ggml.tokens");
            PUT_U32(9);
            PUT_U32(8);
            PUT_U64(3);
            PUT_STR("a");
            PUT_STR("b");
            PUT_STR("ab");
            PUT_STR("tokenizer.ggml.merges");
            PUT_U32(9);
            PUT_U32(8);
            PUT_U64(1);
            PUT_STR("a b");
        }
        if (gcases[i].pre) {
            PUT_STR("tokenizer.ggml.pre");
            PUT_U32(8);
            PUT_STR(gcases[i].pre);
        }
        while (n % 32) g[n++] = 0;
        p = write_tmp(dir, gcases[i].name, (const char *)g, n);
        nb_gguf *gg = NULL;
        CHECK_OK(ctx, nb_gguf_open(ctx, p, &gg));
        if (gg) {
            CHECK_FAIL(ctx, nb_tokenizer_from_gguf(ctx, gg, &tok), gcases[i].code, gcases[i].err);
            nb_gguf_close(gg);
        }
        CHECK_FAIL(ctx, nb_tokenizer_load(ctx, p, &tok), gcases[i].code, gcases[i].err);
        CHECK(tok == NULL);
    }
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx) != NB_OK) return 1;
    test_golden(ctx);
    test_roundtrip(ctx);
    test_api(ctx);
    test_errors(ctx);
    nb_mem_stats ms;
    nb_ctx_mem(ctx, &ms);
    CHECK_EQ_INT(ms.live_bytes, 0);   /* every tokenizer freed everything it counted */
    nb_ctx_release(ctx);
    return nbt_done("test_tokenizer");
}

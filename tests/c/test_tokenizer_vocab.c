/* Tokenizers on real vocabularies from ../shared/data (skipped when it is absent): llama.cpp's vocab
 * conformance vectors for llama-spm, qwen2 and gpt-2 (GGUF, and the same vocabularies as
 * tokenizer.json), llama2-32k tokenizer.json against its tokenizer.model, stories260K on the
 * TinyStories validation text, and HF's ids for special tokens on these vocabularies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static int same_ids(const nb_tokens *a, const nb_tokens *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int32_t)) == 0);
}

/* Run one .inp/.out pair: returns the number of strings whose ids are equal (and counts round trips). */
static int run_vectors(nb_ctx *ctx, const nb_tokenizer *tok, const char *name, int *n_strings, int *n_roundtrip) {
    char p[256];
    snprintf(p, sizeof(p), "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf.inp", name);
    size_t ni = 0, no = 0;
    char *inp = nbt_slurp(nbt_data(p), &ni);
    snprintf(p, sizeof(p), "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf.out", name);
    char *outs = nbt_slurp(nbt_data(p), &no);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = inp, *o = outs;
    int equal = 0, total = 0, rt = 0;
    for (;;) {
        char *e = strstr(s, sep);
        char *oe = strchr(o, '\n');
        if (!e || !oe) break;
        *e = 0;
        *oe = 0;
        nb_tokens t = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, s, (int64_t)strlen(s), 0, &t));
        int32_t want[1024];
        int nw = 0;
        for (char *q = o; *q && nw < 1024;) {
            want[nw++] = (int32_t)strtol(q, &q, 10);
            while (*q == ' ') q++;
        }
        int eq = nw == t.n && (nw == 0 || memcmp(want, t.ids, (size_t)nw * sizeof(int32_t)) == 0);
        if (!eq) fprintf(stderr, "%s: ids differ for [%s]\n", name, s);
        equal += eq;
        total++;
        char buf[8192];
        int64_t nd = 0;
        CHECK_OK(ctx, nb_tokenizer_decode(ctx, tok, t.ids, t.n, 0, buf, sizeof(buf), &nd));
        rt += nd == (int64_t)strlen(s) && memcmp(buf, s, (size_t)nd) == 0;
        nb_tokens_free(&t);
        s = e + strlen(sep);
        o = oe + 1;
    }
    free(inp);
    free(outs);
    *n_strings = total;
    *n_roundtrip = rt;
    return equal;
}

/* The GGUF vocabulary written back as a tokenizer.json with the model's real HF pre-tokenizer, so
 * the tokenizer.json byte-level path is held to the same vectors. */
static const char *gguf_to_json(nb_ctx *ctx, const char *gguf_path, const char *pre_json, const char *dir) {
    nb_gguf *g = NULL;
    CHECK_OK(ctx, nb_gguf_open(ctx, gguf_path, &g));
    if (!g) return NULL;
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    int64_t kt = nb_gguf_find_key(g, "tokenizer.ggml.tokens"), ky = nb_gguf_find_key(g, "tokenizer.ggml.token_type");
    int64_t km = nb_gguf_find_key(g, "tokenizer.ggml.merges");
    const int32_t *types = nb_gguf_arr_data(g, ky);
    for (int64_t i = 0; i < nb_gguf_arr_count(g, kt); i++) {
        const char *s = nb_gguf_arr_str(g, kt, i, NULL);
        if (types[i] == NB_TOKEN_CONTROL || types[i] == NB_TOKEN_USER_DEFINED) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", s);
            cJSON_AddBoolToObject(a, "special", types[i] == NB_TOKEN_CONTROL);
            cJSON_AddBoolToObject(a, "normalized", 0);
            cJSON_AddItemToArray(added, a);
        } else {
            cJSON_AddNumberToObject(vocab, s, (double)i);
        }
    }
    for (int64_t i = 0; i < nb_gguf_arr_count(g, km); i++)
        cJSON_AddItemToArray(merges, cJSON_CreateString(nb_gguf_arr_str(g, km, i, NULL)));
    nb_gguf_close(g);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(pre_json));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    static char path[1024];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    fwrite(txt, 1, strlen(txt), f);
    fclose(f);
    free(txt);
    return path;
}

static void test_vectors(nb_ctx *ctx) {
    static const char *const names[] = {"llama-spm", "qwen2", "gpt-2"};
    for (int k = 0; k < 3; k++) {
        char p[256];
        snprintf(p, sizeof(p), "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf", names[k]);
        nb_tokenizer *tok = NULL;
        CHECK_OK(ctx, nb_tokenizer_load(ctx, nbt_data(p), &tok));
        if (!tok) continue;
        int total = 0, rt = 0;
        int eq = run_vectors(ctx, tok, names[k], &total, &rt);
        printf("GGUF %-9s (%s, pre %s): %d/%d strings equal, %d/%d decode round trips\n", names[k],
               nb_tokenizer_kind(tok), nb_tokenizer_pre(tok), eq, total, rt, total);
        CHECK_EQ_INT(total, 46);
        CHECK_EQ_INT(eq, total);
        CHECK_EQ_INT(rt, total);
        nb_tokenizer_free(tok);
    }
    /* the same vocabularies as tokenizer.json */
    char dir[] = "/tmp/nbtokv_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    static const char *const pres[] = {
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]}",
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}"};
    for (int k = 1; k < 3; k++) {
        char p[256];
        snprintf(p, sizeof(p), "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf", names[k]);
        const char *jp = gguf_to_json(ctx, nbt_data(p), pres[k - 1], dir);
        nb_tokenizer *tok = NULL;
        CHECK_OK(ctx, nb_tokenizer_from_json(ctx, jp, &tok));
        if (!tok) continue;
        int total = 0, rt = 0;
        int eq = run_vectors(ctx, tok, names[k], &total, &rt);
        printf("tokenizer.json %-9s (%s): %d/%d strings equal, %d/%d decode round trips\n", names[k],
               nb_tokenizer_kind(tok), eq, total, rt, total);
        CHECK_EQ_INT(total, 46);
        CHECK_EQ_INT(eq, total);
        CHECK_EQ_INT(rt, total);
        nb_tokenizer_free(tok);
        unlink(jp);
    }
    rmdir(dir);
    /* Llama-2's own tokenizer.json on the llama-spm vectors */
    nb_tokenizer *tok = NULL;
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_data("tokenizers/llama2-32k"), &tok));
    if (tok) {
        int total = 0, rt = 0;
        int eq = run_vectors(ctx, tok, "llama-spm", &total, &rt);
        printf("llama2-32k tokenizer.json on llama-spm vectors: %d/%d strings equal, %d/%d round trips\n", eq, total,
               rt, total);
        CHECK_EQ_INT(eq, 46);
        CHECK_EQ_INT(rt, 46);
        nb_tokenizer_free(tok);
    }
}

/* llama2-32k: the tokenizer.json BPE (merge ranks) and the tokenizer.model (piece scores) agree. */
static void test_json_vs_model(nb_ctx *ctx) {
    nb_tokenizer *tj = NULL, *tm = NULL;
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_data("tokenizers/llama2-32k/tokenizer.json"), &tj));
    CHECK_OK(ctx, nb_tokenizer_load(ctx, nbt_data("tokenizers/llama2-32k/tokenizer.model"), &tm));
    if (!tj || !tm) return;
    CHECK(strcmp(nb_tokenizer_kind(tj), "bpe") == 0 && strcmp(nb_tokenizer_kind(tm), "spm") == 0);
    CHECK_EQ_INT(nb_tokenizer_vocab_size(tj), 32000);
    CHECK_EQ_INT(nb_tokenizer_vocab_size(tm), 32000);
    CHECK_EQ_INT(nb_tokenizer_bos(tj), 1);
    CHECK_EQ_INT(nb_tokenizer_bos(tm), 1);
    CHECK_EQ_INT(nb_tokenizer_eos(tm), 2);
    CHECK_EQ_INT(nb_tokenizer_unk(tm), 0);
    static const struct { const char *file; size_t limit; } texts[] = {
        {"text/brown_corpus_plain.txt", 100 * 1024}, {"text/tinystories_valid_head_776KiB.txt", 0}};
    for (int k = 0; k < 2; k++) {
        size_t n = 0;
        char *txt = nbt_slurp(nbt_data(texts[k].file), &n);
        if (texts[k].limit && n > texts[k].limit) {
            n = texts[k].limit;
            while (n > 0 && ((unsigned char)txt[n] & 0xC0) == 0x80) n--;   /* whole characters */
        }
        nb_tokens a = {0}, b = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tj, txt, (int64_t)n, NB_TOK_ADD_SPECIAL, &a));
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tm, txt, (int64_t)n, NB_TOK_ADD_SPECIAL, &b));
        int64_t same = 0;
        for (int64_t i = 0; i < a.n && i < b.n; i++) same += a.ids[i] == b.ids[i];
        printf("llama2-32k json vs model on %s (%zu bytes): %lld / %lld tokens, %lld equal\n", texts[k].file, n,
               (long long)a.n, (long long)b.n, (long long)same);
        CHECK(a.n > 1000);
        CHECK(same_ids(&a, &b));
        CHECK_EQ_INT(a.ids[0], 1);
        /* lossless: decode without BOS gives the text back */
        char *buf = malloc(n + 16);
        int64_t nd = 0;
        CHECK_OK(ctx, nb_tokenizer_decode(ctx, tm, b.ids, b.n, NB_TOK_SKIP_SPECIAL, buf, (int64_t)n + 16, &nd));
        CHECK(nd == (int64_t)n && memcmp(buf, txt, n) == 0);
        free(buf);
        nb_tokens_free(&a);
        nb_tokens_free(&b);
        free(txt);
    }
    nb_tokenizer_free(tj);
    nb_tokenizer_free(tm);
}

/* stories260K: 393,019 tokens with BOS on the validation text, the first 512 as llama.cpp's. */
static void test_stories(nb_ctx *ctx) {
    size_t n = 0, nr = 0;
    char *txt = nbt_slurp(nbt_data("text/tinystories_valid_head_776KiB.txt"), &n);
    char *ref = nbt_slurp(nbt_data("stories260K/reference/valid_chunk0.json"), &nr);
    cJSON *rj = cJSON_ParseWithLength(ref, nr);
    const cJSON *rids = cJSON_GetObjectItem(rj, "ids");
    CHECK_EQ_INT(cJSON_GetArraySize(rids), 512);
    nb_tokenizer *th = NULL, *tg = NULL;
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_data("stories260K/hf"), &th));
    CHECK_OK(ctx, nb_tokenizer_load(ctx, nbt_data("stories260K/stories260K.gguf"), &tg));
    nb_tokens a = {0}, b = {0};
    if (th) {
        CHECK_EQ_INT(nb_tokenizer_vocab_size(th), 512);
        CHECK_EQ_INT(nb_tokenizer_add_bos(th), 1);
        CHECK_EQ_INT(nb_tokenizer_add_eos(th), 0);
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, th, txt, (int64_t)n, NB_TOK_ADD_SPECIAL | NB_TOK_PARSE_SPECIAL, &a));
        printf("stories260K tokenizer.json: %lld tokens (BOS included) on the validation text\n", (long long)a.n);
        CHECK_EQ_INT(a.n, 393019);
        int first = a.n >= 512;
        for (int i = 0; first && i < 512; i++) first = a.ids[i] == (int32_t)cJSON_GetArrayItem(rids, i)->valuedouble;
        CHECK_MSG(first, "the first 512 ids differ from reference/valid_chunk0.json");
        char *buf = malloc(n + 16);
        int64_t nd = 0;
        CHECK_OK(ctx, nb_tokenizer_decode(ctx, th, a.ids, a.n, NB_TOK_SKIP_SPECIAL, buf, (int64_t)n + 16, &nd));
        CHECK(nd == (int64_t)n && memcmp(buf, txt, n) == 0);
        free(buf);
    }
    if (tg) {
        CHECK(strcmp(nb_tokenizer_kind(tg), "spm") == 0);
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tg, txt, (int64_t)n, NB_TOK_ADD_SPECIAL, &b));
        printf("stories260K GGUF: %lld tokens, %s the tokenizer.json ids\n", (long long)b.n,
               same_ids(&a, &b) ? "identical to" : "DIFFERENT from");
        CHECK(same_ids(&a, &b));
    }
    nb_tokens_free(&a);
    nb_tokens_free(&b);
    nb_tokenizer_free(th);
    nb_tokenizer_free(tg);
    cJSON_Delete(rj);
    free(ref);
    free(txt);
}

/* HF's ids with special tokens in the text, on the real vocabularies (tests/golden/gen_tokenizer_golden.py). */
static void test_special_golden(nb_ctx *ctx) {
    size_t n = 0;
    char *js = nbt_slurp(nbt_src("tests/golden/data/tokenizers/cases.json"), &n);
    CHECK(js != NULL);
    if (!js) return;
    cJSON *root = cJSON_ParseWithLength(js, n);
    nb_tokenizer *toks[3] = {NULL, NULL, NULL};
    static const char *const names[3] = {"llama2-32k", "qwen2", "gpt-2"};
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, nbt_data("tokenizers/llama2-32k"), &toks[0]));
    CHECK_OK(ctx, nb_tokenizer_load(ctx, nbt_data("tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf"), &toks[1]));
    CHECK_OK(ctx, nb_tokenizer_load(ctx, nbt_data("tokenizers/llama.cpp-vocab-tests/ggml-vocab-gpt-2.gguf"), &toks[2]));
    int total = 0, ok = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "tok")->valuestring;
        int k = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(name, names[i])) k = i;
        if (k < 0 || !toks[k]) continue;
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        static const char *const fields[3] = {"ids", "ids_special", "ids_noparse"};
        static const uint32_t flags[3] = {NB_TOK_PARSE_SPECIAL, NB_TOK_PARSE_SPECIAL | NB_TOK_ADD_SPECIAL, 0};
        int all = 1;
        for (int f = 0; f < 3; f++) {
            nb_tokens t = {0};
            CHECK_OK(ctx, nb_tokenizer_encode(ctx, toks[k], text, (int64_t)strlen(text), flags[f], &t));
            const cJSON *want = cJSON_GetObjectItem(c, fields[f]);
            int eq = cJSON_GetArraySize(want) == t.n;
            for (int64_t i = 0; eq && i < t.n; i++) eq = t.ids[i] == (int32_t)cJSON_GetArrayItem(want, (int)i)->valuedouble;
            if (!eq) fprintf(stderr, "%s %s differ for [%s]\n", name, fields[f], text);
            all &= eq;
            if (f == 0) {
                char buf[1024];
                int64_t nd = 0;
                CHECK_OK(ctx, nb_tokenizer_decode(ctx, toks[k], t.ids, t.n, 0, buf, sizeof(buf), &nd));
                const char *dec = cJSON_GetObjectItem(c, "decoded")->valuestring;
                int de = nd == (int64_t)strlen(dec) && memcmp(buf, dec, (size_t)nd) == 0;
                if (!de) fprintf(stderr, "%s decode of [%s] gave [%.*s], HF [%s]\n", name, text, (int)nd, buf, dec);
                all &= de;
            }
            nb_tokens_free(&t);
        }
        total++;
        ok += all;
    }
    printf("special tokens on real vocabularies: %d/%d cases equal to HF (ids, with BOS/EOS, unparsed, decode)\n", ok,
           total);
    CHECK_EQ_INT(total, 21);
    CHECK_EQ_INT(ok, total);
    /* end-of-generation tokens */
    if (toks[1]) {
        CHECK(nb_tokenizer_is_eog(toks[1], nb_tokenizer_find(toks[1], "<|im_end|>", 10)));
        CHECK(nb_tokenizer_is_eog(toks[1], nb_tokenizer_find(toks[1], "<|endoftext|>", 13)));
        CHECK(!nb_tokenizer_is_eog(toks[1], nb_tokenizer_find(toks[1], "<|im_start|>", 12)));
        CHECK_EQ_INT(nb_tokenizer_add_bos(toks[1]), 0);
    }
    if (toks[0]) {
        CHECK(nb_tokenizer_is_eog(toks[0], 2));
        CHECK(!nb_tokenizer_is_eog(toks[0], 1));
    }
    for (int i = 0; i < 3; i++) nb_tokenizer_free(toks[i]);
    cJSON_Delete(root);
    free(js);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx) != NB_OK) return 1;
    nbt_data("tokenizers/llama.cpp-vocab-tests/ggml-vocab-llama-spm.gguf");   /* skip early without shared data */
    test_vectors(ctx);
    test_json_vs_model(ctx);
    test_stories(ctx);
    test_special_golden(ctx);
    nb_mem_stats ms;
    nb_ctx_mem(ctx, &ms);
    CHECK_EQ_INT(ms.live_bytes, 0);
    nb_ctx_release(ctx);
    return nbt_done("test_tokenizer_vocab");
}

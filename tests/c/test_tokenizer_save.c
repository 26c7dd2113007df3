/* nb_tokenizer_save_json: GGUF tokenizers (byte-level BPE: gpt-2, qwen2, SmolLM2; SentencePiece by
 * scores: llama-spm, stories260K; Llama's tokenizer.model, also with remove_extra_whitespaces)
 * written as tokenizer.json and read back with
 * nb_tokenizer_from_json give the same vocabulary and the same ids on llama.cpp's test strings,
 * TinyStories and the Brown corpus, and decode back to the text. The SentencePiece merges equal
 * the ones in stories260K/hf/tokenizer.json (made by transformers' conversion). An export of
 * stories260K loaded from its GGUF ships that tokenizer. Skipped (77) without ../shared/data;
 * SmolLM2 is checked only when ~/.cache/nibble holds it (scripts/fetch-default-model.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nbtest.h"

static char tmpdir[256];

static cJSON *read_json(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    size_t n = 0;
    char *s = nbt_slurp(p, &n);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

/* The test texts: the strings of the three llama.cpp .inp files, then 200 KB of TinyStories and of
 * the Brown corpus (cut at a line end, so no UTF-8 character is split). */
typedef struct texts { char *s[256]; size_t n[256]; int count; } texts;

static void add_text(texts *tx, const char *s, size_t n) {
    if (tx->count >= 256) return;
    tx->s[tx->count] = malloc(n + 1);
    memcpy(tx->s[tx->count], s, n);
    tx->s[tx->count][n] = 0;
    tx->n[tx->count++] = n;
}

static void load_texts(texts *tx) {
    static const char *inp[] = {"gpt-2", "qwen2", "llama-spm"};
    const char *sep = "\n__ggml_vocab_test__\n";
    for (int k = 0; k < 3; k++) {
        char p[256];
        snprintf(p, sizeof p, "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf.inp", inp[k]);
        size_t n = 0;
        char *all = nbt_slurp(nbt_data(p), &n);
        for (char *s = all;;) {
            char *e = strstr(s, sep);
            if (!e) break;
            add_text(tx, s, (size_t)(e - s));
            s = e + strlen(sep);
        }
        free(all);
    }
    static const char *big[] = {"text/tinystories_valid_head_776KiB.txt", "text/brown_corpus_plain.txt"};
    for (int k = 0; k < 2; k++) {
        size_t n = 0;
        char *all = nbt_slurp(nbt_data(big[k]), &n);
        size_t cut = n < 200 * 1024 ? n : 200 * 1024;
        while (cut > 0 && all[cut - 1] != '\n') cut--;
        add_text(tx, all, cut);
        free(all);
    }
}

static int same_ids(const nb_tokens *a, const nb_tokens *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int32_t)) == 0);
}

/* Every added token between words, parsed as specials: the added-token path of both tokenizers. */
static char *specials_text(const nb_tokenizer *t, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    int used = 0;
    for (int32_t id = 0; id < nb_tokenizer_vocab_size(t) && used < 400; id++) {
        nb_token_type ty = nb_tokenizer_token_type(t, id);
        if (ty != NB_TOKEN_CONTROL && ty != NB_TOKEN_USER_DEFINED && ty != NB_TOKEN_UNKNOWN) continue;
        uint32_t tl = 0;
        const char *tt = nb_tokenizer_token_text(t, id, &tl);
        if (n + tl + 32 > cap) break;
        n += (size_t)snprintf(s + n, cap - n, used % 2 ? " word%d " : "x%d", used);
        memcpy(s + n, tt, tl);
        n += tl;
        used++;
    }
    s[n] = 0;
    *len = n;
    return s;
}

typedef struct case_result { int texts, equal, roundtrip, decode_same; } case_result;

/* Save the tokenizer at `gguf` (a GGUF or tokenizer.model) into dir, reload it, and compare
 * everything. `lossy`: the normalizer drops spaces, so decode is not a round trip. */
static void check_case_ex(nb_ctx *ctx, const char *name, const char *gguf, const texts *tx, int lossy) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    nb_tokenizer *g = NULL, *j = NULL;
    CHECK_OK(ctx, nb_tokenizer_load(ctx, gguf, &g));
    if (!g) return;
    CHECK_OK(ctx, nb_tokenizer_save_json(ctx, g, dir));
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, dir, &j));
    if (!j) {
        nb_tokenizer_free(g);
        return;
    }
    /* the vocabulary, token by token */
    int32_t nv = nb_tokenizer_vocab_size(g);
    CHECK_EQ_INT(nb_tokenizer_vocab_size(j), nv);
    CHECK_EQ_INT(nb_tokenizer_bos(j), nb_tokenizer_bos(g));
    CHECK_EQ_INT(nb_tokenizer_eos(j), nb_tokenizer_eos(g));
    CHECK_EQ_INT(nb_tokenizer_unk(j), nb_tokenizer_unk(g));
    CHECK_EQ_INT(nb_tokenizer_add_bos(j), nb_tokenizer_add_bos(g));
    CHECK_EQ_INT(nb_tokenizer_add_eos(j), nb_tokenizer_add_eos(g));
    int bad_text = 0, bad_bytes = 0, bad_type = 0, bad_eog = 0;
    for (int32_t id = 0; id < nv && id < nb_tokenizer_vocab_size(j); id++) {
        uint32_t la = 0, lb = 0;
        const char *a = nb_tokenizer_token_text(g, id, &la), *b = nb_tokenizer_token_text(j, id, &lb);
        bad_text += la != lb || memcmp(a, b, la) != 0;
        a = nb_tokenizer_token_bytes(g, id, &la);
        b = nb_tokenizer_token_bytes(j, id, &lb);
        bad_bytes += la != lb || memcmp(a, b, la) != 0;
        bad_type += nb_tokenizer_token_type(g, id) != nb_tokenizer_token_type(j, id);
        bad_eog += nb_tokenizer_is_eog(g, id) != nb_tokenizer_is_eog(j, id);
    }
    CHECK_MSG(bad_text == 0, "%s: %d token spellings differ", name, bad_text);
    CHECK_MSG(bad_bytes == 0, "%s: %d token byte strings differ", name, bad_bytes);
    CHECK_MSG(bad_type == 0, "%s: %d token types differ", name, bad_type);
    CHECK_MSG(bad_eog == 0, "%s: %d end-of-generation flags differ", name, bad_eog);

    /* ids on every text, three ways; decode gives the text back */
    static const uint32_t flag_sets[3] = {0, NB_TOK_ADD_SPECIAL, NB_TOK_ADD_SPECIAL | NB_TOK_PARSE_SPECIAL};
    case_result r = {0, 0, 0, 0};
    int64_t n_ids = 0;
    size_t sl = 0;
    char *spec = specials_text(g, &sl);
    for (int k = 0; k <= tx->count; k++) {
        const char *s = k < tx->count ? tx->s[k] : spec;
        int64_t n = k < tx->count ? (int64_t)tx->n[k] : (int64_t)sl;
        for (int f = 0; f < 3; f++) {
            nb_tokens a = {0}, b = {0};
            CHECK_OK(ctx, nb_tokenizer_encode(ctx, g, s, n, flag_sets[f], &a));
            CHECK_OK(ctx, nb_tokenizer_encode(ctx, j, s, n, flag_sets[f], &b));
            int eq = same_ids(&a, &b);
            if (!eq) fprintf(stderr, "%s: ids differ (flags %u) for [%.80s]\n", name, flag_sets[f], s);
            r.texts++;
            r.equal += eq;
            n_ids += b.n;
            if (f == 0) {
                int64_t need = 0, need_g = 0;
                CHECK_OK(ctx, nb_tokenizer_decode(ctx, j, b.ids, b.n, 0, NULL, 0, &need));
                char *out = malloc((size_t)need + 1), *out_g = malloc((size_t)need + 1);
                CHECK_OK(ctx, nb_tokenizer_decode(ctx, j, b.ids, b.n, 0, out, need + 1, &need));
                nb_status st = nb_tokenizer_decode(ctx, g, b.ids, b.n, 0, out_g, need + 1, &need_g);
                r.decode_same += st == NB_OK && need_g == need && memcmp(out, out_g, (size_t)need) == 0;
                /* the added-token text is not a round trip without PARSE_SPECIAL on encode */
                int rt = lossy || k == tx->count || (need == n && memcmp(out, s, (size_t)n) == 0);
                if (!rt) fprintf(stderr, "%s: decode does not give back [%.80s]\n", name, s);
                r.roundtrip += rt;
                free(out);
                free(out_g);
            }
            nb_tokens_free(&a);
            nb_tokens_free(&b);
        }
    }
    free(spec);
    CHECK_MSG(r.equal == r.texts, "%s: %d of %d encodings equal", name, r.equal, r.texts);
    CHECK_MSG(r.roundtrip == tx->count + 1, "%s: %d of %d texts round trip", name, r.roundtrip, tx->count + 1);
    CHECK_MSG(r.decode_same == tx->count + 1, "%s: %d of %d decodes equal", name, r.decode_same, tx->count + 1);
    printf("%s: %d encodings (%lld ids) equal to the source tokenizer's: %d; round trips %d/%d\n", name, r.texts,
           (long long)n_ids, r.equal, r.roundtrip, tx->count + 1);
    nb_tokenizer_free(j);
    nb_tokenizer_free(g);
}

static void check_case(nb_ctx *ctx, const char *name, const char *gguf, const texts *tx) {
    check_case_ex(ctx, name, gguf, tx, 0);
}

/* Llama's SentencePiece tokenizer.model, as is and with remove_extra_whitespaces switched on (a
 * byte of its NormalizerSpec flipped): the saved normalizer trims and folds spaces the same way. */
static void check_spm_model(nb_ctx *ctx, const texts *tx) {
    const char *model = nbt_data("tokenizers/llama2-32k/tokenizer.model");
    check_case(ctx, "llama2-32k", model, tx);
    size_t n = 0;
    char *d = nbt_slurp(model, &n);
    static const char spec[] = "identity\x12\x00\x18\x01\x20\x00";   /* ..., remove_extra_whitespaces: false */
    char *hit = NULL;
    for (size_t i = 0; d && i + sizeof(spec) - 1 <= n && !hit; i++)
        if (memcmp(d + i, spec, sizeof(spec) - 1) == 0) hit = d + i;
    CHECK(hit != NULL);
    if (!hit) {
        free(d);
        return;
    }
    hit[sizeof(spec) - 2] = 1;
    char path[512];
    snprintf(path, sizeof path, "%s/ws.model", tmpdir);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(d, 1, n, f);
        fclose(f);
    }
    free(d);
    check_case_ex(ctx, "llama2-32k-ws", path, tx, 1);
    /* it does fold: "  a   b  " is "▁a ▁b" */
    nb_tokenizer *j = NULL, *plain = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/llama2-32k-ws", tmpdir);
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, dir, &j));
    CHECK_OK(ctx, nb_tokenizer_load(ctx, model, &plain));
    if (j && plain) {
        nb_tokens a = {0}, b = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, j, "  a   b  ", 9, 0, &a));
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, plain, "a b", 3, 0, &b));
        CHECK(same_ids(&a, &b));
        CHECK_EQ_INT(a.n, 2);
        nb_tokens_free(&a);
        nb_tokens_free(&b);
    }
    nb_tokenizer_free(j);
    nb_tokenizer_free(plain);
}

/* llama.cpp's expected ids (.out, HF AutoTokenizer's) from the reloaded tokenizer.json. */
static void check_vectors(nb_ctx *ctx, const char *name) {
    char p[512], dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    nb_tokenizer *j = NULL;
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, dir, &j));
    if (!j) return;
    snprintf(p, sizeof p, "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf.inp", name);
    size_t ni = 0, no = 0;
    char *inp = nbt_slurp(nbt_data(p), &ni);
    snprintf(p, sizeof p, "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf.out", name);
    char *outs = nbt_slurp(nbt_data(p), &no);
    const char *sep = "\n__ggml_vocab_test__\n";
    int total = 0, equal = 0;
    for (char *s = inp, *o = outs;;) {
        char *e = strstr(s, sep), *oe = strchr(o, '\n');
        if (!e || !oe) break;
        *e = 0;
        *oe = 0;
        nb_tokens t = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, j, s, (int64_t)strlen(s), 0, &t));
        int32_t want[1024];
        int nw = 0;
        for (char *q = o; *q && nw < 1024;) {
            want[nw++] = (int32_t)strtol(q, &q, 10);
            while (*q == ' ') q++;
        }
        equal += nw == t.n && (nw == 0 || memcmp(want, t.ids, (size_t)nw * sizeof(int32_t)) == 0);
        total++;
        nb_tokens_free(&t);
        s = e + strlen(sep);
        o = oe + 1;
    }
    free(inp);
    free(outs);
    CHECK(total > 30);
    CHECK_MSG(equal == total, "%s: %d of %d llama.cpp vectors equal", name, equal, total);
    nb_tokenizer_free(j);
}

/* The file itself: what HF reads from it. */
static void check_files(nb_ctx *ctx) {
    (void)ctx;
    char dir[512];
    /* SentencePiece: the merges transformers makes, as in stories260K/hf/tokenizer.json (its ties
     * between two splits of one piece are in another order: the merged pieces' order is equal) */
    snprintf(dir, sizeof dir, "%s/stories260K", tmpdir);
    cJSON *mine = read_json(dir, "tokenizer.json");
    char hfdir[512];
    snprintf(hfdir, sizeof hfdir, "%s", nbt_data("stories260K/hf/tokenizer.json"));
    *strrchr(hfdir, '/') = 0;
    cJSON *ref = read_json(hfdir, "tokenizer.json");
    CHECK(mine && ref);
    if (mine && ref) {
        cJSON *ma = cJSON_GetObjectItem(cJSON_GetObjectItem(mine, "model"), "merges");
        cJSON *mb = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "model"), "merges");
        CHECK_EQ_INT(cJSON_GetArraySize(ma), 165);
        CHECK_EQ_INT(cJSON_GetArraySize(mb), 165);
        int same_merged = 0, same_pair = 0, found = 0;
        for (int i = 0; i < cJSON_GetArraySize(ma) && i < cJSON_GetArraySize(mb); i++) {
            const char *a = cJSON_GetArrayItem(ma, i)->valuestring;
            cJSON *b = cJSON_GetArrayItem(mb, i);
            char bs[256], acat[256], bcat[256];
            snprintf(bs, sizeof bs, "%s %s", cJSON_GetArrayItem(b, 0)->valuestring, cJSON_GetArrayItem(b, 1)->valuestring);
            snprintf(bcat, sizeof bcat, "%s%s", cJSON_GetArrayItem(b, 0)->valuestring, cJSON_GetArrayItem(b, 1)->valuestring);
            const char *sp = strchr(a + 1, ' ');
            snprintf(acat, sizeof acat, "%.*s%s", (int)(sp - a), a, sp + 1);
            same_merged += strcmp(acat, bcat) == 0;
            same_pair += strcmp(a, bs) == 0;
            for (int k = 0; k < cJSON_GetArraySize(mb); k++) {
                cJSON *c = cJSON_GetArrayItem(mb, k);
                char cs[256];
                snprintf(cs, sizeof cs, "%s %s", cJSON_GetArrayItem(c, 0)->valuestring, cJSON_GetArrayItem(c, 1)->valuestring);
                if (!strcmp(cs, a)) { found++; break; }
            }
        }
        CHECK_EQ_INT(same_merged, 165);
        CHECK_EQ_INT(found, 165);
        CHECK_EQ_INT(same_pair, 159);   /* 3 pieces (▁the, ▁her, ▁had) list their two splits the other way */
        /* the same vocabulary, normalizer, decoder, post-processor and added tokens */
        static const char *keys[] = {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", NULL};
        for (int k = 0; keys[k]; k++)
            CHECK_MSG(cJSON_Compare(cJSON_GetObjectItem(mine, keys[k]), cJSON_GetObjectItem(ref, keys[k]), 1),
                      "stories260K tokenizer.json: %s differs from hf/tokenizer.json", keys[k]);
        CHECK(cJSON_Compare(cJSON_GetObjectItem(cJSON_GetObjectItem(mine, "model"), "vocab"),
                            cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "model"), "vocab"), 1));
        cJSON *model = cJSON_GetObjectItem(mine, "model");
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(model, "byte_fallback")));
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(model, "fuse_unk")));
        CHECK(!strcmp(cJSON_GetObjectItem(model, "unk_token")->valuestring, "<unk>"));
    }
    cJSON_Delete(mine);
    cJSON_Delete(ref);
    cJSON *cfg = read_json(dir, "tokenizer_config.json");
    CHECK(cfg);
    if (cfg) {
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "add_bos_token")));
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(cfg, "add_eos_token")));
        CHECK(!strcmp(cJSON_GetObjectItem(cfg, "bos_token")->valuestring, "<s>"));
        CHECK(!strcmp(cJSON_GetObjectItem(cfg, "eos_token")->valuestring, "</s>"));
        CHECK(!strcmp(cJSON_GetObjectItem(cfg, "tokenizer_class")->valuestring, "PreTrainedTokenizerFast"));
        CHECK_EQ_INT(cJSON_GetObjectItem(cfg, "model_max_length")->valuedouble, 2048);   /* llama.context_length */
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(cfg, "pad_token")));
    }
    cJSON_Delete(cfg);
    cJSON *stm = read_json(dir, "special_tokens_map.json");
    CHECK(stm && !strcmp(cJSON_GetObjectItem(stm, "unk_token")->valuestring, "<unk>"));
    cJSON_Delete(stm);

    /* byte-level: qwen2's regex, then ByteLevel without its own regex; merges in GGUF order */
    snprintf(dir, sizeof dir, "%s/qwen2", tmpdir);
    mine = read_json(dir, "tokenizer.json");
    CHECK(mine);
    if (mine) {
        cJSON *pre = cJSON_GetObjectItem(cJSON_GetObjectItem(mine, "pre_tokenizer"), "pretokenizers");
        CHECK_EQ_INT(cJSON_GetArraySize(pre), 2);
        cJSON *split = cJSON_GetArrayItem(pre, 0), *bl = cJSON_GetArrayItem(pre, 1);
        CHECK(!strcmp(cJSON_GetObjectItem(split, "type")->valuestring, "Split"));
        CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(split, "pattern"), "Regex")->valuestring,
                      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
        CHECK(!strcmp(cJSON_GetObjectItem(split, "behavior")->valuestring, "Isolated"));
        CHECK(!strcmp(cJSON_GetObjectItem(bl, "type")->valuestring, "ByteLevel"));
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(bl, "use_regex")));
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(bl, "add_prefix_space")));
        cJSON *model = cJSON_GetObjectItem(mine, "model");
        cJSON *merges = cJSON_GetObjectItem(model, "merges");
        CHECK_EQ_INT(cJSON_GetArraySize(merges), 151387);
        CHECK(!strcmp(cJSON_GetArrayItem(merges, 0)->valuestring, "\xc4\xa0 \xc4\xa0"));   /* "Ġ Ġ", the GGUF's first */
        CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(model, "vocab")), 151936);
        /* 3 control + 290 user-defined tokens; qwen2 adds no BOS: the post-processor is ByteLevel */
        cJSON *added = cJSON_GetObjectItem(mine, "added_tokens");
        CHECK_EQ_INT(cJSON_GetArraySize(added), 293);
        int n_special = 0;
        cJSON *it;
        cJSON_ArrayForEach(it, added) n_special += cJSON_IsTrue(cJSON_GetObjectItem(it, "special"));
        CHECK_EQ_INT(n_special, 3);
        CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(mine, "post_processor"), "type")->valuestring, "ByteLevel"));
        CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(mine, "decoder"), "type")->valuestring, "ByteLevel"));
    }
    cJSON_Delete(mine);
    cfg = read_json(dir, "tokenizer_config.json");
    CHECK(cfg && cJSON_IsString(cJSON_GetObjectItem(cfg, "chat_template")) &&
          strstr(cJSON_GetObjectItem(cfg, "chat_template")->valuestring, "<|im_start|>"));
    CHECK(cfg && !strcmp(cJSON_GetObjectItem(cfg, "pad_token")->valuestring, "<|endoftext|>"));
    CHECK(cfg && cJSON_GetObjectItem(cfg, "model_max_length")->valuedouble == 32768);
    cJSON_Delete(cfg);
}

static void check_errors(nb_ctx *ctx) {
    nb_tokenizer *j = NULL;
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/stories260K", tmpdir);
    CHECK_OK(ctx, nb_tokenizer_from_json(ctx, dir, &j));
    snprintf(dir, sizeof dir, "%s/again", tmpdir);
    CHECK_FAIL(ctx, nb_tokenizer_save_json(ctx, j, dir), NB_ERR_UNSUPPORTED,
               "the tokenizer was loaded from a tokenizer.json: copy that file instead of writing it back");
    struct stat st;
    CHECK(stat(dir, &st) != 0);   /* nothing written */
    nb_tokenizer_free(j);
    nb_tokenizer *g = NULL;
    CHECK_OK(ctx, nb_tokenizer_load(ctx, nbt_data("stories260K/stories260K.gguf"), &g));
    snprintf(file, sizeof file, "%s/stories260K/tokenizer.json", tmpdir);
    CHECK_FAIL(ctx, nb_tokenizer_save_json(ctx, g, file), NB_ERR_IO, "is not a directory");
    CHECK_FAIL(ctx, nb_tokenizer_save_json(ctx, g, NULL), NB_ERR_INVALID, "bad arguments");
    nb_tokenizer_free(g);
}

/* stories260K loaded from its GGUF and exported: the export carries a tokenizer that reads back
 * with the GGUF's ids on the whole validation text. */
static void check_export(nb_ctx *ctx) {
    const char *gguf = nbt_data("stories260K/stories260K.gguf");
    nb_model *m = NULL;
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, gguf, &m));
    if (!m) return;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    char out[512];
    snprintf(out, sizeof out, "%s/export", tmpdir);
    if (qm) CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    nb_tokenizer *g = NULL, *j = NULL;
    CHECK_OK(ctx, nb_tokenizer_load(ctx, gguf, &g));
    CHECK_OK(ctx, nb_tokenizer_load(ctx, out, &j));
    if (g && j) {
        CHECK(!strcmp(nb_tokenizer_kind(j), "bpe"));   /* really the tokenizer.json */
        size_t n = 0;
        char *text = nbt_slurp(nbt_data("text/tinystories_valid_head_776KiB.txt"), &n);
        nb_tokens a = {0}, b = {0};
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, g, text, (int64_t)n, NB_TOK_ADD_SPECIAL, &a));
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, j, text, (int64_t)n, NB_TOK_ADD_SPECIAL, &b));
        CHECK_EQ_INT(a.n, 393019);
        CHECK_EQ_INT(b.n, 393019);
        CHECK(same_ids(&a, &b));
        CHECK_EQ_INT(b.ids[0], 1);
        printf("export: %lld ids from the exported tokenizer.json, equal to the GGUF's: %d\n", (long long)b.n,
               same_ids(&a, &b));
        nb_tokens_free(&a);
        nb_tokens_free(&b);
        free(text);
    }
    nb_tokenizer_free(g);
    nb_tokenizer_free(j);
    cJSON *gc = read_json(out, "generation_config.json");
    CHECK(gc);
    if (gc) {
        CHECK_EQ_INT(cJSON_GetObjectItem(gc, "bos_token_id")->valueint, 1);
        CHECK_EQ_INT(cJSON_GetObjectItem(gc, "eos_token_id")->valueint, 2);
    }
    cJSON_Delete(gc);
    cJSON *cfg = read_json(out, "tokenizer_config.json");
    CHECK(cfg && cJSON_IsTrue(cJSON_GetObjectItem(cfg, "add_bos_token")));
    cJSON_Delete(cfg);
    cJSON *stm = read_json(out, "special_tokens_map.json");
    CHECK(stm && !strcmp(cJSON_GetObjectItem(stm, "bos_token")->valuestring, "<s>"));
    cJSON_Delete(stm);

    /* a source directory's files win: its tokenizer.json is copied as is ... */
    char out2[512], src[512], a[600], b[600];
    snprintf(out2, sizeof out2, "%s/export2", tmpdir);
    snprintf(src, sizeof src, "%s", nbt_data("stories260K/hf/tokenizer.json"));
    *strrchr(src, '/') = 0;
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.source_dir = src;
    if (qm) CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out2, &eo));
    snprintf(a, sizeof a, "%s/tokenizer.json", src);
    snprintf(b, sizeof b, "%s/tokenizer.json", out2);
    size_t na = 0, nb = 0;
    char *da = nbt_slurp(a, &na), *db = nbt_slurp(b, &nb);
    CHECK(da && db && na == nb && memcmp(da, db, na) == 0);
    free(da);
    free(db);
    /* ... and without one, the GGUF's is written but a tokenizer_config.json it has is kept */
    snprintf(src, sizeof src, "%s/src", tmpdir);
    mkdir(src, 0755);
    snprintf(a, sizeof a, "%s/tokenizer_config.json", src);
    FILE *f = fopen(a, "wb");
    if (f) {
        fputs("{\"add_bos_token\": true, \"bos_token\": \"<s>\", \"marker\": 7}\n", f);
        fclose(f);
    }
    if (qm) CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out2, &eo));
    cJSON *kept = read_json(out2, "tokenizer_config.json");
    CHECK(kept && cJSON_GetObjectItem(kept, "marker") && cJSON_GetObjectItem(kept, "marker")->valueint == 7);
    cJSON_Delete(kept);
    snprintf(b, sizeof b, "%s/tokenizer.json", out2);
    struct stat st;
    CHECK(stat(b, &st) == 0);
    snprintf(b, sizeof b, "%s/.tokenizer", out2);
    CHECK(stat(b, &st) != 0);   /* the scratch directory is gone */
    nb_qmodel_free(qm);
    nb_model_free(m);
}

int main(void) {
    texts tx = {0};
    load_texts(&tx);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_tokenizer_save_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx)) return 1;

    static const char *vocab[] = {"gpt-2", "qwen2", "llama-spm"};
    for (int k = 0; k < 3; k++) {
        char p[256];
        snprintf(p, sizeof p, "tokenizers/llama.cpp-vocab-tests/ggml-vocab-%s.gguf", vocab[k]);
        check_case(ctx, vocab[k], nbt_data(p), &tx);
        check_vectors(ctx, vocab[k]);
    }
    check_case(ctx, "stories260K", nbt_data("stories260K/stories260K.gguf"), &tx);
    check_spm_model(ctx, &tx);
    const char *home = getenv("HOME");
    char smol[1024];
    snprintf(smol, sizeof smol, "%s/.cache/nibble/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "/root");
    struct stat st;
    if (stat(smol, &st) == 0) check_case(ctx, "smollm2", smol, &tx);
    else printf("SmolLM2 GGUF absent (%s): scripts/fetch-default-model.sh fetches it\n", smol);
    check_files(ctx);
    check_errors(ctx);
    check_export(ctx);

    for (int k = 0; k < tx.count; k++) free(tx.s[k]);
    nb_ctx_release(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return nbt_done("test_tokenizer_save");
}

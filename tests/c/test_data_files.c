/* Reading data files with real tokenizers: the fixtures in tests/data/ (text, prompt/completion and
 * multi-turn chat records; blank-line and separator text) against tests/golden/data/data_golden.json
 * (Hugging Face tokenizers + a Python restatement of the rules), ChatML with the Qwen2 vocabulary,
 * the 2 MiB TinyStories head (counts, ends, checksum, timing), thread-count independence, max_tokens,
 * and the error cases (bad JSON line, unusable record, empty file, ...) with their messages. */
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "nbtest.h"
#include "nibble/data.h"

static cJSON *golden;

static char *slurp(const char *path, long *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    buf[n] = 0;
    fclose(f);
    if (n_out) *n_out = n;
    return buf;
}

static const char *tmp_file(const char *name, const char *content, size_t len) {
    static char paths[16][512];
    static int k = 0;
    char *p = paths[k++ & 15];
    snprintf(p, 512, "%s/nibble-test-data-%d-%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), name);
    FILE *f = fopen(p, "wb");
    fwrite(content, 1, len, f);
    fclose(f);
    return p;
}
#define TMP(name, lit) tmp_file(name, lit, sizeof(lit) - 1)

/* The dataset equals golden[model][file]: ids, mask and document starts. */
static void check_golden(const nb_dataset *ds, const char *model, const char *file) {
    const cJSON *g = cJSON_GetObjectItem(cJSON_GetObjectItem(golden, model), file);
    CHECK_MSG(g != NULL, "no golden entry %s/%s", model, file);
    if (!g) return;
    const cJSON *ids = cJSON_GetObjectItem(g, "ids"), *mask = cJSON_GetObjectItem(g, "mask");
    const cJSON *starts = cJSON_GetObjectItem(g, "doc_start");
    int n = cJSON_GetArraySize(ids);
    CHECK_MSG(nb_dataset_n_tokens(ds) == n, "%s/%s: %lld tokens, golden %d", model, file,
              (long long)nb_dataset_n_tokens(ds), n);
    if (nb_dataset_n_tokens(ds) != n) return;
    const int32_t *a = nb_dataset_ids(ds);
    const uint8_t *m = nb_dataset_mask(ds);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int gi = cJSON_GetArrayItem(ids, i)->valueint, gm = cJSON_GetArrayItem(mask, i)->valueint;
        if (a[i] != gi || m[i] != gm) {
            if (bad++ < 5) fprintf(stderr, "%s/%s: token %d: id %d mask %d, golden id %d mask %d\n", model, file, i, a[i], m[i], gi, gm);
        }
    }
    CHECK_MSG(bad == 0, "%s/%s: %d tokens differ", model, file, bad);
    int nd = cJSON_GetArraySize(starts);
    CHECK_EQ_INT(nb_dataset_n_docs(ds), nd);
    for (int i = 0; i < nd && i < nb_dataset_n_docs(ds); i++)
        CHECK_EQ_INT(nb_dataset_doc_start(ds, i), cJSON_GetArrayItem(starts, i)->valueint);
}

static nb_dataset *load(nb_ctx *ctx, const nb_tokenizer *tok, const char *path, const nb_data_opts *o) {
    nb_dataset *ds = NULL;
    CHECK_OK(ctx, nb_dataset_load(ctx, tok, path, o, &ds));
    return ds;
}

static void test_fixtures(nb_ctx *ctx, const nb_tokenizer *tok) {
    nb_dataset *ds = load(ctx, tok, nbt_src("tests/data/mixed.jsonl"), NULL);
    if (ds) {
        check_golden(ds, "stories260K", "mixed.jsonl");
        CHECK_EQ_INT(nb_dataset_n_docs(ds), 4);   /* the blank line is skipped */
        CHECK_EQ_INT(nb_dataset_eos(ds), 2);
        /* the prompt/completion record: BOS 0, prompt 0, completion 1, EOS 1 */
        int64_t a = nb_dataset_doc_start(ds, 1), b = nb_dataset_doc_start(ds, 2);
        const uint8_t *m = nb_dataset_mask(ds);
        CHECK_EQ_INT(nb_dataset_ids(ds)[a], 1);
        CHECK_EQ_INT(m[a], 0);
        CHECK_EQ_INT(nb_dataset_ids(ds)[b - 1], 2);
        CHECK_EQ_INT(m[b - 1], 1);
        /* the same record added through nb_dataset_add_json gives the same document */
        nb_dataset *one = NULL;
        CHECK_OK(ctx, nb_dataset_new(ctx, &one));
        const char *rec = "{\"prompt\": \"Tom had a red ball.\", \"completion\": \" He gave it to Sue.\"}";
        CHECK_OK(ctx, nb_dataset_add_json(ctx, one, tok, rec, (int64_t)strlen(rec), NULL));
        CHECK_EQ_INT(nb_dataset_n_tokens(one), b - a);
        CHECK(nb_dataset_n_tokens(one) == b - a &&
              memcmp(nb_dataset_ids(one), nb_dataset_ids(ds) + a, (size_t)(b - a) * sizeof(int32_t)) == 0 &&
              memcmp(nb_dataset_mask(one), m + a, (size_t)(b - a)) == 0);
        /* and a text document through nb_dataset_add_text is the first record */
        const char *txt = "Once upon a time, there was a little cat.";
        int64_t n0 = nb_dataset_n_tokens(one);
        CHECK_OK(ctx, nb_dataset_add_text(ctx, one, tok, txt, (int64_t)strlen(txt), NULL));
        int64_t len0 = nb_dataset_doc_start(ds, 1);
        CHECK_EQ_INT(nb_dataset_n_tokens(one) - n0, len0);
        CHECK(memcmp(nb_dataset_ids(one) + n0, nb_dataset_ids(ds), (size_t)len0 * sizeof(int32_t)) == 0);
        CHECK_EQ_INT(nb_dataset_n_docs(one), 2);
        nb_dataset_release(one);
        nb_dataset_release(ds);
    }
    ds = load(ctx, tok, nbt_src("tests/data/chat.jsonl"), NULL);
    if (ds) {
        check_golden(ds, "stories260K", "chat.jsonl");
        /* the second chat ends with the user's turn: its EOS is not a target */
        int64_t n = nb_dataset_n_tokens(ds);
        CHECK_EQ_INT(nb_dataset_ids(ds)[n - 1], 2);
        CHECK_EQ_INT(nb_dataset_mask(ds)[n - 1], 0);
        nb_dataset_release(ds);
    }
    ds = load(ctx, tok, nbt_src("tests/data/docs.txt"), NULL);   /* blank-line documents (the default) */
    if (ds) {
        check_golden(ds, "stories260K", "docs.txt");
        CHECK_EQ_INT(nb_dataset_n_docs(ds), 3);
        CHECK_EQ_INT(nb_dataset_n_masked(ds), nb_dataset_n_tokens(ds));
        nb_dataset_release(ds);
    }
    nb_data_opts o;
    nb_data_opts_init(&o);
    o.separator = "<|endoftext|>";
    ds = load(ctx, tok, nbt_src("tests/data/stories.txt"), &o);
    if (ds) {
        check_golden(ds, "stories260K", "stories.txt");
        CHECK_EQ_INT(nb_dataset_n_docs(ds), 3);   /* the empty document between two separators is skipped */
        nb_dataset_release(ds);
    }
    /* other splits of docs.txt: one document per line; the whole file (trimmed) */
    nb_data_opts_init(&o);
    o.split = NB_SPLIT_LINE;
    ds = load(ctx, tok, nbt_src("tests/data/docs.txt"), &o);
    if (ds) {
        CHECK_EQ_INT(nb_dataset_n_docs(ds), 4);
        nb_dataset_release(ds);
    }
    o.split = NB_SPLIT_WHOLE;
    ds = load(ctx, tok, nbt_src("tests/data/docs.txt"), &o);
    if (ds) {
        long n;
        char *all = slurp(nbt_src("tests/data/docs.txt"), &n);
        while (n > 0 && (all[n - 1] == '\n' || all[n - 1] == ' ')) n--;
        nb_tokens t = { 0 };
        CHECK_OK(ctx, nb_tokenizer_encode(ctx, tok, all, n, 0, &t));
        CHECK_EQ_INT(nb_dataset_n_docs(ds), 1);
        CHECK_EQ_INT(nb_dataset_n_tokens(ds), t.n + 2);
        CHECK(nb_dataset_n_tokens(ds) == t.n + 2 && nb_dataset_ids(ds)[0] == 1 && nb_dataset_ids(ds)[t.n + 1] == 2 &&
              memcmp(nb_dataset_ids(ds) + 1, t.ids, (size_t)t.n * sizeof(int32_t)) == 0);
        nb_tokens_free(&t);
        free(all);
        nb_dataset_release(ds);
    }
    /* blank-line splitting at the edges: leading blank lines, CRLF, no newline at the end */
    nb_dataset *d1, *d2;
    const char *edge = TMP("edge.txt", "\n \n  a\r\nb  \r\n\r\n c");
    d1 = load(ctx, tok, edge, NULL);
    d2 = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &d2));
    CHECK_OK(ctx, nb_dataset_add_text(ctx, d2, tok, "a\r\nb", 4, NULL));
    CHECK_OK(ctx, nb_dataset_add_text(ctx, d2, tok, "c", 1, NULL));
    if (d1 && d2) {
        CHECK_EQ_INT(nb_dataset_n_docs(d1), 2);
        CHECK_EQ_INT(nb_dataset_fingerprint(d1), nb_dataset_fingerprint(d2));
    }
    nb_dataset_release(d1);
    nb_dataset_release(d2);
    /* BOS / EOS switched off */
    nb_data_opts_init(&o);
    o.add_bos = 0;
    o.add_eos = 0;
    ds = load(ctx, tok, nbt_src("tests/data/docs.txt"), &o);
    if (ds) {
        CHECK_EQ_INT(nb_dataset_n_tokens(ds), 46 - 6);
        CHECK(nb_dataset_ids(ds)[0] != 1);
        nb_dataset_release(ds);
    }
    /* a UTF-8 byte order mark and CRLF line ends change nothing */
    const char *crlf = TMP("crlf.jsonl", "\xEF\xBB\xBF{\"text\": \"Once upon a time, there was a little cat.\"}\r\n\r\n"
                                         "{\"prompt\": \"Tom had a red ball.\", \"completion\": \" He gave it to Sue.\"}\r\n");
    d1 = load(ctx, tok, crlf, NULL);
    d2 = load(ctx, tok, nbt_src("tests/data/mixed.jsonl"), NULL);
    if (d1 && d2) {
        int64_t n = nb_dataset_doc_start(d2, 2);
        CHECK_EQ_INT(nb_dataset_n_tokens(d1), n);
        CHECK(memcmp(nb_dataset_ids(d1), nb_dataset_ids(d2), (size_t)n * sizeof(int32_t)) == 0);
    }
    nb_dataset_release(d1);
    nb_dataset_release(d2);
    /* a JSON array of records is read like JSONL */
    const char *arr = TMP("arr.json", "[\n {\"text\": \"Once upon a time, there was a little cat.\"},\n"
                                      " {\"prompt\": \"Tom had a red ball.\", \"completion\": \" He gave it to Sue.\"}\n]\n");
    d1 = load(ctx, tok, arr, NULL);
    d2 = load(ctx, tok, crlf, NULL);
    if (d1 && d2) CHECK_EQ_INT(nb_dataset_fingerprint(d1), nb_dataset_fingerprint(d2));
    nb_dataset_release(d1);
    nb_dataset_release(d2);
    /* special-token text stays text unless parse_special */
    const char *sp = TMP("special.txt", "a </s> b\n");
    nb_data_opts_init(&o);
    d1 = load(ctx, tok, sp, &o);
    o.parse_special = 1;
    d2 = load(ctx, tok, sp, &o);
    if (d1 && d2) {
        int inner1 = 0, inner2 = 0;
        for (int64_t i = 1; i + 1 < nb_dataset_n_tokens(d1); i++) inner1 += nb_dataset_ids(d1)[i] == 2;
        for (int64_t i = 1; i + 1 < nb_dataset_n_tokens(d2); i++) inner2 += nb_dataset_ids(d2)[i] == 2;
        CHECK_EQ_INT(inner1, 0);
        CHECK_EQ_INT(inner2, 1);
    }
    nb_dataset_release(d1);
    nb_dataset_release(d2);
}

static void test_errors(nb_ctx *ctx, const nb_tokenizer *tok) {
    nb_dataset *ds = NULL;
    CHECK_OK(ctx, nb_dataset_load(ctx, tok, nbt_src("tests/data/docs.txt"), NULL, &ds));
    if (!ds) return;
    const int64_t n0 = nb_dataset_n_tokens(ds);
    const uint64_t h0 = nb_dataset_fingerprint(ds);
    char want[1024];

    const char *p = TMP("bad.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", }\n{\"text\": \"three\"}\n");
    snprintf(want, sizeof want, "%s:3: invalid JSON (column 17)", p);
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, want);
    p = TMP("nofield.jsonl", "{\"text\": \"one\"}\n{\"body\": \"two\", \"id\": 3}\n");
    snprintf(want, sizeof want, "%s:2: no usable field: expected \"text\", \"messages\", or \"prompt\" and \"completion\" "
             "(keys: \"body\", \"id\")", p);
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, want);
    p = TMP("empty.jsonl", "");
    snprintf(want, sizeof want, "%s: no documents", p);
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, want);
    p = TMP("blank.txt", "\n  \n\t\n");
    snprintf(want, sizeof want, "%s: no documents", p);
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, want);
    p = TMP("empty.json", " [ ] ");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, "or an empty array");
    p = TMP("pc.jsonl", "{\"prompt\": \"p\"}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT,
               ":1: a prompt/completion record needs both \"prompt\" and \"completion\" as strings");
    p = TMP("msg1.jsonl", "{\"messages\": {\"role\": \"user\"}}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: \"messages\" must be a list");
    p = TMP("msg2.jsonl", "{\"messages\": []}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: \"messages\" is empty");
    p = TMP("msg3.jsonl", "\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"content\": \"y\"}]}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":2: messages[1] has no string \"role\"");
    p = TMP("msg4.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: messages[0] has no \"content\"");
    p = TMP("msg5.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"url\": \"u\"}]}]}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: messages[0].content[0] is not a text part");
    p = TMP("msg6.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT,
               ":1: messages[0].content must be a string or a list of text parts");
    p = TMP("notobj.jsonl", "[1, 2]\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: expected a JSON object (a record), got an array");
    p = TMP("two.jsonl", "{\"text\": \"a\"} {\"text\": \"b\"}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: unexpected text after the JSON value (column 15)");
    p = TMP("textnum.jsonl", "{\"text\": 12}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":1: \"text\" is not a string");
    p = TMP("arr2.json", "[{\"text\": \"a\"},\n {\"txt\": \"b\"}]");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ": record 2: no usable field");
    p = TMP("arr3.json", "[{\"text\": \"a\"},\n {\"text\": \"b\"]");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":2: invalid JSON (column 14)");
    p = TMP("arr4.json", "[{\"text\": \"a\"}]\n  x");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":2: unexpected text after the JSON array (column 3)");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, "/nonexistent/nibble/data.jsonl", NULL), NB_ERR_IO,
               "cannot open /nonexistent/nibble/data.jsonl");
    nb_data_opts o;
    nb_data_opts_init(&o);
    o.split = NB_SPLIT_SEPARATOR;
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, nbt_src("tests/data/docs.txt"), &o), NB_ERR_INVALID,
               "needs a non-empty separator");
    nb_data_opts_init(&o);
    o.chat_template = NB_CHAT_CHATML;
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, nbt_src("tests/data/chat.jsonl"), &o), NB_ERR_UNSUPPORTED,
               "no <|im_start|> / <|im_end|> tokens");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, NULL, nbt_src("tests/data/docs.txt"), NULL), NB_ERR_INVALID, "needs a tokenizer");
    CHECK_FAIL(ctx, nb_dataset_add_json(ctx, ds, tok, "{\"text\": ", 9, NULL), NB_ERR_FORMAT, "record: invalid JSON");
    CHECK_FAIL(ctx, nb_dataset_add_json(ctx, ds, tok, "{\"x\": 1}", 8, NULL), NB_ERR_FORMAT, "record: no usable field");
    /* the dataset is as it was after every failure (a failing file adds nothing) */
    p = TMP("late.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"also fine\"}\n{\"oops\": 1}\n");
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, p, NULL), NB_ERR_FORMAT, ":3: no usable field");
    CHECK_EQ_INT(nb_dataset_n_tokens(ds), n0);
    CHECK_EQ_INT(nb_dataset_n_docs(ds), 3);
    CHECK_EQ_INT(nb_dataset_fingerprint(ds), h0);
    nb_dataset_release(ds);
}

/* Binary files are refused with the offset of their first NUL byte (where GGUF and safetensors have one:
 * the version's high bytes at 5, the header length's at 2), in every format, before anything is added;
 * text that is not UTF-8 (Latin-1) still loads, as the tokenizers take any bytes. */
static void check_binary(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *path, long long off) {
    char want[1024];
    snprintf(want, sizeof want, "%s is not a text file (a NUL byte at offset %lld): give a text or JSONL file", path, off);
    CHECK_FAIL(ctx, nb_dataset_add_file(ctx, ds, tok, path, NULL), NB_ERR_FORMAT, want);
    CHECK_MSG(strcmp(nb_ctx_last_error(ctx), want) == 0, "message \"%s\", wanted \"%s\"", nb_ctx_last_error(ctx), want);
}

static void test_binary(nb_ctx *ctx, const nb_tokenizer *tok) {
    nb_dataset *ds = NULL;
    CHECK_OK(ctx, nb_dataset_load(ctx, tok, nbt_src("tests/data/docs.txt"), NULL, &ds));
    if (!ds) return;
    const int64_t n0 = nb_dataset_n_tokens(ds), d0 = nb_dataset_n_docs(ds);
    const uint64_t h0 = nb_dataset_fingerprint(ds);
    check_binary(ctx, ds, tok, nbt_data("stories260K/stories260K.gguf"), 5);
    check_binary(ctx, ds, tok, nbt_data("stories260K/hf/model.safetensors"), 2);
    /* a NUL late in otherwise good text, in each format; a BOM does not shift the offset */
    check_binary(ctx, ds, tok, TMP("nul.txt", "one story\n\ntwo\0stories\n"), 14);
    check_binary(ctx, ds, tok, TMP("nul.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\0\"}\n"), 25);
    check_binary(ctx, ds, tok, TMP("nul.json", "[{\"text\": \"a\"}]\0"), 15);
    check_binary(ctx, ds, tok, TMP("bom.txt", "\xEF\xBB\xBFtext\0"), 7);
    CHECK_EQ_INT(nb_dataset_n_tokens(ds), n0);
    CHECK_EQ_INT(nb_dataset_n_docs(ds), d0);
    CHECK_EQ_INT(nb_dataset_fingerprint(ds), h0);
    /* Latin-1 ("caf\xE9") is not UTF-8 but is text: it loads */
    CHECK_OK(ctx, nb_dataset_add_file(ctx, ds, tok, TMP("latin1.txt", "un caf\xE9 noir\n"), NULL));
    CHECK_EQ_INT(nb_dataset_n_docs(ds), d0 + 1);
    /* the check on its own, as nibble.data.read_text uses it */
    CHECK_OK(ctx, nb_data_check_text(ctx, "x", "text", 4));
    CHECK_OK(ctx, nb_data_check_text(ctx, "x", NULL, 0));
    CHECK_FAIL(ctx, nb_data_check_text(ctx, "eval.txt", "ab\0", 3), NB_ERR_FORMAT,
               "eval.txt is not a text file (a NUL byte at offset 2): give a text or JSONL file");
    CHECK_FAIL(ctx, nb_data_check_text(ctx, "x", NULL, 3), NB_ERR_INVALID, "nb_data_check_text: bad arguments");
    nb_dataset_release(ds);
}

/* ChatML with the Qwen2 vocabulary (llama.cpp's vocab GGUF): control tokens by id, assistant turns masked in. */
static void test_chatml(nb_ctx *ctx) {
    const char *path = nbt_data("tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf");
    nb_tokenizer *tok = NULL;
    CHECK_OK(ctx, nb_tokenizer_load(ctx, path, &tok));
    if (!tok) return;
    const cJSON *q = cJSON_GetObjectItem(golden, "qwen2");
    CHECK_EQ_INT(nb_tokenizer_add_bos(tok), cJSON_IsTrue(cJSON_GetObjectItem(q, "add_bos")));
    CHECK_EQ_INT(nb_tokenizer_eos(tok), cJSON_GetObjectItem(q, "eos")->valueint);
    nb_dataset *ds = load(ctx, tok, nbt_src("tests/data/chat.jsonl"), NULL);
    if (ds) {
        check_golden(ds, "qwen2", "chat.jsonl");
        CHECK_EQ_INT(nb_dataset_ids(ds)[0], 151644);   /* <|im_start|> */
        nb_dataset_release(ds);
    }
    ds = load(ctx, tok, nbt_src("tests/data/mixed.jsonl"), NULL);
    if (ds) {
        check_golden(ds, "qwen2", "mixed.jsonl");
        nb_dataset_release(ds);
    }
    /* the plain template on request: no control tokens but the EOS */
    nb_data_opts o;
    nb_data_opts_init(&o);
    o.chat_template = NB_CHAT_PLAIN;
    ds = load(ctx, tok, nbt_src("tests/data/chat.jsonl"), &o);
    if (ds) {
        int ctl = 0;
        for (int64_t i = 0; i < nb_dataset_n_tokens(ds); i++) ctl += nb_dataset_ids(ds)[i] >= 151644;
        CHECK_EQ_INT(ctl, 0);
        nb_dataset_release(ds);
    }
    /* "<|im_start|>" typed inside a message stays text */
    ds = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &ds));
    const char *rec = "{\"messages\": [{\"role\": \"user\", \"content\": \"<|im_start|>\"}]}";
    CHECK_OK(ctx, nb_dataset_add_json(ctx, ds, tok, rec, (int64_t)strlen(rec), NULL));
    int starts = 0;
    for (int64_t i = 0; i < nb_dataset_n_tokens(ds); i++) starts += nb_dataset_ids(ds)[i] == 151644;
    CHECK_EQ_INT(starts, 1);
    nb_dataset_release(ds);
    nb_tokenizer_free(tok);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The 2 MiB TinyStories head split at <|endoftext|>: counts, ends and checksum as HF tokenizers give them;
 * the same stream with 1 and 2 threads; max_tokens; a calibration loader over it. */
static void test_tinystories(nb_ctx *ctx, const nb_tokenizer *tok) {
    const char *path = nbt_data("text/tinystories_train_head_2MiB.txt");
    const cJSON *g = cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "stories260K"), "tinystories_train_head_2MiB.txt");
    nb_data_opts o;
    nb_data_opts_init(&o);
    o.separator = "<|endoftext|>";
    double t0 = now();
    nb_dataset *ds = load(ctx, tok, path, &o);
    double dt = now() - t0;
    if (!ds) return;
    printf("tokenized %s: %lld documents, %lld tokens in %.3f s (%d threads)\n", path, (long long)nb_dataset_n_docs(ds),
           (long long)nb_dataset_n_tokens(ds), dt, nb_ctx_threads(ctx));
    CHECK_EQ_INT(nb_dataset_n_tokens(ds), cJSON_GetObjectItem(g, "n_tokens")->valuedouble);
    CHECK_EQ_INT(nb_dataset_n_docs(ds), cJSON_GetObjectItem(g, "n_docs")->valueint);
    CHECK_EQ_INT(nb_dataset_doc_start(ds, 100), cJSON_GetObjectItem(g, "doc_start_100")->valueint);
    const int32_t *ids = nb_dataset_ids(ds);
    int64_t n = nb_dataset_n_tokens(ds);
    const cJSON *head = cJSON_GetObjectItem(g, "head"), *tail = cJSON_GetObjectItem(g, "tail");
    for (int i = 0; i < 64 && n >= 64; i++) {
        CHECK_EQ_INT(ids[i], cJSON_GetArrayItem(head, i)->valueint);
        CHECK_EQ_INT(ids[n - 64 + i], cJSON_GetArrayItem(tail, i)->valueint);
    }
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum = (sum + (uint64_t)(i + 1) * (uint64_t)ids[i]) % 2147483648ull;
    CHECK_EQ_INT(sum, cJSON_GetObjectItem(g, "sum_ids_mod_2_31")->valuedouble);

    /* one thread gives the same stream */
    nb_ctx *c1 = NULL;
    CHECK_OK(ctx, nb_ctx_new(1, &c1));
    nb_dataset *d1 = NULL;
    t0 = now();
    CHECK_OK(c1, nb_dataset_load(c1, tok, path, &o, &d1));
    printf("  with 1 thread: %.3f s\n", now() - t0);
    if (d1) CHECK_EQ_INT(nb_dataset_fingerprint(d1), nb_dataset_fingerprint(ds));
    nb_dataset_release(d1);
    nb_ctx_release(c1);

    /* max_tokens stops after the document that reaches it: a prefix of the full stream */
    o.max_tokens = 5000;
    d1 = load(ctx, tok, path, &o);
    if (d1) {
        int64_t m = nb_dataset_n_tokens(d1), last = nb_dataset_doc_start(d1, nb_dataset_n_docs(d1) - 1);
        CHECK(m >= 5000 && last < 5000);
        CHECK(memcmp(nb_dataset_ids(d1), ids, (size_t)m * sizeof(int32_t)) == 0);
        nb_dataset_release(d1);
    }

    /* a calibration loader: 64 rows of 512 from a seeded offset, 8 per batch */
    nb_dataloader_cfg c;
    nb_dataloader_cfg_init(&c);
    c.seq_len = 512;
    c.batch = 8;
    c.samples = 64;
    c.random_offset = 1;
    c.seed = 1;
    nb_dataloader *ld = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    if (ld) {
        int64_t off = nb_data_offset(1, 0, 512);
        nb_data_batch b = { 0 };
        int batches = 0;
        do {
            CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
            const int32_t *tk = nb_tensor_data(b.tokens), *tg = nb_tensor_data(b.targets);
            int64_t start = off + b.row * 512;
            CHECK(memcmp(tk, ids + start, 8 * 512 * sizeof(int32_t)) == 0);
            CHECK(memcmp(tg, ids + start + 1, 8 * 512 * sizeof(int32_t)) == 0);
            batches++;
        } while (!b.epoch_end && batches < 100);
        CHECK_EQ_INT(batches, 8);
        nb_data_batch_release(&b);
        nb_dataloader_free(ld);
    }
    /* a held-out tail for evaluation */
    nb_dataset *tr = NULL, *ev = NULL;
    CHECK_OK(ctx, nb_dataset_split(ctx, ds, 0.05, &tr, &ev));
    if (tr && ev) {
        CHECK_EQ_INT(nb_dataset_n_tokens(tr) + nb_dataset_n_tokens(ev), n);
        CHECK(nb_dataset_n_tokens(ev) > n / 25 && nb_dataset_n_tokens(ev) < n / 15);
        CHECK(memcmp(nb_dataset_ids(ev), ids + nb_dataset_n_tokens(tr), 100 * sizeof(int32_t)) == 0);
    }
    nb_dataset_release(tr);
    nb_dataset_release(ev);
    nb_dataset_release(ds);
}

int main(void) {
    const char *tokpath = nbt_data("stories260K/hf/tokenizer.json");
    long n = 0;
    char *gj = slurp(nbt_src("tests/golden/data/data_golden.json"), &n);
    golden = gj ? cJSON_Parse(gj) : NULL;
    free(gj);
    if (!golden) {
        fprintf(stderr, "cannot read tests/golden/data/data_golden.json\n");
        return 1;
    }
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx) != NB_OK) return 1;
    nb_tokenizer *tok = NULL;
    CHECK_OK(ctx, nb_tokenizer_load(ctx, tokpath, &tok));
    if (tok) {
        CHECK_EQ_INT(nb_tokenizer_bos(tok), 1);
        CHECK_EQ_INT(nb_tokenizer_eos(tok), 2);
        CHECK_EQ_INT(nb_tokenizer_add_bos(tok), 1);
        test_fixtures(ctx, tok);
        test_errors(ctx, tok);
        test_binary(ctx, tok);
        test_tinystories(ctx, tok);
        nb_tokenizer_free(tok);
    }
    test_chatml(ctx);
    cJSON_Delete(golden);
    nb_ctx_release(ctx);
    return nbt_done("test_data_files");
}

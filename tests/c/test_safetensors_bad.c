/* Malformed safetensors files and sharded sets, built here in a temp dir: each must fail with the
 * right status and a message naming the problem (and the file), never crash. Run under ASan too. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbtest.h"

static char dir[256];

static const char *P(const char *name) {
    static char buf[8][512];
    static int k = 0;
    char *out = buf[k++ & 7];
    snprintf(out, 512, "%s/%s", dir, name);
    return out;
}

/* A file: 8-byte length (hdr's length unless len_override >= 0), the header, then ndata bytes. */
static const char *mkfile(const char *name, const char *hdr, int64_t len_override, size_t ndata) {
    const char *path = P(name);
    FILE *f = fopen(path, "wb");
    if (!f) return path;
    size_t hl = strlen(hdr);
    uint64_t n = len_override >= 0 ? (uint64_t)len_override : hl;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    for (size_t i = 0; i < ndata; i++) fputc((int)(i & 0xFF), f);
    fclose(f);
    return path;
}

static void mktext(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* open must fail with code, a message containing needle and naming the file (its base name). */
static void expect(nb_ctx *ctx, const char *path, nb_status code, const char *needle) {
    nb_st *st = (nb_st *)&st;   /* must be reset to NULL on failure */
    CHECK_FAIL(ctx, nb_st_open(ctx, path, &st), code, needle);
    CHECK(st == NULL);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    CHECK_MSG(strstr(nb_ctx_last_error(ctx), base) != NULL, "message \"%s\" does not name %s",
              nb_ctx_last_error(ctx), base);
    if (st && st != (nb_st *)&st) nb_st_close(st);
}

#define T(name, dt, shape, off) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

static void test_single(nb_ctx *ctx) {
    /* framing */
    FILE *f = fopen(P("short.safetensors"), "wb");
    if (f) { fwrite("\x08\x00\x00\x00\x00", 1, 5, f); fclose(f); }
    expect(ctx, P("short.safetensors"), NB_ERR_FORMAT, "shorter than the 8-byte header length");
    expect(ctx, mkfile("empty.safetensors", "", 0, 0), NB_ERR_FORMAT, "does not start with '{'");
    expect(ctx, mkfile("pastend.safetensors", "{}      ", 1000, 0), NB_ERR_FORMAT,
           "header length 1000 runs past the end of the file (16 bytes)");
    expect(ctx, mkfile("huge.safetensors", "{}      ", 100000001, 0), NB_ERR_FORMAT,
           "header length 100000001 is larger than the limit");
    expect(ctx, mkfile("hugeu64.safetensors", "{}      ", INT64_MAX, 0), NB_ERR_FORMAT, "larger than the limit");
    expect(ctx, mkfile("notobj.safetensors", "[]      ", -1, 0), NB_ERR_FORMAT, "does not start with '{'");
    expect(ctx, mkfile("badjson.safetensors", "{\"a\":{\"dtype\":", -1, 0), NB_ERR_FORMAT, "not valid JSON");
    expect(ctx, mkfile("badjson2.safetensors", "{\"a\" 1}", -1, 0), NB_ERR_FORMAT, "not valid JSON");
    expect(ctx, mkfile("trailing.safetensors", "{} x    ", -1, 0), NB_ERR_FORMAT, "trailing data at byte 3");
    expect(ctx, mkfile("ctlchar.safetensors", "{\"a\tb\":{}}", -1, 0), NB_ERR_FORMAT,
           "raw control character in a string at byte 3");
    expect(ctx, mkfile("utf8.safetensors", "{\"\xff\":1}", -1, 0), NB_ERR_FORMAT, "not valid UTF-8");
    expect(ctx, mkfile("surrogate.safetensors", "{\"\xed\xa0\x80\":1}", -1, 0), NB_ERR_FORMAT, "not valid UTF-8");

    /* per-tensor fields */
    expect(ctx, mkfile("entry.safetensors", "{\"w\":3}", -1, 0), NB_ERR_FORMAT, "tensor 'w': header entry is not a JSON object");
    expect(ctx, mkfile("nodtype.safetensors", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4),
           NB_ERR_FORMAT, "tensor 'w': missing \"dtype\"");
    expect(ctx, mkfile("dtypenum.safetensors", "{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4),
           NB_ERR_FORMAT, "tensor 'w': \"dtype\" is not a string");
    expect(ctx, mkfile("noshape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", -1, 4),
           NB_ERR_FORMAT, "tensor 'w': missing \"shape\"");
    expect(ctx, mkfile("shapeobj.safetensors", "{" T("w", "F32", "{}", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': \"shape\" is not an array");
    expect(ctx, mkfile("negdim.safetensors", "{" T("w", "F32", "[2,-1]", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': negative dimension -1 in shape");
    expect(ctx, mkfile("fracdim.safetensors", "{" T("w", "F32", "[1.5]", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': shape[0] is not a non-negative integer");
    expect(ctx, mkfile("strdim.safetensors", "{" T("w", "F32", "[\"1\"]", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "shape[0] is not a non-negative integer");
    expect(ctx, mkfile("nooff.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': missing \"data_offsets\"");
    expect(ctx, mkfile("off1.safetensors", "{" T("w", "F32", "[1]", "[4]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': \"data_offsets\" is not a pair of non-negative integers");
    expect(ctx, mkfile("offneg.safetensors", "{" T("w", "F32", "[1]", "[-4,0]") "}", -1, 4), NB_ERR_FORMAT,
           "\"data_offsets\" is not a pair of non-negative integers");
    expect(ctx, mkfile("offbig.safetensors", "{" T("w", "F32", "[1]", "[0,1e300]") "}", -1, 4), NB_ERR_FORMAT,
           "\"data_offsets\" is not a pair of non-negative integers");
    expect(ctx, mkfile("dupfield.safetensors",
                       "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4),
           NB_ERR_FORMAT, "tensor 'w': duplicate field \"dtype\"");
    expect(ctx, mkfile("unknown.safetensors", "{" T("w", "F17", "[1]", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': unknown dtype 'F17'");
    expect(ctx, mkfile("lower.safetensors", "{" T("w", "f32", "[1]", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "unknown dtype 'f32'");
    expect(ctx, mkfile("c64.safetensors", "{" T("w", "C64", "[1]", "[0,8]") "}", -1, 8), NB_ERR_UNSUPPORTED,
           "tensor 'w': dtype C64 is not supported by nibble");
    expect(ctx, mkfile("f6.safetensors", "{" T("w", "F6_E2M3", "[4]", "[0,3]") "}", -1, 3), NB_ERR_UNSUPPORTED,
           "dtype F6_E2M3 is not supported");
    expect(ctx, mkfile("f6b.safetensors", "{" T("w", "F6_E3M2", "[4]", "[0,3]") "}", -1, 3), NB_ERR_UNSUPPORTED,
           "dtype F6_E3M2 is not supported");
    expect(ctx, mkfile("fnuz.safetensors", "{" T("w", "F8_E4M3FNUZ", "[1]", "[0,1]") "}", -1, 1), NB_ERR_UNSUPPORTED,
           "dtype F8_E4M3FNUZ is not supported");
    expect(ctx, mkfile("fnuz2.safetensors", "{" T("w", "F8_E5M2FNUZ", "[1]", "[0,1]") "}", -1, 1), NB_ERR_UNSUPPORTED,
           "dtype F8_E5M2FNUZ is not supported");
    expect(ctx, mkfile("rank9.safetensors", "{" T("w", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", -1, 1),
           NB_ERR_UNSUPPORTED, "tensor 'w': rank 9 exceeds");
    expect(ctx, mkfile("overflow.safetensors", "{" T("w", "U8", "[4294967296,4294967296,4294967296]", "[0,1]") "}", -1, 1),
           NB_ERR_FORMAT, "tensor 'w': element count of shape [4294967296,4294967296,4294967296] overflows");
    expect(ctx, mkfile("beginend.safetensors", "{" T("w", "F32", "[1]", "[4,0]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': data_offsets [4, 0] have begin > end");
    expect(ctx, mkfile("size.safetensors", "{" T("w", "F32", "[2]", "[0,4]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': size mismatch: data_offsets [0, 4] hold 4 bytes but F32 [2] needs 8");
    expect(ctx, mkfile("f4odd.safetensors", "{" T("w", "F4", "[3]", "[0,2]") "}", -1, 2), NB_ERR_FORMAT,
           "tensor 'w': 3 elements of F4 are not a whole number of bytes");
    expect(ctx, mkfile("f4last.safetensors", "{" T("w", "F4", "[2,1]", "[0,1]") "}", -1, 1), NB_ERR_UNSUPPORTED,
           "tensor 'w': F4 tensor of shape [2,1] has an odd last dimension");

    /* layout of the byte buffer */
    expect(ctx, mkfile("range.safetensors", "{" T("w", "F32", "[2]", "[0,8]") "}", -1, 4), NB_ERR_FORMAT,
           "tensor 'w': data_offsets [0, 8] are outside the byte buffer (4 bytes)");
    expect(ctx, mkfile("range2.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "," T("b", "F32", "[1]", "[100,104]") "}",
                       -1, 8),
           NB_ERR_FORMAT, "tensor 'b': data_offsets [100, 104] are outside the byte buffer (8 bytes)");
    expect(ctx, mkfile("overlap.safetensors", "{" T("a", "F32", "[2]", "[0,8]") "," T("b", "F32", "[2]", "[4,12]") "}",
                       -1, 12),
           NB_ERR_FORMAT, "tensor 'b' at [4, 12] overlaps tensor 'a' (ends at 8)");
    expect(ctx, mkfile("same.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "," T("b", "F32", "[1]", "[0,4]") "}",
                       -1, 4),
           NB_ERR_FORMAT, "tensor 'b' at [0, 4] overlaps tensor 'a'");
    expect(ctx, mkfile("emptyin.safetensors", "{" T("a", "F32", "[2]", "[0,8]") "," T("e", "F32", "[0]", "[4,4]") "}",
                       -1, 8),
           NB_ERR_FORMAT, "tensor 'e' at [4, 4] overlaps tensor 'a'");
    expect(ctx, mkfile("hole.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "," T("b", "F32", "[1]", "[8,12]") "}",
                       -1, 12),
           NB_ERR_FORMAT, "hole: bytes [4, 8) of the byte buffer belong to no tensor (before tensor 'b')");
    expect(ctx, mkfile("holestart.safetensors", "{" T("a", "F32", "[1]", "[4,8]") "}", -1, 8), NB_ERR_FORMAT,
           "hole: bytes [0, 4)");
    expect(ctx, mkfile("holeend.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "}", -1, 12), NB_ERR_FORMAT,
           "hole: bytes [4, 12) at the end of the byte buffer belong to no tensor");

    /* names and metadata */
    expect(ctx, mkfile("dup.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "," T("a", "F32", "[1]", "[4,8]") "}",
                       -1, 8),
           NB_ERR_FORMAT, "duplicate tensor name 'a'");
    expect(ctx, mkfile("dupmeta.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", -1, 0), NB_ERR_FORMAT,
           "duplicate key '__metadata__'");
    expect(ctx, mkfile("metaint.safetensors", "{\"__metadata__\":{\"a\":1}}", -1, 0), NB_ERR_FORMAT,
           "__metadata__ is not a string-to-string map (value of 'a')");
    expect(ctx, mkfile("metaarr.safetensors", "{\"__metadata__\":[\"a\"]}", -1, 0), NB_ERR_FORMAT,
           "__metadata__ is not a string-to-string map");
    expect(ctx, mkfile("metanest.safetensors", "{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", -1, 0), NB_ERR_FORMAT,
           "__metadata__ is not a string-to-string map");
    expect(ctx, mkfile("metadup.safetensors", "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", -1, 0), NB_ERR_FORMAT,
           "__metadata__ has duplicate key 'a'");

    /* sanity: the same builder makes a valid file, so the cases above fail for their stated reason */
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, mkfile("ok.safetensors",
                                         "{\"__metadata__\":{\"k\":\"v\"}," T("a", "F32", "[1]", "[0,4]") ","
                                         T("b", "F4", "[2,2]", "[4,6]") "," T("e", "F32", "[0]", "[6,6]") "}",
                                         -1, 6), &st));
    if (st) {
        CHECK_EQ_INT(nb_st_count(st), 3);
        CHECK_EQ_INT(nb_st_entry_at(st, 1)->dtype, NB_E2M1);
        nb_st_close(st);
    }
    /* paths that are not safetensors at all */
    CHECK_FAIL(ctx, nb_st_open(ctx, P("does-not-exist.safetensors"), &st), NB_ERR_IO, "does-not-exist.safetensors");
    mkdir(P("emptydir"), 0755);
    CHECK_FAIL(ctx, nb_st_open(ctx, P("emptydir"), &st), NB_ERR_NOT_FOUND,
               "has neither model.safetensors.index.json nor model.safetensors");
    rmdir(P("emptydir"));
}

/* An index over shards a.safetensors (tensor "a") and b.safetensors (tensor "b"); weight_map is
 * the JSON object text given. */
static const char *mkindex(const char *sub, const char *weight_map) {
    char d[512], p[600];
    snprintf(d, sizeof d, "%s", P(sub));
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    char text[2048];
    snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 8}, \"weight_map\": %s}", weight_map);
    mktext(p, text);
    char name[600];
    snprintf(name, sizeof name, "%s/a.safetensors", sub);
    mkfile(name, "{" T("a", "F32", "[1]", "[0,4]") "}", -1, 4);
    snprintf(name, sizeof name, "%s/b.safetensors", sub);
    mkfile(name, "{" T("b", "F32", "[1]", "[0,4]") "}", -1, 4);
    return P(sub);
}

static void test_sharded(nb_ctx *ctx) {
    nb_st *st = NULL;
    const char *d = mkindex("good", "{\"a\": \"a.safetensors\", \"b\": \"b.safetensors\"}");
    CHECK_OK(ctx, nb_st_open(ctx, d, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_count(st), 2);
        CHECK_EQ_INT(nb_st_shard_count(st), 2);
        nb_st_close(st);
    }
    /* a shard in a subdirectory is inside the model directory */
    d = mkindex("subdir", "{\"a\": \"a.safetensors\", \"b\": \"sub/b.safetensors\"}");
    mkdir(P("subdir/sub"), 0755);
    mkfile("subdir/sub/b.safetensors", "{" T("b", "F32", "[1]", "[0,4]") "}", -1, 4);
    CHECK_OK(ctx, nb_st_open(ctx, d, &st));
    nb_st_close(st);
    st = NULL;

    char idx[600];
    /* shard paths outside the model directory */
    mkfile("x.safetensors", "{" T("b", "F32", "[1]", "[0,4]") "}", -1, 4);   /* a real file one level up */
    d = mkindex("escape", "{\"a\": \"a.safetensors\", \"b\": \"../x.safetensors\"}");
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "shard path '../x.safetensors' escapes the model directory");
    CHECK(strstr(nb_ctx_last_error(ctx), "escape/model.safetensors.index.json") != NULL);
    CHECK_FAIL(ctx, nb_st_open(ctx, idx, &st), NB_ERR_FORMAT, "'../x.safetensors' escapes");
    d = mkindex("escape2", "{\"a\": \"a.safetensors\", \"b\": \"sub/../../x.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "'sub/../../x.safetensors' escapes the model directory");
    char wm[1024];
    snprintf(wm, sizeof wm, "{\"a\": \"a.safetensors\", \"b\": \"%s\"}", P("x.safetensors"));
    d = mkindex("absolute", wm);
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "is absolute; shards must be inside the model directory");
    CHECK(strstr(nb_ctx_last_error(ctx), P("x.safetensors")) != NULL);
    d = mkindex("symlink", "{\"a\": \"a.safetensors\", \"b\": \"link.safetensors\"}");
    if (symlink(P("x.safetensors"), P("symlink/link.safetensors")) == 0)
        CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "shard path 'link.safetensors' resolves outside the model directory");

    /* missing and inconsistent shards */
    d = mkindex("missing", "{\"a\": \"a.safetensors\", \"b\": \"gone.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_IO, "missing shard file");
    CHECK(strstr(nb_ctx_last_error(ctx), "gone.safetensors") != NULL);
    d = mkindex("notinshard", "{\"a\": \"a.safetensors\", \"b\": \"b.safetensors\", \"c\": \"b.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT,
               "tensor 'c' is listed in weight_map but missing from its shard b.safetensors");
    d = mkindex("claimed", "{\"a\": \"b.safetensors\", \"b\": \"b.safetensors\", \"z\": \"a.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "tensor 'a' is in this shard but");
    CHECK(strstr(nb_ctx_last_error(ctx), "assigns it to b.safetensors") != NULL);
    CHECK(strstr(nb_ctx_last_error(ctx), "claimed/a.safetensors") != NULL);
    d = mkindex("unlisted", "{\"a\": \"a.safetensors\"}");
    mkfile("unlisted/a.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "," T("q", "F32", "[1]", "[4,8]") "}", -1, 8);
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "tensor 'q' is in this shard but not in the weight_map");
    d = mkindex("twoshards", "{\"a\": \"a.safetensors\", \"b\": \"b.safetensors\"}");
    mkfile("twoshards/b.safetensors", "{" T("a", "F32", "[1]", "[0,4]") "," T("b", "F32", "[1]", "[4,8]") "}", -1, 8);
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "tensor 'a' is in this shard but");
    d = mkindex("badshard", "{\"a\": \"a.safetensors\", \"b\": \"b.safetensors\"}");
    mkfile("badshard/b.safetensors", "{" T("b", "F32", "[2]", "[0,4]") "}", -1, 4);
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "badshard/b.safetensors: tensor 'b': size mismatch");

    /* the index itself */
    d = mkindex("dupwm", "{\"a\": \"a.safetensors\", \"a\": \"a.safetensors\", \"b\": \"b.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "weight_map lists tensor 'a' twice");
    d = mkindex("wmint", "{\"a\": 1, \"b\": \"b.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "weight_map entry for tensor 'a' is not a string");
    d = mkindex("nowm", "[]");
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    mktext(idx, "{\"metadata\": {}}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "index has no \"weight_map\" object");
    mktext(idx, "{\"weight_map\": ");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "index is not valid JSON");
    mktext(idx, "");
    CHECK_FAIL(ctx, nb_st_open(ctx, idx, &st), NB_ERR_FORMAT, "index is not valid JSON");
    d = mkindex("emptyname", "{\"a\": \"\", \"b\": \"b.safetensors\"}");
    CHECK_FAIL(ctx, nb_st_open(ctx, d, &st), NB_ERR_FORMAT, "empty shard path");
    CHECK(st == NULL);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx) != NB_OK) return 1;
    snprintf(dir, sizeof dir, "/tmp/nbt-stbad-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_single(ctx);
    test_sharded(ctx);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    nb_ctx_release(ctx);
    return nbt_done("test_safetensors_bad");
}

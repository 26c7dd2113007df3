/* safetensors reader/writer: FORMATS.md §10 TV8 byte for byte, files written by the real safetensors
 * package and huggingface_hub's splitter (tests/golden/gen_safetensors_golden.py) reproduced byte for
 * byte, round trips of every dtype, sharded sets, metadata, and the real stories260K checkpoint. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbtest.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static void spew(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* 1 if the two files have identical bytes; prints the first difference otherwise. */
static int same_file(const char *a, const char *b) {
    size_t la = 0, lb = 0;
    unsigned char *x = nbt_slurp(a, &la), *y = nbt_slurp(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    if (!same) {
        fprintf(stderr, "files differ: %s (%zu bytes) vs %s (%zu bytes)\n", a, la, b, lb);
        for (size_t i = 0; x && y && i < la && i < lb; i++)
            if (x[i] != y[i]) { fprintf(stderr, "  first difference at byte %zu\n", i); break; }
    }
    free(x);
    free(y);
    return same;
}

static char tmpdir_path[256];

static const char *tmp(const char *name) {
    static char buf[8][512];
    static int k = 0;
    char *out = buf[k++ & 7];
    snprintf(out, 512, "%s/%s", tmpdir_path, name);
    return out;
}

static void rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (!d) { unlink(path); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        rm_rf(p);
    }
    closedir(d);
    rmdir(path);
}

static int count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strstr(e->d_name, needle)) n++;
    if (d) closedir(d);
    return n;
}

/* The generator's byte pattern: (37k + 11ti + 5) & 0xFF, BOOL & 1. */
static void pattern(int ti, unsigned char *out, int64_t n, int is_bool) {
    for (int64_t k = 0; k < n; k++) {
        unsigned char b = (unsigned char)((37 * k + 11 * ti + 5) & 0xFF);
        out[k] = is_bool ? (b & 1) : b;
    }
}

typedef struct spec {
    const char *name;
    nb_dtype dt;
    int ndim;
    int64_t shape[4];
} spec;

static nb_tensor *make(nb_ctx *ctx, int ti, const spec *s) {
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, s->dt, s->ndim, s->shape, &t));
    if (t) pattern(ti, nb_tensor_data(t), nb_tensor_nbytes(t), s->dt == NB_BOOL);
    return t;
}

/* Entry and bytes of tensor ti of a spec list, as read from st. */
static void check_tensor(nb_ctx *ctx, nb_st *st, int ti, const spec *s) {
    int64_t i = nb_st_find(st, s->name);
    CHECK_MSG(i >= 0, "tensor '%s' not found", s->name);
    if (i < 0) return;
    const nb_st_entry *e = nb_st_entry_at(st, i);
    CHECK(strcmp(e->name, s->name) == 0);
    CHECK_EQ_INT(e->dtype, s->dt);
    CHECK_EQ_INT(e->ndim, s->ndim);
    for (int d = 0; d < s->ndim; d++) CHECK_EQ_INT(e->shape[d], s->shape[d]);
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_st_get(ctx, st, s->name, &t));
    if (!t) return;
    int64_t n = nb_tensor_nbytes(t);
    CHECK_EQ_INT(n, e->end - e->begin);
    unsigned char *want = malloc((size_t)n + 1);
    pattern(ti, want, n, s->dt == NB_BOOL);
    CHECK_MSG(memcmp(nb_tensor_data(t), want, (size_t)n) == 0, "bytes of '%s' differ", s->name);
    free(want);
    nb_tensor_release(t);
}

/* Write a spec list (plus metadata) with nibble, compare with the package's file, and read both. */
static void golden_file(nb_ctx *ctx, const char *golden_rel, const spec *specs, int n, const char *mkey,
                        const char *mval) {
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    if (mkey) CHECK_OK(ctx, nb_st_writer_meta(ctx, w, mkey, mval));
    for (int i = 0; i < n; i++) {
        nb_tensor *t = make(ctx, i, &specs[i]);
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, specs[i].name, t));
        nb_tensor_release(t);   /* the writer keeps its own reference */
    }
    const char *mine = tmp("mine.safetensors");
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, mine));
    nb_st_writer_free(w);
    const char *golden = nbt_src(golden_rel);
    CHECK_MSG(same_file(mine, golden), "nibble's writer differs from the safetensors package for %s", golden_rel);
    const char *paths[2] = {golden, mine};
    for (int p = 0; p < 2; p++) {
        nb_st *st = NULL;
        CHECK_OK(ctx, nb_st_open(ctx, paths[p], &st));
        if (!st) continue;
        CHECK_EQ_INT(nb_st_count(st), n);
        for (int i = 0; i < n; i++) check_tensor(ctx, st, i, &specs[i]);
        if (mkey) {
            CHECK_EQ_INT(nb_st_metadata_count(st), 1);
            CHECK(nb_st_metadata(st, mkey) && strcmp(nb_st_metadata(st, mkey), mval) == 0);
        } else {
            CHECK_EQ_INT(nb_st_metadata_count(st), 0);
        }
        /* file order: offsets ascending and contiguous */
        int64_t end = 0;
        for (int64_t i = 0; i < nb_st_count(st); i++) {
            CHECK_EQ_INT(nb_st_entry_at(st, i)->begin, end);
            end = nb_st_entry_at(st, i)->end;
        }
        nb_st_close(st);
    }
    unlink(mine);
}

/* ---- the golden spec lists (same as tests/golden/gen_safetensors_golden.py) ---------------- */

static const spec MIXED[] = {
    {"w.f32", NB_F32, 2, {2, 3}}, {"w.bf16", NB_BF16, 2, {2, 2}}, {"w.f16", NB_F16, 1, {3}},
    {"w.u8", NB_U8, 1, {5}}, {"w.e4m3", NB_E4M3, 2, {2, 2}}, {"w.i64", NB_I64, 1, {2}},
    {"scalar", NB_F32, 0, {0}}, {"empty", NB_F32, 2, {0, 3}}, {"empty.bf16", NB_BF16, 2, {2, 0}},
};
static const spec ALLDT[] = {
    {"t_f32", NB_F32, 1, {3}}, {"t_f16", NB_F16, 2, {2, 2}}, {"t_bf16", NB_BF16, 1, {3}},
    {"t_f64", NB_F64, 1, {2}}, {"t_e4m3", NB_E4M3, 1, {4}}, {"t_e5m2", NB_E5M2, 1, {4}},
    {"t_e8m0", NB_E8M0, 1, {3}}, {"t_f4", NB_E2M1, 2, {2, 4}}, {"t_u8", NB_U8, 1, {3}},
    {"t_i8", NB_I8, 1, {3}}, {"t_i16", NB_I16, 1, {2}}, {"t_u16", NB_U16, 1, {2}},
    {"t_i32", NB_I32, 1, {2}}, {"t_u32", NB_U32, 1, {2}}, {"t_i64", NB_I64, 2, {1, 2}},
    {"t_u64", NB_U64, 1, {2}}, {"t_bool", NB_BOOL, 1, {4}}, {"a_f32", NB_F32, 1, {1}},
};
static const spec NAMES[] = {
    {"na\xc3\xafve", NB_F32, 1, {1}}, {"q\"uote", NB_F32, 1, {1}}, {"back\\slash", NB_F32, 1, {1}},
    {"nl\nx", NB_U8, 1, {1}}, {"tab\t", NB_U8, 1, {1}}, {"ctl\x01", NB_U8, 1, {1}},
    {"del\x7f", NB_U8, 1, {1}}, {"emoji\xf0\x9f\x98\x80", NB_U8, 1, {1}},
};
static const char NAMES_META_VAL[] = "h\xc3\xa9llo\n\"w\"\\ \x02";
static const spec SHARDED[] = {
    {"embed.weight", NB_F32, 2, {8, 4}}, {"layers.0.w", NB_BF16, 2, {4, 4}},
    {"layers.0.scale", NB_E4M3, 1, {4}}, {"big", NB_F32, 1, {64}}, {"layers.1.w", NB_BF16, 2, {4, 8}},
    {"layers.1.bias", NB_F32, 1, {4}}, {"na\xc3\xafve\"name", NB_F16, 1, {3}}, {"empty", NB_F32, 1, {0}},
    {"scalar", NB_I64, 0, {0}}, {"emoji\xf0\x9f\x98\x80", NB_U8, 1, {1}}, {"del\x7f", NB_U8, 1, {1}},
};

/* ---- FORMATS.md §10 TV8 ---------------------------------------------------------------------- */

static const char TV8_HEADER[] =
    "{\"__metadata__\":{\"format\":\"pt\"},\"layer.input_scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":"
    "[0,4]},\"layer.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]},\"layer.weight_scale\":"
    "{\"dtype\":\"F8_E4M3\",\"shape\":[1,2],\"data_offsets\":[8,10]},\"layer.weight\":{\"dtype\":\"U8\",\"shape\":"
    "[1,16],\"data_offsets\":[10,26]}}    ";
static const unsigned char TV8_DATA[26] = {
    0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0x3f, 0x38, 0x7e, 0x00, 0x22, 0x44, 0x66, 0x87, 0xca, 0xee,
    0xf1, 0xd7, 0x24, 0x10, 0x4b, 0x66, 0x0e, 0x90, 0xf5};

static void test_tv8(nb_ctx *ctx) {
    unsigned char want[354];
    const unsigned char len[8] = {0x40, 0x01, 0, 0, 0, 0, 0, 0};
    CHECK_EQ_INT(strlen(TV8_HEADER), 320);
    memcpy(want, len, 8);
    memcpy(want + 8, TV8_HEADER, 320);
    memcpy(want + 328, TV8_DATA, 26);

    float half = 0.5f, one = 1.0f;
    const unsigned char scale[2] = {0x38, 0x7e};
    int64_t s12[2] = {1, 2}, s116[2] = {1, 16};
    nb_tensor *in = NULL, *s2 = NULL, *ws = NULL, *wt = NULL;
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 0, NULL, &half, &in));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_F32, 0, NULL, &one, &s2));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_E4M3, 2, s12, scale, &ws));
    CHECK_OK(ctx, nb_tensor_from_data(ctx, NB_U8, 2, s116, TV8_DATA + 10, &wt));
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    /* added in an order unlike the file's: the writer must sort */
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "layer.weight", wt));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "layer.weight_scale_2", s2));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "layer.weight_scale", ws));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "layer.input_scale", in));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "format", "pt"));
    CHECK_EQ_INT(nb_st_writer_count(w), 4);
    const char *path = tmp("tv8.safetensors");
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    nb_st_writer_free(w);
    nb_tensor_release(in); nb_tensor_release(s2); nb_tensor_release(ws); nb_tensor_release(wt);

    size_t n = 0;
    unsigned char *got = nbt_slurp(path, &n);
    CHECK_EQ_INT(n, 354);
    CHECK_MSG(got && n == 354 && memcmp(got, want, 354) == 0, "TV8 bytes differ");
    free(got);
    /* the safetensors package wrote the same bytes (gen_safetensors_golden.py) */
    got = nbt_slurp(nbt_src("tests/golden/data/st_tv8.safetensors"), &n);
    CHECK_MSG(got && n == 354 && memcmp(got, want, 354) == 0, "package's TV8 file differs from FORMATS.md");
    free(got);

    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (!st) return;
    CHECK_EQ_INT(nb_st_count(st), 4);
    CHECK_EQ_INT(nb_st_shard_count(st), 1);
    CHECK(strcmp(nb_st_shard_path(st, 0), path) == 0);
    static const struct { const char *name; nb_dtype dt; int ndim; int64_t d0, d1, b, e; } E[4] = {
        {"layer.input_scale", NB_F32, 0, 0, 0, 0, 4}, {"layer.weight_scale_2", NB_F32, 0, 0, 0, 4, 8},
        {"layer.weight_scale", NB_E4M3, 2, 1, 2, 8, 10}, {"layer.weight", NB_U8, 2, 1, 16, 10, 26}};
    for (int i = 0; i < 4; i++) {
        const nb_st_entry *e = nb_st_entry_at(st, i);
        CHECK(strcmp(e->name, E[i].name) == 0);
        CHECK_EQ_INT(e->dtype, E[i].dt);
        CHECK_EQ_INT(e->ndim, E[i].ndim);
        if (E[i].ndim) { CHECK_EQ_INT(e->shape[0], E[i].d0); CHECK_EQ_INT(e->shape[1], E[i].d1); }
        CHECK_EQ_INT(e->begin, E[i].b);
        CHECK_EQ_INT(e->end, E[i].e);
        CHECK(strcmp(e->shard, path) == 0);
        CHECK_EQ_INT(nb_st_find(st, E[i].name), i);
        nb_tensor *t = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, E[i].name, &t));
        if (!t) continue;
        CHECK(memcmp(nb_tensor_data(t), TV8_DATA + E[i].b, (size_t)(E[i].e - E[i].b)) == 0);
        CHECK_EQ_INT(nb_buffer_kind_of(t->buf), NB_BUF_MMAP);
        CHECK(!nb_buffer_writable(t->buf));
        CHECK_EQ_INT(t->offset, 328 + E[i].b);   /* zero-copy: a view at the data's place in the file */
        nb_tensor_release(t);
    }
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_st_get(ctx, st, "layer.input_scale", &t));
    if (t) {
        CHECK_NEAR(nb_tensor_get(t, NULL), 0.5, 0);
        CHECK_FAIL(ctx, nb_tensor_set(ctx, t, NULL, 2.0), NB_ERR_INVALID, "read-only");
        nb_tensor_release(t);
    }
    CHECK_OK(ctx, nb_st_get(ctx, st, "layer.weight_scale", &t));
    if (t) {
        int64_t idx[2] = {0, 1};
        CHECK_NEAR(nb_tensor_get(t, idx), 448.0, 0);   /* 0x7E */
        nb_tensor_release(t);
    }
    CHECK(strcmp(nb_st_metadata(st, "format"), "pt") == 0);
    CHECK(nb_st_metadata(st, "nope") == NULL);
    CHECK_EQ_INT(nb_st_metadata_count(st), 1);
    CHECK(strcmp(nb_st_metadata_key(st, 0), "format") == 0);
    CHECK(nb_st_metadata_key(st, 1) == NULL);
    CHECK(nb_st_entry_at(st, 4) == NULL && nb_st_entry_at(st, -1) == NULL);
    CHECK_EQ_INT(nb_st_find(st, "layer"), -1);
    CHECK_FAIL(ctx, nb_st_get(ctx, st, "layer.bias", &t), NB_ERR_NOT_FOUND, "'layer.bias' not found");
    CHECK(t == NULL);
    /* a view outlives the handle: it holds the mapping */
    CHECK_OK(ctx, nb_st_get(ctx, st, "layer.weight", &t));
    nb_st_close(st);
    if (t) {
        int64_t idx[2] = {0, 15};
        CHECK_NEAR(nb_tensor_get(t, idx), 0xf5, 0);
        nb_tensor_release(t);
    }
}

/* ---- round trips of every dtype --------------------------------------------------------------- */

static void test_roundtrip_all_dtypes(nb_ctx *ctx) {
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    spec specs[NB_DTYPE_COUNT * 4];
    char names[NB_DTYPE_COUNT * 4][32];
    int n = 0;
    for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        const char *dn = nb_dtype_info((nb_dtype)dt)->name;
        int packed = dt == NB_E2M1;
        spec cases[4] = {
            {NULL, (nb_dtype)dt, packed ? 1 : 0, {2}},          /* 0-d (E2M1 needs an even last dim) */
            {NULL, (nb_dtype)dt, 3, {2, 3, 4}},
            {NULL, (nb_dtype)dt, 2, {0, 4}},                    /* empty */
            {NULL, (nb_dtype)dt, 3, {3, 0, 2}},                 /* empty, zero in the middle */
        };
        for (int c = 0; c < 4; c++) {
            snprintf(names[n], sizeof names[n], "%s.case%d", dn, c);
            specs[n] = cases[c];
            specs[n].name = names[n];
            nb_tensor *t = make(ctx, 100 + n, &specs[n]);
            CHECK_OK(ctx, nb_st_writer_add(ctx, w, names[n], t));
            nb_tensor_release(t);
            n++;
        }
    }
    const char *path = tmp("all.safetensors");
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    nb_st_writer_free(w);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (!st) return;
    CHECK_EQ_INT(nb_st_count(st), n);
    for (int i = 0; i < n; i++) check_tensor(ctx, st, 100 + i, &specs[i]);
    /* every tensor's data is aligned to its element size, as the reference's padding guarantees */
    for (int i = 0; i < n; i++) {
        nb_tensor *t = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, specs[i].name, &t));
        int es = nb_dtype_info(specs[i].dt)->bits / 8;
        if (t && es > 1) CHECK_EQ_INT((uintptr_t)nb_tensor_data(t) % (uintptr_t)es, 0);
        if (t) CHECK_EQ_INT(nb_buffer_kind_of(t->buf), NB_BUF_MMAP);
        nb_tensor_release(t);
    }
    nb_st_close(st);
    unlink(path);
}

/* Strided inputs are written contiguous (row-major order of the logical elements). */
static void test_noncontiguous(nb_ctx *ctx) {
    int64_t s34[2] = {3, 4}, s48[2] = {4, 8}, s234[3] = {2, 3, 4};
    nb_tensor *a = NULL, *at = NULL, *p = NULL, *ps = NULL, *q = NULL, *qt = NULL, *qs = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_I64, 2, s34, &a));
    int64_t *ad = nb_tensor_data(a);
    for (int i = 0; i < 12; i++) ad[i] = (int64_t)0x0102030405060708LL * (i + 1) + i;   /* > 2^53: exact bytes */
    CHECK_OK(ctx, nb_tensor_transpose(ctx, a, 0, 1, &at));
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_E2M1, 2, s48, &p));
    pattern(7, nb_tensor_data(p), nb_tensor_nbytes(p), 0);
    CHECK_OK(ctx, nb_tensor_slice(ctx, p, 1, 2, 4, &ps));             /* columns 2..5: strided rows */
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_BF16, 3, s234, &q));
    pattern(9, nb_tensor_data(q), nb_tensor_nbytes(q), 0);
    CHECK_OK(ctx, nb_tensor_transpose(ctx, q, 0, 2, &qt));            /* [4,3,2] */
    CHECK_OK(ctx, nb_tensor_slice(ctx, qt, 1, 1, 2, &qs));            /* [4,2,2] */
    CHECK(!nb_tensor_is_contiguous(at) && !nb_tensor_is_contiguous(ps) && !nb_tensor_is_contiguous(qs));
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "at", at));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "ps", ps));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "qs", qs));
    const char *path = tmp("strided.safetensors");
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    nb_st_writer_free(w);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    nb_tensor *r = NULL;
    r = NULL;
    if (st) CHECK_OK(ctx, nb_st_get(ctx, st, "at", &r));
    if (r) {
        CHECK_EQ_INT(r->shape[0], 4);
        CHECK_EQ_INT(r->shape[1], 3);
        const int64_t *rd = nb_tensor_data(r);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) CHECK(rd[i * 3 + j] == ad[j * 4 + i]);
        nb_tensor_release(r);
    }
    r = NULL;
    if (st) CHECK_OK(ctx, nb_st_get(ctx, st, "ps", &r));
    if (r) {
        const unsigned char *pd = nb_tensor_data(p), *rd = nb_tensor_data(r);
        CHECK_EQ_INT(nb_tensor_nbytes(r), 8);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++) CHECK_EQ_INT(rd[i * 2 + j], pd[i * 4 + 1 + j]);
        nb_tensor_release(r);
    }
    r = NULL;
    if (st) CHECK_OK(ctx, nb_st_get(ctx, st, "qs", &r));
    if (r) {
        const uint16_t *qd = nb_tensor_data(q), *rd = nb_tensor_data(r);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++)
                for (int k = 0; k < 2; k++)   /* qs[i][j][k] = q[k][j+1][i] */
                    CHECK_EQ_INT(rd[(i * 2 + j) * 2 + k], qd[(k * 3 + (j + 1)) * 4 + i]);
        nb_tensor_release(r);
    }
    nb_st_close(st);
    nb_tensor_release(a); nb_tensor_release(at); nb_tensor_release(p); nb_tensor_release(ps);
    nb_tensor_release(q); nb_tensor_release(qt); nb_tensor_release(qs);
    unlink(path);
}

/* ---- metadata ------------------------------------------------------------------------------- */

static void test_metadata(nb_ctx *ctx) {
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "format", "pt"));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "quant", "nvfp4"));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "format", "np"));   /* replaces, keeps its place */
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "empty", ""));
    CHECK_FAIL(ctx, nb_st_writer_meta(ctx, w, "bad", "\xff"), NB_ERR_INVALID, "UTF-8");
    const char *path = tmp("meta.safetensors");
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));   /* no tensors at all */
    nb_st_writer_free(w);
    size_t n = 0;
    unsigned char *b = nbt_slurp(path, &n);
    static const char hdr[] = "{\"__metadata__\":{\"format\":\"np\",\"quant\":\"nvfp4\",\"empty\":\"\"}}";
    CHECK_EQ_INT(n, 8 + 64);   /* 60 header bytes padded to 64, no data */
    CHECK(b && n == 72 && b[0] == 64 && memcmp(b + 8, hdr, strlen(hdr)) == 0 && b[71] == ' ');
    free(b);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_count(st), 0);
        CHECK_EQ_INT(nb_st_metadata_count(st), 3);
        CHECK(strcmp(nb_st_metadata_key(st, 0), "format") == 0);
        CHECK(strcmp(nb_st_metadata_key(st, 1), "quant") == 0);
        CHECK(strcmp(nb_st_metadata_key(st, 2), "empty") == 0);
        CHECK(strcmp(nb_st_metadata(st, "format"), "np") == 0);
        CHECK(strcmp(nb_st_metadata(st, "quant"), "nvfp4") == 0);
        CHECK(strcmp(nb_st_metadata(st, "empty"), "") == 0);
        nb_st_close(st);
    }
    unlink(path);
}

/* A header whose length is not a multiple of 8 (legal, but the reference never writes one): the
 * data is misaligned, so nb_st_get hands out an aligned copy with the same values. */
static void test_misaligned(nb_ctx *ctx) {
    static const char hdr[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
    unsigned char file[256];
    uint64_t hl = strlen(hdr);
    for (int i = 0; i < 8; i++) file[i] = (unsigned char)(hl >> (8 * i));
    memcpy(file + 8, hdr, hl);
    float v[2] = {1.5f, -3.25f};
    file[8 + hl] = 0xAB;
    memcpy(file + 9 + hl, v, 8);
    const char *path = tmp("misaligned.safetensors");
    spew(path, file, 17 + hl);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    nb_tensor *t = NULL;
    if (st) CHECK_OK(ctx, nb_st_get(ctx, st, "b", &t));
    if (t) {
        CHECK_EQ_INT((uintptr_t)nb_tensor_data(t) % 4, 0);
        int64_t i0 = 0, i1 = 1;
        CHECK_NEAR(nb_tensor_get(t, &i0), 1.5, 0);
        CHECK_NEAR(nb_tensor_get(t, &i1), -3.25, 0);
        nb_tensor_release(t);
    }
    if (st) CHECK_OK(ctx, nb_st_get(ctx, st, "a", &t));
    if (t) {
        CHECK_EQ_INT(*(unsigned char *)nb_tensor_data(t), 0xAB);
        CHECK_EQ_INT(nb_buffer_kind_of(t->buf), NB_BUF_MMAP);   /* bytes need no copy */
        nb_tensor_release(t);
    }
    nb_st_close(st);
    unlink(path);
}

/* ---- writer errors and atomicity ------------------------------------------------------------ */

static void test_writer_errors(nb_ctx *ctx) {
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    int64_t s2 = 2;
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_tensor_new(ctx, NB_F32, 1, &s2, &t));
    CHECK_OK(ctx, nb_st_writer_add(ctx, w, "x", t));
    CHECK_FAIL(ctx, nb_st_writer_add(ctx, w, "x", t), NB_ERR_INVALID, "'x' was already added");
    CHECK_FAIL(ctx, nb_st_writer_add(ctx, w, "__metadata__", t), NB_ERR_INVALID, "reserved");
    CHECK_FAIL(ctx, nb_st_writer_add(ctx, w, "bad\xc3", t), NB_ERR_INVALID, "UTF-8");
    CHECK_FAIL(ctx, nb_st_writer_index_meta(ctx, w, "total_size", 1), NB_ERR_INVALID, "total_size");
    CHECK_FAIL(ctx, nb_st_writer_write_sharded(ctx, w, tmpdir_path, 0), NB_ERR_INVALID, "max_shard_bytes");
    CHECK_FAIL(ctx, nb_st_writer_write_sharded(ctx, w, tmp("no-such-dir"), 100), NB_ERR_IO, "no-such-dir");
    CHECK_FAIL(ctx, nb_st_writer_write(ctx, w, tmp("no-such-dir/x.safetensors")), NB_ERR_IO, "no-such-dir");
    /* rename onto a directory fails after the data was written: the temp file must be gone */
    const char *dpath = tmp("a-directory");
    mkdir(dpath, 0755);
    CHECK_FAIL(ctx, nb_st_writer_write(ctx, w, dpath), NB_ERR_IO, "cannot rename");
    CHECK_EQ_INT(count_files(tmpdir_path, ".tmp-"), 0);
    rmdir(dpath);
    /* a successful write leaves no temp file either, and replaces an existing file */
    const char *path = tmp("x.safetensors");
    spew(path, "junk", 4);
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    CHECK_EQ_INT(count_files(tmpdir_path, ".tmp-"), 0);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (st) CHECK_EQ_INT(nb_st_count(st), 1);
    nb_st_close(st);
    /* the writer retained the tensor: the caller may drop its handle before writing */
    nb_tensor_release(t);
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, path));
    nb_st_writer_free(w);
    unlink(path);
}

/* ---- sharded sets --------------------------------------------------------------------------- */

static void test_sharded_golden(nb_ctx *ctx) {
    int n = (int)(sizeof SHARDED / sizeof SHARDED[0]);
    const char *dir = tmp("sharded");
    mkdir(dir, 0755);
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "format", "pt"));
    for (int i = 0; i < n; i++) {
        nb_tensor *t = make(ctx, i, &SHARDED[i]);
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, SHARDED[i].name, t));
        nb_tensor_release(t);
    }
    CHECK_OK(ctx, nb_st_writer_write_sharded(ctx, w, dir, 200));
    nb_st_writer_free(w);
    static const char *files[4] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                   "model-00003-of-00003.safetensors", "model.safetensors.index.json"};
    for (int f = 0; f < 4; f++) {
        char mine[600], golden[600];
        snprintf(mine, sizeof mine, "%s/%s", dir, files[f]);
        snprintf(golden, sizeof golden, "tests/golden/data/st_sharded/%s", files[f]);
        CHECK_MSG(same_file(mine, nbt_src(golden)), "%s differs from huggingface_hub + safetensors", files[f]);
    }
    CHECK_EQ_INT(count_files(dir, ""), 4);
    /* read: the directory, the index path, and the golden directory */
    char ipath[600];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    const char *opens[3] = {dir, ipath, nbt_src("tests/golden/data/st_sharded")};
    for (int o = 0; o < 3; o++) {
        nb_st *st = NULL;
        CHECK_OK(ctx, nb_st_open(ctx, opens[o], &st));
        if (!st) continue;
        CHECK_EQ_INT(nb_st_count(st), n);
        CHECK_EQ_INT(nb_st_shard_count(st), 3);
        for (int i = 0; i < n; i++) check_tensor(ctx, st, i, &SHARDED[i]);
        CHECK(strstr(nb_st_entry_at(st, 0)->shard, "model-00001-of-00003.safetensors") != NULL);
        CHECK(strcmp(nb_st_entry_at(st, 0)->name, "big") == 0);
        CHECK(strstr(nb_st_entry_at(st, n - 1)->shard, "model-00003-of-00003.safetensors") != NULL);
        CHECK(strcmp(nb_st_metadata(st, "format"), "pt") == 0);
        nb_st_close(st);
    }
}

/* A bigger generated set split many ways; reopen and compare; then rewrite as one file (stale shards
 * and index removed) and sharded again (stale model.safetensors removed). */
static void test_sharded_roundtrip(nb_ctx *ctx) {
    const char *dir = tmp("sharded2");
    mkdir(dir, 0755);
    enum { N = 24 };
    spec specs[N];
    char names[N][32];
    nb_dtype dts[6] = {NB_F32, NB_BF16, NB_E4M3, NB_E2M1, NB_I64, NB_U8};
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "format", "pt"));
    CHECK_OK(ctx, nb_st_writer_index_meta(ctx, w, "total_parameters", 12345));
    int64_t total = 0;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w", (i * 7) % N);
        specs[i] = (spec){names[i], dts[i % 6], 2, {1 + i % 5, 2 * (1 + i % 7)}};
        nb_tensor *t = make(ctx, 300 + i, &specs[i]);
        total += nb_tensor_nbytes(t);
        CHECK_OK(ctx, nb_st_writer_add(ctx, w, names[i], t));
        nb_tensor_release(t);
    }
    CHECK_OK(ctx, nb_st_writer_write_sharded(ctx, w, dir, 64));
    int nfiles = count_files(dir, "-of-");
    CHECK(nfiles >= 5);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_count(st), N);
        CHECK_EQ_INT(nb_st_shard_count(st), nfiles);
        for (int i = 0; i < N; i++) check_tensor(ctx, st, 300 + i, &specs[i]);
        nb_st_close(st);
    }
    char ipath[600];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    size_t len = 0;
    char *idx = nbt_slurp(ipath, &len);
    char want[128];
    snprintf(want, sizeof want, "{\n  \"metadata\": {\n    \"total_parameters\": 12345,\n    \"total_size\": %lld\n  },\n",
             (long long)total);
    CHECK(idx && strncmp(idx, want, strlen(want)) == 0);
    CHECK(idx && len > 2 && idx[len - 1] == '\n' && idx[len - 2] == '}');
    free(idx);

    CHECK_OK(ctx, nb_st_writer_write_sharded(ctx, w, dir, 1 << 20));   /* one shard now */
    CHECK_EQ_INT(count_files(dir, ""), 1);
    CHECK_EQ_INT(count_files(dir, "model.safetensors"), 1);
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_count(st), N);
        CHECK_EQ_INT(nb_st_shard_count(st), 1);
        for (int i = 0; i < N; i++) check_tensor(ctx, st, 300 + i, &specs[i]);
        nb_st_close(st);
    }
    CHECK_OK(ctx, nb_st_writer_write_sharded(ctx, w, dir, 100));
    CHECK_EQ_INT(count_files(dir, "model.safetensors"), 1);   /* only the index is left with that prefix */
    CHECK_EQ_INT(count_files(dir, ".index.json"), 1);
    CHECK_OK(ctx, nb_st_open(ctx, dir, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_shard_count(st), count_files(dir, "-of-"));
        for (int i = 0; i < N; i++) check_tensor(ctx, st, 300 + i, &specs[i]);
        nb_st_close(st);
    }
    nb_st_writer_free(w);
}

/* ---- the real stories260K checkpoint ---------------------------------------------------------- */

static uint32_t f32_bits(const nb_tensor *t, int64_t i, int64_t j) {
    uint32_t u;
    memcpy(&u, (const unsigned char *)nb_tensor_data(t) + i * t->strides[0] + j * t->strides[1], 4);
    return u;
}

static void test_stories260k(nb_ctx *ctx) {
    const char *path = nbt_data_part("stories260K/hf/model.safetensors", "the real stories260K checkpoint");
    if (!path) return;
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (!st) return;
    CHECK_EQ_INT(nb_st_count(st), 47);   /* 5 layers x 9 + embed + norm; tied, no lm_head */
    CHECK(strcmp(nb_st_metadata(st, "format"), "pt") == 0);
    CHECK_EQ_INT(nb_st_find(st, "lm_head.weight"), -1);
    int64_t qi = nb_st_find(st, "model.layers.0.self_attn.q_proj.weight");
    CHECK(qi >= 0);
    if (qi >= 0) {
        const nb_st_entry *e = nb_st_entry_at(st, qi);
        CHECK_EQ_INT(e->dtype, NB_F32);
        CHECK_EQ_INT(e->ndim, 2);
        CHECK_EQ_INT(e->shape[0], 64);
        CHECK_EQ_INT(e->shape[1], 64);
        CHECK_EQ_INT(e->end - e->begin, 64 * 64 * 4);
    }
    nb_tensor *q = NULL, *emb = NULL, *nrm = NULL;
    CHECK_OK(ctx, nb_st_get(ctx, st, "model.layers.0.self_attn.q_proj.weight", &q));
    CHECK_OK(ctx, nb_st_get(ctx, st, "model.embed_tokens.weight", &emb));
    CHECK_OK(ctx, nb_st_get(ctx, st, "model.norm.weight", &nrm));
    if (q) {   /* values read with safetensors.numpy (safe_open) */
        CHECK_EQ_INT(f32_bits(q, 0, 0), 0x3d35d536);
        CHECK_EQ_INT(f32_bits(q, 0, 1), 0x3da352c4);
        CHECK_EQ_INT(f32_bits(q, 5, 7), 0xbe731b9f);
        CHECK_EQ_INT(f32_bits(q, 17, 42), 0x3ea74773);
        CHECK_EQ_INT(f32_bits(q, 63, 63), 0x3d0e9476);
        int64_t ix[2] = {5, 7};
        CHECK_NEAR(nb_tensor_get(q, ix), -0.2374100536108017, 0);
    }
    if (emb) {
        CHECK_EQ_INT(emb->shape[0], 512);
        CHECK_EQ_INT(emb->shape[1], 64);
        int64_t a[2] = {0, 0}, b[2] = {511, 63};
        CHECK_NEAR(nb_tensor_get(emb, a), -0.29474878311157227, 0);
        CHECK_NEAR(nb_tensor_get(emb, b), -0.424032598733902, 0);
    }
    if (nrm) {
        int64_t a = 0, b = 63;
        CHECK_NEAR(nb_tensor_get(nrm, &a), 2.4583089351654053, 0);
        CHECK_NEAR(nb_tensor_get(nrm, &b), 1.7077769041061401, 0);
    }
    /* all views share the one mapping of the file */
    if (q && emb) CHECK(q->buf == emb->buf);
    int64_t total = 0;
    for (int64_t i = 0; i < nb_st_count(st); i++) {
        const nb_st_entry *e = nb_st_entry_at(st, i);
        CHECK_EQ_INT(e->dtype, NB_F32);
        total += e->end - e->begin;
    }
    CHECK_EQ_INT(total, 260032 * 4);   /* the README's parameter count */
    if (q) CHECK_EQ_INT(nb_buffer_size(q->buf), 8 + 4856 + 260032 * 4);

    /* rewrite it with nibble: the same bytes as the file transformers wrote */
    nb_st_writer *w = NULL;
    CHECK_OK(ctx, nb_st_writer_new(ctx, &w));
    CHECK_OK(ctx, nb_st_writer_meta(ctx, w, "format", "pt"));
    for (int64_t i = nb_st_count(st) - 1; i >= 0; i--) {
        nb_tensor *t = NULL;
        CHECK_OK(ctx, nb_st_get(ctx, st, nb_st_entry_at(st, i)->name, &t));
        if (t) CHECK_OK(ctx, nb_st_writer_add(ctx, w, nb_st_entry_at(st, i)->name, t));
        nb_tensor_release(t);
    }
    const char *copy = tmp("stories.safetensors");
    CHECK_OK(ctx, nb_st_writer_write(ctx, w, copy));
    nb_st_writer_free(w);
    /* The shared file was not written by the reference serializer (its __metadata__ comes last),
     * but its tensors are in reference order (all F32, by name): the byte buffers must be equal. */
    size_t la = 0, lb = 0;
    unsigned char *x = nbt_slurp(copy, &la), *y = nbt_slurp(path, &lb);
    CHECK_EQ_INT(la, lb);
    CHECK(x && y && la == lb && la > 8 + 4856);
    if (x && y && la == lb && la > 8 + 4856) {
        CHECK_EQ_INT(x[0] | (x[1] << 8), 4856);
        CHECK_MSG(memcmp(x + 8 + 4856, y + 8 + 4856, (size_t)(la - 8 - 4856)) == 0, "tensor bytes differ");
        static const char lead[] = "{\"__metadata__\":{\"format\":\"pt\"},\"model.embed_tokens.weight\":";
        CHECK(memcmp(x + 8, lead, strlen(lead)) == 0);
    }
    free(x);
    free(y);
    unlink(copy);
    nb_tensor_release(q);
    nb_tensor_release(emb);
    nb_tensor_release(nrm);
    nb_st_close(st);

    /* the model directory opens through model.safetensors */
    const char *dir = nbt_data("stories260K/hf/config.json");
    char d[4096];
    snprintf(d, sizeof d, "%.*s", (int)(strrchr(dir, '/') - dir), dir);
    CHECK_OK(ctx, nb_st_open(ctx, d, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_count(st), 47);
        CHECK(strstr(nb_st_shard_path(st, 0), "model.safetensors") != NULL);
        nb_st_close(st);
    }
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx) != NB_OK) return 1;
    snprintf(tmpdir_path, sizeof tmpdir_path, "/tmp/nbt-st-XXXXXX");
    if (!mkdtemp(tmpdir_path)) return 1;

    test_tv8(ctx);
    golden_file(ctx, "tests/golden/data/st_mixed.safetensors", MIXED, (int)(sizeof MIXED / sizeof MIXED[0]),
                "format", "pt");
    golden_file(ctx, "tests/golden/data/st_alldtypes.safetensors", ALLDT, (int)(sizeof ALLDT / sizeof ALLDT[0]),
                NULL, NULL);
    golden_file(ctx, "tests/golden/data/st_names.safetensors", NAMES, (int)(sizeof NAMES / sizeof NAMES[0]),
                "note", NAMES_META_VAL);
    test_roundtrip_all_dtypes(ctx);
    test_noncontiguous(ctx);
    test_metadata(ctx);
    test_misaligned(ctx);
    test_writer_errors(ctx);
    test_sharded_golden(ctx);
    test_sharded_roundtrip(ctx);
    test_stories260k(ctx);

    rm_rf(tmpdir_path);
    nb_mem_stats m;
    nb_ctx_mem(ctx, &m);
    CHECK_EQ_INT(m.live_bytes, 0);   /* every tensor and heap buffer was released */
    nb_ctx_release(ctx);
    return nbt_done("test_safetensors");
}

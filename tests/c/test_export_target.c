/* Where an export may go (nb_export_check_target, nb_qmodel_export): a missing target is written, an
 * empty directory or a previous nibble export (either layout, sharded or not, quantized or not) is
 * replaced, and everything else (a user's folder, a regular file, a symbolic link, a plain HF model
 * such as the source model itself) is refused with a message naming it, before anything is written
 * and with every byte of it left as it was. Missing parent folders are created; staging folders of
 * killed processes are removed; a target another process is exporting to (its flock'd lock file) is
 * refused; a NaN/Inf in any written tensor is refused naming it (allow_nonfinite writes and reports
 * it); a file-size limit is an I/O error, not SIGXFSZ. Runs on stories260K (skipped without shared
 * data). */
#include "nbtest.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char root[256];       /* mkdtemp'd, removed at the end */
static char hf[512];         /* ../shared/data/stories260K/hf */

/* ---- file helpers ------------------------------------------------------------------------------ */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) { nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void copy_file(const char *src, const char *dst) {
    size_t n = 0;
    char *b = nbt_slurp(src, &n);
    CHECK_MSG(b != NULL, "cannot read %s", src);
    FILE *f = b ? fopen(dst, "wb") : NULL;
    if (f) {
        CHECK(fwrite(b, 1, n, f) == n);
        fclose(f);
    }
    free(b);
}

/* Sorted listing of dir: one line per entry ("name" for a file, followed by its bytes; "name/" for a
 * directory, followed by its own snapshot; "name@" for anything else), so that two snapshots are equal
 * only when names, kinds and every file's bytes are. The caller frees it. */
typedef struct { char *p; size_t n, cap; } buf_t;

static void put(buf_t *b, const void *x, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) abort();
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void snap_into(buf_t *b, const char *dir) {
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) { put(b, "<missing>\n", 10); return; }
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        if (strcmp(nm, ".") && strcmp(nm, "..")) {
            char path[1024];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", dir, nm);
            put(b, nm, strlen(nm));
            if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                size_t len = 0;
                char *c = nbt_slurp(path, &len);
                char hdr[64];
                int k = snprintf(hdr, sizeof hdr, " %zu\n", len);
                put(b, hdr, (size_t)k);
                if (c) put(b, c, len);
                free(c);
                put(b, "\n", 1);
            } else if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
                put(b, "/\n", 2);
                snap_into(b, path);
                put(b, "</>\n", 4);
            } else {
                put(b, "@\n", 2);
            }
        }
        free(ents[i]);
    }
    free(ents);
}

static char *snap(const char *dir, size_t *n) {
    buf_t b = {0};
    put(&b, "", 0);
    snap_into(&b, dir);
    *n = b.n;
    return b.p;
}

static int same_snap(const char *a, size_t na, const char *b, size_t nb) { return na == nb && !memcmp(a, b, na); }

/* Entries of root whose names contain ".nibble-": a temporary or moved-aside sibling left behind. */
static int leftovers(void) {
    DIR *d = opendir(root);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, ".nibble-") != NULL;
    closedir(d);
    return n;
}

static int exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

/* The message nb_export_check_target gives for a foreign target, asserted whole. */
static void check_refused(nb_ctx *ctx, nb_status s, const char *dir, const char *why) {
    char want[1024];
    snprintf(want, sizeof want, "export: %s %s: remove it or choose another output directory", dir, why);
    CHECK_EQ_INT(s, NB_ERR_INVALID);
    CHECK_MSG(strcmp(nb_ctx_last_error(ctx), want) == 0, "got \"%s\"\nwanted \"%s\"", nb_ctx_last_error(ctx), want);
}

/* ---- models ---------------------------------------------------------------------------------- */

/* NVFP4 W4A16 on every linear module but down_proj (172 wide) and lm_head; weights calibrated. */
static nb_qmodel *quantized(nb_ctx *ctx, nb_model *m) {
    nb_qmodel *qm = NULL;
    CHECK_OK(ctx, nb_qmodel_new(ctx, m, &qm));
    if (!qm) return NULL;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        if (strstr(name, "down_proj") || !strcmp(name, "lm_head")) continue;
        nb_qspec s;
        nb_qspec_init(&s);
        s.weight_format = NB_FMT_NVFP4;
        CHECK_OK(ctx, nb_qmodel_set(ctx, qm, name, &s));
    }
    CHECK_OK(ctx, nb_qmodel_fuse_siblings(ctx, qm, NULL));
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    CHECK_OK(ctx, nb_qmodel_calibrate_weights(ctx, qm, &cc));
    return qm;
}

/* ---- cases ----------------------------------------------------------------------------------- */

/* Missing target: written, marked; exporting again (same bytes), in the other layout, sharded, and
 * unquantized all replace it, and nothing is left beside it. */
static void test_replace(nb_ctx *ctx, nb_qmodel *qm, nb_qmodel *plain) {
    char out[512], path[600];
    snprintf(out, sizeof out, "%s/out", root);
    CHECK_OK(ctx, nb_export_check_target(ctx, out));
    CHECK(!exists(out));   /* the check writes nothing */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (st) {
        CHECK_EQ_INT(nb_st_metadata_count(st), 3);
        CHECK(nb_st_metadata(st, "format") && !strcmp(nb_st_metadata(st, "format"), "pt"));
        CHECK(nb_st_metadata(st, "producer") && !strcmp(nb_st_metadata(st, "producer"), "nibble"));
        CHECK(nb_st_metadata(st, "producer_version") && !strcmp(nb_st_metadata(st, "producer_version"), nb_version()));
        nb_st_close(st);
    }
    CHECK_OK(ctx, nb_export_check_target(ctx, out));

    size_t n1 = 0, n2 = 0;
    char *first = snap(out, &n1);
    static const char *const names[] = {"config.json", "generation_config.json", "hf_quant_config.json",
                                        "model.safetensors", "special_tokens_map.json", "tokenizer.json",
                                        "tokenizer_config.json"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        snprintf(path, sizeof path, "%s/%s", out, names[k]);
        CHECK_MSG(exists(path), "%s is missing", path);
    }
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    char *second = snap(out, &n2);
    CHECK_MSG(same_snap(first, n1, second, n2), "a second export into %s differs from the first", out);
    free(second);
    CHECK_EQ_INT(leftovers(), 0);

    /* a trailing slash names the same directory */
    snprintf(path, sizeof path, "%s/", out);
    CHECK_OK(ctx, nb_export_check_target(ctx, path));

    /* compressed-tensors over ModelOpt (no producer in its config.json: the safetensors mark says it) */
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, &eo));
    snprintf(path, sizeof path, "%s/hf_quant_config.json", out);
    CHECK(!exists(path));
    CHECK_OK(ctx, nb_export_check_target(ctx, out));

    /* sharded over it: model-0000k-of-0000n.safetensors + the index are export names too */
    nb_export_opts_init(&eo);
    eo.max_shard_bytes = 200000;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, &eo));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    CHECK(exists(path));
    int shards = 0;
    DIR *d = opendir(out);
    for (struct dirent *e; d && (e = readdir(d));) shards += !strncmp(e->d_name, "model-0000", 10);
    if (d) closedir(d);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    CHECK_MSG(shards >= 2 && !exists(path), "%d shards", shards);
    CHECK_OK(ctx, nb_export_check_target(ctx, out));

    /* an export with nothing quantized is a plain HF checkpoint but for the mark: still replaceable */
    CHECK_OK(ctx, nb_qmodel_export(ctx, plain, out, NULL));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    CHECK(!exists(path));   /* the sharded files went with the old directory */
    CHECK_OK(ctx, nb_export_check_target(ctx, out));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    second = snap(out, &n2);
    CHECK_MSG(same_snap(first, n1, second, n2), "%s: the export after four others differs from the first", out);
    free(second);
    free(first);
    CHECK_EQ_INT(leftovers(), 0);
    rm_rf(out);
}

/* An empty directory is replaced by the export. */
static void test_empty_dir(nb_ctx *ctx, nb_qmodel *qm) {
    char out[512], ref[512];
    snprintf(out, sizeof out, "%s/empty", root);
    snprintf(ref, sizeof ref, "%s/ref", root);
    CHECK(mkdir(out, 0755) == 0);
    CHECK_OK(ctx, nb_export_check_target(ctx, out));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, ref, NULL));
    size_t na = 0, nb = 0;
    char *a = snap(out, &na), *b = snap(ref, &nb);
    CHECK_MSG(same_snap(a, na, b, nb), "the export into an empty directory differs from one into a new path");
    free(a);
    free(b);
    CHECK_EQ_INT(leftovers(), 0);
    rm_rf(out);
    rm_rf(ref);
}

/* Refused: check and export fail with `why`, and the target is byte for byte as before. */
static void expect_refused(nb_ctx *ctx, nb_qmodel *qm, const char *dir, const char *why) {
    size_t n0 = 0, n1 = 0;
    struct stat st;
    int is_dir = lstat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    char *before = is_dir ? snap(dir, &n0) : nbt_slurp(dir, &n0);
    check_refused(ctx, nb_export_check_target(ctx, dir), dir, why);
    check_refused(ctx, nb_qmodel_export(ctx, qm, dir, NULL), dir, why);
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    check_refused(ctx, nb_qmodel_export(ctx, qm, dir, &eo), dir, why);
    char *after = is_dir ? snap(dir, &n1) : nbt_slurp(dir, &n1);
    CHECK_MSG(before && after && same_snap(before, n0, after, n1), "%s changed although the export was refused", dir);
    free(before);
    free(after);
    CHECK_EQ_INT(leftovers(), 0);   /* refused before the temporary directory was made */
}

static void test_foreign(nb_ctx *ctx, nb_qmodel *qm) {
    char dir[512], path[600], why[700];

    /* the audit's case: a user's folder with notes and a subfolder */
    snprintf(dir, sizeof dir, "%s/user", root);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    write_text(path, "my notes: do not lose\n");
    snprintf(path, sizeof path, "%s/runs", dir);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/runs/log.txt", dir);
    write_text(path, "step 1 loss 2.5\n");
    expect_refused(ctx, qm, dir, "exists and is not a nibble export (it holds notes.txt)");
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    char *txt = nbt_slurp(path, NULL);
    CHECK(txt && !strcmp(txt, "my notes: do not lose\n"));
    free(txt);
    snprintf(path, sizeof path, "%s/runs/log.txt", dir);
    txt = nbt_slurp(path, NULL);
    CHECK(txt && !strcmp(txt, "step 1 loss 2.5\n"));
    free(txt);

    /* a subdirectory alone is foreign too, named with a slash (the smallest foreign name is named) */
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    CHECK(unlink(path) == 0);
    snprintf(path, sizeof path, "%s/zz.txt", dir);
    write_text(path, "z\n");
    expect_refused(ctx, qm, dir, "exists and is not a nibble export (it holds runs/)");
    rm_rf(dir);

    /* a previous export a user added a file to */
    snprintf(dir, sizeof dir, "%s/exp", root);
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, dir, NULL));
    snprintf(path, sizeof path, "%s/README.md", dir);
    write_text(path, "# my model card\n");
    expect_refused(ctx, qm, dir, "exists and is not a nibble export (it holds README.md)");
    CHECK(unlink(path) == 0);
    CHECK_OK(ctx, nb_export_check_target(ctx, dir));   /* without it, it is an export again */

    /* export names only, but no config.json / no weights */
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(unlink(path) == 0);
    expect_refused(ctx, qm, dir, "exists and is not a nibble export (it holds no config.json)");
    rm_rf(dir);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, "{}\n");
    expect_refused(ctx, qm, dir, "exists and is not a nibble export (it holds no model.safetensors)");
    rm_rf(dir);

    /* a regular file */
    snprintf(path, sizeof path, "%s/out.bin", root);
    write_text(path, "a file, not a folder\n");
    expect_refused(ctx, qm, path, "exists and is a file, not a directory");
    txt = nbt_slurp(path, NULL);
    CHECK(txt && !strcmp(txt, "a file, not a folder\n"));
    free(txt);
    unlink(path);

    /* a symbolic link, even to a previous export */
    snprintf(dir, sizeof dir, "%s/exp", root);
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, dir, NULL));
    snprintf(path, sizeof path, "%s/link", root);
    CHECK(symlink(dir, path) == 0);
    snprintf(why, sizeof why, "export: %s exists and is a symbolic link: remove it or choose another output "
             "directory (or name the directory it points to)", path);
    CHECK_EQ_INT(nb_export_check_target(ctx, path), NB_ERR_INVALID);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), why), "got \"%s\"", nb_ctx_last_error(ctx));
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, path, NULL), NB_ERR_INVALID, why);
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISLNK(st.st_mode));
    unlink(path);
    rm_rf(dir);
}

/* A plain HF model directory (a copy of stories260K/hf) is refused, also as `model=X out=X`; and an
 * old-style ModelOpt export (no safetensors mark, producer in config.json) is still recognised. */
static void test_hf_model(nb_ctx *ctx, nb_qmodel *qm) {
    static const char *files[] = {"config.json", "generation_config.json", "model.safetensors",
                                  "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"};
    char dir[512], src[700], dst[700];
    snprintf(dir, sizeof dir, "%s/self", root);
    CHECK(mkdir(dir, 0755) == 0);
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        snprintf(src, sizeof src, "%s/%s", hf, files[k]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[k]);
        copy_file(src, dst);
    }
    size_t n0 = 0, n1 = 0;
    char *ref = snap(hf, &n0), *cp = snap(dir, &n1);
    CHECK_MSG(same_snap(ref, n0, cp, n1), "the copy of %s differs from it", hf);
    free(cp);
    static const char why[] = "exists and is not a nibble export (a model directory nibble did not write: its "
                              "weights do not name nibble as producer)";
    expect_refused(ctx, qm, dir, why);

    /* the source model's own folder: quantize the copy, export into it */
    nb_model *m = NULL;
    nb_qmodel *self = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, dir, &m));
    if (m) self = quantized(ctx, m);
    if (self) {
        check_refused(ctx, nb_qmodel_export(ctx, self, dir, NULL), dir, why);
        cp = snap(dir, &n1);
        CHECK_MSG(same_snap(ref, n0, cp, n1), "the source model in %s changed", dir);
        free(cp);
    }
    nb_qmodel_free(self);
    nb_model_free(m);
    free(ref);

    /* a ModelOpt-layout export from before the mark: config.json's producer says nibble */
    char old[512];
    snprintf(old, sizeof old, "%s/old", root);
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, old, NULL));
    snprintf(src, sizeof src, "%s/model.safetensors", hf);
    snprintf(dst, sizeof dst, "%s/model.safetensors", old);
    copy_file(src, dst);   /* format = pt only, as nibble wrote before */
    CHECK_OK(ctx, nb_export_check_target(ctx, old));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, old, NULL));
    nb_st *st = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, dst, &st));
    if (st) CHECK(nb_st_metadata(st, "producer") && !strcmp(nb_st_metadata(st, "producer"), "nibble"));
    nb_st_close(st);
    /* ... but a compressed-tensors one carried no producer: it cannot be told from another tool's */
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, old, &eo));
    copy_file(src, dst);
    expect_refused(ctx, qm, old, why);
    rm_rf(old);
    rm_rf(dir);
}

/* Entries of dir beside `keep` (NULL: all of them). */
static int entries_besides(const char *dir, const char *keep) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && (!keep || strcmp(e->d_name, keep));
    closedir(d);
    return n;
}

/* Missing parent folders are created (`--out out/q260` in a fresh clone), and the export equals one
 * into an existing folder; a missing folder under a file is refused. */
static void test_bad_paths(nb_ctx *ctx, nb_qmodel *qm) {
    char dir[512], want[700], ref[512];
    snprintf(dir, sizeof dir, "%s/no/such/out", root);
    snprintf(ref, sizeof ref, "%s/ref", root);
    CHECK_OK(ctx, nb_export_check_target(ctx, dir));
    snprintf(want, sizeof want, "%s/no", root);
    CHECK(!exists(want));   /* the check writes nothing */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, dir, NULL));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, ref, NULL));
    size_t na = 0, nb = 0;
    char *a = snap(dir, &na), *b = snap(ref, &nb);
    CHECK_MSG(a && b && same_snap(a, na, b, nb), "the export into new parent folders differs from one into %s", root);
    free(a);
    free(b);
    snprintf(want, sizeof want, "%s/no/such", root);
    CHECK_EQ_INT(entries_besides(want, "out"), 0);   /* no staging folder, no lock file left */
    CHECK_EQ_INT(leftovers(), 0);
    snprintf(want, sizeof want, "%s/no", root);
    rm_rf(want);
    rm_rf(ref);

    /* a parent that is a file */
    char file[512];
    snprintf(file, sizeof file, "%s/f", root);
    write_text(file, "x");
    snprintf(dir, sizeof dir, "%s/f/out", root);
    snprintf(want, sizeof want, "export: cannot write %s: %s is not a directory", dir, file);
    CHECK_FAIL(ctx, nb_export_check_target(ctx, dir), NB_ERR_IO, want);
    snprintf(dir, sizeof dir, "%s/f/a/b/out", root);
    snprintf(want, sizeof want, "export: cannot write %s: %s is not a directory", dir, file);
    CHECK_FAIL(ctx, nb_export_check_target(ctx, dir), NB_ERR_IO, want);
    CHECK_FAIL(ctx, nb_qmodel_export(ctx, qm, dir, NULL), NB_ERR_IO, want);
    unlink(file);

    CHECK_FAIL(ctx, nb_export_check_target(ctx, ""), NB_ERR_INVALID, "export: the output directory is an empty path");
    snprintf(dir, sizeof dir, "%s/.", root);
    snprintf(want, sizeof want, "export: %s is not a directory an export can replace: name a new output directory", dir);
    CHECK_FAIL(ctx, nb_export_check_target(ctx, dir), NB_ERR_INVALID, want);
    CHECK_FAIL(ctx, nb_export_check_target(ctx, "/"), NB_ERR_INVALID,
               "export: / is not a directory an export can replace: name a new output directory");
}

/* A pid no process has: a child that has exited and been reaped. */
static long dead_pid(void) {
    pid_t c = fork();
    if (c == 0) _exit(0);
    int st;
    waitpid(c, &st, 0);
    return (long)c;
}

/* Staging folders of killed processes (the old layout held a whole export, loadable as a model) are
 * removed by the next export to the same target; a live process's (here: our parent's pid) stays. */
static void test_stale(nb_ctx *ctx, nb_qmodel *qm) {
    char out[512], dead1[600], dead2[600], live[600], other[600], path[700];
    snprintf(out, sizeof out, "%s/st", root);
    long dp = dead_pid();
    snprintf(dead1, sizeof dead1, "%s.nibble-tmp-%ld", out, dp);
    snprintf(dead2, sizeof dead2, "%s.nibble-old-%ld-3", out, dp);
    snprintf(live, sizeof live, "%s.nibble-tmp-%ld", out, (long)getppid());
    snprintf(other, sizeof other, "%s/stx.nibble-tmp-%ld", root, dp);   /* another target's */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, dead1, NULL));
    CHECK(mkdir(dead2, 0755) == 0);
    CHECK(mkdir(live, 0755) == 0);
    CHECK(mkdir(other, 0755) == 0);
    snprintf(path, sizeof path, "%s/config.json", dead1);
    CHECK(exists(path));
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    CHECK_MSG(!exists(dead1) && !exists(dead2), "%s or %s was left in place", dead1, dead2);
    CHECK(exists(live) && exists(other));
    rmdir(live);
    rmdir(other);
    CHECK_EQ_INT(entries_besides(root, "st"), 0);
    rm_rf(out);
}

/* Another process holding the target's lock (flock on TARGET.nibble-lock, its pid inside, as nibble
 * writes it): check and export refuse, naming the target and the pid, and write nothing. */
static void test_lock(nb_ctx *ctx, nb_qmodel *qm) {
    char out[512], lock[600], want[900];
    snprintf(out, sizeof out, "%s/busy", root);
    snprintf(lock, sizeof lock, "%s.nibble-lock", out);
    int ready[2], done[2];
    CHECK(pipe(ready) == 0 && pipe(done) == 0);
    pid_t c = fork();
    if (c == 0) {
        int fd = open(lock, O_RDWR | O_CREAT, 0644);
        char b[32];
        int n = snprintf(b, sizeof b, "%ld\n", (long)getpid());
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(fd, b, (size_t)n) != n) _exit(1);
        char x = 1;
        if (write(ready[1], &x, 1) != 1) _exit(1);
        if (read(done[0], &x, 1) < 0) _exit(1);
        _exit(0);
    }
    char x = 0;
    CHECK(read(ready[0], &x, 1) == 1);
    snprintf(want, sizeof want, "export: %s is in use by another nibble process (pid %ld): wait for it to finish or "
             "choose another output directory", out, (long)c);
    CHECK_EQ_INT(nb_export_check_target(ctx, out), NB_ERR_IO);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"\nwanted \"%s\"", nb_ctx_last_error(ctx), want);
    CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out, NULL), NB_ERR_IO);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"\nwanted \"%s\"", nb_ctx_last_error(ctx), want);
    CHECK(!exists(out));
    CHECK_EQ_INT(entries_besides(root, "busy.nibble-lock"), 0);   /* the holder's lock file alone */
    CHECK(write(done[1], &x, 1) == 1);
    int st;
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* the holder is gone (its lock file stays): the export goes ahead and removes the file */
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, NULL));
    CHECK(!exists(lock));
    CHECK_EQ_INT(entries_besides(root, "busy"), 0);
    close(ready[0]); close(ready[1]); close(done[0]); close(done[1]);
    rm_rf(out);
}

/* value of element flat index i of the F32 parameter `name`, set to v; the old value returned */
static float poke(nb_model *m, const char *name, int64_t i, float v) {
    nb_tensor *t = nb_model_param(m, nb_model_find_param(m, name));
    float *d = nb_tensor_data(t), old = d[i];
    d[i] = v;
    return old;
}

/* A NaN in model.norm.weight and a -Inf in an unquantized down_proj (the audit's cases): refused naming
 * tensor and element, nothing written; allow_nonfinite writes them and lists the tensors. A finite
 * F32 value that overflows the dtype asked for (1e6 in F16, max 65504) is refused as +Inf. */
static void test_nonfinite(nb_ctx *ctx, nb_model *m, nb_qmodel *qm) {
    char out[512], want[900], path[700];
    snprintf(out, sizeof out, "%s/nf", root);
    float old = poke(m, "model.norm.weight", 3, NAN);
    nb_export_opts eo;
    nb_export_opts_init(&eo);
    CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out, &eo), NB_ERR_NUMERIC);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), "export: model.norm.weight: NaN at flat index 3 (element [3]): an export "
              "writes finite values only (allow_nonfinite = true writes it as it is)"), "got \"%s\"", nb_ctx_last_error(ctx));
    CHECK(!exists(out));
    CHECK_EQ_INT(entries_besides(root, NULL), 0);
    eo.layout = NB_LAYOUT_COMPRESSED_TENSORS;
    CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out, &eo), NB_ERR_NUMERIC);
    eo.layout = NB_LAYOUT_MODELOPT;

    /* down_proj is 172 wide: 2 * 172 + 5 is element [2, 5] */
    const char *dp = "model.layers.1.mlp.down_proj.weight";
    float old2 = poke(m, dp, 2 * 172 + 5, -INFINITY);
    poke(m, "model.norm.weight", 3, old);
    CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out, &eo), NB_ERR_NUMERIC);
    snprintf(want, sizeof want, "export: %s: -Inf at flat index 349 (element [2, 5]): an export writes finite values only "
             "(allow_nonfinite = true writes it as it is)", dp);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"", nb_ctx_last_error(ctx));

    /* allowed: written as they are, and reported */
    poke(m, "model.norm.weight", 3, NAN);
    eo.allow_nonfinite = 1;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, &eo));
    CHECK_EQ_INT(nb_qmodel_export_nonfinite_count(qm), 2);
    CHECK(nb_qmodel_export_nonfinite(qm, 0) && !strcmp(nb_qmodel_export_nonfinite(qm, 0), dp));
    CHECK(nb_qmodel_export_nonfinite(qm, 1) && !strcmp(nb_qmodel_export_nonfinite(qm, 1), "model.norm.weight"));
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    nb_st *st = NULL;
    nb_tensor *t = NULL;
    CHECK_OK(ctx, nb_st_open(ctx, path, &st));
    if (st) CHECK_OK(ctx, nb_st_get(ctx, st, "model.norm.weight", &t));
    if (t) {
        int64_t i3 = 3;
        CHECK(isnan(nb_tensor_get(t, &i3)));
    }
    nb_tensor_release(t);
    nb_st_close(st);
    poke(m, "model.norm.weight", 3, old);
    poke(m, dp, 2 * 172 + 5, old2);
    eo.allow_nonfinite = 0;
    CHECK_OK(ctx, nb_qmodel_export(ctx, qm, out, &eo));
    CHECK_EQ_INT(nb_qmodel_export_nonfinite_count(qm), 0);   /* the list is the last export's */

    old = poke(m, "model.norm.weight", 0, 1e6f);
    eo.dtype = NB_F16;
    CHECK_EQ_INT(nb_qmodel_export(ctx, qm, out, &eo), NB_ERR_NUMERIC);
    CHECK_MSG(strstr(nb_ctx_last_error(ctx), "export: model.norm.weight: +Inf at flat index 0 (element [0])") != NULL,
              "got \"%s\"", nb_ctx_last_error(ctx));
    poke(m, "model.norm.weight", 0, old);
    rm_rf(out);
}

/* Under a file-size limit smaller than model.safetensors (284,800 bytes with the default BF16 for the
 * unquantized tensors; 200 KiB is below it) the export fails with a named
 * I/O error and leaves nothing; before, SIGXFSZ killed the process (this test) outright. */
static void test_file_size_limit(nb_ctx *ctx, nb_qmodel *qm) {
    char out[512], want[900];
    snprintf(out, sizeof out, "%s/xf", root);
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 200 * 1024;   /* ulimit -f 200 */
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    nb_status s = nb_qmodel_export(ctx, qm, out, NULL);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    snprintf(want, sizeof want, "cannot write %s.nibble-tmp-%ld/export/model.safetensors: File too large", out,
             (long)getpid());
    CHECK_EQ_INT(s, NB_ERR_IO);
    CHECK_MSG(!strcmp(nb_ctx_last_error(ctx), want), "got \"%s\"\nwanted \"%s\"", nb_ctx_last_error(ctx), want);
    CHECK(!exists(out));
    CHECK_EQ_INT(entries_besides(root, NULL), 0);
    sigset_t pend;
    sigpending(&pend);
    CHECK(!sigismember(&pend, SIGXFSZ));   /* nothing left to kill us later */
}

int main(void) {
    const char *st = nbt_data("stories260K/hf/model.safetensors");
    snprintf(hf, sizeof hf, "%s", st);
    *strrchr(hf, '/') = 0;
    snprintf(root, sizeof root, "/tmp/nb_test_export_target_XXXXXX");
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(1, &ctx)) return 1;
    nb_model *m = NULL;
    nb_qmodel *qm = NULL, *plain = NULL;
    CHECK_OK(ctx, nb_model_load(ctx, hf, &m));
    if (m) qm = quantized(ctx, m);
    if (m) CHECK_OK(ctx, nb_qmodel_new(ctx, m, &plain));
    if (qm && plain) {
        test_replace(ctx, qm, plain);
        test_empty_dir(ctx, qm);
        test_foreign(ctx, qm);
        test_hf_model(ctx, qm);
        test_bad_paths(ctx, qm);
        test_stale(ctx, qm);
        test_lock(ctx, qm);
        test_nonfinite(ctx, m, qm);
        test_file_size_limit(ctx, qm);
    }
    nb_qmodel_free(plain);
    nb_qmodel_free(qm);
    nb_model_free(m);
    nb_ctx_release(ctx);
    rm_rf(root);
    CHECK(!exists(root));
    return nbt_done("test_export_target");
}

/* The helpers of fuzz.h. */
#include "fuzz.h"

#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

static nb_ctx *g_ctx;
static char g_dir[512];

static void release_ctx(void) { nb_ctx_release(g_ctx); }

nb_ctx *fz_ctx(void) {
    if (!g_ctx) {
        if (nb_ctx_new(1, &g_ctx) != NB_OK) {
            fprintf(stderr, "fuzz: cannot make a context\n");
            abort();
        }
        atexit(release_ctx);
    }
    nb_ctx_clear_error(g_ctx);
    return g_ctx;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

/* NIBBLE_FUZZ_KEEP=1 leaves the folder, to look at what a reproducer made */
static void remove_dir(void) {
    const char *keep = getenv("NIBBLE_FUZZ_KEEP");
    if (keep && !strcmp(keep, "1")) fprintf(stderr, "fuzz: kept %s\n", g_dir);
    else if (g_dir[0]) nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fz_dir(void) {
    if (!g_dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/nbfuzz_XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(g_dir)) {
            fprintf(stderr, "fuzz: mkdtemp %s: %s\n", g_dir, strerror(errno));
            abort();
        }
        atexit(remove_dir);
    }
    return g_dir;
}

const char *fz_write(const char *name, const uint8_t *data, size_t size) {
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 1024, "%s/%s", fz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", p, strerror(errno));
        abort();
    }
    return p;
}

const char *fz_mkdir(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", fz_dir(), name);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz: mkdir %s: %s\n", p, strerror(errno));
        abort();
    }
    return p;
}

const char *fz_source(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 1024, "%s/%s", NIBBLE_SOURCE_DIR, rel);
    return p;
}

void fz_check(nb_status s, const char *what) {
    if (s == NB_OK) return;
    fprintf(stderr, "fuzz: fixture %s: %s\n", what, nb_ctx_last_error(g_ctx));
    abort();
}

nb_model *fz_model(void) {
    static nb_model *m;
    if (!m) fz_check(nb_model_load(fz_ctx(), fz_source("tests/golden/data/model_llama3"), &m), "load model_llama3");
    return m;
}

nb_qmodel *fz_qmodel(void) {
    nb_ctx *ctx = fz_ctx();
    nb_qmodel *qm = NULL;
    fz_check(nb_qmodel_new(ctx, fz_model(), &qm), "qmodel");
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        nb_qspec s;
        nb_qspec_init(&s);
        s.weight_format = strstr(name, "down_proj") ? NB_FMT_FP8_CHANNEL
                          : strstr(name, ".mlp.")   ? NB_FMT_MXFP8
                          : !strcmp(name, "lm_head") ? NB_FMT_FP8_TENSOR
                                                     : NB_FMT_NVFP4;
        fz_check(nb_qmodel_set(ctx, qm, name, &s), name);
    }
    fz_check(nb_qmodel_fuse_siblings(ctx, qm, NULL), "fuse");
    nb_calib_config cc;
    nb_calib_config_init(&cc, NB_CALIB_MAX);
    fz_check(nb_qmodel_calibrate_weights(ctx, qm, &cc), "calibrate");
    return qm;
}

const char *fz_seed_path(const char *name) {
    static char p[1024];
    const char *d = getenv("NIBBLE_FUZZ_SEEDS");
    if (!d || !*d) return NULL;
    snprintf(p, sizeof p, "%s/%s", d, name);
    return p;
}

void fz_copy(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    char buf[65536];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    if (!ok) {
        fprintf(stderr, "fuzz: cannot copy %s to %s: %s\n", src, dst, strerror(errno));
        abort();
    }
}

/* QAD checkpoints: a directory per save (student.safetensors from nb_qmodel_save, trainer.safetensors with
 * the AdamW moments and, in its metadata, the step, AdamW step counts, data cursor, context RNG and the
 * run's settings), made atomic by writing a temporary sibling and renaming it, and a `latest` file
 * replaced by rename after it. Restoring all of it makes a resumed run equal an uninterrupted one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nibble/safetensors.h"
#include "qad/qad_internal.h"

enum { NB_QAD_CKPT_VERSION = 1 };

/* ---- settings a resume must agree with ---------------------------------------------------------- */

char *nb_qad_settings_text(const nb_qad *q) {
    const nb_qad_cfg *c = &q->cfg;
    char *buf = malloc(2048);
    if (!buf) return NULL;
    snprintf(buf, 2048,
             "kd=%d\ntemperature=%.17g\nt2=%d\ntopk=%d\ntopk_norm=%d\nlm_loss=%d\nkd_loss_scale=%.17g\n"
             "ignore_index=%d\nsteps=%" PRId64 "\nlr=%.17g\nmin_lr=%.17g\nwarmup=%" PRId64 "\ngrad_accum=%d\n"
             "clip=%.17g\nweight_decay=%.17g\nbeta1=%.17g\nbeta2=%.17g\neps=%.17g\nsft_mask=%d\n"
             "recalibrate=%" PRId64 "\nrecalib_method=%d\nparams=%d\n",
             (int)c->loss.kd, c->loss.temperature, (int)c->loss.t2_scale, (int)c->loss.top_k, (int)c->loss.topk_norm,
             (int)c->loss.lm_loss, c->loss.kd_loss_scale, (int)c->loss.ignore_index, c->steps, c->lr, c->min_lr,
             c->warmup, (int)c->grad_accum, c->clip, c->weight_decay, c->beta1, c->beta2, c->eps, (int)c->sft_mask,
             c->recalibrate, (int)c->recalib.method, (int)q->n);
    /* only when set: checkpoints written before this setting existed still resume */
    if (c->lr_scale_unquantized != 1.0) {
        size_t len = strlen(buf);
        snprintf(buf + len, 2048 - len, "lr_scale_unquantized=%.17g\n", c->lr_scale_unquantized);
    }
    return buf;
}

/* The first line that differs between two settings texts: "key: checkpoint X, this run Y". */
static int settings_diff(const char *saved, const char *now, char *msg, size_t len) {
    const char *a = saved, *b = now;
    while (*a || *b) {
        const char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
        size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
        if (la != lb || memcmp(a, b, la) != 0) {
            const char *eqa = memchr(a, '=', la), *eqb = memchr(b, '=', lb);
            if (eqa && eqb && (eqa - a) == (eqb - b) && memcmp(a, b, (size_t)(eqa - a)) == 0)
                snprintf(msg, len, "%.*s: the checkpoint has %.*s, this run %.*s", (int)(eqa - a), a,
                         (int)(la - (size_t)(eqa - a) - 1), eqa + 1, (int)(lb - (size_t)(eqb - b) - 1), eqb + 1);
            else
                snprintf(msg, len, "'%.*s' vs '%.*s'", (int)la, a, (int)lb, b);
            return 1;
        }
        a += la + (ea ? 1 : 0);
        b += lb + (eb ? 1 : 0);
    }
    return 0;
}

/* ---- small file-system helpers ---------------------------------------------------------------------- */

static void join(char *out, size_t len, const char *dir, const char *name) { snprintf(out, len, "%s/%s", dir, name); }

static nb_status mkdirs(nb_ctx *ctx, const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return nb_fail(ctx, NB_ERR_IO, "cannot create directory %s: %s", p, strerror(errno));
        *c = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return nb_fail(ctx, NB_ERR_IO, "cannot create directory %s: %s", p, strerror(errno));
    return NB_OK;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Remove a checkpoint directory (its files are one level deep). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            join(p, sizeof p, dir, e->d_name);
            (void)unlink(p);
        }
        closedir(d);
    }
    (void)rmdir(dir);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

nb_status nb_qad_latest(nb_ctx *ctx, const char *dir, char *buf, int64_t buf_len) {
    char p[4096];
    join(p, sizeof p, dir, "trainer.safetensors");
    if (is_file(p)) {
        snprintf(buf, (size_t)buf_len, "%s", dir);
        return NB_OK;
    }
    join(p, sizeof p, dir, "latest");
    FILE *f = fopen(p, "rb");
    if (!f) return nb_fail(ctx, NB_ERR_NOT_FOUND, "no QAD checkpoint in %s (no %s)", dir, p);
    char name[512] = {0};
    size_t n = fread(name, 1, sizeof name - 1, f);
    fclose(f);
    while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ')) name[--n] = 0;
    if (n == 0 || strchr(name, '/'))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s does not name a checkpoint directory", p);
    snprintf(buf, (size_t)buf_len, "%s/%s", dir, name);
    join(p, sizeof p, buf, "trainer.safetensors");
    if (!is_file(p)) return nb_fail(ctx, NB_ERR_FORMAT, "%s/latest names %s, which has no trainer.safetensors", dir, name);
    return NB_OK;
}

/* ---- save ------------------------------------------------------------------------------------------ */

static nb_status write_trainer(nb_ctx *ctx, nb_qad *q, const char *path) {
    nb_st_writer *w = NULL;
    nb_status s = nb_st_writer_new(ctx, &w);
    if (s) return s;
    char num[64];
    snprintf(num, sizeof num, "%d", NB_QAD_CKPT_VERSION);
    s = nb_st_writer_meta(ctx, w, "nibble_qad", num);
    snprintf(num, sizeof num, "%" PRId64, q->step);
    if (!s) s = nb_st_writer_meta(ctx, w, "step", num);
    /* AdamW step counts, one per parameter, and the moments as tensors */
    size_t cap = (size_t)q->n * 24 + 16;
    char *steps = malloc(cap);
    if (!steps) s = s ? s : nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    size_t used = 0;
    if (steps) steps[0] = 0;
    for (int32_t i = 0; !s && i < q->n; i++) {
        nb_tensor *m = NULL, *v = NULL;
        int64_t st = 0;
        s = nb_adamw_get_state(ctx, q->opt, i, &m, &v, &st);
        if (s) break;
        used += (size_t)snprintf(steps + used, cap - used, "%s%" PRId64, i ? "," : "", st);
        char name[1200];
        snprintf(name, sizeof name, "adam/%s.m", nb_model_param_name(q->sm, i));
        if (!s) s = nb_st_writer_add(ctx, w, name, m);
        snprintf(name, sizeof name, "adam/%s.v", nb_model_param_name(q->sm, i));
        if (!s) s = nb_st_writer_add(ctx, w, name, v);
    }
    if (!s) s = nb_st_writer_meta(ctx, w, "adam_steps", steps);
    free(steps);
    char line[512];
    if (!s && q->ld) {
        nb_data_state d;
        nb_dataloader_state(q->ld, &d);
        snprintf(line, sizeof line, "%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRIx64 " %" PRIx64 " %" PRIx64
                 " %" PRIx64 " %" PRIx64 " %" PRIx64, d.epoch, d.row, d.rows_read, d.offset, d.seed, d.rng[0], d.rng[1],
                 d.rng[2], d.rng[3], d.fingerprint);
        s = nb_st_writer_meta(ctx, w, "data", line);
    }
    if (!s) {
        const nb_rng *r = nb_ctx_rng(ctx);
        snprintf(line, sizeof line, "%" PRIx64 " %" PRIx64 " %" PRIx64 " %" PRIx64, r->s[0], r->s[1], r->s[2], r->s[3]);
        s = nb_st_writer_meta(ctx, w, "rng", line);
    }
    char *set = s ? NULL : nb_qad_settings_text(q);
    if (!s && !set) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    if (!s) s = nb_st_writer_meta(ctx, w, "settings", set);
    free(set);
    if (!s) s = nb_st_writer_write(ctx, w, path);
    nb_st_writer_free(w);
    return s;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Remove leftovers of interrupted saves and all but the newest `keep` step-* directories (the one
 * `latest` names always stays). */
static void prune(const char *dir, const char *current, int32_t keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, ".step-", 6) == 0 || strncmp(e->d_name, "latest.tmp-", 11) == 0) {
            join(p, sizeof p, dir, e->d_name);
            if (is_dir(p)) remove_tree(p);
            else (void)unlink(p);
            continue;
        }
        if (strncmp(e->d_name, "step-", 5) != 0 || strcmp(e->d_name, current) == 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **g = realloc(names, cap * sizeof *g);
            if (!g) break;
            names = g;
        }
        names[n] = malloc(strlen(e->d_name) + 1);
        if (!names[n]) break;
        strcpy(names[n++], e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    size_t others = keep > 1 ? (size_t)(keep - 1) : 0;
    for (size_t i = 0; i + others < n; i++) {
        /* only directories older than the current one go (a newer one belongs to nobody now) */
        join(p, sizeof p, dir, names[i]);
        remove_tree(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

nb_status nb_qad_save(nb_ctx *ctx, nb_qad *q, const char *dir, int32_t keep) {
    if (!dir || !*dir) return nb_fail(ctx, NB_ERR_INVALID, "qad: a checkpoint directory is required");
    if (keep <= 0) keep = 2;
    nb_status s = mkdirs(ctx, dir);
    if (s) return s;
    char name[256], final[4096], tmp[4096], p[4096];
    snprintf(name, sizeof name, "step-%08" PRId64, q->step);
    join(final, sizeof final, dir, name);
    for (int k = 1; is_dir(final) || is_file(final); k++) {   /* never overwrite: a fresh name */
        snprintf(name, sizeof name, "step-%08" PRId64 "-%d", q->step, k);
        join(final, sizeof final, dir, name);
    }
    snprintf(p, sizeof p, ".%s.tmp-%ld", name, (long)getpid());
    join(tmp, sizeof tmp, dir, p);
    remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    join(p, sizeof p, tmp, "student.safetensors");
    s = nb_qmodel_save(ctx, q->qm, p);
    join(p, sizeof p, tmp, "trainer.safetensors");
    if (!s) s = write_trainer(ctx, q, p);
    if (!s && rename(tmp, final) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    if (s) {
        remove_tree(tmp);
        return s;
    }
    fsync_dir(dir);
    /* point latest at it */
    char ltmp[4096], latest[4096];
    snprintf(p, sizeof p, "latest.tmp-%ld", (long)getpid());
    join(ltmp, sizeof ltmp, dir, p);
    join(latest, sizeof latest, dir, "latest");
    FILE *f = fopen(ltmp, "wb");
    if (!f) return nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", ltmp, strerror(errno));
    int ok = fprintf(f, "%s\n", name) > 0;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(ltmp, latest) != 0) {
        int e = errno;
        (void)unlink(ltmp);
        return nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", latest, strerror(e));
    }
    fsync_dir(dir);
    prune(dir, name, keep);
    return NB_OK;
}

/* ---- restore ----------------------------------------------------------------------------------------- */

static nb_status parse_u64s(nb_ctx *ctx, const char *text, const char *what, int hex_from, uint64_t *v, int n) {
    const char *p = text;
    for (int i = 0; i < n; i++) {
        char *end = NULL;
        errno = 0;
        v[i] = strtoull(p, &end, i >= hex_from ? 16 : 10);
        if (end == p || errno) return nb_fail(ctx, NB_ERR_FORMAT, "qad checkpoint: malformed %s metadata", what);
        p = end;
    }
    return NB_OK;
}

nb_status nb_qad_restore(nb_ctx *ctx, nb_qad *q, const char *dir) {
    char ck[4096], p[4096];
    nb_status s = nb_qad_latest(ctx, dir, ck, sizeof ck);
    if (s) return s;
    join(p, sizeof p, ck, "trainer.safetensors");
    nb_st *st = NULL;
    if ((s = nb_st_open(ctx, p, &st))) return s;
    const char *ver = nb_st_metadata(st, "nibble_qad"), *step = nb_st_metadata(st, "step");
    const char *asteps = nb_st_metadata(st, "adam_steps"), *data = nb_st_metadata(st, "data");
    const char *rng = nb_st_metadata(st, "rng"), *set = nb_st_metadata(st, "settings");
    char *now = NULL;
    char msg[1024];
    if (!ver || !step || !asteps || !rng || !set) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s is not a QAD trainer state (metadata missing)", p);
    } else if (atoi(ver) != NB_QAD_CKPT_VERSION) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: QAD checkpoint version %s, this nibble reads %d", p, ver,
                    NB_QAD_CKPT_VERSION);
    } else if (!(now = nb_qad_settings_text(q))) {
        s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    } else if (settings_diff(set, now, msg, sizeof msg)) {
        s = nb_fail(ctx, NB_ERR_INVALID, "cannot resume from %s: the run's settings changed (%s)", ck, msg);
    } else if (!data != !q->ld) {
        s = nb_fail(ctx, NB_ERR_INVALID, "cannot resume from %s: it was saved %s a dataloader, this run has %s", ck,
                    data ? "with" : "without", q->ld ? "one" : "none");
    }
    free(now);
    /* check everything that can be checked before changing anything */
    uint64_t dv[10], rv[4];
    if (!s && data) s = parse_u64s(ctx, data, "data", 4, dv, 10);
    if (!s) s = parse_u64s(ctx, rng, "rng", 0, rv, 4);
    nb_data_state ds;
    memset(&ds, 0, sizeof ds);
    if (!s && data) {
        ds.epoch = (int64_t)dv[0];
        ds.row = (int64_t)dv[1];
        ds.rows_read = (int64_t)dv[2];
        ds.offset = (int64_t)dv[3];
        ds.seed = dv[4];
        for (int i = 0; i < 4; i++) ds.rng[i] = dv[5 + i];
        ds.fingerprint = dv[9];
    }
    for (int32_t i = 0; !s && i < q->n; i++) {
        char name[1200];
        snprintf(name, sizeof name, "adam/%s.m", nb_model_param_name(q->sm, i));
        if (nb_st_find(st, name) < 0) s = nb_fail(ctx, NB_ERR_FORMAT, "%s has no %s", p, name);
        snprintf(name, sizeof name, "adam/%s.v", nb_model_param_name(q->sm, i));
        if (!s && nb_st_find(st, name) < 0) s = nb_fail(ctx, NB_ERR_FORMAT, "%s has no %s", p, name);
    }
    /* the data cursor first: it checks the dataset and its configuration */
    if (!s && data) s = nb_dataloader_restore(ctx, q->ld, &ds);
    /* student weights, quantizer state and specs; then fake quant again over the restored quantizers */
    char sp[4096];
    join(sp, sizeof sp, ck, "student.safetensors");
    if (!s) s = nb_qmodel_restore(ctx, q->qm, sp);
    if (!s) s = nb_qmodel_set_fake(ctx, q->qm, 1);
    /* optimizer */
    const char *a = asteps;
    for (int32_t i = 0; !s && i < q->n; i++) {
        char *end = NULL;
        long long n = strtoll(a, &end, 10);
        if (end == a) { s = nb_fail(ctx, NB_ERR_FORMAT, "%s: malformed adam_steps metadata", p); break; }
        a = *end == ',' ? end + 1 : end;
        char name[1200];
        nb_tensor *m = NULL, *v = NULL;
        snprintf(name, sizeof name, "adam/%s.m", nb_model_param_name(q->sm, i));
        s = nb_st_get(ctx, st, name, &m);
        snprintf(name, sizeof name, "adam/%s.v", nb_model_param_name(q->sm, i));
        if (!s) s = nb_st_get(ctx, st, name, &v);
        if (!s) s = nb_adamw_set_state(ctx, q->opt, i, m, v, (int64_t)n);
        nb_tensor_release(m);
        nb_tensor_release(v);
    }
    if (!s) {
        memcpy(nb_ctx_rng(ctx)->s, rv, sizeof rv);
        q->step = strtoll(step, NULL, 10);
        nb_model_zero_grad(q->sm);
    }
    nb_st_close(st);
    return s;
}

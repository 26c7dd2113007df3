/* QAD checkpoints: a directory per save (student.safetensors from nb_qmodel_save, trainer.safetensors with
 * the AdamW moments and, in its metadata, the step, AdamW step counts, data cursor, context RNG and the
 * run's settings, and last manifest.json with every file's size and hash), made atomic by writing a
 * temporary sibling, fsyncing it and renaming it, and a `latest` file replaced by rename after it. A
 * resume takes the newest step folder its manifest verifies, whatever `latest` says (a kill between
 * the two renames). Restoring all of it makes a resumed run equal an uninterrupted one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/durable.h"
#include "io/json_int.h"
#include "nibble/safetensors.h"
#include "qad/qad_internal.h"

enum { NB_QAD_CKPT_VERSION = 1 };

/* ---- settings a resume must agree with ---------------------------------------------------------- */

/* Append printf text to buf (cap bytes, *len used); a line that does not fit is cut, never overrun. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

/* One "name=value" line per setting of the one list of QAD settings (qad_settings.inc, written from
 * lua/nibble/qad_settings.lua), in its order; then the calibration method recalibrate re-runs and,
 * when params >= 0, the count of trained parameters; last the settings recorded only when not at
 * their default (checkpoints written before they existed still resume). */
static char *settings_text(const nb_qad_cfg *c, int32_t params) {
    const size_t cap = 2048;
    size_t len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = '\0';
#define NB_QAD_INT(name, field) put(buf, cap, &len, #name "=%" PRId64 "\n", (int64_t)c->field);
#define NB_QAD_REAL(name, field) put(buf, cap, &len, #name "=%.17g\n", (double)c->field);
#define NB_QAD_SETTING(name, field, kind) NB_QAD_##kind(name, field)
#define NB_QAD_SETTING_UNLESS(name, field, kind, dflt)
#include "qad/qad_settings.inc"
#undef NB_QAD_SETTING
#undef NB_QAD_SETTING_UNLESS
    put(buf, cap, &len, "recalib_method=%d\n", (int)c->recalib.method);
    if (params >= 0) put(buf, cap, &len, "params=%d\n", (int)params);
#define NB_QAD_SETTING(name, field, kind)
#define NB_QAD_SETTING_UNLESS(name, field, kind, dflt) \
    if ((double)c->field != (double)(dflt)) NB_QAD_##kind(name, field)
#include "qad/qad_settings.inc"
#undef NB_QAD_SETTING
#undef NB_QAD_SETTING_UNLESS
#undef NB_QAD_INT
#undef NB_QAD_REAL
    return buf;
}

char *nb_qad_settings_text(const nb_qad *q) { return settings_text(&q->cfg, q->n); }

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

/* ---- the manifest: what a complete step folder holds ------------------------------------------------ */

static const char *const ckpt_files[] = {"student.safetensors", "trainer.safetensors", NULL};

/* FNV-1a over 8-byte little-endian words (then the tail bytes): a torn or swapped file changes it. */
static int hash_file(const char *path, uint64_t *h, int64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t x = 14695981039346656037ULL;
    int64_t n = 0;
    static const size_t cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    size_t k = 0;
    while (buf && (k = fread(buf, 1, cap, f)) > 0) {
        size_t i = 0;
        for (; i + 8 <= k; i += 8) {
            uint64_t w;
            memcpy(&w, buf + i, 8);
            x = (x ^ w) * 1099511628211ULL;
        }
        for (; i < k; i++) x = (x ^ buf[i]) * 1099511628211ULL;
        n += (int64_t)k;
    }
    int bad = !buf || ferror(f);
    free(buf);
    fclose(f);
    if (bad) return -1;
    *h = x;
    *size = n;
    return 0;
}

/* manifest.json of step folder dir (written last, so its presence says the rest is complete). */
static nb_status write_manifest(nb_ctx *ctx, const char *dir, int64_t step) {
    char text[1024], p[4200];
    int len = snprintf(text, sizeof text, "{\"nibble_qad\": %d, \"step\": %" PRId64 ", \"files\": {", NB_QAD_CKPT_VERSION,
                       step);
    for (int k = 0; ckpt_files[k]; k++) {
        uint64_t h;
        int64_t n;
        join(p, sizeof p, dir, ckpt_files[k]);
        if (hash_file(p, &h, &n) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot read %s: %s", p, strerror(errno));
        len += snprintf(text + len, sizeof text - (size_t)len, "%s\"%s\": {\"size\": %" PRId64 ", \"fnv1a64\": \"%016" PRIx64
                        "\"}", k ? ", " : "", ckpt_files[k], n, h);
    }
    len += snprintf(text + len, sizeof text - (size_t)len, "}}\n");
    join(p, sizeof p, dir, "manifest.json");
    return nb_write_file_durable(ctx, p, text, (size_t)len);
}

/* 1 when dir's manifest.json names every checkpoint file with the size and hash it has now. */
static int manifest_ok(const char *dir) {
    char p[4200];
    join(p, sizeof p, dir, "manifest.json");
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    char text[1024];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    for (int k = 0; ckpt_files[k]; k++) {
        char key[128];
        snprintf(key, sizeof key, "\"%s\": {\"size\": ", ckpt_files[k]);
        const char *at = strstr(text, key);
        long long size = 0;
        char hex[17] = {0}, want[17];
        if (!at || sscanf(at + strlen(key), "%lld, \"fnv1a64\": \"%16[0-9a-f]\"}", &size, hex) != 2) return 0;
        uint64_t h;
        int64_t got;
        join(p, sizeof p, dir, ckpt_files[k]);
        if (hash_file(p, &h, &got) != 0 || got != size) return 0;
        snprintf(want, sizeof want, "%016" PRIx64, h);
        if (strcmp(want, hex) != 0) return 0;
    }
    return 1;
}

/* step-<step>[-<k>] (k: a later save of the same step); 0 when name is no step folder. */
static int parse_step_name(const char *name, int64_t *step, int64_t *k) {
    if (strncmp(name, "step-", 5) != 0) return 0;
    const char *p = name + 5;
    char *end = NULL;
    if (*p < '0' || *p > '9') return 0;
    *step = (int64_t)strtoll(p, &end, 10);
    *k = 0;
    if (*end == '-') {
        p = end + 1;
        if (*p < '0' || *p > '9') return 0;
        *k = (int64_t)strtoll(p, &end, 10);
    }
    return *end == 0;
}

typedef struct step_dir {
    int64_t step, k;
    char name[256];
} step_dir;

static int cmp_step_desc(const void *a, const void *b) {
    const step_dir *x = a, *y = b;
    if (x->step != y->step) return x->step > y->step ? -1 : 1;
    return x->k > y->k ? -1 : x->k < y->k;
}

/* The step folders of dir, newest first (NULL and 0 when none); the caller frees the array. */
static step_dir *list_steps(const char *dir, size_t *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    step_dir *v = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        step_dir sd;
        if (strlen(e->d_name) >= sizeof sd.name || !parse_step_name(e->d_name, &sd.step, &sd.k)) continue;
        snprintf(sd.name, sizeof sd.name, "%s", e->d_name);
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            step_dir *g = realloc(v, cap * sizeof *g);
            if (!g) break;
            v = g;
        }
        v[(*count)++] = sd;
    }
    closedir(d);
    if (*count) qsort(v, *count, sizeof *v, cmp_step_desc);
    return v;
}

/* The name `latest` holds ("" when there is none). */
static void read_latest(const char *dir, char *name, size_t cap) {
    char p[4200];
    join(p, sizeof p, dir, "latest");
    name[0] = 0;
    FILE *f = fopen(p, "rb");
    if (!f) return;
    size_t n = fread(name, 1, cap - 1, f);
    fclose(f);
    name[n] = 0;
    while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ')) name[--n] = 0;
}

nb_status nb_qad_latest(nb_ctx *ctx, const char *dir, char *buf, int64_t buf_len) {
    char p[4200];
    join(p, sizeof p, dir, "trainer.safetensors");
    if (is_file(p)) {
        snprintf(buf, (size_t)buf_len, "%s", dir);
        return NB_OK;
    }
    /* the newest step folder its own manifest verifies; one without a manifest (written before
     * manifests existed) counts only when `latest` names it */
    char latest[512];
    read_latest(dir, latest, sizeof latest);
    size_t n = 0;
    step_dir *v = list_steps(dir, &n);
    int found = 0, broken = 0;
    for (size_t i = 0; i < n && !found; i++) {
        char ck[4200], mf[4400];
        join(ck, sizeof ck, dir, v[i].name);
        join(mf, sizeof mf, ck, "manifest.json");
        if (is_file(mf)) found = manifest_ok(ck);
        else found = !strcmp(latest, v[i].name) && (join(mf, sizeof mf, ck, "trainer.safetensors"), is_file(mf));
        if (found) snprintf(buf, (size_t)buf_len, "%s", ck);
        else broken++;
    }
    free(v);
    if (found) return NB_OK;
    if (broken)
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "no complete QAD checkpoint in %s (%d step folder(s), none verified by its "
                       "manifest.json)", dir, broken);
    return nb_fail(ctx, NB_ERR_NOT_FOUND, "no QAD checkpoint in %s (no step-* folder)", dir);
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

/* Remove leftovers of interrupted saves and all but the newest `keep` step folders (the current one,
 * just saved, always stays). */
static void prune(const char *dir, const char *current, int32_t keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4200];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, ".step-", 6) == 0 || strncmp(e->d_name, "latest.tmp-", 11) == 0) {
            join(p, sizeof p, dir, e->d_name);
            if (is_dir(p)) remove_tree(p);
            else (void)unlink(p);
        }
    }
    closedir(d);
    size_t n = 0, kept = 0, others = keep > 1 ? (size_t)(keep - 1) : 0;
    step_dir *v = list_steps(dir, &n);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(v[i].name, current)) continue;
        if (kept++ < others) continue;
        join(p, sizeof p, dir, v[i].name);
        remove_tree(p);
    }
    free(v);
}

nb_status nb_qad_save(nb_ctx *ctx, nb_qad *q, const char *dir, int32_t keep) {
    if (!dir || !*dir) return nb_fail(ctx, NB_ERR_INVALID, "qad: a checkpoint directory is required");
    if (keep <= 0) keep = 2;
    nb_status s = nb_mkdirs(ctx, dir);
    if (s) return s;
    char name[256], final[4096], tmp[4096], p[4200];
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
    nb_xfsz_guard xg;
    nb_xfsz_guard_begin(&xg);
    join(p, sizeof p, tmp, "student.safetensors");
    s = nb_qmodel_save(ctx, q->qm, p);
    join(p, sizeof p, tmp, "trainer.safetensors");
    if (!s) s = write_trainer(ctx, q, p);
    /* the manifest last: a step folder is complete when its manifest verifies it */
    if (!s) s = write_manifest(ctx, tmp, q->step);
    if (!s) s = nb_fsync_dir_files(ctx, tmp);
    if (!s && rename(tmp, final) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    if (!s && nb_fsync_path(dir) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", dir, strerror(errno));
    if (s) {
        nb_xfsz_guard_end(&xg);
        if (!is_dir(final) || is_dir(tmp)) remove_tree(tmp);
        return s;
    }
    /* point latest at it (a hint for people: resume finds the newest complete folder itself) */
    char ltmp[4200], latest[4200], text[300];
    snprintf(p, sizeof p, "latest.tmp-%ld", (long)getpid());
    join(ltmp, sizeof ltmp, dir, p);
    join(latest, sizeof latest, dir, "latest");
    int len = snprintf(text, sizeof text, "%s\n", name);
    s = nb_write_file_durable(ctx, ltmp, text, (size_t)len);
    if (!s && rename(ltmp, latest) != 0) {
        s = nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", latest, strerror(errno));
        (void)unlink(ltmp);
    }
    if (!s && nb_fsync_path(dir) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", dir, strerror(errno));
    nb_xfsz_guard_end(&xg);
    if (s) return s;
    prune(dir, name, keep);
    if (nb_fsync_path(dir) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", dir, strerror(errno));
    return NB_OK;
}

/* ---- the checkpoint folder's lock ---------------------------------------------------------------------- */

struct nb_qad_lock {
    nb_lockfile lk;
};

nb_status nb_qad_lock_dir(nb_ctx *ctx, const char *dir, nb_qad_lock **out) {
    *out = NULL;
    if (!dir || !*dir) return nb_fail(ctx, NB_ERR_INVALID, "qad: a checkpoint directory is required");
    nb_qad_lock *l = calloc(1, sizeof *l);
    if (!l) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    nb_status s = nb_lock_path(ctx, dir, "qad: checkpoint_dir",
                               "wait for it to finish or give another checkpoint_dir", &l->lk);
    if (s) { free(l); return s; }
    *out = l;
    return NB_OK;
}

void nb_qad_unlock_dir(nb_qad_lock *l) {
    if (!l) return;
    nb_unlock_path(&l->lk);
    free(l);
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

nb_status nb_qad_check_settings(nb_ctx *ctx, const nb_qad_cfg *cfg, const char *dir) {
    char ck[4096], p[4096], msg[1024];
    nb_status s = nb_qad_latest(ctx, dir, ck, sizeof ck);
    if (s) return s;
    join(p, sizeof p, ck, "trainer.safetensors");
    nb_st *st = NULL;
    if ((s = nb_st_open(ctx, p, &st))) return s;
    const char *set = nb_st_metadata(st, "settings");
    char *saved = set ? malloc(strlen(set) + 1) : NULL;
    char *now = set ? settings_text(cfg, -1) : NULL;
    if (!set) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s is not a QAD trainer state (no settings)", p);
    } else if (!saved || !now) {
        s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    } else {
        /* the saved text without its params line: the model's parameters are compared at restore */
        size_t o = 0;
        for (const char *l = set; *l;) {
            const char *e = strchr(l, '\n');
            size_t n = e ? (size_t)(e - l) + 1 : strlen(l);
            if (strncmp(l, "params=", 7) != 0) {
                memcpy(saved + o, l, n);
                o += n;
            }
            l += n;
        }
        saved[o] = '\0';
        if (settings_diff(saved, now, msg, sizeof msg))
            s = nb_fail(ctx, NB_ERR_INVALID, "cannot resume from %s: the run's settings changed (%s)", ck, msg);
    }
    free(saved);
    free(now);
    nb_st_close(st);
    return s;
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
    int64_t step_no = 0;
    if (!ver || !step || !asteps || !rng || !set) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s is not a QAD trainer state (metadata missing)", p);
    } else if (!nb_text_int(ver, NB_QAD_CKPT_VERSION, NB_QAD_CKPT_VERSION, &(int64_t){0})) {
        s = nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: QAD checkpoint version %s, this nibble reads %d", p, ver,
                    NB_QAD_CKPT_VERSION);
    } else if (!nb_text_int(step, 0, INT64_MAX, &step_no)) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: step metadata '%.40s' is not a step number", p, step);
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
        errno = 0;
        long long n = strtoll(a, &end, 10);
        if (end == a || errno || n < 0 || (*end != ',' && *end)) {
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: malformed adam_steps metadata", p);
            break;
        }
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
        q->step = step_no;
        nb_model_zero_grad(q->sm);
    }
    nb_st_close(st);
    return s;
}

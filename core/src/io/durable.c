/* Durable files for exports and checkpoints: fsync of files and folders, mkdir -p, whole-file writes
 * that end on disk, the file-size limit as an error (not SIGXFSZ), and flock'd lock files. What the
 * export (core/src/export/) and QAD checkpoints (core/src/qad/qad_checkpoint.c) build their
 * crash-safety on; see durable.h. */
#include "io/durable.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int nb_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = fsync(fd);
    int e = errno;
    struct stat st;
    /* some file systems refuse fsync on a folder: nothing more can be done for it there */
    if (r != 0 && e == EINVAL && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) r = 0;
    close(fd);
    errno = e;
    return r;
}

void nb_parent_of(char *out, size_t cap, const char *path) {
    size_t L = strlen(path);
    while (L > 1 && path[L - 1] == '/') L--;
    const char *slash = NULL;
    for (size_t i = 0; i < L; i++)
        if (path[i] == '/') slash = path + i;
    if (!slash) snprintf(out, cap, ".");
    else snprintf(out, cap, "%.*s", (int)(slash == path ? 1 : slash - path), path);
}

nb_status nb_fsync_parent(nb_ctx *ctx, const char *path) {
    char dir[4096];
    nb_parent_of(dir, sizeof dir, path);
    if (nb_fsync_path(dir) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", dir, strerror(errno));
    return NB_OK;
}

nb_status nb_fsync_dir_files(nb_ctx *ctx, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return nb_fail(ctx, NB_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    char p[4400];
    nb_status s = NB_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (nb_fsync_path(p) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (!s && nb_fsync_path(dir) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", dir, strerror(errno));
    return s;
}

nb_status nb_mkdirs(nb_ctx *ctx, const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return nb_fail(ctx, NB_ERR_INVALID, "path too long: %s", dir);
    size_t L = strlen(p);
    while (L > 1 && p[L - 1] == '/') p[--L] = 0;
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != 0) continue;
        char keep = *c;
        *c = 0;
        if (mkdir(p, 0755) == 0) {
            nb_status s = nb_fsync_parent(ctx, p);   /* the new name must survive a crash too */
            if (s) return s;
        } else if (errno != EEXIST) {
            return nb_fail(ctx, NB_ERR_IO, "cannot create directory %s: %s", p, strerror(errno));
        } else {
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
                return nb_fail(ctx, NB_ERR_IO, "cannot create directory %s: %s is not a directory", dir, p);
        }
        *c = keep;
        if (!keep) break;
    }
    return NB_OK;
}

nb_status nb_write_fd(nb_ctx *ctx, int fd, const void *data, size_t n, const char *path) {
    const char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
    }
    return NB_OK;
}

nb_status nb_write_file_durable(nb_ctx *ctx, const char *path, const void *data, size_t n) {
    nb_xfsz_guard g;
    nb_xfsz_guard_begin(&g);
    nb_status s = NB_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) s = nb_fail(ctx, NB_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (!s) s = nb_write_fd(ctx, fd, data, n, path);
    if (!s && fsync(fd) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !s) s = nb_fail(ctx, NB_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    if (s && fd >= 0) unlink(path);
    nb_xfsz_guard_end(&g);
    return s;
}

nb_status nb_copy_file_durable(nb_ctx *ctx, const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return nb_fail(ctx, NB_ERR_IO, "cannot read %s: %s", src, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int rd_err = 0;
    while (buf) {
        if (n == cap) {
            char *g = realloc(buf, cap * 2);
            if (!g) { free(buf); buf = NULL; break; }
            buf = g;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, in);
        n += k;
        if (k == 0) { rd_err = ferror(in); break; }
    }
    fclose(in);
    if (!buf) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (copying %s)", src);
    nb_status s = rd_err ? nb_fail(ctx, NB_ERR_IO, "cannot read %s", src) : nb_write_file_durable(ctx, dst, buf, n);
    free(buf);
    return s;
}

/* ---- the file-size limit --------------------------------------------------------------------- */

void nb_xfsz_guard_begin(nb_xfsz_guard *g) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGXFSZ);
    g->active = pthread_sigmask(SIG_BLOCK, &set, &g->old) == 0;
}

void nb_xfsz_guard_end(nb_xfsz_guard *g) {
    if (!g->active) return;
    g->active = 0;
    if (sigismember(&g->old, SIGXFSZ)) return;   /* an outer guard (or the caller) keeps it blocked */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGXFSZ);
    struct timespec zero = {0, 0};
    /* the write that crossed the limit already failed with EFBIG: its signal must not kill us later */
    while (sigtimedwait(&set, NULL, &zero) == SIGXFSZ) {}
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- locks ---------------------------------------------------------------------------------- */

int nb_pid_alive(long pid) {
    if (pid <= 0) return 0;
    return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

static void lock_name(char *out, size_t cap, const char *path) {
    size_t L = strlen(path);
    while (L > 1 && path[L - 1] == '/') L--;
    snprintf(out, cap, "%.*s.nibble-lock", (int)L, path);
}

static long read_pid(int fd) {
    char b[32] = {0};
    ssize_t n = pread(fd, b, sizeof b - 1, 0);
    return n > 0 ? strtol(b, NULL, 10) : 0;
}

int nb_lock_held_elsewhere(const char *path, long *pid) {
    char lp[4200];
    lock_name(lp, sizeof lp, path);
    if (pid) *pid = 0;
    int fd = open(lp, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (!held) flock(fd, LOCK_UN);
    else if (pid) *pid = read_pid(fd);
    close(fd);
    return held;
}

nb_status nb_lock_path(nb_ctx *ctx, const char *path, const char *prefix, const char *advice, nb_lockfile *lk) {
    lk->fd = -1;
    lk->held = 0;
    lock_name(lk->path, sizeof lk->path, path);
    char parent[4096];
    nb_parent_of(parent, sizeof parent, lk->path);
    nb_status s = nb_mkdirs(ctx, parent);
    if (s) return s;
    /* a lock file unlinked by its previous owner between our open and flock is not the lock any more:
     * try again on the name's current file */
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(lk->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return nb_fail(ctx, NB_ERR_IO, "%s: cannot create %s: %s", prefix, lk->path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            long pid = e == EWOULDBLOCK ? read_pid(fd) : 0;
            close(fd);
            if (e != EWOULDBLOCK) return nb_fail(ctx, NB_ERR_IO, "%s: cannot lock %s: %s", prefix, lk->path, strerror(e));
            char who[64] = "";
            if (pid > 0) snprintf(who, sizeof who, " (pid %ld)", pid);
            size_t L = strlen(path);
            while (L > 1 && path[L - 1] == '/') L--;
            return nb_fail(ctx, NB_ERR_IO, "%s: %.*s is in use by another nibble process%s: %s", prefix, (int)L, path, who,
                           advice);
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(lk->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
                /* the pid only makes the refusal friendlier; the flock is the lock */
            }
            lk->fd = fd;
            lk->held = 1;
            return NB_OK;
        }
        close(fd);
    }
    return nb_fail(ctx, NB_ERR_IO, "%s: cannot lock %s: it keeps being replaced", prefix, lk->path);
}

void nb_unlock_path(nb_lockfile *lk) {
    if (!lk || !lk->held) return;
    unlink(lk->path);   /* while still held: whoever opens the name next gets a fresh file */
    close(lk->fd);
    lk->fd = -1;
    lk->held = 0;
}

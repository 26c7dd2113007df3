/* Durable files for exports and checkpoints (core/src/io/durable.c): writes that survive a power cut
 * (fsync of every file and of the folder that names it), folders created with their parents, a
 * file-size limit (RLIMIT_FSIZE) turned into an I/O error instead of death by SIGXFSZ, and flock'd
 * lock files that keep two processes out of one output. Not installed. */
#ifndef NIBBLE_IO_DURABLE_H
#define NIBBLE_IO_DURABLE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "nibble/ctx.h"
#include "nibble/status.h"

/* fsync a file or a folder by path; 0, or -1 with errno set. A folder whose file system refuses
 * fsync (EINVAL) counts as done. */
int nb_fsync_path(const char *path);
/* fsync every regular file directly in dir, then dir itself (files other code wrote: the tokenizer's). */
nb_status nb_fsync_dir_files(nb_ctx *ctx, const char *dir);
/* fsync the folder that holds path (after a rename or create in it). */
nb_status nb_fsync_parent(nb_ctx *ctx, const char *path);
/* The folder that holds path ("." for a bare name) into out. */
void nb_parent_of(char *out, size_t cap, const char *path);

/* mkdir -p: every missing folder of dir is created (0755) and the folder above it fsynced. */
nb_status nb_mkdirs(nb_ctx *ctx, const char *dir);

/* Write n bytes to fd (EINTR retried); an error names path and errno's text. */
nb_status nb_write_fd(nb_ctx *ctx, int fd, const void *data, size_t n, const char *path);
/* Create (or truncate) path, write n bytes, fsync, close. On failure the partial file is removed. */
nb_status nb_write_file_durable(nb_ctx *ctx, const char *path, const void *data, size_t n);
/* Copy src to dst with nb_write_file_durable's guarantees. */
nb_status nb_copy_file_durable(nb_ctx *ctx, const char *src, const char *dst);

/* While a guard is held, a write past the file-size limit fails with EFBIG ("File too large") in
 * this thread instead of killing the process by SIGXFSZ: the signal is blocked, and a SIGXFSZ the
 * kernel raised meanwhile is taken off the pending set before the old mask comes back. Guards nest. */
typedef struct nb_xfsz_guard {
    sigset_t old;
    int active;
} nb_xfsz_guard;
void nb_xfsz_guard_begin(nb_xfsz_guard *g);
void nb_xfsz_guard_end(nb_xfsz_guard *g);

/* An exclusive lock on path + ".nibble-lock" (flock, so it goes with the process, even killed), the
 * file holding the owner's pid. Refused at once when another process holds it: NB_ERR_IO with
 * "<prefix>: <path> is in use by another nibble process (pid N): <advice>". The parent folder of
 * path is created when missing. */
typedef struct nb_lockfile {
    int fd;
    int held;   /* 0 in a zeroed struct: nothing to release */
    char path[4200];
} nb_lockfile;
nb_status nb_lock_path(nb_ctx *ctx, const char *path, const char *prefix, const char *advice, nb_lockfile *lk);
/* Whether another process holds path's lock now (its pid into *pid, 0 if unknown); writes nothing. */
int nb_lock_held_elsewhere(const char *path, long *pid);
/* Remove the lock file and release the lock (a no-op on a zeroed or released one). */
void nb_unlock_path(nb_lockfile *lk);

/* Whether a process with this pid exists (0 only when kill(pid, 0) says ESRCH). */
int nb_pid_alive(long pid);

#endif

/* Where an export may go: nb_export_check_target accepts only a missing target (whose missing parent
 * folders the export creates), an empty directory or a previous nibble export (the names an export
 * writes, the producer=nibble mark), and none another process is exporting to; nbx_free_sibling finds
 * the staging sibling's name and nbx_remove_stale removes the staging siblings killed processes left. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "export/export_internal.h"
#include "io/durable.h"
#include "nibble/safetensors.h"

/* dir + "/" + name into out; 0 if it fit. */
int nbx_join_path(char *out, size_t cap, const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    if (a + 1 + b + 1 > cap) return -1;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return 0;
}

/* The files write_all copies from the source directory (or writes for a GGUF's tokenizer). */
const char *const nbx_copied_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "generation_config.json", "tokenizer.model", "chat_template.jinja", NULL};

/* ---- the target directory ---------------------------------------------------------------- */

/* model-DDDDD-of-DDDDD.safetensors, as nb_st_writer_write_sharded names shards */
static int is_shard_name(const char *n) {
    if (strncmp(n, "model-", 6) != 0) return 0;
    const char *p = n + 6;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    if (strncmp(p, "-of-", 4) != 0) return 0;
    p += 4;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    return strcmp(p, ".safetensors") == 0;
}

/* A file name an export writes (write_all, the safetensors writer); 2 for the weights' entry point. */
static int export_name(const char *n) {
    if (!strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json")) return 2;
    if (!strcmp(n, "config.json") || !strcmp(n, "hf_quant_config.json") || is_shard_name(n)) return 1;
    for (int k = 0; nbx_copied_files[k]; k++) if (!strcmp(n, nbx_copied_files[k])) return 1;
    return 0;
}

/* Does nibble say it wrote the checkpoint in dir? The safetensors mark, or (exports from before the
 * mark) the producer ModelOpt-layout exports put in config.json's quantization_config. Any failure to
 * read either counts as "no". */
static int has_nibble_mark(nb_ctx *ctx, const char *dir) {
    nb_st *st = NULL;
    int marked = 0;
    if (nb_st_open(ctx, dir, &st) == NB_OK) {
        const char *p = nb_st_metadata(st, "producer");
        marked = p && strcmp(p, "nibble") == 0;
        nb_st_close(st);
    } else {
        nb_ctx_clear_error(ctx);
    }
    if (marked) return 1;
    char path[4096];
    if (nbx_join_path(path, sizeof path, dir, "config.json") != 0) return 0;
    cJSON *cfg = NULL;
    if (nbx_read_json(ctx, path, &cfg) != NB_OK) nb_ctx_clear_error(ctx);   /* unreadable: not an export of ours */
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    const cJSON *prod = cJSON_GetObjectItemCaseSensitive(qc, "producer");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(prod, "name");
    marked = cJSON_IsString(name) && strcmp(name->valuestring, "nibble") == 0;
    cJSON_Delete(cfg);
    return marked;
}

#define NOT_OURS "remove it or choose another output directory"

nb_status nb_export_check_target(nb_ctx *ctx, const char *dir) { return nbx_check_target(ctx, dir, 1); }

nb_status nbx_check_target(nb_ctx *ctx, const char *dir, int check_lock) {
    if (!dir || !*dir) return nb_fail(ctx, NB_ERR_INVALID, "export: the output directory is an empty path");
    size_t L = strlen(dir);
    while (L > 1 && dir[L - 1] == '/') L--;
    char target[4096], parent[4096];
    if (L + 64 >= sizeof target) return nb_fail(ctx, NB_ERR_INVALID, "export: path too long: %s", dir);
    snprintf(target, sizeof target, "%.*s", (int)L, dir);
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    if (!strcmp(base, ".") || !strcmp(base, "..") || !strcmp(target, "/"))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s is not a directory an export can replace: name a new "
                       "output directory", target);
    if (!slash) snprintf(parent, sizeof parent, ".");
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash == target ? 1 : slash - target), target);

    /* the export is a sibling staging directory renamed into place: the parent must take it, or the
     * nearest existing folder above it must take the missing ones (the export creates them) */
    struct stat st;
    while (stat(parent, &st) != 0 && (errno == ENOENT || errno == ENOTDIR) && strcmp(parent, ".") && strcmp(parent, "/")) {
        char up[4096];
        nb_parent_of(up, sizeof up, parent);
        snprintf(parent, sizeof parent, "%s", up);
    }
    if (stat(parent, &st) != 0)
        return nb_fail(ctx, NB_ERR_IO, "export: cannot write %s: its parent directory %s: %s", target, parent,
                       strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return nb_fail(ctx, NB_ERR_IO, "export: cannot write %s: %s is not a directory", target, parent);
    if (access(parent, W_OK | X_OK) != 0)
        return nb_fail(ctx, NB_ERR_IO, "export: cannot write %s: its parent directory %s: %s", target, parent,
                       strerror(errno));
    long pid = 0;
    if (check_lock && nb_lock_held_elsewhere(target, &pid)) {
        char who[64] = "";
        if (pid > 0) snprintf(who, sizeof who, " (pid %ld)", pid);
        return nb_fail(ctx, NB_ERR_IO, "export: %s is in use by another nibble process%s: %s", target, who, NBX_BUSY);
    }

    if (lstat(target, &st) != 0) {
        if (errno == ENOENT) return NB_OK;
        return nb_fail(ctx, NB_ERR_IO, "export: cannot inspect %s: %s", target, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is a symbolic link: %s (or name the directory "
                       "it points to)", target, NOT_OURS);
    if (S_ISREG(st.st_mode))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is a file, not a directory: %s", target, NOT_OURS);
    if (!S_ISDIR(st.st_mode))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a directory: %s", target, NOT_OURS);

    DIR *d = opendir(target);
    if (!d) return nb_fail(ctx, NB_ERR_IO, "export: cannot list %s: %s", target, strerror(errno));
    /* the smallest foreign name, so the message does not depend on readdir's order */
    char foreign[512] = "", path[4096];
    int n = 0, has_config = 0, has_weights = 0;
    struct dirent *e;
    while ((errno = 0, e = readdir(d))) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
        n++;
        int kind = export_name(nm);
        struct stat es;
        int regular = nbx_join_path(path, sizeof path, target, nm) == 0 && lstat(path, &es) == 0 && S_ISREG(es.st_mode);
        if (kind && regular) {
            has_config |= !strcmp(nm, "config.json");
            has_weights |= kind == 2;
            continue;
        }
        char shown[512];
        int isdir = !regular && nbx_join_path(path, sizeof path, target, nm) == 0 && lstat(path, &es) == 0 &&
                    S_ISDIR(es.st_mode);
        snprintf(shown, sizeof shown, "%s%s", nm, isdir ? "/" : "");
        if (!foreign[0] || strcmp(shown, foreign) < 0) snprintf(foreign, sizeof foreign, "%s", shown);
    }
    int rd_err = errno;
    closedir(d);
    if (rd_err) return nb_fail(ctx, NB_ERR_IO, "export: cannot list %s: %s", target, strerror(rd_err));
    if (n == 0) return NB_OK;
    if (foreign[0])
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a nibble export (it holds %s): %s", target,
                       foreign, NOT_OURS);
    if (!has_config || !has_weights)
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a nibble export (it holds no %s): %s",
                       target, !has_config ? "config.json" : "model.safetensors", NOT_OURS);
    if (!has_nibble_mark(ctx, target))
        return nb_fail(ctx, NB_ERR_INVALID, "export: %s exists and is not a nibble export (a model directory nibble "
                       "did not write: its weights do not name nibble as producer): %s", target, NOT_OURS);
    return NB_OK;
}

/* A sibling of target that does not exist yet: target + tag + pid (+ a counter). Never removes
 * anything already there, as the name might be someone's. */
int nbx_free_sibling(char *out, size_t cap, const char *target, const char *tag, int make) {
    for (int k = 0; k < 1000; k++) {
        if (k == 0) snprintf(out, cap, "%s.%s-%ld", target, tag, (long)getpid());
        else snprintf(out, cap, "%s.%s-%ld-%d", target, tag, (long)getpid(), k);
        if (make) {
            if (mkdir(out, 0755) == 0) return 0;
            if (errno != EEXIST) return -1;
        } else {
            struct stat st;
            if (lstat(out, &st) != 0 && errno == ENOENT) return 0;
        }
    }
    errno = EEXIST;
    return -1;
}

/* A staging / moved-aside sibling of target that a process left: target + "." + tag + "-" + pid
 * (+ "-" + counter), as nbx_free_sibling names them. Its pid, or 0 when name is no such sibling. */
static long sibling_pid(const char *name, const char *base, const char *tag) {
    size_t b = strlen(base), t = strlen(tag);
    if (strncmp(name, base, b) != 0 || name[b] != '.' || strncmp(name + b + 1, tag, t) != 0 || name[b + 1 + t] != '-')
        return 0;
    const char *p = name + b + 2 + t;
    char *end = NULL;
    long pid = strtol(p, &end, 10);
    if (end == p || pid <= 0) return 0;
    if (*end == '-') {
        const char *q = end + 1;
        strtol(q, &end, 10);
        if (end == q) return 0;
    }
    return *end ? 0 : pid;
}

void nbx_remove_stale(const char *target, void (*remove_tree)(const char *)) {
    char parent[4096], path[4400];
    nb_parent_of(parent, sizeof parent, target);
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = sibling_pid(e->d_name, base, "nibble-tmp");
        if (!pid) pid = sibling_pid(e->d_name, base, "nibble-old");
        if (!pid || pid == (long)getpid() || nb_pid_alive(pid)) continue;
        if (nbx_join_path(path, sizeof path, parent, e->d_name) == 0) remove_tree(path);
    }
    closedir(d);
}

/* safetensors writer: the reference serializer's bytes exactly (serde_json header, __metadata__
 * first, tensors by descending dtype enum then name, space padding to 8), written atomically; and the
 * huggingface_hub/transformers sharded layout with its index.json formatted as Python's json.dumps. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nibble/safetensors.h"
#include "io/durable.h"
#include "io/safetensors_internal.h"

struct nb_st_writer {
    int64_t n, cap;
    char **names;
    nb_tensor **tensors;
    nb_strmap by_name;
    int64_t nmeta, metacap;
    char **mkeys, **mvals;
    int64_t nimeta, imetacap;
    char **ikeys;
    int64_t *ivals;
};

/* ---- growable string ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->n + n + 1) ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt_i64(sbuf *b, int64_t v) {
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)v);
    sb_str(b, t);
}

static void sb_u4(sbuf *b, unsigned v) {
    char t[8];
    snprintf(t, sizeof t, "\\u%04x", v);
    sb_str(b, t);
}

/* Short escapes shared by serde_json and Python's json; 0 if the byte has none. */
static const char *short_escape(unsigned c) {
    switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return NULL;
    }
}

/* serde_json (the reference header): control bytes escaped, everything else (UTF-8, DEL) raw. */
static void sb_json_serde(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *e = short_escape(*p);
        if (e) sb_str(b, e);
        else if (*p < 0x20) sb_u4(b, *p);
        else sb_put(b, p, 1);
    }
    sb_put(b, "\"", 1);
}

/* Python json.dumps with ensure_ascii=True: anything outside ' '..'~' becomes \uXXXX (UTF-16
 * surrogate pairs above U+FFFF). Input is valid UTF-8 (checked when it was added). */
static void sb_json_python(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p, cp;
        const char *e = short_escape(c);
        if (e) { sb_str(b, e); p++; continue; }
        if (c >= 0x20 && c < 0x7F) { sb_put(b, p, 1); p++; continue; }
        if (c < 0x80) { cp = c; p += 1; }
        else if (c < 0xE0) { cp = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu); p += 2; }
        else if (c < 0xF0) { cp = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu); p += 3; }
        else { cp = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu); p += 4; }
        if (cp >= 0x10000) {
            cp -= 0x10000;
            sb_u4(b, 0xD800 + (cp >> 10));
            sb_u4(b, 0xDC00 + (cp & 0x3FF));
        } else {
            sb_u4(b, cp);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---- writer object -------------------------------------------------------------------------- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int grow_arrays(int64_t need, int64_t *cap, size_t n_arrays, void ***arrays, const size_t *elem) {
    if (need <= *cap) return 0;
    int64_t ncap = *cap ? *cap * 2 : 16;
    for (size_t i = 0; i < n_arrays; i++) {
        void *np = realloc(*arrays[i], (size_t)ncap * elem[i]);
        if (!np) return -1;
        *arrays[i] = np;
    }
    *cap = ncap;
    return 0;
}

nb_status nb_st_writer_new(nb_ctx *ctx, nb_st_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? NB_OK : nb_fail(ctx, NB_ERR_NOMEM, "out of memory (safetensors writer)");
}

void nb_st_writer_free(nb_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++) { free(w->names[i]); nb_tensor_release(w->tensors[i]); }
    for (int64_t i = 0; i < w->nmeta; i++) { free(w->mkeys[i]); free(w->mvals[i]); }
    for (int64_t i = 0; i < w->nimeta; i++) free(w->ikeys[i]);
    free(w->names);
    free(w->tensors);
    free(w->mkeys);
    free(w->mvals);
    free(w->ikeys);
    free(w->ivals);
    nb_strmap_free(&w->by_name);
    free(w);
}

int64_t nb_st_writer_count(const nb_st_writer *w) { return w->n; }

static int valid_utf8_str(const char *s) { return nb_utf8_valid((const unsigned char *)s, (int64_t)strlen(s)); }

nb_status nb_st_writer_meta(nb_ctx *ctx, nb_st_writer *w, const char *key, const char *value) {
    if (!key || !value || !valid_utf8_str(key) || !valid_utf8_str(value))
        return nb_fail(ctx, NB_ERR_INVALID, "safetensors metadata key and value must be UTF-8 strings");
    char *v = dup_str(value);
    if (!v) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->mkeys[i], key) == 0) {
            free(w->mvals[i]);
            w->mvals[i] = v;
            return NB_OK;
        }
    char *k = dup_str(key);
    void **arr[] = {(void **)&w->mkeys, (void **)&w->mvals};
    const size_t el[] = {sizeof(char *), sizeof(char *)};
    if (!k || grow_arrays(w->nmeta + 1, &w->metacap, 2, arr, el)) {
        free(k);
        free(v);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    }
    w->mkeys[w->nmeta] = k;
    w->mvals[w->nmeta] = v;
    w->nmeta++;
    return NB_OK;
}

nb_status nb_st_writer_index_meta(nb_ctx *ctx, nb_st_writer *w, const char *key, int64_t value) {
    if (!key || !valid_utf8_str(key) || strcmp(key, "total_size") == 0)
        return nb_fail(ctx, NB_ERR_INVALID, "index metadata key must be UTF-8 and not \"total_size\" (computed)");
    for (int64_t i = 0; i < w->nimeta; i++)
        if (strcmp(w->ikeys[i], key) == 0) {
            w->ivals[i] = value;
            return NB_OK;
        }
    char *k = dup_str(key);
    void **arr[] = {(void **)&w->ikeys, (void **)&w->ivals};
    const size_t el[] = {sizeof(char *), sizeof(int64_t)};
    if (!k || grow_arrays(w->nimeta + 1, &w->imetacap, 2, arr, el)) {
        free(k);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    }
    w->ikeys[w->nimeta] = k;
    w->ivals[w->nimeta] = value;
    w->nimeta++;
    return NB_OK;
}

nb_status nb_st_writer_add(nb_ctx *ctx, nb_st_writer *w, const char *name, const nb_tensor *t) {
    if (!name || !t) return nb_fail(ctx, NB_ERR_INVALID, "safetensors writer: NULL name or tensor");
    if (!valid_utf8_str(name)) return nb_fail(ctx, NB_ERR_INVALID, "tensor name is not valid UTF-8");
    if (strcmp(name, "__metadata__") == 0)
        return nb_fail(ctx, NB_ERR_INVALID, "'__metadata__' is reserved and cannot name a tensor");
    if (t->device >= 0)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "tensor '%s' is on device %d; copy it to the host before writing",
                       name, t->device);
    if (nb_st_dtype_rank(t->dtype) < 0)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "tensor '%s': dtype %d has no safetensors name", name, (int)t->dtype);
    if (nb_strmap_get(&w->by_name, name) >= 0)
        return nb_fail(ctx, NB_ERR_INVALID, "tensor '%s' was already added to this writer", name);
    char *k = dup_str(name);
    void **arr[] = {(void **)&w->names, (void **)&w->tensors};
    const size_t el[] = {sizeof(char *), sizeof(nb_tensor *)};
    if (!k || grow_arrays(w->n + 1, &w->cap, 2, arr, el) || nb_strmap_put(&w->by_name, k, w->n, NULL) < 0) {
        free(k);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    }
    w->names[w->n] = k;
    w->tensors[w->n] = (nb_tensor *)t;
    nb_tensor_retain(w->tensors[w->n]);
    w->n++;
    return NB_OK;
}

/* ---- file output ---------------------------------------------------------------------------- */

typedef nb_status (*emit_fn)(nb_ctx *ctx, int fd, const char *path, void *arg);

/* Write PATH through a temp file in the same directory: emit, fsync, rename, fsync the folder; unlink
 * on failure. A file-size limit is an I/O error ("File too large"), not death by SIGXFSZ. */
static nb_status write_atomic(nb_ctx *ctx, const char *path, emit_fn emit, void *arg) {
    static unsigned long counter;   /* only makes temp names unique within the process */
    size_t len = strlen(path) + 64;
    char *tmp = malloc(len);
    if (!tmp) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        unsigned long c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
        snprintf(tmp, len, "%s.tmp-%ld-%lx%lx", path, (long)getpid(), c, (unsigned long)ts.tv_nsec);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        nb_status s = nb_fail(ctx, NB_ERR_IO, "cannot create a temporary file for %s: %s", path, strerror(errno));
        free(tmp);
        return s;
    }
    nb_xfsz_guard g;
    nb_xfsz_guard_begin(&g);
    nb_status s = emit(ctx, fd, path, arg);
    nb_xfsz_guard_end(&g);
    if (!s && fsync(fd) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && !s) s = nb_fail(ctx, NB_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    if (!s && rename(tmp, path) != 0) s = nb_fail(ctx, NB_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (s) unlink(tmp);
    else s = nb_fsync_parent(ctx, path);
    free(tmp);
    return s;
}

/* Bytes of a tensor in row-major order, gathered through a staging buffer when it is strided. */
static nb_status emit_tensor(nb_ctx *ctx, int fd, const char *path, const nb_tensor *t) {
    int64_t nbytes = nb_tensor_nbytes(t);
    if (nbytes == 0) return NB_OK;
    const uint8_t *base = nb_tensor_data(t);
    if (nb_tensor_is_contiguous(t)) return nb_write_fd(ctx, fd, base, (size_t)nbytes, path);
    /* Rows along the last dim: packed E2M1 rows are always contiguous bytes (strides[last] == 0). */
    int nd = t->ndim, last = nd - 1;
    int esize = nb_dtype_info(t->dtype)->bits / 8;
    int packed = esize == 0;
    int64_t row_len = t->shape[last];
    int64_t row_bytes = packed ? row_len / 2 : row_len * esize;
    int row_contig = packed || t->strides[last] == esize;
    size_t cap = (size_t)1 << 20;
    if ((size_t)row_bytes > cap) cap = (size_t)row_bytes;
    uint8_t *stage = malloc(cap);
    if (!stage) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (staging buffer)");
    size_t fill = 0;
    int64_t idx[NB_MAX_DIMS] = {0};
    int64_t rows = nbytes / row_bytes;
    nb_status s = NB_OK;
    for (int64_t r = 0; r < rows && !s; r++) {
        int64_t off = 0;
        for (int d = 0; d < last; d++) off += idx[d] * t->strides[d];
        if (fill + (size_t)row_bytes > cap) {
            s = nb_write_fd(ctx, fd, stage, fill, path);
            fill = 0;
        }
        if (row_contig) {
            memcpy(stage + fill, base + off, (size_t)row_bytes);
        } else {
            for (int64_t j = 0; j < row_len; j++)
                memcpy(stage + fill + j * esize, base + off + j * t->strides[last], (size_t)esize);
        }
        fill += (size_t)row_bytes;
        for (int d = last - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    if (!s && fill) s = nb_write_fd(ctx, fd, stage, fill, path);
    free(stage);
    return s;
}

typedef struct order_item {
    int rank;
    const char *name;
    int64_t idx;
} order_item;

static int cmp_order(const void *a, const void *b) {
    const order_item *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;   /* descending alignment */
    return strcmp(x->name, y->name);
}

typedef struct file_job {
    const nb_st_writer *w;
    order_item *items;
    int64_t count;
    sbuf header;
} file_job;

static nb_status emit_file(nb_ctx *ctx, int fd, const char *path, void *arg) {
    file_job *job = arg;
    uint8_t len[8];
    uint64_t n = job->header.n;
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(n >> (8 * i));
    nb_status s = nb_write_fd(ctx, fd, len, 8, path);
    if (!s) s = nb_write_fd(ctx, fd, job->header.p, job->header.n, path);
    for (int64_t i = 0; i < job->count && !s; i++) {
        if (nb_ctx_interrupted(ctx)) return nb_fail(ctx, NB_ERR_INTERRUPTED, "writing %s was interrupted", path);
        s = emit_tensor(ctx, fd, path, job->w->tensors[job->items[i].idx]);
    }
    return s;
}

/* One safetensors file holding tensors sel[0..count) of the writer. */
static nb_status write_subset(nb_ctx *ctx, const nb_st_writer *w, const int64_t *sel, int64_t count, const char *path) {
    file_job job = {w, calloc((size_t)(count ? count : 1), sizeof(order_item)), count, {0}};
    if (!job.items) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < count; i++) {
        const nb_tensor *t = w->tensors[sel[i]];
        job.items[i] = (order_item){nb_st_dtype_rank(t->dtype), w->names[sel[i]], sel[i]};
    }
    if (count) qsort(job.items, (size_t)count, sizeof *job.items, cmp_order);

    sbuf *h = &job.header;
    sb_str(h, "{");
    if (w->nmeta) {
        sb_str(h, "\"__metadata__\":{");
        for (int64_t i = 0; i < w->nmeta; i++) {
            if (i) sb_str(h, ",");
            sb_json_serde(h, w->mkeys[i]);
            sb_str(h, ":");
            sb_json_serde(h, w->mvals[i]);
        }
        sb_str(h, "}");
    }
    int64_t offset = 0;
    for (int64_t i = 0; i < count; i++) {
        const nb_tensor *t = w->tensors[job.items[i].idx];
        if (i || w->nmeta) sb_str(h, ",");
        sb_json_serde(h, job.items[i].name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, nb_st_dtypes[job.items[i].rank].name);
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_str(h, ",");
            sb_fmt_i64(h, t->shape[d]);
        }
        sb_str(h, "],\"data_offsets\":[");
        sb_fmt_i64(h, offset);
        sb_str(h, ",");
        offset += nb_tensor_nbytes(t);
        sb_fmt_i64(h, offset);
        sb_str(h, "]}");
    }
    sb_str(h, "}");
    while (h->n % 8) sb_str(h, " ");   /* the reference pads so the data starts 8-byte aligned */
    nb_status s = h->oom ? nb_fail(ctx, NB_ERR_NOMEM, "out of memory (safetensors header)")
                         : write_atomic(ctx, path, emit_file, &job);
    free(h->p);
    free(job.items);
    return s;
}

nb_status nb_st_writer_write(nb_ctx *ctx, nb_st_writer *w, const char *path) {
    int64_t *sel = malloc((size_t)(w->n ? w->n : 1) * sizeof *sel);
    if (!sel) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < w->n; i++) sel[i] = i;
    nb_status s = write_subset(ctx, w, sel, w->n, path);
    free(sel);
    return s;
}

/* ---- sharded output ------------------------------------------------------------------------- */

static nb_status emit_bytes(nb_ctx *ctx, int fd, const char *path, void *arg) {
    const sbuf *b = arg;
    return nb_write_fd(ctx, fd, b->p, b->n, path);
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    while (a > 1 && dir[a - 1] == '/') a--;
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int is_shard_name(const char *s) {
    /* model-DDDDD-of-DDDDD.safetensors */
    if (strlen(s) != 32 || strncmp(s, "model-", 6) != 0 || strncmp(s + 11, "-of-", 4) != 0 ||
        strcmp(s + 20, ".safetensors") != 0)
        return 0;
    for (int i = 0; i < 5; i++)
        if (s[6 + i] < '0' || s[6 + i] > '9' || s[15 + i] < '0' || s[15 + i] > '9') return 0;
    return 1;
}

/* Remove files of an earlier save that the new one does not replace, so the directory never
 * pairs a stale index with new shards (what huggingface_hub does before saving). */
static nb_status remove_stale(nb_ctx *ctx, const char *dir, int sharded, int64_t nshards) {
    DIR *d = opendir(dir);
    if (!d) return nb_fail(ctx, NB_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    char keep_suffix[16];
    snprintf(keep_suffix, sizeof keep_suffix, "-of-%05lld.", (long long)nshards);
    nb_status s = NB_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        const char *n = e->d_name;
        int stale = sharded ? (strcmp(n, "model.safetensors") == 0 ||
                               (is_shard_name(n) && (strncmp(n + 11, keep_suffix, 10) != 0 ||
                                                     atoi(n + 6) < 1 || atoi(n + 6) > nshards)))
                            : (strcmp(n, "model.safetensors.index.json") == 0 || is_shard_name(n));
        if (!stale) continue;
        char *p = join_path(dir, n);
        if (!p) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
        else if (unlink(p) != 0 && errno != ENOENT)
            s = nb_fail(ctx, NB_ERR_IO, "cannot remove stale %s: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
    return s;
}

typedef struct kv_item {
    const char *key;
    int64_t ival;
    const char *sval;
} kv_item;

static int cmp_kv(const void *a, const void *b) { return strcmp(((const kv_item *)a)->key, ((const kv_item *)b)->key); }

nb_status nb_st_writer_write_sharded(nb_ctx *ctx, nb_st_writer *w, const char *dir, int64_t max_shard_bytes) {
    if (max_shard_bytes <= 0) return nb_fail(ctx, NB_ERR_INVALID, "max_shard_bytes must be positive");
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return nb_fail(ctx, NB_ERR_IO, "%s is not an existing directory", dir);

    /* huggingface_hub split_state_dict_into_shards_factory, step for step. */
    int64_t n = w->n;
    int64_t *order = malloc((size_t)(n ? n : 1) * sizeof *order);     /* tensor indices, shard by shard */
    int64_t *starts = malloc((size_t)(n + 2) * sizeof *starts);       /* shard k = order[starts[k]..starts[k+1]) */
    int64_t *cur = malloc((size_t)(n ? n : 1) * sizeof *cur);
    int64_t *shard_of = malloc((size_t)(n ? n : 1) * sizeof *shard_of);
    kv_item *kv = NULL;
    char **files = NULL;
    sbuf idx = {0};
    char *ipath = NULL;
    nb_status s = NB_OK;
    int64_t nshards = 0, filled = 0, ncur = 0, cur_size = 0, total = 0;
    if (!order || !starts || !cur || !shard_of) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    starts[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t size = nb_tensor_nbytes(w->tensors[i]);
        total += size;
        if (size > max_shard_bytes) {   /* its own shard, closed at once, before the one being filled */
            order[filled++] = i;
            shard_of[i] = nshards;
            starts[++nshards] = filled;
            continue;
        }
        if (cur_size + size > max_shard_bytes) {
            for (int64_t k = 0; k < ncur; k++) { order[filled++] = cur[k]; shard_of[cur[k]] = nshards; }
            starts[++nshards] = filled;
            ncur = 0;
            cur_size = 0;
        }
        cur[ncur++] = i;
        cur_size += size;
    }
    if (ncur) {
        for (int64_t k = 0; k < ncur; k++) { order[filled++] = cur[k]; shard_of[cur[k]] = nshards; }
        starts[++nshards] = filled;
    }

    if (nshards <= 1) {
        char *path = join_path(dir, "model.safetensors");
        if (!path) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
        s = write_subset(ctx, w, order, n, path);
        free(path);
        if (!s) s = remove_stale(ctx, dir, 0, 1);
        goto done;
    }

    files = calloc((size_t)nshards, sizeof *files);
    if (!files) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    for (int64_t k = 0; k < nshards && !s; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors", (long long)(k + 1), (long long)nshards);
        files[k] = dup_str(name);
        char *path = join_path(dir, name);
        if (!files[k] || !path) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
        else s = write_subset(ctx, w, order + starts[k], starts[k + 1] - starts[k], path);
        free(path);
    }
    if (s) goto done;

    /* json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers' save_pretrained writes it. */
    kv = malloc((size_t)(n + w->nimeta + 1) * sizeof *kv);
    if (!kv) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    for (int64_t i = 0; i < w->nimeta; i++) kv[i] = (kv_item){w->ikeys[i], w->ivals[i], NULL};
    kv[w->nimeta] = (kv_item){"total_size", total, NULL};
    qsort(kv, (size_t)(w->nimeta + 1), sizeof *kv, cmp_kv);
    sb_str(&idx, "{\n  \"metadata\": {\n");
    for (int64_t i = 0; i <= w->nimeta; i++) {
        sb_str(&idx, "    ");
        sb_json_python(&idx, kv[i].key);
        sb_str(&idx, ": ");
        sb_fmt_i64(&idx, kv[i].ival);
        sb_str(&idx, i < w->nimeta ? ",\n" : "\n");
    }
    sb_str(&idx, "  },\n  \"weight_map\": {\n");
    for (int64_t i = 0; i < n; i++) kv[i] = (kv_item){w->names[i], 0, files[shard_of[i]]};
    if (n) qsort(kv, (size_t)n, sizeof *kv, cmp_kv);
    for (int64_t i = 0; i < n; i++) {
        sb_str(&idx, "    ");
        sb_json_python(&idx, kv[i].key);
        sb_str(&idx, ": ");
        sb_json_python(&idx, kv[i].sval);
        sb_str(&idx, i + 1 < n ? ",\n" : "\n");
    }
    sb_str(&idx, "  }\n}\n");
    if (idx.oom) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (index)"); goto done; }
    ipath = join_path(dir, "model.safetensors.index.json");
    if (!ipath) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    s = write_atomic(ctx, ipath, emit_bytes, &idx);
    if (!s) s = remove_stale(ctx, dir, 1, nshards);
done:
    if (files)
        for (int64_t k = 0; k < nshards; k++) free(files[k]);
    free(files);
    free(ipath);
    free(kv);
    free(idx.p);
    free(order);
    free(starts);
    free(cur);
    free(shard_of);
    return s;
}

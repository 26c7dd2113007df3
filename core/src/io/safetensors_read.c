/* safetensors reader: maps each file once, validates every header field by the reference loader's
 * rules (FORMATS.md §7: full coverage, no overlaps, exact sizes) and hands out zero-copy views.
 * Sharded sets are read through model.safetensors.index.json; shard paths must stay inside its directory. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "nibble/safetensors.h"
#include "io/json_int.h"
#include "io/safetensors_internal.h"

enum { ST_MAX_HEADER = 100000000 };
/* 2^53: a JSON number above it is no longer an exact integer in cJSON's double. */
static const double ST_MAX_INT = 9007199254740992.0;

typedef struct st_shard {
    char *path;
    nb_buffer *buf;
    int64_t data_start;      /* 8 + header length: where the byte buffer starts in the file */
    int64_t nmeta;
    char **mkeys, **mvals;
} st_shard;

struct nb_st {
    int64_t n, cap;
    nb_st_entry *entries;
    int64_t *entry_shard;
    int64_t nshards;
    st_shard *shards;
    nb_strmap names;         /* name -> entry index */
};

/* ---- small helpers ------------------------------------------------------------------------- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
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

static int is_regular_file(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

/* A JSON number that is an exact non-negative integer (serde's usize), at most 2^53. */
static int json_uint(const cJSON *j, int64_t *out) { return nb_json_int(j, 0, (int64_t)ST_MAX_INT, out); }

/* JSON forbids raw bytes < 0x20 inside strings (serde rejects them); cJSON lets them through, and
 * a raw NUL would silently cut a name short. Returns the offending offset, or -1. */
static int64_t raw_control_in_string(const char *h, int64_t n) {
    int in_str = 0;
    for (int64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)h[i];
        if (!in_str) {
            if (c == '"') in_str = 1;
        } else if (c == '\\') {
            i++;   /* skip the escaped character */
        } else if (c == '"') {
            in_str = 0;
        } else if (c < 0x20) {
            return i;
        }
    }
    return -1;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* ---- entries ------------------------------------------------------------------------------- */

static nb_status push_entry(nb_ctx *ctx, nb_st *st, const nb_st_entry *e, int64_t shard) {
    if (st->n == st->cap) {
        int64_t ncap = st->cap ? st->cap * 2 : 64;
        nb_st_entry *ne = realloc(st->entries, (size_t)ncap * sizeof *ne);
        if (!ne) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (safetensors entries)");
        st->entries = ne;
        int64_t *ns = realloc(st->entry_shard, (size_t)ncap * sizeof *ns);
        if (!ns) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (safetensors entries)");
        st->entry_shard = ns;
        st->cap = ncap;
    }
    nb_st_entry *d = &st->entries[st->n];
    *d = *e;
    d->name = dup_str(e->name);
    if (!d->name) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (tensor name)");
    st->entry_shard[st->n] = shard;
    st->n++;
    return NB_OK;
}

/* One tensor's header entry: dtype, shape, data_offsets, and the size they imply. */
static nb_status parse_entry(nb_ctx *ctx, const char *path, const cJSON *item, nb_st_entry *e) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': header entry is not a JSON object", path, name);
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *f = item->child; f; f = f->next) {
        const cJSON **slot = strcmp(f->string, "dtype") == 0 ? &jd
                           : strcmp(f->string, "shape") == 0 ? &js
                           : strcmp(f->string, "data_offsets") == 0 ? &jo : NULL;
        if (!slot) continue;   /* unknown fields are ignored, as serde does */
        if (*slot)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': duplicate field \"%s\"", path, name, f->string);
        *slot = f;
    }
    if (!jd) return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", path, name);
    if (!cJSON_IsString(jd))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", path, name);
    int row = nb_st_dtype_lookup(jd->valuestring);
    if (row < 0)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name, jd->valuestring);
    const nb_st_dtype_row *dt = &nb_st_dtypes[row];
    if (dt->nb < 0)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported by nibble", path, name,
                       dt->name);
    e->dtype = (nb_dtype)dt->nb;

    if (!js) return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", path, name);
    if (!cJSON_IsArray(js))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", path, name);
    int ndim = cJSON_GetArraySize(js);
    if (ndim > NB_MAX_DIMS)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: tensor '%s': rank %d exceeds nibble's limit of %d", path, name,
                       ndim, NB_MAX_DIMS);
    e->ndim = ndim;
    int d = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        if (cJSON_IsNumber(x) && x->valuedouble < 0)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': negative dimension %g in shape", path, name,
                           x->valuedouble);
        if (!json_uint(x, &e->shape[d]))
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                           name, d);
    }

    if (!jo) return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", path, name);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &e->begin) ||
        !json_uint(jo->child->next, &e->end))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" is not a pair of non-negative integers",
                       path, name);
    if (e->begin > e->end)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] have begin > end", path, name,
                       (long long)e->begin, (long long)e->end);

    char sh[256];
    fmt_shape(sh, sizeof sh, ndim, e->shape);
    int64_t numel = 1, nbits;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(numel, e->shape[i], &numel))
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': element count of shape %s overflows", path, name, sh);
    if (__builtin_mul_overflow(numel, (int64_t)dt->bits, &nbits))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': size of shape %s overflows", path, name, sh);
    if (nbits % 8)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s': %lld elements of %s are not a whole number of bytes",
                       path, name, (long long)numel, dt->name);
    if (e->end - e->begin != nbits / 8)
        return nb_fail(ctx, NB_ERR_FORMAT,
                       "%s: tensor '%s': size mismatch: data_offsets [%lld, %lld] hold %lld bytes but %s %s needs %lld",
                       path, name, (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin), dt->name,
                       sh, (long long)(nbits / 8));
    /* nibble packs E2M1 two per byte along the last dim (torch's float4_e2m1fn_x2 always has an even one). */
    if (e->dtype == NB_E2M1 && (ndim == 0 || (e->shape[ndim - 1] & 1)))
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "%s: tensor '%s': F4 tensor of shape %s has an odd last dimension",
                       path, name, sh);
    return NB_OK;
}

static int cmp_offsets(const void *a, const void *b) {
    const nb_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static nb_status parse_metadata(nb_ctx *ctx, const char *path, const cJSON *m, st_shard *sh) {
    if (!cJSON_IsObject(m))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: __metadata__ is not a string-to-string map", path);
    int n = cJSON_GetArraySize(m);
    sh->mkeys = calloc((size_t)n + 1, sizeof(char *));
    sh->mvals = calloc((size_t)n + 1, sizeof(char *));
    if (!sh->mkeys || !sh->mvals) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (metadata)");
    nb_strmap seen = {0};
    nb_status s = NB_OK;
    for (const cJSON *x = m->child; x && !s; x = x->next) {
        if (!cJSON_IsString(x)) {
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: __metadata__ is not a string-to-string map (value of '%s')", path,
                        x->string);
            break;
        }
        int r = nb_strmap_put(&seen, x->string, 0, NULL);
        if (r < 0) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (metadata)");
        else if (r == 0) s = nb_fail(ctx, NB_ERR_FORMAT, "%s: __metadata__ has duplicate key '%s'", path, x->string);
        if (s) break;
        sh->mkeys[sh->nmeta] = dup_str(x->string);
        sh->mvals[sh->nmeta] = dup_str(x->valuestring);
        sh->nmeta++;
        if (!sh->mkeys[sh->nmeta - 1] || !sh->mvals[sh->nmeta - 1])
            s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (metadata)");
    }
    nb_strmap_free(&seen);
    return s;
}

/* Map shard si, validate its header and append its entries. claims (sharded sets only) maps each
 * tensor name of weight_map to the shard index it is assigned to; index is the index file's path. */
static nb_status load_shard(nb_ctx *ctx, nb_st *st, int64_t si, const nb_strmap *claims, const char *index,
                            const char *const *shard_names) {
    st_shard *sh = &st->shards[si];
    const char *path = sh->path;
    nb_status s = nb_buffer_mmap(ctx, path, &sh->buf);
    if (s) return s;
    const unsigned char *data = nb_buffer_data(sh->buf);
    int64_t size = (int64_t)nb_buffer_size(sh->buf);
    if (size < 8)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length", path,
                       (long long)size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
    if (n > ST_MAX_HEADER)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header length %llu is larger than the limit of %d bytes", path,
                       (unsigned long long)n, ST_MAX_HEADER);
    if ((int64_t)n > size - 8)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%lld bytes)", path,
                       (unsigned long long)n, (long long)size);
    const char *hdr = (const char *)data + 8;
    if (n == 0 || hdr[0] != '{')
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header does not start with '{'", path);
    if (!nb_utf8_valid((const unsigned char *)hdr, (int64_t)n))
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header is not valid UTF-8", path);
    int64_t bad = raw_control_in_string(hdr, (int64_t)n);
    if (bad >= 0)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header is not valid JSON (raw control character in a string at byte %lld)",
                       path, (long long)bad);
    sh->data_start = 8 + (int64_t)n;
    int64_t buflen = size - sh->data_start;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0);
    if (!root)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header is not valid JSON (error near byte %lld of the header)", path,
                       end ? (long long)(end - hdr) : -1LL);
    for (const char *p = end; p < hdr + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: header is not valid JSON (trailing data at byte %lld)", path,
                           (long long)(p - hdr));
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: header is not a JSON object", path);
    }

    int64_t first = st->n;
    int seen_meta = 0;
    for (const cJSON *item = root->child; item && !s; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (seen_meta++) s = nb_fail(ctx, NB_ERR_FORMAT, "%s: duplicate key '__metadata__'", path);
            else s = parse_metadata(ctx, path, item, sh);
            continue;
        }
        nb_st_entry e;
        memset(&e, 0, sizeof e);
        e.name = item->string;
        e.shard = path;
        if ((s = parse_entry(ctx, path, item, &e))) break;
        if (claims) {
            int64_t c = nb_strmap_get(claims, e.name);
            if (c < 0) {
                s = nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s' is in this shard but not in the weight_map of %s",
                            path, e.name, index);
                break;
            }
            if (c != si) {
                s = nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s' is in this shard but %s assigns it to %s", path,
                            e.name, index, shard_names[c]);
                break;
            }
        }
        if ((s = push_entry(ctx, st, &e, si))) break;
        int64_t other = -1;
        int r = nb_strmap_put(&st->names, st->entries[st->n - 1].name, st->n - 1, &other);
        if (r < 0) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory (name map)");
        else if (r == 0 && st->entry_shard[other] == si)
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: duplicate tensor name '%s'", path, e.name);
        else if (r == 0)
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s' also appears in %s", path, e.name,
                        st->entries[other].shard);
    }
    cJSON_Delete(root);
    if (s) return s;

    /* The reference sorts by data_offsets and requires each tensor to start where the previous
     * one ended and the last to end at the end of the file. */
    if (st->n > first) qsort(st->entries + first, (size_t)(st->n - first), sizeof *st->entries, cmp_offsets);
    int64_t prev_end = 0;
    const char *prev = NULL;
    for (int64_t i = first; i < st->n; i++) {
        const nb_st_entry *e = &st->entries[i];
        nb_strmap_set(&st->names, e->name, i);
        if (e->end > buflen)
            return nb_fail(ctx, NB_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets [%lld, %lld] are outside the byte buffer (%lld bytes)", path,
                           e->name, (long long)e->begin, (long long)e->end, (long long)buflen);
        if (e->begin < prev_end)
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s' at [%lld, %lld] overlaps tensor '%s' (ends at %lld)",
                           path, e->name, (long long)e->begin, (long long)e->end, prev, (long long)prev_end);
        if (e->begin > prev_end)
            return nb_fail(ctx, NB_ERR_FORMAT,
                           "%s: hole: bytes [%lld, %lld) of the byte buffer belong to no tensor (before tensor '%s')",
                           path, (long long)prev_end, (long long)e->begin, e->name);
        prev_end = e->end;
        prev = e->name;
    }
    if (prev_end != buflen)
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: hole: bytes [%lld, %lld) at the end of the byte buffer belong to no tensor",
                       path, (long long)prev_end, (long long)buflen);
    return NB_OK;
}

/* ---- opening -------------------------------------------------------------------------------- */

static nb_status new_st(nb_ctx *ctx, int64_t nshards, nb_st **out) {
    nb_st *st = calloc(1, sizeof *st);
    if (st) st->shards = calloc((size_t)(nshards ? nshards : 1), sizeof *st->shards);
    if (!st || !st->shards) {
        free(st);
        return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (safetensors handle)");
    }
    st->nshards = nshards;
    *out = st;
    return NB_OK;
}

static nb_status open_single(nb_ctx *ctx, const char *path, nb_st **out) {
    nb_st *st = NULL;
    nb_status s = new_st(ctx, 1, &st);
    if (s) return s;
    st->shards[0].path = dup_str(path);
    if (!st->shards[0].path) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    else s = load_shard(ctx, st, 0, NULL, NULL, NULL);
    if (s) { nb_st_close(st); return s; }
    *out = st;
    return NB_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A shard path from weight_map must name a file inside the index's directory. */
static nb_status check_shard_path(nb_ctx *ctx, const char *index, const char *dir, const char *dir_real,
                                  const char *name, char **full) {
    *full = NULL;
    if (!name[0]) return nb_fail(ctx, NB_ERR_FORMAT, "%s: empty shard path in weight_map", index);
    if (name[0] == '/')
        return nb_fail(ctx, NB_ERR_FORMAT, "%s: shard path '%s' is absolute; shards must be inside the model directory",
                       index, name);
    for (const char *p = name; *p;) {
        const char *q = strchr(p, '/');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return nb_fail(ctx, NB_ERR_FORMAT, "%s: shard path '%s' escapes the model directory ('..')", index, name);
        p += len + (q ? 1 : 0);
    }
    char *path = join_path(dir, name);
    if (!path) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    char *real = realpath(path, NULL);
    if (!real) {
        int e = errno;
        nb_status s = e == ENOENT
            ? nb_fail(ctx, NB_ERR_IO, "%s: missing shard file %s (listed in weight_map)", index, path)
            : nb_fail(ctx, NB_ERR_IO, "%s: cannot resolve shard %s: %s", index, path, strerror(e));
        free(path);
        return s;
    }
    size_t dl = strlen(dir_real);
    int inside = strncmp(real, dir_real, dl) == 0 && (real[dl] == '/' || (dl == 1 && dir_real[0] == '/'));
    if (!inside) {
        nb_status s = nb_fail(ctx, NB_ERR_FORMAT, "%s: shard path '%s' resolves outside the model directory (to %s)",
                              index, name, real);
        free(real);
        free(path);
        return s;
    }
    free(real);
    *full = path;
    return NB_OK;
}

static nb_status open_index(nb_ctx *ctx, const char *index, nb_st **out) {
    nb_buffer *ib = NULL;
    nb_status s = nb_buffer_mmap(ctx, index, &ib);
    if (s) return s;
    cJSON *root = nb_buffer_size(ib) ? cJSON_ParseWithLength(nb_buffer_data(ib), nb_buffer_size(ib)) : NULL;
    nb_buffer_release(ib);
    if (!root) return nb_fail(ctx, NB_ERR_FORMAT, "%s: index is not valid JSON", index);

    nb_strmap claims = {0}, shard_ids = {0};
    const char **names = NULL;
    char *dir = NULL, *dir_real = NULL;
    nb_st *st = NULL;
    int64_t nnames = 0, nshards = 0;
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        s = nb_fail(ctx, NB_ERR_FORMAT, "%s: index has no \"weight_map\" object", index);
        goto done;
    }
    /* Unique shard names, sorted so that entry order does not depend on the map's order. */
    int count = cJSON_GetArraySize(wm);
    names = calloc((size_t)count + 1, sizeof *names);
    if (!names) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    for (const cJSON *x = wm->child; x; x = x->next) {
        if (!cJSON_IsString(x)) {
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: weight_map entry for tensor '%s' is not a string", index, x->string);
            goto done;
        }
        names[nnames++] = x->valuestring;
    }
    qsort(names, (size_t)nnames, sizeof *names, cmp_str);
    for (int64_t i = 0; i < nnames; i++)
        if (i == 0 || strcmp(names[i], names[nshards - 1]) != 0) names[nshards++] = names[i];
    for (int64_t i = 0; i < nshards; i++)
        if (nb_strmap_put(&shard_ids, names[i], i, NULL) < 0) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    for (const cJSON *x = wm->child; x; x = x->next) {
        int r = nb_strmap_put(&claims, x->string, nb_strmap_get(&shard_ids, x->valuestring), NULL);
        if (r < 0) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
        if (r == 0) {
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: weight_map lists tensor '%s' twice", index, x->string);
            goto done;
        }
    }

    const char *slash = strrchr(index, '/');
    if (slash) {
        size_t dl = (size_t)(slash - index);
        dir = malloc(dl + 2);
        if (dir) {
            memcpy(dir, index, dl ? dl : 1);   /* "/model.safetensors.index.json" lives in "/" */
            dir[dl ? dl : 1] = 0;
        }
    } else {
        dir = dup_str(".");
    }
    if (!dir) { s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory"); goto done; }
    dir_real = realpath(dir, NULL);
    if (!dir_real) { s = nb_fail(ctx, NB_ERR_IO, "cannot resolve directory %s: %s", dir, strerror(errno)); goto done; }

    if ((s = new_st(ctx, nshards, &st))) goto done;
    for (int64_t i = 0; i < nshards; i++)
        if ((s = check_shard_path(ctx, index, dir, dir_real, names[i], &st->shards[i].path))) goto done;
    for (int64_t i = 0; i < nshards; i++)
        if ((s = load_shard(ctx, st, i, &claims, index, names))) goto done;
    for (const cJSON *x = wm->child; x; x = x->next)
        if (nb_st_find(st, x->string) < 0) {
            s = nb_fail(ctx, NB_ERR_FORMAT, "%s: tensor '%s' is listed in weight_map but missing from its shard %s",
                        index, x->string, x->valuestring);
            goto done;
        }
done:
    free(names);
    free(dir);
    free(dir_real);
    nb_strmap_free(&claims);
    nb_strmap_free(&shard_ids);
    cJSON_Delete(root);
    if (s) { nb_st_close(st); return s; }
    *out = st;
    return NB_OK;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

nb_status nb_st_open(nb_ctx *ctx, const char *path, nb_st **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ends_with(path, ".json") ? open_index(ctx, path, out) : open_single(ctx, path, out);
    char *idx = join_path(path, "model.safetensors.index.json");
    char *one = join_path(path, "model.safetensors");
    nb_status s;
    if (!idx || !one) s = nb_fail(ctx, NB_ERR_NOMEM, "out of memory");
    else if (is_regular_file(idx)) s = open_index(ctx, idx, out);
    else if (is_regular_file(one)) s = open_single(ctx, one, out);
    else s = nb_fail(ctx, NB_ERR_NOT_FOUND, "%s has neither model.safetensors.index.json nor model.safetensors", path);
    free(idx);
    free(one);
    return s;
}

void nb_st_close(nb_st *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n; i++) free((char *)st->entries[i].name);
    for (int64_t i = 0; i < st->nshards; i++) {
        st_shard *sh = &st->shards[i];
        for (int64_t k = 0; k < sh->nmeta; k++) { free(sh->mkeys[k]); free(sh->mvals[k]); }
        free(sh->mkeys);
        free(sh->mvals);
        nb_buffer_release(sh->buf);
        free(sh->path);
    }
    free(st->shards);
    free(st->entries);
    free(st->entry_shard);
    nb_strmap_free(&st->names);
    free(st);
}

/* ---- queries -------------------------------------------------------------------------------- */

int64_t nb_st_count(const nb_st *st) { return st->n; }

const nb_st_entry *nb_st_entry_at(const nb_st *st, int64_t i) {
    return (i >= 0 && i < st->n) ? &st->entries[i] : NULL;
}

int64_t nb_st_find(const nb_st *st, const char *name) { return nb_strmap_get(&st->names, name); }

const char *nb_st_metadata(const nb_st *st, const char *key) {
    if (!st->nshards) return NULL;
    const st_shard *sh = &st->shards[0];
    for (int64_t i = 0; i < sh->nmeta; i++)
        if (strcmp(sh->mkeys[i], key) == 0) return sh->mvals[i];
    return NULL;
}

int64_t nb_st_metadata_count(const nb_st *st) { return st->nshards ? st->shards[0].nmeta : 0; }

const char *nb_st_metadata_key(const nb_st *st, int64_t i) {
    if (!st->nshards || i < 0 || i >= st->shards[0].nmeta) return NULL;
    return st->shards[0].mkeys[i];
}

int64_t nb_st_shard_count(const nb_st *st) { return st->nshards; }

const char *nb_st_shard_path(const nb_st *st, int64_t i) {
    return (i >= 0 && i < st->nshards) ? st->shards[i].path : NULL;
}

nb_status nb_st_get(nb_ctx *ctx, nb_st *st, const char *name, nb_tensor **out) {
    *out = NULL;
    int64_t i = nb_st_find(st, name);
    if (i < 0)
        return nb_fail(ctx, NB_ERR_NOT_FOUND, "tensor '%s' not found in %s", name,
                       st->nshards ? st->shards[0].path : "(empty safetensors set)");
    const nb_st_entry *e = &st->entries[i];
    const st_shard *sh = &st->shards[st->entry_shard[i]];
    int64_t off = sh->data_start + e->begin;
    int align = nb_dtype_info(e->dtype)->bits / 8;
    if (align <= 1 || off % align == 0) return nb_tensor_wrap(ctx, sh->buf, e->dtype, e->ndim, e->shape, off, out);
    /* Misaligned data (a third-party writer that did not pad the header): typed loads from it
     * would be undefined behaviour, so hand out an aligned copy. */
    return nb_tensor_from_data(ctx, e->dtype, e->ndim, e->shape, (const uint8_t *)nb_buffer_data(sh->buf) + off, out);
}

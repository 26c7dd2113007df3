/* Mixed parameter buffers: the layout of several parameters of mixed formats in one allocation,
 * with Megatron's two maps (param_index_map in logical elements, the packed map where NVFP4
 * spans halve) and byte ranges into the storage. */
#include <stdlib.h>
#include <string.h>

#include "nibble/parambuf.h"
#include "quant/quant_internal.h"

enum { PB_ALIGN = 64 };

typedef struct pb_entry {
    char *name;
    nb_qformat fmt;
    nb_dtype store_dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    int64_t numel;
    int64_t start, end;          /* param_index_map */
    int64_t pstart, pend;        /* packed map */
    int64_t bstart, bend;        /* storage bytes */
} pb_entry;

struct nb_parambuf {
    pb_entry *e;
    int n, cap;
    int64_t numel, packed_numel, nbytes;
    nb_buffer *buf;
};

nb_status nb_parambuf_new(nb_ctx *ctx, nb_parambuf **out) {
    *out = calloc(1, sizeof **out);
    return *out ? NB_OK : nb_fail(ctx, NB_ERR_NOMEM, "out of memory (param buffer)");
}

void nb_parambuf_free(nb_parambuf *pb) {
    if (!pb) return;
    for (int i = 0; i < pb->n; i++) free(pb->e[i].name);
    free(pb->e);
    nb_buffer_release(pb->buf);
    free(pb);
}

int nb_parambuf_find(const nb_parambuf *pb, const char *name) {
    for (int i = 0; name && i < pb->n; i++)
        if (strcmp(pb->e[i].name, name) == 0) return i;
    return -1;
}

nb_status nb_parambuf_add(nb_ctx *ctx, nb_parambuf *pb, const char *name, nb_qformat fmt, nb_dtype dtype, int ndim,
                          const int64_t *shape) {
    if (!name) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: parameter name is NULL");
    if (pb->buf) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: '%s' added after finalize", name);
    if (nb_parambuf_find(pb, name) >= 0) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: duplicate parameter '%s'", name);
    if (!nb_qformat_info(fmt)) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: '%s' has unknown format %d", name, (int)fmt);
    if (ndim < 1 || ndim > NB_MAX_DIMS) return nb_fail(ctx, NB_ERR_SHAPE, "param buffer: '%s' has ndim %d", name, ndim);
    nb_dtype sd = fmt == NB_FMT_NONE ? dtype : (nbq_is_nvfp4(fmt) ? NB_E2M1 : NB_E4M3);
    if (!nb_dtype_info(sd)) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: '%s' has unknown dtype %d", name, (int)dtype);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return nb_fail(ctx, NB_ERR_SHAPE, "param buffer: '%s' has a negative dimension", name);
        numel *= shape[i];
    }
    /* Only the storage layout matters here (block divisibility is the quantizer's rule): packed
     * E2M1 rows must not share a byte. */
    if (sd == NB_E2M1 && (shape[ndim - 1] & 1))
        return nb_fail(ctx, NB_ERR_SHAPE, "param buffer: '%s' last dimension %lld is odd: packed E2M1 rows need an even one",
                       name, (long long)shape[ndim - 1]);
    if (pb->n == pb->cap) {
        int cap = pb->cap ? pb->cap * 2 : 8;
        pb_entry *e = realloc(pb->e, (size_t)cap * sizeof *e);
        if (!e) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (param buffer)");
        pb->e = e;
        pb->cap = cap;
    }
    pb_entry *e = &pb->e[pb->n];
    memset(e, 0, sizeof *e);
    size_t len = strlen(name) + 1;
    if (!(e->name = malloc(len))) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (param buffer)");
    memcpy(e->name, name, len);
    e->fmt = fmt;
    e->store_dtype = sd;
    e->ndim = ndim;
    memcpy(e->shape, shape, (size_t)ndim * sizeof(int64_t));
    e->numel = numel;
    e->start = pb->numel;
    e->end = e->start + numel;
    e->pstart = pb->packed_numel;
    e->pend = e->pstart + (sd == NB_E2M1 ? numel / 2 : numel);
    pb->numel = e->end;
    pb->packed_numel = e->pend;
    pb->n++;
    return NB_OK;
}

nb_status nb_parambuf_finalize(nb_ctx *ctx, nb_parambuf *pb) {
    if (pb->buf) return NB_OK;
    int64_t off = 0;
    for (int i = 0; i < pb->n; i++) {
        pb_entry *e = &pb->e[i];
        off = (off + PB_ALIGN - 1) / PB_ALIGN * PB_ALIGN;
        e->bstart = off;
        e->bend = off + nb_dtype_nbytes(e->store_dtype, e->numel);
        off = e->bend;
    }
    pb->nbytes = off;
    return nb_buffer_new(ctx, (size_t)(off ? off : 1), &pb->buf);
}

int nb_parambuf_count(const nb_parambuf *pb) { return pb->n; }
const char *nb_parambuf_name(const nb_parambuf *pb, int i) { return (i >= 0 && i < pb->n) ? pb->e[i].name : NULL; }
int nb_parambuf_has_nvfp4(const nb_parambuf *pb) {
    for (int i = 0; i < pb->n; i++)
        if (pb->e[i].store_dtype == NB_E2M1) return 1;
    return 0;
}
int64_t nb_parambuf_numel(const nb_parambuf *pb) { return pb->numel; }
int64_t nb_parambuf_packed_numel(const nb_parambuf *pb) { return pb->packed_numel; }
int64_t nb_parambuf_nbytes(const nb_parambuf *pb) { return pb->nbytes; }
nb_buffer *nb_parambuf_buffer(const nb_parambuf *pb) { return pb->buf; }

static nb_status lookup(nb_ctx *ctx, const nb_parambuf *pb, const char *name, const pb_entry **out) {
    int i = nb_parambuf_find(pb, name);
    if (i < 0) return nb_fail(ctx, NB_ERR_NOT_FOUND, "param buffer: no parameter '%s'", name ? name : "(null)");
    *out = &pb->e[i];
    return NB_OK;
}

nb_status nb_parambuf_index(nb_ctx *ctx, const nb_parambuf *pb, const char *name, int64_t *start, int64_t *end) {
    const pb_entry *e = NULL;
    nb_status s = lookup(ctx, pb, name, &e);
    if (s) return s;
    *start = e->start;
    *end = e->end;
    return NB_OK;
}

nb_status nb_parambuf_packed_index(nb_ctx *ctx, const nb_parambuf *pb, const char *name, int64_t *start, int64_t *end) {
    const pb_entry *e = NULL;
    nb_status s = lookup(ctx, pb, name, &e);
    if (s) return s;
    *start = e->pstart;
    *end = e->pend;
    return NB_OK;
}

nb_status nb_parambuf_byte_range(nb_ctx *ctx, const nb_parambuf *pb, const char *name, int64_t *start, int64_t *end) {
    const pb_entry *e = NULL;
    nb_status s = lookup(ctx, pb, name, &e);
    if (s) return s;
    if (!pb->buf) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: byte ranges exist after finalize");
    *start = e->bstart;
    *end = e->bend;
    return NB_OK;
}

nb_status nb_parambuf_view(nb_ctx *ctx, const nb_parambuf *pb, const char *name, nb_tensor **out) {
    *out = NULL;
    const pb_entry *e = NULL;
    nb_status s = lookup(ctx, pb, name, &e);
    if (s) return s;
    if (!pb->buf) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: views exist after finalize");
    return nb_tensor_wrap(ctx, pb->buf, e->store_dtype, e->ndim, e->shape, e->bstart, out);
}

nb_status nb_parambuf_store(nb_ctx *ctx, nb_parambuf *pb, const char *name, const nb_qtensor *q) {
    const pb_entry *e = NULL;
    nb_status s = lookup(ctx, pb, name, &e);
    if (s) return s;
    if (!pb->buf) return nb_fail(ctx, NB_ERR_INVALID, "param buffer: store after finalize only");
    const nb_qformat_traits *a = nb_qformat_info(e->fmt), *b = nb_qformat_info(q->format);
    if (e->fmt == NB_FMT_NONE || a->disk_format != b->disk_format)
        return nb_fail(ctx, NB_ERR_INVALID, "param buffer: '%s' is %s, the quantized tensor %s", name, a->name, b->name);
    if (nb_qtensor_numel(q) != e->numel || q->ndim != e->ndim)
        return nb_fail(ctx, NB_ERR_SHAPE, "param buffer: '%s' shape differs from the quantized tensor", name);
    memcpy((uint8_t *)nb_buffer_data(pb->buf) + e->bstart, nb_tensor_data(q->data), (size_t)(e->bend - e->bstart));
    return NB_OK;
}

/* nb_dataset: the tokenized global stream (ids + loss mask) with its document boundaries and a
 * running fingerprint, built by appending documents; accessors, the held-out split, refcounting.
 * Reading files and rendering records into tokens lives in records.c; packing in loader.c. */
#include <math.h>
#include <string.h>

#include "data/data_internal.h"

void nb_data_opts_init(nb_data_opts *o) {
    memset(o, 0, sizeof(*o));
    o->format = NB_DATA_FORMAT_AUTO;
    o->split = NB_SPLIT_BLANK_LINE;
    o->chat_template = NB_CHAT_AUTO;
    o->add_bos = -1;
    o->add_eos = -1;
}

nb_status nb_dataset_new(nb_ctx *ctx, nb_dataset **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_new: out is NULL");
    *out = NULL;
    nb_dataset *ds = nb_alloc(ctx, sizeof(*ds));
    if (!ds) return NB_ERR_NOMEM;
    nb_ctx_retain(ctx);
    ds->ctx = ctx;
    ds->refcount = 1;
    ds->eos = -1;
    ds->hash = 0x6e62646174617365ull;   /* "nbdatase" */
    *out = ds;
    return NB_OK;
}

void nb_dataset_retain(nb_dataset *ds) {
    if (ds) ds->refcount++;
}

void nb_dataset_release(nb_dataset *ds) {
    if (!ds || --ds->refcount > 0) return;
    nb_ctx *ctx = ds->ctx;
    if (ds->ids) nb_dealloc(ctx, ds->ids, (size_t)ds->cap * sizeof(int32_t));
    if (ds->mask) nb_dealloc(ctx, ds->mask, (size_t)ds->cap);
    if (ds->doc_end) nb_dealloc(ctx, ds->doc_end, (size_t)ds->doc_cap * sizeof(int64_t));
    nb_dealloc(ctx, ds, sizeof(*ds));
    nb_ctx_release(ctx);
}

/* Grow a counted array to hold at least `need` elements (doubling), keeping its contents. */
static nb_status grow(nb_ctx *ctx, void **p, int64_t old_cap, int64_t new_cap, size_t elem) {
    void *q = nb_alloc(ctx, (size_t)new_cap * elem);
    if (!q) return NB_ERR_NOMEM;
    if (*p) {
        memcpy(q, *p, (size_t)old_cap * elem);
        nb_dealloc(ctx, *p, (size_t)old_cap * elem);
    }
    *p = q;
    return NB_OK;
}

static int64_t next_cap(int64_t cap, int64_t need, int64_t floor) {
    int64_t c = cap > 0 ? cap : floor;
    while (c < need) c = c * 2;
    return c;
}

nb_status nb_data_append_doc(nb_ctx *ctx, nb_dataset *ds, const int32_t *ids, const uint8_t *mask, int64_t n) {
    if (ds->n + n > ds->cap) {
        /* allocate both before touching either, so a failure leaves the dataset as it was */
        int64_t nc = next_cap(ds->cap, ds->n + n, 4096);
        int32_t *a = nb_alloc(ctx, (size_t)nc * sizeof(int32_t));
        uint8_t *b = a ? nb_alloc(ctx, (size_t)nc) : NULL;
        if (!b) {
            if (a) nb_dealloc(ctx, a, (size_t)nc * sizeof(int32_t));
            return NB_ERR_NOMEM;
        }
        if (ds->ids) {
            memcpy(a, ds->ids, (size_t)ds->n * sizeof(int32_t));
            memcpy(b, ds->mask, (size_t)ds->n);
            nb_dealloc(ctx, ds->ids, (size_t)ds->cap * sizeof(int32_t));
            nb_dealloc(ctx, ds->mask, (size_t)ds->cap);
        }
        ds->ids = a;
        ds->mask = b;
        ds->cap = nc;
    }
    if (ds->n_docs + 1 > ds->doc_cap) {
        int64_t nc = next_cap(ds->doc_cap, ds->n_docs + 1, 256);
        void *a = ds->doc_end;
        nb_status s = grow(ctx, &a, ds->doc_cap, nc, sizeof(int64_t));
        if (s) return s;
        ds->doc_end = a;
        ds->doc_cap = nc;
    }
    uint64_t h = ds->hash;
    int64_t masked = 0;
    for (int64_t i = 0; i < n; i++) {
        uint8_t m = mask ? (mask[i] != 0) : 1;
        ds->ids[ds->n + i] = ids[i];
        ds->mask[ds->n + i] = m;
        masked += m;
        h = nb_data_mix64(h + ((uint64_t)(uint32_t)ids[i] | (uint64_t)m << 32) + 0x9e3779b97f4a7c15ull);
    }
    ds->hash = nb_data_mix64(h ^ ((uint64_t)n * 0x2545f4914f6cdd1dull + 0xd0cull));
    ds->n += n;
    ds->n_masked += masked;
    ds->doc_end[ds->n_docs++] = ds->n;
    return NB_OK;
}

nb_status nb_dataset_add_tokens(nb_ctx *ctx, nb_dataset *ds, const int32_t *ids, const uint8_t *mask, int64_t n) {
    if (!ds) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_add_tokens: dataset is NULL");
    if (ds->frozen) return nb_fail(ctx, NB_ERR_INVALID, "dataset is in use by a dataloader: it can take no more documents");
    if (n < 0 || (n > 0 && !ids)) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_add_tokens: bad ids or count %lld", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_add_tokens: id %d at %lld is negative", ids[i], (long long)i);
    }
    return nb_data_append_doc(ctx, ds, ids, mask, n);
}

nb_status nb_dataset_split(nb_ctx *ctx, const nb_dataset *ds, double eval_fraction, nb_dataset **train,
                           nb_dataset **eval) {
    if (!ds || !train || !eval) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataset_split: NULL argument");
    *train = *eval = NULL;
    if (!(eval_fraction > 0.0 && eval_fraction < 1.0))
        return nb_fail(ctx, NB_ERR_INVALID, "eval fraction must be in (0, 1), got %g", eval_fraction);
    if (ds->n_docs < 2)
        return nb_fail(ctx, NB_ERR_INVALID, "cannot split a dataset of %lld document(s): need at least 2",
                       (long long)ds->n_docs);
    double target = (1.0 - eval_fraction) * (double)ds->n;
    int64_t best = 1;
    double best_d = INFINITY;
    for (int64_t k = 1; k < ds->n_docs; k++) {   /* boundary before document k */
        double d = fabs((double)ds->doc_end[k - 1] - target);
        if (d < best_d) { best_d = d; best = k; }
    }
    nb_dataset *a = NULL, *b = NULL;
    nb_status s = nb_dataset_new(ctx, &a);
    if (!s) s = nb_dataset_new(ctx, &b);
    for (int64_t k = 0; k < ds->n_docs && !s; k++) {
        int64_t lo = k ? ds->doc_end[k - 1] : 0, hi = ds->doc_end[k];
        s = nb_data_append_doc(ctx, k < best ? a : b, ds->ids + lo, ds->mask + lo, hi - lo);
    }
    if (s) {
        nb_dataset_release(a);
        nb_dataset_release(b);
        return s;
    }
    a->eos = b->eos = ds->eos;
    *train = a;
    *eval = b;
    return NB_OK;
}

int64_t nb_dataset_n_tokens(const nb_dataset *ds) { return ds ? ds->n : 0; }
int64_t nb_dataset_n_docs(const nb_dataset *ds) { return ds ? ds->n_docs : 0; }
int64_t nb_dataset_n_masked(const nb_dataset *ds) { return ds ? ds->n_masked : 0; }
int64_t nb_dataset_doc_start(const nb_dataset *ds, int64_t i) {
    if (!ds || i <= 0) return 0;
    if (i >= ds->n_docs) return ds->n;
    return ds->doc_end[i - 1];
}
const int32_t *nb_dataset_ids(const nb_dataset *ds) { return ds ? ds->ids : NULL; }
const uint8_t *nb_dataset_mask(const nb_dataset *ds) { return ds ? ds->mask : NULL; }
int32_t nb_dataset_eos(const nb_dataset *ds) { return ds ? ds->eos : -1; }
uint64_t nb_dataset_fingerprint(const nb_dataset *ds) { return ds ? ds->hash : 0; }

/* nb_dataloader: rows of seq_len tokens (+1 for the targets) cut from a dataset's global stream (or one
 * document per row), epoch offsets and row orders drawn from the seed, batches, and a cursor that
 * saves and restores exactly. Every draw is a function of (seed, epoch) alone (see nibble/data.h), so
 * all ranks and thread counts read the same rows, and a restored cursor continues the same sequence. */
#include <string.h>

#include "data/data_internal.h"

struct nb_dataloader {
    nb_ctx *ctx;
    nb_dataset *ds;
    nb_dataloader_cfg cfg;
    int64_t avail;           /* rows the data gives (packed: at every offset; unpacked: documents) */
    int64_t per_epoch;       /* rows per epoch, after drop_last */
    int64_t pool;            /* rows an epoch is drawn from (shuffled when cfg.shuffle) */
    int32_t pad;
    uint64_t fingerprint;
    /* the cursor */
    int64_t epoch, row, rows_read, cur_offset;
    nb_rng cur_rng;
    /* the epoch whose row order is in perm (for reads of any epoch) */
    int64_t cache_epoch, cache_offset;
    int64_t *perm;
};

void nb_dataloader_cfg_init(nb_dataloader_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->batch = 1;
    c->pack = 1;
    c->pad_id = -1;
}

/* ---- the draws ----------------------------------------------------------------------------------- */

/* xoshiro256's jump: advances the state by 2^128 draws (the reference constants of Blackman & Vigna),
 * so the streams of different epochs never overlap. */
static void rng_jump(nb_rng *r) {
    static const uint64_t J[4] = { 0x180ec6d33cfd0abaull, 0xd5a61266f0c9392cull, 0xa9582618e03fc9aaull,
                                   0x39abdc4529b1661cull };
    uint64_t s[4] = { 0, 0, 0, 0 };
    for (int i = 0; i < 4; i++) {
        for (int b = 0; b < 64; b++) {
            if (J[i] & (1ull << b)) {
                for (int k = 0; k < 4; k++) s[k] ^= r->s[k];
            }
            nb_rng_next(r);
        }
    }
    memcpy(r->s, s, sizeof s);
}

static void epoch_rng(uint64_t seed, int64_t epoch, nb_rng *r) {
    nb_rng_seed(r, seed);
    for (int64_t e = 0; e < epoch; e++) rng_jump(r);
}

/* Uniform in [0, n) without modulo bias: reject draws below 2^64 mod n. */
static uint64_t uniform_below(nb_rng *r, uint64_t n) {
    uint64_t t = (0 - n) % n, x;
    do x = nb_rng_next(r); while (x < t);
    return x % n;
}

int64_t nb_data_offset(uint64_t seed, int64_t epoch, int64_t seq_len) {
    if (seq_len <= 0 || epoch < 0) return 0;
    nb_rng r;
    epoch_rng(seed, epoch, &r);
    return (int64_t)uniform_below(&r, (uint64_t)seq_len);
}

/* An epoch's offset, the RNG after its draws and (when perm is not NULL and shuffling) its row order. */
static void epoch_setup(const nb_dataloader *ld, int64_t epoch, int64_t *offset, nb_rng *rng, int64_t *perm) {
    nb_rng r;
    epoch_rng(ld->cfg.seed, epoch, &r);
    *offset = ld->cfg.pack && ld->cfg.random_offset ? (int64_t)uniform_below(&r, (uint64_t)ld->cfg.seq_len) : 0;
    if (ld->cfg.shuffle) {
        /* the draws are made even when perm is NULL, so the RNG state is the same either way */
        if (perm) for (int64_t i = 0; i < ld->pool; i++) perm[i] = i;
        for (int64_t i = ld->pool - 1; i > 0; i--) {
            int64_t j = (int64_t)uniform_below(&r, (uint64_t)i + 1);
            if (perm) { int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
        }
    }
    if (rng) *rng = r;
}

/* ---- construction -------------------------------------------------------------------------------- */

static uint64_t fold(uint64_t h, uint64_t v) { return nb_data_mix64(h ^ (v + 0x9e3779b97f4a7c15ull)); }

nb_status nb_dataloader_new(nb_ctx *ctx, nb_dataset *ds, const nb_dataloader_cfg *cfg, nb_dataloader **out) {
    if (!out) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataloader_new: out is NULL");
    *out = NULL;
    if (!ds || !cfg) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataloader_new: NULL dataset or configuration");
    const nb_dataloader_cfg c = *cfg;
    if (c.seq_len <= 0) return nb_fail(ctx, NB_ERR_INVALID, "seq_len must be > 0, got %lld", (long long)c.seq_len);
    if (c.batch <= 0) return nb_fail(ctx, NB_ERR_INVALID, "batch must be > 0, got %lld", (long long)c.batch);
    if (c.samples < 0) return nb_fail(ctx, NB_ERR_INVALID, "samples must be >= 0 (0 = all rows), got %lld", (long long)c.samples);
    if ((c.random_offset | c.pack | c.shuffle | c.wrap | c.drop_last) & ~1)
        return nb_fail(ctx, NB_ERR_INVALID, "random_offset, pack, shuffle, wrap and drop_last must be 0 or 1");
    if (c.pad_id < -1) return nb_fail(ctx, NB_ERR_INVALID, "pad_id must be a token id or -1, got %d", c.pad_id);
    if (c.seq_len > (INT64_MAX / 4) || c.samples > (INT64_MAX / 4) / c.seq_len)
        return nb_fail(ctx, NB_ERR_INVALID, "seq_len %lld x samples %lld is too large", (long long)c.seq_len,
                       (long long)c.samples);
    const int64_t N = ds->n, S = c.seq_len;
    int64_t avail;
    if (c.pack) {
        if (c.random_offset) avail = N >= S ? (N - S) / S : 0;
        else avail = N >= 1 ? (N - 1) / S : 0;
        if (avail == 0) {
            return nb_fail(ctx, NB_ERR_INVALID, "the data has %lld tokens: too few for one row of seq_len + 1 = %lld "
                           "tokens%s", (long long)N, (long long)S + 1,
                           c.random_offset ? " after a random offset of up to seq_len - 1" : "");
        }
    } else {
        avail = ds->n_docs;
        if (avail == 0) return nb_fail(ctx, NB_ERR_INVALID, "the dataset has no documents");
    }
    int64_t E = c.samples ? c.samples : avail;
    if (E > avail && !c.wrap) {
        if (c.pack) {
            return nb_fail(ctx, NB_ERR_INVALID, "samples = %lld, but %lld tokens give only %lld rows of seq_len %lld%s; "
                           "lower samples or set wrap to reuse the stream", (long long)E, (long long)N, (long long)avail,
                           (long long)S, c.random_offset ? " at every random offset" : "");
        }
        return nb_fail(ctx, NB_ERR_INVALID, "samples = %lld, but there are only %lld documents (pack = 0); lower samples "
                       "or set wrap to reuse them", (long long)E, (long long)avail);
    }
    int64_t pool = E > avail ? E : avail;
    if (c.drop_last) {
        if (E < c.batch) {
            return nb_fail(ctx, NB_ERR_INVALID, "drop_last with %lld rows per epoch < batch %lld: every batch would be "
                           "dropped", (long long)E, (long long)c.batch);
        }
        E = E / c.batch * c.batch;
    }
    nb_dataloader *ld = nb_alloc(ctx, sizeof(*ld));
    if (!ld) return NB_ERR_NOMEM;
    if (c.shuffle) {
        ld->perm = nb_alloc(ctx, (size_t)pool * sizeof(int64_t));
        if (!ld->perm) { nb_dealloc(ctx, ld, sizeof(*ld)); return NB_ERR_NOMEM; }
    }
    nb_ctx_retain(ctx);
    nb_dataset_retain(ds);
    ds->frozen = 1;
    ld->ctx = ctx;
    ld->ds = ds;
    ld->cfg = c;
    ld->avail = avail;
    ld->per_epoch = E;
    ld->pool = pool;
    ld->pad = c.pad_id >= 0 ? c.pad_id : ds->eos >= 0 ? ds->eos : 0;
    uint64_t h = ds->hash;
    const uint64_t fields[] = { (uint64_t)N, (uint64_t)ds->n_docs, (uint64_t)S, (uint64_t)c.samples, c.seed,
                                (uint64_t)c.random_offset, (uint64_t)c.pack, (uint64_t)c.shuffle, (uint64_t)c.wrap,
                                (uint64_t)c.drop_last, (uint64_t)(uint32_t)ld->pad };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) h = fold(h, fields[i]);
    ld->fingerprint = h;
    ld->cache_epoch = -1;
    epoch_setup(ld, 0, &ld->cur_offset, &ld->cur_rng, NULL);
    *out = ld;
    return NB_OK;
}

void nb_dataloader_free(nb_dataloader *ld) {
    if (!ld) return;
    nb_ctx *ctx = ld->ctx;
    if (ld->perm) nb_dealloc(ctx, ld->perm, (size_t)ld->pool * sizeof(int64_t));
    nb_dataset *ds = ld->ds;
    nb_dataset_release(ds);
    nb_dealloc(ctx, ld, sizeof(*ld));
    nb_ctx_release(ctx);
}

/* ---- rows ---------------------------------------------------------------------------------------- */

static void fill_row(const nb_dataloader *ld, int64_t offset, int64_t slot, int32_t *tok, int32_t *tgt, uint8_t *mask) {
    const nb_dataset *ds = ld->ds;
    const int64_t S = ld->cfg.seq_len, N = ds->n;
    const int32_t *ids = ds->ids;
    const uint8_t *m = ds->mask;
    if (ld->cfg.pack) {
        int64_t start = offset + slot * S;
        if (start + S < N) {   /* the whole row lies inside the stream */
            if (tok) memcpy(tok, ids + start, (size_t)S * sizeof(int32_t));
            if (tgt) memcpy(tgt, ids + start + 1, (size_t)S * sizeof(int32_t));
            if (mask) memcpy(mask, m + start + 1, (size_t)S);
        } else {               /* wrap: positions modulo N */
            int64_t p = start % N;
            for (int64_t t = 0; t < S; t++) {
                int64_t q = p + 1 == N ? 0 : p + 1;
                if (tok) tok[t] = ids[p];
                if (tgt) tgt[t] = ids[q];
                if (mask) mask[t] = m[q];
                p = q;
            }
        }
        return;
    }
    int64_t d = slot % ds->n_docs;
    int64_t lo = d ? ds->doc_end[d - 1] : 0, len = ds->doc_end[d] - lo;
    for (int64_t t = 0; t < S; t++) {
        if (tok) tok[t] = t < len ? ids[lo + t] : ld->pad;
        if (tgt) tgt[t] = t + 1 < len ? ids[lo + t + 1] : ld->pad;
        if (mask) mask[t] = t + 1 < len ? m[lo + t + 1] : 0;
    }
}

nb_status nb_dataloader_read(nb_ctx *ctx, nb_dataloader *ld, int64_t epoch, int64_t row, int64_t n,
                             int32_t *tokens, int32_t *targets, uint8_t *mask) {
    if (!ld) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataloader_read: dataloader is NULL");
    if (epoch < 0 || row < 0 || n < 0 || row + n > ld->per_epoch) {
        return nb_fail(ctx, NB_ERR_INVALID, "rows [%lld, %lld) of epoch %lld are outside the epoch's %lld rows",
                       (long long)row, (long long)(row + n), (long long)epoch, (long long)ld->per_epoch);
    }
    if (ld->cache_epoch != epoch) {
        epoch_setup(ld, epoch, &ld->cache_offset, NULL, ld->perm);
        ld->cache_epoch = epoch;
    }
    const int64_t S = ld->cfg.seq_len;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = row + i, slot = ld->perm ? ld->perm[r] : r;
        fill_row(ld, ld->cache_offset, slot, tokens ? tokens + i * S : NULL, targets ? targets + i * S : NULL,
                 mask ? mask + i * S : NULL);
    }
    return NB_OK;
}

void nb_data_batch_release(nb_data_batch *b) {
    if (!b) return;
    nb_tensor_release(b->tokens);
    nb_tensor_release(b->targets);
    nb_tensor_release(b->mask);
    b->tokens = b->targets = b->mask = NULL;
    b->rows = 0;
}

nb_status nb_dataloader_next(nb_ctx *ctx, nb_dataloader *ld, nb_data_batch *out) {
    if (!ld || !out) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataloader_next: NULL argument");
    nb_data_batch_release(out);
    int64_t epoch = ld->epoch, row = ld->row;
    nb_rng rng = ld->cur_rng;
    int64_t offset = ld->cur_offset;
    if (row >= ld->per_epoch) {
        epoch++;
        row = 0;
        epoch_setup(ld, epoch, &offset, &rng, NULL);
    }
    int64_t n = ld->per_epoch - row < ld->cfg.batch ? ld->per_epoch - row : ld->cfg.batch;
    const int64_t shape[2] = { n, ld->cfg.seq_len };
    nb_status st = nb_tensor_new(ctx, NB_I32, 2, shape, &out->tokens);
    if (!st) st = nb_tensor_new(ctx, NB_I32, 2, shape, &out->targets);
    if (!st) st = nb_tensor_new(ctx, NB_U8, 2, shape, &out->mask);
    if (!st) st = nb_dataloader_read(ctx, ld, epoch, row, n, nb_tensor_data(out->tokens), nb_tensor_data(out->targets),
                                     nb_tensor_data(out->mask));
    if (st) {
        nb_data_batch_release(out);
        return st;
    }
    out->rows = n;
    out->epoch = epoch;
    out->row = row;
    out->epoch_end = row + n >= ld->per_epoch;
    ld->epoch = epoch;
    ld->row = row + n;
    ld->rows_read += n;
    ld->cur_rng = rng;
    ld->cur_offset = offset;
    return NB_OK;
}

/* ---- the cursor ---------------------------------------------------------------------------------- */

void nb_dataloader_state(const nb_dataloader *ld, nb_data_state *st) {
    memset(st, 0, sizeof(*st));
    if (!ld) return;
    st->epoch = ld->epoch;
    st->row = ld->row;
    st->rows_read = ld->rows_read;
    st->offset = ld->cur_offset;
    st->seed = ld->cfg.seed;
    memcpy(st->rng, ld->cur_rng.s, sizeof st->rng);
    st->fingerprint = ld->fingerprint;
}

nb_status nb_dataloader_restore(nb_ctx *ctx, nb_dataloader *ld, const nb_data_state *st) {
    if (!ld || !st) return nb_fail(ctx, NB_ERR_INVALID, "nb_dataloader_restore: NULL argument");
    if (st->fingerprint != ld->fingerprint || st->seed != ld->cfg.seed) {
        return nb_fail(ctx, NB_ERR_INVALID, "the saved data cursor belongs to another dataset or data configuration "
                       "(fingerprint %016llx, this dataloader %016llx): the data, tokenizer, seq_len, samples, seed "
                       "or flags changed", (unsigned long long)st->fingerprint, (unsigned long long)ld->fingerprint);
    }
    if (st->epoch < 0 || st->row < 0 || st->row > ld->per_epoch || st->rows_read < 0) {
        return nb_fail(ctx, NB_ERR_INVALID, "the saved data cursor (epoch %lld, row %lld) is outside the data's %lld "
                       "rows per epoch", (long long)st->epoch, (long long)st->row, (long long)ld->per_epoch);
    }
    int64_t offset;
    nb_rng rng;
    epoch_setup(ld, st->epoch, &offset, &rng, NULL);
    if (offset != st->offset || memcmp(rng.s, st->rng, sizeof st->rng) != 0) {
        return nb_fail(ctx, NB_ERR_INVALID, "the saved data cursor is inconsistent: its offset or RNG state does not "
                       "follow from seed %llu and epoch %lld", (unsigned long long)st->seed, (long long)st->epoch);
    }
    ld->epoch = st->epoch;
    ld->row = st->row;
    ld->rows_read = st->rows_read;
    ld->cur_offset = offset;
    ld->cur_rng = rng;
    return NB_OK;
}

int64_t nb_dataloader_rows_per_epoch(const nb_dataloader *ld) { return ld ? ld->per_epoch : 0; }
int64_t nb_dataloader_batches_per_epoch(const nb_dataloader *ld) {
    return ld ? (ld->per_epoch + ld->cfg.batch - 1) / ld->cfg.batch : 0;
}
int64_t nb_dataloader_offset(const nb_dataloader *ld, int64_t epoch) {
    if (!ld || !ld->cfg.pack || !ld->cfg.random_offset) return 0;
    return nb_data_offset(ld->cfg.seed, epoch, ld->cfg.seq_len);
}

/* Packing, offsets, epochs and the cursor of nb_dataloader on a hand-made token stream (no tokenizer):
 * exact rows and targets, the offset rule, same seed -> same rows, different seed -> different offset,
 * shuffle, wrap, unpacked rows, drop_last, save/restore, the held-out split, and the error cases. */
#include "nbtest.h"
#include "nibble/data.h"

/* The stream: s[k] = 100 + k for k in [0, 27), documents [0, 10), [10, 20), [20, 27), mask m[k] = (k % 3 != 0). */
enum { NTOK = 27 };
static int32_t S_IDS[NTOK];
static uint8_t S_MASK[NTOK];

static nb_dataset *make_ds(nb_ctx *ctx) {
    for (int k = 0; k < NTOK; k++) {
        S_IDS[k] = 100 + k;
        S_MASK[k] = (uint8_t)(k % 3 != 0);
    }
    nb_dataset *ds = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &ds));
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, ds, S_IDS, S_MASK, 10));
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, ds, S_IDS + 10, S_MASK + 10, 10));
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, ds, S_IDS + 20, S_MASK + 20, 7));
    return ds;
}

static nb_dataloader_cfg cfg_of(int64_t seq_len, int64_t batch, int64_t samples) {
    nb_dataloader_cfg c;
    nb_dataloader_cfg_init(&c);
    c.seq_len = seq_len;
    c.batch = batch;
    c.samples = samples;
    return c;
}

static int32_t ival(const nb_tensor *t, int64_t r, int64_t c) { return ((const int32_t *)nb_tensor_data(t))[r * t->shape[1] + c]; }
static uint8_t uval(const nb_tensor *t, int64_t r, int64_t c) { return ((const uint8_t *)nb_tensor_data(t))[r * t->shape[1] + c]; }

static void check_row(const nb_data_batch *b, int64_t r, const int32_t *tok, const int32_t *tgt, const uint8_t *mask, int S) {
    for (int t = 0; t < S; t++) {
        CHECK_EQ_INT(ival(b->tokens, r, t), tok[t]);
        CHECK_EQ_INT(ival(b->targets, r, t), tgt[t]);
        CHECK_EQ_INT(uval(b->mask, r, t), mask[t]);
    }
}

static void test_stream(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx);
    CHECK_EQ_INT(nb_dataset_n_tokens(ds), 27);
    CHECK_EQ_INT(nb_dataset_n_docs(ds), 3);
    CHECK_EQ_INT(nb_dataset_doc_start(ds, 1), 10);
    CHECK_EQ_INT(nb_dataset_doc_start(ds, 2), 20);
    CHECK_EQ_INT(nb_dataset_doc_start(ds, 3), 27);
    CHECK_EQ_INT(nb_dataset_n_masked(ds), 18);   /* 27 minus k = 0, 3, ..., 24 */
    CHECK_EQ_INT(nb_dataset_eos(ds), -1);
    nb_dataset_release(ds);
}

/* seq_len 4, offset 0: (27 - 1) / 4 = 6 rows; row i = s[4i .. 4i+4], targets one further. */
static void test_packing(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx);
    nb_dataloader_cfg c = cfg_of(4, 4, 0);
    nb_dataloader *ld = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    CHECK_EQ_INT(nb_dataloader_rows_per_epoch(ld), 6);
    CHECK_EQ_INT(nb_dataloader_batches_per_epoch(ld), 2);
    nb_data_batch b = { 0 };
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    CHECK_EQ_INT(b.rows, 4);
    CHECK_EQ_INT(b.tokens->shape[0], 4);
    CHECK_EQ_INT(b.tokens->shape[1], 4);
    CHECK_EQ_INT(b.tokens->dtype, NB_I32);
    CHECK_EQ_INT(b.mask->dtype, NB_U8);
    CHECK_EQ_INT(b.epoch, 0);
    CHECK_EQ_INT(b.row, 0);
    CHECK_EQ_INT(b.epoch_end, 0);
    check_row(&b, 0, (int32_t[]){ 100, 101, 102, 103 }, (int32_t[]){ 101, 102, 103, 104 }, (uint8_t[]){ 1, 1, 0, 1 }, 4);
    check_row(&b, 1, (int32_t[]){ 104, 105, 106, 107 }, (int32_t[]){ 105, 106, 107, 108 }, (uint8_t[]){ 1, 0, 1, 1 }, 4);
    check_row(&b, 3, (int32_t[]){ 112, 113, 114, 115 }, (int32_t[]){ 113, 114, 115, 116 }, (uint8_t[]){ 1, 1, 0, 1 }, 4);
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    CHECK_EQ_INT(b.rows, 2);           /* the epoch's short last batch */
    CHECK_EQ_INT(b.tokens->shape[0], 2);
    CHECK_EQ_INT(b.row, 4);
    CHECK_EQ_INT(b.epoch_end, 1);
    check_row(&b, 1, (int32_t[]){ 120, 121, 122, 123 }, (int32_t[]){ 121, 122, 123, 124 }, (uint8_t[]){ 0, 1, 1, 0 }, 4);
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));   /* epoch 1 starts over (no random offset) */
    CHECK_EQ_INT(b.epoch, 1);
    CHECK_EQ_INT(b.row, 0);
    check_row(&b, 0, (int32_t[]){ 100, 101, 102, 103 }, (int32_t[]){ 101, 102, 103, 104 }, (uint8_t[]){ 1, 1, 0, 1 }, 4);
    nb_data_state st;
    nb_dataloader_state(ld, &st);
    CHECK_EQ_INT(st.epoch, 1);
    CHECK_EQ_INT(st.row, 4);
    CHECK_EQ_INT(st.rows_read, 10);
    CHECK_EQ_INT(st.offset, 0);

    /* random access; rows beyond the epoch are refused */
    int32_t tok[8], tgt[8];
    uint8_t m[8];
    CHECK_OK(ctx, nb_dataloader_read(ctx, ld, 0, 5, 1, tok, tgt, m));
    CHECK_EQ_INT(tok[0], 120);
    CHECK_EQ_INT(tgt[3], 124);
    CHECK_OK(ctx, nb_dataloader_read(ctx, ld, 3, 2, 2, tok, NULL, NULL));
    CHECK_EQ_INT(tok[0], 108);
    CHECK_EQ_INT(tok[7], 115);
    CHECK_FAIL(ctx, nb_dataloader_read(ctx, ld, 0, 5, 2, tok, tgt, m), NB_ERR_INVALID, "outside the epoch's 6 rows");
    /* the dataset is frozen now */
    CHECK_FAIL(ctx, nb_dataset_add_tokens(ctx, ds, S_IDS, NULL, 3), NB_ERR_INVALID, "in use by a dataloader");
    nb_data_batch_release(&b);
    CHECK(b.tokens == NULL);
    nb_dataloader_free(ld);
    nb_dataset_release(ds);
}

/* The offset rule: the first draw of nb_rng seeded with the seed, uniform below seq_len by rejection. */
static int64_t ref_offset(uint64_t seed, int64_t n) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    uint64_t t = (0 - (uint64_t)n) % (uint64_t)n, x;
    do x = nb_rng_next(&r); while (x < t);
    return (int64_t)(x % (uint64_t)n);
}

static void test_offsets(nb_ctx *ctx) {
    for (uint64_t seed = 0; seed < 50; seed++) {
        CHECK_EQ_INT(nb_data_offset(seed, 0, 4), ref_offset(seed, 4));
        CHECK_EQ_INT(nb_data_offset(seed, 0, 1000), ref_offset(seed, 1000));
        CHECK_EQ_INT(nb_data_offset(seed, 0, 2048), ref_offset(seed, 2048));
    }
    /* a different seed gives a different offset (these two, checked once), and later epochs move */
    CHECK_EQ_INT(nb_data_offset(1, 0, 2048), ref_offset(1, 2048));
    CHECK(nb_data_offset(1, 0, 2048) != nb_data_offset(2, 0, 2048));
    CHECK(nb_data_offset(1, 0, 2048) != nb_data_offset(1, 1, 2048));
    CHECK_EQ_INT(nb_data_offset(1, 3, 2048), nb_data_offset(1, 3, 2048));
    /* every value in [0, 7) occurs over 700 seeds, none outside */
    int seen[7] = { 0 };
    for (uint64_t seed = 0; seed < 700; seed++) {
        int64_t o = nb_data_offset(seed, 0, 7);
        CHECK(o >= 0 && o < 7);
        if (o >= 0 && o < 7) seen[o]++;
    }
    for (int i = 0; i < 7; i++) CHECK_MSG(seen[i] > 60, "offset %d seen %d times of 700", i, seen[i]);

    /* a loader's rows start at the offset: (27 - 4) / 4 = 5 rows at any offset */
    nb_dataset *ds = make_ds(ctx);
    for (uint64_t seed = 0; seed < 8; seed++) {
        nb_dataloader_cfg c = cfg_of(4, 5, 0);
        c.random_offset = 1;
        c.seed = seed;
        nb_dataloader *ld = NULL;
        CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
        CHECK_EQ_INT(nb_dataloader_rows_per_epoch(ld), 5);
        int64_t off = ref_offset(seed, 4);
        CHECK_EQ_INT(nb_dataloader_offset(ld, 0), off);
        nb_data_batch b = { 0 };
        CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
        for (int r = 0; r < 5; r++) {
            for (int t = 0; t < 4; t++) {
                int64_t p = off + 4 * r + t;
                CHECK_EQ_INT(ival(b.tokens, r, t), 100 + p);
                CHECK_EQ_INT(ival(b.targets, r, t), 101 + p);
                CHECK_EQ_INT(uval(b.mask, r, t), (p + 1) % 3 != 0);
            }
        }
        nb_data_state st;
        nb_dataloader_state(ld, &st);
        CHECK_EQ_INT(st.offset, off);
        CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));   /* epoch 1: its own offset */
        CHECK_EQ_INT(b.epoch, 1);
        CHECK_EQ_INT(ival(b.tokens, 0, 0), 100 + nb_data_offset(seed, 1, 4));
        nb_data_batch_release(&b);
        nb_dataloader_free(ld);
    }
    nb_dataset_release(ds);
}

/* Rows of `epochs` epochs of a loader, as the tokens of each row's first position and its whole content. */
static void collect(nb_ctx *ctx, nb_dataloader *ld, int nbatches, int32_t *out, int64_t *n_out) {
    nb_data_batch b = { 0 };
    int64_t k = 0;
    for (int i = 0; i < nbatches; i++) {
        CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
        int64_t cnt = nb_tensor_numel(b.tokens);
        memcpy(out + k, nb_tensor_data(b.tokens), (size_t)cnt * sizeof(int32_t));
        k += cnt;
        memcpy(out + k, nb_tensor_data(b.targets), (size_t)cnt * sizeof(int32_t));
        k += cnt;
        for (int64_t j = 0; j < cnt; j++) out[k + j] = ((uint8_t *)nb_tensor_data(b.mask))[j];
        k += cnt;
        out[k++] = (int32_t)(b.epoch * 1000 + b.row);
    }
    nb_data_batch_release(&b);
    *n_out = k;
}

static void test_same_seed(nb_ctx *ctx) {
    static int32_t a[4096], b2[4096], c2[4096];
    int64_t na, nb, nc;
    nb_dataset *d1 = make_ds(ctx), *d2 = make_ds(ctx);
    CHECK_EQ_INT(nb_dataset_fingerprint(d1), nb_dataset_fingerprint(d2));
    nb_dataloader_cfg c = cfg_of(3, 2, 0);
    c.random_offset = 1;
    c.shuffle = 1;
    c.seed = 1234;
    nb_dataloader *l1 = NULL, *l2 = NULL, *l3 = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, d1, &c, &l1));
    CHECK_OK(ctx, nb_dataloader_new(ctx, d2, &c, &l2));
    c.seed = 1235;
    CHECK_OK(ctx, nb_dataloader_new(ctx, d2, &c, &l3));
    collect(ctx, l1, 20, a, &na);
    collect(ctx, l2, 20, b2, &nb);
    collect(ctx, l3, 20, c2, &nc);
    CHECK_EQ_INT(na, nb);
    CHECK(memcmp(a, b2, (size_t)na * sizeof(int32_t)) == 0);
    CHECK(na != nc || memcmp(a, c2, (size_t)na * sizeof(int32_t)) != 0);

    /* with shuffle an epoch is a permutation of the rows at its offset: (27 - 3) / 3 = 8 rows */
    CHECK_EQ_INT(nb_dataloader_rows_per_epoch(l1), 8);
    int32_t tok[8 * 3];
    for (int64_t e = 0; e < 3; e++) {
        CHECK_OK(ctx, nb_dataloader_read(ctx, l1, e, 0, 8, tok, NULL, NULL));
        int64_t off = nb_dataloader_offset(l1, e);
        int hit[8] = { 0 };
        for (int r = 0; r < 8; r++) {
            int64_t start = tok[r * 3] - 100 - off;
            CHECK(start % 3 == 0 && start / 3 >= 0 && start / 3 < 8);
            if (start % 3 == 0 && start / 3 >= 0 && start / 3 < 8) hit[start / 3]++;
        }
        for (int r = 0; r < 8; r++) CHECK_EQ_INT(hit[r], 1);
    }
    nb_dataloader_free(l1);
    nb_dataloader_free(l2);
    nb_dataloader_free(l3);
    nb_dataset_release(d1);
    nb_dataset_release(d2);
}

static void test_restore(nb_ctx *ctx) {
    static int32_t a[8192], b2[8192];
    int64_t na, nb;
    nb_dataset *ds = make_ds(ctx);
    nb_dataloader_cfg c = cfg_of(3, 3, 7);
    c.random_offset = 1;
    c.shuffle = 1;
    c.seed = 77;
    nb_dataloader *l1 = NULL, *l2 = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &l1));
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &l2));
    CHECK_EQ_INT(nb_dataloader_batches_per_epoch(l1), 3);   /* 3 + 3 + 1 */
    collect(ctx, l1, 4, a, &na);   /* one epoch and one batch */
    nb_data_state st;
    nb_dataloader_state(l1, &st);
    CHECK_EQ_INT(st.epoch, 1);
    CHECK_EQ_INT(st.row, 3);
    CHECK_EQ_INT(st.rows_read, 10);
    collect(ctx, l1, 9, a, &na);   /* what an uninterrupted run reads next, across two epoch ends */
    CHECK_OK(ctx, nb_dataloader_restore(ctx, l2, &st));
    collect(ctx, l2, 9, b2, &nb);
    CHECK_EQ_INT(na, nb);
    CHECK(memcmp(a, b2, (size_t)na * sizeof(int32_t)) == 0);
    nb_data_state s1, s2;
    nb_dataloader_state(l1, &s1);
    nb_dataloader_state(l2, &s2);
    CHECK(memcmp(&s1, &s2, sizeof s1) == 0);

    /* a state from another configuration, or tampered with, is refused */
    nb_dataloader_cfg c2 = c;
    c2.seed = 78;
    nb_dataloader *l3 = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c2, &l3));
    CHECK_FAIL(ctx, nb_dataloader_restore(ctx, l3, &st), NB_ERR_INVALID, "belongs to another dataset or data configuration");
    nb_dataloader_free(l3);
    c2 = c;
    c2.seq_len = 2;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c2, &l3));
    CHECK_FAIL(ctx, nb_dataloader_restore(ctx, l3, &st), NB_ERR_INVALID, "another dataset");
    nb_dataloader_free(l3);
    c2 = c;
    c2.batch = 2;   /* the batch size is not part of the cursor: rows continue */
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c2, &l3));
    CHECK_OK(ctx, nb_dataloader_restore(ctx, l3, &st));
    nb_dataloader_free(l3);
    nb_data_state bad = st;
    bad.rng[2] ^= 1;
    CHECK_FAIL(ctx, nb_dataloader_restore(ctx, l2, &bad), NB_ERR_INVALID, "inconsistent");
    bad = st;
    bad.offset = (st.offset + 1) % 3;
    CHECK_FAIL(ctx, nb_dataloader_restore(ctx, l2, &bad), NB_ERR_INVALID, "inconsistent");
    bad = st;
    bad.row = 8;
    CHECK_FAIL(ctx, nb_dataloader_restore(ctx, l2, &bad), NB_ERR_INVALID, "outside the data's 7 rows per epoch");
    nb_dataloader_free(l1);
    nb_dataloader_free(l2);

    /* another dataset (one token changed) with the same configuration */
    nb_dataset *d2 = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &d2));
    int32_t ids[NTOK];
    memcpy(ids, S_IDS, sizeof ids);
    ids[13] = 7;
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, d2, ids, S_MASK, 10));
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, d2, ids + 10, S_MASK + 10, 10));
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, d2, ids + 20, S_MASK + 20, 7));
    CHECK(nb_dataset_fingerprint(d2) != nb_dataset_fingerprint(ds));
    CHECK_OK(ctx, nb_dataloader_new(ctx, d2, &c, &l3));
    CHECK_FAIL(ctx, nb_dataloader_restore(ctx, l3, &st), NB_ERR_INVALID, "another dataset");
    nb_dataloader_free(l3);
    nb_dataset_release(d2);
    nb_dataset_release(ds);
}

/* wrap: samples beyond the stream read it as a cycle; without wrap that is an error */
static void test_wrap(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx);
    nb_dataloader_cfg c = cfg_of(4, 10, 10);
    nb_dataloader *ld = NULL;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID,
               "samples = 10, but 27 tokens give only 6 rows of seq_len 4; lower samples or set wrap");
    c.random_offset = 1;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "give only 5 rows of seq_len 4 at every random offset");
    c.random_offset = 0;
    c.wrap = 1;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    nb_data_batch b = { 0 };
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    CHECK_EQ_INT(b.rows, 10);
    check_row(&b, 5, (int32_t[]){ 120, 121, 122, 123 }, (int32_t[]){ 121, 122, 123, 124 }, (uint8_t[]){ 0, 1, 1, 0 }, 4);
    check_row(&b, 6, (int32_t[]){ 124, 125, 126, 100 }, (int32_t[]){ 125, 126, 100, 101 }, (uint8_t[]){ 1, 1, 0, 1 }, 4);
    check_row(&b, 7, (int32_t[]){ 101, 102, 103, 104 }, (int32_t[]){ 102, 103, 104, 105 }, (uint8_t[]){ 1, 0, 1, 1 }, 4);
    check_row(&b, 9, (int32_t[]){ 109, 110, 111, 112 }, (int32_t[]){ 110, 111, 112, 113 }, (uint8_t[]){ 1, 1, 0, 1 }, 4);
    nb_data_batch_release(&b);
    nb_dataloader_free(ld);
    nb_dataset_release(ds);
}

/* pack = 0: one document per row, cut to seq_len + 1, padded with mask 0 */
static void test_unpacked(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx);
    nb_dataloader_cfg c = cfg_of(8, 3, 0);
    c.pack = 0;
    c.random_offset = 1;   /* ignored without packing */
    nb_dataloader *ld = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    CHECK_EQ_INT(nb_dataloader_rows_per_epoch(ld), 3);
    CHECK_EQ_INT(nb_dataloader_offset(ld, 0), 0);
    nb_data_batch b = { 0 };
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    check_row(&b, 0, (int32_t[]){ 100, 101, 102, 103, 104, 105, 106, 107 },
              (int32_t[]){ 101, 102, 103, 104, 105, 106, 107, 108 }, (uint8_t[]){ 1, 1, 0, 1, 1, 0, 1, 1 }, 8);
    check_row(&b, 2, (int32_t[]){ 120, 121, 122, 123, 124, 125, 126, 0 }, (int32_t[]){ 121, 122, 123, 124, 125, 126, 0, 0 },
              (uint8_t[]){ 0, 1, 1, 0, 1, 1, 0, 0 }, 8);
    nb_data_batch_release(&b);
    nb_dataloader_free(ld);
    c.pad_id = 5;
    c.samples = 4;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "only 3 documents (pack = 0)");
    c.wrap = 1;
    c.batch = 4;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    CHECK_EQ_INT(ival(b.tokens, 2, 7), 5);
    CHECK_EQ_INT(ival(b.targets, 2, 6), 5);
    CHECK_EQ_INT(ival(b.tokens, 3, 0), 100);   /* the fourth row is document 0 again */
    nb_data_batch_release(&b);
    nb_dataloader_free(ld);
    nb_dataset_release(ds);
}

static void test_drop_last(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx);
    nb_dataloader_cfg c = cfg_of(4, 4, 0);
    c.drop_last = 1;
    nb_dataloader *ld = NULL;
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    CHECK_EQ_INT(nb_dataloader_rows_per_epoch(ld), 4);
    CHECK_EQ_INT(nb_dataloader_batches_per_epoch(ld), 1);
    nb_data_batch b = { 0 };
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    CHECK_EQ_INT(b.epoch_end, 1);
    CHECK_OK(ctx, nb_dataloader_next(ctx, ld, &b));
    CHECK_EQ_INT(b.epoch, 1);
    CHECK_EQ_INT(b.rows, 4);
    CHECK_EQ_INT(ival(b.tokens, 0, 0), 100);
    nb_data_batch_release(&b);
    nb_dataloader_free(ld);
    c.batch = 7;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "drop_last with 6 rows per epoch < batch 7");
    nb_dataset_release(ds);
}

static void test_split(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx), *tr = NULL, *ev = NULL;
    CHECK_OK(ctx, nb_dataset_split(ctx, ds, 0.3, &tr, &ev));   /* 0.7 * 27 = 18.9: the boundary at 20 */
    CHECK_EQ_INT(nb_dataset_n_docs(tr), 2);
    CHECK_EQ_INT(nb_dataset_n_tokens(tr), 20);
    CHECK_EQ_INT(nb_dataset_n_docs(ev), 1);
    CHECK_EQ_INT(nb_dataset_n_tokens(ev), 7);
    CHECK_EQ_INT(nb_dataset_ids(ev)[0], 120);
    CHECK_EQ_INT(nb_dataset_mask(ev)[0], 1);
    CHECK_EQ_INT(nb_dataset_mask(ev)[1], 0);
    CHECK_EQ_INT(nb_dataset_n_masked(tr) + nb_dataset_n_masked(ev), nb_dataset_n_masked(ds));
    nb_dataset_release(tr);
    nb_dataset_release(ev);
    CHECK_OK(ctx, nb_dataset_split(ctx, ds, 0.9, &tr, &ev));   /* at least one document stays for training */
    CHECK_EQ_INT(nb_dataset_n_docs(tr), 1);
    CHECK_EQ_INT(nb_dataset_n_docs(ev), 2);
    nb_dataset_release(tr);
    nb_dataset_release(ev);
    CHECK_FAIL(ctx, nb_dataset_split(ctx, ds, 0.0, &tr, &ev), NB_ERR_INVALID, "eval fraction must be in (0, 1)");
    CHECK_FAIL(ctx, nb_dataset_split(ctx, ds, 1.0, &tr, &ev), NB_ERR_INVALID, "eval fraction must be in (0, 1)");
    nb_dataset *one = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &one));
    CHECK_OK(ctx, nb_dataset_add_tokens(ctx, one, S_IDS, NULL, 5));
    CHECK_EQ_INT(nb_dataset_n_masked(one), 5);
    CHECK_FAIL(ctx, nb_dataset_split(ctx, one, 0.5, &tr, &ev), NB_ERR_INVALID, "need at least 2");
    nb_dataset_release(one);
    nb_dataset_release(ds);
}

static void test_errors(nb_ctx *ctx) {
    nb_dataset *ds = make_ds(ctx);
    nb_dataloader *ld = NULL;
    nb_dataloader_cfg c = cfg_of(0, 1, 0);
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "seq_len must be > 0, got 0");
    c.seq_len = -3;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "seq_len must be > 0, got -3");
    c = cfg_of(4, 0, 0);
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "batch must be > 0, got 0");
    c = cfg_of(4, 1, -1);
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "samples must be >= 0");
    c = cfg_of(4, 1, 0);
    c.shuffle = 2;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "must be 0 or 1");
    c = cfg_of(27, 1, 0);   /* 27 tokens: one row needs 28 */
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID,
               "the data has 27 tokens: too few for one row of seq_len + 1 = 28 tokens");
    c = cfg_of(26, 1, 0);
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    CHECK_EQ_INT(nb_dataloader_rows_per_epoch(ld), 1);
    nb_dataloader_free(ld);
    c.random_offset = 1;   /* 27 - 26 = 1 spare token is not enough for every offset in [0, 26) */
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "after a random offset of up to seq_len - 1");
    c = cfg_of(14, 1, 0);   /* offset 13 + 15 tokens > 27 */
    c.random_offset = 1;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, ds, &c, &ld), NB_ERR_INVALID, "too few for one row of seq_len + 1 = 15");
    c.seq_len = 13;         /* offset 12 + 14 tokens = 26 <= 27 */
    CHECK_OK(ctx, nb_dataloader_new(ctx, ds, &c, &ld));
    CHECK_EQ_INT(nb_dataloader_rows_per_epoch(ld), 1);
    nb_dataloader_free(ld);
    nb_dataset *empty = NULL;
    CHECK_OK(ctx, nb_dataset_new(ctx, &empty));
    c = cfg_of(4, 1, 0);
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, empty, &c, &ld), NB_ERR_INVALID, "the data has 0 tokens");
    c.pack = 0;
    CHECK_FAIL(ctx, nb_dataloader_new(ctx, empty, &c, &ld), NB_ERR_INVALID, "no documents");
    int32_t neg[2] = { 3, -1 };
    CHECK_FAIL(ctx, nb_dataset_add_tokens(ctx, empty, neg, NULL, 2), NB_ERR_INVALID, "id -1 at 1 is negative");
    CHECK_EQ_INT(nb_dataset_n_tokens(empty), 0);
    nb_dataset_release(empty);
    nb_dataset_release(ds);
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_new(2, &ctx) != NB_OK) return 1;
    nb_mem_stats m0;
    nb_ctx_mem(ctx, &m0);
    test_stream(ctx);
    test_packing(ctx);
    test_offsets(ctx);
    test_same_seed(ctx);
    test_restore(ctx);
    test_wrap(ctx);
    test_unpacked(ctx);
    test_drop_last(ctx);
    test_split(ctx);
    test_errors(ctx);
    nb_mem_stats m;
    nb_ctx_mem(ctx, &m);
    CHECK_EQ_INT(m.live_bytes, m0.live_bytes);   /* every dataset, loader and batch was released */
    nb_ctx_release(ctx);
    return nbt_done("test_data");
}

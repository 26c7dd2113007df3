/* Internal layout of nb_dataset, shared by the dataset builder (dataset.c, records.c) and the
 * dataloader (loader.c): one token stream, its mask, document boundaries, a running fingerprint. */
#ifndef NIBBLE_DATA_INTERNAL_H
#define NIBBLE_DATA_INTERNAL_H

#include <stdint.h>
#include "nibble/data.h"

struct nb_dataset {
    nb_ctx *ctx;             /* retained: the arrays are counted in its memory stats */
    int32_t refcount;
    int32_t frozen;          /* a dataloader uses it: no more documents */
    int32_t eos;             /* EOS of the tokenizer last used, -1 if none */
    int32_t *ids;
    uint8_t *mask;
    int64_t n, cap;
    int64_t *doc_end;        /* document i is [doc_end[i-1], doc_end[i]) (doc_end[-1] = 0) */
    int64_t n_docs, doc_cap;
    int64_t n_masked;
    uint64_t hash;           /* running hash of ids, masks and document lengths, in order */
};

/* splitmix64's finalizer: a strong 64-bit mix. */
static inline uint64_t nb_data_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Append one document (ids and a mask, both n long) to the dataset; no checks on frozen. */
nb_status nb_data_append_doc(nb_ctx *ctx, nb_dataset *ds, const int32_t *ids, const uint8_t *mask, int64_t n);

#endif

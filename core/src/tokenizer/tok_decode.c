/* Token ids back to text: the decoded bytes tok_finish stored for each token, laid end to end, less
 * the leading space the normalizer put in. */
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- decoding ------------------------------------------------------------------------------ */

nb_status nb_tokenizer_decode(nb_ctx *ctx, const nb_tokenizer *t, const int32_t *ids, int64_t n, uint32_t flags,
                              char *out, int64_t cap, int64_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || n < 0 || (!ids && n > 0) || cap < 0 || (!out && cap > 0))
        return nb_fail(ctx, NB_ERR_INVALID, "nb_tokenizer_decode: bad arguments");
    int64_t total = 0;
    int at_start = 1;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab)
            return nb_fail(ctx, NB_ERR_INVALID, "token id %d at position %lld is outside the vocabulary [0, %d)", id,
                           (long long)i, t->n_vocab);
        const tok_entry *e = &t->ent[id];
        if ((flags & NB_TOK_SKIP_SPECIAL) && tok_is_special_type(e->type)) continue;
        const char *b = t->arena + e->bytes_off;
        int64_t bl = e->bytes_len;
        /* the decoder's Strip / Metaspace step: the space the normalizer put first goes away */
        if (at_start && bl > 0) {
            at_start = 0;
            if (t->decode_strip_space && b[0] == ' ') {
                b++;
                bl--;
            }
        }
        if (out && total < cap) {
            int64_t k = cap - total < bl ? cap - total : bl;
            memcpy(out + total, b, (size_t)k);
        }
        total += bl;
    }
    if (n_out) *n_out = total;
    if (out && total < cap) out[total] = 0;
    if (total > cap && (out || cap > 0))
        return nb_fail(ctx, NB_ERR_SHAPE, "the decoded text is %lld bytes but the buffer holds %lld", (long long)total,
                       (long long)cap);
    return NB_OK;
}

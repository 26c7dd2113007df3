/* Running a tokenizer the fuzz targets built: encode a fixed text that has spaces, digits, a
 * special-token spelling, the SentencePiece space, UTF-8 and an invalid byte, decode the ids back,
 * and read every token's text (the accessors index the tables the loader filled). */
#ifndef NIBBLE_FUZZ_TOK_COMMON_H
#define NIBBLE_FUZZ_TOK_COMMON_H

#include "fuzz.h"

static inline void fz_tokenize(nb_ctx *ctx, const nb_tokenizer *tok) {
    static const char text[] = "Hello world, 12 ab\n<s> </s><|endoftext|> \xe2\x96\x81x  \xc3\xa9\xff";
    nb_tokens ids = {0};
    if (nb_tokenizer_encode(ctx, tok, text, (int64_t)sizeof text - 1, NB_TOK_ADD_SPECIAL | NB_TOK_PARSE_SPECIAL, &ids) ==
        NB_OK) {
        char out[4096];
        int64_t n = 0;
        (void)nb_tokenizer_decode(ctx, tok, ids.ids, ids.n, 0, out, sizeof out, &n);
        (void)nb_tokenizer_decode(ctx, tok, ids.ids, ids.n, NB_TOK_SKIP_SPECIAL, out, sizeof out, &n);
    }
    nb_tokens_free(&ids);
    for (int32_t i = 0; i < nb_tokenizer_vocab_size(tok) && i < 4096; i++) {
        uint32_t len = 0;
        (void)nb_tokenizer_token_text(tok, i, &len);
        (void)nb_tokenizer_token_bytes(tok, i, &len);
        (void)nb_tokenizer_token_type(tok, i);
    }
}

/* The body of a tokenizer file target: write the input as `name`, load it with `load`, run it. */
static inline int fz_tokenizer_file(const uint8_t *data, size_t size, const char *name,
                                    nb_status (*load)(nb_ctx *, const char *, nb_tokenizer **)) {
    nb_ctx *ctx = fz_ctx();
    nb_tokenizer *tok = NULL;
    if (load(ctx, fz_write(name, data, size), &tok) != NB_OK) return 0;
    fz_tokenize(ctx, tok);
    nb_tokenizer_free(tok);
    return 0;
}

#endif

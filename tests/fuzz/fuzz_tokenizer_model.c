/* libFuzzer target: a SentencePiece tokenizer.model (the protobuf: pieces, trainer and normalizer
 * specs), built and then run. */
#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    const char *path = fz_write("tokenizer.model", data, size);
    nb_tokenizer *tok = NULL;
    if (nb_tokenizer_from_spm(ctx, path, &tok) != NB_OK) return 0;
    fz_tokenize(ctx, tok);
    nb_tokenizer_free(tok);
    return 0;
}

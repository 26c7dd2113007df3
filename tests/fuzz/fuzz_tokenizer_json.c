/* libFuzzer target: a Hugging Face tokenizer.json (vocab, merges, added tokens, normalizers,
 * pre-tokenizer regexes, decoders, post-processor), alone in its folder, built and then run. */
#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    fz_mkdir("tokjson");
    const char *path = fz_write("tokjson/tokenizer.json", data, size);
    nb_tokenizer *tok = NULL;
    if (nb_tokenizer_from_json(ctx, path, &tok) != NB_OK) return 0;
    fz_tokenize(ctx, tok);
    nb_tokenizer_free(tok);
    return 0;
}

/* libFuzzer target: a Hugging Face tokenizer.json (vocab, merges, added tokens, normalizers,
 * pre-tokenizer regexes, decoders, post-processor), alone in its folder, built and then run. */
#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_mkdir("tokjson");
    return fz_tokenizer_file(data, size, "tokjson/tokenizer.json", nb_tokenizer_from_json);
}

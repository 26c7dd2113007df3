/* libFuzzer target: a SentencePiece tokenizer.model (the protobuf: pieces, trainer and normalizer
 * specs), built and then run. */
#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_tokenizer_file(data, size, "tokenizer.model", nb_tokenizer_from_spm);
}

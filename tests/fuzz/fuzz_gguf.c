/* libFuzzer target: one GGUF file, three ways: the metadata and tensor tables read through every
 * accessor with every tensor fetched (quantized types dequantized), the embedded tokenizer built
 * and run, and the file loaded as a model (config from metadata, weights dequantized and permuted). */
#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    const char *path = fz_write("model.gguf", data, size);
    nb_gguf *g = NULL;
    if (nb_gguf_open(ctx, path, &g) != NB_OK) return 0;
    for (int64_t i = 0; i < nb_gguf_kv_count(g); i++) {
        uint64_t len = 0;
        (void)nb_gguf_kv_key(g, i);
        switch (nb_gguf_kv_type(g, i)) {
        case NB_GGUF_STRING: (void)nb_gguf_kv_str(g, i, &len); break;
        case NB_GGUF_FLOAT32: case NB_GGUF_FLOAT64: (void)nb_gguf_kv_float(g, i); break;
        case NB_GGUF_ARRAY:
            for (int64_t j = 0; j < nb_gguf_arr_count(g, i) && j < 64; j++)
                if (nb_gguf_arr_type(g, i) == NB_GGUF_STRING) (void)nb_gguf_arr_str(g, i, j, &len);
            (void)nb_gguf_arr_data(g, i);
            break;
        default: (void)nb_gguf_kv_int(g, i); break;
        }
    }
    for (int64_t i = 0; i < nb_gguf_tensor_count(g); i++) {
        nb_tensor *t = NULL;
        if (nb_gguf_get(ctx, g, nb_gguf_tensor_at(g, i)->name, &t) == NB_OK) nb_tensor_release(t);
    }
    nb_tokenizer *tok = NULL;
    if (nb_tokenizer_from_gguf(ctx, g, &tok) == NB_OK) {
        fz_tokenize(ctx, tok);
        nb_tokenizer_free(tok);
    }
    nb_gguf_close(g);
    nb_model *m = NULL;
    if (nb_model_load(ctx, path, &m) == NB_OK) nb_model_free(m);
    return 0;
}

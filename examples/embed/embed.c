/* Embedding libnibble in a C program: load a Hugging Face model, quantize its linear weights to NVFP4
 * (weight only, max calibration), and measure what the quantization costs on a text: perplexity of
 * the original and of the quantized model, the KL divergence between them and their top-1 agreement
 * (llama.cpp's llama-perplexity method). Only the public API of <nibble/nibble.h> is used.
 *
 *   cc embed.c $(pkg-config --cflags --libs nibble) -o embed
 *   ./embed MODEL_DIR TEXT_FILE [CTX [CHUNKS]]
 *
 * e.g. ./embed ../shared/data/stories260K/hf ../shared/data/text/tinystories_valid_head_776KiB.txt 256 4
 * The quantized model is evaluated with fake quant, so its numbers equal those of its export read
 * back (`nibble quantize --format nvfp4_w4a16` then `nibble eval --teacher`). */
#include <stdio.h>
#include <stdlib.h>

#include <nibble/nibble.h>

static int fail(nb_ctx *ctx, const char *what) {
    fprintf(stderr, "embed: %s: %s\n", what, nb_ctx_last_error(ctx));
    return 1;
}

static char *read_all(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)*len + 1)) && fread(buf, 1, (size_t)*len, f) != (size_t)*len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE [CTX [CHUNKS]]\n", argv[0]);
        return 2;
    }
    long n_ctx = argc > 3 ? atol(argv[3]) : 512, n_chunks = argc > 4 ? atol(argv[4]) : 0;
    long len = 0;
    char *text = read_all(argv[2], &len);
    if (!text) {
        fprintf(stderr, "embed: cannot read %s\n", argv[2]);
        return 1;
    }

    nb_ctx *ctx = NULL;
    nb_model *teacher = NULL, *student = NULL;
    nb_tokenizer *tok = NULL;
    nb_qmodel *qm = NULL;
    nb_tokens ids = {0};
    int rc = 1;
    if (nb_ctx_new(0, &ctx)) {
        fprintf(stderr, "embed: cannot create a nibble context\n");
        free(text);
        return 1;
    }
    /* The teacher stays in full precision; the student is a second copy whose weights are quantized. */
    if (nb_model_load(ctx, argv[1], &teacher) || nb_model_load(ctx, argv[1], &student)) {
        rc = fail(ctx, "load");
        goto done;
    }
    if (nb_tokenizer_load(ctx, argv[1], &tok) ||
        nb_tokenizer_encode(ctx, tok, text, len, NB_TOK_ADD_SPECIAL, &ids)) {
        rc = fail(ctx, "tokenize");
        goto done;
    }
    printf("model: %s, %lld parameters tensors, %lld tokens of text\n", nb_model_arch_name(student),
           (long long)nb_model_param_count(student), (long long)ids.n);

    /* NVFP4 weights on every linear module whose input width is a multiple of the 16-element block;
     * the others stay in full precision, with the library's own reason. */
    if (nb_qmodel_new(ctx, student, &qm)) {
        rc = fail(ctx, "qmodel");
        goto done;
    }
    nb_qspec spec;
    nb_qspec_init(&spec);
    spec.weight_format = NB_FMT_NVFP4;
    int64_t n_quant = 0, n_skip = 0;
    for (int64_t i = 0; i < nb_qmodel_count(qm); i++) {
        const char *name = nb_qmodel_name(qm, i);
        if (nb_qmodel_set(ctx, qm, name, &spec) == NB_OK) {
            n_quant++;
        } else {
            if (n_skip++ == 0) printf("kept in full precision: %s (%s)\n", name, nb_ctx_last_error(ctx));
            nb_ctx_clear_error(ctx);
        }
    }
    nb_calib_config cal;
    nb_calib_config_init(&cal, NB_CALIB_MAX);
    if (nb_qmodel_fuse_siblings(ctx, qm, NULL) || nb_qmodel_calibrate_weights(ctx, qm, &cal) ||
        nb_qmodel_set_fake(ctx, qm, 1)) {
        rc = fail(ctx, "quantize");
        goto done;
    }
    printf("quantized %lld linear modules to nvfp4 (weights), %lld kept\n", (long long)n_quant, (long long)n_skip);

    nb_eval_opts eo = {0};
    eo.n_ctx = n_ctx;
    eo.n_chunks = n_chunks;
    eo.bos = -1;
    nb_eval_result base, quant;
    if (nb_model_eval(ctx, teacher, NULL, ids.ids, ids.n, &eo, &base) ||
        nb_model_eval(ctx, student, teacher, ids.ids, ids.n, &eo, &quant)) {
        rc = fail(ctx, "eval");
        goto done;
    }
    printf("scored %lld tokens in %lld chunks of %ld\n", (long long)quant.tokens, (long long)quant.chunks, n_ctx);
    printf("PPL original = %.4f\n", base.ppl);
    printf("PPL nvfp4    = %.4f\n", quant.ppl);
    printf("KLD(original || nvfp4) = %.6f   top-1 agreement = %.3f%%\n", quant.kld_mean, quant.top1_agree);
    rc = 0;

done:
    nb_qmodel_free(qm);
    nb_tokens_free(&ids);
    nb_tokenizer_free(tok);
    nb_model_free(student);
    nb_model_free(teacher);
    nb_ctx_release(ctx);
    free(text);
    return rc;
}

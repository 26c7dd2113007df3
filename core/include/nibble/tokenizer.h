/* Tokenizers: BPE from a Hugging Face tokenizer.json (byte-level with regex pre-tokenization as in
 * GPT-2 / Llama-3 / Qwen2, or SentencePiece-style with byte fallback as in Llama-2 / Mistral), from a
 * GGUF's tokenizer.ggml.* vocabulary (`llama` = SentencePiece by piece scores, `gpt2` = byte-level
 * BPE with the `tokenizer.ggml.pre` regexes) and from a SentencePiece tokenizer.model (BPE type).
 * Encode reproduces HF tokenizers / llama.cpp ids; decode turns ids back into bytes. */
#ifndef NIBBLE_TOKENIZER_H
#define NIBBLE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/gguf.h"

typedef struct nb_tokenizer nb_tokenizer;

/* Token types, numbered as SentencePiece and GGUF's tokenizer.ggml.token_type number them. */
typedef enum nb_token_type {
    NB_TOKEN_UNDEFINED = 0,
    NB_TOKEN_NORMAL = 1,
    NB_TOKEN_UNKNOWN = 2,
    NB_TOKEN_CONTROL = 3,        /* special tokens (<s>, <|endoftext|>): matched in text only with NB_TOK_PARSE_SPECIAL */
    NB_TOKEN_USER_DEFINED = 4,   /* added non-special tokens: always matched in text, before BPE */
    NB_TOKEN_UNUSED = 5,
    NB_TOKEN_BYTE = 6            /* <0xXX> byte-fallback tokens */
} nb_token_type;

/* Encode / decode flags. */
enum {
    NB_TOK_ADD_SPECIAL = 1,      /* encode: add BOS / EOS as the model's config says (add_bos_token, add_eos_token) */
    NB_TOK_PARSE_SPECIAL = 2,    /* encode: text like "<s>" or "<|im_end|>" becomes that control token */
    NB_TOK_SKIP_SPECIAL = 4      /* decode: control and unknown tokens produce no text */
};

/* A growable id array that encode appends to. Zero-initialize it; nb_tokens_free releases it. */
typedef struct nb_tokens {
    int32_t *ids;
    int64_t n;
    int64_t cap;
} nb_tokens;

NB_API void nb_tokens_free(nb_tokens *t);
NB_API nb_status nb_tokens_reserve(nb_ctx *ctx, nb_tokens *t, int64_t cap);

/* Load from a tokenizer.json path, or a directory holding tokenizer.json. tokenizer_config.json
 * beside it (add_bos_token, add_eos_token, bos_token, eos_token, chat_template) and config.json (bos_token_id,
 * eos_token_id) refine BOS/EOS; without them the post_processor template decides. */
NB_API nb_status nb_tokenizer_from_json(nb_ctx *ctx, const char *path_or_dir, nb_tokenizer **out);
/* Load from a GGUF's tokenizer.ggml.* keys (model `llama` or `gpt2`). The tokenizer copies what it
 * needs: the GGUF may be closed afterwards. */
NB_API nb_status nb_tokenizer_from_gguf(nb_ctx *ctx, nb_gguf *g, nb_tokenizer **out);
/* Load a SentencePiece tokenizer.model (a BPE-type ModelProto; unigram models are unsupported). */
NB_API nb_status nb_tokenizer_from_spm(nb_ctx *ctx, const char *path, nb_tokenizer **out);
/* Any of the above by path: a directory (tokenizer.json, else tokenizer.model), *.gguf, *.model, *.json. */
NB_API nb_status nb_tokenizer_load(nb_ctx *ctx, const char *path, nb_tokenizer **out);
NB_API void nb_tokenizer_free(nb_tokenizer *tok);
/* Write the tokenizer as Hugging Face files into dir (created if missing): tokenizer.json (a BPE
 * model that HF tokenizers, transformers and nb_tokenizer_from_json load and that encodes to the
 * same ids), tokenizer_config.json (BOS/EOS, add_bos_token, model_max_length, the chat template)
 * and special_tokens_map.json. For tokenizers from a GGUF (`gpt2` and `llama`) or a tokenizer.model;
 * NB_ERR_UNSUPPORTED for one loaded from a tokenizer.json (copy that file instead). */
NB_API nb_status nb_tokenizer_save_json(nb_ctx *ctx, const nb_tokenizer *tok, const char *dir);

/* Encode len bytes of text (need not be NUL-terminated) and append the ids to out.
 * A tokenizer is read-only after loading: encode/decode may run on several threads at once. */
NB_API nb_status nb_tokenizer_encode(nb_ctx *ctx, const nb_tokenizer *tok, const char *text, int64_t len,
                              uint32_t flags, nb_tokens *out);
/* Same into a fixed buffer: *n_out is always the number of ids the text needs; NB_ERR_SHAPE (and
 * the first cap ids written) when that exceeds cap. */
NB_API nb_status nb_tokenizer_encode_into(nb_ctx *ctx, const nb_tokenizer *tok, const char *text, int64_t len,
                                   uint32_t flags, int32_t *out, int64_t cap, int64_t *n_out);
/* Decode ids to bytes (UTF-8 unless byte tokens split a character). *n_out is always the byte
 * count needed (no NUL is counted); out may be NULL with cap 0 to ask for the size. When cap is
 * larger than the text a NUL is written after it. NB_ERR_SHAPE when the text does not fit. */
NB_API nb_status nb_tokenizer_decode(nb_ctx *ctx, const nb_tokenizer *tok, const int32_t *ids, int64_t n,
                              uint32_t flags, char *out, int64_t cap, int64_t *n_out);

NB_API int32_t nb_tokenizer_vocab_size(const nb_tokenizer *tok);
NB_API int32_t nb_tokenizer_bos(const nb_tokenizer *tok);          /* -1 when the model has none */
NB_API int32_t nb_tokenizer_eos(const nb_tokenizer *tok);          /* -1 when the model has none */
NB_API int32_t nb_tokenizer_unk(const nb_tokenizer *tok);          /* -1 when the model has none */
NB_API int nb_tokenizer_add_bos(const nb_tokenizer *tok);          /* what NB_TOK_ADD_SPECIAL does */
NB_API int nb_tokenizer_add_eos(const nb_tokenizer *tok);
/* "spm" (SentencePiece pieces and scores), "bpe" (SentencePiece-style BPE with merges) or
 * "byte-bpe" (byte-level BPE with merges). */
NB_API const char *nb_tokenizer_kind(const nb_tokenizer *tok);
/* The pre-tokenizer name ("gpt-2", "qwen2", "llama-bpe", "json", "none"...). */
NB_API const char *nb_tokenizer_pre(const nb_tokenizer *tok);
/* The token's text as the vocabulary spells it ("▁Hello", "Ġworld", "<0x0A>"); NULL if id is out of range. */
NB_API const char *nb_tokenizer_token_text(const nb_tokenizer *tok, int32_t id, uint32_t *len);
/* The bytes the token stands for when decoded on its own (" Hello", "\n"); NULL if out of range. */
NB_API const char *nb_tokenizer_token_bytes(const nb_tokenizer *tok, int32_t id, uint32_t *len);
NB_API nb_token_type nb_tokenizer_token_type(const nb_tokenizer *tok, int32_t id);
/* Id of the token spelled exactly `text` (vocabulary spelling), or -1. */
NB_API int32_t nb_tokenizer_find(const nb_tokenizer *tok, const char *text, int64_t len);
/* End-of-generation: EOS, or a control token like <|eot_id|>, <|im_end|>, <|endoftext|>, <end_of_turn>. */
NB_API int nb_tokenizer_is_eog(const nb_tokenizer *tok, int32_t id);
/* The model's chat template (Jinja source): GGUF's tokenizer.chat_template, or beside a tokenizer.json
 * chat_template.jinja, else tokenizer_config.json's "chat_template" (its "default" entry when a list).
 * NULL when the model has none; *len (if not NULL) is its byte length. */
NB_API const char *nb_tokenizer_chat_template(const nb_tokenizer *tok, size_t *len);

#endif

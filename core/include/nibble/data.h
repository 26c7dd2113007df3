/* Calibration and distillation data: documents read from plain text, JSONL or a JSON array,
 * tokenized once with the model's tokenizer into one global token stream with a per-token loss mask
 * (an nb_dataset), then cut into rows of seq_len tokens from a seeded offset and served in batches by
 * an nb_dataloader whose cursor (nb_data_state) can be saved and restored.
 *
 * Documents. Plain text (.txt and any unknown extension) is split into documents by blank lines
 * (lines empty or made of whitespace; the default), by a separator string such as "<|endoftext|>"
 * (wherever it occurs), one per line, or not at all (the whole file is one document). Each document
 * has its leading and trailing whitespace removed; documents left empty are skipped; a UTF-8 byte
 * order mark at the start of the file is skipped. JSONL (.jsonl, .ndjson): one JSON object per line
 * (blank lines skipped); .json: a JSON array of such objects, or else JSONL. Each object is read as
 * the first that applies of
 *   {"messages": [{"role": r, "content": c}, ...]}   chat (content: a string or a list of
 *                                                     {"type": "text", "text": ...} parts; null = "")
 *   {"prompt": p, "completion": c}                   SFT pair, rendered as p immediately followed by c
 *   {"text": t}                                      plain text (the field name is opts.text_field)
 * Errors name the file and the 1-based line (or the array element) and say what is wrong.
 *
 * Tokens. Each document becomes [BOS] tokens [EOS] (BOS when the tokenizer's config adds one, EOS
 * when it has one: opts.add_bos / add_eos override), and the documents are concatenated in file order.
 * Text is encoded without parsing special tokens unless opts.parse_special; chat control tokens are
 * inserted by id, so "<|im_start|>" typed inside a message stays text.
 *
 * Chat rendering (no template engine): NB_CHAT_AUTO picks ChatML when the tokenizer has both
 * <|im_start|> and <|im_end|> tokens (Qwen, SmolLM2-Instruct), else the plain template:
 *   ChatML: <|im_start|>{role}\n{content}<|im_end|>\n      per message, no default system message
 *   plain:  {role}: {content}\n                             per message
 *
 * Loss masks (1 = the token is a training target). Plain text: every token, BOS and EOS included.
 * prompt/completion: the completion tokens and the EOS after them. messages: the content of every
 * "assistant" turn and the token that ends it (<|im_end|> in ChatML, the "\n" in the plain template;
 * not the role header), and the EOS when the last message is the assistant's. BOS is 0 in SFT records.
 * Mask boundaries inside a run of text are found as Hugging Face TRL finds them: the text before the
 * boundary is encoded on its own and the tokens it shares with the encoding of the whole run (the
 * longest common prefix) belong to the earlier part; a token that straddles the boundary goes to the
 * later part. The tokens are always those of encoding the whole run.
 *
 * Packing (pack = 1). The stream s[0..N) is cut into rows of seq_len + 1 tokens that overlap by one:
 * row i of an epoch starts at p = offset + i * seq_len; tokens[t] = s[p + t], targets[t] = s[p + t + 1],
 * mask[t] = m[p + t + 1] (the mask of the target), t in [0, seq_len). Rows never run past the end of
 * the stream unless cfg.wrap: then positions are taken modulo N (the stream is read as a cycle; every
 * document ends with EOS, so the seam is a document boundary). Without pack, row i is document i
 * (modulo the number of documents when wrapping) cut to seq_len + 1 tokens and padded with pad_id;
 * padded targets have mask 0.
 *
 * Random offsets and order, identical on every rank and for any thread count: the epoch's RNG is an
 * nb_rng seeded with cfg.seed (nb_rng_seed) and, for epoch e > 0, advanced by e xoshiro256 jumps (2^128
 * draws each: non-overlapping streams). With random_offset its first draw gives the epoch's offset,
 * uniform in [0, seq_len) by rejection sampling (x = nb_rng_next until x >= 2^64 mod seq_len, then
 * x mod seq_len); without it the offset is 0. With shuffle, the following draws shuffle the epoch's
 * rows (Fisher-Yates from the last row down, j uniform in [0, i]). So epoch 0's offset is a function of
 * (seed, seq_len) alone: nb_data_offset().
 *
 * Rows per epoch: cfg.samples, or when it is 0 every row the data gives (with random offsets, the
 * number that every offset allows: (N - seq_len) / seq_len; without, (N - 1) / seq_len; unpacked: the
 * number of documents). Asking for more samples than that is an error unless cfg.wrap. Without
 * shuffle an epoch reads rows 0, 1, ..., samples - 1; with it, the first samples entries of a shuffled
 * list of all the rows (more than samples when the data allows, so a small calibration set draws from
 * the whole file). Batches never cross an epoch: the last one is short (samples % batch rows) unless
 * drop_last, which skips it. */
#ifndef NIBBLE_DATA_H
#define NIBBLE_DATA_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/tensor.h"
#include "nibble/tokenizer.h"

typedef struct nb_dataset nb_dataset;
typedef struct nb_dataloader nb_dataloader;

typedef enum nb_data_format {
    NB_DATA_FORMAT_AUTO = 0,   /* by extension: .jsonl/.ndjson JSONL, .json array-or-JSONL, else text */
    NB_DATA_TEXT = 1,
    NB_DATA_JSONL = 2,
    NB_DATA_JSON = 3           /* a JSON array of records (falls back to JSONL when it is not one) */
} nb_data_format;

typedef enum nb_text_split {
    NB_SPLIT_BLANK_LINE = 0,   /* documents separated by one or more blank lines (default) */
    NB_SPLIT_WHOLE = 1,        /* the whole file is one document */
    NB_SPLIT_LINE = 2,         /* every non-blank line is a document */
    NB_SPLIT_SEPARATOR = 3     /* documents separated by opts.separator */
} nb_text_split;

typedef enum nb_chat_template {
    NB_CHAT_AUTO = 0,          /* ChatML when the tokenizer has <|im_start|> and <|im_end|>, else plain */
    NB_CHAT_CHATML = 1,
    NB_CHAT_PLAIN = 2
} nb_chat_template;

typedef struct nb_data_opts {
    nb_data_format format;          /* default AUTO */
    nb_text_split split;            /* plain text; default BLANK_LINE (SEPARATOR when separator is set) */
    const char *separator;          /* NULL, or the string between documents, e.g. "<|endoftext|>" */
    const char *text_field;         /* JSONL plain-text field; NULL = "text" */
    nb_chat_template chat_template; /* default AUTO */
    int32_t add_bos;                /* -1 (default): as the tokenizer's config says; 0 never; 1 always */
    int32_t add_eos;                /* -1 (default) or 1: EOS after every document; 0 never */
    int32_t parse_special;          /* 1: special-token text in documents becomes control tokens (default 0) */
    int64_t max_tokens;             /* 0: the whole file; else stop after the document that reaches it */
} nb_data_opts;

typedef struct nb_dataloader_cfg {
    int64_t seq_len;         /* tokens per row (> 0) */
    int64_t batch;           /* rows per batch (> 0; default 1) */
    int64_t samples;         /* rows per epoch; 0 (default) = every row the data gives */
    uint64_t seed;           /* the recipe's seed (default 0) */
    int32_t random_offset;   /* 1: the epoch's start offset is drawn from the seed (default 0) */
    int32_t pack;            /* 1 (default): the global stream; 0: one document per row, padded */
    int32_t shuffle;         /* 1: rows in a seeded random order, a new one every epoch (default 0) */
    int32_t wrap;            /* 1: read the stream (or the documents) as a cycle when samples ask for more */
    int32_t drop_last;       /* 1: skip an epoch's short last batch (default 0) */
    int32_t pad_id;          /* pack = 0: padding id; -1 (default) = the dataset's EOS, or 0 without one */
} nb_dataloader_cfg;

/* The cursor of a dataloader: plain data for a checkpoint. The RNG state and the offset are functions
 * of (seed, epoch) and are checked on restore, as is the fingerprint of the dataset and configuration. */
typedef struct nb_data_state {
    int64_t epoch;
    int64_t row;             /* next row within the epoch */
    int64_t rows_read;       /* rows returned so far, over all epochs */
    int64_t offset;          /* this epoch's start offset */
    uint64_t seed;
    uint64_t rng[4];         /* the epoch's RNG after its offset and shuffle draws */
    uint64_t fingerprint;    /* of the dataset's tokens, masks and documents, and of the configuration (not batch) */
} nb_data_state;

/* One batch. Pass a zeroed struct; nb_dataloader_next replaces the tensors it holds (releasing them). */
typedef struct nb_data_batch {
    nb_tensor *tokens;       /* [rows, seq_len] i32: model inputs */
    nb_tensor *targets;      /* [rows, seq_len] i32: the next token of each input (labels) */
    nb_tensor *mask;         /* [rows, seq_len] u8: 1 where the target counts in the loss */
    int64_t rows;            /* batch, or fewer in an epoch's short last batch */
    int64_t epoch;
    int64_t row;             /* index within the epoch of the first row */
    int32_t epoch_end;       /* 1 when this is the epoch's last batch */
} nb_data_batch;

NB_API void nb_data_opts_init(nb_data_opts *opts);
NB_API void nb_dataloader_cfg_init(nb_dataloader_cfg *cfg);

/* --- datasets ------------------------------------------------------------------------------ */
/* An empty dataset; add documents with the nb_dataset_add_* calls. Datasets are refcounted
 * (a dataloader holds a reference) and frozen once a dataloader uses them. */
NB_API nb_status nb_dataset_new(nb_ctx *ctx, nb_dataset **out);
/* new + add_file. opts may be NULL (defaults). */
NB_API nb_status nb_dataset_load(nb_ctx *ctx, const nb_tokenizer *tok, const char *path, const nb_data_opts *opts,
                          nb_dataset **out);
/* Append every document of a file. Tokenization runs on the context's threads; the result does not
 * depend on their number. Fails, adding nothing, on an unreadable or malformed file, a binary one
 * (nb_data_check_text) or one without documents. */
NB_API nb_status nb_dataset_add_file(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *path,
                              const nb_data_opts *opts);
/* NB_ERR_FORMAT "NAME is not a text file (a NUL byte at offset N): give a text or JSONL file" when the
 * len bytes hold a NUL (a binary file such as a GGUF or safetensors), else NB_OK. Invalid UTF-8 passes
 * (the tokenizers take any bytes). nb_dataset_add_file checks every file with it; callers that read
 * text files themselves (eval data) call it too. */
NB_API nb_status nb_data_check_text(nb_ctx *ctx, const char *name, const char *data, int64_t len);
/* Append one plain-text document (mask 1) of len bytes. */
NB_API nb_status nb_dataset_add_text(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *text, int64_t len,
                              const nb_data_opts *opts);
/* Append one record given as JSON text (an object as in a JSONL line). */
NB_API nb_status nb_dataset_add_json(nb_ctx *ctx, nb_dataset *ds, const nb_tokenizer *tok, const char *json, int64_t len,
                              const nb_data_opts *opts);
/* Append one document as it is: n ids and their mask (NULL = all 1); no BOS or EOS is added. */
NB_API nb_status nb_dataset_add_tokens(nb_ctx *ctx, nb_dataset *ds, const int32_t *ids, const uint8_t *mask, int64_t n);
/* Hold out the last documents as an evaluation set: the split falls at the document boundary nearest
 * to (1 - eval_fraction) of the tokens, keeping at least one document on each side. */
NB_API nb_status nb_dataset_split(nb_ctx *ctx, const nb_dataset *ds, double eval_fraction, nb_dataset **train,
                           nb_dataset **eval);
NB_API void nb_dataset_retain(nb_dataset *ds);
NB_API void nb_dataset_release(nb_dataset *ds);

NB_API int64_t nb_dataset_n_tokens(const nb_dataset *ds);
NB_API int64_t nb_dataset_n_docs(const nb_dataset *ds);
NB_API int64_t nb_dataset_n_masked(const nb_dataset *ds);        /* tokens whose mask is 1 */
NB_API int64_t nb_dataset_doc_start(const nb_dataset *ds, int64_t i);  /* i in [0, n_docs]; n_tokens for n_docs */
NB_API const int32_t *nb_dataset_ids(const nb_dataset *ds);      /* the stream (valid until the next add) */
NB_API const uint8_t *nb_dataset_mask(const nb_dataset *ds);
NB_API int32_t nb_dataset_eos(const nb_dataset *ds);             /* EOS of the tokenizer last used; -1 if none */
NB_API uint64_t nb_dataset_fingerprint(const nb_dataset *ds);

/* --- dataloaders --------------------------------------------------------------------------- */
/* Validates the configuration against the dataset (too short, samples beyond the data without wrap,
 * drop_last with samples < batch) and positions the cursor at epoch 0, row 0. */
NB_API nb_status nb_dataloader_new(nb_ctx *ctx, nb_dataset *ds, const nb_dataloader_cfg *cfg, nb_dataloader **out);
NB_API void nb_dataloader_free(nb_dataloader *ld);
/* The next batch, advancing the cursor; after an epoch's last batch the next call starts the next epoch. */
NB_API nb_status nb_dataloader_next(nb_ctx *ctx, nb_dataloader *ld, nb_data_batch *out);
/* Rows [row, row + n) of an epoch into caller buffers of n * seq_len entries (any may be NULL);
 * the cursor does not move. */
NB_API nb_status nb_dataloader_read(nb_ctx *ctx, nb_dataloader *ld, int64_t epoch, int64_t row, int64_t n,
                             int32_t *tokens, int32_t *targets, uint8_t *mask);
NB_API void nb_dataloader_state(const nb_dataloader *ld, nb_data_state *out);
/* Put the cursor where a saved state says. Fails (NB_ERR_INVALID) on a state from another dataset or
 * configuration, or one whose RNG or offset disagree with its seed and epoch. */
NB_API nb_status nb_dataloader_restore(nb_ctx *ctx, nb_dataloader *ld, const nb_data_state *st);
NB_API int64_t nb_dataloader_rows_per_epoch(const nb_dataloader *ld);   /* after drop_last */
NB_API int64_t nb_dataloader_batches_per_epoch(const nb_dataloader *ld);
/* The start offset the rule above gives an epoch: 0 when random_offset is 0 or pack is 0. */
NB_API int64_t nb_dataloader_offset(const nb_dataloader *ld, int64_t epoch);
/* Epoch e's random offset for a seed and seq_len (> 0): the rule above, without a dataset. */
NB_API int64_t nb_data_offset(uint64_t seed, int64_t epoch, int64_t seq_len);

NB_API void nb_data_batch_release(nb_data_batch *b);

#endif

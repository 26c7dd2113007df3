/* libFuzzer target: calibration / distillation data. The input is read as a text file, a JSONL
 * file (text, prompt/completion and chat records, sft masks) and a JSON file, with ChatML and
 * plain chat rendering in turn, tokenized by a committed byte-level tokenizer; whatever loads is
 * then cut into rows by a packing and a one-document-per-row dataloader. */
#include "fuzz.h"

static nb_tokenizer *tokenizer(void) {
    static nb_tokenizer *tok;
    if (!tok) fz_check(nb_tokenizer_from_json(fz_ctx(), fz_source("tests/golden/data/tokenizers/meta_first/tokenizer.json"), &tok),
                       "tokenizer");
    return tok;
}

static void rows(nb_ctx *ctx, nb_dataset *ds, int pack) {
    nb_dataloader_cfg cfg;
    nb_dataloader_cfg_init(&cfg);
    cfg.seq_len = 7;
    cfg.batch = 2;
    cfg.pack = pack;
    cfg.shuffle = 1;
    cfg.random_offset = pack;
    cfg.seed = 3;
    nb_dataloader *ld = NULL;
    if (nb_dataloader_new(ctx, ds, &cfg, &ld) != NB_OK) return;
    nb_data_batch b = {0};
    for (int i = 0; i < 4 && nb_dataloader_next(ctx, ld, &b) == NB_OK; i++) {}
    nb_data_batch_release(&b);
    nb_dataloader_free(ld);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    static const char *const names[] = {"data.txt", "data.jsonl", "data.json"};
    for (int k = 0; k < 3; k++) {
        const char *path = fz_write(names[k], data, size);
        nb_data_opts o;
        nb_data_opts_init(&o);
        o.chat_template = k == 1 ? NB_CHAT_CHATML : NB_CHAT_PLAIN;
        o.parse_special = k != 0;
        o.separator = k == 0 ? "<|endoftext|>" : NULL;
        nb_dataset *ds = NULL;
        if (nb_dataset_load(ctx, tokenizer(), path, &o, &ds) != NB_OK) continue;
        (void)nb_dataset_n_masked(ds);
        rows(ctx, ds, 1);
        rows(ctx, ds, 0);
        nb_dataset_release(ds);
    }
    return 0;
}

/* libFuzzer target: model.safetensors.index.json of a sharded checkpoint. The folder holds two
 * real shards (the committed tiny Llama, re-written 40 KB per shard), so an index that names them
 * reaches the shard checks: tensors claimed by the wrong shard, missing, twice, or paths that
 * leave the folder. Every tensor the opened set lists is then read. */
#include "fuzz.h"

static const char *shard_dir(void) {
    static const char *dir;
    if (dir) return dir;
    nb_ctx *ctx = fz_ctx();
    static char d[1024];
    snprintf(d, sizeof d, "%s", fz_mkdir("sharded"));
    nb_st *src = NULL;
    nb_st_writer *w = NULL;
    fz_check(nb_st_open(ctx, fz_source("tests/golden/data/model_llama3/model.safetensors"), &src), "open model_llama3");
    fz_check(nb_st_writer_new(ctx, &w), "writer");
    nb_tensor *keep[64];
    int nk = 0;
    for (int64_t i = 0; i < nb_st_count(src) && nk < 64; i++) {
        fz_check(nb_st_get(ctx, src, nb_st_entry_at(src, i)->name, &keep[nk]), "read model_llama3");
        fz_check(nb_st_writer_add(ctx, w, nb_st_entry_at(src, i)->name, keep[nk]), "add");
        nk++;
    }
    fz_check(nb_st_writer_write_sharded(ctx, w, d, 40000), "write shards");
    nb_st_writer_free(w);
    for (int i = 0; i < nk; i++) nb_tensor_release(keep[i]);
    nb_st_close(src);
    char idx[1100];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    if (fz_seed_path("model.safetensors.index.json")) fz_copy(idx, fz_seed_path("model.safetensors.index.json"));
    dir = d;
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    (void)shard_dir();
    fz_write("sharded/model.safetensors.index.json", data, size);
    nb_st *st = NULL;
    if (nb_st_open(ctx, shard_dir(), &st) != NB_OK) return 0;
    for (int64_t i = 0; i < nb_st_shard_count(st); i++) (void)nb_st_shard_path(st, i);
    for (int64_t i = 0; i < nb_st_count(st); i++) {
        nb_tensor *t = NULL;
        if (nb_st_get(ctx, st, nb_st_entry_at(st, i)->name, &t) == NB_OK) nb_tensor_release(t);
    }
    nb_st_close(st);
    return 0;
}

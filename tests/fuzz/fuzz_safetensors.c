/* libFuzzer target: one .safetensors file (header JSON, dtypes, shapes, offsets, metadata), then
 * every tensor read and converted to float32 so that each byte the header points at is touched. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = fz_ctx();
    const char *path = fz_write("model.safetensors", data, size);
    nb_st *st = NULL;
    if (nb_st_open(ctx, path, &st) != NB_OK) return 0;
    for (int64_t i = 0; i < nb_st_metadata_count(st); i++) (void)nb_st_metadata(st, nb_st_metadata_key(st, i));
    for (int64_t i = 0; i < nb_st_count(st); i++) {
        const nb_st_entry *e = nb_st_entry_at(st, i);
        nb_tensor *t = NULL, *f = NULL;
        if (nb_st_find(st, e->name) != i) abort();   /* the name table must agree with the entry list */
        if (nb_st_get(ctx, st, e->name, &t) != NB_OK) continue;
        if (nb_tensor_to(ctx, t, NB_F32, &f) == NB_OK) nb_tensor_release(f);
        nb_tensor_release(t);
    }
    nb_st_close(st);
    return 0;
}

/* safetensors: a validating, lazy (mmap) reader for single files and sharded directories, and a
 * writer that follows the reference serializer byte for byte (FORMATS.md §7) and writes atomically. */
#ifndef NIBBLE_SAFETENSORS_H
#define NIBBLE_SAFETENSORS_H

#include <stdint.h>
#include "nibble/tensor.h"

typedef struct nb_st nb_st;             /* an opened file or sharded set */
typedef struct nb_st_writer nb_st_writer;

typedef struct nb_st_entry {
    const char *name;
    nb_dtype dtype;
    int32_t ndim;
    int64_t shape[NB_MAX_DIMS];
    int64_t begin, end;                 /* data_offsets, relative to the shard's byte buffer */
    const char *shard;                  /* path of the file that holds it */
} nb_st_entry;

/* Open a .safetensors file, a model directory (model.safetensors or model.safetensors.index.json
 * inside), or an index.json path. Every header field is validated; tensors are not read. */
nb_status nb_st_open(nb_ctx *ctx, const char *path, nb_st **out);
void nb_st_close(nb_st *st);
int64_t nb_st_count(const nb_st *st);
/* Entry i in file order (sorted by shard then offset). */
const nb_st_entry *nb_st_entry_at(const nb_st *st, int64_t i);
/* Index of a tensor by name, or -1. */
int64_t nb_st_find(const nb_st *st, const char *name);
/* __metadata__ value of the first shard, or NULL. */
const char *nb_st_metadata(const nb_st *st, const char *key);
int64_t nb_st_metadata_count(const nb_st *st);
const char *nb_st_metadata_key(const nb_st *st, int64_t i);
/* Zero-copy view over the mapped file (read-only buffer). NB_ERR_NOT_FOUND if absent. */
nb_status nb_st_get(nb_ctx *ctx, nb_st *st, const char *name, nb_tensor **out);

/* Writer: add tensors (retained, written contiguous), metadata, then write. */
nb_status nb_st_writer_new(nb_ctx *ctx, nb_st_writer **out);
void nb_st_writer_free(nb_st_writer *w);
nb_status nb_st_writer_meta(nb_ctx *ctx, nb_st_writer *w, const char *key, const char *value);
nb_status nb_st_writer_add(nb_ctx *ctx, nb_st_writer *w, const char *name, const nb_tensor *t);
/* One file, atomically (PATH.tmp-XXXX then rename). */
nb_status nb_st_writer_write(nb_ctx *ctx, nb_st_writer *w, const char *path);
/* Sharded like huggingface_hub: tensors in insertion order into shards of at most max_shard_bytes
 * ("model-00001-of-00003.safetensors" + model.safetensors.index.json), or "model.safetensors" alone
 * when one shard suffices. Files appear atomically; dir must exist. */
nb_status nb_st_writer_write_sharded(nb_ctx *ctx, nb_st_writer *w, const char *dir, int64_t max_shard_bytes);

#endif

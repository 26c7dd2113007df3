/* safetensors: a validating, lazy (mmap) reader for single files and sharded directories, and a
 * writer that follows the reference serializer byte for byte (FORMATS.md §7) and writes atomically. */
#ifndef NIBBLE_SAFETENSORS_H
#define NIBBLE_SAFETENSORS_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/tensor.h"

typedef struct nb_st nb_st;             /* an opened file or sharded set */
typedef struct nb_st_writer nb_st_writer;

typedef struct nb_st_entry {
    const char *name;
    nb_dtype dtype;                     /* F4 maps to NB_E2M1 with the logical (unpacked) shape */
    int32_t ndim;
    int64_t shape[NB_MAX_DIMS];
    int64_t begin, end;                 /* data_offsets, relative to the shard's byte buffer */
    const char *shard;                  /* path of the file that holds it */
} nb_st_entry;

/* Open a .safetensors file, a model directory (model.safetensors.index.json inside if present,
 * else model.safetensors), or an index.json path. Every header field is validated (NB_ERR_FORMAT
 * naming file and tensor; dtypes nibble has no nb_dtype for are NB_ERR_UNSUPPORTED); shard paths
 * must stay inside the index's directory; each shard is mapped once; tensors are not read. */
NB_API nb_status nb_st_open(nb_ctx *ctx, const char *path, nb_st **out);
NB_API void nb_st_close(nb_st *st);
NB_API int64_t nb_st_count(const nb_st *st);
/* Entry i in file order (sorted by shard then offset); NULL when out of range. */
NB_API const nb_st_entry *nb_st_entry_at(const nb_st *st, int64_t i);
/* Index of a tensor by name, or -1. */
NB_API int64_t nb_st_find(const nb_st *st, const char *name);
/* __metadata__ value of the first shard, or NULL. Keys are in file order. */
NB_API const char *nb_st_metadata(const nb_st *st, const char *key);
NB_API int64_t nb_st_metadata_count(const nb_st *st);
NB_API const char *nb_st_metadata_key(const nb_st *st, int64_t i);
/* Shard files, sorted by path (1 for a single file). */
NB_API int64_t nb_st_shard_count(const nb_st *st);
NB_API const char *nb_st_shard_path(const nb_st *st, int64_t i);
/* Zero-copy view over the mapped file (read-only buffer). NB_ERR_NOT_FOUND if absent. Data that is
 * not aligned to its element size in the file (a header length that is not a multiple of 8, which
 * the reference writer never produces) is copied to an aligned heap tensor instead. */
NB_API nb_status nb_st_get(nb_ctx *ctx, nb_st *st, const char *name, nb_tensor **out);

/* Writer: add tensors (retained, written contiguous), metadata, then write. Names must be valid
 * UTF-8, unique and not "__metadata__"; host tensors only. */
NB_API nb_status nb_st_writer_new(nb_ctx *ctx, nb_st_writer **out);
NB_API void nb_st_writer_free(nb_st_writer *w);
/* __metadata__ entry, written in the order added (setting a key again replaces its value). The
 * reference keeps these in a hash map, so its order is unspecified beyond one key. */
NB_API nb_status nb_st_writer_meta(nb_ctx *ctx, nb_st_writer *w, const char *key, const char *value);
NB_API nb_status nb_st_writer_add(nb_ctx *ctx, nb_st_writer *w, const char *name, const nb_tensor *t);
NB_API int64_t nb_st_writer_count(const nb_st_writer *w);
/* One file, atomically (PATH.tmp-* then fsync and rename; the temp file is removed on failure).
 * Tensors are ordered by descending safetensors dtype enum, then by name, as the reference does. */
NB_API nb_status nb_st_writer_write(nb_ctx *ctx, nb_st_writer *w, const char *path);
/* Sharded like huggingface_hub's split_state_dict_into_shards_factory: tensors in insertion order
 * into shards of at most max_shard_bytes (a tensor bigger than that gets a shard of its own, placed
 * before the shard being filled), "model-00001-of-00003.safetensors" + model.safetensors.index.json
 * (transformers' json.dumps(index, indent=2, sort_keys=True) + "\n"), or "model.safetensors" alone
 * when one shard suffices. Every shard gets the writer's __metadata__. Each file appears atomically,
 * the index last; stale model*.safetensors / index files from an earlier save are then removed.
 * dir must exist. */
NB_API nb_status nb_st_writer_write_sharded(nb_ctx *ctx, nb_st_writer *w, const char *dir, int64_t max_shard_bytes);
/* Extra integer entries for the index's "metadata" object next to "total_size" (transformers also
 * writes "total_parameters"). Ignored when no index is written. */
NB_API nb_status nb_st_writer_index_meta(nb_ctx *ctx, nb_st_writer *w, const char *key, int64_t value);

#endif

/* Mixed parameter buffers (Megatron's param buffers): one contiguous allocation holding several
 * parameters of mixed formats, with two index maps: param_index_map in unpacked (logical) element
 * offsets for every parameter, and the packed map where an NVFP4 parameter spans numel/2 (its
 * packed bytes) and every other parameter spans numel, as Megatron's nvfp4_packed_param_index_map.
 * Spans are contiguous and unpadded in both maps; the storage byte ranges are 64-byte aligned. */
#ifndef NIBBLE_PARAMBUF_H
#define NIBBLE_PARAMBUF_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/quant.h"

typedef struct nb_parambuf nb_parambuf;

NB_API nb_status nb_parambuf_new(nb_ctx *ctx, nb_parambuf **out);
NB_API void nb_parambuf_free(nb_parambuf *pb);
/* Append a parameter. fmt NB_FMT_NONE stores it as `dtype`; NVFP4 variants store packed E2M1
 * (an even last dim); MXFP8 and FP8 store E4M3. Names are unique. Not after finalize. */
NB_API nb_status nb_parambuf_add(nb_ctx *ctx, nb_parambuf *pb, const char *name, nb_qformat fmt, nb_dtype dtype, int ndim,
                          const int64_t *shape);
/* Lay out and allocate the (zeroed) storage. */
NB_API nb_status nb_parambuf_finalize(nb_ctx *ctx, nb_parambuf *pb);

NB_API int nb_parambuf_count(const nb_parambuf *pb);
NB_API const char *nb_parambuf_name(const nb_parambuf *pb, int i);
NB_API int nb_parambuf_find(const nb_parambuf *pb, const char *name);   /* -1 if absent */
NB_API int nb_parambuf_has_nvfp4(const nb_parambuf *pb);
NB_API int64_t nb_parambuf_numel(const nb_parambuf *pb);          /* end of param_index_map */
NB_API int64_t nb_parambuf_packed_numel(const nb_parambuf *pb);   /* end of the packed map */
NB_API int64_t nb_parambuf_nbytes(const nb_parambuf *pb);         /* storage size (after finalize) */

/* [start, end) of parameter `name` in param_index_map (unpacked elements). */
NB_API nb_status nb_parambuf_index(nb_ctx *ctx, const nb_parambuf *pb, const char *name, int64_t *start, int64_t *end);
/* [start, end) in the packed map (NVFP4: numel/2, others numel). */
NB_API nb_status nb_parambuf_packed_index(nb_ctx *ctx, const nb_parambuf *pb, const char *name, int64_t *start, int64_t *end);
/* [start, end) in the storage, in bytes (after finalize). */
NB_API nb_status nb_parambuf_byte_range(nb_ctx *ctx, const nb_parambuf *pb, const char *name, int64_t *start, int64_t *end);
/* A tensor view of the parameter's storage: its logical shape in the storage dtype (E2M1 for
 * NVFP4, E4M3 for MXFP8 / FP8, dtype otherwise). Shares the buffer. */
NB_API nb_status nb_parambuf_view(nb_ctx *ctx, const nb_parambuf *pb, const char *name, nb_tensor **out);
/* Copy a quantized tensor's data bytes into the parameter's storage (format and shape must match). */
NB_API nb_status nb_parambuf_store(nb_ctx *ctx, nb_parambuf *pb, const char *name, const nb_qtensor *q);
/* The whole storage buffer (borrowed). */
NB_API nb_buffer *nb_parambuf_buffer(const nb_parambuf *pb);

#endif

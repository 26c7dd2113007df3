/* Buffers and tensors.
 * A buffer is a refcounted span of bytes: heap (nb_alloc), a read-only mmap of a file, external
 * memory the caller keeps alive, or CUDA device memory (nb_tensor_new_on, nb_tensor_to_device). A tensor is a refcounted view over a
 * buffer: dtype, shape, byte strides and a byte offset. Element counts and indices are always
 * logical (unpacked) elements; for packed sub-byte dtypes (E2M1) the last dimension must be
 * contiguous (strides[ndim-1] == 0 marks "packed, contiguous") and byte positions are asked for
 * with nb_tensor_packed_offset. */
#ifndef NIBBLE_TENSOR_H
#define NIBBLE_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/dtype.h"

enum { NB_MAX_DIMS = 8 };

typedef enum nb_buffer_kind {
    NB_BUF_HEAP = 0,
    NB_BUF_MMAP = 1,
    NB_BUF_EXTERNAL = 2,
    NB_BUF_DEVICE = 3
} nb_buffer_kind;

typedef struct nb_buffer nb_buffer;

typedef struct nb_tensor {
    nb_dtype dtype;
    int32_t ndim;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS];  /* in bytes; 0 in the last dim of a packed dtype */
    int64_t offset;                /* bytes from the buffer start to element 0 */
    nb_buffer *buf;
    int32_t refcount;
    int32_t device;                /* -1 = host; >= 0 = CUDA device index (nb_tensor_data is then a device
                                    * address: only the quantizers and nb_tensor_to_device read it) */
} nb_tensor;

/* --- buffers ------------------------------------------------------------------------------ */
NB_API nb_status nb_buffer_new(nb_ctx *ctx, size_t bytes, nb_buffer **out);            /* zero-filled heap */
/* Heap buffer whose contents are unspecified: for outputs every byte of which is written next
 * (saves the zero fill, a full pass over the memory). */
NB_API nb_status nb_buffer_new_uninit(nb_ctx *ctx, size_t bytes, nb_buffer **out);
NB_API nb_status nb_buffer_mmap(nb_ctx *ctx, const char *path, nb_buffer **out);       /* read-only map of a whole file */
/* Wrap memory the caller owns; free_fn(user) is called when the last reference goes (may be NULL). */
NB_API nb_status nb_buffer_wrap(nb_ctx *ctx, void *data, size_t bytes, void (*free_fn)(void *), void *user,
                         nb_buffer **out);
NB_API void nb_buffer_retain(nb_buffer *b);
NB_API void nb_buffer_release(nb_buffer *b);
NB_API void *nb_buffer_data(const nb_buffer *b);
NB_API size_t nb_buffer_size(const nb_buffer *b);
NB_API nb_buffer_kind nb_buffer_kind_of(const nb_buffer *b);
NB_API int nb_buffer_writable(const nb_buffer *b);

/* --- tensors ------------------------------------------------------------------------------ */
/* New zero-filled contiguous tensor (ndim 0 is a scalar with one element). */
NB_API nb_status nb_tensor_new(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out);
/* The same with unspecified contents (nb_buffer_new_uninit): the caller writes every element. */
NB_API nb_status nb_tensor_new_uninit(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out);
/* Contiguous view of `buf` starting `offset` bytes in; fails if it does not fit. Retains buf. */
NB_API nb_status nb_tensor_wrap(nb_ctx *ctx, nb_buffer *buf, nb_dtype dt, int ndim, const int64_t *shape,
                         int64_t offset, nb_tensor **out);
/* New tensor holding a copy of n contiguous elements at data (handy for tests and bindings). */
NB_API nb_status nb_tensor_from_data(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape,
                              const void *data, nb_tensor **out);
NB_API void nb_tensor_retain(nb_tensor *t);
NB_API void nb_tensor_release(nb_tensor *t);

NB_API int64_t nb_tensor_numel(const nb_tensor *t);
NB_API int64_t nb_tensor_nbytes(const nb_tensor *t);           /* bytes of the elements (packed size for E2M1) */
NB_API int nb_tensor_is_contiguous(const nb_tensor *t);
NB_API void *nb_tensor_data(const nb_tensor *t);               /* address of element 0 */
/* Byte offset (from element 0) of logical element `linear_index` of a contiguous tensor;
 * for E2M1 this is linear_index/2 and the nibble is (linear_index & 1). */
NB_API int64_t nb_tensor_packed_offset(const nb_tensor *t, int64_t linear_index);

/* Views share the buffer. view = reshape of a contiguous tensor (one dim may be -1). */
NB_API nb_status nb_tensor_view(nb_ctx *ctx, const nb_tensor *t, int ndim, const int64_t *shape, nb_tensor **out);
NB_API nb_status nb_tensor_slice(nb_ctx *ctx, const nb_tensor *t, int dim, int64_t start, int64_t len, nb_tensor **out);
NB_API nb_status nb_tensor_transpose(nb_ctx *ctx, const nb_tensor *t, int d0, int d1, nb_tensor **out);
/* Copies: contiguous copy in the same dtype, and a converted contiguous copy. */
NB_API nb_status nb_tensor_contiguous(nb_ctx *ctx, const nb_tensor *t, nb_tensor **out);
NB_API nb_status nb_tensor_to(nb_ctx *ctx, const nb_tensor *t, nb_dtype dt, nb_tensor **out);
/* Copy src into dst elementwise (same shape), converting dtypes; dst must be writable. */
NB_API nb_status nb_tensor_copy(nb_ctx *ctx, nb_tensor *dst, const nb_tensor *src);

/* --- devices ------------------------------------------------------------------------------ */
enum { NB_DEVICE_HOST = -1, NB_DEVICE_CTX = -2 /* the context's CUDA device (nb_ctx_options.cuda_device) */ };
/* New contiguous tensor with unspecified contents on `device` (NB_DEVICE_HOST, NB_DEVICE_CTX or a CUDA
 * device index). NB_ERR_DEVICE without CUDA or without that device. */
NB_API nb_status nb_tensor_new_on(nb_ctx *ctx, int device, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out);
/* A contiguous copy of t on `device` (as above; NB_DEVICE_HOST brings a device tensor back). Copies run
 * on the context's stream and are complete when this returns. */
NB_API nb_status nb_tensor_to_device(nb_ctx *ctx, const nb_tensor *t, int device, nb_tensor **out);

/* Element access by multi-index (ndim entries). get returns NaN on a bad index. */
NB_API double nb_tensor_get(const nb_tensor *t, const int64_t *idx);
NB_API nb_status nb_tensor_set(nb_ctx *ctx, nb_tensor *t, const int64_t *idx, double v);

#endif

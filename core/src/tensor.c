/* Refcounted buffers (heap, mmap, external, CUDA device memory) and tensors as strided views over them. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nibble/tensor.h"
#include "backend.h"

struct nb_buffer {
    int refcount;
    nb_buffer_kind kind;
    void *data;
    size_t size;
    nb_ctx *ctx;                 /* retained: counts heap bytes, outlives handles */
    void (*free_fn)(void *);
    void *user;
    int device;                  /* -1 host; >= 0 the CUDA device of NB_BUF_DEVICE memory */
};

/* ---- buffers ------------------------------------------------------------------------------ */

static nb_status buffer_alloc_struct(nb_ctx *ctx, nb_buffer **out) {
    nb_buffer *b = calloc(1, sizeof *b);
    if (!b) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (buffer header)");
    b->refcount = 1;
    b->device = -1;
    b->ctx = ctx;
    nb_ctx_retain(ctx);
    *out = b;
    return NB_OK;
}

void *nb_alloc_uninit(nb_ctx *ctx, size_t bytes);   /* ctx.c: nb_alloc without the zero fill */

static nb_status buffer_new_heap(nb_ctx *ctx, size_t bytes, int zero, nb_buffer **out) {
    *out = NULL;
    nb_buffer *b = NULL;
    nb_status s = buffer_alloc_struct(ctx, &b);
    if (s) return s;
    b->kind = NB_BUF_HEAP;
    b->size = bytes;
    b->data = zero ? nb_alloc(ctx, bytes) : nb_alloc_uninit(ctx, bytes);
    if (!b->data) { nb_buffer_release(b); return NB_ERR_NOMEM; }
    *out = b;
    return NB_OK;
}

nb_status nb_buffer_new(nb_ctx *ctx, size_t bytes, nb_buffer **out) { return buffer_new_heap(ctx, bytes, 1, out); }

nb_status nb_buffer_new_uninit(nb_ctx *ctx, size_t bytes, nb_buffer **out) {
    return buffer_new_heap(ctx, bytes, 0, out);
}

nb_status nb_buffer_mmap(nb_ctx *ctx, const char *path, nb_buffer **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nb_fail(ctx, NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return nb_fail(ctx, NB_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return nb_fail(ctx, NB_ERR_IO, "%s is not a regular file", path);
    }
    void *p = NULL;
    if (st.st_size > 0) {
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return nb_fail(ctx, NB_ERR_IO, "cannot map %s: %s", path, strerror(e));
        }
    }
    close(fd);
    nb_buffer *b = NULL;
    nb_status s = buffer_alloc_struct(ctx, &b);
    if (s) { if (p) munmap(p, (size_t)st.st_size); return s; }
    b->kind = NB_BUF_MMAP;
    b->data = p;
    b->size = (size_t)st.st_size;
    *out = b;
    return NB_OK;
}

nb_status nb_buffer_wrap(nb_ctx *ctx, void *data, size_t bytes, void (*free_fn)(void *), void *user,
                         nb_buffer **out) {
    *out = NULL;
    nb_buffer *b = NULL;
    nb_status s = buffer_alloc_struct(ctx, &b);
    if (s) return s;
    b->kind = NB_BUF_EXTERNAL;
    b->data = data;
    b->size = bytes;
    b->free_fn = free_fn;
    b->user = user;
    *out = b;
    return NB_OK;
}

void nb_buffer_retain(nb_buffer *b) { if (b) __atomic_add_fetch(&b->refcount, 1, __ATOMIC_RELAXED); }

void nb_buffer_release(nb_buffer *b) {
    if (!b || __atomic_sub_fetch(&b->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    switch (b->kind) {
    case NB_BUF_HEAP: nb_dealloc(b->ctx, b->data, b->size); break;
    case NB_BUF_MMAP: if (b->data) munmap(b->data, b->size); break;
    case NB_BUF_EXTERNAL: if (b->free_fn) b->free_fn(b->user); break;
    case NB_BUF_DEVICE: nbk_device_free(b->data); break;
    }
    nb_ctx_release(b->ctx);
    free(b);
}

void *nb_buffer_data(const nb_buffer *b) { return b->data; }
size_t nb_buffer_size(const nb_buffer *b) { return b->size; }
nb_buffer_kind nb_buffer_kind_of(const nb_buffer *b) { return b->kind; }
int nb_buffer_writable(const nb_buffer *b) { return b->kind != NB_BUF_MMAP; }

/* ---- tensors ------------------------------------------------------------------------------ */

static int is_packed(nb_dtype dt) { return nb_dtype_info(dt)->bits < 8; }

static nb_status check_shape(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape) {
    if (!nb_dtype_info(dt)) return nb_fail(ctx, NB_ERR_INVALID, "unknown dtype %d", (int)dt);
    if (ndim < 0 || ndim > NB_MAX_DIMS)
        return nb_fail(ctx, NB_ERR_INVALID, "ndim %d out of range 0..%d", ndim, NB_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return nb_fail(ctx, NB_ERR_INVALID, "negative dimension %lld", (long long)shape[i]);
    if (is_packed(dt) && (ndim == 0 || (shape[ndim - 1] & 1)))
        return nb_fail(ctx, NB_ERR_SHAPE, "packed dtype %s needs an even last dimension", nb_dtype_info(dt)->name);
    return NB_OK;
}

static void set_contiguous_strides(nb_tensor *t) {
    int64_t elem_bits = nb_dtype_info(t->dtype)->bits;
    int64_t stride_bits = elem_bits;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->strides[i] = stride_bits / 8;   /* 0 for the last dim of a packed dtype */
        stride_bits *= t->shape[i];
    }
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static nb_status tensor_alloc(nb_ctx *ctx, nb_tensor **out) {
    nb_tensor *t = calloc(1, sizeof *t);
    if (!t) return nb_fail(ctx, NB_ERR_NOMEM, "out of memory (tensor header)");
    t->refcount = 1;
    t->device = -1;
    *out = t;
    return NB_OK;
}

nb_status nb_tensor_wrap(nb_ctx *ctx, nb_buffer *buf, nb_dtype dt, int ndim, const int64_t *shape,
                         int64_t offset, nb_tensor **out) {
    *out = NULL;
    nb_status s = check_shape(ctx, dt, ndim, shape);
    if (s) return s;
    int64_t bytes = nb_dtype_nbytes(dt, numel_of(ndim, shape));
    if (offset < 0 || (uint64_t)(offset + bytes) > (uint64_t)nb_buffer_size(buf))
        return nb_fail(ctx, NB_ERR_INVALID, "view of %lld bytes at offset %lld does not fit a buffer of %zu bytes",
                       (long long)bytes, (long long)offset, nb_buffer_size(buf));
    nb_tensor *t = NULL;
    if ((s = tensor_alloc(ctx, &t))) return s;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    t->offset = offset;
    t->buf = buf;
    t->device = buf->device;
    nb_buffer_retain(buf);
    *out = t;
    return NB_OK;
}

static nb_status tensor_new_heap(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape, int zero,
                                 nb_tensor **out) {
    *out = NULL;
    nb_status s = check_shape(ctx, dt, ndim, shape);
    if (s) return s;
    nb_buffer *b = NULL;
    if ((s = buffer_new_heap(ctx, (size_t)nb_dtype_nbytes(dt, numel_of(ndim, shape)), zero, &b))) return s;
    s = nb_tensor_wrap(ctx, b, dt, ndim, shape, 0, out);
    nb_buffer_release(b);
    return s;
}

nb_status nb_tensor_new(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out) {
    return tensor_new_heap(ctx, dt, ndim, shape, 1, out);
}

nb_status nb_tensor_new_uninit(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out) {
    return tensor_new_heap(ctx, dt, ndim, shape, 0, out);
}

nb_status nb_tensor_from_data(nb_ctx *ctx, nb_dtype dt, int ndim, const int64_t *shape, const void *data,
                              nb_tensor **out) {
    nb_status s = nb_tensor_new(ctx, dt, ndim, shape, out);
    if (s) return s;
    memcpy(nb_tensor_data(*out), data, (size_t)nb_tensor_nbytes(*out));
    return NB_OK;
}

void nb_tensor_retain(nb_tensor *t) { if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED); }

void nb_tensor_release(nb_tensor *t) {
    if (!t || __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    nb_buffer_release(t->buf);
    free(t);
}

int64_t nb_tensor_numel(const nb_tensor *t) { return numel_of(t->ndim, t->shape); }
int64_t nb_tensor_nbytes(const nb_tensor *t) { return nb_dtype_nbytes(t->dtype, nb_tensor_numel(t)); }

int nb_tensor_is_contiguous(const nb_tensor *t) {
    nb_tensor c = *t;
    set_contiguous_strides(&c);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != 1 && t->strides[i] != c.strides[i]) return 0;
    return 1;
}

void *nb_tensor_data(const nb_tensor *t) { return (uint8_t *)nb_buffer_data(t->buf) + t->offset; }

int64_t nb_tensor_packed_offset(const nb_tensor *t, int64_t linear_index) {
    return nb_dtype_nbytes(t->dtype, linear_index + 1) - (is_packed(t->dtype) ? 1 : nb_dtype_info(t->dtype)->bits / 8);
}

static nb_status clone_header(nb_ctx *ctx, const nb_tensor *t, nb_tensor **out) {
    nb_status s = tensor_alloc(ctx, out);
    if (s) return s;
    nb_tensor *c = *out;
    *c = *t;
    c->refcount = 1;
    nb_buffer_retain(c->buf);
    return NB_OK;
}

nb_status nb_tensor_view(nb_ctx *ctx, const nb_tensor *t, int ndim, const int64_t *shape, nb_tensor **out) {
    *out = NULL;
    if (!nb_tensor_is_contiguous(t))
        return nb_fail(ctx, NB_ERR_INVALID, "view needs a contiguous tensor (use contiguous() first)");
    if (ndim < 0 || ndim > NB_MAX_DIMS) return nb_fail(ctx, NB_ERR_INVALID, "ndim %d out of range", ndim);
    int64_t sh[NB_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (sh[i] == -1) {
            if (infer >= 0) return nb_fail(ctx, NB_ERR_INVALID, "view: only one dimension may be -1");
            infer = i;
        } else {
            known *= sh[i];
        }
    }
    int64_t n = nb_tensor_numel(t);
    if (infer >= 0) {
        if (known == 0 || n % known) return nb_fail(ctx, NB_ERR_SHAPE, "view: cannot infer -1 for %lld elements", (long long)n);
        sh[infer] = n / known;
        known *= sh[infer];
    }
    if (known != n)
        return nb_fail(ctx, NB_ERR_SHAPE, "view: %lld elements cannot be viewed as %lld", (long long)n, (long long)known);
    nb_status s = check_shape(ctx, t->dtype, ndim, sh);
    if (s) return s;
    if ((s = clone_header(ctx, t, out))) return s;
    (*out)->ndim = ndim;
    for (int i = 0; i < ndim; i++) (*out)->shape[i] = sh[i];
    set_contiguous_strides(*out);
    return NB_OK;
}

nb_status nb_tensor_slice(nb_ctx *ctx, const nb_tensor *t, int dim, int64_t start, int64_t len, nb_tensor **out) {
    *out = NULL;
    if (dim < 0 || dim >= t->ndim) return nb_fail(ctx, NB_ERR_INVALID, "slice: dim %d out of range (ndim %d)", dim, t->ndim);
    if (start < 0 || len < 0 || start + len > t->shape[dim])
        return nb_fail(ctx, NB_ERR_INVALID, "slice [%lld, %lld) out of range 0..%lld", (long long)start,
                       (long long)(start + len), (long long)t->shape[dim]);
    if (is_packed(t->dtype) && dim == t->ndim - 1 && ((start | len) & 1))
        return nb_fail(ctx, NB_ERR_SHAPE, "slice of a packed dtype's last dimension must be even-aligned");
    nb_status s = clone_header(ctx, t, out);
    if (s) return s;
    if (is_packed(t->dtype) && dim == t->ndim - 1) (*out)->offset += start / 2;
    else (*out)->offset += start * t->strides[dim];
    (*out)->shape[dim] = len;
    return NB_OK;
}

nb_status nb_tensor_transpose(nb_ctx *ctx, const nb_tensor *t, int d0, int d1, nb_tensor **out) {
    *out = NULL;
    if (d0 < 0 || d1 < 0 || d0 >= t->ndim || d1 >= t->ndim)
        return nb_fail(ctx, NB_ERR_INVALID, "transpose: dims %d, %d out of range (ndim %d)", d0, d1, t->ndim);
    if (is_packed(t->dtype) && d0 != d1)
        return nb_fail(ctx, NB_ERR_UNSUPPORTED, "transpose of packed dtype %s", nb_dtype_info(t->dtype)->name);
    nb_status s = clone_header(ctx, t, out);
    if (s) return s;
    int64_t a = (*out)->shape[d0]; (*out)->shape[d0] = (*out)->shape[d1]; (*out)->shape[d1] = a;
    a = (*out)->strides[d0]; (*out)->strides[d0] = (*out)->strides[d1]; (*out)->strides[d1] = a;
    return NB_OK;
}

/* Byte offset (from element 0) of the row-major linear index in a strided (non-packed) tensor. */
static int64_t elem_offset(const nb_tensor *t, int64_t linear) {
    int64_t off = 0;
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t idx = linear % t->shape[i];
        linear /= t->shape[i];
        off += idx * t->strides[i];
    }
    return off;
}

/* The host-memory operations below refuse a device tensor instead of reading a device address. */
static nb_status host_only(nb_ctx *ctx, const nb_tensor *t, const char *op) {
    if (t->device < 0) return NB_OK;
    return nb_fail(ctx, NB_ERR_DEVICE, "%s: the tensor is on CUDA device %d (nb_tensor_to_device copies it to the host)", op,
                   t->device);
}

nb_status nb_tensor_copy(nb_ctx *ctx, nb_tensor *dst, const nb_tensor *src) {
    nb_status sd = host_only(ctx, dst, "copy");
    if (!sd) sd = host_only(ctx, src, "copy");
    if (sd) return sd;
    if (dst->ndim != src->ndim) return nb_fail(ctx, NB_ERR_SHAPE, "copy: ndim %d vs %d", dst->ndim, src->ndim);
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return nb_fail(ctx, NB_ERR_SHAPE, "copy: dim %d is %lld vs %lld", i, (long long)dst->shape[i],
                           (long long)src->shape[i]);
    if (!nb_buffer_writable(dst->buf)) return nb_fail(ctx, NB_ERR_INVALID, "copy: destination is read-only (mapped file)");
    int64_t n = nb_tensor_numel(src);
    if (nb_tensor_is_contiguous(dst) && nb_tensor_is_contiguous(src))
        return nb_convert(nb_tensor_data(dst), dst->dtype, nb_tensor_data(src), src->dtype, n) == NB_OK
                   ? NB_OK : nb_fail(ctx, NB_ERR_INVALID, "copy: conversion failed");
    int packed_src = is_packed(src->dtype), packed_dst = is_packed(dst->dtype);
    uint8_t *d0 = nb_tensor_data(dst);
    const uint8_t *s0 = nb_tensor_data(src);
    for (int64_t i = 0; i < n; i++) {
        double v = packed_src ? nb_load_elem(s0, src->dtype, i) : nb_load_elem(s0 + elem_offset(src, i), src->dtype, 0);
        if (packed_dst) nb_store_elem(d0, dst->dtype, i, v);
        else nb_store_elem(d0 + elem_offset(dst, i), dst->dtype, 0, v);
    }
    return NB_OK;
}

nb_status nb_tensor_contiguous(nb_ctx *ctx, const nb_tensor *t, nb_tensor **out) {
    return nb_tensor_to(ctx, t, t->dtype, out);
}

nb_status nb_tensor_to(nb_ctx *ctx, const nb_tensor *t, nb_dtype dt, nb_tensor **out) {
    *out = NULL;
    nb_status s = host_only(ctx, t, dt == t->dtype ? "contiguous" : "to");
    if (s) return s;
    s = nb_tensor_new(ctx, dt, t->ndim, t->shape, out);
    if (s) return s;
    if ((s = nb_tensor_copy(ctx, *out, t))) { nb_tensor_release(*out); *out = NULL; }
    return s;
}

static int64_t index_offset(const nb_tensor *t, const int64_t *idx, int64_t *linear) {
    int64_t off = 0, lin = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (idx[i] < 0 || idx[i] >= t->shape[i]) return -1;
        off += idx[i] * t->strides[i];
        lin = lin * t->shape[i] + idx[i];
    }
    *linear = lin;
    return off;
}

double nb_tensor_get(const nb_tensor *t, const int64_t *idx) {
    if (t->device >= 0) return NAN;
    int64_t lin;
    int64_t off = index_offset(t, idx, &lin);
    if (off < 0) return NAN;
    if (is_packed(t->dtype)) return nb_load_elem(nb_tensor_data(t), t->dtype, lin);
    return nb_load_elem((const uint8_t *)nb_tensor_data(t) + off, t->dtype, 0);
}

nb_status nb_tensor_set(nb_ctx *ctx, nb_tensor *t, const int64_t *idx, double v) {
    nb_status sd = host_only(ctx, t, "set");
    if (sd) return sd;
    int64_t lin;
    int64_t off = index_offset(t, idx, &lin);
    if (off < 0) return nb_fail(ctx, NB_ERR_INVALID, "set: index out of range");
    if (!nb_buffer_writable(t->buf)) return nb_fail(ctx, NB_ERR_INVALID, "set: tensor is read-only (mapped file)");
    if (is_packed(t->dtype)) nb_store_elem(nb_tensor_data(t), t->dtype, lin, v);
    else nb_store_elem((uint8_t *)nb_tensor_data(t) + off, t->dtype, 0, v);
    return NB_OK;
}

static nb_status host_contiguous(nb_ctx *ctx, const nb_tensor *t, nb_tensor **out) {
    if (nb_tensor_is_contiguous(t)) {
        nb_tensor_retain((nb_tensor *)t);
        *out = (nb_tensor *)t;
        return NB_OK;
    }
    return nb_tensor_contiguous(ctx, t, out);
}

/* ---- device tensors ------------------------------------------------------------------------- */

static int resolve_device(const nb_ctx *ctx, int device) {
    return device == NB_DEVICE_CTX ? nb_backend_of(ctx)->cuda_device : device;
}

nb_status nb_tensor_new_on(nb_ctx *ctx, int device, nb_dtype dt, int ndim, const int64_t *shape, nb_tensor **out) {
    *out = NULL;
    device = resolve_device(ctx, device);
    if (device == NB_DEVICE_HOST) return nb_tensor_new_uninit(ctx, dt, ndim, shape, out);
    if (device < 0) return nb_fail(ctx, NB_ERR_INVALID, "device %d: expected -1 (host), -2 (the context's) or a CUDA device", device);
    nb_status s = check_shape(ctx, dt, ndim, shape);
    if (s) return s;
    size_t bytes = (size_t)nb_dtype_nbytes(dt, numel_of(ndim, shape));
    void *p = NULL;
    if ((s = nbk_device_alloc(ctx, device, bytes, &p))) return s;
    nb_buffer *b = NULL;
    if ((s = buffer_alloc_struct(ctx, &b))) {
        nbk_device_free(p);
        return s;
    }
    b->kind = NB_BUF_DEVICE;
    b->data = p;
    b->size = bytes;
    b->device = device;
    s = nb_tensor_wrap(ctx, b, dt, ndim, shape, 0, out);
    nb_buffer_release(b);
    return s;
}

nb_status nb_tensor_to_device(nb_ctx *ctx, const nb_tensor *t, int device, nb_tensor **out) {
    *out = NULL;
    if (!t) return nb_fail(ctx, NB_ERR_INVALID, "to_device: tensor is NULL");
    device = resolve_device(ctx, device);
    nb_tensor *src = NULL;
    nb_status s;
    if (t->device < 0) {
        if ((s = host_contiguous(ctx, t, &src))) return s;
    } else {
        if (!nb_tensor_is_contiguous(t))
            return nb_fail(ctx, NB_ERR_UNSUPPORTED, "to_device: a strided tensor on CUDA device %d (copy it contiguous there first)",
                           t->device);
        nb_tensor_retain((nb_tensor *)t);
        src = (nb_tensor *)t;
    }
    if ((s = nb_tensor_new_on(ctx, device, src->dtype, src->ndim, src->shape, out))) {
        nb_tensor_release(src);
        return s;
    }
    int dir = src->device < 0 ? (device < 0 ? -1 : 0) : (device < 0 ? 1 : 2);
    size_t bytes = (size_t)nb_tensor_nbytes(src);
    if (dir < 0) memcpy(nb_tensor_data(*out), nb_tensor_data(src), bytes);
    else s = nbk_memcpy(ctx, nb_tensor_data(*out), nb_tensor_data(src), bytes, dir, nb_backend_of(ctx)->cuda_stream);
    nb_tensor_release(src);
    if (s) {
        nb_tensor_release(*out);
        *out = NULL;
    }
    return s;
}

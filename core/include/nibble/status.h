/* nibble status codes.
 * Every fallible nibble function returns nb_status: 0 is success, negative values are errors.
 * The human-readable message of the last error lives in the context: nb_ctx_last_error(ctx). */
#ifndef NIBBLE_STATUS_H
#define NIBBLE_STATUS_H

/* NB_API marks a declaration as part of the public API: libnibble is built with hidden visibility and
 * exports these names only. Every public header includes this one. */
#if defined(NB_FFI_CDEF)
#define NB_API
#elif defined(__GNUC__) || defined(__clang__)
#define NB_API __attribute__((visibility("default")))
#else
#define NB_API
#endif

typedef enum nb_status {
    NB_OK               = 0,
    NB_ERR_INVALID      = -1,  /* an argument is wrong (bad shape, bad name, out of range) */
    NB_ERR_NOMEM        = -2,  /* allocation failed */
    NB_ERR_IO           = -3,  /* open/read/write/rename failed (errno text in the message) */
    NB_ERR_FORMAT       = -4,  /* a file is malformed: bad header, offsets, magic, truncated */
    NB_ERR_UNSUPPORTED  = -5,  /* valid but not supported (dtype, architecture, config field) */
    NB_ERR_SHAPE        = -6,  /* shapes disagree or a dimension is not divisible by a block */
    NB_ERR_NOT_FOUND    = -7,  /* a named tensor, key or module does not exist */
    NB_ERR_UNCALIBRATED = -8,  /* an enabled quantizer has no calibrated state */
    NB_ERR_NUMERIC      = -9,  /* NaN or Inf where a finite value is required */
    NB_ERR_INTERRUPTED  = -10, /* nb_ctx_interrupt() was called while the operation ran */
    NB_ERR_DEVICE       = -11, /* device (CUDA) error or no device */
    NB_ERR_INTERNAL     = -12, /* an internal invariant failed: a bug in nibble */
    NB_ERR_COMM         = -13  /* a collective failed or timed out (another rank failed, died or never came) */
} nb_status;

/* Stable short name of a status code, e.g. "NB_ERR_FORMAT". Never NULL. */
NB_API const char *nb_status_name(nb_status s);

#endif

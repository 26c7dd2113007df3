/* The compute ops of the Llama-family model runtime, forward and backward, in two versions:
 * nb_op_* are the fast float32 CPU kernels (OpenBLAS for matrix products, the context's threads for
 * the rest) and nb_ref_* are plain double-precision scalar references that the tests hold them to.
 * All arrays are row-major and contiguous unless a stride says otherwise. Backward ops ADD into
 * their gradient outputs (dx, dw, ...) unless the comment says "writes". */
#ifndef NIBBLE_OPS_H
#define NIBBLE_OPS_H

#include <stdint.h>
#include "nibble/ctx.h"

/* Shapes of one causal attention call. q is [B, Tq, H, hd]; k and v are [B, kv_rows, KVH, hd]
 * of which the first Tk rows of each sequence are valid keys (kv_rows >= Tk lets a KV cache be
 * used in place). Query t sits at absolute position q_pos0 + t and key j at position j; query at
 * position p sees keys j <= p, and when window > 0 only keys with j > p - window (transformers'
 * sliding window). H must be a multiple of KVH (grouped-query attention: query head h reads
 * KV head h / (H / KVH)). The softmax scale is `scale` (1/sqrt(hd) for every supported model). */
typedef struct nb_attn_dims {
    int64_t B, Tq, Tk, kv_rows;
    int64_t H, KVH, hd;
    int64_t q_pos0;
    int64_t window;
    float scale;
} nb_attn_dims;

/* --- fast float32 ops ------------------------------------------------------------------------- */

/* The row kernels' SIMD level ctx runs: "avx512", "avx2" or "scalar" (the best this CPU has, unless
 * nb_ctx_options.simd or NIBBLE_SIMD=auto|avx512|avx2|scalar chose one; see nb_ctx_new_opts). */
NB_API const char *nb_simd_level(const nb_ctx *ctx);

/* out[i,:] = table[tokens[i],:]. Token ids out of [0, vocab) are NB_ERR_INVALID. */
NB_API nb_status nb_op_embedding_fwd(nb_ctx *ctx, const float *table, int64_t vocab, const int32_t *tokens,
                              int64_t n, int64_t d, float *out);
/* dtable[tokens[i],:] += dy[i,:] */
NB_API nb_status nb_op_embedding_bwd(nb_ctx *ctx, const int32_t *tokens, const float *dy, int64_t n, int64_t d,
                              float *dtable);

/* y = x * rstd * w with rstd[i] = 1/sqrt(mean_j x[i,j]^2 + eps) (HF LlamaRMSNorm). rstd may be NULL.
 * y may alias x. */
NB_API nb_status nb_op_rmsnorm_fwd(nb_ctx *ctx, const float *x, const float *w, float *y, float *rstd,
                            int64_t n, int64_t d, float eps);
/* dx += d(y)/dx^T dy, dw += sum_i dy * x * rstd (dw may be NULL). rstd comes from the forward. */
NB_API nb_status nb_op_rmsnorm_bwd(nb_ctx *ctx, const float *x, const float *w, const float *rstd,
                            const float *dy, float *dx, float *dw, int64_t n, int64_t d);

/* Rotary embedding, HF rotate-half layout, in place on x [n, nh, hd]. Row i uses row (i % T) of
 * the tables cos/sin [T, hd/2]: pair (x[c], x[c + hd/2]) is rotated by the angle of frequency c. */
NB_API nb_status nb_op_rope_fwd(nb_ctx *ctx, float *x, int64_t n, int64_t T, int64_t nh, int64_t hd,
                         const float *cos_t, const float *sin_t);
/* The transpose (inverse rotation), in place on dx: the backward of nb_op_rope_fwd. */
NB_API nb_status nb_op_rope_bwd(nb_ctx *ctx, float *dx, int64_t n, int64_t T, int64_t nh, int64_t hd,
                         const float *cos_t, const float *sin_t);

/* Causal attention (see nb_attn_dims). Writes out [B, Tq, H, hd] and, when lse is not NULL, the
 * log-sum-exp of each scaled score row, [B, H, Tq] (what the backward needs instead of the
 * probabilities). */
NB_API nb_status nb_op_attention_fwd(nb_ctx *ctx, const nb_attn_dims *a, const float *q, const float *k,
                              const float *v, float *out, float *lse);
/* Writes dq [B, Tq, H, hd], dk and dv [B, Tk, KVH, hd] (not accumulated). */
NB_API nb_status nb_op_attention_bwd(nb_ctx *ctx, const nb_attn_dims *a, const float *q, const float *k,
                              const float *v, const float *out, const float *lse, const float *dout,
                              float *dq, float *dk, float *dv);

/* a = silu(g) * u, elementwise over n values. a may alias g or u. */
NB_API nb_status nb_op_swiglu_fwd(nb_ctx *ctx, const float *g, const float *u, float *a, int64_t n);
/* Writes dg and du (they may alias g and u). */
NB_API nb_status nb_op_swiglu_bwd(nb_ctx *ctx, const float *g, const float *u, const float *da,
                           float *dg, float *du, int64_t n);

/* y [n, out] = x [n, in] w^T (+ b), w is [out, in] as in torch.nn.Linear; b may be NULL. */
NB_API nb_status nb_op_linear_fwd(nb_ctx *ctx, const float *x, const float *w, const float *b, float *y,
                           int64_t n, int64_t in, int64_t out);
/* dx (+)= dy w (added when dx_accumulate, else written; dx may be NULL), dw += dy^T x and
 * db += column sums of dy (each may be NULL). */
NB_API nb_status nb_op_linear_bwd(nb_ctx *ctx, const float *x, const float *w, const float *dy, float *dx,
                           int dx_accumulate, float *dw, float *db, int64_t n, int64_t in, int64_t out);

/* Softmax cross-entropy of logits [n, V] against targets [n] (rows whose target equals
 * ignore_index count nothing). Adds the summed loss (natural log) to *loss_sum and the number of
 * counted rows to *count (either may be NULL). When dlogits is not NULL it is written with
 * grad_scale * (softmax - onehot) (zero rows for ignored targets); dlogits may alias logits. */
NB_API nb_status nb_op_cross_entropy(nb_ctx *ctx, const float *logits, const int32_t *targets, int64_t n,
                              int64_t V, int32_t ignore_index, float grad_scale, double *loss_sum,
                              int64_t *count, float *dlogits);

/* --- float64 scalar references (single-threaded, straightforward loops) ------------------------ */

NB_API void nb_ref_embedding_fwd(const double *table, const int32_t *tokens, int64_t n, int64_t d, double *out);
NB_API void nb_ref_embedding_bwd(const int32_t *tokens, const double *dy, int64_t n, int64_t d, double *dtable);
NB_API void nb_ref_rmsnorm_fwd(const double *x, const double *w, double *y, int64_t n, int64_t d, double eps);
NB_API void nb_ref_rmsnorm_bwd(const double *x, const double *w, const double *dy, double *dx, double *dw,
                        int64_t n, int64_t d, double eps);
/* inv_freq has hd/2 entries; row i is at position pos0 + (i % T). */
NB_API void nb_ref_rope_fwd(double *x, int64_t n, int64_t T, int64_t pos0, int64_t nh, int64_t hd,
                     const double *inv_freq);
NB_API void nb_ref_rope_bwd(double *dx, int64_t n, int64_t T, int64_t pos0, int64_t nh, int64_t hd,
                     const double *inv_freq);
NB_API void nb_ref_attention_fwd(const nb_attn_dims *a, const double *q, const double *k, const double *v,
                          double *out);
/* Adds into dq, dk, dv. */
NB_API void nb_ref_attention_bwd(const nb_attn_dims *a, const double *q, const double *k, const double *v,
                          const double *dout, double *dq, double *dk, double *dv);
NB_API void nb_ref_swiglu_fwd(const double *g, const double *u, double *a, int64_t n);
NB_API void nb_ref_swiglu_bwd(const double *g, const double *u, const double *da, double *dg, double *du, int64_t n);
NB_API void nb_ref_linear_fwd(const double *x, const double *w, const double *b, double *y,
                       int64_t n, int64_t in, int64_t out);
NB_API void nb_ref_linear_bwd(const double *x, const double *w, const double *dy, double *dx, double *dw,
                       double *db, int64_t n, int64_t in, int64_t out);
/* Returns the summed loss; adds grad_scale * (softmax - onehot) into dlogits when not NULL. */
NB_API double nb_ref_cross_entropy(const double *logits, const int32_t *targets, int64_t n, int64_t V,
                            int32_t ignore_index, double grad_scale, double *dlogits);

#endif

/* Private definitions shared by the model runtime's files (model.c, transformer.c, load.c, eval.c,
 * ops.c): the nb_model structure, its per-layer activation records and small helpers. */
#ifndef NIBBLE_MODEL_INTERNAL_H
#define NIBBLE_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "nibble/model.h"
#include "nibble/ops.h"

/* ops.c */
void nb_blas_threads(int n);
void nb_gemm(nb_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void nb_bias_add(nb_ctx *ctx, float *y, const float *b, int64_t n, int64_t out);

#include "cpu/simd.h"   /* the SIMD row kernels of the context's backend */

enum { NB_LIN_PER_LAYER = 7 };

typedef struct nb_param_rec {
    char *name;
    nb_tensor *t;               /* view into the flat buffer */
    nb_tensor *g;               /* view into the flat gradient buffer, or NULL */
    int64_t offset;             /* elements from the flat start */
    int64_t numel;
    int32_t ndim;
    int64_t shape[2];
    int32_t requires_grad;
    int32_t src_dtype;
} nb_param_rec;

typedef struct nb_linear {
    int64_t module;             /* module index */
    int32_t layer, role;
    int32_t expert;             /* -1 unless an expert linear */
    int64_t in, out;
    int64_t pw, pb;             /* parameter indices (pb -1 without bias) */
    int32_t has_hook;
    nb_linear_hook hook;
    float *w_eff;               /* the hooked weight of the last forward (weight hook only) */
} nb_linear;

typedef struct nb_layer {
    nb_linear lin[NB_LIN_PER_LAYER];   /* q k v o gate up down */
    int64_t p_attn_norm, p_mlp_norm, p_q_norm, p_k_norm;   /* -1 when absent */
    int64_t window;
    /* mixture of experts (moe set): lin[gate..down] are unused, the router and 3 linears per expert
     * (ex[3e + 0/1/2] = gate, up, down) take their place */
    int32_t moe;
    nb_linear router;
    nb_linear *ex;
} nb_layer;

typedef struct nb_module_rec {
    char *name;
    int32_t kind;
    nb_linear *lin;             /* for NB_MODULE_LINEAR */
} nb_module_rec;

/* One layer's activations for the backward (see transformer.c for who writes what). Pointers into an
 * arena; the x* inputs alias the shared tensor unless that linear has an input hook. */
typedef struct nb_layer_act {
    float *arena;
    size_t arena_floats;
    float *h1, *rstd1;
    float *xbuf[NB_LIN_PER_LAYER];     /* copy buffer for a hooked input (NULL without input hook) */
    float *xin[NB_LIN_PER_LAYER];      /* the input each linear actually saw */
    float *q, *k, *v;                  /* post-norm, post-RoPE */
    float *qpre, *kpre, *rstdq, *rstdk;
    float *att, *lse;
    float *xmid;
    float *h2, *rstd2;
    float *g, *u, *a;                  /* [N][F], or [N*k][Fe] by expert slot in a MoE layer */
    /* MoE layers: router probabilities, each token's top-k (experts, weights, slots) and the
     * per-slot tensors, slots grouped by expert (expert e owns slots offs[e] .. offs[e+1]-1) */
    float *xbr;                        /* hooked router input copy */
    float *probs, *topw;               /* [N][E], [N][k] */
    int32_t *topi, *slot, *tok, *offs; /* [N][k] experts, [N][k] slots, [N*k] slot -> token, [E+1] */
    float *xg, *xbe[3], *y;            /* gathered input [N*k][D], hooked copies, expert outputs [N*k][D] */
} nb_layer_act;

struct nb_kv_cache {
    nb_ctx *ctx;
    int64_t B, max_len, len, n_layers, kv_dim;
    float *k, *v;               /* [n_layers][B][max_len][kv_dim] */
};

struct nb_model {
    nb_ctx *ctx;
    nb_model_config cfg;
    int32_t format;
    char *path;
    /* parameters */
    nb_param_rec *params;
    int64_t n_params, cap_params;
    float *flat, *gflat;
    int64_t flat_numel;
    nb_tensor *flat_t, *gflat_t;
    int64_t p_embed, p_norm;
    /* modules */
    nb_module_rec *modules;
    int64_t n_modules, cap_modules;
    nb_layer *layers;
    nb_linear lm_head;
    double *inv_freq;           /* head_dim/2 effective inverse frequencies (scaling applied) */
    double *rope_ff;            /* GGUF rope_freqs.weight factors (NB_ROPE_FREQ_FACTORS), or NULL */
    int32_t recompute;          /* NB_RECOMPUTE_* */
    int64_t act_budget;         /* bytes, for NB_RECOMPUTE_AUTO */
    int32_t kept_all;           /* the last train forward kept every layer's activations */
    nb_kv_hook kv_hook;         /* K/V hook (kv NULL: none), see nb_model_set_kv_hook */
    /* training state of the last forward(train = 1) */
    int32_t have_train;
    int64_t tB, tT, tstart;
    int32_t *ttokens;
    float *xs;                  /* [n_layers+1][N][D] layer inputs, xs[L] = input of the final norm */
    size_t xs_floats;
    float *hf, *rstdf;          /* final norm output [N][D] and its rstd [N] */
    float *hsel;                /* lm_head input of the selected rows (after its input hook) */
    size_t hf_floats, rstdf_floats, hsel_floats;
    nb_layer_act *acts;         /* 1 record (recompute) or n_layers records */
    int64_t n_acts;
    /* scratch: ws for the forward (RoPE tables first), bws for the backward */
    float *ws, *bws;
    size_t ws_floats, bws_floats;
    float *logit_buf;
    size_t logit_floats;
};

/* model.c */
int nb_model_layer_is_moe(const nb_model_config *c, int64_t l);   /* layer l has the sparse MLP */
nb_status nb_model_alloc_params(nb_ctx *ctx, nb_model *m);   /* builds params + modules from cfg */
void nb_model_compute_inv_freq(nb_model *m);
float *nb_model_pdata(const nb_model *m, int64_t p);         /* NULL for p < 0 */
float *nb_model_gdata(const nb_model *m, int64_t p);         /* NULL for p < 0, no grads or frozen */
/* Grow-only float workspace owned by the model (counted in the model's context); errors go to ctx. */
nb_status nb_grow(nb_model *m, nb_ctx *ctx, float **buf, size_t *have, size_t need);
nb_status nb_model_validate_config(nb_ctx *ctx, const nb_model_config *c);

/* llama_ref.c: the whole model in double precision from scalar reference ops, for the tests.
 * params is a double copy of the flat parameter buffer (same offsets); grads uses the same layout
 * and is accumulated into. */
void nb_ref_model_forward(const nb_model *m, const double *params, const int32_t *tokens, int64_t B, int64_t T,
                          double *logits);
void nb_ref_model_backward(const nb_model *m, const double *params, const int32_t *tokens, int64_t B, int64_t T,
                           const double *dlogits, double *grads);

#endif

/* Llama-family causal language models on the CPU: loading (Hugging Face directories and GGUF files),
 * a tree of named modules with HF names, float32 master parameters with matching gradients, batched
 * forward and backward (recomputed per layer so activation memory stays bounded), linear-layer
 * quantization hooks, a KV cache for decoding (nibble/generate.h) and perplexity / KL evaluation.
 * Architectures: llama (Llama 2/3/3.x, TinyLlama, SmolLM, llama2.c), mistral, qwen2, qwen3, and the
 * mixtures of experts mixtral and qwen3_moe (HF directories). */
#ifndef NIBBLE_MODEL_H
#define NIBBLE_MODEL_H

#include <stdint.h>
#include "nibble/ctx.h"
#include "nibble/tensor.h"

typedef struct nb_model nb_model;
typedef struct nb_kv_cache nb_kv_cache;

typedef enum nb_arch {
    NB_ARCH_LLAMA = 0,
    NB_ARCH_MISTRAL = 1,
    NB_ARCH_QWEN2 = 2,
    NB_ARCH_QWEN3 = 3,
    NB_ARCH_MIXTRAL = 4,       /* MixtralForCausalLM: llama attention, block_sparse_moe */
    NB_ARCH_QWEN3_MOE = 5      /* Qwen3MoeForCausalLM: qwen3 attention, mlp.gate + mlp.experts */
} nb_arch;

typedef enum nb_rope_kind {
    NB_ROPE_DEFAULT = 0,       /* inv_freq = theta^(-2i/hd) */
    NB_ROPE_LINEAR = 1,        /* inv_freq / factor */
    NB_ROPE_LLAMA3 = 2,        /* Llama 3.1 frequency-dependent scaling (factor, low/high_freq_factor) */
    NB_ROPE_FREQ_FACTORS = 3   /* inv_freq / f_i from a GGUF rope_freqs.weight tensor */
} nb_rope_kind;

typedef enum nb_model_format {
    NB_MODEL_MEMORY = 0,       /* built with nb_model_new */
    NB_MODEL_HF = 1,           /* config.json + safetensors */
    NB_MODEL_GGUF = 2
} nb_model_format;

enum { NB_MODEL_MAX_EOS = 8 };

typedef struct nb_model_config {
    int32_t arch;                       /* nb_arch */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t n_layers;
    int64_t n_heads;
    int64_t n_kv_heads;
    int64_t head_dim;
    int64_t max_position;               /* max_position_embeddings (informational) */
    double rms_eps;
    double rope_theta;
    int32_t rope_kind;                  /* nb_rope_kind */
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_original_max_position;
    int32_t qkv_bias;                   /* q/k/v projections have a bias (qwen2, attention_bias) */
    int32_t o_bias;                     /* o_proj has a bias (attention_bias in llama and qwen3) */
    int32_t mlp_bias;                   /* gate/up/down have biases (llama mlp_bias) */
    int32_t qk_norm;                    /* per-head RMSNorm of q and k before RoPE (qwen3) */
    int32_t tied;                       /* lm_head shares model.embed_tokens.weight */
    int64_t sliding_window;             /* 0: full causal attention; W: keys j > p - W only */
    int32_t bos_token_id;               /* -1 if none */
    int32_t n_eos;
    int32_t eos_token_ids[NB_MODEL_MAX_EOS];
    /* Mixture of experts (n_experts > 0): the MLP of a sparse layer is a router (a linear D -> E,
     * softmax, top n_experts_per_tok, renormalised when norm_topk_prob) over E SwiGLU experts of width
     * moe_intermediate_size; layer l is sparse when (l + 1) % decoder_sparse_step == 0 and bit l of
     * mlp_only_layers is clear (qwen3_moe); the other layers keep the dense MLP of intermediate_size. */
    int32_t n_experts;                  /* 0: every layer dense */
    int32_t n_experts_per_tok;
    int32_t norm_topk_prob;
    int64_t moe_intermediate_size;
    int32_t decoder_sparse_step;        /* 0 is read as 1 */
    uint64_t mlp_only_layers[4];        /* bit l: layer l < 256 keeps the dense MLP */
} nb_model_config;

typedef enum nb_module_kind {
    NB_MODULE_CONTAINER = 0,            /* model, model.layers.N, ...self_attn, ...mlp */
    NB_MODULE_EMBEDDING = 1,
    NB_MODULE_LINEAR = 2,
    NB_MODULE_RMSNORM = 3
} nb_module_kind;

typedef enum nb_linear_role {
    NB_LINEAR_Q = 0, NB_LINEAR_K = 1, NB_LINEAR_V = 2, NB_LINEAR_O = 3,
    NB_LINEAR_GATE = 4, NB_LINEAR_UP = 5, NB_LINEAR_DOWN = 6, NB_LINEAR_LM_HEAD = 7,
    NB_LINEAR_ROUTER = 8,               /* block_sparse_moe.gate / mlp.gate: hidden -> expert logits */
    NB_LINEAR_EXPERT_GATE = 9,          /* experts.E.w1 / gate_proj */
    NB_LINEAR_EXPERT_UP = 10,           /* experts.E.w3 / up_proj */
    NB_LINEAR_EXPERT_DOWN = 11          /* experts.E.w2 / down_proj */
} nb_linear_role;

typedef struct nb_linear_info {
    int64_t in_features;
    int64_t out_features;
    int32_t layer;                      /* -1 for lm_head */
    int32_t role;                       /* nb_linear_role */
    int32_t has_bias;
    int32_t tied;                       /* lm_head whose weight is model.embed_tokens.weight */
    int64_t weight_param;               /* parameter index of the weight */
    int64_t bias_param;                 /* parameter index of the bias, or -1 */
    int32_t expert;                     /* expert index of an expert linear, else -1 */
} nb_linear_info;

/* Passes reported to input hooks: the normal forward, or the recomputation of a layer during the
 * backward (observers should ignore NB_PASS_RECOMPUTE; fake-quantizers treat both alike). */
enum { NB_PASS_FORWARD = 0, NB_PASS_RECOMPUTE = 1 };

/* A quantization hook on one linear module. `weight` (may be NULL) writes the weight to use in the
 * forward (e.g. fake-quantized) from the fp32 master weight [rows = out_features, cols =
 * in_features]; it is called once per nb_model_forward and the result is kept for the backward.
 * `input` (may be NULL) observes and/or modifies in place the activations entering the linear
 * [rows = tokens, cols = in_features]. The backward is straight-through: weight gradients computed
 * against the hooked weight go to the master weight, and input gradients pass through unchanged. */
typedef struct nb_linear_hook {
    void *user;
    nb_status (*weight)(nb_ctx *ctx, void *user, const float *w, float *w_out, int64_t rows, int64_t cols);
    nb_status (*input)(nb_ctx *ctx, void *user, float *x, int64_t rows, int64_t cols, int32_t pass);
} nb_linear_hook;

/* A hook on the keys and values of every attention layer: called once per layer and forward (and
 * again, with NB_PASS_RECOMPUTE, when the backward recomputes the layer) with k and v as the attention
 * and the KV cache get them: after the projections' biases, the q/k norm and RoPE (the tensors
 * ModelOpt's k_bmm_quantizer / v_bmm_quantizer see). k and v are [rows = tokens, cols = n_kv_heads *
 * head_dim]; the hook observes them (calibration) and/or modifies them in place (KV cache fake
 * quant). Decoding with an nb_kv_cache stores the hooked values. The backward is straight-through. */
typedef struct nb_kv_hook {
    void *user;
    nb_status (*kv)(nb_ctx *ctx, void *user, int64_t layer, float *k, float *v, int64_t rows, int64_t cols,
                    int32_t pass);
} nb_kv_hook;

/* --- creating and loading -------------------------------------------------------------------- */

/* Fill *cfg with a small valid llama config (the caller then edits fields). */
NB_API void nb_model_config_init(nb_model_config *cfg);
/* A model with the given config and all parameters zero (RMSNorm weights one). */
NB_API nb_status nb_model_new(nb_ctx *ctx, const nb_model_config *cfg, nb_model **out);
/* Normal(0, std) weights and biases, RMSNorm weights 1 + Normal(0, std), from `seed`. */
NB_API nb_status nb_model_init_random(nb_ctx *ctx, nb_model *m, uint64_t seed, double std);
/* Load a Hugging Face directory (config.json + model.safetensors or a sharded index) or a .gguf
 * file. Weights become float32 once, here. Unsupported architectures or config values, missing or
 * misshapen tensors and configs that disagree with the weights fail with a message naming them. */
NB_API nb_status nb_model_load(nb_ctx *ctx, const char *path, nb_model **out);
/* NB_ERR_FORMAT, naming it, when path (a folder, or a file in one) is an export's unfinished staging
 * folder (OUT.nibble-tmp-PID/, with its INCOMPLETE note) or that folder's export/ subfolder; NB_OK
 * otherwise. nb_model_load and nb_model_read_config check it; file readers (nibble inspect) ask. */
NB_API nb_status nb_model_check_finished(nb_ctx *ctx, const char *path);
NB_API void nb_model_free(nb_model *m);
/* The config of the model at path (what nb_model_load would build) from config.json and the safetensors
 * headers, or the GGUF metadata and tensor table, without reading any weight: for listing modules
 * (nibble plan). `tied` comes from the files as nb_model_load decides it; the weights' shapes are not
 * checked (nb_model_load does that). */
NB_API nb_status nb_model_read_config(nb_ctx *ctx, const char *path, nb_model_config *cfg);

NB_API const nb_model_config *nb_model_get_config(const nb_model *m);
NB_API int32_t nb_model_format_of(const nb_model *m);          /* nb_model_format */
NB_API const char *nb_model_path(const nb_model *m);            /* "" for NB_MODEL_MEMORY */
NB_API const char *nb_model_arch_name(const nb_model *m);       /* "llama", ..., "mixtral", "qwen3_moe" */

/* --- parameters (HF names, float32 views; gradients in matching tensors) ---------------------- */

NB_API int64_t nb_model_param_count(const nb_model *m);
NB_API const char *nb_model_param_name(const nb_model *m, int64_t i);
/* Index by HF name, or -1. With tied embeddings "lm_head.weight" finds model.embed_tokens.weight. */
NB_API int64_t nb_model_find_param(const nb_model *m, const char *name);
NB_API nb_tensor *nb_model_param(const nb_model *m, int64_t i);          /* borrowed; writable */
NB_API nb_tensor *nb_model_grad(const nb_model *m, int64_t i);           /* borrowed; NULL before gradients exist */
/* dtype the file stored (NB_F32, NB_BF16, NB_F16), or -1 when a quantized GGUF tensor was dequantized. */
NB_API int32_t nb_model_param_src_dtype(const nb_model *m, int64_t i);
/* All parameters live in one contiguous float32 buffer (and the gradients in another with the
 * same layout): element offset of parameter i, and views of the whole buffers. */
NB_API int64_t nb_model_param_offset(const nb_model *m, int64_t i);
NB_API nb_tensor *nb_model_flat_params(const nb_model *m);               /* borrowed */
NB_API nb_tensor *nb_model_flat_grads(const nb_model *m);                /* borrowed; NULL before gradients exist */
NB_API nb_status nb_model_alloc_grads(nb_ctx *ctx, nb_model *m);         /* zeroed; the backward calls it */
NB_API void nb_model_zero_grad(nb_model *m);
/* Freeze or unfreeze every parameter whose name matches the glob; returns how many matched. */
NB_API int64_t nb_model_set_requires_grad(nb_model *m, const char *pattern, int32_t requires_grad);
NB_API int32_t nb_model_param_requires_grad(const nb_model *m, int64_t i);

/* --- modules ----------------------------------------------------------------------------------- */

NB_API int64_t nb_model_module_count(const nb_model *m);
NB_API const char *nb_model_module_name(const nb_model *m, int64_t i);
NB_API int32_t nb_model_module_kind(const nb_model *m, int64_t i);       /* nb_module_kind */
NB_API int64_t nb_model_find_module(const nb_model *m, const char *name); /* -1 if absent */
/* fnmatch-style glob without path semantics: '*' (any run, dots included), '?', '[...]', '\'. */
NB_API int nb_glob_match(const char *pattern, const char *name);
NB_API nb_status nb_model_linear_info(nb_ctx *ctx, const nb_model *m, int64_t module, nb_linear_info *out);
/* Install (copied) or clear (hook NULL) the hook of a linear module. */
NB_API nb_status nb_model_set_linear_hook(nb_ctx *ctx, nb_model *m, int64_t module, const nb_linear_hook *hook);
/* Install (copied) or clear (hook NULL, or hook->kv NULL) the model's K/V hook; off by default, and
 * costs nothing when off. */
NB_API nb_status nb_model_set_kv_hook(nb_ctx *ctx, nb_model *m, const nb_kv_hook *hook);

/* --- forward ----------------------------------------------------------------------------------- */

/* Receives `nrows` rows of logits, [nrows, vocab], starting at row `row0` of the selected rows. */
typedef nb_status (*nb_logits_fn)(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab,
                                  float *logits);

typedef struct nb_forward_opts {
    float *logits;              /* NULL or [rows, vocab] for the selected rows */
    int64_t logits_start;       /* rows are positions t in [logits_start, T) of each sequence, b-major;
                                   0 = all positions, T-1 = only the last one */
    nb_logits_fn on_logits;     /* NULL or called once per chunk of selected rows, in order */
    void *user;
    int64_t chunk_rows;         /* rows per logits chunk; 0 = about 32 MiB of logits */
    float **hidden;             /* NULL or n_layers+1 pointers, each NULL or [B*T, hidden]: hidden[l] is
                                   the input of layer l, hidden[n_layers] the final-norm output (HF
                                   output_hidden_states) */
    int32_t train;              /* keep what nb_model_backward needs */
    nb_kv_cache *cache;         /* NULL, or decode incrementally against this cache (not with train) */
} nb_forward_opts;

/* tokens is [B, T]. Positions are 0..T-1 (after the cache's length when decoding with a cache). */
NB_API nb_status nb_model_forward(nb_ctx *ctx, nb_model *m, const int32_t *tokens, int64_t B, int64_t T,
                           const nb_forward_opts *opts);
/* Shorthand: all logits, [B*T, vocab]. */
NB_API nb_status nb_model_logits(nb_ctx *ctx, nb_model *m, const int32_t *tokens, int64_t B, int64_t T, float *logits);

/* Where the backward gets each layer's activations. ALWAYS: recomputed one layer at a time from the
 * saved layer inputs (memory: one layer's activations plus the inputs of all layers). NEVER: every
 * layer's activations are kept from the forward (no recomputation, more memory). AUTO (the default):
 * kept when they fit in the activation budget, recomputed otherwise. */
enum { NB_RECOMPUTE_NEVER = 0, NB_RECOMPUTE_ALWAYS = 1, NB_RECOMPUTE_AUTO = 2 };
NB_API void nb_model_set_recompute(nb_model *m, int32_t mode);
/* AUTO's limit on kept activations, in bytes (default 1 GiB). */
NB_API void nb_model_set_activation_budget(nb_model *m, int64_t bytes);

/* --- backward ---------------------------------------------------------------------------------- */

/* Given logits [nrows, vocab] (rows row0.. of the selected rows), replace them in place with
 * dLoss/dlogits and add this chunk's loss to *loss. */
typedef nb_status (*nb_loss_fn)(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab,
                                float *logits, double *loss);

typedef struct nb_backward_opts {
    const float *dlogits;       /* [rows, vocab] for the forward's selected rows, or NULL */
    nb_loss_fn loss;            /* or NULL; used when dlogits is NULL: logits are recomputed per chunk */
    void *user;
    const float **dhidden;      /* NULL or n_layers+1 entries (each NULL or [B*T, hidden]): gradients
                                   w.r.t. the hidden states nb_forward_opts.hidden describes */
} nb_backward_opts;

/* Accumulates the gradients of every parameter that requires grad, for the last forward that was
 * run with train = 1 (one backward per such forward; setting a hook in between voids it). Gradients
 * are allocated (zeroed) on first use. *loss_out (may be NULL) receives the sum the loss callback
 * reported. */
NB_API nb_status nb_model_backward(nb_ctx *ctx, nb_model *m, const nb_backward_opts *opts, double *loss_out);

/* Cross-entropy as an nb_loss_fn: user points at an nb_lm_loss; targets are indexed by selected row. */
typedef struct nb_lm_loss {
    const int32_t *targets;
    int32_t ignore_index;
    float grad_scale;           /* usually 1 / number of counted targets */
    double loss_sum;            /* accumulated */
    int64_t count;              /* accumulated */
} nb_lm_loss;
NB_API nb_status nb_lm_loss_fn(nb_ctx *ctx, void *user, int64_t row0, int64_t nrows, int64_t vocab, float *logits,
                        double *loss);

/* One language-modelling step: forward (train) and backward of the mean next-token cross-entropy.
 * targets [B*T] (ignore_index -100 skips a position) or NULL for tokens shifted by one with the last
 * position of each sequence ignored. Gradients accumulate; *mean_loss gets the mean loss. */
NB_API nb_status nb_model_lm_step(nb_ctx *ctx, nb_model *m, const int32_t *tokens, int64_t B, int64_t T,
                           const int32_t *targets, double *mean_loss);

/* --- KV cache and generation ------------------------------------------------------------------- */

NB_API nb_status nb_kv_cache_new(nb_ctx *ctx, const nb_model *m, int64_t B, int64_t max_len, nb_kv_cache **out);
NB_API void nb_kv_cache_free(nb_kv_cache *c);
NB_API int64_t nb_kv_cache_len(const nb_kv_cache *c);
NB_API void nb_kv_cache_reset(nb_kv_cache *c);

/* Sampling and generation (nb_model_generate): nibble/generate.h. */

/* --- evaluation -------------------------------------------------------------------------------- */

typedef struct nb_eval_opts {
    int64_t n_ctx;              /* chunk length (llama-perplexity -c); default 512 when 0 */
    int64_t n_chunks;           /* <= 0: every whole chunk of the text */
    int64_t batch;              /* chunks per forward; 0 = automatic */
    int32_t bos;                /* token put in the first slot of each chunk; -1 = the model's BOS,
                                   -2 = keep the text's own first token */
    /* NULL or called after each forward batch with the chunks scored so far and their total (a
       progress line for evals that take minutes); a status other than NB_OK stops the eval with it */
    nb_status (*on_chunks)(nb_ctx *ctx, void *user, int64_t done, int64_t total);
    void *user;
} nb_eval_opts;

typedef struct nb_eval_result {
    double ppl;                 /* exp(nll) */
    double ppl_err;             /* llama.cpp's +/- estimate */
    double nll;                 /* mean negative log-likelihood (nats) over the scored tokens */
    int64_t tokens;             /* scored tokens */
    int64_t chunks;
    double kld_mean;            /* mean KL(teacher || model) per token (nats); NAN without a teacher */
    double top1_agree;          /* percent of scored positions where both argmaxes agree; NAN without */
} nb_eval_result;

/* Perplexity as llama.cpp's llama-perplexity computes it: chunks of n_ctx tokens of the stream, the
 * first slot of each replaced by BOS, only the second half of each chunk scored (positions
 * n_ctx/2 .. n_ctx-2 predicting the next token). With a teacher (same vocab), also the KL divergence
 * and top-1 agreement at the same positions. */
NB_API nb_status nb_model_eval(nb_ctx *ctx, nb_model *m, nb_model *teacher, const int32_t *tokens, int64_t n_tokens,
                        const nb_eval_opts *opts, nb_eval_result *out);

#endif

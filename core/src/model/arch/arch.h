/* Architecture families: what differs between Llama, Mistral, Qwen2, Qwen3, Mixtral and Qwen3-MoE,
 * one file each (their config.json fields, which linears carry biases, q/k RMSNorm, sliding windows,
 * the experts' names, the GGUF layout), described by one row per family. Everything else is shared: the fields every family has
 * (model/load.c), the module and parameter names (model/model.c) and the transformer block, RoPE
 * and norms that the flags set here switch on (model/transformer.c). Adding a family of this shape
 * is adding a file and a row. */
#ifndef NIBBLE_MODEL_ARCH_H
#define NIBBLE_MODEL_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "nibble/gguf.h"
#include "nibble/model.h"

/* Reading config.json: the first error is kept in err (later reads return their default). */
typedef struct nb_cfg_reader {
    nb_ctx *ctx;
    const char *path;
    cJSON *root;
    nb_status err;
} nb_cfg_reader;

const cJSON *nb_cfg_get(const cJSON *o, const char *k);   /* NULL when absent or null */
/* An integer field in [INT32_MIN, INT32_MAX]: required (fails when absent) or defaulted. */
int64_t nb_cfg_int(nb_cfg_reader *c, const cJSON *o, const char *k, int required, int64_t dflt);
double nb_cfg_num(nb_cfg_reader *c, const cJSON *o, const char *k, double dflt);
int nb_cfg_bool(nb_cfg_reader *c, const cJSON *o, const char *k, int dflt);
const char *nb_cfg_str(const cJSON *o, const char *k);    /* NULL when absent or not a string */

typedef struct nb_arch_family {
    int32_t arch;                  /* nb_arch */
    const char *name;              /* config.json model_type, GGUF general.architecture, nb_model_arch_name */
    const char *hf_class;          /* its entry in config.json's architectures */
    int32_t gguf;                  /* GGUF files of this family are read (llama.cpp writes Mistral as llama) */
    int32_t gguf_interleaved_qk;   /* GGUF q/k rows in llama.cpp's interleaved RoPE order: permuted back */
    /* The family's own fields of config.json, read after the shared ones: biases, q/k norm, windows.
     * Errors of a field go to c->err; a returned status other than NB_OK ends the parse with it. */
    nb_status (*hf_config)(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg);
    /* The family's settings from a GGUF file (its tensor table says which biases exist). */
    void (*gguf_config)(nb_gguf *g, nb_model_config *cfg);
    /* Mixtures of experts: the sparse MLP's module under model.layers.N ("block_sparse_moe", "mlp")
     * and each expert's linears in role order gate, up, down (NULL for dense families). */
    const char *moe_block;
    const char *expert_names[3];
} nb_arch_family;

extern const nb_arch_family nb_arch_llama, nb_arch_mistral, nb_arch_qwen2, nb_arch_qwen3, nb_arch_mixtral,
    nb_arch_qwen3_moe;

const nb_arch_family *nb_arch_family_of(int32_t arch);        /* NULL when not a known nb_arch */
const nb_arch_family *nb_arch_family_named(const char *name); /* NULL when unknown */
/* "llama, mistral, qwen2, qwen3" into buf: every family, or (gguf) those read from GGUF files. */
void nb_arch_names(char *buf, size_t cap, int gguf);

/* qwen2.c: Qwen2 and Qwen3's sliding windows (use_sliding_window, per layer_types). */
nb_status nb_arch_qwen_windows(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg);
/* qwen3.c: Qwen3's attention fields (shared by qwen3_moe). */
nb_status nb_arch_qwen3_attention(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg);
/* mixtral.c: the experts' fields every MoE family has (count, top-k), range-checked. */
nb_status nb_arch_moe_common(nb_cfg_reader *c, const cJSON *o, const char *count_key, nb_model_config *cfg);

#endif

/* Llama (LlamaForCausalLM, and GGUF `llama`): attention_bias puts biases on q, k, v and o, mlp_bias on
 * the MLP; no sliding window. llama.cpp stores q/k rows interleaved for its RoPE. */
#include "model/arch/arch.h"

static nb_status hf_config(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    int attn_bias = nb_cfg_bool(c, o, "attention_bias", 0);
    cfg->mlp_bias = nb_cfg_bool(c, o, "mlp_bias", 0);
    cfg->qkv_bias = cfg->o_bias = attn_bias;
    (void)nb_cfg_int(c, o, "sliding_window", 0, 0);   /* validated as an integer, not used */
    return NB_OK;
}

static void gguf_config(nb_gguf *g, nb_model_config *cfg) {
    if (nb_gguf_find_tensor(g, "blk.0.attn_q.bias") >= 0) cfg->qkv_bias = 1;
    if (nb_gguf_find_tensor(g, "blk.0.attn_output.bias") >= 0) cfg->o_bias = 1;
}

const nb_arch_family nb_arch_llama = {NB_ARCH_LLAMA, "llama", "LlamaForCausalLM", 1, 1, hf_config, gguf_config,
                                       NULL, {NULL, NULL, NULL}};

/* Qwen3 (Qwen3ForCausalLM, GGUF `qwen3`): an RMSNorm over each head of q and k before RoPE
 * (q_norm, k_norm); attention_bias on q, k, v and o; Qwen2's sliding-window rule. */
#include "model/arch/arch.h"

nb_status nb_arch_qwen3_attention(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    int attn_bias = nb_cfg_bool(c, o, "attention_bias", 0);
    cfg->qkv_bias = cfg->o_bias = attn_bias;
    cfg->qk_norm = 1;
    return nb_arch_qwen_windows(c, o, cfg);
}

static nb_status hf_config(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    return nb_arch_qwen3_attention(c, o, cfg);
}

static void gguf_config(nb_gguf *g, nb_model_config *cfg) {
    cfg->qk_norm = 1;
    if (nb_gguf_find_tensor(g, "blk.0.attn_output.bias") >= 0) cfg->o_bias = 1;
}

const nb_arch_family nb_arch_qwen3 = {NB_ARCH_QWEN3, "qwen3", "Qwen3ForCausalLM", 1, 0, hf_config, gguf_config,
                                       NULL, {NULL, NULL, NULL}};

/* Mixtral (MixtralForCausalLM): Mistral's attention (no biases, sliding_window in every layer) with a
 * mixture of experts in every layer: block_sparse_moe.gate routes each token to its top
 * num_experts_per_tok of num_local_experts SwiGLU experts (experts.E.w1 gate, w3 up, w2 down, of width
 * intermediate_size), the top-k probabilities always renormalised. Also the experts' fields every MoE
 * family shares. */
#include "model/arch/arch.h"

nb_status nb_arch_moe_common(nb_cfg_reader *c, const cJSON *o, const char *count_key, nb_model_config *cfg) {
    cfg->n_experts = (int32_t)nb_cfg_int(c, o, count_key, 1, 0);
    cfg->n_experts_per_tok = (int32_t)nb_cfg_int(c, o, "num_experts_per_tok", 1, 0);
    if (c->err) return c->err;
    if (cfg->n_experts <= 0 || cfg->n_experts_per_tok <= 0 || cfg->n_experts_per_tok > cfg->n_experts)
        return nb_fail(c->ctx, NB_ERR_FORMAT, "%s: num_experts_per_tok %d must be in [1, %s = %d]", c->path,
                       (int)cfg->n_experts_per_tok, count_key, (int)cfg->n_experts);
    return NB_OK;
}

static nb_status hf_config(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    (void)nb_cfg_bool(c, o, "attention_bias", 0);
    cfg->sliding_window = nb_cfg_int(c, o, "sliding_window", 0, 0);
    nb_status s = nb_arch_moe_common(c, o, "num_local_experts", cfg);
    if (s) return s;
    cfg->norm_topk_prob = 1;
    cfg->moe_intermediate_size = cfg->intermediate_size;
    cfg->decoder_sparse_step = 1;
    return c->err;
}

const nb_arch_family nb_arch_mixtral = {NB_ARCH_MIXTRAL, "mixtral", "MixtralForCausalLM", 0, 0, hf_config, NULL,
                                        "block_sparse_moe", {"w1", "w3", "w2"}};

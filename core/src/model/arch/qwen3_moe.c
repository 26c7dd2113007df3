/* Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k norm, attention_bias, windows) with
 * mlp.gate routing each token to its top num_experts_per_tok of num_experts SwiGLU experts
 * (mlp.experts.E.gate_proj / up_proj / down_proj, of width moe_intermediate_size), renormalised when
 * norm_topk_prob; only layers with (l + 1) % decoder_sparse_step == 0 outside mlp_only_layers are
 * sparse, the others keep a dense mlp of intermediate_size. */
#include "model/arch/arch.h"

static nb_status hf_config(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    nb_status s = nb_arch_qwen3_attention(c, o, cfg);
    if (s) return s;
    /* transformers 5 writes num_local_experts, earlier versions num_experts */
    if ((s = nb_arch_moe_common(c, o, nb_cfg_get(o, "num_experts") ? "num_experts" : "num_local_experts", cfg))) return s;
    cfg->norm_topk_prob = nb_cfg_bool(c, o, "norm_topk_prob", 0);
    cfg->moe_intermediate_size = nb_cfg_int(c, o, "moe_intermediate_size", 1, 0);
    cfg->decoder_sparse_step = (int32_t)nb_cfg_int(c, o, "decoder_sparse_step", 0, 1);
    if (c->err) return c->err;
    if (cfg->decoder_sparse_step <= 0)
        return nb_fail(c->ctx, NB_ERR_FORMAT, "%s: decoder_sparse_step must be positive", c->path);
    const cJSON *only = nb_cfg_get(o, "mlp_only_layers");
    if (only && !cJSON_IsArray(only)) return nb_fail(c->ctx, NB_ERR_FORMAT, "%s: mlp_only_layers must be a list", c->path);
    const cJSON *e;
    cJSON_ArrayForEach(e, only) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= 256 || e->valuedouble != (int)e->valuedouble)
            return nb_fail(c->ctx, NB_ERR_UNSUPPORTED, "%s: mlp_only_layers entries must be layer indices below 256",
                           c->path);
        int l = (int)e->valuedouble;
        cfg->mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    return NB_OK;
}

const nb_arch_family nb_arch_qwen3_moe = {NB_ARCH_QWEN3_MOE, "qwen3_moe", "Qwen3MoeForCausalLM", 0, 0, hf_config,
                                          NULL, "mlp", {"gate_proj", "up_proj", "down_proj"}};

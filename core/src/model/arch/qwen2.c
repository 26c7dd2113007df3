/* Qwen2 (Qwen2ForCausalLM, GGUF `qwen2`): biases on q, k and v always, none on o or the MLP; sliding
 * windows only when layer_types asks (every layer or none). The window rule is Qwen3's too. */
#include <string.h>

#include "model/arch/arch.h"

nb_status nb_arch_qwen_windows(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    int64_t sw = nb_cfg_int(c, o, "sliding_window", 0, 0);
    const cJSON *lt = nb_cfg_get(o, "layer_types");
    int n_sliding = 0, n = 0;
    const cJSON *e;
    if (lt && cJSON_IsArray(lt)) {
        cJSON_ArrayForEach(e, lt) {
            n++;
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention")) n_sliding++;
            else if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
                return nb_fail(c->ctx, NB_ERR_UNSUPPORTED, "%s: layer_types entry '%s' is not supported", c->path,
                               cJSON_IsString(e) ? e->valuestring : "?");
        }
    } else if (nb_cfg_bool(c, o, "use_sliding_window", 0)) {
        return nb_fail(c->ctx, NB_ERR_UNSUPPORTED, "%s: use_sliding_window without layer_types is not supported", c->path);
    }
    if (n_sliding && n_sliding != n)
        return nb_fail(c->ctx, NB_ERR_UNSUPPORTED,
                       "%s: layer_types mixes sliding_attention and full_attention layers (not supported)", c->path);
    cfg->sliding_window = n_sliding ? sw : 0;
    return NB_OK;
}

static nb_status hf_config(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    (void)nb_cfg_bool(c, o, "attention_bias", 0);
    cfg->qkv_bias = 1;
    cfg->o_bias = 0;
    return nb_arch_qwen_windows(c, o, cfg);
}

static void gguf_config(nb_gguf *g, nb_model_config *cfg) {
    (void)g;
    cfg->qkv_bias = 1;
}

const nb_arch_family nb_arch_qwen2 = {NB_ARCH_QWEN2, "qwen2", "Qwen2ForCausalLM", 1, 0, hf_config, gguf_config,
                                       NULL, {NULL, NULL, NULL}};

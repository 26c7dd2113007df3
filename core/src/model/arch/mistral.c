/* Mistral (MistralForCausalLM): no biases (attention_bias is read and ignored, as transformers does),
 * sliding_window applied in every layer. GGUF files of Mistral models say `llama` and load as Llama. */
#include "model/arch/arch.h"

static nb_status hf_config(nb_cfg_reader *c, const cJSON *o, nb_model_config *cfg) {
    (void)nb_cfg_bool(c, o, "attention_bias", 0);
    cfg->sliding_window = nb_cfg_int(c, o, "sliding_window", 0, 0);
    return NB_OK;
}

const nb_arch_family nb_arch_mistral = {NB_ARCH_MISTRAL, "mistral", "MistralForCausalLM", 0, 0, hf_config, NULL,
                                       NULL, {NULL, NULL, NULL}};

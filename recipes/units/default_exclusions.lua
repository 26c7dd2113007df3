-- Modules nibble never quantizes unless a later rule asks for them by name: the output head,
-- MoE routers and gates (ModelOpt's default_disabled_quantizers unit). Embeddings and norms have
-- no quantizer at all. Rules from a unit never fail for matching nothing (a dense model has no router).
return {
  quantize = {
    { "*lm_head*", false, reason = "lm_head (default exclusion; quantize it with an explicit rule)" },
    { "*router*", false, reason = "MoE router (default exclusion)" },
    { "*mlp.gate", false, reason = "MoE gate (default exclusion)" },
    { "*block_sparse_moe.gate*", false, reason = "MoE gate (default exclusion)" },
    { "*output_layer*", false, reason = "output layer (default exclusion)" },
  },
}

-- Every linear layer in mxfp8, then the default exclusions (lm_head, routers, MoE gates).
-- Recipes that extend this unit add their own rules after these; the last match wins.
return {
  quantize = recipe.with_default_exclusions { { "*", "mxfp8" } },
  algorithm = "max",
}

-- Every linear layer in nvfp4_4o6, then the default exclusions (lm_head, routers, MoE gates).
-- Recipes that extend this unit add their own rules after these; the last match wins.
return {
  quantize = recipe.with_default_exclusions { { "*", "nvfp4_4o6" } },
  algorithm = "four_over_six",
}

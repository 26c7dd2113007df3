-- Every linear layer in nvfp4_4o6_a4 (W4A4: four_over_six weights, dynamic NVFP4 inputs), then the
-- default exclusions (lm_head, routers, MoE gates).
-- Recipes that extend this unit add their own rules after these; the last match wins.
return {
  quantize = recipe.with_default_exclusions { { "*", "nvfp4_4o6_a4" } },
  algorithm = "four_over_six",
}

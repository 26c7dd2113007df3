-- Every linear layer in fp8, then the default exclusions (lm_head, routers, MoE gates).
-- Recipes that extend this unit add their own rules after these; the last match wins.
return {
  quantize = recipe.with_default_exclusions { { "*", "fp8" } },
  algorithm = "max",
}

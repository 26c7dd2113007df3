-- FP8 KV cache (ModelOpt's FP8_KV_CFG): the keys (after RoPE) and values every attention layer caches
-- are FP8 E4M3 with one calibrated scale per layer each, exported as k_scale / v_scale = amax / 448
-- (kv_cache_quant_algo "FP8"; compressed-tensors: kv_cache_scheme). Compose it with a weight unit:
--   extends = { "units/nvfp4", "units/kv_fp8" }      (needs calibration data: it observes K and V)
return {
  kv_cache = "fp8",
}

-- Post-training quantization as a recipe: the same run as `nibble quantize`.
--   nibble run recipes/ptq.lua model=PATH out=DIR [format=nvfp4_w4a16] [algorithm=max|mse|four_over_six]
--       [calib=FILE] [samples=512] [seq_len=512] [seed=1] [layout=modelopt|compressed-tensors] [kv_cache=fp8]
--   nibble plan recipes/ptq.lua model=PATH        (what would be quantized, and why not)
-- Formats: nvfp4_w4a16, nvfp4 (W4A4: needs calib), nvfp4_static, nvfp4_4o6, nvfp4_4o6_a4 (W4A4), mxfp8, fp8 (W8A8: needs
-- calib), fp8_per_channel. The unit recipes/units/<format>.lua quantizes every linear layer and keeps
-- the default exclusions (lm_head, routers, MoE gates); layers whose width the block does not divide
-- stay unquantized with that reason. kv_cache=fp8 adds an FP8 KV cache (units/kv_fp8: k_scale / v_scale per
-- layer, calibrated, so it needs calib too).
local nibble = nibble or require("nibble")
local recipe = nibble.recipe
local format = recipe.check_preset(arg.format or "nvfp4_w4a16", "ptq.lua")

return nibble.recipe {
  extends = "units/" .. format,
  model = { path = arg.model },
  algorithm = arg.algorithm,          -- nil: the unit's (max; four_over_six for nvfp4_4o6)
  calibration = {
    data = arg.calib,                 -- nil: weight-only formats need no data
    samples = tonumber(arg.samples or 512),
    seq_len = tonumber(arg.seq_len or 512),
    batch = tonumber(arg.batch or 4),
    random_offset = true,
    seed = tonumber(arg.seed or 1),
  },
  export = { dir = arg.out, layout = arg.layout or "modelopt" },
  allow_uncalibrated = arg.allow_uncalibrated == "true" or nil,
  kv_cache = (arg.kv_cache ~= nil and arg.kv_cache ~= "none" and arg.kv_cache ~= "false") and arg.kv_cache or nil,
}

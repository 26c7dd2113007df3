-- Post-training quantization as a recipe: the same run as `nibble quantize`.
--   nibble run recipes/ptq.lua model=PATH out=DIR [format=nvfp4_w4a16] [algorithm=max|mse|four_over_six]
--       [calib=FILE] [samples=512] [seq_len=512] [seed=1] [layout=modelopt|compressed-tensors] [kv_cache=fp8]
--       [allow_long=true: a seq_len beyond the model's max_position_embeddings]
--       [dtype=bf16|f16|f32: the unquantized tensors; default the source's if BF16/F16, else bf16]
--   nibble plan recipes/ptq.lua model=PATH        (what would be quantized, and why not)
-- Formats: nvfp4_w4a16, nvfp4 (W4A4: needs calib), nvfp4_static, nvfp4_4o6, nvfp4_4o6_a4 (W4A4), mxfp8, fp8 (W8A8: needs
-- calib), fp8_per_channel. The unit recipes/units/<format>.lua quantizes every linear layer and keeps
-- the default exclusions (lm_head, routers, MoE gates); layers whose width the block does not divide
-- stay unquantized with that reason. kv_cache=fp8 adds an FP8 KV cache (units/kv_fp8: k_scale / v_scale per
-- layer, calibrated, so it needs calib too).
local nibble = nibble or require("nibble")
local recipe = nibble.recipe

return require("nibble.cli").program(function()
  local a = recipe.args(arg, "ptq.lua", { "model", "out", "format", "algorithm", "calib", "samples", "seq_len",
    "batch", "seed", "layout", "kv_cache", "allow_uncalibrated", "allow_long",
    "allow_nonfinite", "dtype" })
  if not a then return nil end   -- --help
  local format = recipe.check_preset(a.str("format", "nvfp4_w4a16"), "ptq.lua")
  local kv = a.str("kv_cache")
  return nibble.recipe {
    extends = "units/" .. format,
    model = { path = a.str("model") },
    algorithm = a.str("algorithm"),     -- nil: the unit's (max; four_over_six for nvfp4_4o6)
    calibration = {
      data = a.str("calib"),            -- nil: weight-only formats need no data
      samples = a.num("samples", 512),
      seq_len = a.num("seq_len", 512),
      batch = a.num("batch", 4),
      random_offset = true,
      seed = a.num("seed", 1),
      allow_long = a.bool("allow_long", false) or nil,
    },
    export = { dir = a.str("out"), layout = a.str("layout", "modelopt"), dtype = a.str("dtype") },
    allow_uncalibrated = a.bool("allow_uncalibrated", false) or nil,
    allow_nonfinite = a.bool("allow_nonfinite", false) or nil,   -- write NaN/Inf weights as they are (reported)
    kv_cache = (kv ~= nil and kv ~= "none" and kv ~= "false") and kv or nil,
  }
end)

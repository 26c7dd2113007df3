-- nibble quantize: post-training quantization of a model to NVFP4 / MXFP8 / FP8, exported for serving
-- Usage: nibble quantize --model PATH --format F [--algorithm A] [--calib FILE] [--samples N]
--          [--seq-len N] [--batch N] [--seed S] [--layout modelopt|compressed-tensors]
--          [--kv-cache fp8] [--dtype bf16|f16|f32] [--allow-uncalibrated] [--quiet] --out DIR
-- F is a preset: nvfp4_w4a16, nvfp4 (W4A4), nvfp4_static, nvfp4_4o6, nvfp4_4o6_a4 (W4A4), mxfp8, fp8 (W8A8),
-- fp8_per_channel.
-- Every linear layer gets F except the default exclusions (lm_head, routers, MoE gates) and the
-- layers whose width the format's block does not divide. Formats that quantize activations need
-- --calib (text, JSONL or JSON); weight-only formats calibrate the weights alone. The same run as a
-- recipe: nibble run recipes/ptq.lua model=PATH format=F out=DIR ... --kv-cache fp8 also quantizes the KV
-- cache (FP8 k_scale / v_scale per layer, calibrated on --calib).
local USAGE = [[
usage: nibble quantize --model PATH --format F [--algorithm max|mse|four_over_six] [--calib FILE]
         [--samples N] [--seq-len N] [--batch N] [--seed S] [--layout modelopt|compressed-tensors]
         [--kv-cache fp8] [--dtype bf16|f16|f32] [--allow-uncalibrated] [--quiet] --out DIR
formats: nvfp4_w4a16, nvfp4, nvfp4_static, nvfp4_4o6, nvfp4_4o6_a4, mxfp8, fp8, fp8_per_channel
  --samples N   calibration rows (default 512; fewer when --calib has fewer); N >= 1
  --dtype D     the unquantized tensors and config.json's torch_dtype (default: the model's own
                if BF16 or F16, else bf16, what vLLM and compressed-tensors run)
]]

local function clean(e) return (tostring(e):gsub("^[^\n]-:%d+: ", "")) end

local function err(msg)
  io.stderr:write("nibble quantize: ", msg, "\n")
  return 1
end

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH" }, { "--format", "-f", key = "format", arg = "FORMAT" },
  { "--algorithm", key = "algorithm", arg = "NAME" }, { "--calib", key = "calib", arg = "FILE" },
  { "--samples", key = "samples", num = "int+" }, { "--seq-len", key = "seq_len", num = "int+" },
  { "--batch", key = "batch", num = "int+" }, { "--seed", key = "seed", num = "int0" },
  { "--layout", key = "layout", arg = "LAYOUT" }, { "--out", "-o", key = "out", arg = "DIR" },
  { "--kv-cache", key = "kv_cache", arg = "FORMAT" }, { "--dtype", key = "dtype", arg = "DTYPE" }, { "--allow-uncalibrated", key = "allow_uncalibrated" },
  { "--quiet", "-q", key = "quiet" },
}

return function(args)
  local o, code = require("nibble.cli").parse("quantize", USAGE, args, SPEC)
  if not o then return code end
  if not o.model or not o.format or not o.out then
    io.stderr:write(USAGE)
    return 1
  end
  local recipe = require("nibble.recipe")
  local ptq = require("nibble.ptq")
  local ok, res = pcall(function()
    local r, rargs = ptq.recipe_of(o)
    return ptq.run(r, rargs, { quiet = o.quiet })
  end)
  if not ok then return err(clean(res)) end
  local we = res.weight_error
  io.stdout:write(("quantized %d modules (%s, %s%s) -> %s in %.1f s\n"):format(we.modules, o.format, res.algorithm,
    res.kv_cache and ", KV cache " .. res.kv_cache or "", res.export_dir, res.seconds))
  return 0
end

-- nibble quantize: post-training quantization of a model to NVFP4 / MXFP8 / FP8, exported for serving
-- Usage: nibble quantize --model PATH --format F [--algorithm A] [--calib FILE] [--samples N]
--          [--seq-len N] [--batch N] [--seed S] [--layout modelopt|compressed-tensors]
--          [--kv-cache fp8] [--allow-uncalibrated] [--quiet] --out DIR
-- F is a preset: nvfp4_w4a16, nvfp4 (W4A4), nvfp4_static, nvfp4_4o6, mxfp8, fp8 (W8A8), fp8_per_channel.
-- Every linear layer gets F except the default exclusions (lm_head, routers, MoE gates) and the
-- layers whose width the format's block does not divide. Formats that quantize activations need
-- --calib (text, JSONL or JSON); weight-only formats calibrate the weights alone. The same run as a
-- recipe: nibble run recipes/ptq.lua model=PATH format=F out=DIR ... --kv-cache fp8 also quantizes the KV
-- cache (FP8 k_scale / v_scale per layer, calibrated on --calib).
local USAGE = [[
usage: nibble quantize --model PATH --format F [--algorithm max|mse|four_over_six] [--calib FILE]
         [--samples N] [--seq-len N] [--batch N] [--seed S] [--layout modelopt|compressed-tensors]
         [--kv-cache fp8] [--allow-uncalibrated] [--quiet] --out DIR
formats: nvfp4_w4a16, nvfp4, nvfp4_static, nvfp4_4o6, mxfp8, fp8, fp8_per_channel
]]

local function clean(e) return (tostring(e):gsub("^[^\n]-:%d+: ", "")) end

local function err(msg)
  io.stderr:write("nibble quantize: ", msg, "\n")
  return 1
end

return function(args)
  local o = {}
  local flags = { ["--model"] = "model", ["-m"] = "model", ["--format"] = "format", ["-f"] = "format",
                  ["--algorithm"] = "algorithm", ["--calib"] = "calib", ["--samples"] = "samples",
                  ["--seq-len"] = "seq_len", ["--batch"] = "batch", ["--seed"] = "seed", ["--layout"] = "layout",
                  ["--out"] = "out", ["-o"] = "out", ["--kv-cache"] = "kv_cache" }
  local numeric = { samples = true, seq_len = true, batch = true, seed = true }
  local i = 1
  while i <= #args do
    local a = args[i]
    local key, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
    key = key or a
    if flags[key] then
      local v = inline
      if v == nil then
        i = i + 1
        v = args[i]
      end
      if v == nil then return err(key .. " needs a value") end
      local name = flags[key]
      if numeric[name] then
        local n = tonumber(v)
        if not n or n % 1 ~= 0 or n < 0 then return err(("%s must be a non-negative integer, got %s"):format(key, v)) end
        v = n
      end
      o[name] = v
    elseif a == "--allow-uncalibrated" then o.allow_uncalibrated = true
    elseif a == "--quiet" or a == "-q" then o.quiet = true
    elseif a == "-h" or a == "--help" then io.stdout:write(USAGE); return 0
    else
      io.stderr:write("nibble quantize: unknown argument ", a, "\n", USAGE)
      return 1
    end
    i = i + 1
  end
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

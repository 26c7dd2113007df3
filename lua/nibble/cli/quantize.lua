-- nibble quantize: post-training quantization of a model to NVFP4 / MXFP8 / FP8, exported for serving
-- Usage: nibble quantize --model PATH --format F [--algorithm A] [--calib FILE] [--samples N]
--          [--seq-len N] [--batch N] [--seed S] [--layout modelopt|compressed-tensors]
--          [--kv-cache fp8] [--allow-uncalibrated] [--allow-long] [--allow-nonfinite] [--dtype bf16|f16|f32] [--quiet] --out DIR
-- F is a preset (the rows of nibble/formats.h; --help lists them with their four_over_six variants).
-- Every linear layer gets F except the default exclusions (lm_head, routers, MoE gates) and the
-- layers whose width the format's block does not divide. Formats that quantize activations need
-- --calib (text, JSONL or JSON); weight-only formats calibrate the weights alone. The same run as a
-- recipe: nibble run recipes/ptq.lua model=PATH format=F out=DIR ... --kv-cache fp8 also quantizes the KV
-- cache (FP8 k_scale / v_scale per layer, calibrated on --calib). A --seq-len beyond the model's
-- max_position_embeddings is refused unless --allow-long, as eval and generate refuse such a context.
-- Values are checked here, before any compute, and errors name the option (never a file of nibble's).
local formats = require("nibble.formats")
local USAGE = ([[
usage: nibble quantize --model PATH --format F [--algorithm %s] [--calib FILE]
         [--samples N] [--seq-len N] [--batch N] [--seed S] [--layout modelopt|compressed-tensors]
         [--kv-cache fp8] [--allow-uncalibrated] [--allow-long] [--allow-nonfinite]
         [--dtype bf16|f16|f32] [--quiet] --out DIR
formats:
%s
]]):format(table.concat(formats.algorithm_names, "|"), table.concat(formats.help_lines("  "), "\n")) .. [[
  --samples N   calibration rows (default 512; fewer when --calib has fewer); N >= 1
  --seq-len N   tokens per calibration row (default 512); at most the model's max_position_embeddings
  --allow-long  allow a --seq-len beyond max_position_embeddings
  --dtype D     the unquantized tensors and config.json's torch_dtype (default: the model's own
                if BF16 or F16, else bf16, what vLLM and compressed-tensors run)
]]

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH", need = true },
  { "--format", "-f", key = "format", arg = "FORMAT", need = true },
  { "--algorithm", key = "algorithm", arg = "NAME" }, { "--calib", key = "calib", arg = "FILE" },
  { "--samples", key = "samples", num = "int+" }, { "--seq-len", key = "seq_len", num = "int+" },
  { "--batch", key = "batch", num = "int+" }, { "--seed", key = "seed", num = "int0" },
  { "--layout", key = "layout", arg = "LAYOUT" }, { "--out", "-o", key = "out", arg = "DIR", need = true },
  { "--kv-cache", key = "kv_cache", arg = "FORMAT" }, { "--allow-uncalibrated", key = "allow_uncalibrated" },
  { "--allow-long", key = "allow_long" }, { "--allow-nonfinite", key = "allow_nonfinite" },
  { "--dtype", key = "dtype", arg = "DTYPE" },
  { "--quiet", "-q", key = "quiet" },
}

-- The named values of the options: "unknown --format 'nvfp5' (did you mean 'nvfp4'?); known: ...".
local function bad_value(o)
  local recipe = require("nibble.recipe")
  local kv = {}
  for k in pairs(recipe.kv_presets) do kv[k] = true end
  kv.none = true
  for _, c in ipairs {
    { "--format", o.format, recipe.presets }, { "--algorithm", o.algorithm, recipe.algorithms },
    { "--layout", o.layout, recipe.layouts }, { "--kv-cache", o.kv_cache, kv },
  } do
    local opt, v, known = c[1], c[2], c[3]
    if v ~= nil and not known[v] then
      local names = recipe.keys_of(known)
      return ("unknown %s '%s'%s; known: %s"):format(opt, v, recipe.did_you_mean(v, names), table.concat(names, ", "))
    end
  end
  return nil
end

return function(args)
  local cli = require("nibble.cli")
  local o, code = cli.parse("quantize", USAGE, args, SPEC)
  if not o then return code end
  local bad = bad_value(o)
  if bad then return cli.fail("quantize", bad) end
  local recipe = require("nibble.recipe")
  -- calibration rows are read (and --seq-len used) for formats that quantize activations and the KV cache
  if recipe.presets[o.format].input or (o.kv_cache and o.kv_cache ~= "none") then
    local seq_len, maxpos = o.seq_len or 512, cli.max_position(cli.model_dir(o.model))
    if maxpos and seq_len > maxpos and not o.allow_long then
      return cli.fail("quantize", ("--seq-len %d is more than the model's max_position_embeddings %d "
        .. "(--allow-long runs it anyway)"):format(seq_len, maxpos))
    end
  end
  local ptq = require("nibble.ptq")
  local ok, res = pcall(function()
    local r, rargs = ptq.recipe_of(o)
    return ptq.run(r, rargs, { quiet = o.quiet })
  end)
  if not ok then return cli.fail("quantize", res) end
  local we = res.weight_error
  if require("nibble.comm").rank() ~= 0 then return 0 end   -- as several ranks, rank 0 reports
  io.stdout:write(("quantized %d modules (%s, %s%s) -> %s in %.1f s\n"):format(we.modules, o.format, res.algorithm,
    res.kv_cache and ", KV cache " .. res.kv_cache or "", res.export_dir, res.seconds))
  return 0
end

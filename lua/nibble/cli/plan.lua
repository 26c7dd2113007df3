-- nibble plan: print every module of a recipe's model with its format or the reason it is excluded
-- Usage: nibble plan RECIPE [key=value ...]
-- RECIPE is a declarative recipe file (a table, e.g. recipes/ptq.lua); key=value pairs reach it as
-- arg.key. The recipe is validated (unknown keys, globs that match nothing, block sizes) before
-- anything else; only the model's config and file headers (safetensors header, GGUF metadata) are
-- read to list its modules, no weights. Nothing is quantized.
local USAGE = "usage: nibble plan RECIPE [key=value ...]\n"

local cli = require("nibble.cli")

-- RECIPE and its key=value words are the positional words of the one option parser
local SPEC = { positional = "RECIPE", need_positional = true }

return function(args)
  local o, code = cli.parse("plan", USAGE, args, SPEC)
  if not o then return code end
  local file
  local kv = {}
  for _, a in ipairs(o) do
    local k, v = a:match("^([%a_][%w_%.%-]*)=(.*)$")
    if k then
      kv[k] = v
    elseif not file then
      file = a
    else
      return cli.fail("plan", "unexpected argument " .. a .. " (one RECIPE, then key=value words)")
    end
  end
  if not file then return cli.fail("plan", "missing RECIPE (a recipe file, then key=value words)") end
  local bad = cli.file_problem(file)
  if bad then return cli.fail("plan", bad) end
  -- a file that is not Lua: name it (the parser's message alone, without its position, does not)
  local chunk, perr = loadfile(file)
  if not chunk then return cli.fail("plan", file .. " is not a Lua recipe: " .. tostring(perr)) end
  local recipe = require("nibble.recipe")
  local ptq = require("nibble.ptq")
  local ok, res = pcall(function()
    local r = ptq.prepare(file, kv)
    return ptq.run(r, kv, { dry_run = true, quiet = true })
  end)
  if not ok then return cli.fail("plan", res) end
  io.stdout:write(recipe.format_plan(res.plan), "\n")
  local r = res.recipe
  local lines = { ("algorithm: %s"):format(res.algorithm) }
  if r.calibration and r.calibration.data then
    local c = r.calibration
    lines[#lines + 1] = ("calibration: %s (samples %s, seq_len %s, seed %s)"):format(c.data, tostring(c.samples or 512),
      tostring(c.seq_len or 512), tostring(c.seed or r.seed or 0))
  end
  if r.kv_cache then
    lines[#lines + 1] = ("kv_cache: %s (keys after RoPE and values of every layer; k_scale / v_scale from calibration)")
      :format(r.kv_cache)
  end
  if r.export and r.export.dir then
    lines[#lines + 1] = ("export: %s (%s layout%s)"):format(r.export.dir, r.export.layout or "modelopt",
      r.export.dtype and (", unquantized tensors in " .. r.export.dtype) or "")
  end
  io.stdout:write(table.concat(lines, "\n"), "\n")
  return 0
end

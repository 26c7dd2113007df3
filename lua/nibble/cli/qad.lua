-- nibble qad: quantization-aware distillation: PTQ, then QAD of the student from the original model, the export and an eval table
-- Usage: nibble qad --model PATH --data FILE --out DIR [--KEY VALUE ...]
-- The keys are those of `nibble run recipes/qad.lua key=value ...` (the one list nibble.qad_settings
-- holds, which also writes the help below); --seq-len and --seq_len are the same option. The run is
-- nibble.qad.run on the recipe nibble.qad.recipe_of builds, as recipes/qad.lua builds it.
local cli = require("nibble.cli")
local settings = require("nibble.qad_settings")

local META = { int = "N", number = "X", bool = "true/false", string = "TEXT", path = "PATH", choice = "NAME" }
local REQUIRED = { model = true, data = true, out = true }

local USAGE = "usage: nibble qad --model PATH --data FILE --out DIR [--KEY VALUE ...] [--quiet]\n"
  .. "  (the keys of nibble run recipes/qad.lua KEY=VALUE)\n"
  .. settings.help("option", { { "--quiet", "no progress line and no log" } })

-- every row of the list is an option with a value: --seq-len (and --seq_len) VALUE
local SPEC = { { "--quiet", "-q", key = "quiet" } }
for _, row in ipairs(settings.list) do
  if row.name then
    local dashed = "--" .. row.name:gsub("_", "-")
    local opt = { dashed, key = row.name, arg = META[row.type], need = REQUIRED[row.name] }
    if dashed ~= "--" .. row.name then opt[2] = "--" .. row.name end
    SPEC[#SPEC + 1] = opt
  end
end

-- how messages name an option the user gave: "--seq-len", "--topk 5"
local function option(k) return "--" .. k:gsub("_", "-") end
local function spell(k, v) return option(k) .. " " .. tostring(v) end

return function(args)
  local o, code = cli.parse("qad", USAGE, args, SPEC)
  if not o then return code end
  local qad = require("nibble.qad")
  local ok, res = pcall(function()
    local v = settings.read(function(k) return o[k] end, nil, option)
    return qad.run(qad.recipe_of(v, nil, spell), nil, { quiet = o.quiet })
  end)
  if not ok then return cli.fail("qad", res) end
  io.stdout:write(("qad: %d steps -> %s in %.1f s\n"):format(res.run:step_count(), res.export_dir, res.seconds))
  return 0
end

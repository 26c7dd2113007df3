-- Recipes: load a recipe file (declarative table or imperative script), compose it with `extends`,
-- validate every key before any compute, and resolve the ordered quantization rules against a
-- model's modules into a plan (each module's format, or the reason it is excluded).
-- The formats, presets and calibration algorithms are libnibble's descriptors (nibble.formats).

local formats = require("nibble.formats")

local U = require("nibble.util")
local S = require("nibble.qad_settings")

local M = {}

---------------------------------------------------------------------------------------------------
-- presets: what each named format means for a linear module (rows of nibble/formats.h)
---------------------------------------------------------------------------------------------------

-- name -> { format, block, weight = "dynamic" | "static" | "per_tensor" | "per_channel", input, four_over_six,
-- quant_algo, weight_format, static, summary, variant_4o6 } (nibble.formats.presets)
M.presets = formats.presets

-- KV-cache presets are a separate key (`kv_cache = "fp8"`, or `extends = "units/kv_fp8"`), not
-- per-module rules: FP8 E4M3 keys (after RoPE) and values with one calibrated scale per layer for each
-- (k_scale / v_scale = amax / 448), ModelOpt's FP8_KV_CFG; false or nil leaves the cache in BF16.
M.kv_presets = formats.kv_presets

M.algorithms = formats.algorithms
M.layouts = { modelopt = true, ["compressed-tensors"] = true }
-- the dtype of an export's unquantized tensors (default: the source's if BF16 / F16, else bf16)
M.export_dtypes = { bf16 = true, f16 = true, f32 = true }

---------------------------------------------------------------------------------------------------
-- schema: the keys a recipe may have (unknown keys are errors with a did-you-mean)
---------------------------------------------------------------------------------------------------

M.schema = {
  extends = true, name = true, description = true, model = "table", quantize = "list",
  algorithm = "string", calibration = "table", distill = "table", export = "table", eval = "table",
  allow_uncalibrated = "boolean", allow_nonfinite = "boolean", kv_cache = true, seed = "number", threads = "number",
}
M.sub_schema = {
  model = { path = true, teacher = true },
  calibration = { data = true, samples = true, seq_len = true, batch = true, pack = true,
                  random_offset = true, seed = true, text_field = true, separator = true,
                  chat_template = true,  -- "auto" | "chatml" | "plain" | "model" (data.load)
                  allow_long = true },   -- seq_len beyond the model's max_position_embeddings
  -- the QAD settings' keys: one list (nibble.qad_settings) says them, with their types and ranges
  distill = (function()
    local t = {}
    for k in pairs(S.section("distill")) do t[k] = true end
    return t
  end)(),
  export = { dir = true, layout = true, max_shard_size = true, dtype = true },
  eval = { data = true, ctx = true, chunks = true },
}

local keys_of, nearest, did_you_mean = U.keys_of, U.nearest, U.did_you_mean
M.keys_of = keys_of   -- a table's keys, sorted (the "known: ..." lists of messages)
M.did_you_mean = did_you_mean

-- check_preset(name, where): name when it is one of M.presets, else the error
-- "<where>: unknown format '<name>' (did you mean ...); known: <every preset>".
function M.check_preset(name, where)
  if M.presets[name] then return name end
  local names = keys_of(M.presets)
  error(string.format("%s: unknown format '%s'%s; known: %s", where, tostring(name), did_you_mean(tostring(name), names),
    table.concat(names, ", ")), 0)
end

-- The leading comment of a Lua file (its usage text), without the dashes.
local function usage_of(path)
  local f = path and io.open(path, "r")
  if not f then return nil end
  local lines = {}
  for line in f:lines() do
    local text = line:match("^%-%-(.*)$")
    if not text then break end
    lines[#lines + 1] = (text:gsub("^ ", ""))
  end
  f:close()
  return #lines > 0 and table.concat(lines, "\n") .. "\n" or nil
end

-- args(arg, where, known): the key=value arguments of a recipe file run by `nibble run` (its `arg`),
-- checked against `known` (a list of key names) before anything else runs: an unknown key is an error
-- with a did-you-mean, and so is a word that is not key=value. Returns a reader:
--   a.str(k [, dflt]), a.num(k [, dflt]) (finite numbers: "<where>: k must be a number, got 'x'"),
--   a.bool(k [, dflt]) (true / false / 1 / 0), a.given(k).
-- --help or -h prints the calling file's leading comment on stdout and returns nil (the recipe then
-- returns nothing, so nothing runs).
function M.args(arg, where, known)
  arg = arg or {}
  local allowed, names = {}, {}
  for _, k in ipairs(known) do allowed[k], names[#names + 1] = true, k end
  table.sort(names)
  for i = 1, #arg do
    if arg[i] == "--help" or arg[i] == "-h" then
      local src = debug.getinfo(2, "S").source
      io.stdout:write(usage_of(src:sub(1, 1) == "@" and src:sub(2) or nil) or (where .. ": key=value arguments\n"))
      return nil
    end
  end
  for k, v in pairs(arg) do
    if type(k) == "number" then
      if k >= 1 then
        error(string.format("%s: unexpected argument '%s' (arguments are key=value)", where, tostring(v)), 0)
      end
    elseif not allowed[k] then
      error(string.format("%s: unknown key '%s'%s; --help lists the keys", where, tostring(k),
        did_you_mean(tostring(k), names)), 0)
    end
  end
  local a = {}
  function a.given(k) return arg[k] ~= nil end
  function a.str(k, dflt)
    local v = arg[k]
    if v == nil then return dflt end
    return v
  end
  function a.num(k, dflt)
    local v = arg[k]
    if v == nil then return dflt end
    local x = tonumber(v)
    if not x or x ~= x or x == math.huge or x == -math.huge then
      error(string.format("%s: %s must be a number, got '%s'", where, k, tostring(v)), 0)
    end
    return x
  end
  function a.bool(k, dflt)
    local v = arg[k]
    if v == nil then return dflt end
    if v == "true" or v == "1" then return true end
    if v == "false" or v == "0" then return false end
    error(string.format("%s: %s must be true or false, got '%s'", where, k, tostring(v)), 0)
  end
  return a
end

local function check_keys(t, allowed, where)
  for k in pairs(t) do
    if type(k) ~= "string" then
      error(string.format("recipe: %s has a non-string key %s", where, tostring(k)), 0)
    end
    if allowed[k] == nil then
      error(string.format("recipe: unknown key '%s' in %s%s", k, where, did_you_mean(k, keys_of(allowed))), 0)
    end
  end
end

---------------------------------------------------------------------------------------------------
-- globs
---------------------------------------------------------------------------------------------------

-- fnmatch-style glob (`*` any run, `?` one char, `[abc]` a class) to an anchored Lua pattern.
function M.glob_to_pattern(glob)
  local out, i = { "^" }, 1
  while i <= #glob do
    local c = glob:sub(i, i)
    if c == "*" then
      out[#out + 1] = ".*"
    elseif c == "?" then
      out[#out + 1] = "."
    elseif c == "[" then
      local j = glob:find("]", i + 1, true)
      if not j then error("recipe: unterminated '[' in glob '" .. glob .. "'", 0) end
      out[#out + 1] = "[" .. glob:sub(i + 1, j - 1):gsub("%%", "%%%%") .. "]"
      i = j
    else
      out[#out + 1] = c:gsub("[%^%$%(%)%%%.%+%-%?%[%]]", "%%%0")
    end
    i = i + 1
  end
  out[#out + 1] = "$"
  return table.concat(out)
end

function M.glob_match(glob, name)
  return name:match(M.glob_to_pattern(glob)) ~= nil
end

local function is_wildcard(glob)
  return glob:find("[%*%?%[]") ~= nil
end

-- suggest_glob(glob, names): for a glob that matches none of the module names, the glob with each
-- literal dotted part that no name has replaced by the nearest part names do have ("*.mpl.*" ->
-- "*.mlp.*"), when that glob matches a module; else the nearest whole name; else nil.
local function suggest_glob(glob, names)
  local parts, have, comps = {}, {}, {}
  for seg in (glob .. "."):gmatch("([^%.]*)%.") do parts[#parts + 1] = seg end
  for _, n in ipairs(names) do
    for c in n:gmatch("[^%.]+") do
      if not have[c] then have[c] = true; comps[#comps + 1] = c end
    end
  end
  table.sort(comps)
  local changed = false
  for i, seg in ipairs(parts) do
    if seg ~= "" and not is_wildcard(seg) and not have[seg] then
      local best = nearest(seg, comps)
      if best then parts[i], changed = best, true end
    end
  end
  if changed then
    local g = table.concat(parts, ".")
    for _, n in ipairs(names) do
      if M.glob_match(g, n) then return g end
    end
  end
  return nearest(glob, names)
end

---------------------------------------------------------------------------------------------------
-- loading and composition
---------------------------------------------------------------------------------------------------

M.search_path = {}   -- directories searched for `extends` names, before the defaults below

-- The defaults: $NIBBLE_RECIPES, then the recipes/ folder beside lua/ (the source tree, or
-- share/nibble/recipes of an installation).
local function default_dirs()
  local out = {}
  local env = os.getenv("NIBBLE_RECIPES")
  if env and env ~= "" then for d in env:gmatch("[^:]+") do out[#out + 1] = d end end
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")   -- <root>/lua/nibble
  if here then
    out[#out + 1] = here .. "/../../recipes"
    out[#out + 1] = here .. "/../../../nibble/recipes"
  end
  return out
end

local function file_exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

function M.find(name, from_dir)
  if name:sub(-4) ~= ".lua" then name = name .. ".lua" end
  if name:sub(1, 1) == "/" then
    if file_exists(name) then return name end
    return nil
  end
  local dirs = {}
  if from_dir then dirs[#dirs + 1] = from_dir end
  for _, d in ipairs(M.search_path) do dirs[#dirs + 1] = d end
  for _, d in ipairs(default_dirs()) do dirs[#dirs + 1] = d end
  for _, d in ipairs(dirs) do
    local p = d .. "/" .. name
    if file_exists(p) then return p end
  end
  return nil
end

-- names([from_dir]): the names `extends` can find ("ptq", "units/nvfp4_w4a16", ...), for suggestions:
-- the .lua files in the searched folders and their units/ folders (none when no folder can be listed).
function M.names(from_dir)
  local list = U.listdir
  local dirs, out, seen = {}, {}, {}
  if from_dir then dirs[#dirs + 1] = from_dir end
  for _, d in ipairs(M.search_path) do dirs[#dirs + 1] = d end
  for _, d in ipairs(default_dirs()) do dirs[#dirs + 1] = d end
  for _, d in ipairs(dirs) do
    for _, sub in ipairs { "", "units/" } do
      for _, f in ipairs(list(d .. "/" .. sub) or {}) do
        local stem = f:match("^(.+)%.lua$")
        if stem and not seen[sub .. stem] then
          seen[sub .. stem] = true
          out[#out + 1] = sub .. stem
        end
      end
    end
  end
  table.sort(out)
  return out
end

local tagged = setmetatable({}, { __mode = "k" })   -- recipe tables made by nibble.recipe / load
local paths = setmetatable({}, { __mode = "k" })    -- recipe table -> the file it came from

-- rules .. the rules of units/default_exclusions (for units that start from "everything").
function M.with_default_exclusions(rules)
  local path = M.find("units/default_exclusions")
  if not path then error("recipe: units/default_exclusions.lua not found on the recipe search path", 0) end
  local out = {}
  for _, r in ipairs(rules) do out[#out + 1] = r end
  for _, r in ipairs(dofile(path).quantize) do
    local copy = { optional = true }
    for k, v in pairs(r) do copy[k] = v end
    out[#out + 1] = copy
  end
  return out
end

-- `nibble.recipe{...}`: marks a table as a declarative recipe (validated when resolved). A recipe
-- run as a script (`nibble run file.lua`) is found relative to that script (arg[0]).
function M.new(t, level)
  if type(t) ~= "table" then error("recipe: nibble.recipe expects a table", 2) end
  tagged[t] = true
  local info = debug.getinfo(level or 2, "S")
  local src = info and info.source
  if src and src:sub(1, 1) == "@" and not paths[t] then paths[t] = src:sub(2) end
  return t
end

function M.is_recipe(t)
  return type(t) == "table" and tagged[t] == true
end

-- Run a recipe file with `arg` (a table of key=value strings). A declarative recipe returns a table;
-- an imperative one does its work and returns nothing (nil is returned then).
function M.load(path, args, env_extra)
  local chunk, err = loadfile(path)
  if not chunk then error("recipe: " .. err, 0) end
  -- `nibble` resolves lazily, so plain recipes load without libnibble (the matcher's own specs)
  local env = setmetatable({ arg = args or {}, recipe = M }, { __index = function(_, k)
    local v = _G[k]
    if v == nil and k == "nibble" then v = require("nibble") end
    return v
  end })
  if env_extra then for k, v in pairs(env_extra) do env[k] = v end end
  setfenv(chunk, env)
  local r = chunk()
  if r == nil then return nil end
  if type(r) ~= "table" then error("recipe: " .. path .. " returned a " .. type(r) .. ", expected a table", 0) end
  tagged[r] = true
  paths[r] = path
  return r
end

local function deep_merge(base, over)
  local out = {}
  for k, v in pairs(base) do out[k] = v end
  for k, v in pairs(over) do
    if type(v) == "table" and type(out[k]) == "table" and k ~= "quantize" then
      out[k] = deep_merge(out[k], v)
    else
      out[k] = v
    end
  end
  return out
end

-- Flatten `extends` (a name or a list of names, applied in order) into one table. Quantize rules
-- concatenate base-first, so the recipe's own rules come last and win.
function M.compose(r, args, seen)
  seen = seen or {}
  local ext = r.extends
  local from_dir = paths[r] and dirname(paths[r]) or nil
  local base = {}
  local rules = {}
  if ext then
    if type(ext) == "string" then ext = { ext } end
    for _, name in ipairs(ext) do
      local path = M.find(name, from_dir)
      if not path then
        error("recipe: extends '" .. name .. "': no such recipe or unit" .. did_you_mean(name, M.names(from_dir)), 0)
      end
      if seen[path] then error("recipe: extends cycle through " .. path, 0) end
      seen[path] = true
      local unit = M.load(path, args)
      if not unit then error("recipe: unit " .. path .. " returned nothing", 0) end
      unit = M.compose(unit, args, seen)
      for j, rule in ipairs(unit.quantize or {}) do
        local copy = {}
        for k, v in pairs(rule) do copy[k] = v end
        if not copy.from then copy.from, copy.pos = name, j end
        rules[#rules + 1] = copy
      end
      unit.quantize = nil
      base = deep_merge(base, unit)
    end
  end
  for _, rule in ipairs(r.quantize or {}) do rules[#rules + 1] = rule end
  local own = {}
  for k, v in pairs(r) do own[k] = v end
  own.quantize = nil
  local out = deep_merge(base, own)
  out.extends = nil
  out.quantize = rules
  tagged[out] = true
  paths[out] = paths[r]
  return out
end

---------------------------------------------------------------------------------------------------
-- validation (before any compute)
---------------------------------------------------------------------------------------------------

local function normalize_rule(rule, i, label)
  label = label or string.format("quantize[%d]", i)
  if type(rule) ~= "table" then error(string.format("recipe: %s must be a table {glob, format}", label), 0) end
  local glob, fmt, opts = rule[1], rule[2], rule[3]
  if type(glob) ~= "string" then
    error(string.format("recipe: %s: the first element must be a glob string", label), 0)
  end
  if fmt ~= false and type(fmt) ~= "string" then
    error(string.format("recipe: %s ('%s'): the format must be a preset name or false", label, glob), 0)
  end
  if type(fmt) == "string" then M.check_preset(fmt, string.format("recipe: %s ('%s')", label, glob)) end
  for k in pairs(rule) do
    if k ~= 1 and k ~= 2 and k ~= 3 and k ~= "optional" and k ~= "from" and k ~= "pos" and k ~= "reason" then
      error(string.format("recipe: %s ('%s'): unknown key '%s'", label, glob, tostring(k)), 0)
    end
  end
  if opts ~= nil and type(opts) ~= "table" then
    error(string.format("recipe: %s ('%s'): options must be a table", label, glob), 0)
  end
  return { glob = glob, format = fmt, opts = opts or {}, optional = rule.optional or (rule.from ~= nil),
           from = rule.from, reason = rule.reason, index = i, pos = rule.pos or i }
end

function M.validate(r)
  check_keys(r, M.schema, "the recipe")
  for k, kind in pairs(M.schema) do
    local v = r[k]
    if v ~= nil and kind ~= true then
      local want = kind == "list" and "table" or kind
      if type(v) ~= want then
        error(string.format("recipe: '%s' must be a %s, got %s", k, kind, type(v)), 0)
      end
    end
  end
  for k, allowed in pairs(M.sub_schema) do
    if type(r[k]) == "table" then check_keys(r[k], allowed, "'" .. k .. "'") end
  end
  if r.algorithm and not M.algorithms[r.algorithm] then
    error(string.format("recipe: unknown algorithm '%s'%s; known: %s", r.algorithm,
      did_you_mean(r.algorithm, keys_of(M.algorithms)), table.concat(formats.algorithm_names, ", ")), 0)
  end
  if r.export and r.export.layout and not M.layouts[r.export.layout] then
    error(string.format("recipe: unknown export layout '%s'%s; known: modelopt, compressed-tensors",
      r.export.layout, did_you_mean(r.export.layout, keys_of(M.layouts))), 0)
  end
  if r.export and r.export.dtype ~= nil and not M.export_dtypes[r.export.dtype] then
    error(string.format("recipe: unknown export dtype '%s'%s; known: bf16, f16, f32", tostring(r.export.dtype),
      did_you_mean(tostring(r.export.dtype), keys_of(M.export_dtypes))), 0)
  end
  if r.kv_cache ~= nil and r.kv_cache ~= false and not M.kv_presets[r.kv_cache] then
    error(string.format("recipe: unknown kv_cache '%s'%s; known: fp8 (or false)", tostring(r.kv_cache),
      did_you_mean(tostring(r.kv_cache), keys_of(M.kv_presets))), 0)
  end
  local rules, own = {}, 0
  for i, rule in ipairs(r.quantize or {}) do
    local from = type(rule) == "table" and rule.from or nil
    if not from then own = own + 1 end
    -- how messages name a rule: its place in the recipe, or in the unit it came from
    local label = from and string.format("rule %d of %s", rule.pos, from) or string.format("rule %d", own)
    rules[i] = normalize_rule(rule, i, label)
    rules[i].label = label
  end
  return rules
end

---------------------------------------------------------------------------------------------------
-- resolution against a model
---------------------------------------------------------------------------------------------------

-- modules: list of { name = "model.layers.0.mlp.down_proj", kind = "linear"|"embedding"|"norm",
--                    in_features = 172, out_features = 64, tied = bool (lm_head tied to embeddings) }
-- Returns the plan: one entry per module, in model order:
--   { name, kind, format = preset name or nil, preset = M.presets[...], rule = index, reason = string },
-- and the notes: one line for each rule that its modules' shapes let apply to some of them but not all
-- (what a run reports). The recipe's algorithm picks each preset's variant for it (four_over_six turns
-- the NVFP4 presets into their 4/6 presets). A rule of the recipe's own that matches modules but can
-- apply to none of them (their widths, a tied lm_head) is an error naming it, as one that matches nothing is.
function M.resolve(r, modules)
  local rules = M.validate(r)
  local hits = {}
  local plan = {}
  local won, skips = {}, {}   -- rule index -> modules it won / {name, why} it could not apply to
  for _, m in ipairs(modules) do
    local entry = { name = m.name, kind = m.kind, in_features = m.in_features, out_features = m.out_features }
    if m.kind ~= "linear" then
      entry.reason = m.kind .. " (no quantizer)"
    else
      local chosen
      for _, rule in ipairs(rules) do
        if M.glob_match(rule.glob, m.name) then
          hits[rule.index] = (hits[rule.index] or 0) + 1
          chosen = rule
        end
      end
      if chosen and chosen.format then won[chosen.index] = (won[chosen.index] or 0) + 1 end
      local function skip(why)
        local t = skips[chosen.index] or {}
        t[#t + 1] = { name = m.name, why = why }
        skips[chosen.index] = t
        entry.reason = why
      end
      if not chosen then
        entry.reason = "no rule matches"
      elseif chosen.format == false then
        entry.reason = chosen.reason or string.format("excluded by %s '%s'", chosen.label, chosen.glob)
      elseif m.tied and chosen.format then
        -- a tied lm_head is the embedding matrix: quantizing it would quantize the embeddings too
        if is_wildcard(chosen.glob) then
          skip("tied to model.embed_tokens (not quantized)")
        else
          error(string.format("recipe: %s '%s' asks to quantize %s, but it is tied to the embeddings "
            .. "(tie_word_embeddings); untie it first or drop the rule", chosen.label, chosen.glob, m.name), 0)
        end
      else
        local name = formats.with_algorithm(chosen.format, r.algorithm)
        local p = M.presets[name]
        local block = (chosen.opts.block or p.block)
        if block > 0 and m.in_features and m.in_features % block ~= 0 then
          local why = string.format("in_features %d is not divisible by the %s block size %d",
            m.in_features, p.format, block)
          if is_wildcard(chosen.glob) then
            skip(why)
          else
            error(string.format("recipe: %s '%s' asks for %s on %s, but %s", chosen.label, chosen.glob,
              chosen.format, m.name, why), 0)
          end
        else
          entry.format = name
          entry.preset = p
          entry.opts = chosen.opts
          entry.rule = chosen.index
        end
      end
    end
    plan[#plan + 1] = entry
  end
  -- a rule of the recipe's own that matches nothing is almost always a typo
  for _, rule in ipairs(rules) do
    if not hits[rule.index] and not rule.optional then
      local all = {}
      for _, m in ipairs(modules) do if M.glob_match(rule.glob, m.name) then all[#all + 1] = m.name end end
      if #all == 0 then
        local names = {}
        for _, m in ipairs(modules) do names[#names + 1] = m.name end
        local hint = suggest_glob(rule.glob, names)
        error(string.format("recipe: %s '%s' matches no module%s", rule.label, rule.glob,
          hint and string.format(" (did you mean '%s'?)", hint) or ""), 0)
      end
    end
  end
  -- rules whose modules cannot take them: none of them (an error for the recipe's own rules), or some
  local notes = {}
  for _, rule in ipairs(rules) do
    local sk = skips[rule.index]
    if sk then
      local n, why, names = won[rule.index], {}, {}
      for _, e in ipairs(sk) do
        if not why[e.why] then why[e.why] = true; why[#why + 1] = e.why end
        if #names < 3 then names[#names + 1] = e.name end
      end
      local list = table.concat(names, ", ") .. (#sk > #names and string.format(" and %d more", #sk - #names) or "")
      local head = string.format("%s '%s' (%s)", rule.label, rule.glob, rule.format)
      if #sk == n and not rule.optional then
        error(string.format("recipe: %s matches %d module%s but can quantize none of them: %s (%s)", head, n,
          n == 1 and "" or "s", table.concat(why, "; "), list), 0)
      end
      notes[#notes + 1] = string.format("%s leaves %d of its %d module%s unquantized: %s (%s)", head, #sk, n,
        n == 1 and "" or "s", table.concat(why, "; "), list)
    end
  end
  return plan, notes
end

-- The plan as text: one line per module, then a summary by format.
function M.format_plan(plan)
  local lines, counts, width = {}, {}, 0
  for _, e in ipairs(plan) do width = math.max(width, #e.name) end
  for _, e in ipairs(plan) do
    local what
    if e.format then
      what = e.format
      counts[e.format] = (counts[e.format] or 0) + 1
    else
      what = "-        " .. e.reason
      counts["excluded"] = (counts["excluded"] or 0) + 1
    end
    lines[#lines + 1] = string.format("%-" .. width .. "s  %s", e.name, what)
  end
  local summary = {}
  for _, k in ipairs(keys_of(counts)) do summary[#summary + 1] = string.format("%s: %d", k, counts[k]) end
  lines[#lines + 1] = string.format("%d modules (%s)", #plan, table.concat(summary, ", "))
  return table.concat(lines, "\n")
end

-- execute(r [, args]): what `nibble run FILE` does with a recipe table is nibble.pipeline.execute (the
-- top of the pipeline layer, which knows PTQ and QAD); recipe.tag(r) marks a table as a recipe for it.
function M.tag(r)
  local was = tagged[r] == true
  tagged[r] = true
  return was
end

setmetatable(M, { __call = function(_, t)
  local r = M.new(t, 3)   -- not a tail call: level 3 is the recipe file
  return r
end })

return M

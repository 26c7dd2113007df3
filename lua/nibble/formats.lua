-- nibble.formats: libnibble's format and preset descriptors (nibble/formats.h) as Lua tables, read once
-- through the FFI. The recipe layer, the CLI's usage text and the quantizer modules take every format
-- name, alias, preset and calibration algorithm from here; none is spelled out anywhere else in Lua.
--   formats.presets.nvfp4 -> { name, summary, weight_format = "nvfp4", static = false, input = "nvfp4",
--                              format = "nvfp4", block = 16, weight = "dynamic", algorithm = "max",
--                              four_over_six = false, variant_4o6 = "nvfp4_4o6_a4", quant_algo = "NVFP4" }
local ffi = require("ffi")
local C = require("nibble").C

local M = {}

local function str(p) return p ~= nil and ffi.string(p) or nil end

-- formats by name and by id: { id, name, summary, block, disk, maxbound, scale_norm, input_ok, quant_algo, ... }
M.formats, M.by_id, M.format_names = {}, {}, {}
for f = 1, tonumber(C.NB_FMT_COUNT) - 1 do
  local d = C.nb_format_desc_of(f)
  if d ~= nil then
    local e = { id = f, name = str(d.name), summary = str(d.summary), block = tonumber(d.block_size),
                disk_id = tonumber(d.disk_format), maxbound = tonumber(d.maxbound), scale_norm = tonumber(d.scale_norm),
                input_ok = d.input_ok ~= 0, groupable = d.groupable ~= 0, per_row = d.per_row ~= 0,
                state_dynamic = str(d.state_dynamic), state_static = str(d.state_static),
                quant_algo = str(d.quant_algo), quant_algo_act = str(d.quant_algo_act), ct_format = str(d.ct_format) }
    M.formats[e.name], M.by_id[f] = e, e
    M.format_names[#M.format_names + 1] = e.name
  end
end
for _, e in pairs(M.formats) do e.disk = M.by_id[e.disk_id].name end

-- every accepted spelling of a format -> its id ("none" is 0), and the aliases in C's order
M.format_ids, M.aliases = { none = tonumber(C.NB_FMT_NONE) }, {}
for name, e in pairs(M.formats) do M.format_ids[name] = e.id end
do
  local f = ffi.new("nb_qformat[1]")
  local i = 0
  while true do
    local a = C.nb_qformat_alias(i, f)
    if a == nil then break end
    local alias = ffi.string(a)
    M.format_ids[alias] = tonumber(f[0])
    M.aliases[#M.aliases + 1] = { alias = alias, format = M.by_id[tonumber(f[0])].name }
    i = i + 1
  end
end

-- calibration algorithms: name -> nb_calib_method, and the names in C's order
M.algorithms, M.algorithm_names = {}, {}
for m = 0, tonumber(C.NB_CALIB_COUNT) - 1 do
  local name = ffi.string(C.nb_calib_method_name(m))
  M.algorithms[name] = m
  M.algorithm_names[#M.algorithm_names + 1] = name
end

-- presets (quantize rules) and KV presets (kv_cache), by name, and the preset names in --help order
M.presets, M.kv_presets, M.preset_names = {}, {}, {}
for i = 0, C.nb_preset_count() - 1 do
  local p = C.nb_preset_at(i)
  local w = M.by_id[tonumber(p.weight_format)]
  local e = { name = str(p.name), summary = str(p.summary), weight_format = w.name, static = p.weight_static ~= 0,
              input = p.input_format ~= C.NB_FMT_NONE and M.by_id[tonumber(p.input_format)].name or nil,
              format = w.disk, block = w.block, weight = str(p.weight_kind),
              algorithm = ffi.string(C.nb_calib_method_name(p.algorithm)),
              four_over_six = str(p.four_over_six) == str(p.name) or nil,   -- a 4/6 preset is its own variant
              variant_4o6 = str(p.four_over_six), quant_algo = str(C.nb_preset_quant_algo(p)) }
  if p.kind == C.NB_PRESET_KV then
    M.kv_presets[e.name] = e
  else
    M.presets[e.name] = e
    M.preset_names[#M.preset_names + 1] = e.name
  end
end

-- with_algorithm(preset_name, algorithm): the preset name the algorithm turns it into (four_over_six on
-- an NVFP4 preset: its 4/6 variant); the name itself when the algorithm leaves it as it is.
function M.with_algorithm(name, algorithm)
  local p, m = M.presets[name], M.algorithms[algorithm or "max"]
  if not p or not m then return name end
  local q = C.nb_preset_with_algorithm(C.nb_preset_find(name, C.NB_PRESET_LINEAR), m)
  return q ~= nil and ffi.string(q.name) or name
end

-- help_lines(indent): one line per preset ("name  summary"), then the four_over_six variants and the
-- format aliases: the formats part of the CLI's usage texts.
function M.help_lines(indent)
  indent = indent or "  "
  local w = 0
  for _, n in ipairs(M.preset_names) do w = math.max(w, #n) end
  local out, v = {}, {}
  for _, n in ipairs(M.preset_names) do
    out[#out + 1] = ("%s%-" .. w .. "s  %s"):format(indent, n, M.presets[n].summary)
    local to = M.presets[n].variant_4o6
    if to and to ~= n then v[#v + 1] = n .. " -> " .. to end
  end
  out[#out + 1] = indent .. "with --algorithm four_over_six: " .. table.concat(v, ", ")
  local a = {}
  for _, e in ipairs(M.aliases) do a[#a + 1] = e.alias .. " = " .. e.format end
  out[#out + 1] = indent .. "format aliases (quantizer API): " .. table.concat(a, ", ")
  return out
end

return M

-- nibble.qmodel: quantizers on a model's linear modules (nibble/qmodel.h) from Lua: per-module
-- specs, fused siblings, calibration (observers as hooks during the caller's forward passes),
-- fake quant, the export guard, export in the ModelOpt / compressed-tensors layouts and nibble's own
-- checkpoints. The qmodel keeps its Lua model object alive (the C qmodel borrows the model).
--   local qm = nibble.qmodel.new(model)
--   qm:set("model.layers.0.mlp.up_proj", { weight = "nvfp4" })        -- or qm:apply(plan)
--   qm:fuse_siblings(); qm:calibrate_weights("max"); qm:export("out", { layout = "modelopt" })
local ffi = require("ffi")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local M = {}
local QModel = {}
QModel.__index = QModel

local function ctx() return nibble.context() end

-- The nb_model * of a model object: a nibble.model object (field _p or ptr, or :ptr()), or the cdata.
local function model_ptr(model)
  if type(model) == "cdata" then return ffi.cast("nb_model *", model) end
  if type(model) == "table" then
    local p = rawget(model, "_p") or rawget(model, "ptr")
    if type(p) == "function" then p = p(model) end
    if p == nil and type(model.ptr) == "function" then p = model:ptr() end
    if p ~= nil then return ffi.cast("nb_model *", p) end
    fail("qmodel: the model object was freed")
  end
  fail("qmodel: expected a nibble model (or an nb_model pointer), got " .. type(model))
end
M.model_ptr = model_ptr

local function qp(self)
  local p = rawget(self, "_p")
  if p == nil then fail("qmodel was freed") end
  return p
end

-- formats by name (every spelling nibble/formats.h accepts) and by id
local formats = require("nibble.formats")
local format_alias = formats.format_ids

local format_name = { [0] = "none" }
for id, e in pairs(formats.by_id) do format_name[id] = e.name end
M.format_name = format_name

local function to_format(x, what)
  if x == nil or x == false then return C.NB_FMT_NONE end
  if type(x) == "number" and format_name[x] then return x end
  local f = format_alias[x]
  if f == nil then
    local names = {}
    for k in pairs(format_alias) do names[#names + 1] = k end
    table.sort(names)
    fail(("%s: unknown format %s (one of %s)"):format(what, tostring(x), table.concat(names, ", ")))
  end
  return f
end
M.format = to_format

local calib_methods = formats.algorithms

-- calib_config("max" | "mse" | "four_over_six" | {method =, start =, stop =, step =, metric =})
local function calib_config(a)
  if type(a) ~= "table" then a = { method = a or "max" } end
  local m = calib_methods[a.method or "max"]
  if m == nil then
    fail(("unknown calibration algorithm %s (%s)"):format(tostring(a.method), table.concat(formats.algorithm_names, ", ")))
  end
  local cfg = ffi.new("nb_calib_config")
  C.nb_calib_config_init(cfg, m)
  if a.start then cfg.start_multiplier = a.start end
  if a.stop then cfg.stop_multiplier = a.stop end
  if a.step then cfg.step_size = a.step end
  if a.metric == "export" then cfg.metric = C.NB_MSE_EXPORT
  elseif a.metric ~= nil and a.metric ~= "modelopt" then fail("calibration metric must be 'modelopt' or 'export'") end
  return cfg
end
M.calib_config = calib_config

-- Lifetimes. The C qmodel borrows the model and removes its hooks from it when freed, so the model
-- must outlive it. In ordinary collections the qmodel's finalizer closes over the model, which keeps
-- it reachable until that finalizer has run. When the Lua state closes, finalizers run in any order:
-- the model's own finalizer is wrapped to note its death, and a qmodel whose model is gone is
-- detached (freed without touching the model).
local model_state = setmetatable({}, { __mode = "k" })   -- model cdata -> { dead = bool }
local function watch(model)
  local orig = type(model) == "table" and rawget(model, "_p") or nil
  if type(orig) ~= "cdata" then return { dead = false } end   -- a raw pointer: the caller's business
  local st = model_state[orig]
  if not st then
    st = { dead = false }
    model_state[orig] = st
    ffi.gc(orig, function(p)
      st.dead = true
      C.nb_model_free(p)
    end)
  end
  return st
end

-- new(model): a qmodel over every linear module of the model, all unquantized ("no rule").
function M.new(model)
  local p = model_ptr(model)
  local out = ffi.new("nb_qmodel *[1]")
  check(C.nb_qmodel_new(ctx(), p, out))
  nibble.note_native()
  local st = watch(model)
  local function finalize(q)
    if st.dead or (type(model) == "table" and rawget(model, "_p") == nil) then C.nb_qmodel_detach(q) end
    C.nb_qmodel_free(q)
    local _ = model
  end
  return setmetatable({ _p = ffi.gc(out[0], finalize), model = model }, QModel)
end

function M.is_qmodel(x) return getmetatable(x) == QModel end

-- free(): drop the C object now (hooks are removed); the model stays.
function QModel:free()
  local p = rawget(self, "_p")
  if p ~= nil then
    self._p = nil
    C.nb_qmodel_free(ffi.gc(p, nil))
  end
end

function QModel:count() return tonumber(C.nb_qmodel_count(qp(self))) end
function QModel:name(i) return ffi.string(C.nb_qmodel_name(qp(self), i - 1)) end
-- find(name): 1-based index of a linear module, or nil.
function QModel:find(name)
  local i = tonumber(C.nb_qmodel_find(qp(self), name))
  return i >= 0 and i + 1 or nil
end

local function index_of(self, name_or_i)
  if type(name_or_i) == "number" then return name_or_i - 1 end
  local i = C.nb_qmodel_find(qp(self), name_or_i)
  if i < 0 then fail(("qmodel: no linear module named %s"):format(tostring(name_or_i))) end
  return i
end

-- spec(name or i): {weight = "nvfp4" | ..., static = bool, input = name | nil, floor = bool} or nil
-- when unquantized; reason(name or i): why it is unquantized (nil when quantized).
function QModel:spec(which)
  local s = C.nb_qmodel_spec(qp(self), index_of(self, which))
  if s == nil or s.weight_format == C.NB_FMT_NONE then return nil end
  return { weight = format_name[tonumber(s.weight_format)], static = s.weight_static ~= 0,
           input = s.input_format ~= C.NB_FMT_NONE and format_name[tonumber(s.input_format)] or nil,
           floor = s.mx_floor ~= 0, pass_through_bwd = s.pass_through_bwd ~= 0 }
end
function QModel:reason(which)
  local r = C.nb_qmodel_reason(qp(self), index_of(self, which))
  return r ~= nil and ffi.string(r) or nil
end

-- modules(): {{name, spec, reason}, ...} in model order.
function QModel:modules()
  local out = {}
  for i = 1, self:count() do out[i] = { name = self:name(i), spec = self:spec(i), reason = self:reason(i) } end
  return out
end

-- set(name, spec): spec {weight = format, static = bool (NVFP4 per-block calibrated amax),
-- input = format | nil, floor = bool (MXFP8 OCP rule), pass_through_bwd = bool}.
function QModel:set(name, spec)
  if type(spec) ~= "table" then fail("qmodel:set(name, spec): spec must be a table {weight = ..., input = ...}") end
  for k in pairs(spec) do
    if k ~= "weight" and k ~= "static" and k ~= "input" and k ~= "floor" and k ~= "pass_through_bwd" then
      fail(("qmodel:set: unknown spec key '%s' (weight, static, input, floor, pass_through_bwd)"):format(tostring(k)))
    end
  end
  local s = ffi.new("nb_qspec")
  C.nb_qspec_init(s)
  s.weight_format = to_format(spec.weight, name)
  s.weight_static = spec.static and 1 or 0
  s.input_format = to_format(spec.input, name)
  s.mx_floor = spec.floor and 1 or 0
  if spec.pass_through_bwd ~= nil then s.pass_through_bwd = spec.pass_through_bwd and 1 or 0 end
  check(C.nb_qmodel_set(ctx(), qp(self), name, s))
  return self
end

function QModel:exclude(name, reason)
  check(C.nb_qmodel_exclude(ctx(), qp(self), name, reason))
  return self
end

-- fuse_siblings(): q/k/v and gate/up share global scales; returns the number of groups made.
function QModel:fuse_siblings()
  local n = ffi.new("int64_t[1]")
  check(C.nb_qmodel_fuse_siblings(ctx(), qp(self), n))
  return tonumber(n[0])
end

-- Calibration. calibrate_begin(algorithm) installs input observers; run forward passes; then
-- calibrate_end() calibrates the weights with the algorithm and writes the input amaxes.
-- calibrate_weights(algorithm) calibrates weights only (weight-only formats need no data).
function QModel:calibrate_begin(algorithm)
  check(C.nb_qmodel_calibrate_begin(ctx(), qp(self), calib_config(algorithm)))
  return self
end
function QModel:calibrate_end()
  check(C.nb_qmodel_calibrate_end(ctx(), qp(self)))
  return self
end
function QModel:calibrate_weights(algorithm)
  check(C.nb_qmodel_calibrate_weights(ctx(), qp(self), calib_config(algorithm)))
  return self
end
-- uncovered(): modules whose input quantizer saw no calibration token in the last calibration.
function QModel:uncovered()
  local p, out = qp(self), {}
  for i = 0, tonumber(C.nb_qmodel_uncovered_count(p)) - 1 do out[#out + 1] = ffi.string(C.nb_qmodel_uncovered(p, i)) end
  return out
end

-- needs_data(): true when some enabled quantizer observes activations (an input quantizer, or the
-- KV cache's).
function QModel:needs_data()
  local p = qp(self)
  for i = 0, tonumber(C.nb_qmodel_count(p)) - 1 do
    local q = C.nb_qmodel_input_quantizer(p, i)
    if q ~= nil and C.nb_quantizer_enabled(q) ~= 0 then return true end
  end
  return self:kv_format() ~= nil
end

-- KV cache quantization. set_kv("fp8"): a per-tensor FP8 quantizer for the keys (after RoPE) and one
-- for the values of every layer (ModelOpt's k_bmm_quantizer / v_bmm_quantizer), calibrated with the
-- input quantizers, fake-quantized by set_fake, exported as k_scale / v_scale. set_kv(nil | false |
-- "none") removes them. kv_format(): "fp8" or nil. kv_quantizer(layer, "k" | "v"): layer is the N of
-- model.layers.N (0-based), as a nibble.quant object (nil when off).
function QModel:set_kv(fmt)
  local f = C.NB_FMT_NONE
  if fmt ~= nil and fmt ~= false and fmt ~= "none" then
    local kv = formats.kv_presets[fmt]
    if not kv then
      local names = {}
      for k in pairs(formats.kv_presets) do names[#names + 1] = k end
      table.sort(names)
      fail(("qmodel:set_kv: unknown KV cache format %s (%s, or nil for none)"):format(tostring(fmt), table.concat(names, ", ")))
    end
    f = formats.format_ids[kv.weight_format]
  end
  check(C.nb_qmodel_set_kv(ctx(), qp(self), f))
  return self
end
function QModel:kv_format()
  local f = tonumber(C.nb_qmodel_kv_format(qp(self)))
  for name, kv in pairs(formats.kv_presets) do
    if formats.format_ids[kv.weight_format] == f then return name end
  end
  return nil
end
function QModel:kv_quantizer(layer, which)
  if which ~= "k" and which ~= "v" then fail("qmodel:kv_quantizer(layer, which): which is \"k\" or \"v\"") end
  local q = C.nb_qmodel_kv_quantizer(qp(self), layer, which == "v" and 1 or 0)
  return q ~= nil and nibble.quant.wrap(q) or nil
end

function QModel:set_fake(on)
  check(C.nb_qmodel_set_fake(ctx(), qp(self), (on == nil or on) and 1 or 0))
  return self
end
-- fake(): whether the model's forward runs the quantizers now (ptq.run leaves them on).
function QModel:fake() return C.nb_qmodel_fake(qp(self)) ~= 0 end

-- check(): the export guard (raises NB_ERR_UNCALIBRATED naming module and attribute).
function QModel:check()
  check(C.nb_qmodel_check(ctx(), qp(self)))
  return self
end

-- Borrowed quantizers as nibble.quant objects (each holds its own reference).
function QModel:weight_quantizer(which)
  local q = C.nb_qmodel_weight_quantizer(qp(self), index_of(self, which))
  return q ~= nil and nibble.quant.wrap(q) or nil
end
function QModel:input_quantizer(which)
  local q = C.nb_qmodel_input_quantizer(qp(self), index_of(self, which))
  return q ~= nil and nibble.quant.wrap(q) or nil
end

local layouts = { modelopt = C.NB_LAYOUT_MODELOPT, ["compressed-tensors"] = C.NB_LAYOUT_COMPRESSED_TENSORS,
                  compressed_tensors = C.NB_LAYOUT_COMPRESSED_TENSORS, ct = C.NB_LAYOUT_COMPRESSED_TENSORS }

-- "10GB", "500MB", "5GiB", 1e9 -> bytes (transformers' max_shard_size spelling: GB = 10^9).
local function parse_size(v)
  if v == nil then return 0 end
  if type(v) == "number" then return v end
  local num, unit = tostring(v):match("^%s*([%d%.]+)%s*(%a*)%s*$")
  local mult = ({ [""] = 1, B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12, KIB = 1024, MIB = 1024 ^ 2,
                  GIB = 1024 ^ 3, TIB = 1024 ^ 4 })[(unit or ""):upper()]
  if not num or not mult then fail(("max_shard_size: cannot read %q (e.g. \"5GB\", \"500MB\")"):format(tostring(v))) end
  return math.floor(tonumber(num) * mult)
end
M.parse_size = parse_size

-- the dtypes an export writes unquantized tensors in (PyTorch's names accepted too)
M.export_dtypes = { bf16 = "bf16", f16 = "f16", f32 = "f32", bfloat16 = "bf16", float16 = "f16", float32 = "f32" }

-- The folders exports completed in this process, in order: a Ctrl-C that arrives after one says the
-- export is complete (nibble.cli.interrupt_message). Appended by a function the host's Ctrl-C hook lets
-- finish, so a completed export is never missed.
M.completed_exports = {}
local export_call = nibble.critical(function(c, p, dir, o)
  local s = C.nb_qmodel_export(c, p, dir, o)
  if s == 0 then M.completed_exports[#M.completed_exports + 1] = dir end
  return s
end)

-- export(dir, opts): opts layout ("modelopt" | "compressed-tensors"), allow_uncalibrated,
-- max_shard_size ("10GB"), dtype ("bf16" | "f16" | "f32": the unquantized tensors and config.json's
-- torch_dtype; default the source's when it is BF16 or F16, else bf16),
-- source_dir (config/tokenizer files; default the model's directory), allow_nonfinite (write NaN/Inf
-- values instead of failing). Atomic and durable; missing parent folders are created. Returns the list
-- of modules left unquantized because allow_uncalibrated was set, and the list of tensors written
-- with NaN/Inf because allow_nonfinite was set.
function QModel:export(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" then fail("qmodel:export(dir [, opts]): dir must be a path") end
  local o = ffi.new("nb_export_opts")
  C.nb_export_opts_init(o)
  if opts.layout ~= nil then
    local l = layouts[opts.layout]
    if l == nil then fail(("unknown export layout %s (modelopt, compressed-tensors)"):format(tostring(opts.layout))) end
    o.layout = l
  end
  o.allow_uncalibrated = opts.allow_uncalibrated and 1 or 0
  o.allow_nonfinite = opts.allow_nonfinite and 1 or 0
  o.max_shard_bytes = parse_size(opts.max_shard_size)
  if opts.dtype ~= nil then
    local d = M.export_dtypes[opts.dtype]
    if not d then fail(("unknown export dtype %s (bf16, f16, f32)"):format(tostring(opts.dtype))) end
    o.dtype = nibble.dtype(d)
  end
  local keep = opts.source_dir
  if keep ~= nil then o.source_dir = keep end
  check(export_call(ctx(), qp(self), dir, o))
  keep = nil
  local p, skipped = qp(self), {}
  for i = 0, tonumber(C.nb_qmodel_export_skipped_count(p)) - 1 do
    skipped[#skipped + 1] = ffi.string(C.nb_qmodel_export_skipped(p, i))
  end
  local nonfinite = {}
  for i = 0, tonumber(C.nb_qmodel_export_nonfinite_count(p)) - 1 do
    nonfinite[#nonfinite + 1] = ffi.string(C.nb_qmodel_export_nonfinite(p, i))
  end
  return skipped, nonfinite
end

-- save(path) / restore(path): nibble's own checkpoint (weights + every quantizer's state + specs).
function QModel:save(path)
  check(C.nb_qmodel_save(ctx(), qp(self), path))
  return self
end
function QModel:restore(path)
  check(C.nb_qmodel_restore(ctx(), qp(self), path))
  return self
end

function QModel:__tostring()
  local p = rawget(self, "_p")
  if p == nil then return "qmodel<freed>" end
  local n, q = tonumber(C.nb_qmodel_count(p)), 0
  for i = 0, n - 1 do if C.nb_qmodel_weight_quantizer(p, i) ~= nil then q = q + 1 end end
  return ("qmodel<%d linear modules, %d quantized>"):format(n, q)
end

-- ---- read-back ------------------------------------------------------------------------------------

-- probe(st_path_or_dir, module): how a module is stored in an exported checkpoint:
-- {format = "nvfp4" | "mxfp8" | "fp8" | "fp8_channel" | nil, layout, input_format, input_scale}.
function M.probe(path, module)
  local out = ffi.new("nb_st *[1]")
  check(C.nb_st_open(ctx(), path, out))
  local st = ffi.gc(out[0], C.nb_st_close)
  local info = ffi.new("nb_readback_info")
  check(C.nb_readback_probe(ctx(), st, module, info))
  C.nb_st_close(ffi.gc(st, nil))
  return M.info_table(info)
end

function M.info_table(info)
  local f = tonumber(info.format)
  return { format = f ~= 0 and format_name[f] or nil,
           layout = info.layout == C.NB_LAYOUT_COMPRESSED_TENSORS and "compressed-tensors" or "modelopt",
           input_format = info.input_format ~= 0 and format_name[tonumber(info.input_format)] or nil,
           input_scale = info.input_scale ~= 0 and tonumber(info.input_scale) or nil }
end

-- The f32 amax whose exported scale (amax / 448, or amax / (6 * 448) for NVFP4) is exactly s: the
-- product s * k, nudged an ulp at a time when float32 rounding does not give s back. Some scales
-- (e.g. compressed-tensors' 1 / (1 / s)) no amax reaches: then the nearest one is kept. Returns
-- whether the scale is exact.
local function amax_for_scale(q, s, k)
  local v = ffi.new("float[1]", s * k)
  local u = ffi.new("union { float f; int32_t i; }")
  local t = nibble.tensor(0, "f32")
  local got = ffi.new("float[1]")
  local best, best_err = v[0], math.huge
  for _ = 1, 8 do
    t:set(v[0])
    check(C.nb_quantizer_set_state(ctx(), q, "amax", t.ptr))
    check(C.nb_quantizer_scale(ctx(), q, got))
    local e = math.abs(got[0] - s)
    if e < best_err then best, best_err = v[0], e end
    if e == 0 then return true end
    u.f = v[0]
    u.i = u.i + (got[0] < s and 1 or -1)
    v[0] = u.f
  end
  t:set(best)
  check(C.nb_quantizer_set_state(ctx(), q, "amax", t.ptr))
  return false
end

M.amax_for_scale = amax_for_scale

-- activations(model [, path [, opts]]): the activation quantization an exported checkpoint ships (W4A4
-- NVFP4 or W8A8 FP8 input scales, and the FP8 KV cache's k_scale / v_scale), installed on the read-back
-- model as fake quant with exactly the stored scales (the weights were already dequantized when the
-- model was loaded): the inputs of those linear modules, and the keys and values of every attention
-- layer as vLLM stores them in an FP8 cache. opts.kv = false leaves the KV cache unquantized. Returns
-- the qmodel that holds the hooks (keep it alive), the number of modules with quantized inputs and the
-- number of layers with a quantized KV cache, or nil, 0, 0 when the checkpoint stores none of that
-- (weight-only formats, or not an export). A checkpoint with the scales of only some layers is an error.
function M.activations(model, path, opts)
  opts = opts or {}
  local m = model_ptr(model)
  path = path or (type(model) == "table" and model.path) or ffi.string(C.nb_model_path(m))
  if C.nb_model_format_of(m) ~= C.NB_MODEL_HF or path == "" then return nil, 0, 0 end
  local out = ffi.new("nb_st *[1]")
  if C.nb_st_open(ctx(), path, out) ~= 0 then
    C.nb_ctx_clear_error(ctx())
    return nil, 0, 0
  end
  local st = ffi.gc(out[0], C.nb_st_close)
  local qm, n, nkv = nil, 0, 0
  local info = ffi.new("nb_readback_info")
  -- an input scale is amax / (maxbound * largest block scale), or amax / maxbound for a per-tensor format
  local mul = {}
  for id, e in pairs(formats.by_id) do mul[id] = e.maxbound * (e.scale_norm > 0 and e.scale_norm or 1) end
  local ok, err = pcall(function()
    local probe = M.new(model)
    for i = 1, probe:count() do
      local name = probe:name(i)
      check(C.nb_readback_probe(ctx(), st, name, info))
      if info.input_format ~= C.NB_FMT_NONE then
        qm = qm or probe
        local wf = format_name[tonumber(info.format)]
        qm:set(name, { weight = wf, input = format_name[tonumber(info.input_format)] })
        local p = qp(qm)
        -- the weights are already what shipped: only the activations are quantized now
        C.nb_quantizer_set_enabled(C.nb_qmodel_weight_quantizer(p, i - 1), 0)
        local iq = C.nb_qmodel_input_quantizer(p, i - 1)
        amax_for_scale(iq, info.input_scale, mul[tonumber(info.input_format)])
        n = n + 1
      end
    end
    -- the FP8 KV cache: every layer's k_scale and v_scale, or none
    local layers = tonumber(C.nb_model_get_config(m).n_layers)
    local sc, found, missing = ffi.new("float[1]"), {}, nil
    for l = 0, layers - 1 do
      for w = 0, 1 do
        local rc = C.nb_readback_kv_scale(ctx(), st, l, w, sc, nil)
        if rc == C.NB_ERR_NOT_FOUND then
          C.nb_ctx_clear_error(ctx())
          missing = missing or ("model.layers.%d.self_attn %s"):format(l, w == 0 and "k_scale" or "v_scale")
        else
          check(rc)
          found[#found + 1] = { l, w, sc[0] }
        end
      end
    end
    if #found > 0 and missing then
      fail(("%s: the checkpoint has KV cache scales for some layers but no %s"):format(path, missing))
    end
    if #found > 0 and opts.kv ~= false then
      qm = qm or probe
      qm:set_kv("fp8")
      for _, e in ipairs(found) do
        amax_for_scale(C.nb_qmodel_kv_quantizer(qp(qm), e[1], e[2]), e[3], 448)
      end
      nkv = layers
    end
    if qm then qm:set_fake(true) else probe:free() end
  end)
  C.nb_st_close(ffi.gc(st, nil))
  if not ok then error(err, 0) end
  return qm, n, nkv
end

return M

-- nibble.quant: the quantizers (nibble/quant.h, nibble/parambuf.h) from Lua, for scripts and the REPL.
--   local q = nibble.quant.nvfp4 { name = "q_proj.weight_quantizer" }     -- dynamic NVFP4 (ModelOpt W4A16/W4A4)
--   q:calibrate(w)                     -- max calibration: amax = max |w|
--   local qt = q:quantize(w)           -- qt.data (U8 packed), qt.scale (E4M3), qt.scale2 (weight_scale_2)
--   local y = q:dequantize(qt)         -- == q:fake(w), bit for bit
--   print(q:report(w))                 -- error per block, worst blocks first
-- Formats: nvfp4, four_over_six (nvfp4_46), mxfp8, fp8 (per tensor), fp8_channel. Calibration state is a
-- Lua table {amax =, block_amax =, global_amax =} (numbers for one value, tensors otherwise).
local ffi = require("ffi")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local Q = {}

-- ---- argument checks ------------------------------------------------------------------------------
-- Every public function checks its arguments with argcheck, so a wrong type is one line naming the
-- function and what it expected, at the caller's line (fail), never a traceback from inside this file.

local QT, Quantizer, Observer, Group, PB = {}, {}, {}, {}, {}

-- describe(v): what v is, for messages ("nil", "a tensor", "a quantizer", "a string", ...).
local function describe(v)
  if v == nil then return "nil" end
  if nibble.is_tensor(v) then return "a tensor" end
  local mt = type(v) == "table" and getmetatable(v)
  if mt == QT then return "a quantized tensor" end
  if mt == Quantizer then return "a quantizer" end
  if mt == Observer then return "an observer" end
  if mt == Group then return "a quantizer group" end
  if mt == PB then return "a parameter buffer" end
  if type(v) == "table" then return next(v) == nil and "an empty table" or "a table" end
  local t = type(v)
  return (t == "cdata" or t == "userdata") and t or ("a " .. t)
end

local kinds = {
  tensor = { "a tensor", function(v) return nibble.is_tensor(v) end },
  qtensor = { "a quantized tensor", function(v) return type(v) == "table" and getmetatable(v) == QT end },
  quantizer = { "a quantizer", function(v) return type(v) == "table" and getmetatable(v) == Quantizer end },
  number = { "a number", function(v) return type(v) == "number" end },
  string = { "a string", function(v) return type(v) == "string" end },
  table = { "a table", function(v) return type(v) == "table" and getmetatable(v) == nil end },
  amax = { "a number, a tensor or a table of numbers", function(v)
    return type(v) == "number" or nibble.is_tensor(v) or (type(v) == "table" and getmetatable(v) == nil) end },
}

-- argcheck(fn, what, v, kind [, optional]): v when it is of `kind` (or nil when optional); otherwise
-- "fn: what must be <kind>, got <v>" at the caller's line.
local function argcheck(fn, what, v, kind, optional)
  if v == nil and optional then return v end
  local k = kinds[kind]
  if not k[2](v) then
    fail(("%s: %s must be %s%s, got %s"):format(fn, what, k[1], optional and " or nil" or "", describe(v)))
  end
  return v
end

-- selfcheck(fn, self, mt): a method called with '.' instead of ':' gets its first argument as self.
local function selfcheck(fn, self, mt, noun)
  if type(self) ~= "table" or getmetatable(self) ~= mt then
    fail(("%s: called on %s, not %s (call it with a colon: x:%s(...))"):format(fn, describe(self), noun,
      fn:match("[:.](.*)$") or fn))
  end
end

-- ---- formats --------------------------------------------------------------------------------------

local format_names = {}
Q.formats = {}
for f = 1, C.NB_FMT_COUNT - 1 do
  local tr = C.nb_qformat_info(f)
  local name = ffi.string(tr.name)
  format_names[f] = name
  Q.formats[#Q.formats + 1] = name
end

local function to_format(x)
  if type(x) == "number" and format_names[x] then return x end
  local f = type(x) == "string" and C.nb_qformat_from_name(x) or -1
  if f <= 0 then
    local aliases = {}
    for _, a in ipairs(require("nibble.formats").aliases) do aliases[#aliases + 1] = a.alias .. " = " .. a.format end
    fail(("unknown quantization format %s (one of %s; %s)")
      :format(tostring(x), table.concat(Q.formats, ", "), table.concat(aliases, ", ")))
  end
  return f
end
Q.format = to_format

-- info(fmt): the traits row as a table {name, block_size, elem_dtype, data_dtype, scale_dtype, elem_max, scale_norm, disk}.
function Q.info(fmt)
  local tr = C.nb_qformat_info(to_format(fmt))
  return { name = ffi.string(tr.name), disk = format_names[tonumber(tr.disk_format)], block_size = tonumber(tr.block_size),
           elem_dtype = nibble.dtype_name(tr.elem_dtype), data_dtype = nibble.dtype_name(tr.data_dtype),
           scale_dtype = nibble.dtype_name(tr.scale_dtype), elem_max = tonumber(tr.elem_max),
           scale_norm = tonumber(tr.scale_norm) }
end

-- ---- quantized tensors ------------------------------------------------------------------------------

QT.__index = QT

local function wrap_qtensor(p)
  local self = setmetatable({ ptr = ffi.gc(p, C.nb_qtensor_release) }, QT)
  self.format = format_names[tonumber(p.format)]
  local shape = {}
  for d = 0, p.ndim - 1 do shape[d + 1] = tonumber(p.shape[d]) end
  self.shape = setmetatable(shape, nibble.shape_mt)
  self.data = nibble.wrap(p.data, true)      -- U8 [..., n/2] (NVFP4) or E4M3 [..., n]
  self.scale = nibble.wrap(p.scale, true)    -- E4M3 / U8 (E8M0) block scales, or F32 weight_scale
  if p.scale2 ~= nil then self.scale2 = tonumber(ffi.cast("float *", C.nb_tensor_data(p.scale2))[0]) end
  nibble.note_native()
  return self
end

function QT:numel() return tonumber(C.nb_qtensor_numel(self.ptr)) end
-- dequantize([dtype]): code * block scale * weight_scale_2 in f32, then dtype (f32 by default).
function QT:dequantize(dt)
  selfcheck("qtensor:dequantize", self, QT, "a quantized tensor")
  argcheck("qtensor:dequantize", "argument 1 (dtype)", dt, "string", true)
  return nibble.tcall(C.nb_qtensor_dequantize, self.ptr, nibble.dtype(dt or "f32"))
end
function QT:__tostring()
  return ("qtensor<%s>%s%s"):format(self.format, tostring(self.shape),
    self.scale2 and (" weight_scale_2=%.9g"):format(self.scale2) or "")
end

-- ---- parameters for the standalone functions ----------------------------------------------------------

local function f32_tensor(v)
  if nibble.is_tensor(v) then return v.dtype == "f32" and v:contiguous() or v:to("f32") end
  if type(v) == "number" then return nibble.tensor(v, "f32") end
  return nibble.tensor(v, "f32")
end

local function div_dtype(fn, v)
  if v == nil or v == "auto" then return -1 end
  local ok, d = pcall(nibble.dtype, v)
  if not ok or not (d == C.NB_F32 or d == C.NB_BF16 or d == C.NB_F16) then
    fail(("%s: option 'div' must be auto, f32, bf16 or f16, got '%s'"):format(fn, tostring(v)))
  end
  return d
end

-- params(fn, fmt, opts) -> nb_qparams, keep (tensors it points to)
local function make_params(fn, fmt, opts)
  opts = argcheck(fn, "argument 3 (options)", opts, "table", true) or {}
  local p = ffi.new("nb_qparams")
  C.nb_qparams_init(p, to_format(fmt))
  local keep = {}
  for _, k in ipairs({ "amax", "global_amax" }) do argcheck(fn, "option '" .. k .. "'", opts[k], "number", true) end
  for _, k in ipairs({ "block_amax", "channel_amax" }) do argcheck(fn, "option '" .. k .. "'", opts[k], "amax", true) end
  argcheck(fn, "option 'name'", opts.name, "string", true)
  argcheck(fn, "option 'div'", opts.div, "string", true)
  if opts.amax then p.amax = opts.amax end
  if opts.global_amax then p.global_amax = opts.global_amax end
  if opts.block_amax then keep.b = f32_tensor(opts.block_amax); p.block_amax = keep.b.ptr end
  if opts.channel_amax then keep.c = f32_tensor(opts.channel_amax); p.channel_amax = keep.c.ptr end
  p.mx_floor = opts.floor and 1 or 0
  p.fp8_div_dtype = div_dtype(fn, opts.div)
  if opts.name then keep.name = ffi.new("char[?]", #opts.name + 1, opts.name); p.name = keep.name end
  return p, keep
end

-- quantize(t, fmt [, opts]): one tensor with explicit parameters (no calibration object). opts: amax,
-- global_amax, block_amax, channel_amax (absent = from the data), floor (MXFP8 OCP rule), div (FP8), name.
function Q.quantize(t, fmt, opts)
  argcheck("quant.quantize", "argument 1", t, "tensor")
  local p, keep = make_params("quant.quantize", fmt, opts)
  local out = ffi.new("nb_qtensor *[1]")
  check(C.nb_quantize(nibble.ctx, t.ptr, p, out))
  keep = nil
  return wrap_qtensor(out[0])
end

-- fake(t, fmt [, opts [, out]]): dequantize(quantize(t)) in t's dtype (or into out).
function Q.fake(t, fmt, opts, out)
  argcheck("quant.fake", "argument 1", t, "tensor")
  argcheck("quant.fake", "argument 4 (out)", out, "tensor", true)
  local p, keep = make_params("quant.fake", fmt, opts)
  out = out or nibble.zeros(t.dtype, t.shape)
  check(C.nb_fake_quant(nibble.ctx, t.ptr, p, out.ptr))
  keep = nil
  return out
end

-- ---- quantizers ------------------------------------------------------------------------------------------

Quantizer.__index = function(self, k)
  local m = Quantizer[k]
  if m ~= nil then return m end
  if k == "enabled" then return C.nb_quantizer_enabled(self.ptr) ~= 0 end
  if k == "group" then
    local g = C.nb_quantizer_group(self.ptr)
    return g ~= nil and ffi.string(C.nb_qgroup_name(g)) or nil
  end
  return nil
end
Quantizer.__tostring = function(self)
  local miss = C.nb_quantizer_missing(self.ptr)
  return ("quantizer<%s%s> '%s'%s%s"):format(self.format, self.static and ", static" or "", self.name,
    self.enabled and "" or " (disabled)", miss ~= nil and (" uncalibrated: " .. ffi.string(miss)) or "")
end

local state_names = {}
for i = 0, 8 do
  local n = C.nb_quantizer_state_name(i)
  if n == nil then break end
  state_names[#state_names + 1] = ffi.string(n)
end
Q.state_names = state_names   -- {"amax", "block_amax", "global_amax"}

-- new(fmt [, opts]): opts name, static (NVFP4: calibrated per-block amax), floor (MXFP8 OCP rule),
-- div ("auto" | "f32" | "bf16" | "f16": the dtype FP8's w/s is rounded to, ModelOpt's export quirk),
-- pass_through_bwd (default true: plain STE; false zeroes gradients where |x| > amax), enabled.
local function new_quantizer(fn, fmt, opts)
  opts = argcheck(fn, "argument 1 (options)", opts, "table", true) or {}
  argcheck(fn, "option 'name'", opts.name, "string", true)
  argcheck(fn, "option 'div'", opts.div, "string", true)
  argcheck(fn, "option 'state'", opts.state, "table", true)
  local f = to_format(fmt)
  local cfg = ffi.new("nb_quantizer_config")
  C.nb_quantizer_config_init(cfg, f)
  if opts.static ~= nil then cfg.is_static = opts.static and 1 or 0 end
  cfg.mx_floor = opts.floor and 1 or 0
  cfg.fp8_div_dtype = div_dtype(fn, opts.div)
  if opts.pass_through_bwd ~= nil then cfg.pass_through_bwd = opts.pass_through_bwd and 1 or 0 end
  if opts.enabled ~= nil then cfg.enabled = opts.enabled and 1 or 0 end
  local name = opts.name or (format_names[f] .. "_quantizer")
  local out = ffi.new("nb_quantizer *[1]")
  check(C.nb_quantizer_new(nibble.ctx, name, cfg, out))
  local self = setmetatable({ ptr = ffi.gc(out[0], C.nb_quantizer_release), name = name, format = format_names[f],
                              static = cfg.is_static ~= 0 }, Quantizer)
  if opts.state then self:set_state(opts.state) end
  return self
end
function Q.new(fmt, opts)
  argcheck("quant.new", "argument 2 (options)", opts, "table", true)
  return new_quantizer("quant.new", fmt, opts)
end

function Q.nvfp4(opts)
  argcheck("quant.nvfp4", "argument 1 (options)", opts, "table", true)
  return new_quantizer("quant.nvfp4", opts and opts.four_over_six and "nvfp4_46" or "nvfp4", opts)
end
function Q.four_over_six(opts) return new_quantizer("quant.four_over_six", "nvfp4_46", opts) end
function Q.mxfp8(opts) return new_quantizer("quant.mxfp8", "mxfp8", opts) end
function Q.fp8(opts)
  argcheck("quant.fp8", "argument 1 (options)", opts, "table", true)
  return new_quantizer("quant.fp8", opts and opts.per_channel and "fp8_channel" or "fp8", opts)
end
function Q.is_quantizer(x) return getmetatable(x) == Quantizer end

-- wrap(ptr): a quantizer another object owns (e.g. a qmodel's), as a Lua object holding its own reference.
function Q.wrap(p)
  local cfg = ffi.new("nb_quantizer_config")
  C.nb_quantizer_get_config(p, cfg)
  C.nb_quantizer_retain(p)
  -- a new cdata for the pointer (ffi.new: ffi.cast returns p itself when the type matches): ffi.gc on p
  -- would replace the finalizer p may already carry (another handle's), whose reference then leaks
  return setmetatable({ ptr = ffi.gc(ffi.new("nb_quantizer *", p), C.nb_quantizer_release), name = ffi.string(C.nb_quantizer_name(p)),
                        format = format_names[tonumber(cfg.format)], static = cfg.is_static ~= 0 }, Quantizer)
end

function Quantizer:enable(on)
  selfcheck("quantizer:enable", self, Quantizer, "a quantizer")
  C.nb_quantizer_set_enabled(self.ptr, on == false and 0 or 1)
  return self
end
function Quantizer:disable() return self:enable(false) end

-- missing(): nil when calibrated, else the attribute ("amax", "block_amax", "global_amax").
function Quantizer:missing()
  selfcheck("quantizer:missing", self, Quantizer, "a quantizer")
  local m = C.nb_quantizer_missing(self.ptr)
  return m ~= nil and ffi.string(m) or nil
end
function Quantizer:check()
  selfcheck("quantizer:check", self, Quantizer, "a quantizer")
  check(C.nb_quantizer_check(nibble.ctx, self.ptr))
  return self
end
function Quantizer:global_amax()
  selfcheck("quantizer:global_amax", self, Quantizer, "a quantizer")
  local v = ffi.new("float[1]")
  check(C.nb_quantizer_global_amax(nibble.ctx, self.ptr, v))
  return tonumber(v[0])
end
-- scale(): what export writes per tensor (weight_scale_2 / input_scale / fp8 weight_scale).
function Quantizer:scale()
  selfcheck("quantizer:scale", self, Quantizer, "a quantizer")
  local v = ffi.new("float[1]")
  check(C.nb_quantizer_scale(nibble.ctx, self.ptr, v))
  return tonumber(v[0])
end

-- state(): {amax =, block_amax =, global_amax =} with one-value attributes as numbers, others as tensors.
function Quantizer:state()
  selfcheck("quantizer:state", self, Quantizer, "a quantizer")
  local s = {}
  for _, name in ipairs(state_names) do
    if C.nb_quantizer_has_state(self.ptr, name) ~= 0 then
      local t = nibble.tcall(C.nb_quantizer_get_state, self.ptr, name)
      s[name] = (t:numel() == 1 and t.ndim == 0) and t:get() or t
    end
  end
  return s
end

-- set_state(s): restore from state() (numbers, tensors or nested tables); attributes absent from s
-- are cleared, so a restore is exact.
function Quantizer:set_state(s)
  local fn = "quantizer:set_state"
  selfcheck(fn, self, Quantizer, "a quantizer")
  argcheck(fn, "argument 1 (a table like q:state())", s, "table")
  for k, v in pairs(s) do
    local known = false
    for _, n in ipairs(state_names) do known = known or n == k end
    if not known then
      fail(("%s: unknown attribute '%s' (one of %s)"):format(fn, tostring(k), table.concat(state_names, ", ")))
    end
    argcheck(fn, "attribute '" .. k .. "'", v, "amax")
  end
  for _, name in ipairs(state_names) do
    local v = s[name]
    if v == nil then
      check(C.nb_quantizer_clear_state(nibble.ctx, self.ptr, name))
    else
      check(C.nb_quantizer_set_state(nibble.ctx, self.ptr, name, f32_tensor(v).ptr))
    end
  end
  return self
end
function Quantizer:reset()
  selfcheck("quantizer:reset", self, Quantizer, "a quantizer")
  check(C.nb_quantizer_clear_state(nibble.ctx, self.ptr, nil))
  return self
end

local methods = require("nibble.formats").algorithms

Observer.__index = Observer

-- observer([method [, opts]]): an accumulating calibrator: ob:collect(t) per batch, ob:finish().
-- method "max" | "mse" | "four_over_six" (default: four_over_six for a static nvfp4_46 quantizer, else
-- max; a dynamic nvfp4_46 quantizer picks M=6/M=4 per block when it quantizes, so max is its calibration);
-- opts (mse): start, stop, step (ModelOpt: 0.25, 4.0, 0.1), metric = "modelopt" | "export".
-- The searches try multiples of the max the observer saw over all its batches (kept until finish), so
-- repeating one on the same data gives the same state.
local function new_observer(fn, self, method, opts)
  argcheck(fn, "argument 2 (method)", method, "string", true)
  opts = argcheck(fn, "argument 3 (options)", opts, "table", true) or {}
  for _, k in ipairs({ "start", "stop", "step" }) do argcheck(fn, "option '" .. k .. "'", opts[k], "number", true) end
  argcheck(fn, "option 'metric'", opts.metric, "string", true)
  method = method or ((self.format == "nvfp4_46" and self.static) and "four_over_six" or "max")
  local m = methods[method]
  if m == nil then
    fail(("%s: unknown calibration method %s (%s)"):format(fn, tostring(method),
      table.concat(require("nibble.formats").algorithm_names, ", ")))
  end
  local cfg = ffi.new("nb_calib_config")
  C.nb_calib_config_init(cfg, m)
  if opts.start then cfg.start_multiplier = opts.start end
  if opts.stop then cfg.stop_multiplier = opts.stop end
  if opts.step then cfg.step_size = opts.step end
  if opts.metric == "export" then cfg.metric = C.NB_MSE_EXPORT
  elseif opts.metric ~= nil and opts.metric ~= "modelopt" then
    fail(("%s: option 'metric' must be 'modelopt' or 'export', got '%s'"):format(fn, opts.metric))
  end
  local out = ffi.new("nb_calib *[1]")
  check(C.nb_calib_new(nibble.ctx, self.ptr, cfg, out))
  return setmetatable({ ptr = ffi.gc(out[0], C.nb_calib_free), quantizer = self, method = method }, Observer)
end
function Quantizer:observer(method, opts)
  selfcheck("quantizer:observer", self, Quantizer, "a quantizer")
  return new_observer("quantizer:observer", self, method, opts)
end

function Observer:collect(t)
  selfcheck("observer:collect", self, Observer, "an observer")
  argcheck("observer:collect", "argument 1", t, "tensor")
  check(C.nb_calib_collect(nibble.ctx, self.ptr, t.ptr))
  return self
end
function Observer:finish()
  selfcheck("observer:finish", self, Observer, "an observer")
  check(C.nb_calib_finish(nibble.ctx, self.ptr))
  return self.quantizer
end
function Observer:batches() return tonumber(C.nb_calib_batches(self.ptr)) end
-- choice(): MSE / four_over_six: the chosen candidate per amax element (1-based), after finish.
function Observer:choice()
  local n = ffi.new("int64_t[1]")
  local c = C.nb_calib_choice(self.ptr, n)
  if c == nil then return nil end
  local r = {}
  for i = 0, tonumber(n[0]) - 1 do r[i + 1] = c[i] + 1 end
  return r
end

-- calibrate(t [, method [, opts]]): one batch, then finish. A list of tensors is several batches.
function Quantizer:calibrate(t, method, opts)
  local fn = "quantizer:calibrate"
  selfcheck(fn, self, Quantizer, "a quantizer")
  if not nibble.is_tensor(t) then
    if type(t) ~= "table" or getmetatable(t) ~= nil or t[1] == nil then
      fail(("%s: argument 1 must be a tensor or a non-empty list of tensors, got %s"):format(fn, describe(t)))
    end
    for i = 1, #t do argcheck(fn, ("argument 1[%d]"):format(i), t[i], "tensor") end
  end
  local ob = new_observer(fn, self, method, opts)
  if nibble.is_tensor(t) then ob:collect(t)
  else for _, x in ipairs(t) do ob:collect(x) end end
  ob:finish()
  return self, ob
end

function Quantizer:quantize(t)
  selfcheck("quantizer:quantize", self, Quantizer, "a quantizer")
  argcheck("quantizer:quantize", "argument 1", t, "tensor")
  local out = ffi.new("nb_qtensor *[1]")
  check(C.nb_quantizer_quantize(nibble.ctx, self.ptr, t.ptr, out))
  return wrap_qtensor(out[0])
end

function Quantizer:dequantize(qt, dt)
  selfcheck("quantizer:dequantize", self, Quantizer, "a quantizer")
  argcheck("quantizer:dequantize", "argument 1", qt, "qtensor")
  argcheck("quantizer:dequantize", "argument 2 (dtype)", dt, "string", true)
  return qt:dequantize(dt)
end

-- fake(t [, out]): quantize-dequantize with the export arithmetic, in t's dtype (or into out, t itself allowed).
function Quantizer:fake(t, out)
  selfcheck("quantizer:fake", self, Quantizer, "a quantizer")
  argcheck("quantizer:fake", "argument 1", t, "tensor")
  argcheck("quantizer:fake", "argument 2 (out)", out, "tensor", true)
  out = out or nibble.zeros(t.dtype, t.shape)
  check(C.nb_quantizer_fake(nibble.ctx, self.ptr, t.ptr, out.ptr))
  return out
end

-- backward(x, grad_out [, grad_in]): the straight-through gradient.
function Quantizer:backward(x, g, gi)
  local fn = "quantizer:backward"
  selfcheck(fn, self, Quantizer, "a quantizer")
  argcheck(fn, "argument 1 (x)", x, "tensor")
  argcheck(fn, "argument 2 (grad_out)", g, "tensor")
  argcheck(fn, "argument 3 (grad_in)", gi, "tensor", true)
  gi = gi or nibble.zeros(g.dtype, g.shape)
  check(C.nb_quantizer_backward(nibble.ctx, self.ptr, x.ptr, g.ptr, gi.ptr))
  return gi
end

-- block_errors(t): f32 tensor [..., n/block] (per row for FP8) of the summed squared error of fake
-- quant, plus a summary {sse, mse, max_abs, sqnr_db, worst = {{index, sse}, ...}}.
function Quantizer:block_errors(t)
  selfcheck("quantizer:block_errors", self, Quantizer, "a quantizer")
  argcheck("quantizer:block_errors", "argument 1", t, "tensor")
  local x = t:float():contiguous()
  local y = self:fake(x)
  local shape = x.shape
  local n = shape[#shape]
  local bs = Q.info(self.format).block_size
  if bs == 0 then bs = n end
  local rows = x:numel() / n
  local eshape = {}
  for i = 1, #shape - 1 do eshape[i] = shape[i] end
  eshape[#shape] = n / bs
  local e = nibble.zeros("f32", eshape)
  local xv, yv, ev = x:data("const float *"), y:data("const float *"), e:data("float *")
  local sse, sig, maxabs = 0, 0, 0
  for b = 0, rows * (n / bs) - 1 do
    local s = 0
    for i = b * bs, b * bs + bs - 1 do
      local d = xv[i] - yv[i]
      s = s + d * d
      sig = sig + xv[i] * xv[i]
      if math.abs(d) > maxabs then maxabs = math.abs(d) end
    end
    ev[b] = s
    sse = sse + s
  end
  local count = rows * n
  return e, { sse = sse, mse = sse / count, max_abs = maxabs,
              sqnr_db = sse > 0 and 10 * math.log10(sig / sse) or math.huge }
end

-- report(t [, k]): a printable summary with the k worst blocks (1-based row, block).
function Quantizer:report(t, k)
  selfcheck("quantizer:report", self, Quantizer, "a quantizer")
  argcheck("quantizer:report", "argument 1", t, "tensor")
  k = argcheck("quantizer:report", "argument 2 (count)", k, "number", true) or 5
  local e, s = self:block_errors(t)
  local per_row = e.shape[#e.shape]
  local ev = e:data("const float *")
  local idx = {}
  for i = 0, e:numel() - 1 do idx[#idx + 1] = i end
  table.sort(idx, function(a, b) return ev[a] > ev[b] end)
  local lines = { ("%s: mse %.4g, max |err| %.4g, SQNR %.2f dB over %d blocks"):format(tostring(self), s.mse, s.max_abs,
    s.sqnr_db, e:numel()) }
  for i = 1, math.min(k, #idx) do
    local b = idx[i]
    lines[#lines + 1] = ("  row %d block %d: sse %.4g"):format(math.floor(b / per_row) + 1, b % per_row + 1, ev[b])
  end
  return table.concat(lines, "\n")
end

-- ---- shared-state groups ---------------------------------------------------------------------------

Group.__index = Group

-- group(name, {q1, q2, ...}): fused siblings sharing one per-tensor amax (weight_scale_2 / input_scale).
-- A static member's MSE / four_over_six search uses that shared global amax, so run a max pass on
-- every member first. Adding a member twice changes nothing.
function Q.group(name, members)
  argcheck("quant.group", "argument 1 (name)", name, "string", true)
  argcheck("quant.group", "argument 2 (members)", members, "table", true)
  local out = ffi.new("nb_qgroup *[1]")
  check(C.nb_qgroup_new(nibble.ctx, name or "group", out))
  local self = setmetatable({ ptr = ffi.gc(out[0], C.nb_qgroup_release), name = name or "group", members = {} }, Group)
  for _, q in ipairs(members or {}) do self:add(q) end
  return self
end
function Group:add(q)
  selfcheck("group:add", self, Group, "a quantizer group")
  argcheck("group:add", "argument 1", q, "quantizer")
  check(C.nb_qgroup_add(nibble.ctx, self.ptr, q.ptr))
  for _, m in ipairs(self.members) do if m.ptr == q.ptr then return self end end   -- already a member (C: no-op)
  self.members[#self.members + 1] = q
  return self
end
function Group:remove(q)
  selfcheck("group:remove", self, Group, "a quantizer group")
  argcheck("group:remove", "argument 1", q, "quantizer")
  check(C.nb_qgroup_remove(nibble.ctx, self.ptr, q.ptr))
  for i, m in ipairs(self.members) do if m.ptr == q.ptr then table.remove(self.members, i) break end end
  return self
end
function Group:size() return C.nb_qgroup_size(self.ptr) end

-- ---- parameter buffers --------------------------------------------------------------------------------

PB.__index = PB

-- parambuf(): pb:add(name, fmt_or_nil, dtype, shape), pb:finalize(); maps are 0-based half-open spans.
function Q.parambuf()
  local out = ffi.new("nb_parambuf *[1]")
  check(C.nb_parambuf_new(nibble.ctx, out))
  return setmetatable({ ptr = ffi.gc(out[0], C.nb_parambuf_free) }, PB)
end
function PB:add(name, fmt, dtype, shape)
  local fn = "parambuf:add"
  selfcheck(fn, self, PB, "a parameter buffer")
  argcheck(fn, "argument 1 (name)", name, "string")
  argcheck(fn, "argument 3 (dtype)", dtype, "string", true)
  argcheck(fn, "argument 4 (shape)", shape, "table")
  for i = 1, #shape do argcheck(fn, ("argument 4 (shape)[%d]"):format(i), shape[i], "number") end
  local f = (fmt == nil or fmt == "none" or fmt == false) and C.NB_FMT_NONE or to_format(fmt)
  local n = #shape
  local buf = ffi.new("int64_t[?]", math.max(n, 1))
  for i = 1, n do buf[i - 1] = shape[i] end
  check(C.nb_parambuf_add(nibble.ctx, self.ptr, name, f, nibble.dtype(dtype or "bf16"), n, buf))
  return self
end
function PB:finalize() check(C.nb_parambuf_finalize(nibble.ctx, self.ptr)); return self end
local function span(self, fn, name)
  selfcheck("parambuf", self, PB, "a parameter buffer")
  argcheck("parambuf", "the parameter name", name, "string")
  local a, b = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  check(fn(nibble.ctx, self.ptr, name, a, b))
  return tonumber(a[0]), tonumber(b[0])
end
function PB:index(name) return span(self, C.nb_parambuf_index, name) end
function PB:packed_index(name) return span(self, C.nb_parambuf_packed_index, name) end
function PB:byte_range(name) return span(self, C.nb_parambuf_byte_range, name) end
function PB:view(name)
  selfcheck("parambuf:view", self, PB, "a parameter buffer")
  argcheck("parambuf:view", "argument 1 (name)", name, "string")
  return nibble.tcall(C.nb_parambuf_view, self.ptr, name)
end
function PB:store(name, qt)
  selfcheck("parambuf:store", self, PB, "a parameter buffer")
  argcheck("parambuf:store", "argument 1 (name)", name, "string")
  argcheck("parambuf:store", "argument 2", qt, "qtensor")
  check(C.nb_parambuf_store(nibble.ctx, self.ptr, name, qt.ptr))
  return self
end
function PB:numel() return tonumber(C.nb_parambuf_numel(self.ptr)) end
function PB:packed_numel() return tonumber(C.nb_parambuf_packed_numel(self.ptr)) end
function PB:nbytes() return tonumber(C.nb_parambuf_nbytes(self.ptr)) end
function PB:has_nvfp4() return C.nb_parambuf_has_nvfp4(self.ptr) ~= 0 end
-- maps(): {param_index_map = {name = {start, end}}, packed_index_map = {...}} (0-based, end exclusive).
function PB:maps()
  local u, p = {}, {}
  for i = 0, C.nb_parambuf_count(self.ptr) - 1 do
    local name = ffi.string(C.nb_parambuf_name(self.ptr, i))
    u[name] = { self:index(name) }
    p[name] = { self:packed_index(name) }
  end
  return { param_index_map = u, packed_index_map = p }
end

return Q

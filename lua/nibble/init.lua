-- The `nibble` Lua module: libnibble through the LuaJIT FFI, with declarations generated from the
-- public headers at build time (nibble/cdef.lua in the build tree). It holds the default context,
-- turns failing nb_status codes into Lua errors, and makes nb_tensor a Lua value (a metatype with
-- 1-based indexing, shapes as tables, finalizers) whose native memory nudges the Lua GC.
-- Submodules (nibble.json, nibble.quant, ...) load on first access; see lua/README.md for the API.
local ffi = require("ffi")

local M = {}

-- ---- declarations and library -------------------------------------------------------------------

local def = require("nibble.cdef")
for _, p in ipairs(def.prelude or {}) do pcall(ffi.cdef, p) end
if not pcall(ffi.typeof, "nb_tensor") then ffi.cdef(def.cdef) end
if not pcall(ffi.typeof, "nb_lua_tensor") then
  -- The Lua face of a tensor: a one-pointer struct, because the fields of nb_tensor itself
  -- (shape, dtype, ...) would hide the metatype's __index.
  ffi.cdef("typedef struct nb_lua_tensor { nb_tensor *ptr; } nb_lua_tensor;")
end

local host = package.preload["nibble.host"] and require("nibble.host") or nil

local function has_symbols(lib)
  return pcall(function() return lib.nb_version end)
end

local function open_library()
  if host and has_symbols(ffi.C) then return ffi.C, "(linked into the nibble host)" end
  local tried = {}
  local candidates = {}
  local env = os.getenv("NIBBLE_LIB")
  if env and env ~= "" then candidates[#candidates + 1] = env end
  local okb, info = pcall(require, "nibble.buildinfo")
  if okb and type(info) == "table" and info.lib then candidates[#candidates + 1] = info.lib end
  local p = package.searchpath("libnibble", package.cpath) or package.searchpath("nibble", package.cpath)
  if p then candidates[#candidates + 1] = p end
  candidates[#candidates + 1] = "nibble"
  for _, c in ipairs(candidates) do
    local ok, lib = pcall(ffi.load, c)
    if ok and has_symbols(lib) then return lib, c end
    tried[#tried + 1] = c .. (ok and " (no nb_version)" or (": " .. tostring(lib)))
  end
  -- a program that links libnibble itself (an embedding application)
  if has_symbols(ffi.C) then return ffi.C, "(linked into the program)" end
  error("nibble: cannot find libnibble; set NIBBLE_LIB to its path. Tried:\n  " .. table.concat(tried, "\n  "), 0)
end

local C, libpath = open_library()
M.C = C               -- the FFI namespace of libnibble: nibble.C.nb_tensor_numel(t.ptr), ...
M.libpath = libpath
M.defines = def.defines
M.headers = def.headers
M.version = ffi.string(C.nb_version())
M._VERSION = "nibble " .. M.version

-- ---- errors -------------------------------------------------------------------------------------

-- Errors point at the caller's code, not at nibble's: the level is that of the first stack frame
-- outside lua/nibble/ (the directory of this file, where submodules live too) and outside C.
local own_dir = (debug.getinfo(1, "S").source:match("^@(.*/)[^/]*$")) or "\0"
local function user_level()
  local lvl = 3   -- 1 = user_level, 2 = fail/check: start at their caller
  while true do
    local info = debug.getinfo(lvl, "S")
    if not info then return 0 end   -- only nibble and C frames (tail calls): no position
    local src = info.source
    if info.what ~= "C" and not (src:sub(1, 1) == "@" and src:sub(2, #own_dir + 1) == own_dir) then
      return lvl - 1   -- as counted by error() called from fail/check
    end
    lvl = lvl + 1
  end
end

-- fail(msg): error(msg) positioned at the user's line ("script.lua:3: msg").
local function fail(msg)
  error(msg, user_level())
end
M.fail = fail

-- ---- the default context ----------------------------------------------------------------------

local ctx_ = nil
local function CTX()
  if ctx_ == nil then
    if host then
      ctx_ = ffi.cast("nb_ctx *", host.default_ctx())   -- owned by the host (Ctrl-C interrupts it)
    else
      local out = ffi.new("nb_ctx *[1]")
      local s = C.nb_ctx_new(0, out)                    -- 0: NIBBLE_THREADS or every CPU
      if s ~= 0 then   -- the message of a failed nb_ctx_new (e.g. a bad NIBBLE_SIMD) is kept per thread
        fail("nibble: cannot create a context: " .. ffi.string(C.nb_status_name(s)) .. ": "
             .. ffi.string(C.nb_ctx_last_error(nil)))
      end
      ctx_ = ffi.gc(out[0], C.nb_ctx_release)
    end
    rawset(M, "ctx", ctx_)
  end
  return ctx_
end
M.context = CTX

-- check(status): raise "NB_ERR_X: message" (the context's last error) for a failing status.
-- A pending interrupt (Ctrl-C, nb_ctx_interrupt) is raised here too, so loops that call nibble
-- stop even when LuaJIT has compiled them (compiled code does not run debug hooks).
local function check(s)
  local c = CTX()
  if s ~= 0 then
    local msg = ffi.string(C.nb_ctx_last_error(c))
    local name = ffi.string(C.nb_status_name(s))
    C.nb_ctx_clear_error(c)
    if s == C.NB_ERR_INTERRUPTED then C.nb_ctx_clear_interrupt(c) end
    error(name .. ": " .. (msg ~= "" and msg or "failed"), user_level())
  end
  if C.nb_ctx_interrupted(c) ~= 0 then
    C.nb_ctx_clear_interrupt(c)
    error("interrupted", 0)   -- as the host's Ctrl-C hook raises it; the traceback says where
  end
  return s
end
M.check = check

function M.status_name(s) return ffi.string(C.nb_status_name(s)) end

-- ---- dtypes -------------------------------------------------------------------------------------

local dtype_name, dtype_enum, dtype_list = {}, {}, {}
for i = 0, C.NB_DTYPE_COUNT - 1 do
  local info = C.nb_dtype_info(i)
  if info ~= nil then
    local name = ffi.string(info.name)
    dtype_name[i] = name
    dtype_list[#dtype_list + 1] = name
    dtype_enum[name] = i
    if info.st_name ~= nil then
      local st = ffi.string(info.st_name)
      if dtype_enum[st] == nil then dtype_enum[st] = i end
    end
    if dtype_enum[name:upper()] == nil then dtype_enum[name:upper()] = i end
  end
end
M.dtypes = dtype_list   -- {"f32", "f16", "bf16", ...} in enum order
for k, v in pairs({ float = "f32", float32 = "f32", float16 = "f16", half = "f16", bfloat16 = "bf16",
                    double = "f64", float64 = "f64", float8_e4m3fn = "e4m3", fp8 = "e4m3",
                    float8_e5m2 = "e5m2", fp4 = "e2m1", int8 = "i8", uint8 = "u8", int32 = "i32",
                    int64 = "i64", int16 = "i16", bool = "bool" }) do
  if dtype_enum[k] == nil and dtype_enum[v] ~= nil then dtype_enum[k] = dtype_enum[v] end
end

-- dtype(x): the nb_dtype number of a name ("bf16", "BF16", "bfloat16") or number.
local function to_dtype(x)
  if type(x) == "number" and dtype_name[x] then return x end
  local e = dtype_enum[x]
  if e == nil then
    fail(("unknown dtype %s (one of %s)"):format(tostring(x), table.concat(dtype_list, ", ")))
  end
  return e
end
M.dtype = to_dtype
function M.dtype_name(e) return dtype_name[tonumber(e)] end

-- ---- native memory and the Lua GC ---------------------------------------------------------------

-- Lua sees an 8-byte cdata per tensor however many megabytes it holds, so its GC would never
-- hurry. Each new native object checks the context's live bytes; past a threshold we collect
-- (finalizers free the unreachable tensors) and the threshold moves to twice what survives.
local mem_stats = ffi.new("nb_mem_stats")
local gc_floor = (tonumber(os.getenv("NIBBLE_GC_MB") or "") or 64) * 1048576
local gc_next = gc_floor
local function note_native()
  local c = CTX()
  C.nb_ctx_mem(c, mem_stats)
  if tonumber(mem_stats.live_bytes) > gc_next then
    collectgarbage("collect")
    C.nb_ctx_mem(c, mem_stats)
    gc_next = math.max(gc_floor, 2 * tonumber(mem_stats.live_bytes))
  end
end
M.note_native = note_native

function M.mem()
  C.nb_ctx_mem(CTX(), mem_stats)
  return { live = tonumber(mem_stats.live_bytes), peak = tonumber(mem_stats.peak_bytes),
           allocs = tonumber(mem_stats.n_allocs), gc_threshold = gc_next }
end

function M.threads() return C.nb_ctx_threads(CTX()) end
function M.set_threads(n) check(C.nb_ctx_set_threads(CTX(), n or 0)); return C.nb_ctx_threads(CTX()) end
function M.seed(n) C.nb_rng_seed(C.nb_ctx_rng(CTX()), n) end
function M.cuda() return { built = C.nb_cuda_built() ~= 0, devices = C.nb_cuda_device_count() } end

-- The GEMM library and kernel set in use, and the CPU (nibble/blas.h); .line is what --version prints.
local BLAS_HOW = { [0] = "own choice", "switched", "forced", "host fallback", "fixed", "switch failed" }
function M.blas()
  local info = ffi.new("nb_blas_info")
  check(C.nb_blas_get(CTX(), info))
  local line, flags = ffi.new("char[1024]"), ffi.new("char[256]")
  C.nb_blas_describe(info, line, 1024)
  C.nb_cpu_flags_str(info.cpu.flags, flags, 256)
  return { library = ffi.string(info.library), path = ffi.string(info.path), core = ffi.string(info.core),
           picked = ffi.string(info.picked), best = ffi.string(info.best), how = BLAS_HOW[info.how],
           cpu = ffi.string(info.cpu.brand), vendor = ffi.string(info.cpu.vendor), family = info.cpu.family,
           model = info.cpu.model, features = ffi.string(flags), line = ffi.string(line) }
end

-- ---- tensors ------------------------------------------------------------------------------------

local TT = ffi.typeof("nb_lua_tensor")
local TPP = ffi.typeof("nb_tensor **")
local methods, getters = {}, {}
local tensor_mt = {}

local function P(t)
  local p = t.ptr
  if p == nil then fail("tensor was released") end
  return p
end

-- Ownership moves must not be cut in half by Ctrl-C: the host's interrupt hook can raise at any
-- VM instruction, so functions that move a reference between C and Lua (finalizers, wrap,
-- release) are registered with the host, which holds the interrupt until they return.
local function critical(fn)
  if host and host.critical then host.critical(fn) end
  return fn
end
M.critical = critical

-- wrap(ptr [, retain]): the Lua tensor owning one reference to ptr (taken over, or retained
-- first when retain is true), for pointers C handed out. Prefer tcall for C calls that create
-- tensors: it owns the result from the moment C stores it.
local wrap = critical(function(p, retain)
  if p == nil then fail("wrap: NULL tensor") end
  if retain then C.nb_tensor_retain(p) end
  local t = TT(p)
  note_native()
  return t
end)
M.wrap = wrap

-- tcall(fn, ...): call fn(ctx, ..., out) for a C function with an `nb_tensor **out` last
-- parameter, check the status and wrap *out. Lua tensors among the arguments pass as t.ptr.
local function tcall(fn, ...)
  local n = select("#", ...)
  local args = { ... }
  for i = 1, n do
    if ffi.istype(TT, args[i]) then args[i] = P(args[i]) end
  end
  -- C writes the new tensor straight into the Lua object (its first field), so an error at any
  -- later point (even Ctrl-C) leaves it owned and the finalizer releases it.
  local t = TT()
  args[n + 1] = ffi.cast(TPP, t)
  check(fn(CTX(), unpack(args, 1, n + 1)))
  note_native()
  return t
end
M.tcall = tcall

function M.is_tensor(x) return ffi.istype(TT, x) end

local shape_mt = { __tostring = function(s)
  local parts = {}
  for i = 1, #s do parts[i] = tostring(s[i]) end
  return "{" .. table.concat(parts, ", ") .. "}"
end }
M.shape_mt = shape_mt

local function shape_of(p)
  local s = {}
  for d = 0, p.ndim - 1 do s[d + 1] = tonumber(p.shape[d]) end
  return setmetatable(s, shape_mt)
end

-- Shape arguments: f(2, 3), f{2, 3} or f(shape_table). Returns ndim and an int64_t[?] buffer.
local function shape_args(...)
  local first = ...
  local list = type(first) == "table" and first or { ... }
  local n = #list
  if n > C.NB_MAX_DIMS then fail(("at most %d dimensions, got %d"):format(C.NB_MAX_DIMS, n)) end
  local buf = ffi.new("int64_t[?]", math.max(n, 1))
  for i = 1, n do
    local v = list[i]
    if type(v) ~= "number" or v % 1 ~= 0 then
      fail(("dimension %d is %s, not an integer"):format(i, tostring(v)))
    end
    buf[i - 1] = v
  end
  return n, buf
end

local function dim_arg(p, d)
  local nd = p.ndim
  if type(d) ~= "number" or d % 1 ~= 0 or d == 0 or d > nd or d < -nd then
    fail(("dimension %s out of range for a %d-d tensor (1..%d or -1..-%d)"):format(tostring(d), nd, nd, nd))
  end
  return d > 0 and d - 1 or nd + d   -- 0-based
end

local idxbuf = ffi.new("int64_t[?]", C.NB_MAX_DIMS)

-- Fill idxbuf (0-based) from 1-based Lua indices; the last `extra` varargs are not indices.
local function set_index(p, what, extra, ...)
  local nd = p.ndim
  local n = select("#", ...) - extra
  local first = ...
  if n == 1 and type(first) == "table" then
    for d = 0, nd - 1 do idxbuf[d] = (first[d + 1] or 0) - 1 end
    n = #first
  else
    for d = 0, math.min(n, nd) - 1 do
      local i = select(d + 1, ...)
      idxbuf[d] = type(i) == "number" and i - 1 or -1
    end
  end
  if n ~= nd then fail(("%s: %d indices for a %d-d tensor"):format(what, n, nd)) end
  for d = 0, nd - 1 do
    local i = idxbuf[d]
    if i < 0 or i >= p.shape[d] then
      fail(("%s: index %s out of range 1..%d in dimension %d"):format(what, tostring(tonumber(i) + 1),
            tonumber(p.shape[d]), d + 1))
    end
  end
end

-- Value of the row-major linear element `lin` (0-based) of any (strided) tensor.
local function elem(p, lin)
  for d = p.ndim - 1, 0, -1 do
    local s = p.shape[d]
    idxbuf[d] = lin % s
    lin = (lin - lin % s) / s
  end
  return C.nb_tensor_get(p, idxbuf)
end

getters.shape = function(t) return shape_of(P(t)) end
getters.dtype = function(t) return dtype_name[tonumber(P(t).dtype)] end
getters.ndim = function(t) return tonumber(P(t).ndim) end
getters.nbytes = function(t) return tonumber(C.nb_tensor_nbytes(P(t))) end
getters.device = function(t) return tonumber(P(t).device) end
getters.offset = function(t) return tonumber(P(t).offset) end
getters.strides = function(t)
  local p = P(t)
  local s = {}
  for d = 0, p.ndim - 1 do s[d + 1] = tonumber(p.strides[d]) end
  return setmetatable(s, shape_mt)
end

function methods.numel(t) return tonumber(C.nb_tensor_numel(P(t))) end
function methods.dim(t) return tonumber(P(t).ndim) end
function methods.size(t, d)
  local p = P(t)
  if d == nil then return shape_of(p) end
  return tonumber(p.shape[dim_arg(p, d)])
end
function methods.is_contiguous(t) return C.nb_tensor_is_contiguous(P(t)) ~= 0 end
function methods.writable(t) return C.nb_buffer_writable(P(t).buf) ~= 0 end
-- data([ctype]): pointer to element 0 (void* or cast to ctype, e.g. "float *").
function methods.data(t, ct)
  local p = C.nb_tensor_data(P(t))
  return ct and ffi.cast(ct, p) or p
end

-- get(i, j, ...) / get{i, j}: element as a number; indices are 1-based.
function methods.get(t, ...)
  local p = P(t)
  set_index(p, "get", 0, ...)
  return C.nb_tensor_get(p, idxbuf)
end

-- set(i, j, ..., value): store (converted to the tensor's dtype); 1-based.
function methods.set(t, ...)
  local p = P(t)
  local n = select("#", ...)
  local v = select(n, ...)
  if type(v) == "boolean" then v = v and 1 or 0 end
  if type(v) ~= "number" then fail("set: the last argument must be the value (a number)") end
  set_index(p, "set", 1, ...)
  check(C.nb_tensor_set(CTX(), p, idxbuf, v))
  return t
end

-- view(d1, d2, ...) / view{...}: reshape of a contiguous tensor (one dimension may be -1).
function methods.view(t, ...)
  local n, buf = shape_args(...)
  return tcall(C.nb_tensor_view, P(t), n, buf)
end
-- reshape: view of t:contiguous()
function methods.reshape(t, ...)
  return methods.view(methods.contiguous(t), ...)
end

-- narrow(dim, start, len): `len` entries from 1-based `start` along dim (a view).
function methods.narrow(t, dim, start, len)
  local p = P(t)
  local d = dim_arg(p, dim)
  if type(start) ~= "number" or type(len) ~= "number" then fail("narrow(dim, start, len) needs numbers") end
  return tcall(C.nb_tensor_slice, p, d, start - 1, len)
end

-- slice(dim, first [, last]): entries first..last inclusive (negative counts from the end).
function methods.slice(t, dim, first, last)
  local p = P(t)
  local d = dim_arg(p, dim)
  local size = tonumber(p.shape[d])
  last = last or size
  if first < 0 then first = size + first + 1 end
  if last < 0 then last = size + last + 1 end
  return tcall(C.nb_tensor_slice, p, d, first - 1, math.max(0, last - first + 1))
end

-- select(dim, i): the (ndim-1)-d view at index i of dim (a number for a 1-d tensor).
function methods.select(t, dim, i)
  local p = P(t)
  local d = dim_arg(p, dim)
  local size = tonumber(p.shape[d])
  if type(i) ~= "number" or i < 1 or i > size or i % 1 ~= 0 then
    fail(("select: index %s out of range 1..%d in dimension %d"):format(tostring(i), size, d + 1))
  end
  if p.ndim == 1 then return methods.get(t, i) end
  local nd = p.ndim
  if d == nd - 1 and p.strides[d] == 0 then
    fail("select: cannot drop the packed last dimension of " .. dtype_name[tonumber(p.dtype)])
  end
  local r = tcall(C.nb_tensor_slice, p, d, i - 1, 1)
  local q = r.ptr          -- a fresh header we own alone: drop the dimension in place
  for k = d, nd - 2 do
    q.shape[k] = q.shape[k + 1]
    q.strides[k] = q.strides[k + 1]
  end
  q.ndim = nd - 1
  return r
end

-- transpose(d0, d1) (1-based dims) and t() for 2-d tensors: views with swapped strides.
function methods.transpose(t, d0, d1)
  local p = P(t)
  return tcall(C.nb_tensor_transpose, p, dim_arg(p, d0), dim_arg(p, d1))
end
function methods.t(t)
  local p = P(t)
  if p.ndim ~= 2 then fail(("t() needs a 2-d tensor, this one is %d-d"):format(p.ndim)) end
  return tcall(C.nb_tensor_transpose, p, 0, 1)
end

-- to(dtype): converted contiguous copy. contiguous(): t itself if already contiguous.
function methods.to(t, dt) return tcall(C.nb_tensor_to, P(t), to_dtype(dt)) end
function methods.float(t) return tcall(C.nb_tensor_to, P(t), C.NB_F32) end
function methods.contiguous(t)
  local p = P(t)
  if C.nb_tensor_is_contiguous(p) ~= 0 then return t end
  return tcall(C.nb_tensor_contiguous, p)
end
function methods.clone(t) return tcall(C.nb_tensor_contiguous, P(t)) end

-- copy(src): copy src (same shape, any dtype) into t, converting; returns t.
function methods.copy(t, src)
  if not ffi.istype(TT, src) then fail("copy: the source must be a tensor") end
  check(C.nb_tensor_copy(CTX(), P(t), P(src)))
  return t
end

-- fill(v): set every element to v; returns t.
function methods.fill(t, v)
  local p = P(t)
  if C.nb_buffer_writable(p.buf) == 0 then fail("fill: tensor is read-only (mapped file)") end
  if C.nb_tensor_is_contiguous(p) ~= 0 then
    local base, dt = C.nb_tensor_data(p), p.dtype
    for i = 0, tonumber(C.nb_tensor_numel(p)) - 1 do C.nb_store_elem(base, dt, i, v) end
  else
    local tmp = tcall(C.nb_tensor_new, p.dtype, p.ndim, p.shape)
    methods.fill(tmp, v)
    check(C.nb_tensor_copy(CTX(), p, tmp.ptr))
  end
  return t
end

-- release(): drop this reference now instead of at garbage collection.
methods.release = critical(function(t)
  local p = t.ptr
  if p ~= nil then
    t.ptr = nil
    C.nb_tensor_release(p)
  end
end)

-- A contiguous f32/f64 pointer over t's values (converting when needed). When a copy was made it
-- is returned too: callers release it after their loop, which also keeps it alive until then
-- (a pointer alone does not keep its cdata from the GC).
local function values_ptr(p)
  if C.nb_tensor_is_contiguous(p) ~= 0 then
    if p.dtype == C.NB_F32 then return ffi.cast("const float *", C.nb_tensor_data(p)), nil end
    if p.dtype == C.NB_F64 then return ffi.cast("const double *", C.nb_tensor_data(p)), nil end
  end
  local keep = tcall(C.nb_tensor_to, p, C.NB_F64)
  return ffi.cast("const double *", C.nb_tensor_data(keep.ptr)), keep
end

-- totable(): nested Lua tables of numbers (a number for a 0-d tensor).
function methods.totable(t)
  local p = P(t)
  local v, keep = values_ptr(p)
  local nd = p.ndim
  if nd == 0 then return v[0] end
  local shape = shape_of(p)
  local pos = 0
  local function build(d)
    local r = {}
    if d == nd then
      for i = 1, shape[d] do r[i] = v[pos]; pos = pos + 1 end
    else
      for i = 1, shape[d] do r[i] = build(d + 1) end
    end
    return r
  end
  local r = build(1)
  if keep then keep:release() end
  return r
end

-- stats(): {min, max, mean, std, absmax, numel, nonfinite} over all elements (in double).
function methods.stats(t)
  local p = P(t)
  local n = tonumber(C.nb_tensor_numel(p))
  local v, keep = values_ptr(p)
  local mn, mx, sum, sumsq, amax, bad = math.huge, -math.huge, 0, 0, 0, 0
  for i = 0, n - 1 do
    local x = v[i]
    if x == x and x ~= math.huge and x ~= -math.huge then
      if x < mn then mn = x end
      if x > mx then mx = x end
      sum = sum + x
      sumsq = sumsq + x * x
      local a = x < 0 and -x or x
      if a > amax then amax = a end
    else
      bad = bad + 1
    end
  end
  if keep then keep:release() end
  local good = n - bad
  local mean = good > 0 and sum / good or 0 / 0
  local var = good > 0 and math.max(0, sumsq / good - mean * mean) or 0 / 0
  return { min = good > 0 and mn or 0 / 0, max = good > 0 and mx or 0 / 0, mean = mean, std = math.sqrt(var),
           absmax = good > 0 and amax or 0 / 0, numel = n, nonfinite = bad }
end
function methods.sum(t) local s = methods.stats(t); return s.mean * (s.numel - s.nonfinite) end
function methods.mean(t) return methods.stats(t).mean end
function methods.absmax(t) return methods.stats(t).absmax end

-- equal(other): same shape and every element equal (NaN equals NaN); max_abs_diff(other).
local function same_shape(a, b)
  if a.ndim ~= b.ndim then return false end
  for d = 0, a.ndim - 1 do if a.shape[d] ~= b.shape[d] then return false end end
  return true
end
function methods.max_abs_diff(t, o)
  local a, b = P(t), P(o)
  if not same_shape(a, b) then fail(("max_abs_diff: shapes %s and %s differ"):format(
    tostring(shape_of(a)), tostring(shape_of(b)))) end
  local va, ka = values_ptr(a)
  local vb, kb = values_ptr(b)
  local m = 0
  for i = 0, tonumber(C.nb_tensor_numel(a)) - 1 do
    local x, y = va[i], vb[i]
    local d = x - y
    if d ~= d then
      if not (x ~= x and y ~= y) then m = 0 / 0; break end
    else
      if d < 0 then d = -d end
      if d > m then m = d end
    end
  end
  if ka then ka:release() end
  if kb then kb:release() end
  return m
end
function methods.equal(t, o)
  if not ffi.istype(TT, o) or not same_shape(P(t), P(o)) then return false end
  return methods.max_abs_diff(t, o) == 0
end

local function fmt_num(x, is_float)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" elseif x == -math.huge then return "-inf" end
  if not is_float then return string.format("%d", x) end
  local s = string.format("%.5g", x)
  return s
end

function tensor_mt.__tostring(t)
  local p = t.ptr
  if p == nil then return "tensor<released>" end
  local dt = tonumber(p.dtype)
  local info = C.nb_dtype_info(dt)
  local is_float = info.is_float ~= 0
  local head = ("tensor<%s>%s"):format(dtype_name[dt], tostring(shape_of(p)))
  local n = tonumber(C.nb_tensor_numel(p))
  if n == 0 then return head .. " []" end
  if n <= 16 then
    local nd = p.ndim
    local pos = 0
    local function build(d)
      local parts = {}
      if d == nd then return fmt_num(elem(p, 0), is_float) end
      for _ = 1, tonumber(p.shape[d]) do
        if d == nd - 1 then
          parts[#parts + 1] = fmt_num(elem(p, pos), is_float)
          pos = pos + 1
        else
          parts[#parts + 1] = build(d + 1)
        end
      end
      return "{" .. table.concat(parts, ", ") .. "}"
    end
    return head .. " " .. build(0)
  end
  local parts = {}
  for i = 0, 2 do parts[#parts + 1] = fmt_num(elem(p, i), is_float) end
  parts[#parts + 1] = "..."
  for i = n - 3, n - 1 do parts[#parts + 1] = fmt_num(elem(p, i), is_float) end
  return head .. " [" .. table.concat(parts, ", ") .. "]"
end

function tensor_mt.__index(t, k)
  local m = methods[k]
  if m then return m end
  local g = getters[k]
  if g then return g(t) end
  if type(k) == "number" then return methods.select(t, 1, k) end
  return nil
end

function tensor_mt.__newindex(t, k, v)
  if type(k) ~= "number" then fail(("cannot set field '%s' of a tensor"):format(tostring(k))) end
  local p = P(t)
  if p.ndim == 1 then
    methods.set(t, k, v)
  elseif ffi.istype(TT, v) then
    methods.copy(methods.select(t, 1, k), v)
  else
    methods.fill(methods.select(t, 1, k), v)
  end
end

function tensor_mt.__len(t)
  local p = P(t)
  return p.ndim > 0 and tonumber(p.shape[0]) or 0
end

tensor_mt.__gc = methods.release

local okmt, errmt = pcall(ffi.metatype, TT, tensor_mt)
if not okmt then error("nibble: the tensor metatype is already set (was nibble loaded twice?): " .. tostring(errmt)) end
M.Tensor = TT
M.tensor_methods = methods   -- other modules may add methods (t:quantize(...), ...)
M.tensor_fields = getters    -- t.shape, t.dtype, ... (the REPL completes them)

-- ---- constructors -------------------------------------------------------------------------------

-- Split constructor arguments: (dtype, shape...), (shape [, dtype]) with shape a table, or the sizes
-- alone, as torch takes them: (d1, d2, ... [, dtype]), f32 unless a dtype name ends the list. A number
-- first is a size, except before a shape table (an nb_dtype number from nibble.dtype, then the shape).
local function dtype_shape(a, ...)
  if type(a) == "table" then
    local n, buf = shape_args(a)
    return to_dtype((...) or "f32"), n, buf
  end
  if type(a) == "number" and type((...)) ~= "table" then
    local dims = { a, ... }
    local dt = "f32"
    if type(dims[#dims]) == "string" then dt = table.remove(dims) end
    local n, buf = shape_args(dims)
    return to_dtype(dt), n, buf
  end
  local dt = to_dtype(a)
  local n, buf = shape_args(...)
  return dt, n, buf
end

-- zeros(dtype, shape) / zeros(dtype, d1, d2, ...) / zeros(shape [, dtype]) / zeros(d1, d2, ... [, dtype]):
-- a new zero tensor (f32 unless a dtype is given).
function M.zeros(...)
  local dt, n, buf = dtype_shape(...)
  return tcall(C.nb_tensor_new, dt, n, buf)
end
M.empty = M.zeros

local function from_doubles(dt, n, buf, values)
  local t = tcall(C.nb_tensor_new, dt, n, buf)
  local count = tonumber(C.nb_tensor_numel(t.ptr))
  if count > 0 then check(C.nb_convert(C.nb_tensor_data(t.ptr), dt, values, C.NB_F64, count)) end
  return t
end

-- tensor(data [, dtype]): from a number (0-d) or nested tables ({{1, 2}, {3, 4}}); dtype f32 by default.
function M.tensor(data, dt)
  dt = to_dtype(dt or "f32")
  if ffi.istype(TT, data) then return methods.to(data, dt) end
  if type(data) == "number" or type(data) == "boolean" then
    local v = ffi.new("double[1]", type(data) == "boolean" and (data and 1 or 0) or data)
    return from_doubles(dt, 0, ffi.new("int64_t[1]"), v)
  end
  if type(data) ~= "table" then fail("tensor: expected a number or a (nested) table, got " .. type(data)) end
  local shape = {}
  local x = data
  while type(x) == "table" do
    shape[#shape + 1] = #x
    if #x == 0 then break end
    x = x[1]
  end
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local vals = ffi.new("double[?]", math.max(n, 1))
  local pos = 0
  local function flatten(v, d, where)
    if d > #shape then
      if type(v) == "boolean" then v = v and 1 or 0 end
      if type(v) ~= "number" then fail(("tensor: element %s is %s, not a number"):format(where, type(v))) end
      vals[pos] = v
      pos = pos + 1
      return
    end
    if type(v) ~= "table" or #v ~= shape[d] then
      fail(("tensor: ragged table at %s: expected %d entries"):format(where, shape[d]))
    end
    for i = 1, shape[d] do flatten(v[i], d + 1, where .. "[" .. i .. "]") end
  end
  flatten(data, 1, "data")
  local nd, buf = shape_args(shape)
  return from_doubles(dt, nd, buf, vals)
end

local function random(gen, ...)
  local dt, n, buf = dtype_shape(...)
  local count = 1
  for i = 0, n - 1 do count = count * tonumber(buf[i]) end
  local vals = ffi.new("double[?]", math.max(count, 1))
  local r = C.nb_ctx_rng(CTX())
  for i = 0, count - 1 do vals[i] = gen(r) end
  return from_doubles(dt, n, buf, vals)
end
-- rand / randn(dtype, shape), (shape [, dtype]) or (d1, d2, ... [, dtype]): uniform [0, 1) / standard normal values from
-- the context's RNG (nibble.seed(n) makes them reproducible).
function M.rand(...) return random(C.nb_rng_uniform, ...) end
function M.randn(...) return random(C.nb_rng_normal, ...) end

-- ---- lazy parts ---------------------------------------------------------------------------------

-- Functions that live in submodules but are called as nibble.<name>.
local lazy_functions = { load = "nibble.weights", inspect = "nibble.weights" }
M.lazy_functions = lazy_functions   -- names nibble.<name> has before first use (the REPL completes them)

setmetatable(M, {
  __index = function(t, k)
    if k == "ctx" then return CTX() end
    local modname = lazy_functions[k]
    if modname then
      local f = require(modname)[k]
      rawset(t, k, f)
      return f
    end
    if type(k) == "string" and k:match("^[%w_]+$") then
      local name = "nibble." .. k
      if package.loaded[name] ~= nil or package.preload[name] or package.searchpath(name, package.path)
         or package.searchpath(name, package.cpath) then
        local m = require(name)
        rawset(t, k, m)
        return m
      end
    end
    return nil
  end,
})

return M

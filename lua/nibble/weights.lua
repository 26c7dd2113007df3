-- nibble.load and nibble.inspect: model files (safetensors file, sharded directory or index.json,
-- and GGUF) as Lua values. The parsing is libnibble's (nb_st_*, nb_gguf_*); this file only turns
-- its directories into tables: a loaded file is the list of its tensor names (so #w and ipairs
-- work) whose string keys fetch tensors lazily: w["model.norm.weight"].
local ffi = require("ffi")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local W = {}

-- "gguf" when the file starts with the GGUF magic, else "safetensors" (nb_st_open then reports
-- precisely what is wrong with a path that is neither).
local function detect(path)
  local f = io.open(path, "rb")
  if not f then return "safetensors" end
  local ok, magic = pcall(f.read, f, 4)
  f:close()
  if ok and magic == "GGUF" then return "gguf" end
  return "safetensors"
end
W.detect = detect

local function shape_table(list)
  return setmetatable(list, nibble.shape_mt)
end

local gguf_type_names = {
  [0] = "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array",
  "uint64", "int64", "float64",
}
local gguf_numeric_ctype = {
  [0] = "const uint8_t *", "const int8_t *", "const uint16_t *", "const int16_t *", "const uint32_t *",
  "const int32_t *", "const float *", "const uint8_t *", nil, nil, "const uint64_t *", "const int64_t *",
  "const double *",
}

local function num(x)
  return tonumber(x)
end

-- ---- GGUF -----------------------------------------------------------------------------------------

local function gguf_value(g, i)
  local t = tonumber(C.nb_gguf_kv_type(g, i))
  local len = ffi.new("uint64_t[1]")
  if t == C.NB_GGUF_STRING then
    local p = C.nb_gguf_kv_str(g, i, len)
    return p ~= nil and ffi.string(p, num(len[0])) or "", "string"
  elseif t == C.NB_GGUF_ARRAY then
    local at = tonumber(C.nb_gguf_arr_type(g, i))
    local n = num(C.nb_gguf_arr_count(g, i))
    local tname = "array[" .. (gguf_type_names[at] or tostring(at)) .. "]"
    local out = {}
    if at == C.NB_GGUF_STRING then
      for j = 0, n - 1 do
        local p = C.nb_gguf_arr_str(g, i, j, len)
        out[j + 1] = p ~= nil and ffi.string(p, num(len[0])) or ""
      end
    elseif gguf_numeric_ctype[at] then
      local data = ffi.cast(gguf_numeric_ctype[at], C.nb_gguf_arr_data(g, i))
      if at == C.NB_GGUF_BOOL then
        for j = 0, n - 1 do out[j + 1] = data[j] ~= 0 end
      else
        for j = 0, n - 1 do out[j + 1] = num(data[j]) end
      end
    else
      return nil, tname, n   -- arrays of arrays: only the count is reachable
    end
    return out, tname, n
  elseif t == C.NB_GGUF_BOOL then
    return C.nb_gguf_kv_int(g, i) ~= 0, "bool"
  elseif t == C.NB_GGUF_FLOAT32 or t == C.NB_GGUF_FLOAT64 then
    return num(C.nb_gguf_kv_float(g, i)), gguf_type_names[t]
  else
    return num(C.nb_gguf_kv_int(g, i)), gguf_type_names[t] or tostring(t)
  end
end

local function gguf_row(g, i)
  local info = C.nb_gguf_tensor_at(g, i)
  local shape = {}
  for d = info.ndim - 1, 0, -1 do shape[#shape + 1] = num(info.ne[d]) end
  local tn = C.nb_ggml_type_name(info.type)
  local params = 1
  for _, s in ipairs(shape) do params = params * s end
  return { name = ffi.string(info.name), dtype = tn ~= nil and ffi.string(tn) or ("type" .. info.type),
           shape = shape_table(shape), bytes = num(info.nbytes), offset = num(info.offset),
           ggml_type = num(info.type), params = params }
end

-- The handle lives in a one-slot box that C fills and whose finalizer closes it: ownership is
-- never in flight where an error (Ctrl-C) could drop it.
local close_gguf_box = nibble.critical(function(b)
  local h = b[0]
  if h ~= nil then b[0] = nil; C.nb_gguf_close(h) end
end)
local close_st_box = nibble.critical(function(b)
  local h = b[0]
  if h ~= nil then b[0] = nil; C.nb_st_close(h) end
end)

local function open_gguf(path)
  local box = ffi.gc(ffi.new("nb_gguf *[1]"), close_gguf_box)
  check(C.nb_gguf_open(nibble.ctx, path, box))
  local g = box[0]
  local names = {}
  for i = 0, num(C.nb_gguf_tensor_count(g)) - 1 do
    names[#names + 1] = ffi.string(C.nb_gguf_tensor_at(g, i).name)
  end
  local src = { format = "gguf", path = path, box = box, names = names }
  function src.find(name) local i = num(C.nb_gguf_find_tensor(g, name)); return i >= 0 and i or nil end
  function src.get(name) return nibble.tcall(C.nb_gguf_get, g, name) end
  function src.row(i) return gguf_row(g, i) end
  function src.metadata_list()
    local list = {}
    for i = 0, num(C.nb_gguf_kv_count(g)) - 1 do
      local v, tname, count = gguf_value(g, i)
      list[#list + 1] = { key = ffi.string(C.nb_gguf_kv_key(g, i)), type = tname, value = v, count = count }
    end
    return list
  end
  function src.close() close_gguf_box(box) end
  src.version = num(C.nb_gguf_version(g))
  return src
end

-- ---- safetensors ------------------------------------------------------------------------------------

local function st_row(st, i)
  local e = C.nb_st_entry_at(st, i)
  local shape = {}
  for d = 0, e.ndim - 1 do shape[d + 1] = num(e.shape[d]) end
  local info = C.nb_dtype_info(e.dtype)
  local params = 1
  for _, s in ipairs(shape) do params = params * s end
  return { name = ffi.string(e.name), dtype = info ~= nil and ffi.string(info.st_name) or tostring(e.dtype),
           shape = shape_table(shape), bytes = num(e["end"] - e.begin), offset = num(e.begin),
           shard = e.shard ~= nil and ffi.string(e.shard) or nil, params = params }
end

local function open_st(path)
  local box = ffi.gc(ffi.new("nb_st *[1]"), close_st_box)
  check(C.nb_st_open(nibble.ctx, path, box))
  local st = box[0]
  local names = {}
  for i = 0, num(C.nb_st_count(st)) - 1 do names[#names + 1] = ffi.string(C.nb_st_entry_at(st, i).name) end
  local src = { format = "safetensors", path = path, box = box, names = names }
  function src.find(name) local i = num(C.nb_st_find(st, name)); return i >= 0 and i or nil end
  function src.get(name) return nibble.tcall(C.nb_st_get, st, name) end
  function src.row(i) return st_row(st, i) end
  function src.metadata_list()
    local list = {}
    for i = 0, num(C.nb_st_metadata_count(st)) - 1 do
      local key = ffi.string(C.nb_st_metadata_key(st, i))
      local v = C.nb_st_metadata(st, key)
      list[#list + 1] = { key = key, type = "string", value = v ~= nil and ffi.string(v) or nil }
    end
    return list
  end
  function src.close() close_st_box(box) end
  return src
end

local function open(path)
  if type(path) ~= "string" then fail("expected a path (string), got " .. type(path)) end
  if detect(path) == "gguf" then return open_gguf(path) end
  return open_st(path)
end

-- ---- the loaded-file object ---------------------------------------------------------------------------

local state = setmetatable({}, { __mode = "k" })
local wmethods = {}

local function S(w)
  local s = state[w]
  if not s then fail("not a nibble weights object") end
  if not s.src then fail(("%s was closed"):format(s.path)) end
  return s
end

-- w:get(name): the tensor (an error naming the file if there is none).
function wmethods.get(w, name)
  local s = S(w)
  local t = s.cache[name]
  if t then return t end
  t = s.src.get(name)
  s.cache[name] = t
  return t
end
-- w:has(name)
function wmethods.has(w, name) return S(w).src.find(name) ~= nil end
-- w:names(): the tensor names in file order (a copy).
function wmethods.names(w)
  local r = {}
  for i, n in ipairs(S(w).src.names) do r[i] = n end
  return r
end
-- for name, t in w:pairs() do ... end  (file order)
function wmethods.pairs(w)
  local s = S(w)
  local i = 0
  return function()
    i = i + 1
    local name = s.src.names[i]
    if name then return name, wmethods.get(w, name) end
  end
end
-- w:info(name): {name, dtype, shape, bytes, offset, params, ...} without reading the tensor.
function wmethods.info(w, name)
  local s = S(w)
  local i = s.src.find(name)
  if not i then return nil end
  return s.src.row(i)
end
-- w:rows(): info of every tensor, in file order.
function wmethods.rows(w)
  local s = S(w)
  local r = {}
  for i = 1, #s.src.names do r[i] = s.src.row(i - 1) end
  return r
end
-- w:metadata(): key -> value (GGUF key/values; safetensors __metadata__ strings).
function wmethods.metadata(w)
  local r = {}
  for _, kv in ipairs(S(w).src.metadata_list()) do r[kv.key] = kv.value end
  return r
end
-- w:close(): release the file now (tensors taken from it stay valid: they hold the mapping).
function wmethods.close(w)
  local s = state[w]
  if s and s.src then
    s.src.close()
    s.src = nil
  end
end

local weights_mt = {
  __index = function(w, k)
    local m = wmethods[k]
    if m then return m end
    local s = state[w]
    if not s then return nil end
    if k == "format" then return s.format end
    if k == "path" then return s.path end
    if k == "version" then return s.version end
    if type(k) == "string" and s.src and s.src.find(k) then return wmethods.get(w, k) end
    return nil
  end,
  __newindex = function() fail("a loaded model file is read-only") end,
  __tostring = function(w)
    local s = state[w]
    return ("nibble.weights(%s %s, %d tensors%s)"):format(s.format, s.path, #w, s.src and "" or ", closed")
  end,
}

-- load(path): a safetensors file, a model directory (model.safetensors or a sharded index) or a
-- GGUF file. #w is the tensor count, w[i] the i-th name, w[name] the tensor (or nil).
function W.load(path)
  local src = open(path)
  local w = {}
  for i, n in ipairs(src.names) do w[i] = n end
  state[w] = { src = src, format = src.format, path = path, version = src.version,
               cache = setmetatable({}, { __mode = "v" }) }
  return setmetatable(w, weights_mt)
end

-- inspect(path): what `nibble inspect` prints, as a table:
--   { path, format, version (GGUF), count, params, bytes, shards (safetensors),
--     tensors = { {name, dtype, shape, bytes, offset, params, shard | ggml_type}, ... },
--     metadata = { {key, type, value, count}, ... } }
function W.inspect(path)
  local src = open(path)
  local rows, params, bytes = {}, 0, 0
  local shards, seen = {}, {}
  for i = 1, #src.names do
    local r = src.row(i - 1)
    rows[i] = r
    params = params + r.params
    bytes = bytes + r.bytes
    if r.shard and not seen[r.shard] then
      seen[r.shard] = true
      shards[#shards + 1] = r.shard
    end
  end
  local meta = src.metadata_list()
  src.close()
  return { path = path, format = src.format, version = src.version, count = #rows, params = params,
           bytes = bytes, shards = src.format == "safetensors" and shards or nil, tensors = rows,
           metadata = meta }
end

return W

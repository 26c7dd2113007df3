-- nibble.repl: how the REPL prints results. Values with __tostring (tensors, shapes, loaded files)
-- print through it; plain tables print their contents (sorted, depth and length limited) so that
-- nibble.inspect(path) or t:stats() are readable at the prompt. complete(word) is what Tab offers.
local M = {}

local MAX_ITEMS, MAX_DEPTH = 24, 3

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil end

local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

-- repr(v): a one-value string for display.
function M.repr(v, depth, seen)
  depth, seen = depth or 0, seen or {}
  local tv = type(v)
  if tv == "string" then
    return depth == 0 and v or string.format("%q", v):gsub("\\\n", "\\n")
  elseif tv == "number" then
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format("%.7g", v)
  elseif tv ~= "table" then
    return tostring(v)
  end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] then return "<cycle>" end
  if depth >= MAX_DEPTH then return "{...}" end
  seen[v] = true
  local parts, n = {}, #v
  for i = 1, math.min(n, MAX_ITEMS) do parts[#parts + 1] = M.repr(v[i], depth + 1, seen) end
  if n > MAX_ITEMS then parts[#parts + 1] = ("... (%d items)"):format(n) end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  for i, k in ipairs(keys) do
    if i > MAX_ITEMS then
      parts[#parts + 1] = ("... (%d keys)"):format(#keys)
      break
    end
    local ks = is_ident(k) and k or ("[" .. M.repr(k, depth + 1, seen) .. "]")
    parts[#parts + 1] = ks .. " = " .. M.repr(v[k], depth + 1, seen)
  end
  seen[v] = nil
  local s = "{" .. table.concat(parts, ", ") .. "}"
  if #s > 100 and depth == 0 then s = "{\n  " .. table.concat(parts, ",\n  ") .. "\n}" end
  return s
end

-- show(...): print every value, tab-separated, as the REPL does for results.
function M.show(...)
  local n = select("#", ...)
  local parts = {}
  for i = 1, n do parts[i] = M.repr((select(i, ...))) end
  io.stdout:write(table.concat(parts, "\t"), "\n")
end

-- ---- Tab completion -----------------------------------------------------------------------------

local function is_tensor(v)
  local n = package.loaded.nibble
  return type(v) == "cdata" and type(n) == "table" and rawget(n, "Tensor") ~= nil
    and require("ffi").istype(n.Tensor, v)
end

-- names(v, methods_only): the names a value offers after "." (or ":" with methods_only: functions
-- only): a table's string keys and those of its __index tables; a tensor's methods and fields; the
-- nibble module's submodules and functions that load on first use.
local function names(v, methods_only)
  local out, seen = {}, {}
  local function add(k, val)
    if type(k) == "string" and is_ident(k) and not seen[k] and (not methods_only or type(val) == "function") then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  if is_tensor(v) then
    local n = package.loaded.nibble
    for k, f in pairs(n.tensor_methods) do add(k, f) end
    if not methods_only then for k in pairs(n.tensor_fields or {}) do add(k, 0) end end
    return out
  end
  local t, depth = v, 0
  while type(t) == "table" and depth < 8 do
    for k, val in pairs(t) do add(k, val) end
    local mt = getmetatable(t)
    t = type(mt) == "table" and rawget(mt, "__index") or nil
    depth = depth + 1
  end
  if v == package.loaded.nibble and not methods_only then
    for k in pairs(v.lazy_functions or {}) do add(k, 0) end
    local list = require("nibble.util").listdir
    for template in package.path:gmatch("[^;]+") do
      local dir = template:match("^(.*)/%?%.lua$")
      for _, f in ipairs(dir and list(dir .. "/nibble") or {}) do
        local m = f:match("^([%a_][%w_]*)%.lua$")
        if m and m ~= "init" then add(m, 0) end
      end
    end
  end
  return out
end

-- complete(word [, env]): the completions of word at the prompt, sorted: globals (of env, default _G)
-- for a plain name, fields after "a.b.", methods after "a.b:". Only names are followed (no calls, no
-- indexing with brackets), so completing never runs the user's code; a name that cannot be resolved
-- gives no completions.
function M.complete(word, env)
  env = env or _G
  local path, sep, partial = word:match("^([%a_][%w_%.]*)([%.:])([%w_]*)$")
  local v, head
  if path then
    head = path .. sep
    local ok = pcall(function()
      if path:find("..", 1, true) or path:sub(-1) == "." then error("not a name") end
      v = env
      for part in path:gmatch("[^%.]+") do
        v = v[part]
        if v == nil then error("no value") end
      end
    end)
    if not ok then return {} end
  elseif word:match("^[%a_]?[%w_]*$") then
    v, head, partial, sep = env, "", word, "."
  else
    return {}
  end
  local out = {}
  for _, k in ipairs(names(v, sep == ":")) do
    if k:sub(1, #partial) == partial then out[#out + 1] = head .. k end
  end
  table.sort(out)
  return out
end

return M

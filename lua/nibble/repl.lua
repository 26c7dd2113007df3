-- nibble.repl: how the REPL prints results. Values with __tostring (tensors, shapes, loaded files)
-- print through it; plain tables print their contents (sorted, depth and length limited) so that
-- nibble.inspect(path) or t:stats() are readable at the prompt.
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

return M

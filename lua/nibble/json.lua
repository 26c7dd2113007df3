-- nibble.json: a small JSON encoder/decoder for the Lua side (`nibble inspect --json`, configs).
-- encode: tables with keys 1..n are arrays (an empty table is []; json.object{} forces {}),
-- object keys are sorted so the output is stable, strings are escaped to valid UTF-8 JSON
-- (bytes that are not UTF-8 become \u00XX), NaN/inf become null. decode: JSON null -> json.null.
local M = {}

M.null = setmetatable({}, { __tostring = function() return "null" end })
local object_mt = { __jsontype = "object" }
function M.object(t) return setmetatable(t or {}, object_mt) end

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
                  ["\r"] = "\\r", ["\t"] = "\\t" }

local function utf8_len(s, i)
  local c = s:byte(i)
  local n, min
  if c < 0x80 then return 1
  elseif c >= 0xC2 and c <= 0xDF then n, min = 2, 0x80
  elseif c >= 0xE0 and c <= 0xEF then n, min = 3, 0x800
  elseif c >= 0xF0 and c <= 0xF4 then n, min = 4, 0x10000
  else return nil end
  local cp = c % (2 ^ (7 - n))
  for k = 1, n - 1 do
    local b = s:byte(i + k)
    if not b or b < 0x80 or b > 0xBF then return nil end
    cp = cp * 64 + (b - 0x80)
  end
  if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return nil end
  return n
end

local function encode_string(s)
  if not s:find('[%c"\\\128-\255]') then return '"' .. s .. '"' end
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:sub(i, i)
    local b = c:byte()
    if escapes[c] then
      out[#out + 1] = escapes[c]
      i = i + 1
    elseif b < 0x20 or b == 0x7F then
      out[#out + 1] = string.format("\\u%04x", b)
      i = i + 1
    elseif b < 0x80 then
      out[#out + 1] = c
      i = i + 1
    else
      local len = utf8_len(s, i)
      if len then
        out[#out + 1] = s:sub(i, i + len - 1)
        i = i + len
      else
        out[#out + 1] = string.format("\\u%04x", b)
        i = i + 1
      end
    end
  end
  return '"' .. table.concat(out) .. '"'
end

local function is_array(t)
  if getmetatable(t) == object_mt then return false end
  local n = #t
  local count = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then return false end
    count = count + 1
  end
  return count == n
end

local function encode(v, indent, depth, seen, out)
  local tv = type(v)
  if v == nil or v == M.null then
    out[#out + 1] = "null"
  elseif tv == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif tv == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      out[#out + 1] = "null"
    elseif v % 1 == 0 and math.abs(v) < 2 ^ 53 then
      out[#out + 1] = string.format("%d", v)
    else
      out[#out + 1] = string.format("%.17g", v)
    end
  elseif tv == "string" then
    out[#out + 1] = encode_string(v)
  elseif tv == "table" then
    if seen[v] then error("json.encode: cycle in table", 0) end
    seen[v] = true
    local nl = indent and ("\n" .. string.rep(indent, depth + 1)) or ""
    local close_nl = indent and ("\n" .. string.rep(indent, depth)) or ""
    local colon = indent and ": " or ":"
    if is_array(v) then
      local flat = true
      for i = 1, #v do
        local te = type(v[i])
        if te ~= "number" and te ~= "boolean" then flat = false break end
      end
      if #v == 0 then
        out[#out + 1] = "[]"
      elseif flat and indent then   -- shapes and other short numeric lists stay on one line
        local items = {}
        for i = 1, #v do
          local o = {}
          encode(v[i], nil, 0, seen, o)
          items[i] = o[1]
        end
        out[#out + 1] = "[" .. table.concat(items, ", ") .. "]"
      else
        out[#out + 1] = "["
        for i = 1, #v do
          if i > 1 then out[#out + 1] = "," end
          out[#out + 1] = nl
          encode(v[i], indent, depth + 1, seen, out)
        end
        out[#out + 1] = close_nl .. "]"
      end
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" and type(k) ~= "number" then
          error("json.encode: object key of type " .. type(k), 0)
        end
        keys[#keys + 1] = tostring(k)
      end
      table.sort(keys)
      if #keys == 0 then
        out[#out + 1] = "{}"
      else
        out[#out + 1] = "{"
        for i, k in ipairs(keys) do
          if i > 1 then out[#out + 1] = "," end
          local val = v[k]
          if val == nil then val = v[tonumber(k)] end
          out[#out + 1] = nl .. encode_string(k) .. colon
          encode(val, indent, depth + 1, seen, out)
        end
        out[#out + 1] = close_nl .. "}"
      end
    end
    seen[v] = nil
  else
    error("json.encode: cannot encode a " .. tv, 0)
  end
end

-- encode(value [, {indent = "  "}])
function M.encode(v, opts)
  local out = {}
  encode(v, opts and opts.indent, 0, {}, out)
  return table.concat(out)
end

-- ---- decoding ---------------------------------------------------------------------------------------

local function decode_error(s, i, msg)
  local line, col = 1, 1
  for k = 1, math.min(i - 1, #s) do
    if s:byte(k) == 10 then line, col = line + 1, 1 else col = col + 1 end
  end
  error(("json.decode: %s at line %d column %d"):format(msg, line, col), 0)
end

local function skip(s, i)
  local _, e = s:find("^[ \t\r\n]*", i)
  return e + 1
end

local function utf8_encode(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
                     0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

M.utf8_encode = utf8_encode   -- a code point as UTF-8 (nibble.chat's string escapes too)

local decode_value

local function decode_string(s, i)
  local out, j = {}, i + 1
  while true do
    local a = s:find('["\\%c]', j)
    if not a then decode_error(s, i, "unterminated string") end
    out[#out + 1] = s:sub(j, a - 1)
    local c = s:sub(a, a)
    if c == '"' then return table.concat(out), a + 1 end
    if c ~= "\\" then decode_error(s, a, "control character in string") end
    local e = s:sub(a + 1, a + 1)
    local simple = ({ ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" })[e]
    if simple then
      out[#out + 1] = simple
      j = a + 2
    elseif e == "u" then
      local hex = s:match("^%x%x%x%x", a + 2)
      if not hex then decode_error(s, a, "bad \\u escape") end
      local cp = tonumber(hex, 16)
      j = a + 6
      if cp >= 0xD800 and cp <= 0xDBFF then
        local lo = s:match("^\\u(%x%x%x%x)", j)
        local lv = lo and tonumber(lo, 16)
        if lv and lv >= 0xDC00 and lv <= 0xDFFF then
          cp = 0x10000 + (cp - 0xD800) * 1024 + (lv - 0xDC00)
          j = j + 6
        end
      end
      out[#out + 1] = utf8_encode(cp)
    else
      decode_error(s, a, "bad escape \\" .. e)
    end
  end
end

function decode_value(s, i)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "{" then
    local obj = M.object({})
    i = skip(s, i + 1)
    if s:sub(i, i) == "}" then return obj, i + 1 end
    while true do
      if s:sub(i, i) ~= '"' then decode_error(s, i, "expected a string key") end
      local k
      k, i = decode_string(s, i)
      i = skip(s, i)
      if s:sub(i, i) ~= ":" then decode_error(s, i, "expected ':'") end
      local v
      v, i = decode_value(s, i + 1)
      obj[k] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "}" then return obj, i + 1 end
      if d ~= "," then decode_error(s, i, "expected ',' or '}'") end
      i = skip(s, i + 1)
    end
  elseif c == "[" then
    local arr = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "]" then return arr, i + 1 end
    while true do
      local v
      v, i = decode_value(s, i)
      arr[#arr + 1] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "]" then return arr, i + 1 end
      if d ~= "," then decode_error(s, i, "expected ',' or ']'") end
      i = i + 1
    end
  elseif c == '"' then
    return decode_string(s, i)
  elseif s:find("^true", i) then return true, i + 4
  elseif s:find("^false", i) then return false, i + 5
  elseif s:find("^null", i) then return M.null, i + 4
  else
    local numstr = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    if not numstr or numstr == "" or numstr == "-" then decode_error(s, i, "unexpected character") end
    local v = tonumber(numstr)
    if not v then decode_error(s, i, "bad number " .. numstr) end
    return v, i + #numstr
  end
end

-- decode(string): the value; raises "json.decode: ... at line L column C" on bad input.
function M.decode(s)
  local v, i = decode_value(s, 1)
  i = skip(s, i)
  if i <= #s then decode_error(s, i, "trailing characters") end
  return v
end

return M

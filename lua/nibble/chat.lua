-- nibble.chat: renders a model's chat template (the Jinja source in tokenizer_config.json's
-- "chat_template" or GGUF's tokenizer.chat_template) as transformers' apply_chat_template does: Jinja
-- with trim_blocks and lstrip_blocks, raise_exception, strftime_now and a JSON-dumping tojson. Only the
-- subset the common templates use is implemented; anything else is an error naming the construct.
local json = require("nibble.json")

local M = {}

local NONE = json.null                       -- Jinja's none (and JSON null in decoded messages)
local UNDEF = setmetatable({}, { __tostring = function() return "undefined" end })
local NS_MT = {}                             -- namespace(...) objects
local LOOP_MT = {}                           -- the loop variable
M.none, M.undefined = NONE, UNDEF

local function fail(msg) error("chat template: " .. msg, 0) end
local function at(line, msg) fail(("line %d: %s"):format(line, msg)) end

-- ---- values -----------------------------------------------------------------------------------------

local function is_list(v)
  return type(v) == "table" and v ~= NONE and v ~= UNDEF and getmetatable(v) == nil and (next(v) == nil or v[1] ~= nil)
end
-- a mapping: a Lua table with keys, or a JSON object from nibble.json (namespaces and loop are not)
local function is_dict(v)
  if type(v) ~= "table" or v == NONE or v == UNDEF then return false end
  local mt = getmetatable(v)
  return mt ~= NS_MT and mt ~= LOOP_MT and not is_list(v)
end

local function kind(v)
  if v == UNDEF then return "undefined" elseif v == NONE then return "none" end
  local t = type(v)
  if t == "table" then
    if getmetatable(v) == NS_MT then return "namespace" end
    return is_list(v) and "list" or "mapping"
  end
  return t
end

local function truthy(v)
  if v == nil or v == false or v == NONE or v == UNDEF or v == 0 or v == "" then return false end
  if (is_list(v) or is_dict(v)) and next(v) == nil then return false end
  return true
end

-- Python's str() of a number: integers without a point, others in the shortest form that reads back.
local function num_str(n)
  if n ~= n then return "nan" elseif n == math.huge then return "inf" elseif n == -math.huge then return "-inf" end
  if n == math.floor(n) and math.abs(n) < 1e16 then return ("%d"):format(n) end
  for p = 1, 17 do
    local s = ("%." .. p .. "g"):format(n)
    if tonumber(s) == n then return s end
  end
  return ("%.17g"):format(n)
end

local function str(v)
  local t = type(v)
  if t == "string" then return v elseif t == "number" then return num_str(v)
  elseif t == "boolean" then return v and "True" or "False"
  elseif v == UNDEF then return "" elseif v == NONE then return "None" end
  fail("printing a " .. kind(v) .. " is not supported")
end

-- UTF-8 code points of s (Python indexes and counts strings by code point, not by byte).
local function chars(s)
  local r = {}
  for c in s:gmatch("[%z\1-\127\194-\244][\128-\191]*") do r[#r + 1] = c end
  return r
end
local function ulen(s)
  if not s:find("[\128-\255]") then return #s end
  return #chars(s)
end

-- Python's str.isspace() set: ASCII whitespace, \x1c-\x1f and the Unicode spaces.
local spaces = { "\194\133", "\194\160", "\225\154\128", "\226\128\168", "\226\128\169", "\226\128\175",
                 "\226\129\159", "\227\128\128" }
for c = 0x80, 0x8A do spaces[#spaces + 1] = "\226\128" .. string.char(c) end
local function space_at(s, i, backward)
  local b = s:byte(i)
  if b == 32 or (b >= 9 and b <= 13) or (b >= 28 and b <= 31) then return 1 end
  for _, sp in ipairs(spaces) do
    local j = backward and i - #sp + 1 or i
    if j >= 1 and s:sub(j, j + #sp - 1) == sp then return #sp end
  end
  return nil
end
local function strip(s, left, right, set)
  local i, j = 1, #s
  if set then
    local cs = {}
    for _, c in ipairs(chars(set)) do cs[c] = true end
    local cp = chars(s)
    local a, b = 1, #cp
    while left and a <= b and cs[cp[a]] do a = a + 1 end
    while right and b >= a and cs[cp[b]] do b = b - 1 end
    return table.concat(cp, "", a, b)
  end
  while left and i <= j do
    local n = space_at(s, i, false)
    if not n then break end
    i = i + n
  end
  while right and j >= i do
    local n = space_at(s, j, true)
    if not n then break end
    j = j - n
  end
  return s:sub(i, j)
end

local eq
eq = function(a, b)
  if type(a) == "boolean" then a = a and 1 or 0 end
  if type(b) == "boolean" then b = b and 1 or 0 end
  if a == b then return true end
  if is_list(a) and is_list(b) then
    if #a ~= #b then return false end
    for i = 1, #a do if not eq(a[i], b[i]) then return false end end
    return true
  end
  return false
end

local function tojson(v, opts)
  if opts and (opts.indent ~= nil or opts.separators ~= nil or opts.sort_keys ~= nil) then
    fail("tojson with indent, separators or sort_keys is not supported")
  end
  local t = type(v)
  if v == NONE or v == UNDEF then return "null" end
  if t == "boolean" then return v and "true" or "false" end
  if t == "number" then
    if v == math.floor(v) and math.abs(v) < 1e16 then return ("%d"):format(v) end
    return num_str(v)
  end
  if t == "string" then
    -- json.dumps(ensure_ascii=False): quotes, backslashes and control characters escaped, the rest raw
    return '"' .. v:gsub('[%c"\\]', function(c)
      local e = ({ ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
                   ["\b"] = "\\b", ["\f"] = "\\f" })[c]
      if e then return e end
      if c:byte() == 127 then return c end
      return ("\\u%04x"):format(c:byte())
    end) .. '"'
  end
  if is_list(v) then
    local r = {}
    for i = 1, #v do r[i] = tojson(v[i]) end
    return "[" .. table.concat(r, ", ") .. "]"
  end
  if is_dict(v) then
    local k, x = next(v)
    if next(v, k) ~= nil then
      fail("tojson of a mapping with more than one key is not supported (a Lua table keeps no key order)")
    end
    return "{" .. tojson(tostring(k)) .. ": " .. tojson(x) .. "}"
  end
  fail("tojson of a " .. kind(v) .. " is not supported")
end

-- ---- lexer: the template into text, {{ }}, {% %} ---------------------------------------------------

local function line_of(src, pos)
  local _, n = src:sub(1, pos):gsub("\n", "")
  return n + 1
end

-- Jinja's lexer with trim_blocks and lstrip_blocks (transformers' settings) and keep_trailing_newline off.
local function lex(src)
  src = src:gsub("\r\n", "\n"):gsub("\r", "\n")
  if src:sub(-1) == "\n" then src = src:sub(1, -2) end
  local out, pos, line_starting = {}, 1, true
  while pos <= #src do
    local s = src:find("{[{%%#]", pos)
    if not s then
      out[#out + 1] = { type = "text", value = src:sub(pos) }
      break
    end
    local text, k = src:sub(pos, s - 1), src:sub(s + 1, s + 1)
    local sign = src:sub(s + 2, s + 2)
    if sign ~= "-" and sign ~= "+" then sign = "" end
    if sign == "-" then
      text = strip(text, false, true)
    elseif sign ~= "+" and k ~= "{" then
      local nl = text:find("\n[^\n]*$")
      local tail = nl and text:sub(nl + 1) or text
      if (nl or line_starting) and not tail:find("[^ \t\v\f]") then text = text:sub(1, #text - #tail) end
    end
    if text ~= "" then out[#out + 1] = { type = "text", value = text } end
    local line = line_of(src, s)
    local close = ({ ["{"] = "}}", ["%"] = "%}", ["#"] = "#}" })[k]
    local i = s + 2 + #sign
    local inner_end, after
    while true do
      if i > #src then at(line, ("'%s' is never closed"):format("{" .. k)) end
      local c = src:sub(i, i)
      if k ~= "#" and (c == "'" or c == '"') then
        local j = i + 1
        while j <= #src and src:sub(j, j) ~= c do j = j + (src:sub(j, j) == "\\" and 2 or 1) end
        i = j + 1
      elseif src:sub(i, i + 1) == close then
        inner_end, after = i - 1, i + 2
        break
      else
        i = i + 1
      end
    end
    local esign = src:sub(inner_end, inner_end)
    if esign == "-" or esign == "+" then inner_end = inner_end - 1 else esign = "" end
    pos = after
    if esign == "-" then
      while pos <= #src and space_at(src, pos, false) do pos = pos + space_at(src, pos, false) end
    elseif esign ~= "+" and k ~= "{" and src:sub(pos, pos) == "\n" then
      pos = pos + 1
    end
    line_starting = src:sub(pos - 1, pos - 1) == "\n"
    if k ~= "#" then
      out[#out + 1] = { type = k == "{" and "var" or "block", src = src:sub(s + 2 + #sign, inner_end), line = line }
    end
  end
  return out
end

-- ---- expression tokens ------------------------------------------------------------------------------

local ops2 = { ["//"] = true, ["**"] = true, ["=="] = true, ["!="] = true, ["<="] = true, [">="] = true }
local ops1 = "+-*/%~<>=()[]{},.:|"
local esc = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ["'"] = "'", ['"'] = '"', a = "\a", b = "\b",
              f = "\f", v = "\v", ["0"] = "\0" }
local utf8_char = json.utf8_encode

local function unescape(s, line)
  local r, i = {}, 1
  while i <= #s do
    local c = s:sub(i, i)
    if c ~= "\\" then
      r[#r + 1] = c
      i = i + 1
    else
      local e = s:sub(i + 1, i + 1)
      local hex = ({ x = 2, u = 4, U = 8 })[e]
      if hex then
        local h = s:sub(i + 2, i + 1 + hex)
        if #h ~= hex or h:find("[^%x]") then at(line, "invalid \\" .. e .. " escape in a string") end
        r[#r + 1] = utf8_char(tonumber(h, 16))
        i = i + 2 + hex
      elseif esc[e] then
        r[#r + 1] = esc[e]
        i = i + 2
      elseif e == "\n" then
        i = i + 2
      else
        r[#r + 1] = "\\" .. e   -- Python keeps an unknown escape as it is
        i = i + 2
      end
    end
  end
  return table.concat(r)
end

local function tokens(src, line)
  local t, i = {}, 1
  while i <= #src do
    local c = src:sub(i, i)
    if c:find("%s") then
      i = i + 1
    elseif c:find("[%a_]") then
      local w = src:match("^[%w_]+", i)
      t[#t + 1] = { "name", w }
      i = i + #w
    elseif c:find("%d") then
      local n = src:match("^%d[%d_]*%.%d[%d_]*[eE][+-]?%d+", i) or src:match("^%d[%d_]*%.%d[%d_]*", i)
        or src:match("^%d[%d_]*[eE][+-]?%d+", i) or src:match("^%d[%d_]*", i)
      t[#t + 1] = { "number", tonumber((n:gsub("_", ""))) }
      i = i + #n
    elseif c == "'" or c == '"' then
      local j = i + 1
      while j <= #src and src:sub(j, j) ~= c do j = j + (src:sub(j, j) == "\\" and 2 or 1) end
      if j > #src then at(line, "unterminated string") end
      t[#t + 1] = { "string", unescape(src:sub(i + 1, j - 1), line) }
      i = j + 1
    elseif ops2[src:sub(i, i + 1)] then
      t[#t + 1] = { "op", src:sub(i, i + 1) }
      i = i + 2
    elseif ops1:find(c, 1, true) then
      t[#t + 1] = { "op", c }
      i = i + 1
    else
      at(line, ("unexpected character '%s'"):format(c))
    end
  end
  t[#t + 1] = { "eof" }
  return t
end

-- ---- expression parser (Jinja's precedence) ---------------------------------------------------------

local FILTERS, TESTS = {}, {}

local P = {}
P.__index = P

local function parser(src, line)
  return setmetatable({ t = tokens(src, line), i = 1, line = line }, P)
end
function P:peek(k) return self.t[self.i + (k or 0)] end
function P:next() local x = self.t[self.i]; self.i = self.i + 1; return x end
function P:is(ty, v) local x = self.t[self.i]; return x[1] == ty and (v == nil or x[2] == v) end
function P:skip(ty, v) if self:is(ty, v) then self.i = self.i + 1; return true end return false end
function P:expect(ty, v)
  if not self:is(ty, v) then
    local x = self.t[self.i]
    at(self.line, ("expected '%s', found '%s'"):format(v or ty, x[1] == "eof" and "end of tag" or tostring(x[2])))
  end
  return self:next()
end
function P:done() if not self:is("eof") then self:expect("eof") end end

function P:expr(no_cond)
  local e = self:or_()
  if no_cond then return e end
  while self:skip("name", "if") do
    local c = self:or_()
    local f = self:skip("name", "else") and self:expr() or nil
    e = { "cond", c, e, f }
  end
  return e
end
function P:or_()
  local e = self:and_()
  while self:skip("name", "or") do e = { "or", e, self:and_() } end
  return e
end
function P:and_()
  local e = self:not_()
  while self:skip("name", "and") do e = { "and", e, self:not_() } end
  return e
end
function P:not_()
  if self:skip("name", "not") then return { "not", self:not_() } end
  return self:compare()
end
local cmp_ops = { ["=="] = true, ["!="] = true, ["<"] = true, [">"] = true, ["<="] = true, [">="] = true }
function P:compare()
  local e = self:math1()
  while true do
    local x = self:peek()
    if x[1] == "op" and cmp_ops[x[2]] then
      self:next()
      e = { "cmp", x[2], e, self:math1() }
    elseif self:skip("name", "in") then
      e = { "in", e, self:math1() }
    elseif self:is("name", "not") and self:peek(1)[1] == "name" and self:peek(1)[2] == "in" then
      self.i = self.i + 2
      e = { "not", { "in", e, self:math1() } }
    else
      return e
    end
  end
end
function P:math1()
  local e = self:concat()
  while self:is("op", "+") or self:is("op", "-") do
    local op = self:next()[2]
    e = { "bin", op, e, self:concat() }
  end
  return e
end
function P:concat()
  local e = self:math2()
  while self:skip("op", "~") do e = { "bin", "~", e, self:math2() } end
  return e
end
function P:math2()
  local e = self:pow()
  while self:is("op", "*") or self:is("op", "/") or self:is("op", "//") or self:is("op", "%") do
    local op = self:next()[2]
    e = { "bin", op, e, self:pow() }
  end
  return e
end
function P:pow()
  local e = self:unary(true)
  while self:skip("op", "**") do e = { "bin", "**", e, self:unary(true) } end
  return e
end
function P:unary(with_filter)
  local e
  if self:skip("op", "-") then e = { "neg", self:unary(false) }
  elseif self:skip("op", "+") then e = { "pos", self:unary(false) }
  else e = self:postfix(self:primary()) end
  if with_filter then e = self:filters(e) end
  return e
end
function P:primary()
  local x = self:next()
  if x[1] == "name" then
    local v = x[2]
    if v == "true" or v == "True" then return { "lit", true } end
    if v == "false" or v == "False" then return { "lit", false } end
    if v == "none" or v == "None" then return { "lit", NONE } end
    return { "var", v }
  elseif x[1] == "string" then
    local s = x[2]
    while self:is("string") do s = s .. self:next()[2] end
    return { "lit", s }
  elseif x[1] == "number" then
    return { "lit", x[2] }
  elseif x[1] == "op" and x[2] == "(" then
    local items = {}
    local tuple = false
    while not self:is("op", ")") do
      items[#items + 1] = self:expr()
      if not self:skip("op", ",") then break end
      tuple = true
    end
    self:expect("op", ")")
    if not tuple and #items == 1 then return items[1] end
    return { "list", items }
  elseif x[1] == "op" and x[2] == "[" then
    local items = {}
    while not self:is("op", "]") do
      items[#items + 1] = self:expr()
      if not self:skip("op", ",") then break end
    end
    self:expect("op", "]")
    return { "list", items }
  elseif x[1] == "op" and x[2] == "{" then
    local keys, vals = {}, {}
    while not self:is("op", "}") do
      keys[#keys + 1] = self:expr()
      self:expect("op", ":")
      vals[#vals + 1] = self:expr()
      if not self:skip("op", ",") then break end
    end
    self:expect("op", "}")
    return { "dict", keys, vals }
  end
  at(self.line, ("unexpected '%s' in an expression"):format(x[1] == "eof" and "end of tag" or tostring(x[2])))
end
function P:args()
  local pos, kw = {}, {}
  while not self:is("op", ")") do
    if self:is("name") and self:peek(1)[1] == "op" and self:peek(1)[2] == "=" then
      local k = self:next()[2]
      self:next()
      kw[k] = self:expr()
    else
      pos[#pos + 1] = self:expr()
    end
    if not self:skip("op", ",") then break end
  end
  self:expect("op", ")")
  return pos, kw
end
function P:postfix(e)
  while true do
    if self:skip("op", ".") then
      local x = self:next()
      if x[1] == "name" then e = { "attr", e, x[2] }
      elseif x[1] == "number" then e = { "item", e, { "lit", x[2] } }
      else at(self.line, "expected an attribute name after '.'") end
    elseif self:skip("op", "[") then
      local parts, colon = { nil, nil, nil }, 0
      local idx = 1
      while not self:is("op", "]") do
        if self:skip("op", ":") then
          colon = colon + 1
          idx = idx + 1
          if idx > 3 then at(self.line, "too many ':' in a slice") end
        else
          parts[idx] = self:expr()
        end
      end
      self:expect("op", "]")
      if colon == 0 then e = { "item", e, parts[1] } else e = { "slice", e, parts[1], parts[2], parts[3] } end
    elseif self:skip("op", "(") then
      local pos, kw = self:args()
      e = { "call", e, pos, kw }
    else
      return e
    end
  end
end
function P:filters(e)
  while true do
    if self:skip("op", "|") then
      local name = self:expect("name")[2]
      if not FILTERS[name] then at(self.line, ("unsupported filter '%s'"):format(name)) end
      local pos, kw = {}, {}
      if self:skip("op", "(") then pos, kw = self:args() end
      e = { "filter", name, e, pos, kw }
    elseif self:skip("name", "is") then
      local negate = self:skip("name", "not")
      local name = self:expect("name")[2]
      if not TESTS[name] then at(self.line, ("unsupported test 'is %s'"):format(name)) end
      local pos = {}
      if self:skip("op", "(") then
        pos = self:args()
      elseif self:is("string") or self:is("number") or (self:is("name") and not ({ ["and"] = 1, ["or"] = 1,
             ["else"] = 1, ["if"] = 1, ["in"] = 1, ["is"] = 1, ["not"] = 1 })[self:peek()[2]]) then
        pos = { self:postfix(self:primary()) }
      end
      e = { "test", name, e, pos }
      if negate then e = { "not", e } end
    else
      return e
    end
  end
end

-- ---- statements -------------------------------------------------------------------------------------

local unsupported_tags = { macro = true, call = true, filter = true, include = true, import = true, from = true,
                           extends = true, block = true, raw = true, with = true, autoescape = true, ["do"] = true }

-- parse(segments, i, ends): a list of nodes up to one of the tags in `ends` ({"endfor", ...});
-- returns the body, the index after the end tag and the end tag's name.
local function parse_body(segs, i, ends, opener)
  local body = {}
  while i <= #segs do
    local s = segs[i]
    if s.type == "text" then
      body[#body + 1] = { "text", s.value }
      i = i + 1
    elseif s.type == "var" then
      local p = parser(s.src, s.line)
      local e = p:expr()
      p:done()
      body[#body + 1] = { "out", e, line = s.line }
      i = i + 1
    else
      local p = parser(s.src, s.line)
      local tag = p:is("name") and p:next()[2] or at(s.line, "a '{%' tag without a name")
      if ends and ends[tag] then return body, i + 1, tag, p end
      if tag == "for" then
        local targets = { p:expect("name")[2] }
        while p:skip("op", ",") do targets[#targets + 1] = p:expect("name")[2] end
        p:expect("name", "in")
        local iter = p:expr(true)
        local cond = p:skip("name", "if") and p:expr(true) or nil
        if p:is("name", "recursive") then at(s.line, "unsupported 'for ... recursive'") end
        p:done()
        local b, j, e = parse_body(segs, i + 1, { endfor = true, ["else"] = true }, "for")
        local eb = nil
        if e == "else" then
          eb, j = parse_body(segs, j, { endfor = true }, "for")
        end
        body[#body + 1] = { "for", targets, iter, cond, b, eb, line = s.line }
        i = j
      elseif tag == "if" then
        local branches = {}
        local c = p:expr()
        p:done()
        local j, e, q = i + 1, nil, nil
        local b
        while true do
          b, j, e, q = parse_body(segs, j, { elif = true, ["else"] = true, endif = true }, "if")
          branches[#branches + 1] = { c, b }
          if e == "elif" then
            c = q:expr()
            q:done()
          elseif e == "else" then
            b, j = parse_body(segs, j, { endif = true }, "if")
            branches[#branches + 1] = { { "lit", true }, b }
            break
          else
            break
          end
        end
        body[#body + 1] = { "if", branches, line = s.line }
        i = j
      elseif tag == "set" then
        local name = p:expect("name")[2]
        local attr = p:skip("op", ".") and p:expect("name")[2] or nil
        if p:is("op", ",") then at(s.line, "unsupported 'set' of several names") end
        if p:skip("op", "=") then
          local e = p:expr()
          p:done()
          body[#body + 1] = { "set", name, attr, e, line = s.line }
          i = i + 1
        else
          if attr then at(s.line, "unsupported block 'set' of an attribute") end
          p:done()
          local b, j = parse_body(segs, i + 1, { endset = true }, "set")
          body[#body + 1] = { "setblock", name, b, line = s.line }
          i = j
        end
      elseif tag == "break" or tag == "continue" then
        p:done()
        body[#body + 1] = { tag, line = s.line }
        i = i + 1
      elseif tag == "generation" then
        -- transformers' {% generation %} marks assistant text for masks; the text renders as usual
        p:done()
        local b, j = parse_body(segs, i + 1, { endgeneration = true }, "generation")
        body[#body + 1] = { "block", b }
        i = j
      elseif unsupported_tags[tag] then
        at(s.line, ("unsupported tag '{%% %s %%}'"):format(tag))
      else
        at(s.line, ("unknown tag '{%% %s %%}'"):format(tag))
      end
    end
  end
  if ends then
    local names = {}
    for k in pairs(ends) do names[#names + 1] = k end
    table.sort(names)
    fail(("'{%% %s %%}' is never closed (expected %s)"):format(opener, table.concat(names, " or ")))
  end
  return body, i
end

-- ---- evaluation -------------------------------------------------------------------------------------

local function lookup(scope, name)
  while scope do
    local v = scope.vars[name]
    if v ~= nil then return v end
    scope = scope.parent
  end
  return UNDEF
end

local BREAK, CONTINUE = {}, {}

local function slice(v, a, b, c, line)
  local list = is_list(v)
  if not list and type(v) ~= "string" then at(line, "cannot slice a " .. kind(v)) end
  local items = list and v or chars(v)
  local n = #items
  local step = c or 1
  if step == 0 then at(line, "slice step cannot be zero") end
  local function norm(x, dflt)
    if x == nil then return dflt end
    if x < 0 then x = x + n end
    if step > 0 then return math.max(0, math.min(x, n)) end
    return math.max(-1, math.min(x, n - 1))
  end
  local s = norm(a, step > 0 and 0 or n - 1)
  local e = norm(b, step > 0 and n or -1)
  local r = {}
  local k = s
  while (step > 0 and k < e) or (step < 0 and k > e) do
    r[#r + 1] = items[k + 1]
    k = k + step
  end
  if list then return r end
  return table.concat(r)
end

local function index(v, key, line)
  if v == UNDEF then at(line, ("cannot read [%s] of an undefined value"):format(str(key))) end
  if type(v) == "string" then
    if type(key) ~= "number" then return UNDEF end
    local cs = chars(v)
    if key < 0 then key = key + #cs end
    return cs[key + 1] or UNDEF
  end
  if type(v) ~= "table" or v == NONE then return UNDEF end
  if is_list(v) then
    if type(key) ~= "number" then return UNDEF end
    if key < 0 then key = key + #v end
    local x = v[key + 1]
    if x == nil then return UNDEF end
    return x
  end
  local x = v[key]
  if x == nil then return UNDEF end
  return x
end

-- an error at a line when one is known (string methods are called without one)
local function lfail(line, msg) if line then at(line, msg) else fail(msg) end end
local function need_str(v, what, line)
  if type(v) ~= "string" then lfail(line, ("'%s' of a %s"):format(what, kind(v))) end
  return v
end
-- Lua's case mapping is ASCII-only; Python maps every cased letter, so non-ASCII text is refused
local function ascii(v, what, line)
  need_str(v, what, line)
  if v:find("[\128-\255]") then lfail(line, ("'%s' of non-ASCII text is not supported"):format(what)) end
  return v
end
local function method(obj, name)
  local t = type(obj)
  if t == "string" then
    local m = {
      strip = function(chars_) return strip(obj, true, true, chars_ ~= NONE and chars_ or nil) end,
      lstrip = function(chars_) return strip(obj, true, false, chars_ ~= NONE and chars_ or nil) end,
      rstrip = function(chars_) return strip(obj, false, true, chars_ ~= NONE and chars_ or nil) end,
      upper = function() return ascii(obj, "upper"):upper() end,
      lower = function() return ascii(obj, "lower"):lower() end,
      startswith = function(p) return obj:sub(1, #p) == p end,
      endswith = function(p) return p == "" or obj:sub(-#p) == p end,
      replace = function(a, b)
        if a == "" then fail("str.replace with an empty pattern is not supported") end
        local r, i = {}, 1
        while true do
          local s, e = obj:find(a, i, true)
          if not s then break end
          r[#r + 1] = obj:sub(i, s - 1) .. b
          i = e + 1
        end
        return table.concat(r) .. obj:sub(i)
      end,
      split = function(sep)
        local r = {}
        if sep == nil or sep == NONE then
          for w in obj:gmatch("%S+") do r[#r + 1] = w end
          return r
        end
        local i = 1
        while true do
          local s, e = obj:find(sep, i, true)
          if not s then break end
          r[#r + 1] = obj:sub(i, s - 1)
          i = e + 1
        end
        r[#r + 1] = obj:sub(i)
        return r
      end,
    }
    return m[name]
  elseif is_dict(obj) then
    if name == "get" then
      return function(k, d)
        local x = obj[k]
        if x == nil then return d == nil and NONE or d end
        return x
      end
    elseif name == "items" or name == "keys" or name == "values" then
      return function() fail(("mapping.%s() is not supported (a Lua table keeps no key order)"):format(name)) end
    end
  end
  return nil
end

local function attr(v, name, line)
  if v == UNDEF then at(line, ("cannot read '.%s' of an undefined value"):format(name)) end
  if type(v) == "table" and v ~= NONE then
    local mt = getmetatable(v)
    if mt == NS_MT or mt == LOOP_MT then
      local x = v[name]
      if x == nil then return UNDEF end
      return x
    end
    local m = method(v, name)
    if m then return m end
    if is_dict(v) then
      local x = v[name]
      if x == nil then return UNDEF end
      return x
    end
    return UNDEF
  end
  return method(v, name) or UNDEF
end

local eval

local function arith(op, a, b, line)
  if op == "~" then return str(a) .. str(b) end
  local ta, tb = type(a), type(b)
  if ta == "boolean" then a, ta = a and 1 or 0, "number" end
  if tb == "boolean" then b, tb = b and 1 or 0, "number" end
  if op == "+" then
    if ta == "number" and tb == "number" then return a + b end
    if ta == "string" and tb == "string" then return a .. b end
    if is_list(a) and is_list(b) then
      local r = {}
      for i = 1, #a do r[#r + 1] = a[i] end
      for i = 1, #b do r[#r + 1] = b[i] end
      return r
    end
  elseif op == "*" and ta == "string" and tb == "number" then
    return a:rep(math.max(0, b))
  elseif ta == "number" and tb == "number" then
    if op == "-" then return a - b
    elseif op == "*" then return a * b
    elseif op == "**" then return a ^ b
    elseif b == 0 and (op == "/" or op == "//" or op == "%") then at(line, "division by zero")
    elseif op == "/" then return a / b
    elseif op == "//" then return math.floor(a / b)
    elseif op == "%" then return a - math.floor(a / b) * b end
  end
  at(line, ("cannot apply '%s' to a %s and a %s"):format(op, kind(a), kind(b)))
end

local function contains(hay, x, line)
  if type(hay) == "string" then
    if type(x) ~= "string" then at(line, "'in <string>' needs a string on the left, got a " .. kind(x)) end
    return hay:find(x, 1, true) ~= nil
  end
  if is_list(hay) then
    for i = 1, #hay do if eq(hay[i], x) then return true end end
    return false
  end
  if is_dict(hay) then return hay[x] ~= nil end
  if hay == UNDEF then at(line, "'in' an undefined value") end
  at(line, "cannot test 'in' a " .. kind(hay))
end

local function compare(op, a, b, line)
  if op == "==" then return eq(a, b) elseif op == "!=" then return not eq(a, b) end
  if type(a) == "boolean" then a = a and 1 or 0 end
  if type(b) == "boolean" then b = b and 1 or 0 end
  if not ((type(a) == "number" and type(b) == "number") or (type(a) == "string" and type(b) == "string")) then
    at(line, ("cannot compare a %s with a %s by '%s'"):format(kind(a), kind(b), op))
  end
  if op == "<" then return a < b elseif op == ">" then return a > b
  elseif op == "<=" then return a <= b else return a >= b end
end

local function eval_args(nodes, scope, line)
  local r = {}
  for i, n in ipairs(nodes) do r[i] = eval(n, scope, line) end
  return r
end
local function eval_kw(kw, scope, line)
  local r = {}
  for k, n in pairs(kw) do r[k] = eval(n, scope, line) end
  return r
end

eval = function(n, scope, line)
  local k = n[1]
  if k == "lit" then return n[2]
  elseif k == "var" then return lookup(scope, n[2])
  elseif k == "list" then return eval_args(n[2], scope, line)
  elseif k == "dict" then
    local r = {}
    for i, kn in ipairs(n[2]) do r[eval(kn, scope, line)] = eval(n[3][i], scope, line) end
    return r
  elseif k == "attr" then return attr(eval(n[2], scope, line), n[3], line)
  elseif k == "item" then
    local v, key = eval(n[2], scope, line), eval(n[3], scope, line)
    if is_dict(v) and v[key] == nil and type(key) == "string" then return attr(v, key, line) end
    return index(v, key, line)
  elseif k == "slice" then
    local function opt(x)
      if not x then return nil end
      local v = eval(x, scope, line)
      if v == NONE then return nil end
      return v
    end
    return slice(eval(n[2], scope, line), opt(n[3]), opt(n[4]), opt(n[5]), line)
  elseif k == "cond" then
    if truthy(eval(n[2], scope, line)) then return eval(n[3], scope, line) end
    if n[4] then return eval(n[4], scope, line) end
    return UNDEF
  elseif k == "or" then
    local a = eval(n[2], scope, line)
    if truthy(a) then return a end
    return eval(n[3], scope, line)
  elseif k == "and" then
    local a = eval(n[2], scope, line)
    if not truthy(a) then return a end
    return eval(n[3], scope, line)
  elseif k == "not" then return not truthy(eval(n[2], scope, line))
  elseif k == "cmp" then return compare(n[2], eval(n[3], scope, line), eval(n[4], scope, line), line)
  elseif k == "in" then return contains(eval(n[3], scope, line), eval(n[2], scope, line), line)
  elseif k == "bin" then
    local a, b = eval(n[3], scope, line), eval(n[4], scope, line)
    if n[2] ~= "~" and (a == UNDEF or b == UNDEF) then
      at(line, ("'%s' with an undefined value"):format(n[2]))
    end
    return arith(n[2], a, b, line)
  elseif k == "neg" or k == "pos" then
    local v = eval(n[2], scope, line)
    if type(v) ~= "number" then at(line, "unary '" .. (k == "neg" and "-" or "+") .. "' of a " .. kind(v)) end
    return k == "neg" and -v or v
  elseif k == "filter" then
    return FILTERS[n[2]](eval(n[3], scope, line), eval_args(n[4], scope, line), eval_kw(n[5], scope, line), line)
  elseif k == "test" then
    return TESTS[n[2]](eval(n[3], scope, line), eval_args(n[4], scope, line), line)
  elseif k == "call" then
    local f = eval(n[2], scope, line)
    if type(f) ~= "function" then
      local what = n[2][1] == "var" and ("'" .. n[2][2] .. "'") or n[2][1] == "attr" and ("'." .. n[2][3] .. "'") or "this"
      at(line, ("unsupported call: %s is not a function the renderer knows"):format(what))
    end
    local args, kw = eval_args(n[3], scope, line), eval_kw(n[4], scope, line)
    if next(kw) ~= nil then
      if f ~= scope.root.namespace then at(line, "keyword arguments are only supported for namespace()") end
      return f(kw, args)
    end
    return f(unpack(args, 1, #n[3]))
  end
  error("chat template: internal error: node " .. tostring(k))
end

local exec
local function exec_body(body, scope, out)
  for _, n in ipairs(body) do
    local r = exec(n, scope, out)
    if r then return r end
  end
end

exec = function(n, scope, out)
  local k, line = n[1], n.line
  if k == "text" then out[#out + 1] = n[2]
  elseif k == "out" then out[#out + 1] = str(eval(n[2], scope, line))
  elseif k == "if" then
    for _, br in ipairs(n[2]) do
      if truthy(eval(br[1], scope, line)) then return exec_body(br[2], scope, out) end
    end
  elseif k == "set" then
    local v = eval(n[4], scope, line)
    if n[3] then
      local ns = lookup(scope, n[2])
      if getmetatable(ns) ~= NS_MT then at(line, ("'set %s.%s': %s is not a namespace()"):format(n[2], n[3], n[2])) end
      ns[n[3]] = v
    else
      scope.vars[n[2]] = v
    end
  elseif k == "setblock" then
    local o = {}
    exec_body(n[3], scope, o)
    scope.vars[n[2]] = table.concat(o)
  elseif k == "break" then return BREAK
  elseif k == "continue" then return CONTINUE
  elseif k == "block" then return exec_body(n[2], scope, out)
  elseif k == "for" then
    local seq = eval(n[3], scope, line)
    local items
    if seq == UNDEF then items = {}
    elseif type(seq) == "string" then items = chars(seq)
    elseif is_list(seq) then items = seq
    else at(line, "unsupported 'for' over a " .. kind(seq)) end
    local targets = n[2]
    local function bind(vars, item)
      if #targets == 1 then vars[targets[1]] = item; return end
      if not is_list(item) or #item ~= #targets then
        at(line, ("cannot unpack a %s into %d names"):format(kind(item), #targets))
      end
      for i, t in ipairs(targets) do vars[t] = item[i] end
    end
    if n[4] then   -- {% for x in xs if cond %}: the loop (and loop.index) sees only the kept items
      local kept = {}
      for _, item in ipairs(items) do
        local s = { vars = {}, parent = scope, root = scope.root }
        bind(s.vars, item)
        if truthy(eval(n[4], s, line)) then kept[#kept + 1] = item end
      end
      items = kept
    end
    local len = #items
    if len == 0 then
      if n[6] then return exec_body(n[6], scope, out) end
      return
    end
    for i = 1, len do
      local loop = setmetatable({ index = i, index0 = i - 1, revindex = len - i + 1, revindex0 = len - i,
                                  first = i == 1, last = i == len, length = len,
                                  previtem = i > 1 and items[i - 1] or UNDEF,
                                  nextitem = i < len and items[i + 1] or UNDEF }, LOOP_MT)
      local s = { vars = { loop = loop }, parent = scope, root = scope.root }
      bind(s.vars, items[i])
      local r = exec_body(n[5], s, out)
      if r == BREAK then break end
    end
  end
end

-- ---- filters and tests ------------------------------------------------------------------------------

local function length(v, line)
  if type(v) == "string" then return ulen(v) end
  if v == UNDEF then return 0 end
  if is_list(v) then return #v end
  if is_dict(v) then local c = 0; for _ in pairs(v) do c = c + 1 end; return c end
  at(line, "length of a " .. kind(v))
end

FILTERS.trim = function(v, a, _, line)
  if v == UNDEF then v = "" end
  return strip(type(v) == "string" and v or str(v), true, true, a[1] ~= nil and a[1] ~= NONE and a[1] or nil)
end
FILTERS.length = function(v, _, _, line) return length(v, line) end
FILTERS.count = FILTERS.length
FILTERS.upper = function(v, _, _, line) return ascii(v, "upper", line):upper() end
FILTERS.lower = function(v, _, _, line) return ascii(v, "lower", line):lower() end
FILTERS.capitalize = function(v, _, _, line)
  v = ascii(v, "capitalize", line)
  return v:sub(1, 1):upper() .. v:sub(2):lower()
end
FILTERS.string = function(v) return str(v) end
FILTERS.safe = function(v) return v end
FILTERS.tojson = function(v, a, kw) return tojson(v, { indent = a[1] or kw.indent, separators = kw.separators, sort_keys = kw.sort_keys }) end
FILTERS.default = function(v, a, kw)
  local boolean = a[2] or kw.boolean
  if v == UNDEF or (truthy(boolean) and not truthy(v)) then
    local d = a[1] or kw.default_value
    if d == nil then return "" end
    return d
  end
  return v
end
FILTERS.d = FILTERS.default
FILTERS.first = function(v, _, _, line)
  if type(v) == "string" then return chars(v)[1] or UNDEF end
  if is_list(v) then if v[1] == nil then return UNDEF end return v[1] end
  at(line, "filter 'first' of a " .. kind(v))
end
FILTERS.last = function(v, _, _, line)
  if type(v) == "string" then local c = chars(v); return c[#c] or UNDEF end
  if is_list(v) then if #v == 0 then return UNDEF end return v[#v] end
  at(line, "filter 'last' of a " .. kind(v))
end
FILTERS.join = function(v, a, kw, line)
  if not is_list(v) then at(line, "filter 'join' of a " .. kind(v)) end
  if kw.attribute then at(line, "unsupported 'join(attribute=...)'") end
  local r = {}
  for i = 1, #v do r[i] = str(v[i]) end
  return table.concat(r, a[1] or kw.d or "")
end
FILTERS.list = function(v, _, _, line)
  if type(v) == "string" then return chars(v) end
  if is_list(v) then return v end
  at(line, "filter 'list' of a " .. kind(v))
end
FILTERS.replace = function(v, a, _, line)
  return method(need_str(v, "replace", line), "replace")(a[1], a[2])
end
FILTERS.int = function(v)
  if type(v) == "number" then return v >= 0 and math.floor(v) or math.ceil(v) end
  if type(v) == "boolean" then return v and 1 or 0 end
  local n = type(v) == "string" and tonumber(strip(v, true, true)) or nil
  if n then return n >= 0 and math.floor(n) or math.ceil(n) end
  return 0
end

TESTS.defined = function(v) return v ~= UNDEF end
TESTS.undefined = function(v) return v == UNDEF end
TESTS.none = function(v) return v == NONE end
TESTS.string = function(v) return type(v) == "string" end
TESTS.number = function(v) return type(v) == "number" end
TESTS.integer = function(v) return type(v) == "number" and v == math.floor(v) end
TESTS.float = function(v) return type(v) == "number" and v ~= math.floor(v) end
TESTS.boolean = function(v) return type(v) == "boolean" end
TESTS["true"] = function(v) return v == true end
TESTS["false"] = function(v) return v == false end
TESTS.mapping = function(v) return is_dict(v) end
TESTS.sequence = function(v) return type(v) == "string" or is_list(v) end
TESTS.iterable = TESTS.sequence
TESTS.even = function(v) return type(v) == "number" and v % 2 == 0 end
TESTS.odd = function(v) return type(v) == "number" and v % 2 == 1 end
TESTS.divisibleby = function(v, a) return type(v) == "number" and v % a[1] == 0 end
TESTS.eq = function(v, a) return eq(v, a[1]) end
TESTS.equalto = TESTS.eq
TESTS.sameas = function(v, a) return rawequal(v, a[1]) end
TESTS["in"] = function(v, a, line) return contains(a[1], v, line) end

-- ---- the public API ---------------------------------------------------------------------------------

local cache = setmetatable({}, { __mode = "k" })

-- compile(source): the parsed template (parse errors are raised here, before anything renders).
function M.compile(source)
  if type(source) ~= "string" then fail("expected the template source as a string, got " .. type(source)) end
  local body = parse_body(lex(source), 1, nil)
  return { body = body, source = source }
end

-- render(template (source or compiled), vars): the text; vars are the template's variables
-- (messages, add_generation_prompt, bos_token, eos_token, tools, ...). Lua nil fields are undefined.
function M.render(template, vars)
  if type(template) == "string" then
    local c = cache[template]
    if not c then c = M.compile(template); cache[template] = c end
    template = c
  end
  local root = { vars = {} }
  root.root = root
  local g = root.vars
  g.raise_exception = function(msg) fail(str(msg == nil and UNDEF or msg)) end
  g.namespace = function(kw, args)
    if args and #args > 0 then fail("namespace() takes keyword arguments only") end
    local ns = setmetatable({}, NS_MT)
    for k, v in pairs(kw or {}) do ns[k] = v end
    return ns
  end
  root.namespace = g.namespace
  g.strftime_now = function(fmt) return os.date(fmt) end
  g.range = function(a, b, c)
    if b == nil then a, b = 0, a end
    c = c or 1
    local r = {}
    for x = a, b - (c > 0 and 1 or -1), c do r[#r + 1] = x end
    return r
  end
  for k, v in pairs(vars or {}) do g[k] = v end
  local out = {}
  exec_body(template.body, root, out)
  return table.concat(out)
end

-- apply(template, messages, opts): transformers' apply_chat_template(messages, tokenize=False, ...):
-- opts.add_generation_prompt, opts.bos_token / eos_token, and any other variables in opts.vars (tools, ...).
function M.apply(template, messages, opts)
  opts = opts or {}
  if type(messages) ~= "table" then fail("messages must be a list of {role=, content=} tables") end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" then
      fail(("message %d has no 'role' string"):format(i))
    end
  end
  local vars = {}
  for k, v in pairs(opts.vars or {}) do vars[k] = v end
  vars.messages = messages
  -- transformers passes tools=None and documents=None when there are none: `tools is defined` holds
  if vars.tools == nil then vars.tools = NONE end
  if vars.documents == nil then vars.documents = NONE end
  vars.add_generation_prompt = opts.add_generation_prompt and true or false
  if opts.bos_token then vars.bos_token = opts.bos_token end
  if opts.eos_token then vars.eos_token = opts.eos_token end
  return M.render(template, vars)
end

return M

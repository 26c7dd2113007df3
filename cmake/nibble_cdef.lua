-- Build-time generator of the LuaJIT FFI declarations (DESIGN.md §3: generated, never hand-copied).
-- Input: `cc -E -dD -DNB_FFI_CDEF` output of core/include/nibble/nibble.h. Keeps only text that the
-- line markers attribute to files under the include dir, strips what ffi.cdef cannot take, checks
-- the result with ffi.cdef itself (so a header LuaJIT cannot parse fails the build, naming the line),
-- and writes a Lua module returning { cdef = "...", defines = {...}, headers = {...} }.
-- usage: luajit nibble_cdef.lua PREPROCESSED.i INCLUDE_DIR OUTPUT.lua
local input, incdir, output = arg[1], arg[2], arg[3]
if not (input and incdir and output) then
  io.stderr:write("usage: luajit nibble_cdef.lua PREPROCESSED.i INCLUDE_DIR OUTPUT.lua\n")
  os.exit(2)
end

local function die(msg)
  io.stderr:write("nibble_cdef: ", msg, "\n")
  os.exit(1)
end

local function normalize(p)
  p = p:gsub("/%./", "/"):gsub("//+", "/")
  local prev
  repeat prev = p; p = p:gsub("/[^/]+/%.%./", "/", 1) until p == prev
  return p
end
incdir = normalize(incdir:gsub("/+$", "") .. "/")

local f = assert(io.open(input, "rb"))
local src = f:read("*a")
f:close()

-- 1. Keep the lines whose line marker names one of our headers; collect `#define NAME literal`.
local kept, defines, define_order, headers, seen_hdr = {}, {}, {}, {}, {}
local cur_file, ours = nil, false
for line in (src .. "\n"):gmatch("([^\n]*)\n") do
  local lno, file = line:match('^#%s*(%d+)%s+"([^"]*)"')
  if not lno then lno, file = line:match('^#line%s+(%d+)%s+"([^"]*)"') end
  if lno then
    cur_file = normalize(file)
    ours = cur_file:sub(1, #incdir) == incdir
    if ours and not seen_hdr[cur_file] then
      seen_hdr[cur_file] = true
      headers[#headers + 1] = cur_file:sub(#incdir + 1)
    end
  elseif ours then
    local name, value = line:match("^#%s*define%s+([%a_][%w_]*)%s+(.-)%s*$")
    if name then
      local v = value:gsub("[uUlL]+$", "")
      local num = tonumber(v)
      if num and not v:find("^0%d") then
        if not defines[name] then define_order[#define_order + 1] = name end
        defines[name] = num
      elseif value:match('^"[^"\\]*"$') then
        if not defines[name] then define_order[#define_order + 1] = name end
        defines[name] = value:sub(2, -2)
      end
    elseif not line:match("^%s*#") then
      kept[#kept + 1] = { text = line, file = cur_file:sub(#incdir + 1) }
    end
  end
end
if #kept == 0 then die("no declarations found under " .. incdir .. " in " .. input) end

-- Consecutive lines of one header form a segment (a declaration never spans an #include), so a
-- declaration LuaJIT rejects can be blamed on its header.
local segments = {}
for _, l in ipairs(kept) do
  local last = segments[#segments]
  if not last or last.file ~= l.file then
    last = { file = l.file, lines = {} }
    segments[#segments + 1] = last
  end
  last.lines[#last.lines + 1] = l.text
end

-- 2. Strip what LuaJIT's C parser does not take. The headers should not contain these (common.md),
-- but a stray one must not break every Lua user.
local function strip_balanced(s, word)
  -- remove `word` followed by a balanced (...) group
  local out, pos = {}, 1
  while true do
    local a, b = s:find("%f[%w_]" .. word .. "%f[^%w_]", pos)
    if not a then break end
    local p = b + 1
    while s:sub(p, p):match("%s") do p = p + 1 end
    if s:sub(p, p) == "(" then
      local depth, q = 0, p
      repeat
        local c = s:sub(q, q)
        if c == "(" then depth = depth + 1 elseif c == ")" then depth = depth - 1 end
        q = q + 1
      until depth == 0 or q > #s
      out[#out + 1] = s:sub(pos, a - 1)
      pos = q
    else
      out[#out + 1] = s:sub(pos, b)
      pos = b + 1
    end
  end
  out[#out + 1] = s:sub(pos)
  return table.concat(out)
end
local function clean(text)
  for _, w in ipairs({ "__attribute__", "__attribute", "__asm__", "__asm", "asm", "_Static_assert",
                       "static_assert", "_Alignas", "__declspec" }) do
    text = strip_balanced(text, w)
  end
  for _, w in ipairs({ "__extension__", "__restrict__", "__restrict", "restrict", "__inline__", "__inline",
                       "_Noreturn", "__thread", "_Thread_local" }) do
    text = text:gsub("%f[%w_]" .. w .. "%f[^%w_]", "")
  end

  -- Remove function definitions (`static inline` helpers with bodies). Split the text into file-scope
  -- declarations: one ends at a `;` at depth 0, or at the `}` closing a body whose `{` followed a `)`.
  do
    local decls, depth, start, last_sig, is_body = {}, 0, 1, nil, false
    for i = 1, #text do
      local c = text:sub(i, i)
      if c == "{" then
        if depth == 0 and last_sig == ")" then is_body = true end
        depth = depth + 1
      elseif c == "}" then
        depth = depth - 1
        if depth == 0 and is_body then
          decls[#decls + 1] = { text:sub(start, i), true }
          start, is_body = i + 1, false
        end
      elseif c == ";" and depth == 0 then
        decls[#decls + 1] = { text:sub(start, i), false }
        start = i + 1
      end
      if depth == 0 and not c:match("%s") then last_sig = c end
    end
    decls[#decls + 1] = { text:sub(start), false }
    local keep = {}
    for _, d in ipairs(decls) do
      if not d[2] then keep[#keep + 1] = d[1] end
    end
    text = table.concat(keep)
  end
  -- A bare `inline` left on a prototype is harmless to C but not to cdef.
  text = text:gsub("%f[%w_]inline%f[^%w_]", "")

  -- Tidy: drop blank runs.
  text = text:gsub("[ \t]+\n", "\n"):gsub("\n\n\n+", "\n\n"):gsub("^%s+", "")
  return text
end

local parts = {}
for _, seg in ipairs(segments) do
  seg.text = clean(table.concat(seg.lines, "\n"))
  if seg.text:find("%S") then parts[#parts + 1] = "/* nibble/" .. seg.file .. " */\n" .. seg.text end
end
local text = table.concat(parts, "\n")

-- System types a header may use that LuaJIT does not predefine (it knows size_t, intN_t, va_list,
-- bool...). They go in a separate prelude that the loader declares one by one under pcall, so a
-- program that already declared one keeps working.
local prelude, prelude_known = {}, {
  FILE = "typedef struct _IO_FILE FILE;",
  ssize_t = "typedef intptr_t ssize_t;",
  off_t = "typedef int64_t off_t;",
  time_t = "typedef int64_t time_t;",
  pid_t = "typedef int32_t pid_t;",
}
for _, name in ipairs({ "FILE", "ssize_t", "off_t", "time_t", "pid_t" }) do
  if text:find("%f[%w_]" .. name .. "%f[^%w_]") then prelude[#prelude + 1] = prelude_known[name] end
end

-- 3. Prove LuaJIT accepts it (in a fresh state's ffi namespace: this process has nothing else defined).
local ffi = require("ffi")
for _, p in ipairs(prelude) do ffi.cdef(p) end
for _, seg in ipairs(segments) do
  local ok, err = pcall(ffi.cdef, seg.text)
  if not ok then
    local lno = tonumber(tostring(err):match("line (%d+)"))
    local ctx = ""
    local i = 0
    for l in (seg.text .. "\n"):gmatch("([^\n]*)\n") do
      i = i + 1
      if not lno or (i >= lno - 2 and i <= lno + 2) then ctx = ctx .. string.format("%5d| %s\n", i, l) end
      if not lno and i >= 12 then ctx = ctx .. "  ...\n" break end
    end
    die(("LuaJIT cannot parse the declarations of nibble/%s: %s\n%s"):format(seg.file, tostring(err), ctx))
  end
end

-- 4. Write the module.
local level = 0
while text:find("]" .. ("="):rep(level) .. "]", 1, true) do level = level + 1 end
local eq = ("="):rep(level)
local out = {}
out[#out + 1] = "-- Generated at build time by cmake/nibble_cdef.lua from core/include/nibble/nibble.h. Do not edit.\n"
out[#out + 1] = "return {\n  cdef = [" .. eq .. "[\n" .. text .. "\n]" .. eq .. "],\n  defines = {\n"
for _, name in ipairs(define_order) do
  local v = defines[name]
  out[#out + 1] = string.format("    %s = %s,\n", name, type(v) == "string" and string.format("%q", v) or
    (v == math.floor(v) and string.format("%d", v) or string.format("%.17g", v)))
end
out[#out + 1] = "  },\n  headers = {"
for i, h in ipairs(headers) do out[#out + 1] = (i > 1 and ", " or " ") .. string.format("%q", h) end
out[#out + 1] = " },\n  prelude = {"
for i, p in ipairs(prelude) do out[#out + 1] = (i > 1 and ", " or " ") .. string.format("%q", p) end
out[#out + 1] = " },\n}\n"
local tmp = output .. ".tmp"
local o = assert(io.open(tmp, "wb"))
o:write(table.concat(out))
o:close()
assert(os.rename(tmp, output))

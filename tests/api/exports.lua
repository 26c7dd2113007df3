-- The public headers are the API (DESIGN.md §3): libnibble, built with hidden visibility, must export
-- exactly the functions that core/include/nibble/*.h declare with NB_API, no internal symbol (nbq_*,
-- nb_gemm, a static runtime's names) and no declared function missing (the Lua FFI resolves them all
-- at run time). The declared names come from the FFI declarations generated from those headers.
-- usage: luajit exports.lua NM LIBNIBBLE.so CDEF.lua
local nm, lib, cdef_path = arg[1], arg[2], arg[3]
if not (nm and lib and cdef_path) then
  io.stderr:write("usage: luajit exports.lua NM LIBNIBBLE.so CDEF.lua\n")
  os.exit(2)
end
local def = dofile(cdef_path)

local declared, n_declared = {}, 0
for name, after in def.cdef:gmatch("%f[%w_](nb_[%w_]+)%s*%((.)") do
  -- `nb_status (*fn)(...)` is a function pointer type, `(nb_x)(` cannot occur in our headers
  if after ~= "*" and not declared[name] then
    declared[name] = true
    n_declared = n_declared + 1
  end
end

local p = assert(io.popen(("%q -D --defined-only %q"):format(nm, lib)))
local exported, n_exported, stray = {}, 0, {}
for line in p:lines() do
  local kind, name = line:match("^%x*%s+(%a)%s+([^%s@]+)")
  if name then
    exported[name] = true
    n_exported = n_exported + 1
    if not declared[name] then stray[#stray + 1] = name .. " (" .. kind .. ")" end
  end
end
local ok = p:close()
if ok ~= true and ok ~= 0 then
  io.stderr:write("nm failed on ", lib, "\n")
  os.exit(1)
end

local missing = {}
for name in pairs(declared) do
  if not exported[name] then missing[#missing + 1] = name end
end
table.sort(stray)
table.sort(missing)
if #stray > 0 then
  io.stderr:write(("%s exports %d symbol(s) that no public header declares with NB_API:\n  %s\n")
    :format(lib, #stray, table.concat(stray, "\n  ")))
end
if #missing > 0 then
  io.stderr:write(("%s does not export %d function(s) the public headers declare:\n  %s\n")
    :format(lib, #missing, table.concat(missing, "\n  ")))
end
if #stray > 0 or #missing > 0 then os.exit(1) end
if n_declared < 100 then
  io.stderr:write("only ", n_declared, " declared functions found in ", cdef_path, ": the parse is wrong\n")
  os.exit(1)
end
print(("%s exports exactly the %d functions the public headers declare"):format(lib, n_exported))

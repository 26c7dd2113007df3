-- nibble inspect: list the tensors (name, dtype, shape, bytes) and GGUF metadata of a model file
-- Usage: nibble inspect PATH [--json] [--all]. PATH is a .safetensors file, a model directory
-- (single or sharded), an index.json or a .gguf file. --json prints nibble.inspect(PATH) as JSON;
-- --all prints every element of long metadata arrays. Bad files: a named error, exit code 1.
local nibble = require("nibble")
local cli = require("nibble.cli")

local USAGE = "usage: nibble inspect PATH [--json] [--all]\n"
  .. "  PATH     a .safetensors file, a model folder (single or sharded), a model.safetensors.index.json or a .gguf\n"
  .. "  --json   print everything as one JSON object\n"
  .. "  --all    print every element of long metadata arrays and whole long strings (else the first 8 / 120 chars)\n"

local function group(n)
  local s = string.format("%d", n)
  local r = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (r:gsub("^,", ""))
end

local function quote(s, max)
  local q = string.format("%q", s):gsub("\\\n", "\\n")
  if max and #q > max then q = q:sub(1, max - 4) .. '..."' end
  return q
end

local function value_text(kv, all)
  local v = kv.value
  if type(v) == "table" then
    local n = kv.count or #v
    local limit = all and n or math.min(n, 8)
    local parts = {}
    for i = 1, limit do
      local x = v[i]
      parts[i] = type(x) == "string" and quote(x, 40) or tostring(x)
    end
    if limit < n then parts[#parts + 1] = "..." end
    return ("%s (%d): %s"):format(kv.type, n, table.concat(parts, ", "))
  elseif v == nil then
    return ("%s (%d)"):format(kv.type, kv.count or 0)
  elseif type(v) == "string" then
    return quote(v, not all and 120 or nil)
  elseif type(v) == "number" and v % 1 ~= 0 then
    return string.format("%.9g", v)
  end
  return tostring(v)
end

local function print_table(rows, cols)
  local width = {}
  for c, col in ipairs(cols) do
    width[c] = #col[1]
    for _, r in ipairs(rows) do width[c] = math.max(width[c], #r[c]) end
  end
  local function line(cells)
    local parts = {}
    for c, col in ipairs(cols) do
      local cell = cells[c]
      if col[2] == "right" then parts[c] = string.rep(" ", width[c] - #cell) .. cell
      elseif c == #cols then parts[c] = cell
      else parts[c] = cell .. string.rep(" ", width[c] - #cell) end
    end
    io.stdout:write("  ", table.concat(parts, "  "), "\n")
  end
  local head = {}
  for c, col in ipairs(cols) do head[c] = col[1] end
  line(head)
  for _, r in ipairs(rows) do line(r) end
end

local SPEC = { { "--json", key = "json" }, { "--all", key = "all" }, positional = "PATH", need_positional = true }

return function(args)
  local o, code = cli.parse("inspect", USAGE, args, SPEC)
  if not o then return code end
  if #o > 1 then return cli.fail("inspect", "one PATH only, got " .. table.concat(o, " ")) end
  local path, as_json, all = o[1], o.json, o.all
  -- a file that is neither safetensors (8-byte header length, then '{') nor GGUF (magic "GGUF") nor an
  -- index: say so, rather than what its first bytes mean when read as a header length
  local f = io.open(path, "rb")
  local head = f and f:read(9)
  if f then f:close() end
  if head and not path:match("%.json$") and head:sub(1, 4) ~= "GGUF" and head:sub(9, 9) ~= "{" then
    return cli.fail("inspect", path .. " is not a safetensors or GGUF file")
  end
  -- an export's staging folder is no model, whatever files it holds
  local fin, why = pcall(nibble.check, nibble.C.nb_model_check_finished(nibble.context(), path))
  if not fin then return cli.fail("inspect", why) end
  local ok, info = pcall(nibble.inspect, path)
  if not ok and path:match("%.json$") and tostring(info):find("weight_map", 1, true) then
    info = path .. " is not a safetensors index (no \"weight_map\"); give the model folder, a .safetensors or a .gguf file"
  end
  if not ok then return cli.fail("inspect", info) end
  if as_json then
    io.stdout:write(nibble.json.encode(info, { indent = "  " }), "\n")
    return 0
  end

  local what
  if info.format == "gguf" then
    what = ("GGUF v%d"):format(info.version or 0)
  else
    local ns = info.shards and #info.shards or 1
    what = ("safetensors, %d file%s"):format(ns, ns == 1 and "" or "s")
  end
  io.stdout:write(("%s: %s, %d tensors, %s parameters, %s bytes of tensor data\n"):format(
    path, what, info.count, group(info.params), group(info.bytes)))

  if #info.metadata > 0 then
    io.stdout:write(("\nmetadata (%d):\n"):format(#info.metadata))
    local kw = 0
    for _, kv in ipairs(info.metadata) do kw = math.max(kw, #kv.key) end
    for _, kv in ipairs(info.metadata) do
      io.stdout:write("  ", kv.key, string.rep(" ", kw - #kv.key), "  ", value_text(kv, all), "\n")
    end
  end

  io.stdout:write(("\ntensors (%d):\n"):format(info.count))
  local multi = info.shards and #info.shards > 1
  local rows = {}
  for i, r in ipairs(info.tensors) do
    local row = { r.name, r.dtype, tostring(r.shape), group(r.bytes) }
    if multi then row[5] = (r.shard or ""):match("[^/]*$") end
    rows[i] = row
  end
  local cols = { { "name" }, { "dtype" }, { "shape" }, { "bytes", "right" } }
  if multi then cols[5] = { "file" } end
  print_table(rows, cols)
  return 0
end

-- A first run of nibble: load a model (stories260K by default), print its tensor table with a few
-- statistics per tensor, and what rounding its weights to bf16 and f16 would cost.
--   nibble run examples/hello.lua                      (../shared/data/stories260K/hf)
--   nibble run examples/hello.lua model=path/to/model  (a safetensors file or dir, or a .gguf)
local nibble = nibble or require("nibble")

local function default_model()
  local shared = os.getenv("NIBBLE_SHARED_DATA")
  if not shared then
    local ok, info = pcall(require, "nibble.buildinfo")
    shared = ok and info.shared_data or "../shared/data"
  end
  return shared .. "/stories260K/hf"
end

local path = arg and arg.model or default_model()
local info = nibble.inspect(path)
local w = nibble.load(path)

local function group(n)
  local s = string.format("%d", n):reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (s:gsub("^,", ""))
end

print(("nibble %s: %s"):format(nibble.version, path))
print(("%s, %d tensors, %s parameters, %s bytes, %d threads\n"):format(info.format, #w, group(info.params),
  group(info.bytes), nibble.threads()))

-- config.json beside a safetensors model, or the GGUF metadata
local config = {}
if info.format == "gguf" then
  local m = w:metadata()
  local arch = m["general.architecture"] or "?"
  config = { arch = arch, dim = m[arch .. ".embedding_length"], layers = m[arch .. ".block_count"],
             heads = m[arch .. ".attention.head_count"], kv_heads = m[arch .. ".attention.head_count_kv"] }
else
  local dir = path:match("%.safetensors$") and (path:match("^(.*)/[^/]*$") or ".") or path
  local f = io.open(dir .. "/config.json")
  if f then
    local c = nibble.json.decode(f:read("*a"))
    f:close()
    config = { arch = c.architectures and c.architectures[1], dim = c.hidden_size, layers = c.num_hidden_layers,
               heads = c.num_attention_heads, kv_heads = c.num_key_value_heads }
  end
end
if config.arch then
  print(("%s: dim %s, %s layers, %s heads (%s for k/v)\n"):format(config.arch, tostring(config.dim),
    tostring(config.layers), tostring(config.heads), tostring(config.kv_heads)))
end

local width = 0
for _, name in ipairs(w) do width = math.max(width, #name) end
print(("%-" .. width .. "s  %-5s  %-10s %9s %9s %9s"):format("tensor", "dtype", "shape", "mean", "std", "absmax"))
local biggest, worst_bf16, worst_f16 = nil, { 0 }, { 0 }
for name, t in w:pairs() do
  local s = t:stats()
  print(("%-" .. width .. "s  %-5s  %-10s %9.4f %9.4f %9.4f"):format(name, t.dtype, tostring(t.shape), s.mean,
    s.std, s.absmax))
  if not biggest or t:numel() > biggest[2] then biggest = { name, t:numel() } end
  if t.dtype == "f32" then
    local e16, eb = t:max_abs_diff(t:to("f16")), t:max_abs_diff(t:to("bf16"))
    if eb > worst_bf16[1] then worst_bf16 = { eb, name } end
    if e16 > worst_f16[1] then worst_f16 = { e16, name } end
  end
end

print(("\nlargest tensor: %s (%s values)"):format(biggest[1], group(biggest[2])))
if worst_bf16[2] then
  print(("rounding to bf16 moves a weight by at most %.3g (%s)"):format(worst_bf16[1], worst_bf16[2]))
  print(("rounding to f16 moves a weight by at most %.3g (%s)"):format(worst_f16[1], worst_f16[2]))
end
local q = w[w[1]]
print(("\n%s is %s;\nits first row starts %s"):format(w[1], tostring(q), tostring(q[1]:narrow(1, 1, 4))))

-- PTQ on stories260K, row by row as a user runs it: `nibble quantize` exports each format (and algorithm,
-- and the FP8 KV cache), `nibble eval --json` scores the export against the F32 teacher with llama.cpp's
-- method (ctx 512, 100 chunks of the validation text: PPL, KL to the teacher, top-1 agreement), beside
-- llama.cpp's own NVFP4 and Q4_0 GGUFs of the same model from ../shared/data.
--   nibble run bench/ptq_stories.lua [chunks=100] [out=/tmp/ptq-stories] [only=LABEL,LABEL]
-- With NIBBLE_BENCH_JSON set (bench/record.lua) the table also goes there, as bench/results/ptq_stories.json.
local nibble = nibble or require("nibble")
local S = os.getenv("NIBBLE_SHARED_DATA") or "../shared/data"
local bin = arg[-1] or "build/nibble"
local out = arg.out or "/tmp/ptq-stories"
local chunks = tonumber(arg.chunks or 100)
local model = S .. "/stories260K/hf"
local calib = S .. "/text/tinystories_train_head_2MiB.txt"
local valid = S .. "/text/tinystories_valid_head_776KiB.txt"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function run(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local s = p:read("*a")
  local ok = p:close()
  return s, ok
end

-- label, format, algorithm[, kv = KV cache format]; rows with a path score that model as it is (no export)
local ROWS = {
  { "FP32 teacher", nil, "-", path = model, teacher = false },
  { "nvfp4_w4a16", "nvfp4_w4a16", "max" },
  { "nvfp4_w4a16", "nvfp4_w4a16", "mse" },
  { "nvfp4_4o6", "nvfp4_4o6", "four_over_six" },
  { "mxfp8", "mxfp8", "max" },
  { "fp8 (W8A8)", "fp8", "max" },
  { "nvfp4 (W4A4)", "nvfp4", "max" },
  { "nvfp4_4o6_a4 (W4A4)", "nvfp4_4o6_a4", "four_over_six" },
  { "nvfp4_w4a16 + FP8 KV cache", "nvfp4_w4a16", "max", kv = "fp8" },
  { "fp8 (W8A8) + FP8 KV cache", "fp8", "max", kv = "fp8" },
  { "llama.cpp NVFP4 GGUF", nil, "-", path = S .. "/stories260K/quantized/stories260K-nvfp4.gguf" },
  { "llama.cpp Q4_0 GGUF", nil, "-", path = S .. "/stories260K/quantized/stories260K-q4_0.gguf" },
}
local only = {}
for l in (arg.only or ""):gmatch("[^,]+") do only[l] = true end

if not io.open(model .. "/config.json", "rb") then
  io.stderr:write("ptq_stories: ", model, " not found (../shared/data, or NIBBLE_SHARED_DATA)\n")
  os.exit(1)
end
os.execute("mkdir -p " .. q(out))
local rows = {}
local function f(x, fmt) return type(x) == "number" and fmt:format(x) or "-" end
for i, r in ipairs(ROWS) do
  if next(only) == nil or only[r[1]] then
    local path = r.path
    if not path then
      path = ("%s/%d-%s-%s%s"):format(out, i, r[2], r[3], r.kv and "-kv" or "")
      local cmd = ("%s quantize --model %s --format %s --algorithm %s --calib %s --out %s --quiet%s"):format(
        q(bin), q(model), r[2], r[3], q(calib), q(path), r.kv and " --kv-cache " .. r.kv or "")
      local _, ok = run(cmd)
      if not ok then io.stderr:write("ptq_stories: failed: ", cmd, "\n"); os.exit(1) end
    end
    if io.open(path, "rb") then
      local cmd = ("%s eval --model %s --data %s --ctx 512 --chunks %d%s --json"):format(q(bin), q(path), q(valid),
        chunks, r.teacher == false and "" or " --teacher " .. q(model))
      local s, ok = run(cmd)
      local e = ok and nibble.json.decode(s:match("{.*}") or "null")
      if type(e) ~= "table" then io.stderr:write("ptq_stories: failed: ", cmd, "\n"); os.exit(1) end
      local row = { r[1], r[3], f(e.ppl, "%.4f"), f(e.kld, "%.4f"), f(e.top1, "%.2f %%") }
      rows[#rows + 1] = row
      io.stderr:write(("%-28s %-14s PPL %s  KLD %s  top-1 %s\n"):format(row[1], row[2], row[3], row[4], row[5]))
    else
      io.stderr:write("ptq_stories: ", path, " not found: row skipped\n")
    end
  end
end

local path = os.getenv("NIBBLE_BENCH_JSON")
if path and path ~= "" then
  local fh = assert(io.open(path, "wb"))
  fh:write(nibble.json.encode {
    bench = "ptq_stories", title = "PTQ on stories260K", threads = nibble.threads(),
    tables = { {
      caption = ("validation text, ctx 512, %d chunks (llama.cpp's method); KLD and top-1 against the F32 teacher"):format(chunks),
      columns = { "export", "algorithm", "PPL", "KLD", "top-1" }, rows = rows } },
    notes = {
      "each export: nibble quantize --model stories260K/hf --format F --algorithm A --calib "
        .. "text/tinystories_train_head_2MiB.txt [--kv-cache fp8] --out DIR; then nibble eval --model DIR --data "
        .. "text/tinystories_valid_head_776KiB.txt --ctx 512 --chunks N --teacher stories260K/hf --json",
      "FP8 KV cache rows: nibble eval fake-quantizes K (after RoPE) and V with the export's k_scale / v_scale, as vLLM runs them",
      "not like for like: llama.cpp's NVFP4 file also quantizes the output matrix and has no per-tensor scale; "
        .. "nibble keeps the tied lm_head and the 172-wide down_proj (not a multiple of 16) unquantized",
    } })
  fh:close()
end

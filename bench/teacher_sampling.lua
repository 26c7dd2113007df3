-- Teacher sampling as the quickstart runs it (qad.teacher_samples: chat prompts, temperature 1, top-k 50):
-- one prompt's answers per nb_model_generate call (rows = samples, the shape of the old per-prompt loop)
-- against the answers of several prompts decoded together (rows = 32, the default), in tokens/s of wall
-- time and of CPU time; both must write the same file (each answer draws from its own seeded stream).
--   nibble run bench/teacher_sampling.lua [model=PATH] [prompts=8] [samples=8] [tokens=64] [rows=32]
-- model defaults to the quickstart's SmolLM2-135M-Instruct (scripts/fetch-default-model.sh).
-- With NIBBLE_BENCH_JSON set (bench/record.lua) the table also goes there, as bench/results/teacher_sampling.json.
local nibble = nibble or require("nibble")
local qad = require("nibble.qad")
local home = os.getenv("HOME") or "."
local model = arg.model or (home .. "/.cache/nibble/SmolLM2-135M-Instruct.Q4_1.gguf")
local n_prompts, samples = tonumber(arg.prompts or 8), tonumber(arg.samples or 8)
local tokens, rows = tonumber(arg.tokens or 64), tonumber(arg.rows or 32)
local all = { "Tell me a short story about a brave little fox.", "What is the capital of France?",
  "Write a haiku about the sea.", "Explain why the sky is blue.", "Give three tips for staying healthy.",
  "Describe a cat to someone who has never seen one.", "What is 12 times 7?", "Write a limerick about a frog.",
  "How do plants make food?", "Name three colours of the rainbow.", "What does a bee do all day?",
  "Why do we need sleep?" }
local prompts = {}
for i = 1, n_prompts do prompts[i] = all[(i - 1) % #all + 1] end
local m = nibble.model.load(model)
local tok = m:tokenizer()

local function cpu() return os.clock() end   -- process CPU time, all threads
local function run(r, out)
  local t0, c0 = require("nibble.ptq").now(), cpu()
  local _, n = qad.teacher_samples { model = m, tokenizer = tok, prompts = prompts, samples = samples, tokens = tokens,
                                     rows = r, temperature = 1.0, top_k = 50, seed = 1, out = out }
  local wall, c = require("nibble.ptq").now() - t0, cpu() - c0
  return n, wall, c
end
local function slurp(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end
local tmp = os.tmpname()
local res = {}
for k, r in ipairs({ samples, rows }) do
  local n, wall, c = run(r, tmp .. "." .. k)
  res[k] = { rows = r, tokens = n, wall = wall, cpu = c }
  print(("rows %3d: %d tokens, %.1f s wall (%.1f tok/s), %.1f s CPU (%.1f tok/CPU-s)"):format(r, n, wall, n / wall, c, n / c))
end
local same = slurp(tmp .. ".1") == slurp(tmp .. ".2")
os.remove(tmp .. ".1"); os.remove(tmp .. ".2"); os.remove(tmp)
print(("speed-up %.2fx wall, %.2fx CPU; %s"):format(res[1].wall / res[2].wall, res[1].cpu / res[2].cpu,
  same and "the same samples" or "THE SAMPLES DIFFER"))
if not same then os.exit(1) end

local path = os.getenv("NIBBLE_BENCH_JSON")
if path and path ~= "" then
  local t = {}
  for _, x in ipairs(res) do
    t[#t + 1] = { x.rows, x.tokens, ("%.1f"):format(x.tokens / x.wall), ("%.1f"):format(x.tokens / x.cpu) }
  end
  local fh = assert(io.open(path, "wb"))
  fh:write(nibble.json.encode {
    bench = "teacher_sampling", title = "Teacher sampling (qad.teacher_samples)", threads = nibble.threads(),
    tables = { {
      caption = ("%s: %d prompts x %d answers of up to %d tokens, temperature 1, top-k 50"):format(model:match("[^/]+$"),
        n_prompts, samples, tokens),
      columns = { "rows per decode", "tokens", "tok/s", "tok/CPU-s" }, rows = t } },
    notes = { ("rows = %d decodes one prompt's answers at a time (the old loop's shape); the same samples either way"):format(samples) } })
  fh:close()
end

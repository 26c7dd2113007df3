-- Why the stories260K student's PPL does not follow its KLD: the eval's PPL gap to the teacher,
-- mean(log p_t(y) - log p_s(y)) over the real next tokens y, against KL(teacher || student) =
-- the same difference averaged over y drawn from the teacher, on the positions llama.cpp's method
-- scores (ctx 512, BOS first, the second half of each of 100 chunks), with both models' entropies,
-- and split by the teacher's probability of the real token. A QAD student checkpoint comes from
-- bench/qad_stories.lua (it writes OUT.student.safetensors).
--   nibble run bench/qad_stories_gap.lua ck=/tmp/qad-stories.student.safetensors [chunks=100] [ctx=512]
--       [text=FILE: score another text the same way, e.g. the training text (its <|endoftext|> marks become
--        blank lines, as the validation text separates stories): KL there as on the validation text means
--        the student is short of grid, not of data]
local nibble = nibble or require("nibble")
local ffi = require("ffi")
local S = os.getenv("NIBBLE_SHARED_DATA") or "../shared/data"
local path = S .. "/stories260K/hf"
if not arg.ck then error("give ck=STUDENT.safetensors (bench/qad_stories.lua writes OUT.student.safetensors)", 0) end
local T, chunks = tonumber(arg.ctx or 512), tonumber(arg.chunks or 100)

local teacher, student = nibble.model.load(path), nibble.model.load(path)
local p = nibble.ptq.run(nibble.recipe { extends = "units/nvfp4_w4a16", model = { path = path }, algorithm = "max" },
                         nil, { model = student, no_export = true, quiet = true })
p.qmodel:restore(arg.ck)
p.qmodel:set_fake(true)
local tok = student:tokenizer()
local text = assert(io.open(arg.text or (S .. "/text/tinystories_valid_head_776KiB.txt"), "rb")):read("*a")
local ev = tok:encode_tokens((text:gsub("%s*<|endoftext|>%s*", "\n\n")))
if tonumber(ev.n) < chunks * T then chunks = math.floor(tonumber(ev.n) / T) end
local V = teacher.config.vocab_size

local function log_softmax(l, off, out)
  local m = -math.huge
  for v = 0, V - 1 do m = math.max(m, l[off + v]) end
  local s = 0
  for v = 0, V - 1 do s = s + math.exp(l[off + v] - m) end
  local lz = m + math.log(s)
  for v = 0, V - 1 do out[v] = l[off + v] - lz end
end

local function acc() return { n = 0, gap = 0, kl = 0, ht = 0, hs = 0, nll = 0 } end
local all, bins = acc(), {}
for b = 0, 9 do bins[b] = acc() end
local lt, ls = ffi.new("double[?]", V), ffi.new("double[?]", V)
local ids = nibble.zeros("i32", 1, T)
local id = ids:data("int32_t *")
for c = 0, chunks - 1 do
  for i = 0, T - 1 do id[i] = ev.ids[c * T + i] end
  id[0] = tok.bos or 1
  local Lt = teacher:forward(ids):data("const float *")
  local Ls = student:forward(ids):data("const float *")
  for pos = T / 2, T - 2 do
    log_softmax(Lt, pos * V, lt)
    log_softmax(Ls, pos * V, ls)
    local y = id[pos + 1]
    local kl, ht, hs = 0, 0, 0
    for v = 0, V - 1 do
      local pt = math.exp(lt[v])
      kl, ht, hs = kl + pt * (lt[v] - ls[v]), ht - pt * lt[v], hs - math.exp(ls[v]) * ls[v]
    end
    for _, a in ipairs { all, bins[math.min(9, math.floor(math.exp(lt[y]) * 10))] } do
      a.n, a.gap, a.kl, a.ht, a.hs, a.nll = a.n + 1, a.gap + lt[y] - ls[y], a.kl + kl, a.ht + ht, a.hs + hs, a.nll - lt[y]
    end
  end
end

print(("%s: %d tokens scored; teacher PPL %.4f, student PPL %.4f"):format(arg.ck, all.n, math.exp(all.nll / all.n),
  math.exp((all.nll + all.gap) / all.n)))
print(("PPL gap (nats) %.5f, KL(teacher||student) %.5f; entropy teacher %.4f, student %.4f"):format(all.gap / all.n,
  all.kl / all.n, all.ht / all.n, all.hs / all.n))
print("p_teacher(real token)   share      gap       KL   H_teacher  H_student  share of gap")
for b = 0, 9 do
  local a = bins[b]
  if a.n > 0 then
    print(("  [%.1f, %.1f)        %5.1f %%  %+.5f  %.5f   %.4f     %.4f     %5.1f %%"):format(b / 10, (b + 1) / 10,
      100 * a.n / all.n, a.gap / a.n, a.kl / a.n, a.ht / a.n, a.hs / a.n, 100 * a.gap / all.gap))
  end
end

-- The stories260K QAD numbers of issue 6 ("what it must show"), measured end to end with the same pieces
-- recipes/qad.lua uses: NVFP4 W4A16 with max calibration, QAD on the TinyStories train head, eval with
-- llama.cpp's method (ctx 512, 100 chunks) on the validation text, against the teacher. Rows: teacher, PTQ,
-- QAD (the trained scales, as exported), QAD with the per-tensor amax recomputed from the final weights at
-- export, the export read back, and llama.cpp's own NVFP4 and Q4_0 GGUFs of the same model. The stories are
-- tokenized as the tokenizer marks documents (BOS, no EOS: stories260K never saw EOS); bench/README.md has
-- the table of every setting tried and why (EOS after every story: KLD 0.029 instead of 0.024).
--   nibble run bench/qad_stories.lua [steps=200] [batch=8] [seq_len=512] [lr=1e-4] [min_lr=0] [warmup=10]
--       [chunks=100] [out=/tmp/qad-stories] [metrics=FILE.jsonl] [freeze=GLOB,GLOB] [seed=1]
--       [clip=1] [beta1=0.9] [beta2=0.999] [eps=1e-8] [weight_decay=0] [temperature=1] [grad_accum=1]
--       [recalibrate=N: re-run max calibration every N steps] [lm_loss=1 kd_loss_scale=S: loss = CE + S * KL]
--       [lr_scale_unquantized=M: lr * M for the parameters that stay in full precision]
--       [loss=kl|reverse_kl: the distillation loss] [teacher_temperature=T: distill from logits / T]
--       [quick=1: QAD row only]
--       [pack=0: one story per row] [eos=0|1: EOS after every story (default: as the tokenizer, none)]
--       [dump=DIR: write the training rows and validation ids for bench/qad_stories_torch.py, then stop]
--       [train_eval=1: also score PTQ and QAD on the training text (is the student short of data or of grid?)]
-- With NIBBLE_BENCH_JSON set (bench/record.lua) the table also goes there, as bench/results/qad_stories.json.
local nibble = nibble or require("nibble")
local qad, ptq = nibble.qad, nibble.ptq
local S = os.getenv("NIBBLE_SHARED_DATA") or "../shared/data"
local path = S .. "/stories260K/hf"
local function n(k, d) return tonumber(arg[k] or d) end
local steps, lr = n("steps", 200), n("lr", 1e-4)
local out = arg.out or "/tmp/qad-stories"
local t0 = ptq.now()

local teacher, student = nibble.model.load(path), nibble.model.load(path)
for g in (arg.freeze or ""):gmatch("[^,]+") do student:requires_grad(g, false) end
local p = ptq.run(nibble.recipe { extends = "units/nvfp4_w4a16", model = { path = path }, algorithm = "max" }, nil,
                  { model = student, no_export = true, quiet = true })
local qm = p.qmodel
local tok = student:tokenizer()
local ev = tok:encode_tokens(io.open(S .. "/text/tinystories_valid_head_776KiB.txt", "rb"):read("*a"))
local eopts = { ctx = 512, chunks = n("chunks", 100) }
local rows = {}
-- (the training file separates stories with a literal <|endoftext|>, the validation file with blank lines)
local tr_ids = arg.train_eval and tok:encode_tokens((io.open(S .. "/text/tinystories_train_head_2MiB.txt", "rb"):read("*a")
  :gsub("%s*<|endoftext|>%s*", "\n\n")))
-- the table as a bench/record.lua fragment, cells formatted as qad.table_text prints them
local function write_result(caption, notes)
  local path = os.getenv("NIBBLE_BENCH_JSON")
  if not path or path == "" then return end
  local function f(x, fmt) return (x == nil or x ~= x) and "-" or fmt:format(x) end
  local t = { caption = caption, columns = { "model", "PPL", "KLD", "top-1" }, rows = {} }
  for _, r in ipairs(rows) do t.rows[#t.rows + 1] = { r.name, f(r.ppl, "%.4f"), f(r.kld, "%.5f"), f(r.top1, "%.2f %%") } end
  local fh = assert(io.open(path, "wb"))
  fh:write(nibble.json.encode { bench = "qad_stories", title = "QAD on stories260K (NVFP4 W4A16)", threads = nibble.threads(),
                                tables = { t }, notes = notes })
  fh:close()
end
local function row(name, model, ids)
  local e = qad.evaluate(model, ids or ev, model ~= teacher and teacher or nil, eopts)
  rows[#rows + 1] = { name = name, ppl = e.ppl, kld = e.kld, top1 = e.top1 }
  io.stderr:write(("%-24s PPL %.4f  KLD %s  top-1 %s\n"):format(name, e.ppl, e.kld and ("%.5f"):format(e.kld) or "-",
    e.top1 and ("%.2f%%"):format(e.top1) or "-"))
end
if not arg.quick and not arg.dump then row("teacher (F32)", teacher) end

local eos   -- default: as the tokenizer marks documents (BOS only for stories260K); eos=1 puts EOS after each story
if arg.eos then eos = arg.eos ~= "0" end
local loader = qad.loader({ data = S .. "/text/tinystories_train_head_2MiB.txt", seq_len = n("seq_len", 512),
                            batch = n("batch", 8), pack = arg.pack ~= "0", eos = eos }, tok, n("seed", 1))
if arg.dump then   -- the exact rows QAD would read: [steps * batch, seq_len + 1] int32 LE, and the eval ids
  local ffi = require("ffi")
  os.execute("mkdir -p '" .. arg.dump:gsub("'", "'\\''") .. "'")
  local f = assert(io.open(arg.dump .. "/train_rows.i32", "wb"))
  local S1 = loader.seq_len
  local rowbuf = ffi.new("int32_t[?]", S1 + 1)
  for _ = 1, steps do
    local b = loader:next()
    local tp, gp = b.tokens:data("int32_t *"), b.targets:data("int32_t *")
    for r = 0, b.rows - 1 do
      ffi.copy(rowbuf, tp + r * S1, 4 * S1)
      rowbuf[S1] = gp[r * S1 + S1 - 1]
      f:write(ffi.string(rowbuf, 4 * (S1 + 1)))
    end
  end
  f:close()
  f = assert(io.open(arg.dump .. "/valid.i32", "wb"))
  f:write(ffi.string(ev.ids, 4 * tonumber(ev.n)))
  f:close()
  print(("wrote %s/train_rows.i32 (%d rows of %d) and valid.i32 (%d ids)"):format(arg.dump, steps * loader.batch,
    S1 + 1, tonumber(ev.n)))
  return
end
local config = { steps = steps, lr = lr, min_lr = n("min_lr", 0), warmup = n("warmup", 10) }
for _, k in ipairs { "clip", "beta1", "beta2", "eps", "weight_decay", "temperature", "grad_accum", "recalibrate",
                     "lr_scale_unquantized" } do
  config[k] = arg[k] and tonumber(arg[k]) or nil
end
config.loss = arg.loss   -- kl (default) | reverse_kl | ce (nibble.distill's kinds)
if arg.lm_loss == "1" then config.lm_loss, config.kd_loss_scale = true, n("kd_loss_scale", 1) end
-- teacher_temperature=T: distill from the teacher's logits divided by T (its final norm's weight scaled by
-- 1/T, which scales the logits of this tied-embedding model exactly), restored before every eval: the
-- KLD rows stay against the teacher itself. bench/README.md says how T was fit on the training rows.
local tt = n("teacher_temperature", 1)
local norm_w = teacher:param("model.norm.weight")
local norm_saved = nibble.zeros("f32", norm_w.shape)
local nbytes = 4 * norm_w:numel()
local function teacher_soften()    -- the logits / tt (the weights saved first)
  local d = norm_w:data("float *")
  require("ffi").copy(norm_saved:data("float *"), d, nbytes)
  for i = 0, norm_w:numel() - 1 do d[i] = d[i] * (1 / tt) end
end
local function teacher_restore() require("ffi").copy(norm_w:data("float *"), norm_saved:data("float *"), nbytes) end
local run = qad.new { teacher = teacher, student = qm, loader = loader, config = config }
if not arg.quick then row("PTQ (NVFP4 W4A16 max)", student) end
if tr_ids then row("PTQ, on training text", student, tr_ids) end
local mf = arg.metrics and io.open(arg.metrics, "wb")
if tt ~= 1 then teacher_soften() end
local tr = qad.train(run, { record = function(t) if mf then mf:write(qad.json_line(t), "\n") end end })
if tt ~= 1 then teacher_restore() end
if mf then mf:close() end
row("QAD (trained scales)", student)
if tr_ids then row("QAD, on training text", student, tr_ids) end
local settings = ("QAD %d steps of %d x %d tokens at lr %g (cosine to %g), seed %d"):format(steps, loader.batch,
  loader.seq_len, lr, n("min_lr", 0), n("seed", 1))
local caption = ("stories260K, validation text, ctx %d, %d chunks; %s"):format(eopts.ctx, eopts.chunks, settings)
local train_note = ("%.0f s of training"):format(tr.seconds)
if arg.quick then
  print(qad.table_text(rows))
  write_result(caption, { train_note })
  return
end
qm:export(out)
local rb = nibble.model.load(out)
row("QAD export read back", rb)
-- what re-deriving the per-tensor amax from the final weights at export would ship instead
local ck = out .. ".student.safetensors"
qm:save(ck)
qm:calibrate_weights("max")
row("QAD, amax recomputed", student)
qm:export(out .. "-recomputed")
qm:restore(ck)
for _, g in ipairs { { "llama.cpp NVFP4 GGUF", "stories260K-nvfp4.gguf" }, { "llama.cpp Q4_0 GGUF", "stories260K-q4_0.gguf" } } do
  local f = S .. "/stories260K/quantized/" .. g[2]
  if io.open(f, "rb") then row(g[1], nibble.model.load(f)) end
end
print(("stories260K, valid text, ctx %d, %d chunks; QAD %d steps of %d x %d at lr %g (cosine to %g), %.0f s of training:"):format(
  eopts.ctx, eopts.chunks, steps, loader.batch, loader.seq_len, lr, n("min_lr", 0), tr.seconds))
print(qad.table_text(rows))
print(("(%.1f min)"):format((ptq.now() - t0) / 60))
write_result(caption, { train_note .. (", %.1f min in all"):format((ptq.now() - t0) / 60) })

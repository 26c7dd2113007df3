-- The stories260K QAD numbers of issue 6 ("what it must show"), measured end to end with the same pieces
-- recipes/qad.lua uses: NVFP4 W4A16 with max calibration, QAD on the TinyStories train head, eval with
-- llama.cpp's method (ctx 512, 100 chunks) on the validation text, against the teacher. Rows: teacher, PTQ,
-- QAD (the trained scales, as exported), QAD with the per-tensor amax recomputed from the final weights at
-- export, the export read back, and llama.cpp's own NVFP4 and Q4_0 GGUFs of the same model.
--   nibble run bench/qad_stories.lua [steps=200] [batch=8] [seq_len=512] [lr=1e-4] [min_lr=0] [warmup=10]
--       [chunks=100] [out=/tmp/qad-stories] [metrics=FILE.jsonl] [freeze=GLOB,GLOB]
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
local function row(name, model)
  local e = qad.evaluate(model, ev, model ~= teacher and teacher or nil, eopts)
  rows[#rows + 1] = { name = name, ppl = e.ppl, kld = e.kld, top1 = e.top1 }
  io.stderr:write(("%-24s PPL %.4f  KLD %s  top-1 %s\n"):format(name, e.ppl, e.kld and ("%.5f"):format(e.kld) or "-",
    e.top1 and ("%.2f%%"):format(e.top1) or "-"))
end
row("teacher (F32)", teacher)

local loader = qad.loader({ data = S .. "/text/tinystories_train_head_2MiB.txt", seq_len = n("seq_len", 512),
                            batch = n("batch", 8) }, tok, 1)
local run = qad.new { teacher = teacher, student = qm, loader = loader,
                      config = { steps = steps, lr = lr, min_lr = n("min_lr", 0), warmup = n("warmup", 10) } }
row("PTQ (NVFP4 W4A16 max)", student)
local mf = arg.metrics and io.open(arg.metrics, "wb")
local tr = qad.train(run, { record = function(t) if mf then mf:write(qad.json_line(t), "\n") end end })
if mf then mf:close() end
row("QAD (trained scales)", student)
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

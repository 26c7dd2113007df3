-- Three departures from the plain QAD of bench/qad_stories.lua, tried against the stories260K aim of issue 6
-- (KLD <= 0.02): same PTQ (NVFP4 W4A16, max), same rows, same eval (valid text, ctx 512, 100 chunks), QAD
-- row only. bench/README.md has the numbers.
--   nibble run bench/qad_stories_extra.lua mode=ema [ema=0.99,0.995,0.998] [steps=200] [lr=1e-4]
--       an exponential moving average of the student's weights, scored beside the trained weights
--   nibble run bench/qad_stories_extra.lua mode=hidden [mse=0.1] [layers=2,3,4,5,6] [steps=200] [lr=1e-4]
--       KL on the logits plus mse * the mean squared error of hidden states (model:forward{hidden = true}
--       numbering: 1 = embeddings), through the step-level API as examples/custom_qad.lua
--   nibble run bench/qad_stories_extra.lua mode=teacher_data [batches=128] [steps=1600] [samples=FILE]
--       the training text plus stories sampled from the teacher (BOS, temperature 1, 64 rows of 511 tokens
--       per batch; a story cut at the end of a row is dropped), written once to FILE and reused
local nibble = nibble or require("nibble")
local qad, ptq = nibble.qad, nibble.ptq
local S = os.getenv("NIBBLE_SHARED_DATA") or "../shared/data"
local path = S .. "/stories260K/hf"
local train = S .. "/text/tinystories_train_head_2MiB.txt"
local function n(k, d) return tonumber(arg[k] or d) end
local mode = arg.mode or error("mode=ema|hidden|teacher_data", 0)
local steps, lr = n("steps", mode == "teacher_data" and 1600 or 200), n("lr", 1e-4)

local teacher, smodel = nibble.model.load(path), nibble.model.load(path)
local qm = ptq.run(nibble.recipe { extends = "units/nvfp4_w4a16", model = { path = path }, algorithm = "max" }, nil,
                   { model = smodel, no_export = true, quiet = true }).qmodel
local tok = smodel:tokenizer()
local ev = tok:encode_tokens(io.open(S .. "/text/tinystories_valid_head_776KiB.txt", "rb"):read("*a"))
local function row(name)
  local e = qad.evaluate(smodel, ev, teacher, { ctx = 512, chunks = n("chunks", 100) })
  print(("%-30s PPL %.4f  KLD %.5f  top-1 %.2f%%"):format(name, e.ppl, e.kld, e.top1))
end

local data = train
if mode == "teacher_data" then
  local out = arg.samples or "/tmp/qad-stories-teacher.txt"
  if not io.open(out, "rb") then
    local f = assert(io.open(out .. ".part", "wb"))
    local nb, ntok = n("batches", 128), 0
    for i = 1, nb do
      for _, o in ipairs(qad.sample_batch(teacher, { 1 }, 64, 511, { temperature = 1, seed = 7919 * i, stop = { -1 } })) do
        local cur = {}
        for _, t in ipairs(o) do   -- stories260K streams are BOS story BOS story ...
          if t == 1 or t == 2 then
            if #cur > 8 then f:write(tok:decode(cur, { skip_special = true }), "\n<|endoftext|>\n") end
            cur = {}
          else
            cur[#cur + 1] = t
          end
        end
        ntok = ntok + #o
      end
      io.stderr:write(("\rteacher samples: batch %d/%d, %d tokens"):format(i, nb, ntok))
    end
    f:close()
    assert(os.rename(out .. ".part", out))
    io.stderr:write("\n")
  end
  data = { train, out }
end
local loader = qad.loader({ data = data, seq_len = 512, batch = n("batch", 8) }, tok, n("seed", 1))

if mode == "hidden" then
  local student = qad.student(smodel, qm)
  local names, params = student:params()
  local opt = nibble.optim.adamw(params, { lr = lr, weight_decay = 0 })
  local sched = nibble.optim.schedule { lr = lr, min_lr = 0, warmup = 10, total = steps }
  local w = n("mse", 0.1)
  local layers = {}
  for l in (arg.layers or "2,3,4,5,6"):gmatch("[^,]+") do layers[#layers + 1] = tonumber(l) end
  local function mse(a, b)   -- mean squared error of two f32 tensors and its gradient w.r.t. a
    local cnt, pa, pb = a:numel(), a:data("const float *"), b:data("const float *")
    local g = nibble.zeros("f32", a.shape)
    local pg, s = g:data("float *"), 0
    for i = 0, cnt - 1 do
      local d = pa[i] - pb[i]
      s = s + d * d
      pg[i] = 2 * d / cnt
    end
    return qad.loss(s / cnt, { [a] = g })
  end
  for step = 1, steps do
    local b = loader:next()
    local t_logits, t_hidden = teacher:forward(b.tokens, { hidden = true })
    local s_logits, s_hidden = student:forward(b.tokens, { hidden = true })
    local loss = nibble.distill.kl(s_logits, t_logits, { mask = b.mask })
    for _, l in ipairs(layers) do loss = loss + w * mse(s_hidden[l], t_hidden[l]) end
    loss:backward()
    local grads = student:grads(names)
    nibble.optim.clip_grad_norm(grads, 1.0)
    opt:step(grads, sched(step - 1))
    student:zero_grad()
  end
  row(("QAD, KL + %g * hidden MSE"):format(w))
  return
end

local run = qad.new { teacher = teacher, student = qm, loader = loader,
                      config = { steps = steps, lr = lr, min_lr = 0, warmup = 10 } }
local ffi = require("ffi")
local P, E, decays = {}, {}, {}
if mode == "ema" then
  for d in (arg.ema or "0.99,0.995,0.998"):gmatch("[^,]+") do decays[#decays + 1] = tonumber(d) end
  for _, name in ipairs(smodel:params()) do P[#P + 1] = smodel:param(name) end
  for k = 1, #decays do
    E[k] = {}
    for i, t in ipairs(P) do
      E[k][i] = ffi.new("float[?]", t:numel())
      ffi.copy(E[k][i], t:data("float *"), 4 * t:numel())
    end
  end
end
qad.train(run, { record = function()
  for k, d in ipairs(decays) do
    for i, t in ipairs(P) do
      local wp, e = t:data("float *"), E[k][i]
      for j = 0, t:numel() - 1 do e[j] = d * e[j] + (1 - d) * wp[j] end
    end
  end
end })
row(mode == "teacher_data" and "QAD, train text + teacher stories" or "QAD (trained weights)")
for k, d in ipairs(decays) do
  for i, t in ipairs(P) do ffi.copy(t:data("float *"), E[k][i], 4 * t:numel()) end
  row(("EMA %g of the weights"):format(d))
end

-- The temperature at which the stories260K teacher best fits the QAD training rows (the rows
-- bench/qad_stories.lua trains on: same loader, seed 1), by its mean cross-entropy on the real next
-- tokens with the logits divided by T (the final norm's weight scaled by 1/T: exact for this
-- tied-embedding model). This is where `qad_stories.lua teacher_temperature=T` took T = 1.06 from; no
-- validation text is read.
--   nibble run bench/qad_stories_tau.lua [batches=60] [temps=1,1.02,1.04,1.06,1.08]
local nibble = nibble or require("nibble")
local S = os.getenv("NIBBLE_SHARED_DATA") or "../shared/data"
local teacher = nibble.model.load(S .. "/stories260K/hf")
local tok = teacher:tokenizer()
local w = teacher:param("model.norm.weight")
local saved = nibble.zeros("f32", w.shape)
require("ffi").copy(saved:data("float *"), w:data("float *"), 4 * w:numel())
local nb = tonumber(arg.batches or 60)
for t in (arg.temps or "1,1.02,1.04,1.06,1.08"):gmatch("[^,]+") do
  local tau = tonumber(t)
  local d, s0 = w:data("float *"), saved:data("float *")
  for i = 0, w:numel() - 1 do d[i] = s0[i] / tau end
  local loader = nibble.qad.loader({ data = S .. "/text/tinystories_train_head_2MiB.txt", seq_len = 512, batch = 8 }, tok, 1)
  local sum, n = 0, 0
  for _ = 1, nb do
    local b = loader:next()
    local r = nibble.distill.loss { student = teacher:forward(b.tokens), loss = "ce", labels = b.targets, weights = b.mask }
    sum, n = sum + r.loss * tonumber(r.tokens), n + tonumber(r.tokens)
  end
  print(("T %.2f  teacher CE on the QAD rows %.5f nats (PPL %.4f, %d tokens)"):format(tau, sum / n, math.exp(sum / n), n))
end

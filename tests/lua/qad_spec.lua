-- nibble.qad from Lua: the distill-table -> nb_qad_cfg mapping and its errors; the step-level API (losses
-- that add and scale, loss:backward() into logits and hidden states, errors for foreign tensors); the C run
-- object (steps, metrics, save/restore to the same bytes); recipe dry-runs of recipes/qad.lua; and, on
-- stories260K, the whole recipe through `nibble run` (eval table, metrics JSONL, export, `nibble plot`) and
-- a run interrupted with SIGINT or killed with SIGKILL at a random step that resumes to the same export bytes.
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")
local qad = require("nibble.qad")
local recipe = require("nibble.recipe")
local C = nibble.C

local stories = nbspec.data("stories260K/hf")
local train = nbspec.data("text/tinystories_train_head_2MiB.txt")
local valid = nbspec.data("text/tinystories_valid_head_776KiB.txt")
local src = nbspec.source_dir

local need = nbspec.need
local err_of = nbspec.err_of

local tmp = nbspec.private_dir()

-- A tiny Llama pair: teacher and an NVFP4 W4A16 student (every linear but lm_head), same random weights.
local function tiny()
  local cfg = { vocab_size = 64, hidden_size = 32, intermediate_size = 48, n_layers = 2, n_heads = 4, n_kv_heads = 2,
                head_dim = 8 }
  local teacher = nibble.model.new(cfg, { seed = 3, std = 0.3 })
  local sm = nibble.model.new(cfg, { seed = 3, std = 0.3 })
  local qm = nibble.qmodel.new(sm)
  for _, m in ipairs(sm:modules()) do
    if m.kind == "linear" and m.name ~= "lm_head" then qm:set(m.name, { weight = "nvfp4" }) end
  end
  qm:fuse_siblings()
  qm:calibrate_weights("max")
  return teacher, sm, qm
end

local function toks(B, T, vocab, salt)
  local t = nibble.zeros("i32", B, T)
  for b = 1, B do
    for i = 1, T do t:set(b, i, (i * 13 + b * 7 + (salt or 0)) % vocab) end
  end
  return t
end

local function flat_grads(model)
  return nibble.wrap(C.nb_model_flat_grads(model._p), true):clone()
end

describe("qad.config", function()
  it("maps a recipe's distill table onto nb_qad_cfg", function()
    local c = qad.config { loss = "reverse_kl", temperature = 2, t2 = false, topk = 16, lm_loss = true,
                           kd_loss_scale = 0.5, steps = 300, lr = 2e-5, min_lr = 1e-6, warmup = 15, grad_accum = 4,
                           clip = 0.5, weight_decay = 0.01, sft_mask = false, recalibrate = 50, batch = 8,
                           lr_scale_unquantized = 10 }
    assert.are.equal(C.NB_KD_REVERSE, c.loss.kd)
    assert.are.equal(2, c.loss.temperature)
    assert.are.equal(0, c.loss.t2_scale)
    assert.are.equal(16, c.loss.top_k)
    assert.are.equal(1, c.loss.lm_loss)
    assert.are.equal(0.5, c.loss.kd_loss_scale)
    assert.are.equal(300, tonumber(c.steps))
    assert.are.equal(2e-5, c.lr)
    assert.are.equal(1e-6, c.min_lr)
    assert.are.equal(15, tonumber(c.warmup))
    assert.are.equal(4, c.grad_accum)
    assert.are.equal(0.5, c.clip)
    assert.are.equal(0.01, c.weight_decay)
    assert.are.equal(0, c.sft_mask)
    assert.are.equal(50, tonumber(c.recalibrate))
    assert.are.equal(C.NB_CALIB_MAX, c.recalib.method)
    assert.are.equal(10, c.lr_scale_unquantized)
    local d = qad.config {}
    assert.are.equal(1, d.lr_scale_unquantized)
    assert.are.equal(C.NB_KD_FORWARD, d.loss.kd)
    assert.are.equal(1e-5, d.lr)
    assert.are.equal(1, d.clip)
    assert.are.equal(1, d.sft_mask)
    assert.are.equal(0, tonumber(d.recalibrate))
    local t = qad.config { loss = "topk" }
    assert.are.equal(C.NB_KD_FORWARD, t.loss.kd)
    assert.are.equal(64, t.loss.top_k)
  end)

  it("takes every distill key a recipe may hold (the recipe schema and qad agree)", function()
    local r = nibble.recipe { distill = { beta1 = 0.8, beta2 = 0.95, eps = 1e-6, pack = false, eos = false,
                                          separator = "<|endoftext|>", text_field = "body", ignore_index = -1,
                                          topk_norm = "renorm" } }
    nibble.recipe.validate(r)
    local c = qad.config(r.distill)
    assert.are.equal(0.8, c.beta1)
    assert.are.equal(0.95, c.beta2)
    assert.are.equal(1e-6, c.eps)
    for k in pairs(nibble.recipe.sub_schema.distill) do
      local ok, e = pcall(qad.config, { [k] = "?" })
      assert.is_nil((not ok) and tostring(e):match("unknown key") or nil, k)
    end
  end)

  it("names bad values", function()
    assert.matches("unknown loss 'klx'", err_of(qad.config, { loss = "klx" }))
    assert.matches("steps must be >= 1", err_of(qad.config, { steps = 0 }))
    assert.matches("grad_accum must be a whole number", err_of(qad.config, { grad_accum = 1.5 }))
    assert.matches("recalibrate must be a number of steps", err_of(qad.config, { recalibrate = true }))
    assert.matches("sft_mask must be true or false", err_of(qad.config, { sft_mask = "yes" }))
    assert.matches("lr_scale_unquantized must be >= 0", err_of(qad.config, { lr_scale_unquantized = -2 }))
    assert.matches("unknown key 'stepz' %(did you mean 'steps'%?%)", err_of(qad.config, { stepz = 3 }))
  end)

  it("refuses impossible settings before any compute: T <= 0, min_lr above lr, empty batches or rows", function()
    assert.matches("distill: temperature must be > 0, got 0$", err_of(qad.config, { temperature = 0 }))
    assert.matches("distill: temperature must be > 0, got %-1$", err_of(qad.config, { temperature = "-1" }))
    assert.matches("distill: min_lr 0.001 is above lr 0.0001", err_of(qad.config, { lr = 1e-4, min_lr = 1e-3 }))
    assert.matches("distill: batch must be >= 1, got 0", err_of(qad.config, { batch = 0 }))
    assert.matches("distill: seq_len must be >= 1, got 0", err_of(qad.config, { seq_len = 0 }))
    assert.matches("distill: kd_loss_scale must be >= 0", err_of(qad.config, { kd_loss_scale = -1 }))
    local c = qad.config { lr = 1e-4, min_lr = 1e-4, kd_loss_scale = "0.25", ignore_index = "-1" }
    assert.are.equal(0.25, c.loss.kd_loss_scale)
    assert.are.equal(-1, c.loss.ignore_index)
  end)

  it("loss_text says the loss of the run header (kd, top-k, T, LM loss)", function()
    assert.are.equal("KL(teacher || student), T = 1", qad.loss_text(qad.config {}))
    assert.are.equal("top-8 KL(teacher || student) (renorm), T = 2",
      qad.loss_text(qad.config { loss = "topk", topk = 8, temperature = 2 }))
    assert.are.equal("CE + 0.5 x reverse KL(student || teacher), T = 1",
      qad.loss_text(qad.config { loss = "reverse_kl", lm_loss = true, kd_loss_scale = 0.5 }))
  end)
end)

describe("metrics files and identities", function()
  it("cut_metrics keeps what a run had written up to its checkpoint (atomically), once", function()
    local path = tmp .. "/cut.jsonl"
    local rows = { '{"step": 0, "eval_ppl": 4.2, "eval_kld": 0.09}' }
    for i = 1, 6 do rows[#rows + 1] = ('{"step": %d, "loss": 0.%d}'):format(i, i) end
    table.insert(rows, 5, '{"step": 4, "eval_ppl": 4.1, "eval_kld": 0.05}')   -- eval_every = 4, after the save
    nbspec.write(path, table.concat(rows, "\n") .. '\n{"step": 7, "lo')        -- a kill mid-line
    assert.are.same({ 6, 3 }, { qad.cut_metrics(path, 4, 10) })
    assert.are.equal(table.concat(rows, "\n", 1, 6) .. "\n", nbspec.read(path))
    assert.is_nil(nbspec.read(path .. ".part"))
    -- at the last step, the final eval row goes: the resumed run records it again
    nbspec.write(path, '{"step": 0, "eval_kld": 0.1}\n{"step": 1, "loss": 1}\n{"step": 2, "loss": 2}\n'
                       .. '{"step": 2, "eval_kld": 0.05}\n')
    assert.are.same({ 3, 1 }, { qad.cut_metrics(path, 2, 2) })
    assert.are.equal('{"step": 0, "eval_kld": 0.1}\n{"step": 1, "loss": 1}\n{"step": 2, "loss": 2}\n', nbspec.read(path))
    assert.are.same({ 3, 0 }, { qad.cut_metrics(path, 2, 2) })
    assert.are.same({ 0, 0 }, { qad.cut_metrics(tmp .. "/none.jsonl", 2, 2) })
  end)

  it("model_identity follows the weights, config and tokenizer, not the folder's name or place", function()
    if not need(stories) then return end
    local function copy(dir)
      os.execute(("mkdir -p %s && cp %s/* %s/"):format(nbspec.quote(dir), nbspec.quote(stories), nbspec.quote(dir)))
      return dir
    end
    local a, b = copy(tmp .. "/ida/hf"), copy(tmp .. "/idb/hf")
    local id = qad.model_identity(stories)
    assert.matches("^%x+$", id)
    assert.are.equal(id, qad.model_identity(a))
    assert.are.equal(id, qad.model_identity(a .. "/"))
    -- other weights (the last bytes of the last tensor) in a folder of the same name
    local w = nbspec.read(b .. "/model.safetensors")
    nbspec.write(b .. "/model.safetensors", w:sub(1, -5) .. "\0\0\128\63")
    assert.are_not.equal(id, qad.model_identity(b))
    nbspec.write(b .. "/model.safetensors", w)
    assert.are.equal(id, qad.model_identity(b))
    local cfg = nbspec.read(b .. "/config.json")
    nbspec.write(b .. "/config.json", cfg:gsub('"rms_norm_eps": 1e%-05', '"rms_norm_eps": 1e-06'))
    assert.are_not.equal(id, qad.model_identity(b))
    assert.is_nil(qad.model_identity(tmp .. "/nothing"))
  end)
end)

describe("step-level API", function()
  it("losses add and scale, and backward sends logits and hidden-state gradients to the student", function()
    local teacher, sm, qm = tiny()
    local student = qad.student(sm, qm)
    local x = toks(2, 16, 64)
    local tl, th = teacher:forward(x, { hidden = true })
    -- KL alone
    local sl = student:forward(x)
    local kl, r = nibble.distill.kl(sl, tl)
    assert.is_true(kl.value > 0)
    assert.are.equal(r.loss, kl.value)
    assert.are.equal(32, r.tokens)
    kl:backward()
    local g1 = flat_grads(sm)
    sm:zero_grad()
    -- kl + kl and 2 * kl: exactly twice the gradient (scaling by 2 is exact)
    sl = student:forward(x)
    local k2 = nibble.distill.kl(sl, tl)
    local twice = k2 + k2
    assert.are.equal(2 * kl.value, twice.value)
    twice:backward()
    local g2 = flat_grads(sm)
    local a, b = g1:data("const float *"), g2:data("const float *")
    for i = 0, g1:numel() - 1 do assert(b[i] == 2 * a[i], "gradient " .. i .. " is not doubled") end
    sm:zero_grad()
    assert.are.equal(kl.value * 0.25, (0.25 * kl).value)
    assert.are.equal(kl.value - 1, (kl - 1).value)
    assert.are.equal(-kl.value, (-kl).value)
    assert.are.equal(kl.value / 4, (kl / 4).value)
    -- KL + a hidden-state loss written in Lua = the model's backward with both gradients
    local sl2, sh = student:forward(x, { hidden = true })
    local kl3 = nibble.distill.kl(sl2, tl, { temperature = 2 })
    local h = sh[2]
    local gh = nibble.zeros("f32", h.shape)
    local ph, pt, pg = h:data("const float *"), th[2]:data("const float *"), gh:data("float *")
    local s, n = 0, h:numel()
    for i = 0, n - 1 do
      local d = ph[i] - pt[i]
      s = s + d * d
      pg[i] = 2 * d / n
    end
    local total = kl3 + 0.1 * qad.loss(s / n, { [h] = gh })
    total:backward()
    local gmix = flat_grads(sm)
    sm:zero_grad()
    local sl4 = sm:forward(x, { train = true, hidden = true })
    local _, dl = nibble.distill.loss { student = sl4, teacher = tl, temperature = 2, grad = true }
    local dh = { [2] = nibble.optim.accumulate(nibble.zeros("f32", gh.shape), gh, 0.1) }
    sm:backward(dl, dh)
    local gref = flat_grads(sm)
    assert.is_true(gmix:equal(gref))
    sm:zero_grad()
    -- gradients on tensors that no student:forward made are refused
    local bad = qad.loss(1, { [tl] = nibble.zeros("f32", tl.shape) })
    assert.matches("no student:forward returned", err_of(bad.backward, bad))
    assert.matches("multiplied by a number", err_of(function() return kl * kl end))
    -- ce and reverse_kl forms
    sl = student:forward(x)
    local labels = toks(2, 16, 64, 5):view(32)
    local ce = nibble.distill.ce(sl, labels)
    assert.is_true(ce.value > 0)
    local rkl = nibble.distill.reverse_kl(sl, tl, { mask = nibble.ones and nil })
    assert.is_true(rkl.value > 0)
    ce:backward()
    sm:zero_grad()
  end)
end)

describe("qad.new", function()
  local function loader_of(vocab)
    local ds = nibble.data.new()
    local ids = {}
    for i = 1, 2000 do ids[i] = (i * 7 + (i % 11) * 3) % vocab end
    ds:add_tokens(ids)
    return ds:loader { seq_len = 16, batch = 4, seed = 9, random_offset = true, shuffle = true, drop_last = true }
  end

  it("steps with metrics, and a restored run continues to the same bytes", function()
    local cfg = { steps = 6, lr = 1e-3, min_lr = 1e-4, warmup = 1, grad_accum = 2, weight_decay = 0.01 }
    local function fresh()
      local teacher, sm, qm = tiny()
      local ld = loader_of(64)
      return qad.new { teacher = teacher, student = qm, loader = ld, config = cfg }, qm, sm
    end
    local run, qm = fresh()
    local m = run:step()
    assert.are.equal(1, m.step)
    assert.are.equal(0, m.lr)
    assert.are.equal(2 * 4 * 16, m.seen)
    assert.are.equal(m.seen, m.tokens)
    assert.is_true(m.kd > 0 and m.ce > 0 and m.grad_norm > 0 and m.tokens_per_s > 0)
    assert.is_false(m.skipped)
    run:step()
    local ck = tmp .. "/ck"
    run:save(ck)
    assert.matches("step%-00000002$", qad.latest(ck))
    while not run:done() do run:step() end
    assert.are.equal(6, run:step_count())
    local a = tmp .. "/a.safetensors"
    qm:save(a)
    local run2, qm2 = fresh()
    assert.are.equal(2, run2:restore(ck))
    while not run2:done() do run2:step() end
    local b = tmp .. "/b.safetensors"
    qm2:save(b)
    assert.are.equal(nbspec.read(a), nbspec.read(b))
    -- settings must match the checkpoint's
    local teacher3, _, qm3 = tiny()
    local other = qad.new { teacher = teacher3, student = qm3, loader = loader_of(64),
                            config = { steps = 6, lr = 2e-3, min_lr = 1e-4, warmup = 1, grad_accum = 2, weight_decay = 0.01 } }
    assert.matches("lr: the checkpoint has 0.001", err_of(other.restore, other, ck))
    assert.is_nil(qad.latest(tmp .. "/nothing"))
  end)

  it("micro_step + optimizer_step is the pieces of step", function()
    local teacher, _, qm = tiny()
    local run = qad.new { teacher = teacher, student = qm, config = { steps = 3, lr = 1e-3 } }
    assert.matches("no dataloader", err_of(run.step, run))
    local x, y = toks(2, 16, 64), toks(2, 16, 64, 1)
    local mask = nibble.zeros("u8", 2, 16):fill(1)
    mask:set(1, 1, 0)
    local r = run:micro_step(x, y, mask)
    assert.are.equal(31, r.tokens)
    assert.are.equal(31, run:count_tokens(y, mask))
    local m = run:optimizer_step()
    assert.are.equal(1, m.step)
    assert.are.equal(1, run:step_count())
    assert.are.equal(run:lr_at(0), m.lr)
    -- Ctrl-C that lands while the update runs: AdamW completes the step, then sees the flag. The step's
    -- metrics come back and the interrupt stays pending (the next check raises it), so a checkpoint
    -- saved on the interrupt never holds a step whose metrics row was lost.
    local C, c = nibble.C, nibble.context()
    run:micro_step(x, y, mask)
    C.nb_ctx_interrupt(c)
    local m2 = run:optimizer_step()
    assert.are.equal(2, m2.step)
    assert.are.equal(2, run:step_count())
    assert.are.equal(1, C.nb_ctx_interrupted(c))
    assert.matches("^interrupted$", err_of(nibble.check, 0))
    assert.are.equal(0, C.nb_ctx_interrupted(c))
  end)

  it("refuses a student without calibrated scales and the teacher as student", function()
    local teacher, sm = tiny()
    local raw = nibble.qmodel.new(sm)
    raw:set("model.layers.0.mlp.up_proj", { weight = "nvfp4" })
    assert.matches("NB_ERR_UNCALIBRATED: .*model.layers.0.mlp.up_proj",
      err_of(qad.new, { teacher = teacher, student = raw, config = {} }))
    local _, sm2, qm2 = tiny()
    assert.matches("teacher must be a separate model", err_of(qad.new, { teacher = sm2, student = qm2, config = {} }))
  end)
end)

describe("teacher samples", function()
  it("sample_batch decodes B rows with one cache; top_k = 1 is greedy generation", function()
    local teacher = tiny()
    local prompt = { 1, 5, 9, 13 }
    local outs = qad.sample_batch(teacher, prompt, 3, 12, { top_k = 1, stop = {} })
    local _, ids = teacher:generate { prompt = prompt, n = 12, greedy = true, stop = false, text = false }
    assert.are.equal(3, #outs)
    for b = 1, 3 do assert.are.same(ids, outs[b]) end
    local a1 = qad.sample_batch(teacher, prompt, 4, 10, { temperature = 1, seed = 5, stop = {} })
    local a2 = qad.sample_batch(teacher, prompt, 4, 10, { temperature = 1, seed = 5, stop = {} })
    assert.are.same(a1, a2)
    assert.are_not.same(a1[1], a1[2])   -- each row has its own stream
    local stopped = qad.sample_batch(teacher, prompt, 2, 10, { top_k = 1, stop = { ids[3] } })
    assert.are.same({ ids[1], ids[2], ids[3] }, stopped[1])
  end)

  -- The expected ids were drawn by the Lua decode loops that nb_model_generate replaced (same seeds, one
  -- nb_rng stream per row, the same nb_sample_logits): the C loop draws exactly the same tokens.
  it("sample_batch and generate draw on stories260K the tokens the Lua decode loops drew", function()
    if not need(stories) then return end
    local m = nibble.model.load(stories)
    local prompt = { 1, 403, 407, 261 }
    local outs = qad.sample_batch(m, prompt, 3, 24, { temperature = 1, top_k = 50, seed = 3 })
    assert.are.same({
      { 378, 432, 383, 286, 261, 370, 280, 415, 412, 315, 426, 392, 303, 422, 268, 414, 422, 395, 326, 263, 377, 267, 265, 282 },
      { 378, 432, 383, 286, 261, 298, 315, 421, 395, 317, 322, 261, 370, 298, 276, 302, 278, 380, 422, 263, 415, 414, 401, 396 },
      { 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 272, 411, 411, 421, 348, 425, 423, 343 },
    }, outs)
    -- rows that stop (at 401, both on their 14th token) leave the batch
    assert.are.same({
      { 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401 },
      { 378, 432, 383, 286, 261, 376, 268, 414, 422, 395, 326, 426, 326, 401 },
    }, qad.sample_batch(m, prompt, 2, 24, { temperature = 0.9, top_p = 0.9, seed = 8, stop = { 401 } }))
    local text, ids = m:generate { prompt = "Once upon a time", n = 30, temperature = 0.8, top_k = 40, top_p = 0.95, seed = 7 }
    assert.are.same({ 432, 383, 286, 261, 272, 414, 444, 395, 410, 454, 412, 340, 426, 346, 286, 399, 344, 444, 429, 275,
                      266, 329, 429, 412, 425, 372, 281, 286, 399, 344 }, ids)
    assert.are.equal(", there was a fox named Jack. He was very excited because he was very e", text)
    -- streamed pieces add up to the text
    local pieces = {}
    local t3 = m:generate { prompt = "Tom", n = 25, temperature = 1, seed = 4, on_text = function(p) pieces[#pieces + 1] = p end }
    assert.are.equal(" and Ducky were trouble kids in the nast tree.", t3)
    assert.are.equal(t3, table.concat(pieces))
    -- row b of a batch seeded s is what generate seeded s + b draws alone
    for b = 1, 3 do
      local _, alone = m:generate { prompt = prompt, n = 24, temperature = 1, top_k = 50, seed = 3 + b, text = false }
      assert.are.same(outs[b], alone)
    end
    -- an error in on_text stops the decoding and comes back as raised
    local calls = 0
    local ok, e = pcall(m.generate, m, { prompt = "Tom", n = 25, greedy = true,
                                         on_text = function() calls = calls + 1; if calls == 3 then error("enough", 0) end end })
    assert.is_false(ok)
    assert.are.equal("enough", e)
    assert.are.equal(3, calls)
  end)

  it("teacher_samples writes chat records whose answers are the loss tokens", function()
    if not need(stories) then return end
    local m = nibble.model.load(stories)
    local out = tmp .. "/samples.jsonl"
    local calls = 0
    local path, n = qad.teacher_samples { model = m, prompts = { "Once upon a time", "The cat" }, samples = 3,
                                          tokens = 20, seed = 2, out = out, progress = function() calls = calls + 1 end }
    assert.are.equal(out, path)
    assert.are.equal(2, calls)
    assert.is_true(n > 6 and n <= 2 * 3 * 20)
    local lines = {}
    for l in io.lines(out) do lines[#lines + 1] = nibble.json.decode(l) end
    assert.are.equal(6, #lines)
    assert.are.equal("Once upon a time", lines[1].messages[1].content)
    assert.are.equal("assistant", lines[1].messages[2].role)
    local ds = nibble.data.load(out, { tokenizer = m:tokenizer() })
    assert.is_true(ds:n_masked() > 0 and ds:n_masked() < ds:n_tokens())
    -- both prompts (of different lengths) decoded together write what one prompt per decode writes, and
    -- prompt i's answers are sample_batch's rows seeded seed * 1000003 + i * 1009 + b
    local function slurp(p) local f = assert(io.open(p, "rb")); local d = f:read("*a"); f:close(); return d end
    local out1 = tmp .. "/samples-rows3.jsonl"
    qad.teacher_samples { model = m, prompts = { "Once upon a time", "The cat" }, samples = 3, tokens = 20, seed = 2,
                          rows = 3, out = out1 }
    assert.are.equal(slurp(out), slurp(out1))
    local tok = m:tokenizer()
    local ids = tok:encode("User: The cat\nAssistant:", { special = true })
    local alone = qad.sample_batch(m, ids, 3, 20, { temperature = 1, top_k = 50, seed = 2 * 1000003 + 2 * 1009 })
    for b = 1, 3 do
      assert.are.equal(tok:decode(alone[b], { skip_special = true }), lines[3 + b].messages[2].content)
    end
  end)
end)

describe("qad.loader", function()
  it("marks plain-text documents as the tokenizer does; pack = false gives one document per row", function()
    if not need(stories) then return end
    local tok = nibble.model.load(stories):tokenizer()
    assert.is_true(tok.add_bos)
    assert.is_false(tok.add_eos)
    local docs = { "Once upon a time there was a cat.", "Tom had a red ball. He liked it.", "The sun was hot." }
    local file = tmp .. "/docs.txt"
    local f = io.open(file, "wb")
    f:write(table.concat(docs, "<|endoftext|>"))
    f:close()
    local function stream(ld)
      local ds = ld.dataset
      local p = C.nb_dataset_ids(rawget(ds, "_p"))
      local ids = {}
      for i = 0, ds:n_tokens() - 1 do ids[#ids + 1] = p[i] end
      return ids
    end
    local want = {}
    for _, d in ipairs(docs) do
      for _, id in ipairs(tok:encode(d)) do want[#want + 1] = id end   -- encode adds BOS (add_bos_token)
    end
    assert.are.equal(tok.bos, want[1])
    -- stories260K's tokenizer adds BOS and no EOS (llama2.c trained on BOS-only streams): no EOS either
    assert.are.same(want, stream(qad.loader({ data = file, seq_len = 4, batch = 1 }, tok, 1)))
    -- eos = true: the data.h rule, EOS after every document
    local with = stream(qad.loader({ data = file, seq_len = 4, batch = 1, eos = true }, tok, 1))
    assert.are.equal(#want + 3, #with)
    local n_eos = 0
    for _, id in ipairs(with) do if id == tok.eos then n_eos = n_eos + 1 end end
    assert.are.equal(3, n_eos)
    -- pack = false: row i is a document from its BOS, padding masked out
    local ld = qad.loader({ data = file, seq_len = 16, batch = 3, pack = false }, tok, 1)
    assert.are.equal(3, ld.rows_per_epoch)
    local b = ld:next()
    local firsts, counted = {}, 0
    for r = 1, 3 do
      assert.are.equal(tok.bos, b.tokens:get(r, 1))
      firsts[#firsts + 1] = b.tokens:get(r, 2)
      for t = 1, 16 do counted = counted + b.mask:get(r, t) end
    end
    table.sort(firsts)
    local starts = {}
    for _, d in ipairs(docs) do starts[#starts + 1] = tok:encode(d)[2] end
    table.sort(starts)
    assert.are.same(starts, firsts)
    assert.are.equal(#want - 3, counted)   -- every token of each document but its BOS is a target
  end)
end)

describe("recipes/qad.lua", function()
  local function load(args)
    return recipe.load(src .. "/recipes/qad.lua", args)
  end

  it("dry-runs: the plan and the settings, before any compute", function()
    if not need(stories, train) then return end
    local r = qad.run(load { model = stories, data = train, out = tmp .. "/never", steps = "50", lr = "3e-5",
                             kd = "topk", topk = "8", grad_accum = "2" }, nil, { dry_run = true, quiet = true })
    assert.are.equal(50, r.steps)
    assert.are.equal(3e-5, r.config.lr)
    assert.are.equal(0, r.config.min_lr)
    assert.are.equal(2, tonumber(r.config.warmup))
    assert.are.equal(8, r.config.loss.top_k)
    assert.are.equal(2, r.config.grad_accum)
    assert.are.equal(tmp .. "/never-checkpoints", r.checkpoint_dir)
    local q, ex = 0, 0
    for _, e in ipairs(r.plan) do
      if e.format then q = q + 1 elseif e.kind == "linear" then ex = ex + 1 end
    end
    assert.are.equal(30, q)   -- q k v o gate up of 5 layers; down_proj (172) and the tied lm_head stay
    assert.are.equal(6, ex)
    local f = io.open(tmp .. "/never", "rb")
    assert.is_nil(f)
  end)

  it("names what is wrong", function()
    if not need(stories, train) then return end
    assert.matches("distill.data .* does not exist",
      err_of(qad.run, load { model = stories, data = tmp .. "/missing.txt", out = tmp .. "/x" }, nil, { dry_run = true }))
    assert.matches("kd must be kl, reverse_kl or topk", err_of(load, { model = stories, data = train, kd = "mse" }))
    assert.matches("lr must be a number", err_of(load, { model = stories, data = train, lr = "fast" }))
    assert.matches("export.dir is missing", err_of(qad.run, load { model = stories, data = train }, nil, { quiet = true }))
    assert.matches("steps must be >= 1",
      err_of(qad.run, load { model = stories, data = train, out = tmp .. "/x", steps = "0" }, nil, { dry_run = true }))
    assert.matches("distill.data is missing",
      err_of(qad.run, load { model = stories, out = tmp .. "/x" }, nil, { dry_run = true }))
  end)

  it("passes every distill key on (t2, kd_loss_scale, topk_norm, AdamW's, the data's) and refuses unknown keys", function()
    if not need(stories, train) then return end
    local r = qad.run(load { model = stories, data = train, kd = "topk", topk = "8", topk_norm = "ghost", t2 = "false",
                             temperature = "2", lm_loss = "true", kd_loss_scale = "0.5", ignore_index = "-1",
                             weight_decay = "0.01", beta1 = "0.8", beta2 = "0.95", eps = "1e-6", clip = "0.5",
                             pack = "false", eos = "true", separator = "<|endoftext|>", text_field = "body" },
                      nil, { dry_run = true, quiet = true })
    local c = r.config
    assert.are.equal(8, c.loss.top_k)
    assert.are.equal(C.NB_TOPK_GHOST, c.loss.topk_norm)
    assert.are.equal(0, c.loss.t2_scale)
    assert.are.equal(2, c.loss.temperature)
    assert.are.equal(1, c.loss.lm_loss)
    assert.are.equal(0.5, c.loss.kd_loss_scale)
    assert.are.equal(-1, c.loss.ignore_index)
    assert.are.equal(0.01, c.weight_decay)
    assert.are.equal(0.8, c.beta1)
    assert.are.equal(0.95, c.beta2)
    assert.are.equal(1e-6, c.eps)
    assert.are.equal(0.5, c.clip)
    local d = r.recipe.distill
    assert.are.same({ false, true, "<|endoftext|>", "body" }, { d.pack, d.eos, d.separator, d.text_field })
    assert.are.equal("qad.lua: unknown key 'stpes' (did you mean 'steps'?); --help lists the keys",
      err_of(load, { model = stories, data = train, stpes = "5" }))
    assert.are.equal("qad.lua: topk=5 needs kd=topk (the KD loss over the teacher's top k)",
      err_of(load, { model = stories, data = train, topk = "5" }))
    assert.are.equal("qad.lua: t2 must be true or false, got 'no'", err_of(load, { model = stories, data = train, t2 = "no" }))
  end)

  it("refuses impossible requests before any compute, naming them", function()
    if not need(stories, train) then return end
    local function dry(extra)
      local a = { model = stories, data = train, out = tmp .. "/never" }
      for k, v in pairs(extra) do a[k] = v end
      return qad.run(load(a), nil, { dry_run = true, quiet = true })
    end
    local function refused(extra) return err_of(dry, extra) end
    assert.are.equal("distill: seq_len 100000 is more than the model's max_position_embeddings 512 "
                     .. "(allow_long=true runs it anyway)", refused { seq_len = "100000" })
    assert.are.equal(100000, tonumber(dry({ seq_len = "100000", allow_long = "true" }).recipe.distill.seq_len))
    assert.are.equal("eval: ctx 1024 is more than the model's max_position_embeddings 512 (allow_long=true runs it anyway)",
      refused { eval_data = valid, ctx = "1024" })
    assert.are.equal("distill: topk 100000 is more than the model's vocabulary (512 tokens)",
      refused { kd = "topk", topk = "100000" })
    assert.matches("distill: seq_len must be >= 1, got 0", refused { seq_len = "0" })
    assert.matches("distill: batch must be >= 1, got 0", refused { batch = "0" })
    assert.matches("distill: temperature must be > 0, got 0", refused { temperature = "0" })
    assert.matches("distill: min_lr 0.001 is above lr 0.0001", refused { lr = "1e-4", min_lr = "1e-3" })
    -- files: W4A4 calibrates on calib, the data and eval data are files
    assert.matches("^calibration data /nonexistent/c.txt does not exist", refused { format = "nvfp4", calib = "/nonexistent/c.txt" })
    assert.are.equal("calibration: seq_len 4096 is more than the model's max_position_embeddings 512 "
                     .. "(allow_long=true runs it anyway)", refused { format = "nvfp4", calib_seq_len = "4096" })
    dry { format = "nvfp4_w4a16", calib = "/nonexistent/c.txt" }   -- weight-only: the calibration text is not read
    assert.are.equal(("distill.data %s is a folder; give a file"):format(tmp), refused { data = tmp })
    assert.are.equal(("eval data %s is a folder; give a file"):format(tmp), refused { eval_data = tmp })
    assert.are.equal(("distill: metrics %s is a folder; give a file"):format(tmp), refused { metrics = tmp })
    assert.matches("cannot be written", refused { metrics = "/nonexistent/m.jsonl" })
    -- where the export goes
    assert.are.equal("export: out=/proc/x: cannot write in /proc", refused { out = "/proc/x" })
    nbspec.write(tmp .. "/afile", "x")
    assert.are.equal(("export: out=%s/afile is a file, not a folder"):format(tmp), refused { out = tmp .. "/afile" })
    -- missing folders above out are created by the export (as `nibble quantize --out out/q260` does); not under a file
    dry { format = "nvfp4_w4a16", out = tmp .. "/new/deeper/x" }
    assert.is_false(nbspec.exists(tmp .. "/new"))   -- a dry run creates nothing
    assert.are.equal(("export: the folder of out=%s/afile/x %s/afile is a file, not a folder"):format(tmp, tmp),
                     refused { out = tmp .. "/afile/x" })
    os.execute(("mkdir -p %s && echo hi > %s"):format(nbspec.quote(tmp .. "/mine"), nbspec.quote(tmp .. "/mine/notes.txt")))
    assert.matches("exists and is not a nibble export", refused { out = tmp .. "/mine" })
    local copy = tmp .. "/model-copy"
    os.execute(("mkdir -p %s && cp %s/* %s/"):format(nbspec.quote(copy), nbspec.quote(stories), nbspec.quote(copy)))
    assert.are.equal(("export: out=%s is the folder of the model %s; choose another output folder"):format(copy, copy),
      err_of(qad.run, load { model = copy, data = train, out = copy }, nil, { dry_run = true, quiet = true }))
    assert.is_nil(nbspec.read(tmp .. "/mine/model.safetensors"))
  end)

  it("checkpoints: a fresh run over them is refused, resume = true checks every setting, a finished run resumed "
     .. "trains nothing, and the metrics keep one row per step", function()
    if not need(stories, train, valid) then return end
    local base = { model = stories, data = train, eval_data = valid, ctx = "64", chunks = "2", steps = "4", batch = "2",
                   seq_len = "32", lr = "3e-4", checkpoint_every = "2", out = tmp .. "/rck", metrics = tmp .. "/rck.jsonl" }
    local function with(extra)
      local a = {}
      for k, v in pairs(base) do a[k] = v end
      for k, v in pairs(extra or {}) do a[k] = v end
      return load(a)
    end
    local function rows(path)   -- the rows without their timings
      local out = {}
      for l in io.lines(path) do
        local t = nibble.json.decode(l)
        out[#out + 1] = t.loss and ("%d loss %.9g"):format(t.step, t.loss) or ("%d eval %.9g"):format(t.step, t.eval_kld)
      end
      return out
    end
    local ckdir = tmp .. "/rck-checkpoints"
    local r1 = qad.run(with(), nil, { quiet = true })
    assert.are.equal(4, #r1.metrics)
    local ref, ref_rows = nbspec.read(tmp .. "/rck/model.safetensors"), rows(tmp .. "/rck.jsonl")
    assert.are.equal(6, #ref_rows)   -- eval at 0, steps 1-4, eval at 4
    assert.matches("step%-00000004$", qad.latest(ckdir))   -- the last step has one too
    -- a fresh run over them
    assert.are.equal(("qad: %s already holds checkpoints (the latest of step 4): resume=true continues that run, "
                      .. "overwrite=true starts again and removes them"):format(ckdir), err_of(qad.run, with(), nil, { quiet = true }))
    -- resume = true with other settings: refused up front, numbers as written
    local function changed(extra)
      extra.resume = "true"
      return err_of(qad.run, with(extra), nil, { quiet = true })
    end
    assert.matches("settings changed %(format: the checkpoint has nvfp4_w4a16, this run mxfp8%)", changed { format = "mxfp8" })
    assert.matches("settings changed %(algorithm: the checkpoint has max, this run mse%)", changed { algorithm = "mse" })
    assert.matches("settings changed %(lr: the checkpoint has 0.0003, this run 0.0001%)", changed { lr = "1e-4" })
    assert.matches("settings changed %(seed: the checkpoint has 1, this run 2%)", changed { seed = "2" })
    assert.matches("settings changed %(kd: the checkpoint has kl, this run reverse_kl%)", changed { kd = "reverse_kl" })
    assert.matches("settings changed %(data: the checkpoint's run used .*train.*, this run .*valid.* %(not the same content%)%)",
      changed { data = valid })
    assert.matches("resume and overwrite exclude each other", changed { overwrite = "true" })
    -- the finished run resumed: nothing to train, the same export, the same rows
    local r2 = qad.run(with { resume = "true" }, nil, { quiet = true })
    assert.are.equal(0, #r2.metrics)
    assert.are.equal(ref, nbspec.read(tmp .. "/rck/model.safetensors"))
    assert.are.same(ref_rows, rows(tmp .. "/rck.jsonl"))
    -- killed after step 4 with the last checkpoint at 2: steps 3 and 4 are trained and recorded once again
    nbspec.write(ckdir .. "/latest", "step-00000002\n")
    os.execute("rm -rf " .. nbspec.quote(ckdir .. "/step-00000004"))
    local r3 = qad.run(with { resume = "true" }, nil, { quiet = true })
    assert.are.equal(2, #r3.metrics)
    assert.are.equal(ref, nbspec.read(tmp .. "/rck/model.safetensors"))
    assert.are.same(ref_rows, rows(tmp .. "/rck.jsonl"))
    -- overwrite = true starts again from step 0
    local r4 = qad.run(with { overwrite = "true" }, nil, { quiet = true })
    assert.are.equal(4, #r4.metrics)
    assert.are.equal(ref, nbspec.read(tmp .. "/rck/model.safetensors"))
    assert.are.same(ref_rows, rows(tmp .. "/rck.jsonl"))
  end)

  it("nibble plan shows the recipe's quantization plan", function()
    if not need(stories, train) then return end
    local out, e, rc = nbspec.nibble { "plan", src .. "/recipes/qad.lua", "model=" .. stories, "data=" .. train }
    assert.are.equal(0, rc, e)
    assert.matches("model.layers.0.self_attn.q_proj%s+nvfp4_w4a16", out)
    assert.matches("model.layers.0.mlp.down_proj%s+%-", out)
  end)
end)

describe("recipes/quickstart.lua", function()
  it("dry-runs on a given model", function()
    if not need(stories) then return end
    local out, e, rc = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. stories, "dry_run=true",
                                       "steps=5" }
    assert.are.equal(0, rc, e)
    assert.matches("quickstart %(dry run%): .* %-> PTQ nvfp4_w4a16 %-> QAD 5 steps", out)
    -- quick=true: smaller defaults, and a key given still wins
    local oq, eq, rcq = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. stories, "dry_run=true",
                                        "quick=true" }
    assert.are.equal(0, rcq, eq)
    assert.matches("%-> QAD 6 steps of 2 x 128 tokens at lr 0.0001 %->", oq)
    oq = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. stories, "dry_run=true", "quick=true",
                         "steps=3" }
    assert.matches("%-> QAD 3 steps of 2 x 128 tokens", oq)
    local _, e2, rc2 = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. tmp .. "/none", "dry_run=true" }
    assert.are.equal(1, rc2)
    assert.matches("does not exist", e2)
  end)

  it("refuses unknown keys and bad formats before it loads anything", function()
    if not need(stories) then return end
    local qs = src .. "/recipes/quickstart.lua"
    local out, e, rc = nbspec.nibble { "run", qs, "model=" .. stories, "dry_run=true", "stpes=2" }
    assert.are.equal(1, rc)
    assert.are.equal("", out)
    assert.are.equal("nibble: quickstart: unknown key 'stpes' (did you mean 'steps'?); --help lists the keys\n", e)
    local _, e2, rc2 = nbspec.nibble { "run", qs, "model=" .. stories, "format=nvfp5", "out=" .. tmp .. "/qsbad" }
    assert.are.equal(1, rc2)
    assert.are.equal("nibble: quickstart: unknown format 'nvfp5' (did you mean 'nvfp4'?); known: fp8, fp8_per_channel, "
                     .. "mxfp8, nvfp4, nvfp4_4o6, nvfp4_4o6_a4, nvfp4_static, nvfp4_w4a16\n", e2)
    local _, e3, rc3 = nbspec.nibble { "run", qs, "model=" .. stories, "dry_run=true", "seq_len=4096" }
    assert.are.equal(1, rc3)
    assert.matches("nibble: quickstart: seq_len 4096 is more than the model's max_position_embeddings 512", e3)
    local _, e4, rc4 = nbspec.nibble { "run", qs, "model=" .. stories, "dry_run=true", "out=/proc/qs" }
    assert.are.equal(1, rc4)
    assert.matches("nibble: export: out=/proc/qs: cannot write in /proc\n$", e4)
  end)

  it("the sampled text is cached per model: the same folder name with other weights samples again", function()
    if not need(stories) then return end
    local function copy(dir)
      os.execute(("mkdir -p %s && cp %s/* %s/"):format(nbspec.quote(dir), nbspec.quote(stories), nbspec.quote(dir)))
      return dir
    end
    local a, b = copy(tmp .. "/qsa/hf"), copy(tmp .. "/qsb/hf")
    local w = nbspec.read(b .. "/model.safetensors")
    nbspec.write(b .. "/model.safetensors", w:sub(1, -5) .. "\0\0\128\63")
    local function qs(model, out)
      local _, e, rc = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. model, "prompts=1",
        "samples=2", "eval_samples=2", "tokens=16", "steps=1", "batch=1", "seq_len=16", "out=" .. tmp .. "/" .. out,
        "cache=" .. tmp .. "/qs-id-cache" }
      assert.are.equal(0, rc, e)
      return e
    end
    assert.matches("train tokens sampled", qs(a, "qsa-out"))
    local eb = qs(b, "qsb-out")
    assert.matches("train tokens sampled", eb)
    assert.is_nil(eb:find("(cached)", 1, true))
    assert.matches("%(cached%)", qs(a, "qsa-out2"))
  end)

  it("runs the whole job in miniature on stories260K: samples, PTQ, QAD, export, table", function()
    if not need(stories) then return end
    local out, e, rc = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. stories, "prompts=2",
      "samples=4", "eval_samples=4", "tokens=40", "steps=3", "batch=2", "seq_len=32", "out=" .. tmp .. "/qs",
      "cache=" .. tmp .. "/qs-cache" }
    assert.are.equal(0, rc, e)
    assert.matches("teacher%s+[%d%.]+", out)
    assert.matches("PTQ%s+[%d%.]+%s+[%d%.]+%s+[%d%.]+%%", out)
    assert.matches("QAD%s+[%d%.]+%s+[%d%.]+%s+[%d%.]+%%", out)
    assert.matches("data: %d+ train tokens sampled", e)
    -- progress with an ETA (stderr is not a terminal: whole lines), and each row as soon as it is known:
    -- the stderr rows are the table's, the PTQ row comes before QAD's first step
    assert.matches("\ndata: sampling train: 2/2 prompts  %d+ tokens, %d+ tok/s  ETA 0:00\n", e)
    assert.matches("\ndata: sampling eval: 6/6 prompts  %d+ tokens, %d+ tok/s  ETA 0:00\n", e)
    assert.matches("\neval: PTQ: (%d+)/%1 chunks  ETA 0:00\n", e)
    local t_row = e:match("\neval: teacher PPL ([%d%.]+) %(")
    local p_row = { e:match("\neval: PTQ     PPL ([%d%.]+)  KLD ([%d%.]+)  top%-1 ([%d%.]+)%% %(") }
    local q_row = { e:match("\neval: QAD     PPL ([%d%.]+)  KLD ([%d%.]+)  top%-1 ([%d%.]+)%% %(") }
    assert.are.equal(out:match("teacher%s+([%d%.]+)"), t_row)
    assert.are.same({ out:match("PTQ%s+([%d%.]+)%s+([%d%.]+)%s+([%d%.]+)%%") }, p_row)
    assert.are.same({ out:match("QAD%s+([%d%.]+)%s+([%d%.]+)%s+([%d%.]+)%%") }, q_row)
    assert.is_true(e:find("\neval: PTQ     PPL", 1, true) < e:find("qad: step 1/3", 1, true), e)
    assert.matches("\nexport: [^\n]*/qs written in %d+ s\n", e)
    assert.is_truthy(nbspec.read(tmp .. "/qs/model.safetensors"))
    -- a second run reuses the sampled text
    local _, e2, rc2 = nbspec.nibble { "run", src .. "/recipes/quickstart.lua", "model=" .. stories, "prompts=2",
      "samples=4", "eval_samples=4", "tokens=40", "steps=3", "batch=2", "seq_len=32", "out=" .. tmp .. "/qs2",
      "cache=" .. tmp .. "/qs-cache" }
    assert.are.equal(0, rc2, e2)
    assert.matches("%(cached%)", e2)
    assert.are.equal(nbspec.read(tmp .. "/qs/model.safetensors"), nbspec.read(tmp .. "/qs2/model.safetensors"))
  end)
end)

describe("nibble run recipes/qad.lua on stories260K", function()
  local base_args
  local function args(extra)
    local a = { "run", src .. "/recipes/qad.lua", "model=" .. stories, "data=" .. train, "eval_data=" .. valid,
                "steps=24", "batch=4", "seq_len=128", "lr=3e-4", "ctx=128", "chunks=4", "seed=3" }
    for _, x in ipairs(extra) do a[#a + 1] = x end
    return a
  end

  local function files(dir)
    local out = {}
    for _, n in ipairs { "model.safetensors", "config.json", "hf_quant_config.json" } do out[n] = nbspec.read(dir .. "/" .. n) end
    return out
  end

  local ref
  it("trains, prints the eval table, writes metrics JSONL and the export; nibble plot draws it", function()
    if not need(stories, train, valid) then return end
    local out, e, rc = nbspec.nibble(args { "out=" .. tmp .. "/ref", "metrics=" .. tmp .. "/ref.jsonl" })
    assert.are.equal(0, rc, e)
    local t_ppl = out:match("teacher%s+([%d%.]+)")
    local p_ppl, p_kld = out:match("PTQ%s+([%d%.]+)%s+([%d%.]+)")
    local q_ppl, q_kld = out:match("QAD%s+([%d%.]+)%s+([%d%.]+)")
    assert.is_truthy(t_ppl and p_ppl and q_ppl, out)
    assert.is_true(tonumber(q_kld) < tonumber(p_kld), out)
    assert.matches("qad: step 24/24", e)
    local lines = {}
    for l in io.lines(tmp .. "/ref.jsonl") do lines[#lines + 1] = nibble.json.decode(l) end
    assert.are.equal(26, #lines)   -- eval at step 0, 24 steps, eval at the end
    assert.are.equal(0, lines[1].step)
    assert.is_truthy(lines[1].eval_kld)
    assert.are.equal(1, lines[2].step)
    for _, k in ipairs { "loss", "kd", "ce", "lr", "grad_norm", "tokens_per_s", "tokens" } do
      assert.is_truthy(lines[2][k], k)
    end
    assert.are.equal(24, lines[26].step)
    assert.are.equal(tonumber(q_kld), tonumber(("%.5f"):format(lines[26].eval_kld)))
    ref = files(tmp .. "/ref")
    assert.is_truthy(ref["model.safetensors"] and ref["hf_quant_config.json"])
    local po, pe, prc = nbspec.nibble { "plot", tmp .. "/ref.jsonl", "--out", tmp .. "/ref.svg" }
    assert.are.equal(0, prc, pe)
    assert.matches("9 panels", po)
    local svg = nbspec.read(tmp .. "/ref.svg")
    assert.matches("^<%?xml", svg)
    assert.matches("<polyline", svg)
    assert.matches(">eval_kld<", svg)
    local _, pe2, prc2 = nbspec.nibble { "plot", tmp .. "/ref.jsonl" }
    assert.are.equal(1, prc2)
    assert.matches("usage: nibble plot", pe2)
  end)

  -- After a resume, the metrics hold every step once, in order, and the evals at 0 and 24 once.
  local function assert_steps_once(path)
    local steps, evals = {}, {}
    for l in io.lines(path) do
      local t = nibble.json.decode(l)
      if t.loss then steps[#steps + 1] = t.step else evals[#evals + 1] = t.step end
    end
    local want = {}
    for i = 1, 24 do want[i] = i end
    assert.are.same(want, steps)
    assert.are.same({ 0, 24 }, evals)
  end

  -- Run in the background; once the metrics file shows step k (random), send the signal.
  local function interrupted_run(name, sig, k, extra)
    local metrics = tmp .. "/" .. name .. ".jsonl"
    local a = args(extra)
    a[#a + 1] = "out=" .. tmp .. "/" .. name
    a[#a + 1] = "metrics=" .. metrics
    local parts = {}
    for _, x in ipairs(a) do parts[#parts + 1] = nbspec.quote(x) end
    local cmd = ("%s %s >%s.log 2>&1 & pid=$!; n=0; "
      .. "while [ \"$(cat %s 2>/dev/null | grep -c '\"loss\"')\" -lt %d ] && [ $n -lt 3000 ] && kill -0 $pid 2>/dev/null; do "
      .. "sleep 0.01; n=$((n+1)); done; kill -%s $pid; wait $pid; echo rc=$?"):format(
      nbspec.quote(nbspec.bin), table.concat(parts, " "), nbspec.quote(tmp .. "/" .. name), nbspec.quote(metrics), k, sig)
    local out = nbspec.sh(cmd)
    return tonumber(out:match("rc=(%d+)")), nbspec.read(tmp .. "/" .. name .. ".log") or ""
  end

  it("Ctrl-C saves a checkpoint; resume=true ends with the same export bytes", function()
    if not need(stories, train, valid) or not ref then return end
    math.randomseed(os.time())
    local k = math.random(3, 15)
    local rc, log = interrupted_run("int", "INT", k, {})
    if rc == 0 then pending("the run finished before the signal") return end
    assert.are.equal(130, rc, log)
    assert.matches("interrupted; checkpoint of step %d+ saved", log)
    assert.matches("\nnibble: interrupted\n$", log)   -- the friendly line, then one line and no traceback
    assert.falsy(log:find("stack traceback", 1, true), log)
    assert.is_nil(nbspec.read(tmp .. "/int/model.safetensors"))
    local _, e, rc2 = nbspec.nibble(args { "out=" .. tmp .. "/int", "metrics=" .. tmp .. "/int.jsonl", "resume=true" })
    assert.are.equal(0, rc2, e)
    assert.matches("resumed from .*step%-", e)
    assert.are.same(ref, files(tmp .. "/int"))
    assert_steps_once(tmp .. "/int.jsonl")
  end)

  it("SIGKILL with checkpoint_every=1: resume=true ends with the same export bytes", function()
    if not need(stories, train, valid) or not ref then return end
    local k = math.random(2, 18)
    local rc, log = interrupted_run("kill", "KILL", k, { "checkpoint_every=1" })
    if rc == 0 then pending("the run finished before the signal") return end
    assert.are.equal(137, rc, log)
    local _, e, rc2 = nbspec.nibble(args { "out=" .. tmp .. "/kill", "resume=true", "checkpoint_every=1",
                                           "metrics=" .. tmp .. "/kill.jsonl" })
    assert.are.equal(0, rc2, e)
    assert.matches("resumed from .*step%-", e)
    assert.are.same(ref, files(tmp .. "/kill"))
    assert_steps_once(tmp .. "/kill.jsonl")
  end)
end)

-- nibble.model and `nibble eval` / `nibble generate`: stories260K from ../shared/data (pending when
-- absent) and the transformers golden models in tests/golden/data (always there). Reference numbers:
-- the README of ../shared/data (PPL 3.8666 on 100 chunks, the greedy continuation from BOS) and
-- tests/golden/gen_model_golden.py (logits in float64).
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")
local need = nbspec.need
local err_of = nbspec.err_of

local stories_hf = nbspec.data("stories260K/hf")
local stories_gguf = nbspec.data("stories260K/stories260K.gguf")
local valid = nbspec.data("text/tinystories_valid_head_776KiB.txt")
local greedy_txt = nbspec.data("stories260K/reference/greedy_from_bos_200.txt")
local golden = nbspec.source_dir .. "/tests/golden/data"

describe("nibble.model", function()
  it("loads the golden Qwen3 and matches transformers' logits", function()
    local m = nibble.model(golden .. "/model_qwen3")
    assert.is_true(nibble.model.is_model(m))
    assert.are.equal("qwen3", m.arch)
    assert.are.equal("hf", m.format)
    assert.is_true(m.tied)
    assert.is_true(m.config.qk_norm)
    assert.are.equal(16, m.config.head_dim)
    local g = nibble.json.decode(nbspec.read(golden .. "/model_qwen3/golden.json"))
    local rows = {}
    for b = 1, g.B do
      rows[b] = {}
      for t = 1, g.T do rows[b][t] = g.ids[(b - 1) * g.T + t] end
    end
    local logits, hidden = m:forward(rows, { hidden = true })
    assert.are.same({ g.B * g.T, g.vocab_size }, { logits:size(1), logits:size(2) })
    local ref = nbspec.read(golden .. "/model_qwen3/logits_f32le.bin")
    local rp = ffi.cast("const float *", ref)
    local lp = logits:data("float *")
    local worst = 0
    for i = 0, g.B * g.T * g.vocab_size - 1 do worst = math.max(worst, math.abs(lp[i] - rp[i])) end
    assert.is_true(worst <= 1e-4, "max abs error " .. worst)
    assert.are.equal(g.n_layers + 1, #hidden)
    -- the last position only
    local last = m:forward(rows[1], { last = true })
    assert.are.same({ 1, g.vocab_size }, { last:size(1), last:size(2) })
    assert.is_true(math.abs(last:get(1, 1) - rp[(g.T - 1) * g.vocab_size]) < 1e-4)
    -- the same loss transformers computed, and gradients land in the parameters' grads
    assert.is_nil(m:grad("model.norm.weight"))
    local loss = m:lm_step(rows)
    assert.is_true(math.abs(loss - g.loss) < 1e-5, ("loss %.7f vs %.7f"):format(loss, g.loss))
    assert.is_true(m:grad("model.norm.weight"):absmax() > 0)
    m:free()
  end)

  it("lists modules and parameters by name and glob", function()
    local m = nibble.model(golden .. "/model_llama3")
    assert.are.equal("llama", m.arch)
    assert.is_false(m.tied)
    assert.are.equal("llama3", m.config.rope)
    local mlp = m:modules("*.mlp.*")
    assert.are.equal(6, #mlp)
    assert.are.equal("model.layers.0.mlp.gate_proj", mlp[1].name)
    assert.are.equal("linear", mlp[1].kind)
    assert.are.equal("gate", mlp[1].role)
    assert.are.equal(32, mlp[1].in_features)
    assert.are.equal(48, mlp[1].out_features)
    assert.are.equal(0, mlp[1].layer)
    assert.are.equal("model.layers.0.mlp.gate_proj.weight", mlp[1].weight)
    local lin = {}
    for _, r in ipairs(m:modules()) do if r.kind == "linear" then lin[#lin + 1] = r.name end end
    assert.are.equal(15, #lin)
    assert.are.equal("lm_head", lin[15])
    assert.are.equal("norm", m:module("model.norm").kind)
    assert.matches("model has no module 'model.layers.9'", err_of(m.module, m, "model.layers.9"))
    assert.are.same({ "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight" },
      m:params("*q_proj*"))
    local w = m:param("model.layers.1.self_attn.k_proj.weight")
    assert.are.same({ 8, 32 }, { w:size(1), w:size(2) })
    assert.are.equal("f32", m:src_dtype("model.norm.weight"))
    assert.matches("no parameter 'nope'", err_of(m.param, m, "nope"))
    -- the view is the model's own memory: editing it changes the logits
    local ids = { 1, 5, 9, 13 }
    local a = m:forward(ids)
    local head = m:param("lm_head.weight")
    head:fill(0)
    local b = m:forward(ids)
    assert.are.equal(0, b:absmax())
    assert.is_true(a:absmax() > 0)
    assert.are.equal(4, m:requires_grad("*.self_attn.[qk]_proj.*", false))
  end)

  it("builds a model in memory and runs Lua hooks", function()
    local m = nibble.model.new({ arch = "qwen2", vocab_size = 40, hidden_size = 16, intermediate_size = 24,
                                 n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 4, qkv_bias = true },
                               { seed = 5, std = 0.3 })
    assert.are.equal("qwen2", m.arch)
    assert.are.equal("memory", m.format)
    local ids = { { 1, 2, 3, 4, 5 }, { 6, 7, 8, 9, 10 } }
    local ref = m:forward(ids)
    local seen, passes = 0, {}
    m:set_hook("model.layers.1.mlp.down_proj", {
      input = function(x, rows, cols, pass) seen = seen + rows; passes[#passes + 1] = pass end,
      weight = function(w, out, rows, cols) for i = 0, rows * cols - 1 do out[i] = 2 * w[i] end end,
    })
    local hooked = m:forward(ids)
    assert.are.equal(10, seen)
    assert.is_true(hooked:max_abs_diff(ref) > 1e-3)
    m:lm_step(ids)
    assert.are.same({ 0, 0 }, passes)      -- small enough: the backward reuses the forward's activations
    m:set_recompute(true)
    m:lm_step(ids)
    assert.are.same({ 0, 0, 0, 1 }, passes) -- the training forward and the backward's recompute
    m:set_hook("model.layers.1.mlp.down_proj", nil)
    assert.are.equal(0, m:forward(ids):max_abs_diff(ref))
    assert.matches("unknown arch 'gpt2'", err_of(nibble.model.new, { arch = "gpt2" }))
    assert.matches("NB_ERR_INVALID: forward: token id 40", err_of(m.forward, m, { 1, 40 }))
  end)

  it("evaluates stories260K with llama.cpp's method (PPL 3.8666)", function()
    if not need(stories_gguf, stories_hf, valid) then return end
    local m = nibble.model(stories_gguf)
    local r = m:eval({ data = valid, ctx = 512, chunks = 100 })
    assert.is_true(math.abs(r.ppl - 3.8666) <= 0.0005, "ppl " .. r.ppl)
    assert.are.equal(25500, r.tokens)
    assert.are.equal(100, r.chunks)
    assert.is_nil(r.kld)
    local t = nibble.model(stories_hf)
    local r2 = m:eval({ data = valid, chunks = 4, teacher = t })
    assert.is_true(math.abs(r2.kld) < 1e-9)
    assert.are.equal(100, r2.top1)
    -- progress: called after each batch of chunks (batch 3: 3, 6, 8 of 8); the numbers do not change;
    -- an error in it stops the eval and is raised as it was (it does not unwind through C)
    local seen = {}
    local r3 = m:eval({ data = valid, ctx = 512, chunks = 8, batch = 3,
                        progress = function(done, total) seen[#seen + 1] = done .. "/" .. total end })
    assert.are.same({ "3/8", "6/8", "8/8" }, seen)
    assert.are.equal(m:eval({ data = valid, ctx = 512, chunks = 8, batch = 3 }).nll, r3.nll)
    local ok, err = pcall(m.eval, m, { data = valid, ctx = 512, chunks = 8, batch = 3,
                                       progress = function() error("stop here", 0) end })
    assert.is_false(ok)
    assert.are.equal("stop here", err)
    assert.are.equal(100, m:eval({ data = valid, chunks = 2, teacher = t }).top1)   -- still usable after
  end)

  it("generates the reference greedy continuation from BOS", function()
    if not need(stories_hf, greedy_txt) then return end
    local m = nibble.model(stories_hf)
    local text, ids = m:generate({ n = 200, greedy = true })
    assert.are.equal(200, #ids)
    assert.are.equal(nbspec.read(greedy_txt), text)
    local pieces = {}
    local t2 = m:generate({ prompt = "Lily and Tom", n = 20, greedy = true, on_text = function(s) pieces[#pieces + 1] = s end })
    assert.are.equal(t2, table.concat(pieces))
    assert.matches("^ ", t2)   -- the space SentencePiece folds into the first new word is kept
  end)
end)

describe("nibble eval / generate", function()
  it("prints the JSON the issue asks for", function()
    if not need(stories_gguf, valid) then return end
    local out, err, code = nbspec.nibble({ "eval", "--model", stories_gguf, "--data", valid, "--ctx", "512",
                                           "--chunks", "100", "--json" })
    assert.are.equal(0, code, err)
    local j = nibble.json.decode(out)
    assert.is_true(math.abs(j.ppl - 3.8666) <= 0.0005)
    assert.are.equal(25500, j.tokens)
    assert.is_true(math.abs(j.nll - math.log(j.ppl)) < 1e-5)
    assert.are.equal(nibble.json.null, j.kld)
    assert.are.equal(nibble.json.null, j.top1)
    assert.matches('^{"ppl": [%d.]+, "nll": [%d.]+, "tokens": 25500, "kld": null, "top1": null', out)
  end)

  it("reports KL and top-1 agreement against a teacher", function()
    if not need(stories_hf, valid) then return end
    local q4 = nbspec.data("stories260K/quantized/stories260K-q4_0.gguf")
    if not need(q4) then return end
    local out, err, code = nbspec.nibble({ "eval", "-m", q4, "--teacher", stories_hf, "-f", valid, "--chunks", "100", "--json" })
    assert.are.equal(0, code, err)
    local j = nibble.json.decode(out)
    assert.is_true(math.abs(j.ppl - 4.1658) <= 0.0005, "ppl " .. tostring(j.ppl))
    assert.is_true(j.kld > 0.05 and j.kld < 0.1)
    assert.is_true(j.top1 > 80 and j.top1 < 95)
  end)

  it("generates greedily from BOS", function()
    if not need(stories_hf, greedy_txt) then return end
    local out, err, code = nbspec.nibble({ "generate", "--model", stories_hf, "--greedy", "-n", "200" })
    assert.are.equal(0, code, err)
    assert.are.equal(nbspec.read(greedy_txt) .. "\n", out)
    out, err, code = nbspec.nibble({ "generate", "--model", stories_hf, "--greedy", "-n", "5", "--ids" })
    assert.are.equal(0, code, err)
    assert.matches("^%d+ %d+ %d+ %d+ %d+\n$", out)
  end)

  it("names bad arguments and bad models", function()
    local out, err, code = nbspec.nibble({ "eval", "--model", golden .. "/model_qwen2" })
    assert.are.equal(1, code)
    assert.matches("^nibble eval: missing %-%-data FILE\nusage: nibble eval", err)
    out, err, code = nbspec.nibble({ "eval", "--model", "/nonexistent", "--data", "/nonexistent" })
    assert.are.equal(1, code)
    assert.matches("nibble eval: NB_ERR_IO: cannot open /nonexistent", err)
    out, err, code = nbspec.nibble({ "generate", "--model", golden .. "/model_qwen2", "--bogus" })
    assert.are.equal(1, code)
    assert.matches("unknown argument %-%-bogus", err)
    out, err, code = nbspec.nibble({ "eval", "--model", golden .. "/model_qwen2", "--data", "x", "--ctx", "0" })
    assert.are.equal(1, code)
    assert.matches("%-%-ctx needs a positive integer", err)
    local _ = out
  end)
end)

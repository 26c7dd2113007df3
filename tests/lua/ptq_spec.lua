-- nibble.ptq and nibble.qmodel end to end: recipes resolved against real models, calibration over
-- packed data with seeded offsets (same seed -> same bytes), the student's fake-quant logits equal to
-- the logits of its export read back (weights and, for W4A4 / W8A8, activations), untied lm_head
-- quantized on request (the transformers Llama-3 golden model), four_over_six beating plain NVFP4,
-- MXFP8 / FP8 / MIXED_PRECISION exports, the coverage report and the export guard from Lua.
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")
local ptq = require("nibble.ptq")
local recipe = require("nibble.recipe")
local qmodel = require("nibble.qmodel")
local C = nibble.C

local stories = nbspec.data("stories260K/hf")
local train = nbspec.data("text/tinystories_train_head_2MiB.txt")
local valid = nbspec.data("text/tinystories_valid_head_776KiB.txt")
local llama3 = nbspec.source_dir .. "/tests/golden/data/model_llama3"
local fixtures = nbspec.source_dir .. "/tests/recipes/fixtures"

local need = nbspec.need
local err_of = nbspec.err_of

local tmp = nbspec.private_dir()

-- tokens 1..T of a fixed pseudo-text (ids < vocab)
local function ids(T, vocab)
  local t = nibble.zeros("i32", 2, T)
  for b = 1, 2 do
    for i = 1, T do t:set(b, i, i == 1 and 1 or (i * 37 + b * 11) % vocab) end
  end
  return t
end

local function logits(m, toks)
  return (m:forward(toks))
end

local function st_info(dir)
  local w = nibble.load(dir)
  local out = {}
  for _, name in ipairs(w:names()) do out[name] = w:info(name) end
  w:close()
  return out
end

local function json_file(path) return nibble.json.decode(nbspec.read(path)) end

local function quiet_run(r, args, opts)
  opts = opts or {}
  opts.quiet = true
  return ptq.run(r, args, opts)
end

describe("ptq on stories260K", function()
  it("W4A16: plan, export, and read-back logits equal to the student's fake quant", function()
    if not need(stories) then return end
    local out = tmp .. "/w4a16"
    -- export.dtype f32: the unquantized tensors as the student holds them (the default rounds this F32
    -- model's to BF16), so the read-back logits are the student's bit for bit
    local res = quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories },
                                      export = { dir = out, dtype = "f32" } })
    local n = 0
    for _, e in ipairs(res.plan) do if e.format then n = n + 1 end end
    assert.are.equal(30, n)
    assert.are.equal(30, res.weight_error.modules)
    assert.is_nil(res.calib_samples)   -- weight-only: no forward passes
    local toks = ids(64, 512)
    -- ptq.run leaves the model running with fake quant (as ModelOpt's quantize does)
    assert.is_true(res.fake)
    assert.is_true(res.qmodel:fake())
    local a = logits(res.model, toks)
    res.qmodel:set_fake(false)
    assert.is_false(res.qmodel:fake())
    local plain = logits(res.model, toks)
    local back = nibble.model.load(out)
    local b = logits(back, toks)
    assert.are.equal(0, a:max_abs_diff(b))
    assert.is_true(a:max_abs_diff(plain) > 1e-3)
    local info = st_info(out)
    assert.are.equal("U8", info["model.layers.0.self_attn.q_proj.weight"].dtype)
    assert.are.same({ 64, 32 }, { info["model.layers.0.self_attn.q_proj.weight"].shape[1],
                                  info["model.layers.0.self_attn.q_proj.weight"].shape[2] })
    assert.are.equal("F32", info["model.layers.0.mlp.down_proj.weight"].dtype)
    local hq = json_file(out .. "/hf_quant_config.json")
    assert.are.equal("W4A16_NVFP4", hq.quantization.quant_algo)
  end)

  it("calibration rows come from the seed: same seed, same bytes; offsets as nb_data_offset says", function()
    if not need(stories, train) then return end
    local function run(seed, dir)
      return quiet_run(recipe.new {
        extends = "units/nvfp4", model = { path = stories },
        calibration = { data = train, samples = 12, seq_len = 96, batch = 5, random_offset = true, seed = seed },
        export = { dir = dir } })
    end
    local r1, r2, r3 = run(7, tmp .. "/s7a"), run(7, tmp .. "/s7b"), run(8, tmp .. "/s8")
    assert.are.equal(12, r1.calib_samples)
    assert.are.equal(12 * 96, r1.calib_tokens)
    assert.are.equal(tonumber(C.nb_data_offset(7, 0, 96)), r1.calib_offset)
    assert.are.equal(tonumber(C.nb_data_offset(8, 0, 96)), r3.calib_offset)
    assert.are_not.equal(r1.calib_offset, r3.calib_offset)
    local a, b, c = nbspec.read(tmp .. "/s7a/model.safetensors"), nbspec.read(tmp .. "/s7b/model.safetensors"),
                    nbspec.read(tmp .. "/s8/model.safetensors")
    assert.is_true(a == b)
    assert.is_false(a == c)   -- other rows, other input amaxes
    assert.are.same({}, r1.uncovered)
    -- the input scales of siblings are shared (fused), and differ between the two seeds
    local q1 = qmodel.probe(tmp .. "/s7a", "model.layers.1.self_attn.q_proj")
    local v1 = qmodel.probe(tmp .. "/s7a", "model.layers.1.self_attn.v_proj")
    local q3 = qmodel.probe(tmp .. "/s8", "model.layers.1.self_attn.q_proj")
    assert.are.equal("nvfp4", q1.input_format)
    assert.are.equal(q1.input_scale, v1.input_scale)
    assert.are_not.equal(q1.input_scale, q3.input_scale)
  end)

  for _, case in ipairs { { "nvfp4", "W4A4 NVFP4" }, { "fp8", "W8A8 FP8" } } do
    it(case[2] .. ": read-back with the export's activation scales equals the calibrated student", function()
      if not need(stories, train) then return end
      for _, layout in ipairs { "modelopt", "compressed-tensors" } do
        local out = tmp .. "/act-" .. case[1] .. "-" .. layout
        local res = quiet_run(recipe.new {
          extends = "units/" .. case[1], model = { path = stories },
          calibration = { data = train, samples = 8, seq_len = 128, batch = 4, seed = 1 },
          export = { dir = out, layout = layout, dtype = "f32" } })   -- the student's own precision
        local toks = ids(64, 512)
        res.qmodel:set_fake(true)
        local a = logits(res.model, toks)
        local back = nibble.model.load(out)
        local w_only = logits(back, toks)
        local aq, n = qmodel.activations(back)
        assert.are.equal(case[1] == "fp8" and 35 or 30, n)
        local b = logits(back, toks)
        if layout == "modelopt" then
          assert.are.equal(0, a:max_abs_diff(b))
        else
          -- CT stores 1/scale for NVFP4 (one ulp away after inversion) and FP8 scales in the model dtype
          assert.is_true(a:max_abs_diff(b) < 1e-4 * a:absmax(), case[1] .. " " .. a:max_abs_diff(b))
        end
        assert.is_true(a:max_abs_diff(w_only) > 1e-4)   -- the activations matter
        aq:free()
      end
    end)
  end

  it("FP8 KV cache: k_scale / v_scale per layer; the read-back applies them, as the student did", function()
    if not need(stories, train) then return end
    for _, layout in ipairs { "modelopt", "compressed-tensors" } do
      local out = tmp .. "/kv-" .. layout
      local res = quiet_run(recipe.new {
        extends = { "units/nvfp4_w4a16", "units/kv_fp8" }, model = { path = stories },
        calibration = { data = train, samples = 8, seq_len = 128, batch = 4, seed = 1 },
        export = { dir = out, layout = layout, dtype = "f32" } })   -- the student's own precision
      assert.are.equal("fp8", res.kv_cache)
      local qm = res.qmodel
      assert.are.equal("fp8", qm:kv_format())
      assert.is_true(qm:needs_data())
      local info = st_info(out)
      for l = 0, 4 do
        for _, w in ipairs { "k", "v" } do
          local name = layout == "modelopt" and ("model.layers.%d.self_attn.%s_proj.%s_scale"):format(l, w, w)
                       or ("model.layers.%d.self_attn.%s_scale"):format(l, w)
          assert.are.equal("F32", info[name].dtype, name)
          assert.are.equal(layout == "modelopt" and 0 or 1, #info[name].shape, name)
          local amax = qm:kv_quantizer(l, w):state().amax
          local want = ffi.new("float[1]", amax)
          want[0] = want[0] / 448
          local got = nibble.load(out)[name]:data("const float *")[0]
          assert.are.equal(want[0], got, name)
        end
      end
      local toks = ids(64, 512)
      res.qmodel:set_fake(true)
      local a = logits(res.model, toks)
      res.qmodel:set_fake(false)
      local back = nibble.model.load(out)
      local w_only = logits(back, toks)
      local aq, n, nkv = qmodel.activations(back)
      assert.are.equal(0, n)
      assert.are.equal(5, nkv)
      assert.are.equal("fp8", aq:kv_format())
      local b = logits(back, toks)
      if layout == "modelopt" then
        assert.are.equal(0, a:max_abs_diff(b))
      else
        assert.is_true(a:max_abs_diff(b) < 1e-4 * a:absmax(), "ct " .. a:max_abs_diff(b))
      end
      assert.is_true(a:max_abs_diff(w_only) > 1e-4)   -- the FP8 cache matters
      aq:free()
      -- kv = false: weights only
      local aq2, n2, nkv2 = qmodel.activations(back, nil, { kv = false })
      assert.is_nil(aq2)
      assert.are.equal(0, n2)
      assert.are.equal(0, nkv2)
      assert.are.equal(0, w_only:max_abs_diff(logits(back, toks)))
    end
    -- the CLI runs an export as it ships, and says so; --no-kv-quant keeps the cache in float
    local kvdir = tmp .. "/kv-modelopt"
    local gen = { "generate", "--model", kvdir, "--prompt", "Once upon a time", "-n", "100", "--greedy", "--ids", "--no-stop" }
    local g1, e1, c1 = nbspec.nibble(gen)
    gen[#gen + 1] = "--no-kv-quant"
    local g2, e2, c2 = nbspec.nibble(gen)
    assert.are.equal(0, c1, e1)
    assert.are.equal(0, c2, e2)
    assert.are.equal("nibble generate: KV cache quantized as exported (FP8, 5 layers; --no-kv-quant to turn off)\n", e1)
    assert.are.equal("", e2)
    assert.are_not.equal(g1, g2)   -- the greedy continuation changes with the FP8 cache
    if valid then
      local ev = { "eval", "--model", kvdir, "--data", valid, "--ctx", "128", "--chunks", "2", "--json" }
      local j1, f1 = nbspec.nibble(ev)
      ev[#ev + 1] = "--no-kv-quant"
      local j2, f2 = nbspec.nibble(ev)
      assert.truthy(f1:find("KV cache quantized as exported (FP8, k_scale / v_scale of 5 layers", 1, true), f1)
      assert.truthy(f2:find("KV cache not quantized (--no-kv-quant)", 1, true), f2)
      local p1, p2 = j1:match('"ppl": ([%d.]+)'), j2:match('"ppl": ([%d.]+)')
      assert.truthy(p1 and p2, j1 .. j2)
      assert.are_not.equal(p1, p2)
    else
      nbspec.skip_part("the eval with and without the FP8 cache")
    end
    -- a checkpoint with the scales of only some layers is refused, naming the first missing one
    local dir = tmp .. "/kv-partial"
    os.execute(("cp -r %s %s"):format(nbspec.quote(tmp .. "/kv-modelopt"), nbspec.quote(dir)))
    local full = nibble.load(tmp .. "/kv-modelopt/model.safetensors")
    local wo = ffi.new("nb_st_writer *[1]")
    nibble.check(C.nb_st_writer_new(nibble.ctx, wo))
    local wr = ffi.gc(wo[0], C.nb_st_writer_free)
    for name, t in full:pairs() do
      if name ~= "model.layers.3.self_attn.v_proj.v_scale" then nibble.check(C.nb_st_writer_add(nibble.ctx, wr, name, t.ptr)) end
    end
    nibble.check(C.nb_st_writer_write(nibble.ctx, wr, dir .. "/model.safetensors"))
    local back = nibble.model.load(dir)
    assert.matches("the checkpoint has KV cache scales for some layers but no model.layers.3.self_attn v_scale",
      err_of(qmodel.activations, back), nil, true)
  end)

  it("a recipe may quantize the KV cache alone (weights stay as they are)", function()
    if not need(stories, train) then return end
    local out = tmp .. "/kv-only"
    local res = quiet_run(recipe.new {
      extends = "units/kv_fp8", model = { path = stories },
      calibration = { data = train, samples = 8, seq_len = 128, batch = 4, seed = 1 }, export = { dir = out } })
    assert.are.equal("fp8", res.kv_cache)
    local q = json_file(out .. "/hf_quant_config.json").quantization
    assert.are.equal(nibble.json.null, q.quant_algo)
    assert.are.equal("FP8", q.kv_cache_quant_algo)
    local info = st_info(out)
    assert.are.equal("F32", info["model.layers.4.self_attn.v_proj.v_scale"].dtype)
    for name, e in pairs(info) do
      assert.is_nil(name:match("weight_scale"), name)
      if name:match("%.weight$") then assert.are.equal("BF16", e.dtype, name) end   -- F32 source: BF16 by default
    end
    local back = nibble.model.load(out)
    local toks = ids(64, 512)
    local plain = logits(back, toks)
    local aq, n, nkv = qmodel.activations(back)
    assert.are.equal(0, n)
    assert.are.equal(5, nkv)
    assert.is_true(plain:max_abs_diff(logits(back, toks)) > 1e-4)
    aq:free()
  end)

  it("a recipe that excludes every module (and no KV cache) is refused, pointing at nibble plan", function()
    if not need(stories) then return end
    assert.matches("recipe: no module is quantized (every linear module is excluded); see nibble plan",
      err_of(quiet_run, recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories },
                                     quantize = { { "*", false } }, export = { dir = tmp .. "/never" } }), nil, true)
  end)

  it("a KV cache recipe without calibration data is refused before any compute", function()
    if not need(stories) then return end
    assert.matches("this recipe quantizes activations or the KV cache, so it needs calibration data",
      err_of(quiet_run, recipe.new { extends = { "units/nvfp4_w4a16", "units/kv_fp8" }, model = { path = stories },
                                     export = { dir = tmp .. "/never" } }), nil, true)
  end)

  it("an occupied out folder is refused before the model is loaded or any data read; an earlier export is not", function()
    if not need(stories) then return end
    local busy = tmp .. "/busy"
    os.execute("mkdir -p " .. nbspec.quote(busy))
    nbspec.write(busy .. "/notes.txt", "my notes\n")
    local want = "export: " .. busy .. " exists and is not a nibble export (it holds notes.txt): remove it or choose "
                 .. "another output directory"
    -- neither the model nor the calibration file exists: the refusal must come before either is opened
    local r = recipe.new { extends = "units/nvfp4", model = { path = tmp .. "/no-such-model" },
                           calibration = { data = tmp .. "/no-such-calib.txt" }, export = { dir = busy } }
    assert.are.equal(want, err_of(quiet_run, r))
    assert.are.equal("my notes\n", nbspec.read(busy .. "/notes.txt"))
    -- the command line says it once, on one line, and exits non-zero; the folder is untouched
    local out, err, rc = nbspec.nibble { "quantize", "--model", stories, "--format", "nvfp4", "--calib",
                                         tmp .. "/no-such-calib.txt", "--out", busy }
    assert.are_not.equal(0, rc)
    assert.truthy(err:find(want, 1, true), err)
    assert.falsy(err:find("calibration", 1, true), err)
    assert.are.equal("", out)
    assert.are.equal("my notes\n", nbspec.read(busy .. "/notes.txt"))
    -- a dry run (a plan) does not ask
    assert.truthy(quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories },
                                         export = { dir = busy } }, nil, { dry_run = true }).plan)
    -- an earlier export is replaced
    local again = tmp .. "/again"
    quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories }, export = { dir = again } })
    local first = nbspec.read(again .. "/model.safetensors")
    local res = quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories },
                                       export = { dir = again } })
    assert.are.equal(again, res.export_dir)
    assert.is_true(first == nbspec.read(again .. "/model.safetensors"))
  end)

  it("four_over_six lowers the weight error and the perplexity against plain NVFP4", function()
    if not need(stories, valid) then return end
    local plain = quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories },
                                        export = { dir = tmp .. "/plain" } })
    local fos = quiet_run(recipe.new { extends = "units/nvfp4_4o6", model = { path = stories },
                                      export = { dir = tmp .. "/4o6" } })
    assert.are.equal("four_over_six", fos.algorithm)
    assert.is_true(fos.weight_error.rel < plain.weight_error.rel,
      ("4/6 %g vs plain %g"):format(fos.weight_error.rel, plain.weight_error.rel))
    local function ppl(dir)
      return nibble.model.load(dir):eval { data = valid, ctx = 512, chunks = 20 }.ppl
    end
    local p_plain, p_fos = ppl(tmp .. "/plain"), ppl(tmp .. "/4o6")
    assert.is_true(p_fos < p_plain, ("4/6 PPL %g vs plain %g"):format(p_fos, p_plain))
    -- 4/6 keeps NVFP4 bytes on disk: a plain NVFP4 loader reads it
    assert.are.equal("nvfp4", qmodel.probe(tmp .. "/4o6", "model.layers.0.mlp.up_proj").format)
  end)

  it("exports MXFP8 and FP8 with the tensors FORMATS §3.4 lists", function()
    if not need(stories, train) then return end
    quiet_run(recipe.new { extends = "units/mxfp8", model = { path = stories }, export = { dir = tmp .. "/mx" } })
    local mx = st_info(tmp .. "/mx")
    local w, s = mx["model.layers.2.mlp.gate_proj.weight"], mx["model.layers.2.mlp.gate_proj.weight_scale"]
    assert.are.equal("F8_E4M3", w.dtype)
    assert.are.same({ 172, 64 }, { w.shape[1], w.shape[2] })
    assert.are.equal("U8", s.dtype)
    assert.are.same({ 172, 2 }, { s.shape[1], s.shape[2] })
    assert.is_nil(mx["model.layers.2.mlp.gate_proj.input_scale"])
    assert.are.equal("MXFP8", json_file(tmp .. "/mx/hf_quant_config.json").quantization.quant_algo)
    quiet_run(recipe.new { extends = "units/fp8", model = { path = stories }, export = { dir = tmp .. "/fp8" },
                           calibration = { data = train, samples = 4, seq_len = 64 } })
    local f8 = st_info(tmp .. "/fp8")
    assert.are.equal("F8_E4M3", f8["model.layers.0.mlp.down_proj.weight"].dtype)   -- FP8 has no block: 172 is fine
    assert.are.equal("F32", f8["model.layers.0.mlp.down_proj.weight_scale"].dtype)
    assert.are.equal(0, #f8["model.layers.0.mlp.down_proj.weight_scale"].shape)
    assert.are.equal(0, #f8["model.layers.0.mlp.down_proj.input_scale"].shape)
    local hq = json_file(tmp .. "/fp8/hf_quant_config.json")
    assert.are.equal("FP8", hq.quantization.quant_algo)
    assert.are.same({ "lm_head", "model.embed_tokens" }, hq.quantization.exclude_modules)
  end)

  it("a MIXED_PRECISION recipe (MXFP8 on *.mlp.*, NVFP4 elsewhere) exports and reads back", function()
    if not need(stories) then return end
    local out = tmp .. "/mixed"
    local r = recipe.load(fixtures .. "/mixed.lua", { model = stories, out = out })
    r.export.dtype = "f32"   -- the student's own precision: read-back logits bit for bit
    local res = quiet_run(r)
    local hq = json_file(out .. "/hf_quant_config.json")
    assert.are.equal("MIXED_PRECISION", hq.quantization.quant_algo)
    local ql = hq.quantization.quantized_layers
    assert.are.same({ quant_algo = "MXFP8", group_size = 32 }, ql["model.layers.3.mlp.up_proj"])
    assert.are.same({ quant_algo = "W4A16_NVFP4", group_size = 16 }, ql["model.layers.3.self_attn.o_proj"])
    assert.is_nil(ql["model.layers.3.mlp.down_proj"])
    local cfg = json_file(out .. "/config.json")
    assert.are.equal("MIXED_PRECISION", cfg.quantization_config.quant_algo)
    local toks = ids(48, 512)
    res.qmodel:set_fake(true)
    local a = logits(res.model, toks)
    local b = logits(nibble.model.load(out), toks)
    assert.are.equal(0, a:max_abs_diff(b))
    assert.are.equal("mxfp8", qmodel.probe(out, "model.layers.3.mlp.up_proj").format)
    assert.are.equal("nvfp4", qmodel.probe(out, "model.layers.3.self_attn.o_proj").format)
  end)
end)

describe("plans without weights", function()
  it("model.modules_of / read_config (config + file headers) equal the loaded model's modules and config", function()
    local paths = { llama3, nbspec.source_dir .. "/tests/golden/data/model_qwen3",
                    nbspec.source_dir .. "/tests/golden/moe/mixtral", nbspec.source_dir .. "/tests/golden/moe/qwen3moe_norm" }
    if not stories then
      nbspec.skip_part("the plans of stories260K's HF folder and GGUF")
    else
      paths[#paths + 1] = stories
      paths[#paths + 1] = nbspec.shared .. "/stories260K/stories260K.gguf"
      paths[#paths + 1] = stories .. "/model.safetensors"
    end
    for _, path in ipairs(paths) do
      local m = nibble.model.load(path)
      assert.are.same(ptq.modules(m), nibble.model.modules_of(path), path)
      assert.are.same(m.config, nibble.model.read_config(path), path)
    end
    -- the qwen3 model has q/k norms, the llama3 one an untied lm_head
    local q3 = nibble.model.modules_of(nbspec.source_dir .. "/tests/golden/data/model_qwen3")
    assert.are.equal("norm", q3[6].kind)
    assert.matches("self_attn.q_norm$", q3[6].name)
    assert.is_false(nibble.model.modules_of(llama3)[#nibble.model.modules_of(llama3)].tied)
    assert.matches("cannot open /nonexistent", err_of(nibble.model.read_config, "/nonexistent"), nil, true)
  end)

  it("plans a mixture of experts: every expert linear quantized, routers excluded, mlp_only layers dense", function()
    local moe = nbspec.source_dir .. "/tests/golden/moe/qwen3moe_norm"
    local plan = {}
    for _, e in ipairs(recipe.resolve(recipe.compose(recipe.new { extends = "units/nvfp4_w4a16" }),
                                      nibble.model.modules_of(moe))) do plan[e.name] = e end
    assert.are.equal("nvfp4_w4a16", plan["model.layers.0.mlp.experts.7.down_proj"].format)
    assert.are.equal("nvfp4_w4a16", plan["model.layers.2.mlp.experts.0.gate_proj"].format)
    assert.are.equal("nvfp4_w4a16", plan["model.layers.1.mlp.gate_proj"].format)   -- mlp_only_layers = [1]
    assert.is_nil(plan["model.layers.1.mlp.gate"])
    assert.is_nil(plan["model.layers.0.mlp.gate"].format)
    assert.are.equal("MoE gate (default exclusion)", plan["model.layers.0.mlp.gate"].reason)
    local m = nibble.model.load(moe)
    assert.are.same({ 1 }, m.config.mlp_only_layers)
    assert.are.equal(8, m.config.n_experts)
    assert.is_true(m.config.norm_topk_prob)
    local up = m:module("model.layers.2.mlp.experts.5.up_proj")
    assert.are.equal("expert_up", up.role)
    assert.are.equal(5, up.expert)
    assert.are.equal(2, up.layer)
  end)

  it("a dry run loads no weight: the plan of a checkpoint whose weights nb_model_load refuses", function()
    if not need(stories) then return end
    -- model.safetensors with the embedding's dtype changed to I32 in the header (same size): loading
    -- fails on that weight, planning never looks at it
    local dir = tmp .. "/bad-weights"
    os.execute("mkdir -p " .. nbspec.quote(dir))
    os.execute(("cp %s/config.json %s/"):format(nbspec.quote(stories), nbspec.quote(dir)))
    local st = nbspec.read(stories .. "/model.safetensors")
    local bad, k = st:gsub('("model%.embed_tokens%.weight":{"dtype":")F32', "%1I32", 1)
    assert.are.equal(1, k)
    local f = assert(io.open(dir .. "/model.safetensors", "wb"))
    f:write(bad)
    f:close()
    assert.matches("model.embed_tokens: the weight is I32", err_of(nibble.model.load, dir), nil, true)
    local r = ptq.run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = dir } }, nil,
                      { dry_run = true, quiet = true })
    assert.is_nil(r.model)
    local full = ptq.run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories } }, nil,
                         { dry_run = true, quiet = true, model = nibble.model.load(stories) })
    assert.are.equal(recipe.format_plan(full.plan), recipe.format_plan(r.plan))
  end)

  it("the recipe's threads sets the thread count", function()
    if not need(stories) then return end
    local before = nibble.threads()
    ptq.run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = stories }, threads = 1 }, nil,
            { dry_run = true, quiet = true })
    assert.are.equal(1, nibble.threads())
    nibble.set_threads(before)
  end)
end)

describe("the command line", function()
  it("nibble run recipes/ptq.lua and nibble quantize write the same checkpoint", function()
    if not need(stories) then return end
    local a, b = tmp .. "/cli-run", tmp .. "/cli-quantize"
    local out, err, rc = nbspec.nibble { "run", nbspec.source_dir .. "/recipes/ptq.lua", "model=" .. stories,
                                         "out=" .. a, "format=nvfp4_4o6" }
    assert.are.equal(0, rc, err)
    assert.truthy(err:find("ptq: 30 of 36 linear modules quantized, 10 fused sibling groups, algorithm four_over_six",
                           1, true), err)
    assert.truthy(err:find("weight-only formats need no data", 1, true), err)
    out, err, rc = nbspec.nibble { "quantize", "--model", stories, "--format", "nvfp4_4o6", "--out", b, "--quiet" }
    assert.are.equal(0, rc, err)
    assert.are.equal("", err)
    assert.truthy(out:find("quantized 30 modules (nvfp4_4o6, four_over_six) -> " .. b, 1, true), out)
    assert.is_true(nbspec.read(a .. "/model.safetensors") == nbspec.read(b .. "/model.safetensors"))
    assert.is_true(nbspec.read(a .. "/config.json") == nbspec.read(b .. "/config.json"))
    -- a script that returns a table that is not a recipe keeps it to itself
    local script = tmp .. "/returns.lua"
    nbspec.write(script, "print('hi') return { 1, 2, answer = 42 }\n")
    out, err, rc = nbspec.nibble { "run", script }
    assert.are.equal(0, rc, err)
    assert.are.equal("hi\n", out)
  end)

  it("shows calibration progress with samples, tokens/s and ETA", function()
    if not need(stories, train) then return end
    local _, err, rc = nbspec.nibble { "quantize", "--model", stories, "--format", "fp8", "--calib", train,
                                       "--samples", "6", "--seq-len", "64", "--batch", "2", "--out", tmp .. "/cli-fp8" }
    assert.are.equal(0, rc, err)
    assert.truthy(err:find("calibration: 6 samples of 64 tokens from " .. train .. " (batch 2, offset ", 1, true), err)
    -- stderr is not a terminal here: whole lines, not one line rewritten with \r
    assert.truthy(err:find("\ncalibrating: 6/6 samples  %d+ tok/s  ETA 0:00\n"), err)
    assert.truthy(err:find("coverage: every input quantizer saw calibration data", 1, true), err)
  end)
end)

describe("untied lm_head (transformers Llama-3 golden model)", function()
  it("stays unquantized by default and is quantized when a rule names it", function()
    local m = nibble.model.load(llama3)
    assert.is_false(m.tied)
    local mods = ptq.modules(m)
    local lm = mods[#mods]
    assert.are.same({ name = "lm_head", kind = "linear", in_features = 32, out_features = 96, tied = false }, lm)
    local def = quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = llama3 },
                                      export = { dir = tmp .. "/l3-default" } })
    assert.are.same({ "lm_head", "model.embed_tokens" },
                    json_file(tmp .. "/l3-default/hf_quant_config.json").quantization.exclude_modules)
    assert.are.equal("BF16", st_info(tmp .. "/l3-default")["lm_head.weight"].dtype)   -- F32 source: BF16
    for _, layout in ipairs { "modelopt", "compressed-tensors" } do
      local out = tmp .. "/l3-lm-" .. layout
      local res = quiet_run(recipe.new { extends = "units/nvfp4_w4a16", model = { path = llama3 },
                                        quantize = { { "lm_head", "nvfp4_w4a16" } },
                                        export = { dir = out, layout = layout, dtype = "f32" } })
      local plan = {}
      for _, e in ipairs(res.plan) do plan[e.name] = e end
      assert.are.equal("nvfp4_w4a16", plan.lm_head.format)
      local info = st_info(out)
      local wname = layout == "modelopt" and "lm_head.weight" or "lm_head.weight_packed"
      assert.are.equal("U8", info[wname].dtype)
      assert.are.same({ 96, 16 }, { info[wname].shape[1], info[wname].shape[2] })
      assert.are.equal("F8_E4M3", info["lm_head.weight_scale"].dtype)
      if layout == "modelopt" then
        local hq = json_file(out .. "/hf_quant_config.json")
        assert.are.same({ "model.embed_tokens" }, hq.quantization.exclude_modules)
      else
        local cfg = json_file(out .. "/config.json")
        assert.are.same({}, cfg.quantization_config.ignore)
      end
      local toks = ids(24, 96)
      res.qmodel:set_fake(true)
      local a = logits(res.model, toks)
      local back = nibble.model.load(out)
      assert.is_false(back.tied)
      local b = logits(back, toks)
      if layout == "modelopt" then assert.are.equal(0, a:max_abs_diff(b))
      else assert.is_true(a:max_abs_diff(b) <= 1e-5 * a:absmax()) end
    end
  end)
end)

describe("nibble.qmodel", function()
  it("names uncovered input quantizers, and the guard stops or skips them", function()
    if not need(stories) then return end
    local m = nibble.model.load(stories)
    local qm = qmodel.new(m)
    assert.are.equal(36, qm:count())
    qm:set("model.layers.0.self_attn.q_proj", { weight = "nvfp4", input = "nvfp4" })
    qm:set("model.layers.0.self_attn.k_proj", { weight = "nvfp4", input = "nvfp4" })
    qm:set("model.layers.1.mlp.up_proj", { weight = "mxfp8" })
    assert.are.same({ weight = "nvfp4", static = false, input = "nvfp4", floor = false, pass_through_bwd = true },
                    qm:spec("model.layers.0.self_attn.q_proj"))
    assert.are.equal("no rule", qm:reason("model.layers.0.self_attn.v_proj"))
    assert.is_true(qm:needs_data())
    assert.truthy(err_of(qm.set, qm, "model.layers.0.mlp.down_proj", { weight = "nvfp4" })
      :find("NB_ERR_SHAPE: model.layers.0.mlp.down_proj: in_features 172 is not divisible by the nvfp4 block size 16", 1, true))
    assert.truthy(err_of(qm.set, qm, "model.layers.0.mlp.up_proj", { weight = "nvfp4", block = 8 })
      :find("unknown spec key 'block'", 1, true))
    assert.truthy(err_of(qm.set, qm, "model.layers.0.mlp.up_proj", { weight = "nvfp5" })
      :find("unknown format nvfp5", 1, true))
    qm:calibrate_begin("max")
    qm:calibrate_end()   -- no forward pass: the inputs saw nothing
    assert.are.same({ "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj" }, qm:uncovered())
    local e = err_of(qm.export, qm, tmp .. "/guard")
    assert.truthy(e:find("NB_ERR_UNCALIBRATED: model.layers.0.self_attn.q_proj: input_quantizer is enabled but has "
                         .. "no calibrated amax", 1, true), e)
    assert.is_nil(io.open(tmp .. "/guard/config.json"))
    local skipped = qm:export(tmp .. "/guard", { allow_uncalibrated = true })
    assert.are.same({ "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj" }, skipped)
    local info = st_info(tmp .. "/guard")
    assert.are.equal("BF16", info["model.layers.0.self_attn.q_proj.weight"].dtype)   -- skipped: as unquantized
    assert.are.equal("F8_E4M3", info["model.layers.1.mlp.up_proj.weight"].dtype)
    -- weight quantizers as nibble.quant objects, sharing state with the qmodel's
    local wq = qm:weight_quantizer("model.layers.1.mlp.up_proj")
    assert.are.equal("mxfp8", wq.format)
    assert.are.equal("model.layers.1.mlp.up_proj.weight_quantizer", wq.name)
    assert.is_nil(qm:weight_quantizer("model.layers.2.mlp.up_proj"))
  end)

  it("save, restore, export: the same bytes", function()
    if not need(stories) then return end
    local m = nibble.model.load(stories)
    local qm = qmodel.new(m)
    ptq.apply(qm, recipe.resolve(recipe.compose(recipe.new { extends = "units/nvfp4_4o6" }), ptq.modules(m)))
    assert.are.equal(10, qm:fuse_siblings())
    qm:calibrate_weights("four_over_six")
    qm:export(tmp .. "/sr1")
    qm:save(tmp .. "/sr.safetensors")
    local m2 = nibble.model.load(stories)
    local qm2 = qmodel.new(m2):restore(tmp .. "/sr.safetensors")
    qm2:export(tmp .. "/sr2")
    assert.is_true(nbspec.read(tmp .. "/sr1/model.safetensors") == nbspec.read(tmp .. "/sr2/model.safetensors"))
    assert.are.equal("nvfp4_46", qm2:spec("model.layers.4.mlp.gate_proj").weight)
    assert.truthy(tostring(qm2):find("36 linear modules, 30 quantized", 1, true))
  end)

  it("parses max_shard_size like transformers", function()
    assert.are.equal(10e9, qmodel.parse_size("10GB"))
    assert.are.equal(500e6, qmodel.parse_size("500MB"))
    assert.are.equal(5 * 1024 ^ 3, qmodel.parse_size("5GiB"))
    assert.are.equal(0, qmodel.parse_size(nil))
    assert.truthy(err_of(qmodel.parse_size, "lots"):find("cannot read", 1, true))
  end)
end)

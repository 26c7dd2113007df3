-- nibble's export against nvidia-modelopt's own exporter (tests/golden/gen_export_golden.py): the
-- same stories260K weights, the same recipe (W4A16 NVFP4, W4A4 NVFP4, MXFP8, FP8, and MIXED_PRECISION:
-- MXFP8 on the MLP, NVFP4 elsewhere) and the same input
-- amaxes give the same bytes in every quantized tensor (weight, weight_scale, weight_scale_2,
-- input_scale) and the same hf_quant_config.json / quantization_config up to the producer. The FP8 KV
-- cache case (W4A16 NVFP4 + FP8_KV_CFG) also checks that nibble's own K/V calibration on the same token
-- ids finds ModelOpt's k_bmm / v_bmm amax (K after RoPE), and that k_scale / v_scale are ModelOpt's bytes.
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")
local ptq = require("nibble.ptq")
local recipe = require("nibble.recipe")
local qmodel = require("nibble.qmodel")

local stories = nbspec.data("stories260K/hf")
local golden = nbspec.source_dir .. "/tests/golden/data/modelopt_export"

local tmp = nbspec.private_dir()

-- the recipe unit that says what ModelOpt's stock config says
local units = { w4a16 = "units/nvfp4_w4a16", nvfp4 = "units/nvfp4", mxfp8 = "units/mxfp8", fp8 = "units/fp8",
                w4a16_kv = { "units/nvfp4_w4a16", "units/kv_fp8" } }

local function without_producer(t)
  local c = {}
  for k, v in pairs(t) do if k ~= "producer" then c[k] = v end end
  return c
end

local function bytes(t)
  return ffi.string(t:data(), t.nbytes)
end

-- mean NLL of positions 256..510 of ids (llama.cpp's scoring of one 512-token chunk)
local function chunk_nll(m, ids)
  local p = m:forward({ ids }):data("const float *")
  local V, s = m.config.vocab_size, 0
  for pos = 256, 510 do
    local row, mx = pos * V, -math.huge
    for j = 0, V - 1 do mx = math.max(mx, p[row + j]) end
    local z = 0
    for j = 0, V - 1 do z = z + math.exp(p[row + j] - mx) end
    s = s + math.log(z) + mx - p[row + ids[pos + 2]]
  end
  return s / 255
end

describe("FP8 KV cache fake quant equals ModelOpt's", function()
  it("the same K/V amaxes give the NLL ModelOpt's k/v_bmm_quantizers give (weights unquantized)", function()
    if not nbspec.need(stories) then return end
    local g = nibble.json.decode(nbspec.read(golden .. "/w4a16_kv.json"))
    local ids = nibble.json.decode(nbspec.read(nbspec.data("stories260K/reference/valid_chunk0.json"))).ids
    local m = nibble.model.load(stories)
    local base = chunk_nll(m, ids)
    assert.is_true(math.abs(base - g.base_nll) < 2e-5, ("base %.7f vs %.7f"):format(base, g.base_nll))
    local qm = qmodel.new(m)
    qm:set_kv("fp8")
    local function nll_at(f)   -- the NLL with every K/V amax scaled by f (the FP8 grid moved by 1/f)
      for l, kvv in pairs(g.kv_amax) do
        qm:kv_quantizer(tonumber(l), "k"):set_state { amax = kvv[1] * f }
        qm:kv_quantizer(tonumber(l), "v"):set_state { amax = kvv[2] * f }
      end
      qm:set_fake(true)
      return chunk_nll(m, ids)
    end
    local kv = nll_at(1)
    -- The NLL of an FP8 cache is a step function of K and V: an element within its float32 rounding
    -- of an FP8 midpoint rounds up in one forward and down in another, and one such flip here moves
    -- the NLL by up to 1.2e-3 (ModelOpt's torch and nibble's kernels sum in different orders, so
    -- their K/V differ by a few ulps). Moving the FP8 grid by a relative e flips exactly the elements
    -- within e of a midpoint, one direction per sign: the NLL's range over grid moves up to e,
    -- upwards plus downwards, is what order differences of up to e can do (first order: flips add).
    -- e = nbspec.kv_order_tol for layer 0 (the projection's own rounding, 2 (2D + 11) u = 1.7e-5)
    -- gives 4.6e-3 here; a divisor of 447 for 448 moves the NLL by 0.023, the neighbouring layer's
    -- amaxes or K before RoPE by more.
    local e, up, down = nbspec.kv_order_tol(m.config, 0, #ids), 0, 0
    for k = 0, 5 do
      up = math.max(up, math.abs(nll_at(1 + e * 2 ^ -k) - kv))
      down = math.max(down, math.abs(nll_at(1 - e * 2 ^ -k) - kv))
    end
    local tol = up + down + 2e-5   -- + the base NLL's own allowance above
    nll_at(1)
    assert.is_true(math.abs(kv - g.kv_nll) <= tol, ("FP8 KV %.7f vs ModelOpt %.7f (allowed %.3g)"):format(kv, g.kv_nll, tol))
    assert.is_true(kv - base > 0.05)   -- the FP8 cache costs this tiny model (head_dim 8) that much
    qm:set_fake(false)
    assert.are.equal(base, chunk_nll(m, ids))
  end)
end)

describe("export equals ModelOpt's export_hf_checkpoint", function()
  for _, case in ipairs { "w4a16", "nvfp4", "mxfp8", "fp8", "mixed", "w4a16_kv" } do
    it(case, function()
      if not nbspec.need(stories) then return end
      local g = nibble.json.decode(nbspec.read(golden .. "/" .. case .. ".json"))
      local m = nibble.model.load(stories)
      local qm = qmodel.new(m)
      local r = case == "mixed" and recipe.load(nbspec.source_dir .. "/tests/recipes/fixtures/mixed.lua", {})
                or recipe.new { extends = units[case] }
      local composed = recipe.compose(r)
      local plan = recipe.resolve(composed, ptq.modules(m))
      ptq.apply(qm, plan)
      local kv = ptq.kv_of(composed)
      if kv then qm:set_kv(kv.format) end
      g.kv_amax = g.kv_amax or {}   -- (the cases made before the KV case have no such field)
      assert.are.equal(case == "w4a16_kv", next(g.kv_amax) ~= nil)
      -- the same modules are quantized
      local names = {}
      for _, e in ipairs(plan) do if e.format then names[#names + 1] = e.name end end
      table.sort(names)
      assert.are.same(g.quantized_modules, names)
      qm:fuse_siblings()
      if kv then
        -- nibble's own calibration on ModelOpt's token ids finds the same K/V amax, within what the
        -- float32 sums of another order (torch's) allow (nbspec.kv_order_tol)
        local ids = nibble.tensor(g.calib_ids, "i32")
        qm:calibrate_begin("max")
        local fo = ffi.new("nb_forward_opts")
        nibble.check(nibble.C.nb_model_forward(nibble.ctx, qmodel.model_ptr(m), ids:data("const int32_t *"),
          #g.calib_ids, #g.calib_ids[1], fo))
        qm:calibrate_end()
        for l, kvv in pairs(g.kv_amax) do
          for w, want in ipairs(kvv) do
            local got = qm:kv_quantizer(tonumber(l), w == 1 and "k" or "v"):state().amax
            local tol = nbspec.kv_order_tol(m.config, tonumber(l), #g.calib_ids[1])
            assert.is_true(math.abs(got - want) <= tol * want, ("layer %s %s: %.9g vs %.9g"):format(l, w, got, want))
          end
        end
      end
      qm:calibrate_weights("max")
      -- ModelOpt's weight amax (max |w|) is what nibble computed (group maxima are applied at export)
      for name, a in pairs(g.weight_amax) do
        local s = qm:weight_quantizer(name):state()
        assert.are.equal(a, s.amax, name)
      end
      -- the input amaxes ModelOpt calibrated, given to nibble
      local n_in = 0
      for name, a in pairs(g.input_amax) do
        qm:input_quantizer(name):set_state { amax = a }
        n_in = n_in + 1
      end
      assert.are.equal(case == "fp8" and 35 or case == "nvfp4" and 30 or 0, n_in)
      -- and ModelOpt's K/V amaxes, exactly
      for l, kvv in pairs(g.kv_amax) do
        qm:kv_quantizer(tonumber(l), "k"):set_state { amax = kvv[1] }
        qm:kv_quantizer(tonumber(l), "v"):set_state { amax = kvv[2] }
      end
      qm:check()
      local out = tmp .. "/" .. case
      qm:export(out)

      local want, got = nibble.load(golden .. "/" .. case .. ".safetensors"), nibble.load(out)
      local n = 0
      for _, name in ipairs(want:names()) do
        local a, b = want:info(name), got:info(name)
        assert.is_not_nil(b, "nibble's export has no " .. name)
        assert.are.equal(a.dtype, b.dtype, name)
        assert.are.same(a.shape, b.shape, name)
        assert.is_true(bytes(want[name]) == bytes(got[name]), name .. ": bytes differ")
        n = n + 1
      end
      -- nothing quantized that ModelOpt left alone: every other tensor is the source (F32) rounded to
      -- BF16, the default dtype of an F32 model's export (the rounding is held to torch's by lua.client_golden)
      local src = nibble.load(stories)
      for _, name in ipairs(got:names()) do
        if not want:has(name) then
          assert.are.equal("BF16", got:info(name).dtype, name)
          assert.is_true(bytes(got[name]) == bytes(src[name]:to("bf16")), name)
        end
      end
      assert.are.equal(#want:names() + #src:names() - #g.quantized_modules, #got:names())
      assert.is_true(n >= 60)

      local hq = nibble.json.decode(nbspec.read(out .. "/hf_quant_config.json"))
      assert.are.same({ name = "nibble", version = nibble.version }, hq.producer)
      assert.are.same(without_producer(g.hf_quant_config), without_producer(hq))
      local qc = nibble.json.decode(nbspec.read(out .. "/config.json")).quantization_config
      assert.are.same(without_producer(g.quantization_config), without_producer(qc))
    end)
  end
end)

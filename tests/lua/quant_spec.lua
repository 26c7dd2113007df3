-- nibble.quant from Lua: FORMATS TV1/TV4 bytes, the quantizer lifecycle (uncalibrated errors,
-- calibration, export, fake == dequantize), state as Lua tables round-tripping to the same bytes,
-- groups, the straight-through gradient, named errors, the per-block error report on a real
-- stories260K weight, and the mixed parameter buffer maps.
local nibble = require("nibble")
local nbspec = require("nbspec")

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function bytes(t)
  local u = t:contiguous()
  local p = u:data("const uint8_t *")
  local r = {}
  for i = 0, u.nbytes - 1 do r[#r + 1] = string.format("%02X", p[i]) end
  return table.concat(r, " ")
end

describe("nibble.quant formats", function()
  it("lists the traits table", function()
    assert.are.same({ "nvfp4", "nvfp4_46", "mxfp8", "fp8", "fp8_channel" }, nibble.quant.formats)
    assert.are.equal("nvfp4_46", nibble.quant.info("nvfp4_4o6").name)   -- the recipe preset's spelling
    local i = nibble.quant.info("four_over_six")
    assert.are.equal("nvfp4", i.disk)
    assert.are.equal(16, i.block_size)
    assert.are.equal(256, i.scale_norm)
    assert.are.equal("e4m3", i.scale_dtype)
    assert.are.equal("u8", nibble.quant.info("mxfp8").scale_dtype)
    assert.truthy(err_of(nibble.quant.info, "int4"):find("unknown quantization format int4", 1, true))
  end)

  it("reproduces TV1 (NVFP4 ties, saturation, -0)", function()
    local v = { 0, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, 6, -.25, -.75, -1.75, -3.5, -5, 0.3, -6,
                2688, -1344, 896, 448, 100, 300, -700, 1104, 1600, 2000, -2208, 0, 50, -120, 1504, -2688 }
    local x = nibble.tensor({ v }, "bf16")
    local qt = nibble.quant.quantize(x, "nvfp4", { amax = 2688 })
    assert.are.equal("00 22 44 66 87 CA EE F1 D7 24 10 4B 66 0E 90 F5", bytes(qt.data))
    assert.are.equal("38 7E", bytes(qt.scale))
    assert.are.equal(1.0, qt.scale2)
    assert.are.equal("nvfp4", qt.format)
    assert.are.same({ 1, 32 }, { qt.shape[1], qt.shape[2] })
    assert.truthy(qt:dequantize():equal(nibble.quant.fake(x, "nvfp4", { amax = 2688 }):float()))
  end)

  it("reproduces TV4 (four_over_six picks M=4) through a calibrated quantizer", function()
    local x = nibble.tensor({ { 6, 5, 5, 5, -5, -5, 5, 5, 2.5, 1, 0.5, 0, 3, 4, -4.5, 5.5 } }, "bf16")
    local q = nibble.quant.four_over_six { name = "tv4" }
    assert.are.equal("block_amax", q:missing())
    local _, ob = q:calibrate(x)
    assert.are.same({ 2 }, ob:choice())          -- candidate 2 = multiplier 1.5
    local s = q:state()
    assert.are.equal(6, s.global_amax)
    assert.are.equal(9, s.block_amax:get(1, 1))
    local qt = q:quantize(x)
    assert.are.equal("56 55 DD 55 13 01 54 6D", bytes(qt.data))
    assert.are.equal("7C", bytes(qt.scale))
    assert.are.equal(2 ^ -8, qt.scale2)
    assert.are.equal(2 ^ -8, q:scale())
  end)

  it("reproduces TV5 (MXFP8) and TV6 (FP8 with the bf16 division)", function()
    local v = { 480, -300, 17, 0.5, -1, 2, 3, 100 }
    for i = 0, 23 do v[#v + 1] = 0.25 * i end
    local qt = nibble.quant.quantize(nibble.tensor({ v }, "bf16"), "mxfp8")
    assert.are.equal("80", bytes(qt.scale))
    assert.truthy(bytes(qt.data):find("^77 F1 50 28 B0 38 3C 64 00 20"))
    assert.are.equal("7F", bytes(nibble.quant.quantize(nibble.tensor({ v }, "bf16"), "mxfp8", { floor = true }).scale))
    local f = nibble.quant.quantize(nibble.tensor({ { 3.0, -1.5, 1.0, 2.890625 } }, "bf16"), "fp8", { amax = 3 })
    assert.are.equal("7E F6 71 7E", bytes(f.data))
    local g = nibble.quant.quantize(nibble.tensor({ { 3.0, -1.5, 1.0, 2.890625 } }, "bf16"), "fp8", { amax = 3, div = "f32" })
    assert.are.equal("7E F6 71 7D", bytes(g.data))
  end)
end)

describe("nibble.quant quantizers", function()
  it("refuses to export uncalibrated, then exports what fake quant trains", function()
    nibble.seed(3)
    local w = nibble.randn("bf16", 8, 64)
    local q = nibble.quant.nvfp4 { name = "layers.0.q_proj.weight_quantizer" }
    local e = err_of(q.quantize, q, w)
    assert.truthy(e:find("NB_ERR_UNCALIBRATED: quantizer 'layers.0.q_proj.weight_quantizer' has no calibrated amax", 1, true), e)
    assert.truthy(e:find("quant_spec.lua", 1, true), e)      -- the error names the caller's line
    q:calibrate(w)
    assert.is_nil(q:missing())
    assert.are.equal(w:absmax(), q:global_amax())
    local qt = q:quantize(w)
    assert.are.equal("u8", qt.data.dtype)
    assert.are.same({ 8, 32 }, { qt.data.shape[1], qt.data.shape[2] })
    assert.truthy(q:fake(w):equal(q:dequantize(qt, "bf16")))
    -- disabled: identity in training, an error at export
    q:disable()
    assert.truthy(q:fake(w):equal(w))
    assert.truthy(err_of(q.quantize, q, w):find("is disabled", 1, true))
    q:enable()
    assert.is_true(q.enabled)
  end)

  it("saves and restores state as Lua tables with identical bytes", function()
    nibble.seed(5)
    local w = nibble.randn("bf16", 4, 3, 32)
    for _, mk in ipairs({ function() return nibble.quant.nvfp4 { static = true } end,
                          function() return nibble.quant.four_over_six() end,
                          function() return nibble.quant.fp8 { per_channel = true } end,
                          function() return nibble.quant.fp8() end }) do
      local q = mk()
      q:calibrate(w)
      local s = q:state()
      local r = mk():set_state(s)
      assert.are.equal(bytes(q:quantize(w).data), bytes(r:quantize(w).data))
      assert.are.equal(bytes(q:quantize(w).scale), bytes(r:quantize(w).scale))
    end
    local q = nibble.quant.nvfp4()
    assert.truthy(err_of(q.set_state, q, { scale = 1 }):find("unknown attribute 'scale'", 1, true))
    assert.truthy(err_of(q.set_state, q, { amax = -1 }):find("NB_ERR_NUMERIC", 1, true))
  end)

  it("runs MSE with ModelOpt's candidates and reports choices", function()
    nibble.seed(9)
    local w = nibble.randn("f32", 16, 64)
    local q = nibble.quant.nvfp4 { static = true }
    q:calibrate(w)
    local before = q:state().block_amax
    local _, ob = q:calibrate(w, "mse")
    local ch = ob:choice()
    assert.are.equal(64, #ch)
    local after = q:state().block_amax
    for i = 1, 16 do
      for b = 1, 4 do
        local k = ch[(i - 1) * 4 + b]
        assert.truthy(k >= 1 and k <= 39)
        -- amax x linspace(0.25, 4, 39)[k], in f32
        local m = nibble.C.nb_linspace_f32(0.25, 4.0, 39, k - 1)
        assert.are.equal(nibble.tensor(before:get(i, b) * m, "f32"):get(), after:get(i, b))
      end
    end
  end)

  it("shares one global amax in a group and computes the STE", function()
    nibble.seed(11)
    local g, u = nibble.randn("bf16", 4, 64), nibble.randn("bf16", 4, 64)
    local qg, qu = nibble.quant.nvfp4 { name = "gate" }, nibble.quant.nvfp4 { name = "up" }
    local grp = nibble.quant.group("gate_up", { qg, qu })
    assert.are.equal(2, grp:size())
    assert.are.equal("gate_up", qg.group)
    qg:calibrate(g)
    assert.truthy(err_of(qg.check, qg):find("member 'up' is uncalibrated", 1, true))
    qu:calibrate(u)
    assert.are.equal(qg:scale(), qu:scale())
    assert.are.equal(math.max(g:absmax(), u:absmax()), qg:global_amax())
    -- STE: pass-through by default; clipped on request
    local x = g:float()
    local grad = nibble.randn("f32", 4, 64)
    assert.truthy(qg:backward(x, grad):equal(grad))
    local clipped = nibble.quant.nvfp4 { pass_through_bwd = false }
    clipped:set_state { amax = 1.0 }
    local gi = clipped:backward(x, grad)
    for i = 1, 4 do
      for j = 1, 64 do
        local want = math.abs(x:get(i, j)) <= 1.0 and grad:get(i, j) or 0
        assert.are.equal(want, gi:get(i, j))
      end
    end
  end)

  it("names bad input", function()
    local q = nibble.quant.nvfp4 { name = "down_proj.weight_quantizer" }
    local w = nibble.zeros("bf16", 4, 172):fill(1)
    local e = err_of(q.calibrate, q, w)
    assert.truthy(e:find("NB_ERR_SHAPE: down_proj.weight_quantizer: last dimension (dim 1) is 172, not divisible by the nvfp4 block size 16", 1, true), e)
    local x = nibble.zeros("f32", 2, 32):fill(1)
    x:set(2, 5, 0 / 0)
    e = err_of(nibble.quant.quantize, x, "mxfp8", { name = "w" })
    assert.truthy(e:find("NB_ERR_NUMERIC: w: NaN at flat index 36 (element [1, 4])", 1, true), e)
    assert.truthy(err_of(q.observer, q, "best"):find("unknown calibration method best", 1, true))
  end)

  it("reports the error per block of a real weight", function()
    local path = nbspec.data("stories260K/hf")
    if not nbspec.need(path) then return end
    local w = nibble.load(path):get("model.layers.0.self_attn.q_proj.weight"):to("bf16")
    local q = nibble.quant.nvfp4 { name = "q_proj" }
    q:calibrate(w)
    local e, s = q:block_errors(w)
    assert.are.same({ 64, 4 }, { e.shape[1], e.shape[2] })
    -- the blocks add up to the whole tensor's squared error
    local y = q:fake(w:float())   -- f32 fake quant (in bf16 the values would be rounded once more)
    local x = w:float()
    local total = 0
    for i = 1, 64 do for j = 1, 64 do local d = x:get(i, j) - y:get(i, j); total = total + d * d end end
    assert.is_true(math.abs(total - s.sse) <= 1e-9 * total)
    assert.is_true(s.sqnr_db > 15 and s.sqnr_db < 30)
    local rep = q:report(w, 3)
    assert.truthy(rep:find("quantizer<nvfp4> 'q_proj': mse", 1, true), rep)
    local _, lines = rep:gsub("\n", "")
    assert.are.equal(3, lines)
    -- four_over_six never does worse than plain NVFP4 at 256 on the same weight, and differs from it
    local q46 = nibble.quant.four_over_six()
    q46:calibrate(w)
    local _, s46 = q46:block_errors(w)
    assert.is_true(s46.sse < s.sse)
  end)
end)

describe("nibble.quant parameter buffers", function()
  it("maps a 100x100 NVFP4 weight beside a 100-element BF16 norm", function()
    local pb = nibble.quant.parambuf()
    pb:add("mlp.up_proj.weight", "nvfp4", "bf16", { 100, 100 })
    pb:add("post_attention_layernorm.weight", nil, "bf16", { 100 })
    pb:finalize()
    local m = pb:maps()
    assert.are.same({ 0, 10000 }, m.param_index_map["mlp.up_proj.weight"])
    assert.are.same({ 0, 5000 }, m.packed_index_map["mlp.up_proj.weight"])
    assert.are.same({ 10000, 10100 }, m.param_index_map["post_attention_layernorm.weight"])
    assert.are.same({ 5000, 5100 }, m.packed_index_map["post_attention_layernorm.weight"])
    assert.is_true(pb:has_nvfp4())
    assert.are.equal("e2m1", pb:view("mlp.up_proj.weight").dtype)
    local a, b = pb:byte_range("post_attention_layernorm.weight")
    assert.are.equal(5056, a)
    assert.are.equal(5256, b)
  end)
end)

describe("nibble.quant audit fixes", function()
  -- an expected error: one line, positioned at this spec's line, never inside lua/nibble/quant.lua
  local function user_err(f, ...)
    local e = err_of(f, ...)
    assert.truthy(e:find("quant_spec.lua:%d+: "), e)
    assert.is_nil(e:find("quant.lua", 1, true), e)
    assert.is_nil(e:find("\n", 1, true), e)
    return (e:gsub("^.-quant_spec%.lua:%d+: ", ""))
  end

  it("gives the same state when calibrated twice (the search starts from the data's max)", function()
    local x = nibble.tensor({ { 6, 5, 5, 5, -5, -5, 5, 5, 2.5, 1, 0.5, 0, 3, 4, -4.5, 5.5 } }, "bf16")
    local q = nibble.quant.four_over_six { name = "tv4" }
    q:calibrate(x)
    local first = bytes(q:quantize(x).data)
    q:calibrate(x)
    assert.are.equal(9, q:state().block_amax:get(1, 1))   -- 6 x 1.5, not 13.5
    assert.are.equal(first, bytes(q:quantize(x).data))
    assert.are.equal("56 55 DD 55 13 01 54 6D", first)
    nibble.seed(21)
    local w = nibble.randn("bf16", 16, 64)
    for _, mk in ipairs({ function() return nibble.quant.fp8() end,
                          function() return nibble.quant.fp8 { per_channel = true } end,
                          function() return nibble.quant.nvfp4 { static = true } end }) do
      local a, b = mk(), mk()
      a:calibrate(w, "mse")
      b:set_state(a:state())      -- a searched state first must not move the next search
      b:calibrate(w, "mse")
      b:calibrate(w, "mse")
      local sa, sb = a:state(), b:state()
      for k, v in pairs(sa) do
        if type(v) == "number" then assert.are.equal(v, sb[k]) else assert.truthy(v:equal(sb[k]), k) end
      end
    end
  end)

  it("quantizes a zero amax with the maxbound (ModelOpt's sanitize): positive scale, zero codes", function()
    nibble.seed(22)
    local w = nibble.randn("bf16", 3, 32)
    for j = 1, 32 do w:set(2, j, 0) end
    local q = nibble.quant.fp8 { per_channel = true, name = "o_proj" }
    q:calibrate(w)
    local qt = q:quantize(w)
    assert.are.equal(1.0, qt.scale:get(2))
    assert.are.equal(string.rep("00", 32, " "), bytes(qt.data:select(1, 2)))
    assert.are.equal(0, q:fake(w):float():select(1, 2):absmax())
    local z = nibble.zeros("f32", 2, 32)
    local n = nibble.quant.nvfp4()
    n:calibrate(z)
    local s2 = nibble.tensor(6 / 2688, "f32"):get()        -- amax 0 -> 6: weight_scale_2 = f32(6/2688)
    assert.are.equal(s2, n:quantize(z).scale2)
    assert.are.equal(s2, n:scale())
    assert.are.equal(string.rep("00", 32, " "), bytes(n:quantize(z).data))
    local f = nibble.quant.fp8()
    f:calibrate(z)
    assert.are.equal(1.0, f:scale())
    assert.truthy(user_err(nibble.quant.quantize, z, "fp8", { amax = 0 / 0, name = "w" }):find("NB_ERR_NUMERIC: w: amax is NaN", 1, true))
  end)

  it("refuses state calibrated for a tensor of another shape", function()
    nibble.seed(23)
    local w = nibble.randn("bf16", 64, 64)
    local q = nibble.quant.nvfp4 { static = true, name = "q_proj" }
    q:calibrate(w)
    assert.are.equal("NB_ERR_SHAPE: q_proj: block_amax {64, 4} does not fit this {32, 128} tensor, which needs {32, 8} "
      .. "(calibrated on a tensor of another shape)", user_err(q.quantize, q, w:view(32, 128)))
    local k = nibble.randn("bf16", 32, 64)
    local qk = nibble.quant.nvfp4 { static = true, name = "k_proj" }
    qk:calibrate(k)
    assert.truthy(user_err(qk.quantize, qk, k:t()):find("block_amax {32, 4} does not fit this {64, 32} tensor", 1, true))
    assert.truthy(user_err(q.set_state, q, { block_amax = { { 1, 1, 1 }, { 1, 1, 1 }, { 1, 1, 1 } }, global_amax = 1 })
      :find("NB_ERR_SHAPE: quantizer 'q_proj': block_amax {3, 3} does not match the block_amax {64, 4} it has", 1, true))
  end)

  it("calibrates a dynamic four_over_six quantizer with max by default", function()
    nibble.seed(24)
    local w = nibble.randn("bf16", 8, 64)
    local q = nibble.quant.four_over_six { static = false, name = "dyn" }
    q:calibrate(w)
    assert.are.equal(w:absmax(), q:global_amax())
    assert.are.equal(bytes(nibble.quant.quantize(w, "nvfp4_46").data), bytes(q:quantize(w).data))
    assert.truthy(user_err(q.calibrate, q, w, "four_over_six")
      :find("this one is dynamic (it picks per block when it quantizes), so calibrate it with max", 1, true))
  end)

  it("names the function and the expected argument on a wrong type", function()
    local Q = nibble.quant
    local x = nibble.randn("f32", 2, 32)
    local q = Q.nvfp4 { name = "q" }
    q:calibrate(x)
    local qt = q:quantize(x)
    local g = Q.group("g", { Q.nvfp4 {} })
    local pb = Q.parambuf()
    local cases = {
      { "quantizer:quantize: argument 1 must be a tensor, got nil", q.quantize, q, nil },
      { "quantizer:quantize: argument 1 must be a tensor, got a number", q.quantize, q, 3 },
      { "quantizer:quantize: argument 1 must be a tensor, got a quantized tensor", q.quantize, q, qt },
      { "quantizer:quantize: argument 1 must be a tensor, got a quantizer", q.quantize, q, q },
      { "quantizer:quantize: called on a tensor, not a quantizer (call it with a colon: x:quantize(...))", q.quantize, x },
      { "quantizer:fake: argument 1 must be a tensor, got nil", q.fake, q, nil },
      { "quantizer:fake: argument 1 must be a tensor, got a string", q.fake, q, "s" },
      { "quantizer:fake: argument 1 must be a tensor, got a quantized tensor", q.fake, q, qt },
      { "quantizer:dequantize: argument 1 must be a quantized tensor, got nil", q.dequantize, q, nil },
      { "quantizer:dequantize: argument 1 must be a quantized tensor, got a tensor", q.dequantize, q, x },
      { "quantizer:dequantize: argument 1 must be a quantized tensor, got an empty table", q.dequantize, q, {} },
      { "quant.quantize: argument 1 must be a tensor, got nil", Q.quantize, nil, "nvfp4" },
      { "quantizer:calibrate: argument 1 must be a tensor or a non-empty list of tensors, got a string", q.calibrate, q, "x" },
      { "quantizer:calibrate: argument 1 must be a tensor or a non-empty list of tensors, got nil", q.calibrate, q, nil },
      { "quantizer:calibrate: argument 1 must be a tensor or a non-empty list of tensors, got a number", q.calibrate, q, 5 },
      { "quantizer:calibrate: argument 1[2] must be a tensor, got a number", q.calibrate, q, { x, 5 } },
      { "quantizer:backward: argument 1 (x) must be a tensor, got nil", q.backward, q, nil, nil },
      { "group:remove: argument 1 must be a quantizer, got nil", g.remove, g, nil },
      { "parambuf:add: argument 4 (shape) must be a table, got nil", pb.add, pb, "x", nil, "f32" },
      { "parambuf:store: argument 2 must be a quantized tensor, got a tensor", pb.store, pb, "a", x },
      { "quant.nvfp4: option 'name' must be a string or nil, got a number", Q.nvfp4, { name = 5 } },
      { "quant.quantize: option 'amax' must be a number or nil, got a string", Q.quantize, x, "nvfp4", { amax = "x" } },
      { "quantizer:observer: option 'start' must be a number or nil, got a string", q.observer, q, "mse", { start = "a" } },
      { "quant.new: option 'div' must be auto, f32, bf16 or f16, got 'i32'", Q.new, "fp8", { div = "i32" } },
    }
    for _, c in ipairs(cases) do
      assert.are.equal(c[1], user_err(c[2], unpack(c, 3, 6)))
    end
  end)

  it("keeps a group's Lua list and C members in step, and refuses integer gradients", function()
    local Q = nibble.quant
    local q = Q.nvfp4 { name = "m" }
    local g = Q.group("g", { q })
    g:add(q)
    g:add(Q.wrap(q.ptr))        -- another Lua handle on the same quantizer
    assert.are.equal(1, g:size())
    assert.are.equal(1, #g.members)
    g:remove(q)
    assert.are.equal(0, g:size())
    assert.are.equal(0, #g.members)
    local x = nibble.randn("f32", 2, 32)
    q:calibrate(x)
    assert.truthy(user_err(q.backward, q, x, x, nibble.zeros("i32", 2, 32))
      :find("NB_ERR_UNSUPPORTED: quantizer 'm' backward: f32, bf16 or f16 tensors only (x f32, grad_out f32, grad_in i32)", 1, true))
  end)
end)

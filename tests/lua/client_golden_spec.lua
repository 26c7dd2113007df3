-- nibble's exports as a real client runs them (tests/golden/gen_client_golden.py: transformers 5 with
-- compressed-tensors): each export is made here as the generator made it (`nibble quantize` with the
-- recorded arguments, default --dtype), and nibble's read-back eval of it scores the validation
-- windows as transformers did in float32 (client_ppl.json, run "f32_rope64"). Also: the export is in
-- BF16 with torch_dtype bfloat16 (the generator's stock transformers load ran it: "client"), and
-- nibble's float32 -> bf16 / f16 rounding equals torch's and its FP8 activation fake quant equals
-- compressed-tensors' on the vectors of tests/golden/gen_dtype_golden.py (dtype_round.json).
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")

local stories = nbspec.data("stories260K/hf")
local train = nbspec.data("text/tinystories_train_head_2MiB.txt")
local valid = nbspec.data("text/tinystories_valid_head_776KiB.txt")
local golden = nbspec.source_dir .. "/tests/golden/data"
local tmp = nbspec.private_dir()

-- Per-window tolerance, from the arithmetic. Both sides run the same float32 forward of the same
-- weights with sums in another order; the longest sums have n = 512 terms (attention over 512 keys,
-- the logsumexp over the 512-token vocabulary). Rounding errors of such a sum grow as sqrt(n) * u
-- (u = 2^-24; Higham & Mary's probabilistic bound): sqrt(512) * 5.96e-8 = 1.35e-6 relative, on logits
-- of at most |20| (stories260K on this text: max |logit| 18) gives 2.7e-5 per logit, and a token's NLL
-- (logsumexp minus one logit) moves by at most twice that: 5.4e-5. A window's NLL is a mean of such.
local TOL = 2 * math.sqrt(512) * 2 ^ -24 * 20

-- the export, made as the generator made it
local function export(case, g)
  local args = { "quantize", "--model", stories, "--out", tmp .. "/" .. case, "--quiet" }
  for _, a in ipairs(g.nibble_args) do args[#args + 1] = (a:gsub("^%$DATA", nbspec.shared)) end
  local out, err, rc = nbspec.nibble(args)
  assert.are.equal(0, rc, err .. out)
  return tmp .. "/" .. case
end

-- nibble's read-back eval, one window at a time: llama.cpp's scoring (BOS first, positions 256..510)
local ids
local function window_nlls(dir, n, n_ctx, kv, scales)
  local m = nibble.model.load(dir)
  -- input scales (and KV scales unless kv is false) as exported: what nibble eval does
  local aq = nibble.qmodel.activations(m, nil, { kv = kv })
  -- the golden's calibrated input scales: the calibration forward sums in the BLAS's order, and on
  -- another CPU (or OPENBLAS_CORETYPE) its amaxes, so the export's scales, may be an ulp apart; the
  -- comparison is of the checkpoint the golden scored
  local u = ffi.new("union { uint32_t u; float f; }")
  for name, hex in pairs(scales or {}) do
    u.u = tonumber(hex, 16)
    local q = aq:input_quantizer(name)
    if q:scale() ~= u.f then assert.is_true(nibble.qmodel.amax_for_scale(q.ptr, u.f, 448), name) end
    assert.are.equal(u.f, q:scale(), name)
  end
  ids = ids or m:tokenizer():encode(nbspec.read(valid))
  local out = {}
  for c = 0, n - 1 do
    local w = {}
    for i = 1, n_ctx do w[i] = ids[c * n_ctx + i] end
    out[c + 1] = m:eval({ tokens = w, ctx = n_ctx, chunks = 1 }).nll
  end
  if aq then aq:free() end
  return out
end

describe("a real client runs nibble's exports", function()
  local g = nibble.json.decode(nbspec.read(golden .. "/client_ppl.json"))

  it("transformers loads the compressed-tensors layouts in their BF16 and runs them; not the ModelOpt layout", function()
    for _, case in ipairs { "ct_w4a16", "ct_mxfp8", "ct_fp8", "ct_fp8_kv" } do
      local c = g.cases[case]
      assert.are.equal("bfloat16", c.torch_dtype, case)
      assert.is_nil(c.client_error, case)
      assert.are.equal("torch.bfloat16", c.client.dtype, case)
      -- bf16 compute: near the float32 result, not equal to it
      assert.is_true(math.abs(c.client.mean_nll - c.f32.mean_nll) < 0.01, case)
    end
    assert.matches("has no quant_method 'modelopt'", g.cases.modelopt_w4a16.client_error, 1, true)
  end)

  it("an F32 source exports its unquantized tensors in BF16, torch_dtype bfloat16", function()
    if not nbspec.need(stories) then return end
    local dir = export("ct_w4a16", g.cases.ct_w4a16)
    local cfg = nibble.json.decode(nbspec.read(dir .. "/config.json"))
    assert.are.equal("bfloat16", cfg.torch_dtype)
    local st, src = nibble.load(dir), nibble.load(stories)
    for _, name in ipairs { "model.embed_tokens.weight", "model.norm.weight", "model.layers.2.mlp.down_proj.weight" } do
      assert.are.equal("BF16", st:info(name).dtype, name)
      assert.is_true(ffi.string(st[name]:data(), st[name].nbytes) ==
                     ffi.string(src[name]:to("bf16"):data(), st[name].nbytes), name)
    end
  end)

  it("a GGUF source (all F32) exports in BF16 too, and --dtype f32 keeps float32", function()
    local gguf = nbspec.data("stories260K/stories260K.gguf")
    if not nbspec.need(gguf) then return end
    for _, d in ipairs { { {}, "BF16", "bfloat16" }, { { "--dtype", "f32" }, "F32", "float32" } } do
      local dir = tmp .. "/gguf-" .. d[2]
      local args = { "quantize", "--model", gguf, "--format", "nvfp4_w4a16", "--out", dir, "--quiet" }
      for _, a in ipairs(d[1]) do args[#args + 1] = a end
      local out, err, rc = nbspec.nibble(args)
      assert.are.equal(0, rc, err .. out)
      assert.are.equal(d[3], nibble.json.decode(nbspec.read(dir .. "/config.json")).torch_dtype)
      assert.are.equal(d[2], nibble.load(dir):info("model.norm.weight").dtype)
    end
  end)

  -- weight-only: no activation is quantized, so each window agrees to float32 rounding (TOL)
  for _, case in ipairs { "ct_w4a16", "ct_mxfp8" } do
    it(case .. ": nibble's read-back eval equals transformers' on every window", function()
      if not nbspec.need(stories, valid) then return end
      local c = g.cases[case]
      local want = c.f32_rope64.nll
      local got = window_nlls(export(case, c), g.windows, g.n_ctx)
      for i = 1, g.windows do
        assert.is_true(math.abs(got[i] - want[i]) <= TOL, ("%s window %d: %.8f vs %.8f"):format(case, i, got[i], want[i]))
      end
      -- and the stock transformers (float32 rotary angle) too: without quantized activations the
      -- angle's rounding is far below TOL
      for i = 1, g.windows do assert.is_true(math.abs(c.f32.nll[i] - want[i]) <= TOL) end
    end)
  end

  -- W8A8: the activations are quantized the same way on both sides (x / input_scale, clamp to +-448,
  -- E4M3 round to nearest even, times input_scale: core/src/quant/fp8.c; held bit for bit to
  -- compressed-tensors' own fake_quantize below, where a multiplication by 1 / scale fails). The
  -- windows still differ: an activation within a float32 rounding of an E4M3 midpoint rounds either
  -- way, and the float32 sums before it are in another order (another BLAS kernel, attention, and
  -- transformers' float32 rotary angle: with the golden's angle in float32, 3 windows of 20 agree
  -- within TOL, in double 17 with the default OpenBLAS kernel, 9 with Haswell's, 2 with Prescott's).
  -- One flip moves a 512-token window's NLL by up to ~0.01 in this 64-wide model, either way. So the
  -- windows' differences d are flips of either sign: the test is that their mean is zero within
  -- three standard errors of the mean (sd(d) / sqrt(20)) plus TOL; a quantizer that shifted
  -- activations one way (a clamp, a scale off by a factor) moves every window the same way.
  for _, case in ipairs { "ct_fp8", "ct_fp8_kv" } do
    it(case .. ": nibble's read-back eval equals transformers' up to FP8 midpoint flips", function()
      if not nbspec.need(stories, train, valid) then return end
      local c = g.cases[case]
      -- compressed-tensors 0.20 under transformers 5 does not see the attention modules as cached (it
      -- looks for a past_key_value(s) argument, since renamed): k_scale / v_scale load as unexpected
      -- keys and its KV cache stays in float, so nibble is compared with its KV cache in float too
      assert.is_false(c.kv_applied)
      local n_scales = 0
      for _ in pairs(c.input_scales) do n_scales = n_scales + 1 end
      assert.are.equal(35, n_scales)   -- every linear module's input
      local got = window_nlls(export(case, c), g.windows, g.n_ctx, c.kv_applied, c.input_scales)
      local n, sum, sum2, same = g.windows, 0, 0, 0
      for i = 1, n do
        local d = got[i] - c.f32_rope64.nll[i]
        sum, sum2 = sum + d, sum2 + d * d
        if math.abs(d) <= TOL then same = same + 1 end
      end
      local mean = sum / n
      local se = math.sqrt(math.max(0, (sum2 - n * mean * mean) / (n - 1)) / n)
      assert.is_true(math.abs(mean) <= 3 * se + TOL,
                     ("%s: mean NLL difference %.6f, standard error %.6f (%d of %d windows within TOL)")
                       :format(case, mean, se, same, n))
    end)
  end
end)

describe("float32 -> bf16 / f16 rounding equals torch's", function()
  it("on the generator's vectors (ties, subnormals, overflow, NaN)", function()
    local v = nibble.json.decode(nbspec.read(golden .. "/dtype_round.json"))
    local n = #v.f32_bits
    local x = nibble.zeros("f32", { n })
    local p = ffi.cast("uint32_t *", x:data())
    for i = 1, n do p[i - 1] = tonumber(v.f32_bits[i], 16) end
    for dt, key in pairs { bf16 = "bf16_bits", f16 = "f16_bits" } do
      local y = x:to(dt)
      local q = ffi.cast("const uint16_t *", y:data())
      local bad, nan = {}, 0
      for i = 1, n do
        local t = tonumber(v[key][i], 16)
        -- NaN: torch's tensor path writes 0xFFFF for bf16 (its 0-d path 0x7FC0, which nibble writes):
        -- both are NaN, and a NaN is what is checked
        local exp_mask, man_mask = dt == "bf16" and 0x7F80 or 0x7C00, dt == "bf16" and 0x7F or 0x3FF
        local function is_nan(b) return bit.band(b, exp_mask) == exp_mask and bit.band(b, man_mask) ~= 0 end
        if is_nan(t) then
          if not is_nan(q[i - 1]) then bad[#bad + 1] = v.f32_bits[i] .. " is not NaN" end
          nan = nan + 1
        elseif q[i - 1] ~= t then
          bad[#bad + 1] = ("%s -> %04x, torch %s"):format(v.f32_bits[i], q[i - 1], v[key][i])
        end
      end
      assert.are.same({}, bad, dt)
      assert.is_true(nan >= 5, dt)   -- the five listed NaNs, and those among the random patterns
    end
    assert.is_true(n >= 1000)
  end)
end)

describe("FP8 activation fake quant equals compressed-tensors'", function()
  it("x / input_scale, clamp, E4M3 RNE, times input_scale: bit for bit, at the midpoints too", function()
    local q = require("nibble.quant")
    local v = nibble.json.decode(nbspec.read(golden .. "/dtype_round.json"))
    assert.are.equal(3, #v.fp8_act)
    for _, c in ipairs(v.fp8_act) do
      local u = ffi.new("union { uint32_t u; float f; }")
      u.u = tonumber(c.amax, 16)
      local n = #c.x
      local x = nibble.zeros("f32", { n })
      local p = ffi.cast("uint32_t *", x:data())
      for i = 1, n do p[i - 1] = tonumber(c.x[i], 16) end
      local y = ffi.cast("const uint32_t *", q.fake(x, "fp8", { amax = u.f }):data())
      local bad = {}
      for i = 1, n do
        if y[i - 1] ~= tonumber(c.y[i], 16) then
          bad[#bad + 1] = ("x %s -> %08x, compressed-tensors %s"):format(c.x[i], y[i - 1], c.y[i])
        end
      end
      assert.are.same({}, bad, c.amax)
    end
  end)
end)

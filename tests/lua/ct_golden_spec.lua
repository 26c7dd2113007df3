-- nibble's compressed-tensors exports read back by nibble equal what the compressed-tensors package's
-- own decompressors make of them (tests/golden/gen_ct_golden.py: transformers with
-- CompressedTensorsConfig(dequantize=True)): every quantized module's weight sums, and three or four
-- modules' weights value by value (NVFP4: after the bf16 rounding compressed-tensors applies).
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")
local ptq = require("nibble.ptq")

local stories = nbspec.data("stories260K/hf")
local train = nbspec.data("text/tinystories_train_head_2MiB.txt")
local golden = nbspec.source_dir .. "/tests/golden/data/ct_readback"

local tmp = nbspec.private_dir()

-- `nibble quantize` arguments (as the generator ran them) -> the options ptq.recipe_of takes
local function options(args)
  local o, keys = {}, { ["--format"] = "format", ["--calib"] = "calib", ["--samples"] = "samples",
                        ["--seq-len"] = "seq_len", ["--batch"] = "batch", ["--seed"] = "seed", ["--layout"] = "layout",
                        ["--recipe"] = "recipe", ["--kv-cache"] = "kv_cache" }
  for i = 1, #args, 2 do
    local k = assert(keys[args[i]], args[i])
    o[k] = args[i + 1]:gsub("^%$DATA", nbspec.shared)
  end
  return o
end

local function sums(t)
  local p, s, s2 = t:data("const float *"), 0, 0
  for i = 0, t:numel() - 1 do
    local v = p[i]
    s = s + v
    s2 = s2 + v * v
  end
  return s, s2
end

describe("compressed-tensors read-back equals compressed-tensors' decompression", function()
  for _, case in ipairs { "w4a16", "mxfp8", "fp8_per_channel", "fp8", "mixed", "fp8_kv" } do
    it(case, function()
      if not nbspec.need(stories, train) then return end
      local g = nibble.json.decode(nbspec.read(golden .. "/" .. case .. ".json"))
      local o = options(g.nibble_args)
      o.model, o.out = stories, tmp .. "/" .. case
      if o.recipe then   -- nibble run RECIPE model= out= layout=
        ptq.run(nbspec.source_dir .. "/" .. o.recipe, { model = o.model, out = o.out, layout = o.layout },
                { quiet = true })
      else
        local r, args = ptq.recipe_of(o)
        ptq.run(r, args, { quiet = true })
      end
      local cfg = nibble.json.decode(nbspec.read(o.out .. "/config.json"))
      assert.are.equal(g.format, cfg.quantization_config.format)
      local m = nibble.model.load(o.out)
      -- compressed-tensors dequantizes NVFP4 into bfloat16: nibble's exact float32 read-back, rounded
      -- to bf16, is what it gets; modules whose values CT left in float32 are compared as they are
      local function readback(name)
        local w = m:param(name .. ".weight")
        local dt = g.modules[name].dtype
        if dt == "bfloat16" then return w:to("bf16"):float() end
        assert.are.equal("float32", dt)
        return w
      end
      local n, bf = 0, 0
      for name, st in pairs(g.modules) do
        local w = readback(name)
        if st.dtype == "bfloat16" then bf = bf + 1 end
        local s, s2 = sums(w)
        -- float64 sums in another order: equal to rounding of the sums themselves
        assert.is_true(math.abs(s - st.sum) <= 1e-9 * math.max(1, math.abs(st.sum)), name .. " sum")
        assert.is_true(math.abs(s2 - st.sumsq) <= 1e-9 * st.sumsq, name .. " sum of squares")
        n = n + 1
      end
      assert.are.equal(case:match("^fp8") and 35 or 30, n)
      -- NVFP4 modules come back in bf16 from CT, FP8 per tensor in float32
      if case == "w4a16" or case == "mixed" then assert.are.equal(30, bf) end
      if case == "fp8" then assert.are.equal(0, bf) end
      local want = nibble.load(golden .. "/" .. case .. ".safetensors")
      for _, tname in ipairs(want:names()) do
        local a, b = want[tname], readback((tname:gsub("%.weight$", "")))
        assert.are.equal(0, a:max_abs_diff(b), tname)
      end
      assert.is_true(#want:names() >= 3)
      -- the FP8 KV cache: compressed-tensors registered self_attn.k_scale / v_scale ([1]) from the
      -- kv_cache_scheme and loaded nibble's tensors into them, with these values
      if case == "fp8_kv" then
        assert.are.same(g.kv_cache_scheme, cfg.quantization_config.kv_cache_scheme)
        -- The scales come from a calibration forward, whose float32 sums round differently with
        -- each OpenBLAS kernel set and SIMD level: equal within the bound that order allows
        -- (nbspec.kv_order_tol), every other tensor to the byte.
        local got, n_kv = nibble.load(o.out), 0
        for name, e in pairs(g.kv_scales) do
          assert.are.same(e.shape, got:info(name).shape, name)
          local want = ffi.new("float[1]", e.value)[0]
          local v, l = got[name]:data("const float *")[0], tonumber(name:match("layers%.(%d+)%."))
          local tol = nbspec.kv_order_tol(cfg, l, tonumber(o.seq_len))
          assert.is_true(math.abs(v - want) <= tol * want,
                         ("%s: %.9g vs %.9g, relative %.3g > %.3g"):format(name, v, want, math.abs(v - want) / want, tol))
          n_kv = n_kv + 1
        end
        assert.are.equal(10, n_kv)
      else
        assert.is_nil(g.kv_scales)
      end
    end)
  end
end)

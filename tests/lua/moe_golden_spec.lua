-- The committed MoE goldens (tests/golden/moe, made by tests/golden/gen_moe_golden.py and
-- gen_moe_modelopt_golden.py) are well-formed and agree with their config.json: every tensor the
-- architecture implies is there with its shape and dtype (experts under the names each family uses, dense
-- layers where mlp_only_layers / decoder_sparse_step put them), the gradient files name the same tensors,
-- the logits and router choices have the sizes golden.json says, and ModelOpt's exports hold the tensors
-- of every quantized module (routers and lm_head left out) with one w1/w3 global scale per expert and one
-- input scale per layer. No forward pass: this guards the files the MoE runtime tests are held to.
local ffi = require("ffi")
local nibble = require("nibble")
local nbspec = require("nbspec")

local root = nbspec.source_dir .. "/tests/golden/moe"
local MODELS = { "mixtral", "qwen3moe_norm", "qwen3moe_nonorm", "olmoe" }

local function json(path) return nibble.json.decode(nbspec.read(path)) end

local function file_size(path)
  local f = assert(io.open(path, "rb"))
  local n = f:seek("end")
  f:close()
  return n
end

-- name -> shape of every tensor the config implies (HF checkpoint names)
local function expected(cfg)
  local H, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
  local hd = cfg.head_dim or H / cfg.num_attention_heads
  local nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
  local mixtral = cfg.model_type == "mixtral"
  -- transformers 5 writes num_local_experts for every family (its attribute_map); published Qwen3-MoE
  -- and OLMoE configs say num_experts
  local E = cfg.num_local_experts or cfg.num_experts
  local I = mixtral and cfg.intermediate_size or cfg.moe_intermediate_size or cfg.intermediate_size
  local t = { ["model.embed_tokens.weight"] = { V, H }, ["model.norm.weight"] = { H } }
  if not cfg.tie_word_embeddings then t["lm_head.weight"] = { V, H } end
  local moe = {}
  for l = 0, L - 1 do
    local p = "model.layers." .. l .. "."
    t[p .. "input_layernorm.weight"] = { H }
    t[p .. "post_attention_layernorm.weight"] = { H }
    t[p .. "self_attn.q_proj.weight"] = { nq, H }
    t[p .. "self_attn.k_proj.weight"] = { nkv, H }
    t[p .. "self_attn.v_proj.weight"] = { nkv, H }
    t[p .. "self_attn.o_proj.weight"] = { H, nq }
    if cfg.model_type == "qwen3_moe" then        -- per-head q/k norms
      t[p .. "self_attn.q_norm.weight"] = { hd }
      t[p .. "self_attn.k_norm.weight"] = { hd }
    elseif cfg.model_type == "olmoe" then        -- q/k norms over the whole projection
      t[p .. "self_attn.q_norm.weight"] = { nq }
      t[p .. "self_attn.k_norm.weight"] = { nkv }
    end
    local sparse = true
    if cfg.model_type == "qwen3_moe" then
      for _, d in ipairs(cfg.mlp_only_layers) do if d == l then sparse = false end end
      sparse = sparse and (l + 1) % cfg.decoder_sparse_step == 0
    end
    if sparse then
      moe[#moe + 1] = l
      local b = p .. (mixtral and "block_sparse_moe." or "mlp.")
      t[b .. "gate.weight"] = { E, H }
      for e = 0, E - 1 do
        local x = b .. "experts." .. e .. "."
        t[x .. (mixtral and "w1" or "gate_proj") .. ".weight"] = { I, H }
        t[x .. (mixtral and "w3" or "up_proj") .. ".weight"] = { I, H }
        t[x .. (mixtral and "w2" or "down_proj") .. ".weight"] = { H, I }
      end
    else
      local D = cfg.intermediate_size
      t[p .. "mlp.gate_proj.weight"] = { D, H }
      t[p .. "mlp.up_proj.weight"] = { D, H }
      t[p .. "mlp.down_proj.weight"] = { H, D }
    end
  end
  return t, moe, E
end

local function check_file(w, want, what)
  local n = 0
  for _, name in ipairs(w:names()) do
    assert.is_not_nil(want[name], what .. ": unexpected " .. name)
    local info = w:info(name)
    assert.are.same(want[name], info.shape, what .. " " .. name)
    assert.are.equal("F32", info.dtype, what .. " " .. name)
    n = n + 1
  end
  local m = 0
  for _ in pairs(want) do m = m + 1 end
  assert.are.equal(m, n, what .. ": tensor count")
  return n
end

describe("MoE goldens from transformers", function()
  for _, name in ipairs(MODELS) do
    it(name .. ": weights, gradients, logits and routes agree with config.json", function()
      local d = root .. "/" .. name
      local cfg = json(d .. "/config.json")
      local g = json(d .. "/golden.json")
      local want, moe, E = expected(cfg)
      local n = check_file(nibble.load(d .. "/model.safetensors"), want, name .. " model")
      assert.are.equal(n, check_file(nibble.load(d .. "/grads.safetensors"), want, name .. " grads"))
      assert.are.same(moe, g.moe_layers)
      assert.are.equal(cfg.tie_word_embeddings, g.tied)
      local aux = nibble.load(d .. "/aux_grads.safetensors")
      assert.are.equal(#moe, #aux:names())
      for _, gname in ipairs(aux:names()) do assert.are.same({ E, cfg.hidden_size }, aux:info(gname).shape, gname) end
      local rows = g.B * g.T
      assert.are.equal(rows, #g.ids)
      for _, id in ipairs(g.ids) do assert.is_true(id >= 0 and id < cfg.vocab_size) end
      assert.are.equal(rows * cfg.vocab_size * 4, file_size(d .. "/logits_f32le.bin"))
      assert.are.equal(rows * cfg.vocab_size * 4, file_size(d .. "/loss_weights_f32le.bin"))
      -- routes: top_k distinct experts per token in descending weight; weights sum to 1 when renormalised
      local renorm = cfg.model_type == "mixtral" or cfg.norm_topk_prob
      assert.are.equal(cfg.num_experts_per_tok, g.top_k)
      assert.is_true(g.min_topk_margin >= 1e-2, "router choices are decisive")
      for _, l in ipairs(moe) do
        local r, min_sum = g.routes[tostring(l)], math.huge
        assert.are.equal(rows, #r.experts)
        for tok = 1, rows do
          local ex, wt, seen, s = r.experts[tok], r.weights[tok], {}, 0
          assert.are.equal(g.top_k, #ex)
          for j = 1, g.top_k do
            assert.is_true(ex[j] >= 0 and ex[j] < E and not seen[ex[j]])
            seen[ex[j]] = true
            assert.is_true(wt[j] > 0 and wt[j] <= 1 and (j == 1 or wt[j] <= wt[j - 1]))
            s = s + wt[j]
          end
          -- the weights are float32 (transformers' router softmax), so sums are 1 to ~1e-7
          if renorm then assert.is_true(math.abs(s - 1) < 1e-6) else assert.is_true(s < 1 + 1e-6) end
          min_sum = math.min(min_sum, s)
        end
        -- without renormalisation some token's top-k leaves visible probability to the other experts
        if not renorm then assert.is_true(min_sum < 0.99, "not renormalised") end
      end
    end)
  end
end)

local function bytes(t) return ffi.string(t:data(), t.nbytes) end

describe("MoE goldens from ModelOpt", function()
  local fmt = { w4a16 = "NVFP4", nvfp4 = "NVFP4", fp8 = "FP8" }
  for _, name in ipairs(MODELS) do
    for case, kind in pairs(fmt) do
      it(name .. " " .. case .. ": every quantized module's tensors, shared w1/w3 and input scales", function()
        local d = root .. "/" .. name
        local cfg = json(d .. "/config.json")
        local g = json(root .. "/modelopt/" .. name .. "_" .. case .. ".json")
        local w = nibble.load(root .. "/modelopt/" .. name .. "_" .. case .. ".safetensors")
        local want = expected(cfg)
        assert.are.equal(case == "w4a16" and "W4A16_NVFP4" or kind, g.hf_quant_config.quantization.quant_algo)
        assert.are.equal("0.47.0", g.modelopt)
        local per_module = case == "w4a16" and 3 or 4
        local mods = 0
        for tname, shape in pairs(want) do
          local m = tname:match("^(.*_proj)%.weight$") or tname:match("^(.*experts%.%d+%.w%d)%.weight$")
          if m then
            mods = mods + 1
            local out, inn = shape[1], shape[2]
            local wi, si, s2 = w:info(m .. ".weight"), w:info(m .. ".weight_scale"), nil
            if kind == "NVFP4" then
              assert.are.same({ "U8", { out, inn / 2 } }, { wi.dtype, wi.shape }, m)
              assert.are.same({ "F8_E4M3", { out, inn / 16 } }, { si.dtype, si.shape }, m)
              s2 = w:info(m .. ".weight_scale_2")
              assert.are.same({ "F32", {} }, { s2.dtype, s2.shape }, m)
            else
              assert.are.same({ "F8_E4M3", { out, inn } }, { wi.dtype, wi.shape }, m)
              assert.are.same({ "F32", {} }, { si.dtype, si.shape }, m)
            end
            assert.are.equal(case ~= "w4a16", w:has(m .. ".input_scale"), m)
          end
        end
        assert.are.equal(mods * per_module - (kind == "FP8" and mods or 0), #w:names())
        -- one global scale per expert over w1/w3 (gate/up); one input scale per projection per layer
        local inputs = {}
        for _, tname in ipairs(w:names()) do
          local m = tname:match("^(.*experts%.%d+%.)[%w_]+%.weight$")
          if m then
            local g1 = m .. (cfg.model_type == "mixtral" and "w1" or "gate_proj")
            local g3 = m .. (cfg.model_type == "mixtral" and "w3" or "up_proj")
            local leaf = kind == "NVFP4" and ".weight_scale_2" or ".weight_scale"
            assert.are.equal(bytes(w[g1 .. leaf]), bytes(w[g3 .. leaf]), g1)
          end
          local l, proj = tname:match("layers%.(%d+)%.[%w_]+%.experts%.%d+%.([%w_]+)%.input_scale$")
          if l then
            local key = l .. ((proj == "w2" or proj == "down_proj") and "down" or "gate_up")
            local v = w[tname]:data("const float *")[0]
            inputs[key] = inputs[key] or v
            assert.are.equal(inputs[key], v, tname)
            -- input_scale = amax / 448 (FP8) or amax / (6 * 448) (NVFP4), computed by ModelOpt in float32
            local q = ("model.layers.%s.mlp.experts.%s_input_quantizer"):format(l, key:match("%d+(.*)") == "down"
                                                                                   and "down_proj" or "gate_up_proj")
            local amax = assert(g.input_amax[q], q)
            local s = amax / (kind == "FP8" and 448 or 6 * 448)
            assert.is_true(math.abs(v - s) <= 1e-6 * s, ("%s: %.9g vs amax/max %.9g"):format(tname, v, s))
          end
        end
        if case ~= "w4a16" then assert.is_not_nil(next(inputs)) end
      end)
    end
  end
end)

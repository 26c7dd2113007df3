-- nibble.model: Llama-family models (llama, mistral, qwen2, qwen3) from a Hugging Face directory or
-- a GGUF file, as Lua objects over libnibble's nb_model: config, modules and parameters by HF name
-- or glob, forward (logits, hidden states), backward and LM steps, linear hooks, generation and
-- llama.cpp-style perplexity / KL evaluation. Token ids are the model's (0-based) ids.
local ffi = require("ffi")
local bit = require("bit")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local M = {}
local Model = {}
Model.__index = Model

local arch_names = { [0] = "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe" }
local arch_enum = { llama = 0, mistral = 1, qwen2 = 2, qwen3 = 3, mixtral = 4, qwen3_moe = 5 }
-- the mixtures of experts: the sparse MLP's module and each expert's linears (gate, up, down), as
-- model/arch/ names them
local moe_names = { mixtral = { "block_sparse_moe", { "w1", "w3", "w2" } },
                    qwen3_moe = { "mlp", { "gate_proj", "up_proj", "down_proj" } } }
-- module kinds by nb_module_kind: the names recipe.resolve and modules_of use
local kind_names = { [tonumber(C.NB_MODULE_CONTAINER)] = "container", [tonumber(C.NB_MODULE_EMBEDDING)] = "embedding",
                     [tonumber(C.NB_MODULE_LINEAR)] = "linear", [tonumber(C.NB_MODULE_RMSNORM)] = "norm" }
M.kind_names = kind_names
local role_names = { [0] = "q", "k", "v", "o", "gate", "up", "down", "lm_head", "router", "expert_gate", "expert_up",
                     "expert_down" }
M.role_names = role_names
local format_names = { [0] = "memory", "hf", "gguf" }
local rope_names = { [0] = "default", "linear", "llama3", "freq_factors" }
local rope_enum = { default = 0, linear = 1, llama3 = 2, freq_factors = 3 }

local function ptr(m)
  local p = rawget(m, "_p")
  if p == nil then fail("model was freed") end
  return p
end

local function config_table(c)
  local eos, only = {}, {}
  for i = 0, c.n_eos - 1 do eos[#eos + 1] = c.eos_token_ids[i] end
  for l = 0, 255 do
    if bit.band(bit.rshift(c.mlp_only_layers[math.floor(l / 64)], l % 64), 1ULL) ~= 0ULL then only[#only + 1] = l end
  end
  return {
    arch = arch_names[c.arch], vocab_size = tonumber(c.vocab_size), hidden_size = tonumber(c.hidden_size),
    intermediate_size = tonumber(c.intermediate_size), n_layers = tonumber(c.n_layers),
    n_heads = tonumber(c.n_heads), n_kv_heads = tonumber(c.n_kv_heads), head_dim = tonumber(c.head_dim),
    max_position = tonumber(c.max_position), rms_eps = c.rms_eps, rope_theta = c.rope_theta,
    rope = rope_names[c.rope_kind], rope_factor = c.rope_factor, rope_low_freq_factor = c.rope_low_freq_factor,
    rope_high_freq_factor = c.rope_high_freq_factor,
    rope_original_max_position = tonumber(c.rope_original_max_position),
    qkv_bias = c.qkv_bias ~= 0, o_bias = c.o_bias ~= 0, mlp_bias = c.mlp_bias ~= 0, qk_norm = c.qk_norm ~= 0,
    tied = c.tied ~= 0, sliding_window = tonumber(c.sliding_window),
    bos = c.bos_token_id >= 0 and c.bos_token_id or nil, eos = eos,
    n_experts = c.n_experts, n_experts_per_tok = c.n_experts_per_tok, norm_topk_prob = c.norm_topk_prob ~= 0,
    moe_intermediate_size = tonumber(c.moe_intermediate_size), decoder_sparse_step = c.decoder_sparse_step,
    mlp_only_layers = only,
  }
end

-- Whether layer l (from 0) of a config has the sparse MLP (model.c's nb_model_layer_is_moe).
local function layer_is_moe(cfg, l)
  local step = cfg.decoder_sparse_step > 0 and cfg.decoder_sparse_step or 1
  if cfg.n_experts <= 0 or (l + 1) % step ~= 0 then return false end
  for _, x in ipairs(cfg.mlp_only_layers) do if x == l then return false end end
  return true
end

local function wrap_model(p, path)
  local m = setmetatable({ _p = p, _hooks = {} }, Model)
  nibble.note_native()
  local c = C.nb_model_get_config(p)
  m.config = config_table(c)
  m.path = path or ffi.string(C.nb_model_path(p))
  m.format = format_names[C.nb_model_format_of(p)]
  m.arch = m.config.arch
  m.tied = m.config.tied
  return m
end

-- load(path): a HF directory (config.json + safetensors) or a .gguf file.
function M.load(path)
  if type(path) ~= "string" then fail("model.load: expected a path, got " .. type(path)) end
  local out = ffi.new("nb_model *[1]")
  check(C.nb_model_load(nibble.context(), path, out))
  return wrap_model(ffi.gc(out[0], C.nb_model_free), path)
end

-- new(config [, {seed=, std=}]): a model built in memory (fields as in m.config; unset fields take
-- nb_model_config_init's small defaults). With opts, weights are Normal(0, std) from seed.
function M.new(cfg, opts)
  cfg = cfg or {}
  local c = ffi.new("nb_model_config")
  C.nb_model_config_init(c)
  for k, v in pairs(cfg) do
    if k == "arch" then
      local a = arch_enum[v]
      if not a then
        fail("model.new: unknown arch '" .. tostring(v) .. "' (llama, mistral, qwen2, qwen3, mixtral, qwen3_moe)")
      end
      c.arch = a
    elseif k == "mlp_only_layers" then
      for _, l in ipairs(v) do
        if l < 0 or l >= 256 then fail("model.new: mlp_only_layers entries must be in [0, 256)") end
        c.mlp_only_layers[math.floor(l / 64)] = bit.bor(c.mlp_only_layers[math.floor(l / 64)], bit.lshift(1ULL, l % 64))
      end
    elseif k == "rope" then
      local r = rope_enum[v]
      if not r then fail("model.new: unknown rope '" .. tostring(v) .. "'") end
      c.rope_kind = r
    elseif k == "bos" then c.bos_token_id = v
    elseif k == "eos" then
      local list = type(v) == "table" and v or { v }
      c.n_eos = #list
      for i, e in ipairs(list) do c.eos_token_ids[i - 1] = e end
    elseif type(v) == "boolean" then c[k] = v and 1 or 0
    else
      local ok = pcall(function() c[k] = v end)
      if not ok then fail("model.new: unknown config field '" .. tostring(k) .. "'") end
    end
  end
  local out = ffi.new("nb_model *[1]")
  check(C.nb_model_new(nibble.context(), c, out))
  local m = wrap_model(ffi.gc(out[0], C.nb_model_free), "")
  if opts then m:init_random(opts.seed or 0, opts.std or 0.02) end
  return m
end

-- read_config(path): the config of the model at path (the fields of m.config) from config.json and the
-- safetensors headers, or the GGUF metadata, without reading any weight.
function M.read_config(path)
  if type(path) ~= "string" then fail("model.read_config: expected a path, got " .. type(path)) end
  local c = ffi.new("nb_model_config")
  check(C.nb_model_read_config(nibble.context(), path, c))
  return config_table(c)
end

-- modules_of(path or config): the embedding, linear and norm modules a model of that config has, in
-- model order (the order nb_model_load's module tree lists them): { name, kind = "embedding" |
-- "linear" | "norm", in_features, out_features, tied } -- what recipe.resolve takes, so `nibble plan`
-- needs no weights. Held equal to the loaded model's list by lua.model's spec.
function M.modules_of(cfg)
  if type(cfg) == "string" then cfg = M.read_config(cfg) end
  local D, F = cfg.hidden_size, cfg.intermediate_size
  local qd, kvd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  local out = { { name = "model.embed_tokens", kind = "embedding" } }
  local function lin(name, i, o) out[#out + 1] = { name = name, kind = "linear", in_features = i, out_features = o,
                                                    tied = false } end
  for l = 0, cfg.n_layers - 1 do
    local p = "model.layers." .. l
    lin(p .. ".self_attn.q_proj", D, qd)
    lin(p .. ".self_attn.k_proj", D, kvd)
    lin(p .. ".self_attn.v_proj", D, kvd)
    lin(p .. ".self_attn.o_proj", qd, D)
    if cfg.qk_norm then
      out[#out + 1] = { name = p .. ".self_attn.q_norm", kind = "norm" }
      out[#out + 1] = { name = p .. ".self_attn.k_norm", kind = "norm" }
    end
    if layer_is_moe(cfg, l) then
      local blk, names = moe_names[cfg.arch][1], moe_names[cfg.arch][2]
      local Fe = cfg.moe_intermediate_size
      lin(p .. "." .. blk .. ".gate", D, cfg.n_experts)
      for e = 0, cfg.n_experts - 1 do
        local q = p .. "." .. blk .. ".experts." .. e .. "."
        lin(q .. names[1], D, Fe)
        lin(q .. names[2], D, Fe)
        lin(q .. names[3], Fe, D)
      end
    else
      lin(p .. ".mlp.gate_proj", D, F)
      lin(p .. ".mlp.up_proj", D, F)
      lin(p .. ".mlp.down_proj", F, D)
    end
    out[#out + 1] = { name = p .. ".input_layernorm", kind = "norm" }
    out[#out + 1] = { name = p .. ".post_attention_layernorm", kind = "norm" }
  end
  out[#out + 1] = { name = "model.norm", kind = "norm" }
  lin("lm_head", D, cfg.vocab_size)
  out[#out].tied = cfg.tied
  return out
end

function M.is_model(x) return getmetatable(x) == Model end

function Model:init_random(seed, std)
  check(C.nb_model_init_random(nibble.context(), ptr(self), seed or 0, std or 0.02))
  return self
end

function Model:free()
  local p = rawget(self, "_p")
  if p ~= nil then
    for name in pairs(self._hooks) do self:set_hook(name, nil) end
    ffi.gc(p, nil)
    C.nb_model_free(p)
    self._p = nil
  end
end

function Model:__tostring()
  local c = self.config
  return ("nibble.model(%s, %d layers, hidden %d, heads %d/%d, vocab %d%s, %s%s)"):format(c.arch, c.n_layers,
    c.hidden_size, c.n_heads, c.n_kv_heads, c.vocab_size, c.tied and ", tied" or "", self.format,
    self.path ~= "" and (": " .. self.path) or "")
end

-- ---- modules and parameters ---------------------------------------------------------------------

local function module_record(m, i)
  local p = ptr(m)
  local r = { index = i, name = ffi.string(C.nb_model_module_name(p, i)),
              kind = kind_names[C.nb_model_module_kind(p, i)] }
  if r.kind == "linear" then
    local li = ffi.new("nb_linear_info")
    check(C.nb_model_linear_info(nibble.context(), p, i, li))
    r.in_features, r.out_features = tonumber(li.in_features), tonumber(li.out_features)
    r.layer = li.layer >= 0 and li.layer or nil
    r.role = role_names[li.role]
    r.expert = li.expert >= 0 and li.expert or nil
    r.bias = li.has_bias ~= 0
    r.tied = li.tied ~= 0
    r.weight = ffi.string(C.nb_model_param_name(p, li.weight_param))
  end
  return r
end

-- modules([glob]): the modules (in HF named_modules order) whose name matches the glob ('*' also
-- crosses dots): { {name=, kind="linear"|"norm"|"embedding"|"container", index=, ...}, ... }.
-- Linear modules also carry in_features, out_features, layer, role, bias, tied, weight (param name).
function Model:modules(glob)
  local p, out = ptr(self), {}
  for i = 0, tonumber(C.nb_model_module_count(p)) - 1 do
    if glob == nil or C.nb_glob_match(glob, C.nb_model_module_name(p, i)) ~= 0 then
      out[#out + 1] = module_record(self, i)
    end
  end
  return out
end

-- module(name): one module's record; an error names the missing module.
function Model:module(name)
  local i = C.nb_model_find_module(ptr(self), name)
  if i < 0 then fail("model has no module '" .. tostring(name) .. "'") end
  return module_record(self, tonumber(i))
end

-- params([glob]): the parameter names matching the glob, in state-dict order.
function Model:params(glob)
  local p, out = ptr(self), {}
  for i = 0, tonumber(C.nb_model_param_count(p)) - 1 do
    local n = C.nb_model_param_name(p, i)
    if glob == nil or C.nb_glob_match(glob, n) ~= 0 then out[#out + 1] = ffi.string(n) end
  end
  return out
end

local function param_index(m, name)
  local i = C.nb_model_find_param(ptr(m), name)
  if i < 0 then fail("model has no parameter '" .. tostring(name) .. "'") end
  return i
end

-- param(name): the float32 parameter as a tensor (a view: writing it changes the model).
-- With tied embeddings "lm_head.weight" is model.embed_tokens.weight.
function Model:param(name)
  return nibble.wrap(C.nb_model_param(ptr(self), param_index(self, name)), true)
end

-- grad(name): its gradient tensor, or nil before the first backward.
function Model:grad(name)
  local g = C.nb_model_grad(ptr(self), param_index(self, name))
  if g == nil then return nil end
  return nibble.wrap(g, true)
end

-- src_dtype(name): the dtype name the file stored ("f32", "bf16", "f16"), or "quantized".
function Model:src_dtype(name)
  local d = C.nb_model_param_src_dtype(ptr(self), param_index(self, name))
  return d < 0 and "quantized" or nibble.dtype_name(d)
end

function Model:zero_grad() C.nb_model_zero_grad(ptr(self)) end

-- requires_grad(glob, flag): freeze (false) or unfreeze parameters; returns how many matched.
function Model:requires_grad(glob, flag)
  return tonumber(C.nb_model_set_requires_grad(ptr(self), glob, flag == false and 0 or 1))
end

-- set_recompute(true | false | "auto" [, budget_bytes]): how the backward gets each layer's
-- activations: recomputed per layer (true), kept from the forward (false), or kept while they fit
-- in the budget (default 1 GiB) and recomputed otherwise ("auto", the default).
function Model:set_recompute(mode, budget)
  local v = mode == "auto" and C.NB_RECOMPUTE_AUTO or (mode and C.NB_RECOMPUTE_ALWAYS or C.NB_RECOMPUTE_NEVER)
  C.nb_model_set_recompute(ptr(self), v)
  if budget then C.nb_model_set_activation_budget(ptr(self), budget) end
end

-- ---- tokens -------------------------------------------------------------------------------------

-- tokens: {id, ...} (one sequence), {{...}, {...}} (a batch of equal lengths), an nb_tokens, or an
-- int32 tensor [T] / [B, T]. Returns int32_t*, B, T and what keeps the memory alive.
local function tokens_arg(tokens)
  if ffi.istype("nb_tokens", tokens) then return tokens.ids, 1, tonumber(tokens.n), tokens end
  if nibble.is_tensor(tokens) then
    if nibble.dtype_name(tokens.ptr.dtype) ~= "i32" or not tokens:is_contiguous() then
      fail("tokens: expected a contiguous i32 tensor")
    end
    local nd = tokens:dim()
    local B = nd == 2 and tokens:size(1) or 1
    local T = nd == 2 and tokens:size(2) or tokens:numel()
    return tokens:data("int32_t *"), B, T, tokens
  end
  if type(tokens) ~= "table" or #tokens == 0 then fail("tokens: expected a non-empty table of ids") end
  local rows = type(tokens[1]) == "table" and tokens or { tokens }
  local B, T = #rows, #rows[1]
  local buf = ffi.new("int32_t[?]", math.max(B * T, 1))
  for b = 1, B do
    local r = rows[b]
    if type(r) ~= "table" or #r ~= T then fail(("tokens: row %d has %s ids, expected %d"):format(b, type(r) == "table" and #r or "no", T)) end
    for t = 1, T do
      local v = r[t]
      if type(v) ~= "number" then fail(("tokens: element [%d][%d] is %s, not an id"):format(b, t, type(v))) end
      buf[(b - 1) * T + t - 1] = v
    end
  end
  return buf, B, T, buf
end
M.tokens_arg = tokens_arg

-- ---- forward and backward -----------------------------------------------------------------------

-- forward(tokens [, opts]): logits as a tensor [rows, vocab]. opts.last = true keeps only the last
-- position of each sequence; opts.start = k keeps positions k.. (0-based); opts.hidden = true also
-- returns the list of n_layers+1 hidden states [B*T, hidden] (HF output_hidden_states);
-- opts.train = true keeps what backward needs; opts.logits = false computes no logits.
function Model:forward(tokens, opts)
  opts = opts or {}
  local p = ptr(self)
  local ids, B, T, keep = tokens_arg(tokens)
  local V, D, L = self.config.vocab_size, self.config.hidden_size, self.config.n_layers
  local fo = ffi.new("nb_forward_opts")
  local start = opts.last and (T - 1) or (opts.start or 0)
  fo.logits_start = start
  fo.train = opts.train and 1 or 0
  local logits
  if opts.logits ~= false then
    logits = nibble.zeros("f32", B * (T - start), V)
    fo.logits = logits:data("float *")
  end
  local hidden, hptrs
  if opts.hidden then
    hidden = {}
    hptrs = ffi.new("float *[?]", L + 1)
    for l = 1, L + 1 do
      hidden[l] = nibble.zeros("f32", B * T, D)
      hptrs[l - 1] = hidden[l]:data("float *")
    end
    fo.hidden = hptrs
  end
  check(C.nb_model_forward(nibble.context(), p, ids, B, T, fo))
  local _ = keep
  if opts.train then self._train = { B = B, T = T, start = start } end
  return logits, hidden
end

-- backward(dlogits [, dhidden]): accumulate parameter gradients for the last forward{train=true};
-- dlogits is a tensor shaped like its logits (or nil), dhidden an optional list like its hidden.
function Model:backward(dlogits, dhidden)
  local bo = ffi.new("nb_backward_opts")
  if dlogits ~= nil then bo.dlogits = dlogits:contiguous():data("float *") end
  local keep
  if dhidden then
    local L = self.config.n_layers
    keep = ffi.new("const float *[?]", L + 1)
    for l = 1, L + 1 do
      if dhidden[l] then keep[l - 1] = dhidden[l]:data("float *") end
    end
    bo.dhidden = keep
  end
  check(C.nb_model_backward(nibble.context(), ptr(self), bo, nil))
  local _ = keep
end

-- lm_step(tokens [, targets]): forward + backward of the mean next-token cross-entropy (targets
-- default to the tokens shifted by one; -100 skips a position). Gradients accumulate; returns the loss.
function Model:lm_step(tokens, targets)
  local ids, B, T, keep = tokens_arg(tokens)
  local tg, keep2 = nil, nil
  if targets then
    local tids, tB, tT
    tids, tB, tT, keep2 = tokens_arg(targets)
    if tB * tT ~= B * T then fail("lm_step: targets must have as many entries as tokens") end
    tg = tids
  end
  local loss = ffi.new("double[1]")
  check(C.nb_model_lm_step(nibble.context(), ptr(self), ids, B, T, tg, loss))
  local _ = { keep, keep2 }
  return loss[0]
end

-- ---- hooks ----------------------------------------------------------------------------------------

-- set_hook(module_name, hook): hook is an nb_linear_hook cdata (C functions, e.g. a quantizer's),
-- a table {weight = function(w, w_out, rows, cols), input = function(x, rows, cols, pass)} of Lua
-- functions receiving float* (return nothing or a status), or nil to clear it.
function Model:set_hook(name, hook)
  local p = ptr(self)
  local i = C.nb_model_find_module(p, name)
  if i < 0 then fail("model has no module '" .. tostring(name) .. "'") end
  local old = self._hooks[name]
  if hook == nil then
    check(C.nb_model_set_linear_hook(nibble.context(), p, i, nil))
  elseif ffi.istype("nb_linear_hook", hook) then
    check(C.nb_model_set_linear_hook(nibble.context(), p, i, hook))
    self._hooks[name] = { cdata = hook }
  elseif type(hook) == "table" then
    local h = ffi.new("nb_linear_hook")
    local rec = { cdata = h }
    if hook.weight then
      local fn = hook.weight
      rec.wcb = ffi.cast("nb_status (*)(nb_ctx *, void *, const float *, float *, int64_t, int64_t)",
        function(_, _, w, wo, rows, cols) return fn(w, wo, tonumber(rows), tonumber(cols)) or 0 end)
      h.weight = rec.wcb
    end
    if hook.input then
      local fn = hook.input
      rec.icb = ffi.cast("nb_status (*)(nb_ctx *, void *, float *, int64_t, int64_t, int32_t)",
        function(_, _, x, rows, cols, pass) return fn(x, tonumber(rows), tonumber(cols), pass) or 0 end)
      h.input = rec.icb
    end
    check(C.nb_model_set_linear_hook(nibble.context(), p, i, h))
    self._hooks[name] = rec
  else
    fail("set_hook: expected an nb_linear_hook, a table of functions or nil")
  end
  if old and old ~= self._hooks[name] then
    if old.wcb then old.wcb:free() end
    if old.icb then old.icb:free() end
  end
  if hook == nil then self._hooks[name] = nil end
end

-- ---- tokenizer, generation, evaluation --------------------------------------------------------------

-- tokenizer(): the tokenizer stored with the model (tokenizer.json beside config.json, or the
-- GGUF's vocabulary), loaded once.
function Model:tokenizer()
  local t = rawget(self, "_tok")
  if not t then
    if self.path == "" then fail("model has no files to load a tokenizer from") end
    t = nibble.tokenizer.load(self.path)
    self._tok = t
  end
  return t
end

-- nb_generate_opts from generate{} / qad.sample_batch options (greedy unless temperature > 0); keeps the
-- stop array alive in the returned table's second value
function M.generate_opts(o)
  local go = ffi.new("nb_generate_opts")
  go.sample.greedy = (o.greedy or not o.temperature or o.temperature <= 0) and 1 or 0
  go.sample.temperature = o.temperature or 0
  go.sample.top_k = o.top_k or 0
  go.sample.top_p = o.top_p or 1
  go.seed = o.seed or 0
  go.stop_at_eos = o.stop_at_eos == false and 0 or 1
  local stop = o.stop_ids
  if stop and #stop > 0 then
    local arr = ffi.new("int32_t[?]", #stop)
    for k, id in ipairs(stop) do arr[k - 1] = id end
    go.stop, go.n_stop = arr, #stop
    return go, arr
  end
  return go
end

-- generate{prompt = text or {ids}, n = 128, greedy = true | temperature =, top_k =, top_p =, seed =,
-- stop = true (stop at EOS), on_text = function(piece)}: returns the new text and the new ids.
-- Without a prompt generation starts from BOS. Text needs the model's tokenizer.
-- generate{messages = { {role=, content=}, ... }, ...} answers a conversation instead: the prompt is the
-- model's chat template with the assistant's header (tokenizer:encode_chat), and generation also stops at
-- the template's end-of-turn tokens (<|im_end|>, <|eot_id|>, <end_of_turn>).
-- The decoding is nb_model_generate's (one row); on_text streams from its per-token callback.
function Model:generate(o)
  o = o or {}
  local p, ctx = ptr(self), nibble.context()
  local prompt = o.prompt
  local tok
  local function tk() tok = tok or self:tokenizer(); return tok end
  local stop_eog = false
  if o.messages ~= nil then
    if prompt ~= nil then fail("generate: give a prompt or messages, not both") end
    prompt = tk():encode_chat(o.messages, { add_generation_prompt = true, template = o.chat_template })
    stop_eog = true
  end
  if prompt == nil then
    if not self.config.bos then fail("generate: the model has no BOS token; give a prompt") end
    prompt = { self.config.bos }
  elseif type(prompt) == "string" then
    prompt = tk():encode(prompt)
    if #prompt == 0 then prompt = { self.config.bos } end
  end
  local ids, _, np, keep = tokens_arg(prompt)
  local n = o.n or 128
  -- a chat answer also ends at the template's end-of-turn tokens: every id the tokenizer calls EOG
  local eog
  if stop_eog and o.stop ~= false then
    eog = {}
    for id = 0, tk().vocab_size - 1 do
      if tk():is_eog(id) then eog[#eog + 1] = id end
    end
  end
  local go, stop_arr = M.generate_opts { greedy = o.greedy, temperature = o.temperature, top_k = o.top_k,
    top_p = o.top_p, seed = o.seed, stop_at_eos = o.stop ~= false, stop_ids = eog }
  -- new text = decode(prompt .. new ids) minus decode(prompt): decoding the new ids alone would
  -- lose the space SentencePiece folds into a word's first piece
  local all, out = {}, {}
  for k = 0, np - 1 do all[k + 1] = ids[k] end
  local base, printed
  local function new_text()
    local d = tk()
    local full = d:decode(all, { skip_special = true })
    if full:sub(1, #base) == base then return full:sub(#base + 1) end
    return d:decode(out, { skip_special = true })
  end
  local cb, cb_err
  if o.on_text then
    base = tk():decode(all, { skip_special = true })
    printed = ""
    -- an error in on_text must not unwind through C: it stops the decoding, and is raised below
    cb = ffi.cast("nb_token_fn", function(c, _, _, t)
      local okc, e = pcall(function()
        out[#out + 1] = t
        all[#all + 1] = t
        local text = new_text()
        if #text > #printed and text:sub(1, #printed) == printed then
          o.on_text(text:sub(#printed + 1))
          printed = text
        end
      end)
      if okc then return 0 end
      cb_err = e
      return C.nb_fail(c, C.NB_ERR_INVALID, "%s", "generate: on_text failed")
    end)
    go.on_token = cb
  end
  local lens = ffi.new("int64_t[1]", np)
  local buf, nout = ffi.new("int32_t[?]", math.max(n, 1)), ffi.new("int64_t[1]")
  local st = C.nb_model_generate(ctx, p, ids, lens, 1, n, go, buf, nout)
  if cb then cb:free() end
  if cb_err ~= nil then error(cb_err, 0) end
  check(st)
  local _ = keep, stop_arr
  if not cb then
    for k = 0, tonumber(nout[0]) - 1 do
      out[k + 1] = buf[k]
      all[np + k + 1] = buf[k]
    end
  end
  local text
  if o.text ~= false and (type(o.prompt) == "string" or rawget(self, "_tok") or self.path ~= "") then
    local ok, s = pcall(function()
      if not base then
        local pre = {}
        for k = 1, np do pre[k] = all[k] end
        base = tk():decode(pre, { skip_special = true })
      end
      return new_text()
    end)
    text = ok and s or nil
  end
  return text, out
end

-- eval{data = path or text, tokens = ids/nb_tokens, ctx = 512, chunks = N, batch =, teacher =
-- model or path, bos = id, progress = function(done, total)}: perplexity with llama.cpp's llama-perplexity method; with a teacher also
-- the mean KL(teacher || model) per token and the top-1 agreement in percent.
-- Returns {ppl, ppl_err, nll, tokens, chunks, kld, top1} (the last two nil without teacher; top1 in %; the
-- names qad.evaluate and the QAD metrics use).
function Model:eval(o)
  o = o or {}
  local toks = o.tokens
  if toks == nil then
    local text = o.text
    if o.data then text = nibble.data.read_text(o.data, "eval") end
    if not text then fail("eval: give data (a file), text or tokens") end
    toks = self:tokenizer():encode_tokens(text)
  end
  local ids, _, n, keep = tokens_arg(toks)
  local teacher = o.teacher
  if type(teacher) == "string" then teacher = M.load(teacher) end
  local eo = ffi.new("nb_eval_opts")
  eo.n_ctx = o.ctx or 512
  eo.n_chunks = o.chunks or 0
  eo.batch = o.batch or 0
  eo.bos = o.bos or -1
  local cb, cb_err
  if o.progress then
    -- an error in the callback must not unwind through C: it stops the eval, and is raised below
    local fn = o.progress
    cb = ffi.cast("nb_status (*)(nb_ctx *, void *, int64_t, int64_t)", function(c, _, done, total)
      local ok, e = pcall(fn, tonumber(done), tonumber(total))
      if ok then return 0 end
      cb_err = e
      return C.nb_fail(c, C.NB_ERR_INVALID, "%s", "eval: the progress function failed")
    end)
    eo.on_chunks = cb
  end
  local r = ffi.new("nb_eval_result")
  local st = C.nb_model_eval(nibble.context(), ptr(self), teacher and ptr(teacher) or nil, ids, n, eo, r)
  if cb then cb:free() end
  if cb_err ~= nil then error(cb_err, 0) end
  check(st)
  local _ = keep
  local res = { ppl = r.ppl, ppl_err = r.ppl_err, nll = r.nll, tokens = tonumber(r.tokens), chunks = tonumber(r.chunks) }
  if teacher then res.kld, res.top1 = r.kld_mean, r.top1_agree end
  return res
end

-- Calls that may run Lua hooks (FFI callbacks) must not be JIT-compiled: LuaJIT refuses a
-- callback from C code entered through a compiled trace.
for _, name in ipairs({ "forward", "backward", "lm_step", "generate", "eval" }) do
  if jit and jit.off then jit.off(Model[name], true) end
end

return setmetatable(M, { __call = function(_, path) return M.load(path) end })

-- nibble.distill: the QAD losses of libnibble (nibble/distill.h) from Lua. KL(teacher‖student), reverse
-- KL, teacher top-k KL, cross-entropy; masks and weights; values and d loss / d student logits; whole
-- batches or row chunks (begin / chunk / finish) so full logits never exist twice.
--   local d = nibble.distill
--   local r, g = d.loss { student = s, teacher = t, labels = l, temperature = 2, grad = true }
--   r.loss, r.kd, r.lm, r.tokens          g: d loss / d s, a new [n, V] f32 tensor
-- Config keys (the loss part of a recipe's `distill` table): loss = "kl" | "reverse_kl" | "ce",
-- temperature, t2, topk (k, or {k, norm = "renorm" | "student_full" | "ghost"}), topk_norm,
-- lm_loss, kd_loss_scale, ignore_index. The exact definitions are in core/include/nibble/distill.h.
local ffi = require("ffi")
local nibble = require("nibble")
local S = require("nibble.qad_settings")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local D = {}

local kd_kinds = {
  kl = C.NB_KD_FORWARD, forward_kl = C.NB_KD_FORWARD, forward = C.NB_KD_FORWARD,
  reverse_kl = C.NB_KD_REVERSE, reverse = C.NB_KD_REVERSE, rkl = C.NB_KD_REVERSE,
  ce = C.NB_KD_NONE, none = C.NB_KD_NONE,
}
local norms = { renorm = C.NB_TOPK_RENORM, student_full = C.NB_TOPK_STUDENT_FULL, ghost = C.NB_TOPK_GHOST }
D.kd_kinds, D.topk_norms = kd_kinds, norms

-- Keys this module reads (the loss rows of the QAD settings list), and the rest of a recipe's distill
-- table (the training loop's), which it leaves alone.
local loss_keys, distill_keys = {}, S.section("distill")
for k, row in pairs(distill_keys) do if row.loss then loss_keys[k] = true end end
local function other_keys() return distill_keys end
-- keys of D.loss / chunk arguments that are tensors, not configuration
local batch_keys = { student = true, teacher = true, topk_vals = true, topk_idx = true, topk_lse = true,
                     labels = true, weights = true, grad = true, cfg = true }

local function names(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ", ")
end

-- config(t): an nb_distill_cfg from a table (or a cfg itself, returned as is).
function D.config(t)
  if ffi.istype("nb_distill_cfg", t) then return t end
  t = t or {}
  if type(t) ~= "table" then fail("distill.config: expected a table, got " .. type(t)) end
  local others = other_keys()
  for k in pairs(t) do
    if not loss_keys[k] and not others[k] and not batch_keys[k] then
      fail(("distill: unknown key '%s' (loss keys: %s)"):format(tostring(k), names(loss_keys)))
    end
  end
  local cfg = ffi.new("nb_distill_cfg")
  C.nb_distill_cfg_init(cfg)
  if t.loss ~= nil then
    local kd = kd_kinds[t.loss]
    if kd == nil then fail(("distill: unknown loss '%s' (one of %s)"):format(tostring(t.loss), names(kd_kinds))) end
    cfg.kd = kd
    if t.loss == "ce" and t.lm_loss == nil then cfg.lm_loss = 1 end
  end
  if t.temperature ~= nil then
    if type(t.temperature) ~= "number" then fail("distill: temperature must be a number") end
    cfg.temperature = t.temperature
  end
  if t.t2 ~= nil then cfg.t2_scale = t.t2 and 1 or 0 end
  local k, norm = t.top_k, t.topk_norm
  if type(t.topk) == "number" then k = t.topk
  elseif type(t.topk) == "table" then k, norm = t.topk.k or t.topk[1], t.topk.norm or norm
  elseif t.topk ~= nil and t.topk ~= false then fail("distill: topk must be a number or {k, norm = ...}") end
  if k ~= nil then
    if type(k) ~= "number" or k % 1 ~= 0 or k < 0 then fail("distill: topk must be a whole number >= 0") end
    cfg.top_k = k
  end
  if norm ~= nil then
    local n = norms[norm]
    if n == nil then fail(("distill: unknown topk norm '%s' (one of %s)"):format(tostring(norm), names(norms))) end
    cfg.topk_norm = n
  end
  if t.lm_loss ~= nil then cfg.lm_loss = t.lm_loss and 1 or 0 end
  if t.kd_loss_scale ~= nil then cfg.kd_loss_scale = t.kd_loss_scale end
  if t.ignore_index ~= nil then cfg.ignore_index = t.ignore_index end
  return cfg
end

local function ptr(x, what)
  if x == nil or x == false then return nil end
  if not nibble.is_tensor(x) then fail(("distill: %s must be a tensor"):format(what)) end
  local p = x.ptr
  if p == nil then fail(("distill: %s was released"):format(what)) end
  return p
end

local function batch_of(a)
  local b = ffi.new("nb_distill_batch")
  b.student = ptr(a.student, "student")
  if b.student == nil then fail("distill: student logits are required") end
  b.teacher = ptr(a.teacher, "teacher")
  local tk = a.topk_vals and a or (type(a.topk) == "table" and nibble.is_tensor(a.topk[1]) and {
    topk_vals = a.topk[1], topk_idx = a.topk[2], topk_lse = a.topk[3] }) or a
  b.topk_vals = ptr(tk.topk_vals, "topk_vals")
  b.topk_idx = ptr(tk.topk_idx, "topk_idx")
  b.topk_lse = ptr(tk.topk_lse, "topk_lse")
  b.labels = ptr(a.labels, "labels")
  b.weights = ptr(a.weights, "weights")
  return b
end

-- grad = true: a new f32 tensor like student; "inplace": the student itself; a tensor: that one.
local function grad_of(a)
  local g = a.grad
  if g == nil or g == false then return nil end
  if g == true then return nibble.zeros("f32", a.student.shape) end
  if g == "inplace" then return a.student end
  if nibble.is_tensor(g) then return g end
  fail("distill: grad must be true, \"inplace\" or a tensor")
end

local function result(r)
  return { loss = r.loss, kd = r.kd, lm = r.lm, tokens = tonumber(r.tokens), weight_sum = r.weight_sum }
end

-- loss{student, teacher | topk_vals + topk_idx [+ topk_lse], labels, weights, grad, <config keys> | cfg}
-- → result {loss, kd, lm, tokens, weight_sum}, grad tensor (or nil).
function D.loss(a)
  if type(a) ~= "table" then fail("distill.loss: expected a table of arguments") end
  local cfg = a.cfg and D.config(a.cfg) or D.config(a)
  local b = batch_of(a)
  local g = grad_of(a)
  local out = ffi.new("nb_distill_result")
  check(C.nb_distill_loss(nibble.ctx, cfg, b, g and g.ptr or nil, out))
  return result(out), g
end

-- ---- chunked use ---------------------------------------------------------------------------------

local State = {}
State.__index = State

-- begin(cfg_or_table, n_rows [, labels [, weights]]): a batch of n_rows rows fed in chunks.
function D.begin(cfg, n_rows, labels, weights)
  cfg = D.config(cfg)
  if type(n_rows) ~= "number" then fail("distill.begin: n_rows must be a number") end
  local st = ffi.new("nb_distill_state")
  check(C.nb_distill_begin(nibble.ctx, cfg, n_rows, ptr(labels, "labels"), ptr(weights, "weights"), st))
  return setmetatable({ st = st }, State)
end

-- chunk{student, teacher | topk..., labels, weights, grad}: add rows; returns the grad tensor (or nil).
function State:chunk(a)
  local b = batch_of(a)
  local g = grad_of(a)
  check(C.nb_distill_chunk(nibble.ctx, self.st, b, g and g.ptr or nil))
  return g
end

-- Megatron's dynamic balance (after a forward-only pass): kd_coef = kd_loss_scale · lm / kd.
function State:rescale_kd(lm, kd) C.nb_distill_rescale_kd(self.st, lm, kd) end

function State:finish()
  local out = ffi.new("nb_distill_result")
  check(C.nb_distill_finish(nibble.ctx, self.st, out))
  return result(out)
end

-- The divisor of the means (settable: e.g. the token count of all gradient-accumulation micro-batches).
function State:denom(v)
  if v ~= nil then
    if type(v) ~= "number" or not (v > 0) then fail("distill: denom must be a number > 0") end
    self.st.denom = v
  end
  return self.st.denom
end

function State:coefs() return self.st.lm_coef, self.st.kd_coef end

-- topk(teacher, k [, temperature [, lse_dtype]]): the teacher's top k per row → vals [n, k] f32,
-- idx [n, k] i32 and (when lse_dtype is "f32" or "f64") logsumexp(teacher / T) [n].
function D.topk(teacher, k, temperature, lse_dtype)
  local tp = ptr(teacher, "teacher")
  if tp == nil then fail("distill.topk: teacher logits are required") end
  if type(k) ~= "number" then fail("distill.topk: k must be a number") end
  local shape = teacher.shape
  local n = teacher:numel() / shape[#shape]
  local vals = nibble.zeros("f32", { n, k })
  local idx = nibble.zeros("i32", { n, k })
  local lse = lse_dtype and nibble.zeros(lse_dtype, { n }) or nil
  check(C.nb_distill_topk(nibble.ctx, tp, k, temperature or 1.0, vals.ptr, idx.ptr, lse and lse.ptr or nil))
  return vals, idx, lse
end

-- ---- step-level API: loss objects and the student (nibble.qad re-exports them as qad.loss, qad.student, ...)

-- Outputs of student:forward, weakly keyed: tensor -> {model, kind = "logits" | "hidden", layer}.
local owners = setmetatable({}, { __mode = "k" })

local Loss = {}
Loss.__index = Loss

-- objective(value [, grads]) (qad.loss): a loss object. grads maps tensors that student:forward returned (logits, hidden
-- states) to d loss / d tensor (f32 tensors of the same shape).
function D.objective(value, grads)
  if type(value) ~= "number" then fail("qad.loss(value, grads): value must be a number") end
  return setmetatable({ value = value, grads = grads or {} }, Loss)
end
function D.is_objective(x) return getmetatable(x) == Loss end

local function scaled(g, k)
  if k == 1 then return g end
  return nibble.optim.accumulate(nibble.zeros("f32", g.shape), g, k)
end

local function combine(a, b, kb)
  local out = D.objective(a.value + kb * b.value)
  for t, g in pairs(a.grads) do out.grads[t] = g end
  for t, g in pairs(b.grads) do
    if out.grads[t] then
      out.grads[t] = nibble.optim.accumulate(out.grads[t]:clone(), g, kb)
    else
      out.grads[t] = scaled(g, kb)
    end
  end
  return out
end

local function as_loss(x)
  if D.is_objective(x) then return x end
  if type(x) == "number" then return D.objective(x) end
  fail("loss arithmetic: expected a loss or a number, got " .. type(x))
end

Loss.__add = function(a, b) return combine(as_loss(a), as_loss(b), 1) end
Loss.__sub = function(a, b) return combine(as_loss(a), as_loss(b), -1) end
Loss.__unm = function(a) return combine(D.objective(0), a, -1) end
Loss.__mul = function(a, b)
  local k, l = a, b
  if D.is_objective(a) then k, l = b, a end
  if type(k) ~= "number" then fail("loss arithmetic: a loss can only be multiplied by a number") end
  return combine(D.objective(0), l, k)
end
Loss.__div = function(a, b)
  if type(b) ~= "number" then fail("loss arithmetic: a loss can only be divided by a number") end
  return combine(D.objective(0), a, 1 / b)
end
Loss.__tostring = function(a) return ("qad.loss(%.6g)"):format(a.value) end

-- backward(): every gradient goes to the model whose forward produced its tensor (student:forward);
-- one model:backward per model, logits and hidden-state gradients together.
function Loss:backward()
  local per = {}
  for t, g in pairs(self.grads) do
    local o = owners[t]
    if not o then
      fail("loss:backward: a gradient is attached to a tensor that no student:forward returned (the teacher's?)")
    end
    local e = per[o.model]
    if not e then
      e = { hidden = {} }
      per[o.model] = e
    end
    if o.kind == "logits" then
      e.logits = e.logits and nibble.optim.accumulate(e.logits:clone(), g, 1) or g
    else
      local h = e.hidden[o.layer]
      e.hidden[o.layer] = h and nibble.optim.accumulate(h:clone(), g, 1) or g
    end
  end
  for model, e in pairs(per) do
    model:backward(e.logits, next(e.hidden) and e.hidden or nil)
  end
  return self.value
end

-- kd(kind, student_logits, teacher_logits [, opts]): a distillation loss (kind "kl", "reverse_kl", "ce")
-- with opts mask (u8/f32 weights [B, T] or [N]), labels (i32), temperature, t2, topk, lm_loss,
-- kd_loss_scale. Returns the loss object and the result table {loss, kd, lm, tokens}.
function D.kd(kind, s, t, opts)
  opts = opts or {}
  local a = { student = s, teacher = t, loss = kind, grad = true }
  for k, v in pairs(opts) do
    if k == "mask" then a.weights = v else a[k] = v end
  end
  if a.weights and not a.weights:is_contiguous() then a.weights = a.weights:contiguous() end
  local r, g = D.loss(a)
  return D.objective(r.loss, { [s] = g }), r
end

local Student = {}
Student.__index = Student

-- student(model [, qm]): the model whose forward outputs losses can flow back into (fake quant switched
-- on when a qmodel is given).
function D.student(model, qm)
  if qm then qm:set_fake(true) end
  return setmetatable({ model = model, qmodel = qm }, Student)
end

-- forward(tokens [, opts]): model:forward with train = true; opts.hidden = true also returns the hidden
-- states. The returned tensors are registered so a loss on them can backward.
function Student:forward(tokens, opts)
  opts = opts or {}
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.train = true
  local logits, hidden = self.model:forward(tokens, o)
  if logits then owners[logits] = { model = self.model, kind = "logits" } end
  for l, h in ipairs(hidden or {}) do owners[h] = { model = self.model, kind = "hidden", layer = l } end
  return logits, hidden
end

-- params(): names, parameter tensors and (after a backward) gradient tensors of the trainable parameters.
function Student:params()
  local names, params, grads = {}, {}, {}
  for _, n in ipairs(self.model:params()) do
    names[#names + 1] = n
    params[#params + 1] = self.model:param(n)
  end
  return names, params, grads
end

function Student:grads(names)
  local g = {}
  for i, n in ipairs(names) do g[i] = self.model:grad(n) or false end
  return g
end

function Student:zero_grad() self.model:zero_grad() end

-- ---- differentiable forms (step-level QAD pipelines) -------------------------------------------------
-- kl(student_logits, teacher_logits [, opts]), reverse_kl(...), ce(student_logits, labels [, opts]): a
-- nibble.qad loss object (.value, :backward(), + - * / with numbers) whose gradient flows into the tensor
-- student:forward returned, and the result table {loss, kd, lm, tokens}. opts: mask (weights [B, T] or
-- [N]), labels, and the config keys above (temperature, t2, topk, lm_loss, kd_loss_scale, ...).
function D.kl(s, t, opts) return D.kd("kl", s, t, opts) end
function D.reverse_kl(s, t, opts) return D.kd("reverse_kl", s, t, opts) end
function D.ce(s, labels, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.labels = labels
  return D.kd("ce", s, nil, o)
end

-- Loops that end in C calls which may run Lua hooks must not be compiled.
for _, f in ipairs({ Student.forward, Loss.backward }) do
  if jit and jit.off then jit.off(f, true) end
end

return D

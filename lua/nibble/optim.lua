-- nibble.optim: AdamW over FP32 master weights (bit-exact with torch.optim.AdamW), global-norm gradient
-- clipping, gradient accumulation and the warmup + cosine LR schedule (nibble/optim.h) from Lua.
--   local opt = nibble.optim.adamw({w1, w2}, { lr = 1e-5, weight_decay = 0.0 })
--   local sched = nibble.optim.schedule { lr = 1e-5, min_lr = 5e-6, warmup = 50, total = 1000 }
--   local norm, ok = nibble.optim.clip_grad_norm({g1, g2}, 1.0)
--   if ok then opt:step({g1, g2}, sched(step)) end
-- Parameter indices are 1-based here (0-based in C).
local ffi = require("ffi")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local O = {}

local function tensor_list(list, n, what, allow_nil)
  local arr = ffi.new("nb_tensor *[?]", math.max(n, 1))
  for i = 1, n do
    local t = list[i]
    if t == nil or t == false then
      if not allow_nil then fail(("optim: %s %d is missing"):format(what, i)) end
      arr[i - 1] = nil
    else
      if not nibble.is_tensor(t) then fail(("optim: %s %d is not a tensor"):format(what, i)) end
      if t.ptr == nil then fail(("optim: %s %d was released"):format(what, i)) end
      arr[i - 1] = t.ptr
    end
  end
  return arr
end

local Adam = {}
Adam.__index = Adam

-- adamw(params [, opts]): opts lr, betas = {b1, b2} (or beta1, beta2), eps, weight_decay (torch defaults:
-- 1e-3, (0.9, 0.999), 1e-8, 1e-2), no_decay = {i, ...} for parameters without weight decay.
function O.adamw(params, opts)
  if type(params) ~= "table" then fail("optim.adamw: params must be a list of f32 tensors") end
  opts = opts or {}
  local cfg = ffi.new("nb_adamw_cfg")
  C.nb_adamw_cfg_init(cfg)
  if opts.lr ~= nil then cfg.lr = opts.lr end
  local betas = opts.betas or {}
  if opts.beta1 or betas[1] then cfg.beta1 = opts.beta1 or betas[1] end
  if opts.beta2 or betas[2] then cfg.beta2 = opts.beta2 or betas[2] end
  if opts.eps ~= nil then cfg.eps = opts.eps end
  if opts.weight_decay ~= nil then cfg.weight_decay = opts.weight_decay end
  local n = #params
  local arr = tensor_list(params, n, "param")
  local out = ffi.new("nb_adamw *[1]")
  check(C.nb_adamw_new(nibble.ctx, cfg, n, arr, out))
  local self = setmetatable({ opt = ffi.gc(out[0], C.nb_adamw_free), n = n, params = { unpack(params, 1, n) },
                              cfg = cfg }, Adam)
  for _, i in ipairs(opts.no_decay or {}) do self:set_weight_decay(i, 0.0) end
  return self
end

local function index(self, i)
  if type(i) ~= "number" or i < 1 or i > self.n or i % 1 ~= 0 then
    fail(("optim: parameter index %s out of range 1..%d"):format(tostring(i), self.n))
  end
  return i - 1
end

function Adam:count() return self.n end

function Adam:set_weight_decay(i, wd)
  check(C.nb_adamw_set_weight_decay(nibble.ctx, self.opt, index(self, i), wd))
end

-- set_lr_scale(i, s): parameter i steps at lr * s (a param group of its own).
function Adam:set_lr_scale(i, s)
  check(C.nb_adamw_set_lr_scale(nibble.ctx, self.opt, index(self, i), s))
end

-- step(grads [, lr]): grads[i] for params[i] (nil or false: skip that parameter this step).
function Adam:step(grads, lr)
  if type(grads) ~= "table" then fail("optim: step needs a list of gradients") end
  local arr = tensor_list(grads, self.n, "grad", true)
  check(C.nb_adamw_step(nibble.ctx, self.opt, ffi.cast("const nb_tensor *const *", arr), lr or -1.0))
end

-- state(i): {m = tensor, v = tensor, step = n}, m and v being the optimizer's own tensors (live views).
function Adam:state(i)
  local m, v = ffi.new("nb_tensor *[1]"), ffi.new("nb_tensor *[1]")
  local step = ffi.new("int64_t[1]")
  check(C.nb_adamw_get_state(nibble.ctx, self.opt, index(self, i), m, v, step))
  return { m = nibble.wrap(m[0], true), v = nibble.wrap(v[0], true), step = tonumber(step[0]) }
end

function Adam:set_state(i, m, v, step)
  if not (nibble.is_tensor(m) and nibble.is_tensor(v)) then fail("optim: set_state needs tensors m and v") end
  check(C.nb_adamw_set_state(nibble.ctx, self.opt, index(self, i), m.ptr, v.ptr, step or 0))
end

-- state_dict(): a list of {m, v, step} with copies of the tensors, for a checkpoint;
-- load_state_dict(sd) puts them back (a resumed run is bit-identical).
function Adam:state_dict()
  local sd = {}
  for i = 1, self.n do
    local s = self:state(i)
    sd[i] = { m = s.m:clone(), v = s.v:clone(), step = s.step }
  end
  return sd
end

function Adam:load_state_dict(sd)
  if type(sd) ~= "table" or #sd ~= self.n then
    fail(("optim: state dict has %s entries, the optimizer has %d parameters"):format(
      type(sd) == "table" and tostring(#sd) or "no", self.n))
  end
  for i = 1, self.n do self:set_state(i, sd[i].m, sd[i].v, sd[i].step) end
end

-- clip_grad_norm(grads, max_norm) → total norm, ok. ok is false (and the gradients unchanged) when the
-- norm is not finite: skip that step.
function O.clip_grad_norm(grads, max_norm)
  if type(grads) ~= "table" then fail("optim.clip_grad_norm: grads must be a list of tensors") end
  local n = table.maxn(grads)
  local arr = tensor_list(grads, n, "grad", true)
  local total = ffi.new("double[1]")
  local s = C.nb_clip_grad_norm(nibble.ctx, n, arr, max_norm, total)
  if s == C.NB_ERR_NUMERIC then
    C.nb_ctx_clear_error(nibble.ctx)
    return total[0], false
  end
  check(s)
  return total[0], true
end

-- accumulate(acc, g [, scale]): acc += scale · g.
function O.accumulate(acc, g, scale)
  if not (nibble.is_tensor(acc) and nibble.is_tensor(g)) then fail("optim.accumulate needs two tensors") end
  check(C.nb_grad_accumulate(nibble.ctx, acc.ptr, g.ptr, scale or 1.0))
  return acc
end

-- schedule{lr, min_lr, warmup | warmup_ratio, total}: a function step → lr (step = optimizer steps taken;
-- warmup_ratio gives ceil(ratio · total) as HF does).
function O.schedule(t)
  if type(t) ~= "table" or type(t.lr) ~= "number" or type(t.total) ~= "number" then
    fail("optim.schedule needs {lr = number, total = number [, min_lr, warmup | warmup_ratio]}")
  end
  local warm = t.warmup
  if warm == nil and t.warmup_ratio then warm = math.ceil(t.warmup_ratio * t.total) end
  local s = ffi.new("nb_lr_schedule", { lr = t.lr, min_lr = t.min_lr or 0.0, warmup_steps = warm or 0,
                                        total_steps = t.total })
  return function(step) return C.nb_lr_at(s, step) end, s
end

return O

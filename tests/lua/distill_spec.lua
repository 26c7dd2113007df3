-- nibble.distill and nibble.optim from Lua, against the same golden data as the C tests
-- (tests/golden/gen_distill_golden.py: float64 torch autograd, torch.optim.AdamW, clip_grad_norm_,
-- transformers' cosine schedule): config parsing, whole-batch and chunked losses with gradients, the
-- cached top-k form, AdamW bit for bit with a save/restore in the middle, clipping, the schedule, errors.
local nibble = require("nibble")
local ffi = require("ffi")
local json = require("nibble.json")
local nbspec = require("nbspec")

local src = os.getenv("NIBBLE_SOURCE_DIR") or "."
local function slurp(p)
  local f = assert(io.open(src .. "/" .. p, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
local G = json.decode(slurp("tests/golden/data/distill_golden.json"))
local BLOB = slurp("tests/golden/data/distill_golden.bin")
local BASE = ffi.cast("const uint8_t *", BLOB)

local dtypes = { f32 = "f32", f64 = "f64", i32 = "i32" }
local ctypes = { f32 = "const float *", f64 = "const double *", i32 = "const int32_t *" }
-- golden array → a new tensor of its dtype (and the raw pointer for comparisons)
-- (BASE points into BLOB: arr uses BLOB too, so the string stays alive as long as arr does)
local function arr(name)
  local a = assert(G.arrays[name], name)
  local t = nibble.zeros(dtypes[a.dtype], a.shape)
  assert(a.offset + t.nbytes <= #BLOB, name)
  ffi.copy(t:data(), BASE + a.offset, t.nbytes)
  return t, ffi.cast(ctypes[a.dtype], BASE + a.offset)
end

local err_of = nbspec.err_of

local function case_args(c)
  local w = c.data
  local a = { student = arr(w .. ".student"), teacher = arr(w .. ".teacher"),
              labels = c.labels and arr(w .. ".labels") or nil, weights = c.weights and arr(w .. ".weights") or nil,
              loss = c.kd == "forward" and "kl" or c.kd == "reverse" and "reverse_kl" or "ce",
              temperature = c.temperature, t2 = c.t2, lm_loss = c.lm_loss, kd_loss_scale = c.kd_loss_scale }
  if c.top_k > 0 then a.topk = { c.top_k, norm = c.topk_norm } end
  return a
end

local function check_grad(g, ref_name)
  local _, ref = arr(ref_name)
  local x = g:data("const float *")
  local bad = 0
  for i = 0, g:numel() - 1 do
    if math.abs(x[i] - ref[i]) > 6e-8 * math.abs(ref[i]) + 1e-13 then bad = bad + 1 end
  end
  assert.are.equal(0, bad)
end

describe("nibble.distill", function()
  it("parses configs and rejects unknown keys and values", function()
    local cfg = nibble.distill.config { loss = "reverse_kl", temperature = 2, t2 = false, topk = { 8, norm = "ghost" },
                                        lm_loss = true, kd_loss_scale = 0.5, steps = 1000, lr = 1e-5 }
    assert.are.equal(nibble.C.NB_KD_REVERSE, cfg.kd)
    assert.are.equal(2, cfg.temperature)
    assert.are.equal(0, cfg.t2_scale)
    assert.are.equal(8, cfg.top_k)
    assert.are.equal(nibble.C.NB_TOPK_GHOST, cfg.topk_norm)
    assert.are.equal(1, cfg.lm_loss)
    assert.are.equal(0.5, cfg.kd_loss_scale)
    local def = nibble.distill.config {}
    assert.are.equal(nibble.C.NB_KD_FORWARD, def.kd)
    assert.are.equal(1, def.temperature)
    assert.are.equal(-100, def.ignore_index)
    assert.are.equal(1, nibble.distill.config { loss = "ce" }.lm_loss)
    local e = err_of(nibble.distill.config, { temprature = 2 })
    assert.truthy(e:find("unknown key 'temprature'", 1, true), e)
    e = err_of(nibble.distill.config, { loss = "jsd" })
    assert.truthy(e:find("unknown loss 'jsd'", 1, true), e)
    e = err_of(nibble.distill.config, { topk = { 5, norm = "full" } })
    assert.truthy(e:find("unknown topk norm 'full'", 1, true), e)
  end)

  it("matches the float64 torch values and gradients of every golden case", function()
    local n = 0
    for _, c in ipairs(G.distill_cases) do
      local a = case_args(c)
      a.grad = true
      local r, g
      if c.dynamic then
        local st = nibble.distill.begin(a, a.student.shape[1], a.labels, a.weights)
        st:chunk { student = a.student, teacher = a.teacher, labels = a.labels, weights = a.weights }
        local fwd = st:finish()
        st = nibble.distill.begin(a, a.student.shape[1], a.labels, a.weights)
        st:rescale_kd(fwd.lm, fwd.kd)
        local _, kd_coef = st:coefs()
        assert.is_true(math.abs(kd_coef - c.kd_coef) <= 1e-12 * c.kd_coef)
        g = st:chunk { student = a.student, teacher = a.teacher, labels = a.labels, weights = a.weights, grad = true }
        r = st:finish()
      else
        r, g = nibble.distill.loss(a)
      end
      assert.is_true(math.abs(r.loss - c.loss) <= 1e-12 * math.abs(c.loss), c.name)
      assert.is_true(math.abs(r.kd - c.kd_mean) <= 1e-12 * math.abs(c.kd_mean) + 1e-15, c.name)
      assert.is_true(math.abs(r.lm - c.lm_mean) <= 1e-12 * math.abs(c.lm_mean) + 1e-15, c.name)
      check_grad(g, c.grad)
      n = n + 1
    end
    assert.are.equal(21, n)
  end)

  it("gives the same bits in row chunks and in place", function()
    local c
    for _, x in ipairs(G.distill_cases) do if x.name == "large_topk_lm" then c = x end end
    local a = case_args(c)
    a.grad = true
    local whole, gw = nibble.distill.loss(a)
    local st = nibble.distill.begin(a, 8, a.labels, a.weights)
    local g = nibble.zeros("f32", { 8, 1000 })
    for _, r in ipairs({ { 1, 5 }, { 6, 8 } }) do
      st:chunk { student = a.student:slice(1, r[1], r[2]), teacher = a.teacher:slice(1, r[1], r[2]),
                 labels = a.labels:slice(1, r[1], r[2]), weights = a.weights:slice(1, r[1], r[2]),
                 grad = g:slice(1, r[1], r[2]) }
    end
    local chunked = st:finish()
    assert.are.equal(whole.loss, chunked.loss)
    assert.are.equal(whole.tokens, chunked.tokens)
    assert.is_true(g:equal(gw))
    local s2 = a.student:clone()
    a.student, a.grad = s2, "inplace"
    local r2, g2 = nibble.distill.loss(a)
    assert.are.equal(whole.loss, r2.loss)
    assert.is_true(rawequal(g2, s2))
    assert.is_true(s2:equal(gw))
  end)

  it("extracts the teacher's top k like torch.topk and accepts it cached", function()
    local t = arr("small.teacher")
    local vals, idx, lse = nibble.distill.topk(t, 5, 2.0, "f64")
    local _, rv = arr("topk.vals")
    local _, ri = arr("topk.idx")
    local _, rl = arr("topk.lse_T2")
    for i = 0, 12 * 5 - 1 do
      assert.are.equal(rv[i], vals:data("const float *")[i])
      assert.are.equal(ri[i], idx:data("const int32_t *")[i])
    end
    for i = 0, 11 do assert.is_true(math.abs(lse:data("const double *")[i] - rl[i]) <= 1e-13 * math.abs(rl[i])) end
    local c
    for _, x in ipairs(G.distill_cases) do if x.name == "topk_ghost_T2_rev" then c = x end end
    local a = case_args(c)
    a.teacher = nil
    a.topk_vals, a.topk_idx, a.topk_lse = vals, idx, lse
    a.grad = true
    local r, g = nibble.distill.loss(a)
    assert.is_true(math.abs(r.loss - c.loss) <= 1e-12 * c.loss)
    check_grad(g, c.grad)
  end)

  it("raises errors that name the problem", function()
    local a = case_args(G.distill_cases[1])
    a.temperature = 0
    local e = err_of(nibble.distill.loss, a)
    assert.truthy(e:find("NB_ERR_INVALID: distill: temperature must be finite and > 0", 1, true), e)
    a = case_args(G.distill_cases[1])
    a.lm_loss = true
    e = err_of(nibble.distill.loss, a)
    assert.truthy(e:find("lm_loss needs labels", 1, true), e)
    a = case_args(G.distill_cases[1])
    a.teacher = a.teacher:slice(1, 1, 11)
    e = err_of(nibble.distill.loss, a)
    assert.truthy(e:find("NB_ERR_SHAPE: distill: teacher is [11, 50], student is [12, 50]", 1, true), e)
    e = err_of(nibble.distill.loss, { teacher = a.student })
    assert.truthy(e:find("student logits are required", 1, true), e)
  end)
end)

describe("nibble.optim", function()
  it("follows torch.optim.AdamW bit for bit, across a save and restore", function()
    local traj = G.adamw[1]
    local function fresh()
      local p0, p1 = arr("adam.default.p0"), arr("adam.default.p1")
      local opt = nibble.optim.adamw({ p0, p1 }, { lr = traj.lr, betas = { traj.beta1, traj.beta2 }, eps = traj.eps,
                                                  weight_decay = traj.weight_decay0, no_decay = { 2 } })
      return opt, { p0, p1 }
    end
    local function run(opt, p, from, to)
      for k = from, to do
        local st = traj.steps[k + 1]
        local g0, g1 = arr("adam.default.g0." .. k), arr("adam.default.g1." .. k)
        opt:step({ g0, (not st.skip1) and g1 or false }, st.lr)
        for i = 0, 1 do
          assert.is_true(p[i + 1]:equal((arr(("adam.default.p%d.%d"):format(i, k)))))
          local s = opt:state(i + 1)
          assert.is_true(s.m:equal((arr(("adam.default.m%d.%d"):format(i, k)))))
          assert.is_true(s.v:equal((arr(("adam.default.v%d.%d"):format(i, k)))))
          assert.are.equal(i == 0 and st.step0 or st.step1, s.step)
        end
      end
    end
    local opt, p = fresh()
    assert.are.equal(2, opt:count())
    run(opt, p, 0, 2)
    local sd = opt:state_dict()
    local saved = { p[1]:clone(), p[2]:clone() }
    opt, p = nil, nil
    collectgarbage()
    local opt2, p2 = fresh()
    p2[1]:copy(saved[1])
    p2[2]:copy(saved[2])
    opt2:load_state_dict(sd)
    run(opt2, p2, 3, 4)
  end)

  it("clips like clip_grad_norm_ and reports a non-finite norm", function()
    local c = G.clip[1]
    local g0, g1 = arr("clip.0.g0"), arr("clip.0.g1")
    local norm, ok = nibble.optim.clip_grad_norm({ g0, g1 }, c.max_norm)
    assert.is_true(ok)
    assert.is_true(math.abs(norm - c.total_norm_exact) <= 1e-13 * norm)
    assert.is_true(g0:max_abs_diff((arr("clip.0.out0"))) <= 4e-7 * g0:absmax())
    local bad = nibble.tensor { 1, 0 / 0, 2 }
    local n2, ok2 = nibble.optim.clip_grad_norm({ bad }, 1.0)
    assert.is_false(ok2)
    assert.is_true(n2 ~= n2)
    assert.are.equal(2, bad:get(3))
  end)

  it("schedules like transformers' cosine with min_lr", function()
    for _, s in ipairs(G.schedule) do
      local f = nibble.optim.schedule { lr = s.lr, min_lr = s.min_lr, warmup = s.warmup, total = s.total }
      for step, v in ipairs(s.values) do
        assert.is_true(math.abs(f(step - 1) - v) <= 1e-15 * s.lr)
      end
      assert.are.equal(s.min_lr, f(s.total + 5))
    end
    local f = nibble.optim.schedule { lr = 1e-5, min_lr = 5e-6, warmup_ratio = 0.05, total = 1000 }
    assert.are.equal(0, f(0))
    assert.are.equal(1e-5, f(50))   -- ceil(0.05 * 1000) warmup steps
  end)

  it("accumulates and checks its arguments", function()
    local acc = nibble.tensor { 1, 2 }
    nibble.optim.accumulate(acc, nibble.tensor { 4, 8 }, 0.25)
    assert.are.same({ 2, 4 }, acc:totable())
    local e = err_of(nibble.optim.adamw, { nibble.zeros("f16", { 3 }) })
    assert.truthy(e:find("NB_ERR_INVALID: adamw: param 0 must be f32, got f16", 1, true), e)
    local opt = nibble.optim.adamw({ nibble.zeros("f32", { 3 }) })
    e = err_of(opt.step, opt, { nibble.zeros("f32", { 4 }) })
    assert.truthy(e:find("grad 0 has 4 elements, param has 3", 1, true), e)
    e = err_of(opt.state, opt, 2)
    assert.truthy(e:find("parameter index 2 out of range 1..1", 1, true), e)
    e = err_of(opt.set_lr_scale, opt, 1, -1)
    assert.truthy(e:find("lr scale must be >= 0, got -1", 1, true), e)
  end)

  it("steps a parameter with its own lr scale as at lr * scale", function()
    local a, b = nibble.tensor { 1, -2, 3 }, nibble.tensor { 1, -2, 3 }
    local oa, ob = nibble.optim.adamw({ a }, { weight_decay = 0.1 }), nibble.optim.adamw({ b }, { weight_decay = 0.1 })
    oa:set_lr_scale(1, 4)
    local g = nibble.tensor { 0.5, 0.25, -1 }
    for _ = 1, 2 do
      oa:step({ g }, 1e-2)
      ob:step({ g }, 4e-2)
    end
    assert.are.same(b:totable(), a:totable())
    assert.are_not.same({ 1, -2, 3 }, a:totable())
  end)
end)

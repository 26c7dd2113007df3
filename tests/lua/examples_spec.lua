-- The scripting examples run as a user runs them (`nibble run examples/...`), so they cannot rot unseen.
-- examples/custom_qad.lua (the issue's step-level API: KL on logits plus a hidden-state MSE written in Lua):
-- QAD beats PTQ, the printed loss is KL + w * MSE, the Lua gradient lowers the MSE it is the gradient of,
-- the export read back scores what the script scored, and a bad layer or file is refused in one line.
local nibble = require("nibble")
local nbspec = require("nbspec")

local stories = nbspec.data("stories260K/hf")
local train = nbspec.data("text/tinystories_train_head_2MiB.txt")
local valid = nbspec.data("text/tinystories_valid_head_776KiB.txt")
local tmp = nbspec.private_dir()

local function custom_qad(extra)
  local a = { "run", nbspec.source_dir .. "/examples/custom_qad.lua", "model=" .. stories, "data=" .. train,
              "eval_data=" .. valid, "steps=10" }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return nbspec.nibble(a)
end

-- "step  10  loss L  kl K  mse(h3) M ..." -> L, K, M as numbers
local function step_line(out, step)
  local l, k, m = out:match(("step%%s+%d%%s+loss ([%%d%%.]+)%%s+kl ([%%d%%.]+)%%s+mse%%(h%%d+%%) ([%%d%%.]+)"):format(step))
  return tonumber(l), tonumber(k), tonumber(m)
end

local function eval_line(out, label)
  local ppl, kld = out:match(label .. "%s+PPL ([%d%.]+)%s+KLD ([%d%.]+)")
  return tonumber(ppl), tonumber(kld)
end

describe("examples/custom_qad.lua", function()
  it("trains KL + a Lua hidden-state MSE: QAD beats PTQ, the loss adds up, the export scores the same", function()
    if not nbspec.need(stories, train, valid) then return end
    -- dtype=f32: the trained unquantized tensors as the student holds them (the default rounds this
    -- F32 model's to BF16), so the export read back scores what the script scored
    local out, err, rc = custom_qad { "mse_weight=0.05", "out=" .. tmp .. "/cq", "dtype=f32" }
    assert.are.equal(0, rc, err)
    local p_ppl, p_kld = eval_line(out, "PTQ:")
    local q_ppl, q_kld = eval_line(out, "QAD %(KL %+ MSE%):")
    assert.is_truthy(p_kld and q_kld, out)
    assert.is_true(q_kld < 0.9 * p_kld, out)
    assert.is_true(q_ppl < p_ppl, out)
    for _, s in ipairs { 1, 10 } do
      local loss, kl, mse = step_line(out, s)
      assert.is_truthy(loss, out)
      assert.is_true(mse > 0, out)
      assert.is_true(math.abs(loss - (kl + 0.05 * mse)) <= 2e-5, out)   -- printed to 5 decimals
    end
    assert.matches("exported " .. tmp .. "/cq", out, 1, true)

    -- the export read back, scored as the script scores its student (same ids, ctx, chunks, teacher)
    local teacher = nibble.model.load(stories)
    local back = nibble.model.load(tmp .. "/cq")
    local ids = teacher:tokenizer():encode_tokens(nbspec.read(valid):sub(1, 400000))
    local r = back:eval { tokens = ids, ctx = 256, chunks = 20, teacher = teacher }
    assert.are.equal(("%.4f %.5f"):format(q_ppl, q_kld), ("%.4f %.5f"):format(r.ppl, r.kld))
  end)

  it("the MSE's gradient written in Lua lowers that MSE (same batches, weight 20 against 0)", function()
    if not nbspec.need(stories, train, valid) then return end
    local out0, e0, rc0 = custom_qad { "mse_weight=0" }
    local out1, e1, rc1 = custom_qad { "mse_weight=20" }
    assert.are.equal(0, rc0, e0)
    assert.are.equal(0, rc1, e1)
    local l0, k0, m0 = step_line(out0, 1)
    local _, k1, m1 = step_line(out1, 1)
    assert.are.equal(l0, k0)                    -- weight 0: the loss is the KL alone
    assert.are.same({ k0, m0 }, { k1, m1 })     -- step 1 is before any update: the same forward
    local _, _, m0_10 = step_line(out0, 10)
    local _, _, m1_10 = step_line(out1, 10)
    assert.is_true(m1_10 < 0.95 * m0_10, ("mse at step 10: %s (weight 20) vs %s (weight 0)"):format(m1_10, m0_10))
  end)

  it("refuses a layer the model does not have in one line, naming the range, before loading anything", function()
    if not nbspec.need(stories, train, valid) then return end
    local out, err, rc = custom_qad { "layer=99" }
    assert.are.equal(1, rc)
    assert.are.equal("", out)
    assert.are.equal("nibble: layer must be in 1..6, got 99\n", err)   -- no traceback
    out, err, rc = custom_qad { "eval_data=/nonexistent.txt" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble: cannot open /nonexistent.txt: No such file or directory\n", err)
  end)
end)

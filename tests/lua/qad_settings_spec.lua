-- The one list of QAD settings (nibble.qad_settings) and what it drives: the keys of a recipe's distill
-- table, nibble.qad.config's checks and nb_qad_cfg fields, libnibble's checkpoint settings
-- (core/src/qad/qad_settings.inc, written from the list), the command's values and help; and, on
-- stories260K, `nibble qad` end to end: a few steps, the export read back and equal byte for byte to
-- `nibble run recipes/qad.lua` with the same keys, the checkpoint's settings recorded once, a resume
-- with a changed setting refused.
local nibble = require("nibble")
local nbspec = require("nbspec")
local S = require("nibble.qad_settings")
local recipe = require("nibble.recipe")
local qad = require("nibble.qad")
local util = require("nibble.util")

-- the message of a refusal, without the position nibble's errors get when Lua code calls them
local function err_of(...) return util.clean(nbspec.err_of(...)) end

local function field(c, path)
  for part in path:gmatch("[^%.]+") do c = c[part] end
  return tonumber(c)
end

describe("the QAD settings list", function()
  it("names each setting once, each with a type and a doc, and reaches every row from a key", function()
    local names, keys, types = {}, {}, { int = 1, number = 1, bool = 1, string = 1, path = 1, choice = 1 }
    for i, s in ipairs(S.list) do
      assert(s.name or s.key, "row " .. i .. " has neither a command key nor a recipe key")
      assert(types[s.type], ("%s: type %s"):format(s.name or s.key, tostring(s.type)))
      assert(type(s.doc) == "string" and #s.doc > 0, (s.name or s.key) .. " has no doc")
      if s.name then assert(not names[s.name], "two rows named " .. s.name); names[s.name] = true end
      if s.key then assert(not keys[s.key], "two rows at " .. s.key); keys[s.key] = true end
      if s.type == "choice" then assert(#s.values >= 2) end
    end
    -- the keys recipes/qad.lua has always taken
    assert.are.same({ "algorithm", "allow_long", "batch", "beta1", "beta2", "calib", "calib_seq_len", "checkpoint_dir",
                      "checkpoint_every", "chunks", "clip", "ctx", "data", "dtype", "eos", "eps", "eval_data", "eval_every",
                      "format", "grad_accum", "ignore_index", "kd", "kd_loss_scale", "layout", "lm_loss", "lr",
                      "lr_scale_unquantized", "metrics", "min_lr", "model", "out", "overwrite", "pack", "recalibrate",
                      "resume", "samples", "seed", "separator", "seq_len", "sft_mask", "steps", "t2", "teacher",
                      "temperature", "text_field", "topk", "topk_norm", "warmup", "weight_decay" }, util.keys_of(S.by_name))
  end)

  it("is the distill keys a recipe may have", function()
    assert.are.same({ "allow_long", "batch", "beta1", "beta2", "chat_template", "checkpoint_dir", "checkpoint_every",
                      "clip", "data", "eos", "eps", "eval_data", "eval_every", "grad_accum", "ignore_index",
                      "kd_loss_scale", "lm_loss", "loss", "lr", "lr_scale_unquantized", "metrics", "min_lr", "overwrite",
                      "pack", "recalibrate", "resume", "seed", "separator", "seq_len", "sft_mask", "steps", "t2",
                      "temperature", "text_field", "top_k", "topk", "topk_norm", "warmup", "weight_decay" },
                    util.keys_of(recipe.sub_schema.distill))
    assert.are.equal("distill: unknown key 'stpes' (did you mean 'steps'?)", err_of(qad.config, { stpes = 3 }))
  end)

  it("is what libnibble records in a checkpoint: core/src/qad/qad_settings.inc is c_include()", function()
    local have = nbspec.read(nbspec.source_dir .. "/core/src/qad/qad_settings.inc")
    assert(have == S.c_include(), "core/src/qad/qad_settings.inc is not the list's: regenerate it with\n"
      .. "  LUA_PATH='lua/?.lua' luajit -e 'io.write(require(\"nibble.qad_settings\").c_include())' "
      .. "> core/src/qad/qad_settings.inc")
    assert.truthy(have:find("NB_QAD_SETTING(lr, lr, REAL)\n", 1, true))
    assert.truthy(have:find("NB_QAD_SETTING(kd, loss.kd, INT)\n", 1, true))
  end)

  it("drives qad.config: each row sets its nb_qad_cfg field and refuses a value below its least", function()
    local checked = 0
    for _, s in ipairs(S.list) do
      local k = s.key and s.key:match("^distill%.([%w_]+)$")
      if k and s.cfg and (s.type == "int" or s.type == "number") and k ~= "topk" then
        local v = (s.min or 0) + 3 + (s.type == "number" and 0.25 or 0)
        local t = { [k] = v }
        if k == "warmup" then t.steps = 100 end
        if k == "min_lr" then t.lr = 10 end
        local c = qad.config(t)
        assert.are.equal(v, field(c, s.cfg), k)
        if s.min then
          local below = s.min - 1
          assert.are.equal(("distill: %s must be %s %s, got %s"):format(k, s.above and ">" or ">=", tostring(s.min),
            tostring(below)), err_of(qad.config, { [k] = below }))
        end
        checked = checked + 1
      elseif k and s.cfg and s.type == "bool" then
        assert.are.equal(0, field(qad.config { [k] = false }, s.cfg), k)
        assert.are.equal(1, field(qad.config { [k] = "true" }, s.cfg), k)
        assert.are.equal(("distill: %s must be true or false, got maybe"):format(k), err_of(qad.config, { [k] = "maybe" }))
        checked = checked + 1
      end
    end
    assert.are.equal(18, checked)   -- every cfg row but the two named ones (kd's loss, topk_norm) and topk
  end)

  it("reads the command's values by their types, with the list's defaults", function()
    local given = { model = "m", data = "d", steps = "60", lr = "2e-4", t2 = "1", kd = "reverse_kl", seq_len = "64" }
    local v = S.read(function(k) return given[k] end, "qad.lua")
    assert.are.same({ 60, 2e-4, true, "reverse_kl", 64, 3, 64, 128, 8, "nvfp4_w4a16", false, 1 },
      { v.steps, v.lr, v.t2, v.kd, v.seq_len, v.warmup, v.calib_seq_len, v.samples, v.batch, v.format, v.lm_loss,
        v.seed })
    assert.is_nil(v.beta1)   -- no default of its own: libnibble's (nb_qad_cfg_init)
    for _, c in ipairs {
      { { steps = "x" }, "qad.lua: steps must be a number, got 'x'" },
      { { t2 = "no" }, "qad.lua: t2 must be true or false, got 'no'" },
      { { kd = "ce" }, "qad.lua: kd must be kl, reverse_kl or topk, got 'ce'" },
      { { layout = "gguf" }, "qad.lua: layout must be modelopt or compressed-tensors, got 'gguf'" },
    } do
      assert.are.equal(c[2], err_of(S.read, function(k) return c[1][k] end, "qad.lua"))
    end
    assert.are.equal("--seq-len must be a number, got 'long'",
      err_of(S.read, function(k) return k == "seq_len" and "long" or nil end, nil, function(k) return "--" .. k:gsub("_", "-") end))
  end)

  it("writes the help of nibble qad: every key as an option, with its doc and default", function()
    local out, err, rc = nbspec.nibble { "qad", "--help" }
    assert.are.equal(0, rc, err)
    for _, name in ipairs(S.names()) do
      assert.truthy(out:find("\n  --" .. name:gsub("_", "-") .. " ", 1, true), name)
    end
    assert.truthy(out:find("  --lr X                    peak learning rate (default 1e-5)\n", 1, true), out)
    assert.truthy(out:find("  --steps N                 optimizer steps (default 200)\n", 1, true), out)
  end)

  it("nibble qad refuses as every command does: unknown option, missing value, missing required option", function()
    local _, err, rc = nbspec.nibble { "qad", "--model", "m", "--data", "d", "--out", "o", "--stpes", "3" }
    assert.are.equal(1, rc)
    assert.truthy(err:find("^nibble qad: unknown argument %-%-stpes %(did you mean '%-%-steps'%?%)\nusage: nibble qad "), err)
    _, err, rc = nbspec.nibble { "qad", "--model", "m", "--data", "d", "--out", "o", "--lr" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble qad: --lr needs a X\n", err)
    _, err, rc = nbspec.nibble { "qad", "--model", "m", "--data", "d" }
    assert.are.equal(1, rc)
    assert.truthy(err:find("^nibble qad: missing %-%-out PATH\nusage: nibble qad "), err)
    _, err, rc = nbspec.nibble { "qad", "--model", "m", "--data", "d", "--out", "o", "--topk", "5" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble qad: --topk 5 needs --kd topk (the KD loss over the teacher's top k)\n", err)
  end)
end)

describe("nibble qad on stories260K", function()
  local stories = nbspec.data("stories260K/hf")
  local train = nbspec.data("text/tinystories_train_head_2MiB.txt")
  local tmp = nbspec.private_dir()

  it("runs a few steps, exports what recipes/qad.lua exports, records the settings once, refuses a changed resume", function()
    if not nbspec.need(stories, train) then return end
    local keys = { steps = "3", batch = "2", seq_len = "64", lr = "1e-4", checkpoint_every = "2" }
    local argv = { "qad", "--model", stories, "--data", train, "--out", tmp .. "/cmd", "--quiet" }
    local kv = { "run", "recipes/qad.lua", "model=" .. stories, "data=" .. train, "out=" .. tmp .. "/file" }
    for _, k in ipairs(util.keys_of(keys)) do
      argv[#argv + 1] = "--" .. k:gsub("_", "-")
      argv[#argv + 1] = keys[k]
      kv[#kv + 1] = k .. "=" .. keys[k]
    end
    local out, err, rc = nbspec.nibble(argv)
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("^qad: 3 steps %-> " .. (tmp .. "/cmd"):gsub("%p", "%%%0") .. " in [%d.]+ s\n$"), out)
    local _, err2, rc2 = nbspec.nibble(kv)
    assert.are.equal(0, rc2, err2)
    -- the same keys, the same run: the same bytes
    for _, f in ipairs { "model.safetensors", "config.json", "hf_quant_config.json" } do
      local a, b = nbspec.read(tmp .. "/cmd/" .. f), nbspec.read(tmp .. "/file/" .. f)
      assert(a and a == b, f .. " differs between nibble qad and recipes/qad.lua")
    end
    -- read back: an NVFP4 W4A16 checkpoint of 30 quantized linears that loads and runs
    local q = nibble.json.decode(nbspec.read(tmp .. "/cmd/hf_quant_config.json"))
    assert.are.equal("W4A16_NVFP4", q.quantization.quant_algo)
    local info = nibble.inspect(tmp .. "/cmd/model.safetensors")
    local scales = 0
    for _, t in ipairs(info.tensors) do if t.name:match("%.weight_scale_2$") then scales = scales + 1 end end
    assert.are.equal(30, scales)
    -- its logits are finite, and not the original model's (the weights it reads back are quantized)
    local ids = nibble.tensor({ { 1, 403, 407, 261 } }, "i32")
    local got = nibble.model.load(tmp .. "/cmd"):forward(ids)
    local orig = nibble.model.load(stories):forward(ids)
    local V, diff = got:size(2), 0
    for r = 1, 4 do
      for j = 1, V do
        local a = got:get(r, j)
        assert(a == a and a > -1e30 and a < 1e30, "logit not finite")
        diff = math.max(diff, math.abs(a - orig:get(r, j)))
      end
    end
    assert.is_true(diff > 0)
    -- libnibble's settings are in the checkpoint (the list's "cfg" rows, in order); run-settings.json
    -- holds none of them
    local ck = tmp .. "/cmd-checkpoints"
    local meta
    for _, kvp in ipairs(nibble.inspect(qad.latest(ck) .. "/trainer.safetensors").metadata) do
      if kvp.key == "settings" then meta = kvp.value end
    end
    local names = {}
    for line in meta:gmatch("([%w_]+)=[^\n]*\n") do names[#names + 1] = line end
    local want = {}
    for _, s in ipairs(S.list) do
      if s.resume == "cfg" and s.c_unless == nil then want[#want + 1] = s.name end
    end
    want[#want + 1] = "recalib_method"
    want[#want + 1] = "params"
    assert.are.same(want, names)
    assert.truthy(meta:find("\nlr=0.0001\n", 1, true), meta)
    for _, e in ipairs(nibble.json.decode(nbspec.read(ck .. "/run-settings.json"))) do
      local row = S.by_name[e.key]
      assert(not (row and row.resume == "cfg"), e.key .. " is recorded twice")
    end
    -- a resume with another lr is refused before any compute, naming it from the checkpoint's record
    argv[#argv + 1] = "--resume"
    argv[#argv + 1] = "true"
    argv[#argv + 1] = "--lr"
    argv[#argv + 1] = "2e-4"
    local _, err3, rc3 = nbspec.nibble(argv)
    assert.are.equal(1, rc3)
    assert.truthy(err3:find("the run's settings changed (lr: the checkpoint has 0.0001, this run 0.0002)", 1, true), err3)
  end)
end)

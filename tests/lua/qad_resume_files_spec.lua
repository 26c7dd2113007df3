-- The files a QAD resume reads on the Lua side, hostile or cut short: run-settings.json (the record a
-- resumed run is compared with), the metrics JSONL it continues, and the checkpoint folder's `latest`.
-- Each bad one is a one-line error naming the file (never a Lua runtime error with a traceback), or is
-- passed over where the file is only a hint; a good one still resumes.
local nibble = require("nibble")
local nbspec = require("nbspec")
local qad = require("nibble.qad")

local tmp = nbspec.private_dir()
local err_of = nbspec.err_of

-- A checkpoint folder nb_qad_latest takes as it is (a trainer.safetensors inside), with the record
-- `settings` as its run-settings.json text.
local n = 0
local function ckdir(settings)
  n = n + 1
  local d = ("%s/ck%d"):format(tmp, n)
  os.execute("mkdir -p " .. nbspec.quote(d))
  nbspec.write(d .. "/trainer.safetensors", "")
  if settings then nbspec.write(d .. "/run-settings.json", settings) end
  return d
end

local now = { { key = "format", value = "nvfp4_w4a16" }, { key = "seq_len", value = "32" },
              { key = "model", value = "abc", shown = "m/" } }

local function refusal(d, why)
  return ("qad: %s/run-settings.json %s: resume compares this run with it (overwrite=true starts again)"):format(d, why)
end

describe("run-settings.json on resume", function()
  it("a good record resumes, and a changed setting is named", function()
    local d = ckdir(nibble.json.encode(now))
    assert.are.equal(d, qad.check_checkpoints(d, now, true, false))
    local other = { now[1], { key = "seq_len", value = "64" }, now[3] }
    assert.are.equal(("qad: cannot resume from %s: the run's settings changed (seq_len: the checkpoint has 32, this "
                      .. "run 64); resume with the same settings, or overwrite=true to start again"):format(d),
                     err_of(qad.check_checkpoints, d, other, true, false))
  end)

  it("cut short, not JSON, or not a list of settings: one line naming the file", function()
    local cases = {
      { '[{"key": "format", "val', "is not valid JSON (unterminated string at line 1 column 20)" },
      { "", "is not valid JSON (unexpected character at line 1 column 1)" },
      { "\0\255garbage", "is not valid JSON (unexpected character at line 1 column 1)" },
      { "{}", "is not a list of settings" },
      { "42", "is not a list of settings" },
      { '{"1": {"key": "a", "value": "b"}, "x": 1}', "is not a list of settings" },
      { "[1, 2]", "entry 1 is not {key, value[, shown]} with string values" },
      { '[{"key": "format", "value": "nvfp4"}, {"key": "seq_len", "value": {"a": 1}}]',
        "entry 2 is not {key, value[, shown]} with string values" },
      { '[{"key": "model", "value": "abc", "shown": [1]}]', "entry 1 is not {key, value[, shown]} with string values" },
      { '[{"value": "abc"}]', "entry 1 is not {key, value[, shown]} with string values" },
    }
    for _, c in ipairs(cases) do
      local d = ckdir(c[1])
      local e = err_of(qad.check_checkpoints, d, now, true, false)
      assert.are.equal(refusal(d, c[2]), e)
      assert.is_nil(e:find("\n"))
    end
  end)

  it("one that cannot be read (a folder) is named too; an absent one is not checked", function()
    local d = ckdir(nil)
    os.execute("mkdir " .. nbspec.quote(d .. "/run-settings.json"))
    assert.are.equal(refusal(d, "cannot be read (Is a directory)"), err_of(qad.check_checkpoints, d, now, true, false))
    local e = ckdir(nil)
    assert.are.equal(e, qad.check_checkpoints(e, now, true, false))
  end)
end)

describe("the metrics JSONL on resume", function()
  it("step0_eval passes over damaged rows: only a row with the three numbers is the PTQ eval", function()
    local path = tmp .. "/m.jsonl"
    nbspec.write(path, table.concat({
      '{"step": 0, "eval_kld": 0.5, "eval_ppl": "x", "eval_top1": 50}',   -- edited: ppl is not a number
      '{"step": 0, "eval_kld": 0.5, "eval_ppl": 4.2}',                     -- cut: no top-1
      "\0\1\2 binary",
      '[0, 1]',
      '{"step": 0, "eval_kld": 0.25, "eval_ppl": 4.5, "eval_top1": 61.5}',
    }, "\n") .. '\n{"step": 0, "eval_k')
    assert.are.same({ ppl = 4.5, kld = 0.25, top1 = 61.5 }, qad.step0_eval(path))
    nbspec.write(path, '{"step": 0, "eval_kld": 0.5, "eval_ppl": null, "eval_top1": 50}\n')
    assert.is_nil(qad.step0_eval(path))
  end)

  it("cut_metrics drops rows that are not step records (hostile values included) and keeps the rest", function()
    local path = tmp .. "/cut.jsonl"
    local good = { '{"step": 1, "loss": 1}', '{"step": 2, "loss": 2}' }
    nbspec.write(path, table.concat({ good[1], '{"step": {"a": 1}, "loss": 1}', '{"step": "2x", "loss": 1}',
                                      '{"step": 1e999, "loss": 1}', "\1\255", "[[[[[[[[", good[2],
                                      '{"step": -1e999, "loss"' }, "\n"))
    assert.are.same({ 2, 6 }, { qad.cut_metrics(path, 2, 10) })
    assert.are.equal(table.concat(good, "\n") .. "\n", nbspec.read(path))
  end)
end)

describe("the checkpoint folder's latest on resume", function()
  it("names a step folder without a manifest (older checkpoints); garbage in it names none", function()
    local d = tmp .. "/ckl"
    os.execute("mkdir -p " .. nbspec.quote(d .. "/step-00000002"))
    nbspec.write(d .. "/step-00000002/trainer.safetensors", "")
    nbspec.write(d .. "/run-settings.json", nibble.json.encode(now))
    nbspec.write(d .. "/latest", "step-00000002\n")
    assert.are.equal(d .. "/step-00000002", qad.check_checkpoints(d, now, true, false))
    for _, text in ipairs { "\0\255\n", "../ck1\n", "step-00000002/../../ck1", ("step-"):rep(200), "", "step-2" } do
      nbspec.write(d .. "/latest", text)
      assert.is_nil(qad.check_checkpoints(d, now, true, false))
    end
  end)
end)

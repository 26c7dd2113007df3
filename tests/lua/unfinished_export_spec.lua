-- An export's staging folder (OUT.nibble-tmp-PID/: an INCOMPLETE note beside export/, where the files are
-- written before the final rename) given to a reader: `nibble inspect`, `eval` and `quantize` refuse it,
-- its export/ subfolder and a file in it, in one line saying it is an unfinished export; exit 1.
local nbspec = require("nbspec")

local tmp = nbspec.private_dir()
local model = nbspec.source_dir .. "/tests/golden/data/model_llama3"

-- A staging folder as a process killed just before the rename leaves it (export_hf.c's layout): every
-- file of a model in export/, and the note.
local stage = tmp .. "/out.nibble-tmp-4242"
os.execute(("mkdir -p %s && cp %s/* %s/"):format(nbspec.quote(stage .. "/export"), nbspec.quote(model),
                                                 nbspec.quote(stage .. "/export")))
nbspec.write(stage .. "/INCOMPLETE", "an unfinished nibble export of " .. tmp .. "/out (process 4242): not a model\n")
-- a copy with the note beside the files (the staging folder itself given, files and all)
local flat = tmp .. "/flat.nibble-tmp-4243"
os.execute(("mkdir -p %s && cp %s/* %s/"):format(nbspec.quote(flat), nbspec.quote(model), nbspec.quote(flat)))
nbspec.write(flat .. "/INCOMPLETE", "an unfinished nibble export\n")

local function refused(cmd, given, note)
  return ("nibble %s: NB_ERR_FORMAT: %s is an unfinished nibble export (%s/INCOMPLETE says so): not a model; run "
          .. "the export again\n"):format(cmd, given, note)
end

describe("a staging folder given as a model", function()
  it("nibble inspect refuses the folder, its export/ subfolder and a file in it", function()
    for _, given in ipairs { stage, stage .. "/export", stage .. "/export/", stage .. "/export/model.safetensors",
                             flat, flat .. "/model.safetensors" } do
      local note = given:find("flat", 1, true) and flat or stage
      local out, err, rc = nbspec.nibble { "inspect", given }
      assert.are.equal(1, rc)
      assert.are.equal("", out)
      assert.are.equal(refused("inspect", given, note), err)
    end
    -- the same files outside a staging folder are a model
    local out, err, rc = nbspec.nibble { "inspect", model }
    assert.are.equal(0, rc, err)
    assert.matches("21 tensors", out)
  end)

  it("nibble eval and nibble quantize refuse it as --model", function()
    local data = nbspec.source_dir .. "/tests/data/docs.txt"
    local out, err, rc = nbspec.nibble { "eval", "--model", stage .. "/export", "--data", data }
    assert.are.equal(1, rc)
    assert.are.equal(refused("eval", stage .. "/export", stage), err)
    out, err, rc = nbspec.nibble { "quantize", "--model", stage, "--format", "fp8", "--out", tmp .. "/q" }
    assert.are.equal(1, rc)
    assert.are.equal(refused("quantize", stage, stage), err)
    assert.is_nil(nbspec.read(tmp .. "/q/config.json"))
    out, err, rc = nbspec.nibble { "quantize", "--model", flat .. "/model.safetensors", "--format", "fp8", "--out",
                                   tmp .. "/q" }
    assert.are.equal(1, rc)
    assert.are.equal(refused("quantize", flat .. "/model.safetensors", flat), err)
  end)
end)

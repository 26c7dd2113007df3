-- What `nibble quantize` and a QAD run do with hostile weights and unlucky folders: a NaN / -Inf in a
-- tensor the export writes is refused naming tensor and element (--allow-nonfinite writes it and says
-- so), --out a/b creates the missing folders, and a checkpoint folder one run holds is refused to
-- another. (Kills at every file-system call: tests/crash/crash_points.sh.)
local nbspec = require("nbspec")
local nibble = require("nibble")

local tmp = nbspec.private_dir()
local hf = nbspec.data("stories260K/hf")

-- A copy of stories260K/hf whose F32 tensor `name` has the 4 bytes `bytes` at element `index`.
local function poisoned(dir, name, index, bytes)
  os.execute(("mkdir -p %s && cp %s/* %s/"):format(nbspec.quote(dir), nbspec.quote(hf), nbspec.quote(dir)))
  local path = dir .. "/model.safetensors"
  local data = nbspec.read(path)
  local hlen = 0
  for i = 8, 1, -1 do hlen = hlen * 256 + data:byte(i) end
  local header = nibble.json.decode(data:sub(9, 8 + hlen))
  local e = assert(header[name], name)
  assert(e.dtype == "F32")
  local at = 8 + hlen + e.data_offsets[1] + 4 * index
  nbspec.write(path, data:sub(1, at) .. bytes .. data:sub(at + 5))
  return dir
end

describe("nibble quantize: non-finite weights", function()
  it("refuses a NaN in model.norm.weight, naming tensor and element, and writes nothing", function()
    if not nbspec.need(hf) then return end
    local m = poisoned(tmp .. "/nan", "model.norm.weight", 3, "\0\0\192\127")
    local out = tmp .. "/nan_out"
    local o, e, rc = nbspec.nibble { "quantize", "--model", m, "--format", "nvfp4_w4a16", "--out", out, "--quiet" }
    assert.are.equal(1, rc)
    assert.are.equal("", o)
    assert.are.equal("nibble quantize: NB_ERR_NUMERIC: export: model.norm.weight: NaN at flat index 3 (element [3]): "
                     .. "an export writes finite values only (allow_nonfinite = true writes it as it is)\n", e)
    assert.is_false(nbspec.exists(out .. "/config.json"))
    local o2 = nbspec.sh("ls -A " .. nbspec.quote(tmp) .. " | grep nan_out || true")
    assert.are.equal("", o2)
  end)

  it("refuses a -Inf in an unquantized down_proj; --allow-nonfinite writes it and reports it", function()
    if not nbspec.need(hf) then return end
    -- down_proj [64, 172] stays unquantized in NVFP4 (16 does not divide 172): element [2, 5] is 349
    local m = poisoned(tmp .. "/inf", "model.layers.2.mlp.down_proj.weight", 349, "\0\0\128\255")
    local out = tmp .. "/inf_out"
    local args = { "quantize", "--model", m, "--format", "nvfp4_w4a16", "--out", out, "--quiet" }
    local _, e, rc = nbspec.nibble(args)
    assert.are.equal(1, rc)
    assert.are.equal("nibble quantize: NB_ERR_NUMERIC: export: model.layers.2.mlp.down_proj.weight: -Inf at flat index "
                     .. "349 (element [2, 5]): an export writes finite values only (allow_nonfinite = true writes it "
                     .. "as it is)\n", e)
    args[#args + 1] = "--allow-nonfinite"
    local o
    o, e, rc = nbspec.nibble(args)
    assert.are.equal(0, rc)
    assert.are.equal("export: allow_nonfinite wrote NaN/Inf values in 1 tensor(s): "
                     .. "model.layers.2.mlp.down_proj.weight\n", e)
    assert.truthy(o:match("^quantized 30 modules"))
    assert.truthy(nbspec.exists(out .. "/config.json"))
  end)
end)

describe("nibble quantize --out", function()
  it("creates missing parent folders (out/q260 in a fresh clone)", function()
    if not nbspec.need(hf) then return end
    local root = tmp .. "/fresh"
    os.execute("mkdir -p " .. nbspec.quote(root))
    local o, e, rc = nbspec.sh(("cd %s && %s quantize --model %s --format nvfp4_w4a16 --out out/q260 --quiet")
      :format(nbspec.quote(root), nbspec.quote(nbspec.bin), nbspec.quote(hf)))
    assert.are.equal(0, rc, e)
    assert.are.equal("quantized 30 modules (nvfp4_w4a16, max) -> out/q260", o:gsub(" in [%d.]+ s\n$", ""))
    assert.truthy(nbspec.exists(root .. "/out/q260/model.safetensors"))
    assert.are.equal("q260\n", (nbspec.sh("ls -A " .. nbspec.quote(root .. "/out"))))
  end)
end)

describe("qad.lock", function()
  it("holds a checkpoint folder for one run: a second lock is refused naming the folder and the pid", function()
    local qad = require("nibble.qad")
    local dir = tmp .. "/ck/run1"
    local a = qad.lock(dir)
    assert.truthy(nbspec.exists(dir .. ".nibble-lock"))
    local e = nbspec.err_of(qad.lock, dir)
    local pid = nbspec.read(dir .. ".nibble-lock"):match("^(%d+)\n$")
    assert.truthy(pid)
    assert.are.equal(("qad: checkpoint_dir: %s is in use by another nibble process (pid %s): wait for it to finish or "
                      .. "give another checkpoint_dir"):format(dir, pid), e)
    a.release()
    assert.is_false(nbspec.exists(dir .. ".nibble-lock"))
    qad.lock(dir).release()
  end)
end)

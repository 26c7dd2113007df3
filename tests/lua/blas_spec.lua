-- `nibble --version`'s GEMM line: its shape, and that the kernel set it names is the one OpenBLAS
-- itself says it runs (OPENBLAS_VERBOSE=2 makes OpenBLAS print "Core: <name>" each time it selects
-- a kernel table, at load and at libnibble's switch), with OPENBLAS_CORETYPE unset, forced, and with
-- OpenBLAS pretending to have picked Prescott (NIBBLE_BLAS_PRETEND_CORE, as 0.3.21 does on a family 6
-- model 207 Xeon). nibble.blas() returns the same fields.
local nibble = require("nibble")
local nbspec = require("nbspec")

-- "gemm: LIB (PATH), kernels CORE (HOW); cpu: BRAND (VENDOR family F model M); features: f1 f2 ..."
local LINE = "^gemm: (.-) %((/[^%)]+)%), kernels (%S+) %((.-)%); cpu: (.-) %((%S+) family (%d+) model (%d+)%); " ..
             "features: ([%w_ ]+)\n$"

local function version(env)
  -- env -u: the test's own environment may force a core; each case sets exactly what it means
  local out, err, code = nbspec.sh("env -u OPENBLAS_CORETYPE -u NIBBLE_BLAS_PRETEND_CORE -u NIBBLE_BLAS " ..
                                   "OPENBLAS_VERBOSE=2 " .. (env or "") .. " " .. nbspec.quote(nbspec.bin) .. " --version")
  assert.are.equal(0, code, err)
  local line = out:match("\n(gemm: .*)$")
  assert.truthy(line, out)
  local lib, path, core, how, brand, vendor, fam, model, features = line:match(LINE)
  assert.truthy(lib, line)
  local said = {}   -- what OpenBLAS printed, in order
  for name in err:gmatch("Core: (%S+)\n") do said[#said + 1] = name end
  return { lib = lib, path = path, core = core, how = how, brand = brand, vendor = vendor, family = tonumber(fam),
           model = tonumber(model), features = features, said = said, line = line }
end

local function has(list, word)
  for w in list:gmatch("%S+") do if w == word then return true end end
  return false
end

describe("nibble --version, the GEMM line", function()
  local b = nibble.blas()
  local openblas = b.library:match("^OpenBLAS ") and b.how ~= "fixed"

  it("has the documented shape and names the kernels OpenBLAS says it runs", function()
    local v = version()
    assert.are.equal(b.library, v.lib)
    assert.are.equal(b.path, v.path)
    assert.are.equal(b.features, v.features)
    assert.are.equal(b.vendor, v.vendor)
    if not openblas then return end
    assert.truthy(v.lib:match("^OpenBLAS %d+%.%d+%.%d+"), v.lib)
    assert.are.equal(v.core, v.said[#v.said], v.line)   -- the last table OpenBLAS selected
    assert.truthy(v.how == "the BLAS's own choice" or v.how:match("^switched from %S+, the weaker set"), v.how)
    -- a CPU with AVX-512 (F, BW, VL, DQ) or AVX2 runs such kernels unless the user forces others
    if has(v.features, "avx512bw") and has(v.features, "avx512dq") and has(v.features, "avx512vl") then
      assert.truthy(v.core == "SkylakeX" or v.core == "Cooperlake" or v.core == "SapphireRapids", v.line)
    elseif has(v.features, "avx2") and has(v.features, "fma") then
      assert.truthy(v.core == "Haswell" or v.core == "Zen" or v.core == "Excavator", v.line)
    end
  end)

  it("honours OPENBLAS_CORETYPE and says what the CPU could run", function()
    if not openblas then return pending(b.library .. " has no run-time kernel choice") end
    local v = version("OPENBLAS_CORETYPE=Prescott")
    assert.are.equal("Prescott", v.core)
    assert.are.same({ "Prescott" }, v.said)
    if b.best ~= "" and b.best ~= "Prescott" then
      assert.are.equal("forced by OPENBLAS_CORETYPE; this CPU can run " .. b.best, v.how)
    end
  end)

  it("switches a weaker pick before the first product, and OpenBLAS confirms it", function()
    if not openblas then return pending(b.library .. " has no run-time kernel choice") end
    local v = version("NIBBLE_BLAS_PRETEND_CORE=Prescott")
    if b.best == "" then   -- an SSE-only CPU: Prescott is its best
      assert.are.same({ "Prescott" }, v.said)
      return
    end
    assert.are.equal(b.best, v.core)
    assert.are.equal("switched from Prescott, the weaker set the BLAS picked for this CPU", v.how)
    assert.are.same({ "Prescott", b.best }, v.said)
  end)

  it("nibble.blas() agrees with the line", function()
    local forced = os.getenv("OPENBLAS_CORETYPE")   -- this process's own, when the suite runs forced
    local v = version(forced and forced ~= "" and ("OPENBLAS_CORETYPE=" .. nbspec.quote(forced)) or nil)
    assert.are.equal(b.line .. "\n", v.line)
    assert.truthy(b.cpu ~= nil and b.family > 0, b.line)
  end)
end)

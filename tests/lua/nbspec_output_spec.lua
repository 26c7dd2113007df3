-- nbspec_output.lua, the busted output handler every spec runs under, on a fixture spec: a skip for
-- missing test data names the folder or the files, each spec ends with its counts, a spec whose cases
-- all skipped exits 77 (ctest: Skipped), one with a failure still fails.
local nbspec = require("nbspec")

local luajit, busted = os.getenv("NIBBLE_LUAJIT"), os.getenv("NIBBLE_BUSTED")
local handler = nbspec.source_dir .. "/tests/lua/nbspec_output.lua"
local fixture = nbspec.source_dir .. "/tests/lua/fixtures/skips_spec.lua"
local tmp = nbspec.private_dir()

-- The fixture's stdout from the first line the handler adds, and its exit code.
local function run(mode, data)
  local out, err, code = nbspec.sh(("NBSPEC_FIXTURE=%s NIBBLE_SHARED_DATA=%s %s %s --output=%s %s"):format(
    mode, nbspec.quote(data), nbspec.quote(luajit), nbspec.quote(busted), nbspec.quote(handler), nbspec.quote(fixture)))
  return out:match("\n(busted: .*)$") or (out .. err), code
end

describe("nbspec_output", function()
  local absent = tmp .. "/no-such-folder"

  it("exits 77 when every case skipped, naming the absent folder", function()
    local tail, code = run("all", absent)
    assert.are.equal(77, code)
    assert.are.equal("busted: 2 skipped: test data absent: " .. absent .. " (scripts/fetch-test-data.sh)\n" ..
                     "busted: 0 passed, 0 failed, 2 skipped (2 for missing test data)\n", tail)
  end)

  it("names the missing files when the folder exists", function()
    local tail, code = run("all", tmp)
    assert.are.equal(77, code)
    assert.are.equal("busted: 2 skipped: test data absent: text/fixture.txt, fixture-model in " .. tmp ..
                     " (scripts/fetch-test-data.sh)\n" ..
                     "busted: 0 passed, 0 failed, 2 skipped (2 for missing test data)\n", tail)
  end)

  it("counts skips beside passes, and tells a data skip from another", function()
    local tail, code = run("some", absent)
    assert.are.equal(0, code)
    assert.are.equal("busted: 2 skipped: test data absent: " .. absent .. " (scripts/fetch-test-data.sh)\n" ..
                     "busted: 1 skipped: not here\n" ..
                     "busted: 1 passed, 0 failed, 3 skipped (2 for missing test data)\n", tail)
  end)

  it("fails a spec with a failure, skips or not", function()
    local tail, code = run("fail", absent)
    assert.are.equal(1, code)
    assert.are.equal("busted: 2 skipped: test data absent: " .. absent .. " (scripts/fetch-test-data.sh)\n" ..
                     "busted: 0 passed, 1 failed, 2 skipped (2 for missing test data)\n", tail)
  end)
end)

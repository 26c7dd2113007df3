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

-- The data skip line the handler prints for `n` cases, naming `what`.
local function data_skip(n, what)
  return ("busted: %d skipped: test data absent: %s (scripts/fetch-test-data.sh)\n"):format(n, what)
end

describe("nbspec_output", function()
  local absent = tmp .. "/no-such-folder"
  local cases = {
    { "exits 77 when every case skipped, naming the absent folder", "all", absent, 77,
      data_skip(2, absent) .. "busted: 0 passed, 0 failed, 2 skipped (2 for missing test data)\n" },
    { "names the missing files when the folder exists", "all", tmp, 77,
      data_skip(2, "text/fixture.txt, fixture-model in " .. tmp) ..
      "busted: 0 passed, 0 failed, 2 skipped (2 for missing test data)\n" },
    { "counts skips beside passes, and tells a data skip from another", "some", absent, 0,
      data_skip(2, absent) .. "busted: 1 skipped: not here\n" ..
      "busted: 1 passed, 0 failed, 3 skipped (2 for missing test data)\n" },
    { "fails a spec with a failure, skips or not", "fail", absent, 1,
      data_skip(2, absent) .. "busted: 0 passed, 1 failed, 2 skipped (2 for missing test data)\n" },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local tail, code = run(c[2], c[3])
      assert.are.equal(c[4], code)
      assert.are.equal(c[5], tail)
    end)
  end
end)

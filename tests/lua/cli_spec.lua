-- nibble.cli.parse: the option parser of every sub-command (values inline or next, numbers with
-- their rules, flags, lists, positional words) and the messages it writes for bad input.
local cli = require("nibble.cli")

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH" }, { "-n", key = "n", num = "int0" },
  { "--ctx", key = "ctx", num = "int+" }, { "--temp", key = "temp", num = "num0" },
  { "--keys", key = "keys", list = "metric names" }, { "--no-stop", key = "stop", set = false },
  { "--ids", key = "ids" }, positional = "FILE",
}

-- runs parse with io.stdout/io.stderr captured; returns result, code, stdout, stderr
local function run(argv, spec)
  local out, err = {}, {}
  local so, se = io.stdout, io.stderr
  io.stdout = { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = s end end }
  io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do err[#err + 1] = s end end }
  local ok, o, code = pcall(cli.parse, "demo", "usage: nibble demo ...\n", argv, spec or SPEC)
  io.stdout, io.stderr = so, se
  assert(ok, o)
  return o, code, table.concat(out), table.concat(err)
end

describe("nibble.cli.parse", function()
  it("reads values given next or inline, numbers, flags, lists and positional words", function()
    local o = run({ "a.jsonl", "-m", "dir", "-n", "0", "--ctx=512", "--temp", "0.5", "--keys", "loss,kl",
                    "--no-stop", "--ids", "b.jsonl" })
    assert.are.same({ "a.jsonl", "b.jsonl", model = "dir", n = 0, ctx = 512, temp = 0.5, keys = { "loss", "kl" },
                      stop = false, ids = true }, o)
    assert.are.same({}, (run({})))
  end)

  it("names the option and the rule a bad number breaks", function()
    for _, c in ipairs {
      { { "-n", "1.5" }, "nibble demo: -n needs a non-negative integer, got 1.5\n" },
      { { "--ctx", "0" }, "nibble demo: --ctx needs a positive integer, got 0\n" },
      { { "--ctx=x" }, "nibble demo: --ctx needs a positive integer, got x\n" },
      { { "--temp", "-1" }, "nibble demo: --temp needs a non-negative number, got -1\n" },
      { { "--temp", "nan" }, "nibble demo: --temp needs a non-negative number, got nan\n" },
      { { "--ctx" }, "nibble demo: --ctx needs a positive integer\n" },
      { { "--model" }, "nibble demo: --model needs a PATH\n" },
      { { "--model=" }, "nibble demo: --model needs a PATH\n" },
      { { "--keys" }, "nibble demo: --keys needs a comma-separated list of metric names\n" },
    } do
      local o, code, out, err = run(c[1])
      assert.is_nil(o)
      assert.are.equal(1, code)
      assert.are.equal("", out)
      assert.are.equal(c[2], err)
    end
  end)

  it("refuses unknown options, values on flags and (without positional) stray words, with the usage", function()
    for _, argv in ipairs { { "--frob" }, { "--ids=1" }, { "-x", "1" } } do
      local o, code, _, err = run(argv)
      assert.is_nil(o)
      assert.are.equal(1, code)
      assert.are.equal("nibble demo: unknown argument " .. argv[1] .. "\nusage: nibble demo ...\n", err)
    end
    local o, code, _, err = run({ "word" }, { { "--ids", key = "ids" } })
    assert.is_nil(o)
    assert.are.equal(1, code)
    assert.are.equal("nibble demo: unknown argument word\nusage: nibble demo ...\n", err)
  end)

  it("prints the usage on stdout for -h and --help and exits 0", function()
    for _, h in ipairs { "-h", "--help" } do
      local o, code, out, err = run({ "-m", "x", h, "--frob" })
      assert.is_nil(o)
      assert.are.equal(0, code)
      assert.are.equal("usage: nibble demo ...\n", out)
      assert.are.equal("", err)
    end
  end)
end)

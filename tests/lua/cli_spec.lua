-- nibble.cli.parse: the option parser of every sub-command (values inline or next, numbers with
-- their rules, flags, lists, positional words) and the messages it writes for bad input; how programs
-- that `nibble run` starts report errors (a refused request: one line; a bug or NIBBLE_DEBUG=1: the
-- traceback), and `nibble run --help`.
local cli = require("nibble.cli")
local nbspec = require("nbspec")

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

-- runs f with io.stdout captured; returns its results and what it wrote
local function captured(f, ...)
  local out = {}
  local so = io.stdout
  io.stdout = { write = function(_, ...) for _, x in ipairs({ ... }) do out[#out + 1] = x end end }
  local res = { pcall(f, ...) }
  io.stdout = so
  assert(res[1], res[2])
  return table.concat(out), unpack(res, 2, table.maxn(res))
end

describe("errors of programs that nibble run starts", function()
  it("user_message: a string raised without a position is a refused request; the rest are not", function()
    assert.are.equal("qad.lua: kd must be kl, reverse_kl or topk, got 'ce'",
      cli.user_message("qad.lua: kd must be kl, reverse_kl or topk, got 'ce'"))
    assert.are.equal("NB_ERR_IO: cannot open /x: No such file or directory",
      cli.user_message("NB_ERR_IO: cannot open /x: No such file or directory"))
    assert.is_nil(cli.user_message("recipes/x.lua:3: attempt to index a nil value"))
    assert.is_nil(cli.user_message("/work/lua/nibble/qad.lua:12: boom\nmore"))
    assert.is_nil(cli.user_message('[string "x"]:1: boom'))
    assert.is_nil(cli.user_message("interrupted"))
    assert.is_nil(cli.user_message({}))
    assert.is_nil(cli.user_message(nil))
  end)

  it("program is a plain call from Lua (a spec, a script, the REPL): results and errors reach the caller", function()
    assert.are.same({ 1, 2 }, { cli.program(function(a, b) return a, b end, 1, 2) })
    assert.are.equal("x: refused", nbspec.err_of(cli.program, function() error("x: refused", 0) end))
  end)

  it("user_call raises a failure again without the position a script's call gave it", function()
    assert.are.equal("boom", nbspec.err_of(cli.user_call, function() error("boom") end))
    assert.are.equal("interrupted", nbspec.err_of(cli.user_call, function() error("interrupted", 0) end))
    local t = {}
    local ok, e = pcall(cli.user_call, function() error(t) end)
    assert.is_false(ok)
    assert.are.equal(t, e)
    assert.are.same({ 3 }, { cli.user_call(function(x) return x + 1 end, 2) })
  end)

  local tmp = nbspec.private_dir()
  local function script(name, body)
    local p = tmp .. "/" .. name
    nbspec.write(p, body)
    return p
  end

  it("nibble run: a refused request is one line and exit code 1; NIBBLE_DEBUG=1 adds the traceback", function()
    local p = script("refuse.lua", "return require('nibble.cli').program(function() error('demo: refused', 0) end)\n")
    local out, err, rc = nbspec.nibble { "run", p }
    assert.are.equal(1, rc)
    assert.are.equal("", out)
    assert.are.equal("nibble: demo: refused\n", err)
    local _, err2, rc2 = nbspec.nibble({ "run", p }, nil, { NIBBLE_DEBUG = "1" })
    assert.are.equal(1, rc2)
    assert.truthy(err2:find("nibble: demo: refused\nstack traceback:\n", 1, true), err2)
  end)

  it("nibble run: a bug keeps its traceback, with the file and line", function()
    local p = script("bug.lua", "return require('nibble.cli').program(function()\n  local t = nil\n  return t.x\nend)\n")
    local _, err, rc = nbspec.nibble { "run", p }
    assert.are.equal(1, rc)
    assert.truthy(err:find("nibble: " .. p .. ":3: attempt to index", 1, true), err)
    assert.truthy(err:find("stack traceback:", 1, true), err)
  end)

  it("nibble run: a declarative recipe refused by recipe.execute is one line", function()
    local p = script("bad_distill.lua", "return nibble.recipe { model = { path = '/nonexistent' }, distill = { stepz = 3 } }\n")
    local _, err, rc = nbspec.nibble { "run", p }
    assert.are.equal(1, rc)
    assert.are.equal("nibble: recipe: unknown key 'stepz' in 'distill' (did you mean 'steps'?)\n", err)
  end)

  it("nibble run recipes/qad.lua: bad keys and values are one line, --help prints the keys", function()
    local src = nbspec.source_dir .. "/recipes/qad.lua"
    for _, c in ipairs {
      { "format=nvfp5", "nibble: qad.lua: unknown format 'nvfp5' (did you mean 'nvfp4'?); known: fp8, fp8_per_channel, "
                        .. "mxfp8, nvfp4, nvfp4_4o6, nvfp4_4o6_a4, nvfp4_static, nvfp4_w4a16\n" },
      { "kd=ce", "nibble: qad.lua: kd must be kl, reverse_kl or topk, got 'ce'\n" },
      { "stpes=5", "nibble: qad.lua: unknown key 'stpes' (did you mean 'steps'?); --help lists the keys\n" },
      { "lr=fast", "nibble: qad.lua: lr must be a number, got 'fast'\n" },
    } do
      local out, err, rc = nbspec.nibble { "run", src, "model=/nonexistent", c[1] }
      assert.are.equal(1, rc, c[1])
      assert.are.equal("", out)
      assert.are.equal(c[2], err)
    end
    local out, err, rc = nbspec.nibble { "run", src, "--help" }
    assert.are.equal(0, rc, err)
    assert.matches("^Quantization%-aware distillation as a recipe", out)
    assert.truthy(out:find("[lm_loss=true kd_loss_scale=S: loss = CE + S * KD]", 1, true), out)
  end)

  it("nibble run usage: the run command's text, listed by nibble --help", function()
    local out, code = captured(cli.main, "run", { "--help" })
    assert.are.equal(0, code)
    assert.matches("^usage: nibble run FILE", out)
    assert.truthy(out:find("NIBBLE_DEBUG=1 prints the traceback for every error", 1, true), out)
    local help = nbspec.nibble { "--help" }
    assert.matches("nibble run %.%.%.%s+run a Lua script or a recipe", help)
  end)
end)

describe("sub-commands: one-line refusals that name the path and what is wrong", function()
  local H = nbspec.data("stories260K/hf")
  local V = nbspec.data("text/tinystories_valid_head_776KiB.txt")
  local tmp = nbspec.private_dir()

  -- runs nibble ARGS and checks exit code 1, nothing on stdout and exactly `msg` on stderr
  local function refused(args, msg)
    local out, err, rc = nbspec.nibble(args)
    assert.are.equal(msg, err)
    assert.are.equal(1, rc, table.concat(args, " "))
    assert.are.equal("", out)
  end

  it("parse: a value that starts with -- is a forgotten value, not the value; --opt=--x and -1 still pass", function()
    local o, code, _, err = run({ "--model", "--ids" })
    assert.is_nil(o)
    assert.are.equal(1, code)
    assert.are.equal("nibble demo: --model needs a value, got the option --ids\n", err)
    _, _, _, err = run({ "--ctx", "--ids" })
    assert.are.equal("nibble demo: --ctx needs a value, got the option --ids\n", err)
    _, _, _, err = run({ "--ctx", "-1" })
    assert.are.equal("nibble demo: --ctx needs a positive integer, got -1\n", err)
    assert.are.same({ model = "--ids" }, (run({ "--model=--ids" })))
  end)

  it("quantize --out --quiet and tokenize --text --count are refused (no folder named --quiet)", function()
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--out", "--quiet" },
      "nibble quantize: --out needs a value, got the option --quiet\n")
    refused({ "tokenize", "--model", "/nonexistent", "--text", "--count" },
      "nibble tokenize: --text needs a value, got the option --count\n")
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--out", tmp .. "/q", "--samples", "0" },
      "nibble quantize: --samples needs a positive integer, got 0\n")
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--out", tmp .. "/q", "--seq-len", "0" },
      "nibble quantize: --seq-len needs a positive integer, got 0\n")
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--out", tmp .. "/q", "--batch", "0" },
      "nibble quantize: --batch needs a positive integer, got 0\n")
    refused({ "generate", "--model", "/nonexistent", "--top-p", "2" }, "nibble generate: --top-p needs a number in (0, 1], got 2\n")
    refused({ "generate", "--model", "/nonexistent", "--top-p", "0" }, "nibble generate: --top-p needs a number in (0, 1], got 0\n")
  end)

  -- hostile files (issue 22): ids past what a tokenizer.json declares, and a layer count whose cast to
  -- an integer would be undefined behaviour, refused before anything big is allocated
  it("tokenize: a 66-byte tokenizer.json with id 333333330 is one line, exit 1", function()
    local d = tmp .. "/bigid"
    os.execute("mkdir -p " .. nbspec.quote(d))
    local big = '{"model":{"type":"BPE","vocab":{"a":0,"b":333333330},"merges":[]}}'
    assert.are.equal(66, #big)
    nbspec.write(d .. "/tokenizer.json", big)
    refused({ "tokenize", "--model", d, "--text", "a" }, "nibble tokenize: NB_ERR_FORMAT: " .. d .. "/tokenizer.json: "
      .. 'vocab entry "b" has id 333333330, but the file declares only 2 tokens (vocab entries + added_tokens)\n')
  end)

  it("eval: num_hidden_layers 1e36 in config.json is one line, exit 1", function()
    if not nbspec.need(H) then return end
    local d = tmp .. "/layers"
    os.execute("mkdir -p " .. nbspec.quote(d))
    local cfg = nbspec.read(H .. "/config.json")
    local bad, n = cfg:gsub('"num_hidden_layers": 5', '"num_hidden_layers": 1e36')
    assert.are.equal(1, n)
    nbspec.write(d .. "/config.json", bad)
    nbspec.write(d .. "/tokenizer.json", nbspec.read(H .. "/tokenizer.json"))
    os.execute("ln -s " .. nbspec.quote(H .. "/model.safetensors") .. " " .. nbspec.quote(d .. "/model.safetensors"))
    refused({ "eval", "--model", d, "--data", "tests/data/stories.txt" }, "nibble eval: NB_ERR_FORMAT: " .. d
      .. "/config.json: field 'num_hidden_layers' is 1e+36, outside [-2147483648, 2147483647]\n")
  end)

  it("plot, tokenize, eval and plan: a folder or a missing file is one line naming the path once", function()
    refused({ "plot", tmp, "--out", tmp .. "/c.svg" }, "nibble plot: " .. tmp .. " is a folder, not a file\n")
    refused({ "plot", "/nonexist.txt", "--out", tmp .. "/c.svg" },
      "nibble plot: cannot open /nonexist.txt: No such file or directory\n")
    local m = tmp .. "/m.jsonl"
    nbspec.write(m, '{"step": 1, "loss": 2}\n')
    refused({ "plot", m, "--out", "/nonexist/c.svg" }, "nibble plot: cannot write /nonexist/c.svg: No such file or directory\n")
    refused({ "plan", "/nonexist.lua" }, "nibble plan: cannot open /nonexist.lua: No such file or directory\n")
    local md = tmp .. "/notes.md"
    nbspec.write(md, "# title\n\n`code`\n")
    refused({ "plan", md }, "nibble plan: " .. md .. " is not a Lua recipe: " .. md .. ":3: unexpected symbol near '`'\n")
    if not nbspec.need(H) then return end
    refused({ "tokenize", "--model", H, "--file", tmp }, "nibble tokenize: " .. tmp .. " is a folder, not a file\n")
    refused({ "tokenize", "--model", H, "--file", "/nonexist.txt" },
      "nibble tokenize: cannot open /nonexist.txt: No such file or directory\n")
    local bin = tmp .. "/bin.dat"
    nbspec.write(bin, "abc\0def")
    refused({ "tokenize", "--model", H, "--file", bin }, "nibble tokenize: NB_ERR_FORMAT: " .. bin
      .. " is not a text file (a NUL byte at offset 3): give a text or JSONL file\n")
    refused({ "eval", "--model", H, "--data", tmp }, "nibble eval: " .. tmp .. " is a folder, not a file\n")
    refused({ "eval", "--model", H, "--data", "/nonexist.txt" },
      "nibble eval: cannot open /nonexist.txt: No such file or directory\n")
  end)

  it("inspect: a text file is not safetensors or GGUF; config.json is not an index", function()
    local txt = tmp .. "/a.txt"
    nbspec.write(txt, "Once upon a time there was a cat.\n")
    refused({ "inspect", txt }, "nibble inspect: " .. txt .. " is not a safetensors or GGUF file\n")
    if not nbspec.need(H) then return end
    refused({ "inspect", H .. "/config.json" }, "nibble inspect: " .. H .. "/config.json is not a safetensors index "
      .. "(no \"weight_map\"); give the model folder, a .safetensors or a .gguf file\n")
    local out, _, rc = nbspec.nibble { "inspect", H .. "/model.safetensors" }
    assert.are.equal(0, rc)
    assert.truthy(out:find("safetensors, 1 file, 47 tensors, 260,032 parameters", 1, true), out)
  end)

  it("eval and generate refuse contexts beyond max_position_embeddings unless --allow-long", function()
    if not nbspec.need(H, V) then return end
    refused({ "eval", "--model", H, "--data", V, "--ctx", "4096", "--chunks", "1" },
      "nibble eval: --ctx 4096 is more than the model's max_position_embeddings 512 (--allow-long runs it anyway)\n")
    local out, err, rc = nbspec.nibble { "eval", "--model", H, "--data", V, "--ctx", "600", "--chunks", "1", "--allow-long" }
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("(1 chunk of 600 tokens, 299 scored)", 1, true), out)
    refused({ "generate", "--model", H, "--prompt", "Once upon", "-n", "510", "--greedy" },
      "nibble generate: the prompt's 3 tokens + -n 510 = 513 is more than the model's max_position_embeddings 512 "
      .. "(--allow-long runs it anyway)\n")
    refused({ "generate", "--model", H, "-n", "512" },
      "nibble generate: the prompt's 1 token + -n 512 = 513 is more than the model's max_position_embeddings 512 "
      .. "(--allow-long runs it anyway)\n")
  end)

  it("eval, generate and tokenize take the model's .safetensors file for its folder", function()
    if not nbspec.need(H, V) then return end
    local out, err, rc = nbspec.nibble { "eval", "--model", H .. "/model.safetensors", "--data", V, "--ctx", "64",
                                         "--chunks", "1", "--json" }
    assert.are.equal(0, rc, err)
    assert.truthy(out:find('"tokens": 31', 1, true), out)
    out, err, rc = nbspec.nibble { "tokenize", "--model", H .. "/model.safetensors", "--text", "hi" }
    assert.are.equal(0, rc, err)
    assert.are.equal("1 270 417\n", out)
    out, err, rc = nbspec.nibble { "generate", "--model", H .. "/model.safetensors", "--prompt", "Once upon", "-n", "5",
                                   "--greedy" }
    assert.are.equal(0, rc, err)
    assert.are.equal("Once upon a time, there was\n", out)
  end)

  it("--help says what the options mean", function()
    local out = nbspec.nibble { "generate", "--help" }
    assert.truthy(out:find("0 = no top-k limit", 1, true), out)
    assert.truthy(out:find("--allow-long", 1, true), out)
    out = nbspec.nibble { "eval", "--help" }
    assert.truthy(out:find("--allow-long   allow a --ctx beyond max_position_embeddings", 1, true), out)
    out = nbspec.nibble { "inspect", "--help" }
    assert.truthy(out:find("--all    print every element of long metadata arrays", 1, true), out)
    out = nbspec.nibble { "tokenize", "--help" }
    assert.truthy(out:find("without --text or --file the text is read from stdin", 1, true), out)
    out = nbspec.nibble { "quantize", "--help" }
    assert.truthy(out:find("--samples N   calibration rows (default 512", 1, true), out)
  end)
end)

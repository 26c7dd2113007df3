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

  it("refuses unknown options and (without positional) stray words, with the usage; values on flags", function()
    for _, argv in ipairs { { "--frob" }, { "-x", "1" } } do
      local o, code, _, err = run(argv)
      assert.is_nil(o)
      assert.are.equal(1, code)
      assert.are.equal("nibble demo: unknown argument " .. argv[1] .. "\nusage: nibble demo ...\n", err)
    end
    local o, code, _, err = run({ "--ids=1" })
    assert.is_nil(o)
    assert.are.equal(1, code)
    assert.are.equal("nibble demo: --ids takes no value, got --ids=1\n", err)
    local o, code, _, err = run({ "word" }, { { "--ids", key = "ids" } })
    assert.is_nil(o)
    assert.are.equal(1, code)
    assert.are.equal("nibble demo: unknown argument word\nusage: nibble demo ...\n", err)
  end)

  it("suggests the nearest option for a misspelt one (a typo's distance: 2 edits)", function()
    for _, c in ipairs {
      { "--modle", "--model" }, { "--tmep=2", "--temp" }, { "--kyes", "--keys" }, { "--no-stpo", "--no-stop" },
    } do
      local o, code, _, err = run({ c[1] })
      assert.is_nil(o)
      assert.are.equal(1, code)
      assert.are.equal(("nibble demo: unknown argument %s (did you mean '%s'?)\nusage: nibble demo ...\n")
        :format(c[1], c[2]), err)
    end
  end)

  it("says which required options (and positional words) are missing; with no argument at all, the usage", function()
    local spec = { { "--model", key = "model", arg = "PATH", need = true }, { "--ctx", key = "ctx", num = "int+", need = true },
                   { "--ids", key = "ids" }, positional = "FILE", need_positional = true }
    local o, code, out, err = run({ "--ids" }, spec)
    assert.is_nil(o)
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.are.equal("nibble demo: missing FILE, --model PATH, --ctx N\nusage: nibble demo ...\n", err)
    _, _, _, err = run({ "a.txt", "--ctx", "2" }, spec)
    assert.are.equal("nibble demo: missing --model PATH\nusage: nibble demo ...\n", err)
    _, code, _, err = run({}, spec)
    assert.are.equal(1, code)
    assert.are.equal("usage: nibble demo ...\n", err)
    assert.are.same({ "a.txt", model = "m", ctx = 2 }, (run({ "a.txt", "--ctx", "2", "--model", "m" }, spec)))
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

  it("a position in a data file is the user's (FILE:LINE stays); a Lua position is not", function()
    local data_err = "NB_ERR_FORMAT: /tmp/calib.jsonl:2: invalid JSON (column 3)"
    assert.are.equal(data_err, cli.user_message(data_err))
    assert.are.equal(data_err, cli.clean(data_err))
    assert.are.equal(data_err, cli.clean("/work/lua/nibble/ptq.lua:120: " .. data_err))
    assert.are.equal(data_err, cli.clean("recipes/x.lua:3: " .. data_err))
    assert.are.equal("boom", cli.clean('[string "x = 1"]:1: boom'))
    assert.are.equal("boom", cli.clean("stdin:4: boom"))
    assert.are.equal("boom", cli.clean("(command line):1: boom"))
    assert.are.equal("a.txt:3: boom", cli.clean("a.txt:3: boom"))
    assert.is_nil(cli.user_message("recipes/x.lua:3: " .. data_err))
    assert.are.equal("NB_ERR_FORMAT: /tmp/calib.jsonl:2: invalid JSON", nbspec.err_of(cli.user_call, function()
      error("NB_ERR_FORMAT: /tmp/calib.jsonl:2: invalid JSON")   -- error() adds this spec's position
    end))
  end)

  it("fail: a failed call is one line without the Lua position; Ctrl-C is raised again (the host exits 130)", function()
    local err = {}
    local se = io.stderr
    io.stderr = { write = function(_, ...) for _, x in ipairs({ ... }) do err[#err + 1] = x end end }
    local ok, code = pcall(cli.fail, "demo", "/x/nibble/data.lua:9: NB_ERR_FORMAT: c.jsonl:2: invalid JSON")
    local ok2, e2 = pcall(cli.fail, "demo", "interrupted")
    local ok3, e3 = pcall(cli.fail, "demo", "/x/nibble/init.lua:109: NB_ERR_INTERRUPTED: interrupted")
    io.stderr = se
    assert.is_true(ok)
    assert.are.equal(1, code)
    assert.are.equal("nibble demo: NB_ERR_FORMAT: c.jsonl:2: invalid JSON\n", table.concat(err))
    assert.is_false(ok2)
    assert.are.equal("interrupted", e2)
    assert.is_false(ok3)
    assert.are.equal("interrupted", e3)
  end)

  it("interrupt_message says which exports completed since a point, and only those", function()
    local qm = require("nibble.qmodel")
    local n = #qm.completed_exports
    assert.are.equal("interrupted", cli.interrupt_message(n))
    qm.completed_exports[n + 1] = "/tmp/out-a"
    local ok, msg = pcall(cli.interrupt_message, n)
    local msg0 = cli.interrupt_message(n + 1)
    qm.completed_exports[n + 1] = nil
    assert.is_true(ok, msg)
    assert.are.equal("interrupted after the export was complete: /tmp/out-a is complete and usable", msg)
    assert.are.equal("interrupted", msg0)
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
    -- the tensor made before the refusal is freed: program closes the Lua state as it exits (os.exit(1,
    -- true)); without that the sanitizer build's LeakSanitizer reports it on stderr and the exit code is 23
    local p = script("refuse.lua", "local t = nibble.zeros('f32', 4096)\n"
      .. "return require('nibble.cli').program(function() error('demo: refused', 0) end)\n")
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

  -- nibble run on a script NAME holding BODY: exit code 1, nothing on stdout, exactly MSG on stderr
  local function run_refused(name, body, msg)
    local out, err, rc = nbspec.nibble { "run", script(name, body) }
    assert.are.equal(msg, err)
    assert.are.equal(1, rc)
    assert.are.equal("", out)
  end

  it("nibble run: a declarative recipe refused by recipe.execute is one line", function()
    run_refused("bad_distill.lua", "return nibble.recipe { model = { path = '/nonexistent' }, distill = { stepz = 3 } }\n",
      "nibble: recipe: unknown key 'stepz' in 'distill' (did you mean 'steps'?)\n")
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

  it("nibble run recipes/qad.lua --help speaks to the user: no issue numbers, no internal documents", function()
    local out, err, rc = nbspec.nibble { "run", nbspec.source_dir .. "/recipes/qad.lua", "--help" }
    assert.are.equal(0, rc, err)
    assert.falsy(out:find("issue", 1, true), out)
    assert.falsy(out:find("FORMATS", 1, true), out)
    assert.falsy(out:find("§", 1, true), out)
    assert.falsy(out:find("qad.loader", 1, true), out)
    assert.truthy(out:find("The defaults are those of NVIDIA ModelOpt's QAD: the loss is KL(teacher‖student)", 1, true), out)
    assert.truthy(out:find("exits with code 130;\nrun again with resume=true", 1, true), out)
  end)

  it("nibble run: a glob with a typo or a misspelt unit gets the nearest that exists", function()
    run_refused("typo_unit.lua", "return nibble.recipe { extends = 'units/nvfp4_w4a61', model = { path = '/nonexistent' } }\n",
      "nibble: recipe: extends 'units/nvfp4_w4a61': no such recipe or unit (did you mean 'units/nvfp4_w4a16'?)\n")
    -- the matcher alone (no model needed): module names as the resolver sees them
    local recipe = require("nibble.recipe")
    local mods = {}
    for _, n in ipairs { "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj" } do
      mods[#mods + 1] = { name = n, kind = "linear", in_features = 64, out_features = 64 }
    end
    local function refused(glob)
      return nbspec.err_of(recipe.resolve, { quantize = { { "*", "nvfp4_w4a16" }, { glob, "mxfp8" } } }, mods)
    end
    assert.are.equal("recipe: rule 2 '*.mpl.*' matches no module (did you mean '*.mlp.*'?)", refused("*.mpl.*"))
    assert.are.equal("recipe: rule 2 'model.layers.*.mlp.gate_prj' matches no module (did you mean "
      .. "'model.layers.*.mlp.gate_proj'?)", refused("model.layers.*.mlp.gate_prj"))
    assert.are.equal("recipe: rule 2 'model.layers.0.mlp.down_prj' matches no module (did you mean "
      .. "'model.layers.0.mlp.down_proj'?)", refused("model.layers.0.mlp.down_prj"))
    assert.are.equal("recipe: rule 2 '*.experts.*' matches no module", refused("*.experts.*"))
  end)

  it("nibble run usage: the run command's text, listed by nibble --help", function()
    local out, code = captured(cli.main, "run", { "--help" })
    assert.are.equal(0, code)
    assert.matches("^usage: nibble run FILE", out)
    assert.truthy(out:find("NIBBLE_DEBUG=1 prints the traceback for every error", 1, true), out)
    assert.truthy(out:find('After the export finished, Ctrl-C says "interrupted\n  after the export was complete: DIR is '
      .. 'complete and usable" and still exits 130', 1, true), out)
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
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--out", tmp .. "/q", "--dtype", "f64" },
      "nibble quantize: recipe: unknown export dtype 'f64' (did you mean 'f16'?); known: bf16, f16, f32\n")
    refused({ "generate", "--model", "/nonexistent", "--top-p", "2" }, "nibble generate: --top-p needs a number in (0, 1], got 2\n")
    refused({ "generate", "--model", "/nonexistent", "--top-p", "0" }, "nibble generate: --top-p needs a number in (0, 1], got 0\n")
  end)

  it("quantize: a misspelt option, a missing --out and unknown values name the option, not a file of nibble's", function()
    local _, err, rc = nbspec.nibble { "quantize", "--fromat", "nvfp4" }
    assert.are.equal(1, rc)
    assert.matches("^nibble quantize: unknown argument %-%-fromat %(did you mean '%-%-format'%?%)\nusage: nibble quantize ", err)
    _, err, rc = nbspec.nibble { "quantize", "--model", "/nonexistent", "--format", "nvfp4" }
    assert.are.equal(1, rc)
    assert.matches("^nibble quantize: missing %-%-out DIR\nusage: nibble quantize ", err)
    local known = "fp8, fp8_per_channel, mxfp8, nvfp4, nvfp4_4o6, nvfp4_4o6_a4, nvfp4_static, nvfp4_w4a16"
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp5", "--out", tmp .. "/q" },
      "nibble quantize: unknown --format 'nvfp5' (did you mean 'nvfp4'?); known: " .. known .. "\n")
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--layout", "compresed-tensors", "--out", tmp .. "/q" },
      "nibble quantize: unknown --layout 'compresed-tensors' (did you mean 'compressed-tensors'?); known: "
      .. "compressed-tensors, modelopt\n")
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--algorithm", "msee", "--out", tmp .. "/q" },
      "nibble quantize: unknown --algorithm 'msee' (did you mean 'mse'?); known: four_over_six, max, mse\n")
    refused({ "quantize", "--model", "/nonexistent", "--format", "nvfp4", "--kv-cache", "fp16", "--out", tmp .. "/q" },
      "nibble quantize: unknown --kv-cache 'fp16' (did you mean 'fp8'?); known: fp8, none\n")
  end)

  it("quantize refuses a --seq-len beyond max_position_embeddings unless --allow-long, before any compute", function()
    if not nbspec.need(H, V) then return end
    refused({ "quantize", "--model", H, "--format", "nvfp4", "--calib", V, "--seq-len", "2048", "--out", tmp .. "/long" },
      "nibble quantize: --seq-len 2048 is more than the model's max_position_embeddings 512 (--allow-long runs it anyway)\n")
    assert.is_nil(nbspec.read(tmp .. "/long/config.json"))
    -- the recipe form, and QAD's calibration rows (which follow distill's allow_long)
    refused({ "run", nbspec.source_dir .. "/recipes/ptq.lua", "model=" .. H, "format=fp8", "calib=" .. V, "seq_len=513",
              "out=" .. tmp .. "/long" },
      "nibble: calibration: seq_len 513 is more than the model's max_position_embeddings 512 (allow_long=true runs it anyway)\n")
    refused({ "run", nbspec.source_dir .. "/recipes/qad.lua", "model=" .. H, "data=" .. V, "format=nvfp4", "calib_seq_len=1024",
              "out=" .. tmp .. "/long" },
      "nibble: calibration: seq_len 1024 is more than the model's max_position_embeddings 512 (allow_long=true runs it anyway)\n")
    refused({ "run", nbspec.source_dir .. "/recipes/qad.lua", "model=" .. H, "data=" .. V, "seq_len=2048", "out=" .. tmp .. "/long" },
      "nibble: distill: seq_len 2048 is more than the model's max_position_embeddings 512 (allow_long=true runs it anyway)\n")
    -- a weight-only format reads no calibration rows: --seq-len is not used, nothing to refuse
    local out, err, rc = nbspec.nibble { "quantize", "--model", H, "--format", "nvfp4_w4a16", "--seq-len", "2048", "--quiet",
                                         "--out", tmp .. "/wo" }
    assert.are.equal(0, rc, err)
    assert.matches("^quantized 30 modules %(nvfp4_w4a16, max%) %-> ", out)
    -- --allow-long runs it (rows of 600 tokens, positions past 512)
    out, err, rc = nbspec.nibble { "quantize", "--model", H, "--format", "nvfp4", "--calib", V, "--seq-len", "600",
                                   "--samples", "2", "--allow-long", "--quiet", "--out", tmp .. "/long2" }
    assert.are.equal(0, rc, err)
    assert.matches("^quantized 30 modules %(nvfp4, max%) %-> ", out)
  end)

  it("quantize --algorithm four_over_six on an NVFP4 format runs its 4/6 variant, byte for byte; the run reports skips", function()
    if not nbspec.need(H) then return end
    local out, err, rc = nbspec.nibble { "quantize", "--model", H, "--format", "nvfp4_w4a16", "--algorithm", "four_over_six",
                                         "--out", tmp .. "/alg46" }
    assert.are.equal(0, rc, err)
    assert.matches("^quantized 30 modules %(nvfp4_w4a16, four_over_six%) %-> ", out)
    -- the unit's '*' rule cannot take down_proj (172 wide): the run says so, with the reason
    assert.are.equal(1, err:find("recipe: rule 1 of units/nvfp4_w4a16 '*' (nvfp4_w4a16) leaves 5 of its 35 modules unquantized: "
      .. "in_features 172 is not divisible by the nvfp4 block size 16 (model.layers.0.mlp.down_proj, "
      .. "model.layers.1.mlp.down_proj, model.layers.2.mlp.down_proj and 2 more)\n", 1, true), err)
    out, err, rc = nbspec.nibble { "quantize", "--model", H, "--format", "nvfp4_4o6", "--quiet", "--out", tmp .. "/pre46" }
    assert.are.equal(0, rc, err)
    assert.matches("^quantized 30 modules %(nvfp4_4o6, four_over_six%) %-> ", out)
    for _, f in ipairs { "model.safetensors", "hf_quant_config.json", "config.json" } do
      local a, b = nbspec.read(tmp .. "/alg46/" .. f), nbspec.read(tmp .. "/pre46/" .. f)
      assert.is_string(a, f)
      assert.are.equal(b, a, f)
    end
    -- the 4/6 scales: weight_scale_2 = G/1536, not the plain preset's G/2688
    local plain
    out, err, rc = nbspec.nibble { "quantize", "--model", H, "--format", "nvfp4_w4a16", "--quiet", "--out", tmp .. "/plain" }
    assert.are.equal(0, rc, err)
    plain = nbspec.read(tmp .. "/plain/model.safetensors")
    assert.are_not.equal(plain, nbspec.read(tmp .. "/alg46/model.safetensors"))
  end)

  it("quantize stopped by Ctrl-C during calibration: exit code 130, 'nibble: interrupted' on a line of its own", function()
    if not nbspec.need(H, V) then return end
    -- the signal is sent once the calibration log line is out (the progress line follows it)
    local log = tmp .. "/int.err"
    local cmd = ("%s quantize --model %s --format nvfp4 --calib %s --out %s 2>%s & pid=$!; n=0; "
      .. "while ! grep -q '^calibration:' %s 2>/dev/null && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; "
      .. "sleep 0.3; kill -INT $pid; wait $pid"):format(nbspec.quote(nbspec.bin), nbspec.quote(H), nbspec.quote(V),
      nbspec.quote(tmp .. "/int"), nbspec.quote(log), nbspec.quote(log))
    local out, _, rc = nbspec.sh(cmd)
    local err = nbspec.read(log) or ""
    if rc == 0 then pending("the calibration finished before the signal") return end
    assert.are.equal(130, rc, err)
    assert.are.equal("", out)
    assert.matches("\nnibble: interrupted\n$", err)
    assert.falsy(err:find("traceback", 1, true), err)
    assert.is_nil(nbspec.read(tmp .. "/int/config.json"))
  end)

  it("a bad JSONL line keeps its FILE:LINE through quantize and recipes, as one line", function()
    if not nbspec.need(H, V) then return end
    local bad = tmp .. "/bad.jsonl"
    nbspec.write(bad, '{"text": "Once upon a time"}\n{"text": oops}\n')
    local msg = "NB_ERR_FORMAT: " .. bad .. ":2: invalid JSON (column 10)\n"
    local out, err, rc = nbspec.nibble { "quantize", "--model", H, "--format", "nvfp4", "--calib", bad, "--quiet",
                                         "--out", tmp .. "/j" }
    assert.are.equal(1, rc)
    assert.are.equal("", out)
    assert.are.equal("nibble quantize: " .. msg, err)
    -- recipes log their stages on stderr first; the error is the last line, with no traceback after it
    for _, a in ipairs {
      { nbspec.source_dir .. "/recipes/ptq.lua", "format=nvfp4", "calib=" .. bad },
      { nbspec.source_dir .. "/recipes/qad.lua", "data=" .. bad, "steps=1" },
    } do
      out, err, rc = nbspec.nibble { "run", a[1], "model=" .. H, a[2], a[3], "out=" .. tmp .. "/j" }
      assert.are.equal(1, rc, err)
      assert.are.equal("", out)
      assert.truthy(err:sub(-#msg - 8) == "nibble: " .. msg, err)
      assert.falsy(err:find("traceback", 1, true), err)
    end
  end)

  -- hostile files: ids past what a tokenizer.json declares, and a layer count whose cast to
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

describe("NIBBLE_SIMD", function()
  local tmp = nbspec.private_dir()
  -- a level that is not one (or that this CPU lacks) is refused when the context is created: one line,
  -- exit 1, nothing written; never a silent fallback to another level
  it("a value that is not a SIMD level is one line and exit code 1, before any work", function()
    local msg = "NIBBLE_SIMD='avx3' is not a SIMD level: expected auto, avx512, avx2 or scalar (unset it for auto)\n"
    local out, err, rc = nbspec.nibble({ "quantize", "--model", tmp, "--format", "fp8", "--out", tmp .. "/q" }, nil,
                                       { NIBBLE_SIMD = "avx3" })
    assert.are.equal("nibble quantize: cannot create a context: " .. msg, err)
    assert.are.equal(1, rc)
    assert.are.equal("", out)
    assert.is_false(nbspec.exists(tmp .. "/q/config.json"))
    -- nibble -e shows a traceback after any error (as for error('x')); its first line is the message
    out, err, rc = nbspec.nibble({ "-e", "require('nibble').zeros({2})" }, nil, { NIBBLE_SIMD = "avx3" })
    assert.are.equal("nibble: cannot create a context: " .. msg, err:match("^[^\n]*\n"))
    assert.are.equal(1, rc)
  end)
  it("scalar is honoured on any CPU (nb_simd_level says which table runs)", function()
    local out, err, rc = nbspec.nibble({ "-e", "local nb = require('nibble'); nb.context(); "
                                         .. "io.write(require('ffi').string(nb.C.nb_simd_level(nb.context())))" }, nil,
                                       { NIBBLE_SIMD = "scalar" })
    assert.are.equal("scalar", out, err)
    assert.are.equal(0, rc)
  end)
end)

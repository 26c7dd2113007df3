-- The `nibble` program, run as a subprocess: --version/--help, -e, run with key=value arguments,
-- tracebacks and exit codes, `inspect` (text and --json) on good and corrupt files, sub-command
-- dispatch to lua/nibble/cli/<cmd>.lua, the REPL on a pipe and on a pty, and Ctrl-C.
local nibble = require("nibble")
local nbspec = require("nbspec")
local need = nbspec.need
local json = require("nibble.json")

local run = nbspec.nibble
local hf = nbspec.data("stories260K/hf")
local gguf_path = nbspec.data("stories260K/stories260K.gguf")

local function has(s, needle) return s:find(needle, 1, true) ~= nil end

local function script(text)
  local path = nbspec.tmpname(".lua")
  nbspec.write(path, text)
  return path
end

describe("nibble flags", function()
  it("--version prints nibble's and LuaJIT's versions, then the GEMM line (blas_spec.lua)", function()
    local out, err, code = run({ "--version" })
    assert.are.equal(0, code, err)
    local first, second = out:match("^([^\n]*\n)(gemm: [^\n]*\n)$")
    assert.are.equal(("nibble %s (LuaJIT 2.1.0-beta3, CUDA %s)\n"):format(nibble.version,
      nibble.cuda().built and "on" or "off"), first)
    assert.truthy(second, out)
  end)

  it("--help lists the built-ins and the cli modules", function()
    local out, err, code = run({ "--help" })
    assert.are.equal(0, code, err)
    assert.truthy(has(out, "nibble run FILE [ARGS]"), out)
    assert.truthy(has(out, "nibble -e CODE [ARGS]"), out)
    assert.truthy(out:find("\n  nibble inspect %.%.%. +list the tensors %(name, dtype, shape, bytes%) and GGUF metadata"), out)
  end)

  it("rejects unknown commands and options", function()
    local _, err, code = run({ "frobnicate" })
    assert.are.equal(1, code)
    assert.are.equal("nibble: unknown command or file 'frobnicate' (see nibble --help)\n", err)
    _, err, code = run({ "--frob" })
    assert.are.equal(1, code)
    assert.are.equal("nibble: unknown option '--frob' (see nibble --help)\n", err)
    _, err, code = run({ "-e" })
    assert.are.equal(1, code)
    assert.truthy(has(err, "-e needs an argument"), err)
  end)
end)

describe("nibble -e and run", function()
  it("runs code with the nibble module loaded and linked into the host", function()
    local out, err, code = run({ "-e", "print(1 + 1, nibble.version, nibble.libpath, type(nibble.zeros))" })
    assert.are.equal(0, code, err)
    assert.are.equal(("2\t%s\t(linked into the nibble host)\tfunction\n"):format(nibble.version), out)
  end)

  it("loads stories260K and prints the count and a shape (the issue's example)", function()
    if not need(hf) then return end
    local code_text = ('local t = nibble.load(%q); print(#t, t["model.layers.0.self_attn.q_proj.weight"].shape)')
      :format(hf .. "/model.safetensors")
    local out, err, code = run({ "-e", code_text })
    assert.are.equal(0, code, err)
    assert.are.equal("47\t{64, 64}\n", out)
  end)

  it("passes key=value pairs as arg.key and the rest positionally", function()
    local path = script([[
print(arg[0], arg[1], arg[2], arg[3], arg.model, arg.steps, type(arg.steps), arg.eq, select("#", ...))
print(arg[-1] ~= nil, arg["not-a-key"], arg["lr.min"])
]])
    local out, err, code = run({ "run", path, "first", "model=x/y.safetensors", "steps=3", "eq=a=b", "second", "=odd",
                                 "lr.min=1e-5" })
    assert.are.equal(0, code, err)
    assert.are.equal(("%s\tfirst\tsecond\t=odd\tx/y.safetensors\t3\tstring\ta=b\t7\ntrue\tnil\t1e-5\n"):format(path), out)
    out, err, code = run({ path, "k=v" })   -- FILE.lua directly
    assert.are.equal(0, code, err)
    assert.truthy(out:find("^" .. path:gsub("%p", "%%%0") .. "\tnil\tnil\tnil\tnil\tnil\tnil\tnil\t1\n"), out)
    os.remove(path)
  end)

  it("prints a traceback with file:line and exits 1 on a script error", function()
    local path = script("local function f()\n  error('boom')\nend\nf()\n")
    local out, err, code = run({ "run", path })
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.truthy(has(err, "nibble: " .. path .. ":2: boom\nstack traceback:\n"), err)
    assert.truthy(has(err, path .. ":2: in function 'f'"), err)
    assert.truthy(has(err, path .. ":4: in main chunk"), err)
    os.remove(path)
  end)

  it("reports library errors at the script's line", function()
    local path = script("local t = nibble.zeros('f32', 2, 3)\nlocal v = t:view(5)\n")
    local _, err, code = run({ "run", path })
    assert.are.equal(1, code)
    assert.truthy(has(err, "nibble: " .. path .. ":2: NB_ERR_SHAPE: view: 6 elements cannot be viewed as 5\n"), err)
    os.remove(path)
  end)

  it("reports syntax errors and missing files", function()
    local path = script("x = = 1\n")
    local _, err, code = run({ "run", path })
    assert.are.equal(1, code)
    assert.truthy(has(err, "nibble: " .. path .. ":1: unexpected symbol near '='"), err)
    os.remove(path)
    _, err, code = run({ "run", "/nonexistent/x.lua" })
    assert.are.equal(1, code)
    assert.truthy(has(err, "cannot open /nonexistent/x.lua"), err)
    _, err, code = run({ "-e", "error({})" })
    assert.are.equal(1, code)
    assert.truthy(has(err, "(error object is a table value)"), err)
  end)

  it("runs a script from stdin with run -", function()
    local out, err, code = run({ "run", "-", "n=4" }, "print(arg.n * 2)\n")
    assert.are.equal(0, code, err)
    assert.are.equal("8\n", out)
  end)
end)

describe("nibble inspect", function()
  it("lists every tensor of the safetensors file", function()
    if not need(hf) then return end
    local out, err, code = run({ "inspect", hf .. "/model.safetensors" })
    assert.are.equal(0, code, err)
    assert.truthy(has(out, hf .. "/model.safetensors: safetensors, 1 file, 47 tensors, 260,032 parameters, "
                        .. "1,040,128 bytes of tensor data\n"), out)
    assert.truthy(has(out, "\nmetadata (1):\n  format  \"pt\"\n"), out)
    assert.truthy(out:find("\n  model%.layers%.0%.self_attn%.q_proj%.weight +F32 +{64, 64} +16,384\n"), out)
    local w = nibble.load(hf)
    local rows = 0
    for name in w:pairs() do
      assert.truthy(out:find("\n  " .. name:gsub("%p", "%%%0") .. " +F32 +{[%d, ]+} +[%d,]+\n"), name)
      rows = rows + 1
    end
    assert.are.equal(47, rows)
  end)

  it("lists every tensor and the metadata of the GGUF file", function()
    if not need(gguf_path) then return end
    local out, err, code = run({ "inspect", gguf_path })
    assert.are.equal(0, code, err)
    assert.truthy(has(out, ": GGUF v3, 48 tensors, 292,800 parameters, 1,171,200 bytes of tensor data\n"), out)
    assert.truthy(out:find("\n  general%.architecture +\"llama\"\n"), out)
    assert.truthy(out:find("\n  tokenizer%.ggml%.tokens +array%[string%] %(512%): \"<unk>\", \"<s>\", \"</s>\", "), out)
    assert.truthy(out:find("\n  llama%.attention%.layer_norm_rms_epsilon +9%.99999975e%-06\n"), out)
    local n = 0
    for name in nibble.load(gguf_path):pairs() do
      assert.truthy(out:find("\n  " .. name:gsub("%p", "%%%0") .. " +F32 +{[%d, ]+} +[%d,]+\n"), name)
      n = n + 1
    end
    assert.are.equal(48, n)
  end)

  it("--json prints nibble.inspect as JSON", function()
    if not need(hf and gguf_path) then return end
    for _, p in ipairs({ hf, gguf_path }) do
      local out, err, code = run({ "inspect", p, "--json" })
      assert.are.equal(0, code, err)
      local j = json.decode(out)
      local ref = nibble.inspect(p)
      assert.are.equal(ref.count, j.count)
      assert.are.equal(ref.params, j.params)
      assert.are.equal(#ref.tensors, #j.tensors)
      for i, r in ipairs(ref.tensors) do
        assert.are.equal(r.name, j.tensors[i].name)
        assert.are.same(r.shape, j.tensors[i].shape)
        assert.are.equal(r.bytes, j.tensors[i].bytes)
      end
      assert.are.equal(#ref.metadata, #j.metadata)
    end
    local ok, dk = pcall(require, "dkjson")   -- an independent parser, when installed
    if ok then
      local out = run({ "inspect", gguf_path, "--json" })
      local j = dk.decode(out)
      assert.are.equal(48, #j.tensors)
      assert.are.equal("<unk>", j.metadata[1].value[1])
    end
  end)

  it("names the problem with a bad file and exits 1", function()
    local tmp = nbspec.tmpname(".safetensors")
    nbspec.write(tmp, "\16\0\0\0\0\0\0\0{\"a\":{\"dtype\":1}}")
    local out, err, code = run({ "inspect", tmp })
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.truthy(err:find("^nibble inspect: NB_ERR_FORMAT: " .. tmp:gsub("%p", "%%%0")), err)
    assert.falsy(has(err, "traceback"))
    nbspec.write(tmp, "GGUF\3\0\0\0\1\0\0\0\0\0\0\0")
    _, err, code = run({ "inspect", tmp, "--json" })
    assert.are.equal(1, code)
    assert.truthy(err:find("^nibble inspect: NB_ERR_FORMAT: "), err)
    os.remove(tmp)
    _, err, code = run({ "inspect", "/nonexistent.gguf" })
    assert.are.equal(1, code)
    assert.are.equal("nibble inspect: NB_ERR_IO: cannot open /nonexistent.gguf: No such file or directory\n", err)
    _, err, code = run({ "inspect" })
    assert.are.equal(1, code)
    assert.truthy(has(err, "usage: nibble inspect PATH [--json] [--all]"), err)
  end)
end)

describe("sub-commands", function()
  it("dispatch to nibble.cli.<cmd> found on NIBBLE_LUA_PATH and appear in --help", function()
    local dir = nbspec.mkdtemp()
    os.execute("mkdir -p " .. nbspec.quote(dir .. "/nibble/cli"))
    nbspec.write(dir .. "/nibble/cli/hello-test.lua", [[
-- nibble hello-test: a command that exists only in this test
return function(args)
  print(#args, args[1], args[2], type(nibble) == "table" or require("nibble") ~= nil)
  return 3
end
]])
    local env = { NIBBLE_LUA_PATH = dir .. "/?.lua" }
    local out, err, code = run({ "hello-test", "a", "k=v" }, nil, env)
    assert.are.equal(3, code, err)
    assert.are.equal("2\ta\tk=v\ttrue\n", out)
    out = run({ "--help" }, nil, env)
    assert.truthy(out:find("\n  nibble hello%-test %.%.%. +a command that exists only in this test\n"), out)
    assert.truthy(has(out, "nibble inspect ..."), out)
    os.execute("rm -rf " .. nbspec.quote(dir))
  end)
end)

describe("the REPL", function()
  it("prints expression results and continues incomplete chunks (stdin is a pipe)", function()
    local input = table.concat({
      "x = 1 + 2",
      "x",
      "=x * 2",
      "nibble.tensor{{1, 2}, {3, 4}}",
      "function f(a)",
      "  return a * 10",
      "end",
      "f(4)",
      "nibble.zeros('bf16', 64, 64).shape",
      "'str', nil, 5",
      "error('oops')",
      "{1, 2, x = 3}",
      "print('still here')",
      "for i = 1, 2 do",
    }, "\n") .. "\n"
    local out, err, code = run({}, input)
    assert.are.equal(0, code, err)
    assert.are.equal(table.concat({
      "3", "6", "tensor<f32>{2, 2} {{1, 2}, {3, 4}}", "40", "{64, 64}", "str\tnil\t5", "{1, 2, x = 3}",
      "still here", "" }, "\n"), out)
    assert.truthy(has(err, "nibble: oops\n"), err)
    assert.truthy(has(err, "nibble: stdin:1: 'end' expected near '<eof>'\n"), err)
  end)

  it("prints a user error as its message alone; NIBBLE_DEBUG=1 adds the traceback", function()
    local input = "nibble.zeros('f32', -1)\nfunction f() error('boom') end\nf()\nprint('after')\n"
    local out, err, code = run({}, input)
    assert.are.equal(0, code, err)
    assert.are.equal("after\n", out)
    assert.are.equal("nibble: NB_ERR_INVALID: negative dimension -1\nnibble: stdin:1: boom\n", err)
    out, err, code = run({}, input, { NIBBLE_DEBUG = "1" })
    assert.are.equal(0, code, err)
    assert.are.equal("after\n", out)
    assert.truthy(has(err, "nibble: NB_ERR_INVALID: negative dimension -1\nstack traceback:\n"), err)
    assert.truthy(has(err, "nibble: stdin:1: boom\nstack traceback:\n"), err)
  end)

  it("takes sizes as torch does: nibble.randn(64, 64), nibble.zeros(2, 3, 'bf16')", function()
    local out, err, code = run({}, "nibble.randn(64, 64)\nnibble.zeros(2, 3, 'bf16')\nnibble.rand(5).shape\n")
    assert.are.equal(0, code, err)
    assert.are.equal("", err)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.matches("^tensor<f32>{64, 64} ", lines[1])
    assert.are.equal("tensor<bf16>{2, 3} {{0, 0, 0}, {0, 0, 0}}", lines[2])
    assert.are.equal("{5}", lines[3])
  end)

  it("completes globals, fields after '.' and methods after ':' (nibble.repl.complete)", function()
    local repl = require("nibble.repl")
    local t = nibble.zeros("f32", 2)
    local env = setmetatable({ t = t, nibble = nibble, xlong_name = 1, cfg = { alpha = 1, beta = { gamma = 2 } } },
                             { __index = _G })
    assert.are.same({ "xlong_name" }, repl.complete("xlo", env))
    assert.are.same({ "nibble.zeros" }, repl.complete("nibble.zer", env))
    assert.are.same({ "nibble.load" }, repl.complete("nibble.loa", env))            -- loaded on first use
    assert.are.same({ "nibble.model" }, repl.complete("nibble.mode", env))            -- a submodule not loaded yet
    assert.are.same({ "t:reshape" }, repl.complete("t:resh", env))
    assert.are.same({ "t.shape" }, repl.complete("t.sha", env))                        -- a tensor's fields
    assert.are.same({}, repl.complete("t:sha", env))                                   -- not a method
    assert.are.same({ "cfg.beta.gamma" }, repl.complete("cfg.beta.g", env))
    assert.are.same({ "cfg.alpha", "cfg.beta" }, repl.complete("cfg.", env))
    assert.are.same({ "string.format" }, repl.complete("string.form", env))
    assert.are.same({}, repl.complete("cfg..x", env))
    assert.are.same({}, repl.complete("nosuch.x", env))
  end)

  it("loads and shows a model at the prompt", function()
    if not need(hf) then return end
    local out, err, code = run({}, ("w = nibble.load(%q)\n#w, w[1]\nw['model.norm.weight']:stats().numel\n"):format(hf))
    assert.are.equal(0, code, err)
    assert.are.equal("47\tmodel.embed_tokens.weight\n64\n", out)
  end)
end)

-- in_terminal(keys): the REPL on a terminal (script(1) gives it a pty), typed at by the shell commands
-- `keys` (printf ...; sleep ...), then Ctrl-D, in a fresh HOME; returns its output (CRs removed) and the
-- history it saved, or nil (pending) when script(1) is not installed. Fails the spec unless it exits 0.
local function in_terminal(keys)
  local _, _, has_script = nbspec.sh("command -v script")
  if has_script ~= 0 then pending("script(1) is not installed") return nil end
  local home = nbspec.mkdtemp()
  -- script(1) runs the command through $SHELL -c; dash (CI's /bin/sh) stays as the parent in the
  -- terminal's process group and dies of a Ctrl-C, so exec the binary in its place.
  local cmd = ("{ %s printf '\\004'; sleep 0.5; } | HOME=%s SHELL=/bin/sh timeout 60 script -qfec %s /dev/null")
    :format(keys, nbspec.quote(home), nbspec.quote("exec " .. nbspec.quote(nbspec.bin)))
  local out, err, code = nbspec.sh(cmd)
  local hist = nbspec.read(home .. "/.nibble_history") or ""
  os.execute("rm -rf " .. nbspec.quote(home))
  assert.are.equal(0, code, err .. out)
  return (out:gsub("\r", "")), hist
end

describe("Ctrl-C", function()
  -- The program writes its pid; the code under test creates a marker file once its loop is about
  -- to start, and the driver waits for that file before it sends SIGINT (so a slow machine does
  -- not signal too early). Loops that call nibble are interrupted (the Lua hook, and check()
  -- polls the context flag the handler sets).
  local pidfile, ready, ready2
  before_each(function()
    pidfile, ready, ready2 = nbspec.tmpname(".pid"), nbspec.tmpname(".ready"), nbspec.tmpname(".ready")
  end)
  after_each(function() os.remove(pidfile); os.remove(ready); os.remove(ready2) end)

  -- sh -c 'echo $$ > PIDFILE; exec nibble ARGS...' (so $$ is nibble's pid)
  local function bin_with_pid(...)
    local inner = { "echo $$ >", nbspec.quote(pidfile), "; exec", nbspec.quote(nbspec.bin) }
    for _, a in ipairs({ ... }) do inner[#inner + 1] = nbspec.quote(a) end
    return "sh -c " .. nbspec.quote(table.concat(inner, " "))
  end
  local function wait_for(file)
    return ("i=0; while [ ! -e %s ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; sleep 0.3; ")
      :format(nbspec.quote(file))
  end
  local function touch(file) return ("io.open(%q, 'w'):close() "):format(file) end
  local function kill() return ("kill -INT $(cat %s); "):format(nbspec.quote(pidfile)) end
  -- nibble ARGS..., one Ctrl-C once `ready` exists: exit code 130, nothing on stdout; returns stderr
  local function stopped(...)
    local out, err, code = nbspec.sh(("%s & %s%s wait $!"):format(bin_with_pid(...), wait_for(ready), kill()))
    assert.are.equal(130, code, err)
    assert.are.equal("", out)
    return err
  end

  it("stops a script with 'nibble: interrupted' and exit code 130; NIBBLE_DEBUG=1 adds where it stopped", function()
    local code_text = touch(ready) .. "while true do local t = nibble.zeros('f32', 8) end"
    assert.are.equal("nibble: interrupted\n", stopped("-e", code_text))
    os.remove(ready)
    local cmd = ("%s & %s%s wait $!"):format(bin_with_pid("-e", code_text), wait_for(ready), kill())
    local _, err, code = nbspec.sh("NIBBLE_DEBUG=1 " .. cmd)
    assert.are.equal(130, code, err)
    assert.truthy(has(err, "nibble: interrupted\nstack traceback:\n"), err)
    assert.truthy(has(err, "(command line):1: in main chunk"), err)
  end)

  -- a program as recipes are (nibble.cli.program), optionally exporting stories260K first
  local function program_loop(export_dir)
    local body = ""
    if export_dir then
      body = ("nibble.ptq.run(nibble.recipe { extends = 'units/nvfp4_w4a16', model = { path = %q }, "
        .. "export = { dir = %q } }, nil, { quiet = true })\n"):format(hf, export_dir)
    end
    return script("return require('nibble.cli').program(function()\n" .. body .. touch(ready)
      .. "\nwhile true do local t = nibble.zeros('f32', 8) end\nend)\n")
  end

  it("stops a program (a recipe) with one line: no traceback, exit code 130", function()
    local p = program_loop(nil)
    assert.are.equal("nibble: interrupted\n", stopped("run", p))
    os.remove(p)
  end)

  it("says that the export is complete when Ctrl-C arrives after it (exit code 130 all the same)", function()
    if not need(hf) then return end
    local dir = nbspec.mkdtemp()
    local p = program_loop(dir .. "/q")
    assert.are.equal("nibble: interrupted after the export was complete: " .. dir .. "/q is complete and usable\n",
      stopped("run", p))
    assert.truthy(nbspec.read(dir .. "/q/model.safetensors"))
    assert.truthy(nbspec.read(dir .. "/q/hf_quant_config.json"))
    os.remove(p)
    os.execute("rm -rf " .. nbspec.quote(dir))
  end)

  it("interrupts the default context: a compiled loop that polls it stops at once", function()
    -- LuaJIT runs no debug hooks inside compiled loops; the handler's nb_ctx_interrupt is what
    -- this loop sees (as every nibble call does through check()).
    local code_text = touch(ready) ..
      "local n = 0 while nibble.C.nb_ctx_interrupted(nibble.ctx) == 0 do n = n + 1 end print('not reached')"
    local cmd = ("%s & %s%s wait $!"):format(bin_with_pid("-e", code_text), wait_for(ready), kill())
    local out, err, code = nbspec.sh(cmd)
    assert.are.equal(130, code, err)
    assert.are.equal("", out)
    assert.truthy(has(err, "nibble: interrupted\n"), err)
  end)

  it("explains a compiled loop that cannot be interrupted, and a Ctrl-C after that exits", function()
    -- The quick second Ctrl-C (before the notice) is absorbed: the first may still be on its way.
    local code_text = touch(ready) .. "local n = 0 while true do n = n + 1 end"
    local cmd = ("%s & %s%s sleep 0.2; %s sleep 2; %s wait $!")
      :format(bin_with_pid("-e", code_text), wait_for(ready), kill(), kill(), kill())
    local out, err, code = nbspec.sh(cmd)
    assert.are.equal(130, code, err)
    assert.are.equal("", out)
    assert.truthy(has(err, "nibble: still running: LuaJIT-compiled Lua loops cannot be interrupted"), err)
    assert.truthy(has(err, "nibble: interrupted twice, exiting\n"), err)
    assert.truthy(err:find("still running", 1, true) < err:find("interrupted twice", 1, true), err)
  end)

  it("returns to the REPL prompt without leaking, and drops a half-typed chunk", function()
    local loop = touch(ready) .. 'while true do local t = nibble.zeros("f32", 8):view(2, 4):t() x = x + 1 end'
    local after = 'collectgarbage() print("alive", x > 0, nibble.mem().live - base) ' .. touch(ready2)
    local feed = "{ echo " .. nbspec.quote("x = 0 collectgarbage() base = nibble.mem().live") .. "; "
      .. "echo " .. nbspec.quote(loop) .. "; " .. wait_for(ready) .. kill()
      .. "echo " .. nbspec.quote(after) .. "; " .. wait_for(ready2)
      .. "echo 'for i = 1, 3 do'; sleep 0.5; " .. kill() .. "sleep 0.5; echo 'print(\"after\")'; }"
    local out, err, code = nbspec.sh(feed .. " | " .. bin_with_pid())
    assert.are.equal(0, code, err)
    assert.are.equal("alive\ttrue\t0\nafter\n", out)   -- 0: no tensor leaked by the interrupt
    assert.truthy(has(err, "nibble: interrupted\n"), err)
  end)

  it("works on a terminal (libedit, under script(1))", function()
    -- One Ctrl-C stops the loop; the next line proves the REPL is back (it touches ready2) before
    -- a Ctrl-C at the prompt drops a half-typed line. Nothing depends on how fast the machine is.
    local loop = touch(ready) .. 'while true do local t = nibble.zeros("f32", 8); x = x + 1 end'
    local out, hist = in_terminal("sleep 0.7; printf '1 + 41\\r'; sleep 0.3; printf 'x = 0\\r'; sleep 0.3; "
      .. "printf '%s\\r' " .. nbspec.quote(loop) .. "; " .. wait_for(ready)
      .. "printf '\\003'; sleep 0.3; "
      .. "printf '%s\\r' " .. nbspec.quote('print("alive", x > 0) ' .. touch(ready2)) .. "; " .. wait_for(ready2)
      .. "printf 'half typed\\003'; sleep 0.3; "
      .. "printf 'nibble.tensor{1, 2}\\r'; sleep 0.3; ")
    if not out then return end
    assert.truthy(has(out, "1 + 41\n42\n"), out)
    assert.truthy(has(out, "nibble: interrupted\n"), out)
    assert.truthy(has(out, "alive\ttrue\n"), out)
    assert.truthy(has(out, "^C\n"), out)
    assert.truthy(has(out, "tensor<f32>{2} {1, 2}\n"), out)
    assert.falsy(has(out, "stack traceback"), out)
    assert.truthy(has(hist, "1\\040+\\04041"), hist)
  end)
end)

describe("Tab at the prompt", function()
  it("completes a global, a nibble function and a tensor method (libedit, under script(1))", function()
    -- each line is typed with a Tab in the middle of a name; the line runs as completed
    local out = in_terminal("sleep 0.7; printf 'xlong_name_q = 41\\r'; sleep 0.3; printf 'xlong_na\\t + 1\\r'; "
      .. "sleep 0.3; printf 'nibble.zer\\t(2).shape\\r'; sleep 0.3; printf 't = nibble.zeros(2, 3)\\r'; sleep 0.3; "
      .. "printf 't:resh\\t(3, 2).shape\\r'; sleep 0.3; ")
    if not out then return end
    assert.truthy(has(out, "\n42\n"), out)
    assert.truthy(has(out, "\n{2}\n"), out)
    assert.truthy(has(out, "\n{3, 2}\n"), out)
    assert.falsy(has(out, "nibble: "), out)   -- no line failed (an uncompleted name would be nil)
  end)
end)

describe("examples/hello.lua", function()
  it("summarizes stories260K from the default path and from arg.model", function()
    if not need(hf and gguf_path) then return end
    local out, err, code = run({ "run", nbspec.source_dir .. "/examples/hello.lua" })
    assert.are.equal(0, code, err)
    assert.truthy(has(out, "safetensors, 47 tensors, 260,032 parameters, 1,040,128 bytes"), out)
    assert.truthy(has(out, "LlamaForCausalLM: dim 64, 5 layers, 8 heads (4 for k/v)"), out)
    assert.truthy(out:find("\nmodel%.norm%.weight +f32 +{64} +1%.8118 +0%.5779 +4%.4251\n"), out)
    assert.truthy(has(out, "largest tensor: model.embed_tokens.weight (32,768 values)"), out)
    out, err, code = run({ "run", nbspec.source_dir .. "/examples/hello.lua", "model=" .. gguf_path })
    assert.are.equal(0, code, err)
    assert.truthy(has(out, "gguf, 48 tensors, 292,800 parameters"), out)
    assert.truthy(has(out, "llama: dim 64, 5 layers, 8 heads (4 for k/v)"), out)
  end)
end)

describe("plain luajit", function()
  it("finds libnibble through the path baked into nibble.buildinfo", function()
    local cmd = nbspec.luajit_prefix()
      .. "env -u NIBBLE_LIB luajit -e 'local n = require(\"nibble\"); print(n.libpath, #n.zeros(\"f32\", 3))'"
    local out, err, code = nbspec.sh(cmd)
    assert.are.equal(0, code, err)
    assert.are.equal(require("nibble.buildinfo").lib .. "\t3\n", out)
  end)
end)

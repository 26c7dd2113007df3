-- nibble.cli: sub-commands of the `nibble` program written in Lua. `nibble <cmd> args...` runs the
-- module nibble.cli.<cmd> (lua/nibble/cli/<cmd>.lua), which returns function(args) -> exit code
-- (or a table with a `run` function). The first comment line of the file is the summary that
-- `nibble --help` shows. Adding a command is adding a file: the host is not touched.
local M = {}

local function valid(cmd)
  return type(cmd) == "string" and cmd:match("^[%a_][%w_%-]*$") ~= nil and cmd ~= "init"
end

-- The file of command `cmd`, or nil.
function M.find(cmd)
  if not valid(cmd) then return nil end
  return package.searchpath("nibble.cli." .. cmd, package.path)
end

function M.exists(cmd) return M.find(cmd) ~= nil end

-- listdir(dir): the names in a folder (the host's nibble.host.listdir, else LuaFileSystem), or nil.
local function listdir(dir)
  local okh, host = pcall(require, "nibble.host")
  if okh and type(host) == "table" and host.listdir then return host.listdir(dir) end
  local okl, lfs = pcall(require, "lfs")
  if okl and lfs and lfs.dir then
    local r = {}
    local ok = pcall(function() for f in lfs.dir(dir) do r[#r + 1] = f end end)
    return ok and r or nil
  end
  return nil
end
M.listdir = listdir

local function summary_of(file, cmd)
  local f = io.open(file, "r")
  if not f then return "" end
  local line = f:read("*l") or ""
  f:close()
  line = line:match("^%-%-+%s*(.-)%s*$") or ""
  line = line:gsub("^nibble%s+" .. cmd:gsub("%-", "%%-") .. "%s*:%s*", "")
  return line
end

-- list(): { {name=, summary=, file=}, ... } sorted by name, over every directory of package.path
-- (the first file found for a name wins, as require would pick it).
function M.list()
  local found, out = {}, {}
  for template in package.path:gmatch("[^;]+") do
    if template:match("%?%.lua$") and not template:match("%?/") then
      local dir = template:gsub("%?%.lua$", "nibble/cli")
      for _, f in ipairs(listdir(dir) or {}) do
        local cmd = f:match("^(.+)%.lua$")
        if cmd and valid(cmd) and not found[cmd] then
          local file = M.find(cmd)
          if file then
            found[cmd] = true
            out[#out + 1] = { name = cmd, summary = summary_of(file, cmd), file = file }
          end
        end
      end
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

-- Lines for `nibble --help`.
function M.help_lines()
  local lines = {}
  for _, c in ipairs(M.list()) do
    lines[#lines + 1] = ("  nibble %-19s %s\n"):format(c.name .. " ...", c.summary)
  end
  if #lines == 0 then return "  (none found)\n" end
  return table.concat(lines)
end

-- main(cmd, args): run a command; returns its exit code (0 when it returns nothing or true).
function M.main(cmd, args)
  if not M.find(cmd) then
    io.stderr:write(("nibble: unknown command '%s' (see nibble --help)\n"):format(tostring(cmd)))
    return 1
  end
  local mod = require("nibble.cli." .. cmd)
  local fn = mod
  if type(mod) == "table" then
    fn = mod.run or (getmetatable(mod) or {}).__call and function(a) return mod(a) end
  end
  if type(fn) ~= "function" then error(("nibble.cli.%s does not return a function"):format(cmd), 0) end
  local code = fn(args or {})
  if code == nil or code == true then return 0 end
  if code == false then return 1 end
  return tonumber(code) or 1
end

-- ---- errors of programs that `nibble run` starts ----------------------------------------------------

-- debug_on(): NIBBLE_DEBUG is set (to anything but "" or "0"): every error keeps its traceback.
function M.debug_on()
  local v = os.getenv("NIBBLE_DEBUG")
  return v ~= nil and v ~= "" and v ~= "0"
end

-- lua_position(msg): the "chunk:line: " prefix Lua's error() gives a message raised from Lua code (a
-- .lua file, a string chunk, stdin or -e in the host, the script `nibble run` started), else nil. The
-- position a data reader gives ("NB_ERR_FORMAT: calib.jsonl:2: invalid JSON") is not one: it is what
-- the user needs to find the bad line, and it stays.
function M.lua_position(msg)
  if type(msg) ~= "string" then return nil end
  local p = msg:match("^([^\n]-:%d+: )")
  if not p then return nil end
  local chunk = p:match("^(.-):%d+: $")
  local a = rawget(_G, "arg")
  if chunk:match("%.lua$") or chunk:match('^%[string ".*"%]$') or chunk == "stdin" or chunk == "(command line)"
     or (type(a) == "table" and chunk == a[0]) then
    return p
  end
  return nil
end

-- clean(e): the message of an error without the Lua position a call from Lua code gave it (the user
-- did not write that code); any other position stays.
function M.clean(e)
  local s = tostring(e)
  local p = M.lua_position(s)
  return p and s:sub(#p + 1) or s
end

-- is_interrupt(e): the error Ctrl-C raises ("interrupted", from the host's hook or a nibble call that
-- saw the context's interrupt flag), with or without a position.
function M.is_interrupt(e)
  if type(e) ~= "string" then return false end
  local s = M.clean(e)
  return s == "interrupted" or s:match("^interrupted[;:]") ~= nil or s:match("^NB_ERR_INTERRUPTED") ~= nil
end

-- fail(cmd, e): how a sub-command reports a failed call: "nibble CMD: MESSAGE" (the Lua position
-- removed) and exit code 1. Ctrl-C is raised again, so the host exits 130 as for any interrupted run.
function M.fail(cmd, e)
  if M.is_interrupt(e) then error("interrupted", 0) end
  io.stderr:write("nibble ", cmd, ": ", M.clean(e), "\n")
  return 1
end

-- user_message(err): the message of a user error, else nil. A user error is how nibble refuses a request
-- (a bad key or value, a missing file, an impossible setting): a string raised without a Lua position,
-- error(msg, 0), as recipes and nibble's checks raise them. A positioned error ("file.lua:12: ...": a
-- bug, or a misused API in a script), a non-string error and "interrupted" (Ctrl-C) are not.
function M.user_message(err)
  if type(err) ~= "string" or err == "" or M.is_interrupt(err) then return nil end
  if M.lua_position(err) then return nil end
  return err
end

-- The folders whose export finished in this process (nibble.qmodel records them; not loaded: none).
local function completed_exports()
  local q = package.loaded["nibble.qmodel"]
  return type(q) == "table" and q.completed_exports or {}
end

-- interrupt_message(since): the line Ctrl-C ends a run with: "interrupted", and when exports completed
-- after the first `since` of them, that they are complete and usable.
function M.interrupt_message(since)
  local all, done = completed_exports(), {}
  for i = (since or 0) + 1, #all do done[#done + 1] = all[i] end
  if #done == 0 then return "interrupted" end
  return ("interrupted after the export was complete: %s %s complete and usable"):format(table.concat(done, ", "),
    #done == 1 and "is" or "are")
end

-- Whether program() was called by the host itself for `nibble run`: the global arg[0] is set (the REPL
-- has no arg) and no Lua frame is under program's caller (as there is under a spec, a script that
-- loads the recipe, or the REPL).
local function program_level()
  local a = rawget(_G, "arg")
  if type(a) ~= "table" or a[0] == nil then return false end
  local level = 4   -- 1 = program_level, 2 = program, 3 = its caller (or C, after a tail call)
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return true end
    if info.what ~= "C" then return false end
    level = level + 1
  end
end

-- program(fn, ...): fn(...) as the body of a program `nibble run` started (a recipe file, what
-- recipe.execute runs). A user error (user_message) prints "nibble: MESSAGE" on stderr and ends the
-- program with exit code 1, without the Lua traceback the host would add; other errors keep theirs
-- (they are bugs). Ctrl-C ends it with "nibble: interrupted" (and, once an export is complete, says so)
-- and exit code 130, no traceback. NIBBLE_DEBUG=1 keeps every traceback. From anywhere else (a spec, a
-- script, the REPL) it is a plain call, so callers still catch the error.
-- The exit closes the Lua state (os.exit(code, true)), so the objects loaded before the refusal are
-- freed as at a normal end (LeakSanitizer counts them otherwise).
function M.program(fn, ...)
  if M.debug_on() or not program_level() then return fn(...) end
  local since = #completed_exports()
  local function handler(e)
    local msg = M.user_message(e)
    if msg then
      io.stdout:flush()
      io.stderr:write("nibble: ", msg, "\n")
      io.stderr:flush()
      os.exit(1, true)   -- the host would print a traceback for any error that reaches it
    end
    if M.is_interrupt(e) then return M.interrupt_message(since) end   -- the host prints it, exit code 130
    if type(e) == "string" then return debug.traceback(e, 2) end   -- where it happened, not here
    return e
  end
  local res = { xpcall(fn, handler, ...) }
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- user_call(f, ...): f(...), where a failure is the user's (a model that cannot be read, a checkpoint
-- of other settings): its error is raised again as a user error, the message without the position
-- nibble's errors get when a script called them.
function M.user_call(f, ...)
  local res = { pcall(f, ...) }
  if not res[1] then
    local e = res[2]
    if type(e) ~= "string" or M.is_interrupt(e) then error(e, 0) end
    error(M.clean(e), 0)
  end
  return unpack(res, 2, table.maxn(res))
end

-- parse(cmd, usage, argv, spec): the option parser every sub-command uses, so they all accept
-- `--opt VALUE` and `--opt=VALUE` and say the same things about bad input. spec is a list of
--   { "--long", "-s", key = "name", arg = "PATH" }          an option with a value (named in errors)
--   { "--long", key = "name", num = "int+" | "int0" | "num0" | "prob" } a number: positive integer,
--                                          non-negative integer, non-negative number, in (0, 1]
--   { "--flag", key = "name", set = value }                  a flag (set defaults to true)
--   { "--long", key = "name", list = "NAMES" }               a comma-separated list
-- and spec.positional = "WHAT" accepts other non-option words into the result's array part.
-- need = true on an option (or spec.need_positional = true) makes it required: without it the
-- error says what is missing ("missing --out DIR"), then the usage; with no argument at all, the usage.
-- An unknown option gets the nearest known one as a did-you-mean.
-- A value given as the next word must not start with "--" (`--out --quiet` forgot the value: it is an
-- error, not a folder named --quiet); `--opt=--x` passes such a value, and a negative number like
-- `--ctx -1` (one dash) still reaches its number rule.
-- Returns the options table, or nil and the exit code after writing the usage or the error
-- (`nibble CMD: MESSAGE`) itself: `local o, code = cli.parse(...); if not o then return code end`.
local NUM = {
  ["int+"] = { "a positive integer", function(v) return v % 1 == 0 and v >= 1 end },
  ["int0"] = { "a non-negative integer", function(v) return v % 1 == 0 and v >= 0 end },
  ["num0"] = { "a non-negative number", function(v) return v >= 0 end },
  ["prob"] = { "a number in (0, 1]", function(v) return v > 0 and v <= 1 end },
}

function M.parse(cmd, usage, argv, spec)
  local by_name = {}
  for _, opt in ipairs(spec) do
    for _, name in ipairs(opt) do by_name[name] = opt end
  end
  local function fail(msg)
    io.stderr:write("nibble ", cmd, ": ", msg, "\n")
    return nil, 1
  end
  local o, i = {}, 1
  while i <= #argv do
    local a = argv[i]
    local name, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
    name = name or a
    local opt = by_name[name]
    if a == "-h" or a == "--help" then
      io.stdout:write(usage)
      return nil, 0
    elseif opt and (opt.arg or opt.num or opt.list) then
      local v = inline
      if v == nil then
        i = i + 1; v = argv[i]
        if v and v:sub(1, 2) == "--" then return fail(("%s needs a value, got the option %s"):format(name, v)) end
      end
      if opt.num then
        local n, rule = tonumber(v or ""), NUM[opt.num]
        if not n or n ~= n or n == math.huge or not rule[2](n) then
          return fail(("%s needs %s%s"):format(name, rule[1], v and (", got " .. v) or ""))
        end
        v = n
      elseif v == nil or v == "" then
        return fail(("%s needs %s"):format(name, opt.arg and ("a " .. opt.arg) or ("a comma-separated list of " .. opt.list)))
      elseif opt.list then
        local t = {}
        for x in v:gmatch("[^,]+") do t[#t + 1] = x end
        v = t
      end
      o[opt.key] = v
    elseif opt then   -- a flag
      if inline ~= nil then return fail(("%s takes no value, got %s"):format(name, a)) end
      if opt.set == nil then o[opt.key] = true else o[opt.key] = opt.set end
    elseif spec.positional and a:sub(1, 1) ~= "-" then
      o[#o + 1] = a
    else
      local hint = ""
      if name:sub(1, 1) == "-" then
        local names = {}
        for n in pairs(by_name) do if n:sub(1, 2) == "--" then names[#names + 1] = n end end
        table.sort(names)
        hint = require("nibble.recipe").did_you_mean(name, names)
      end
      io.stderr:write("nibble ", cmd, ": unknown argument ", a, hint, "\n", usage)
      return nil, 1
    end
    i = i + 1
  end
  local missing = {}
  if spec.need_positional and #o == 0 then missing[1] = spec.positional end
  for _, opt in ipairs(spec) do
    if opt.need and o[opt.key] == nil then
      missing[#missing + 1] = opt[1] .. " " .. (opt.arg or opt.list or "N")
    end
  end
  if #missing > 0 then
    if #argv > 0 then io.stderr:write("nibble ", cmd, ": missing ", table.concat(missing, ", "), "\n") end
    io.stderr:write(usage)
    return nil, 1
  end
  return o
end

-- ---- paths that sub-commands read -----------------------------------------------------------------

-- path_kind(path): "file" or "dir" (a directory fails a read with EISDIR), and the read error a file gave,
-- if any; nil and io.open's error when path cannot be opened. The QAD checks (nibble.qad_guard) use it too.
function M.path_kind(path)
  local f, e = io.open(path, "rb")
  if not f then return nil, e end
  local _, rerr, code = f:read(0)
  f:close()
  if code == 21 then return "dir" end
  return "file", rerr
end

-- file_problem(path): nil when path is a file that can be read, else what is wrong with it, naming it
-- once ("cannot open X: No such file or directory", "X is a folder, not a file").
function M.file_problem(path)
  local kind, e = M.path_kind(path)
  if not kind then
    e = tostring(e)
    if e:sub(1, #path + 2) == path .. ": " then e = e:sub(#path + 3) end
    return ("cannot open %s: %s"):format(path, e)
  end
  if kind == "dir" then return ("%s is a folder, not a file"):format(path) end
  if e then return ("cannot read %s: %s"):format(path, tostring(e)) end
  return nil
end

-- model_dir(path): the model folder of a path given as --model: X/foo.safetensors beside X/config.json
-- is the model in X (as quantize reads it); any other path is returned as it is.
function M.model_dir(path)
  if type(path) == "string" and path:match("%.safetensors$") then
    local dir = path:match("^(.*)/[^/]*$") or "."
    local f = io.open(dir .. "/config.json", "rb")
    if f then f:close(); return dir end
  end
  return path
end

-- max_position(path): the model's max_position_embeddings from its config (nibble.model.read_config, as
-- the QAD preflight reads it), or nil when the config does not say or cannot be read (loading the
-- model then reports that).
function M.max_position(path)
  local ok, cfg = pcall(require("nibble.model").read_config, path)
  local n = ok and tonumber(cfg.max_position) or nil
  return n and n > 0 and n or nil
end

return M

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

-- user_message(err): the message of a user error, else nil. A user error is how nibble refuses a request
-- (a bad key or value, a missing file, an impossible setting): a string raised without a position,
-- error(msg, 0), as recipes and nibble's checks raise them. A positioned error ("file.lua:12: ...": a
-- bug, or a misused API in a script), a non-string error and "interrupted" (Ctrl-C) are not.
function M.user_message(err)
  if type(err) ~= "string" or err == "interrupted" or err == "" then return nil end
  if err:match("^[^\n]-:%d+: ") then return nil end
  return err
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
-- (they are bugs). NIBBLE_DEBUG=1 keeps every traceback. From anywhere else (a spec, a script, the
-- REPL) it is a plain call, so callers still catch the error.
function M.program(fn, ...)
  if M.debug_on() or not program_level() then return fn(...) end
  local function handler(e)
    local msg = M.user_message(e)
    if msg then
      io.stdout:flush()
      io.stderr:write("nibble: ", msg, "\n")
      io.stderr:flush()
      os.exit(1)   -- the host would print a traceback for any error that reaches it
    end
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
    if type(e) ~= "string" or e == "interrupted" then error(e, 0) end
    error((e:gsub("^[^\n]-:%d+: ", "")), 0)
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
    elseif opt and inline == nil then
      if opt.set == nil then o[opt.key] = true else o[opt.key] = opt.set end
    elseif spec.positional and a:sub(1, 1) ~= "-" then
      o[#o + 1] = a
    else
      io.stderr:write("nibble ", cmd, ": unknown argument ", a, "\n", usage)
      return nil, 1
    end
    i = i + 1
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

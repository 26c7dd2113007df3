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

local U = require("nibble.util")
local listdir = U.listdir

-- The helpers commands share with the library (nibble.util), reachable as nibble.cli.<name> too.
for _, k in ipairs { "listdir", "path_kind", "file_problem", "debug_on", "lua_position", "clean", "is_interrupt",
                     "user_message", "interrupt_message", "program", "user_call" } do
  M[k] = U[k]
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

-- ---- how sub-commands fail ----------------------------------------------------------------------

-- fail(cmd, e): how a sub-command reports a failed call: "nibble CMD: MESSAGE" (the Lua position
-- removed) and exit code 1. Ctrl-C is raised again, so the host exits 130 as for any interrupted run.
function M.fail(cmd, e)
  if U.is_interrupt(e) then error("interrupted", 0) end
  io.stderr:write("nibble ", cmd, ": ", U.clean(e), "\n")
  return 1
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
        hint = U.did_you_mean(name, names)
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

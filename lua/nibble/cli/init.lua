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

return M

-- nibble.util: the plain-Lua helpers every layer shares (bottom layer: it requires no nibble module):
-- names and did-you-mean suggestions, folder listing and path checks, and how a refused request is
-- told from a bug (user errors, Lua positions, Ctrl-C) and ends a program `nibble run` started.
-- nibble.cli re-exports the error helpers for the sub-commands; pipeline modules (recipe, ptq, qad)
-- use them from here, so no library module depends on the command line.
local U = {}

-- keys_of(t): a table's keys, sorted (the "known: ..." lists of messages).
function U.keys_of(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- Levenshtein distance, for did-you-mean suggestions.
local function distance(a, b)
  local la, lb = #a, #b
  local prev, cur = {}, {}
  for j = 0, lb do prev[j] = j end
  for i = 1, la do
    cur[0] = i
    for j = 1, lb do
      local cost = (a:sub(i, i) == b:sub(j, j)) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[lb]
end

-- nearest(word, candidates): the closest candidate within a typo's distance (2 edits, or a third of
-- the word's length for long words), else nil.
function U.nearest(word, candidates)
  local best, bd = nil, math.huge
  for _, c in ipairs(candidates) do
    local d = distance(word, c)
    if d < bd then best, bd = c, d end
  end
  if best and bd <= math.max(2, math.floor(#word / 3)) then return best end
  return nil
end

-- did_you_mean(word, candidates): " (did you mean 'x'?)" for the nearest candidate, else "".
function U.did_you_mean(word, candidates)
  local best = U.nearest(word, candidates)
  return best and string.format(" (did you mean '%s'?)", best) or ""
end

-- ---- folders and files ------------------------------------------------------------------------------

-- listdir(dir): the names in a folder (the host's nibble.host.listdir, else LuaFileSystem), or nil.
function U.listdir(dir)
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

-- path_kind(path): "file" or "dir" (a directory fails a read with EISDIR), and the read error a file gave,
-- if any; nil and io.open's error when path cannot be opened.
function U.path_kind(path)
  local f, e = io.open(path, "rb")
  if not f then return nil, e end
  local _, rerr, code = f:read(0)
  f:close()
  if code == 21 then return "dir" end
  return "file", rerr
end

-- file_problem(path): nil when path is a file that can be read, else what is wrong with it, naming it
-- once ("cannot open X: No such file or directory", "X is a folder, not a file").
function U.file_problem(path)
  local kind, e = U.path_kind(path)
  if not kind then
    e = tostring(e)
    if e:sub(1, #path + 2) == path .. ": " then e = e:sub(#path + 3) end
    return ("cannot open %s: %s"):format(path, e)
  end
  if kind == "dir" then return ("%s is a folder, not a file"):format(path) end
  if e then return ("cannot read %s: %s"):format(path, tostring(e)) end
  return nil
end

-- ---- errors: the user's or a bug ----------------------------------------------------------------------

-- debug_on(): NIBBLE_DEBUG is set (to anything but "" or "0"): every error keeps its traceback.
function U.debug_on()
  local v = os.getenv("NIBBLE_DEBUG")
  return v ~= nil and v ~= "" and v ~= "0"
end

-- lua_position(msg): the "chunk:line: " prefix Lua's error() gives a message raised from Lua code (a
-- .lua file, a string chunk, stdin or -e in the host, the script `nibble run` started), else nil. The
-- position a data reader gives ("NB_ERR_FORMAT: calib.jsonl:2: invalid JSON") is not one: it is what
-- the user needs to find the bad line, and it stays.
function U.lua_position(msg)
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
function U.clean(e)
  local s = tostring(e)
  local p = U.lua_position(s)
  return p and s:sub(#p + 1) or s
end

-- is_interrupt(e): the error Ctrl-C raises ("interrupted", from the host's hook or a nibble call that
-- saw the context's interrupt flag), with or without a position.
function U.is_interrupt(e)
  if type(e) ~= "string" then return false end
  local s = U.clean(e)
  return s == "interrupted" or s:match("^interrupted[;:]") ~= nil or s:match("^NB_ERR_INTERRUPTED") ~= nil
end

-- user_message(err): the message of a user error, else nil. A user error is how nibble refuses a request
-- (a bad key or value, a missing file, an impossible setting): a string raised without a Lua position,
-- error(msg, 0), as recipes and nibble's checks raise them. A positioned error ("file.lua:12: ...": a
-- bug, or a misused API in a script), a non-string error and "interrupted" (Ctrl-C) are not.
function U.user_message(err)
  if type(err) ~= "string" or err == "" or U.is_interrupt(err) then return nil end
  if U.lua_position(err) then return nil end
  return err
end

-- The folders whose export finished in this process (nibble.qmodel records them; not loaded: none).
local function completed_exports()
  local q = package.loaded["nibble.qmodel"]
  return type(q) == "table" and q.completed_exports or {}
end

-- interrupt_message(since): the line Ctrl-C ends a run with: "interrupted", and when exports completed
-- after the first `since` of them, that they are complete and usable.
function U.interrupt_message(since)
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
-- nibble.pipeline.execute runs). A user error (user_message) prints "nibble: MESSAGE" on stderr and ends the
-- program with exit code 1, without the Lua traceback the host would add; other errors keep theirs
-- (they are bugs). Ctrl-C ends it with "nibble: interrupted" (and, once an export is complete, says so)
-- and exit code 130, no traceback. NIBBLE_DEBUG=1 keeps every traceback. From anywhere else (a spec, a
-- script, the REPL) it is a plain call, so callers still catch the error.
-- The exit closes the Lua state (os.exit(code, true)), so the objects loaded before the refusal are
-- freed as at a normal end (LeakSanitizer counts them otherwise).
function U.program(fn, ...)
  if U.debug_on() or not program_level() then return fn(...) end
  local since = #completed_exports()
  local function handler(e)
    local msg = U.user_message(e)
    if msg then
      io.stdout:flush()
      io.stderr:write("nibble: ", msg, "\n")
      io.stderr:flush()
      os.exit(1, true)   -- the host would print a traceback for any error that reaches it
    end
    if U.is_interrupt(e) then return U.interrupt_message(since) end   -- the host prints it, exit code 130
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
function U.user_call(f, ...)
  local res = { pcall(f, ...) }
  if not res[1] then
    local e = res[2]
    if type(e) ~= "string" or U.is_interrupt(e) then error(e, 0) end
    error(U.clean(e), 0)
  end
  return unpack(res, 2, table.maxn(res))
end

return U

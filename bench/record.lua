-- Runs one bench and writes its result record to bench/results/ID.json (ID = the bench's own id, or id=).
-- The bench writes a fragment (bench, title, tables, notes[, threads]) to the file named by the
-- environment variable NIBBLE_BENCH_JSON; this adds the command, the commit, the UTC date and the
-- machine (bench/results.lua) and writes the record. Then `build/nibble run bench/gen_results.lua`.
--   build/nibble run bench/record.lua [id=ID] [dir=bench/results] -- COMMAND [ARGS ...]
-- e.g. build/nibble run bench/record.lua -- build/bench/bench_quant --paths avx512,avx2 --quick
local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "."
local results = dofile(here .. "/results.lua")
local json = require("nibble.json")

local function die(msg)
  io.stderr:write("record: ", msg, "\n")
  os.exit(1)
end
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local raw, cmd, own = { ... }, nil, {}
for i, a in ipairs(raw) do
  if a == "--" then cmd = { unpack(raw, i + 1) }; break end
  own[#own + 1] = a
end
if not cmd or #cmd == 0 then die("usage: nibble run bench/record.lua [id=ID] [dir=DIR] -- COMMAND [ARGS ...]") end
for _, a in ipairs(own) do
  if not (a:match("^id=") or a:match("^dir=")) then die("unknown argument " .. a .. " (id=, dir=, then -- COMMAND)") end
end
local dir = arg.dir or here .. "/results"

local function loadavg()
  local f = io.open("/proc/loadavg", "rb")
  local s = f and f:read("*l") or ""
  if f then f:close() end
  return s:match("^(%S+ %S+ %S+)") or "unknown"
end
local load0 = loadavg()
local root = here .. "/.."
local commit = results.commit(root)   -- the code and the time as the bench starts, not as it ends
local date = os.date("!%Y-%m-%dT%H:%M:%SZ")
local frag_path = os.tmpname()
local quoted = {}
for i, a in ipairs(cmd) do quoted[i] = q(a) end
local ok, _, code = os.execute("NIBBLE_BENCH_JSON=" .. q(frag_path) .. " " .. table.concat(quoted, " "))
-- LuaJIT's os.execute returns the wait status (exit code * 256); Lua 5.2+ returns ok, "exit", code
local status = type(ok) == "number" and (ok >= 256 and math.floor(ok / 256) or ok) or (ok and 0 or (code or 1))
if status ~= 0 then os.remove(frag_path); die(("%s failed (status %s)"):format(cmd[1], tostring(status))) end
local f = io.open(frag_path, "rb")
local text = f and f:read("*a") or ""
if f then f:close() end
os.remove(frag_path)
if text == "" then die(cmd[1] .. " wrote no result to $NIBBLE_BENCH_JSON (does it write one?)") end
local okd, frag = pcall(json.decode, text)
if not okd then die(cmd[1] .. ": " .. frag) end
if type(frag) ~= "table" or frag[1] ~= nil then die(cmd[1] .. " wrote no JSON object to $NIBBLE_BENCH_JSON") end
if arg.id then frag.bench = arg.id end

local shown = { "build/nibble run bench/record.lua" }
for _, a in ipairs(own) do if not a:match("^dir=") then shown[#shown + 1] = a end end
shown[#shown + 1] = "--"
for _, a in ipairs(cmd) do shown[#shown + 1] = a:match("^[%w%./_,=:%-]+$") and a or q(a) end
frag.commit, frag.date = frag.commit or commit, frag.date or date
local rec = results.complete(frag, table.concat(shown, " "), root)
rec.notes[#rec.notes + 1] = ("load average (1, 5, 15 min) before the run %s, after it %s"):format(load0, loadavg())
-- the variables that change which kernels run are part of how the numbers were made
local env = {}
for _, k in ipairs { "OPENBLAS_CORETYPE", "NIBBLE_BLAS_PRETEND_CORE", "NIBBLE_BLAS", "NIBBLE_SIMD", "NIBBLE_QUANT_PATH",
                     "NIBBLE_THREADS" } do
  local v = os.getenv(k)
  if v and v ~= "" then env[#env + 1] = k .. "=" .. v end
end
if #env > 0 then rec.notes[#rec.notes + 1] = "environment: " .. table.concat(env, " ") end
local okv, err = pcall(results.validate, rec, cmd[1])
if not okv then die(err) end
os.execute("mkdir -p " .. q(dir))
local path = dir .. "/" .. rec.bench .. ".json"
local out = io.open(path, "wb") or die("cannot write " .. path)
out:write(results.encode(rec))
out:close()
print("wrote " .. path)

-- Bench results as data: the JSON record each bench leaves in bench/results/ (what ran, on which commit and
-- machine, its tables and notes) and bench/RESULTS.md rendered from those records, so that every number
-- there is produced by a run, never typed. bench/record.lua and bench/gen_results.lua are the two
-- commands; tests/lua/results_spec.lua holds the rendering and the committed RESULTS.md to each other.
-- A record: {"bench": ID, "title": "...", "command": "...", "commit": SHA, "date": "UTC ISO 8601",
--   "machine": {"cpu", "features", "threads", "blas", "blas_core"},
--   "tables": [{"caption": "...", "columns": [...], "rows": [[cell, ...], ...]}], "notes": ["..."]}
-- Cells are strings (written as the bench formatted them) or numbers.
local json = require("nibble.json")

local M = {}

M.GENERATED_BY = "build/nibble run bench/gen_results.lua"

local function fail(fmt, ...) error(fmt:format(...), 0) end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then fail("cannot read %s", err or path) end
  local s = f:read("*a")
  f:close()
  return s
end

local function is_array(t)
  if type(t) ~= "table" or getmetatable(t) then return false end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t
end

-- validate(rec, name): raises "NAME: WHAT" for the first key that is missing or of the wrong type.
function M.validate(rec, name)
  if type(rec) ~= "table" or is_array(rec) then fail("%s: not a JSON object", name) end
  for _, k in ipairs { "bench", "title", "command", "commit", "date" } do
    if type(rec[k]) ~= "string" or rec[k] == "" then fail("%s: %q must be a non-empty string", name, k) end
  end
  if not rec.bench:match("^[%w_%-]+$") then fail("%s: \"bench\" %q must be letters, digits, _ or -", name, rec.bench) end
  local m = rec.machine
  if type(m) ~= "table" or is_array(m) then fail("%s: \"machine\" must be an object", name) end
  for _, k in ipairs { "cpu", "features", "blas", "blas_core" } do
    if type(m[k]) ~= "string" then fail("%s: \"machine.%s\" must be a string", name, k) end
  end
  if type(m.threads) ~= "number" or m.threads < 1 or m.threads % 1 ~= 0 then
    fail("%s: \"machine.threads\" must be a positive integer", name)
  end
  if not is_array(rec.tables) or #rec.tables == 0 then fail("%s: \"tables\" must be a non-empty array", name) end
  for i, t in ipairs(rec.tables) do
    local where = ("%s: tables[%d]"):format(name, i)
    if type(t) ~= "table" or is_array(t) then fail("%s is not an object", where) end
    if type(t.caption) ~= "string" then fail("%s: \"caption\" must be a string", where) end
    if not is_array(t.columns) or #t.columns == 0 then fail("%s: \"columns\" must be a non-empty array", where) end
    if not is_array(t.rows) then fail("%s: \"rows\" must be an array", where) end
    for r, row in ipairs(t.rows) do
      if not is_array(row) then fail("%s: row %d is not an array", where, r) end
      if #row ~= #t.columns then fail("%s: row %d has %d cells, the table has %d columns", where, r, #row, #t.columns) end
      for c, v in ipairs(row) do
        if type(v) ~= "string" and type(v) ~= "number" then
          fail("%s: row %d, cell %d must be a string or a number", where, r, c)
        end
      end
    end
  end
  if rec.notes ~= nil then
    if not is_array(rec.notes) then fail("%s: \"notes\" must be an array of strings", name) end
    for i, s in ipairs(rec.notes) do
      if type(s) ~= "string" then fail("%s: notes[%d] must be a string", name, i) end
    end
  end
  return rec
end

-- load(path): the record in a results file, validated (errors name the file).
function M.load(path)
  local ok, rec = pcall(json.decode, read_file(path))
  if not ok then fail("%s: %s", path, rec) end
  return M.validate(rec, path)
end

-- load_dir(dir): the records of dir/*.json in file-name order; two files of one bench are an error.
function M.load_dir(dir)
  local p = io.popen("ls -1 '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  local names = {}
  for line in p:lines() do
    if line:match("%.json$") then names[#names + 1] = line end
  end
  p:close()
  table.sort(names)
  local recs, seen = {}, {}
  for _, n in ipairs(names) do
    local rec = M.load(dir .. "/" .. n)
    if seen[rec.bench] then fail("%s/%s: bench %q is also in %s", dir, n, rec.bench, seen[rec.bench]) end
    seen[rec.bench] = n
    recs[#recs + 1] = rec
  end
  if #recs == 0 then fail("%s: no *.json results", dir) end
  return recs
end

local function cell(v)
  local s = type(v) == "number" and (v % 1 == 0 and math.abs(v) < 2 ^ 53 and ("%d"):format(v) or ("%.10g"):format(v)) or v
  return (s:gsub("\\", "\\\\"):gsub("|", "\\|"):gsub("\n", " "))
end

local function md_table(t, out)
  if t.caption ~= "" then out[#out + 1] = "**" .. t.caption .. "**\n" end
  local head, rule = {}, {}
  for i, c in ipairs(t.columns) do head[i], rule[i] = cell(c), "---" end
  out[#out + 1] = "| " .. table.concat(head, " | ") .. " |"
  out[#out + 1] = "|" .. table.concat(rule, "|") .. "|"
  for _, row in ipairs(t.rows) do
    local cells = {}
    for i, v in ipairs(row) do cells[i] = cell(v) end
    out[#out + 1] = "| " .. table.concat(cells, " | ") .. " |"
  end
  out[#out + 1] = ""
end

-- render(records): the text of RESULTS.md. Each bench gets an anchor named by its id
-- (RESULTS.md#quant), which README.md and bench/README.md link to.
function M.render(recs)
  local out = {
    "# Measured results",
    "",
    ("Generated by `%s` from `bench/results/*.json`; do not edit by hand. Each JSON file is written by"):format(M.GENERATED_BY),
    "the bench it names, run through `bench/record.lua` (the command shown under each heading re-measures it),",
    "and the test `lua.results` fails when this file differs from what the JSON files give.",
    "bench/README.md says what each bench compares and holds the tables of runs too long to repeat here.",
    "",
  }
  for _, r in ipairs(recs) do
    out[#out + 1] = ("- [%s](#%s)"):format(r.title, r.bench)
  end
  out[#out + 1] = ""
  for _, r in ipairs(recs) do
    local m = r.machine
    out[#out + 1] = ('<a id="%s"></a>'):format(r.bench)
    out[#out + 1] = ""
    out[#out + 1] = "## " .. r.title
    out[#out + 1] = ""
    out[#out + 1] = "```sh"
    out[#out + 1] = r.command
    out[#out + 1] = "```"
    out[#out + 1] = ""
    local sha = r.commit:match("^%x+") and r.commit:sub(1, 12) .. (r.commit:match("%-dirty$") or "") or r.commit
    out[#out + 1] = ("Commit `%s`, %s. %s (%s); %d thread%s; BLAS: %s (core %s)."):format(sha, r.date, m.cpu,
      m.features, m.threads, m.threads == 1 and "" or "s", m.blas, m.blas_core)
    out[#out + 1] = ""
    for _, t in ipairs(r.tables) do md_table(t, out) end
    if r.notes and #r.notes > 0 then
      for _, s in ipairs(r.notes) do out[#out + 1] = "- " .. s:gsub("\n", " ") end
      out[#out + 1] = ""
    end
  end
  while out[#out] == "" do out[#out] = nil end
  return table.concat(out, "\n") .. "\n"
end

-- generate(dir): render(load_dir(dir)).
function M.generate(dir) return M.render(M.load_dir(dir)) end

-- first_difference(a, b): nil when equal, else "line N: got X, expected Y" (a = generated, b = file).
function M.first_difference(a, b)
  if a == b then return nil end
  local la, lb = {}, {}
  for l in (a .. "\n"):gmatch("(.-)\n") do la[#la + 1] = l end
  for l in (b .. "\n"):gmatch("(.-)\n") do lb[#lb + 1] = l end
  for i = 1, math.max(#la, #lb) do
    if la[i] ~= lb[i] then
      return ("line %d is %q, the JSON gives %q"):format(i, lb[i] or "<end of file>", la[i] or "<end of file>")
    end
  end
  return "the files differ in their last newline"
end

-- ---- what record.lua fills in ------------------------------------------------------------------------

local function sh(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local s = p:read("*a") or ""
  p:close()
  return (s:gsub("%s+$", ""))
end
M.sh = sh

-- The CPU features that pick nibble's (and the peers') code paths, as /proc/cpuinfo names them.
local FEATURES = { "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vbmi", "avx512_vnni",
                   "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8" }

-- machine(threads): cpu, features, threads, blas, blas_core of this process (the BLAS as the nibble
-- library loaded it: OpenBLAS's own build string and the core it picked, which OPENBLAS_CORETYPE forces).
function M.machine(threads)
  local info = io.open("/proc/cpuinfo", "rb")
  local text = info and info:read("*a") or ""
  if info then info:close() end
  local cpu = text:match("model name%s*:%s*([^\n]+)") or "unknown CPU"
  local flags, have = text:match("\nflags%s*:%s*([^\n]+)") or "", {}
  for f in flags:gmatch("%S+") do have[f] = true end
  local feats = {}
  for _, f in ipairs(FEATURES) do if have[f] then feats[#feats + 1] = f end end
  local cores = tonumber(sh("nproc")) or 0
  local blas, core = "unknown", os.getenv("OPENBLAS_CORETYPE") or "unknown"
  local okb, b = pcall(function() return require("nibble").blas() end)   -- as libnibble loaded it
  if okb and type(b) == "table" then blas, core = b.library or blas, b.core or core end
  return {
    cpu = ("%s, %d CPUs"):format(cpu:gsub("%s+", " "), cores),
    features = #feats > 0 and table.concat(feats, " ") or "none of " .. table.concat(FEATURES, " "),
    threads = threads,
    blas = blas,
    blas_core = core,
  }
end

-- commit(root): HEAD's sha, with "-dirty" when tracked files other than the results differ from it.
function M.commit(root)
  local q = "'" .. root:gsub("'", "'\\''") .. "'"
  local sha = sh("git -C " .. q .. " rev-parse HEAD")
  if sha == "" then return "unknown" end
  local dirty = sh("git -C " .. q .. " status --porcelain --untracked-files=no -- . ':!bench/results' ':!bench/RESULTS.md'")
  return dirty ~= "" and sha .. "-dirty" or sha
end

-- complete(frag, command, root): the record from a bench's fragment (bench, title, tables, notes, and
-- threads when it used its own count), with command, commit, date and machine added where it has none.
function M.complete(frag, command, root)
  local rec = {}
  for k, v in pairs(frag) do rec[k] = v end
  rec.threads = nil
  rec.command = rec.command or command
  rec.commit = rec.commit or M.commit(root)
  rec.date = rec.date or os.date("!%Y-%m-%dT%H:%M:%SZ")
  rec.machine = rec.machine or M.machine(tonumber(frag.threads) or tonumber(os.getenv("NIBBLE_THREADS")) or 1)
  rec.notes = rec.notes or {}
  return rec
end

-- encode(rec): the file's text (sorted keys, two-space indent, final newline).
function M.encode(rec) return json.encode(rec, { indent = "  " }) .. "\n" end

return M

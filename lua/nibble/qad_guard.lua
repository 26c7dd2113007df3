-- nibble.qad_guard: what a QAD run checks and records around the training engine (nibble.qad), before
-- it computes and between runs: preflight (settings, files, where it writes), the identities of models
-- and files, the run-settings record a resume must match, the checkpoints and metrics a resume continues.
-- Its public names are also nibble.qad's (qad.preflight, qad.check_out, ...); it reaches qad.config and
-- qad.latest at call time, so either module can be required first.
local ffi = require("ffi")
local nibble = require("nibble")
local S = require("nibble.qad_settings")
local util = require("nibble.util")
local ptq = require("nibble.ptq")
local qmodel = require("nibble.qmodel")
local C, fail = nibble.C, nibble.fail
local function ctx() return nibble.context() end

local G = {}

-- ---- recipe values (shared with nibble.qad) ---------------------------------------------------------------

-- num(t, k, what [, int [, min [, above]]]): t[k] as a number (a numeric string reads as one), nil when
-- absent; anything else is "<what>: <k> must be ..." (a number, a whole number, >= min; > min with above).
local function num(t, k, what, int, min, above)
  local v = t[k]
  if v == nil then return nil end
  if type(v) == "string" and tonumber(v) then v = tonumber(v) end
  if type(v) ~= "number" or v ~= v then fail(("%s: %s must be a number, got %s"):format(what, k, tostring(v))) end
  if int and v % 1 ~= 0 then fail(("%s: %s must be a whole number, got %s"):format(what, k, tostring(v))) end
  if min and above and not (v > min and v < math.huge) then
    fail(("%s: %s must be > %s, got %s"):format(what, k, tostring(min), tostring(v)))
  end
  if min and v < min then fail(("%s: %s must be >= %s, got %s"):format(what, k, tostring(min), tostring(v))) end
  return v
end

-- bool(v, what, k): true / false from a boolean, "true" / "false" or 1 / 0; nil stays nil.
local function bool(v, what, k)
  if v == nil then return nil end
  if v == true or v == "true" or v == 1 then return true end
  if v == false or v == "false" or v == 0 then return false end
  fail(("%s: %s must be true or false, got %s"):format(what, k, tostring(v)))
end

-- The shortest %g text that reads back as the same number (0.0003, not 0.00029999999999999997).
local function gnum(x)
  x = tonumber(x)
  for _, p in ipairs { 6, 10, 15, 17 } do
    local s = ("%." .. p .. "g"):format(x)
    if tonumber(s) == x then return s end
  end
  return tostring(x)
end
G.num, G.bool, G.gnum = num, bool, gnum

-- The loader's rows when distill leaves them out: qad.loader uses them, and so do the seq_len check and
-- the settings a resume compares, which must agree with it.
local loader_defaults = { seq_len = 512, batch = 8 }
G.loader_defaults = loader_defaults

-- ---- the training settings: nb_qad_cfg from a recipe's distill table ---------------------------------

-- config(t [, algorithm]): an nb_qad_cfg from a recipe's distill table, every key and value checked
-- against the one list of QAD settings (nibble.qad_settings: its type, least value, nb_qad_cfg field):
-- the loss keys through nibble.distill.config; recalibrate = N steps (false/0: scales frozen) re-runs
-- the calibration method `algorithm` (default "max"). A key out of the list is an error with a
-- did-you-mean; the loader's keys (batch, seq_len) are checked here with the rest.
function G.config(t, algorithm)
  if ffi.istype("nb_qad_cfg", t) then return t end
  t = t or {}
  if type(t) ~= "table" then fail("qad.config: expected the recipe's distill table") end
  local rows = S.section("distill")
  for k in pairs(t) do
    if not rows[k] then
      fail(("distill: unknown key '%s'%s"):format(tostring(k), util.did_you_mean(tostring(k), util.keys_of(rows))))
    end
  end
  local c = ffi.new("nb_qad_cfg")
  C.nb_qad_cfg_init(c)
  local w = "distill"
  -- the loss: its numbers checked here (a numeric string reads as one), its names by nibble.distill
  local lt = {}
  for k, s in pairs(rows) do
    if s.loss then
      lt[k] = t[k]
      if s.type == "bool" then
        lt[k] = bool(t[k], w, k)
      elseif (s.type == "number" or s.type == "int") and k ~= "topk" and k ~= "top_k" then
        lt[k] = num(t, k, w, s.type == "int", s.min, s.above)
      end
    end
  end
  if lt.loss == "topk" then lt.loss = "kl"; lt.topk = lt.topk or 64 end
  c.loss = nibble.distill.config(lt)
  -- the run: every row with an nb_qad_cfg field of its own, in list order
  for _, s in ipairs(S.list) do
    local k = s.key and s.key:match("^distill%.([%w_]+)$")
    if k and s.cfg and not s.loss then
      if s.type == "bool" then
        local b = bool(t[k], w, k)
        if b ~= nil then c[s.cfg] = b and 1 or 0 end
      elseif k == "recalibrate" then
        local rc = t.recalibrate
        if rc ~= nil and rc ~= false then
          if rc == true then fail("distill: recalibrate must be a number of steps (recalibrate every N steps) or false") end
          c.recalibrate = num(t, "recalibrate", w, true, 0)
          c.recalib = qmodel.calib_config(algorithm or "max")
        end
      else
        local x = num(t, k, w, s.type == "int", s.min, s.above)
        if x ~= nil then c[s.cfg] = x end
      end
    elseif k and s.type == "int" and not s.loss then
      num(t, k, w, true, s.min)   -- the loader's and the run's own (batch, seq_len, checkpoint_every, ...)
    end
  end
  if c.min_lr > c.lr then
    fail(("distill: min_lr %s is above lr %s (the cosine goes from lr down to min_lr)"):format(gnum(c.min_lr),
      gnum(c.lr)))
  end
  if c.warmup > c.steps then
    fail(("distill: warmup %d is more than steps %d"):format(tonumber(c.warmup), tonumber(c.steps)))
  end
  return c
end

-- ---- checkpoint folders ----------------------------------------------------------------------------

-- lock(dir): one run per checkpoint folder (flock on dir.nibble-lock, created with dir's parent when
-- missing); an error naming dir and the other process's pid when one holds it. Returns a handle with
-- :release() (also released by the GC, and with the process).
function G.lock(dir)
  local out = ffi.new("nb_qad_lock *[1]")
  local s = C.nb_qad_lock_dir(ctx(), dir, out)
  if s ~= 0 then
    local msg = ffi.string(C.nb_ctx_last_error(ctx()))
    C.nb_ctx_clear_error(ctx())
    error(msg, 0)
  end
  local h = ffi.gc(out[0], C.nb_qad_unlock_dir)
  return { release = function() if h ~= nil then ffi.gc(h, nil); C.nb_qad_unlock_dir(h); h = nil end end }
end

-- latest(dir): path of the checkpoint a resume continues from (the newest complete one), or nil.
function G.latest(dir)
  local buf = ffi.new("char[4096]")
  local s = C.nb_qad_latest(ctx(), dir, buf, 4096)
  if s ~= 0 then
    C.nb_ctx_clear_error(ctx())
    return nil
  end
  return ffi.string(buf)
end

-- ---- the metrics file across a resume ---------------------------------------------------------------

-- step0_eval(metrics_path): the step-0 eval record of a metrics JSONL file ({ppl, kld, top1}) or nil.
function G.step0_eval(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local found
  for line in f:lines() do
    local ok, t = pcall(nibble.json.decode, line)
    -- a row of the PTQ eval has all three numbers; a damaged one (edited, cut short) is passed over
    if ok and type(t) == "table" and t.step == 0 and type(t.eval_kld) == "number" and type(t.eval_ppl) == "number"
       and type(t.eval_top1) == "number" then
      found = { ppl = t.eval_ppl, kld = t.eval_kld, top1 = t.eval_top1 }
      break
    end
  end
  f:close()
  return found
end

-- cut_metrics(path, step, steps): a run resumed from the checkpoint of `step` records every later row
-- again, so the metrics JSONL keeps only what was written up to that checkpoint: the rows of steps
-- before it, the training row of `step`, and its eval row unless `step` is the last one (the final eval
-- is recorded again). A partial line (a kill mid-write) goes too. The file is replaced through a
-- temporary sibling and a rename, so a kill leaves the old file or the new one. Returns the rows kept
-- and dropped (0, 0 when there is no file).
function G.cut_metrics(path, step, steps)
  local f = io.open(path, "rb")
  if not f then return 0, 0 end
  local keep, dropped = {}, 0
  for line in f:lines() do
    local ok, t = pcall(nibble.json.decode, line)
    local s = ok and type(t) == "table" and tonumber(t.step)
    local is_train = s and t.loss ~= nil
    if s and (s < step or (s == step and (is_train or step < steps))) then
      keep[#keep + 1] = line
    else
      dropped = dropped + 1
    end
  end
  f:close()
  if dropped == 0 then return #keep, 0 end
  local tmp = path .. ".part"
  local w = io.open(tmp, "wb")
  if not w then error(("qad: cannot write %s (to cut the metrics back to step %d)"):format(tmp, step), 0) end
  if #keep > 0 then w:write(table.concat(keep, "\n"), "\n") end
  w:close()
  local ok, e = os.rename(tmp, path)
  if not ok then error("qad: cannot replace " .. path .. ": " .. tostring(e), 0) end
  return #keep, dropped
end

-- ---- identities of models and files (resume checks, caches) ---------------------------------------------

local FNV_PRIME = 1099511628211ULL
local function fnv(h, s)
  for i = 1, #s do h = bit.bxor(h, s:byte(i)) * FNV_PRIME end
  return h
end
local function hex(h) return bit.tohex(h, 16) end

-- A file's identity: its size and a hash of its first and last 64 KiB (the header of a safetensors or
-- GGUF file lists every tensor, the tail holds weights): cheap for any size, and a copy keeps it.
local function file_identity(p)
  local f = io.open(p, "rb")
  if not f then return nil end
  local size = f:seek("end")
  f:seek("set", 0)
  local head = f:read(65536) or ""
  f:seek("set", math.max(0, size - 65536))
  local tail = f:read(65536) or ""
  f:close()
  return ("%d:%s"):format(size, hex(fnv(fnv(14695981039346656037ULL, head), tail)))
end
G.file_identity = file_identity

-- model_identity(path): a hash of what makes a model (a Hugging Face folder: config.json, the weight
-- files, the tokenizer; or a GGUF file), equal for copies of it and different when the weights, config
-- or tokenizer differ, whatever the folder is called. nil when path is neither.
function G.model_identity(path)
  local parts = {}
  local dir = path:gsub("/+$", "")
  local cfg = io.open(dir .. "/config.json", "rb")
  if not cfg then
    local id = file_identity(path)
    return id and hex(fnv(14695981039346656037ULL, "gguf " .. id)) or nil
  end
  parts[#parts + 1] = "config " .. cfg:read("*a")
  cfg:close()
  local weights = {}
  local index = io.open(dir .. "/model.safetensors.index.json", "rb")
  if index then
    local text = index:read("*a")
    index:close()
    parts[#parts + 1] = "index " .. text
    local ok, t = pcall(nibble.json.decode, text)
    local seen = {}
    for _, file in pairs(ok and type(t) == "table" and type(t.weight_map) == "table" and t.weight_map or {}) do
      if type(file) == "string" and not seen[file] then seen[file] = true; weights[#weights + 1] = file end
    end
    table.sort(weights)
  else
    weights[1] = "model.safetensors"
  end
  for _, n in ipairs { "tokenizer.json", "tokenizer.model", "tokenizer_config.json" } do weights[#weights + 1] = n end
  for _, n in ipairs(weights) do parts[#parts + 1] = n .. " " .. (file_identity(dir .. "/" .. n) or "-") end
  return hex(fnv(14695981039346656037ULL, table.concat(parts, "\n")))
end

-- hash(s): a 64-bit FNV-1a hash of a string, as 16 hex digits.
function G.hash(s) return hex(fnv(14695981039346656037ULL, s)) end

-- ---- checks before any compute ---------------------------------------------------------------------------

-- check_context(cfg, n, what, allow_long): nibble.ptq's (PTQ calibration checks it too).
G.check_context = ptq.check_context

-- "file", "dir" or nil, error (missing or unreadable): the sub-commands' test (nibble.util.path_kind).
local kind_of = util.path_kind

local function parent_of(p)
  p = p:gsub("/+$", "")
  local parent = p:match("^(.*)/[^/]*$")
  if parent == nil then return "." end
  return parent == "" and "/" or parent
end

-- Whether a file can be created in dir (what the export's temporary sibling and checkpoints need).
local function can_write_in(dir)
  local probe = ("%s/.nibble-write-test-%d-%d"):format(dir, os.time(), math.random(1, 2 ^ 30))
  local f = io.open(probe, "wb")
  if not f then return false end
  f:close()
  os.remove(probe)
  return true
end

pcall(ffi.cdef, "char *realpath(const char *path, char *resolved_path);")
pcall(ffi.cdef, "void free(void *ptr);")
local function realpath(p)
  local ok, r = pcall(function()
    local s = ffi.C.realpath(p, nil)
    if s == nil then return nil end
    local out = ffi.string(s)
    ffi.C.free(s)
    return out
  end)
  return ok and r or nil
end

local function need_file(p, what)
  local k, e = kind_of(p)
  if not k then error(("%s %s does not exist (%s)"):format(what, tostring(p), tostring(e):gsub("^[^:]*: ", "")), 0) end
  if k == "dir" then error(("%s %s is a folder; give a file"):format(what, tostring(p)), 0) end
end

-- A folder that will be created (with its parents, as checkpoints are): its nearest existing ancestor
-- must be a folder a file can be written in.
local function need_creatable(dir, what)
  local k = kind_of(dir)
  if k == "file" then error(("%s %s is a file, not a folder"):format(what, dir), 0) end
  if k == "dir" then
    if not can_write_in(dir) then error(("%s %s is not writable"):format(what, dir), 0) end
    return
  end
  local p = parent_of(dir)
  while not kind_of(p) and p ~= "/" and p ~= "." do p = parent_of(p) end
  if kind_of(p) ~= "dir" then error(("%s %s: %s is not a folder"):format(what, dir, p), 0) end
  if not can_write_in(p) then error(("%s %s cannot be created: %s is not writable"):format(what, dir, p), 0) end
end

-- check_out(dir, models [, o]): may an export go to dir? Its parent must be a writable folder (with
-- o.parents: or a folder that can be created, as the caller will), dir must not be a file nor the
-- folder of one of `models` (paths), and libnibble's nb_export_check_target must agree (dir absent,
-- empty, or a previous nibble export). Errors name dir and why; nothing is written.
function G.check_out(dir, models, o)
  local k = kind_of(dir)
  if k == "file" then error(("export: out=%s is a file, not a folder"):format(dir), 0) end
  local parent = parent_of(dir)
  if kind_of(parent) ~= "dir" then
    if o and o.parents then
      need_creatable(parent, "export: the folder of out=" .. dir)
      return   -- nothing is there yet
    end
    error(("export: out=%s: the folder %s does not exist"):format(dir, parent), 0)
  end
  if k == "dir" then
    local rd = realpath(dir)
    for _, m in ipairs(models or {}) do
      if rd and realpath(m) == rd then
        error(("export: out=%s is the folder of the model %s; choose another output folder"):format(dir, m), 0)
      end
    end
  end
  if not can_write_in(parent) then error(("export: out=%s: cannot write in %s"):format(dir, parent), 0) end
  local c = nibble.context()
  if C.nb_export_check_target(c, dir) ~= 0 then
    local msg = ffi.string(C.nb_ctx_last_error(c))
    C.nb_ctx_clear_error(c)
    error(msg, 0)
  end
end

-- ---- the run's settings and its checkpoints ---------------------------------------------------------------

-- The loss enums in words: the run header's loss_text and the settings record say them alike.
local kd_names = { [tonumber(C.NB_KD_FORWARD)] = "kl", [tonumber(C.NB_KD_REVERSE)] = "reverse_kl",
                   [tonumber(C.NB_KD_NONE)] = "ce" }
local norm_names = { [tonumber(C.NB_TOPK_RENORM)] = "renorm", [tonumber(C.NB_TOPK_STUDENT_FULL)] = "student_full",
                     [tonumber(C.NB_TOPK_GHOST)] = "ghost" }

-- loss_text(cfg): the loss of an nb_qad_cfg in words, for the run header.
function G.loss_text(cfg)
  local l = cfg.loss
  local kd = tonumber(l.kd)
  local s = kd == tonumber(C.NB_KD_REVERSE) and "reverse KL(student || teacher)"
            or kd == tonumber(C.NB_KD_NONE) and "no KD" or "KL(teacher || student)"
  if kd ~= tonumber(C.NB_KD_NONE) then
    if l.top_k > 0 then s = ("top-%d %s (%s)"):format(l.top_k, s, norm_names[tonumber(l.topk_norm)] or "?") end
    s = s .. ", T = " .. gnum(l.temperature)
    if l.temperature ~= 1 and l.t2_scale == 0 then s = s .. " (no T^2 scale)" end
  end
  if l.lm_loss ~= 0 then
    s = kd == tonumber(C.NB_KD_NONE) and "CE on the data" or
        ("CE + %s x %s"):format(gnum(l.kd_loss_scale), s)
  end
  return s
end

-- readable(msg): libnibble's settings message ("kd: the checkpoint has 0, this run 1") in the words of
-- the settings list: the loss kind and top-k norm by name, flags as true / false, the shortest numbers
-- ("lr: the checkpoint has 0.0003, this run 0.0001").
function G.readable(msg)
  return (tostring(msg):gsub("([%w_]+): the checkpoint has ([^,]+), this run ([^%)]+)", function(name, x, y)
    local row = S.by_name[name]
    local function word(v)
      local n = tonumber(v)
      if not n then return v end
      if row and row.cfg == "loss.kd" then return kd_names[n] or v end
      if row and row.cfg == "loss.topk_norm" then return norm_names[n] or v end
      if row and row.type == "bool" then return tostring(n ~= 0) end
      return gnum(n)
    end
    return ("%s: the checkpoint has %s, this run %s"):format(name, word(x), word(y))
  end))
end

-- The settings a resumed run must share with its checkpoints beyond those libnibble records in them (the
-- settings list's "cfg" rows: loss, schedule, optimizer; compared before any compute by
-- nb_qad_check_settings; the student it restores carries its quantizers, so a changed format would
-- silently not apply): the models, the quantization plan, calibration, data, the loader and the seed.
-- Recorded once, in run-settings.json. A list of {key, value, shown}.
local function run_settings(r, cfg, plan, needs_calib, tpath, mpath, data_key)
  local s = {}
  local function add(k, v, shown)
    if type(v) == "number" then v = gnum(v) elseif v == nil then v = "-" else v = tostring(v) end
    s[#s + 1] = { key = k, value = v, shown = shown }
  end
  local formats, seen, modules = {}, {}, {}
  for _, e in ipairs(plan or {}) do
    if e.kind == "linear" then
      modules[#modules + 1] = { e.name, e.format or "-" }
      if e.format and not seen[e.format] then seen[e.format] = true; formats[#formats + 1] = e.format end
    end
  end
  add("format", #formats > 0 and table.concat(formats, " + ") or "none")
  add("algorithm", r.algorithm or "max")
  add("kv_cache", r.kv_cache or "none")
  add("model", mpath and G.model_identity(mpath), mpath)
  add("teacher", tpath and G.model_identity(tpath), tpath)
  for _, m in ipairs(modules) do add("module " .. m[1], m[2]) end
  local c = r.calibration or {}
  if needs_calib then
    if data_key then add("calibration data", data_key) else add("calibration data", c.data and file_identity(c.data), c.data) end
    for _, k in ipairs { "samples", "seq_len", "batch", "seed", "pack", "random_offset", "text_field", "separator" } do
      add("calibration " .. k, c[k])
    end
  end
  local d = r.distill
  if data_key then
    add("data", data_key)
  else
    local data = type(d.data) == "table" and d.data or { d.data }
    local ids = {}
    for i, p in ipairs(data) do ids[i] = file_identity(p) or "-" end
    add("data", table.concat(ids, ","), table.concat(data, ","))
  end
  -- the loader's: the rows of the settings list a resume must share that libnibble does not record
  for _, row in ipairs(S.list) do
    local k = row.key and row.key:match("^distill%.([%w_]+)$")
    if row.resume == "loader" then
      add(row.name, (k == "seq_len" or k == "batch") and (tonumber(d[k]) or loader_defaults[k]) or d[k])
    end
  end
  add("seed", tonumber(d.seed or r.seed or 0))
  return s
end

local SETTINGS_FILE = "run-settings.json"

-- read_settings(ckdir): the run-settings record of a checkpoint folder (a list of {key, value [, shown]}
-- with string values, as run_settings makes), nil when there is none. A record that cannot be read, is
-- not JSON or not such a list is an error naming the file: a resume must not go on unchecked.
local function read_settings(ckdir)
  local path = ckdir .. "/" .. SETTINGS_FILE
  local f = io.open(path, "rb")
  if not f then return nil end
  local text, e = f:read("*a")
  f:close()
  local function bad(why)
    error(("qad: %s %s: resume compares this run with it (overwrite=true starts again)"):format(path, why), 0)
  end
  if not text then bad("cannot be read (" .. tostring(e) .. ")") end
  local ok, t = pcall(nibble.json.decode, text)
  if not ok then bad("is not valid JSON (" .. tostring(t):gsub("^json%.decode: ", "") .. ")") end
  if type(t) ~= "table" or #t == 0 then bad("is not a list of settings") end
  for k in pairs(t) do
    if type(k) ~= "number" then bad("is not a list of settings") end
  end
  for i, x in ipairs(t) do
    if type(x) ~= "table" or type(x.key) ~= "string" or type(x.value) ~= "string"
       or (x.shown ~= nil and type(x.shown) ~= "string") then
      bad(("entry %d is not {key, value[, shown]} with string values"):format(i))
    end
  end
  return t
end

local function write_settings(ckdir, s)
  os.execute("mkdir -p '" .. ckdir:gsub("'", "'\\''") .. "'")
  local tmp = ckdir .. "/" .. SETTINGS_FILE .. ".part"
  local f = io.open(tmp, "wb")
  if not f then error("qad: cannot write " .. tmp, 0) end
  f:write(nibble.json.encode(s), "\n")
  f:close()
  local ok, e = os.rename(tmp, ckdir .. "/" .. SETTINGS_FILE)
  if not ok then error("qad: " .. tostring(e), 0) end
end

-- The first setting that differs: "key: the checkpoint has A, this run B" (models by path), or nil.
local function settings_diff(saved, now)
  local by = {}
  for _, e in ipairs(saved) do by[e.key] = e end
  for _, e in ipairs(now) do
    local o = by[e.key]
    if o and o.value ~= e.value then
      if e.shown or o.shown then
        local a, b = tostring(o.shown or "-"), tostring(e.shown or "-")
        return ("%s: the checkpoint's run used %s, this run %s (%s)"):format(e.key, a, b,
          a == b and "changed since" or "not the same content")
      end
      return ("%s: the checkpoint has %s, this run %s"):format(e.key, o.value, e.value)
    end
  end
  for _, o in ipairs(saved) do
    local found = false
    for _, e in ipairs(now) do if e.key == o.key then found = true break end end
    -- a libnibble setting in a record an earlier version wrote: the checkpoint itself is compared
    local row = S.by_name[o.key]
    if not found and not (row and row.resume == "cfg") then
      return ("%s: the checkpoint has %s, this run none"):format(o.key, o.value)
    end
  end
  return nil
end

local function step_of(path) return tonumber(tostring(path):match("step%-(%d+)/*$")) end

-- resume_settings(r, cfg, plan, o): what a resumed run must share with its checkpoints (see above), from
-- a composed recipe r (its distill table: the data and loader keys), the nb_qad_cfg, the plan (ptq's
-- dry run) and o = {model = path, teacher = path, needs_calib = bool, data_key = string or nil: names the
-- training and calibration text instead of the files' identities (the quickstart's cache key)}.
function G.resume_settings(r, cfg, plan, o)
  o = o or {}
  return run_settings(r, cfg, plan, o.needs_calib, o.teacher, o.model, o.data_key)
end

-- cfg_diff(ckdir, cfg): the first of libnibble's recorded settings that the latest checkpoint in ckdir
-- has otherwise than cfg (nb_qad_check_settings), readable, or nil; a checkpoint whose trainer state
-- cannot be read is an error.
local function cfg_diff(ckdir, cfg)
  local c = ctx()
  if C.nb_qad_check_settings(c, cfg, ckdir) == 0 then return nil end
  local msg = ffi.string(C.nb_ctx_last_error(c))
  C.nb_ctx_clear_error(c)
  local d = msg:match("settings changed %((.*)%)$")
  if not d then error(msg, 0) end
  return G.readable(d)
end

-- check_checkpoints(ckdir, settings, resume, overwrite [, cfg]): before any compute. resume = true with a
-- checkpoint whose run had other settings is an error naming the first ("format: the checkpoint has
-- nvfp4_w4a16, this run mxfp8"; with cfg, the nb_qad_cfg: "lr: the checkpoint has 0.0003, this run 0.0001"); a fresh run over checkpoints is an error unless overwrite. Returns
-- the latest checkpoint's path, or nil.
function G.check_checkpoints(ckdir, settings, resume, overwrite, cfg)
  if resume and overwrite then error("qad: resume and overwrite exclude each other", 0) end
  local latest = ckdir and G.latest(ckdir) or nil
  if latest and resume then
    local saved = read_settings(ckdir)
    local diff = saved and settings_diff(saved, settings)
    if not diff and cfg then diff = cfg_diff(ckdir, cfg) end
    if diff then
      error(("qad: cannot resume from %s: the run's settings changed (%s); resume with the same settings, or "
             .. "overwrite=true to start again"):format(latest, diff), 0)
    end
  elseif latest and not overwrite then
    error(("qad: %s already holds checkpoints (the latest of step %s): resume=true continues that run, "
           .. "overwrite=true starts again and removes them"):format(ckdir, tostring(step_of(latest) or "?")), 0)
  end
  return latest
end

-- start_checkpoints(ckdir, settings, latest, resumed [, log]): just before the first step. A fresh run
-- removes the checkpoints there (check_checkpoints let it only with overwrite). Returns the function
-- qad.train calls before it saves a checkpoint (o.before_save): it records the settings next to them,
-- once, for the next resume to check.
function G.start_checkpoints(ckdir, settings, latest, resumed, log)
  if not ckdir then return nil end
  if latest and not resumed then
    local q = "'" .. ckdir:gsub("'", "'\\''") .. "'"
    os.execute(("rm -rf %s/step-[0-9]* %s/.step-* %s/latest %s/latest.tmp-* %s/%s"):format(q, q, q, q, q, SETTINGS_FILE))
    if log then log("qad: overwrite = true: removed the checkpoints in %s", ckdir) end
  end
  local written = false
  return function()
    if not written then
      write_settings(ckdir, settings)
      written = true
    end
  end
end

-- ---- preflight ---------------------------------------------------------------------------------------

-- preflight(r, opts): everything a QAD run checks before any compute, on a composed recipe: the
-- training settings (qad.config), the files it reads (data, eval data, calibration data when the formats
-- need it), the model's config (seq_len within max_position_embeddings unless distill.allow_long, topk
-- within the vocabulary, a teacher of the same vocabulary and width), the plan (ptq's dry run), where
-- it writes (export.dir: qad.check_out; checkpoint_dir; metrics) and the checkpoints already there (a
-- fresh run refuses them unless distill.overwrite; resume = true refuses one whose settings differ).
-- Returns {config, plan, algorithm, checkpoint_dir, latest (checkpoint path or nil), settings}.
local function preflight(r, opts)
  local d = r.distill
  if type(d) ~= "table" then error("recipe: QAD needs a distill section", 0) end
  local export = r.export or {}
  local mpath = r.model and r.model.path
  local tpath = (r.model and r.model.teacher) or mpath
  if not opts.model and not mpath then error("recipe: model.path is missing (the model to quantize; model=PATH)", 0) end
  if not opts.dry_run and not export.dir then error("recipe: export.dir is missing (out=DIR)", 0) end
  local cfg = G.config(d, r.algorithm)   -- every training key
  if not d.data then
    error("recipe: distill.data is missing (the text QAD distils on: data=FILE; e.g. the calibration text)", 0)
  end
  for _, p in ipairs(type(d.data) == "table" and d.data or { d.data }) do need_file(p, "distill.data") end
  local ev = r.eval or {}
  local eval_data = ev.data or d.eval_data
  if eval_data then need_file(eval_data, "eval data") end
  num(ev, "ctx", "eval", true, 2)
  num(ev, "chunks", "eval", true, 0)
  num(d, "checkpoint_every", "distill", true, 0)
  num(d, "eval_every", "distill", true, 0)
  local resume = bool(d.resume, "distill", "resume")
  local overwrite = bool(d.overwrite, "distill", "overwrite")
  local allow_long = bool(d.allow_long, "distill", "allow_long")

  -- the models' configs (no weights) and the plan
  local read_config = nibble.model.read_config
  local mcfg = (opts.model and opts.model.config) or read_config(mpath)
  local tcfg = (opts.teacher and opts.teacher.config) or (tpath ~= mpath and read_config(tpath)) or mcfg
  if tcfg.vocab_size ~= mcfg.vocab_size or tcfg.hidden_size ~= mcfg.hidden_size then
    error(("recipe: the teacher %s (vocabulary %d, width %d) does not match the model %s (vocabulary %d, width %d)")
      :format(tostring(tpath), tcfg.vocab_size, tcfg.hidden_size, tostring(mpath), mcfg.vocab_size, mcfg.hidden_size), 0)
  end
  local function within(n, what) G.check_context(mcfg, n, what, allow_long) end
  within(tonumber(d.seq_len) or loader_defaults.seq_len, "distill: seq_len")
  if eval_data then within(tonumber(ev.ctx) or 512, "eval: ctx") end
  if cfg.loss.top_k > mcfg.vocab_size then
    error(("distill: topk %d is more than the model's vocabulary (%d tokens)"):format(cfg.loss.top_k, mcfg.vocab_size), 0)
  end
  local dry = ptq.run(r, nil, { dry_run = true, quiet = true, model = opts.model })
  local needs_calib = ptq.kv_of(r) ~= nil
  for _, e in ipairs(dry.plan) do
    if e.preset and e.preset.input then needs_calib = true end
  end
  if needs_calib then
    local c = r.calibration or {}
    if not c.data then
      error("recipe: this recipe quantizes activations" .. (ptq.kv_of(r) and " or the KV cache" or "")
            .. ", so it needs calibration data: calibration = { data = FILE } (qad.lua: calib=FILE or data=FILE)", 0)
    end
    need_file(c.data, "calibration data")
    num(c, "samples", "calibration", true, 1)
    num(c, "seq_len", "calibration", true, 1)
    num(c, "batch", "calibration", true, 1)
    within(tonumber(c.seq_len) or 512, "calibration: seq_len")
  end

  -- where it writes
  local ckdir = d.checkpoint_dir or (export.dir and (export.dir .. "-checkpoints")) or nil
  if export.dir then G.check_out(export.dir, { mpath, tpath }, { parents = true }) end   -- the export creates them
  if ckdir then need_creatable(ckdir, "checkpoint_dir") end
  if d.metrics then
    if kind_of(d.metrics) == "dir" then error(("distill: metrics %s is a folder; give a file"):format(d.metrics), 0) end
    local parent = parent_of(d.metrics)
    if kind_of(parent) ~= "dir" or not can_write_in(parent) then
      error(("distill: metrics %s cannot be written (%s is not a writable folder)"):format(d.metrics, parent), 0)
    end
  end

  -- checkpoints already there
  local settings = run_settings(r, cfg, dry.plan, needs_calib, tpath, mpath)
  local latest = G.check_checkpoints(ckdir, settings, resume, overwrite, cfg)
  return { config = cfg, plan = dry.plan, algorithm = dry.algorithm, checkpoint_dir = ckdir, latest = latest,
           settings = settings, resume = resume, overwrite = overwrite }
end
G.preflight = preflight

return G

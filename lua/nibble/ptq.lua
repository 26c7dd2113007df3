-- nibble.ptq: post-training quantization from a recipe. Load the model, resolve the recipe's rules
-- against its modules, put a quantizer on each chosen linear module (presets -> qmodel specs), fuse
-- siblings, calibrate (forward passes over packed calibration data when some activations are
-- quantized; weights alone otherwise), report coverage, and export (ModelOpt or compressed-tensors).
--   local r = nibble.ptq.run(nibble.recipe { extends = "units/nvfp4_w4a16", model = { path = "m" },
--                                            export = { dir = "out" } })
-- r.plan, r.qmodel, r.model, r.skipped, r.uncovered, r.weight_error, r.seconds are what happened; r.fake is
-- true when r.model now runs with fake quant (on whenever every enabled quantizer is calibrated).
local ffi = require("ffi")
local nibble = require("nibble")
local recipe = require("nibble.recipe")
local qmodel = require("nibble.qmodel")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local M = {}

local function ctx() return nibble.context() end

-- ---- wall clock (for tokens/s and ETA) --------------------------------------------------------------

local have_clock = pcall(ffi.cdef, [[
  struct nb_ptq_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk, struct nb_ptq_timespec *ts);
]])
local ts = have_clock and ffi.new("struct nb_ptq_timespec") or nil
local function now()
  if ts and ffi.C.clock_gettime(1, ts) == 0 then return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
  return os.time()
end
M.now = now

local function hms(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return ("%d:%02d:%02d"):format(s / 3600, (s % 3600) / 60, s % 60) end
  return ("%d:%02d"):format(s / 60, s % 60)
end
M.hms = hms

-- ---- the model ---------------------------------------------------------------------------------------

-- load_model(path): a model object ({_p = nb_model *, path}); nibble.model's when it exists.
function M.load_model(path)
  if type(path) ~= "string" then fail("ptq: the recipe needs model.path (a Hugging Face directory or a .gguf)") end
  if package.searchpath("nibble.model", package.path) then
    local mm = require("nibble.model")
    if type(mm) == "table" and type(mm.load) == "function" then return mm.load(path) end
  end
  local out = ffi.new("nb_model *[1]")
  check(C.nb_model_load(ctx(), path, out))
  nibble.note_native()
  return { _p = ffi.gc(out[0], C.nb_model_free), path = path }
end


-- modules(model): what recipe.resolve needs, in model order: {name, kind, in_features, out_features, tied}.
function M.modules(model)
  local m = qmodel.model_ptr(model)
  local out, info = {}, ffi.new("nb_linear_info")
  for i = 0, tonumber(C.nb_model_module_count(m)) - 1 do
    local kind = require("nibble.model").kind_names[tonumber(C.nb_model_module_kind(m, i))]
    if kind ~= "container" then
      local e = { name = ffi.string(C.nb_model_module_name(m, i)), kind = kind }
      if kind == "linear" then
        check(C.nb_model_linear_info(ctx(), m, i, info))
        e.in_features, e.out_features = tonumber(info.in_features), tonumber(info.out_features)
        e.tied = info.tied ~= 0
      end
      out[#out + 1] = e
    end
  end
  return out
end

-- ---- presets -> qmodel specs -----------------------------------------------------------------------

-- spec_of(preset [, opts]): the qmodel spec of a recipe preset (recipe.presets[name]: its weight format,
-- static or dynamic, input format); opts.floor is MXFP8's OCP exponent rule.
function M.spec_of(p, opts)
  opts = opts or {}
  if not p.weight_format then fail("ptq: preset " .. tostring(p.name) .. " has no quantizer") end
  local s = { weight = p.weight_format, static = p.static or nil, input = p.input }
  if p.weight_format == "mxfp8" then s.floor = opts.floor or nil end
  if opts.pass_through_bwd ~= nil then s.pass_through_bwd = opts.pass_through_bwd end
  return s
end

-- kv_of(r): the KV cache preset a (validated) recipe asks for, or nil.
function M.kv_of(r)
  if r.kv_cache == nil or r.kv_cache == false then return nil end
  return recipe.kv_presets[r.kv_cache]
end

-- prepare(r [, args]): compose and check a recipe without any compute (what `nibble plan` needs and
-- what run does first). Returns the composed recipe.
function M.prepare(r, args)
  if type(r) == "string" then
    local loaded = recipe.load(r, args)
    if not loaded then error("recipe: " .. r .. " is a script (it returned nothing), not a declarative recipe", 0) end
    r = loaded
  end
  r = recipe.compose(r, args)
  recipe.validate(r)
  return r
end

-- ---- calibration data --------------------------------------------------------------------------------

local function file_head(path, n)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read(n)
  f:close()
  return s
end

local calib_defaults = { samples = 512, seq_len = 512, batch = 4, pack = true, random_offset = true }

-- The loader over the calibration data (the model's tokenizer, packing, seeded offset).
function M.calibration_loader(r, model_path, log)
  local c = r.calibration or {}
  if not c.data then
    error("recipe: this recipe quantizes activations" .. (M.kv_of(r) and " or the KV cache" or "")
          .. ", so it needs calibration data: calibration = { data = FILE } (nibble quantize: --calib FILE)", 0)
  end
  local data = nibble.data
  local tok = nibble.tokenizer.load(model_path)
  local opts = { tokenizer = tok, text_field = c.text_field, chat_template = c.chat_template }
  if c.separator then
    opts.separator = c.separator
  elseif not c.data:match("%.jsonl?$") and not c.data:match("%.ndjson$") then
    local head = file_head(c.data, 65536)
    if head and head:find("<|endoftext|>", 1, true) then
      opts.separator = "<|endoftext|>"
      log("calibration: %s separates documents with <|endoftext|>; splitting there", c.data)
    end
  end
  local ds = data.load(c.data, opts)
  local seq_len = c.seq_len or calib_defaults.seq_len
  local samples = c.samples or calib_defaults.samples
  local cfg = { seq_len = seq_len, batch = c.batch or calib_defaults.batch, seed = c.seed or r.seed or 0,
                random_offset = c.random_offset == nil and calib_defaults.random_offset or c.random_offset,
                pack = c.pack == nil and calib_defaults.pack or c.pack }
  cfg.samples = 0
  local all = data.loader(ds, cfg)
  local avail = all.rows_per_epoch
  all:free()
  if avail < 1 then error(("calibration: %s gives no row of %d tokens"):format(c.data, seq_len), 0) end
  if samples > avail then
    log("calibration: %s gives %d rows of %d tokens, fewer than samples = %d: using %d", c.data, avail, seq_len,
        samples, avail)
    samples = avail
  end
  cfg.samples = samples
  return data.loader(ds, cfg), ds, tok
end

-- calibrate(qm, model, loader, opts): forward passes over every batch of the loader's epoch with the
-- observers installed. opts: algorithm, progress (function(done, total, tok_s, eta) or nil).
function M.calibrate(qm, model, loader, opts)
  opts = opts or {}
  local m = qmodel.model_ptr(model)
  qm:calibrate_begin(opts.algorithm or "max")
  local ok, err = pcall(function()
    local fo = ffi.new("nb_forward_opts")
    -- lm_head's input only reaches its observer when logits are computed
    local lm = qm:find("lm_head")
    local iq = lm and C.nb_qmodel_input_quantizer(qm._p, lm - 1)
    local vocab = tonumber(C.nb_model_get_config(m).vocab_size)
    local logits
    local total, done, t0, ntok = loader.rows_per_epoch, 0, now(), 0
    for b in loader:epoch() do
      local T = loader.seq_len
      fo.logits = nil
      if iq ~= nil and C.nb_quantizer_enabled(iq) ~= 0 then
        logits = logits or ffi.new("float[?]", loader.batch * T * vocab)
        fo.logits = logits
      end
      check(C.nb_model_forward(ctx(), m, b.tokens:data("const int32_t *"), b.rows, T, fo))
      done = done + b.rows
      ntok = ntok + b.rows * T
      if opts.progress then
        local dt = now() - t0
        local rate = dt > 0 and ntok / dt or 0
        opts.progress(done, total, rate, rate > 0 and (total - done) * T / rate or 0 / 0)
      end
    end
  end)
  -- always leave calibration mode (hooks off), then report the first error
  local ok2, err2 = pcall(qm.calibrate_end, qm)
  if not ok then error(err, 0) end
  if not ok2 then error(err2, 0) end
  return qm
end

-- ---- weight error ----------------------------------------------------------------------------------

-- weight_error(qm, model): {mse, rel, numel, modules} of fake-quant weights vs the masters, summed
-- over the quantized modules (rel = sum sq err / sum sq w).
function M.weight_error(qm, model)
  local m = qmodel.model_ptr(model)
  local se, sw, n, mods = 0, 0, 0, 0
  for i = 1, qm:count() do
    local wq = C.nb_qmodel_weight_quantizer(qm._p, i - 1)
    if wq ~= nil and C.nb_quantizer_enabled(wq) ~= 0 then
      local p = C.nb_model_find_param(m, qm:name(i) .. ".weight")
      local w = nibble.wrap(C.nb_model_param(m, p), true)
      local f = nibble.zeros("f32", w.shape)
      check(C.nb_quantizer_fake(ctx(), wq, w.ptr, f.ptr))
      local a, b = w:data("const float *"), f:data("const float *")
      local k = w:numel()
      for j = 0, k - 1 do
        local d = a[j] - b[j]
        se = se + d * d
        sw = sw + a[j] * a[j]
      end
      n, mods = n + k, mods + 1
    end
  end
  return { mse = n > 0 and se / n or 0, rel = sw > 0 and se / sw or 0, numel = n, modules = mods }
end

-- recipe_of(o): the recipe `nibble quantize` runs: recipes/ptq.lua with o's values as its arguments
-- (model, format, algorithm, calib, samples, seq_len, batch, seed, layout, out, allow_uncalibrated, allow_long,
-- dtype).
function M.recipe_of(o)
  local path = recipe.find("ptq")
  if not path then error("ptq: recipes/ptq.lua not found on the recipe path (set NIBBLE_RECIPES)", 0) end
  local args = {}
  for _, k in ipairs { "model", "format", "algorithm", "calib", "samples", "seq_len", "batch", "seed", "layout", "out",
                       "kv_cache", "dtype" } do
    if o[k] ~= nil then args[k] = tostring(o[k]) end
  end
  if o.allow_uncalibrated then args.allow_uncalibrated = "true" end
  if o.allow_long then args.allow_long = "true" end
  if o.allow_nonfinite then args.allow_nonfinite = "true" end
  local r = recipe.load(path, args)
  return r, args
end

-- report_nonfinite(names): what allow_nonfinite let an export write, on stderr (even with quiet: the
-- checkpoint holds values a server will propagate).
function M.report_nonfinite(names)
  if names and #names > 0 then
    io.stderr:write(("export: allow_nonfinite wrote NaN/Inf values in %d tensor(s): %s\n"):format(#names,
      table.concat(names, ", ")))
  end
end

-- ---- the pipeline ----------------------------------------------------------------------------------

-- logger(quiet): log(fmt, ...) writes one formatted line to stderr (nothing when quiet); qad.run uses it too.
local function logger(quiet)
  if quiet then return function() end end
  return function(fmt, ...)
    io.stderr:write((select("#", ...) > 0 and fmt:format(...) or fmt) .. "\n")
  end
end
M.logger = logger

local function isatty(fd)
  local ok, host = pcall(require, "nibble.host")
  if ok and type(host) == "table" and host.isatty then return host.isatty(fd) end
  return false
end
M.isatty = isatty

-- meter(label, opts): the progress line of every step that takes more than a few seconds (calibration,
-- teacher sampling, evals, export). update(done, total [, detail]) draws "LABEL: done/total UNIT  DETAIL
-- ETA m:ss" on stderr, the ETA from the elapsed time per unit done: on a terminal one line rewritten in
-- place (at most 5 times a second), otherwise a line every opts.every seconds (5) and the last one, so a
-- log shows that the run is alive without a line per unit. finish() ends a line still open, so a message
-- after a failure or Ctrl-C starts on a line of its own. opts: unit (""), tty (default: stderr is a
-- terminal), every, quiet (nothing at all).
function M.meter(label, opts)
  opts = opts or {}
  if opts.quiet then return function() end, function() end end
  local tty = opts.tty
  if tty == nil then tty = isatty(2) end
  local every = tty and 0.2 or (opts.every or 5)
  local unit = opts.unit and opts.unit ~= "" and (" " .. opts.unit) or ""
  local t0, last, open = now(), nil, false
  local function update(done, total, detail)
    local t = now()
    local fin = done >= total
    if not fin and last and t - last < every then return end
    last = t
    local eta = done > 0 and (t - t0) / done * (total - done) or 0 / 0
    local line = ("%s: %d/%d%s  %sETA %s"):format(label, done, total, unit,
      detail and detail ~= "" and (detail .. "  ") or "", hms(eta))
    if tty then
      io.stderr:write("\r" .. line .. "\27[K")   -- erase what a longer line before left
      open = not fin
      if fin then io.stderr:write("\n") end
    else
      io.stderr:write(line, "\n")
    end
    io.stderr:flush()
  end
  return update, function()
    if open then io.stderr:write("\n") end
    open = false
  end
end

-- progress_line(quiet): the calibration meter, fed by calibrate's function(done, total, tok_s, eta).
local function progress_line(quiet)
  if quiet then return nil, function() end end
  local update, finish = M.meter("calibrating", { unit = "samples" })
  return function(done, total, rate) update(done, total, ("%.0f tok/s"):format(rate)) end, finish
end

-- apply(qm, plan): quantizers as the plan says; unquantized linear modules keep their reason.
function M.apply(qm, plan)
  local n = 0
  for _, e in ipairs(plan) do
    if e.kind == "linear" then
      if e.format then
        qm:set(e.name, M.spec_of(e.preset, e.opts))
        n = n + 1
      else
        qm:exclude(e.name, e.reason)
      end
    end
  end
  return n
end

-- check_context(cfg, n, what, allow_long): refuse n tokens (a seq_len, an eval ctx) beyond the model's
-- max_position_embeddings (cfg from nibble.model.read_config), unless allow_long.
function M.check_context(cfg, n, what, allow_long)
  local maxpos = tonumber(cfg.max_position) or 0
  if n and maxpos > 0 and n > maxpos and not allow_long then
    error(("%s %d is more than the model's max_position_embeddings %d (allow_long=true runs it anyway)")
      :format(what, n, maxpos), 0)
  end
end

-- check_seq_len(r, plan, cfg): calibration rows of calibration.seq_len tokens beyond the model's
-- max_position_embeddings (cfg: nibble.model.read_config's) are refused unless calibration.allow_long
-- (or distill.allow_long, which QAD's calibration follows), as eval and generate refuse such a context;
-- only when the recipe calibrates on data (activation or KV quantizers), the one use of seq_len.
local function check_seq_len(r, plan, cfg)
  local needs_data = M.kv_of(r) ~= nil
  for _, e in ipairs(plan) do
    if e.preset and e.preset.input then needs_data = true end
  end
  if not needs_data then return end
  local c, d = r.calibration or {}, r.distill or {}
  M.check_context(cfg, tonumber(c.seq_len) or calib_defaults.seq_len, "calibration: seq_len",
    c.allow_long == true or d.allow_long == true)
end

-- run(recipe [, args [, opts]]): the whole PTQ. opts: quiet (no stderr output), dry_run (plan only:
-- without opts.model it reads the model's config and file headers, no weights, and result.model is nil),
-- model (an already loaded model object to use instead of model.path), no_export (stop after
-- calibration: QAD exports later, after training).
function M.run(r, args, opts)
  opts = opts or {}
  local log = logger(opts.quiet)
  local t_start = now()
  r = M.prepare(r, args)
  if r.threads then nibble.set_threads(r.threads) end
  local mpath = r.model and r.model.path
  local export = r.export or {}
  if not opts.dry_run and not opts.no_export and not export.dir then
    error("recipe: export.dir is missing (where to write the checkpoint; nibble quantize: --out DIR)", 0)
  end
  if not opts.dry_run and not opts.no_export then
    -- refuse an occupied folder now, not after minutes of loading and calibration; the export asks
    -- again before it writes and before its rename
    local c = ctx()
    if C.nb_export_check_target(c, tostring(export.dir)) ~= 0 then
      local msg = ffi.string(C.nb_ctx_last_error(c))
      C.nb_ctx_clear_error(c)
      error(msg, 0)
    end
  end
  if opts.dry_run and not opts.model then
    -- a plan needs the module list only: the config and file headers, no weights (result.model is nil)
    if type(mpath) ~= "string" then fail("ptq: the recipe needs model.path (a Hugging Face directory or a .gguf)") end
    local plan, notes = recipe.resolve(r, require("nibble.model").modules_of(mpath))
    local algorithm = r.algorithm or "max"   -- resolve chose each preset's variant for it
    check_seq_len(r, plan, require("nibble.model").read_config(mpath))
    return { recipe = r, plan = plan, notes = notes, algorithm = algorithm }
  end
  local model = opts.model or M.load_model(mpath)
  local plan, notes = recipe.resolve(r, M.modules(model))
  local algorithm = r.algorithm or "max"   -- resolve chose each preset's variant for it
  check_seq_len(r, plan, model.config)
  local result = { recipe = r, plan = plan, notes = notes, model = model, algorithm = algorithm }
  if opts.dry_run then return result end
  for _, n in ipairs(notes) do log("recipe: %s", n) end

  local qm = qmodel.new(model)
  result.qmodel = qm
  local nq = M.apply(qm, plan)
  local kv = M.kv_of(r)
  if nq == 0 and not kv then
    error("recipe: no module is quantized (every linear module is excluded); see nibble plan", 0)
  end
  local groups = qm:fuse_siblings()
  log("ptq: %d of %d linear modules quantized, %d fused sibling groups, algorithm %s", nq, qm:count(), groups,
      algorithm)
  if kv then
    qm:set_kv(kv.format)
    result.kv_cache = kv.format
    log("ptq: KV cache in %s: k_scale / v_scale of every layer from the calibration data", kv.format)
  end

  if qm:needs_data() then
    local loader = M.calibration_loader(r, mpath or model.path, log)
    log("calibration: %d samples of %d tokens from %s (batch %d, offset %d, seed %s)", loader.rows_per_epoch,
        loader.seq_len, r.calibration.data, loader.batch, loader:offset(0), tostring(r.calibration.seed or r.seed or 0))
    local t0 = now()
    local progress, progress_end = progress_line(opts.quiet)
    local okc, errc = pcall(M.calibrate, qm, model, loader, { algorithm = algorithm, progress = progress })
    progress_end()
    if not okc then error(errc, 0) end
    result.calib_seconds = now() - t0
    result.calib_samples = loader.rows_per_epoch
    result.calib_offset = loader:offset(0)
    result.calib_tokens = loader.rows_per_epoch * loader.seq_len
  else
    log("calibration: weight-only formats need no data: calibrating the weights alone (no forward passes)")
    if r.calibration and r.calibration.data then
      log("calibration: %s is not read", r.calibration.data)
    end
    qm:calibrate_weights(algorithm)
  end

  -- coverage: every enabled input (and KV) quantizer saw data, or say which did not
  result.uncovered = qm:uncovered()
  if #result.uncovered > 0 then
    log("coverage: %d input or KV quantizer(s) saw no calibration token: %s", #result.uncovered,
        table.concat(result.uncovered, ", "))
    if not r.allow_uncalibrated then
      log("coverage: the export will stop at the first of them (allow_uncalibrated = true leaves them unquantized)")
    end
  elseif qm:needs_data() then
    log("coverage: every input%s quantizer saw calibration data", kv and " and KV" or "")
  end

  result.weight_error = M.weight_error(qm, model)
  log("weights: mean squared error %.4g (relative %.4g) over %d quantized modules", result.weight_error.mse,
      result.weight_error.rel, result.weight_error.modules)

  -- the model now computes as it will ship, as ModelOpt's quantize leaves it (simulated quantization on):
  -- result.qmodel:set_fake(false) gives the original model's outputs back (said in lua/README.md, not in
  -- the log, which `nibble quantize` users read)
  local fake_ok, fake_err = pcall(qm.set_fake, qm, true)
  result.fake = fake_ok
  if fake_ok then
    log("ptq: the loaded model now computes with the quantized weights%s, as the export will",
        qm:needs_data() and " and activations" or "")
  else
    log("ptq: fake quant left off: %s", tostring(fake_err))
  end

  if export.dir and not opts.no_export then
    local t0 = now()
    result.skipped, result.nonfinite = qm:export(export.dir, { layout = export.layout or "modelopt",
                                             allow_uncalibrated = r.allow_uncalibrated,
                                             allow_nonfinite = r.allow_nonfinite,
                                             max_shard_size = export.max_shard_size, dtype = export.dtype })
    if #result.skipped > 0 then
      log("export: allow_uncalibrated left %d module(s) unquantized: %s", #result.skipped,
          table.concat(result.skipped, ", "))
    end
    M.report_nonfinite(result.nonfinite)
    log("export: %s (%s layout) in %.1f s", export.dir, export.layout or "modelopt", now() - t0)
    result.export_dir = export.dir
  end
  result.seconds = now() - t_start
  return result
end

return M

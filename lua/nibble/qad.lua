-- nibble.qad: quantization-aware distillation from Lua (nibble/qad.h). Three levels:
--   * run(recipe): the whole job of a recipe with a `distill` section, once every check that needs no
--     compute passed (preflight): PTQ (nibble.ptq's pipeline, no export), QAD with metrics JSONL, a
--     progress line, periodic eval and checkpoints (Ctrl-C saves one; resume = true continues bit for
--     bit, refused when a setting changed), the export, and the teacher / PTQ / QAD eval table.
--   * new{teacher, student, loader, config}: the C training step as an object (run:step(), save, restore,
--     micro_step, optimizer_step) for scripts that drive the loop themselves.
--   * the step-level API for custom losses: student(model, qm):forward(...) registers its outputs, losses
--     (nibble.distill.kl / reverse_kl / ce, qad.loss(value, {[tensor] = grad}) for ones written in Lua)
--     add and scale, and loss:backward() sends every gradient into the student's backward.
-- This file is the training engine and those levels; what a run checks before it computes and records
-- for a resume (preflight, model identities, run settings, checkpoints, the metrics file) is
-- nibble.qad_guard, whose public names are re-exported here (qad.preflight, qad.check_out, ...).
local ffi = require("ffi")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local D = require("nibble.distill")
local G = require("nibble.qad_guard")
local S = require("nibble.qad_settings")
local num, gnum, loader_defaults = G.num, G.gnum, G.loader_defaults

local Q = {}

-- What a run checks and records around this engine (preflight, identities, the settings a resume must
-- match, its checkpoints and metrics) is nibble.qad_guard; its public names stay reachable from here.
for _, k in ipairs { "preflight", "check_out", "resume_settings", "check_checkpoints", "start_checkpoints",
                     "cut_metrics", "step0_eval", "check_context", "model_identity", "file_identity", "hash",
                     "loss_text", "gnum", "latest", "lock" } do
  Q[k] = G[k]
end

local function ctx() return nibble.context() end

local ptq = require("nibble.ptq")
local recipe = require("nibble.recipe")
local util = require("nibble.util")
local qmodel = require("nibble.qmodel")
local now, hms, logger = ptq.now, ptq.hms, ptq.logger
local model_ptr = qmodel.model_ptr

local function qmodel_ptr(qm)
  local p = type(qm) == "table" and rawget(qm, "_p") or nil
  if p == nil then fail("qad: the student must be a nibble.qmodel (calibrated)") end
  return p
end

-- ---- configuration ------------------------------------------------------------------------------------

-- config(t [, algorithm]) is nibble.qad_guard.config: the nb_qad_cfg of a recipe's distill table, every
-- key checked against the one list of QAD settings (nibble.qad_settings).
Q.config = G.config

-- recipe_of(v [, where [, spell]]): the QAD recipe of the command's values (nibble.qad_settings.read:
-- `nibble qad --key V`, `nibble run recipes/qad.lua key=V`): units/FORMAT with every row's value at its
-- recipe key; kd = topk is KL over the teacher's top k (topk, default 64); formats that quantize
-- activations calibrate on calib, else on data. where prefixes messages; spell(k, v) names a key as
-- the user gave it ("topk=5", "--topk 5").
function Q.recipe_of(v, where, spell)
  local pre = where and (where .. ": ") or ""
  spell = spell or function(k, x) return k .. "=" .. tostring(x) end
  local format = recipe.check_preset(v.format, where or "--format")
  if v.topk ~= nil and v.kd ~= "topk" then
    error(("%s%s needs %s (the KD loss over the teacher's top k)"):format(pre, spell("topk", v.topk), spell("kd", "topk")), 0)
  end
  local r = { extends = "units/" .. format }
  for _, s in ipairs(S.list) do
    if s.name and s.key and v[s.name] ~= nil then
      local t, path = r, {}
      for part in s.key:gmatch("[^%.]+") do path[#path + 1] = part end
      for i = 1, #path - 1 do
        t[path[i]] = t[path[i]] or {}
        t = t[path[i]]
      end
      t[path[#path]] = v[s.name]
    end
  end
  r.calibration = r.calibration or {}
  r.calibration.random_offset = true
  -- formats that quantize activations calibrate on calib (default: the distillation data)
  if not r.calibration.data and recipe.presets[format].input then r.calibration.data = v.data end
  r.distill = r.distill or {}
  if v.kd == "topk" then r.distill.loss, r.distill.topk = "kl", v.topk or 64 end
  r.eval = r.eval or {}
  r.export = r.export or {}
  recipe.new(r, 3)   -- found relative to the caller's file (recipes/qad.lua: its units/)
  return r
end

-- ---- the C run ------------------------------------------------------------------------------------------

local Run = {}
Run.__index = Run

local function rp(self)
  local p = rawget(self, "_p")
  if p == nil then fail("qad run was freed") end
  return p
end

-- new{teacher = model, student = qmodel, loader = nibble.data loader or nil, config = distill table or
-- nb_qad_cfg, algorithm = "max"}: fake quant goes on, every parameter that requires grad is trained.
function Q.new(o)
  if type(o) ~= "table" then fail("qad.new{teacher =, student =, loader =, config =}") end
  local cfg = Q.config(o.config or {}, o.algorithm)
  local out = ffi.new("nb_qad *[1]")
  local lp = o.loader and rawget(o.loader, "_p") or nil
  if o.loader and lp == nil then fail("qad.new: the loader was freed") end
  check(C.nb_qad_new(ctx(), cfg, model_ptr(o.teacher), qmodel_ptr(o.student), lp, out))
  nibble.note_native()
  return setmetatable({ _p = ffi.gc(out[0], C.nb_qad_free), teacher = o.teacher, student = o.student,
                        loader = o.loader, cfg = cfg, steps = tonumber(cfg.steps) }, Run)
end

local function metrics_of(m)
  return { step = tonumber(m.step), loss = m.loss, kd = m.kd, ce = m.ce, lr = m.lr, grad_norm = m.grad_norm,
           tokens = tonumber(m.tokens), seen = tonumber(m.seen), seconds = m.seconds, tokens_per_s = m.tokens_per_s,
           skipped = m.skipped ~= 0, recalibrated = m.recalibrated ~= 0 }
end

-- step(): one optimizer step on the loader's next grad_accum batches -> metrics {step, loss, kd, ce, lr,
-- grad_norm, tokens, seen, seconds, tokens_per_s, skipped, recalibrated}.
-- A Ctrl-C that arrives once the step is done stays pending (raised by the next check or the host's
-- hook), so the caller still gets the metrics of the step it completed.
-- NB_ERR_INTERRUPTED with m.step set means the step completed (AdamW ran to the end before it saw the
-- flag): the interrupt is put back as pending instead of raised here, or the step's row would be lost.
local function completed_step(s, m)
  if s == C.NB_ERR_INTERRUPTED and m.step > 0 then
    local c = ctx()
    C.nb_ctx_clear_error(c)
    C.nb_ctx_interrupt(c)
  elseif s ~= 0 then
    check(s)
  end
  return metrics_of(m)
end

function Run:step()
  local m = ffi.new("nb_qad_metrics")
  return completed_step(C.nb_qad_step(ctx(), rp(self), m), m)
end

-- micro_step(tokens, targets [, mask [, denom]]): forward + backward of one micro-batch (i32 / u8 tensors
-- [B, T]); denom: the counted tokens of the whole optimizer step (default: this batch's own).
function Run:micro_step(tokens, targets, mask, denom)
  if not (nibble.is_tensor(tokens) and nibble.is_tensor(targets)) then
    fail("qad: micro_step(tokens, targets [, mask [, denom]]) needs i32 tensors [B, T]")
  end
  local B, T = tokens:size(1), tokens:size(2)
  local r = ffi.new("nb_distill_result")
  check(C.nb_qad_micro_step(ctx(), rp(self), tokens:contiguous():data("const int32_t *"),
                            targets:contiguous():data("const int32_t *"),
                            mask and mask:contiguous():data("const uint8_t *") or nil, B, T, denom or 0, r))
  return { loss = r.loss, kd = r.kd, lm = r.lm, tokens = tonumber(r.tokens) }
end

-- count_tokens(targets [, mask]): tokens micro_step would count (for the denom of accumulated steps).
function Run:count_tokens(targets, mask)
  return tonumber(C.nb_qad_count_tokens(rp(self), targets:contiguous():data("const int32_t *"),
                                        mask and mask:contiguous():data("const uint8_t *") or nil, targets:numel()))
end

-- optimizer_step(): clip, AdamW at the scheduled lr, zero grads -> metrics (step, lr, grad_norm, ...).
function Run:optimizer_step()
  local m = ffi.new("nb_qad_metrics")
  return completed_step(C.nb_qad_optimizer_step(ctx(), rp(self), m), m)
end

function Run:step_count() return tonumber(C.nb_qad_step_count(rp(self))) end
function Run:done() return C.nb_qad_done(rp(self)) ~= 0 end
function Run:lr_at(step) return C.nb_qad_lr_at(rp(self), step) end

-- save(dir [, keep]): an atomic checkpoint dir/step-N + dir/latest (keep: how many to keep, default 2).
-- Ctrl-C is held until it returns; a pending interrupt is kept for the caller.
Run.save = nibble.critical(function(self, dir, keep)
  local c = ctx()
  local pending = C.nb_ctx_interrupted(c) ~= 0
  C.nb_ctx_clear_interrupt(c)
  local s = C.nb_qad_save(c, rp(self), dir, keep or 2)
  local msg = s ~= 0 and ffi.string(C.nb_ctx_last_error(c)) or nil
  if s ~= 0 then C.nb_ctx_clear_error(c) end
  if pending then C.nb_ctx_interrupt(c) end
  if s ~= 0 then fail(ffi.string(C.nb_status_name(s)) .. ": " .. msg) end
  return dir
end)

-- restore(dir): continue from dir/latest (an error when there is none or the settings differ).
function Run:restore(dir)
  local ok, e = pcall(check, C.nb_qad_restore(ctx(), rp(self), dir))
  if not ok then fail(G.readable(util.clean(e))) end
  return self:step_count()
end

function Run:free()
  local p = rawget(self, "_p")
  if p ~= nil then
    self._p = nil
    C.nb_qad_free(ffi.gc(p, nil))
  end
end

-- ---- step-level API: losses and the student (nibble.distill's differentiable forms) -----------------

Q.loss, Q.is_loss, Q.kd, Q.student = D.objective, D.is_objective, D.kd, D.student

-- ---- metrics and progress -------------------------------------------------------------------------------

local function jnum(x)
  if type(x) ~= "number" or x ~= x or x == math.huge or x == -math.huge then return "null" end
  if x % 1 == 0 and math.abs(x) < 2 ^ 53 then return ("%d"):format(x) end
  return ("%.8g"):format(x)
end

-- The order keys are written in (the rest follow sorted).
local key_order = { "step", "loss", "kd", "ce", "lr", "grad_norm", "tokens", "seen", "tokens_per_s", "seconds",
                    "elapsed", "eval_ppl", "eval_kld", "eval_top1", "skipped", "recalibrated" }

-- json_line(t): one JSON object of numbers / booleans / strings, keys in a stable order.
function Q.json_line(t)
  local parts, seen = {}, {}
  local function add(k)
    local v = t[k]
    if v == nil then return end
    seen[k] = true
    local s
    if type(v) == "boolean" then s = v and "true" or "false"
    elseif type(v) == "number" then s = jnum(v)
    else s = nibble.json.encode(tostring(v)) end
    parts[#parts + 1] = ('"%s": %s'):format(k, s)
  end
  for _, k in ipairs(key_order) do add(k) end
  local rest = {}
  for k in pairs(t) do if not seen[k] then rest[#rest + 1] = k end end
  table.sort(rest)
  for _, k in ipairs(rest) do add(k) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local isatty = ptq.isatty
Q.isatty = isatty

-- progress(total, opts): a function(m) drawing "qad: step 12/200 [####......] loss ... tok/s ETA" on
-- stderr: in place on a terminal, else one line per ~5 % of the run (and the last step).
function Q.progress(total, opts)
  opts = opts or {}
  local tty = opts.tty
  if tty == nil then tty = isatty(2) end
  local t0, last, first = now(), -1, nil
  local every = math.max(1, math.floor(total / 20))
  return function(m)
    first = first or (m.step - 1)
    local t = now()
    local done = m.step >= total
    if tty then
      if not done and t - last < 0.2 then return end
    elseif not done and m.step % every ~= 0 and m.step ~= first + 1 then
      return
    end
    last = t
    local width = 24
    local fill = math.floor(width * m.step / total + 0.5)
    local steps_done = m.step - first
    local eta = steps_done > 0 and (t - t0) / steps_done * (total - m.step) or 0 / 0
    local line = ("qad: step %d/%d [%s%s] loss %.4g kd %.4g ce %.4g lr %.3g |g| %.3g %.0f tok/s ETA %s"):format(
      m.step, total, ("#"):rep(fill), ("."):rep(width - fill), m.loss, m.kd, m.ce, m.lr, m.grad_norm,
      m.tokens_per_s, hms(eta))
    if tty then
      io.stderr:write("\r" .. line .. "  ")
      if done then io.stderr:write("\n") end
    else
      io.stderr:write(line .. "\n")
    end
    io.stderr:flush()
  end
end

-- ---- evaluation -----------------------------------------------------------------------------------------

-- evaluate(model, tokens, teacher, opts): {ppl, kld, top1, tokens} with llama.cpp's method (opts ctx, chunks,
-- progress = function(done, total) after each batch of chunks).
function Q.evaluate(model, tokens, teacher, opts)
  opts = opts or {}
  local r = model:eval { tokens = tokens, ctx = opts.ctx or 512, chunks = opts.chunks, teacher = teacher,
                         progress = opts.progress }
  return { ppl = r.ppl, kld = r.kld, top1 = r.top1, tokens = r.tokens, chunks = r.chunks }
end

-- table_text(rows): the eval table, rows {name, ppl, kld, top1}.
function Q.table_text(rows)
  local w = 10
  for _, r in ipairs(rows) do w = math.max(w, #r.name) end
  local fmt_row = "%-" .. w .. "s %10s %10s %9s"
  local out = { fmt_row:format("", "PPL", "KLD", "top-1") }
  local function f(x, fmt) return (x == nil or x ~= x) and "-" or fmt:format(x) end
  for _, r in ipairs(rows) do
    out[#out + 1] = fmt_row:format(r.name, f(r.ppl, "%.4f"), f(r.kld, "%.5f"), f(r.top1, "%.2f%%"))
  end
  return table.concat(out, "\n")
end

-- ---- distillation text sampled from the teacher ------------------------------------------------------

-- generate_rows(model, prompts, seeds, n_new, opts): one continuation per row, row k continuing prompts[k] (a
-- table of ids) from the stream seeds[k], all rows decoded together by nb_model_generate. opts: temperature (1),
-- top_p (1), top_k (0), stop (the ids that end a row; default the model's EOS ids). Returns a table of new ids
-- per row (stop id included).
local function generate_rows(model, prompts, seeds, n_new, opts)
  local B, total = #prompts, 0
  for _, pr in ipairs(prompts) do total = total + #pr end
  local toks, lens = ffi.new("int32_t[?]", total), ffi.new("int64_t[?]", B)
  local sd = ffi.new("uint64_t[?]", B)
  local at = 0
  for k, pr in ipairs(prompts) do
    lens[k - 1], sd[k - 1] = #pr, seeds[k]
    for t = 1, #pr do toks[at + t - 1] = pr[t] end
    at = at + #pr
  end
  local go, stop_arr = nibble.model.generate_opts { temperature = opts.temperature or 1.0, top_p = opts.top_p,
    top_k = opts.top_k, stop_at_eos = opts.stop == nil, stop_ids = opts.stop }
  go.seeds = sd
  local out, nout = ffi.new("int32_t[?]", B * math.max(n_new, 1)), ffi.new("int64_t[?]", B)
  check(C.nb_model_generate(ctx(), model_ptr(model), toks, lens, B, n_new, go, out, nout))
  local _ = stop_arr
  local outs = {}
  for b = 0, B - 1 do
    local row = {}
    for k = 0, tonumber(nout[b]) - 1 do row[k + 1] = out[b * n_new + k] end
    outs[b + 1] = row
  end
  return outs
end

-- sample_batch(model, prompt_ids, B, n_new, opts): B continuations of one prompt (a table of ids), decoded
-- together by nb_model_generate. opts: temperature (1), top_p (1), top_k (0), seed (0; row b uses seed + b),
-- stop (the ids that end a row; default the model's EOS ids). Returns B tables of new ids (stop id included).
function Q.sample_batch(model, prompt, B, n_new, opts)
  opts = opts or {}
  local prompts, seeds = {}, {}
  for b = 1, B do prompts[b], seeds[b] = prompt, (opts.seed or 0) + b end
  return generate_rows(model, prompts, seeds, n_new, opts)
end

-- teacher_samples{model, tokenizer, prompts, samples = 8, tokens = 128, temperature = 1, top_k = 50, top_p = 1,
-- seed = 0, rows = 32, out = FILE.jsonl, progress = function(done, total, tokens)}: for every prompt, `samples`
-- answers of the model to it as a user turn (ChatML when the tokenizer has <|im_start|>, else "User: ...\nAssistant:"),
-- written as {"messages": [{user}, {assistant}]} lines to out (atomically). QAD distils well on its own
-- teacher's text, so this needs no dataset. Returns out and the number of generated tokens. The answers of
-- several prompts decode together, up to `rows` rows at a time (whole prompts; at least one): answer b of
-- prompt i draws from its own stream (seed * 1000003 + i * 1009 + b), so `rows` changes the speed, not the text.
function Q.teacher_samples(o)
  local tok = o.tokenizer or o.model:tokenizer()
  local chatml = pcall(function()
    local a, b = tok:encode("<|im_start|>", { special = true, bos = false }), tok:encode("<|im_end|>", { special = true, bos = false })
    assert(#a == 1 and #b == 1)
  end)
  local n_samples, n_tok = o.samples or 8, o.tokens or 128
  local per = math.max(1, math.floor((o.rows or 32) / n_samples))   -- prompts per decode
  local lines, generated = {}, 0
  local stop
  if chatml then stop = tok:encode("<|im_end|>", { special = true, bos = false }) end
  local opts = { temperature = o.temperature or 1.0, top_k = o.top_k or 50, top_p = o.top_p or 1.0, stop = stop }
  for i0 = 1, #o.prompts, per do
    local i1 = math.min(#o.prompts, i0 + per - 1)
    local rows, seeds = {}, {}
    for i = i0, i1 do
      local prompt = o.prompts[i]
      local text = chatml and ("<|im_start|>user\n" .. prompt .. "<|im_end|>\n<|im_start|>assistant\n")
                   or ("User: " .. prompt .. "\nAssistant:")
      local ids = tok:encode(text, { special = true })
      for b = 1, n_samples do
        rows[#rows + 1] = ids
        seeds[#seeds + 1] = (o.seed or 0) * 1000003 + i * 1009 + b
      end
    end
    local outs = generate_rows(o.model, rows, seeds, n_tok, opts)
    for i = i0, i1 do
      for b = 1, n_samples do
        local out = outs[(i - i0) * n_samples + b]
        generated = generated + #out
        local body = {}
        for k = 1, #out do
          if not (stop and out[k] == stop[1]) then body[#body + 1] = out[k] end
        end
        local answer = tok:decode(body, { skip_special = true })
        lines[#lines + 1] = nibble.json.encode { messages = { { role = "user", content = o.prompts[i] },
                                                              { role = "assistant", content = answer } } }
      end
      if o.progress then o.progress(i, #o.prompts, generated) end
    end
  end
  local tmp = o.out .. ".part"
  local f = io.open(tmp, "wb")
  if not f then fail("qad.teacher_samples: cannot write " .. tostring(tmp)) end
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local ok, e = os.rename(tmp, o.out)
  if not ok then fail("qad.teacher_samples: " .. tostring(e)) end
  return o.out, generated
end

-- ---- the recipe pipeline --------------------------------------------------------------------------------

local function is_interrupt(err)
  local s = tostring(err)
  return s:find("interrupted", 1, true) ~= nil or s:find("NB_ERR_INTERRUPTED", 1, true) ~= nil
end

-- loader(distill, tokenizer [, seed]): the training rows: distill.data (a file or a list; text, JSONL
-- or JSON; "<|endoftext|>" separates documents when the text has it), rows of seq_len from a seeded
-- random offset, shuffled every epoch, batch rows per micro-batch (short last batches dropped);
-- pack = false: one document per row from its start (BOS first), cut at seq_len, the rest padded and masked.
-- Plain-text documents are marked as the tokenizer marks them, as HF's tokenizer(text) per document does
-- before packing: BOS when its config has add_bos_token, EOS when add_eos_token; a tokenizer that adds
-- neither (GPT-2, Qwen style) gets EOS between documents, the <|endoftext|> such models are pretrained
-- with. An EOS a model never saw in pretraining is out of distribution, and the student then learns the
-- teacher's confusion after it: stories260K (llama2.c, BOS-only streams) distilled on rows with an EOS
-- after every story stalls at KLD 0.029, 0.024 without (bench/README.md). d.eos = true/false overrides
-- (Lua API; recipes do not have the key); JSON records keep data.h's rule (the answer's EOS is a target).
function Q.loader(d, tok, seed)
  local data = nibble.data
  if not d.data then
    error("recipe: distill.data is missing (the text QAD distils on; e.g. the calibration data)", 0)
  end
  local opts = { tokenizer = tok, text_field = d.text_field, chat_template = d.chat_template }
  local first = type(d.data) == "table" and d.data[1] or d.data
  local plain = not tostring(first):match("%.jsonl?$") and not tostring(first):match("%.ndjson$")
  if d.separator then
    opts.separator = d.separator
  elseif plain then
    local f = io.open(first, "rb")
    local head = f and f:read(65536)
    if f then f:close() end
    if head and head:find("<|endoftext|>", 1, true) then opts.separator = "<|endoftext|>" end
  end
  if d.eos ~= nil then
    opts.eos = d.eos
  elseif plain and type(tok) == "table" and tok.add_bos ~= nil then
    opts.eos = tok.add_eos or not tok.add_bos
  end
  local ds = data.load(d.data, opts)
  return data.loader(ds, { seq_len = tonumber(d.seq_len) or loader_defaults.seq_len,
                           batch = tonumber(d.batch) or loader_defaults.batch,
                           seed = tonumber(d.seed or seed or 0), random_offset = d.pack ~= false, shuffle = true,
                           pack = d.pack ~= false, drop_last = true })
end

-- train(run, o): the training loop of a run until its last step: o.record(t) gets every metrics table
-- (and eval rows), a progress line on stderr unless o.quiet (o.tty forces its style), a checkpoint every
-- o.checkpoint_every steps in o.checkpoint_dir, o.eval() (-> {ppl, kld, top1}) every o.eval_every steps.
-- o.checkpoint_final: also a checkpoint of the last step (keeping the one before), so resume = true on a
-- finished run is a no-op; it is skipped when the run was restored at its last step already.
-- o.before_save() runs before every checkpoint (qad.start_checkpoints gives the one recording settings).
-- Ctrl-C (an "interrupted" error) saves a checkpoint of the last completed step, says how to resume and
-- raises "interrupted" again (o.on_error runs first on any error). Returns {metrics = {...}, seconds}.
function Q.train(run, o)
  o = o or {}
  local record = o.record or function() end
  local every_ck, every_eval = o.checkpoint_every or 0, o.eval_every or 0
  local ckdir = o.checkpoint_dir
  if every_ck > 0 and not ckdir then fail("qad.train: checkpoint_every needs checkpoint_dir") end
  if o.checkpoint_final and not ckdir then fail("qad.train: checkpoint_final needs checkpoint_dir") end
  local progress = o.quiet and function() end or Q.progress(run.steps, { tty = o.tty })
  local t_train = now()
  local history = {}
  local start = run:step_count()
  local function save()
    if o.before_save then o.before_save() end
    run:save(ckdir)
  end
  -- A completed step and its metrics row go together: Ctrl-C is held until both are done, so the
  -- checkpoint saved on an interrupt never holds a step whose row was not recorded.
  local step_recorded = nibble.critical(function()
    local m = run:step()
    m.elapsed = now() - t_train
    history[#history + 1] = m
    record(m)
    progress(m)
    return m
  end)
  local ok, err = pcall(function()
    while not run:done() do
      local m = step_recorded()
      if every_ck > 0 and m.step % every_ck == 0 and not run:done() then save() end
      if o.eval and every_eval > 0 and m.step % every_eval == 0 and not run:done() then
        local e = o.eval()
        record { step = m.step, eval_ppl = e.ppl, eval_kld = e.kld, eval_top1 = e.top1 }
        if not o.quiet then
          io.stderr:write(("\neval at step %d: PPL %.4f, KLD %.5f, top-1 %.2f%%\n"):format(m.step, e.ppl, e.kld, e.top1))
        end
      end
    end
    if o.checkpoint_final and run:step_count() > start then save() end
  end)
  if not ok then
    if o.on_error then o.on_error(err) end
    if is_interrupt(err) and ckdir then
      C.nb_ctx_clear_interrupt(ctx())
      save()
      io.stderr:write(("\nqad: interrupted; checkpoint of step %d saved in %s (run again with resume=true)\n"):format(
        run:step_count(), ckdir))
      error("interrupted", 0)
    end
    error(err, 0)
  end
  return { metrics = history, seconds = now() - t_train }
end

-- run(recipe [, args [, opts]]): PTQ, then QAD, then export and the eval table. opts: quiet, dry_run
-- (check the recipe, files and settings: preflight; no compute), teacher / model (loaded models to
-- use), tty (force the progress style). Returns {recipe, plan, qmodel, model, teacher, run, evals,
-- metrics, export_dir, seconds, steps}.
function Q.run(r, args, opts)
  opts = opts or {}
  local log = logger(opts.quiet)
  local t_start = now()
  r = ptq.prepare(r, args)
  local pre = G.preflight(r, opts)   -- every check before any compute
  local d, cfg, ckdir = r.distill, pre.config, pre.checkpoint_dir
  local export = r.export or {}
  local ev = r.eval or {}
  local eval_data = ev.data or d.eval_data
  local mpath = r.model and r.model.path
  local tpath = (r.model and r.model.teacher) or mpath
  local every_ck = num(d, "checkpoint_every", "distill", true, 0) or 0
  local every_eval = num(d, "eval_every", "distill", true, 0) or 0
  local result = { recipe = r, config = cfg, checkpoint_dir = ckdir, steps = tonumber(cfg.steps), plan = pre.plan }
  if opts.dry_run then return result end
  -- a second run given the same checkpoint folder is refused now, before any compute
  local lock = ckdir and Q.lock(ckdir) or nil

  -- models: the teacher stays as loaded; the student is quantized (PTQ without export)
  local teacher = opts.teacher or ptq.load_model(tpath)
  local student = opts.model or ptq.load_model(mpath)
  if teacher == student then error("qad: the teacher and the student must be two loads of the model", 0) end
  local pres = ptq.run(r, nil, { model = student, no_export = true, quiet = opts.quiet })
  local qm = pres.qmodel
  result.plan, result.qmodel, result.model, result.teacher = pres.plan, qm, student, teacher

  local tok = student:tokenizer()
  local loader = Q.loader(d, tok, r.seed)
  log("qad: %d steps of %d x %d tokens x %d accumulation on %s (%d rows per epoch), lr %s -> %s, warmup %d, %s",
      tonumber(cfg.steps), loader.batch, loader.seq_len, tonumber(cfg.grad_accum), tostring(d.data),
      loader.rows_per_epoch, gnum(cfg.lr), gnum(cfg.min_lr), tonumber(cfg.warmup), Q.loss_text(cfg))
  local eval_tokens
  if eval_data then eval_tokens = tok:encode_tokens(nibble.data.read_text(eval_data, "qad: eval data")) end
  local eopts = { ctx = tonumber(ev.ctx) or 512, chunks = tonumber(ev.chunks) }

  local run = Q.new { teacher = teacher, student = qm, loader = loader, config = cfg }
  result.run = run
  local resumed = false
  if pre.resume then
    if pre.latest then
      local step = run:restore(ckdir)
      resumed = true
      log("qad: resumed from %s at step %d%s", pre.latest, step,
          step >= tonumber(cfg.steps) and " (the last step: nothing to train)" or "")
    else
      log("qad: resume = true but %s holds no checkpoint: starting at step 0", tostring(ckdir))
    end
  end
  local before_save = Q.start_checkpoints(ckdir, pre.settings, pre.latest, resumed, log)

  local mfile
  if d.metrics then
    if resumed then
      local kept, dropped = Q.cut_metrics(d.metrics, run:step_count(), tonumber(cfg.steps))
      if dropped > 0 then
        log("qad: %s cut back to the checkpoint's step %d (%d rows kept, %d dropped)", d.metrics, run:step_count(),
            kept, dropped)
      end
    end
    mfile = io.open(d.metrics, resumed and "ab" or "wb")
    if not mfile then error("qad: cannot write metrics file " .. tostring(d.metrics), 0) end
  end
  local function record(t)
    if mfile then
      mfile:write(Q.json_line(t), "\n")
      mfile:flush()
    end
  end

  local evals = {}
  result.evals = evals
  if eval_tokens then
    log("eval: %s, %d tokens, ctx %d%s", eval_data, tonumber(eval_tokens.n), eopts.ctx,
        eopts.chunks and (", " .. eopts.chunks .. " chunks") or "")
    evals.teacher = Q.evaluate(teacher, eval_tokens, nil, eopts)
    if not resumed then
      evals.ptq = Q.evaluate(student, eval_tokens, teacher, eopts)
      record { step = 0, eval_ppl = evals.ptq.ppl, eval_kld = evals.ptq.kld, eval_top1 = evals.ptq.top1 }
      log("eval: teacher PPL %.4f; PTQ PPL %.4f, KLD %.5f, top-1 %.2f%%", evals.teacher.ppl, evals.ptq.ppl,
          evals.ptq.kld, evals.ptq.top1)
    else
      evals.ptq = d.metrics and Q.step0_eval(d.metrics) or nil   -- the PTQ row of the first run, if recorded
    end
  end

  local trained = Q.train(run, { record = record, checkpoint_every = every_ck, checkpoint_dir = ckdir,
                                  checkpoint_final = ckdir ~= nil and (every_ck > 0 or resumed),
                                  before_save = before_save,
                                  eval_every = every_eval, quiet = opts.quiet, tty = opts.tty,
                                  eval = eval_tokens and function() return Q.evaluate(student, eval_tokens, teacher, eopts) end,
                                  on_error = function() if mfile then mfile:close() end end })
  result.metrics, result.train_seconds = trained.metrics, trained.seconds

  if eval_tokens then
    evals.qad = Q.evaluate(student, eval_tokens, teacher, eopts)
    record { step = run:step_count(), eval_ppl = evals.qad.ppl, eval_kld = evals.qad.kld, eval_top1 = evals.qad.top1 }
  end
  if mfile then mfile:close() end

  -- export through the normal path: the scales the student trained with
  local t0 = now()
  result.skipped, result.nonfinite = qm:export(export.dir, { layout = export.layout or "modelopt",
                                           allow_uncalibrated = r.allow_uncalibrated, allow_nonfinite = r.allow_nonfinite,
                                           max_shard_size = export.max_shard_size, dtype = export.dtype })
  ptq.report_nonfinite(result.nonfinite)
  result.export_dir = export.dir
  log("export: %s (%s layout) in %.1f s", export.dir, export.layout or "modelopt", now() - t0)
  if eval_tokens and not opts.quiet then
    local rows = { { name = "teacher", ppl = evals.teacher.ppl } }
    if evals.ptq then rows[#rows + 1] = { name = "PTQ", ppl = evals.ptq.ppl, kld = evals.ptq.kld, top1 = evals.ptq.top1 } end
    rows[#rows + 1] = { name = "QAD", ppl = evals.qad.ppl, kld = evals.qad.kld, top1 = evals.qad.top1 }
    io.stdout:write(Q.table_text(rows), "\n")
  end
  result.seconds = now() - t_start
  if lock then lock.release() end
  return result
end

-- Loops that end in C calls which may run Lua hooks must not be compiled.
for _, f in ipairs({ Q.run, Q.train, Q.sample_batch, Q.teacher_samples, Run.step, Run.micro_step }) do
  if jit and jit.off then jit.off(f, true) end
end

return Q

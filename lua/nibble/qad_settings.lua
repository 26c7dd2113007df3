-- nibble.qad_settings: the one list of QAD settings. Each row names a setting once (its key for
-- `nibble qad --key V` and `nibble run recipes/qad.lua key=V`, where it goes in a recipe, its type,
-- default, range and doc), and everything else is read from it: the keys a recipe's `distill` table
-- may have (nibble.recipe), the checks and the nb_qad_cfg of nibble.qad.config, what a resume must
-- share with its checkpoints (nibble.qad_guard; the nb_qad_cfg fields under the names
-- nb_qad_settings_text gives them in libnibble's checkpoints), the recipe that `nibble qad` and
-- recipes/qad.lua build, and their --help. Plain data: this module requires nothing.
--
-- Row fields:
--   name     the command's key (key=V, --key V); nil for recipe-only keys
--   key      where it goes in a recipe ("distill.lr", "model.path", "seed"); nil for command-only ones
--   type     "int" | "number" | "bool" | "string" | "path" | "choice" (one of `values`)
--   default  the command's default (a function of the values read so far when it depends on them);
--            a recipe's distill table that leaves a cfg key out gets libnibble's nb_qad_cfg_init value
--   min      the least value (numbers); above = true: the value must be more than min
--   cfg      the nb_qad_cfg field it sets ("lr", "loss.temperature"); loss = true: through nibble.distill
--   resume   a resumed run must have the same value: "cfg" (the nb_qad_cfg field: libnibble records it in
--            every checkpoint, under the row's name, through core/src/qad/qad_settings.inc, which
--            S.c_include() writes from this list) or "loader" (the distill table's value, which
--            nibble.qad_guard records in run-settings.json); c_unless = v: recorded only when not v (a
--            setting added later: checkpoints written before it existed still resume)
--   doc      one line for --help (meta: the value's name there, when not the type's)
local S = {}

local function steps_20(v) return math.floor((v.steps or 200) / 20) end

S.list = {
  -- what to read and where to write
  { name = "model", key = "model.path", type = "path", doc = "the model to quantize (Hugging Face folder or GGUF); required" },
  { name = "teacher", key = "model.teacher", type = "path", doc = "the teacher (default: the model itself)" },
  { name = "data", key = "distill.data", type = "path", doc = "the text QAD distils on (text, JSONL or JSON); required" },
  { name = "out", key = "export.dir", type = "path", doc = "the export folder; required" },
  { name = "format", type = "string", meta = "FORMAT", default = "nvfp4_w4a16", doc = "the preset every linear layer gets (recipes/units/FORMAT)" },
  { name = "algorithm", key = "algorithm", type = "choice", values = { "max", "mse", "four_over_six" },
    doc = "the PTQ calibration algorithm (default max)" },
  { name = "eval_data", key = "distill.eval_data", type = "path", doc = "text of the teacher / PTQ / QAD eval table" },
  -- the loss (nb_distill_cfg, through nibble.distill.config)
  { name = "kd", key = "distill.loss", type = "choice", values = { "kl", "reverse_kl", "topk" }, default = "kl",
    loss = true, cfg = "loss.kd", resume = "cfg", doc = "KL(teacher||student), reverse KL, or KL over the teacher's top k" },
  { name = "temperature", key = "distill.temperature", type = "number", min = 0, above = true, default = 1, loss = true,
    cfg = "loss.temperature", resume = "cfg", doc = "distillation temperature" },
  { name = "t2", key = "distill.t2", type = "bool", loss = true, cfg = "loss.t2_scale", resume = "cfg",
    doc = "scale the KD term by T^2" },
  { name = "topk", key = "distill.topk", type = "int", min = 0, loss = true, cfg = "loss.top_k", resume = "cfg",
    doc = "k of kd=topk (default 64)" },
  { key = "distill.top_k", type = "int", min = 0, loss = true, doc = "topk's other spelling (recipes)" },
  { name = "topk_norm", key = "distill.topk_norm", type = "choice", values = { "renorm", "student_full", "ghost" },
    loss = true, cfg = "loss.topk_norm", resume = "cfg", doc = "how top-k KL normalizes (default renorm)" },
  { name = "lm_loss", key = "distill.lm_loss", type = "bool", default = false, loss = true, cfg = "loss.lm_loss",
    resume = "cfg", doc = "add the cross-entropy on the data: loss = CE + kd_loss_scale * KD" },
  { name = "kd_loss_scale", key = "distill.kd_loss_scale", type = "number", min = 0, loss = true,
    cfg = "loss.kd_loss_scale", resume = "cfg", doc = "the KD term's weight beside lm_loss" },
  { name = "ignore_index", key = "distill.ignore_index", type = "int", loss = true, cfg = "loss.ignore_index",
    resume = "cfg", doc = "target id that counts no loss (default -100)" },
  -- the training run (nb_qad_cfg)
  { name = "steps", key = "distill.steps", type = "int", min = 1, default = 200, cfg = "steps", resume = "cfg",
    doc = "optimizer steps" },
  { name = "lr", key = "distill.lr", type = "number", min = 0, default = 1e-5, cfg = "lr", resume = "cfg",
    doc = "peak learning rate" },
  { name = "min_lr", key = "distill.min_lr", type = "number", min = 0, default = 0, cfg = "min_lr", resume = "cfg",
    doc = "the cosine's floor" },
  { name = "warmup", key = "distill.warmup", type = "int", min = 0, default = steps_20, cfg = "warmup", resume = "cfg",
    doc = "linear warmup steps (default steps/20)" },
  { name = "grad_accum", key = "distill.grad_accum", type = "int", min = 1, default = 1, cfg = "grad_accum", resume = "cfg",
    doc = "micro-batches per optimizer step" },
  { name = "clip", key = "distill.clip", type = "number", default = 1, cfg = "clip", resume = "cfg",
    doc = "max global gradient norm (<= 0: no clipping)" },
  { name = "weight_decay", key = "distill.weight_decay", type = "number", min = 0, cfg = "weight_decay", resume = "cfg",
    doc = "AdamW weight decay of 2-D weights (default 0)" },
  { name = "beta1", key = "distill.beta1", type = "number", cfg = "beta1", resume = "cfg", doc = "AdamW beta1 (default 0.9)" },
  { name = "beta2", key = "distill.beta2", type = "number", cfg = "beta2", resume = "cfg", doc = "AdamW beta2 (default 0.999)" },
  { name = "eps", key = "distill.eps", type = "number", cfg = "eps", resume = "cfg", doc = "AdamW epsilon (default 1e-8)" },
  { name = "sft_mask", key = "distill.sft_mask", type = "bool", default = true, cfg = "sft_mask", resume = "cfg",
    doc = "count only the data's masked-in tokens (the assistant turns of chat data)" },
  { name = "recalibrate", key = "distill.recalibrate", type = "int", min = 0, default = 0, cfg = "recalibrate",
    resume = "cfg", doc = "re-run the weight calibration every N steps (0: scales frozen)" },
  { name = "lr_scale_unquantized", key = "distill.lr_scale_unquantized", type = "number", min = 0, default = 1,
    cfg = "lr_scale_unquantized", resume = "cfg", c_unless = 1, doc = "lr multiplier of the parameters left in full precision" },
  -- rows of training data and calibration
  { name = "seq_len", key = "distill.seq_len", type = "int", min = 1, default = 512, resume = "loader",
    doc = "tokens per training row; at most the model's max_position_embeddings" },
  { name = "batch", key = "distill.batch", type = "int", min = 1, default = 8, resume = "loader", doc = "rows per micro-batch" },
  { name = "calib", key = "calibration.data", type = "path",
    doc = "calibration text of formats that quantize activations (default: data)" },
  { name = "calib_seq_len", key = "calibration.seq_len", type = "int", min = 1,
    default = function(v) return v.seq_len or 512 end, doc = "tokens per calibration row (default seq_len)" },
  { name = "samples", key = "calibration.samples", type = "int", min = 1, default = 128, doc = "calibration rows" },
  -- reading the training data
  { name = "pack", key = "distill.pack", type = "bool", resume = "loader",
    doc = "pack documents into rows (default true; false: one document per row, padded)" },
  { name = "eos", key = "distill.eos", type = "bool", resume = "loader",
    doc = "EOS after every plain-text document (default: as the tokenizer marks them)" },
  { name = "separator", key = "distill.separator", type = "string", resume = "loader",
    doc = "text that separates documents (default <|endoftext|> when the text has it)" },
  { name = "text_field", key = "distill.text_field", type = "string", resume = "loader", doc = "JSON records' text field" },
  { key = "distill.chat_template", type = "string", doc = "auto | chatml | plain | model (nibble.data.load)" },
  { key = "distill.seed", type = "int", doc = "the loader's seed (default: the recipe's seed)" },
  -- export, eval, checkpoints
  { name = "layout", key = "export.layout", type = "choice", values = { "modelopt", "compressed-tensors" },
    default = "modelopt", doc = "the export layout" },
  { name = "dtype", key = "export.dtype", type = "choice", values = { "bf16", "f16", "f32" },
    doc = "the exported unquantized tensors (default: the source's if BF16/F16, else bf16)" },
  { name = "metrics", key = "distill.metrics", type = "path", doc = "a JSONL file of every step's metrics" },
  { name = "checkpoint_every", key = "distill.checkpoint_every", type = "int", min = 0, default = 0,
    doc = "a checkpoint every N steps" },
  { name = "checkpoint_dir", key = "distill.checkpoint_dir", type = "path", doc = "checkpoints (default OUT-checkpoints)" },
  { name = "resume", key = "distill.resume", type = "bool", default = false,
    doc = "continue the run of checkpoint_dir bit for bit (refused when a setting changed)" },
  { name = "overwrite", key = "distill.overwrite", type = "bool", default = false,
    doc = "start again over checkpoint_dir's checkpoints (removes them)" },
  { name = "eval_every", key = "distill.eval_every", type = "int", min = 0, default = 0, doc = "an eval every N steps" },
  { name = "ctx", key = "eval.ctx", type = "int", min = 2, default = 512, doc = "eval tokens per chunk" },
  { name = "chunks", key = "eval.chunks", type = "int", min = 0, doc = "eval chunks (default: the whole eval text)" },
  { name = "seed", key = "seed", type = "int", default = 1, doc = "the seed of data order and calibration offsets" },
  { name = "allow_long", key = "distill.allow_long", type = "bool", default = false,
    doc = "allow seq_len beyond the model's max_position_embeddings" },
}

S.by_name, S.by_key = {}, {}
for _, s in ipairs(S.list) do
  if s.name then S.by_name[s.name] = s end
  if s.key then S.by_key[s.key] = s end
end

-- names(): the command's keys, in list order.
function S.names()
  local out = {}
  for _, s in ipairs(S.list) do if s.name then out[#out + 1] = s.name end end
  return out
end

-- section(sec): the set of keys a recipe's `sec` table may have that rows of the list put there
-- ({lr = row, ...} for "distill").
function S.section(sec)
  local out = {}
  for _, s in ipairs(S.list) do
    local k = s.key and s.key:match("^" .. sec .. "%.([%w_]+)$")
    if k then out[k] = s end
  end
  return out
end

-- read(get [, where [, name_of]]): the command's values from strings (get(name) -> string or nil: a
-- key=value argument, an option), each converted by its row's type (a number "<where>: k must be a
-- number, got 'x'", where k is name_of(name) when given ("--seq-len"), a bool
-- "... must be true or false, got 'x'", a choice "... must be a, b or c, got 'x'"), defaults filled in
-- list order. Values that are already numbers or booleans are taken as they are. Ranges are checked
-- where the recipe's values are (nibble.qad.config, the preflight), so both ways in say the same.
function S.read(get, where, name_of)
  local v = {}
  local pre = where and (where .. ": ") or ""
  for _, s in ipairs(S.list) do
    if s.name then
      local x = get(s.name)
      local shown = name_of and name_of(s.name) or s.name
      if x ~= nil and (s.type == "int" or s.type == "number") and type(x) ~= "number" then
        local n = tonumber(x)
        if not n or n ~= n or n == math.huge or n == -math.huge then
          error(string.format("%s%s must be a number, got '%s'", pre, shown, tostring(x)), 0)
        end
        x = n
      elseif x ~= nil and s.type == "bool" and type(x) ~= "boolean" then
        if x == "true" or x == "1" then x = true
        elseif x == "false" or x == "0" then x = false
        else error(string.format("%s%s must be true or false, got '%s'", pre, shown, tostring(x)), 0) end
      elseif x ~= nil and s.type == "choice" then
        local ok = false
        for _, c in ipairs(s.values) do if c == x then ok = true end end
        if not ok then
          error(string.format("%s%s must be %s or %s, got '%s'", pre, shown,
            table.concat(s.values, ", ", 1, #s.values - 1), s.values[#s.values], tostring(x)), 0)
        end
      end
      if x == nil and s.default ~= nil then
        if type(s.default) == "function" then x = s.default(v) else x = s.default end
      end
      v[s.name] = x
    end
  end
  return v
end

-- c_include(): the text of core/src/qad/qad_settings.inc, libnibble's view of the "cfg" rows in list
-- order: NB_QAD_SETTING(name, nb_qad_cfg field, INT | REAL) for each, NB_QAD_SETTING_UNLESS(name, field,
-- kind, value) for those recorded only when not value. nb_qad_settings_text writes a checkpoint's
-- settings from it, and tests/lua/qad_settings_spec.lua holds the committed file to this text.
function S.c_include()
  local out = { "/* The QAD settings libnibble records in a checkpoint and a resume compares, in order: written by\n"
                .. " * nibble.qad_settings.c_include() from the one list of QAD settings (lua/nibble/qad_settings.lua);\n"
                .. " * edit that list, then regenerate this file (tests/lua/qad_settings_spec.lua says how). */\n" }
  for _, s in ipairs(S.list) do
    if s.resume == "cfg" then
      local kind = s.type == "number" and "REAL" or "INT"
      if s.c_unless ~= nil then
        out[#out + 1] = ("NB_QAD_SETTING_UNLESS(%s, %s, %s, %s)\n"):format(s.name, s.cfg, kind, tostring(s.c_unless))
      else
        out[#out + 1] = ("NB_QAD_SETTING(%s, %s, %s)\n"):format(s.name, s.cfg, kind)
      end
    end
  end
  return table.concat(out)
end

-- help(style [, extra]): the command's keys with their docs, one per line: style "option"
-- ("  --steps N  ...") or "key" ("  steps=N  ..."); extra: more {left, doc} rows to align with them.
local meta = { int = "N", number = "X", bool = "true|false", string = "TEXT", path = "PATH" }
local function shown(x)
  if type(x) == "number" then return (("%.10g"):format(x):gsub("e([%-+])0*(%d)", "e%1%2")) end
  return tostring(x)
end
function S.help(style, extra)
  local rows = {}
  for _, s in ipairs(S.list) do
    if s.name then
      local val = s.meta or (s.type == "choice" and table.concat(s.values, "|")) or meta[s.type]
      local left = style == "option" and ("--" .. s.name:gsub("_", "-") .. " " .. val) or (s.name .. "=" .. val)
      local d = s.default
      local dflt = (type(d) == "number" or type(d) == "boolean" or type(d) == "string") and not s.doc:find("%(default")
        and (" (default " .. shown(d) .. ")") or ""
      rows[#rows + 1] = { left, s.doc .. dflt }
    end
  end
  for _, r in ipairs(extra or {}) do rows[#rows + 1] = r end
  local w = 24   -- a longer left part puts its doc on the next line
  local out = {}
  for _, r in ipairs(rows) do
    if #r[1] > w then
      out[#out + 1] = ("  %s\n  %s  %s\n"):format(r[1], (" "):rep(w), r[2])
    else
      out[#out + 1] = ("  %-" .. w .. "s  %s\n"):format(r[1], r[2])
    end
  end
  return table.concat(out)
end

return S

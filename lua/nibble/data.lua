-- nibble.data: calibration and distillation data (nibble/data.h) from Lua. A dataset is a file (or
-- several) tokenized once into one stream with a loss mask; a loader cuts it into rows of seq_len
-- from a seeded offset and hands out batches of tensors; its cursor is a plain table a checkpoint
-- can store (JSON-safe: 64-bit values are hex strings).
--   local data = nibble.data
--   local ds = data.load("calib.jsonl", { tokenizer = tok })          -- text / JSONL / JSON array
--   local ld = ds:loader { seq_len = 2048, batch = 8, samples = 512, random_offset = true, seed = 1 }
--   for b in ld:epoch() do model:forward(b.tokens) ... b.targets, b.mask end
--   local st = ld:state() ... ld:restore(st)                           -- resumes the same batches
-- The document, template and masking rules are those of data.h (read it: they are the contract).
local ffi = require("ffi")
local bit = require("bit")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local M = {}
local Dataset, Loader = {}, {}
Dataset.__index = Dataset
Loader.__index = Loader

-- ---- helpers --------------------------------------------------------------------------------------

local function ctx() return nibble.context() end

local function hex64(v) return "0x" .. bit.tohex(ffi.cast("uint64_t", v), 16) end

local function parse_u64(v, what)
  if type(v) == "number" then
    if v < 0 or v % 1 ~= 0 or v >= 2 ^ 64 then fail(("%s must be an integer in [0, 2^64), got %s"):format(what, tostring(v))) end
    if v >= 2 ^ 53 then fail(("%s %s is beyond 2^53: give it as a hex string"):format(what, tostring(v))) end
    return ffi.new("uint64_t", v)
  end
  if type(v) == "cdata" then return ffi.cast("uint64_t", v) end
  if type(v) == "string" then
    local h = v:match("^0[xX](%x+)$")
    if not h or #h > 16 then fail(("%s: %q is not a hex uint64 (0x...)"):format(what, v)) end
    local r = ffi.new("uint64_t", 0)
    for i = 1, #h do r = r * 16 + tonumber(h:sub(i, i), 16) end
    return r
  end
  fail(("%s must be a number or a hex string, got %s"):format(what, type(v)))
end

local function tok_ptr(t)
  if t == nil then fail("data: a tokenizer is needed (opts.tokenizer: a nibble.tokenizer or a path)") end
  if type(t) == "string" then t = nibble.tokenizer.load(t) end
  if type(t) == "table" then
    local p = rawget(t, "_p")
    if p == nil then fail("data: the tokenizer was freed") end
    return p, t
  end
  if type(t) == "cdata" then return ffi.cast("const nb_tokenizer *", t), t end
  fail("data: opts.tokenizer must be a nibble.tokenizer, a path or an nb_tokenizer pointer, got " .. type(t))
end

local function check_keys(t, allowed, what)
  for k in pairs(t) do
    if not allowed[k] then
      local names = {}
      for n in pairs(allowed) do names[#names + 1] = n end
      table.sort(names)
      fail(("%s: unknown option '%s' (one of %s)"):format(what, tostring(k), table.concat(names, ", ")))
    end
  end
end

local function enum_of(map, v, what)
  if v == nil then return 0 end
  local e = map[v]
  if e == nil then
    local names = {}
    for n in pairs(map) do names[#names + 1] = n end
    table.sort(names)
    if map == templates then names[#names + 1] = "model" end
    fail(("%s: unknown value %s (one of %s)"):format(what, tostring(v), table.concat(names, ", ")))
  end
  return e
end

local function flag(v, dflt, what)
  if v == nil then return dflt end
  if v == true or v == 1 then return 1 end
  if v == false or v == 0 then return 0 end
  fail(("%s must be a boolean, got %s"):format(what, tostring(v)))
end

local function int(v, dflt, what)
  if v == nil then return dflt end
  if type(v) ~= "number" or v % 1 ~= 0 then fail(("%s must be an integer, got %s"):format(what, tostring(v))) end
  return v
end

local formats = { auto = C.NB_DATA_FORMAT_AUTO, text = C.NB_DATA_TEXT, txt = C.NB_DATA_TEXT, jsonl = C.NB_DATA_JSONL,
                  json = C.NB_DATA_JSON }
local splits = { blank = C.NB_SPLIT_BLANK_LINE, blank_line = C.NB_SPLIT_BLANK_LINE, whole = C.NB_SPLIT_WHOLE,
                 line = C.NB_SPLIT_LINE, lines = C.NB_SPLIT_LINE, separator = C.NB_SPLIT_SEPARATOR }
local templates = { auto = C.NB_CHAT_AUTO, chatml = C.NB_CHAT_CHATML, plain = C.NB_CHAT_PLAIN }
local data_keys = { tokenizer = true, format = true, split = true, separator = true, text_field = true,
                    chat_template = true, bos = true, eos = true, special = true, max_tokens = true }

-- Options -> nb_data_opts. Returns the struct, the tokenizer pointer and a table of Lua values
-- (strings, the tokenizer) that must stay alive while C reads the struct.
local function data_opts(opts, what)
  opts = opts or {}
  if type(opts) ~= "table" then fail(what .. ": options must be a table") end
  check_keys(opts, data_keys, what)
  local o = ffi.new("nb_data_opts")
  C.nb_data_opts_init(o)
  local keep = {}
  o.format = enum_of(formats, opts.format, what .. ": format")
  o.split = enum_of(splits, opts.split, what .. ": split")
  -- "model": records with messages are rendered by the tokenizer's own chat template, in Lua (see
  -- add_file); the C reader sees only the other records
  if opts.chat_template ~= "model" then
    o.chat_template = enum_of(templates, opts.chat_template, what .. ": chat_template")
  end
  if opts.separator ~= nil then
    if type(opts.separator) ~= "string" then fail(what .. ": separator must be a string") end
    keep[#keep + 1] = opts.separator
    o.separator = opts.separator
  end
  if opts.text_field ~= nil then
    if type(opts.text_field) ~= "string" then fail(what .. ": text_field must be a string") end
    keep[#keep + 1] = opts.text_field
    o.text_field = opts.text_field
  end
  o.add_bos = opts.bos == nil and -1 or flag(opts.bos, -1, what .. ": bos")
  o.add_eos = opts.eos == nil and -1 or flag(opts.eos, -1, what .. ": eos")
  o.parse_special = flag(opts.special, 0, what .. ": special")
  o.max_tokens = int(opts.max_tokens, 0, what .. ": max_tokens")
  local tp, tobj = tok_ptr(opts.tokenizer)
  keep[#keep + 1] = tobj
  return o, tp, keep
end

-- ---- datasets -------------------------------------------------------------------------------------

local function wrap_dataset(p)
  nibble.note_native()
  return setmetatable({ _p = ffi.gc(p, C.nb_dataset_release) }, Dataset)
end

local function dp(ds)
  local p = rawget(ds, "_p")
  if p == nil then fail("dataset was freed") end
  return p
end

-- new(): an empty dataset (add documents with add_file / add_text / add / add_json / add_tokens).
function M.new()
  local out = ffi.new("nb_dataset *[1]")
  check(C.nb_dataset_new(ctx(), out))
  return wrap_dataset(out[0])
end

-- load(path or {paths...}, opts): the documents of one or more files, in order. opts: tokenizer
-- (required), format ("auto" | "text" | "jsonl" | "json"), split ("blank" | "whole" | "line" |
-- "separator"), separator ("<|endoftext|>"), text_field ("text"), chat_template ("auto" | "chatml" |
-- "plain" | "model": the tokenizer's own chat template for records with messages, see chat_tokens), bos / eos (booleans; default: BOS as the tokenizer says, EOS after every document),
-- special (parse special-token text), max_tokens (stop after the document that reaches it).
function M.load(paths, opts)
  local ds = M.new()
  if type(paths) == "string" then paths = { paths } end
  if type(paths) ~= "table" or #paths == 0 then fail("data.load: expected a path or a list of paths") end
  for _, p in ipairs(paths) do ds:add_file(p, opts) end
  return ds
end

-- read_text(path [, who]): the bytes of a text file, for callers that tokenize a whole file themselves
-- (eval data); refuses a binary one as add_file does (nb_data_check_text: a NUL byte).
function M.read_text(path, who)
  if type(path) ~= "string" then fail((who or "read_text") .. ": expected a path, got " .. type(path)) end
  local f, e = io.open(path, "rb")
  if not f then fail((who or "read_text") .. ": cannot open " .. path .. ": " .. tostring(e)) end
  local s = f:read("*a")
  f:close()
  if not s then fail((who or "read_text") .. ": cannot read " .. path) end
  check(C.nb_data_check_text(ctx(), path, s, #s))
  return s
end

-- ---- the model's chat template ---------------------------------------------------------------------

-- chat_tokens(tok, messages): the ids and mask of a conversation rendered by the tokenizer's chat template,
-- as transformers' apply_chat_template(tokenize=True) writes it (the template's BOS and end-of-turn tokens,
-- nothing added). Mask: for each assistant message i, the text the template adds between the first i - 1
-- messages with the generation prompt and the first i messages (the answer and its end of turn); its
-- token boundaries follow data.h's rule (the longest common prefix of the encoding of the text before a
-- boundary with the encoding of the whole).
local function chat_tokens(tok, messages)
  if type(messages) ~= "table" then fail("messages must be a list of {role=, content=}") end
  -- JSON null fields are dropped, as transformers drops None-valued keys
  local msgs = {}
  for i, m in ipairs(messages) do
    if type(m) ~= "table" then fail(("message %d is not an object"):format(i)) end
    local c = {}
    for k, v in pairs(m) do if v ~= nibble.json.null then c[k] = v end end
    msgs[i] = c
  end
  local enc = { bos = false, special = true }
  local text = tok:apply_chat_template(msgs)
  local ids = tok:encode(text, enc)
  local mask = {}
  for k = 1, #ids do mask[k] = 0 end
  local function boundary(nbytes)
    if nbytes <= 0 then return 0 end
    if nbytes >= #text then return #ids end
    local pre = tok:encode(text:sub(1, nbytes), enc)
    local n = 0
    while n < #pre and n < #ids and pre[n + 1] == ids[n + 1] do n = n + 1 end
    return n
  end
  for i, m in ipairs(msgs) do
    if m.role == "assistant" then
      local before = { unpack(msgs, 1, i - 1) }
      local head = tok:apply_chat_template(before, { add_generation_prompt = true })
      local upto = tok:apply_chat_template({ unpack(msgs, 1, i) })
      if text:sub(1, #head) ~= head or text:sub(1, #upto) ~= upto or #upto < #head then
        fail(("the chat template renders the conversation up to message %d differently from the whole "
              .. "conversation, so the assistant's tokens cannot be masked (use chat_template = \"chatml\" or \"plain\")"):format(i))
      end
      for k = boundary(#head) + 1, boundary(#upto) do mask[k] = 1 end
    end
  end
  return ids, mask
end
M.chat_tokens = chat_tokens

-- add_file with chat_template = "model": JSON / JSONL records read here; those with messages go through
-- the tokenizer's template (chat_tokens), the others to the C reader one by one; errors name FILE:LINE.
local function add_file_model_template(ds, path, opts)
  local tok = opts.tokenizer
  if type(tok) == "string" then tok = nibble.tokenizer.load(tok) end
  if not nibble.tokenizer.is_tokenizer(tok) then
    fail("data.load: chat_template = \"model\" needs opts.tokenizer as a nibble.tokenizer or a path")
  end
  if not tok:chat_template() then
    fail(("data.load: chat_template = \"model\": the tokenizer %s has no chat template"):format(tostring(tok.path)))
  end
  local rest = {}
  for k, v in pairs(opts) do rest[k] = v end
  rest.chat_template, rest.tokenizer = nil, tok
  local low = path:lower()
  local fmt = opts.format or "auto"
  if fmt == "auto" then
    fmt = (low:match("%.jsonl$") or low:match("%.ndjson$")) and "jsonl" or low:match("%.json$") and "json" or "text"
  end
  if fmt == "text" or fmt == "txt" then return ds:add_file(path, rest) end
  local s = M.read_text(path, "data.load")
  local records = {}
  local json = nibble.json
  if fmt == "json" and s:match("^%s*%[") then
    local ok, arr = pcall(json.decode, s)
    if not ok then fail(("%s: %s"):format(path, tostring(arr):gsub("^[^\n]-:%d+: ", ""))) end
    for k, r in ipairs(arr) do records[#records + 1] = { r, ("%s: element %d"):format(path, k) } end
  else
    local line = 0
    for l in (s:sub(-1) == "\n" and s or s .. "\n"):gmatch("([^\n]*)\n") do
      line = line + 1
      if l:find("%S") then
        local ok, r = pcall(json.decode, l)
        if not ok then fail(("%s:%d: invalid JSON"):format(path, line)) end
        records[#records + 1] = { r, ("%s:%d"):format(path, line) }
      end
    end
  end
  local n0, limit = ds:n_tokens(), opts.max_tokens or 0
  for _, rw in ipairs(records) do
    local r, where = rw[1], rw[2]
    if type(r) ~= "table" then fail(where .. ": a record must be a JSON object") end
    local ok, e = pcall(function()
      if r.messages ~= nil then
        local ids, mask = chat_tokens(tok, r.messages)
        ds:add_tokens(ids, mask)
      else
        ds:add_json(json.encode(r), rest)
      end
    end)
    if not ok then fail(("%s: %s"):format(where, tostring(e):gsub("^[^\n]-%.lua:%d+: ", ""))) end
    if limit > 0 and ds:n_tokens() - n0 >= limit then break end
  end
  return ds
end

function Dataset:add_file(path, opts)
  if type(path) ~= "string" then fail("add_file: expected a path, got " .. type(path)) end
  if type(opts) == "table" and opts.chat_template == "model" then
    data_opts(opts, "data.load")   -- the same option checks
    return add_file_model_template(self, path, opts)
  end
  local o, tp, keep = data_opts(opts, "data.load")
  check(C.nb_dataset_add_file(ctx(), dp(self), tp, path, o))
  keep = nil
  nibble.note_native()
  return self
end

function Dataset:add_text(text, opts)
  if type(text) ~= "string" then fail("add_text: expected a string, got " .. type(text)) end
  local o, tp, keep = data_opts(opts, "add_text")
  check(C.nb_dataset_add_text(ctx(), dp(self), tp, text, #text, o))
  keep = nil
  return self
end

function Dataset:add_json(json, opts)
  if type(json) ~= "string" then fail("add_json: expected a JSON string, got " .. type(json)) end
  local o, tp, keep = data_opts(opts, "add_json")
  check(C.nb_dataset_add_json(ctx(), dp(self), tp, json, #json, o))
  keep = nil
  return self
end

-- add(record, opts): one record as a Lua table: {text = ...}, {prompt = ..., completion = ...} or
-- {messages = {{role = ..., content = ...}, ...}}.
function Dataset:add(record, opts)
  if type(record) ~= "table" then fail("add: expected a record table, got " .. type(record)) end
  if type(opts) == "table" and opts.chat_template == "model" and record.messages ~= nil then
    local tok = opts.tokenizer
    if type(tok) == "string" then tok = nibble.tokenizer.load(tok) end
    local ids, mask = chat_tokens(tok, record.messages)
    return self:add_tokens(ids, mask)
  end
  return self:add_json(nibble.json.encode(record), opts)
end

-- add_tokens(ids [, mask]): one document as it is (Lua tables of ids and 0/1 or booleans).
function Dataset:add_tokens(ids, mask)
  if type(ids) ~= "table" then fail("add_tokens: expected a table of ids") end
  local n = #ids
  local a = ffi.new("int32_t[?]", math.max(n, 1))
  local m = mask and ffi.new("uint8_t[?]", math.max(n, 1)) or nil
  if mask and #mask ~= n then fail(("add_tokens: %d ids but %d mask values"):format(n, #mask)) end
  for i = 1, n do
    local v = ids[i]
    if type(v) ~= "number" or v % 1 ~= 0 then fail(("add_tokens: element %d is %s, not a token id"):format(i, tostring(v))) end
    a[i - 1] = v
    if m then
      local x = mask[i]
      m[i - 1] = (x == true or x == 1) and 1 or 0
    end
  end
  check(C.nb_dataset_add_tokens(ctx(), dp(self), a, m, n))
  return self
end

function Dataset:n_tokens() return tonumber(C.nb_dataset_n_tokens(dp(self))) end
function Dataset:n_docs() return tonumber(C.nb_dataset_n_docs(dp(self))) end
function Dataset:n_masked() return tonumber(C.nb_dataset_n_masked(dp(self))) end
function Dataset:eos()
  local e = C.nb_dataset_eos(dp(self))
  return e >= 0 and tonumber(e) or nil
end
function Dataset:fingerprint() return hex64(C.nb_dataset_fingerprint(dp(self))) end

-- slice(first, last): ids and mask of stream positions first..last (1-based, inclusive) as tables.
function Dataset:slice(first, last)
  local p = dp(self)
  local n = tonumber(C.nb_dataset_n_tokens(p))
  last = last or n
  if type(first) ~= "number" or first < 1 or last > n or first > last + 1 then
    fail(("slice: %s..%s is outside 1..%d"):format(tostring(first), tostring(last), n))
  end
  local a, m = C.nb_dataset_ids(p), C.nb_dataset_mask(p)
  local ids, mask = {}, {}
  for i = first, last do
    ids[#ids + 1] = a[i - 1]
    mask[#mask + 1] = m[i - 1]
  end
  return ids, mask
end

-- doc(i): ids and mask of document i (1-based).
function Dataset:doc(i)
  local p = dp(self)
  local nd = tonumber(C.nb_dataset_n_docs(p))
  if type(i) ~= "number" or i < 1 or i > nd or i % 1 ~= 0 then
    fail(("doc: index %s is outside 1..%d"):format(tostring(i), nd))
  end
  local a, b = tonumber(C.nb_dataset_doc_start(p, i - 1)), tonumber(C.nb_dataset_doc_start(p, i))
  return self:slice(a + 1, b)
end

-- split(eval_fraction): train, eval datasets; the eval set is the last documents, about that
-- fraction of the tokens (the boundary falls between documents).
function Dataset:split(fraction)
  if type(fraction) ~= "number" then fail("split: expected a fraction in (0, 1)") end
  local a, b = ffi.new("nb_dataset *[1]"), ffi.new("nb_dataset *[1]")
  check(C.nb_dataset_split(ctx(), dp(self), fraction, a, b))
  return wrap_dataset(a[0]), wrap_dataset(b[0])
end

function Dataset:free()
  local p = rawget(self, "_p")
  if p ~= nil then
    self._p = nil
    C.nb_dataset_release(ffi.gc(p, nil))
  end
end

function Dataset:__tostring()
  if rawget(self, "_p") == nil then return "nibble.data.dataset(freed)" end
  return ("nibble.data.dataset(%d documents, %d tokens, %d masked in)"):format(self:n_docs(), self:n_tokens(),
    self:n_masked())
end

function M.is_dataset(x) return getmetatable(x) == Dataset end

-- ---- loaders --------------------------------------------------------------------------------------

local loader_keys = { seq_len = true, batch = true, samples = true, seed = true, random_offset = true, pack = true,
                      shuffle = true, wrap = true, drop_last = true, pad_id = true }

-- loader(dataset, cfg) / ds:loader(cfg). cfg: seq_len (required), batch (1), samples (0 = every row the
-- data gives), seed (0), random_offset (false), pack (true), shuffle (false), wrap (false),
-- drop_last (false), pad_id (EOS).
function M.loader(ds, cfg)
  if not M.is_dataset(ds) then fail("data.loader: expected a dataset") end
  cfg = cfg or {}
  if type(cfg) ~= "table" then fail("data.loader: the configuration must be a table") end
  check_keys(cfg, loader_keys, "data.loader")
  if cfg.seq_len == nil then fail("data.loader: seq_len is required") end
  local c = ffi.new("nb_dataloader_cfg")
  C.nb_dataloader_cfg_init(c)
  c.seq_len = int(cfg.seq_len, 0, "seq_len")
  c.batch = int(cfg.batch, 1, "batch")
  c.samples = int(cfg.samples, 0, "samples")
  c.seed = parse_u64(cfg.seed or 0, "seed")
  c.random_offset = flag(cfg.random_offset, 0, "random_offset")
  c.pack = flag(cfg.pack, 1, "pack")
  c.shuffle = flag(cfg.shuffle, 0, "shuffle")
  c.wrap = flag(cfg.wrap, 0, "wrap")
  c.drop_last = flag(cfg.drop_last, 0, "drop_last")
  c.pad_id = int(cfg.pad_id, -1, "pad_id")
  local out = ffi.new("nb_dataloader *[1]")
  check(C.nb_dataloader_new(ctx(), dp(ds), c, out))
  local p = ffi.gc(out[0], C.nb_dataloader_free)
  return setmetatable({
    _p = p,
    dataset = ds,
    seq_len = tonumber(c.seq_len),
    batch = tonumber(c.batch),
    rows_per_epoch = tonumber(C.nb_dataloader_rows_per_epoch(p)),
    batches_per_epoch = tonumber(C.nb_dataloader_batches_per_epoch(p)),
  }, Loader)
end
Dataset.loader = M.loader

local function lp(ld)
  local p = rawget(ld, "_p")
  if p == nil then fail("loader was freed") end
  return p
end

-- next(): the next batch {tokens, targets, mask (tensors [rows, seq_len]: i32, i32, u8), rows, epoch,
-- row, epoch_end}; epoch and row count from 0 as in C (they are positions in the data, not indices).
function Loader:next()
  local b = ffi.new("nb_data_batch")
  check(C.nb_dataloader_next(ctx(), lp(self), b))
  return {
    tokens = nibble.wrap(b.tokens), targets = nibble.wrap(b.targets), mask = nibble.wrap(b.mask),
    rows = tonumber(b.rows), epoch = tonumber(b.epoch), row = tonumber(b.row), epoch_end = b.epoch_end ~= 0,
  }
end

-- epoch(): an iterator over the batches up to the end of the current epoch (from the cursor).
-- At an epoch boundary it runs the whole next epoch.
function Loader:epoch()
  local done = false
  return function()
    if done then return nil end
    local b = self:next()
    done = b.epoch_end
    return b
  end
end

-- read(epoch, row, n): rows [row, row + n) of an epoch (0-based, as in state()) without moving the
-- cursor, as tensors tokens, targets, mask.
function Loader:read(epoch, row, n)
  n = n or 1
  local S = self.seq_len
  local tok = nibble.zeros("i32", n, S)
  local tgt = nibble.zeros("i32", n, S)
  local msk = nibble.zeros("u8", n, S)
  check(C.nb_dataloader_read(ctx(), lp(self), epoch, row, n, tok:data("int32_t *"), tgt:data("int32_t *"),
                             msk:data("uint8_t *")))
  return tok, tgt, msk
end

-- offset(epoch): the stream offset of that epoch's rows (0 without random_offset).
function Loader:offset(epoch) return tonumber(C.nb_dataloader_offset(lp(self), epoch or 0)) end

-- state(): the cursor as a JSON-safe table; restore(state) puts it back (on a loader over the same
-- data and configuration: anything else is an error).
function Loader:state()
  local s = ffi.new("nb_data_state")
  C.nb_dataloader_state(lp(self), s)
  return {
    epoch = tonumber(s.epoch), row = tonumber(s.row), rows_read = tonumber(s.rows_read), offset = tonumber(s.offset),
    seed = hex64(s.seed), rng = { hex64(s.rng[0]), hex64(s.rng[1]), hex64(s.rng[2]), hex64(s.rng[3]) },
    fingerprint = hex64(s.fingerprint),
  }
end

function Loader:restore(st)
  if type(st) ~= "table" or type(st.rng) ~= "table" then fail("restore: expected a table from loader:state()") end
  if st.epoch == nil or st.row == nil or st.fingerprint == nil or st.seed == nil then
    fail("restore: the state needs epoch, row, seed, rng and fingerprint (a table from loader:state())")
  end
  local s = ffi.new("nb_data_state")
  s.epoch = int(st.epoch, 0, "state.epoch")
  s.row = int(st.row, 0, "state.row")
  s.rows_read = int(st.rows_read, 0, "state.rows_read")
  s.offset = int(st.offset, 0, "state.offset")
  s.seed = parse_u64(st.seed, "state.seed")
  for i = 1, 4 do s.rng[i - 1] = parse_u64(st.rng[i], "state.rng[" .. i .. "]") end
  s.fingerprint = parse_u64(st.fingerprint, "state.fingerprint")
  check(C.nb_dataloader_restore(ctx(), lp(self), s))
  return self
end

function Loader:free()
  local p = rawget(self, "_p")
  if p ~= nil then
    self._p = nil
    C.nb_dataloader_free(ffi.gc(p, nil))
  end
end

function Loader:__tostring()
  if rawget(self, "_p") == nil then return "nibble.data.loader(freed)" end
  local s = self:state()
  return ("nibble.data.loader(seq_len %d, batch %d, %d rows per epoch; at epoch %d row %d)"):format(self.seq_len,
    self.batch, self.rows_per_epoch, s.epoch, s.row)
end

function M.is_loader(x) return getmetatable(x) == Loader end

-- offset(seed, epoch, seq_len): the random offset rule of data.h without a dataset.
function M.offset(seed, epoch, seq_len)
  return tonumber(C.nb_data_offset(parse_u64(seed, "seed"), epoch or 0, seq_len))
end

-- ---- recipes --------------------------------------------------------------------------------------

-- from_recipe(section, tokenizer [, seed]): a loader for a recipe's `calibration` (or `distill`)
-- table: data (a path or a list), seq_len, samples, batch, pack, random_offset, seed (falls back to
-- the given recipe seed), text_field; also separator, split, chat_template, shuffle, wrap, drop_last
-- and max_tokens when present. The loader's .dataset is the tokenized data.
local recipe_data_keys = { text_field = true, separator = true, split = true, chat_template = true, max_tokens = true,
                           format = true }
local recipe_loader_keys = { seq_len = true, samples = true, batch = true, pack = true, random_offset = true,
                             shuffle = true, wrap = true, drop_last = true, pad_id = true }
function M.from_recipe(section, tokenizer, seed)
  if type(section) ~= "table" then fail("data.from_recipe: expected the recipe's calibration or distill table") end
  if section.data == nil then fail("data.from_recipe: the section has no `data`") end
  local dopts = { tokenizer = tokenizer }
  for k in pairs(recipe_data_keys) do dopts[k] = section[k] end
  local ds = M.load(section.data, dopts)
  local cfg = { seed = section.seed or seed or 0 }
  for k in pairs(recipe_loader_keys) do cfg[k] = section[k] end
  return ds:loader(cfg)
end

return M

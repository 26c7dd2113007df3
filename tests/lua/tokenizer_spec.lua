-- nibble.tokenizer and `nibble tokenize`: stories260K's tokenizer.json and GGUF, the Qwen2 and
-- Llama-2 vocabularies from ../shared/data (pending when absent), and a small trained tokenizer
-- from tests/golden/data (always there). Expected ids come from HF tokenizers 0.23 (see
-- tests/golden/gen_tokenizer_golden.py and the README of ../shared/data).
local nibble = require("nibble")
local nbspec = require("nbspec")
local need = nbspec.need
local err_of = nbspec.err_of

local stories_hf = nbspec.data("stories260K/hf")
local stories_gguf = nbspec.data("stories260K/stories260K.gguf")
local valid = nbspec.data("text/tinystories_valid_head_776KiB.txt")
local qwen2 = nbspec.data("tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf")
local llama_model = nbspec.data("tokenizers/llama2-32k/tokenizer.model")
local golden = nbspec.source_dir .. "/tests/golden/data/tokenizers"

describe("nibble.tokenizer", function()
  it("loads stories260K's tokenizer.json and encodes as HF does", function()
    if not need(stories_hf) then return end
    local tok = nibble.tokenizer(stories_hf)
    assert.is_true(nibble.tokenizer.is_tokenizer(tok))
    assert.are.equal(512, tok.vocab_size)
    assert.are.equal(1, tok.bos)
    assert.are.equal(2, tok.eos)
    assert.are.equal(0, tok.unk)
    assert.is_true(tok.add_bos)
    assert.is_false(tok.add_eos)
    assert.are.equal("bpe", tok.kind)
    assert.are.equal("nibble.tokenizer(bpe, pre none, 512 tokens, bos 1, eos 2)", tostring(tok))
    local text = "Once upon a time, there was a little girl."
    local ids = tok:encode(text)
    assert.are.same({ 1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 426 }, ids)
    assert.are.same({ 403, 407, 261, 378 }, tok:encode("Once upon a time", { bos = false }))
    assert.are.same({ 1, 317, 439, 419, 280, 294, 336, 313, 415, 417, 443, 436, 13, 13, 434, 260, 344, 264, 426 },
      tok:encode("Lily's cat said \"hi!\"\n\nThe end."))
    assert.are.equal(text, tok:decode(ids, { skip_special = true }))
    assert.are.equal("<s>" .. " " .. text, tok:decode(ids))
    assert.are.equal("\226\150\129Once", tok:token(403))
    assert.are.equal(" Once", tok:token_bytes(403))
    assert.are.equal(403, tok:id("\226\150\129Once"))
    assert.is_nil(tok:id("Once upon"))
    assert.are.equal("control", tok:type(1))
    assert.are.equal("byte", tok:type(13))
    assert.are.equal("normal", tok:type(403))
    assert.are.equal("unknown", tok:type(0))
    assert.is_true(tok:is_eog(2))
    assert.is_false(tok:is_eog(403))
    assert.is_nil(tok:token(512))
    tok:free()
    assert.are.equal("nibble.tokenizer(freed)", tostring(tok))
    assert.matches("tokenizer was freed", err_of(tok.encode, tok, "x"))
  end)

  it("gives 393,019 tokens on the validation text, the same from the GGUF", function()
    if not need(stories_hf, stories_gguf, valid) then return end
    local text = nbspec.read(valid)
    local a, b = nibble.tokenizer(stories_hf), nibble.tokenizer(stories_gguf)
    assert.are.equal("spm", b.kind)
    assert.are.equal(393019, a:count(text))
    local ta, tb = a:encode_tokens(text), b:encode_tokens(text)
    assert.are.equal(393019, tonumber(ta.n))
    assert.are.equal(393019, tonumber(tb.n))
    local same = true
    for i = 0, tonumber(ta.n) - 1 do
      if ta.ids[i] ~= tb.ids[i] then same = false break end
    end
    assert.is_true(same)
    assert.are.equal(text, a:decode(ta, { skip_special = true }))
    -- appending to a given buffer
    a:encode_tokens("Once", { bos = false }, ta)
    assert.are.equal(393020, tonumber(ta.n))
    assert.are.equal(403, ta.ids[393019])
  end)

  it("parses special tokens only when asked (Qwen2 GGUF)", function()
    if not need(qwen2) then return end
    local tok = nibble.tokenizer.load(qwen2)
    assert.are.equal("byte-bpe", tok.kind)
    assert.are.equal("qwen2", tok.pre)
    assert.is_false(tok.add_bos)
    assert.are.same({ 9707, 1879, 0, 220, 108386 }, tok:encode("Hello world! 你好"))
    local chat = "<|im_start|>user\nHi<|im_end|>"
    assert.are.same({ 151644, 872, 198, 13048, 151645 }, tok:encode(chat, { special = true }))
    local plain = tok:encode(chat)
    assert.are.same({ 27, 91, 318, 4906, 91, 29, 872, 198, 13048, 27, 91, 318, 6213, 91, 29 }, plain)
    assert.are.equal(chat, tok:decode(plain))
    assert.are.equal(chat, tok:decode({ 151644, 872, 198, 13048, 151645 }))
    assert.are.equal("user\nHi", tok:decode({ 151644, 872, 198, 13048, 151645 }, { skip_special = true }))
    assert.is_true(tok:is_eog(151645))
    assert.are.equal("control", tok:type(151644))
    assert.are.equal(151645, tok:id("<|im_end|>"))
  end)

  it("reads a SentencePiece tokenizer.model", function()
    if not need(llama_model) then return end
    local tok = nibble.tokenizer(llama_model)
    assert.are.equal("spm", tok.kind)
    assert.are.equal(32000, tok.vocab_size)
    assert.are.same({ 1, 15043, 3186 }, tok:encode("Hello world"))
    assert.are.same({ 29871, 13 }, tok:encode("\n", { bos = false }))
  end)

  it("loads the golden tokenizers without shared data", function()
    local tok = nibble.tokenizer(golden .. "/spm_norm")
    local s, e = tok:id("<|start|>"), tok:id("<|end|>")
    assert.are.equal(s, tok.bos)
    assert.are.equal(e, tok.eos)
    local cases = nibble.json.decode(nbspec.read(golden .. "/cases.json")).cases
    local n = 0
    for _, c in ipairs(cases) do
      if c.tok == "spm_norm" then
        assert.are.same(c.ids, tok:encode(c.text, { bos = false, special = true }))
        assert.are.same(c.ids_special, tok:encode(c.text, { special = true }))
        assert.are.same(c.ids_noparse, tok:encode(c.text, { bos = false }))
        assert.are.equal(c.decoded, tok:decode(c.ids))
        n = n + 1
      end
    end
    assert.are.equal(23, n)
  end)

  it("names what is wrong", function()
    assert.matches("NB_ERR_IO: cannot open /nonexistent/tok.json", err_of(nibble.tokenizer, "/nonexistent/tok.json"), 1, true)
    local dir = nbspec.mkdtemp()
    nbspec.write(dir .. "/tokenizer.json", '{"model": {"type": "Unigram", "vocab": []}}')
    assert.matches("NB_ERR_UNSUPPORTED: .*tokenizer model type %(only BPE is%) 'Unigram' is not supported",
      err_of(nibble.tokenizer.load, dir))
    nbspec.write(dir .. "/tokenizer.json", '{"model": ')
    assert.matches("NB_ERR_FORMAT: .*is not valid JSON", err_of(nibble.tokenizer.load, dir))
    os.execute("rm -rf " .. nbspec.quote(dir))
    local tok = nibble.tokenizer(golden .. "/bl_prefix")
    assert.matches("NB_ERR_INVALID: token id 99999 at position 0 is outside the vocabulary",
      err_of(tok.decode, tok, { 99999 }))
    assert.matches("decode: element 2 is string", err_of(tok.decode, tok, { 1, "x" }))
    assert.matches("encode: expected a string", err_of(tok.encode, tok, 42))
  end)
end)

describe("nibble tokenize", function()
  it("prints ids, counts and tokens", function()
    if not need(stories_hf, valid, qwen2) then return end
    local out, err, code = nbspec.nibble({ "tokenize", "--model", stories_hf, "--text", "Once upon a time" })
    assert.are.equal(0, code, err)
    assert.are.equal("1 403 407 261 378\n", out)
    out, err, code = nbspec.nibble({ "tokenize", "--model", stories_hf, "--file", valid, "--count" })
    assert.are.equal(0, code, err)
    assert.are.equal("393019\n", out)
    out, err, code = nbspec.nibble({ "tokenize", "--model", stories_hf, "--no-bos", "--count" }, "Once upon a time")
    assert.are.equal(0, code, err)
    assert.are.equal("4\n", out)
    out, err, code = nbspec.nibble({ "tokenize", "-m", qwen2, "--special", "--tokens", "-t", "<|im_start|>Hi" })
    assert.are.equal(0, code, err)
    assert.are.equal("151644\t<|im_start|>\n13048\tHi\n", out)
  end)

  it("fails with a message and exit code 1", function()
    local out, err, code = nbspec.nibble({ "tokenize", "--model", "/nonexistent", "--text", "x" })
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.are.equal("nibble tokenize: NB_ERR_IO: cannot open /nonexistent: No such file or directory\n", err)
    out, err, code = nbspec.nibble({ "tokenize", "--text", "x" })
    assert.are.equal(1, code)
    assert.matches("^nibble tokenize: missing %-%-model PATH\nusage: nibble tokenize", err)
    out, err, code = nbspec.nibble({ "tokenize", "--model", golden .. "/bl_prefix", "--bogus" })
    assert.are.equal(1, code)
    assert.matches("unknown argument %-%-bogus", err)
    out, err, code = nbspec.nibble({ "tokenize", "--model", golden .. "/bl_prefix", "--text", "a", "--file", "b" })
    assert.are.equal(1, code)
    assert.matches("not both", err)
  end)
end)

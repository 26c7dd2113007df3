-- nibble.load and nibble.inspect on the real stories260K files (HF safetensors, a sharded copy
-- written by libnibble's writer, GGUF F32 and Q8_0) and on broken files. Reference values were
-- read with the `safetensors` and `gguf` Python packages.
local nibble = require("nibble")
local nbspec = require("nbspec")
local need = nbspec.need
-- local, not nbspec.err_of: the errors name this file's line (the caller of the nibble function)
local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end
local ffi = require("ffi")
local C = nibble.C

local hf = nbspec.data("stories260K/hf")
local gguf_path = nbspec.data("stories260K/stories260K.gguf")
local q8_path = nbspec.data("stories260K/quantized/stories260K-q8_0.gguf")

describe("nibble.load (safetensors)", function()
  it("lists the tensors and fetches them by name", function()
    if not need(hf) then return end
    local w = nibble.load(hf)
    assert.are.equal(47, #w)
    assert.are.equal("safetensors", w.format)
    assert.are.equal(hf, w.path)
    assert.are.equal("model.embed_tokens.weight", w[1])
    assert.are.equal(("nibble.weights(safetensors %s, 47 tensors)"):format(hf), tostring(w))
    local q = w["model.layers.0.self_attn.q_proj.weight"]
    assert.are.equal("f32", q.dtype)
    assert.are.same({ 64, 64 }, q.shape)
    assert.are.equal("{64, 64}", tostring(q.shape))
    assert.are.equal(0.04439278692007065, q:get(1, 1))
    assert.are.equal(-0.2862856090068817, q:get(2, 3))
    assert.are.equal(0.034809552133083344, q:get(64, 64))
    local s = q:stats()
    assert.are.equal(1.5936816930770874, s.absmax)
    assert.is_true(math.abs(s.mean - -0.0058173395773124525) < 1e-12)
    assert.is_true(math.abs(s.std - 0.23602729308901868) < 1e-9)
    local e = w["model.embed_tokens.weight"]
    assert.are.same({ 512, 64 }, e.shape)
    assert.are.equal(-0.29474878311157227, e:get(1, 1))
    assert.are.equal(0.2313426434993744, e[4][6])
    assert.are.equal(-0.424032598733902, e:get(512, 64))
    assert.is_true(math.abs(e:sum() - -752.3677446640068) < 1e-9)
    local n = w["model.norm.weight"]:narrow(1, 1, 4):totable()
    assert.are.same({ 2.4583089351654053, 1.3673226833343506, 1.7504382133483887, 1.1078318357467651 }, n)
    assert.are.equal(-0.09656164050102234, w["model.layers.4.mlp.down_proj.weight"]:get(11, 172))
  end)

  it("answers names, info, metadata and missing names", function()
    if not need(hf) then return end
    local w = nibble.load(hf .. "/model.safetensors")
    local names = w:names()
    assert.are.equal(47, #names)
    local i = 0
    for name, t in w:pairs() do
      i = i + 1
      assert.are.equal(names[i], name)
      assert.are.equal(w[i], name)
      assert.is_true(nibble.is_tensor(t))
    end
    assert.are.equal(47, i)
    assert.is_nil(w["lm_head.weight"])   -- tied embeddings: there is none
    assert.is_false(w:has("lm_head.weight"))
    assert.is_true(w:has("model.norm.weight"))
    local e = err_of(function() return w:get("lm_head.weight") end)
    assert.truthy(e:find("load_spec.lua:%d+: NB_ERR_NOT_FOUND: "), e)
    assert.truthy(e:find("lm_head.weight", 1, true), e)
    local info = w:info("model.layers.0.mlp.down_proj.weight")
    assert.are.equal("F32", info.dtype)
    assert.are.same({ 64, 172 }, info.shape)
    assert.are.equal(44032, info.bytes)
    assert.are.equal(64 * 172, info.params)
    assert.is_nil(w:info("nope"))
    assert.are.same({ format = "pt" }, w:metadata())
    assert.are.equal(47, #w:rows())
  end)

  it("gives read-only views of the mapped file that outlive close()", function()
    if not need(hf) then return end
    local w = nibble.load(hf)
    local n = w["model.norm.weight"]
    assert.are.equal(n, w["model.norm.weight"])   -- cached while referenced
    assert.is_false(n:writable())
    local e = err_of(function() n:set(1, 0) end)
    assert.truthy(e:find("NB_ERR_INVALID: set: tensor is read-only (mapped file)", 1, true), e)
    local c = n:clone()
    c:set(1, 0)
    assert.are.equal(0, c:get(1))
    w:close()
    collectgarbage("collect")
    assert.are.equal(2.4583089351654053, n:get(1))
    e = err_of(function() return w:get("model.norm.weight") end)
    assert.truthy(e:find(" was closed", 1, true), e)
    assert.truthy(tostring(w):find(", closed)", 1, true))
  end)

  it("reads a sharded directory written by libnibble", function()
    if not need(hf) then return end
    local w = nibble.load(hf)
    local out = ffi.new("nb_st_writer *[1]")
    nibble.check(C.nb_st_writer_new(nibble.ctx, out))
    local wr = ffi.gc(out[0], C.nb_st_writer_free)
    for name, t in w:pairs() do nibble.check(C.nb_st_writer_add(nibble.ctx, wr, name, t.ptr)) end
    local dir = nbspec.mkdtemp()
    nibble.check(C.nb_st_writer_write_sharded(nibble.ctx, wr, dir, 300000))
    local s = nibble.load(dir)
    assert.are.equal(47, #s)
    for i = 1, #w do
      assert.are.equal(w[i], s[i])
      assert.is_true(s[s[i]]:equal(w[w[i]]), s[i])
    end
    local info = nibble.inspect(dir)
    assert.is_true(#info.shards >= 4, tostring(#info.shards))
    assert.are.equal(260032, info.params)
    assert.truthy(info.shards[1]:find("model%-00001%-of%-%d+%.safetensors$"), info.shards[1])
    os.execute("rm -rf " .. nbspec.quote(dir))
  end)
end)

describe("nibble.load (GGUF)", function()
  it("reads the F32 GGUF, equal to the HF weights where no permutation applies", function()
    if not need(gguf_path and hf) then return end
    local g = nibble.load(gguf_path)
    local w = nibble.load(hf)
    assert.are.equal(48, #g)
    assert.are.equal("gguf", g.format)
    assert.are.equal(3, g.version)
    assert.are.equal("token_embd.weight", g[1])
    local te = g["token_embd.weight"]
    assert.are.same({ 512, 64 }, te.shape)
    assert.is_true(te:equal(w["model.embed_tokens.weight"]))
    assert.is_true(g["output.weight"]:equal(te))
    local down = g["blk.4.ffn_down.weight"]
    assert.are.same({ 64, 172 }, down.shape)
    assert.is_true(down:equal(w["model.layers.4.mlp.down_proj.weight"]))
    assert.is_true(g["blk.2.attn_v.weight"]:equal(w["model.layers.2.self_attn.v_proj.weight"]))
  end)

  it("decodes the metadata", function()
    if not need(gguf_path) then return end
    local m = nibble.load(gguf_path):metadata()
    assert.are.equal("llama", m["general.architecture"])
    assert.are.equal(64, m["llama.embedding_length"])
    assert.are.equal(2048, m["llama.context_length"])
    assert.are.equal(1, m["tokenizer.ggml.bos_token_id"])
    assert.are.equal(9.999999747378752e-06, m["llama.attention.layer_norm_rms_epsilon"])
    local tok = m["tokenizer.ggml.tokens"]
    assert.are.equal(512, #tok)
    assert.are.same({ "<unk>", "<s>", "</s>", "<0x00>" }, { tok[1], tok[2], tok[3], tok[4] })
    local tt = m["tokenizer.ggml.token_type"]
    assert.are.same({ 2, 3, 3, 6 }, { tt[1], tt[2], tt[3], tt[4] })
    assert.are.equal(0, m["tokenizer.ggml.scores"][1])
  end)

  it("dequantizes Q8_0 tensors to f32 close to the originals", function()
    if not need(q8_path and gguf_path) then return end
    local q = nibble.load(q8_path)
    local f = nibble.load(gguf_path)
    local info = q:info("blk.0.attn_q.weight")
    assert.are.equal("Q8_0", info.dtype)
    assert.are.equal(64 * 64 / 32 * 34, info.bytes)
    local t = q["blk.0.attn_q.weight"]
    assert.are.equal("f32", t.dtype)
    assert.are.same({ 64, 64 }, t.shape)
    local d = t:max_abs_diff(f["blk.0.attn_q.weight"])
    assert.is_true(d > 0 and d <= 1.5936816930770874 / 127 / 2 + 1e-6, tostring(d))
  end)
end)

describe("nibble.inspect", function()
  it("returns the rows the CLI prints", function()
    if not need(hf and gguf_path) then return end
    local s = nibble.inspect(hf)
    assert.are.equal("safetensors", s.format)
    assert.are.equal(47, s.count)
    assert.are.equal(260032, s.params)
    assert.are.equal(1040128, s.bytes)
    assert.are.same({ hf .. "/model.safetensors" }, s.shards)
    assert.are.same({ name = "model.embed_tokens.weight", dtype = "F32", shape = { 512, 64 }, bytes = 131072,
                      offset = 0, params = 32768, shard = hf .. "/model.safetensors" }, s.tensors[1])
    assert.are.same({ { key = "format", type = "string", value = "pt" } }, s.metadata)
    local g = nibble.inspect(gguf_path)
    assert.are.equal("gguf", g.format)
    assert.are.equal(3, g.version)
    assert.are.equal(48, g.count)
    assert.are.equal(292800, g.params)
    assert.are.equal(1171200, g.bytes)
    assert.are.same({ name = "token_embd.weight", dtype = "F32", shape = { 512, 64 }, bytes = 131072, offset = 14176,
                      ggml_type = 0, params = 32768 }, g.tensors[1])
    local last
    for _, r in ipairs(g.tensors) do if r.name == "blk.4.ffn_down.weight" then last = r end end
    assert.are.same({ 64, 172 }, last.shape)
    assert.are.equal(1097056, last.offset)
    assert.are.equal(19, #g.metadata)
    assert.are.same({ "tokenizer.ggml.tokens", "array[string]", 512 },
                    { g.metadata[1].key, g.metadata[1].type, g.metadata[1].count })
  end)
end)

describe("bad files", function()
  local tmp
  before_each(function() tmp = nbspec.tmpname(".bin") end)
  after_each(function() os.remove(tmp) end)

  it("give named errors, never a crash", function()
    nbspec.write(tmp, "garbage")
    local e = err_of(nibble.load, tmp)
    assert.truthy(e:find("load_spec.lua:%d+: NB_ERR_FORMAT: .*shorter than the 8%-byte header length"), e)
    nbspec.write(tmp, "GGUF\3\0\0\0garbage")
    e = err_of(nibble.inspect, tmp)
    assert.truthy(e:find("NB_ERR_FORMAT: ", 1, true), e)
    e = err_of(nibble.load, "/nonexistent/model.safetensors")
    assert.truthy(e:find("NB_ERR_IO: cannot open /nonexistent/model.safetensors", 1, true), e)
    e = err_of(nibble.load, 42)
    assert.truthy(e:find("expected a path (string), got number", 1, true), e)
  end)

  it("rejects a truncated real file", function()
    if not need(hf and gguf_path) then return end
    local data = nbspec.read(hf .. "/model.safetensors")
    nbspec.write(tmp, data:sub(1, 5000))
    local e = err_of(nibble.load, tmp)
    assert.truthy(e:find("NB_ERR_FORMAT: ", 1, true), e)
    local g = nbspec.read(gguf_path)
    nbspec.write(tmp, g:sub(1, 20000))
    e = err_of(nibble.load, tmp)
    assert.truthy(e:find("NB_ERR_FORMAT: ", 1, true), e)
  end)
end)

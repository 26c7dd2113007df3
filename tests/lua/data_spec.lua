-- nibble.data from Lua: packing on a hand-made stream (exact rows, targets, masks), the offset rule,
-- same seed -> same rows, the cursor as a JSON-safe table that resumes exactly, the epoch iterator,
-- the fixtures of tests/data with stories260K's tokenizer against tests/golden/data/data_golden.json,
-- named errors (file:line for bad JSON, unknown options, seq_len <= 0), and from_recipe.
local nibble = require("nibble")
local nbspec = require("nbspec")
local data = nibble.data

local stories_hf = nbspec.data("stories260K/hf")
local src = nbspec.source_dir

local need = nbspec.need
local err_of = nbspec.err_of

-- s[k] = 100 + k, k in [0, 27): documents of 10, 10 and 7 tokens; mask (k % 3 ~= 0)
local function stream()
  local ds = data.new()
  local k = 0
  for _, len in ipairs { 10, 10, 7 } do
    local ids, mask = {}, {}
    for i = 1, len do
      ids[i] = 100 + k
      mask[i] = k % 3 ~= 0
      k = k + 1
    end
    ds:add_tokens(ids, mask)
  end
  return ds
end

local function rows(b)
  return b.tokens:totable(), b.targets:totable(), b.mask:totable()
end

describe("nibble.data packing", function()
  it("cuts the stream into rows of seq_len with next-token targets", function()
    local ds = stream()
    assert.are.equal(27, ds:n_tokens())
    assert.are.equal(3, ds:n_docs())
    assert.are.equal(18, ds:n_masked())
    local ids, mask = ds:doc(3)
    assert.are.same({ 120, 121, 122, 123, 124, 125, 126 }, ids)
    assert.are.same({ 1, 0, 1, 1, 0, 1, 1 }, mask)
    local ld = ds:loader { seq_len = 4, batch = 4 }
    assert.are.equal(6, ld.rows_per_epoch)
    assert.are.equal(2, ld.batches_per_epoch)
    local b = ld:next()
    assert.are.equal(4, b.rows)
    assert.are.equal("i32", b.tokens.dtype)
    assert.are.equal("u8", b.mask.dtype)
    local tok, tgt, m = rows(b)
    assert.are.same({ 100, 101, 102, 103 }, tok[1])
    assert.are.same({ 101, 102, 103, 104 }, tgt[1])
    assert.are.same({ 1, 1, 0, 1 }, m[1])
    assert.are.same({ 112, 113, 114, 115 }, tok[4])
    assert.is_false(b.epoch_end)
    b = ld:next()
    assert.are.equal(2, b.rows)
    assert.is_true(b.epoch_end)
    tok, tgt, m = rows(b)
    assert.are.same({ 120, 121, 122, 123 }, tok[2])
    assert.are.same({ 121, 122, 123, 124 }, tgt[2])
    assert.are.same({ 0, 1, 1, 0 }, m[2])
    b = ld:next()
    assert.are.equal(1, b.epoch)
    assert.are.equal(0, b.row)
  end)

  it("wraps around the stream only when asked", function()
    local ds = stream()
    local e = err_of(data.loader, ds, { seq_len = 4, samples = 10 })
    assert.matches("NB_ERR_INVALID: samples = 10, but 27 tokens give only 6 rows of seq_len 4", e, 1, true)
    local ld = ds:loader { seq_len = 4, samples = 10, batch = 10, wrap = true }
    local tok, tgt = rows(ld:next())
    assert.are.same({ 124, 125, 126, 100 }, tok[7])
    assert.are.same({ 125, 126, 100, 101 }, tgt[7])
  end)

  it("gives one document per row, padded, without packing", function()
    local ld = stream():loader { seq_len = 8, batch = 3, pack = false, pad_id = 9 }
    local tok, tgt, m = rows(ld:next())
    assert.are.same({ 120, 121, 122, 123, 124, 125, 126, 9 }, tok[3])
    assert.are.same({ 121, 122, 123, 124, 125, 126, 9, 9 }, tgt[3])
    assert.are.same({ 0, 1, 1, 0, 1, 1, 0, 0 }, m[3])
  end)

  it("draws the offset from the seed, the same everywhere", function()
    assert.are.equal(data.offset(1, 0, 2048), data.offset(1, 0, 2048))
    assert.are_not.equal(data.offset(1, 0, 2048), data.offset(2, 0, 2048))
    assert.are_not.equal(data.offset(1, 0, 2048), data.offset(1, 1, 2048))
    local ds = stream()
    for seed = 0, 5 do
      local ld = ds:loader { seq_len = 4, batch = 5, random_offset = true, seed = seed }
      local off = data.offset(seed, 0, 4)
      assert.are.equal(off, ld:offset(0))
      local tok = rows(ld:next())
      assert.are.equal(100 + off, tok[1][1])
      assert.are.equal(100 + off + 16, tok[5][1])
    end
  end)

  it("gives the same rows for the same seed and other rows for another", function()
    local function run(seed)
      local ld = stream():loader { seq_len = 3, batch = 2, random_offset = true, shuffle = true, seed = seed }
      local out = {}
      for _ = 1, 12 do
        local b = ld:next()
        out[#out + 1] = b.tokens:totable()
      end
      return out
    end
    assert.are.same(run(42), run(42))
    assert.are_not.same(run(42), run(43))
  end)

  it("saves and restores the cursor as a JSON-safe table", function()
    local ds = stream()
    local cfg = { seq_len = 3, batch = 3, samples = 7, random_offset = true, shuffle = true, seed = 77 }
    local a = ds:loader(cfg)
    for _ = 1, 4 do a:next() end
    local st = a:state()
    assert.are.equal(1, st.epoch)
    assert.are.equal(3, st.row)
    assert.are.equal(10, st.rows_read)
    assert.matches("^0x%x+$", st.fingerprint)
    local text = nibble.json.encode(st)
    local expect = {}
    for i = 1, 6 do expect[i] = a:next().tokens:totable() end
    local b = ds:loader(cfg)
    b:restore(nibble.json.decode(text))
    for i = 1, 6 do assert.are.same(expect[i], b:next().tokens:totable()) end
    assert.are.same(a:state(), b:state())
    -- another seed, or a tampered state, is refused
    local c = ds:loader { seq_len = 3, batch = 3, samples = 7, random_offset = true, shuffle = true, seed = 78 }
    assert.matches("belongs to another dataset or data configuration", err_of(c.restore, c, st), 1, true)
    local bad = nibble.json.decode(text)
    bad.rng[1] = "0x0000000000000001"
    assert.matches("inconsistent", err_of(b.restore, b, bad), 1, true)
  end)

  it("iterates over an epoch and reads rows at random", function()
    local ld = stream():loader { seq_len = 4, batch = 4 }
    local n, rows_seen = 0, 0
    for b in ld:epoch() do
      n = n + 1
      rows_seen = rows_seen + b.rows
    end
    assert.are.equal(2, n)
    assert.are.equal(6, rows_seen)
    local tok, tgt, m = ld:read(0, 5, 1)
    assert.are.same({ { 120, 121, 122, 123 } }, tok:totable())
    assert.are.same({ { 121, 122, 123, 124 } }, tgt:totable())
    assert.are.same({ { 0, 1, 1, 0 } }, m:totable())
    assert.are.equal(6, ld:state().row)   -- read() did not move the cursor
  end)

  it("splits off a held-out tail", function()
    local tr, ev = stream():split(0.3)
    assert.are.equal(20, tr:n_tokens())
    assert.are.equal(7, ev:n_tokens())
    assert.are.same({ 120 }, (ev:slice(1, 1)))
  end)

  it("names what is wrong", function()
    local ds = stream()
    assert.matches("NB_ERR_INVALID: seq_len must be > 0, got 0", err_of(data.loader, ds, { seq_len = 0 }), 1, true)
    assert.matches("seq_len must be > 0, got -2", err_of(data.loader, ds, { seq_len = -2 }), 1, true)
    assert.matches("seq_len is required", err_of(data.loader, ds, {}), 1, true)
    assert.matches("unknown option 'seqlen'", err_of(data.loader, ds, { seqlen = 4 }), 1, true)
    assert.matches("too few for one row", err_of(data.loader, ds, { seq_len = 27 }), 1, true)
    ds:loader { seq_len = 4 }
    assert.matches("in use by a dataloader", err_of(ds.add_tokens, ds, { 1, 2 }), 1, true)
  end)
end)

describe("nibble.data files", function()
  local golden = nibble.json.decode(nbspec.read(src .. "/tests/golden/data/data_golden.json"))

  it("reads text, prompt/completion and chat records with the masks of data.h", function()
    if not need(stories_hf) then return end
    local tok = nibble.tokenizer(stories_hf)
    for _, f in ipairs { "mixed.jsonl", "chat.jsonl", "docs.txt" } do
      local ds = data.load(src .. "/tests/data/" .. f, { tokenizer = tok })
      local g = golden.stories260K[f]
      local ids, mask = ds:slice(1)
      assert.are.same(g.ids, ids)
      assert.are.same(g.mask, mask)
      assert.are.equal(#g.doc_start, ds:n_docs())
    end
    local ds = data.load(src .. "/tests/data/stories.txt", { tokenizer = tok, separator = "<|endoftext|>" })
    assert.are.same(golden.stories260K["stories.txt"].ids, (ds:slice(1)))
    -- records from Lua tables are the same documents
    local one = data.new()
    one:add({ prompt = "Tom had a red ball.", completion = " He gave it to Sue." }, { tokenizer = tok })
    local full = data.load(src .. "/tests/data/mixed.jsonl", { tokenizer = tok })
    local a, am = full:doc(2)
    local b, bm = one:doc(1)
    assert.are.same(a, b)
    assert.are.same(am, bm)
    -- a tokenizer given by path, several files in order
    local two = data.load({ src .. "/tests/data/docs.txt", src .. "/tests/data/mixed.jsonl" }, { tokenizer = stories_hf })
    assert.are.equal(7, two:n_docs())
    assert.are.equal(2, two:eos())
  end)

  it("reports the file and line of a bad record", function()
    if not need(stories_hf) then return end
    local tok = nibble.tokenizer(stories_hf)
    local p = nbspec.tmpname(".jsonl")
    nbspec.write(p, '{"text": "a"}\n{"text": "b",}\n')
    local e = err_of(data.load, p, { tokenizer = tok })
    assert.matches("NB_ERR_FORMAT: " .. p .. ":2: invalid JSON (column 14)", e, 1, true)
    nbspec.write(p, '{"text": "a"}\n\n{"body": "b"}\n')
    assert.matches(p .. ":3: no usable field", err_of(data.load, p, { tokenizer = tok }), 1, true)
    nbspec.write(p, "")
    assert.matches(p .. ": no documents", err_of(data.load, p, { tokenizer = tok }), 1, true)
    os.remove(p)
    assert.matches("unknown value xml", err_of(data.load, src .. "/tests/data/docs.txt", { tokenizer = tok, format = "xml" }),
                   1, true)
    assert.matches("unknown option 'sep'", err_of(data.load, src .. "/tests/data/docs.txt", { tokenizer = tok, sep = "x" }),
                   1, true)
    assert.matches("a tokenizer is needed", err_of(data.load, src .. "/tests/data/docs.txt", {}), 1, true)
  end)

  it("builds a calibration loader from a recipe section", function()
    if not need(stories_hf) then return end
    local tok = nibble.tokenizer(stories_hf)
    local ld = data.from_recipe({ data = src .. "/tests/data/chat.jsonl", seq_len = 16, samples = 4, batch = 2,
                                  random_offset = true }, tok, 5)
    assert.are.equal(4, ld.rows_per_epoch)
    assert.are.equal(data.offset(5, 0, 16), ld:offset(0))
    local b = ld:next()
    local ids = ld.dataset:slice(1)
    local off = ld:offset(0)
    for t = 1, 16 do assert.are.equal(ids[off + t], b.tokens:get(1, t)) end
    for t = 1, 16 do assert.are.equal(ids[off + 16 + t + 1], b.targets:get(2, t)) end
  end)
end)

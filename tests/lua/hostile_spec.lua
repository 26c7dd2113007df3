-- Hostile files through the CLI: a tokenizer.json whose ids outrun what it declares, and a
-- config.json whose layer count is 1e36 (a cast to an integer that would be undefined behaviour).
-- Each must be refused in one line naming the file, exit code 1, before anything big is allocated.
local nbspec = require("nbspec")

describe("hostile input", function()
  local H = nbspec.data("stories260K/hf")
  local tmp = nbspec.private_dir()

  local function refused(args, msg)
    local out, err, rc = nbspec.nibble(args)
    assert.are.equal(msg, err)
    assert.are.equal(1, rc, table.concat(args, " "))
    assert.are.equal("", out)
  end

  it("tokenize: a 66-byte tokenizer.json with id 333333330 is one line, exit 1", function()
    local d = tmp .. "/bigid"
    os.execute("mkdir -p " .. nbspec.quote(d))
    local big = '{"model":{"type":"BPE","vocab":{"a":0,"b":333333330},"merges":[]}}'
    assert.are.equal(66, #big)
    nbspec.write(d .. "/tokenizer.json", big)
    refused({ "tokenize", "--model", d, "--text", "a" }, "nibble tokenize: NB_ERR_FORMAT: " .. d .. "/tokenizer.json: "
      .. 'vocab entry "b" has id 333333330, but the file declares only 2 tokens (vocab entries + added_tokens)\n')
  end)

  it("eval: num_hidden_layers 1e36 in config.json is one line, exit 1", function()
    if not nbspec.need(H) then return end
    local d = tmp .. "/layers"
    os.execute("mkdir -p " .. nbspec.quote(d))
    local cfg = nbspec.read(H .. "/config.json")
    local bad, n = cfg:gsub('"num_hidden_layers": 5', '"num_hidden_layers": 1e36')
    assert.are.equal(1, n)
    nbspec.write(d .. "/config.json", bad)
    nbspec.write(d .. "/tokenizer.json", nbspec.read(H .. "/tokenizer.json"))
    os.execute("ln -s " .. nbspec.quote(H .. "/model.safetensors") .. " " .. nbspec.quote(d .. "/model.safetensors"))
    refused({ "eval", "--model", d, "--data", "tests/data/stories.txt" }, "nibble eval: NB_ERR_FORMAT: " .. d
      .. "/config.json: field 'num_hidden_layers' is 1e+36, outside [-2147483648, 2147483647]\n")
  end)
end)

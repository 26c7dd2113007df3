-- nibble.chat: chat templates rendered byte for byte as transformers renders them (the golden renders in
-- tests/golden/data/chat_golden.json, made by tests/golden/gen_chat_golden.py: SmolLM2, Llama 3, Qwen2,
-- Qwen2.5, Mistral, Gemma, Phi-3 and two templates for the rest of the Jinja subset), raise_exception's
-- message as the error, and a one-line error naming each construct the renderer does not support.
local json = require("nibble.json")
local chat = require("nibble.chat")
local nbspec = require("nbspec")

local golden = json.decode(assert(nbspec.read("tests/golden/data/chat_golden.json"), "chat_golden.json is missing"))

describe("chat templates", function()
  it("render as transformers renders them, byte for byte", function()
    local n, errors = 0, 0
    for _, c in ipairs(golden.cases) do
      local src, msgs = golden.templates[c.template], golden.messages[c.messages]
      local what = ("%s / %s / add_generation_prompt=%s"):format(c.template, c.messages, tostring(c.add_generation_prompt))
      local ok, out = pcall(chat.apply, src, msgs, { add_generation_prompt = c.add_generation_prompt,
                                                    bos_token = c.bos_token, eos_token = c.eos_token })
      if c.error then
        assert.is_false(ok, what)
        assert.are.equal("chat template: " .. c.error, out, what)
        errors = errors + 1
      else
        assert(ok, what .. ": " .. tostring(out))
        assert.are.equal(c.output, out, what)
      end
      n = n + 1
    end
    -- every family and every message list took part: 80 renders, 8 of them raise_exception
    assert.are.equal(80, n)
    assert.are.equal(8, errors)
  end)

  it("renders the SmolLM2 prompt the generate command sends", function()
    local out = chat.apply(golden.templates.smollm2, { { role = "user", content = "What is the capital of France?" } },
                           { add_generation_prompt = true })
    assert.are.equal("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      .. "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n", out)
  end)

  it("treats tools and documents as none, as transformers passes them", function()
    assert.are.equal("none none", chat.render("{{ 'none' if tools is none }} {{ 'none' if documents is none }}",
                                              { tools = chat.none, documents = chat.none }))
    assert.are.equal("True", chat.apply("{{ tools is none }}", {}))
  end)

  local function refused(src, msg, vars)
    local ok, e = pcall(chat.render, src, vars or { messages = {} })
    assert.is_false(ok, src)
    assert.are.equal(msg, e)
  end

  it("names each construct it does not support, in one line", function()
    refused("{% macro m() %}x{% endmacro %}", "chat template: line 1: unsupported tag '{% macro %}'")
    refused("a\n{{ messages | wordcount }}", "chat template: line 2: unsupported filter 'wordcount'")
    refused("{% if x is callable %}{% endif %}", "chat template: line 1: unsupported test 'is callable'")
    refused("{% for m in messages recursive %}{% endfor %}", "chat template: line 1: unsupported 'for ... recursive'")
    refused("{{ 'a'.zfill(3) }}", "chat template: line 1: unsupported call: '.zfill' is not a function the renderer knows")
    refused("{{ cycler(1) }}", "chat template: line 1: unsupported call: 'cycler' is not a function the renderer knows")
    refused("{% for k in d %}{% endfor %}", "chat template: line 1: unsupported 'for' over a mapping", { d = { a = 1 } })
    refused("{{ d | tojson }}", "chat template: tojson of a mapping with more than one key is not supported "
      .. "(a Lua table keeps no key order)", { d = { a = 1, b = 2 } })
    refused("{{ 'é' | upper }}", "chat template: line 1: 'upper' of non-ASCII text is not supported")
    refused("{{ messages }}", "chat template: printing a list is not supported")
    refused("{% if x %}", "chat template: '{% if %}' is never closed (expected elif or else or endif)")
    refused("{{ x.y }}", "chat template: line 1: cannot read '.y' of an undefined value")
    refused("{{ 'a' + 1 }}", "chat template: line 1: cannot apply '+' to a string and a number")
    refused("{{ raise_exception('no system role') }}", "chat template: no system role")
  end)

  it("checks the messages it is given", function()
    local ok, e = pcall(chat.apply, "x", { { content = "hi" } })
    assert.is_false(ok)
    assert.are.equal("chat template: message 1 has no 'role' string", e)
  end)
end)

-- nibble.chat: chat templates rendered byte for byte as transformers renders them (the golden renders in
-- tests/golden/data/chat_golden.json, made by tests/golden/gen_chat_golden.py: SmolLM2, Llama 2/3, Qwen2,
-- Qwen2.5, Mistral, Gemma, Phi-3 and two templates for the rest of the Jinja subset), raise_exception's
-- message as the error, and a one-line error naming each construct the renderer does not support; the
-- template found beside a tokenizer or in a GGUF; `nibble generate` answering in the template (stories260K).
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
    -- every family and every message list took part: 88 renders, 8 of them raise_exception
    assert.are.equal(88, n)
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

describe("a tokenizer's chat template", function()
  local L2 = nbspec.data("tokenizers/llama2-32k")
  local QW = nbspec.data("tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf")
  local H = nbspec.data("stories260K/hf")
  local tmp = nbspec.private_dir()

  it("is read from tokenizer_config.json and rendered with the tokenizer's BOS and EOS", function()
    if not nbspec.need(L2) then return end
    local tok = require("nibble").tokenizer(L2)
    assert.are.equal(golden.templates.llama2, tok:chat_template())
    for _, c in ipairs(golden.cases) do
      if c.template == "llama2" then
        assert.are.equal(c.output, tok:apply_chat_template(golden.messages[c.messages],
                                                           { add_generation_prompt = c.add_generation_prompt }))
      end
    end
  end)

  it("is read from a GGUF's tokenizer.chat_template", function()
    if not nbspec.need(QW) then return end
    local tok = require("nibble").tokenizer(QW)
    assert.are.equal("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      .. "<|im_start|>assistant\n", tok:apply_chat_template({ { role = "user", content = "Hi" } }, { add_generation_prompt = true }))
    -- the template's control tokens are tokens; the user's text is text
    local ids = tok:encode_chat({ { role = "user", content = "Hi" } }, { add_generation_prompt = true })
    assert.are.equal(tok:id("<|im_start|>"), ids[1])
    assert.are.equal(tok:decode(ids), tok:apply_chat_template({ { role = "user", content = "Hi" } }, { add_generation_prompt = true }))
  end)

  -- a copy of stories260K's HF folder whose tokenizer_config.json (or chat_template.jinja) holds `template`
  local function with_template(name, config_value, jinja)
    local d = tmp .. "/" .. name
    os.execute("mkdir -p " .. nbspec.quote(d) .. " && cp " .. nbspec.quote(H) .. "/* " .. nbspec.quote(d)
               .. " && chmod u+w " .. nbspec.quote(d) .. "/*")
    local cfg = json.decode(nbspec.read(d .. "/tokenizer_config.json"))
    cfg.chat_template = config_value
    nbspec.write(d .. "/tokenizer_config.json", json.encode(cfg))
    if jinja then nbspec.write(d .. "/chat_template.jinja", jinja) end
    return d
  end
  local STORY = "{% for m in messages %}{{ bos_token if loop.first }}{% if m.role == 'system' %}{{ m.content + '\\n' }}"
    .. "{% else %}{{ m.role + ': ' + m.content + '\\n' }}{% endif %}{% endfor %}"
    .. "{% if add_generation_prompt %}{{ 'Once upon a time' }}{% endif %}"

  it("comes from chat_template.jinja before tokenizer_config.json, and a list's 'default' entry", function()
    if not nbspec.need(H) then return end
    local nibble = require("nibble")
    assert.is_nil(nibble.tokenizer(H):chat_template())
    local d = with_template("list", { { name = "tool_use", template = "T" }, { name = "default", template = "D" } })
    assert.are.equal("D", nibble.tokenizer(d):chat_template())
    d = with_template("jinja", "C", "J{{ 1 }}\n")
    assert.are.equal("J{{ 1 }}\n", nibble.tokenizer(d):chat_template())
    local ok, e = pcall(function() return nibble.tokenizer(H):apply_chat_template({}) end)
    assert.is_false(ok)
    -- nibble.fail names the caller's line, as every API error does
    assert.are.equal("the tokenizer has no chat template (" .. H .. ")", (e:gsub("^[^\n]-:%d+: ", "")))
  end)

  it("is what `nibble generate` answers in, printing only the answer", function()
    if not nbspec.need(H) then return end
    local d = with_template("story", STORY)
    -- the chat prompt is "<s>user: Lily\nOnce upon a time": the same ids as that text with the model's BOS, so
    -- the answer is exactly what plain generation continues that text with
    local plain, err, rc = nbspec.nibble { "generate", "--model", d, "--no-chat", "--prompt", "user: Lily\nOnce upon a time",
                                           "-n", "12", "--greedy" }
    assert.are.equal(0, rc, err)
    local prefix = "user: Lily\nOnce upon a time"
    assert.are.equal(prefix, plain:sub(1, #prefix))
    local answer = plain:sub(#prefix + 1)
    assert.truthy(#answer > 2, plain)
    local out
    out, err, rc = nbspec.nibble { "generate", "--model", d, "--prompt", "Lily", "-n", "12", "--greedy" }
    assert.are.equal(0, rc, err)
    assert.are.equal(answer, out)
    out, err, rc = nbspec.nibble { "generate", "--model", d, "--chat", "--prompt", "Lily", "-n", "12", "--greedy" }
    assert.are.equal(0, rc, err)
    assert.are.equal(answer, out)
    -- --system is a system message before the prompt
    plain = nbspec.nibble { "generate", "--model", d, "--no-chat", "--prompt", "Be kind.\nuser: Lily\nOnce upon a time",
                            "-n", "12", "--greedy" }
    out, err, rc = nbspec.nibble { "generate", "--model", d, "--system", "Be kind.", "--prompt", "Lily", "-n", "12", "--greedy" }
    assert.are.equal(0, rc, err)
    assert.are.equal(plain:sub(#"Be kind.\nuser: Lily\nOnce upon a time" + 1), out)
    -- the model without a template: the prompt stays plain text, and --chat says why it cannot
    out, err, rc = nbspec.nibble { "generate", "--model", H, "--prompt", "Lily", "-n", "3", "--greedy" }
    assert.are.equal(0, rc, err)
    assert.are.equal("Lily", out:sub(1, 4))
    out, err, rc = nbspec.nibble { "generate", "--model", H, "--chat", "--prompt", "Lily" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble generate: the model " .. H .. " has no chat template (tokenizer_config.json "
      .. "\"chat_template\", chat_template.jinja or GGUF tokenizer.chat_template); without --chat the prompt is plain text\n", err)
    out, err, rc = nbspec.nibble { "generate", "--model", d, "--chat" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble generate: --chat needs --prompt (the user's message)\n", err)
    out, err, rc = nbspec.nibble { "generate", "--model", d, "--no-chat", "--system", "x", "--prompt", "Lily" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble generate: --system needs a chat template (it is a system message): drop --no-chat, "
      .. "or put it in --prompt\n", err)
    -- a template the renderer cannot render is one line naming the construct
    d = with_template("bad", "{{ messages | wordcount }}")
    out, err, rc = nbspec.nibble { "generate", "--model", d, "--prompt", "Lily" }
    assert.are.equal(1, rc)
    assert.are.equal("nibble generate: chat template: line 1: unsupported filter 'wordcount'\n", err)
  end)
end)

describe("chat data with the model's template (chat_template = \"model\")", function()
  local L2 = nbspec.data("tokenizers/llama2-32k")
  local tmp = nbspec.private_dir()

  -- the mask data.h asks for, restated on the golden ids: each assistant answer, from the token after
  -- "[/INST]" (518 29914 25580 29962) through its </s> (2)
  local function expected_mask(ids)
    local m, on = {}, false
    for k, id in ipairs(ids) do
      m[k] = on and 1 or 0
      if id == 2 then on = false end
      if k >= 4 and ids[k - 3] == 518 and ids[k - 2] == 29914 and ids[k - 1] == 25580 and id == 29962 then on = true end
    end
    return m
  end

  it("tokenizes conversations as transformers' apply_chat_template(tokenize=True) and masks the answers", function()
    if not nbspec.need(L2) then return end
    local nibble = require("nibble")
    local tok = nibble.tokenizer(L2)
    local lines, want_ids, want_mask = {}, {}, {}
    for _, c in ipairs(golden.tokenized) do
      lines[#lines + 1] = json.encode({ messages = c.messages })
      for _, id in ipairs(c.input_ids) do want_ids[#want_ids + 1] = id end
      for _, v in ipairs(expected_mask(c.input_ids)) do want_mask[#want_mask + 1] = v end
    end
    lines[#lines + 1] = '{"text": "Once upon a time"}'
    local plain = nibble.data.new():add({ text = "Once upon a time" }, { tokenizer = tok })
    local pids, pmask = plain:slice(1, plain:n_tokens())
    for k, id in ipairs(pids) do want_ids[#want_ids + 1] = id; want_mask[#want_mask + 1] = pmask[k] end
    local f = tmp .. "/chat.jsonl"
    nbspec.write(f, table.concat(lines, "\n") .. "\n")
    local ds = nibble.data.load(f, { tokenizer = tok, chat_template = "model" })
    assert.are.equal(3, ds:n_docs())
    local ids, mask = ds:slice(1, ds:n_tokens())
    assert.are.same(want_ids, ids)
    local m = {}
    for k, v in ipairs(mask) do m[k] = (v == true or v == 1) and 1 or 0 end
    assert.are.same(want_mask, m)
    -- 17 answer tokens: " Hello. How can I help? </s>" (9), " Paris </s>" (3), " Oui. </s>" (5), and the
    -- plain-text document's every token
    assert.are.equal(17 + plain:n_masked(), ds:n_masked())
    -- the same conversation added as a record
    local one = nibble.data.new():add({ messages = golden.tokenized[1].messages }, { tokenizer = tok, chat_template = "model" })
    assert.are.same(golden.tokenized[1].input_ids, (one:slice(1, one:n_tokens())))
  end)

  it("says which record and why when it cannot", function()
    if not nbspec.need(L2) then return end
    local nibble = require("nibble")
    local f = tmp .. "/bad.jsonl"
    nbspec.write(f, '{"text": "fine"}\n\n{"messages": [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}]}\n')
    local ok, e = pcall(nibble.data.load, f, { tokenizer = L2, chat_template = "model" })
    assert.is_false(ok)
    assert.are.equal(f .. ":3: chat template: Conversation roles must alternate user/assistant/user/assistant/...",
                     (e:gsub("^[^\n]-%.lua:%d+: ", "")))
    ok, e = pcall(nibble.data.load, f, { tokenizer = nbspec.data("stories260K/hf"), chat_template = "model" })
    assert.is_false(ok)
    assert.truthy(e:find('chat_template = "model": the tokenizer ' .. nbspec.data("stories260K/hf") .. " has no chat template", 1, true), e)
  end)
end)

describe("a recipe's chat_template", function()
  it("reaches data.load through data.from_recipe", function()
    local L2 = nbspec.data("tokenizers/llama2-32k")
    if not nbspec.need(L2) then return end
    local nibble = require("nibble")
    local f = nbspec.tmpname(".jsonl")
    nbspec.write(f, json.encode({ messages = golden.tokenized[1].messages }) .. "\n")
    local ld = nibble.data.from_recipe({ data = f, chat_template = "model", seq_len = 8 }, nibble.tokenizer(L2))
    os.remove(f)
    assert.are.equal(#golden.tokenized[1].input_ids, ld.dataset:n_tokens())
    assert.are.equal(12, ld.dataset:n_masked())   -- " Hello. How can I help? </s>" and " Paris </s>"
  end)
end)

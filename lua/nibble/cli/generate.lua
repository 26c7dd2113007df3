-- nibble generate: continue a prompt with a model (greedy or sampled), printing the text as it comes
-- Usage: nibble generate --model PATH [--prompt TEXT] [--chat | --no-chat] [--system TEXT] [-n N] [--greedy] [--temp T] [--top-k K] [--top-p P] [--seed S] [--no-stop] [--ids] [--no-kv-quant]
-- A model with a chat template (an instruct model) gets the prompt as a user message in that template
-- and prints only its answer, stopping at its end of turn; --no-chat sends the prompt as plain text.
-- Without --prompt generation starts from BOS. Sampling (--temp > 0) is the default unless --greedy;
-- --temp 0 is greedy too. Generation stops at the model's EOS unless --no-stop. --ids prints the
-- generated token ids instead of the text. --top-k 0 and --top-p 1 turn those filters off. The prompt's
-- tokens plus -n must fit the model's max_position_embeddings unless --allow-long.
local cli = require("nibble.cli")   -- the option parser and how a command fails (cli.fail)
local nibble = require("nibble")

local USAGE = "usage: nibble generate --model PATH [--prompt TEXT] [--chat | --no-chat] [--system TEXT] [-n N] [--greedy] [--temp T] [--top-k K] [--top-p P] [--seed S] [--no-stop] [--ids] [--no-kv-quant] [--allow-long]\n"
  .. "  --chat         send the prompt as a user message in the model's chat template and print only the answer\n"
  .. "                 (the default for a model that has a chat template); --no-chat sends it as plain text\n"
  .. "  --system TEXT  a system message before the prompt (with --chat)\n"
  .. "  -n N           tokens to generate (default 128); the prompt's tokens + N must fit max_position_embeddings\n"
  .. "  --temp T       sampling temperature (default 0.8); 0 is greedy\n"
  .. "  --top-k K      sample among the K most likely tokens (default 40); 0 = no top-k limit\n"
  .. "  --top-p P      nucleus sampling, P in (0, 1] (default 0.95); 1 = no top-p limit\n"
  .. "  --allow-long   allow prompt + N beyond the model's max_position_embeddings\n"

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH", need = true }, { "--prompt", "-p", key = "prompt", arg = "TEXT" },
  { "-n", "--n-predict", key = "n", num = "int0" }, { "--temp", key = "temperature", num = "num0" },
  { "--top-k", key = "top_k", num = "int0" }, { "--top-p", key = "top_p", num = "prob" },
  { "--seed", key = "seed", num = "int0" }, { "--greedy", key = "greedy" }, { "--no-stop", key = "stop", set = false },
  { "--ids", key = "ids" }, { "--chat", key = "chat" }, { "--no-chat", key = "chat", set = false },
  { "--system", key = "system", arg = "TEXT" }, { "--no-kv-quant", key = "no_kv" }, { "--allow-long", key = "allow_long" },
}

return function(args)
  local a, code = cli.parse("generate", USAGE, args, SPEC)
  if not a then return code end
  local o = { n = a.n or 128, temperature = a.temperature or 0.8, top_k = a.top_k or 40, top_p = a.top_p or 0.95,
              seed = a.seed or 0, prompt = a.prompt }
  local model, greedy, ids, stop = cli.model_dir(a.model), a.greedy, a.ids, a.stop ~= false
  local ok, m = pcall(nibble.model.load, model)
  if not ok then return cli.fail("generate", m) end
  -- chat: on when asked, or by default when there is a prompt and the model has a chat template
  local chat = a.chat
  if chat == nil and o.prompt then
    local okt, tmpl = pcall(function() return m:tokenizer():chat_template() end)
    chat = okt and tmpl ~= nil
  end
  if chat then
    if not o.prompt then return cli.fail("generate", "--chat needs --prompt (the user's message)") end
    local okt, tmpl = pcall(function() return m:tokenizer():chat_template() end)
    if not okt then return cli.fail("generate", tmpl) end
    if not tmpl then
      return cli.fail("generate", ("the model %s has no chat template (tokenizer_config.json \"chat_template\", chat_template.jinja "
                  .. "or GGUF tokenizer.chat_template); without --chat the prompt is plain text"):format(a.model))
    end
    o.messages = { { role = "user", content = o.prompt } }
    if a.system then table.insert(o.messages, 1, { role = "system", content = a.system }) end
    o.prompt = nil
  elseif a.system then
    return cli.fail("generate", "--system needs a chat template (it is a system message): drop --no-chat, or put it in --prompt")
  end
  local maxpos = cli.max_position(model)
  if maxpos and not a.allow_long then
    local np = 1   -- BOS alone without a prompt (or with one that encodes to nothing), as m:generate starts
    if o.prompt or o.messages then
      local okt, pids = pcall(function()
        local t = m:tokenizer()
        if o.messages then return t:encode_chat(o.messages, { add_generation_prompt = true }) end
        return t:encode(o.prompt)
      end)
      if not okt then return cli.fail("generate", pids) end
      np = math.max(#pids, 1)
    end
    if np + o.n > maxpos then
      return cli.fail("generate", ("the prompt's %d token%s + -n %d = %d is more than the model's max_position_embeddings %d "
                  .. "(--allow-long runs it anyway)"):format(np, np == 1 and "" or "s", o.n, np + o.n, maxpos))
    end
  end
  -- an export that quantizes activations (W4A4 / W8A8 input scales) runs with them, as it ships
  -- and an FP8 KV cache (k_scale / v_scale) stores keys and values as vLLM's would, unless --no-kv-quant
  local okq, aq, naq, nkv = pcall(nibble.qmodel.activations, m, nil, { kv = not a.no_kv })
  if not okq then return cli.fail("generate", aq) end
  if naq > 0 then io.stderr:write(("nibble generate: activations quantized as exported (%d modules)\n"):format(naq)) end
  if nkv > 0 then
    io.stderr:write(("nibble generate: KV cache quantized as exported (FP8, %d layers; --no-kv-quant to turn off)\n"):format(nkv))
  end
  o.greedy = greedy or o.temperature == 0
  o.stop = stop
  if not ids then
    if o.prompt then io.stdout:write(o.prompt) end
    o.on_text = function(piece) io.stdout:write(piece); io.stdout:flush() end
  end
  o.text = not ids
  local okg, _, out = pcall(m.generate, m, o)
  if not okg then io.stdout:write("\n"); return cli.fail("generate", _) end
  if ids then
    local s = {}
    for k, v in ipairs(out) do s[k] = tostring(v) end
    io.stdout:write(table.concat(s, " "), "\n")
  else
    io.stdout:write("\n")
  end
  if aq then aq:free() end   -- the hooks lived until here
  return 0
end

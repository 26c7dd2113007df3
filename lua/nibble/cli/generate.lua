-- nibble generate: continue a prompt with a model (greedy or sampled), printing the text as it comes
-- Usage: nibble generate --model PATH [--prompt TEXT] [-n N] [--greedy] [--temp T] [--top-k K] [--top-p P] [--seed S] [--no-stop] [--ids] [--no-kv-quant]
-- Without --prompt generation starts from BOS. Sampling (--temp > 0) is the default unless --greedy;
-- --temp 0 is greedy too. Generation stops at the model's EOS unless --no-stop. --ids prints the
-- generated token ids instead of the text.
local nibble = require("nibble")

local USAGE = "usage: nibble generate --model PATH [--prompt TEXT] [-n N] [--greedy] [--temp T] [--top-k K] [--top-p P] [--seed S] [--no-stop] [--ids] [--no-kv-quant]\n"

local function err(msg)
  io.stderr:write("nibble generate: ", msg, "\n")
  return 1
end

local function clean(e) return (tostring(e):gsub("^[^\n]-:%d+: ", "")) end

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH" }, { "--prompt", "-p", key = "prompt", arg = "TEXT" },
  { "-n", "--n-predict", key = "n", num = "int0" }, { "--temp", key = "temperature", num = "num0" },
  { "--top-k", key = "top_k", num = "int0" }, { "--top-p", key = "top_p", num = "num0" },
  { "--seed", key = "seed", num = "int0" }, { "--greedy", key = "greedy" }, { "--no-stop", key = "stop", set = false },
  { "--ids", key = "ids" }, { "--no-kv-quant", key = "no_kv" },
}

return function(args)
  local a, code = require("nibble.cli").parse("generate", USAGE, args, SPEC)
  if not a then return code end
  if not a.model then
    io.stderr:write(USAGE)
    return 1
  end
  local o = { n = a.n or 128, temperature = a.temperature or 0.8, top_k = a.top_k or 40, top_p = a.top_p or 0.95,
              seed = a.seed or 0, prompt = a.prompt }
  local model, greedy, ids, stop = a.model, a.greedy, a.ids, a.stop ~= false
  local ok, m = pcall(nibble.model.load, model)
  if not ok then return err(clean(m)) end
  -- an export that quantizes activations (W4A4 / W8A8 input scales) runs with them, as it ships
  -- and an FP8 KV cache (k_scale / v_scale) stores keys and values as vLLM's would, unless --no-kv-quant
  local okq, aq, naq, nkv = pcall(nibble.qmodel.activations, m, nil, { kv = not a.no_kv })
  if not okq then return err(clean(aq)) end
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
  if not okg then io.stdout:write("\n"); return err(clean(_)) end
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

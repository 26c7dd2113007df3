-- nibble generate: continue a prompt with a model (greedy or sampled), printing the text as it comes
-- Usage: nibble generate --model PATH [--prompt TEXT] [-n N] [--greedy] [--temp T] [--top-k K] [--top-p P] [--seed S] [--no-stop] [--ids]
-- Without --prompt generation starts from BOS. Sampling (--temp > 0) is the default unless --greedy;
-- --temp 0 is greedy too. Generation stops at the model's EOS unless --no-stop. --ids prints the
-- generated token ids instead of the text.
local nibble = require("nibble")

local USAGE = "usage: nibble generate --model PATH [--prompt TEXT] [-n N] [--greedy] [--temp T] [--top-k K] [--top-p P] [--seed S] [--no-stop] [--ids]\n"

local function err(msg)
  io.stderr:write("nibble generate: ", msg, "\n")
  return 1
end

local function clean(e) return (tostring(e):gsub("^[^\n]-:%d+: ", "")) end

return function(args)
  local o = { n = 128, temperature = 0.8, top_k = 40, top_p = 0.95, seed = 0 }
  local model, greedy, ids, stop = nil, false, false, true
  local i = 1
  local nums = { ["-n"] = "n", ["--n-predict"] = "n", ["--temp"] = "temperature", ["--top-k"] = "top_k",
                 ["--top-p"] = "top_p", ["--seed"] = "seed" }
  while i <= #args do
    local a = args[i]
    local function value()
      i = i + 1
      return args[i]
    end
    if a == "--model" or a == "-m" then model = value(); if not model then return err("--model needs a PATH") end
    elseif a == "--prompt" or a == "-p" then o.prompt = value(); if not o.prompt then return err("--prompt needs TEXT") end
    elseif nums[a] then
      local v = tonumber(value() or "")
      if not v or v < 0 then return err(a .. " needs a non-negative number") end
      o[nums[a]] = v
    elseif a == "--greedy" then greedy = true
    elseif a == "--no-stop" then stop = false
    elseif a == "--ids" then ids = true
    elseif a == "-h" or a == "--help" then io.stdout:write(USAGE); return 0
    else
      io.stderr:write("nibble generate: unknown argument ", a, "\n", USAGE)
      return 1
    end
    i = i + 1
  end
  if not model then
    io.stderr:write(USAGE)
    return 1
  end
  if o.n ~= math.floor(o.n) then return err("-n needs an integer") end
  local ok, m = pcall(nibble.model.load, model)
  if not ok then return err(clean(m)) end
  -- an export that quantizes activations (W4A4 / W8A8 input scales) runs with them, as it ships
  local okq, aq, naq = pcall(nibble.qmodel.activations, m)
  if not okq then return err(clean(aq)) end
  if naq > 0 then io.stderr:write(("nibble generate: activations quantized as exported (%d modules)\n"):format(naq)) end
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

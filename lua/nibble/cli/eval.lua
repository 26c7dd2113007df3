-- nibble eval: perplexity of a model on a text file as llama.cpp's llama-perplexity computes it, and KL / top-1 agreement to a teacher
-- Usage: nibble eval --model PATH --data FILE [--ctx 512] [--chunks N] [--batch B] [--teacher PATH] [--json]
-- The text is tokenized once (with the model's tokenizer, BOS first) and cut into chunks of --ctx
-- tokens; each chunk starts with BOS and only its second half is scored. With --teacher (same
-- vocabulary) it also reports the mean KL(teacher || model) per token and the percentage of scored
-- positions where both models' top-1 tokens agree. --json prints one JSON object:
-- {"ppl":..., "nll":..., "tokens":..., "kld":..., "top1":..., "ppl_err":..., "chunks":...}.
-- An exported checkpoint runs as it ships: quantized activations (input scales) and an FP8 KV cache
-- (k_scale / v_scale: keys and values fake-quantized to FP8 E4M3 with those scales, as vLLM's FP8 cache
-- stores them) are applied and reported; --no-kv-quant keeps the KV cache in float. A --ctx beyond the
-- model's max_position_embeddings is refused unless --allow-long (positions it was not trained on).
-- PATH may be the model folder or its .safetensors file.
local cli = require("nibble.cli")   -- the option parser and how a command fails (cli.fail)
local nibble = require("nibble")

local USAGE = "usage: nibble eval --model PATH --data FILE [--ctx 512] [--chunks N] [--batch B] [--teacher PATH] [--json]\n"
  .. "         [--no-kv-quant] [--allow-long]\n"
  .. "  --ctx N        tokens per chunk (default 512); at most the model's max_position_embeddings\n"
  .. "  --allow-long   allow a --ctx beyond max_position_embeddings\n"

local function num(x)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then return "null" end
  return ("%.6f"):format(x)
end

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH", need = true }, { "--data", "-f", key = "data", arg = "FILE", need = true },
  { "--teacher", key = "teacher", arg = "PATH" }, { "--ctx", "-c", key = "ctx", num = "int+" },
  { "--chunks", key = "chunks", num = "int+" }, { "--batch", key = "batch", num = "int+" },
  { "--json", key = "json" }, { "--no-kv-quant", key = "no_kv" },
  { "--allow-long", key = "allow_long" },
}

return function(args)
  local o, code = cli.parse("eval", USAGE, args, SPEC)
  if not o then return code end
  o.model = cli.model_dir(o.model)
  if o.teacher then o.teacher = cli.model_dir(o.teacher) end
  local ctx = o.ctx or 512
  local maxpos = cli.max_position(o.model)
  if maxpos and ctx > maxpos and not o.allow_long then
    return cli.fail("eval", ("--ctx %d is more than the model's max_position_embeddings %d (--allow-long runs it anyway)")
      :format(ctx, maxpos))
  end
  local ok, m = pcall(nibble.model.load, o.model)
  if not ok then return cli.fail("eval", m) end
  local bad = cli.file_problem(o.data)   -- after the model, whose errors come first
  if bad then return cli.fail("eval", bad) end
  -- an export that quantizes activations (W4A4 / W8A8 input scales) runs with them, as it ships
  local okq, aq, naq, nkv = pcall(nibble.qmodel.activations, m, nil, { kv = not o.no_kv })
  if not okq then return cli.fail("eval", aq) end
  if naq > 0 then io.stderr:write(("nibble eval: activations quantized as exported (%d modules)\n"):format(naq)) end
  if nkv > 0 then
    io.stderr:write(("nibble eval: KV cache quantized as exported (FP8, k_scale / v_scale of %d layers; "
                     .. "--no-kv-quant to turn off)\n"):format(nkv))
  elseif o.no_kv then
    io.stderr:write("nibble eval: KV cache not quantized (--no-kv-quant)\n")
  end
  local teacher
  if o.teacher then
    local okt, t = pcall(nibble.model.load, o.teacher)
    if not okt then return cli.fail("eval", t) end
    teacher = t
  end
  local t0 = os.clock()
  local okr, r = pcall(m.eval, m, { data = o.data, ctx = ctx, chunks = o.chunks, batch = o.batch,
                                    teacher = teacher })
  if not okr then return cli.fail("eval", r) end
  if o.json then
    io.stdout:write(('{"ppl": %s, "nll": %s, "tokens": %d, "kld": %s, "top1": %s, "ppl_err": %s, "chunks": %d}\n')
      :format(num(r.ppl), num(r.nll), r.tokens, num(r.kld), num(r.top1), num(r.ppl_err), r.chunks))
  else
    io.stdout:write(("model:   %s\n"):format(tostring(m)))
    io.stdout:write(("data:    %s (%d chunk%s of %d tokens, %d scored)\n"):format(o.data, r.chunks,
      r.chunks == 1 and "" or "s", ctx, r.tokens))
    io.stdout:write(("PPL = %.4f +/- %.5f   (mean NLL %.6f)\n"):format(r.ppl, r.ppl_err, r.nll))
    if teacher then
      io.stdout:write(("KLD(teacher || model) = %.6f   top-1 agreement = %.3f%%\n"):format(r.kld, r.top1))
    end
    io.stdout:write(("(%.1f s CPU)\n"):format(os.clock() - t0))
  end
  if aq then aq:free() end   -- the hooks lived until here
  return 0
end

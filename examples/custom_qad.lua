-- A QAD loop written in Lua with the step-level API: the loss mixes KL(teacher‖student) on the logits
-- (nibble.distill.kl) with a mean-squared error between one layer's hidden states, written here in
-- plain Lua. Losses add and scale; loss:backward() sends both gradients into the student's backward.
--   nibble run examples/custom_qad.lua [model=DIR|GGUF] [data=FILE] [eval_data=FILE] [steps=40]
--       [layer=3] [mse_weight=0.05] [lr=1e-4] [batch=4] [seq_len=256] [out=DIR]
--       [dtype=bf16|f16|f32: the exported unquantized tensors; default the model's if BF16/F16, else bf16]
-- Defaults use ../shared/data (stories260K and TinyStories). `layer` picks hidden state k (1 = the
-- embeddings, n_layers + 1 = the final norm's output), as model:forward{hidden = true} numbers them.
-- A refused request (a bad layer, a missing file) prints one line and exits 1, as nibble's own recipes do
-- (nibble.cli.program); a bug in the script keeps its traceback.
local nibble = nibble or require("nibble")

return require("nibble.cli").program(function()
  local shared = os.getenv("NIBBLE_SHARED_DATA") or "../shared/data"
  local model_path = arg.model or (shared .. "/stories260K/hf")
  local data_path = arg.data or (shared .. "/text/tinystories_train_head_2MiB.txt")
  local eval_path = arg.eval_data or (shared .. "/text/tinystories_valid_head_776KiB.txt")
  local steps = tonumber(arg.steps or 40)
  local layer = tonumber(arg.layer or 3)
  local w_mse = tonumber(arg.mse_weight or 0.05)
  local lr = tonumber(arg.lr or 1e-4)

  -- the files and the layer are checked before anything is loaded; cli.user_call reports a model that
  -- cannot be read as the user's error (one line), not as a bug of this script
  local cli = require("nibble.cli")
  for _, p in ipairs { data_path, eval_path } do
    local bad = cli.file_problem(p)
    if bad then error(bad, 0) end
  end
  local n_layers = cli.user_call(nibble.model.read_config, model_path).n_layers
  if not layer or layer % 1 ~= 0 or layer < 1 or layer > n_layers + 1 then
    error(("layer must be in 1..%d, got %s"):format(n_layers + 1, tostring(arg.layer)), 0)
  end

  -- the teacher, and the student quantized by the normal PTQ pipeline (NVFP4 W4A16, max), not exported yet
  local teacher = nibble.model.load(model_path)
  local student_model = nibble.model.load(model_path)
  local ptq = nibble.ptq.run(nibble.recipe { extends = "units/nvfp4_w4a16", model = { path = model_path } }, nil,
                             { model = student_model, no_export = true, quiet = true })
  local student = nibble.qad.student(student_model, ptq.qmodel)   -- fake quant on

  local tok = student_model:tokenizer()
  local ds = nibble.data.load(data_path, { tokenizer = tok, separator = "<|endoftext|>" })
  local loader = ds:loader { seq_len = tonumber(arg.seq_len or 256), batch = tonumber(arg.batch or 4), seed = 1,
                             random_offset = true, shuffle = true, drop_last = true }

  local names, params = student:params()
  local opt = nibble.optim.adamw(params, { lr = lr, weight_decay = 0 })
  local sched = nibble.optim.schedule { lr = lr, min_lr = lr / 10, warmup = math.floor(steps / 10), total = steps }

  -- mean squared error of two [rows, hidden] tensors and its gradient w.r.t. the first, in Lua
  local function mse(a, b)
    local n = a:numel()
    local pa, pb = a:data("const float *"), b:data("const float *")
    local g = nibble.zeros("f32", a.shape)
    local pg = g:data("float *")
    local s = 0
    for i = 0, n - 1 do
      local d = pa[i] - pb[i]
      s = s + d * d
      pg[i] = 2 * d / n
    end
    return nibble.qad.loss(s / n, { [a] = g })
  end

  local eval_tokens = tok:encode_tokens(nibble.data.read_text(eval_path, "eval_data"):sub(1, 400000))
  local function evaluate()
    local r = student_model:eval { tokens = eval_tokens, ctx = 256, chunks = 20, teacher = teacher }
    return ("PPL %.4f  KLD %.5f  top-1 %.2f%%"):format(r.ppl, r.kld, r.top1)
  end
  print("PTQ:            " .. evaluate())

  for step = 1, steps do
    local b = loader:next()
    local t_logits, t_hidden = teacher:forward(b.tokens, { hidden = true })
    local s_logits, s_hidden = student:forward(b.tokens, { hidden = true })
    local kl = nibble.distill.kl(s_logits, t_logits, { mask = b.mask })
    local hid = mse(s_hidden[layer], t_hidden[layer])
    local loss = kl + w_mse * hid
    loss:backward()
    local grads = student:grads(names)
    local norm = nibble.optim.clip_grad_norm(grads, 1.0)
    opt:step(grads, sched(step - 1))
    student:zero_grad()
    if step == 1 or step % 10 == 0 or step == steps then
      print(("step %3d  loss %.5f  kl %.5f  mse(h%d) %.5f  |g| %.3f  lr %.2e"):format(step, loss.value, kl.value, layer,
        hid.value, norm, sched(step - 1)))
    end
  end
  print("QAD (KL + MSE): " .. evaluate())

  if arg.out then
    ptq.qmodel:export(arg.out, { layout = arg.layout or "modelopt", dtype = arg.dtype })
    print("exported " .. arg.out)
  end
end)

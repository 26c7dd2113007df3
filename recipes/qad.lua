-- Quantization-aware distillation as a recipe: PTQ, then QAD of the fake-quantized student from the
-- original model (the teacher), then the export and an eval table (teacher / PTQ / QAD).
--   nibble run recipes/qad.lua model=PATH data=FILE out=DIR [format=nvfp4_w4a16] [algorithm=max]
--       [calib=FILE] [eval_data=FILE] [steps=200] [lr=1e-5] [min_lr=0] [warmup=steps/20]
--       [seq_len=512] [batch=8] [grad_accum=1] [kd=kl|reverse_kl|topk] [topk=64] [temperature=1]
--       [lm_loss=false] [sft_mask=true] [layout=modelopt|compressed-tensors] [metrics=FILE.jsonl]
--       [dtype=bf16|f16|f32: the exported unquantized tensors; default the source's if BF16/F16, else bf16]
--       [checkpoint_every=N] [checkpoint_dir=DIR] [resume=true] [eval_every=N] [ctx=512] [chunks=N]
--       [seed=1] [teacher=PATH] [lr_scale_unquantized=1: lr multiplier of the parameters left in full precision]
--       [lm_loss=true kd_loss_scale=S: loss = CE + S * KD] [t2=true: KD scaled by T^2] [topk_norm=renorm|student_full|ghost]
--       [ignore_index=-100] [weight_decay=0] [beta1=0.9] [beta2=0.999] [eps=1e-8] [clip=1] [samples=128: calibration rows]
--       [calib_seq_len=seq_len] [pack=true] [eos=true|false] [separator=TEXT] [text_field=NAME]
--       [allow_long=true: seq_len beyond the model's max_position_embeddings]
--       [overwrite=true: start again over out's checkpoints (removes them)]
-- Unknown keys and impossible settings are errors before any compute; --help prints this. The same run
-- as a command: nibble qad --model PATH --data FILE --out DIR [--KEY VALUE ...] (the same keys).
-- Example on stories260K (from the test data, ../shared/data): QAD brings the PTQ model from
-- KLD 0.0941 / PPL 4.2412 to 0.0246 / 3.9911 (the original model: PPL 3.8666). Plain-text data is split
-- into documents and marked as the model's tokenizer marks them (here BOS only):
--   nibble run recipes/qad.lua model=../shared/data/stories260K/hf
--       data=../shared/data/text/tinystories_train_head_2MiB.txt
--       eval_data=../shared/data/text/tinystories_valid_head_776KiB.txt steps=200 batch=8 seq_len=512 lr=2e-4
--       chunks=100 out=/tmp/stories-qad
-- The defaults are those of NVIDIA ModelOpt's QAD: the loss is KL(teacher‖student) on the logits at
-- temperature 1 with no LM loss, and the scales PTQ calibrated stay frozen, so the export ships what was
-- trained. Ctrl-C saves a checkpoint (in out-checkpoints unless checkpoint_dir) and exits with code 130;
-- run again with resume=true to continue it bit for bit.
local nibble = nibble or require("nibble")
local settings = require("nibble.qad_settings")   -- the keys, their types and defaults (as `nibble qad`'s)

return require("nibble.util").program(function()
  local a = nibble.recipe.args(arg, "qad.lua", settings.names())
  if not a then return nil end   -- --help
  local r = nibble.qad.recipe_of(settings.read(a.str, "qad.lua"), "qad.lua")
  return r
end)

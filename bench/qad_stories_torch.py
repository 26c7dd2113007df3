#!/usr/bin/env python3
"""PyTorch replica of bench/qad_stories.lua on the exact rows nibble reads, to check nibble's QAD step against
torch (bench/README.md): HF LlamaForCausalLM stories260K in F32, NVFP4 W4A16 fake quant on every linear but
lm_head (ModelOpt's arithmetic, bench_qad.nvfp4_fake; per-tensor amax from max calibration, shared by q/k/v and
gate/up, frozen; straight-through), KL(teacher || student) summed over the vocabulary and averaged over every
position, clip_grad_norm_(1.0), torch.optim.AdamW (weight decay 0), nibble's warmup + cosine schedule; eval as
llama.cpp (ctx 512, BOS first, second half of each chunk scored).
  build/nibble run bench/qad_stories.lua dump=/tmp/qad-rows [eos=1] [seed=N]     # the rows and eval ids
  /root/nbvenv/bin/python bench/qad_stories_torch.py --dump /tmp/qad-rows [--steps 200] [--lr 1e-4]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_qad import quantize  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="the dir qad_stories.lua dump=DIR wrote")
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "../../shared/data/stories260K/hf"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--min_lr", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--bos_first", action="store_true", help="put BOS at position 0 of every row")
    ap.add_argument("--skip_first", type=int, default=0, help="loss only on positions >= this")
    ap.add_argument("--chunks", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM
    teacher = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    student = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    bos = teacher.config.bos_token_id

    quantize(student)   # bench_qad.py's fake quant: NVFP4 on every Linear but lm_head, STE, fused amax

    valid = torch.from_numpy(np.fromfile(os.path.join(a.dump, "valid.i32"), dtype=np.int32).astype(np.int64))

    def evaluate(model, with_teacher):
        n_ctx, first = 512, 256
        nll = kld = 0.0
        cnt = top = 0
        with torch.no_grad():
            for c in range(a.chunks):
                toks = valid[c * n_ctx:(c + 1) * n_ctx].clone()
                toks[0] = bos
                ls = F.log_softmax(model(toks[None]).logits[0].double()[first:n_ctx - 1], -1)
                tgt = toks[first + 1:n_ctx]
                nll -= ls.gather(1, tgt[:, None]).sum().item()
                cnt += len(tgt)
                if with_teacher:
                    lt = F.log_softmax(teacher(toks[None]).logits[0].double()[first:n_ctx - 1], -1)
                    kld += (lt.exp() * (lt - ls)).sum().item()
                    top += (lt.argmax(-1) == ls.argmax(-1)).sum().item()
        return math.exp(nll / cnt), kld / cnt, 100.0 * top / cnt

    def row(name, model, with_teacher=True):
        p, k, t = evaluate(model, with_teacher)
        print(f"{name:10s} PPL {p:.4f}" + (f"  KLD {k:.5f}  top-1 {t:.2f}%" if with_teacher else ""), flush=True)

    row("teacher", teacher, False)
    row("PTQ", student)
    rows = torch.from_numpy(np.fromfile(os.path.join(a.dump, "train_rows.i32"), dtype=np.int32).astype(np.int64))
    rows = rows.reshape(-1, 513)
    if a.bos_first:
        rows[:, 0] = bos
    opt = torch.optim.AdamW(student.parameters(), lr=a.lr, weight_decay=0.0)

    def lr_at(step):   # nibble's nb_lr_at: linear warmup from 0, then cosine to min_lr
        if step < a.warmup:
            return a.lr * step / max(a.warmup, 1)
        prog = (step - a.warmup) / max(a.steps - a.warmup, 1)
        return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * prog))

    t0 = time.time()
    for s in range(a.steps):
        b = rows[(s * a.batch) % rows.shape[0]:][:a.batch]
        x = b[:, :-1]
        with torch.no_grad():
            tl = teacher(x).logits[:, a.skip_first:]
        sl = student(x).logits[:, a.skip_first:]
        kd = F.kl_div(F.log_softmax(sl, -1), F.log_softmax(tl, -1), log_target=True, reduction="none").sum(-1).mean()
        kd.backward()
        gn = torch.nn.utils.clip_grad_norm_(student.parameters(), a.clip if a.clip > 0 else float("inf"))
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s % 20 == 0 or s == a.steps - 1:
            print(json.dumps({"step": s + 1, "kd": round(kd.item(), 5), "grad_norm": round(gn.item(), 4),
                              "lr": lr_at(s), "seconds": round(time.time() - t0, 1)}), file=sys.stderr, flush=True)
    row("QAD", student)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""nibble vs PyTorch on the CPU: one QAD optimizer step on the same model, batch, sequence length and threads.
A step = teacher forward (no_grad) + student forward with NVFP4 fake-quant weights (straight-through; W4A16 on
every nn.Linear whose in_features 16 divides, lm_head excluded; per-tensor amax frozen at the start and shared by
q/k/v and gate/up) + KL(teacher || student) summed over the vocabulary and averaged over every position + backward
+ clip_grad_norm_(1.0) + torch.optim.AdamW (lr 1e-5). The NVFP4 fake quant is ModelOpt's arithmetic in torch ops
(block amax / (6 * s2) cast to E4M3, values rounded to the E2M1 grid), as ModelOpt's CPU path computes it.

  bench_qad.py compare --bin BUILD/bench/bench_qad [--repeat 2]   both sides, best of N, ratios
  bench_qad.py run --model DIR|GGUF ...                            the PyTorch side alone (JSON)
bench/bench_qad.sh wraps `compare`."""
import argparse
import json
import os
import subprocess
import sys
import time

import results_json
from results_json import run_json


def load(path):
    import torch
    from transformers import AutoModelForCausalLM
    if path.endswith(".gguf"):
        # transformers' own GGUF reader (dequantized, q/k permuted back to HF's layout); from_pretrained's GGUF
        # path would also want accelerate
        from transformers import AutoConfig, LlamaConfig
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
        cfg = dict(load_gguf_checkpoint(path, return_tensors=False)["config"])
        cfg.pop("model_type", None)
        cfg.pop("_model_name_or_path", None)
        model = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), dtype=torch.float32)
        sd = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise SystemExit(f"GGUF load: missing {missing[:5]}, unexpected {unexpected[:5]}")
        model.tie_weights()
        return model
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def nvfp4_fake(w, gamax):
    import torch
    s2 = gamax / (6.0 * 448.0)
    wb = w.reshape(-1, 16)
    amax = wb.abs().amax(dim=1, keepdim=True)
    bs = (amax / (6.0 * s2)).clamp(min=2.0 ** -9, max=448.0).to(torch.float8_e4m3fn).to(torch.float32)
    scale = bs * s2
    x = wb / scale
    ax = x.abs().clamp(max=6.0)
    q = torch.where(ax < 2.0, torch.round(ax * 2.0) / 2.0, torch.where(ax < 4.0, torch.round(ax), torch.round(ax / 2.0) * 2.0))
    return (torch.sign(x) * q * scale).reshape(w.shape)


def quantize(model):
    import torch
    import torch.nn.functional as F
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")
               and m.in_features % 16 == 0}
    # fused siblings share the per-tensor amax (as nibble and ModelOpt do)
    amax = {n: m.weight.detach().abs().max() for n, m in linears.items()}
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        for n in list(linears):
            if n.endswith("." + group[0]):
                names = [n[: -len(group[0])] + g for g in group if n[: -len(group[0])] + g in linears]
                shared = torch.stack([amax[x] for x in names]).max()
                for x in names:
                    amax[x] = shared

    def make_forward(mod, a):
        def forward(x):
            w = mod.weight
            wq = w + (nvfp4_fake(w, a) - w).detach()   # straight-through
            return F.linear(x, wq, mod.bias)
        return forward

    for n, m in linears.items():
        m.forward = make_forward(m, amax[n].clone())
    return len(linears)


def bench(a):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    teacher = load(a.model)
    student = load(a.model)
    teacher.train(False)
    student.train(False)   # no dropout either way; gradients still flow
    for p in teacher.parameters():
        p.requires_grad_(False)
    nq = quantize(student)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    V = student.config.vocab_size

    def step():
        ids = torch.randint(0, V, (a.batch, a.seq), generator=gen)
        with torch.no_grad():
            tl = teacher(ids).logits
        sl = student(ids).logits
        kd = F.kl_div(F.log_softmax(sl.float(), -1), F.log_softmax(tl.float(), -1), log_target=True,
                      reduction="none").sum(-1).mean()
        kd.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return kd.item()

    step()   # warm-up
    t0 = time.perf_counter()
    c0 = time.process_time()
    kd = float("nan")
    for _ in range(a.iters):
        kd = step()
    dt = (time.perf_counter() - t0) / a.iters
    cpu = (time.process_time() - c0) / a.iters
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "model": a.model, "batch": a.batch,
                      "seq": a.seq, "threads": torch.get_num_threads(), "quantized_linears": nq,
                      "qad_tok_s": round(a.batch * a.seq / dt, 1),
                      "qad_tok_cpu_s": round(a.batch * a.seq / cpu, 1), "step_s": round(dt, 3), "kd": kd}))


def compare(a):
    cases = []
    if os.path.isdir(a.stories):
        cases.append(("stories260K", a.stories, 8, 512, 6))
    big = os.path.join(a.work, "llama512")
    if os.path.exists(os.path.join(big, "model.safetensors")):
        cases.append(("llama dim512 L8 V32000 (58M)", big, 4, 256, 3))
    else:
        print(f"(skipping the 58M Llama: make it with bench/bench_model.py make-random {big})")
    if a.smollm and os.path.exists(a.smollm):
        cases.append(("SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)", a.smollm, 4, 256, 2))
    rows = []
    env = results_json.bench_env(a.isa)
    first = None
    for name, path, batch, seq, iters in cases:
        common = ["--batch", str(batch), "--seq", str(seq), "--threads", str(a.threads), "--iters", str(iters)]
        best = {}
        for _ in range(a.repeat):   # interleaved, best of N: the machine may be shared
            n = run_json([a.bin, "--model", path] + common, env)
            p = run_json([sys.executable, __file__, "run", "--model", path] + common, env)
            if first is None:
                first = n
                print(n.get("gemm", ""))
            for k, r in (("nibble", n), ("pytorch", p)):
                if k not in best or r["qad_tok_s"] > best[k]["qad_tok_s"]:
                    best[k] = r
        ratio = best["nibble"]["qad_tok_s"] / best["pytorch"]["qad_tok_s"]
        cpu_ratio = best["nibble"]["qad_tok_cpu_s"] / best["pytorch"]["qad_tok_cpu_s"]
        rows.append((name, batch, seq, best["nibble"]["qad_tok_s"], best["pytorch"]["qad_tok_s"], ratio, cpu_ratio,
                     best["nibble"]["quantized_linears"], best["pytorch"]["quantized_linears"]))
    print(f"QAD step (teacher fwd + NVFP4 W4A16 fake-quant student fwd/bwd + KL + clip + AdamW), {a.threads} threads,"
          f" best of {a.repeat}:")
    print(f"{'model':48s} {'B x T':>9s} {'nibble tok/s':>13s} {'PyTorch tok/s':>14s} {'ratio':>7s} {'per CPU-s':>10s}")
    for name, b, t, n, p, r, rc, qn, qp in rows:
        print(f"{name:48s} {b:>4d}x{t:<4d} {n:13.1f} {p:14.1f} {r:6.2f}x {rc:9.2f}x  ({qn}/{qp} quantized linears)")
    print("(per CPU-s: the ratio of tokens per CPU-second of each process, steadier on a shared machine)")
    load = ""
    try:
        load = f"load average: {os.getloadavg()[0]:.2f}"
        print(load)
    except OSError:
        pass
    isa, isa_note = results_json.ISA_MODES[a.isa]
    results_json.write("qad" + (f"-{a.isa}" if a.isa else ""), f"QAD step vs PyTorch on the CPU{isa}", first or {},
                       a.threads,
                       [{"caption": f"QAD step (teacher fwd + NVFP4 W4A16 fake-quant student fwd/bwd + KL + clip + "
                                    f"AdamW), {a.threads} threads, best of {a.repeat}",
                         "columns": ["model", "B x T", "nibble tok/s", "PyTorch tok/s", "ratio", "ratio per CPU-s",
                                     "quantized linears nibble", "PyTorch"],
                         "rows": [[name, f"{b}x{t}", n, p, round(r, 2), round(rc, 2), qn, qp]
                                  for name, b, t, n, p, r, rc, qn, qp in rows]}],
                       [load, "environment: " + isa_note])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--batch", type=int, default=4)
    r.add_argument("--seq", type=int, default=256)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--iters", type=int, default=3)
    c = sub.add_parser("compare")
    c.add_argument("--bin", required=True)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--repeat", type=int, default=2)
    c.add_argument("--work", default="/tmp/nibble-bench-model")
    c.add_argument("--stories", default="../shared/data/stories260K/hf")
    c.add_argument("--isa", choices=["avx2", "prescott-pick"],
                   help="avx2: hold both sides to AVX2 (an older CPU's path); "
                        "prescott-pick: OpenBLAS as it loads on family 6 model 207")
    c.add_argument("--smollm", default=os.path.expanduser("~/.cache/nibble/SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    bench(a) if a.cmd == "run" else compare(a)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""nibble vs PyTorch on the CPU: the same HF model directory, batch, sequence length and thread count.
Forward = all logits (PyTorch under no_grad); train step = forward + mean next-token cross-entropy
(labels = input ids, HF shifts them) + backward into every parameter's gradient (no optimizer).

  bench_model.py compare --bin BUILD/bench/bench_model [--repeat 3]   both sides, best of N, ratios
  bench_model.py run --model DIR ...                                    the PyTorch side alone (JSON)
  bench_model.py make-random DIR --dim 512 --layers 8 ...               a random Llama for both sides
bench/bench_model.sh wraps `compare`."""
import argparse
import json
import os
import subprocess
import sys
import time

import results_json
from results_json import run_json


def make_random(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).float()
    model.save_pretrained(a.dir, safe_serialization=True)
    print(f"wrote {a.dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


def bench(a):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation=a.attn)
    model.train(False)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=gen)
    fwd_s = train_s = 0.0
    loss = float("nan")
    with torch.no_grad():
        model(ids)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(a.iters):
            model(ids).logits
        fwd_s = (time.perf_counter() - t0) / a.iters
        fwd_cpu = (time.process_time() - c0) / a.iters
    out = model(ids, labels=ids)
    out.loss.backward()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.iters):
        out = model(ids, labels=ids)
        out.loss.backward()
    train_s = (time.perf_counter() - t0) / a.iters
    train_cpu = (time.process_time() - c0) / a.iters
    loss = out.loss.item()
    n = a.batch * a.seq
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "model": a.model, "batch": a.batch, "seq": a.seq,
                      "threads": torch.get_num_threads(), "attn": a.attn, "fwd_tok_s": round(n / fwd_s, 1),
                      "train_tok_s": round(n / train_s, 1), "fwd_tok_cpu_s": round(n / fwd_cpu, 1),
                      "train_tok_cpu_s": round(n / train_cpu, 1), "loss": loss}))


def compare(a):
    here = os.path.dirname(os.path.abspath(__file__))
    big = os.path.join(a.work, "llama512")
    if not os.path.exists(os.path.join(big, "model.safetensors")):
        subprocess.run([sys.executable, __file__, "make-random", big], check=True)
    cases = []
    if os.path.isdir(a.stories):
        cases.append(("stories260K", a.stories, 4, 512, 10))
    else:
        print(f"(skipping stories260K: {a.stories} is absent)")
    cases.append(("llama d512 L8 V32000 (58M)", big, 4, 256, 3))
    rows = []
    env = results_json.bench_env(a.isa)
    first = None
    for name, path, batch, seq, iters in cases:
        common = ["--batch", str(batch), "--seq", str(seq), "--threads", str(a.threads), "--iters", str(iters)]
        best = {}
        for r in range(a.repeat):   # interleaved, best of N: the machine may be shared
            for impl, cmd in (("nibble", [a.bin, "--model", path] + common),
                              ("nibble_recompute", [a.bin, "--model", path, "--recompute", "always"] + common),
                              ("pytorch", [sys.executable, __file__, "run", "--model", path] + common)):
                j = run_json(cmd, env)
                if impl == "nibble" and first is None:
                    first = j
                    print(j.get("gemm", ""))
                b = best.setdefault(impl, {"fwd": 0.0, "train": 0.0, "fwd_cpu": 0.0, "train_cpu": 0.0})
                for k, key in (("fwd", "fwd_tok_s"), ("train", "train_tok_s"), ("fwd_cpu", "fwd_tok_cpu_s"),
                               ("train_cpu", "train_tok_cpu_s")):
                    b[k] = max(b[k], j[key])
        rows.append((name, batch, seq, best))
    try:
        load = "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = ""
    print(f"threads {a.threads}, best of {a.repeat}; {load}; ratio = nibble / PyTorch")
    print("tokens/s by wall clock, and tokens per CPU-second (all threads' CPU time: with one thread it")
    print("estimates the uncontended speed on a shared machine)")
    print(f"{'model':30} {'B x T':>7} {'':>5} {'nibble':>9} {'PyTorch':>9} {'ratio':>6} {'recompute':>9} {'ratio':>6}"
          f" | {'CPU-s: nibble':>13} {'PyTorch':>9} {'ratio':>6}")
    table = []
    for name, batch, seq, best in rows:
        for kind in ("fwd", "train"):
            n, t, nr = best["nibble"][kind], best["pytorch"][kind], best["nibble_recompute"][kind]
            nc, tc = best["nibble"][kind + "_cpu"], best["pytorch"][kind + "_cpu"]
            print(f"{name:30} {f'{batch}x{seq}':>7} {kind:>5} {n:9.1f} {t:9.1f} {n / t:6.2f} {nr:9.1f} {nr / t:6.2f}"
                  f" | {nc:13.1f} {tc:9.1f} {nc / tc:6.2f}")
            table.append([name, f"{batch}x{seq}", kind, n, t, round(n / t, 2), nr, round(nr / t, 2), nc, tc,
                          round(nc / tc, 2)])
    isa, isa_note = results_json.ISA_MODES[a.isa]
    results_json.write("model" + (f"-{a.isa}" if a.isa else ""), f"Model runtime vs PyTorch on the CPU{isa}",
                       first or {}, a.threads,
                       [{"caption": f"tokens/s, {a.threads} threads, best of {a.repeat}; ratio = nibble / PyTorch",
                         "columns": ["model", "B x T", "pass", "nibble tok/s", "PyTorch tok/s", "ratio",
                                     "nibble recompute tok/s", "ratio", "nibble tok/CPU-s", "PyTorch tok/CPU-s",
                                     "ratio"], "rows": table}],
                       [f"{load}", "fwd = all logits; train = forward + cross-entropy + backward (no optimizer)",
                        "environment: " + isa_note])


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--bin", required=True, help="the bench_model executable")
    c.add_argument("--stories", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "../../shared/data/stories260K/hf"))
    c.add_argument("--work", default="/tmp/nibble-bench-model")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--repeat", type=int, default=3)
    c.add_argument("--isa", choices=["avx2", "prescott-pick"],
                   help="avx2: hold both sides to AVX2 (an older CPU's path); "
                        "prescott-pick: OpenBLAS as it loads on family 6 model 207")
    r = sub.add_parser("make-random")
    r.add_argument("dir")
    r.add_argument("--dim", type=int, default=512)
    r.add_argument("--layers", type=int, default=8)
    r.add_argument("--heads", type=int, default=8)
    r.add_argument("--kv-heads", type=int, default=8)
    r.add_argument("--ffn", type=int, default=1376)
    r.add_argument("--vocab", type=int, default=32000)
    b = sub.add_parser("run")
    b.add_argument("--model", required=True)
    b.add_argument("--batch", type=int, default=4)
    b.add_argument("--seq", type=int, default=256)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--iters", type=int, default=5)
    b.add_argument("--attn", default="sdpa")
    a = p.parse_args()
    if a.cmd == "make-random":
        make_random(a)
    elif a.cmd == "compare":
        compare(a)
    else:
        bench(a)


if __name__ == "__main__":
    sys.exit(main())

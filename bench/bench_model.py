#!/usr/bin/env python3
"""PyTorch side of bench/bench_model.sh: the same HF model directory, the same batch, sequence length
and thread count as bench_model (C); forward = all logits under no_grad, train step = forward +
next-token cross-entropy (labels = input ids, HF shifts them) + backward. Prints one JSON line.

Also: `bench_model.py make-random DIR --dim 512 --layers 8 ...` writes a random Llama to DIR with
transformers (float32 safetensors), so that both sides load identical weights."""
import argparse
import json
import sys
import time


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
        t0 = time.perf_counter()
        for _ in range(a.iters):
            model(ids).logits
        fwd_s = (time.perf_counter() - t0) / a.iters
    out = model(ids, labels=ids)
    out.loss.backward()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        out = model(ids, labels=ids)
        out.loss.backward()
    train_s = (time.perf_counter() - t0) / a.iters
    loss = out.loss.item()
    n = a.batch * a.seq
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "model": a.model, "batch": a.batch, "seq": a.seq,
                      "threads": torch.get_num_threads(), "attn": a.attn, "fwd_tok_s": round(n / fwd_s, 1),
                      "train_tok_s": round(n / train_s, 1), "loss": loss}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
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
    make_random(a) if a.cmd == "make-random" else bench(a)


if __name__ == "__main__":
    sys.exit(main())

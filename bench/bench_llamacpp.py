#!/usr/bin/env python3
"""Prompt processing throughput of llama.cpp (through llama-cpp-python): one sequence of N prompt
tokens evaluated in one batch (n_batch = n_ubatch = N), logits for the last position only, no
generation; the peer of bench_pp.c. Prints one JSON line like bench_pp (median and best wall time
over --iters runs after a warm-up, median process CPU time), once per flash-attention setting asked for.
Usage: bench_llamacpp.py --model PATH [--tokens 512] [--threads 2] [--iters 5] [--ids FILE] [--fa off|on|both]
                         [--ref-logits FILE]
--ids reads the prompt's token ids (one per line, as bench_pp --ids-out writes them); without it the
ids are random with BOS first. --ref-logits (bench_pp --logits-out) adds the largest difference
between the two last-position logit rows. Run with OPENBLAS_NUM_THREADS=1: numpy's OpenBLAS threads otherwise
spin next to llama.cpp's (bench_llamacpp.sh sets it)."""
import argparse
import json
import random
import statistics
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama


def bench(a, ids, flash_attn):
    t0 = time.perf_counter()
    llm = Llama(model_path=a.model, n_ctx=a.tokens, n_batch=a.tokens, n_ubatch=a.tokens, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, flash_attn=flash_attn, verbose=False)
    load_s = time.perf_counter() - t0
    if ids is None:
        rng = random.Random(1)
        ids = [rng.randrange(llm.n_vocab()) for _ in range(a.tokens)]
        ids[0] = llm.token_bos()

    def run():
        llm.reset()   # n_tokens = 0: eval() then drops the whole KV cache before decoding
        t, c = time.perf_counter(), time.process_time()
        llm.eval(ids)
        return time.perf_counter() - t, time.process_time() - c

    run()   # warm-up
    runs = [run() for _ in range(a.iters)]
    times = [r[0] for r in runs]
    cpu = statistics.median(r[1] for r in runs)   # CPU time of all threads, spinning included
    nv = llm.n_vocab()
    # the last position's row (logits_all is off)
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(nv,)).astype(np.float32)
    am = int(np.argmax(logits))
    med = statistics.median(times)
    out = {"impl": "llama.cpp", "model": a.model, "tokens": a.tokens, "threads": a.threads, "iters": a.iters,
           "flash_attn": flash_attn, "load_s": round(load_s, 3), "median_s": round(med, 5),
           "best_s": round(min(times), 5), "cpu_median_s": round(cpu, 5), "pp_tok_s": round(a.tokens / med, 1),
           "best_tok_s": round(a.tokens / min(times), 1), "cpu_tok_s": round(a.tokens / cpu, 1), "last_argmax": am,
           "llama_cpp_python": llama_cpp.__version__}
    if a.ref_logits:
        ref = np.fromfile(a.ref_logits, dtype=np.float32)
        out["max_abs_diff"] = float(np.max(np.abs(ref - logits))) if ref.size == nv else None
        out["ref_absmax"] = float(np.max(np.abs(ref))) if ref.size == nv else None
    llm.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ids")
    ap.add_argument("--fa", choices=["off", "on", "both"], default="off")
    ap.add_argument("--ref-logits")
    a = ap.parse_args()
    ids = None
    if a.ids:
        with open(a.ids) as f:
            ids = [int(x) for x in f.read().split()]
        if len(ids) != a.tokens:
            raise SystemExit(f"bench_llamacpp: {a.ids} has {len(ids)} ids, expected {a.tokens}")
    for fa in {"off": [False], "on": [True], "both": [False, True]}[a.fa]:
        print(json.dumps(bench(a, ids, fa)), flush=True)


if __name__ == "__main__":
    main()

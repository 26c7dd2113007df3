#!/usr/bin/env bash
# Prompt processing (llama-bench's "pp512": one sequence of N prompt tokens in one batch, last
# position's logits only, no generation) in tokens/s: nibble (bench_pp) against llama.cpp (through
# llama-cpp-python, bench_llamacpp.py), same model file, same prompt ids, same thread count.
# Models: stories260K (F32) and, when present, SmolLM2-135M-Instruct Q4_1 plus F32/F16 GGUFs made from
# it by gguf_dequant.py (the same numbers nibble computes with, since nibble dequantizes to F32 at load).
# llama.cpp runs twice, flash attention off (llama-cpp-python's default) and on; ratios are against
# the faster of the two. Speeds are prompt tokens / wall time of one forward after a warm-up: the
# median and the best of --iters runs; on a shared machine the best run is the one least disturbed.
# The last column checks both computed the same thing: last-position argmax, and the largest logit
# difference (llama.cpp keeps its KV cache in F16, and multiplies Q4_1 weights with activations
# rounded to Q8_1, so the Q4_1 row differs more).
# llama.cpp's OpenMP threads spin at barriers by default (OMP_WAIT_POLICY=active); on a shared,
# loaded machine a spinning thread burns the time slice its descheduled peer needs: llama.cpp with 2
# threads ran 3.4x slower than with passive waiting (SmolLM2 F32, load ~5). So this script sets
# passive unless --omp-wait active is given; on an idle machine active, llama.cpp's own default, was
# about 9% faster (774 vs 708 tok/s), so use it when the machine is yours.
# llama-cpp-python here was built from source for this CPU without AMX (AVX-512 on, AMX off):
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON
#     -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
#     -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF" pip install llama-cpp-python
# With GGML_NATIVE=ON the AMX path is compiled in and Q4_1 matmuls crash in ggml_backend_amx_mul_mat
# (ldtilecfg, SIGSEGV; llama.cpp issue #20824).
# Usage: bench/bench_llamacpp.sh [--build DIR] [--tokens 512] [--threads 2 | 1,2] [--iters 5]
#                                [--omp-wait passive|active]
# Env: PYTHON (a python with llama-cpp-python, gguf, numpy; default /root/nbvenv/bin/python or python3),
#      NIBBLE_DATA (shared/data), SMOLLM2_Q4_1 (the Q4_1 GGUF), NIBBLE_BENCH_CACHE (dequantized copies),
#      NIBBLE_BENCH_JSON (set by bench/record.lua: the table is also written there, as bench/results/llamacpp.json).
set -euo pipefail
json_out="${NIBBLE_BENCH_JSON:-}"
unset NIBBLE_BENCH_JSON   # bench_pp, run below for each row, would write its own result there

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
tokens=512
threads=2
iters=5
omp_wait=passive
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --omp-wait) omp_wait="$2"; shift 2 ;;
    *) echo "bench_llamacpp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -z "${PYTHON:-}" ]; then
  if [ -x /root/nbvenv/bin/python ]; then PYTHON=/root/nbvenv/bin/python; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import llama_cpp' 2>/dev/null; then
  echo "bench_llamacpp.sh: $PYTHON cannot import llama_cpp (pip install llama-cpp-python)" >&2
  exit 1
fi
pp="$build/bench/bench_pp"
if [ ! -x "$pp" ]; then
  echo "bench_llamacpp.sh: $pp not found (cmake --build $build --target bench_pp)" >&2
  exit 1
fi
data="${NIBBLE_DATA:-$root/../shared/data}"
smol="${SMOLLM2_Q4_1:-$HOME/.cache/nibble/SmolLM2-135M-Instruct.Q4_1.gguf}"
cache="${NIBBLE_BENCH_CACHE:-$HOME/.cache/nibble/bench}"

# rows: label, nibble's file, llama.cpp's file, what is compared
rows=()
rows+=("stories260K F32|$data/stories260K/stories260K.gguf|$data/stories260K/stories260K.gguf|same F32 file")
if [ -f "$smol" ]; then
  mkdir -p "$cache"
  base="$cache/$(basename "$smol" .gguf)"
  for t in f32 f16; do
    if [ ! -f "$base-dq-$t.gguf" ]; then
      echo "making $base-dq-$t.gguf" >&2
      "$PYTHON" "$here/gguf_dequant.py" "$smol" "$base-dq-$t.gguf.tmp" --type "$t"
      mv "$base-dq-$t.gguf.tmp" "$base-dq-$t.gguf"
    fi
  done
  rows+=("SmolLM2-135M F32 (Q4_1 dequantized)|$base-dq-f32.gguf|$base-dq-f32.gguf|same F32 file")
  rows+=("SmolLM2-135M F16 (Q4_1 dequantized)|$base-dq-f16.gguf|$base-dq-f16.gguf|same F16 file (nibble: F32 at load)")
  rows+=("SmolLM2-135M Q4_1|$smol|$smol|same Q4_1 file (nibble: F32 at load; llama.cpp: Q4_1 kernels)")
else
  echo "bench_llamacpp.sh: $smol not found: SmolLM2 rows skipped" >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
i=0
load0="$(cut -d' ' -f1-3 /proc/loadavg)"
for nt in ${threads//,/ }; do
  for r in "${rows[@]}"; do
    IFS='|' read -r label fn fl what <<<"$r"
    echo "running $label, $nt threads" >&2
    "$pp" --model "$fn" --tokens "$tokens" --threads "$nt" --iters "$iters" --ids-out "$tmp/ids$i" \
      --logits-out "$tmp/logits$i" >"$tmp/nb$i"
    OMP_WAIT_POLICY="$omp_wait" OPENBLAS_NUM_THREADS=1 "$PYTHON" "$here/bench_llamacpp.py" --model "$fl" --tokens "$tokens" --threads "$nt" \
      --iters "$iters" --ids "$tmp/ids$i" --ref-logits "$tmp/logits$i" --fa both >"$tmp/lc$i"
    printf '%s\n' "$label|$what" >"$tmp/label$i"
    i=$((i + 1))
  done
done

echo "command: bench/bench_llamacpp.sh --tokens $tokens --threads $threads --iters $iters --omp-wait $omp_wait ($(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average before $load0, after $(cut -d' ' -f1-3 /proc/loadavg))"
"$PYTHON" - "$tmp" "$i" "$json_out" "$omp_wait" <<'EOF'
import json, sys
d, n, json_out, omp_wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def lc_runs(i):
    return {r["flash_attn"]: r for r in map(json.loads, open(f"{d}/lc{i}").read().split("\n")[:-1])}
print(f"llama-cpp-python {lc_runs(0)[False]['llama_cpp_python']}; tok/s = prompt tokens / wall time of one forward: "
      "median of the runs (best run in brackets). Ratios = nibble / the faster llama.cpp setting, from the medians, "
      "the best runs, and the median process CPU time (all threads; llama.cpp's spinning threads count).")
hdr = ("model", "compared", "threads", "tokens", "nibble tok/s", "llama.cpp tok/s FA off", "llama.cpp tok/s FA on",
       "ratio (median)", "ratio (best)", "ratio (CPU time)", "last position: argmax agrees, max abs logit diff FA off / on")
print("| " + " | ".join(hdr) + " |")
print("|" + "|".join("---" for _ in hdr) + "|")
cell = lambda r: f"{r['pp_tok_s']:.0f} ({r['best_tok_s']:.0f})"
rows = []
for i in range(n):
    nb, lc = json.load(open(f"{d}/nb{i}")), lc_runs(i)
    label, what = open(f"{d}/label{i}").read().strip().split("|", 1)
    ratio = lambda k: nb[k] / max(r[k] for r in lc.values())
    ams = {r["last_argmax"] for r in lc.values()}
    agree = "yes" if ams == {nb["last_argmax"]} else f"no (nibble {nb['last_argmax']}, llama.cpp {sorted(ams)})"
    agree += f", {lc[False]['max_abs_diff']:.2g} / {lc[True]['max_abs_diff']:.2g} (largest abs logit {lc[False]['ref_absmax']:.3g})"
    row = [label, what, str(nb["threads"]), str(nb["tokens"]), cell(nb), cell(lc[False]), cell(lc[True]),
           f"{ratio('pp_tok_s'):.2f}", f"{ratio('best_tok_s'):.2f}", f"{ratio('cpu_tok_s'):.2f}", agree]
    rows.append(row)
    print("| " + " | ".join(row) + " |")
if json_out:   # the fragment bench/record.lua completes (bench/results.lua has the format)
    frag = {"bench": "llamacpp", "title": "Prompt processing against llama.cpp",
            "threads": max(int(r[2]) for r in rows),
            "tables": [{"caption": "tok/s = prompt tokens / wall time of one forward: median of the runs (best run in "
                                   "brackets); ratios = nibble / the faster llama.cpp setting",
                        "columns": list(hdr), "rows": rows}],
            "notes": [f"llama-cpp-python {lc_runs(0)[False]['llama_cpp_python']}, OMP_WAIT_POLICY={omp_wait}",
                      "ratio (CPU time): from the median process CPU time of all threads (llama.cpp's spinning threads count)"]}
    with open(json_out, "w") as f:
        json.dump(frag, f)
EOF

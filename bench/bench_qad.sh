#!/bin/sh
# QAD step vs PyTorch on the CPU (same model, same threads, same batch): teacher forward + NVFP4 W4A16
# fake-quant student forward/backward + KL + clip + AdamW, tokens/s on stories260K, the random 58M Llama
# of bench_model.sh and SmolLM2-135M-Instruct (when fetched), best of REPEAT interleaved runs, and the ratios.
# Usage: bench/bench_qad.sh [BUILD_DIR]
# Environment: PYTHON (default /root/nbvenv/bin/python, with torch + transformers + gguf), THREADS (2),
# REPEAT (2), BENCH_DIR (/tmp/nibble-bench-model: the random model, made once), SMOLLM (the GGUF).
set -e
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PY=${PYTHON:-/root/nbvenv/bin/python}
BIN="$BUILD/bench/bench_qad"
[ -x "$BIN" ] || { echo "bench_qad.sh: $BIN not found (build the bench_qad target first)" >&2; exit 1; }
WORK=${BENCH_DIR:-/tmp/nibble-bench-model}
[ -f "$WORK/llama512/model.safetensors" ] || "$PY" bench/bench_model.py make-random "$WORK/llama512"
# OPENBLAS_CORETYPE is dropped (nibble picks its kernels itself, as for any user); ISA=avx2 holds both
# sides to AVX2 instead (OpenBLAS Haswell kernels; MKL, ATen and oneDNN capped at AVX2).
# Results: bench/results/qad.json (qad-avx2.json), with the BLAS core they ran on.
export NIBBLE_BENCH_COMMAND="${ISA:+ISA=$ISA }THREADS=${THREADS:-2} REPEAT=${REPEAT:-2} bench/bench_qad.sh $*"
exec "$PY" bench/bench_qad.py compare ${ISA:+--isa "$ISA"} --bin "$BIN" --threads "${THREADS:-2}" --repeat "${REPEAT:-2}" \
    --work "$WORK" --stories "${STORIES:-../shared/data/stories260K/hf}" \
    --smollm "${SMOLLM:-$HOME/.cache/nibble/SmolLM2-135M-Instruct.Q4_1.gguf}"

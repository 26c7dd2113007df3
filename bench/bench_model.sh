#!/bin/sh
# Model runtime vs PyTorch on the CPU (same model, same threads, same batch): forward and train-step
# tokens/s for stories260K and a random 58M-parameter Llama (dim 512, 8 layers, vocab 32000), best of
# REPEAT interleaved runs, and the ratios. Usage: bench/bench_model.sh [BUILD_DIR]
# Environment: PYTHON (default /root/nbvenv/bin/python, with torch + transformers), THREADS (2),
# REPEAT (3), BENCH_DIR (/tmp/nibble-bench-model, where the random model is written once).
set -e
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PY=${PYTHON:-/root/nbvenv/bin/python}
BIN="$BUILD/bench/bench_model"
[ -x "$BIN" ] || { echo "bench_model.sh: $BIN not found (build the bench_model target first)" >&2; exit 1; }
# OPENBLAS_CORETYPE is dropped (nibble picks its kernels itself, as for any user); ISA=avx2 holds both
# sides to AVX2 instead (OpenBLAS Haswell kernels; MKL, ATen and oneDNN capped at AVX2).
# Results: bench/results/model.json (model-avx2.json), with the BLAS core they ran on.
export NIBBLE_BENCH_COMMAND="${ISA:+ISA=$ISA }THREADS=${THREADS:-2} REPEAT=${REPEAT:-3} bench/bench_model.sh $*"
exec "$PY" bench/bench_model.py compare ${ISA:+--isa "$ISA"} --bin "$BIN" --threads "${THREADS:-2}" --repeat "${REPEAT:-3}" \
    --work "${BENCH_DIR:-/tmp/nibble-bench-model}" --stories "${STORIES:-../shared/data/stories260K/hf}"

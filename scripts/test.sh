#!/bin/sh
# The whole test suite on a fresh Debian 12 machine (as root): install the packages, build
# (release, CUDA kernels compiled and linked when nvcc is present), run ctest.
# NIBBLE_TEST_SANITIZE=1 also builds the debug preset (ASan+UBSan) and runs ctest there, less the
# two full-model evaluation runs (perplexity over 100 chunks, ~10x slower under ASan); the same
# forward/backward code runs under ASan in c.test_model_grad, c.test_model_stories and c.test_qad.
# It then builds the libFuzzer targets (clang) and runs each over its corpus plus NIBBLE_FUZZ_SECONDS
# (default 15) of fuzzing: any finding fails the run.
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
JOBS=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"
if [ "${NIBBLE_TEST_SANITIZE:-0}" = 1 ]; then
  cmake --preset debug >/dev/null
  cmake --build build-debug -j"$JOBS"
  ctest --test-dir build-debug --output-on-failure -j"$JOBS" -E '^(c\.test_model_eval|lua\.model)$'
  cmake --preset fuzz >/dev/null
  cmake --build build-fuzz -j"$JOBS" --target fuzz
  tests/fuzz/run.sh build-fuzz "${NIBBLE_FUZZ_SECONDS:-15}"
fi

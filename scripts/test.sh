#!/bin/sh
# The whole test suite on a fresh Debian 12 machine (as root): install the packages, build
# (release, CUDA kernels compiled and linked when nvcc is present), run ctest.
# NIBBLE_TEST_SANITIZE=1 also builds the debug preset (ASan+UBSan) and runs ctest there, less the
# two full-model evaluation runs (perplexity over 100 chunks, ~10x slower under ASan); the same
# forward/backward code runs under ASan in c.test_model_grad, c.test_model_stories and c.test_qad.
# Last, scripts/test-cpus.sh reruns the numeric tests on the SIMD levels and OpenBLAS kernel sets of
# other CPUs (NIBBLE_TEST_CPUS=0 skips it).
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
fi
if [ "${NIBBLE_TEST_CPUS:-1}" != 0 ]; then
  ./scripts/test-cpus.sh build
fi

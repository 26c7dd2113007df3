#!/bin/sh
# The whole test suite on a fresh Debian 12 machine (as root): install the packages, build
# (release, CUDA kernels compiled and linked when nvcc is present), run ctest.
# NIBBLE_TEST_SANITIZE=1 also builds the debug preset (ASan+UBSan) and runs ctest there, less the
# two full-model evaluation runs (perplexity over 100 chunks, ~10x slower under ASan); the same
# forward/backward code runs under ASan in c.test_model_grad, c.test_model_stories and c.test_qad;
# and script.derive_test_data (a data script, whose float64 forward passes are Lua, not libnibble).
# Then it builds the libFuzzer targets (clang) and runs each over its corpus plus NIBBLE_FUZZ_SECONDS
# (default 15) of fuzzing: any finding fails the run.
# Then scripts/test-cpus.sh reruns the numeric tests on the SIMD levels and OpenBLAS kernel sets of
# other CPUs (NIBBLE_TEST_CPUS=0 skips it).
# It ends with one line counting the tests (and busted cases) skipped for missing test data, after
# a line per such test saying what was absent. `scripts/test.sh --skips BUILD_DIR` prints those lines
# for the last ctest run in BUILD_DIR.
set -eu
cd "$(dirname "$0")/.."

# What ctest's log of BUILD_DIR says was skipped for missing test data: the tests that print
# "SKIP (test data...)" (tests/c/nbtest.h, tests/recipes/run.sh, tests/scripts/) and the closing lines
# of the busted specs (tests/lua/nbspec_output.lua).
skips() {
  log=$1/Testing/Temporary/LastTest.log
  [ -f "$log" ] || { echo "scripts/test.sh: no ctest log in $1" >&2; return 1; }
  data=$(sed -n 's/^NIBBLE_SHARED_DATA:[A-Z]*=//p' "$1/CMakeCache.txt" 2>/dev/null)
  awk -v data="$data" '
    function flush() {
      if (name == "") return
      if (why != "") { whole++; printf "1 skipped  %s: %s\n", name, why }
      else if (part != "") { parts++; printf "1 in part  %s: %s\n", name, part }
      name = ""
    }
    /^[0-9]+\/[0-9]+ Test: / { flush(); name = $3; why = ""; part = ""; reason = ""; total++; next }
    /^SKIP \(test data\): / { why = substr($0, 19); next }
    /^SKIP \(test data, part: / { if (part == "") { part = substr($0, 24); sub(/\): /, " skipped: ", part) }; next }
    /^busted: [0-9]+ skipped: test data absent: / { reason = substr($0, index($0, "test data absent: ")); next }
    /^busted: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped \([0-9]+ for missing test data/ {
      p = $2 + 0; f = $4 + 0; s = $6 + 0; d = substr($8, 2) + 0
      cases += d
      if (p == 0 && f == 0 && s > 0 && d == s) why = d " of " d " cases: " reason
      else if (d > 0) part = d " of " (p + f + s) " cases skipped: " reason
    }
    END {
      flush()
      if (whole + parts + cases == 0)
        printf "2 no test skipped for missing test data (%s)\n", data
      else
        printf "2 %d of %d tests skipped for missing test data in %s (%d more ran in part; %d busted cases skipped): run scripts/fetch-test-data.sh\n",
               whole, total, data, parts, cases
    }' "$log" | sort -k1,1 -k3,3 | cut -c3-
}

if [ "${1:-}" = --skips ]; then
  [ $# -eq 2 ] || { echo "usage: scripts/test.sh [--skips BUILD_DIR]" >&2; exit 2; }
  skips "$2"
  exit
fi

./scripts/install-deps.sh
JOBS=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build build -j"$JOBS"
rc=0
ctest --test-dir build --output-on-failure -j"$JOBS" || rc=$?
if [ "${NIBBLE_TEST_SANITIZE:-0}" = 1 ]; then
  cmake --preset debug >/dev/null
  cmake --build build-debug -j"$JOBS"
  ctest --test-dir build-debug --output-on-failure -j"$JOBS" -E '^(c\.test_model_eval|lua\.model|script\.derive_test_data)$' || rc=$?
  cmake --preset fuzz >/dev/null
  cmake --build build-fuzz -j"$JOBS" --target fuzz
  tests/fuzz/run.sh build-fuzz "${NIBBLE_FUZZ_SECONDS:-15}" || rc=$?
fi
if [ "${NIBBLE_TEST_CPUS:-1}" != 0 ]; then
  ./scripts/test-cpus.sh build || rc=$?
fi
skips build
exit $rc

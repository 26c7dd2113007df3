#!/bin/sh
# ctest script.test_skips: `scripts/test.sh --skips BUILD_DIR`, the closing lines of the test suite,
# on a ctest log written here in ctest's format: a C test skipped for a missing file, one that ran in
# part, the CUDA test skipped for another reason (not counted), busted specs all skipped, partly
# skipped, and skipped for another reason, and a plain pass. Then on a log with no data skip.
set -u
src=${NIBBLE_SOURCE_DIR:-.}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nibble-skips-XXXXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/Testing/Temporary"
echo "NIBBLE_SHARED_DATA:UNINITIALIZED=/data" >"$tmp/CMakeCache.txt"   # the type a bare -D leaves

block() {  # index name output-lines...
  i=$1 name=$2; shift 2
  printf '%s/7 Testing: %s\n%s/7 Test: %s\nCommand: "x"\nOutput:\n----------------------------------------------------------\n' "$i" "$name" "$i" "$name"
  for l in "$@"; do printf '%s\n' "$l"; done
  printf '<end of output>\nTest time =   0.01 sec\n----------------------------------------------------------\nTest Passed.\n\n'
}
{
  block 1 c.test_gguf "SKIP (test data): /data/stories260K/stories260K.gguf is absent (scripts/fetch-test-data.sh)"
  block 2 c.test_safetensors "SKIP (test data, part: the real checkpoint): /data/m.safetensors is absent (scripts/fetch-test-data.sh)" "test_safetensors: 90 checks, 0 failed"
  block 3 c.test_quant_cuda "SKIP: no CUDA device is available"
  block 4 lua.export_golden "busted: 7 skipped: test data absent: /data (scripts/fetch-test-data.sh)" "busted: 0 passed, 0 failed, 7 skipped (7 for missing test data)"
  block 5 lua.ptq "SKIP (test data, part: the plans): test data absent: /data (scripts/fetch-test-data.sh)" "busted: 18 skipped: test data absent: /data (scripts/fetch-test-data.sh)" "busted: 3 passed, 0 failed, 18 skipped (18 for missing test data, 1 ran in part)"
  block 6 lua.host "busted: 1 skipped: script(1) is not installed" "busted: 23 passed, 0 failed, 1 skipped (0 for missing test data)"
  block 7 c.test_tensor "test_tensor: 12 checks, 0 failed"
} >"$tmp/Testing/Temporary/LastTest.log"

fails=0
same() {
  [ "$2" = "$3" ] && return
  fails=$((fails + 1))
  printf 'FAIL: %s\n--- got:\n%s\n--- wanted:\n%s\n' "$1" "$2" "$3"
}
same "skips with data missing" "$(sh "$src/scripts/test.sh" --skips "$tmp")" "skipped  c.test_gguf: /data/stories260K/stories260K.gguf is absent (scripts/fetch-test-data.sh)
skipped  lua.export_golden: 7 of 7 cases: test data absent: /data (scripts/fetch-test-data.sh)
in part  c.test_safetensors: the real checkpoint skipped: /data/m.safetensors is absent (scripts/fetch-test-data.sh)
in part  lua.ptq: 18 of 21 cases skipped: test data absent: /data (scripts/fetch-test-data.sh)
2 of 7 tests skipped for missing test data in /data (2 more ran in part; 25 busted cases skipped): run scripts/fetch-test-data.sh"

{
  block 1 c.test_quant_cuda "SKIP: no CUDA device is available"
  block 2 lua.host "busted: 1 skipped: script(1) is not installed" "busted: 23 passed, 0 failed, 1 skipped (0 for missing test data)"
} >"$tmp/Testing/Temporary/LastTest.log"
same "nothing skipped for data" "$(sh "$src/scripts/test.sh" --skips "$tmp")" "no test skipped for missing test data (/data)"

echo "script.test_skips: $fails failed"
[ $fails -eq 0 ]

#!/bin/sh
# Recipe dry-run driver: run a command, put stdout+stderr (shared-data paths replaced by $DATA) next
# to an expected file and compare them exactly, and check the exit code.
# usage: run.sh EXPECTED RC CMD ARGS...   (skips with 77, saying so, when the test data is absent)
exp=$1; want=$2; shift 2
data=${NIBBLE_SHARED_DATA:-../shared/data}
[ -f "$data/stories260K/hf/model.safetensors" ] || { echo "SKIP (test data): $data/stories260K/hf/model.safetensors is absent (scripts/fetch-test-data.sh)"; exit 77; }
out=$("$@" 2>&1); rc=$?
actual=${TMPDIR:-/tmp}/nb_recipe_$$.txt
printf '%s\n' "$out" | sed "s|$data|\$DATA|g" > "$actual"
status=0
if ! diff -u "$exp" "$actual"; then echo "output differs from $exp"; status=1; fi
if [ "$rc" != "$want" ]; then echo "exit code $rc, expected $want"; status=1; fi
rm -f "$actual"
exit $status

#!/bin/sh
# Runs the libFuzzer targets of a fuzz build (cmake --preset fuzz; cmake --build build-fuzz --target fuzz):
# each target first replays its committed corpus, its reproducers (crashes/) and its seeds.txt,
# then mutates them for SECONDS, two targets at a time (or FUZZ_JOBS). Exits 1 when any target
# reports a finding (a sanitizer report, a crash, a leak, a timeout, an allocation over
# FUZZ_MALLOC_MB); the input that caused it is left in BUILD/fuzz-out/TARGET/ beside its log.
# Usage: tests/fuzz/run.sh BUILD SECONDS [TARGET...]
set -eu
[ $# -ge 2 ] || { echo "usage: tests/fuzz/run.sh BUILD SECONDS [TARGET...]" >&2; exit 2; }
BUILD=$1
SECONDS_PER=$2
shift 2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${NIBBLE_SHARED_DATA:-$ROOT/../shared/data}
TARGETS=${*:-"safetensors st_index gguf tokenizer_json tokenizer_model config data checkpoint readback qad_checkpoint"}
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
OUT=$BUILD/fuzz-out
rm -rf "$OUT"
mkdir -p "$OUT"

one() {
  t=$1
  bin=$BUILD/tests/fuzz/fuzz_$t
  src=$ROOT/tests/fuzz/$t
  work=$OUT/$t
  mkdir -p "$work/corpus" "$work/artifacts"
  [ -x "$bin" ] || { echo "$t: $bin is missing (build the fuzz preset)" > "$work/log"; echo 1 > "$work/rc"; return; }
  # the run's corpus: committed inputs and seeds; new inputs land there, never in the source tree
  cp "$src"/corpus/* "$work/corpus/" 2>/dev/null || true
  if [ -f "$src/seeds.txt" ]; then
    while IFS= read -r s; do
      case $s in shared:*) f=$SHARED/${s#shared:} ;; *) f=$ROOT/$s ;; esac
      [ -f "$f" ] && cp "$f" "$work/corpus/seed-$(echo "$s" | tr '/:' '__')"
    done < "$src/seeds.txt"
  fi
  set +e
  # reproducers first, each run once: a fixed finding must stay fixed
  if [ -n "$(ls "$src/crashes" 2>/dev/null)" ]; then
    "$bin" -runs=0 -artifact_prefix="$work/artifacts/" "$src/crashes" > "$work/replay.log" 2>&1 || { cat "$work/replay.log" > "$work/log"; echo 1 > "$work/rc"; return; }
  fi
  "$bin" "$work/corpus" -max_total_time="$SECONDS_PER" -timeout=${FUZZ_TIMEOUT:-20} \
    -rss_limit_mb=${FUZZ_RSS_MB:-2560} -malloc_limit_mb=${FUZZ_MALLOC_MB:-512} -max_len=${FUZZ_MAX_LEN:-600000} \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" > "$work/log" 2>&1
  echo $? > "$work/rc"
  set -e
}

# two (FUZZ_JOBS) at a time
running=0
for t in $TARGETS; do
  one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait; running=0; fi
done
wait

fail=0
for t in $TARGETS; do
  rc=$(cat "$OUT/$t/rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/$t/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$OUT/$t/log" | tail -1)
  if [ "$rc" = 0 ]; then
    echo "fuzz $t: ok, ${execs:-?} execs, ${cov:-no coverage line}"
  else
    fail=1
    echo "fuzz $t: FINDING (exit $rc); input and log in $OUT/$t/"
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written|fuzz:' "$OUT/$t/log" | head -20
  fi
done
exit $fail

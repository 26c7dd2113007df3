#!/bin/sh
# ctest mpi.ptq_ranks: data-parallel calibration. `nibble quantize` (W4A4 NVFP4 with an FP8 KV cache, on
# stories260K) as 1 rank and under mpirun as 2 and 3 ranks writes byte-identical exports, for the max
# and mse algorithms; calibrating on fewer rows gives other bytes (so the comparison can fail: the
# ranks' shares must be merged). A calibration file that is bad on rank 1 only stops every rank with
# the same one-line message naming rank 1. Usage: ptq_ranks.sh NIBBLE "MPIRUN [ARGS]" (empty: skip).
set -u
bin=$1 mpirun=${2:-}
if [ -z "$mpirun" ]; then
  echo "SKIP (no mpirun): MPI was not found at configure time (install openmpi-bin libopenmpi-dev)"
  exit 77
fi
D=${NIBBLE_SHARED_DATA:-../shared/data}
M=$D/stories260K/hf T=$D/text/tinystories_valid_head_776KiB.txt
for f in "$M/config.json" "$T"; do
  [ -e "$f" ] || { echo "SKIP (test data): $f is absent (scripts/fetch-test-data.sh)"; exit 77; }
done
W=$(mktemp -d "${TMPDIR:-/tmp}/nibble-ranks-XXXXXXXX")
trap 'rm -rf "$W"' EXIT
export NIBBLE_THREADS=1   # ranks share the machine's cores
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 12 rows in 6 batches of 2: 3 batches a rank with 2 ranks, 2 with 3
q() {  # out algorithm [samples]
  "$bin" quantize --model "$M" --format nvfp4 --kv-cache fp8 --calib "$T" --samples "${3:-12}" --seq-len 64 \
    --batch 2 --algorithm "$2" --quiet --out "$1"
}
same_dir() {  # a b
  for f in "$1"/*; do
    cmp -s "$f" "$2/$(basename "$f")" || return 1
  done
  [ "$(ls "$1")" = "$(ls "$2")" ]
}
for alg in max mse; do
  q "$W/$alg.1" $alg >"$W/log" 2>&1 || { bad "1 rank, $alg: $(cat "$W/log")"; continue; }
  for n in 2 3; do
    # shellcheck disable=SC2086  # $mpirun is a command with its arguments
    $mpirun -n $n "$bin" quantize --model "$M" --format nvfp4 --kv-cache fp8 --calib "$T" --samples 12 --seq-len 64 \
      --batch 2 --algorithm $alg --quiet --out "$W/$alg.$n" >"$W/log" 2>&1 || { bad "$n ranks, $alg: $(cat "$W/log")"; continue; }
    if same_dir "$W/$alg.1" "$W/$alg.$n"; then echo "ok: $alg, $n ranks: export byte-identical to 1 rank"
    else bad "$alg, $n ranks: the export differs from 1 rank's"; fi
    # only rank 0 prints the closing report line (stdout), and --quiet leaves no log on any rank
    lines=$(grep -c '^quantized ' "$W/log")
    [ "$lines" = 1 ] || bad "$alg, $n ranks: $lines report lines, wanted rank 0's alone"
    [ "$(wc -l <"$W/log")" = 1 ] || bad "$alg, $n ranks: more than the report line: $(cat "$W/log")"
  done
done
q "$W/fewer" max 4 >"$W/log" 2>&1 || bad "1 rank, 4 rows: $(cat "$W/log")"
if same_dir "$W/max.1" "$W/fewer"; then bad "4 rows give the same export as 12: the comparison above cannot fail"
else echo "ok: 4 calibration rows give other bytes than 12"; fi

# a calibration file absent on rank 1 only: every rank exits non-zero with the same message
cat >"$W/one_bad.sh" <<EOS
#!/bin/sh
r=\${OMPI_COMM_WORLD_RANK:-0}
calib="$T"
[ "\$r" = 1 ] && calib="$W/absent.txt"
"$bin" quantize --model "$M" --format nvfp4 --calib "\$calib" --samples 12 --seq-len 64 --batch 2 --quiet \
  --out "$W/failed" 2>"$W/err.\$r"
echo \$? >"$W/rc.\$r"
EOS
# shellcheck disable=SC2086
timeout 60 $mpirun -n 3 sh "$W/one_bad.sh" >/dev/null 2>&1
[ $? = 124 ] && bad "a bad file on rank 1: the ranks hung"
want=$(cat "$W/err.1" 2>/dev/null)
case $want in
  *"rank 1: "*absent.txt*) echo "ok: rank 1's bad file: $want" ;;
  *) bad "rank 1's message: '$want'" ;;
esac
for r in 0 1 2; do
  [ "$(cat "$W/rc.$r" 2>/dev/null)" != 0 ] && [ -s "$W/rc.$r" ] || bad "rank $r exited $(cat "$W/rc.$r" 2>/dev/null)"
  [ "$(cat "$W/err.$r" 2>/dev/null)" = "$want" ] || bad "rank $r said '$(cat "$W/err.$r" 2>/dev/null)', rank 1 '$want'"
done
[ -e "$W/failed" ] && bad "a failed run left $W/failed"
[ $fails = 0 ] && echo "ptq_ranks: all passed" && exit 0
exit 1

#!/usr/bin/env bash
# nibble vs ModelOpt's CPU weight quantization on the same 4096x4096 BF16 tensor, same thread count:
# bench_quant_modelopt.py writes the tensor and times ModelOpt, bench_quant times nibble on those
# bytes (--input), and the table gives ModelOpt ms / nibble ms per format (nibble: nb_quantize on its
# fastest path, allocating the output each call like ModelOpt).
# Usage: bench/bench_quant_modelopt.sh [BUILD_DIR]   (env: THREADS=2 REPS=5 NIBBLE_PYTHON=/root/nbvenv/bin/python)
# With NIBBLE_BENCH_JSON set (bench/record.lua) the table is also written there, as bench/results/quant_modelopt.json.
set -euo pipefail
json_out=${NIBBLE_BENCH_JSON:-}
unset NIBBLE_BENCH_JSON   # bench_quant, run below, would write its own result there
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
py=${NIBBLE_PYTHON:-/root/nbvenv/bin/python}
threads=${THREADS:-2}
reps=${REPS:-5}
bin="$build/bench/bench_quant"
[ -x "$bin" ] || { echo "no $bin: build nibble first (cmake --build $build)" >&2; exit 1; }
w=$(mktemp /tmp/nibble_bench_w_bf16.XXXXXX)
trap 'rm -f "$w"' EXIT

load0=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
mo=$("$py" "$here/bench_quant_modelopt.py" --threads "$threads" --reps "$reps" --out "$w")
nb=$("$bin" --threads "$threads" --reps $((reps * 3)) --input "$w" --paths avx512,avx2,reference)
load1=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
echo "$mo" | grep '^#' || true
echo "# load average before: $load0, after: $load1 (both sides share the machine: rerun on a quiet one)"
echo "$nb" | head -2
echo
# ceiling: ModelOpt ms / the least traffic the case needs at memcpy's best rate (bench_quant's "min ms":
# the input read once, or twice when the amax comes from the data, plus the outputs), i.e. the speedup
# that a quantizer moving only those bytes as fast as memcpy moves its own would show on this machine
printf '%-14s %14s %14s %10s %10s\n' format "modelopt ms" "nibble ms" speedup ceiling
rows=""
for f in nvfp4 nvfp4_46 mxfp8 fp8 fp8_cal fp8_channel; do
  m=$(echo "$mo" | awk -v f="$f" '$1 == "modelopt" && $2 == f {print $3}')
  # nibble's fastest path on this CPU (avx512, else avx2, else the reference), nb_quantize allocating its
  # output each call ("new"), as ModelOpt's calls do
  n="" floor=""
  for path in avx512 avx2 reference; do
    [ -n "$n" ] && continue
    row=$(echo "$nb" | awk -v f="$f" -v p="$path" '$1 == f && $2 == p && $3 == "new" && $4 ~ /^[0-9.]+$/ {print; exit}')
    [ -n "$row" ] || continue
    n=$(echo "$row" | awk '{print $4}')
    floor=$(echo "$row" | awk '{print $12}')
  done
  if [ -n "$m" ] && [ -n "$n" ] && [ -n "$floor" ]; then
    line=$(printf '%-14s %14.3f %14.3f %9.1fx %9.1fx' "$f" "$m" "$n" "$(echo "$m / $n" | bc -l)" "$(echo "$m / $floor" | bc -l)")
    echo "$line"
    rows="$rows$line
"
  fi
done
if [ -n "$json_out" ]; then   # the fragment bench/record.lua completes (bench/results.lua has the format)
  printf '%s' "$rows" | python3 -c '
import json, sys
out, threads, torch_line, memcpy_line = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [l.split() for l in sys.stdin.read().splitlines() if l.strip()]
json.dump({"bench": "quant_modelopt", "title": "Weight quantization against ModelOpt on the CPU (4096x4096 BF16)",
           "threads": threads,
           "tables": [{"caption": "median times; speedup = ModelOpt ms / nibble ms; ceiling = ModelOpt ms / the least "
                                  "traffic the case needs at memcpy best rate",
                       "columns": ["format", "ModelOpt ms", "nibble ms", "speedup", "ceiling"], "rows": rows}],
           "notes": [torch_line.lstrip("# "), memcpy_line]}, open(out, "w"))
' "$json_out" "$threads" "$(echo "$mo" | grep -m1 '^# torch' || echo '# torch version unknown')" "$(echo "$nb" | sed -n 2p)"
fi

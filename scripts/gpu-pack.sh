#!/usr/bin/env bash
# The GPU checks, prepared here and run on a machine with an NVIDIA GPU that has no compiler for
# the rest of nibble's dependencies (the device machine some tasks are lent: CUDA, no apt).
# Here: builds nibble with the CUDA kernels (sm_90 unless CMAKE_CUDA_ARCHITECTURES says otherwise),
# then fills gpu/ (ignored by git) with the CUDA test and bench, libnibble, the non-system shared
# libraries they load, and gpu/run.sh. There: `bash gpu/run.sh` (device tool: carry ["gpu"]) runs
#   nvidia-smi, test_quant_cuda (every CUDA kernel against the scalar reference, bit for bit) and
#   bench_quant_cuda (throughput vs cudaMemcpy, bytes vs the CPU path) on 8192^2 and 4096^2 BF16,
#   and the test again under compute-sanitizer's memcheck where that tool exists,
# and writes the log to $OUT/gpu.log (or /tmp/gpu.log). Exit code: 0 only if all of them passed.
# Usage: scripts/gpu-pack.sh [BUILD_DIR]   (default /tmp/build-cuda)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-/tmp/build-cuda}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu-pack: no nvcc here" >&2; exit 1; }
# the architecture on the command line: a build folder configured before the sm_90 default would
# otherwise keep its cached one (sm_75 PTX, JIT-compiled on the H200, without sm_89+ instructions)
arch=${CMAKE_CUDA_ARCHITECTURES:-90}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DNIBBLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
cmake --build "$build" -j"$(nproc)" --target test_quant_cuda bench_quant_cuda
test_bin=$(find "$build/tests" -name test_quant_cuda -type f | head -1)
bench_bin="$build/bench/bench_quant_cuda"
[ -x "$test_bin" ] && [ -x "$bench_bin" ] || { echo "gpu-pack: the CUDA test or bench was not built (nvcc not found by cmake?)" >&2; exit 1; }

out="$root/gpu"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$test_bin" "$bench_bin" "$out/bin/"
# libnibble and what it loads, except the C/C++ runtime the other machine has in a newer version
for f in "$test_bin" "$bench_bin"; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done

echo "sm_$arch" >"$out/arch"
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root (see scripts/gpu-pack.sh).
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log="${OUT:-/tmp}/gpu.log"
rc=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap --format=csv || true
  echo "built for: $(cat "$here/arch")"
  echo "== test_quant_cuda"
  "$here/bin/test_quant_cuda"; r=$?; echo "test_quant_cuda exit $r"; [ $r -eq 0 ] || rc=1
  echo "== bench_quant_cuda 8192 x 8192"
  "$here/bin/bench_quant_cuda"; r=$?; echo "bench_quant_cuda exit $r"; [ $r -eq 0 ] || rc=1
  echo "== bench_quant_cuda 4096 x 4096"
  "$here/bin/bench_quant_cuda" --rows 4096 --cols 4096; r=$?; echo "bench_quant_cuda exit $r"; [ $r -eq 0 ] || rc=1
  if command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck test_quant_cuda"
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 "$here/bin/test_quant_cuda"
    r=$?; echo "memcheck exit $r"; [ $r -eq 0 ] || rc=1
  fi
  echo "gpu checks: $([ $rc -eq 0 ] && echo passed || echo FAILED)"
  exit $rc
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
EOF
chmod +x "$out/run.sh"
echo "gpu-pack: $(du -sh "$out" | cut -f1) in $out; on the GPU machine: bash gpu/run.sh (carry gpu/)"

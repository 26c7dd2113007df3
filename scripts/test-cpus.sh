#!/bin/sh
# The numeric tests (ctest LABEL numeric) again on the paths other x86-64 CPUs take, on this one:
# every SIMD level this CPU runs (NIBBLE_SIMD=scalar|avx2|avx512) and several OpenBLAS kernel sets
# (OPENBLAS_CORETYPE), each alone and as the pairs real machines have (an SSE3-only CPU runs scalar
# rows and Prescott kernels; a Haswell AVX2 rows and Haswell kernels). Each combination prints one
# line; one that this CPU or this OpenBLAS cannot run is skipped with the reason; any failure fails
# the script. Usage: scripts/test-cpus.sh [BUILD_DIR]   (default build, already built)
#
# Why that subset: the tests labelled numeric are those whose values come from the model runtime's
# float32 sums (row kernels, sgemm) and are held to references or goldens: the ops against float64,
# the forward/backward against transformers' goldens, calibration, QAD steps, K/V scales and the
# ModelOpt/compressed-tensors goldens, about 20 s a combination on 2 cores. Left out: the quantizer
# tests (their CPU paths are forced by the tests themselves and by NIBBLE_QUANT_PATH, and never call
# sgemm), the tokenizer, I/O and CLI tests (no float sums), and the minute-long perplexity and
# sampling runs (c.test_model_eval, c.test_model_sample, lua.model, lua.ptq, lua.qad), which the
# whole suite runs on this CPU's own path.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
JOBS=$(nproc 2>/dev/null || echo 2)
NIBBLE="$BUILD/nibble"
[ -x "$NIBBLE" ] || { echo "test-cpus: $NIBBLE not found: build first (cmake --preset release && cmake --build build)"; exit 1; }

# What a process started with this environment really runs: "<simd level> <OpenBLAS core name>",
# or the one-line error nibble gives (a level this CPU lacks).
probe() {
    env "$@" "$NIBBLE" -e 'local nb = require("nibble")
io.write(require("ffi").string(nb.C.nb_simd_level(nb.context())), " ", nb.blas().core, "\n")' 2>&1 | head -n 1
}

fails=0
ran=0
skipped=0
run() {   # run SIMD CORETYPE ("" = not forced)
    simd=$1 core=$2
    set --
    [ -n "$simd" ] && set -- "$@" "NIBBLE_SIMD=$simd"
    [ -n "$core" ] && set -- "$@" "OPENBLAS_CORETYPE=$core"
    label="simd=${simd:-auto} openblas=${core:-auto}"
    got=$(probe "$@")
    gsimd=${got%% *}
    gcore=${got#* }
    case "$got" in
    *"this CPU (or this build) lacks"*)   # nibble's refusal of a level this CPU does not have
        echo "SKIP  $label: this CPU cannot run it ($got)"
        skipped=$((skipped + 1))
        return ;;
    scalar\ ?*|avx2\ ?*|avx512\ ?*) ;;
    *)   # the probe itself failed: that is a failure, never a skip
        echo "FAIL  $label: cannot tell what runs: $got"
        fails=$((fails + 1))
        return ;;
    esac
    if [ -n "$simd" ] && [ "$gsimd" != "$simd" ]; then
        echo "FAIL  $label: NIBBLE_SIMD=$simd ran $gsimd rows"
        fails=$((fails + 1))
        return
    fi
    if [ -n "$core" ] && [ "$(echo "$gcore" | tr 'A-Z' 'a-z')" != "$(echo "$core" | tr 'A-Z' 'a-z')" ]; then
        echo "SKIP  $label: this OpenBLAS has no $core kernels for this CPU (it ran $gcore)"
        skipped=$((skipped + 1))
        return
    fi
    t0=$(date +%s)
    log=$(mktemp)
    if env "$@" ctest --test-dir "$BUILD" -L numeric -j"$JOBS" --output-on-failure >"$log" 2>&1; then
        echo "PASS  $label (ran $gsimd rows, $gcore kernels): $(grep -cE "Test +#[0-9]+: .* Passed" "$log") tests in $(($(date +%s) - t0)) s"
    else
        echo "FAIL  $label (ran $gsimd rows, $gcore kernels):"
        sed -n '/The following tests FAILED/,$p' "$log" | grep -E '^[[:space:]]+[0-9]+ - ' || true
        echo "----- output"
        cat "$log"
        echo "-----"
        fails=$((fails + 1))
    fi
    rm -f "$log"
    ran=$((ran + 1))
}

for simd in scalar avx2 avx512; do run "$simd" ""; done
for core in Prescott Haswell SkylakeX Cooperlake SapphireRapids; do run "" "$core"; done
run scalar Prescott
run avx2 Haswell

echo "test-cpus: $ran combinations run, $fails failed, $skipped skipped"
# every x86-64 runs the scalar rows and at least Prescott and this CPU's own kernels: fewer than three
# combinations run means the matrix did not test anything
[ "$fails" -eq 0 ] && [ "$ran" -ge 3 ]

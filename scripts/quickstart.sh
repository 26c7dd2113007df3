#!/bin/sh
# The main job on a fresh Debian 12 machine (as root): install the packages, build nibble, and
# run the quickstart recipe on the embedded default model. Extra key=value pairs go to the recipe.
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
JOBS=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build build -j"$JOBS"
if [ -f recipes/quickstart.lua ]; then
  exec ./build/nibble run recipes/quickstart.lua "$@"
else
  exec ./build/nibble run examples/hello.lua "$@"
fi

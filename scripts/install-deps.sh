#!/bin/sh
# Installs the Debian packages nibble needs to build and test (run as root on Debian 12).
# Idempotent: packages already present are left as they are. clang and libclang-rt-14-dev (which
# ships libclang_rt.fuzzer-x86_64.a) build the fuzz preset's libFuzzer targets.
set -eu
PKGS="build-essential cmake pkg-config git ca-certificates python3 \
  luajit libluajit-5.1-dev lua-busted libcjson-dev libopenblas-dev libedit-dev \
  libpcre2-dev python3-pip clang libclang-rt-14-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

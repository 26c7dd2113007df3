#!/bin/sh
# Installs the Debian packages nibble needs to build and test (run as root on Debian 12).
# Idempotent: packages already present are left as they are. clang and libclang-rt-14-dev (which
# ships libclang_rt.fuzzer-x86_64.a) build the fuzz preset's libFuzzer targets. OpenMPI (openmpi-bin,
# libopenmpi-dev) is the communicator's mpi backend and runs the many-rank tests under mpirun.
set -eu
PKGS="build-essential cmake pkg-config git ca-certificates python3 \
  luajit libluajit-5.1-dev lua-busted libcjson-dev libopenblas-dev libedit-dev \
  libpcre2-dev python3-pip strace clang libclang-rt-14-dev openmpi-bin libopenmpi-dev"
# OpenBLAS stays the GEMM library: libnibble dlopens libopenblas.so.0 and switches a generic kernel pick to the
# CPU's (bench/bench_gemm: as fast as oneDNN FP32; Debian's BLIS has no AVX-512 kernels). BENCH_PEERS=1 also
# installs the libraries bench_gemm compares it with.
[ "${BENCH_PEERS:-0}" = 1 ] && PKGS="$PKGS libblis4-pthread libdnnl2"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

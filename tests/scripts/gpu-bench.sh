#!/usr/bin/env bash
# Phos against native CUDA on this machine's GPU, in one run: builds the micro-benchmarks
# (tests/bench/remoting.cu) and every tests/cuda program with nvcc, then `phosctl bench`
# runs each natively and through Phos over each transport and writes the table.
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-bench.sh BIN_DIR OUT_DIR [RUNS]
# Environment: ARCH (default sm_90), TRANSPORTS (default shm,unix), MICRO_ARGS (`quick`
# skips copies above 64 MiB), PROGRAMS=0 to skip the whole programs, SERVED=N to also run
# through one router started with N API servers kept ready (`phosctl bench --served N`).
# Writes OUT_DIR/bench.md.
set -eu
BIN=$(realpath "$1")
mkdir -p "$2"
OUT=$(realpath "$2")
RUNS=${3:-3}
ARCH=${ARCH:-sm_90}
WORK=$(mktemp -d)
mkdir -p "$WORK/programs"
nvcc -O2 -cudart shared -arch="$ARCH" -o "$WORK/remoting" tests/bench/remoting.cu
ARGS=(--micro "$WORK/remoting" --runs "$RUNS" --transports "${TRANSPORTS:-shm,unix}" --out "$OUT/bench.md")
for a in ${MICRO_ARGS:-}; do ARGS+=(--micro-args "$a"); done
if [ -n "${SERVED:-}" ]; then ARGS+=(--served "$SERVED"); fi
if [ "${PROGRAMS:-1}" != 0 ]; then
  for src in tests/cuda/*.cu; do
    name=$(basename "$src" .cu)
    nvcc -O2 -cudart shared -arch="$ARCH" -Itests/cuda -o "$WORK/programs/$name" "$src" &
  done
  wait
  ARGS+=(--programs "$WORK/programs")
fi
PHOS_GUEST_LIB="$BIN/libphos_guest.so" "$BIN/phosctl" bench "${ARGS[@]}"
rm -rf "$WORK"

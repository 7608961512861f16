#!/usr/bin/env bash
# The CUDA 11 half of the GPU suite, prepared on a machine with CUDA 11.8's nvcc (Debian's
# nvidia-cuda-toolkit): every tests/cuda program built for the GPU machine, and NVIDIA's
# libcudart.so.11.0 (from PyPI's nvidia-cuda-runtime-cu11) in lib/, which the suite's native
# runs use. Carry the directory to the GPU machine and pass it as PREBUILT to gpu-suite.sh.
#
# Usage (from the repository root): tests/scripts/prebuild-cu11.sh OUT_DIR
set -eu
OUT=$1
ARCH=${ARCH:-sm_90}
mkdir -p "$OUT/lib"
for src in tests/cuda/*.cu; do
  name=$(basename "$src" .cu)
  libs=$(tests/scripts/cuda-link-flags.sh "$src")
  nvcc -O2 -cudart shared -arch="$ARCH" -Itests/cuda -o "$OUT/$name" "$src" $libs &
done
wait
if [ ! -f "$OUT/lib/libcudart.so.11.0" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.11 -d "$tmp" "nvidia-cuda-runtime-cu11==11.8.*"
  unzip -q -o "$tmp"/nvidia_cuda_runtime_cu11-*.whl -d "$tmp/x"
  cp "$tmp"/x/nvidia/cuda_runtime/lib/libcudart.so.11.0 "$OUT/lib/"
  rm -rf "$tmp"
fi
ls -la "$OUT"

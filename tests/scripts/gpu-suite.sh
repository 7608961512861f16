#!/usr/bin/env bash
# The GPU suite: build every program in tests/cuda with this machine's nvcc, run each natively
# and through `phosctl run --backend cuda`, compare their standard output, and time both.
#
# Usage (on a machine with a GPU, from the repository root):
#   [PROGRAMS="name ..."] tests/scripts/gpu-suite.sh BIN_DIR OUT_DIR
# BIN_DIR holds phosctl, phos-api-server, libphos_guest.so and libphos_audit.so built in release
# mode (`make gpu-bins`; the device machine has no Rust: they are built elsewhere and carried).
# OUT_DIR receives the summary (gpu-suite.md), the native outputs (native-outputs.tar, the
# expected files of the emu tests) and the logs (logs.tar). Where the machine has PyTorch, it
# also runs tests/python/check_no_bypass.py through Phos.
set -u
BIN=$(realpath "$1")
OUT=$(realpath "$2")
ARCH=${ARCH:-sm_90}
WORK=$(mktemp -d)
mkdir -p "$WORK/build" "$WORK/native" "$WORK/phos" "$OUT"

nvcc_version=$(nvcc --version | tail -1)
nvcc_release=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
summary="$OUT/gpu-suite.md"
{
  echo "# GPU suite"
  echo
  echo "- GPU: $gpu"
  echo "- nvcc: $nvcc_version (\`-cudart shared -arch=$ARCH\`)"
  echo "- command: \`tests/scripts/gpu-suite.sh BIN_DIR OUT_DIR\`"
  echo
  echo "| program | native exit | Phos exit | stdout identical | native s | Phos s |"
  echo "|---|---|---|---|---|---|"
} > "$summary"

pass=0; fail=0
# A program whose run through Phos mapped a CUDA runtime or driver that is not Phos's, or
# carried NVIDIA's runtime inside it, did not (only) go through Phos: phosctl and the guest
# library say so on standard error (docs/operations.md, "No bypass").
bypassed() { grep -q "that is not Phos's\|NVIDIA's own CUDA runtime, built into" "$1"; }
# PROGRAMS="a b" runs only those programs of tests/cuda (default: all of them).
sources=()
if [ -n "${PROGRAMS:-}" ]; then
  for p in $PROGRAMS; do sources+=("tests/cuda/$p.cu"); done
else
  sources=(tests/cuda/*.cu)
fi
# Build every program first, all at once (the device machine's time is what a lease costs).
for src in "${sources[@]}"; do
  name=$(basename "$src" .cu)
  libs=$(tests/scripts/cuda-link-flags.sh "$src")
  (nvcc -O2 -cudart shared -arch="$ARCH" -Itests/cuda -o "$WORK/build/$name" "$src" $libs > "$WORK/build/$name.log" 2>&1 \
    || rm -f "$WORK/build/$name") &
done
wait
# "a.b" >= "c.d"?
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }
for src in "${sources[@]}"; do
  name=$(basename "$src" .cu)
  # A program of a newer CUDA than this nvcc's (its first line says `// Needs CUDA X.Y`):
  # skipped, saying so, not a failure.
  needs=$(head -1 "$src" | sed -n 's|^// Needs CUDA \([0-9.]*\).*|\1|p')
  if [ -n "$needs" ] && ! version_at_least "$nvcc_release" "$needs"; then
    echo "| $name | skipped: needs CUDA $needs, nvcc here is $nvcc_release | | | | |" >> "$summary"
    continue
  fi
  if [ ! -x "$WORK/build/$name" ]; then
    echo "| $name | build failed | | | | |" >> "$summary"
    cat "$WORK/build/$name.log"
    fail=$((fail + 1))
    continue
  fi
  t0=$(date +%s.%N)
  "$WORK/build/$name" > "$WORK/native/$name.out" 2> "$WORK/native/$name.err"; native_rc=$?
  t1=$(date +%s.%N)
  "$BIN/phosctl" run --backend cuda -- "$WORK/build/$name" > "$WORK/phos/$name.out" 2> "$WORK/phos/$name.err"; phos_rc=$?
  t2=$(date +%s.%N)
  if bypassed "$WORK/phos/$name.err"; then
    same=**bypassed**; fail=$((fail + 1))
    echo "=== $name bypassed Phos"
    grep "that is not Phos's\|NVIDIA's own CUDA runtime, built into" "$WORK/phos/$name.err" | head -5
  elif cmp -s "$WORK/native/$name.out" "$WORK/phos/$name.out" && [ "$native_rc" = "$phos_rc" ]; then
    same=yes; pass=$((pass + 1))
  else
    same=**no**; fail=$((fail + 1))
    echo "=== $name differs (native rc $native_rc, phos rc $phos_rc)"
    diff "$WORK/native/$name.out" "$WORK/phos/$name.out" | head -20
    tail -5 "$WORK/phos/$name.err"
  fi
  printf '| %s | %s | %s | %s | %.3f | %.3f |\n' "$name" "$native_rc" "$phos_rc" "$same" \
    "$(awk "BEGIN{print $t1 - $t0}")" "$(awk "BEGIN{print $t2 - $t1}")" >> "$summary"
done
# Programs built elsewhere (e.g. with CUDA 11.8 for the 11.x ABI), run natively against the
# NVIDIA runtime carried in $PREBUILT/lib.
if [ -n "${PREBUILT:-}" ] && [ -d "$PREBUILT" ]; then
  PREBUILT=$(realpath "$PREBUILT")
  label=${PREBUILT_LABEL:-prebuilt}
  for exe in "$PREBUILT"/*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    name="$(basename "$exe") ($label)"
    key="$(basename "$exe")-$label"
    t0=$(date +%s.%N)
    if LD_LIBRARY_PATH="$PREBUILT/lib" ldd "$exe" | grep -q "not found"; then
      # A library of that CUDA release that is not carried (cuBLAS's is hundreds of MB): the
      # reference is the same program's native run as built here, whose output is the same.
      echo "=== $name: $(LD_LIBRARY_PATH="$PREBUILT/lib" ldd "$exe" | grep "not found" | awk '{print $1}' | tr '\n' ' ')not carried; compared with the native run of this machine's build"
      cp "$WORK/native/$(basename "$exe").out" "$WORK/native/$key.out" 2>/dev/null || : > "$WORK/native/$key.out"
      native_rc=$(awk -v n="$(basename "$exe")" -F' [|] ' '$1 == "| " n {print $2}' "$summary" | head -1)
      name="$name (vs native $nvcc_release)"
    else
      LD_LIBRARY_PATH="$PREBUILT/lib" "$exe" > "$WORK/native/$key.out" 2> "$WORK/native/$key.err"; native_rc=$?
    fi
    t1=$(date +%s.%N)
    "$BIN/phosctl" run --backend cuda -- "$exe" > "$WORK/phos/$key.out" 2> "$WORK/phos/$key.err"; phos_rc=$?
    t2=$(date +%s.%N)
    if bypassed "$WORK/phos/$key.err"; then
      same=**bypassed**; fail=$((fail + 1))
      echo "=== $name bypassed Phos"
      grep "that is not Phos's\|NVIDIA's own CUDA runtime, built into" "$WORK/phos/$key.err" | head -5
    elif cmp -s "$WORK/native/$key.out" "$WORK/phos/$key.out" && [ "$native_rc" = "$phos_rc" ]; then
      same=yes; pass=$((pass + 1))
    else
      same=**no**; fail=$((fail + 1))
      echo "=== $name differs (native rc $native_rc, phos rc $phos_rc)"
      diff "$WORK/native/$key.out" "$WORK/phos/$key.out" | head -20
      tail -5 "$WORK/phos/$key.err"
    fi
    printf '| %s | %s | %s | %s | %.3f | %.3f |\n' "$name" "$native_rc" "$phos_rc" "$same" \
      "$(awk "BEGIN{print $t1 - $t0}")" "$(awk "BEGIN{print $t2 - $t1}")" >> "$summary"
  done
fi
# PyTorch, where the machine has it: through Phos, its process must map no CUDA runtime or
# driver but Phos's (reported on its own line; the programs' tally is above).
torch_line=""
if python3 -c "import torch" 2>/dev/null; then
  "$BIN/phosctl" run --backend cuda -- python3 tests/python/check_no_bypass.py > "$WORK/phos/torch-check.out" 2>&1
  torch_rc=$?
  torch_line="PyTorch through Phos (tests/python/check_no_bypass.py): exit $torch_rc, $(grep -E '^(no bypass|BYPASS|FAILED)' "$WORK/phos/torch-check.out" | head -3 | tr '\n' ' ')"
fi
{
  echo
  echo "$pass of $((pass + fail)) programs print the same output natively and through Phos, none bypassing it."
  [ -n "$torch_line" ] && echo "$torch_line"
  echo "Times are whole-process wall clock, one run each (the Phos column includes starting a private router and API server); docs/perf.md has the measured overheads."
} >> "$summary"
(cd "$WORK" && tar cf "$OUT/native-outputs.tar" native && tar cf "$OUT/logs.tar" native phos build/*.log)
cat "$summary"
rm -rf "$WORK"
[ "$fail" = 0 ]

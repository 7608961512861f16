#!/usr/bin/env bash
# Remoting micro-benchmarks, natively and through Phos in the same run, on this machine's GPU.
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-bench.sh BIN_DIR OUT_DIR [RUNS]
# Writes OUT_DIR/bench.md: the median of RUNS (default 3) runs of each side, and their ratio.
set -eu
BIN=$(realpath "$1")
OUT=$(realpath "$2")
RUNS=${3:-3}
ARCH=${ARCH:-sm_90}
WORK=$(mktemp -d)
mkdir -p "$OUT"
nvcc -O2 -cudart shared -arch="$ARCH" -o "$WORK/remoting" tests/bench/remoting.cu
for i in $(seq "$RUNS"); do
  "$WORK/remoting" > "$WORK/native.$i"
  "$BIN/phosctl" run --backend cuda -- "$WORK/remoting" > "$WORK/phos.$i" 2> "$WORK/phos.$i.err"
done
python3 - "$WORK" "$RUNS" "$OUT/bench.md" <<'PY'
import sys, statistics
work, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(side):
    vals = {}
    for i in range(1, runs + 1):
        for line in open(f"{work}/{side}.{i}"):
            name, v, unit = line.split()
            vals.setdefault(name, ([], unit))[0].append(float(v))
    return {k: (statistics.median(v), u) for k, (v, u) in vals.items()}
nat, phos = load("native"), load("phos")
rows = ["| metric | native | Phos | Phos / native |", "|---|---|---|---|"]
for k, (v, unit) in nat.items():
    p = phos[k][0]
    rows.append(f"| {k} | {v:.2f} {unit} | {p:.2f} {unit} | {p / v:.3f} |")
open(out, "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
rm -rf "$WORK"

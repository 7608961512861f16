#!/usr/bin/env bash
# PyTorch on the GPU, natively and through Phos, in one run: the steps of
# tests/python/torch_steps.py, training of a CNN and a transformer for a few hundred steps
# (tests/python/torch_train.py: losses compared, training step time and inference latency
# against native), and the same training checkpointed with `phosctl checkpoint --stop` and
# restored in the middle (its losses compared with the native run's).
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-torch.sh BIN_DIR OUT_DIR
# STEPS (training steps per model, default 300), ONLY=steps|train|cr (one part), IMG (image
# directory, default /dev/shm/phos-torch-img), RESTORE_ARGS (added to `phosctl restore`, e.g. --full).
set -u
BIN=$(realpath "$1")
OUT=$(realpath "$2")
STEPS=${STEPS:-300}
ONLY=${ONLY:-all}
IMG=${IMG:-/dev/shm/phos-torch-img}
WORK=$(mktemp -d)
mkdir -p "$OUT"
summary="$OUT/torch.md"
{
  echo "# PyTorch through Phos"
  echo
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "- PyTorch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
  echo "- command: \`tests/scripts/gpu-torch.sh BIN_DIR OUT_DIR\` (STEPS=$STEPS)"
  echo
} > "$summary"
bypassed() { grep -q "that is not Phos's\|NVIDIA's own CUDA runtime, built into" "$1"; }
part() { [ "$ONLY" = all ] || [ "$ONLY" = "$1" ]; }

# Loss lines of two outputs: how far apart (largest relative difference), and whether every
# line is there in both.
compare_losses() { # a b
  python3 - "$1" "$2" <<'EOF'
import sys
def losses(p):
    out = {}
    for line in open(p):
        w = line.split()
        if len(w) == 5 and w[1] == "step" and w[3] == "loss":
            out[(w[0], int(w[2]))] = float(w[4])
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or a.keys() != b.keys():
    print(f"lines differ ({len(a)} against {len(b)} loss lines)")
    sys.exit(1)
worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-12) for k in a)
same = all(a[k] == b[k] for k in a)
print(f"{len(a)} loss lines, {'identical' if same else f'largest relative difference {worst:.2e}'}")
sys.exit(0 if worst <= 1e-4 else 1)
EOF
}
timing() { sed -n "s/^timing $2 \([0-9.]*\)$/\1/p" "$1" | tail -1; }

if part steps; then
  python3 tests/python/torch_steps.py > "$WORK/steps-native.out" 2> "$WORK/steps-native.err"
  native_rc=$?
  "$BIN/phosctl" run --backend cuda -- python3 tests/python/torch_steps.py > "$WORK/steps-phos.out" 2> "$WORK/steps-phos.err"
  phos_rc=$?
  {
    echo "## Steps (tests/python/torch_steps.py)"
    echo
    echo "| step | native | Phos | same |"
    echo "|---|---|---|---|"
    while IFS= read -r line; do
      step=${line%%:*}
      theirs=$(grep "^$step:" "$WORK/steps-phos.out" | head -1)
      same=no
      [ "$line" = "$theirs" ] && same=yes
      echo "| $step | ${line#*: } | ${theirs#*: } | $same |"
    done < "$WORK/steps-native.out"
    echo
    echo "Exit status: native $native_rc, Phos $phos_rc.$(bypassed "$WORK/steps-phos.err" && echo ' **The Phos run bypassed Phos.**')"
    echo
  } >> "$summary"
  cp "$WORK/steps-native.out" "$WORK/steps-phos.out" "$OUT/"
  tail -c 20000 "$WORK/steps-phos.err" > "$OUT/steps-phos.err"
  tail -c 8000 "$WORK/steps-native.err" > "$OUT/steps-native.err"
fi

if part train; then
  python3 tests/python/torch_train.py "$STEPS" > "$WORK/train-native.out" 2> "$WORK/train-native.err"
  native_rc=$?
  "$BIN/phosctl" run --backend cuda -- python3 tests/python/torch_train.py "$STEPS" > "$WORK/train-phos.out" 2> "$WORK/train-phos.err"
  phos_rc=$?
  cmp_line=$(compare_losses "$WORK/train-native.out" "$WORK/train-phos.out")
  {
    echo "## Training (tests/python/torch_train.py $STEPS)"
    echo
    echo "Exit status: native $native_rc, Phos $phos_rc. Losses: $cmp_line.$(bypassed "$WORK/train-phos.err" && echo ' **The Phos run bypassed Phos.**')"
    echo
    echo "| figure | native ms | Phos ms | native / Phos (throughput ratio) |"
    echo "|---|---|---|---|"
    for t in cnn_train_step transformer_train_step transformer_inference; do
      n=$(timing "$WORK/train-native.err" $t)
      p=$(timing "$WORK/train-phos.err" $t)
      r=$(python3 -c "print(f'{$n / $p:.3f}')" 2>/dev/null || echo -)
      echo "| $t | $n | $p | $r |"
    done
    echo
  } >> "$summary"
  cp "$WORK/train-native.out" "$WORK/train-phos.out" "$OUT/"
  tail -c 20000 "$WORK/train-phos.err" > "$OUT/train-phos.err"
fi

if part cr; then
  [ -f "$WORK/train-native.out" ] || python3 tests/python/torch_train.py "$STEPS" > "$WORK/train-native.out" 2> /dev/null
  "$BIN/phosctl" serve --listen "unix:$WORK/r.sock" --backend cuda > "$OUT/cr-router.log" 2>&1 &
  router=$!
  for _ in $(seq 200); do [ -S "$WORK/r.sock.ctl" ] && break; sleep 0.05; done
  sleep 0.5
  ctl() { "$BIN/phosctl" "$@" --router "unix:$WORK/r.sock"; }
  # A failed restore must not leave the program waiting for its session for minutes.
  PHOS_RECONNECT_TIMEOUT=${PHOS_RECONNECT_TIMEOUT:-60} "$BIN/phosctl" run --endpoint "unix:$WORK/r.sock" -- \
    python3 tests/python/torch_train.py "$STEPS" > "$OUT/cr.out" 2> "$WORK/cr.err" &
  guest=$!
  at="transformer step $((STEPS / 2 / 25 * 25)) "
  for _ in $(seq 3000); do grep -q "$at" "$OUT/cr.out" 2> /dev/null && break; sleep 0.05; done
  id=$(ctl sessions | awk '$3 == "active" { id = $1 } END { print id }')
  ck=$(ctl checkpoint "$id" --out "$IMG" --stop 2>&1)
  echo "$ck" > "$OUT/cr-commands.txt"
  rs=$(ctl restore "$IMG" ${RESTORE_ARGS:-} 2>&1)
  echo "$rs" >> "$OUT/cr-commands.txt"
  wait $guest
  rc=$?
  cmp_line=$(compare_losses "$WORK/train-native.out" "$OUT/cr.out")
  ok=$?
  {
    echo "## Checkpoint and restore mid-training"
    echo
    echo "After \`$at\`: \`phosctl checkpoint SESSION --out $IMG --stop\` then \`phosctl restore $IMG${RESTORE_ARGS:+ $RESTORE_ARGS}\`."
    echo
    echo '```'
    echo "$ck"
    echo "$rs"
    echo '```'
    echo
    if [ $ok = 0 ] && [ $rc = 0 ] && grep -q '^done' "$OUT/cr.out"; then
      echo "The restored run finished (exit 0); losses against the native run: $cmp_line."
    else
      echo "**The restored run differs or failed** (exit $rc): $cmp_line."
    fi
    echo
  } >> "$summary"
  tail -c 20000 "$WORK/cr.err" > "$OUT/cr.err"
  kill $router 2> /dev/null
  rm -rf "$IMG"
fi
cat "$summary"

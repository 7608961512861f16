#!/usr/bin/env bash
# Concurrent checkpoints while the program keeps launching kernels: for each size, the stall
# (how long every call of the session was held) and copy time of a stop-the-world, a
# copy-on-write and a recopy checkpoint; the program's launch rate during each checkpoint
# against before it (its slowdown); and the device time of its kernel before and during the
# checkpoint (during a concurrent one the checked twin runs: the validator's cost per
# launch, with the copy's traffic on the same GPU).
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-cr-concurrent.sh BIN_DIR OUT_DIR
# SIZES (GiB, default "1 2 4 8 16 32"), IMG (image directory, default /dev/shm/phos-img),
# WARM (seconds of running before and after each checkpoint, default 2), ARCH (default
# sm_90), WINDOW_KIB (bytes each kernel writes, default 4096), BACKEND (default cuda; with
# BACKEND=emu ARCH=sm_70 SIZES=0.25 WINDOW_KIB=16 the same steps run on the CPU, which
# checks the script, not the figures).
set -u
BIN=$(realpath "$1")
OUT=$(realpath "$2")
SIZES=${SIZES:-"1 2 4 8 16 32"}
IMG=${IMG:-/dev/shm/phos-img}
WARM=${WARM:-2}
ARCH=${ARCH:-sm_90}
WINDOW_KIB=${WINDOW_KIB:-4096}
BACKEND=${BACKEND:-cuda}
WORK=$(mktemp -d)
mkdir -p "$OUT"

nvcc -O2 -cudart shared -arch="$ARCH" -o "$WORK/cr_busy" tests/bench/cr_busy.cu || exit 1

"$BIN/phosctl" serve --listen "unix:$WORK/r.sock" --backend "$BACKEND" --pool 1 > "$WORK/router.log" 2>&1 &
router=$!
trap 'kill "$router" 2> /dev/null; cp "$WORK/router.log" "$OUT/" 2> /dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 200); do [ -S "$WORK/r.sock.ctl" ] && break; sleep 0.05; done
sleep 0.5
ctl() { "$BIN/phosctl" "$@" --router "unix:$WORK/r.sock"; }
wait_for() { # file text
  for _ in $(seq 2400); do grep -q "$2" "$1" 2> /dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1"; cat "$1"; return 1
}
active_session() { ctl sessions | awk '$3 == "active" { id = $1 } END { print id }'; }
# Launches a second and mean kernel microseconds of the "t" lines between two times.
window_stats() { # file from to
  awk -v a="$2" -v b="$3" '$1 == "t" && $2 >= a && $2 <= b {
      if (n == 0) { t0 = $2; l0 = $3 } t1 = $2; l1 = $3; us += $4; n++ }
    END {
      if (n < 2) { printf "n/a n/a"; exit }
      printf "%.0f %.1f", (l1 - l0) / (t1 - t0), us / n }' "$1"
}

summary="$OUT/cr-concurrent.md"
{
  echo "# Concurrent checkpoints on the GPU, the program launching kernels throughout"
  echo
  if command -v nvidia-smi > /dev/null; then
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  fi
  echo "- backend $BACKEND; images in $IMG; each kernel writes $WINDOW_KIB KiB of one 256 MiB buffer, the buffers in turn"
  echo "- command: \`tests/scripts/gpu-cr-concurrent.sh BIN_DIR OUT_DIR\`"
  echo
  echo "| device memory | checkpoint | calls held ms | copy ms | launches/s before | during (slowdown) | kernel µs before | during | copied aside MiB | writers waited ms (calls) | note |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} > "$summary"

measure() { # size mode flags...
  local size=$1 mode=$2
  shift 2
  rm -f "$WORK/in"
  mkfifo "$WORK/in"
  "$BIN/phosctl" run --endpoint "unix:$WORK/r.sock" -- "$WORK/cr_busy" "$size" "$WINDOW_KIB" \
    < "$WORK/in" > "$WORK/w.out" 2> "$WORK/w.err" &
  local guest=$!
  exec 3> "$WORK/in"
  wait_for "$WORK/w.out" "ready" || return 1
  sleep "$WARM"
  local id; id=$(active_session)
  local t0 t1 ck
  t0=$(date +%s.%N)
  ck=$(ctl checkpoint "$id" --out "$IMG" "$@")
  t1=$(date +%s.%N)
  sleep "$WARM"
  echo stop >&3
  exec 3>&-
  wait "$guest"
  local held copy note
  held=$(echo "$ck" | sed -n 's/.*calls held \([0-9.]*\) ms.*/\1/p')
  copy=$(echo "$ck" | sed -n 's/.*memory copied in \([0-9.]*\) ms.*/\1/p')
  note=$(echo "$ck" | grep -o 'taken again stop-the-world' || true)
  # Copy-on-write: what was copied aside ahead of writes, and the writers' waits in all.
  local aside waited
  aside=$(echo "$ck" | sed -n 's/.*(\([0-9.]*\) MiB copied aside.*/\1/p')
  waited=$(echo "$ck" | sed -n 's/.*; \([0-9]*\) calls waited \([0-9.]*\) ms in all.*/\2 (\1)/p')
  local before us_before during us_during from
  from=$(awk -v t="$t0" -v w="$WARM" 'BEGIN { printf "%.6f", t - w }')
  read -r before us_before <<< "$(window_stats "$WORK/w.out" "$from" "$t0")"
  read -r during us_during <<< "$(window_stats "$WORK/w.out" "$t0" "$t1")"
  local slowdown="n/a"
  if [ "$before" != n/a ] && [ "$during" != n/a ]; then
    slowdown=$(awk -v a="$before" -v b="$during" 'BEGIN { printf "%.0f%%", (1 - b / a) * 100 }')
  fi
  echo "| $size GiB | $mode | $held | $copy | $before | $during ($slowdown) | $us_before | $us_during | ${aside:-} | ${waited:-} | $note |" >> "$summary"
  echo "$size GiB $mode: held $held ms, copy $copy ms, launches/s $before -> $during, kernel µs $us_before -> $us_during $note"
  rm -rf "$IMG" "$WORK/in"
}

for s in $SIZES; do
  measure "$s" stop-the-world --stop-the-world
  measure "$s" copy-on-write
  measure "$s" recopy --recopy
done
echo >> "$summary"
echo "calls held: the quiesce and taking the host state (all of the copy, stop-the-world; the rounds' quiesces and the last copy, recopy). Slowdown: launches a second while the checkpoint ran against the $WARM s before it." >> "$summary"
cat "$summary"

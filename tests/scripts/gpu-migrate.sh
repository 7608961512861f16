#!/usr/bin/env bash
# Live migration on the GPU: for each size, a program keeps launching kernels that rewrite
# HOT of its 256 MiB buffers (tests/bench/cr_busy.cu) while `phosctl migrate` moves its
# session from router A to router B over TCP and back over B's socket (two routers, one
# host, one GPU). Reports what phosctl printed (rounds, bytes, downtime = calls held), and
# the program's launch rate before and during each move.
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-migrate.sh BIN_DIR OUT_DIR
# SIZES (GiB, default "1 4 16"), HOT (buffers rewritten, default 1), WINDOW_KIB (bytes each
# kernel writes, default 64), WARM (seconds before and after, default 2), ARCH (sm_90),
# BACKEND (cuda; BACKEND=emu ARCH=sm_70 SIZES=0.25 checks the script on a CPU), CONNECTIONS
# (the migration stream's TCP connections, default 4), GPUS=2 (also move the session to the
# router's second GPU and back: `phosctl migrate --device`, on a machine with two; the program
# keeps its device 0 throughout (cr_busy checks its own results); with BACKEND=emu the
# servers present GPUS emulated devices, PHOS_EMU_DEVICES).
set -u
BIN=$(realpath "$1")
OUT=$(realpath "$2")
SIZES=${SIZES:-"1 4 16"}
HOT=${HOT:-1}
WINDOW_KIB=${WINDOW_KIB:-64}
WARM=${WARM:-2}
ARCH=${ARCH:-sm_90}
BACKEND=${BACKEND:-cuda}
WORK=$(mktemp -d)
if [ "$BACKEND" = emu ] && [ "${GPUS:-1}" -ge 2 ]; then export PHOS_EMU_DEVICES="$GPUS"; fi
mkdir -p "$OUT"
nvcc -O2 -cudart shared -arch="$ARCH" -o "$WORK/cr_busy" tests/bench/cr_busy.cu || exit 1
head -c 32 /dev/urandom | base64 > "$WORK/secret"
"$BIN/phosctl" serve --listen "unix:$WORK/a.sock" --backend "$BACKEND" ${POOL:+--pool $POOL} --peer-listen 127.0.0.1:7101 \
  --peer-secret-file "$WORK/secret" > "$WORK/a.log" 2>&1 &
ra=$!
"$BIN/phosctl" serve --listen "unix:$WORK/b.sock" --backend "$BACKEND" ${POOL:+--pool $POOL} --peer-listen 127.0.0.1:7102 \
  --peer-secret-file "$WORK/secret" > "$WORK/b.log" 2>&1 &
rb=$!
trap 'kill "$ra" "$rb" 2> /dev/null; cp "$WORK"/a.log "$WORK"/b.log "$OUT/" 2> /dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 200); do [ -S "$WORK/a.sock.ctl" ] && [ -S "$WORK/b.sock.ctl" ] && break; sleep 0.05; done
sleep 0.5
wait_for() { # file text
  for _ in $(seq 2400); do grep -q "$2" "$1" 2> /dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1"; cat "$1"; return 1
}
rate() { # file from to: launches a second between two times
  awk -v a="$2" -v b="$3" '$1 == "t" && $2 >= a && $2 <= b { if (n == 0) { t0 = $2; l0 = $3 } t1 = $2; l1 = $3; n++ }
    END { if (n < 2) printf "n/a"; else printf "%.0f", (l1 - l0) / (t1 - t0) }' "$1"
}
summary="$OUT/migrate.md"
{
  echo "# Live migration on the GPU, the program launching kernels throughout"
  echo
  command -v nvidia-smi > /dev/null && echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "- backend $BACKEND; each kernel writes $WINDOW_KIB KiB of one of the first $HOT 256 MiB buffers, in turn"
  echo "- command: \`SIZES=\"$SIZES\" HOT=$HOT WINDOW_KIB=$WINDOW_KIB CONNECTIONS=${CONNECTIONS:-4} tests/scripts/gpu-migrate.sh BIN_DIR OUT_DIR\`"
  echo
  echo "| device memory | move | total ms | downtime ms | launches/s before | during | what phosctl printed |"
  echo "|---|---|---|---|---|---|---|"
} > "$summary"
move() { # size label router target out ("device:N" moves to the router's own device N)
  local t0 t1 printed where
  case "$3" in device:*) where=(--device "${3#device:}") ;; *) where=(--to "$3") ;; esac
  t0=$(date +%s.%N)
  printed=$("$BIN/phosctl" migrate "$id" --router "unix:$WORK/$2.sock" "${where[@]}" --connections "${CONNECTIONS:-4}" 2>&1)
  local rc=$?
  t1=$(date +%s.%N)
  echo "$printed" > "$WORK/last-move.txt"
  local downtime total before during from
  downtime=$(echo "$printed" | sed -n 's/.*calls held \([0-9.]*\) ms (downtime).*/\1/p')
  total=$(echo "$printed" | sed -n 's/.*MiB sent, in \([0-9.]*\) ms.*/\1/p')
  from=$(awk -v t="$t0" -v w="$WARM" 'BEGIN { printf "%.6f", t - w }')
  before=$(rate "$WORK/w.out" "$from" "$t0")
  sleep 0.5
  during=$(rate "$WORK/w.out" "$t0" "$t1")
  echo "| $1 GiB | $2 -> $4 | ${total:-rc $rc} | ${downtime:-} | $before | $during | $(echo "$printed" | tr '\n' ' ' | tr '|' '/' | cut -c1-400) |" >> "$summary"
  echo "$1 GiB $2 -> $4 (rc $rc):"; echo "$printed"
}
for s in $SIZES; do
  rm -f "$WORK/in"; mkfifo "$WORK/in"
  "$BIN/phosctl" run --endpoint "unix:$WORK/a.sock" -- "$WORK/cr_busy" "$s" "$WINDOW_KIB" "$HOT" \
    < "$WORK/in" > "$WORK/w.out" 2> "$WORK/w.err" &
  guest=$!
  exec 3> "$WORK/in"
  wait_for "$WORK/w.out" "ready" || break
  sleep "$WARM"
  id=$("$BIN/phosctl" sessions --router "unix:$WORK/a.sock" | awk '$3 == "active" { id = $1 } END { print id }')
  move "$s" a tcp:127.0.0.1:7102 b
  sleep "$WARM"
  move "$s" b "unix:$WORK/a.sock" a
  sleep "$WARM"
  if [ "${GPUS:-1}" -ge 2 ]; then
    move "$s" a device:1 "a (GPU 1)"
    sleep "$WARM"
    move "$s" a device:0 "a (GPU 0)"
    sleep "$WARM"
  fi
  echo stop >&3
  exec 3>&-
  wait "$guest"; echo "program exit $? ($(tail -1 "$WORK/w.out"))" | tee -a "$summary"
  tail -3 "$WORK/w.err" >> "$OUT/programs.err"
done
cat "$summary"

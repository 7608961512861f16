#!/usr/bin/env bash
# Usage (on the GPU machine, from the repository root): tests/scripts/gpu-cow-probe.sh BIN_DIR OUT_DIR
# Three copy-on-write checkpoints, one second apart, of one running cr_busy (1 GiB): the
# program's timed launches ("t" lines: time, step, kernel µs) in OUT_DIR/t.txt, the
# checkpoints' start and end times in marks.txt and what phosctl printed in ck.txt, to see
# which launches a checkpoint slows and by how much.
set -u
BIN=$(realpath "$1")
OUT=$(realpath "$2")
mkdir -p "$OUT"
W=$(mktemp -d)
nvcc -O2 -cudart shared -arch=sm_90 -o "$W/cr_busy" tests/bench/cr_busy.cu || exit 1
"$BIN/phosctl" serve --listen "unix:$W/r.sock" --backend cuda --pool 1 > "$OUT/router.log" 2>&1 &
router=$!
for _ in $(seq 200); do [ -S "$W/r.sock.ctl" ] && break; sleep 0.05; done
sleep 0.5
ctl() { "$BIN/phosctl" "$@" --router "unix:$W/r.sock"; }
mkfifo "$W/in"
"$BIN/phosctl" run --endpoint "unix:$W/r.sock" -- "$W/cr_busy" 1 4096 < "$W/in" > "$OUT/w.out" 2> "$OUT/w.err" &
guest=$!
exec 3> "$W/in"
for _ in $(seq 600); do grep -q ready "$OUT/w.out" && break; sleep 0.05; done
sleep 1
id=$(ctl sessions | awk '$3 == "active" { id = $1 } END { print id }')
for k in 1 2 3; do
  echo "ck $k start $(date +%s.%N)" >> "$OUT/marks.txt"
  ctl checkpoint "$id" --out /dev/shm/img$k >> "$OUT/ck.txt" 2>&1
  echo "ck $k end $(date +%s.%N)" >> "$OUT/marks.txt"
  rm -rf /dev/shm/img$k
  sleep 1
done
echo stop >&3; exec 3>&-
wait $guest
kill $router
awk '$1=="t"' "$OUT/w.out" > "$OUT/t.txt"
echo done

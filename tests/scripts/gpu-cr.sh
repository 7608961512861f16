#!/usr/bin/env bash
# Checkpoint/restore on the GPU: correctness of a checkpoint-stop-restore in the middle of a
# run, then checkpoint and full-restore times against image size (with and without the server
# pool), time to the first served call of an on-demand restore against a full one, and the
# driver's own checkpoint (cuCheckpointProcess*) of the same workload.
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-cr.sh BIN_DIR OUT_DIR
# SIZES (GiB, default "1 2 4 8 16"; up to 32: see below), ONDEMAND_SIZES (GiB, default
# "1 2 4 8 16 32"), NOPOOL_SIZES (GiB, default "1 8"), DRIVER_SIZES (GiB, default SIZES) and
# IMG (image directory, default /dev/shm/phos-img, so that the figures measure the copy path
# rather than the disk) can be set. ONLY=ondemand runs the on-demand comparison alone.
#
# Large sizes: an N GiB row needs N GiB of device memory, and N GiB (and 16 chunks of 8 MiB)
# free where IMG is: /dev/shm is half the host's memory unless mounted larger, 64 GiB on a
# 128 GiB host, so 32 GiB fits (one image at a time: each row's is removed after it) and a
# row that does not fit is skipped with a line saying so. The driver's own checkpoint of an
# N GiB workload holds N GiB of host memory in the process.
#
# The servers log their checkpoint and restore steps (PHOS_LOG, default
# info,phos::cr_timing=debug); the summary ends with each restore's step timing.
set -u
export PHOS_LOG=${PHOS_LOG:-info,phos::cr_timing=debug}
BIN=$(realpath "$1")
OUT=$(realpath "$2")
SIZES=${SIZES:-"1 2 4 8 16"}
ONDEMAND_SIZES=${ONDEMAND_SIZES:-"1 2 4 8 16 32"}
NOPOOL_SIZES=${NOPOOL_SIZES:-"1 8"}
DRIVER_SIZES=${DRIVER_SIZES:-$SIZES}
ONLY=${ONLY:-all}
IMG=${IMG:-/dev/shm/phos-img}
ARCH=${ARCH:-sm_90}
WORK=$(mktemp -d)
mkdir -p "$OUT"
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc)")")/include

nvcc -O2 -cudart shared -arch="$ARCH" -Itests/cuda -o "$WORK/iterative" tests/cuda/iterative.cu || exit 1
nvcc -O2 -cudart shared -arch="$ARCH" -o "$WORK/cr_workload" tests/bench/cr_workload.cu || exit 1
cc -O2 -I"$CUDA_INC" -o "$WORK/driver_checkpoint" tests/bench/driver_checkpoint.c -lcuda || echo "no driver checkpoint tool"

routers=()
start_router() { # name pool
  "$BIN/phosctl" serve --listen "unix:$WORK/$1.sock" --backend "${BACKEND:-cuda}" --pool "$2" > "$WORK/$1.log" 2>&1 &
  routers+=($!)
  for _ in $(seq 200); do [ -S "$WORK/$1.sock.ctl" ] && break; sleep 0.05; done
  sleep 0.5
}
ctl() { # name args...
  local r=$1; shift
  "$BIN/phosctl" "$@" --router "unix:$WORK/$r.sock"
}
wait_for() { # file text
  for _ in $(seq 1200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1"; cat "$1"; return 1
}
active_session() { ctl "$1" sessions | awk '$3 == "active" { id = $1 } END { print id }'; }
# Whether an image of N GiB fits where IMG goes (with 1 GiB to spare); says so if not.
image_fits() { # size
  local dir; dir=$(dirname "$IMG")
  local free_kib; free_kib=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  if [ -n "$free_kib" ] && [ "$free_kib" -lt $((($1 + 1) * 1024 * 1024)) ]; then
    echo "- $1 GiB skipped: $dir has $((free_kib / 1024 / 1024)) GiB free, an image of $1 GiB needs $(($1 + 1)) (mount it larger: \`mount -o remount,size=NG /dev/shm\`)" >> "$summary"
    echo "$1 GiB skipped: $dir has $((free_kib / 1024)) MiB free"
    return 1
  fi
}
# Lines of a router's log (its servers' included) after line $2: the step timing of what ran
# since, for the summary.
steps="$WORK/steps.md"
: > "$steps"
log_lines() { wc -l < "$WORK/$1.log" 2>/dev/null || echo 0; }
note_steps() { # router from_line heading
  {
    echo
    echo "$3:"
    echo
    echo '```'
    tail -n +$(($2 + 1)) "$WORK/$1.log" | grep 'phos::cr_timing' | grep -v 'launch\|hooks before' \
      | sed 's/^[^ ]* *DEBUG phos::cr_timing: //' | head -40
    echo '```'
  } >> "$steps"
}

summary="$OUT/cr.md"
{
  echo "# Checkpoint/restore on the GPU"
  echo
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "- images in $IMG; command: \`tests/scripts/gpu-cr.sh BIN_DIR OUT_DIR\`"
  echo
} > "$summary"

# 1. Correctness: stopped at iteration 10, restored (into a pooled server, then into a new
#    one), the output is the native output.
"$WORK/iterative" 60 0 > "$WORK/native.out"
start_router main 1
start_router nopool 0
for r in main nopool; do
  "$BIN/phosctl" run --endpoint "unix:$WORK/$r.sock" -- "$WORK/iterative" 60 30 > "$WORK/phos.out" 2> "$WORK/phos.err" &
  guest=$!
  wait_for "$WORK/phos.out" "iteration 10 " || exit 1
  id=$(active_session $r)
  ctl $r checkpoint "$id" --out "$IMG" --stop | tee "$WORK/ck.txt"
  ctl $r restore "$IMG" | tee "$WORK/rs.txt"
  wait $guest; rc=$?
  # On demand (the default): the time until the session was served.
  rs_ms=$(sed -n 's/^session [0-9]* restored from [^ ]* on demand: serving after \([0-9.]*\) ms.*/\1/p' "$WORK/rs.txt")
  if cmp -s "$WORK/native.out" "$WORK/phos.out" && [ $rc = 0 ]; then
    echo "- $r: checkpoint with --stop at iteration 10 of tests/cuda/iterative.cu, server ended, session restored on demand (served after $rs_ms ms, $(grep -o '(.*server' "$WORK/rs.txt" | head -1 | tr -d '(')): the program finishes with output identical to the native run." >> "$summary"
  else
    echo "- **$r: checkpoint/restore mid-run: output differs from the native run** (rc $rc)" >> "$summary"
    diff "$WORK/native.out" "$WORK/phos.out"; tail "$WORK/phos.err"
  fi
  rm -rf "$IMG"
done

# 2. Times against image size.
{
  echo
  echo "| device memory | pool | checkpoint ms (quiesce + copy) | checkpoint GB/s | restore ms (replay + copy in the server) | restore GB/s | after restore |"
  echo "|---|---|---|---|---|---|---|"
} >> "$summary"
measure() { # router size
  local r=$1 s=$2
  image_fits "$s" || return 0
  mkfifo "$WORK/in"
  "$BIN/phosctl" run --endpoint "unix:$WORK/$r.sock" -- "$WORK/cr_workload" "$s" < "$WORK/in" > "$WORK/w.out" 2> "$WORK/w.err" &
  local g=$!
  exec 3> "$WORK/in"
  wait_for "$WORK/w.out" "ready" || return 1
  local id; id=$(active_session "$r")
  local ck; ck=$(ctl "$r" checkpoint "$id" --out "$IMG" --stop | head -1)
  local ck_ms; ck_ms=$(echo "$ck" | sed -n 's/.* in \([0-9.]*\) ms.*/\1/p')
  local q; q=$(echo "$ck" | sed -n 's/.*quiesce \([0-9.]*\) ms.*/\1/p')
  local c; c=$(echo "$ck" | sed -n 's/.*copy \([0-9.]*\) ms.*/\1/p')
  local from; from=$(log_lines "$r")
  local rs; rs=$(ctl "$r" restore "$IMG" --full)
  sleep 0.2 # the server's log lines reach the router's log
  note_steps "$r" "$from" "Full restore of $s GiB ($([ "$r" = main ] && echo pooled || echo new) server), its steps"
  local rs_ms; rs_ms=$(echo "$rs" | sed -n 's/^session [0-9]* restored from [^ ]* in \([0-9.]*\) ms.*/\1/p')
  local rp; rp=$(echo "$rs" | sed -n 's/.*replayed in \([0-9.]*\) ms.*/\1/p')
  local rc_ms; rc_ms=$(echo "$rs" | sed -n 's/.*copied in \([0-9.]*\) ms.*/\1/p')
  echo go >&3; exec 3>&-
  wait $g
  local v; v=$(tail -1 "$WORK/w.out")
  local gbs; gbs=$(awk "BEGIN { printf \"%.2f\", $s * 1.073741824 / ($c / 1000) }")
  local rgbs; rgbs=$(awk "BEGIN { printf \"%.2f\", $s * 1.073741824 / ($rc_ms / 1000) }")
  echo "| $s GiB | $([ "$r" = main ] && echo yes || echo no) | $ck_ms ($q + $c) | $gbs | $rs_ms ($rp + $rc_ms) | $rgbs | $v |" >> "$summary"
  echo "$s GiB via $r: checkpoint $ck_ms ms, restore $rs_ms ms: $v"
  rm -rf "$IMG" "$WORK/in"
}
if [ "$ONLY" != ondemand ]; then
  for s in $SIZES; do measure main "$s"; done
  for s in $NOPOOL_SIZES; do measure nopool "$s"; done
fi

# 2b. Time to the first served call: on-demand restore (the default) against a full one
#     (--full), pooled server. The workload's next call (its check kernel on its first GiB)
#     is sent before the restore, so it waits in the router and is the session's first call:
#     after a full restore it runs once everything is copied (the restore's time); after an
#     on-demand one, once its own GiB is loaded (its chunks are loaded first).
{
  echo
  echo "Time to the first served call after a restore, pooled server (times from the request; the first call is a kernel reading the first GiB, so it waits for that GiB):"
  echo
  echo "| device memory | full: first call ms (= restore) | on demand: serving ms | on demand: first call ms | on demand: all loaded ms | calls held | after restore (full / on demand) |"
  echo "|---|---|---|---|---|---|---|"
} >> "$summary"
first_call() { # size mode(full|ondemand) -> prints "serving first loaded held verdict"
  local s=$1 mode=$2
  image_fits "$s" > /dev/null || { echo "- - - - skipped"; return 0; }
  mkfifo "$WORK/in"
  "$BIN/phosctl" run --endpoint "unix:$WORK/main.sock" -- "$WORK/cr_workload" "$s" < "$WORK/in" > "$WORK/w.out" 2> "$WORK/w.err" &
  local g=$!
  exec 3> "$WORK/in"
  wait_for "$WORK/w.out" "ready" || { exec 3>&-; rm -f "$WORK/in"; return 1; }
  local id; id=$(active_session main)
  ctl main checkpoint "$id" --out "$IMG" --stop > /dev/null
  sleep 1 # the pool refills
  # The workload's next call goes now, and waits in the router for the restore.
  echo go >&3; exec 3>&-
  local rs
  local from; from=$(log_lines main)
  if [ "$mode" = full ]; then rs=$(ctl main restore "$IMG" --full); else rs=$(ctl main restore "$IMG"); fi
  wait $g
  note_steps main "$from" "$([ "$mode" = full ] && echo Full || echo On-demand) restore of $s GiB (pooled server, the first call waiting), its steps"
  local v; v=$(tail -1 "$WORK/w.out")
  if [ "$mode" = full ]; then
    local ms; ms=$(echo "$rs" | sed -n 's/^session [0-9]* restored from [^ ]* in \([0-9.]*\) ms.*/\1/p')
    echo "- - $ms - $v"
  else
    local serving; serving=$(echo "$rs" | sed -n 's/.*on demand: serving after \([0-9.]*\) ms.*/\1/p')
    local first; first=$(echo "$rs" | sed -n 's/^first call served \([0-9.]*\) ms.*/\1/p')
    local loaded; loaded=$(echo "$rs" | sed -n 's/.*all in \([0-9.]*\) ms after the request.*/\1/p')
    local held; held=$(echo "$rs" | sed -n 's/.*calls held for memory: \([0-9]*\).*/\1/p')
    # The program may end before the load does ("the session ended with ..."): no "all in".
    echo "$serving ${first:-none} ${loaded:--} ${held:--} $v"
  fi
  echo "$s GiB $mode: $rs" >&2
  rm -rf "$IMG" "$WORK/in"
}
for s in $ONDEMAND_SIZES; do
  read -r _ _ full_ms _ full_v <<< "$(first_call "$s" full)"
  read -r od_serving od_first od_loaded od_held od_v <<< "$(first_call "$s" ondemand)"
  echo "| $s GiB | $full_ms | $od_serving | $od_first | $od_loaded | $od_held | $full_v / $od_v |" >> "$summary"
done

# 3. The driver's own checkpoint of the same workload, natively.
if [ "$ONLY" != ondemand ] && [ -x "$WORK/driver_checkpoint" ]; then
  {
    echo
    echo "The driver's checkpoint (cuCheckpointProcessCheckpoint/Restore of the native process, device memory to host memory, no image written):"
    echo
    echo "| device memory | lock ms | checkpoint ms | restore ms | unlock ms | after restore |"
    echo "|---|---|---|---|---|---|"
  } >> "$summary"
  for s in $DRIVER_SIZES; do
    mkfifo "$WORK/in"
    "$WORK/cr_workload" "$s" < "$WORK/in" > "$WORK/n.out" &
    g=$!
    exec 3> "$WORK/in"
    wait_for "$WORK/n.out" "ready" || break
    "$WORK/driver_checkpoint" $g > "$WORK/d.txt" 2>&1
    echo go >&3; exec 3>&-
    wait $g
    get() { sed -n "s/^$1_ms \([0-9.]*\)/\1/p" "$WORK/d.txt"; }
    echo "| $s GiB | $(get lock) | $(get checkpoint) | $(get restore) | $(get unlock) | $(tail -1 "$WORK/n.out") |" >> "$summary"
    cat "$WORK/d.txt"
    rm -f "$WORK/in"
  done
fi

if [ -s "$steps" ]; then
  {
    echo
    echo "## Restore step timing"
    echo
    echo "Steps of a millisecond or more (\`phos::cr_timing\`), in the order they ended; \"restore copy\" sums its threads' time."
    cat "$steps"
  } >> "$summary"
fi
for p in "${routers[@]}"; do kill "$p" 2>/dev/null; done
cp "$WORK"/*.log "$OUT/" 2>/dev/null
cat "$summary"

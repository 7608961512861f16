#!/usr/bin/env bash
# The end of `make demo` (after the release build): build a CUDA program from tests/cuda with
# nvcc, run it through Phos with `phosctl run --summary` (which says which backend ran it and
# why, and what the router counted), move a running program between two routers (live
# migration; its output compared with an uninterrupted run's), then show what to try next.
#
#   scripts/demo.sh [PROGRAM]   PROGRAM: a tests/cuda/*.cu name (default vector_add)
set -euo pipefail
cd "$(dirname "$0")/.."
program="${1:-vector_add}"
phosctl=target/release/phosctl
[ -x "$phosctl" ] || { echo "demo: $phosctl is not built: run \`make demo\`" >&2; exit 1; }
[ -f "tests/cuda/$program.cu" ] || { echo "demo: no tests/cuda/$program.cu" >&2; exit 1; }

# Programs link NVIDIA's runtime as a shared library (`-cudart shared`), so that Phos's
# libcudart can stand in for it. `iterative` runs for as long as asked: the walk-through's
# program to checkpoint and restore.
mkdir -p target/demo
for p in "$program" iterative; do
  if [ ! target/demo/$p -nt tests/cuda/$p.cu ] || [ ! target/demo/$p -nt tests/cuda/check.h ]; then
    echo "nvcc -cudart shared -O2 -Itests/cuda -o target/demo/$p tests/cuda/$p.cu"
    nvcc -cudart shared -O2 -Itests/cuda -o "target/demo/$p" "tests/cuda/$p.cu"
  fi
done

echo
echo "== target/demo/$program through Phos ($phosctl run --summary -- target/demo/$program):"
# Warnings only: the summary says what the log would.
PHOS_LOG="${PHOS_LOG:-warn}" "$phosctl" run --summary -- "target/demo/$program"

# A live migration between two routers on this machine: the program starts at router A and
# moves to router B while it runs; its output must be what an uninterrupted run prints.
echo
echo "== a live migration between two routers (A and B, each its own API servers), mid-run:"
work=$(mktemp -d "${TMPDIR:-/tmp}/phos-demo.XXXXXX")
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap stop_all EXIT
a="unix:$work/a.sock"
b="unix:$work/b.sock"
# A knows B as a peer of its fleet: `phosctl sessions --all` at A lists B's sessions too.
PHOS_LOG=warn "$phosctl" serve --listen "$a" --name A --peer "B=$b" 2> "$work/a.log" & pids+=($!)
PHOS_LOG=warn "$phosctl" serve --listen "$b" --name B 2> "$work/b.log" & pids+=($!)
for r in "$a" "$b"; do
  for _ in $(seq 200); do "$phosctl" sessions --router "$r" > /dev/null 2>&1 && break; sleep 0.05; done
done
echo "$phosctl run --endpoint $a -- target/demo/iterative 60 30    (uninterrupted, for reference)"
"$phosctl" run --endpoint "$a" -- target/demo/iterative 60 30 > "$work/reference.txt" 2> "$work/reference.err"
"$phosctl" run --endpoint "$a" -- target/demo/iterative 60 30 > "$work/moved.txt" 2> "$work/moved.err" &
program=$!
for _ in $(seq 600); do grep -q "^iteration 10 " "$work/moved.txt" && break; sleep 0.05; done
session=$("$phosctl" sessions --router "$a" | awk '$3 == "active" { print $1; exit }')
[ -n "$session" ] || { echo "demo: the program's session is not at A" >&2; exit 1; }
echo "$phosctl migrate $session --router $a --to $b    (after iteration 10)"
"$phosctl" migrate "$session" --router "$a" --to "$b"
echo "$phosctl sessions --all --router $a"
"$phosctl" sessions --all --router "$a"
wait "$program" || { echo "demo: the migrated program failed:" >&2; cat "$work/moved.err" >&2; exit 1; }
if cmp -s "$work/reference.txt" "$work/moved.txt"; then
  echo "The program moved from router A to router B mid-run and printed exactly what the"
  echo "uninterrupted run printed ($(wc -l < "$work/reference.txt") lines, compared)."
else
  echo "demo: the migrated program's output differs from the uninterrupted run's:" >&2
  diff "$work/reference.txt" "$work/moved.txt" >&2 || true
  exit 1
fi

socket="${XDG_RUNTIME_DIR:-/run}/phos/router.sock"
cat <<TEXT

What happened: the program was built with \`nvcc -cudart shared\`; \`phosctl run\` started it
with Phos's libcudart first on its library path, and a private router. Every CUDA call went
to the router, which counts (and can police) it, and on to an API server process that ran it.

Next, with a router that outlives one program (two terminals):
  $phosctl serve
      a router for many programs, tenants and policies (docs/operations.md); leave it running
  $phosctl run --endpoint unix:$socket -- target/demo/iterative 600 100
      a program of about a minute, through that router
  $phosctl sessions
      the router's sessions: the program's id (1), its calls so far
  $phosctl top
      live calls/s, kernel launches/s and device time per tenant (Ctrl-C to leave)
  $phosctl checkpoint 1 --out /tmp/phos-image --stop
      the program's GPU state to disk; the session stops and the program waits...
  $phosctl restore /tmp/phos-image
      ...until it is restored: it carries on where it stopped
On a GPU machine without Rust: \`make gpu-bins\` here, then README.md ("On a GPU machine").
TEXT

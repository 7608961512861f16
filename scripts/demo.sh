#!/usr/bin/env bash
# The end of `make demo` (after the release build): build a CUDA program from tests/cuda with
# nvcc, run it through Phos with `phosctl run --summary` (which says which backend ran it and
# why, and what the router counted), then show what to try next.
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

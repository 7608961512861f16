#!/usr/bin/env bash
# The README's first command on a fresh machine: a Debian bookworm root filesystem made with
# debootstrap (minbase, plus make to type `make` with) and nothing else but Rust (this
# machine's rustup and cargo homes, bind-mounted). In it, from a clean clone of this
# repository's HEAD:
#
#   1. `make demo` installs what it needs and runs the demo;
#   2. a second `make demo` installs nothing (the installed packages are compared) and runs
#      in under a minute;
#   3. with clang hidden (an empty directory mounted over its binaries, in a mount namespace
#      of its own), a build fails and says what to install; with PHOS_WITHOUT_POLICIES=1 it
#      succeeds, and `phosctl policy list` and `phosctl serve` say that the shipped policies
#      are not in the build. (A separate target directory: the demo's build is left alone.)
#
# Heavy (a root filesystem, the CUDA toolkit from Debian, two builds from scratch: about half
# an hour on two cores, some 10 GB of disk), so it is not part of CI or `make test`; run it by
# hand after changing scripts/setup.sh, the Makefile or the build's requirements.
#
# Usage, as root (needs debootstrap, git, unshare, and the network to deb.debian.org, PyPI):
#   tests/scripts/fresh-machine.sh [ROOT_DIR]     (default /var/tmp/phos-fresh)
# ROOT_DIR must not exist; it is removed at the end unless KEEP=1. Logs: ROOT_DIR.log/.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
root="${1:-/var/tmp/phos-fresh}"
logs="$root.log"
mirror="${MIRROR:-http://deb.debian.org/debian}"

[ "$(id -u)" = 0 ] || { echo "fresh-machine: run as root (debootstrap, chroot, mounts)" >&2; exit 1; }
for tool in debootstrap git unshare chroot; do
  command -v "$tool" >/dev/null || { echo "fresh-machine: $tool is needed (apt-get install $tool)" >&2; exit 1; }
done
[ ! -e "$root" ] || { echo "fresh-machine: $root exists; remove it or name another directory" >&2; exit 1; }
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
[ -x "$cargo_home/bin/cargo" ] || { echo "fresh-machine: no cargo in $cargo_home/bin" >&2; exit 1; }

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[$i]}" 2>/dev/null || umount -R -l "${mounted[$i]}" 2>/dev/null || true
  done
  if [ "${KEEP:-0}" != 1 ] && [ -d "$root" ]; then
    # Only once nothing is mounted below it any more.
    if ! grep -q " $root/" /proc/mounts; then rm -rf "$root"; fi
  fi
}
trap cleanup EXIT
mount_at() { # mount_at TARGET MOUNT-ARGS...
  mkdir -p "$1"
  mount "${@:2}" "$1"
  mounted+=("$1")
}

step() { printf '\n=== %s\n' "$*"; }
mkdir -p "$logs"

step "debootstrap bookworm (minbase + make) into $root"
debootstrap --variant=minbase --include=make bookworm "$root" "$mirror" >"$logs/debootstrap.log" 2>&1 \
  || { tail -20 "$logs/debootstrap.log"; exit 1; }
cp /etc/resolv.conf "$root/etc/resolv.conf"
# No services start in a chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mount_at "$root/proc" -t proc proc
mount_at "$root/sys" --rbind /sys --make-rslave
mount_at "$root/dev" --rbind /dev --make-rslave
mount_at "$root/root/.rustup" --bind "$rustup_home"
mount_at "$root/root/.cargo" --bind "$cargo_home"

rev="$(git -C "$repo" rev-parse HEAD)"
step "a clean clone of $rev"
git clone -q --no-hardlinks "$repo" "$root/root/phos"
git -C "$root/root/phos" checkout -q "$rev"

# A login shell of the fresh machine: its own PATH, Rust's, nothing of this machine's.
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 RUSTUP_AUTO_INSTALL=0 \
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/phos && $1"
}
packages() { chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' | sort; }

step "the fresh machine has: $(in_root 'for t in cargo make cc clang nvcc; do command -v $t >/dev/null && printf "%s " $t; done')"
packages >"$logs/packages-0.txt"

step "make demo (first)"
start=$(date +%s)
in_root 'make demo' 2>&1 | tee "$logs/demo-1.log"
echo "--- first make demo: $(($(date +%s) - start)) s"
packages >"$logs/packages-1.txt"
echo "--- packages installed: $(comm -13 "$logs/packages-0.txt" "$logs/packages-1.txt" | wc -l)"

step "make demo (second)"
start=$(date +%s)
in_root 'make demo' 2>&1 | tee "$logs/demo-2.log"
took=$(($(date +%s) - start))
echo "--- second make demo: $took s"
packages >"$logs/packages-2.txt"
if ! cmp -s "$logs/packages-1.txt" "$logs/packages-2.txt"; then
  echo "FAIL: the second make demo changed the installed packages:" >&2
  diff "$logs/packages-1.txt" "$logs/packages-2.txt" >&2 || true
  exit 1
fi
if grep -q "phos setup:" "$logs/demo-2.log"; then
  echo "FAIL: the second make demo's set-up was not silent" >&2
  exit 1
fi
[ "$took" -lt 60 ] || { echo "FAIL: the second make demo took $took s (a minute at most)" >&2; exit 1; }
grep -q "exited with status 0" "$logs/demo-2.log" || { echo "FAIL: no summary of a successful run" >&2; exit 1; }
echo "--- installed nothing, set-up silent, the demo ran in $took s"

# clang's binaries hidden: /usr/bin/clang is left dangling, as if clang were not installed.
without_clang() {
  local bin
  bin="$root$(dirname "$(chroot "$root" readlink -f /usr/bin/clang)")"
  ROOT="$root" BIN="$bin" unshare -m bash -c 'mount -t tmpfs -o size=1m none "$BIN" && root="$ROOT" && in_root "$1"' _ "$1"
}
export -f in_root
export_target='export CARGO_TARGET_DIR=/root/phos/target/without-clang'

step "a build without clang"
if without_clang "$export_target; command -v clang; cargo build -p phosctl" >"$logs/no-clang.log" 2>&1; then
  echo "FAIL: the build without clang succeeded" >&2
  tail -20 "$logs/no-clang.log" >&2
  exit 1
fi
grep "error: phos-policy" "$logs/no-clang.log" || { echo "FAIL: no message from phos-policy:" >&2; tail -20 "$logs/no-clang.log" >&2; exit 1; }
grep -q "PHOS_WITHOUT_POLICIES=1" "$logs/no-clang.log" || { echo "FAIL: the message does not name the opt-out" >&2; exit 1; }

step "a build without clang, with PHOS_WITHOUT_POLICIES=1"
without_clang "$export_target; export PHOS_WITHOUT_POLICIES=1; cargo build -p phosctl -p phos-api-server -p phos-guestlib" \
  >"$logs/without-policies.log" 2>&1 || { tail -20 "$logs/without-policies.log" >&2; exit 1; }
tail -1 "$logs/without-policies.log"
phosctl=/root/phos/target/without-clang/debug/phosctl
in_root "$phosctl policy list --router unix:/nonexistent/router.sock" >"$logs/policy-list.log" 2>&1 || true
cat "$logs/policy-list.log"
grep -q "note: the shipped policies (builtin:fair_share, builtin:memory_quota, builtin:rate_limit) are not in this build" \
  "$logs/policy-list.log" || { echo "FAIL: policy list does not say the shipped policies are absent" >&2; exit 1; }
in_root "PHOS_LOG=warn timeout 3 $phosctl serve --backend emu --listen unix:/tmp/fresh-router.sock" >"$logs/serve.log" 2>&1 || true
cat "$logs/serve.log"
grep -q "are not in this build" "$logs/serve.log" || { echo "FAIL: serve does not say the shipped policies are absent" >&2; exit 1; }
in_root "PHOS_LOG=warn $phosctl run --summary -- target/demo/vector_add" >"$logs/run-without.log" 2>&1 \
  || { cat "$logs/run-without.log" >&2; exit 1; }
cat "$logs/run-without.log"
grep -q "are not in this build" "$logs/run-without.log" || { echo "FAIL: run does not say the shipped policies are absent" >&2; exit 1; }

step "PASS (logs in $logs)"

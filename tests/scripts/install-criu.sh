#!/usr/bin/env bash
# Install Debian trixie's CRIU (4.1.1) into a private prefix on a Debian bookworm host, without
# touching the system's libc: bookworm's criu 3.17 fails `criu check` on recent kernels (6.18:
# "vdso: Unexpected rt vDSO area bounds"), and trixie's needs glibc 2.38 (bookworm has 2.36).
# The .debs of criu, libcompel1, their libraries and trixie's libc6 are fetched with apt-get
# through a private apt configuration (the system's sources and state are not changed),
# unpacked with `dpkg -x` into PREFIX, and `PREFIX/bin/criu` runs criu through that prefix's
# own dynamic loader with `--library-path`. Ends with `criu check`.
#
#   tests/scripts/install-criu.sh [PREFIX]     PREFIX: default /opt/phos-criu
#
# CRIU dumps and restores as root (CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE, CAP_SYS_PTRACE).
set -euo pipefail
prefix="${1:-/opt/phos-criu}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A private apt: trixie's index only, its lists, cache and (empty) status in $work.
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
echo "deb $mirror trixie main" > "$work/sources.list"
touch "$work/status"
cat > "$work/apt.conf" <<EOF
Dir::Etc::SourceList "$work/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::State::Lists "$work/lists";
Dir::Cache "$work/cache";
Dir::State::status "$work/status";
APT::Architecture "amd64";
EOF
export APT_CONFIG="$work/apt.conf"
apt-get -q update > "$work/update.log" || { cat "$work/update.log" >&2; exit 1; }
# criu and what it needs to run (libcompel1, libc6 2.41 and the libraries), not what it
# recommends.
packages=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances --no-pre-depends criu | grep -E '^[a-z0-9]' | sort -u)
(cd "$work/debs" && apt-get -q download $packages 2> >(grep -v "unsandboxed as root" >&2))

rm -rf "$prefix"
mkdir -p "$prefix/bin"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$prefix"; done
lib="$prefix/usr/lib/x86_64-linux-gnu"
[ -x "$lib/ld-linux-x86-64.so.2" ] && [ -x "$prefix/usr/sbin/criu" ] || {
  echo "install-criu: no loader or criu in $prefix" >&2
  exit 1
}
# Plugins from the prefix only (the system's /usr/lib/criu belongs to the other criu).
mkdir -p "$prefix/usr/lib/criu"
cat > "$prefix/bin/criu" <<EOF
#!/bin/sh
# trixie's criu through its own loader and libraries ($prefix); see tests/scripts/install-criu.sh
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$prefix/usr/sbin/criu" --libdir "$prefix/usr/lib/criu" "\$@"
EOF
chmod +x "$prefix/bin/criu"
ls "$work"/debs > "$prefix/PACKAGES"
echo "install-criu: $("$prefix/bin/criu" --version | head -1) in $prefix ($(wc -l < "$prefix/PACKAGES") packages); criu check:"
"$prefix/bin/criu" check

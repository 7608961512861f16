#!/usr/bin/env bash
# Fetch the kernel of the end-to-end VM test (tests/e2e/vm.rs) into DIR (default
# target/vm-kernel): Debian's cloud kernel, unpacked, never installed; DIR gets `vmlinuz`
# and the virtio, vsock and virtio-net modules the test's initramfs loads (virtio-net: the
# VM's network path to its router while its vsock device is away, `phosctl vm-migrate`).
set -euo pipefail
dir="${1:-target/vm-kernel}"
if [ -f "$dir/vmlinuz" ] && [ -f "$dir/modules/vmw_vsock_virtio_transport.ko" ] && [ -f "$dir/modules/virtio_net.ko" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
pkg="$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')"
if [ -z "$pkg" ]; then
  apt-get update -q
  pkg="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')"
fi
if [ -z "$pkg" ]; then
  echo "apt knows no linux-image-cloud-amd64 (Debian's cloud kernel) here: put a kernel's vmlinuz and" \
    "its virtio and vsock modules in $dir/ (and $dir/modules/) by hand" >&2
  exit 1
fi
(cd "$work" && apt-get download -q "$pkg")
dpkg-deb -x "$work"/*.deb "$work/x"
mkdir -p "$dir/modules"
cp "$work"/x/boot/vmlinuz-* "$dir/vmlinuz"
for m in virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci vsock \
  vmw_vsock_virtio_transport_common vmw_vsock_virtio_transport failover net_failover virtio_net; do
  f="$(find "$work/x/lib/modules" -name "$m.ko*" | head -n 1)"
  [ -n "$f" ] || { echo "module $m not in $pkg" >&2; exit 1; }
  cp "$f" "$dir/modules/"
done
echo "$pkg" > "$dir/package"

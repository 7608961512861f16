#!/usr/bin/env bash
# Phos's set-up, shared by `make build|release`, `make demo`, `make test` and .ci/run: checks
# for every tool the target needs and installs what is missing. Silent, and well under a
# second, when everything is there.
#
#   scripts/setup.sh build   a Rust toolchain (never installed here: https://rustup.rs), a C
#                            compiler and GNU ld, make, clang (the shipped eBPF policies)
#   scripts/setup.sh demo    build + nvcc and a host C++ compiler that nvcc accepts
#   scripts/setup.sh test    demo + rustfmt and clippy, QEMU and busybox-static (the VM test),
#                            llvm, the CUDA 11/12/13 runtime headers (the ABI layout tests;
#                            NVIDIA's wheels from PyPI, unpacked), the VM test's kernel
#
# Installs with apt on Debian 12 and Ubuntu 22.04 or later (x86-64), as root or through sudo,
# enabling Debian's non-free (Ubuntu's multiverse) component for nvidia-cuda-toolkit where it
# is off. Where it cannot install (not root and no sudo, no apt), it stops before anything is
# built and prints the commands to run.
#
# It writes target/setup.env, the environment the tests read (PHOS_CUDA1x_INCLUDE: where the
# headers are); `make test` and .ci/run source it. Variables already set win over it.
# PHOS_CUDA_HEADERS moves the headers' cache (default ~/.cache/phos/cuda-headers).
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${1:-}"
case "$profile" in
  build | demo | test) ;;
  *)
    echo "usage: scripts/setup.sh build|demo|test" >&2
    exit 2
    ;;
esac

say() { echo "phos setup: $*" >&2; }
die() {
  say "$*"
  exit 1
}
has() { command -v "$1" >/dev/null 2>&1; }
wants() { [ "$profile" = test ] || { [ "$profile" = demo ] && [ "$1" = demo ]; }; }

if ! has cargo; then
  die "Rust is needed and is not on PATH. Install it with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh
then open a new shell (or \`. ~/.cargo/env\`) and run make again."
fi

# --- What is missing: (apt package, what it is for) pairs.
need_pkgs=()
need_why=()
need() {
  need_pkgs+=("$1")
  need_why+=("$2")
}

# A C compiler that links against the C library (rustc links through it, zstd-sys builds
# with it), and GNU ld (guestlib's build links libphos_guest.so with ld.bfd).
if ! has cc || ! echo 'int main(void) { return 0; }' | cc -x c - -o /dev/null >/dev/null 2>&1; then
  need gcc "a C compiler (cc)"
  need libc6-dev "the C library's headers"
fi
has ld.bfd || need binutils "GNU ld"
has make || need make "make"
has clang || need clang "clang, which compiles the shipped eBPF policies"

probe_dir=""
nvcc_ok=false
# nvcc accepts only some host compilers (Debian's nvcc 11.8: g++ 11 at most); preprocessing a
# kernel runs its check of the host compiler, in about 60 ms.
nvcc_works() {
  [ -n "$probe_dir" ] || {
    probe_dir="$(mktemp -d)"
    trap 'rm -rf "$probe_dir"' EXIT
    printf '__global__ void k() {}\nint main() { k<<<1, 1>>>(); return 0; }\n' >"$probe_dir/probe.cu"
  }
  nvcc -E "$probe_dir/probe.cu" -o /dev/null >"$probe_dir/nvcc.log" 2>&1 && nvcc_ok=true
}

# The g++ that the distribution's nvidia-cuda-toolkit wants: the first g++-N of its Depends
# (installed together, or apt may settle that dependency with a clang nvcc does not take).
os_id=""
codename=""
if [ -r /etc/os-release ]; then
  os_id="$(. /etc/os-release && echo "${ID:-}")"
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
fi
host_cxx_package() {
  local dep
  dep="$(apt-cache show nvidia-cuda-toolkit 2>/dev/null | sed -n 's/^Depends: //p' | grep -o 'g++-[0-9]*' | head -n 1 || true)"
  if [ -n "$dep" ]; then
    echo "$dep"
    return
  fi
  case "$codename" in
    bookworm | jammy) echo g++-11 ;;
    noble) echo g++-12 ;;
  esac
}

if wants demo; then
  # nvcc asks the default C++ compiler for the host's properties before it runs its own.
  has g++ || need g++ "the C++ compiler nvcc asks for the host's properties"
  if ! has nvcc; then
    need nvidia-cuda-toolkit "nvcc, the CUDA compiler"
    cxx="$(host_cxx_package)"
    [ -z "$cxx" ] || has "$cxx" || need "$cxx" "a host compiler that nvcc accepts"
  elif has g++ && ! nvcc_works; then
    # The distribution's nvcc takes the g++ its package names; for another, we cannot tell.
    cxx=""
    if dpkg -S "$(command -v nvcc)" 2>/dev/null | grep -q '^nvidia-cuda-toolkit:'; then
      cxx="$(host_cxx_package)"
    fi
    if [ -n "$cxx" ] && ! has "$cxx"; then
      need "$cxx" "a host compiler that nvcc accepts"
    else
      die "nvcc ($(command -v nvcc)) cannot compile with this machine's host compiler:
$(sed 's/^/    /' "$probe_dir/nvcc.log")
Install a g++ that this nvcc supports, and name it in NVCC_CCBIN if it is not the default."
    fi
  fi
fi

# The CUDA runtime headers of each major version the guest library mirrors: NVIDIA's runtime
# wheels from PyPI, unpacked (about 6 MB, once).
headers="${PHOS_CUDA_HEADERS:-${XDG_CACHE_HOME:-$HOME/.cache}/phos/cuda-headers}"
declare -A wheel=([11]="nvidia-cuda-runtime-cu11==11.8.*" [12]="nvidia-cuda-runtime-cu12==12.9.*" [13]="nvidia-cuda-runtime==13.0.*")
declare -A inside=([11]="nvidia/cuda_runtime/include" [12]="nvidia/cuda_runtime/include" [13]="nvidia/cu13/include")
headers_missing() {
  local major
  for major in 11 12 13; do
    [ -f "$headers/cu$major/${inside[$major]}/cuda_runtime_api.h" ] || return 0
  done
  return 1
}

if wants test; then
  has qemu-system-x86_64 || need qemu-system-x86 "QEMU, for the VM test"
  # The VM test's initramfs runs busybox alone: it must be the static one.
  if ! { has dpkg-query && dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; }; then
    if has dpkg-query || ! [ -x /bin/busybox ]; then
      need busybox-static "busybox, for the VM test's initramfs"
    fi
  fi
  # Inspecting policy objects (llvm-objdump -d), as CI always had it.
  has llvm-objdump || need llvm "llvm's tools for eBPF objects"
  if headers_missing; then
    has unzip || need unzip "unzip, for the CUDA header wheels"
    has python3 && python3 -m pip --version >/dev/null 2>&1 || need python3-pip "pip, which fetches the CUDA header wheels"
  fi
fi

# --- Install, or say how.
as_root=()
can_install=false
if has apt-get; then
  if [ "$(id -u)" = 0 ]; then
    can_install=true
  elif has sudo && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
    as_root=(sudo)
    can_install=true
  fi
fi

cuda_sources=/etc/apt/sources.list.d/phos-cuda-toolkit.sources
cuda_available() {
  local candidate
  candidate="$(apt-cache policy nvidia-cuda-toolkit 2>/dev/null | sed -n 's/^ *Candidate: //p')"
  [ -n "$candidate" ] && [ "$candidate" != "(none)" ]
}
# nvidia-cuda-toolkit lives in Debian's non-free and Ubuntu's multiverse component.
sources_text() {
  case "$os_id" in
    debian)
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$codename"
      ;;
    ubuntu)
      printf 'Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: %s %s-updates\nComponents: multiverse\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n' "$codename" "$codename"
      ;;
  esac
}

if [ ${#need_pkgs[@]} -gt 0 ]; then
  what=""
  for i in "${!need_pkgs[@]}"; do what+="    ${need_pkgs[$i]}: ${need_why[$i]}"$'\n'; done
  wants_cuda=false
  [[ " ${need_pkgs[*]} " == *" nvidia-cuda-toolkit "* ]] && wants_cuda=true
  if ! $can_install; then
    if ! has apt-get || { [ "$os_id" != debian ] && [ "$os_id" != ubuntu ]; }; then
      die "missing for \`make $profile\`, and this is not a Debian or Ubuntu machine with apt: install the equivalents of these Debian packages with the system's package manager, then run make again:
$what(nvcc from NVIDIA's CUDA toolkit, with a host compiler it supports; busybox statically linked)."
    fi
    prefix=""
    run_as="Run"
    if [ "$(id -u)" != 0 ]; then
      if has sudo; then prefix="sudo "; else run_as="Run as root"; fi
    fi
    {
      say "missing for \`make $profile\`:"
      printf '%s' "$what" >&2
      say "this script installs them as root or through sudo, and can do neither here. $run_as:"
      if $wants_cuda && ! cuda_available; then
        echo "    printf '$(sources_text | sed -z 's/\n/\\n/g')' | ${prefix}tee $cuda_sources"
      fi
      echo "    ${prefix}apt-get update"
      echo "    ${prefix}apt-get install -y --no-install-recommends ${need_pkgs[*]}"
      echo "then run make again."
    } >&2
    exit 1
  fi
  say "installing for \`make $profile\`:"
  printf '%s' "$what" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get update -q
  if $wants_cuda && ! cuda_available; then
    [ -n "$(sources_text)" ] || die "nvidia-cuda-toolkit is not in apt's sources, and this script knows only Debian's and Ubuntu's"
    say "enabling the component with nvidia-cuda-toolkit in $cuda_sources"
    sources_text | "${as_root[@]}" tee "$cuda_sources" >/dev/null
    "${as_root[@]}" apt-get update -q
    cuda_available || die "nvidia-cuda-toolkit is still not in apt's sources after adding $cuda_sources"
    # Now that the package is known, its host compiler is too.
    cxx="$(host_cxx_package)"
    [ -z "$cxx" ] || has "$cxx" || [[ " ${need_pkgs[*]} " == *" $cxx "* ]] || need_pkgs+=("$cxx")
  fi
  "${as_root[@]}" apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
  hash -r
fi

# --- What apt cannot check or give: check again, then the rest.
for tool in cc ld.bfd make clang; do
  has "$tool" || die "$tool is still missing after the installation"
done
if wants demo; then
  has nvcc || die "nvcc is still missing after the installation"
  has g++ || die "g++ is still missing after the installation"
  $nvcc_ok || nvcc_works || die "nvcc still cannot compile with this machine's host compiler:
$(sed 's/^/    /' "$probe_dir/nvcc.log")"
fi
[ "$profile" = test ] || exit 0

for component in fmt clippy; do
  cargo "$component" --version >/dev/null 2>&1 && continue
  has rustup || die "cargo $component is missing, and there is no rustup to add it: install your Rust's rustfmt and clippy"
  say "adding the rustup components rustfmt and clippy"
  rustup component add rustfmt clippy
  break
done

# The CUDA runtime headers, fetched above where missing.
env_lines=("# Written by scripts/setup.sh: the environment the tests read. Variables already set win.")
for major in 11 12 13; do
  var="PHOS_CUDA${major}_INCLUDE"
  if [ -n "${!var:-}" ] && [ ! -f "${!var}/cuda_runtime_api.h" ]; then
    die "$var=${!var} has no cuda_runtime_api.h: fix it, or unset it to use the headers fetched into $headers"
  fi
  dir="$headers/cu$major/${inside[$major]}"
  if [ ! -f "$dir/cuda_runtime_api.h" ]; then
    say "fetching the CUDA $major runtime headers (${wheel[$major]}) into $headers/cu$major"
    tmp="$(mktemp -d)"
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      --python-version 3.11 -d "$tmp" "${wheel[$major]}"
    rm -rf "$headers/cu$major"
    mkdir -p "$headers/cu$major"
    unzip -q -o "$tmp"/*.whl -d "$headers/cu$major"
    rm -rf "$tmp"
    [ -f "$dir/cuda_runtime_api.h" ] || die "the wheel ${wheel[$major]} has no ${inside[$major]}/cuda_runtime_api.h"
  fi
  env_lines+=("export $var=\"\${$var:-$dir}\"")
done

# CRIU for the whole-process checkpoint test (tests/e2e/process_checkpoint.rs): Debian
# trixie's, in a private prefix (bookworm's fails `criu check` on recent kernels); as root only.
# Where it cannot be installed or cannot run, that test says so and stops.
criu_prefix="${PHOS_CRIU_PREFIX:-/opt/phos-criu}"
if wants test && [ ! -x "$criu_prefix/bin/criu" ] && [ "$(id -u)" = 0 ] && has apt-get && has dpkg; then
  say "installing CRIU into $criu_prefix (tests/scripts/install-criu.sh)"
  bash tests/scripts/install-criu.sh "$criu_prefix" >&2 || say "CRIU did not install or does not run here: the whole-process checkpoint test will say so"
fi
if [ -x "$criu_prefix/bin/criu" ]; then
  env_lines+=("export PHOS_CRIU=\"\${PHOS_CRIU:-$criu_prefix/bin/criu}\"")
fi

# The VM test's kernel: Debian's cloud kernel package, unpacked into target/vm-kernel (never
# installed). apt must know the package; that may take an update of its lists.
kernel_dir="${PHOS_VM_KERNEL:-target/vm-kernel}"
if [ ! -f "$kernel_dir/vmlinuz" ]; then
  if ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
    $can_install || die "the VM test's kernel comes from Debian's linux-image-cloud-amd64, which apt does not know here: run \`apt-get update\` as root (on other systems, put a kernel's vmlinuz and its virtio and vsock modules in $kernel_dir, see tests/scripts/vm-kernel.sh)"
    "${as_root[@]}" apt-get update -q
  fi
  say "fetching the VM test's kernel into $kernel_dir"
fi
bash tests/scripts/vm-kernel.sh "$kernel_dir"
mkdir -p target
env_file=target/setup.env
new="$(printf '%s\n' "${env_lines[@]}")"
# Rewritten only when it changes.
[ -f "$env_file" ] && [ "$(cat "$env_file")" = "$new" ] || printf '%s\n' "$new" >"$env_file"

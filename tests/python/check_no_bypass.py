#!/usr/bin/env python3
"""Checks that a PyTorch process run through Phos maps no CUDA runtime or driver of its own.

On a machine with PyTorch and a GPU, from the repository root:

    phosctl run --backend cuda -- python3 tests/python/check_no_bypass.py

It initialises CUDA in PyTorch (`torch.cuda.init()` and a small tensor on the device), then
reads /proc/self/maps: every mapped file that is a CUDA runtime or driver (`libcudart.so*`,
`libcuda.so*`, by file name or by ELF soname), or NVML (`libnvidia-ml.so*`, which PyTorch
loads for `torch.cuda.device_count()`), must be Phos's guest library, and Phos's must
be mapped. NVIDIA libraries Phos does not serve yet (cuBLAS, cuDNN, ...) are listed, for
information.

Exit status: 0 no bypass; 1 a CUDA runtime or driver that is not Phos's is mapped (each
named), or Phos's library is not; 2 PyTorch could not initialise CUDA (the maps are still
checked and reported). `--without-torch` skips PyTorch (the check alone, after loading the
libraries given with `--load`), for testing the check itself.
"""

import argparse
import ctypes
import os
import re
import struct
import sys

RUNTIME_OR_DRIVER = re.compile(r"^lib(cuda|cudart|nvidia-ml)\.so(\..*)?$")
UNSERVED = {
    "libcublasLt.so": "cuBLASLt",
    "libcublas.so": "cuBLAS",
    "libcudnn": "cuDNN",
    "libcufft": "cuFFT",
    "libcurand.so": "cuRAND",
    "libcusparse": "cuSPARSE",
    "libcusolver": "cuSOLVER",
    "libnccl.so": "NCCL",
    "libcupti.so": "CUPTI",
}


def soname(path):
    """The DT_SONAME of a 64-bit little-endian ELF file, or None (reads its headers only)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            if shentsize != 64 or shnum > 65535:
                return None
            f.seek(shoff)
            table = f.read(shnum * 64)
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * 64)[1:7] for i in range(len(table) // 64)]
            for kind, _, _, offset, size, link in sections:
                if kind != 6 or link >= len(sections):  # SHT_DYNAMIC, its string table linked
                    continue
                f.seek(offset)
                dynamic = f.read(size)
                for at in range(0, len(dynamic) - 15, 16):
                    tag, value = struct.unpack_from("<qQ", dynamic, at)
                    if tag == 0:
                        break
                    if tag == 14:  # DT_SONAME
                        f.seek(sections[link][3] + value)
                        return f.read(4096).split(b"\0", 1)[0].decode(errors="replace")
    except (OSError, struct.error):
        return None
    return None


def mapped_files():
    files = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].strip()
                if path not in files:
                    files.append(path)
    return files


def is_phos(path, guest_id):
    if os.path.basename(os.path.realpath(path)) == "libphos_guest.so":
        return True
    try:
        st = os.stat(path)
    except OSError:
        return False
    return guest_id is not None and (st.st_dev, st.st_ino) == guest_id


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without-torch", action="store_true", help="skip PyTorch: check the maps only")
    parser.add_argument("--load", action="append", default=[], help="load this library first (ctypes)")
    args = parser.parse_args()

    guest_dir = os.environ.get("PHOS_GUEST_DIR")
    guest_id = None
    if guest_dir:
        try:
            st = os.stat(os.path.join(guest_dir, "libcuda.so.1"))
            guest_id = (st.st_dev, st.st_ino)
        except OSError:
            pass
    if not os.environ.get("PHOS_ENDPOINT"):
        print("note: PHOS_ENDPOINT is not set: run this through `phosctl run`", file=sys.stderr)

    for lib in args.load:
        ctypes.CDLL(lib)
    status = 0
    if not args.without_torch:
        try:
            import torch

            torch.cuda.init()
            x = torch.ones(1024, device="cuda")
            torch.cuda.synchronize()
            print(f"PyTorch {torch.__version__}: CUDA initialised, sum {float(x.sum()):.0f} on {torch.cuda.get_device_name()}")
        except Exception as e:  # noqa: BLE001: any failure to start is reported, the maps still checked
            print(f"FAILED: PyTorch could not initialise CUDA: {type(e).__name__}: {e}", file=sys.stderr)
            status = 2

    phos, foreign, unserved = [], [], []
    for path in mapped_files():
        base = os.path.basename(path)
        name = soname(path)
        if is_phos(path, guest_id):
            phos.append(path)
        elif RUNTIME_OR_DRIVER.match(base) or (name and RUNTIME_OR_DRIVER.match(name)):
            foreign.append(f"{path}" + (f" (soname {name})" if name else ""))
        else:
            library = next((lib for prefix, lib in UNSERVED.items() if base.startswith(prefix)), None)
            if library:
                unserved.append(f"{library}: {path}")

    for line in unserved:
        print(f"note: an NVIDIA library Phos does not serve yet is mapped: {line}")
    if foreign:
        for line in foreign:
            print(f"BYPASS: a CUDA runtime or driver that is not Phos's is mapped: {line}", file=sys.stderr)
        return 1
    if not phos:
        print("BYPASS: Phos's guest library is not mapped: this process did not go through Phos", file=sys.stderr)
        return 1
    print(f"no bypass: the CUDA runtime and driver mapped are Phos's ({phos[0]})")
    return status


if __name__ == "__main__":
    sys.exit(main())

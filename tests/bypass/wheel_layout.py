"""A Python process that uses a CUDA runtime the way a framework's wheels lay it out:
`SITE/nvidia/cuda_runtime/lib/libcudart.so.12`, preloaded by its full path (as PyTorch
preloads its wheels' libraries), and a library `SITE/model/lib/libmodel.so` that needs
`libcudart.so.12` and finds it through its `$ORIGIN` run path. Prints what its calls got and
whether the wheel's runtime is mapped."""
import ctypes
import sys

site = sys.argv[1]
ctypes.CDLL(f"{site}/nvidia/cuda_runtime/lib/libcudart.so.12")
model = ctypes.CDLL(f"{site}/model/lib/libmodel.so")
print("devices", model.device_count())
print("runtime", model.runtime_version())
with open("/proc/self/maps") as maps:
    mapped = any("nvidia/cuda_runtime" in line for line in maps)
print("stand-in mapped:", "yes" if mapped else "no")

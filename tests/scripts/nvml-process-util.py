#!/usr/bin/env python3
"""Print the GPU's own per-process SM utilisation samples (NVML) for SECONDS seconds:
one line per sample, `MONOTONIC_NS PID SAMPLE_TIMESTAMP_US SM_UTIL_PERCENT`. A diagnostic
for comparing the API servers' event-timed device time with the driver's accounting of
time slices (docs/perf.md, fairness)."""
import ctypes, sys, time

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
nvml = ctypes.CDLL("libnvidia-ml.so.1")
if nvml.nvmlInit_v2() != 0:
    sys.exit("nvmlInit failed")
dev = ctypes.c_void_p()
nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


last = 0
end = time.monotonic() + secs
buf = (Sample * 256)()
while time.monotonic() < end:
    n = ctypes.c_uint(256)
    r = nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), ctypes.c_ulonglong(last))
    if r == 0:
        newest = last
        for i in range(n.value):
            s = buf[i]
            if s.timeStamp > last:
                print(time.monotonic_ns(), s.pid, s.timeStamp, s.smUtil, flush=True)
                newest = max(newest, s.timeStamp)
        last = newest
    time.sleep(0.02)

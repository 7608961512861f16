#!/usr/bin/env python3
"""Runs PyTorch's common GPU steps one by one and prints one line per step: `ok`, or the
error it stopped at. Each step is independent, so one failure does not hide the next; the
output of a native run and of a run through Phos can be compared line by line.

    python3 tests/python/torch_steps.py                                 # natively
    phosctl run --backend cuda -- python3 tests/python/torch_steps.py   # through Phos

Results are rounded so that a native run and a run through Phos print the same text when
they compute the same thing. Exit status: the number of failed steps (0: all passed).
"""

import sys
import traceback


def main():
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)

    def tensors():
        a = torch.arange(1 << 20, device=dev, dtype=torch.float32)
        return f"{a[12345].item():.1f} {a.sum().item():.6e}"

    def elementwise():
        a = torch.linspace(-3, 3, 4096, device=dev)
        b = torch.sin(a) * torch.exp(-a * a) + a.clamp(min=0)
        return f"{b.sum().item():.4f} {b.max().item():.4f}"

    def reductions():
        a = torch.arange(10000, device=dev, dtype=torch.float64).reshape(100, 100)
        return f"{a.mean().item():.3f} {a.std().item():.3f} {a.argmax(dim=1)[7].item()}"

    def copies():
        host = torch.arange(1 << 22, dtype=torch.int32)
        back = host.to(dev).mul_(3).cpu()
        return f"{int(back[-1])} {bool(torch.equal(back, host * 3))}"

    def matmul(dtype):
        def step():
            a = torch.ones(256, 512, device=dev, dtype=dtype) / 8
            b = torch.ones(512, 128, device=dev, dtype=dtype) / 4
            c = a @ b
            return f"{c.float().mean().item():.3f}"

        return step

    def conv2d():
        conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(dev)
        with torch.no_grad():
            conv.weight.fill_(0.1)
            conv.bias.fill_(0.0)
        x = torch.ones(2, 3, 16, 16, device=dev, requires_grad=True)
        y = conv(x)
        y.sum().backward()
        return f"{y.sum().item():.2f} {x.grad.sum().item():.2f}"

    def linear():
        # addmm with a bias: PyTorch's cuBLASLt path (gemm and bias in one call).
        lin = torch.nn.Linear(64, 32).to(dev)
        with torch.no_grad():
            lin.weight.fill_(0.01)
            lin.bias.fill_(0.5)
        x = torch.ones(16, 64, device=dev, requires_grad=True)
        y = lin(x)
        y.sum().backward()
        return f"{y.sum().item():.3f} {lin.weight.grad.sum().item():.1f} {x.grad.sum().item():.3f}"

    def cnn_training():
        # A small CNN (convolution, batch norm, pooling, linear) trained a few steps.
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 8 * 8, 10),
        ).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.linspace(-1, 1, 32 * 16 * 16, device=dev).reshape(32, 1, 16, 16)
        target = torch.arange(32, device=dev) % 10
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
        return f"{loss.item():.2f}"

    def graphs():
        x = torch.zeros(1024, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x.add_(1)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        return f"{x.sum().item():.1f}"

    def graphed_linear():
        # Linear layers (cuBLAS/cuBLASLt matmuls) captured in a CUDA graph, as
        # torch.cuda.graph does after a warm-up on a side stream; each replay with a new input
        # must match the eager model.
        torch.manual_seed(1)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        ).to(dev)
        static_in = torch.randn(32, 64, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            static_out = model(static_in)
        worst = 0.0
        for _ in range(3):
            static_in.copy_(torch.randn(32, 64, device=dev))
            g.replay()
            with torch.no_grad():
                eager = model(static_in)
            worst = max(worst, (static_out - eager).abs().max().item())
        return f"{worst < 1e-4}"

    def memory_stats():
        before = torch.cuda.memory_allocated()
        a = torch.empty(1 << 24, device=dev)
        grew = torch.cuda.memory_allocated() - before
        del a
        return f"{grew}"

    def nvml():
        # What PyTorch reads through NVML: the device count of `torch.cuda.device_count()`
        # before CUDA starts (ctypes, libnvidia-ml.so.1), and where pynvml is installed the
        # memory, utilisation and process list of torch.cuda (guarded: absent in some
        # versions). Through Phos the process must map no NVIDIA NVML of its own.
        import os

        parts = []
        if hasattr(torch.cuda, "_device_count_nvml"):
            parts.append(f"count {torch.cuda._device_count_nvml() == torch.cuda.device_count()}")
        a = torch.empty(1 << 24, device=dev)  # 64 MiB
        torch.cuda.synchronize()
        try:
            import pynvml  # noqa: F401
        except ImportError:
            pynvml = None
        if pynvml is not None:
            if hasattr(torch.cuda, "device_memory_used"):
                parts.append(f"used {torch.cuda.device_memory_used() >= a.numel() * 4}")
            if hasattr(torch.cuda, "utilization"):
                parts.append(f"utilization {0 <= torch.cuda.utilization() <= 100}")
            if hasattr(torch.cuda, "list_gpu_processes"):
                listed = [l for l in torch.cuda.list_gpu_processes().splitlines() if l.startswith("process")]
                parts.append(f"processes {len(listed) >= 1}")
        del a
        if os.environ.get("PHOS_GUEST_DIR"):
            theirs = []
            with open("/proc/self/maps") as maps:
                for line in maps:
                    path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
                    if os.path.basename(path).startswith("libnvidia-ml.so"):
                        if os.path.basename(os.path.realpath(path)) != "libphos_guest.so" and path not in theirs:
                            theirs.append(path)
            if theirs:
                raise RuntimeError(f"NVIDIA's NVML is mapped beside Phos's: {', '.join(theirs)}")
        return " ".join(parts)

    def matmul_tf32():
        # TF32 tensor cores: within TF32's precision of the float64 product.
        torch.manual_seed(2)
        a = torch.randn(384, 256, device=dev)
        b = torch.randn(256, 192, device=dev)
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            c = a @ b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
        ref = a.double() @ b.double()
        err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
        return f"{err < 2e-2}"

    def batched_gemm():
        # Batched and strided GEMMs: bmm, baddbmm, and products of transposed (non-contiguous)
        # views, against the float64 result.
        torch.manual_seed(3)
        a = torch.randn(8, 48, 32, device=dev)
        b = torch.randn(8, 32, 40, device=dev)
        bias = torch.randn(8, 48, 40, device=dev)
        worst = 0.0
        for got, want in (
            (torch.bmm(a, b), torch.bmm(a.double(), b.double())),
            (torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0),
             torch.baddbmm(bias.double(), a.double(), b.double(), beta=0.5, alpha=2.0)),
            (a.transpose(1, 2).matmul(a), a.double().transpose(1, 2).matmul(a.double())),
            (a[:, ::2, :] @ b, a.double()[:, ::2, :] @ b.double()),
        ):
            worst = max(worst, (got.double() - want).abs().max().item())
        return f"{worst < 1e-3}"

    def streams():
        # Work on several streams, ordered by events across them.
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        a = torch.ones(1 << 20, device=dev)
        done = torch.cuda.Event()
        with torch.cuda.stream(s1):
            c = a * 2
            done.record(s1)
        s2.wait_event(done)
        with torch.cuda.stream(s2):
            d = (c + 1).sum()
        with torch.cuda.stream(s1):
            e = (a * 5).sum()
        torch.cuda.synchronize()
        return f"{d.item():.0f} {e.item():.0f}"

    def transformer():
        # A small transformer encoder: a few training steps, then inference in bfloat16.
        torch.manual_seed(4)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 2).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(8, 16, 64, device=dev)
        for _ in range(5):
            opt.zero_grad()
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x)
        return f"{loss.item():.3f} {y.dtype} {bool(torch.isfinite(y).all())}"

    def compiled():
        # torch.compile: Triton kernels loaded and launched through the driver API.
        def f(x, y):
            return torch.sin(x) * y + torch.cos(y).relu()

        g = torch.compile(f)
        x = torch.linspace(-4, 4, 1 << 16, device=dev)
        y = torch.linspace(0, 2, 1 << 16, device=dev)
        got = g(x, y)
        mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dev)
        cmlp = torch.compile(mlp)
        z = torch.randn(16, 32, device=dev)
        with torch.no_grad():
            same = torch.allclose(cmlp(z), mlp(z), atol=1e-4)
        return f"{torch.allclose(got, f(x, y), atol=1e-5)} {same}"

    steps = [
        ("tensors", tensors),
        ("elementwise", elementwise),
        ("reductions", reductions),
        ("copies", copies),
        ("matmul_fp32", matmul(torch.float32)),
        ("matmul_fp16", matmul(torch.float16)),
        ("matmul_bf16", matmul(torch.bfloat16)),
        ("matmul_tf32", matmul_tf32),
        ("batched_gemm", batched_gemm),
        ("conv2d", conv2d),
        ("linear", linear),
        ("cnn_training", cnn_training),
        ("graphs", graphs),
        ("memory_stats", memory_stats),
        ("graphed_linear", graphed_linear),
        ("nvml", nvml),
        ("streams", streams),
        ("transformer", transformer),
        ("compiled", compiled),
    ]
    failed = 0
    for name, step in steps:
        try:
            result = step()
            torch.cuda.synchronize()
            print(f"{name}: ok {result}", flush=True)
        except Exception as e:  # a step's failure is its line of output
            failed += 1
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"{name}: FAILED {type(e).__name__}: {first}", flush=True)
            traceback.print_exc(file=sys.stderr)
    return failed


if __name__ == "__main__":
    sys.exit(main())

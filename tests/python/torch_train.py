#!/usr/bin/env python3
"""Trains a small CNN and a small transformer for a few hundred steps each, deterministically,
and prints their losses; then times transformer inference. Run natively and through Phos, the
loss lines must agree (tests/scripts/gpu-torch.sh compares them within float tolerance), and a
run checkpointed and restored in the middle must print the same losses as one that was not.

    python3 tests/python/torch_train.py [STEPS]                       # natively
    phosctl run --backend cuda -- python3 tests/python/torch_train.py   # through Phos

Standard output holds only what the computation determines (`cnn step N loss X`,
`transformer step N loss X`, `done`); timings go to standard error as `timing NAME MS` lines,
so that outputs can be compared and timings read from the same runs.
"""

import os
import sys
import time

# cuBLAS's deterministic mode must be chosen before the library starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def main():
    import torch

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    report_every = 25
    dev = torch.device("cuda")
    # warn_only: an op without a deterministic form warns rather than stops the run.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def timing(name, seconds):
        print(f"timing {name} {seconds * 1e3:.4f}", file=sys.stderr, flush=True)

    def train(name, model, opt, batch):
        # The first steps warm up (allocator, library plans, algorithm choice): timed after.
        warm = min(20, steps // 4)
        t0 = None
        for step in range(1, steps + 1):
            if step == warm + 1:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            x, target = batch(step)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
            if step % report_every == 0 or step == steps:
                print(f"{name} step {step} loss {loss.item():.6f}", flush=True)
        torch.cuda.synchronize()
        timing(f"{name}_train_step", (time.perf_counter() - t0) / (steps - warm))

    # A CNN on MNIST-shaped synthetic images (convolutions, batch norm, pooling, dropout).
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(32 * 7 * 7, 10),
    ).to(dev)
    images = torch.randn(16, 64, 1, 28, 28, device=dev)
    labels = torch.randint(0, 10, (16, 64), device=dev)
    train(
        "cnn",
        cnn,
        torch.optim.SGD(cnn.parameters(), lr=0.02, momentum=0.9),
        lambda step: (images[step % 16], labels[step % 16]),
    )

    # A small transformer language model on synthetic token sequences.
    torch.manual_seed(1)
    vocab, width, length = 96, 128, 32

    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.pos = torch.nn.Parameter(torch.randn(length, width) * 0.02)
            layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True)
            self.body = torch.nn.TransformerEncoder(layer, 2)
            self.head = torch.nn.Linear(width, vocab)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(length))

        def forward(self, tokens):
            h = self.body(self.embed(tokens) + self.pos, mask=self.mask, is_causal=True)
            return self.head(h).reshape(-1, vocab)

    lm = Lm().to(dev)
    # Sequences with structure to learn: each token is the previous plus a per-sequence step.
    start = torch.randint(0, vocab, (16, 32, 1), device=dev)
    stride = torch.randint(1, 5, (16, 32, 1), device=dev)
    seqs = (start + stride * torch.arange(length + 1, device=dev)) % vocab
    train(
        "transformer",
        lm,
        torch.optim.AdamW(lm.parameters(), lr=3e-4),
        lambda step: (seqs[step % 16, :, :-1], seqs[step % 16, :, 1:].reshape(-1)),
    )

    # Inference latency: one batch of eight sequences at a time, in bfloat16.
    lm.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        tokens = seqs[0, :8, :-1]
        for _ in range(10):
            lm(tokens)
        torch.cuda.synchronize()
        runs = 200
        t0 = time.perf_counter()
        for _ in range(runs):
            out = lm(tokens)
            torch.cuda.synchronize()
        timing("transformer_inference", (time.perf_counter() - t0) / runs)
        predicted = out.float().argmax(dim=-1).reshape(8, length)
        right = (predicted == seqs[0, :8, 1:]).float().mean().item()
    print(f"inference accuracy {right:.4f}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

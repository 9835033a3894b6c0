"""PyTorch running the `lmhead` workload's step (docs/spec.md, benchmark workloads): the
comparison of docs/bench.md ("The head").

Two weights nn.Linear(512, 32000) and nn.Linear(512, 256) (bias-free) concatenated as the
split head does, H 512, N 2048 tokens, labels Zipf(32256, 1.2) with 205 (10 %) set to -100;
loss = summed per-token cross-entropy; gradients of both weights and of the hidden states;
Adam (lr 1e-3) on both weights. One step = zero grads, forward, backward, Adam.

Variants: `eager`, and `compile` (torch.compile of the loss, eager backward and Adam; its
first step, which compiles, is the warm-up).

Usage: python benches/pytorch/lmhead.py [--variants eager,compile] [--steps 5] [--threads 2]
Prints one JSON object on its last line.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

V_ORIG, V_NEW, H, N = 32000, 256, 512, 2048
V = V_ORIG + V_NEW
N_IGNORED = round(0.10 * N)


def zipf_ids(n, vocab, s, gen):
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** s
    return torch.multinomial(p / p.sum(), n, replacement=True, generator=gen)


def loss_fn(hidden, w1, w2, labels):
    logits = hidden @ torch.cat([w1, w2], dim=0).t()
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


def run(variant, steps):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    w1 = torch.nn.Linear(H, V_ORIG, bias=False).weight.detach().clone().requires_grad_(True)
    w2 = torch.nn.Linear(H, V_NEW, bias=False).weight.detach().clone().requires_grad_(True)
    hidden = torch.randn(N, H, generator=gen).requires_grad_(True)
    labels = zipf_ids(N, V, 1.2, gen)
    labels[torch.randperm(N, generator=gen)[:N_IGNORED]] = -100
    opt = torch.optim.Adam([w1, w2], lr=1e-3)
    fn = torch.compile(loss_fn) if variant == "compile" else loss_fn
    times = []
    for i in range(1 + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        hidden.grad = None
        loss = fn(hidden, w1, w2, labels)
        loss.backward()
        opt.step()
        loss.item()
        if i > 0:
            times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "step_s": times,
            "gflops_6NVH": 6 * (N - N_IGNORED) * V * H / statistics.median(times) / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="eager,compile")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = {"workload": "lmhead", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "variants": {v: run(v, a.steps) for v in a.variants.split(",")}}
    out["best_s"] = min(r["median_s"] for r in out["variants"].values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()

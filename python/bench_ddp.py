"""The embed_full training step under DistributedDataParallel: two processes
(gloo, one machine, one thread each), each with its own 4096 of the spec's
8192 ids, with splitgrad.torch's SplitTokenEmbeddings on sparse gradients and
SparseAdam, and on fused_adam after prepare_distributed. The sides alternate
over rounds; each round's figure is rank 0's median step.

    python python/bench_ddp.py [--rounds 3] [--steps 8] [--scale 1]

Needs torch besides splitgrad.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


class Model(torch.nn.Module):
    """The embeddings, and one dense parameter for DistributedDataParallel to reduce."""

    def __init__(self, sizes, h, fused):
        super().__init__()
        from splitgrad.torch import SplitTokenEmbeddings

        self.emb = SplitTokenEmbeddings(sizes, list(sizes), h, fused_adam={"lr": 1e-3} if fused else None)
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, ids):
        return self.emb(ids) * self.scale


def worker(rank, world, store, fused, scale, steps, out):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from splitgrad.torch import prepare_distributed

    sizes = {"orig": 32000 // scale, "special": max(1, 256 // scale), "prompt": max(1, 64 // scale)}
    h, n = max(1, 1024 // scale), max(1, 8192 // scale // world)
    torch.manual_seed(0)
    m = Model(sizes, h, fused)
    if fused:
        prepare_distributed(m)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opts = [torch.optim.Adam([m.scale], lr=1e-3)]
    if not fused:
        opts.append(torch.optim.SparseAdam(list(m.emb.parameters()), lr=1e-3))
    g = torch.Generator().manual_seed(rank)
    zipf = torch.arange(1, sum(sizes.values()) + 1, dtype=torch.float64) ** -1.2
    ids = torch.multinomial(zipf, n, replacement=True, generator=g)
    r = torch.randn(n, h, generator=g)
    times = []
    for _ in range(steps + 1):  # a warm-up step first
        t = time.perf_counter()
        for o in opts:
            o.zero_grad()
        ddp(ids).backward(r)
        for o in opts:
            o.step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(statistics.median(times[1:])))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--scale", type=int, default=1, help="divide every size by this (smoke runs)")
    a = p.parse_args()
    sides = {"sparse gradients + SparseAdam": False, "fused_adam + prepare_distributed": True}
    got = {s: [] for s in sides}
    for _ in range(a.rounds):
        for side, fused in sides.items():
            d = tempfile.mkdtemp()
            out = os.path.join(d, "median")
            args = (2, os.path.join(d, "store"), fused, a.scale, a.steps, out)
            mp.start_processes(worker, args=args, nprocs=2, start_method="spawn")
            with open(out) as f:
                got[side].append(float(f.read()))
    print(f"embed_full under DistributedDataParallel, 2 processes x 1 thread, scale {a.scale}, {a.rounds} rounds")
    base = statistics.median(got["sparse gradients + SparseAdam"])
    for side, ts in got.items():
        m = statistics.median(ts)
        print(f"   {m * 1e3:8.1f} ms  {base / m:5.1f}x  {side}   (rounds: {', '.join(f'{t * 1e3:.1f}' for t in ts)})")


if __name__ == "__main__":
    main()

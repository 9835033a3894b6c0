"""Row-sharded layers (splitgrad.torch.shard) against replicated ones
(prepare_distributed, every process holding every table) at the same P = 2:
two gloo processes on localhost, one thread each. For each layer (token
embeddings, split vocabulary, vocabulary-parallel head) a training step
(forward, backward, fused step; torch Adam for the head and the dense rest,
under DistributedDataParallel) is timed after warm-up; the two sides
alternate over rounds, each round's figure is rank 0's median step, and the
reported figure is the median over rounds.

    python python/bench_shard.py [--json] [--rounds 3] [--steps 5] [--dtype bfloat16]

``--dtype bfloat16``: every layer, the dense rest and the inputs in bf16, the
fused optimisers' moments too (``state_dtype="bf16"``), on both sides.

Memory is counted from what each process holds, not from the allocator:
the bytes of the layer's parameters (the table rows this process keeps),
their ``.grad`` tensors if any, the fused optimiser's state
(``fused_optimizer_state()`` replicated, the sharded layer's own fused state)
and torch Adam's state for the layer's parameters, after the timed steps.
``memory_ratio`` is the sum over the three layers of rank 0's sharded bytes
over its replicated bytes. ``bytes_per_step`` is the sharded layer's
``bytes_sent`` (what this rank handed to all_to_all_single, all_gather,
all_reduce) over the timed steps, per step and process.

The memory-limit case: each child sets RLIMIT_AS before building its model.
torch, gloo and the thread pools reserve address space they never touch, so
an absolute limit would measure those reservations; the child instead reads
its own VmSize (/proc/self/status) once torch is imported, the process group
and the layer's group made and a small step run, and sets the limit to that
baseline plus 2.2 times the table's weight bytes W. The replicated table
needs W + 2W (Adam's two moments) + its row gradients, more than the limit;
the sharded build holds W (shard() builds the full module first) plus W/2,
drops the full table, then trains with W/2 + W of moments, within it.

Needs torch besides splitgrad.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

P = 2
LAYERS = ("SplitTokenEmbeddings", "SplitVocabulary", "SplitLanguageModellingHead")
FUSED = {"lr": 1e-3}
# moderate sizes: the whole script runs in about a minute and a half on 2 shared cores
EMB = {"sizes": {"orig": 30000, "new": 2000}, "h": 256, "n": 4096}
SV = {"vocab": 32000, "dim": 256, "langs": 4, "cells": 24000, "n": 4096}
HEAD = {"sizes": {"orig": 14000, "new": 2000}, "h": 128, "n": 1024}
LIMIT_ROWS, LIMIT_H = 200_000, 512  # 410 MB of f32 weights for the memory-limit case


def fused(dtype):
    """``fused_adam`` of a layer of ``dtype``: bf16 moments for a bf16 layer."""
    return FUSED | ({"state_dtype": "bf16"} if dtype == torch.bfloat16 else {})


class EmbModel(torch.nn.Module):
    def __init__(self, sizes, h, dtype=torch.float32):
        super().__init__()
        from splitgrad.torch import SplitTokenEmbeddings

        self.layer = SplitTokenEmbeddings(sizes, list(sizes), h, dtype=dtype, fused_adam=fused(dtype))
        self.scale = torch.nn.Parameter(torch.ones((), dtype=dtype))

    def forward(self, ids, r):
        return ((self.layer(ids) * self.scale) * r).float().sum()


class SvModel(torch.nn.Module):
    def __init__(self, index_path, dtype=torch.float32):
        super().__init__()
        from splitgrad.torch import SplitVocabulary

        self.layer = SplitVocabulary(
            index_path, SV["vocab"], SV["dim"], SV["langs"], gate_init=0.5, dtype=dtype, fused_adam=fused(dtype)
        )
        self.scale = torch.nn.Parameter(torch.ones((), dtype=dtype))

    def forward(self, tokens, langs, shared, r):
        out = self.layer(tokens, langs, shared * self.scale)
        return (out * r).float().sum() + 0.1 * self.layer.penalty().float() + 0.1 * self.layer.fusion_penalty().float()


class HeadModel(torch.nn.Module):
    def __init__(self, sizes, h, dtype=torch.float32):
        super().__init__()
        from splitgrad.torch import SplitLanguageModellingHead

        self.lin = torch.nn.Linear(h, h, dtype=dtype)
        self.layer = SplitLanguageModellingHead(sizes, list(sizes), h, dtype=dtype)

    def forward(self, x, labels):
        return self.layer(torch.tanh(self.lin(x)), labels).cross_entropy.float().sum()


def make_index(path):
    rng = np.random.default_rng(3)
    cells = np.sort(rng.choice(SV["langs"] * SV["vocab"], size=SV["cells"], replace=False))
    np.savez(path, language_index=cells // SV["vocab"], token_index=cells % SV["vocab"])


def _nbytes(x):
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def held_bytes(layer, opt):
    """Parameters, their .grad, fused optimiser state, torch optimiser state of ``layer``."""
    params = list(layer.parameters())
    n = sum(_nbytes(p.detach()) + (_nbytes(p.grad) if p.grad is not None else 0) for p in params)
    if hasattr(layer, "_fused_state"):
        n += _nbytes(layer._fused_state())
    elif getattr(layer, "fused_optimizer_state", None) is not None:
        n += _nbytes(layer.fused_optimizer_state())
    ids = {id(p) for p in params}
    for p, st in opt.state.items():
        if id(p) in ids:
            n += _nbytes(dict(st))
    return n


def workload(kind, rank, index_path, dtype=torch.float32):
    """(model, the inputs of each step) of one layer's workload on ``rank``, in ``dtype``."""
    g = torch.Generator().manual_seed(100 + rank)
    torch.manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    if kind == "SplitTokenEmbeddings":
        m = EmbModel(EMB["sizes"], EMB["h"], dtype)
        v = sum(EMB["sizes"].values())
        zipf = torch.arange(1, v + 1, dtype=torch.float64) ** -1.1
        ids = torch.multinomial(zipf, EMB["n"], replacement=True, generator=g)
        return m, (ids, randn(EMB["n"], EMB["h"]))
    if kind == "SplitVocabulary":
        m = SvModel(index_path, dtype)
        zipf = torch.arange(1, SV["vocab"] + 1, dtype=torch.float64) ** -1.1
        t = torch.multinomial(zipf, SV["n"], replacement=True, generator=g)
        langs = torch.randint(0, SV["langs"], (SV["n"],), generator=g)
        shared = randn(SV["n"], SV["dim"])
        return m, (t, langs, shared, randn(SV["n"], SV["dim"]))
    m = HeadModel(HEAD["sizes"], HEAD["h"], dtype)
    v = sum(HEAD["sizes"].values())
    labels = torch.randint(0, v, (HEAD["n"],), generator=g)
    labels[::11] = -100
    return m, (randn(HEAD["n"], HEAD["h"]), labels)


def _init(rank, store):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=120))


def timing_worker(rank, store, sharded, steps, index_path, out, dtype=torch.float32):
    _init(rank, store)
    from splitgrad.torch import prepare_distributed, shard

    res = {}
    for kind in LAYERS:
        m, inputs = workload(kind, rank, index_path, dtype)
        if sharded:
            shard(m)
        else:
            prepare_distributed(m)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        # torch Adam for what has no fused step: the dense rest, and the head (local rows when sharded)
        opt = torch.optim.Adam([p for n, p in m.named_parameters() if not n.startswith("layer.") or kind == "SplitLanguageModellingHead"], lr=1e-3)
        times, sent0 = [], 0
        for i in range(steps + 2):  # two warm-up steps
            if i == 2:
                sent0 = m.layer.bytes_sent if sharded else 0
            dist.barrier()
            t = time.perf_counter()
            opt.zero_grad()
            ddp(*inputs).backward()
            opt.step()
            times.append(time.perf_counter() - t)
        res[kind] = {
            "median_s": statistics.median(times[2:]),
            "held_bytes": held_bytes(m.layer, opt),
            "bytes_per_step": (m.layer.bytes_sent - sent0) / steps if sharded else None,
        }
        del ddp, m, opt
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def _vmsize():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def limit_worker(rank, store, sharded, out):
    _init(rank, store)
    from splitgrad.torch import SplitTokenEmbeddings, prepare_distributed, shard

    group = dist.new_group()
    # warm the kernels, the threads and the groups on a tiny table before measuring the baseline
    small = EmbModel({"orig": 64}, 8)
    shard(small, group) if sharded else prepare_distributed(small, group)
    small(torch.arange(8), torch.ones(8, 8)).backward()
    dist.barrier()
    del small
    w = LIMIT_ROWS * LIMIT_H * 4
    base = _vmsize()
    limit = base + int(2.2 * w)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    result = {"baseline_vmsize": base, "limit": limit, "weights_bytes": w}
    try:
        torch.manual_seed(0)
        m = torch.nn.Module()
        m.layer = SplitTokenEmbeddings({"orig": LIMIT_ROWS}, ["orig"], LIMIT_H, fused_adam=FUSED)
        m = shard(m, group) if sharded else prepare_distributed(m, group)
        g = torch.Generator().manual_seed(rank)
        for _ in range(3):
            ids = torch.randint(0, LIMIT_ROWS, (4096,), generator=g)
            m.layer(ids).sum().backward()
        result["peak_vmsize"] = _vmsize()
        result["outcome"] = "trained 3 steps"
        result["ok"] = True
    except (MemoryError, RuntimeError) as e:  # an allocation refused by the limit
        result["outcome"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        result["ok"] = False
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    # a rank that failed cannot rejoin its peer's collectives; leave without the group's teardown
    os._exit(0)


def run(fn, args):
    mp.start_processes(fn, args=args, nprocs=P, start_method="spawn")


def cpu():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one line of JSON")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the layers', the dense rest's and the inputs' dtype (bfloat16: bf16 moments too)")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    d = tempfile.mkdtemp()
    index_path = os.path.join(d, "index.npz")
    make_index(index_path)
    got = {True: [], False: []}
    for r in range(a.rounds):
        for sharded in ((True, False) if r % 2 == 0 else (False, True)):
            out = os.path.join(d, f"t{r}{int(sharded)}")
            run(timing_worker, (os.path.join(d, f"s{r}{int(sharded)}"), sharded, a.steps, index_path, out, dtype))
            with open(out) as f:
                got[sharded].append(json.load(f))
    med = {s: {k: statistics.median(x[k]["median_s"] for x in got[s]) for k in LAYERS} for s in got}
    held = {s: {k: got[s][-1][k]["held_bytes"] for k in LAYERS} for s in got}
    limit = {}
    for sharded in (False, True):
        out = os.path.join(d, f"limit{int(sharded)}")
        run(limit_worker, (os.path.join(d, f"ls{int(sharded)}"), sharded, out))
        ranks = []
        for rank in range(P):
            with open(f"{out}.{rank}") as f:
                ranks.append(json.load(f))
        limit["sharded" if sharded else "replicated"] = ranks[0] | {"all_ranks_ok": all(x["ok"] for x in ranks)}
    res = {
        "P": P,
        "threads_per_process": 1,
        "rounds": a.rounds,
        "steps": a.steps,
        "dtype": a.dtype,
        "memory_ratio": sum(held[True].values()) / sum(held[False].values()),
        "memory_ratio_by_layer": {k: held[True][k] / held[False][k] for k in LAYERS},
        "held_bytes": {"sharded": held[True], "replicated": held[False]},
        "step_ratio": {k: med[True][k] / med[False][k] for k in LAYERS},
        "bytes_per_step": {k: statistics.median(x[k]["bytes_per_step"] for x in got[True]) for k in LAYERS},
        "median_step_s": {"sharded": med[True], "replicated": med[False]},
        "rounds_step_s": {("sharded" if s else "replicated"): [{k: x[k]["median_s"] for k in LAYERS} for x in got[s]] for s in got},
        "memory_limit": limit,
        "cpu": cpu(),
    }
    if a.json:
        print(json.dumps(res))
        return
    print(f"sharded vs replicated (prepare_distributed), {a.dtype}, {P} processes x 1 thread, {a.rounds} rounds x {a.steps} steps; {res['cpu']}")
    for k in LAYERS:
        print(
            f"  {k:28s} step {med[True][k] * 1e3:7.1f} ms vs {med[False][k] * 1e3:7.1f} ms ({res['step_ratio'][k]:.2f}x)"
            f"  held {held[True][k] / 1e6:7.1f} MB vs {held[False][k] / 1e6:7.1f} MB"
            f"  sent {res['bytes_per_step'][k] / 1e6:6.2f} MB/step"
        )
    print(f"  memory_ratio {res['memory_ratio']:.3f}")
    for side, x in limit.items():
        print(f"  RLIMIT_AS baseline+{(x['limit'] - x['baseline_vmsize']) / 1e6:.0f} MB, {x['weights_bytes'] / 1e6:.0f} MB table, {side}: {x['outcome']}")


if __name__ == "__main__":
    main()

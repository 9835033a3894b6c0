"""FBGEMM's CPU table-batched embeddings against the splitgrad.torch drop-in,
both with float16 tables, on the embed_full workload of docs/spec.md §5, in
one process; and what each does with updates smaller than half an ulp.

    python python/bench_fbgemm.py [--threads 2] [--rounds 5] [--steps 5] [--scale 1] [--json]

Needs fbgemm-gpu-cpu and the torch it was built for (fbgemm-gpu-cpu 1.9.0 with
torch 2.14: ``pip install torch==2.14.1 fbgemm-gpu-cpu==1.9.0``) besides
splitgrad. FBGEMM's CPU training takes float16 tables (its CPU forward of
sequence embeddings is not implemented for bfloat16), and has no Adam on the
CPU (its constructor refuses one). So the timed step is each one's own
optimiser:

- FBGEMM ``SplitTableBatchedEmbeddingBagsCodegen`` on the CPU, one table per
  split, ``PoolingMode.NONE`` (one output row per id), float16 weights and
  outputs, ``stochastic_rounding=True``, with ``EXACT_ROWWISE_ADAGRAD`` (one
  f32 moment per row) or ``EXACT_SGD`` (no state);
- ``splitgrad.torch.SplitTokenEmbeddings(dtype=torch.float16,
  fused_adam=...)`` (Adam: two moments per element, f32 or bf16, and
  stochastic rounding).

FBGEMM's step does less optimiser work than Adam's. Its batch is grouped by
table in the step (global ids to each table's local ids, and its output rows
put back in the batch's order), which the drop-in does inside its forward.
Before timing, both sides start from the same weights and their forward
outputs are compared (a gather: equal bit for bit). The timing alternates
the sides over rounds (a warm-up step first) and quotes each side's median
step and the median over rounds of each round's ratio.

The rounding part runs each optimiser on 100 rows of 64 elements at 1.0, where
a float16 ulp is 2⁻¹⁰ ≈ 9.8e-4, for 200 steps whose every update is below
half an ulp (the gradient is 1 everywhere): FBGEMM's SGD (lr 1e-4) and
row-wise Adagrad (lr 1e-4), with ``stochastic_rounding`` True and False, and
the drop-in's fused Adam (lr 1e-4) with stochastic and with nearest rounding.
It reports each one's mean change against the change the same steps make in
float32.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys

import numpy as np


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
    p.add_argument("--scale", type=int, default=1, help="divide every size by this (smoke runs; 1 is the spec's workload)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on the last line")
    return p.parse_args()


ARGS = parse()
# The script sits beside the package's sources (python/splitgrad, without the
# compiled extension): import the installed package, not those.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from bench_common import timed, zipf  # noqa: E402  (numpy only)

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import torch  # noqa: E402

try:
    from fbgemm_gpu.split_embedding_configs import SparseType  # noqa: E402
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode  # noqa: E402
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
        ComputeDevice,
        EmbeddingLocation,
        OptimType,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
except (ImportError, OSError) as e:  # OSError: an fbgemm built for another torch
    sys.exit(
        f"bench_fbgemm.py: cannot import fbgemm_gpu with torch {torch.__version__} ({e}); "
        "install fbgemm-gpu-cpu with the torch it was built for, e.g. "
        "pip install torch==2.14.1 fbgemm-gpu-cpu==1.9.0"
    )

import splitgrad  # noqa: E402
import splitgrad.torch as sgt  # noqa: E402

torch.set_num_threads(ARGS.threads)
try:
    splitgrad.set_num_threads(ARGS.threads)
except RuntimeError:
    pass

F16 = torch.float16
LR = 1e-3


def sz(n):
    return max(1, n // ARGS.scale)


def fbgemm_tables(sizes, dim, optimizer, lr, stochastic_rounding=True):
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(v, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for v in sizes],
        optimizer=optimizer,
        weights_precision=SparseType.FP16,
        output_dtype=SparseType.FP16,
        stochastic_rounding=stochastic_rounding,
        learning_rate=lr,
        pooling_mode=PoolingMode.NONE,
    )


class Routed(torch.nn.Module):
    """FBGEMM's tables behind global ids, as the drop-in takes them: each
    batch grouped by table (one bag per table, each id one output row) and
    the output rows put back in the batch's order."""

    def __init__(self, tbe, sizes):
        super().__init__()
        sizes = [int(v) for v in sizes]
        self.tbe = tbe
        self.starts = torch.tensor(np.cumsum([0] + list(sizes))[:-1], dtype=torch.long)
        self.ends = torch.tensor(np.cumsum(sizes), dtype=torch.long)

    def group(self, ids):
        """The batch grouped by table: its order, each id's local id in
        that order, and the bags' offsets (one bag per table)."""
        table = torch.bucketize(ids, self.ends, right=True)
        order = torch.argsort(table, stable=True)
        local = ids[order] - self.starts[table[order]]
        counts = torch.bincount(table, minlength=len(self.starts))
        return order, local, torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])

    def forward(self, ids):
        order, local, offsets = self.group(ids)
        rows = self.tbe(local, offsets).view(len(ids), -1)
        out = torch.empty_like(rows)
        out[order] = rows
        return out


def workload():
    """embed_full (docs/spec.md §5): splits orig 32000, special 256, prompt
    64; H 1024; N 8192 ids Zipf over the global vocabulary; every split
    trained; the loss Σ out ⊙ R, its backward from R."""
    n, h = sz(8192), sz(1024)
    sizes = {"orig": sz(32000), "special": sz(256), "prompt": sz(64)}
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(zipf(rng, sum(sizes.values()), n))
    r = torch.from_numpy(np.random.default_rng(1).standard_normal((n, h), dtype=np.float32)).to(F16)
    return sizes, h, ids, r


def speed():
    sizes, h, ids, r = workload()
    order = list(sizes)
    torch.manual_seed(0)
    ours = {
        "splitgrad.torch f16, fused_adam (stochastic rounding, f32 state)": {"lr": LR},
        "splitgrad.torch f16, fused_adam (stochastic rounding, bf16 state)": {"lr": LR, "state_dtype": "bf16"},
    }
    ours = {name: sgt.SplitTokenEmbeddings(sizes, order, h, dtype=F16, fused_adam=cfg) for name, cfg in ours.items()}
    first = next(iter(ours.values()))
    start = first.state_dict()
    for m in ours.values():
        m.load_state_dict(start)

    def fbgemm(optimizer):
        m = Routed(fbgemm_tables(sizes.values(), h, optimizer, LR), sizes.values())
        for w, s in zip(m.tbe.split_embedding_weights(), order):
            w.copy_(start[f"token_embedding.{s}.weight"])
        return m

    theirs = {
        "FBGEMM TBE f16, EXACT_ROWWISE_ADAGRAD (stochastic_rounding=True)": fbgemm(OptimType.EXACT_ROWWISE_ADAGRAD),
        "FBGEMM TBE f16, EXACT_SGD (stochastic_rounding=True)": fbgemm(OptimType.EXACT_SGD),
    }
    # FBGEMM's tables alone: the batch grouped by table before the step (as
    # a data loader could hand it over), the upstream gradient in its order.
    grouped_name = "FBGEMM TBE f16, EXACT_ROWWISE_ADAGRAD, the batch grouped by table beforehand"
    grouped = fbgemm(OptimType.EXACT_ROWWISE_ADAGRAD)
    g_order, g_local, g_offsets = grouped.group(ids)
    g_r = r[g_order].contiguous()

    def grouped_out():
        return grouped.tbe(g_local, g_offsets).view(len(ids), -1)

    def loss(out, r):
        return float(torch.dot(out.float().reshape(-1), r.float().reshape(-1)))

    with torch.no_grad():
        want = first(ids)
        loss_before = loss(want, r)
        diffs = {name: float((m(ids).float() - want.float()).abs().max()) for name, m in theirs.items()}
        diffs[grouped_name] = float((grouped_out().float() - want[g_order].float()).abs().max())

    outputs = {
        **{name: (lambda m=m: m(ids), r) for name, m in theirs.items()},
        grouped_name: (grouped_out, g_r),
        **{name: (lambda m=m: m(ids), r) for name, m in ours.items()},
    }
    base = next(iter(outputs))
    times = {s: [] for s in outputs}
    rounds = {s: [] for s in outputs}
    for _ in range(ARGS.rounds):
        for s, (out, upstream) in outputs.items():

            def step():
                out().backward(upstream)

            step()  # warm-up
            t = timed(step, ARGS.steps)
            times[s] += t
            rounds[s].append(statistics.median(t))
    paired = {s: statistics.median(a / b for a, b in zip(rounds[base], rs)) for s, rs in rounds.items()}
    with torch.no_grad():
        losses = {name: loss(out(), upstream) for name, (out, upstream) in outputs.items()}
    return {
        "workload": "embed_full",
        "sizes": sizes,
        "hidden": h,
        "tokens": len(ids),
        "steps_per_side": ARGS.rounds * (ARGS.steps + 1),
        "forward_max_abs_diff_vs_splitgrad": diffs,
        "median_s": {s: statistics.median(t) for s, t in times.items()},
        "round_median_s": rounds,
        "speedup_over_first": paired,
        "loss_before": loss_before,
        "loss_after": losses,
    }


def rounding():
    """200 steps of updates below half a float16 ulp on rows at 1.0."""
    v, d, n, steps, lr = 1000, 64, 100, 200, 1e-4
    ids = torch.arange(n)
    ones = torch.ones(n, d, dtype=F16)
    out = {}

    def mean_change(w):
        return float((w[:n].float() - 1.0).mean())

    for opt, name in ((OptimType.EXACT_SGD, "EXACT_SGD"), (OptimType.EXACT_ROWWISE_ADAGRAD, "EXACT_ROWWISE_ADAGRAD")):
        for sr in (True, False):
            m = Routed(fbgemm_tables([v], d, opt, lr, stochastic_rounding=sr), [v])
            m.tbe.split_embedding_weights()[0].fill_(1.0)
            for _ in range(steps):
                m(ids).backward(ones)
            out[f"FBGEMM {name}, stochastic_rounding={sr}"] = mean_change(m.tbe.split_embedding_weights()[0])
        # The same steps in f32: SGD moves by lr a step; row-wise Adagrad by
        # lr / sqrt(k) at step k (the mean square of a row's gradient is 1).
        k = np.arange(1, steps + 1)
        out[f"float32 trajectory of {name}"] = float(-lr * (steps if opt == OptimType.EXACT_SGD else (1 / np.sqrt(k)).sum()))
    for dtype, cfg, name in (
        (torch.float32, {}, "float32 trajectory of fused Adam (splitgrad.torch, f32 table)"),
        (F16, {}, "splitgrad.torch f16, fused_adam, stochastic rounding"),
        (F16, {"rounding": "nearest"}, "splitgrad.torch f16, fused_adam, nearest rounding"),
    ):
        m = sgt.SplitTokenEmbeddings({"t": v}, ["t"], d, dtype=dtype, fused_adam={"lr": lr, **cfg})
        with torch.no_grad():
            m.token_embedding["t"].weight.fill_(1.0)
        for _ in range(steps):
            m(ids).backward(ones.to(dtype))
        out[name] = mean_change(m.token_embedding["t"].weight.detach())
    return {"rows": n, "dim": d, "steps": steps, "lr": lr, "mean_change": out}


def main():
    env = {
        "cpu": platform.processor() or platform.machine(),
        "threads": ARGS.threads,
        "torch": torch.__version__,
        "fbgemm_gpu": getattr(__import__("fbgemm_gpu"), "__version__", "unknown"),
        "splitgrad_build": getattr(splitgrad._splitgrad, "BUILD", "unknown"),
    }
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if env["splitgrad_build"] != "release":
        print(
            f"bench_fbgemm.py: warning: splitgrad's extension is a {env['splitgrad_build']} build, many times "
            "slower than what `pip install ./python` builds; its timings do not stand for splitgrad",
            file=sys.stderr,
        )
    res = {"env": env, "speed": speed(), "rounding": rounding()}
    s = res["speed"]
    print(f"== embed_full, float16 tables ({s['steps_per_side']} steps per side, {ARGS.rounds} alternating rounds; {env['cpu']}, {ARGS.threads} threads)")
    for name, t in s["median_s"].items():
        print(f"  {t * 1e3:9.2f} ms  {s['speedup_over_first'][name]:6.2f}×  {name}")
    print("  forward, largest difference from splitgrad's on the same weights: " + ", ".join(f"{v:g}" for v in s["forward_max_abs_diff_vs_splitgrad"].values()))
    print(f"  loss Σ out ⊙ R before the steps {s['loss_before']:.2f}; after them (each its own optimiser, lr {LR}):")
    for name, x in s["loss_after"].items():
        print(f"    {x:14.2f}  {name}")
    rr = res["rounding"]
    print(f"\n== {rr['steps']} steps of updates below half an ulp, rows at 1.0 in float16 (lr {rr['lr']}): mean change")
    for name, x in rr["mean_change"].items():
        print(f"  {x:+.6f}  {name}")
    if ARGS.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()

"""A PyTorch training step (forward, backward, optimiser) with the splitgrad.torch
modules against the same step with d9d's SplitTokenEmbeddings (sparse=True +
SparseAdam) and plain-torch references, on the benchmark workloads of
docs/spec.md §5, side by side in one process.

Before timing, each workload runs one step of both sides from the same weights
and reports the largest difference of the outputs and of every gradient. The
timing alternates the two sides over rounds (a warm-up step first) and quotes
the median step of each side and their ratio, and the median over rounds of
each round's ratio (the figure a load that drifts between rounds disturbs
least).

    python python/bench.py [--threads 2] [--rounds 3] [--steps 5] [--workloads embed_prompt,...]
                           [--scale 1] [--upstream given|dot] [--heap-kept] [--omp-passive] [--json]
                           [--dtype float32|bfloat16]

--dtype bfloat16 runs the embedding workloads (embed_prompt, embed_full) with
every table, output and upstream gradient in bf16: d9d's module after
``.to(torch.bfloat16)`` with torch.optim.SparseAdam (which keeps its moments
in bf16 and rounds every store to nearest), against the drop-in built with
``dtype=torch.bfloat16`` under SparseAdam, and with ``fused_adam`` (stochastic
rounding; moments in f32, and in bf16). After the timing, when every side has
taken the same steps from the same weights, it reports each side's loss
Σ out ⊙ R (evaluated in f32) beside an untimed f32 run of d9d + SparseAdam
for as many steps, and the bytes of the parameters and of the optimiser state.

The embedding workloads' loss is Σ out ⊙ R (plus the penalties for
splitvocab), the same on both sides, in one of two forms (--upstream):

- ``given`` (the default): the loss's value is one torch.dot under no_grad and
  the backward starts from ∂loss/∂out = R, passed as ``out.backward(R)``: the
  golden cases' ``upstream`` array, and what a layer inside a larger model
  receives from the layers above it.
- ``dot``: ``torch.dot(out, R).backward()``. Torch's autograd then forms
  ∂out = 1·R as a fresh N × H tensor each step; at the spec's sizes that is a
  32 MiB allocation whose pages the kernel supplies anew every time (about
  10–14 ms on this machine), paid by both sides alike.

--omp-passive sets OMP_WAIT_POLICY=PASSIVE for both sides. By default torch's
OpenMP workers keep spinning on the cores for a while after each parallel torch
op (here the loss's torch.dot, the optimisers' foreach ops), and splitgrad's
threads, which run next, share those cores with them.

Needs torch and d9d (pip install torch d9d) besides splitgrad.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
    p.add_argument("--workloads", default="embed_prompt,embed_full,splitvocab,lmhead")
    p.add_argument("--scale", type=int, default=1, help="divide every size by this (smoke runs; 1 is the spec's workload)")
    p.add_argument(
        "--upstream",
        choices=("given", "dot"),
        default="given",
        help="how the embedding workloads' loss Σ out ⊙ R starts its backward (see above)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the embedding workloads' tables, outputs and gradients (see above)",
    )
    p.add_argument(
        "--heap-kept",
        action="store_true",
        help="run with glibc's malloc keeping large blocks in the heap (no fresh pages each step), for both sides",
    )
    p.add_argument(
        "--omp-passive",
        action="store_true",
        help="run with OMP_WAIT_POLICY=PASSIVE: torch's OpenMP workers sleep at once after a parallel op "
        "instead of spinning on the cores splitgrad's threads then need, for both sides",
    )
    return p.parse_args()


ARGS = parse()
# The script sits beside the package's sources (python/splitgrad, without the
# compiled extension): import the installed package, not those.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from bench_common import timed, zipf  # noqa: E402  (numpy only)

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
HEAP_KEPT = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
# Both settings are read when the process starts: set them, then start again.
_ENV = {
    **({"GLIBC_TUNABLES": HEAP_KEPT} if ARGS.heap_kept else {}),
    **({"OMP_WAIT_POLICY": "PASSIVE"} if ARGS.omp_passive else {}),
}
if any(os.environ.get(k) != v for k, v in _ENV.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **_ENV})
# matrixmultiply (the head's products) reads its thread count once per process.
os.environ.setdefault("MATMUL_NUM_THREADS", str(ARGS.threads))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import splitgrad  # noqa: E402
import splitgrad.torch as sgt  # noqa: E402

# "release", or "debug" for a development build (an older extension has no BUILD).
BUILD = getattr(splitgrad._splitgrad, "BUILD", "unknown")

torch.set_num_threads(ARGS.threads)
try:
    splitgrad.set_num_threads(ARGS.threads)
except RuntimeError:
    pass

from d9d.module.block.embedding import SplitTokenEmbeddings as D9dEmbeddings  # noqa: E402

LR = 1e-3


def sz(n):
    return max(1, n // ARGS.scale)


def d9d_sparse(sizes, order, h):
    m = D9dEmbeddings(split_vocab_size=sizes, split_order=order, hidden_size=h)
    for e in m.token_embedding.values():
        e.sparse = True
    return m


def inner(x, r):
    """Σ x ⊙ r as one dot product."""
    return torch.dot(x.reshape(-1), r.reshape(-1))


def backward_of(out, r, extra=None):
    """Backward of Σ out ⊙ r (+ ``extra``, a 0-d tensor) in the --upstream form; returns the loss."""
    given = ARGS.upstream == "given"
    with torch.no_grad() if given else contextlib.nullcontext():
        loss = inner(out, r) if extra is None else inner(out, r) + extra
    if not given:
        loss.backward()
        return loss.detach()
    if extra is None:
        out.backward(r)
    else:
        torch.autograd.backward([out, extra], [r, torch.ones((), dtype=extra.dtype)])
    return loss


def maxdiff(a, b):
    a = a.to_dense() if a.is_sparse else a
    b = b.to_dense() if b.is_sparse else b
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


# --- workloads: each returns (sides, check) ---------------------------------
# a side is (name, step function); check() runs one step of both and returns
# {what: max |difference|}.


def state_bytes(m, opt):
    """The bytes of a side's optimiser state: torch's, or the fused Adam's."""
    if opt is not None:
        return sum(t.nbytes for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    return sum(v.nbytes for v in m.fused_optimizer_state().values())


def embeddings_workload(sizes, order, trainable, ids, h):
    if ARGS.dtype == "bfloat16":
        return embeddings_workload_bf16(sizes, order, trainable, ids, h)
    rng = np.random.default_rng(1)
    r = torch.from_numpy(rng.standard_normal((len(ids), h), dtype=np.float32))
    ids = torch.from_numpy(ids)
    torch.manual_seed(0)
    theirs = d9d_sparse(sizes, order, h)
    ours = sgt.SplitTokenEmbeddings(sizes, order, h)
    ours.load_state_dict(theirs.state_dict())
    fused = sgt.SplitTokenEmbeddings(sizes, order, h, fused_adam={"lr": LR})
    fused.load_state_dict(theirs.state_dict())
    for m in (theirs, ours, fused):
        for s in order:
            m.token_embedding[s].weight.requires_grad_(s in trainable)

    def make(m):
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.SparseAdam(params, lr=LR) if m is not fused else None

        def step():
            if opt:
                opt.zero_grad(set_to_none=True)
            backward_of(m(ids), r)
            if opt:
                opt.step()

        return step

    def check():
        a, b = ours(ids), theirs(ids)
        backward_of(a, r)
        backward_of(b, r)
        out = {"output": maxdiff(a, b)}
        for s in trainable:
            out[f"grad {s}"] = maxdiff(ours.token_embedding[s].weight.grad, theirs.token_embedding[s].weight.grad)
        ours.zero_grad(set_to_none=True)
        theirs.zero_grad(set_to_none=True)
        return out

    return [
        ("d9d SplitTokenEmbeddings, sparse=True + SparseAdam", make(theirs)),
        ("splitgrad.torch + SparseAdam", make(ours)),
        ("splitgrad.torch, fused_adam", make(fused)),
    ], check


def embeddings_workload_bf16(sizes, order, trainable, ids, h):
    bf16 = torch.bfloat16
    rng = np.random.default_rng(1)
    r = torch.from_numpy(rng.standard_normal((len(ids), h), dtype=np.float32)).to(bf16)
    ids = torch.from_numpy(ids)
    torch.manual_seed(0)
    theirs = d9d_sparse(sizes, order, h).to(bf16)
    start = theirs.state_dict()
    ours = sgt.SplitTokenEmbeddings(sizes, order, h, dtype=bf16)
    fused = sgt.SplitTokenEmbeddings(sizes, order, h, dtype=bf16, fused_adam={"lr": LR})
    fused_bf16 = sgt.SplitTokenEmbeddings(sizes, order, h, dtype=bf16, fused_adam={"lr": LR, "state_dtype": "bf16"})
    ref = d9d_sparse(sizes, order, h)  # f32, from the same (bf16) weights: untimed
    for m in (ours, fused, fused_bf16, ref):
        m.load_state_dict(start)
    for m in (theirs, ours, fused, fused_bf16, ref):
        for s in order:
            m.token_embedding[s].weight.requires_grad_(s in trainable)
    taken, opts = {}, {}

    def make(m, r):
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.SparseAdam(params, lr=LR) if getattr(m, "_fused", None) is None else None
        opts[id(m)] = opt

        def step():
            if opt:
                opt.zero_grad(set_to_none=True)
            backward_of(m(ids), r)
            if opt:
                opt.step()
            taken[id(m)] = taken.get(id(m), 0) + 1

        return step

    with torch.no_grad():
        start_loss = float(inner(theirs(ids).float(), r.float()))
    ref_step = make(ref, r.float())
    sides = [
        ("d9d SplitTokenEmbeddings bf16, sparse=True + SparseAdam (bf16 state, nearest)", theirs),
        ("splitgrad.torch bf16 + SparseAdam", ours),
        ("splitgrad.torch bf16, fused_adam (stochastic rounding, f32 state)", fused),
        ("splitgrad.torch bf16, fused_adam (stochastic rounding, bf16 state)", fused_bf16),
    ]
    sides = [(name, make(m, r), m) for name, m in sides]

    def check():
        a, b = ours(ids), theirs(ids)
        backward_of(a, r)
        backward_of(b, r)
        out = {"output": maxdiff(a, b)}
        for s in trainable:
            out[f"grad {s}"] = maxdiff(ours.token_embedding[s].weight.grad, theirs.token_embedding[s].weight.grad)
        ours.zero_grad(set_to_none=True)
        theirs.zero_grad(set_to_none=True)
        return out

    def after():
        """Each side's loss after its steps (all took as many), and the f32 reference's."""
        n = taken[id(theirs)]
        assert all(taken[id(m)] == n for _, _, m in sides), "the sides took different numbers of steps"
        for _ in range(n):
            ref_step()
        with torch.no_grad():
            losses = {name: float(inner(m(ids).float(), r.float())) for name, _, m in sides}
            losses[f"f32 reference: d9d f32 + SparseAdam, {n} steps (untimed)"] = float(inner(ref(ids), r.float()))
        nbytes = {
            name: {
                "params": sum(p.untyped_storage().nbytes() for p in m.parameters()),
                "state": state_bytes(m, opts[id(m)]),
            }
            for name, _, m in sides
        }
        return {"steps": n, "loss_before": start_loss, "loss_after": losses, "bytes": nbytes}

    return [(name, step) for name, step, _ in sides], check, after


def embed_prompt():
    n, v, p = sz(8192), sz(151936), sz(16)
    rng = np.random.default_rng(0)
    ids = zipf(rng, v, n)
    prompt = np.arange(n) % 8 == 7
    ids[prompt] = v + zipf(rng, p, int(prompt.sum()))
    return embeddings_workload({"orig": v, "prompt": p}, ["orig", "prompt"], {"prompt"}, ids, sz(1024))


def embed_full():
    n = sz(8192)
    sizes = {"orig": sz(32000), "special": sz(256), "prompt": sz(64)}
    rng = np.random.default_rng(0)
    ids = zipf(rng, sum(sizes.values()), n)
    return embeddings_workload(sizes, list(sizes), set(sizes), ids, sz(1024))


class ReferenceSplitVocabulary(torch.nn.Module):
    """docs/spec.md §2.3 in plain torch (the reference module's computation)."""

    def __init__(self, language_index, token_index, vocab_size, dim, n_languages):
        super().__init__()
        n = len(token_index)
        self.lookup = torch.full((n_languages, vocab_size), -1, dtype=torch.long)
        self.lookup[language_index, token_index] = torch.arange(n)
        self.token_index = token_index
        self.rows = torch.nn.Parameter(torch.zeros(n, dim))
        self.gate_logit = torch.nn.Parameter(torch.zeros(n))

    def penalty(self):
        return torch.sigmoid(self.gate_logit).mean()

    def fusion_penalty(self):
        groups, which = torch.unique(self.token_index, return_inverse=True)
        total = torch.zeros(len(groups), self.rows.shape[1]).index_add(0, which, self.rows)
        count = torch.zeros(len(groups)).index_add(0, which, torch.ones(len(which)))
        return (self.rows - (total / count.clamp(min=1)[:, None])[which]).norm(dim=1).mean()

    def forward(self, token_ids, lang, shared):
        row = self.lookup[lang, token_ids]
        has = row >= 0
        safe = row.clamp(min=0)
        g = torch.sigmoid(self.gate_logit)[safe].unsqueeze(1) * has.unsqueeze(1)
        return shared * (1.0 - g) + self.rows[safe] * g


def splitvocab():
    import tempfile

    v, d, langs, n_rows, n = sz(32000), sz(512), 8, sz(20000), sz(8192)
    rng = np.random.default_rng(0)
    cells = np.sort(rng.choice(langs * v, size=min(n_rows, langs * v), replace=False))
    li, ti = cells // v, cells % v
    path = os.path.join(tempfile.mkdtemp(), "index.npz")
    np.savez(path, language_index=li, token_index=ti)
    tokens = torch.from_numpy(zipf(rng, v, n))
    lang = torch.from_numpy(rng.integers(0, langs, n))
    r = torch.from_numpy(rng.standard_normal((n, d), dtype=np.float32))
    noise = torch.from_numpy(0.01 * rng.standard_normal((len(cells), d), dtype=np.float32))

    torch.manual_seed(0)
    shared_t = d9d_sparse({"vocab": v}, ["vocab"], d)
    ref = ReferenceSplitVocabulary(torch.from_numpy(li), torch.from_numpy(ti), v, d, langs)
    with torch.no_grad():
        ref.rows.copy_(shared_t.token_embedding["vocab"].weight[torch.from_numpy(ti)] + noise)
    shared_o = sgt.SplitTokenEmbeddings({"vocab": v}, ["vocab"], d)
    shared_o.load_state_dict(shared_t.state_dict())
    sv = sgt.SplitVocabulary(path, v, d, langs, 0.0)
    sv.seed_from(shared_o.token_embedding["vocab"].weight)
    with torch.no_grad():
        sv.rows += noise
    shared_f = sgt.SplitTokenEmbeddings({"vocab": v}, ["vocab"], d, fused_adam={"lr": LR})
    shared_f.load_state_dict(shared_t.state_dict())
    sv_f = sgt.SplitVocabulary(path, v, d, langs, 0.0, fused_adam={"lr": LR})
    sv_f.load_state_dict(sv.state_dict())

    def loss_of(emb, vocab):
        out = vocab(tokens, lang, emb(tokens))
        return backward_of(out, r, 0.01 * vocab.penalty() + 0.01 * vocab.fusion_penalty())

    def make(emb, vocab):
        opts = [] if vocab is sv_f else [
            torch.optim.SparseAdam(list(emb.parameters()), lr=LR),
            torch.optim.Adam([vocab.rows, vocab.gate_logit], lr=LR, foreach=True),
        ]

        def step():
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss_of(emb, vocab)
            for o in opts:
                o.step()

        return step

    def check():
        a = sv(tokens, lang, shared_o(tokens))
        b = ref(tokens, lang, shared_t(tokens))
        out = {"output": maxdiff(a, b)}
        la, lb = loss_of(shared_o, sv), loss_of(shared_t, ref)
        out["loss (relative)"] = abs(float(la) - float(lb)) / abs(float(lb))
        out["grad shared table"] = maxdiff(
            shared_o.token_embedding["vocab"].weight.grad, shared_t.token_embedding["vocab"].weight.grad
        )
        out["grad rows"] = maxdiff(sv.rows.grad, ref.rows.grad)
        out["grad gate_logit"] = maxdiff(sv.gate_logit.grad, ref.gate_logit.grad)
        for m in (shared_o, shared_t, sv, ref):
            m.zero_grad(set_to_none=True)
        return out

    return [
        ("d9d SplitTokenEmbeddings (sparse) + reference SplitVocabulary, SparseAdam/Adam", make(shared_t, ref)),
        ("splitgrad.torch SplitTokenEmbeddings + SplitVocabulary, SparseAdam/Adam", make(shared_o, sv)),
        ("splitgrad.torch SplitTokenEmbeddings + SplitVocabulary, fused_adam", make(shared_f, sv_f)),
    ], check


def lmhead():
    sizes = {"orig": sz(32000), "new": sz(256)}
    h, n = sz(512), sz(2048)
    rng = np.random.default_rng(0)
    labels = zipf(rng, sum(sizes.values()), n)
    labels[rng.choice(n, size=round(n * 0.1), replace=False)] = -100
    labels = torch.from_numpy(labels)
    hidden0 = torch.from_numpy(rng.standard_normal((n, h), dtype=np.float32))
    torch.manual_seed(0)
    ours = sgt.SplitLanguageModellingHead(sizes, list(sizes), h)
    ours.reset_parameters()
    ref = torch.nn.ModuleDict({s: torch.nn.Linear(h, k, bias=False) for s, k in sizes.items()})
    ref.load_state_dict({k.removeprefix("lm_head."): v for k, v in ours.state_dict().items()})

    def ref_loss(x):
        w = torch.cat([ref[s].weight for s in sizes])
        return F.cross_entropy(x @ w.T, labels, ignore_index=-100, reduction="sum")

    def make(loss_fn, params):
        opt = torch.optim.Adam(params, lr=LR)
        x = hidden0.clone().requires_grad_(True)

        def step():
            opt.zero_grad(set_to_none=True)
            x.grad = None
            loss_fn(x).backward()
            opt.step()

        return step

    def check():
        x1 = hidden0.clone().requires_grad_(True)
        x2 = hidden0.clone().requires_grad_(True)
        a = ours.forward_sum(x1, labels)
        b = ref_loss(x2)
        a.backward()
        b.backward()
        la, lb = float(a.detach()), float(b.detach())
        out = {"loss (relative)": abs(la - lb) / abs(lb), "grad hidden": maxdiff(x1.grad, x2.grad)}
        for s in sizes:
            out[f"grad {s}"] = maxdiff(ours.lm_head[s].weight.grad, ref[s].weight.grad)
        per_token = ours(hidden0, labels).cross_entropy
        x3 = hidden0.clone()
        w = torch.cat([ref[s].weight for s in sizes])
        want = F.cross_entropy(x3 @ w.T, labels, ignore_index=-100, reduction="none")
        out["per-token loss"] = maxdiff(per_token.detach(), want.detach())
        ours.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        return out

    return [
        ("torch: concatenated weights, full logits, F.cross_entropy, Adam", make(ref_loss, list(ref.parameters()))),
        ("splitgrad.torch forward_sum, Adam", make(lambda x: ours.forward_sum(x, labels), list(ours.parameters()))),
        (
            "splitgrad.torch forward(...).cross_entropy.sum(), Adam",
            make(lambda x: ours(x, labels).cross_entropy.sum(), list(ours.parameters())),
        ),
    ], check


WORKLOADS = {"embed_prompt": embed_prompt, "embed_full": embed_full, "splitvocab": splitvocab, "lmhead": lmhead}


def main():
    report = {
        "threads": ARGS.threads,
        "scale": ARGS.scale,
        "heap_kept": ARGS.heap_kept,
        "omp_passive": ARGS.omp_passive,
        "upstream": ARGS.upstream,
        "dtype": ARGS.dtype,
        "torch": torch.__version__,
        "splitgrad_build": BUILD,
        "workloads": {},
    }
    if BUILD != "release":
        print(
            f"bench.py: warning: splitgrad's extension is a {BUILD} build, many times slower than "
            "what `pip install ./python` builds; its timings do not stand for splitgrad",
            file=sys.stderr,
        )
    if not ARGS.json:
        print(
            f"torch {torch.__version__}, {ARGS.threads} threads, upstream {ARGS.upstream}"
            + (", heap kept" if ARGS.heap_kept else "")
            + (", OMP_WAIT_POLICY=PASSIVE" if ARGS.omp_passive else "")
            + ("" if BUILD == "release" else f", splitgrad {BUILD} build")
        )
    for name in ARGS.workloads.split(","):
        sides, check, *after = WORKLOADS[name]()
        diffs = check()
        steps = ARGS.steps if name != "lmhead" else max(1, min(ARGS.steps, 3))
        times = {s: [] for s, _ in sides}
        rounds = {s: [] for s, _ in sides}  # each round's median
        for _, step in sides:
            step()  # warm-up: optimiser state, buffers
        for _ in range(ARGS.rounds):
            for s, step in sides:
                t = timed(step, steps)
                times[s] += t
                rounds[s].append(statistics.median(t))
        med = {s: statistics.median(t) for s, t in times.items()}
        base = sides[0][0]
        # The first side's time over each side's, round by round: the ratio a
        # load that drifts between rounds disturbs least.
        paired = {s: statistics.median(a / b for a, b in zip(rounds[base], r)) for s, r in rounds.items()}
        report["workloads"][name] = {
            "max_abs_difference": diffs,
            "median_s": med,
            "min_s": {s: min(t) for s, t in times.items()},
            "speedup_vs_first": {s: med[base] / m for s, m in med.items()},
            "paired_speedup_vs_first": paired,
            "round_median_s": rounds,
            "steps_per_side": len(times[base]),
        }
        extra = after[0]() if after else None
        if extra is not None:
            report["workloads"][name]["after"] = extra
        if not ARGS.json:
            print(f"\n== {name} ({len(times[base])} steps per side, {ARGS.rounds} alternating rounds)")
            print("   differences: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
            for s in med:
                print(
                    f"   {med[s] * 1e3:9.2f} ms  (min {min(times[s]) * 1e3:8.2f})  {med[base] / med[s]:6.1f}x  "
                    f"(by round {paired[s]:5.1f}x)  {s}"
                )
            if extra is not None:
                print(f"   loss Σ out ⊙ R after {extra['steps']} steps from {extra['loss_before']:.4f}:")
                for s, v in extra["loss_after"].items():
                    print(f"   {v:14.4f}  {s}")
                for s, b in extra["bytes"].items():
                    print(f"   params {b['params'] / 2**20:8.1f} MiB, optimiser state {b['state'] / 2**20:8.1f} MiB  {s}")
            sys.stdout.flush()
        del sides, check
    if ARGS.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

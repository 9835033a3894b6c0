"""PyTorch training the model of `splitgrad train` on a corpus file: the comparison of
docs/bench.md ("The main job at real vocabularies").

The model, as `splitgrad train` defines it (docs/spec.md):
  shared  nn.Embedding(V, D, sparse=True)                          SparseAdam
  rows    nn.Embedding(P, D, sparse=True), one per (language, token) pair seen at least
          --min-count times in the corpus, seeded from its token's shared row + N(0, 0.01)
                                                                    SparseAdam
  gates   nn.Parameter(zeros(P)), g = sigmoid                       Adam
  x       shared[t], or shared[t] + g_r * (rows[r] - shared[t]) where (l, t) has row r
  head    nn.Linear(D, V, bias=False)                               Adam
  loss    mean cross-entropy of the next token + gate_penalty * mean(sigmoid(gates))
Batches of bigrams (context, language, next token) within sequences, drawn uniformly up
front (not timed). One step: zero grads, forward, backward, both optimisers.

Usage: python benches/pytorch/bigram.py CORPUS.npz [--steps 20] [--batch 4096] [--dim 64]
Prints one JSON object on its last line (tokens_per_s = batch / median step).
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Bigram(nn.Module):
    def __init__(self, vocab, n_lang, dim, pair_lang, pair_tok, gen):
        super().__init__()
        self.shared = nn.Embedding(vocab, dim, sparse=True)
        p = len(pair_tok)
        lookup = torch.full((n_lang, vocab), -1, dtype=torch.long)
        lookup[pair_lang, pair_tok] = torch.arange(p)
        self.register_buffer("lookup", lookup)
        self.rows = nn.Embedding(max(p, 1), dim, sparse=True)
        with torch.no_grad():
            if p:
                self.rows.weight.copy_(
                    self.shared.weight[pair_tok] + 0.01 * torch.randn(p, dim, generator=gen)
                )
        self.gate_logit = nn.Parameter(torch.zeros(max(p, 1)))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, lang, ctx):
        x = self.shared(ctx)
        r = self.lookup[lang, ctx]
        sel = (r >= 0).nonzero().squeeze(1)
        rs = r[sel]
        g = torch.sigmoid(self.gate_logit[rs]).unsqueeze(1)
        xs = x[sel]
        x = x.index_put((sel,), xs + g * (self.rows(rs) - xs))
        return self.head(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--min-count", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--gate-penalty", type=float, default=0.005)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    d = np.load(a.corpus)
    tok = d["token_ids"].astype(np.int64)
    lang = d["language_ids"].astype(np.int64)
    vocab = int(d["vocab_size"]) if "vocab_size" in d.files else int(tok.max()) + 1
    n_lang = int(d["n_languages"]) if "n_languages" in d.files else int(lang.max()) + 1
    starts = d["sequence_starts"].astype(np.int64) if "sequence_starts" in d.files else np.array([0])
    ends = np.append(starts[1:], len(tok))
    ok = np.ones(len(tok), bool)
    ok[ends - 1] = False  # the last token of a sequence has no next token
    ctx_pos = np.nonzero(ok)[0]
    cell = lang[ctx_pos] * vocab + tok[ctx_pos]
    cells, counts = np.unique(cell, return_counts=True)
    kept = cells[counts >= a.min_count]
    pair_lang = torch.from_numpy(kept // vocab)
    pair_tok = torch.from_numpy(kept % vocab)

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = Bigram(vocab, n_lang, a.dim, pair_lang, pair_tok, gen)
    sparse_opt = torch.optim.SparseAdam([model.shared.weight, model.rows.weight], lr=a.lr)
    dense_opt = torch.optim.Adam([model.gate_logit, model.head.weight], lr=a.lr)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(a.warmup + a.steps):
        p = ctx_pos[rng.integers(0, len(ctx_pos), a.batch)]
        batches.append(tuple(torch.from_numpy(x) for x in (lang[p], tok[p], tok[p + 1])))
    times, losses = [], []
    for i, (l, c, t) in enumerate(batches):
        t0 = time.perf_counter()
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(l, c), t) + a.gate_penalty * torch.sigmoid(model.gate_logit).mean()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    med = statistics.median(times)
    print(json.dumps({
        "corpus": a.corpus, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "V": vocab, "L": n_lang, "D": a.dim, "batch": a.batch, "pairs": len(kept),
        "steps": a.steps, "median_s": med, "min_s": min(times), "tokens_per_s": a.batch / med,
        "loss_first": losses[0], "loss_last": losses[-1], "step_s": times,
    }))


if __name__ == "__main__":
    main()

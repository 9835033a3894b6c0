#!/usr/bin/env python3
"""An implementation of splitgrad's three layers in numpy, written from
docs/spec.md and the golden format of docs/golden.md, for the tests of
`splitgrad golden fuzz` (tests/app/golden_fuzz.rs).

    candidate.py INPUTS OUTPUTS

reads every case INPUTS/<layer>/NAME.npz and writes its results to
OUTPUTS/<layer>/NAME.npz, computed in the case's dtype. A bf16 case (its
reals are uint16 arrays of bf16 bits) or f16 case is computed in float64 on
the widened values: the layer's output is written in the half type, rounded
once, the other results in float32.

SPLITGRAD_CANDIDATE_BUG plants one bug:
  boundary      split-embeddings: an id at the first row of a split is
                looked up in the split before it (`id <= end` for `id < end`)
  ignore_index  lm-head: a label of -100 is not ignored but taken as an
                index from the end of the vocabulary
  gate          split-vocabulary: the gated mix the wrong way round,
                (1 - g)·row + g·shared
  empty_split   split-embeddings: raise on a split of size 0 (the whole
                program then fails)
"""

import os
import sys

import numpy as np

BUG = os.environ.get("SPLITGRAD_CANDIDATE_BUG", "")


def splits(case):
    sizes = [int(s) for s in case["split_sizes"]]
    weights = [case[f"weight_{k}"] for k in range(len(sizes))]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return sizes, weights, starts


def split_of(i, sizes, starts):
    """(split, row) of global id i."""
    for k, size in enumerate(sizes):
        if BUG == "boundary":
            if size > 0 and i <= starts[k] + size:
                return k, min(i - starts[k], size - 1)
        elif starts[k] <= i < starts[k] + size:
            return k, i - starts[k]
    raise ValueError(f"id {i} out of range")


def split_embeddings(case):
    sizes, weights, starts = splits(case)
    if BUG == "empty_split" and 0 in sizes:
        raise ValueError("a split of size 0")
    trainable = case["split_trainable"]
    ids = case["input_ids"].astype(np.int64)
    upstream = case["upstream"]
    dtype, width = upstream.dtype, weights[0].shape[1]
    flat_up = upstream.reshape(-1, width)
    out = np.zeros((ids.size, width), dtype)
    grads = [np.zeros((size, width), dtype) for size in sizes]
    for n, i in enumerate(ids.reshape(-1)):
        k, r = split_of(int(i), sizes, starts)
        out[n] = weights[k][r]
        grads[k][r] += flat_up[n]
    result = {"out": out.reshape(ids.shape + (width,))}
    for k, g in enumerate(grads):
        if trainable[k]:
            result[f"grad_weight_{k}"] = g
    return result


def lm_head(case):
    sizes, weights, starts = splits(case)
    hidden = case["hidden"]
    dtype, width = hidden.dtype, hidden.shape[-1]
    h = hidden.reshape(-1, width)
    labels = case["labels"].astype(np.int64).reshape(-1)
    upstream = case["upstream"].reshape(-1)
    w = np.concatenate(weights, axis=0)
    vocab = w.shape[0]
    z = h @ w.T
    m = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(axis=1, keepdims=True))
    if BUG == "ignore_index":
        keep = np.ones(labels.shape, bool)
        y = labels % vocab
    else:
        keep = labels != -100
        y = np.where(keep, labels, 0)
    n = np.arange(len(labels))
    loss = np.where(keep, (m[:, 0] - z[n, y]) + lse[:, 0], 0).astype(dtype)
    g = np.exp((z - m) - lse)
    g[n, y] -= 1
    g *= np.where(keep, upstream, 0).astype(dtype)[:, None]
    grad_w = g.T @ h
    result = {
        "loss": loss.reshape(case["labels"].shape),
        "grad_hidden": (g @ w).reshape(hidden.shape),
    }
    for k, size in enumerate(sizes):
        result[f"grad_weight_{k}"] = grad_w[starts[k] : starts[k] + size]
    return result


def split_vocabulary(case):
    vocab, n_languages = int(case["vocab_size"]), int(case["n_languages"])
    lang_index = case["language_index"].astype(np.int64)
    tok_index = case["token_index"].astype(np.int64)
    rows, gate_logit = case["rows"], case["gate_logit"]
    tokens = case["token_ids"].astype(np.int64)
    langs = case["language_ids"].astype(np.int64)
    shared, upstream = case["shared"], case["upstream"]
    dtype = shared.dtype
    use_gate = int(case["use_gate"]) == 1
    penalty_weight, fusion_weight = case["penalty_weight"], case["fusion_weight"]
    n_rows = len(rows)

    table = np.full(n_languages * vocab, -1, np.int64)
    table[lang_index * vocab + tok_index] = np.arange(n_rows)
    row = table[langs * vocab + tokens]
    has = row >= 0
    r = row[has]
    g = (1 / (1 + np.exp(-gate_logit))).astype(dtype)

    out = shared.copy()
    grad_shared = upstream.copy()
    grad_rows = np.zeros_like(rows)
    grad_g = np.zeros_like(gate_logit)
    if use_gate:
        gr = g[r][:, None]
        if BUG == "gate":
            out[has] = rows[r] + gr * (shared[has] - rows[r])
        else:
            out[has] = shared[has] + gr * (rows[r] - shared[has])
        grad_shared[has] = (1 - gr) * upstream[has]
        np.add.at(grad_rows, r, gr * upstream[has])
        np.add.at(grad_g, r, (upstream[has] * (rows[r] - shared[has])).sum(axis=1))
    else:
        out[has] = rows[r]
        grad_shared[has] = 0
        np.add.at(grad_rows, r, upstream[has])
    penalty = g.mean()

    # The fusion penalty: each row's distance to the centroid of its token's
    # rows, c(t) = rows_f + mean_j (rows_j - rows_f), f the token's first row.
    centroid = np.zeros_like(rows)
    unit = np.zeros_like(rows)
    norms = np.zeros(n_rows, dtype)
    for t in np.unique(tok_index):
        group = np.flatnonzero(tok_index == t)
        first = rows[group[0]]
        centroid[group] = first + (rows[group] - first).sum(axis=0) / len(group)
    deviation = rows - centroid
    norms = np.sqrt((deviation * deviation).sum(axis=1))
    nonzero = norms > 0
    unit[nonzero] = deviation[nonzero] / norms[nonzero][:, None]
    fusion = norms.sum() / n_rows
    for t in np.unique(tok_index):
        group = np.flatnonzero(tok_index == t)
        mean_unit = unit[group].sum(axis=0) / len(group)
        grad_rows[group] += (fusion_weight / n_rows) * (unit[group] - mean_unit)

    grad_gate_logit = g * (1 - g) * (grad_g + penalty_weight / n_rows)
    loss = ((out * upstream).sum() + penalty_weight * penalty) + fusion_weight * fusion
    scalar = lambda x: np.asarray(x, dtype)
    return {
        "out": out,
        "penalty": scalar(penalty),
        "fusion_penalty": scalar(fusion),
        "loss": scalar(loss),
        "grad_shared": grad_shared,
        "grad_rows": grad_rows.astype(dtype),
        "grad_gate_logit": grad_gate_logit.astype(dtype),
    }


LAYERS = {
    "split-embeddings": split_embeddings,
    "lm-head": lm_head,
    "split-vocabulary": split_vocabulary,
}


ANCHOR = {"split-embeddings": "upstream", "lm-head": "hidden", "split-vocabulary": "shared"}
OUTPUT = {"split-embeddings": "out", "lm-head": "loss", "split-vocabulary": "out"}


def bf16_to_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def float_to_bf16(x):
    """Rounded to nearest, ties to even (finite values)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def evaluate_half(layer, evaluate, case):
    """A half-precision case: widened to float64, computed, the output rounded once."""
    half = case[ANCHOR[layer]].dtype
    if half not in (np.uint16, np.float16):
        return evaluate(case)
    widen = bf16_to_float if half == np.uint16 else (lambda a: a.astype(np.float64))
    wide = {k: widen(case[k]) if case[k].dtype == half else case[k] for k in case.files}
    result = evaluate(wide)
    for name, value in result.items():
        if name == OUTPUT[layer]:
            result[name] = float_to_bf16(value) if half == np.uint16 else np.asarray(value, np.float16)
        else:
            result[name] = np.asarray(value, np.float32)
    return result


def main(inputs, outputs):
    for layer, evaluate in LAYERS.items():
        folder = os.path.join(inputs, layer)
        if not os.path.isdir(folder):
            continue
        os.makedirs(os.path.join(outputs, layer), exist_ok=True)
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".npz"):
                continue
            with np.load(os.path.join(folder, name)) as case:
                result = evaluate_half(layer, evaluate, case)
            np.savez(os.path.join(outputs, layer, name), **result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

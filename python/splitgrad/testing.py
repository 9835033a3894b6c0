"""Differential testing of other implementations of splitgrad's three layers.

``check_split_token_embeddings(factory)``, ``check_lm_head(factory)`` and
``check_split_vocabulary(factory)`` generate cases with hypothesis from the
rules of docs/spec.md (§2.1, §2.2, §2.3), run each case through the
candidate that ``factory`` builds and through splitgrad's PyTorch drop-in
(``splitgrad.torch``) side by side, forward and backward, and compare the
outputs and gradients. On the first difference hypothesis shrinks the case
(toward few ids, small sizes, one split); the check then writes the shrunk
case as a golden case file, ``<out_dir>/<layer>/case-NNNN.npz`` in the
format of docs/spec.md §4 (inputs, splitgrad's results where splitgrad
accepts the case, the candidate's answers as ``candidate_*`` arrays), and
raises ``Difference`` (an ``AssertionError``) describing it.

The factory is called with the constructor arguments of the layer it
stands for, positionally, while torch's default dtype is the case's dtype
(float64 or float32, or with ``dtypes=`` bfloat16 or float16): the whole
case runs under it. In bfloat16 and float16 the layer's parameters,
activations and upstream gradients are values of that type, the reference
is the drop-in built in it (math in float32, each result rounded once,
docs/spec.md §7.3), and a case file holds bf16 arrays as their bits
(``uint16``), as golden case files do.

- ``SplitTokenEmbeddings``: ``factory(split_vocab_size, split_order,
  hidden_size)`` (d9d's); parameters ``token_embedding.<split>.weight``.
  Called as ``module(input_ids)``.
- ``SplitLanguageModellingHead``: ``factory(split_vocab_size, split_order,
  hidden_size)`` (d9d's); parameters ``lm_head.<split>.weight``. Called as
  ``module(hidden_states, shared)`` with ``shared.labels`` the labels; the
  result is the per-token loss, or has it as ``.cross_entropy``.
- ``SplitVocabulary``: ``factory(index_path, vocab_size, dim, n_languages,
  gate_init)`` (the reference module's; ``index_path`` an ``.npz`` of
  ``language_index`` and ``token_index``); parameters ``rows`` and
  ``gate_logit``; methods ``forward(token_ids, lang_per_token, shared,
  use_gate)``, ``penalty()``, ``fusion_penalty()``.

The splits of a case are named ``s0``, ``s1``, … in split order (the
golden format's names); ``split_vocab_size`` may list them in another
order. The reference's parameters are loaded into the candidate by name
(``load_state_dict``; the candidate may hold further buffers). A frozen
split is frozen with ``requires_grad_(False)`` on its weight, on both
sides. Each case's scalar loss is that of the golden format: ``Σ out ⊙
upstream`` (plus the weighted penalties for the split vocabulary), and
``torch.autograd.backward`` runs from it.

What counts as equal (the tolerances, per dtype ``T``, ``eps`` its machine
epsilon; ``|a − b| ≤ tol`` element by element, NaN equal only to NaN):

- Where the math is a lookup or a copy, the same value (−0 equals +0):
  the embeddings' output; an embedding gradient row that one position
  reached (zero where none did); the head's loss and hidden-state gradient
  at a −100 label (exactly 0); the split vocabulary's output for a token
  without a row (``shared``), in fusion mode (its row) and where its row
  equals its shared row (``shared``, bit for bit, docs/spec.md §2.3).
- An embedding gradient element that k ≥ 2 positions reached:
  ``tol = k·eps·Σ|upstream|`` over those positions (a bound on the
  rounding of any summation order).
- Everything else (the head's loss and gradients, the split vocabulary's
  mixed outputs, penalties, loss and gradients): ``tol = rtol·(1 +
  max|b|)`` over the array, with ``rtol`` 1e-12 for float64, 1e-5 for
  float32, and 5e-2 and 2e-2 for bfloat16 and float16, whose torch modules
  round at every operation (``RTOL``; docs/golden.md gives the errors
  measured). In the half types no head case has logits in the thousands.
- float32 head cases with logits in the thousands (hidden elements above
  100): the loss and the gradients to ``1e-3·(1 + max|b|)``, because each
  float32 logit near 3000 is itself rounded to 2.4·10⁻⁴ in any
  implementation (docs/golden.md).
- A frozen split's weight must get no gradient at all (``.grad`` stays
  ``None``); a trainable one that no token reached may have ``None`` or
  zeros.
- Shapes and dtypes must be the reference's.
- An error on one side and a value on the other is a difference: an id,
  label or language out of range, or an index that lists a pair twice,
  must raise (splitgrad raises ``ValueError``); errors on both sides agree,
  whatever their types.

``seed=`` fixes hypothesis's random choices, so a seed and ``max_examples``
name a test run; ``max_examples`` trades time for depth. ``without=``
leaves out kinds of cases (e.g. ``without=("out_of_range",)`` once a
candidate's behaviour there is known), from the layer's ``FEATURES``.
``replay(factory, path)`` runs one written case again.

Importing this module needs torch and hypothesis; neither is a dependency
of splitgrad.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

try:
    import torch
    import hypothesis
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised where they are absent
    raise ImportError(
        "splitgrad.testing needs PyTorch and hypothesis (pip install torch hypothesis); "
        "neither is a dependency of splitgrad"
    ) from exc

from . import golden
from . import torch as _dropin

__all__ = [
    "Difference",
    "FEATURES",
    "LMHeadShared",
    "RTOL",
    "check_lm_head",
    "check_split_token_embeddings",
    "check_split_vocabulary",
    "lm_head_cases",
    "replay",
    "split_token_embeddings_cases",
    "split_vocabulary_cases",
]

EMBEDDINGS, VOCABULARY, HEAD = "split-embeddings", "split-vocabulary", "lm-head"

#: Relative tolerance per dtype for the results that are not lookups:
#: ``|a − b| ≤ rtol·(1 + max|b|)`` over each array.
#: In bfloat16 and float16 the reference computes in float32 and rounds each
#: result once, while a torch module in the half type rounds at every
#: operation: the tolerances are docs/golden.md's for such an implementation.
RTOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 5e-2, "float16": 2e-2}
#: float32 head cases whose hidden states reach this are "logits in the thousands".
LARGE_HIDDEN = 100.0
#: Their loss and gradients compare to ``LARGE_LOGIT_RTOL·(1 + max|b|)``.
LARGE_LOGIT_RTOL = 1e-3

#: The kinds of case each layer's strategy draws that ``without=`` can leave out.
FEATURES = {
    EMBEDDINGS: ("out_of_range", "empty_split", "frozen"),
    HEAD: ("out_of_range", "empty_split", "frozen", "ignore_index", "large_logits"),
    VOCABULARY: ("out_of_range", "duplicate_pair", "fusion_mode"),
}

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: numpy has no bfloat16: a bf16 array of a case holds its bits as uint16, as in golden case files.
_HALF = ("bfloat16", "float16")


def _widen(a):
    """A case's real array as float64 (a uint16 array is bf16's bits)."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _store(x, dtype):
    """float64 values as a case of ``dtype`` holds them (bf16: rounded to nearest, as bits)."""
    x = np.asarray(x, np.float64)
    if dtype == "bfloat16":
        t = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return x.astype(dtype)


def _tensor(a):
    """A case's array as a torch tensor (a uint16 array of bf16 bits as bfloat16)."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


# --- cases ----------------------------------------------------------------------


@dataclasses.dataclass
class LMHeadShared:
    """The head's shared input: what d9d's ``SequenceCausalLMHeadShared`` holds."""

    labels: torch.Tensor


class Case:
    """One case: the arrays of a golden case file's inputs (docs/spec.md §4),
    plus ``split_dict_order`` (the order in which ``split_vocab_size`` lists
    the splits), ``split_trainable`` for the head and ``gate_init`` for the
    split vocabulary, which ``splitgrad golden eval`` ignores where its layer
    does not read them."""

    def __init__(self, layer: str, arrays: dict):
        self.layer = layer
        self.arrays = {k: np.asarray(v) for k, v in arrays.items()}

    # shared properties
    @property
    def dtype(self) -> str:
        anchor = {EMBEDDINGS: "upstream", HEAD: "hidden", VOCABULARY: "shared"}[self.layer]
        name = str(self.arrays[anchor].dtype)
        return "bfloat16" if name == "uint16" else name

    def real(self, name) -> np.ndarray:
        """Real array ``name`` as float64 values (bf16's bits widened)."""
        return _widen(self.arrays[name])

    @property
    def split_sizes(self) -> list:
        return [int(s) for s in self.arrays["split_sizes"]]

    @property
    def split_trainable(self) -> list:
        t = self.arrays.get("split_trainable")
        return [True] * len(self.split_sizes) if t is None else [bool(x) for x in t]

    @property
    def dict_order(self) -> list:
        o = self.arrays.get("split_dict_order")
        return list(range(len(self.split_sizes))) if o is None else [int(x) for x in o]

    @property
    def hidden_size(self) -> int:
        return int(self.arrays["weight_0"].shape[1])

    def _starts(self):
        starts, s = [], 0
        for size in self.split_sizes:
            starts.append(s)
            s += size
        return starts, s

    @property
    def features(self) -> frozenset:
        """The kinds of input this case holds (the ``FEATURES`` and a few more)."""
        a, f = self.arrays, set()
        if self.dtype == "float32":
            f.add("float32")
        if self.layer in (EMBEDDINGS, HEAD):
            _, V = self._starts()
            if 0 in self.split_sizes:
                f.add("empty_split")
            if not all(self.split_trainable):
                f.add("frozen")
            ids = a["input_ids" if self.layer == EMBEDDINGS else "labels"].reshape(-1)
            valid = (ids >= 0) & (ids < V)
            if self.layer == HEAD:
                if (ids == -100).any():
                    f.add("ignore_index")
                if np.abs(self.real("hidden")).max(initial=0) > LARGE_HIDDEN:
                    f.add("large_logits")
                valid |= ids == -100
            elif len(np.unique(ids)) < len(ids):
                f.add("repeated_id")
            if not valid.all():
                f.add("out_of_range")
        else:
            V, L = int(a["vocab_size"]), int(a["n_languages"])
            t, l_ = a["token_ids"], a["language_ids"]
            if ((t < 0) | (t >= V) | (l_ < 0) | (l_ >= L)).any():
                f.add("out_of_range")
            pairs = list(zip(a["language_index"].tolist(), a["token_index"].tolist()))
            if len(set(pairs)) < len(pairs):
                f.add("duplicate_pair")
            if not int(a["use_gate"]):
                f.add("fusion_mode")
        return frozenset(f)

    def describe(self) -> str:
        """The case in a few lines: sizes, ids, labels."""
        a = self.arrays
        lines = []
        if self.layer in (EMBEDDINGS, HEAD):
            starts, V = self._starts()
            sizes = ", ".join(f"s{k}={n}" for k, n in enumerate(self.split_sizes))
            frozen = [f"s{k}" for k, t in enumerate(self.split_trainable) if not t]
            order = ""
            if self.dict_order != sorted(self.dict_order):
                order = f" (split_vocab_size lists {', '.join(f's{k}' for k in self.dict_order)})"
            lines.append(
                f"{self.dtype}; splits {sizes} in split order{order}, so V = {V}; H = {self.hidden_size}; "
                + (f"frozen: {', '.join(frozen)}" if frozen else "every split trainable")
            )
            if self.layer == EMBEDDINGS:
                ids = a["input_ids"]
                lines.append(f"input_ids {list(ids.shape)}: {ids.tolist()}")
            else:
                lab = a["labels"]
                lines.append(f"labels {list(lab.shape)}: {lab.tolist()}")
                lines.append(
                    f"hidden {list(a['hidden'].shape)}, max |hidden| {np.abs(self.real('hidden')).max(initial=0):.4g}; "
                    f"upstream {_brief(self.real('upstream'))}"
                )
        else:
            lines.append(
                f"{self.dtype}; vocab_size {int(a['vocab_size'])}, n_languages {int(a['n_languages'])}, "
                f"dim {a['rows'].shape[1]}, {'gated' if int(a['use_gate']) else 'fusion mode (use_gate false)'}, "
                f"gate_init {float(a.get('gate_init', 0.0)):g}, penalty_weight {float(self.real('penalty_weight')):g}, "
                f"fusion_weight {float(self.real('fusion_weight')):g}"
            )
            pairs = list(zip(a["language_index"].tolist(), a["token_index"].tolist()))
            lines.append(f"index (language, token): {pairs}; gate_logit {_brief(self.real('gate_logit'))}; rows {_brief(self.real('rows'))}")
            tok, lang = a["token_ids"].tolist(), a["language_ids"].tolist()
            lines.append(f"tokens (language, token): {list(zip(lang, tok))}; shared {_brief(self.real('shared'))}")
            same = _rows_equal_shared(a)
            if same.any():
                lines.append(f"tokens whose row equals their shared row: {np.flatnonzero(same).tolist()}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<{self.layer} case: " + "; ".join(self.describe().splitlines()) + ">"


def _brief(a) -> str:
    a = np.asarray(a)
    if a.size <= 6:
        return str(np.round(a.astype(np.float64), 4).tolist())
    return f"shape {list(a.shape)}"


def _rows_equal_shared(a) -> np.ndarray:
    """Per token of a split-vocabulary case: it has a row, and the row equals its shared row."""
    lookup = {}
    for i, pair in enumerate(zip(a["language_index"].tolist(), a["token_index"].tolist())):
        lookup.setdefault(pair, i)
    out = np.zeros(len(a["token_ids"]), dtype=bool)
    for n, pair in enumerate(zip(a["language_ids"].tolist(), a["token_ids"].tolist())):
        r = lookup.get(pair)
        if r is not None:
            out[n] = bool(np.array_equal(a["rows"][r], a["shared"][n]))
    return out


# --- strategies -----------------------------------------------------------------


def _check_without(layer, without):
    without = frozenset([without] if isinstance(without, str) else without)
    unknown = without - set(FEATURES[layer])
    if unknown:
        raise ValueError(f"without: no kind of {layer} case named {sorted(unknown)}; the kinds: {', '.join(FEATURES[layer])}")
    return without


def _dtype_names(dtypes):
    names = []
    for d in dtypes:
        name = {t: n for n, t in _DTYPES.items()}.get(d, d)
        if name not in _DTYPES:
            raise ValueError(f"dtypes: {d!r} is not float64, float32, bfloat16 or float16")
        names.append(name)
    if not names:
        raise ValueError("dtypes is empty")
    return names


def _rare(draw, one_in):
    """True once in ``one_in`` draws; shrinks to False."""
    return draw(st.integers(0, one_in - 1)) == one_in - 1


def _rng(draw):
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _splits(draw, without, max_size):
    """Split sizes (0 now and then, shrinking toward one split of size 1),
    trainable flags (shrinking toward trainable) and the order in which
    split_vocab_size lists them (shrinking toward split order)."""
    n = draw(st.integers(1, 4))
    choices = list(range(1, max_size + 1)) + ([] if "empty_split" in without else [0])
    sizes = [draw(st.sampled_from(choices)) for _ in range(n)]
    if sum(sizes) == 0:
        sizes[0] = 1
    trainable = [True] * n if "frozen" in without else [not _rare(draw, 4) for _ in range(n)]
    order = draw(st.permutations(range(n)))
    return sizes, trainable, list(order)


def _boundaries(sizes):
    ids, start = set(), 0
    for size in sizes:
        if size:
            ids.update((start, start + size - 1))
        start += size
    return sorted(ids)


def _shape(draw, ranks=(1, 2, 3)):
    rank = draw(st.sampled_from(list(ranks)))
    top = {1: 10, 2: 4, 3: 3}[rank]
    return tuple(draw(st.integers(1, top)) for _ in range(rank))


@st.composite
def split_token_embeddings_cases(draw, dtypes=("float64", "float32"), without=()):
    """Cases of ``SplitTokenEmbeddings`` (docs/spec.md §2.1): 1 to 4 splits of
    sizes 1 to 6 or 0, some frozen, listed in split_vocab_size in any order;
    H 1 to 6; ids of rank 1 to 3 drawn from the splits' first and last ids
    and from the whole vocabulary (so repeated), and now and then one out of
    range (−1, V or beyond), which must raise."""
    without = _check_without(EMBEDDINGS, without)
    dtype = draw(st.sampled_from(_dtype_names(dtypes)))
    sizes, trainable, order = _splits(draw, without, 6)
    V = sum(sizes)
    H = draw(st.integers(1, 6))
    shape = _shape(draw)
    n = int(np.prod(shape))
    element = st.one_of(st.sampled_from(_boundaries(sizes)), st.integers(0, V - 1))
    ids = [draw(element) for _ in range(n)]
    if "out_of_range" not in without and _rare(draw, 8):
        ids[draw(st.integers(0, n - 1))] = draw(st.sampled_from([V, -1, V + 1000]))
    rng = _rng(draw)
    arrays = {
        "split_sizes": np.array(sizes, dtype=np.int64),
        "split_trainable": np.array(trainable, dtype=np.uint8),
    }
    for k, size in enumerate(sizes):
        arrays[f"weight_{k}"] = _store(rng.standard_normal((size, H)), dtype)
    arrays["input_ids"] = np.array(ids, dtype=np.int64).reshape(shape)
    arrays["upstream"] = _store(rng.standard_normal(shape + (H,)), dtype)
    arrays["split_dict_order"] = np.array(order, dtype=np.int64)
    return Case(EMBEDDINGS, arrays)


@st.composite
def lm_head_cases(draw, dtypes=("float64", "float32"), without=()):
    """Cases of ``SplitLanguageModellingHead`` (docs/spec.md §2.2): splits as
    for the embeddings (sizes 1 to 5 or 0); H 1 to 6; labels of rank 1 or 2
    from the splits' boundaries and the whole vocabulary, about one in five
    −100; now and then one out of range (V, −1, −101), which must raise; in
    one case in four hidden states scaled by 3000, so that the logits reach
    the thousands; the upstream gradient all ones (the summed loss) or
    random."""
    without = _check_without(HEAD, without)
    dtype = draw(st.sampled_from(_dtype_names(dtypes)))
    sizes, trainable, order = _splits(draw, without, 5)
    V = sum(sizes)
    H = draw(st.integers(1, 6))
    shape = _shape(draw, (1, 2))
    n = int(np.prod(shape))
    element = st.one_of(st.integers(0, V - 1), st.sampled_from(_boundaries(sizes)))
    labels = []
    for _ in range(n):
        ignore = "ignore_index" not in without and _rare(draw, 5)
        labels.append(-100 if ignore else draw(element))
    if "out_of_range" not in without and _rare(draw, 8):
        labels[draw(st.integers(0, n - 1))] = draw(st.sampled_from([V, -1, -101]))
    # In a half type a logit near 3000 is off by units: no case in the thousands.
    large = "large_logits" not in without and dtype not in _HALF and _rare(draw, 4)
    ones = draw(st.booleans())
    rng = _rng(draw)
    bound = 1.0 / math.sqrt(H)
    arrays = {"split_sizes": np.array(sizes, dtype=np.int64)}
    for k, size in enumerate(sizes):
        arrays[f"weight_{k}"] = _store(rng.uniform(-bound, bound, (size, H)), dtype)
    hidden = rng.standard_normal(shape + (H,)) * (3000.0 if large else 1.0)
    arrays["hidden"] = _store(hidden, dtype)
    arrays["labels"] = np.array(labels, dtype=np.int64).reshape(shape)
    arrays["upstream"] = _store(np.ones(shape) if ones else rng.standard_normal(shape), dtype)
    arrays["split_trainable"] = np.array(trainable, dtype=np.uint8)
    arrays["split_dict_order"] = np.array(order, dtype=np.int64)
    return Case(HEAD, arrays)


@st.composite
def split_vocabulary_cases(draw, dtypes=("float64", "float32"), without=()):
    """Cases of ``SplitVocabulary`` (docs/spec.md §2.3): V 1 to 6, L 1 to 3,
    D 1 to 4; an index of 1 to 8 distinct (language, token) cells in any
    order (one-row vocabularies, tokens with one row and with several), now
    and then a pair listed twice, which must raise; rows seeded from the
    shared table (equal to their shared rows, and groups of equal rows, whose
    fusion deviation is exactly zero; in one case in four every row) or
    moved off it; gate logits all
    ``gate_init`` or spread; 1 to 8 tokens, about half hitting a row, now and
    then a token or language out of range, which must raise; shared rows the
    table's or moved; gated or fusion mode; penalty weights 0.5, 0 or 2."""
    without = _check_without(VOCABULARY, without)
    dtype = draw(st.sampled_from(_dtype_names(dtypes)))
    V, L, D = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    cells = draw(st.lists(st.integers(0, L * V - 1), min_size=1, max_size=min(8, L * V), unique=True))
    if "duplicate_pair" not in without and _rare(draw, 8):
        cells.insert(draw(st.integers(0, len(cells))), draw(st.sampled_from(cells)))
    lang_index = np.array([c // V for c in cells], dtype=np.int64)
    tok_index = np.array([c % V for c in cells], dtype=np.int64)
    n_rows = len(cells)
    gate_init = draw(st.sampled_from([0.0, 1.0, -2.5, 4.0]))
    spread = draw(st.booleans())
    seeded = _rare(draw, 4)  # every row as seed_from leaves it: the fusion penalty is exactly 0
    moved = [not seeded and not _rare(draw, 3) for _ in range(n_rows)]
    n = draw(st.integers(1, 8))
    tokens, langs = [], []
    for _ in range(n):
        if draw(st.booleans()):
            tokens.append(draw(st.integers(0, V - 1)))
            langs.append(draw(st.integers(0, L - 1)))
        else:
            r = draw(st.integers(0, n_rows - 1))
            tokens.append(int(tok_index[r]))
            langs.append(int(lang_index[r]))
    if "out_of_range" not in without and _rare(draw, 8):
        p = draw(st.integers(0, n - 1))
        if draw(st.booleans()):
            tokens[p] = draw(st.sampled_from([V, -1]))
        else:
            langs[p] = draw(st.sampled_from([L, -1]))
    shared_moved = _rare(draw, 4)
    use_gate = "fusion_mode" in without or not _rare(draw, 4)
    pw = draw(st.sampled_from([0.5, 0.0, 2.0]))
    fw = draw(st.sampled_from([0.5, 0.0, 2.0]))
    rng = _rng(draw)
    stored, dtype = dtype, ("float32" if dtype in _HALF else dtype)  # the draws in float32, then stored
    table = rng.standard_normal((V, D)).astype(dtype)
    rows = table[tok_index].copy()
    noise = (0.5 * rng.standard_normal((n_rows, D))).astype(dtype)
    rows[moved] += noise[moved]
    gate = np.full(n_rows, gate_init) + (rng.standard_normal(n_rows) if spread else 0.0)
    tok_arr, lang_arr = np.array(tokens, dtype=np.int64), np.array(langs, dtype=np.int64)
    shared = table[np.clip(tok_arr, 0, V - 1)].copy()
    if shared_moved:
        shared += (0.5 * rng.standard_normal((n, D))).astype(dtype)
    arrays = {
        "vocab_size": np.array(V, dtype=np.int64),
        "n_languages": np.array(L, dtype=np.int64),
        "language_index": lang_index,
        "token_index": tok_index,
        "rows": rows,
        "gate_logit": gate.astype(dtype),
        "token_ids": tok_arr,
        "language_ids": lang_arr,
        "shared": shared,
        "upstream": rng.standard_normal((n, D)).astype(dtype),
        "use_gate": np.array(int(use_gate), dtype=np.int64),
        "penalty_weight": np.array(pw, dtype=dtype),
        "fusion_weight": np.array(fw, dtype=dtype),
        "gate_init": np.array(gate_init, dtype=np.float64 if stored in _HALF else dtype),
    }
    if stored in _HALF:
        for name in ("rows", "gate_logit", "shared", "upstream", "penalty_weight", "fusion_weight"):
            arrays[name] = _store(arrays[name], stored)
    return Case(VOCABULARY, arrays)


# --- running one side ------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What one side gave: ``values`` (name → numpy array, or None for no
    gradient), and ``error`` ``(stage, exception)`` if it raised."""

    values: dict
    error: tuple | None = None

    def describe_error(self) -> str:
        stage, e = self.error
        return f"{type(e).__name__}: {e} (in {stage})"


@contextmanager
def _default_dtype(name):
    before = torch.get_default_dtype()
    torch.set_default_dtype(_DTYPES[name])
    try:
        with warnings.catch_warnings():
            # nn.Linear / nn.Embedding's initialisers on a split of size 0
            warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
            yield
    finally:
        torch.set_default_dtype(before)


def _np(t, what):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} is a {type(t).__name__}, not a torch.Tensor")
    t = t.detach()
    if t.is_sparse:
        t = t.coalesce().to_dense()
    if t.dtype == torch.bfloat16:  # numpy has none: its bits, as in the case
        return t.cpu().contiguous().view(torch.int16).numpy().view(np.uint16).copy()
    return t.cpu().numpy().copy()


def _load(module, state):
    result = module.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise LookupError(f"the module has no parameter named {', '.join(result.unexpected_keys)}")


def _params(module):
    return dict(module.named_parameters())


def _to_dtype(module, name):
    want = _DTYPES[name]
    if any(p.is_floating_point() and p.dtype != want for p in module.parameters()):
        module.to(want)


def _backward(out, upstream):
    if isinstance(out, torch.Tensor) and out.requires_grad:
        torch.autograd.backward(out, _tensor(upstream).to(out.dtype))


def _run_splits(factory, case, prefix, body):
    """Builds a split layer (embeddings or head), loads the case's weights,
    freezes, then runs ``body(module, params, values, stage)``, which notes
    in ``stage[0]`` where it is; returns an Outcome."""
    a, values, stage = case.arrays, {}, ["construction"]
    sizes, names = case.split_sizes, [f"s{k}" for k in range(len(case.split_sizes))]
    try:
        with _default_dtype(case.dtype):
            m = factory({names[k]: sizes[k] for k in case.dict_order}, list(names), case.hidden_size)
            stage[0] = "load_state_dict"
            _to_dtype(m, case.dtype)
            _load(m, {f"{prefix}.{n}.weight": _tensor(a[f"weight_{k}"]) for k, n in enumerate(names)})
            stage[0] = "freezing"
            params = _params(m)
            for k, n in enumerate(names):
                if not case.split_trainable[k]:
                    params[f"{prefix}.{n}.weight"].requires_grad_(False)
            stage[0] = "forward"
            body(m, params, values, stage)
    except Exception as e:  # the side's error is a result
        return Outcome(values, (stage[0], e))
    return Outcome(values)


def _run_embeddings(factory, case, tmp):
    a = case.arrays

    def body(m, params, values, stage):
        out = m(torch.from_numpy(a["input_ids"].copy()))
        values["out"] = _np(out, "the output")
        stage[0] = "backward"
        _backward(out, a["upstream"])
        for k in range(len(case.split_sizes)):
            values[f"grad_weight_{k}"] = _np(params[f"token_embedding.s{k}.weight"].grad, "a gradient")

    return _run_splits(factory, case, "token_embedding", body)


def _run_head(factory, case, tmp):
    a = case.arrays

    def body(m, params, values, stage):
        hidden = _tensor(a["hidden"]).requires_grad_(True)
        res = m(hidden, LMHeadShared(torch.from_numpy(a["labels"].copy())))
        loss = getattr(res, "cross_entropy", res)
        values["loss"] = _np(loss, "the loss")
        stage[0] = "backward"
        _backward(loss, a["upstream"])
        values["grad_hidden"] = _np(hidden.grad, "the hidden states' gradient")
        for k in range(len(case.split_sizes)):
            values[f"grad_weight_{k}"] = _np(params[f"lm_head.s{k}.weight"].grad, "a gradient")

    return _run_splits(factory, case, "lm_head", body)


def _run_vocabulary(factory, case, tmp):
    a, values, stage = case.arrays, {}, "construction"
    path = os.path.join(tmp, "index.npz")
    np.savez(path, language_index=a["language_index"], token_index=a["token_index"])
    gate_init = float(a["gate_init"]) if "gate_init" in a else 0.0
    try:
        with _default_dtype(case.dtype):
            m = factory(path, int(a["vocab_size"]), int(a["rows"].shape[1]), int(a["n_languages"]), gate_init)
            stage = "load_state_dict"
            _to_dtype(m, case.dtype)
            _load(m, {"rows": _tensor(a["rows"]), "gate_logit": _tensor(a["gate_logit"])})
            params = _params(m)
            stage = "forward"
            shared = _tensor(a["shared"]).requires_grad_(True)
            out = m(
                torch.from_numpy(a["token_ids"].copy()),
                torch.from_numpy(a["language_ids"].copy()),
                shared,
                bool(int(a["use_gate"])),
            )
            values["out"] = _np(out, "the output")
            stage = "penalty"
            penalty = m.penalty()
            values["penalty"] = _np(penalty, "the penalty")
            stage = "fusion_penalty"
            fusion = m.fusion_penalty()
            values["fusion_penalty"] = _np(fusion, "the fusion penalty")
            stage = "loss"
            up = _tensor(a["upstream"]).to(out.dtype)
            pw, fw = float(case.real("penalty_weight")), float(case.real("fusion_weight"))
            loss = ((out * up).sum() + pw * penalty) + fw * fusion
            values["loss"] = _np(loss, "the loss")
            stage = "backward"
            if loss.requires_grad:
                loss.backward()
            values["grad_shared"] = _np(shared.grad, "the shared rows' gradient")
            values["grad_rows"] = _np(params["rows"].grad, "the rows' gradient")
            values["grad_gate_logit"] = _np(params["gate_logit"].grad, "the gate logits' gradient")
    except Exception as e:
        return Outcome(values, (stage, e))
    return Outcome(values)


_RUNNERS = {EMBEDDINGS: _run_embeddings, HEAD: _run_head, VOCABULARY: _run_vocabulary}
_REFERENCES = {
    EMBEDDINGS: _dropin.SplitTokenEmbeddings,
    HEAD: _dropin.SplitLanguageModellingHead,
    VOCABULARY: _dropin.SplitVocabulary,
}
_NAMES = {EMBEDDINGS: "SplitTokenEmbeddings", HEAD: "SplitLanguageModellingHead", VOCABULARY: "SplitVocabulary"}


def _run(layer, factory, case, tmp):
    return _RUNNERS[layer](factory, case, tmp)


# --- comparing -------------------------------------------------------------------


def _eps(dtype):
    return float(torch.finfo(_DTYPES[dtype]).eps)


def _compare_array(name, a, b, tol, why=None):
    """None if ``a`` matches ``b`` within ``tol`` (an array or scalar; 0 is
    exact), else a sentence naming the worst element."""
    if a.shape != b.shape:
        return f"{name}: shape {list(a.shape)}, splitgrad's is {list(b.shape)}"
    if a.dtype != b.dtype:
        return f"{name}: dtype {a.dtype}, splitgrad's is {b.dtype}"
    if a.size == 0:
        return None
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), b.shape)
    a64, b64 = _widen(a), _widen(b)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a64 - b64)
        ok = (a64 == b64) | (err <= tol) | (np.isnan(a64) & np.isnan(b64))
    if ok.all():
        return None
    bad = ~ok
    excess = np.where(bad, np.nan_to_num(err - tol, nan=np.inf, posinf=np.inf), -1.0)
    i = np.unravel_index(int(np.argmax(excess)), b.shape)
    where = f"[{', '.join(str(int(x)) for x in i)}]" if b.ndim else ""
    kind = "the same value" if tol[i] == 0 else f"within {tol[i]:.3g}"
    return (
        f"{name}{where}: the candidate gives {float(a64[i])!r}, splitgrad {float(b64[i])!r}, expected {kind}"
        + (f" ({why(i)})" if why else "")
        + (f"; {int(bad.sum())} of {b.size} elements differ" if bad.sum() > 1 else "")
    )


def _rel(b, rtol):
    return rtol * (1.0 + float(np.abs(_widen(b)).max(initial=0.0)))


def _embedding_tolerances(case, k):
    """Per element of split k's gradient: 0 where at most one position
    reached it, else count·eps·Σ|upstream|; and the contributing positions."""
    a = case.arrays
    starts, _ = case._starts()
    start, size = starts[k], case.split_sizes[k]
    ids = a["input_ids"].reshape(-1)
    up = np.abs(case.real("upstream").reshape(-1, case.hidden_size))
    count = np.zeros(size)
    mass = np.zeros((size, case.hidden_size))
    for p, i in enumerate(ids):
        if start <= i < start + size:
            count[i - start] += 1
            mass[i - start] += up[p]
    tol = np.where(count[:, None] >= 2, count[:, None] * _eps(case.dtype) * mass, 0.0)
    return tol, count


def _nonzero_rows(g):
    rows = sorted(set(np.nonzero(g)[0].tolist())) if g.ndim else []
    return f" (nonzero in rows {rows})" if rows else " (of zeros)"


def _reached(count):
    if count == 0:
        return "a row no position reached"
    return "a row one position reached" if count == 1 else f"a row {count} positions reached"


def _compare_embeddings(case, ref, cand):
    d = []
    d.append(_compare_array("out", cand.values["out"], ref.values["out"], 0.0, lambda i: "a lookup"))
    for k, trainable in enumerate(case.split_trainable):
        name = f"grad_weight_{k}"
        b, a = ref.values[name], cand.values[name]
        if not trainable:
            if a is not None:
                d.append(f"{name}: split s{k} is frozen, but the candidate gave it a gradient{_nonzero_rows(a)}")
            continue
        if b is None:
            b = _store(np.zeros((case.split_sizes[k], case.hidden_size)), case.dtype)
        if a is None:
            a = np.zeros_like(b)
        tol, count = _embedding_tolerances(case, k)
        d.append(
            _compare_array(name, a, b, tol, lambda i, c=count: _reached(int(c[i[0]])))
        )
    return d


def _compare_head(case, ref, cand):
    a = case.arrays
    rtol = RTOL[case.dtype]
    large = case.dtype == "float32" and "large_logits" in case.features
    ignored = a["labels"] == -100
    d = []
    b = ref.values["loss"]
    tol = np.where(ignored, 0.0, _rel(b, LARGE_LOGIT_RTOL if large else rtol))
    d.append(_compare_array("loss", cand.values["loss"], b, tol, lambda i: "label −100" if ignored[i] else "cross-entropy"))
    b = ref.values["grad_hidden"]
    c = cand.values["grad_hidden"]
    if c is None:
        c = np.zeros_like(b)
    tol = np.where(ignored[..., None], 0.0, _rel(b, LARGE_LOGIT_RTOL if large else rtol))
    d.append(_compare_array("grad_hidden", c, b, tol, lambda i: "label −100" if ignored[i[:-1]] else "softmax − onehot"))
    for k, trainable in enumerate(case.split_trainable):
        name = f"grad_weight_{k}"
        b, c = ref.values[name], cand.values[name]
        if not trainable:
            if c is not None:
                d.append(f"{name}: split s{k} is frozen, but the candidate gave it a gradient{_nonzero_rows(c)}")
            continue
        if b is None:
            b = _store(np.zeros((case.split_sizes[k], case.hidden_size)), case.dtype)
        if c is None:
            c = np.zeros_like(b)
        d.append(_compare_array(name, c, b, _rel(b, LARGE_LOGIT_RTOL if large else rtol)))
    return d


def _compare_vocabulary(case, ref, cand):
    a = case.arrays
    rtol = RTOL[case.dtype]
    gated = bool(int(a["use_gate"]))
    lookup = {}
    for i, pair in enumerate(zip(a["language_index"].tolist(), a["token_index"].tolist())):
        lookup.setdefault(pair, i)
    has = np.array([p in lookup for p in zip(a["language_ids"].tolist(), a["token_ids"].tolist())])
    exact = ~has | (not gated) | _rows_equal_shared(a)
    b = ref.values["out"]
    tol = np.where(exact[:, None], 0.0, _rel(b, rtol))

    def why(i):
        n = i[0]
        if not has[n]:
            return "no row: shared"
        if not gated:
            return "fusion mode: the row"
        if exact[n]:
            return "the row equals the shared row: shared, bit for bit"
        return "shared + σ(gate)·(row − shared)"

    d = [_compare_array("out", cand.values["out"], b, tol, why)]
    for name in ("penalty", "fusion_penalty", "loss", "grad_shared", "grad_rows", "grad_gate_logit"):
        b, c = ref.values[name], cand.values[name]
        if b is None and c is None:
            continue
        if b is None:
            b = np.zeros_like(c)
        if c is None:
            c = np.zeros_like(b)
        d.append(_compare_array(name, c, b, _rel(b, rtol)))
    return d


_COMPARE = {EMBEDDINGS: _compare_embeddings, HEAD: _compare_head, VOCABULARY: _compare_vocabulary}


def _differences(case, ref, cand):
    if ref.error and cand.error:
        return []  # both refuse the case
    if ref.error:
        got = ", ".join(f"{k} {_brief(v)}" for k, v in cand.values.items() if v is not None and k in ("out", "loss"))
        return [f"splitgrad raised {ref.describe_error()}; the candidate returned a value" + (f" ({got})" if got else "")]
    if cand.error:
        return [f"the candidate raised {cand.describe_error()}; splitgrad returned a value"]
    return [x for x in _COMPARE[case.layer](case, ref, cand) if x]


# --- failures: the report and the golden case ---------------------------------------


class Difference(AssertionError):
    """The candidate differs from splitgrad on ``case`` (a ``Case``, shrunk by
    hypothesis). ``differences``: one sentence each; ``reference_error`` and
    ``candidate_error``: what each side raised (or None); ``path``: the golden
    case file written (or None)."""

    def __init__(self, message, case, differences, reference_error, candidate_error, path):
        super().__init__(message)
        self.case, self.differences, self.path = case, differences, path
        self.reference_error, self.candidate_error = reference_error, candidate_error

    @property
    def layer(self) -> str:
        return self.case.layer

    @property
    def features(self) -> frozenset:
        return self.case.features


class _Found(Exception):
    def __init__(self, case, ref, cand, diffs):
        super().__init__("; ".join(diffs))
        self.case, self.ref, self.cand, self.diffs = case, ref, cand, diffs


def _write_case(out_dir, found):
    """Writes the case as ``<out_dir>/<layer>/case-NNNN.npz`` (the first free
    number): its inputs, splitgrad's results (``splitgrad.golden.evaluate``)
    or ``reference_error``, and the candidate's answers as ``candidate_*``
    or ``candidate_error``."""
    case = found.case
    folder = Path(out_dir) / case.layer
    folder.mkdir(parents=True, exist_ok=True)
    arrays = dict(case.arrays)
    try:
        arrays.update(golden.evaluate(case.layer, case.arrays))
    except ValueError as e:
        arrays["reference_error"] = np.array(str(e))
    for k, v in found.cand.values.items():
        if v is not None:
            arrays[f"candidate_{k}"] = v
    if found.cand.error:
        arrays["candidate_error"] = np.array(found.cand.describe_error())
    i = 0
    while (folder / f"case-{i:04d}.npz").exists():
        i += 1
    path = folder / f"case-{i:04d}.npz"
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    tmp = folder / f".case-{i:04d}.npz.tmp-{os.getpid()}"
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)
    return path


def _report(found, path, what):
    lines = [f"{what}: the candidate differs from splitgrad's {_NAMES[found.case.layer]} on this case"]
    lines += ["  " + x for x in found.case.describe().splitlines()]
    lines.append("differences:")
    lines += [f"  - {x}" for x in found.diffs]
    if path is not None:
        lines.append(
            f"written to {path}; replay it with `splitgrad golden eval --inputs {path.parent.parent} --out <folder>` "
            "or splitgrad.testing.replay(factory, path)"
        )
    return "\n".join(lines)


def _difference(found, path, what):
    return Difference(
        _report(found, path, what),
        found.case,
        found.diffs,
        found.ref.describe_error() if found.ref.error else None,
        found.cand.describe_error() if found.cand.error else None,
        path,
    )


def _find(exc):
    if isinstance(exc, _Found):
        return exc
    for sub in getattr(exc, "exceptions", ()):
        f = _find(sub)
        if f is not None:
            return f
    return None


def _check(layer, factory, strategy, seed, max_examples, out_dir):
    ran = [0]
    with tempfile.TemporaryDirectory(prefix="splitgrad-testing-") as tmp:

        def body(case):
            ran[0] += 1
            ref = _run(layer, _REFERENCES[layer], case, tmp)
            cand = _run(layer, factory, case, tmp)
            diffs = _differences(case, ref, cand)
            if diffs:
                raise _Found(case, ref, cand, diffs)

        test = hypothesis.given(case=strategy)(body)
        test = hypothesis.settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            derandomize=False,
            report_multiple_bugs=False,
            print_blob=False,
            verbosity=hypothesis.Verbosity.quiet,
            phases=(hypothesis.Phase.generate, hypothesis.Phase.shrink),
            suppress_health_check=list(hypothesis.HealthCheck),
        )(test)
        test = hypothesis.seed(seed)(test)
        try:
            test()
        except Exception as e:
            found = _find(e)
            if found is None:
                raise
            path = _write_case(out_dir, found) if out_dir is not None else None
            raise _difference(found, path, f"check ({ran[0]} cases run, seed {seed})") from None
    return ran[0]


def check_split_token_embeddings(
    factory, *, seed=0, max_examples=100, dtypes=("float64", "float32"), without=(), out_dir="splitgrad-differences"
):
    """Checks ``factory(split_vocab_size, split_order, hidden_size)`` (d9d's
    ``SplitTokenEmbeddings`` arguments) against splitgrad's drop-in on
    ``max_examples`` cases of ``split_token_embeddings_cases``. The output
    is a lookup and must hold the same values; a gradient row that one
    position reached too, one that k ≥ 2 reached within k·eps·Σ|upstream|;
    a frozen table gets no gradient; an id out of range must raise. Returns
    the number of cases run; raises ``Difference`` with the shrunk case, which
    it writes under ``out_dir`` (None: nowhere)."""
    strategy = split_token_embeddings_cases(dtypes=dtypes, without=without)
    return _check(EMBEDDINGS, factory, strategy, seed, max_examples, out_dir)


def check_lm_head(
    factory, *, seed=0, max_examples=100, dtypes=("float64", "float32"), without=(), out_dir="splitgrad-differences"
):
    """Checks ``factory(split_vocab_size, split_order, hidden_size)`` (d9d's
    ``SplitLanguageModellingHead`` arguments) against splitgrad's drop-in on
    ``max_examples`` cases of ``lm_head_cases``: the per-token loss, the
    hidden states' and the trainable weights' gradients within
    ``RTOL[dtype]·(1 + max|b|)`` (float32 with logits in the thousands:
    1e-3), exactly 0 at a −100 label; a frozen weight gets no gradient; a
    label out of range must raise. Returns the number of cases run; raises
    ``Difference`` with the shrunk case, which it writes under ``out_dir``."""
    strategy = lm_head_cases(dtypes=dtypes, without=without)
    return _check(HEAD, factory, strategy, seed, max_examples, out_dir)


def check_split_vocabulary(
    factory, *, seed=0, max_examples=100, dtypes=("float64", "float32"), without=(), out_dir="splitgrad-differences"
):
    """Checks ``factory(index_path, vocab_size, dim, n_languages, gate_init)``
    (the reference ``SplitVocabulary``'s arguments) against splitgrad's
    drop-in on ``max_examples`` cases of ``split_vocabulary_cases``: the
    output (the same values for a token without a row, in fusion mode and
    where a row equals its shared row; else within ``RTOL[dtype]·(1 +
    max|b|)``), both penalties, the loss and the gradients of ``shared``,
    ``rows`` and ``gate_logit`` within the same; an index with a repeated
    pair and a token or language out of range must raise. Returns the number
    of cases run; raises ``Difference`` with the shrunk case, which it writes
    under ``out_dir``."""
    strategy = split_vocabulary_cases(dtypes=dtypes, without=without)
    return _check(VOCABULARY, factory, strategy, seed, max_examples, out_dir)


def replay(factory, path, layer=None):
    """Runs one case file (``<layer>/NAME.npz``; ``layer`` defaults to the name
    of its folder) through ``factory`` and splitgrad's drop-in and compares
    them as the checks do: raises ``Difference`` if they differ."""
    path = Path(path)
    layer = layer or path.parent.name
    if layer not in _RUNNERS:
        raise ValueError(f"{path}: no layer named `{layer}` (the layers: {', '.join(_RUNNERS)})")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if not _is_result(layer, k)}
    case = Case(layer, arrays)
    with tempfile.TemporaryDirectory(prefix="splitgrad-testing-") as tmp:
        ref = _run(layer, _REFERENCES[layer], case, tmp)
        cand = _run(layer, factory, case, tmp)
    diffs = _differences(case, ref, cand)
    if diffs:
        raise _difference(_Found(case, ref, cand, diffs), None, f"replay of {path}")


_RESULTS = {
    EMBEDDINGS: ("out",),
    HEAD: ("loss", "grad_hidden"),
    VOCABULARY: ("out", "penalty", "fusion_penalty", "loss", "grad_shared", "grad_rows", "grad_gate_logit"),
}


def _is_result(layer, name):
    return (
        name in _RESULTS[layer]
        or name.startswith("grad_weight_")
        or name.startswith("candidate_")
        or name == "reference_error"
    )


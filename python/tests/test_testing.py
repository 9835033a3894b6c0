"""splitgrad.testing: the differential tester passes splitgrad's own drop-ins
and plain torch implementations written from docs/spec.md, and finds, with a
shrunk case of a few ids, each bug planted in a copy of those, and d9d's
two differences (a zero vector for an id out of range, a crash on a split of
size 0)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: splitgrad.testing needs it")
pytest.importorskip("hypothesis", reason="hypothesis is not installed: splitgrad.testing needs it")
F = torch.nn.functional

from splitgrad import golden  # noqa: E402
from splitgrad import testing  # noqa: E402
from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary  # noqa: E402


def d9d_embeddings():
    mod = pytest.importorskip("d9d.module.block.embedding", reason="d9d is not installed: no check of it")
    return mod.SplitTokenEmbeddings


# --- plain torch implementations, from docs/spec.md, with switchable bugs ---------


class PlainEmbeddings(torch.nn.Module):
    """§2.1 in plain torch: each id looked up in the split that owns it.

    ``boundary_bug``: the owning split is found with ``bucketize(right=False)``
    on the splits' ends, so the first id of a split goes to the one before it
    (and reads that split's last row). ``frozen_bug``: one table, the splits
    concatenated, whose gradient is handed to every split's ``.grad``, frozen
    or not (as a fused kernel writing gradients itself might)."""

    def __init__(self, split_vocab_size, split_order, hidden_size, boundary_bug=False, frozen_bug=False):
        super().__init__()
        self.token_embedding = torch.nn.ModuleDict(
            {s: torch.nn.Embedding(n, hidden_size) for s, n in split_vocab_size.items()}
        )
        self.order = list(split_order)
        sizes = [split_vocab_size[s] for s in self.order]
        self.register_buffer("ends", torch.tensor(np.cumsum(sizes), dtype=torch.int64), persistent=False)
        self.sizes, self.boundary_bug, self.frozen_bug = sizes, boundary_bug, frozen_bug

    def forward(self, ids):
        V = sum(self.sizes)
        bad = (ids < 0) | (ids >= V)
        if bad.any():
            raise ValueError(f"input id {int(ids[bad][0])} is out of range 0..{V}")
        weights = [self.token_embedding[s].weight for s in self.order]
        if self.frozen_bug:
            table = torch.cat([w.detach() for w in weights]).requires_grad_(True)

            def spread(g):
                for w, part in zip(weights, torch.split(g, self.sizes)):
                    w.grad = part.clone() if w.grad is None else w.grad + part

            table.register_hook(spread)
            return F.embedding(ids, table)
        split = torch.bucketize(ids, self.ends, right=not self.boundary_bug)
        out = torch.zeros(*ids.shape, weights[0].shape[1], dtype=weights[0].dtype)
        start = 0
        for k, w in enumerate(weights):
            mask = split == k
            if mask.any():
                local = (ids[mask] - start).clamp(max=self.sizes[k] - 1)
                out = out.index_put((mask,), F.embedding(local, w))
            start += self.sizes[k]
        return out


class PlainHead(torch.nn.Module):
    """§2.2 in plain torch: the full logits and a stabilised log-sum-exp.

    ``ignore_bug``: a −100 label is clamped to 0 and its loss kept.
    ``overflow_bug``: ``log Σ exp(z)`` without the maximum taken out, which
    overflows on logits in the thousands."""

    def __init__(self, split_vocab_size, split_order, hidden_size, ignore_bug=False, overflow_bug=False):
        super().__init__()
        self.lm_head = torch.nn.ModuleDict(
            {s: torch.nn.Linear(hidden_size, n, bias=False) for s, n in split_vocab_size.items()}
        )
        self.order, self.ignore_bug, self.overflow_bug = list(split_order), ignore_bug, overflow_bug

    def forward(self, hidden, shared):
        labels = shared.labels
        w = torch.cat([self.lm_head[s].weight for s in self.order])
        logits = hidden.reshape(-1, hidden.shape[-1]) @ w.T
        flat = labels.reshape(-1)
        if self.overflow_bug:
            lse = logits.exp().sum(dim=1).log()
            picked = logits.gather(1, flat.clamp(min=0)[:, None])[:, 0]
            loss = torch.where(flat == -100, 0.0, lse - picked)
            if ((flat < 0) & (flat != -100)).any() or (flat >= logits.shape[1]).any():
                raise IndexError("a label is out of range")
        elif self.ignore_bug:
            lse = torch.logsumexp(logits, dim=1)
            loss = lse - logits.gather(1, flat.clamp(min=0)[:, None])[:, 0]
        else:
            loss = F.cross_entropy(logits, flat, ignore_index=-100, reduction="none")
        return loss.reshape(labels.shape)  # the tester takes the loss itself or anything with .cross_entropy


class PlainVocabulary(torch.nn.Module):
    """§2.3 in plain torch, the centroid as the spec computes it.

    ``gate_bug``: the gate mixes the wrong way, σ·shared + (1 − σ)·row.
    ``norm_bug``: the fusion penalty's norm is ``sqrt(Σ d²)``, whose gradient
    at a zero deviation is NaN (0·∞), not 0 as the spec (and torch's norm)
    has it. ``duplicate_bug``: an index that lists a pair twice is taken (the
    later row wins the lookup) instead of refused."""

    def __init__(
        self, index_path, vocab_size, dim, n_languages, gate_init=0.0, gate_bug=False, norm_bug=False,
        duplicate_bug=False,
    ):
        super().__init__()
        with np.load(index_path) as z:
            lang = torch.from_numpy(z["language_index"].astype(np.int64))
            tok = torch.from_numpy(z["token_index"].astype(np.int64))
        n = len(tok)
        if n == 0:
            raise ValueError("the index is empty")
        if (lang < 0).any() or (lang >= n_languages).any() or (tok < 0).any() or (tok >= vocab_size).any():
            raise ValueError("an index id is out of range")
        cells = lang * vocab_size + tok
        if len(torch.unique(cells)) < n and not duplicate_bug:
            raise ValueError("a (language, token) pair is listed twice")
        self.V, self.L = vocab_size, n_languages
        self.lookup = torch.full((n_languages * vocab_size,), -1, dtype=torch.int64)
        self.lookup[cells] = torch.arange(n)
        groups, which = torch.unique(tok, return_inverse=True)
        first = torch.full((len(groups),), n, dtype=torch.int64).scatter_reduce(0, which, torch.arange(n), "amin")
        self.which, self.first = which, first
        self.count = torch.bincount(which, minlength=len(groups))
        self.rows = torch.nn.Parameter(torch.zeros(n, dim))
        self.gate_logit = torch.nn.Parameter(torch.full((n,), float(gate_init)))
        self.gate_bug, self.norm_bug = gate_bug, norm_bug

    def penalty(self):
        return torch.sigmoid(self.gate_logit).mean()

    def fusion_penalty(self):
        f = self.rows[self.first][self.which]
        total = torch.zeros(len(self.first), self.rows.shape[1]).index_add(0, self.which, self.rows - f)
        centroid = self.rows[self.first] + total / self.count[:, None].to(self.rows.dtype)
        d = self.rows - centroid[self.which]
        norm = torch.sqrt((d * d).sum(dim=1)) if self.norm_bug else d.norm(dim=1)
        return norm.mean()

    def forward(self, token_ids, lang, shared, use_gate=True):
        bad = (token_ids < 0) | (token_ids >= self.V) | (lang < 0) | (lang >= self.L)
        if bad.any():
            raise ValueError("a token or language id is out of range")
        row = self.lookup[lang * self.V + token_ids]
        has = (row >= 0)[:, None]
        mine = self.rows[row.clamp(min=0)]
        if not use_gate:
            return torch.where(has, mine, shared)
        g = torch.sigmoid(self.gate_logit)[row.clamp(min=0)][:, None]
        mixed = g * shared + (1 - g) * mine if self.gate_bug else shared + g * (mine - shared)
        return torch.where(has, mixed, shared)


# --- the tests --------------------------------------------------------------------


def ids_of(case):
    """The ids (or labels, or tokens) of a case."""
    a = case.arrays
    return a.get("input_ids", a.get("labels", a.get("token_ids")))


def test_passes_splitgrads_own_embeddings(tmp_path):
    n = testing.check_split_token_embeddings(SplitTokenEmbeddings, max_examples=200, out_dir=tmp_path)
    assert n == 200
    assert not any(tmp_path.iterdir())


def test_passes_splitgrads_own_head_and_vocabulary(tmp_path):
    assert testing.check_lm_head(SplitLanguageModellingHead, max_examples=100, out_dir=tmp_path) == 100
    assert testing.check_split_vocabulary(SplitVocabulary, max_examples=100, out_dir=tmp_path) == 100


@pytest.mark.parametrize(
    "check, factory",
    [
        (testing.check_split_token_embeddings, PlainEmbeddings),
        (testing.check_lm_head, PlainHead),
        (testing.check_split_vocabulary, PlainVocabulary),
    ],
    ids=["embeddings", "head", "vocabulary"],
)
def test_passes_plain_torch_implementations_of_the_spec(check, factory, tmp_path):
    # the tolerances hold for an implementation that computes differently
    assert check(factory, max_examples=60, seed=1, out_dir=tmp_path) == 60


def bugged(cls, **bug):
    return lambda *args: cls(*args, **bug)


PLANTED = {
    # name: (check, bugged factory, correct factory, a phrase of the report)
    "off-by-one at a split boundary": (
        testing.check_split_token_embeddings, bugged(PlainEmbeddings, boundary_bug=True), PlainEmbeddings,
        "expected the same value (a lookup)",
    ),
    "gradient sent to a frozen split": (
        testing.check_split_token_embeddings, bugged(PlainEmbeddings, frozen_bug=True), PlainEmbeddings,
        "is frozen, but the candidate gave it a gradient",
    ),
    "head that ignores -100": (
        testing.check_lm_head, bugged(PlainHead, ignore_bug=True), PlainHead, "(label −100)",
    ),
    "head that overflows": (
        testing.check_lm_head, bugged(PlainHead, overflow_bug=True), PlainHead, "the candidate gives inf",
    ),
    "gate mixing the wrong way": (
        testing.check_split_vocabulary, bugged(PlainVocabulary, gate_bug=True), PlainVocabulary, "grad_gate_logit",
    ),
    "fusion penalty without the zero-deviation rule": (
        testing.check_split_vocabulary, bugged(PlainVocabulary, norm_bug=True), PlainVocabulary,
        "grad_rows[0, 0]: the candidate gives nan",
    ),
    "duplicate index pair taken": (
        testing.check_split_vocabulary, bugged(PlainVocabulary, duplicate_bug=True), PlainVocabulary,
        "splitgrad raised ValueError: ",
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_finds_a_planted_bug_with_a_shrunk_case(name, tmp_path):
    check, factory, correct, phrase = PLANTED[name]
    with pytest.raises(testing.Difference) as info:
        check(factory, max_examples=300, out_dir=tmp_path)
    e = info.value
    assert isinstance(e, AssertionError)
    assert phrase in str(e), str(e)
    assert ids_of(e.case).size <= 3, str(e)
    # the shrunk case is a golden case file: splitgrad evaluates it (or refuses
    # it, naming why, when it must be refused), and it replays
    assert e.path.is_file() and e.path.parent.name == e.layer and e.path.name == "case-0000.npz"
    with np.load(e.path) as z:
        stored = {k: z[k] for k in z.files}
    if e.reference_error is None:
        for k, v in golden.evaluate(e.layer, e.path).items():
            np.testing.assert_array_equal(stored[k], v)
    else:
        assert "reference_error" in stored
        assert e.reference_error.startswith("ValueError: ")
    with pytest.raises(testing.Difference):
        testing.replay(factory, e.path)
    testing.replay(correct, e.path)  # the correct implementation agrees on it


HALF_PLANTED = ["off-by-one at a split boundary", "head that ignores -100", "gate mixing the wrong way"]


@pytest.mark.parametrize("dtype", ["bfloat16", torch.float16])
@pytest.mark.parametrize("name", HALF_PLANTED)
def test_finds_a_planted_bug_in_half_precision(name, dtype, tmp_path):
    check, factory, correct, phrase = PLANTED[name]
    with pytest.raises(testing.Difference) as info:
        check(factory, dtypes=(dtype,), max_examples=300, out_dir=tmp_path)
    e = info.value
    assert phrase in str(e), str(e)
    assert e.case.dtype == ("bfloat16" if dtype == "bfloat16" else "float16")
    assert ids_of(e.case).size <= 3, str(e)
    with np.load(e.path) as z:
        stored = {k: z[k] for k in z.files}
    # a golden case of the half type (bf16 as its bits): splitgrad's results in it
    anchor = {"split-embeddings": "upstream", "lm-head": "hidden", "split-vocabulary": "shared"}[e.layer]
    assert stored[anchor].dtype == (np.uint16 if dtype == "bfloat16" else np.float16)
    for k, v in golden.evaluate(e.layer, e.path).items():
        np.testing.assert_array_equal(stored[k], v)
    testing.replay(correct, e.path)


@pytest.mark.parametrize("check, factory", [
    (testing.check_split_token_embeddings, PlainEmbeddings),
    (testing.check_lm_head, PlainHead),
    (testing.check_split_vocabulary, PlainVocabulary),
])
def test_plain_layers_in_half_precision_pass(check, factory, tmp_path):
    # torch computing in bf16 / f16 against the drop-in computing in f32 and rounding once
    assert check(factory, dtypes=("bfloat16", "float16"), max_examples=80, seed=2, out_dir=tmp_path) == 80


def test_d9d_in_bf16_passes_but_for_its_two_known_differences(tmp_path):
    cls = d9d_embeddings()
    n = testing.check_split_token_embeddings(
        cls, dtypes=(torch.bfloat16,), max_examples=100, without=("out_of_range", "empty_split"), out_dir=tmp_path
    )
    assert n == 100
    with pytest.raises(testing.Difference, match="index_select"):  # a split of size 0
        testing.check_split_token_embeddings(cls, dtypes=("bfloat16",), max_examples=300, out_dir=tmp_path)


def test_d9d_differs_on_an_out_of_range_id_and_on_a_split_of_size_0(tmp_path):
    D9d = d9d_embeddings()
    with pytest.raises(testing.Difference) as info:
        testing.check_split_token_embeddings(D9d, max_examples=200, out_dir=tmp_path)
    first = info.value
    assert ids_of(first.case).size <= 3, str(first)
    assert first.features & {"out_of_range", "empty_split"}
    with pytest.raises(testing.Difference) as info:
        testing.check_split_token_embeddings(D9d, max_examples=200, without=["out_of_range"], out_dir=tmp_path)
    e = info.value
    assert ids_of(e.case).size <= 3, str(e)
    assert "empty_split" in e.features and 0 in e.case.split_sizes
    assert e.reference_error is None and e.candidate_error and "(in forward)" in e.candidate_error
    assert "the candidate raised" in str(e) and "splitgrad returned a value" in str(e)
    # everywhere else d9d agrees with splitgrad
    assert testing.check_split_token_embeddings(
        D9d, max_examples=60, without=["out_of_range", "empty_split"], out_dir=tmp_path
    ) == 60


def test_known_fact_the_drop_in_raises_where_d9d_returns_zeros(tmp_path):
    D9d = d9d_embeddings()
    sizes, order = {"a": 2, "b": 1}, ["a", "b"]
    ids = torch.tensor([0, 3])
    assert torch.equal(D9d(sizes, order, 2)(ids)[1], torch.zeros(2))
    with pytest.raises(ValueError, match=r"input id 3 at position \[1\] is out of range 0\.\.3"):
        SplitTokenEmbeddings(sizes, order, 2)(ids)
    # and the tester reports it as which side raised what, with the case
    with pytest.raises(testing.Difference) as info:
        testing.check_split_token_embeddings(D9d, max_examples=200, without=["empty_split"], out_dir=tmp_path)
    e = info.value
    assert "out_of_range" in e.features
    assert e.reference_error.startswith("ValueError: input id") and e.candidate_error is None
    assert "splitgrad raised ValueError" in str(e) and "the candidate returned a value" in str(e)
    assert "input_ids [1]:" in str(e)
    with np.load(e.path) as z:
        assert not z["candidate_out"].any()  # d9d's zero vector, kept in the case
        assert "out of range" in str(z["reference_error"])


def test_a_seed_names_a_run(tmp_path):
    factory = bugged(PlainEmbeddings, boundary_bug=True)
    cases = []
    for _ in range(2):
        with pytest.raises(testing.Difference) as info:
            testing.check_split_token_embeddings(factory, seed=0, max_examples=100, out_dir=None)
        assert info.value.path is None
        cases.append(info.value.case.arrays)
    assert cases[0].keys() == cases[1].keys()
    for k in cases[0]:
        np.testing.assert_array_equal(cases[0][k], cases[1][k])


def test_float32_only_and_bad_arguments(tmp_path):
    assert testing.check_split_token_embeddings(
        SplitTokenEmbeddings, max_examples=20, dtypes=[torch.float32], out_dir=tmp_path
    ) == 20
    with pytest.raises(ValueError, match="no kind of split-embeddings case named"):
        testing.check_split_token_embeddings(SplitTokenEmbeddings, without=["ignore_index"])
    with pytest.raises(ValueError, match="is not float64, float32, bfloat16 or float16"):
        testing.check_lm_head(SplitLanguageModellingHead, dtypes=["int8"])


def test_a_candidate_without_the_parameter_names_differs(tmp_path):
    class Renamed(torch.nn.Module):
        def __init__(self, split_vocab_size, split_order, hidden_size):
            super().__init__()
            self.inner = SplitTokenEmbeddings(split_vocab_size, split_order, hidden_size)

        def forward(self, ids):
            return self.inner(ids)

    with pytest.raises(testing.Difference, match=r"the candidate raised LookupError: .*token_embedding\.s0\.weight"):
        testing.check_split_token_embeddings(Renamed, max_examples=10, out_dir=tmp_path)

"""splitgrad.torch against d9d's SplitTokenEmbeddings and against references
written here from docs/spec.md (the head, §2.2, and SplitVocabulary, §2.3):
outputs, gradients, training steps, freezing and state dicts."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the splitgrad.torch tests need it")
F = torch.nn.functional

from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary  # noqa: E402

SIZES = {"orig": 10, "special": 3, "prompt": 2}
ORDER = ["orig", "special", "prompt"]
H = 4


def d9d_embeddings():
    mod = pytest.importorskip("d9d.module.block.embedding", reason="d9d is not installed: no parity test against it")
    return mod.SplitTokenEmbeddings


def ids_batch(seed=0, shape=(3, 7)):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, sum(SIZES.values()), shape, generator=g)


# --- SplitTokenEmbeddings vs d9d ---------------------------------------------


def test_same_names_shapes_and_reset_as_d9d():
    D9d = d9d_embeddings()
    theirs = D9d(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H)
    ours = SplitTokenEmbeddings(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for k, v in theirs.state_dict().items():
        assert ours.state_dict()[k].shape == v.shape and ours.state_dict()[k].dtype == v.dtype
    torch.manual_seed(5)
    theirs.reset_parameters()
    torch.manual_seed(5)
    ours.reset_parameters()
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k


def test_d9d_state_dict_loads_into_the_drop_in_and_back_unchanged():
    D9d = d9d_embeddings()
    theirs = D9d(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H)
    before = {k: v.clone() for k, v in theirs.state_dict().items()}
    ours = SplitTokenEmbeddings(SIZES, ORDER, H)
    ours.load_state_dict(theirs.state_dict())
    back = D9d(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H)
    back.load_state_dict(ours.state_dict())
    for k, v in before.items():
        assert torch.equal(back.state_dict()[k], v), k
        assert torch.equal(ours.state_dict()[k], v), k
    # the kernels read what was loaded
    ids = ids_batch()
    assert torch.equal(ours(ids), theirs(ids))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outputs_and_gradients_equal_d9d(dtype):
    D9d = d9d_embeddings()
    theirs = D9d(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H).to(dtype)
    ours = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    ids = ids_batch(1)
    r = torch.randn(*ids.shape, H, dtype=dtype, generator=torch.Generator().manual_seed(2))
    a, b = ours(ids), theirs(ids)
    assert torch.equal(a, b)  # a lookup: the same bits
    (a * r).sum().backward()
    (b * r).sum().backward()
    for s in ORDER:
        go = ours.token_embedding[s].weight.grad
        gt = theirs.token_embedding[s].weight.grad
        assert go.is_sparse
        torch.testing.assert_close(go.to_dense(), gt, rtol=1e-6 if dtype == torch.float32 else 1e-13, atol=1e-6)
        # one gradient row per distinct id of the split, in increasing order
        # (coalesced; torch's gradient accumulation drops the flag, not the order)
        start = sum(SIZES[o] for o in ORDER[: ORDER.index(s)])
        own = ids[(ids >= start) & (ids < start + SIZES[s])] - start
        assert go._indices()[0].tolist() == sorted(set(own.tolist()))


def test_out_of_range_id_raises_where_d9d_returns_zeros():
    ours = SplitTokenEmbeddings(SIZES, ORDER, H)
    with pytest.raises(ValueError, match=r"input id 15 at position \[1\] is out of range 0\.\.15"):
        ours(torch.tensor([0, 15]))
    with pytest.raises(ValueError, match="integer dtype"):
        ours(torch.tensor([0.0]))


def reference_sparse_embeddings(weights, ids):
    """Each token looked up in the split that owns it, sparse gradients (spec §2.1)."""
    out = torch.zeros(*ids.shape, H, dtype=weights[0].dtype)
    start = 0
    for s, w in zip(ORDER, weights):
        mask = (ids >= start) & (ids < start + SIZES[s])
        if mask.any():
            out = out.index_put((mask,), F.embedding(ids[mask] - start, w, sparse=True))
        start += SIZES[s]
    return out


def test_prompt_tuning_with_sparse_adam_matches_a_torch_reference():
    torch.manual_seed(0)
    ours = SplitTokenEmbeddings(SIZES, ORDER, H)
    ours.reset_parameters()
    ref = [torch.nn.Parameter(ours.token_embedding[s].weight.detach().clone()) for s in ORDER]
    ours.token_embedding["orig"].weight.requires_grad_(False)
    ref[0].requires_grad_(False)
    opt = torch.optim.SparseAdam([p for p in ours.parameters() if p.requires_grad], lr=0.05)
    ropt = torch.optim.SparseAdam([p for p in ref if p.requires_grad], lr=0.05)
    for step in range(4):
        ids = ids_batch(10 + step)
        r = torch.randn(*ids.shape, H, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        ropt.zero_grad()
        (ours(ids) * r).sum().backward()
        (reference_sparse_embeddings(ref, ids) * r).sum().backward()
        assert ours.token_embedding["orig"].weight.grad is None
        opt.step()
        ropt.step()
    for s, w in zip(ORDER, ref):
        torch.testing.assert_close(ours.token_embedding[s].weight.detach(), w.detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(ours.token_embedding["orig"].weight, ref[0])


def test_sparse_gradients_stay_marked_coalesced_and_sum_correctly():
    # torch forgets the flag when it stores a first sparse gradient; without
    # it SparseAdam sorts and merges every step's rows again
    ours = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.float64)
    ids = torch.tensor([[1, 5, 5, 11], [14, 2, 1, 0]])
    r = torch.randn(2, 4, H, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ours(ids).backward(r)
    g = ours.token_embedding["orig"].weight.grad
    assert g.is_sparse and g.is_coalesced()
    assert g._indices().tolist() == [[0, 1, 2, 5]]
    dense = torch.zeros(10, H, dtype=torch.float64).index_add_(0, ids[ids < 10], r[ids < 10])
    torch.testing.assert_close(g.to_dense(), dense, rtol=0, atol=1e-15)
    # a second pass sums into the same .grad: still the right rows and values
    ours(ids[:, :2]).backward(r[:, :2])
    dense.index_add_(0, ids[:, :2][ids[:, :2] < 10], r[:, :2][ids[:, :2] < 10])
    g = ours.token_embedding["orig"].weight.grad
    torch.testing.assert_close(g.coalesce().to_dense(), dense, rtol=0, atol=1e-15)
    if g.is_coalesced():  # whoever marks it must be right
        assert g._indices().tolist() == [sorted(set(g._indices()[0].tolist()))]


def test_fused_adam_equals_sparse_adam():
    torch.manual_seed(1)
    plain = SplitTokenEmbeddings(SIZES, ORDER, H)
    plain.reset_parameters()
    fused = SplitTokenEmbeddings(SIZES, ORDER, H, fused_adam={"lr": 0.05})
    fused.load_state_dict(plain.state_dict())
    opt = torch.optim.SparseAdam(list(plain.parameters()), lr=0.05)
    for step in range(4):
        ids = ids_batch(20 + step)
        r = torch.randn(*ids.shape, H, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        (plain(ids) * r).sum().backward()
        opt.step()
        (fused(ids) * r).sum().backward()
        assert all(p.grad is None for p in fused.parameters())
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[k], v, rtol=1e-6, atol=1e-7)
    state = fused.fused_optimizer_state()
    assert int(state["token_embedding.prompt.weight.step"]) == 4


def test_converted_or_replaced_parameters():
    ours = SplitTokenEmbeddings(SIZES, ORDER, H)
    new = torch.randn(10, H)
    ours.token_embedding["orig"].weight.data = new.clone()  # replaced storage, same dtype: copied in
    assert torch.equal(ours(torch.tensor([3]))[0], new[3])
    with pytest.raises(TypeError, match="build it with dtype"):
        ours.double()  # refused: the layer computes in float32, and stays as it was
    assert ours.token_embedding["orig"].weight.dtype == torch.float32
    assert torch.equal(ours(torch.tensor([3]))[0], new[3])
    ours.token_embedding["orig"].weight.data = new.double()  # a replaced storage of another dtype
    with pytest.raises(TypeError, match="build it with dtype"):
        ours(torch.tensor([3]))


def test_stand_in_values_for_one_call_are_refused_and_the_layer_is_unchanged(index_file):
    path, _, _ = index_file
    ids = torch.tensor([1, 11])
    layers = [
        (SplitTokenEmbeddings(SIZES, ORDER, H), (ids,)),
        (SplitLanguageModellingHead(SIZES, ORDER, H), (torch.randn(2, H), ids)),
        (SplitVocabulary(path, 12, H, 4), (ids, torch.tensor([0, 3]), torch.randn(2, H))),
    ]
    for layer, args in layers:
        before = {k: v.detach().clone() for k, v in layer.state_dict().items()}
        zeros = {k: torch.zeros_like(v) for k, v in layer.named_parameters()}
        with pytest.raises(TypeError, match="functional_call"):
            torch.func.functional_call(layer, zeros, args)
        after = layer.state_dict()
        assert all(torch.equal(after[k], before[k]) for k in before), type(layer).__name__
        assert all(not (z != 0).any() for z in zeros.values())  # and the stand-ins are untouched
        # The layer's own values, detached: computed as the layer computes them.
        own = {k: v.detach() for k, v in layer.named_parameters()}
        out = torch.func.functional_call(layer, own, args)
        want = layer(*args)
        got = out.cross_entropy if isinstance(layer, SplitLanguageModellingHead) else out
        want = want.cross_entropy if isinstance(layer, SplitLanguageModellingHead) else want
        assert torch.equal(got, want)
        assert all(p.requires_grad for p in layer.parameters())


# --- SplitLanguageModellingHead vs the spec's reference ------------------------


def reference_head(weights, hidden, labels):
    """Per-token cross-entropy of the full logits (spec §2.2), 0 at −100."""
    w = torch.cat(weights)
    logits = hidden.reshape(-1, hidden.shape[-1]) @ w.T
    return F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100, reduction="none").reshape(labels.shape)


@pytest.mark.parametrize("reduce", ["sum", "mean", "weighted"])
def test_head_equals_the_reference(reduce):
    torch.manual_seed(3)
    head = SplitLanguageModellingHead(SIZES, ORDER, H, dtype=torch.float64)
    head.reset_parameters()
    ref = [torch.nn.Parameter(head.lm_head[s].weight.detach().clone()) for s in ORDER]
    h1 = torch.randn(2, 5, H, dtype=torch.float64, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    labels = torch.randint(0, 15, (2, 5))
    labels[0, 1] = labels[1, 4] = -100
    out = head(h1, labels).cross_entropy
    want = reference_head(ref, h2, labels)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert out[0, 1] == 0
    weights = torch.rand(2, 5, dtype=torch.float64)
    loss = {"sum": lambda x: x.sum(), "mean": lambda x: x.mean(), "weighted": lambda x: (x * weights).sum()}[reduce]
    loss(out).backward()
    loss(want).backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)
    for s, w in zip(ORDER, ref):
        torch.testing.assert_close(head.lm_head[s].weight.grad, w.grad, rtol=1e-10, atol=1e-12)


def test_head_forward_sum_freezing_and_names():
    torch.manual_seed(4)
    head = SplitLanguageModellingHead(SIZES, ORDER, H)
    head.reset_parameters()
    assert list(head.state_dict()) == [f"lm_head.{s}.weight" for s in SIZES]
    head.lm_head["orig"].weight.requires_grad_(False)
    h = torch.randn(6, H, requires_grad=True)
    labels = torch.tensor([1, 11, -100, 14, 0, 12])
    total = head.forward_sum(h, labels)
    torch.testing.assert_close(total, head(h.detach(), labels).cross_entropy.sum(), rtol=1e-5, atol=1e-5)
    (2 * total).backward()
    assert head.lm_head["orig"].weight.grad is None
    ref = [head.lm_head[s].weight.detach().clone().requires_grad_(s != "orig") for s in ORDER]
    h2 = h.detach().clone().requires_grad_(True)
    (2 * reference_head(ref, h2, labels).sum()).backward()
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(head.lm_head["prompt"].weight.grad, ref[2].grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"label 15 at position \[0\] is out of range 0\.\.15"):
        head(h.detach(), torch.tensor([15, 0, 0, 0, 0, 0]))


def test_head_state_dict_matches_d9d_layout():
    # d9d's head cannot be imported without cut_cross_entropy; its layout is
    # one nn.Linear(H, size, bias=False) per split, which is what we build.
    head = SplitLanguageModellingHead(SIZES, ORDER, H)
    for s, size in SIZES.items():
        lin = head.lm_head[s]
        assert isinstance(lin, torch.nn.Linear) and lin.bias is None and lin.weight.shape == (size, H)
    torch.manual_seed(0)
    head.reset_parameters()
    torch.manual_seed(0)
    ref = {s: torch.nn.Linear(H, size, bias=False) for s, size in SIZES.items()}
    torch.manual_seed(0)
    for lin in ref.values():
        lin.reset_parameters()
    for s in SIZES:
        assert torch.equal(head.lm_head[s].weight, ref[s].weight)


# --- SplitVocabulary vs a reference written from spec §2.3 ---------------------


class ReferenceSplitVocabulary(torch.nn.Module):
    """Spec §2.3 in plain torch: a private row per listed (language, token) pair,
    out = shared + σ(gate)·(row − shared) where a pair has a row (row alone
    without the gate), penalty = mean gate, fusion penalty = mean distance of
    each row to the mean of its token's rows."""

    def __init__(self, language_index, token_index, vocab_size, dim, n_languages, gate_init=0.0):
        super().__init__()
        n = len(token_index)
        self.lookup = torch.full((n_languages, vocab_size), -1, dtype=torch.long)
        self.lookup[language_index, token_index] = torch.arange(n)
        self.token_index = token_index
        self.rows = torch.nn.Parameter(torch.zeros(n, dim, dtype=torch.float64))
        self.gate_logit = torch.nn.Parameter(torch.full((n,), float(gate_init), dtype=torch.float64))

    def penalty(self):
        return torch.sigmoid(self.gate_logit).mean()

    def fusion_penalty(self):
        groups, which = torch.unique(self.token_index, return_inverse=True)
        total = torch.zeros(len(groups), self.rows.shape[1], dtype=self.rows.dtype).index_add(0, which, self.rows)
        count = torch.bincount(which, minlength=len(groups)).to(self.rows.dtype)
        centroid = total / count[:, None]
        return (self.rows - centroid[which]).norm(dim=1).mean()

    def forward(self, token_ids, lang, shared, use_gate=True):
        row = self.lookup[lang, token_ids]
        has = (row >= 0)[:, None]
        mine = self.rows[row.clamp(min=0)]
        if not use_gate:
            return torch.where(has, mine, shared)
        g = torch.sigmoid(self.gate_logit)[row.clamp(min=0)][:, None]
        return torch.where(has, shared + g * (mine - shared), shared)


@pytest.fixture
def index_file(tmp_path):
    rng = np.random.default_rng(0)
    cells = rng.choice(4 * 12, size=20, replace=False)
    cells.sort()
    lang, tok = cells // 12, cells % 12
    path = tmp_path / "index.npz"
    np.savez(path, language_index=lang, token_index=tok)
    return path, torch.from_numpy(lang), torch.from_numpy(tok)


@pytest.mark.parametrize("use_gate", [True, False])
def test_vocabulary_equals_the_reference(index_file, use_gate):
    path, lang, tok = index_file
    ours = SplitVocabulary(path, 12, 5, 4, gate_init=0.2, dtype=torch.float64)
    ref = ReferenceSplitVocabulary(lang, tok, 12, 5, 4, gate_init=0.2)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(12, 5, dtype=torch.float64, generator=g)
    ours.seed_from(table)
    with torch.no_grad():
        ref.rows.copy_(table[tok])
    assert torch.equal(ours.rows, ref.rows)
    assert ours.fusion_penalty().item() == 0.0
    with torch.no_grad():
        noise = 0.1 * torch.randn(20, 5, dtype=torch.float64, generator=g)
        ours.rows += noise
        ref.rows += noise
        ours.gate_logit += torch.linspace(-1, 1, 20, dtype=torch.float64)
        ref.gate_logit += torch.linspace(-1, 1, 20, dtype=torch.float64)
    token_ids = torch.randint(0, 12, (30,), generator=g)
    langs = torch.randint(0, 4, (30,), generator=g)
    token_ids[:10] = tok[:10]
    langs[:10] = lang[:10]
    s1 = table[token_ids].clone().requires_grad_(True)
    s2 = s1.detach().clone().requires_grad_(True)
    r = torch.randn(30, 5, dtype=torch.float64, generator=g)
    a = ours(token_ids, langs, s1, use_gate)
    b = ref(token_ids, langs, s2, use_gate)
    torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(ours.penalty(), ref.penalty(), rtol=1e-14, atol=0)
    torch.testing.assert_close(ours.fusion_penalty(), ref.fusion_penalty(), rtol=1e-12, atol=1e-15)
    ((a * r).sum() + 0.3 * ours.penalty() + 0.7 * ours.fusion_penalty()).backward()
    ((b * r).sum() + 0.3 * ref.penalty() + 0.7 * ref.fusion_penalty()).backward()
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(ours.rows.grad.to_dense(), ref.rows.grad, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(ours.gate_logit.grad, ref.gate_logit.grad, rtol=1e-12, atol=1e-13)
    assert list(ours.state_dict()) == ["rows", "gate_logit"]


def test_vocabulary_state_dict_of_another_index_is_refused(index_file, tmp_path):
    """A state dict names its index in its metadata (kept by torch.save): loading
    it into a layer of another index, of the same size or not, is refused and
    leaves the layer as it was; the same index loads, and a dict without the
    name (built by hand) loads as before."""
    import io

    path, lang, tok = index_file
    a = SplitVocabulary(path, 12, 5, 4, dtype=torch.float64)
    with torch.no_grad():
        a.rows.copy_(torch.arange(100, dtype=torch.float64).reshape(20, 5))
        a.gate_logit.fill_(0.5)
    sd = a.state_dict()
    assert list(sd) == ["rows", "gate_logit"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    saved = torch.load(buf)
    # The same pairs but one: row 19 on another (language, token).
    cells = (lang * 12 + tok).numpy()
    free = sorted(set(range(48)) - set(cells.tolist()))
    other = np.sort(np.concatenate([cells[:-1], [free[-1]]]))
    np.savez(tmp_path / "other.npz", language_index=other // 12, token_index=other % 12)
    np.savez(tmp_path / "fewer.npz", language_index=cells[:7] // 12, token_index=cells[:7] % 12)
    for name, n in (("other.npz", 20), ("fewer.npz", 7)):
        b = SplitVocabulary(tmp_path / name, 12, 5, 4, dtype=torch.float64)
        rows, gates = b.rows.detach().clone(), b.gate_logit.detach().clone()
        for state in (sd, saved):
            with pytest.raises(RuntimeError, match=rf"rows: saved by a SplitVocabulary with another index \(20 rows, sha256 [0-9a-f]{{16}}; this layer: {n} rows, sha256 [0-9a-f]{{16}}\): its rows belong to other \(language, token\) pairs"):
                b.load_state_dict(state)
            assert torch.equal(b.rows, rows) and torch.equal(b.gate_logit, gates)
        # Inside a model too, under the model's prefix.
        with pytest.raises(RuntimeError, match=r"emb\.rows: saved by a SplitVocabulary with another index"):
            torch.nn.ModuleDict({"emb": b}).load_state_dict(torch.nn.ModuleDict({"emb": a}).state_dict())
    same = SplitVocabulary(path, 12, 5, 4, dtype=torch.float64)
    same.load_state_dict(saved)
    assert torch.equal(same.rows, a.rows) and torch.equal(same.gate_logit, a.gate_logit)
    # In bf16, and from a dict without metadata.
    half = SplitVocabulary(path, 12, 5, 4, dtype=torch.bfloat16)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in sd.items()})
    assert torch.equal(half.rows, a.rows.to(torch.bfloat16))
    b = SplitVocabulary(tmp_path / "other.npz", 12, 5, 4, dtype=torch.float64)
    b.load_state_dict(dict(sd))
    assert torch.equal(b.rows, a.rows)


def test_vocabulary_rows_gradient_is_sparse_and_sparse_adam_applies(index_file):
    path, lang, tok = index_file
    sv = SplitVocabulary(path, 12, 5, 4)
    shared = torch.zeros(3, 5)
    out = sv(tok[:3], lang[:3], shared)
    out.sum().backward()
    assert sv.rows.grad.is_sparse and sv.rows.grad._indices()[0].tolist() == [0, 1, 2]
    torch.optim.SparseAdam([sv.rows], lr=0.1).step()
    with pytest.raises(OSError, match="No such file or directory"):
        SplitVocabulary(path.parent / "missing.npz", 12, 5, 4)
    with pytest.raises(ValueError, match=r"token id 12 at position \[0\] is out of range 0\.\.12"):
        sv(torch.tensor([12]), torch.tensor([0]), torch.zeros(1, 5))


def test_fusion_penalty_backward_sees_changed_rows(index_file):
    path, _, _ = index_file
    torch.manual_seed(4)
    fused = SplitVocabulary(path, 12, 5, 4, dtype=torch.float64, fused_adam={"lr": 0.05})
    twin = SplitVocabulary(path, 12, 5, 4, dtype=torch.float64, fused_adam={"lr": 0.05})
    for m in (fused, twin):
        with torch.no_grad():
            m.rows.copy_(torch.arange(100, dtype=torch.float64).reshape(20, 5).cos())
    # Two penalties, then their backwards: the first one's fused step moves
    # the rows before the second backward, which must not use the distances
    # its forward saw. The twin runs each backward right after its forward.
    a, b = fused.fusion_penalty(), fused.fusion_penalty()
    a.backward()
    b.backward()
    twin.fusion_penalty().backward()
    twin.fusion_penalty().backward()
    assert torch.equal(fused.rows, twin.rows)
    # A change in place between forward and backward is refused, as torch
    # refuses it for any saved tensor.
    plain = SplitVocabulary(path, 12, 5, 4, dtype=torch.float64)
    p = plain.fusion_penalty()
    with torch.no_grad():
        plain.rows += 1.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        p.backward()


def test_vocabulary_fused_adam_equals_torch_adam(index_file):
    path, lang, tok = index_file
    torch.manual_seed(2)
    plain = SplitVocabulary(path, 12, 5, 4, gate_init=0.1, dtype=torch.float64)
    fused = SplitVocabulary(path, 12, 5, 4, gate_init=0.1, dtype=torch.float64, fused_adam={"lr": 0.02})
    table = torch.randn(12, 5, dtype=torch.float64)
    for m in (plain, fused):
        m.seed_from(table)
        with torch.no_grad():
            m.rows += 0.01 * torch.arange(100, dtype=torch.float64).reshape(20, 5).sin()
    # the fused step is lazy Adam (SparseAdam's update) for the rows, Adam for the gates
    opts = [torch.optim.SparseAdam([plain.rows], lr=0.02), torch.optim.Adam([plain.gate_logit], lr=0.02)]
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        token_ids = torch.randint(0, 12, (16,), generator=g)
        langs = torch.randint(0, 4, (16,), generator=g)
        token_ids[:8], langs[:8] = tok[:8], lang[:8]
        r = torch.randn(16, 5, dtype=torch.float64, generator=g)
        shared = table[token_ids]
        for o in opts:
            o.zero_grad()
        for m in (plain, fused):
            loss = (m(token_ids, langs, shared) * r).sum() + 0.5 * m.penalty() + 0.3 * m.fusion_penalty()
            loss.backward()
        # a dense gradient is one with every row (the fusion penalty reads them all)
        plain.rows.grad = torch.sparse_coo_tensor(
            torch.arange(20)[None], plain.rows.grad.to_dense(), (20, 5), check_invariants=True
        )
        for o in opts:
            o.step()
        assert fused.rows.grad is None and fused.gate_logit.grad is None
    torch.testing.assert_close(fused.rows, plain.rows, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(fused.gate_logit, plain.gate_logit, rtol=1e-9, atol=1e-12)
    rows_state, gate_state = fused.fused_optimizer_state()
    assert int(rows_state["split_vocabulary.rows.step"]) == 3
    assert int(gate_state["split_vocabulary.gate_logit.step"]) == 3


def test_constructed_as_d9d_constructs():
    # d9d's nn.Embedding / nn.Linear splits are initialised at construction:
    # with the same seed the drop-ins hold the same values, not zeros
    D9d = d9d_embeddings()
    torch.manual_seed(11)
    theirs = D9d(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H)
    torch.manual_seed(11)
    ours = SplitTokenEmbeddings(SIZES, ORDER, H)
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k


def test_head_constructed_as_d9d_constructs():
    # d9d's head builds one bias-free nn.Linear per split, in the order of
    # split_vocab_size (its module needs the cut_cross_entropy extra to
    # import, so the same construction stands in for it here)
    torch.manual_seed(12)
    theirs = {s: torch.nn.Linear(H, n, bias=False) for s, n in SIZES.items()}
    torch.manual_seed(12)
    ours = SplitLanguageModellingHead(SIZES, ORDER, H)
    for s, lin in theirs.items():
        assert torch.equal(ours.state_dict()[f"lm_head.{s}.weight"], lin.weight.detach()), s
    assert ours.state_dict()["lm_head.orig.weight"].abs().sum() > 0


def test_vocabulary_fused_state_loads_both_or_neither(index_file):
    path, _, _ = index_file
    v = SplitVocabulary(path, 12, H, 4, fused_adam={"lr": 0.1})
    tokens, langs = torch.tensor([1, 2, 3, 5]), torch.tensor([0, 1, 2, 3])

    def step():
        v(tokens, langs, torch.randn(4, H)).sum().backward()

    step()
    saved = v.fused_optimizer_state()
    step()
    before = v.fused_optimizer_state()
    bad = (saved[0], {k: np.full_like(a, np.nan) if a.ndim else a for k, a in saved[1].items()})
    with pytest.raises(ValueError, match="gate_logit.exp_avg.*non-finite"):
        v.load_fused_optimizer_state(bad)
    after = v.fused_optimizer_state()
    for b, a in zip(before, after):
        assert b.keys() == a.keys() and all(np.array_equal(b[k], a[k]) for k in b)
    v.load_fused_optimizer_state(saved)
    for b, a in zip(saved, v.fused_optimizer_state()):
        assert all(np.array_equal(b[k], a[k]) for k in b)
    with pytest.raises(ValueError, match="rows' state, the gate logits' state"):
        v.load_fused_optimizer_state(saved[0])

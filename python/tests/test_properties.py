"""Property tests (hypothesis) of the splitgrad.torch drop-ins over random
shapes, strides (contiguous, transposed and sliced views of the ids and of
the upstream gradients), dtypes (int32 / int64 ids, float32 / float64),
id ranges and frozen splits: SplitTokenEmbeddings against d9d's module with
the same parameters; the head (d9d's needs its CUDA cross-entropy kernel)
and SplitVocabulary (d9d has none) against numpy references written here
from docs/spec.md §2.2 and §2.3."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the property tests need it")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")

FAST = settings(max_examples=25, deadline=None, derandomize=True)
REALS = [torch.float32, torch.float64]


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}


@st.composite
def splits(draw, smallest=0):
    """split sizes (each ≥ smallest), their order, H and the frozen splits."""
    n = draw(st.integers(1, 3))
    names = [f"s{k}" for k in range(n)]
    sizes = {s: draw(st.integers(smallest, 9)) for s in names}
    if sum(sizes.values()) == 0:
        sizes[names[0]] = 1
    order = draw(st.permutations(names))
    frozen = {s for s in names if draw(st.booleans())}
    return sizes, list(order), draw(st.integers(1, 5)), frozen


def viewed(draw, base):
    """`base` as it is, or an equal non-contiguous view: transposed, or
    sliced out of a larger tensor."""
    kind = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    if kind == "transposed" and base.dim() >= 2:
        v = base.transpose(0, 1).contiguous().transpose(0, 1)
    elif kind == "sliced" and base.numel() > 0:
        big = torch.zeros((*base.shape[:-1], 2 * base.shape[-1] + 1), dtype=base.dtype)
        big[..., 1::2] = base
        v = big[..., 1::2]
    else:
        v = base
    assert torch.equal(v, base)
    return v


@st.composite
def ids_of(draw, high, dtype, allow=()):
    """ids in 0..high (and the values in `allow`) of a random 1- or 2-D shape,
    int32 or int64, as a random kind of view."""
    shape = draw(st.sampled_from([(1,), (5,), (3, 4), (2, 7), (4, 1)]))
    values = st.one_of(st.integers(0, high - 1), *[st.just(a) for a in allow])
    flat = draw(st.lists(values, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return viewed(draw, torch.tensor(flat, dtype=dtype).reshape(shape))


def upstream(draw, shape, dtype):
    seed = draw(st.integers(0, 2**31 - 1))
    r = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    return viewed(draw, r)


# --- SplitTokenEmbeddings against d9d ----------------------------------------


@FAST
@given(cfg=splits(1), data=st.data(), dtype=st.sampled_from(REALS), id_dtype=st.sampled_from([torch.int32, torch.int64]))
def test_embeddings_equal_d9d(cfg, data, dtype, id_dtype):
    d9d = pytest.importorskip("d9d.module.block.embedding", reason="d9d is not installed: no parity test against it")
    sizes, order, h, frozen = cfg  # (d9d's lookup fails on an empty split)
    theirs = d9d.SplitTokenEmbeddings(split_vocab_size=sizes, split_order=order, hidden_size=h).to(dtype)
    with torch.no_grad():
        for w in theirs.parameters():
            w.normal_(generator=torch.Generator().manual_seed(data.draw(st.integers(0, 1000))))
    ours = SplitTokenEmbeddings(sizes, order, h, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    for s in frozen:
        ours.token_embedding[s].weight.requires_grad_(False)
        theirs.token_embedding[s].weight.requires_grad_(False)
    ids = data.draw(ids_of(sum(sizes.values()), id_dtype))
    a = ours(ids)
    b = theirs(ids.to(torch.int64))
    assert a.dtype == dtype and torch.equal(a, b)  # a lookup: the same bits
    assert a.requires_grad == b.requires_grad == (len(frozen) < len(order))
    if not a.requires_grad:
        return
    r = upstream(data.draw, a.shape, dtype)
    a.backward(r)
    b.backward(r)
    for s in order:
        go, gt = ours.token_embedding[s].weight.grad, theirs.token_embedding[s].weight.grad
        if s in frozen:
            assert go is None and gt is None
        elif gt is None:
            assert go is None or not go.to_dense().any()
        else:
            torch.testing.assert_close(go.to_dense(), gt, **tol(dtype))


# --- SplitLanguageModellingHead against spec §2.2 ----------------------------


def head_reference(w, hidden, labels, g):
    """loss_n = ln Σ exp z_n − z_{n,y}, 0 at −100; ∂h = G·W, ∂W = Gᵀ·h with
    G = g_n·(softmax − onehot) (spec §2.2), in float64."""
    h = hidden.reshape(-1, w.shape[1])
    y = labels.reshape(-1)
    z = h @ w.T
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    keep = y != -100
    yy = np.where(keep, y, 0)
    loss = np.where(keep, lse - z[np.arange(len(y)), yy], 0.0)
    p = np.exp(z - lse[:, None])
    p[np.arange(len(y)), yy] -= 1.0
    G = p * (np.where(keep, g.reshape(-1), 0.0))[:, None]
    return loss.reshape(labels.shape), (G @ w).reshape(hidden.shape), G.T @ h


@FAST
@given(cfg=splits(), data=st.data(), dtype=st.sampled_from(REALS), id_dtype=st.sampled_from([torch.int32, torch.int64]))
def test_head_equals_the_spec(cfg, data, dtype, id_dtype):
    sizes, order, h, frozen = cfg
    ours = SplitLanguageModellingHead(sizes, order, h, dtype=dtype)
    for s in frozen:
        ours.lm_head[s].weight.requires_grad_(False)
    v = sum(sizes.values())
    labels = data.draw(ids_of(v, id_dtype, allow=(-100,)))
    hidden = upstream(data.draw, (*labels.shape, h), dtype).requires_grad_(True)
    g = upstream(data.draw, labels.shape, dtype)
    loss = ours(hidden, labels).cross_entropy
    loss.backward(g)
    w = torch.cat([ours.lm_head[s].weight for s in order]).detach().double().numpy()
    ref_loss, ref_gh, ref_gw = head_reference(w, hidden.detach().double().numpy(), labels.numpy(), g.double().numpy())
    t = tol(dtype)
    np.testing.assert_allclose(loss.detach().double().numpy(), ref_loss, rtol=t["rtol"], atol=t["atol"])
    np.testing.assert_allclose(hidden.grad.double().numpy(), ref_gh, rtol=t["rtol"], atol=t["atol"])
    start = 0
    for s in order:
        gw = ours.lm_head[s].weight.grad
        if s in frozen:
            assert gw is None
        elif sizes[s] > 0:
            np.testing.assert_allclose(
                gw.double().numpy(), ref_gw[start : start + sizes[s]], rtol=t["rtol"], atol=t["atol"]
            )
        start += sizes[s]


# --- SplitVocabulary against spec §2.3 ---------------------------------------


def vocabulary_reference(rows, gate_logit, row_of, shared, g, use_gate):
    """out, ∂shared, ∂rows, ∂gate_logit of the gated mix (spec §2.3), float64."""
    gate = 1.0 / (1.0 + np.exp(-gate_logit))
    out, gs = shared.copy(), g.copy()
    grows, ggate = np.zeros_like(rows), np.zeros_like(gate)
    for n, r in enumerate(row_of):
        if r < 0:
            continue
        if use_gate:
            out[n] = shared[n] + gate[r] * (rows[r] - shared[n])
            gs[n] = (1 - gate[r]) * g[n]
            grows[r] += gate[r] * g[n]
            ggate[r] += (g[n] * (rows[r] - shared[n])).sum()
        else:
            out[n] = rows[r]
            gs[n] = 0.0
            grows[r] += g[n]
    return out, gs, grows, gate * (1 - gate) * ggate


@FAST
@given(data=st.data(), dtype=st.sampled_from(REALS), id_dtype=st.sampled_from([torch.int32, torch.int64]))
def test_vocabulary_equals_the_spec(data, dtype, id_dtype, tmp_path_factory):
    v, d, n_lang = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    cells = [(lang, tok) for lang in range(n_lang) for tok in range(v)]
    pairs = data.draw(st.lists(st.sampled_from(cells), min_size=1, max_size=len(cells), unique=True))
    path = tmp_path_factory.mktemp("index") / "index.npz"
    np.savez(path, language_index=np.array([p[0] for p in pairs]), token_index=np.array([p[1] for p in pairs]))
    use_gate = data.draw(st.booleans())
    ours = SplitVocabulary(path, v, d, n_lang, 0.0, dtype=dtype)
    seed = data.draw(st.integers(0, 1000))
    with torch.no_grad():
        ours.rows.normal_(generator=torch.Generator().manual_seed(seed))
        ours.gate_logit.normal_(generator=torch.Generator().manual_seed(seed + 1))
    frozen_gate = data.draw(st.booleans())
    if frozen_gate:
        ours.gate_logit.requires_grad_(False)
    tokens = data.draw(ids_of(v, id_dtype))
    n = tokens.numel()
    tokens = tokens.reshape(-1)
    langs = torch.tensor(data.draw(st.lists(st.integers(0, n_lang - 1), min_size=n, max_size=n)), dtype=id_dtype)
    shared = upstream(data.draw, (n, d), dtype).requires_grad_(True)
    g = upstream(data.draw, (n, d), dtype)
    out = ours(tokens, langs, shared, use_gate)
    out.backward(g)
    where = {p: i for i, p in enumerate(pairs)}
    row_of = [where.get((int(lang), int(tok)), -1) for tok, lang in zip(tokens, langs)]
    ref = vocabulary_reference(
        ours.rows.detach().double().numpy(),
        ours.gate_logit.detach().double().numpy(),
        row_of,
        shared.detach().double().numpy(),
        g.double().numpy(),
        use_gate,
    )
    t = tol(dtype)
    rows_grad = ours.rows.grad
    rows_grad = torch.zeros_like(ours.rows) if rows_grad is None else rows_grad.to_dense()
    got = [out.detach(), shared.grad, rows_grad]
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a.double().numpy(), b, rtol=t["rtol"], atol=t["atol"])
    if frozen_gate:
        assert ours.gate_logit.grad is None
    else:
        np.testing.assert_allclose(ours.gate_logit.grad.double().numpy(), ref[3], rtol=t["rtol"], atol=t["atol"])

"""The drop-ins under autograd's rules: torch.autograd.gradcheck in float64,
inputs changed in place between the forward and the backward refused as
torch refuses them, double backward refused with a message, and no_grad,
inference_mode and torch.compile."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the autograd tests need it")

from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary  # noqa: E402

SIZES = {"orig": 5, "empty": 0, "prompt": 2}
ORDER = ["orig", "empty", "prompt"]
H = 3
D = torch.float64


@pytest.fixture
def index_file(tmp_path):
    path = tmp_path / "index.npz"
    np.savez(path, language_index=np.array([0, 0, 1, 2]), token_index=np.array([1, 4, 4, 6]))
    return path


def embeddings(sparse=True):
    torch.manual_seed(0)
    m = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=D, sparse=sparse)
    m.reset_parameters()
    return m


def head():
    torch.manual_seed(1)
    m = SplitLanguageModellingHead(SIZES, ORDER, H, dtype=D)
    m.reset_parameters()
    return m


def vocabulary(index_file, sparse=True):
    torch.manual_seed(2)
    m = SplitVocabulary(index_file, 7, H, 3, 0.2, dtype=D, sparse=sparse)
    m.seed_from(torch.randn(7, H, dtype=D))
    with torch.no_grad():
        m.rows.add_(torch.randn_like(m.rows))  # away from the centroids: the fusion penalty is smooth there
        m.gate_logit.add_(torch.randn_like(m.gate_logit))
    return m


IDS = torch.tensor([[0, 5, 6, 4], [6, 6, 1, 0]])
LABELS = torch.tensor([0, 6, -100, 3, 5])
TOKENS = torch.tensor([1, 4, 4, 6, 2, 1])
LANGS = torch.tensor([0, 1, 0, 2, 1, 2])


def _gradcheck(fn, inputs):
    # gradcheck takes dense gradients of non-empty, non-overlapping inputs:
    # the layers are built with sparse=False here, and the empty split stays out.
    inputs = [x for x in inputs if x.numel() > 0]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


def _weights(m, attr):
    return [getattr(m, attr)[s].weight for s in ORDER]


def test_gradcheck_embeddings():
    m = embeddings(sparse=False)
    weights = _weights(m, "token_embedding")
    r = torch.randn(*IDS.shape, H, dtype=D)

    def fn(*ws):  # the layer reads its own parameters, which gradcheck perturbs in place
        return (m(IDS) * r).sum()

    _gradcheck(fn, weights)


@pytest.mark.parametrize("reduce", ["per_token", "sum", "forward_sum"])
def test_gradcheck_head(reduce):
    m = head()
    hidden = torch.randn(len(LABELS), H, dtype=D, requires_grad=True)
    weights = _weights(m, "lm_head")
    w = torch.rand(len(LABELS), dtype=D) + 0.5

    def fn(h, *ws):
        if reduce == "forward_sum":
            return m.forward_sum(h, LABELS)
        ce = m(h, LABELS).cross_entropy
        return ce.sum() if reduce == "sum" else (ce * w).sum()

    _gradcheck(fn, [hidden, *weights])


@pytest.mark.parametrize("use_gate", [True, False])
def test_gradcheck_vocabulary(index_file, use_gate):
    m = vocabulary(index_file, sparse=False)
    shared = torch.randn(len(TOKENS), H, dtype=D, requires_grad=True)
    r = torch.randn(len(TOKENS), H, dtype=D)

    def fn(s, rows, gate_logit):
        return (m(TOKENS, LANGS, s, use_gate=use_gate) * r).sum()

    _gradcheck(fn, [shared, m.rows, m.gate_logit])


def test_gradcheck_penalties(index_file):
    m = vocabulary(index_file)
    _gradcheck(lambda rows: m.fusion_penalty(), [m.rows])
    _gradcheck(lambda g: m.penalty(), [m.gate_logit])


def test_gradcheck_fused_penalty_runs_the_kernel_penalty(index_file):
    # in fused mode the penalty is the kernels' own function; its value
    # agrees with torch's formula
    m = SplitVocabulary(index_file, 7, H, 3, 0.2, dtype=D, fused_adam={"lr": 1e-3})
    assert torch.allclose(m.penalty(), torch.sigmoid(m.gate_logit).mean())


INPLACE = {
    "embeddings ids": lambda f: _inplace_embeddings(),
    "head hidden": lambda f: _inplace_head("hidden"),
    "head labels": lambda f: _inplace_head("labels"),
    "vocabulary tokens": lambda f: _inplace_vocabulary(f, "tokens"),
    "vocabulary shared": lambda f: _inplace_vocabulary(f, "shared"),
}


def _inplace_embeddings():
    m, ids = embeddings(), IDS.clone()
    out = m(ids)
    ids[0, 0] = 6
    out.sum().backward()


def _inplace_head(which):
    m = head()
    hidden = torch.randn(len(LABELS), H, dtype=D, requires_grad=True)
    h, labels = hidden * 1.0, LABELS.clone()
    loss = (m(h, labels).cross_entropy * torch.arange(len(LABELS), dtype=D)).sum()
    with torch.no_grad():
        if which == "hidden":
            h.add_(1.0)
        else:
            labels[0] = 1
    loss.backward()


def _inplace_vocabulary(index_file, which):
    m = vocabulary(index_file)
    tokens, shared = TOKENS.clone(), torch.randn(len(TOKENS), H, dtype=D, requires_grad=True)
    s = shared * 1.0
    out = m(tokens, LANGS, s)
    with torch.no_grad():
        if which == "tokens":
            tokens[0] = 2
        else:
            s.add_(1.0)
    out.sum().backward()


@pytest.mark.parametrize("case", sorted(INPLACE))
def test_inputs_changed_in_place_before_the_backward_are_refused(case, index_file):
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        INPLACE[case](index_file)


def test_numpy_ids_are_copied_for_the_backward():
    m = embeddings()
    ids = IDS.numpy().copy()
    out = m(ids)
    ids[0, 0] = 6  # the backward still sends the gradient to the forward's ids
    out.sum().backward()
    g = m.token_embedding["orig"].weight.grad.to_dense()
    ref = embeddings()
    ref(IDS).sum().backward()
    assert torch.equal(g, ref.token_embedding["orig"].weight.grad.to_dense())


def test_double_backward_is_refused_with_a_message():
    m = head()
    hidden = torch.randn(len(LABELS), H, dtype=D, requires_grad=True)
    loss = m(hidden, LABELS).cross_entropy.sum()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, hidden, create_graph=True)


def test_no_grad_and_inference_mode_give_the_same_outputs(index_file):
    e, h, v = embeddings(), head(), vocabulary(index_file)
    hidden = torch.randn(len(LABELS), H, dtype=D)
    shared = torch.randn(len(TOKENS), H, dtype=D)
    ref = (e(IDS), h(hidden, LABELS).cross_entropy, v(TOKENS, LANGS, shared))
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            got = (e(IDS), h(hidden, LABELS).cross_entropy, v(TOKENS, LANGS, shared))
        for a, b in zip(ref, got):
            assert not b.requires_grad
            assert torch.equal(a.detach(), b)


def test_torch_compile_runs_the_drop_ins():
    pytest.importorskip("torch._dynamo")
    m = embeddings()
    r = torch.randn(*IDS.shape, H, dtype=D)

    def step(ids):
        return (m(ids) * r).sum()

    compiled = torch.compile(step, backend="eager")  # a graph break around the kernels is fine
    eager = step(IDS)
    got = compiled(IDS)
    assert torch.equal(eager, got)
    got.backward()
    assert m.token_embedding["orig"].weight.grad is not None


def test_sparse_false_gives_the_dense_gradient_of_the_sparse_one(index_file):
    a, b = embeddings(), embeddings(sparse=False)
    r = torch.randn(*IDS.shape, H, dtype=D)
    (a(IDS) * r).sum().backward()
    (b(IDS) * r).sum().backward()
    for s in ORDER:
        ga, gb = a.token_embedding[s].weight.grad, b.token_embedding[s].weight.grad
        assert ga.is_sparse and not gb.is_sparse
        assert torch.equal(ga.to_dense(), gb)
    va, vb = vocabulary(index_file), vocabulary(index_file, sparse=False)
    shared = torch.randn(len(TOKENS), H, dtype=D)
    va(TOKENS, LANGS, shared).sum().backward()
    vb(TOKENS, LANGS, shared).sum().backward()
    assert va.rows.grad.is_sparse and not vb.rows.grad.is_sparse
    assert torch.equal(va.rows.grad.to_dense(), vb.rows.grad)


def test_a_backward_pass_that_raises_leaves_no_fused_step_pending():
    # A function upstream of the vocabulary raises in its backward after the
    # layer has queued its step: that step goes with the pass, and the next
    # passes step the rows again on their own gradients.
    import numpy as np
    import torch
    from splitgrad.torch import SplitVocabulary

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("upstream")

    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "index.npz")
        np.savez(path, language_index=np.array([0, 1]), token_index=np.array([1, 2]))
        sv = SplitVocabulary(path, 4, 3, 2, gate_init=0.5, fused_adam={"lr": 0.1})
    tok, lang = torch.tensor([1, 2, 1]), torch.tensor([0, 1, 1])
    shared = torch.randn(3, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="upstream"):
        sv(tok, lang, Boom.apply(shared)).sum().backward()
    for _ in range(3):
        before = sv.rows.detach().clone()
        sv(tok, lang, shared).square().sum().backward()
        assert not torch.equal(sv.rows.detach(), before), "the rows did not move"
    import copy
    copy.deepcopy(sv)

"""copy.deepcopy, pickle and torch.save/torch.load of every layer: the copy
has the same parameters, trainable flags, fused optimiser state and
configuration, and is independent of the original (a step on one never
moves the other)."""

import copy
import io
import pickle

import numpy as np
import pytest

import splitgrad as sg

SIZES = {"orig": 6, "special": 0, "prompt": 3}
ORDER = ["orig", "special", "prompt"]
H = 4


def _numpy_layers():
    e = sg.SplitTokenEmbeddings(SIZES, ORDER, H, dtype="float64")
    e.reset_parameters(1)
    e.set_parameter_trainable("token_embedding.orig.weight", False)
    h = sg.SplitLanguageModellingHead(SIZES, ORDER, H)
    h.reset_parameters(2)
    v = sg.SplitVocabulary(np.array([0, 1, 1]), np.array([2, 2, 5]), 9, H, 2, 0.5, score=[0.1, 0.2, 0.3])
    v.seed_from(np.arange(9 * H, dtype=np.float32).reshape(9, H))
    return [e, h, v]


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and np.array_equal(sa[k], sb[k]), k


COPIES = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
}


@pytest.mark.parametrize("how", sorted(COPIES))
@pytest.mark.parametrize("which", [0, 1, 2], ids=["embeddings", "head", "vocabulary"])
def test_numpy_layer_copies_are_equal_and_independent(how, which):
    layer = _numpy_layers()[which]
    dup = COPIES[how](layer)
    assert type(dup) is type(layer) and dup is not layer
    _same_state(layer, dup)
    assert dup.dtype == layer.dtype
    for name in layer.parameter_names():
        assert dup.is_trainable(name) == layer.is_trainable(name), name
    # independent: writing the copy's buffer leaves the original alone
    name = layer.parameter_names()[-1]
    before = layer.parameter(name).copy()
    dup.parameter(name)[...] += 1
    assert np.array_equal(layer.parameter(name), before)


torch = pytest.importorskip("torch", reason="torch is not installed: the drop-ins' copy tests need it")
from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary  # noqa: E402


def _torch_save_load(x):
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


TORCH_COPIES = dict(COPIES, torch_save=_torch_save_load)


@pytest.fixture
def index_file(tmp_path):
    path = tmp_path / "index.npz"
    np.savez(path, language_index=np.array([0, 0, 1, 2]), token_index=np.array([1, 4, 4, 7]))
    return path


def _embeddings(_):
    torch.manual_seed(0)
    m = SplitTokenEmbeddings({"orig": 10, "prompt": 3}, ["orig", "prompt"], H, fused_adam={"lr": 0.05})
    m.reset_parameters()
    m.token_embedding["orig"].weight.requires_grad_(False)
    return m


def _embeddings_step(m):
    ids = torch.tensor([[0, 10, 12, 11], [12, 3, 10, 10]])
    r = torch.linspace(-1, 1, ids.numel() * H).reshape(*ids.shape, H)
    (m(ids) * r).sum().backward()


def _vocabulary(index_file):
    torch.manual_seed(0)
    m = SplitVocabulary(index_file, 9, H, 3, 0.3, fused_adam={"lr": 0.05})
    m.seed_from(torch.randn(9, H))
    return m


def _vocabulary_step(m):
    t = torch.tensor([1, 4, 4, 7, 2])
    lang = torch.tensor([0, 1, 0, 2, 1])
    shared = torch.linspace(-1, 1, 5 * H).reshape(5, H)
    (m(t, lang, shared) ** 2).sum().add(m.penalty()).add(m.fusion_penalty()).backward()


def _head(_):
    torch.manual_seed(0)
    m = SplitLanguageModellingHead({"orig": 10, "prompt": 3}, ["orig", "prompt"], H)
    m.reset_parameters()
    return m


def _head_step(m):
    hidden = torch.linspace(-1, 1, 5 * H).reshape(5, H)
    labels = torch.tensor([0, 12, -100, 3, 10])
    m(hidden, labels).cross_entropy.sum().backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.1 * p.grad
            p.grad = None


DROP_INS = {
    "embeddings": (_embeddings, _embeddings_step),
    "vocabulary": (_vocabulary, _vocabulary_step),
    "head": (_head, _head_step),
}


def _states_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _fused_equal(a, b):
    fa, fb = getattr(a, "fused_optimizer_state", lambda: None)(), getattr(b, "fused_optimizer_state", lambda: None)()
    assert (fa is None) == (fb is None)
    if fa is None:
        return
    fa = fa if isinstance(fa, tuple) else (fa,)
    fb = fb if isinstance(fb, tuple) else (fb,)
    for x, y in zip(fa, fb):
        assert sorted(x) == sorted(y)
        for k in x:
            assert np.asarray(x[k]).dtype == np.asarray(y[k]).dtype and np.array_equal(x[k], y[k]), k


@pytest.mark.parametrize("how", sorted(TORCH_COPIES))
@pytest.mark.parametrize("which", sorted(DROP_INS))
def test_drop_in_copies_train_like_the_original_and_apart_from_it(how, which, index_file):
    make, step = DROP_INS[which]
    a = make(index_file)
    step(a)  # the fused optimiser (where there is one) has state now
    b = TORCH_COPIES[how](a)
    assert type(b) is type(a)
    _states_equal(a, b)
    _fused_equal(a, b)
    assert [p.requires_grad for p in a.parameters()] == [p.requires_grad for p in b.parameters()]
    # the same next step on both, then on the copy alone
    step(a)
    step(b)
    _states_equal(a, b)
    _fused_equal(a, b)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    step(b)
    for k, v in a.state_dict().items():
        assert torch.equal(v, before[k]), f"a step on the copy moved the original's {k}"
    assert any(not torch.equal(v, before[k]) for k, v in b.state_dict().items())


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("dtype", [None, "bfloat16", "float16"])
def test_a_copy_keeps_non_finite_values_and_a_checkpoint_refuses_them(how, dtype, tmp_path):
    # A copy reproduces its layer, NaN and infinities included; a checkpoint
    # (whose load refuses them) is refused before anything is written, and
    # the file already there stays as it was.
    for layer in _numpy_layers():
        if dtype is not None:
            layer.set_dtype(dtype)
        name = layer.parameter_names()[0]
        p = layer.parameter(name)
        if p.dtype == np.uint16:  # bf16 bits
            p.reshape(-1)[:2] = [0x7F80, 0x7FC0]  # +inf, NaN
        else:
            p.reshape(-1)[:2] = [np.inf, np.nan]
        c = COPIES[how](layer)
        assert np.array_equal(c.parameter(name), p, equal_nan=p.dtype != np.uint16), (type(layer).__name__, name)
        path = tmp_path / "ck.safetensors"
        path.write_bytes(b"an earlier checkpoint")
        with pytest.raises(ValueError, match=f"{name}.*non-finite value inf at position .*nothing was written"):
            sg.save_checkpoint(path, [layer])
        assert path.read_bytes() == b"an earlier checkpoint"

"""The drop-ins with parameters kept in bf16 or f16 (docs/spec.md, the Python
section): construction and ``.to()``, zero-copy half-precision buffers,
activations in the layer's dtype equal to the f32 layer on the widened values
rounded once, d9d's state dicts in bf16, the fused Adam's rounding and state
dtype, checkpoints, and the errors."""

import copy
import pickle
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the splitgrad.torch tests need it")

import splitgrad  # noqa: E402
import splitgrad.torch as sgt  # noqa: E402
from splitgrad import _splitgrad as sg  # noqa: E402
from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary  # noqa: E402

SIZES = {"orig": 10, "special": 3, "prompt": 2}
ORDER = ["orig", "special", "prompt"]
H = 4
HALF = [torch.bfloat16, torch.float16]
NAMES = [f"token_embedding.{s}.weight" for s in ORDER]


def ids_batch(seed=0, shape=(3, 7)):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, sum(SIZES.values()), shape, generator=g)


def widened_twin(layer):
    """An f32 layer holding ``layer``'s half-precision values, widened."""
    twin = type(layer)(SIZES, ORDER, H)
    twin.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    return twin


def bits(t):
    return t.view(torch.int16) if t.dtype in HALF else t.view(torch.int32)


# --- construction, buffers, memory -------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cls", [SplitTokenEmbeddings, SplitLanguageModellingHead])
def test_constructed_in_half_precision_over_the_kernels_own_buffer(cls, dtype):
    full = cls(SIZES, ORDER, H)
    half = cls(SIZES, ORDER, H, dtype=dtype)
    assert half._core.param_dtype == {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    assert half.parameter_bytes * 2 == full.parameter_bytes == 4 * H * sum(SIZES.values())
    for (name, p), (_, q) in zip(half.named_parameters(), full.named_parameters()):
        assert p.dtype == dtype and p.untyped_storage().nbytes() * 2 == q.untyped_storage().nbytes()
        view = half._core.parameter(name)
        assert p.data_ptr() == view.ctypes.data  # no copy: the kernels' buffer
    # a write through torch is what the kernels read
    name, p = next(iter(half.named_parameters()))
    with torch.no_grad():
        p.fill_(0.5)
    kernels = half._core.state_dict()[name]  # a copy the kernels make of their own buffer
    assert np.array_equal(kernels.view(np.uint16), p.detach().view(torch.int16).numpy().view(np.uint16))
    if cls is SplitTokenEmbeddings:
        assert torch.equal(half(torch.tensor([0]))[0], torch.full((H,), 0.5, dtype=dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_to_and_back_keeps_the_parameter_objects_and_rounds_to_nearest(dtype):
    ours = SplitTokenEmbeddings(SIZES, ORDER, H)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    params = list(ours.parameters())
    opt = torch.optim.SparseAdam(ours.parameters(), lr=0.1)
    assert (ours.half() if dtype == torch.float16 else ours.bfloat16()) is ours
    assert list(ours.parameters()) == params  # the same objects, over new buffers
    assert ours.parameter_bytes == 2 * H * sum(SIZES.values())
    for k, v in ours.state_dict().items():
        assert v.dtype == dtype and torch.equal(v, before[k].to(dtype)), k
    for name, p in zip(NAMES, ours._weights()):
        assert p.data_ptr() == ours._core.parameter(name).ctypes.data
    ids = ids_batch()
    ours(ids).float().sum().backward()
    opt.step()  # torch's optimiser still holds the parameters
    moved = {k: v.clone() for k, v in ours.state_dict().items()}
    ours.to(torch.float32)
    for k, v in ours.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, moved[k].float()), k
    assert torch.equal(ours(ids), widened_twin(ours)(ids))


def test_refused_conversions_leave_the_layer_as_it_was():
    ours = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(TypeError, match="build it with dtype=torch.float64"):
        ours.double()
    with pytest.raises(TypeError, match="float32, float64, bfloat16 or float16, not torch.int32"):
        SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.int32)
    with pytest.raises(ValueError, match="dtype"):
        ours._core.set_dtype("int8")
    with pytest.raises(ValueError, match="f64"):
        ours._core.set_dtype("float64")
    for k, v in ours.state_dict().items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, before[k])
    assert ours(ids_batch()).dtype == torch.bfloat16


def test_old_numpy_views_stay_readable_after_a_change_of_dtype():
    core = sg.SplitTokenEmbeddings(SIZES, ORDER, H)
    core.reset_parameters(3)
    old = core.parameter(NAMES[0])
    kept = old.copy()
    core.set_dtype("bf16")
    del core
    assert np.array_equal(old, kept)  # the retired buffer lives while its view does
    old[0, 0] = 7.0  # and is writable, touching nothing the layer uses


# --- values: the f32 layer on the widened values, rounded once ---------------


@pytest.mark.parametrize("dtype", HALF)
def test_embeddings_outputs_and_gradients_equal_the_f32_layer_on_widened_values(dtype):
    torch.manual_seed(1)
    half = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=dtype)
    full = widened_twin(half)
    ids = ids_batch(2)
    a, b = half(ids), full(ids)
    assert a.dtype == dtype and torch.equal(a, b.to(dtype))
    assert torch.equal(a.float(), b)  # a gather of half values is exact
    up = torch.randn(a.shape).to(dtype)
    a.backward(up)
    b.backward(up.float())
    for p, q in zip(half._weights(), full._weights()):
        assert p.grad.is_sparse and p.grad.dtype == dtype
        assert torch.equal(p.grad.to_dense(), q.grad.to_dense().to(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_head_losses_and_gradients_equal_the_f32_head_rounded_once(dtype):
    torch.manual_seed(2)
    half = SplitLanguageModellingHead(SIZES, ORDER, H, dtype=dtype)
    full = widened_twin(half)
    hidden = torch.randn(9, H).to(dtype)
    labels = torch.randint(0, 15, (9,))
    labels[3] = -100
    h1, h2 = hidden.clone().requires_grad_(True), hidden.float().requires_grad_(True)
    a, b = half(h1, labels).cross_entropy, full(h2, labels).cross_entropy
    assert a.dtype == dtype and torch.equal(a, b.to(dtype))
    up = torch.randn(9).to(dtype)
    a.backward(up)
    b.backward(up.float())
    assert h1.grad.dtype == dtype and torch.equal(h1.grad, h2.grad.to(dtype))
    for p, q in zip(half._weights(), full._weights()):
        assert p.grad.dtype == dtype and torch.equal(p.grad, q.grad.to(dtype))
    # the summed loss (one upstream gradient for every token): the summed kernel
    s1 = half.forward_sum(hidden, labels)
    s2 = full.forward_sum(hidden.float(), labels)
    assert s1.dtype == dtype and torch.equal(s1, s2.to(dtype))


@pytest.fixture
def index_file(tmp_path):
    rng = np.random.default_rng(0)
    cells = np.sort(rng.choice(4 * 12, size=20, replace=False))
    lang, tok = cells // 12, cells % 12
    path = tmp_path / "index.npz"
    np.savez(path, language_index=lang, token_index=tok)
    return path, torch.from_numpy(lang), torch.from_numpy(tok)


@pytest.mark.parametrize("dtype", HALF)
def test_vocabulary_in_half_precision_equals_the_f32_layer_rounded_once(index_file, dtype):
    path, lang, tok = index_file
    g = torch.Generator().manual_seed(4)
    table = torch.randn(12, 5, generator=g).to(dtype)
    half = SplitVocabulary(path, 12, 5, 4, gate_init=0.3, dtype=dtype)
    half.seed_from(table)  # rows copied from a table of the same precision: exact
    assert half.rows.dtype == dtype and torch.equal(half.rows, table[tok])
    with torch.no_grad():
        half.rows += (0.1 * torch.randn(20, 5, generator=g)).to(dtype)
    full = SplitVocabulary(path, 12, 5, 4, gate_init=0.3)
    full.load_state_dict({k: v.float() for k, v in half.state_dict().items()})
    ids = torch.randint(0, 12, (30,), generator=g)
    langs = torch.randint(0, 4, (30,), generator=g)
    ids[:10], langs[:10] = tok[:10], lang[:10]
    s1 = table[ids].clone().requires_grad_(True)
    s2 = s1.detach().float().requires_grad_(True)
    a, b = half(ids, langs, s1), full(ids, langs, s2)
    assert a.dtype == dtype and torch.equal(a, b.to(dtype))
    up = torch.randn(30, 5, generator=g).to(dtype)
    (a.float() * up.float()).sum().backward()
    (b * up.float()).sum().backward()
    assert s1.grad.dtype == dtype and torch.equal(s1.grad, s2.grad.to(dtype))
    assert half.rows.grad.is_sparse and half.rows.grad.dtype == dtype
    assert torch.equal(half.rows.grad.to_dense(), full.rows.grad.to_dense().to(dtype))
    assert torch.equal(half.gate_logit.grad, full.gate_logit.grad.to(dtype))
    fp1, fp2 = half.fusion_penalty(), full.fusion_penalty()
    assert fp1.dtype == dtype and torch.equal(fp1, fp2.to(dtype))


@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_vocabulary_fused_adam_in_bf16_trains(index_file, rounding):
    path, lang, tok = index_file
    sv = SplitVocabulary(
        path, 12, 5, 4, dtype=torch.bfloat16,
        fused_adam={"lr": 0.05, "state_dtype": "bf16", "rounding": rounding, **({"seed": 3} if rounding == "stochastic" else {})},
    )
    sv.seed_from(torch.randn(12, 5, dtype=torch.bfloat16))
    rows0 = sv.rows.detach().clone()
    for _ in range(3):
        out = sv(tok[:6], lang[:6], torch.zeros(6, 5, dtype=torch.bfloat16))
        (out.float().pow(2).sum() + 0.1 * sv.penalty() + 0.1 * sv.fusion_penalty()).backward()
    assert sv.rows.grad is None and not torch.equal(sv.rows, rows0)
    state = sv.fused_optimizer_state()
    assert state[0]["split_vocabulary.rows.exp_avg"].dtype == np.uint16  # bf16 bits


# --- d9d's module in bf16 -----------------------------------------------------


def test_d9d_in_bf16_loads_our_state_dict_and_ours_loads_theirs():
    mod = pytest.importorskip("d9d.module.block.embedding", reason="d9d is not installed: no parity test against it")
    theirs = mod.SplitTokenEmbeddings(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H).to(torch.bfloat16)
    ours = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    for k, v in theirs.state_dict().items():
        assert ours.state_dict()[k].dtype == torch.bfloat16 and torch.equal(ours.state_dict()[k], v), k
    ids = ids_batch(5)
    assert torch.equal(ours(ids), theirs(ids))
    # and back: d9d takes what our kernels trained
    opt = torch.optim.SparseAdam(ours.parameters(), lr=0.1)
    ours(ids).float().square().sum().backward()
    opt.step()
    back = mod.SplitTokenEmbeddings(split_vocab_size=SIZES, split_order=ORDER, hidden_size=H).to(torch.bfloat16)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back(ids), ours(ids))
    # the kernels' own state dict names the same BF16 tensors (as their bits)
    core = ours._core.state_dict()
    for k, v in back.state_dict().items():
        assert core[k].dtype == np.uint16 and np.array_equal(core[k], v.view(torch.int16).numpy().view(np.uint16))


# --- the fused Adam: stochastic rounding and the state's dtype ----------------


def stall_run(dtype, rounding=None, steps=150, lr=1e-4):
    """Every update (≈ lr) is below half an ulp of the weights (1.0)."""
    cfg = {"lr": lr}
    if rounding is not None:
        cfg["rounding"] = rounding
    sizes, order = {"orig": 64}, ["orig"]
    layer = SplitTokenEmbeddings(sizes, order, 64, dtype=dtype, fused_adam=cfg)
    with torch.no_grad():
        layer.token_embedding["orig"].weight.fill_(1.0)
    ids = torch.arange(64)
    for _ in range(steps):
        layer(ids).float().sum().backward()  # every gradient is 1: each step moves every weight by −lr
    return layer.token_embedding["orig"].weight.detach().float()


def test_fused_adam_nearest_stalls_where_stochastic_rounding_follows_f32():
    f32 = stall_run(torch.float32)
    nearest = stall_run(torch.bfloat16, "nearest")
    sr = stall_run(torch.bfloat16)  # the default: stochastic
    drift = 1.0 - f32.mean().item()
    assert 0.014 < drift < 0.016  # ≈ 150 · 1e-4
    assert torch.equal(nearest, torch.ones_like(nearest))  # every update lost
    # unbiased: the mean of 4096 weights follows f32 (each one's spread after
    # 150 stores is under 0.04, so the mean's is under 0.001)
    assert abs(sr.mean().item() - f32.mean().item()) < 0.004
    assert sr.std().item() > 0  # the stores did round both ways


def test_stochastic_rounding_is_a_function_of_the_seed():
    def run(seed):
        layer = SplitTokenEmbeddings(
            {"orig": 8}, ["orig"], 16, dtype=torch.bfloat16, fused_adam={"lr": 1e-3, "seed": seed}
        )
        with torch.no_grad():
            layer.token_embedding["orig"].weight.fill_(1.0)
        for _ in range(5):
            layer(torch.arange(8)).float().sum().backward()
        return layer.token_embedding["orig"].weight.detach().clone()

    a, b, c = run(1), run(1), run(2)
    assert torch.equal(bits(a), bits(b)) and not torch.equal(bits(a), bits(c))


def test_fused_state_in_bf16_saves_and_loads():
    cfg = {"lr": 0.01, "state_dtype": torch.bfloat16}
    a = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, fused_adam=cfg)
    ids = ids_batch()
    a(ids).float().sum().backward()
    state = a.fused_optimizer_state()
    assert a._fused.state_dtype == "bfloat16" and a._fused.rounding == ("stochastic", 0)
    assert state["token_embedding.orig.weight.exp_avg"].dtype == np.uint16
    b = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, fused_adam=cfg)
    b.load_state_dict(a.state_dict())
    b.load_fused_optimizer_state(state)
    a(ids).float().sum().backward()
    b(ids).float().sum().backward()
    for k, v in a.state_dict().items():
        assert torch.equal(bits(b.state_dict()[k]), bits(v)), k
    # a state kept in f32 loads into an optimiser keeping bf16, converted
    c = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, fused_adam={"lr": 0.01})
    c(ids).float().sum().backward()
    b.load_fused_optimizer_state(c.fused_optimizer_state())
    assert all(v.dtype == np.uint16 for k, v in b.fused_optimizer_state().items() if not k.endswith(".step"))
    # a bad entry is refused, naming it, and nothing changes
    bad = dict(state)
    bad["token_embedding.orig.weight.exp_avg_sq"] = np.full_like(state["token_embedding.orig.weight.exp_avg_sq"], 0xBF80)
    before = b.fused_optimizer_state()
    with pytest.raises(ValueError, match="exp_avg_sq"):
        b.load_fused_optimizer_state(bad)  # −1.0 in bf16: a second moment must be ≥ 0
    for k, v in b.fused_optimizer_state().items():
        assert np.array_equal(v, before[k]), k


def test_fused_adam_option_errors():
    for bad, err in [
        ({"lr": 0.1, "state_dtype": torch.float16}, ValueError),
        ({"lr": 0.1, "state_dtype": "int8"}, ValueError),
        ({"lr": 0.1, "rounding": "up"}, ValueError),
        ({"lr": 0.1, "seed": -1}, ValueError),
        ({"lr": 0.1, "state_dtype": 3}, TypeError),
        ({"lr": 0.1, "momentum": 0.9}, TypeError),
    ]:
        with pytest.raises(err):
            SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, fused_adam=bad)


# --- checkpoints, copies, sharding -------------------------------------------


def test_checkpoint_of_a_bf16_layer_and_its_bf16_optimizer(tmp_path):
    layer = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16)
    opt = sg.Optimizer.lazy_adam(0.01)
    opt.set_state_dtype("bf16")
    opt.step(layer, layer._core.backward(ids_batch().numpy(), np.ones((3, 7, H), np.float32)))
    path = tmp_path / "ckpt.safetensors"
    splitgrad.save_checkpoint(path, [layer], opt)
    other = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16)
    opt2 = sg.Optimizer.lazy_adam(0.01)
    opt2.set_state_dtype("bf16")
    splitgrad.load_checkpoint(path, [other], opt2)
    for k, v in layer.state_dict().items():
        assert torch.equal(bits(other.state_dict()[k]), bits(v)), k
    for k, v in opt.state_dict().items():
        assert np.array_equal(opt2.state_dict()[k], v), k
    with pytest.raises(ValueError, match="BF16"):
        splitgrad.load_checkpoint(path, [SplitTokenEmbeddings(SIZES, ORDER, H)])  # an f32 layer: refused


@pytest.mark.parametrize("dtype", HALF)
def test_copies_keep_the_dtype(dtype):
    layer = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=dtype, fused_adam={"lr": 0.01, "rounding": "nearest"})
    layer(ids_batch()).float().sum().backward()
    twin = copy.deepcopy(layer)
    assert twin._core.param_dtype == layer._core.param_dtype and twin._fused.rounding == ("nearest", None)
    for k, v in layer.state_dict().items():
        assert torch.equal(bits(twin.state_dict()[k]), bits(v))
    assert twin.token_embedding["orig"].weight.data_ptr() == twin._core.parameter(NAMES[0]).ctypes.data


# --- errors, never a crash ----------------------------------------------------


def test_bad_dtypes_raise_python_errors():
    layer = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16)
    ids = ids_batch()
    # a float64 upstream gradient: torch's autograd casts it to the output's
    # dtype before the layer's backward sees it, as for its own layers
    up = torch.randn(3, 7, H, dtype=torch.float64)
    layer(ids).backward(up)
    g64 = [p.grad.to_dense() for p in layer._weights()]
    layer.zero_grad(set_to_none=True)
    layer(ids).backward(up.to(torch.bfloat16))
    assert all(torch.equal(a, p.grad.to_dense()) for a, p in zip(g64, layer._weights()))
    with pytest.raises(ValueError, match="expected torch.bfloat16"):
        sgt._grad_in(layer, up, "grad_output")  # what the backward checks, were one to reach it
    with pytest.raises(ValueError, match="integer"):
        layer(ids.float())
    core = layer._core
    with pytest.raises(ValueError, match="float64"):
        core.backward(ids.numpy(), np.ones((3, 7, H)))  # the kernels take float32
    with pytest.raises(ValueError, match="dtype"):
        core.backward(ids.numpy(), np.ones((3, 7, H), np.int32))
    with pytest.raises(ValueError, match="BF16"):
        core.load_state_dict({n: np.zeros(s, np.float32) for n, s in zip(NAMES, layer._shapes)})
    head = SplitLanguageModellingHead(SIZES, ORDER, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        head(torch.randn(3, H), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="Sgd"):
        sg.Optimizer.sgd(0.1).step(core, core.backward(ids.numpy(), np.ones((3, 7, H), np.float32)))
    with pytest.raises(ValueError, match="unknown dtype"):
        sg.Optimizer.lazy_adam(0.1).set_state_dtype("float8")
    with pytest.raises(ValueError):
        sg.Optimizer.lazy_adam(0.1).set_rounding("down")
    # A seed with nearest rounding would draw nothing.
    with pytest.raises(ValueError, match=r"fused_adam: seed 3 draws the random bits of stochastic rounding, and rounding 'nearest' draws none: leave the seed out"):
        SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, fused_adam={"rounding": "nearest", "seed": 3})
    seeded = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, fused_adam={"seed": 3})
    assert seeded._fused.rounding == ("stochastic", 3)


# --- a property over random sizes ---------------------------------------------

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    sizes=hst.lists(hst.integers(0, 9), min_size=1, max_size=3),
    hidden=hst.integers(1, 9),
    n=hst.integers(0, 12),
    half=hst.sampled_from(HALF),
    seed=hst.integers(0, 2**31),
)
def test_converted_layer_equals_the_f32_layer_on_widened_values(sizes, hidden, n, half, seed):
    names = [f"s{i}" for i in range(len(sizes))]
    split = dict(zip(names, sizes))
    torch.manual_seed(seed)
    full = SplitTokenEmbeddings(split, names, hidden)
    layer = copy.deepcopy(full).to(half)
    for k, v in full.state_dict().items():
        assert torch.equal(layer.state_dict()[k], v.to(half))
    full.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    total = sum(sizes)
    ids = torch.randint(0, max(total, 1), (n,)) if total else torch.zeros(0, dtype=torch.int64)
    a, b = layer(ids), full(ids)
    assert a.dtype == half and torch.equal(a.float(), b)
    up = torch.randn(n, hidden).to(half)
    a.backward(up)
    b.backward(up.float())
    for p, q in zip(layer._weights(), full._weights()):
        if q.grad is None:
            assert p.grad is None
        else:
            assert p.grad.dtype == half and torch.equal(p.grad.to_dense(), q.grad.to_dense().to(half))


# --- the numpy classes' half-precision activations (act=) ---------------------


def to_half_np(a, dtype):
    t = torch.from_numpy(a).to(dtype)
    return t.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("dtype", HALF)
def test_numpy_layers_take_and_return_half_activations(dtype, index_file):
    act = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    core = sg.SplitTokenEmbeddings(SIZES, ORDER, H)
    core.reset_parameters(5)
    core.set_dtype(act)
    ids = ids_batch(3, (64, 300)).numpy()  # outputs past the kept buffers' 1 MiB floor
    full = core.forward(ids)
    half = core.forward(ids, act=act)
    assert half.dtype == (np.uint16 if dtype == torch.bfloat16 else np.float16)
    assert np.array_equal(half, to_half_np(full, dtype))  # rounded once, to nearest
    again = core.forward(ids, act=act)  # the same kept buffer, once the first is gone
    assert np.array_equal(again, half)
    up = np.random.default_rng(0).standard_normal(full.shape).astype(np.float32)
    up_half = to_half_np(up, dtype)
    widened = torch.from_numpy(up).to(dtype).float().numpy()
    a, b = core.backward(ids, up_half, act=act), core.backward(ids, widened)
    for name in a.names():
        assert np.array_equal(a.rows(name), b.rows(name)) and np.array_equal(a.values(name), b.values(name))
    with pytest.raises(ValueError, match="expected"):
        core.backward(ids, up, act=act)  # float32 where the half type is declared
    with pytest.raises(ValueError, match="activations"):
        core.forward(ids, act="float64")
    path, lang, tok = index_file
    sv = sg.SplitVocabulary.from_npz(str(path), 12, 5, 4, 0.2)
    shared = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    sh = to_half_np(shared, dtype)
    sh_wide = torch.from_numpy(shared).to(dtype).float().numpy()
    out = sv.forward(tok[:6].numpy(), lang[:6].numpy(), sh, act=act)
    assert np.array_equal(out, to_half_np(sv.forward(tok[:6].numpy(), lang[:6].numpy(), sh_wide), dtype))
    head = sg.SplitLanguageModellingHead(SIZES, ORDER, H)
    hid = to_half_np(np.ones((3, H), np.float32), dtype)
    loss = head.forward(hid, np.array([0, 1, 2]), act=act)
    assert np.array_equal(loss, to_half_np(head.forward(np.ones((3, H), np.float32), np.array([0, 1, 2])), dtype))


def test_head_and_vocabulary_convert_in_place(index_file):
    path, lang, tok = index_file
    sv = SplitVocabulary(path, 12, 5, 4, gate_init=0.1)
    sv.seed_from(torch.randn(12, 5))
    rows = sv.rows
    want = {k: v.to(torch.bfloat16) for k, v in sv.state_dict().items()}
    sv.bfloat16()
    assert sv.rows is rows and rows.dtype == torch.bfloat16
    assert rows.data_ptr() == sv._core.parameter("split_vocabulary.rows").ctypes.data
    for k, v in sv.state_dict().items():
        assert torch.equal(v, want[k]), k
    out = sv(tok[:4], lang[:4], torch.zeros(4, 5, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert sv.rows.grad.dtype == torch.bfloat16 and sv.rows.grad.is_sparse
    head = SplitLanguageModellingHead(SIZES, ORDER, H).half()
    assert head.parameter_bytes == 2 * H * sum(SIZES.values())
    hidden = torch.randn(5, H, dtype=torch.float16, requires_grad=True)
    loss = head(hidden, torch.tensor([0, 1, 2, 3, -100])).cross_entropy
    assert loss.dtype == torch.float16
    loss.sum().backward()
    assert hidden.grad.dtype == torch.float16 and head.lm_head["orig"].weight.grad.dtype == torch.float16
    dense = SplitTokenEmbeddings(SIZES, ORDER, H, dtype=torch.bfloat16, sparse=False)
    dense(ids_batch()).float().sum().backward()
    assert all(not p.grad.is_sparse and p.grad.dtype == torch.bfloat16 for p in dense._weights())


def sys_platform_linux():
    return sys.platform.startswith("linux")


def _peak_growth(setup, build, after="VmHWM:"):
    """Bytes the peak resident set grows by while ``build`` runs in a fresh
    interpreter (after ``setup``), measured with Linux's resettable peak
    (``after="VmRSS:"``: the resident set left after it instead)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import torch, splitgrad.torch as sgt
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        {setup}
        before = status("VmRSS:")
        open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from now
        {build}
        print(status({after!r}) - before)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys_platform_linux(), reason="reads /proc/self/status and resets the peak")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_tables_are_built_and_converted_without_an_f32_copy(dtype, tmp_path):
    # 2**26 elements: 128 MiB in half precision, 256 MiB in f32.
    elems, half = 1 << 26, 128 << 20
    index = tmp_path / "index.npz"
    np.savez(index, language_index=np.repeat([0, 1], 16384), token_index=np.tile(np.arange(16384), 2))
    for build in [
        f"m = sgt.SplitTokenEmbeddings({{'orig': 32768}}, ['orig'], 2048, dtype=torch.{dtype})",
        f"m = sgt.SplitLanguageModellingHead({{'orig': 32768}}, ['orig'], 2048, dtype=torch.{dtype})",
        f"m = sgt.SplitVocabulary({str(index)!r}, 16384, 2048, 2, dtype=torch.{dtype})",
    ]:
        grown = _peak_growth("", build)
        assert half <= grown < half + (48 << 20), (build, grown)
    # From f32: the new half buffer beside the f32 table, no widened copy.
    grown = _peak_growth(
        "m = sgt.SplitTokenEmbeddings({'orig': 32768}, ['orig'], 2048)",
        f"m = m.to(torch.{dtype})",
    )
    assert grown < half + (48 << 20), grown
    assert elems * 2 == half


@pytest.mark.skipif(not sys_platform_linux(), reason="reads /proc/self/status")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_outputs_of_growing_lengths_leave_about_one_buffer_behind(dtype):
    # Ten forwards, each output 32 MiB and a little longer than the last,
    # each dropped before the next: the buffers kept for reuse hold about
    # one output, not one per length.
    elem = 4 if dtype == "float32" else 2
    rows = (32 << 20) // (256 * elem)
    left = _peak_growth(
        f"m = sgt.SplitTokenEmbeddings({{'orig': 1000}}, ['orig'], 256, dtype=torch.{dtype}); "
        "torch.set_grad_enabled(False)",
        f"for k in range(10): m(torch.randint(0, 1000, ({rows} + 1000 * k,)))",
        after="VmRSS:",
    )
    assert left < 3 * (32 << 20), left


def test_rounding_rows_are_checked_and_key_the_roundings():
    # A part of a table keyed by its rows' places rounds as the whole does;
    # rows of another length, repeated or negative are refused by name, and
    # the parameter keeps its keys.
    whole = SplitTokenEmbeddings({"t": 6}, ["t"], H, dtype=torch.bfloat16, fused_adam={"lr": 0.1, "seed": 4})
    part = SplitTokenEmbeddings({"t": 3}, ["t"], H, dtype=torch.bfloat16, fused_adam={"lr": 0.1, "seed": 4})
    name = "token_embedding.t.weight"
    with torch.no_grad():
        part.token_embedding["t"].weight.copy_(whole.token_embedding["t"].weight[1::2])
    assert part._core.rounding_rows(name) is None
    part._core.set_rounding_rows(name, np.array([1, 3, 5]))
    # Copies keep them, as they keep the trainable flags.
    for twin in (copy.deepcopy(part._core), pickle.loads(pickle.dumps(part._core))):
        assert twin.rounding_rows(name).tolist() == [1, 3, 5]
    ids = torch.tensor([[1, 3, 5, 3]])
    up = torch.randn(1, 4, H).to(torch.bfloat16)
    whole(ids).backward(up)
    part(torch.tensor([[0, 1, 2, 1]])).backward(up)
    assert torch.equal(bits(part.token_embedding["t"].weight), bits(whole.token_embedding["t"].weight[1::2]))
    for rows, message in (
        (np.array([1, 3]), r"rounding rows.*expected \(3,\) \(one per row\)"),
        (np.array([1, 1, 5]), "row 1 given twice"),
        (np.array([1, -3, 5]), r"array `rows`: at position 1: row -3, expected a row >= 0"),
        (np.array([[1, 3, 5]]), "expected one dimension"),
        (np.array([1.0, 3.0, 5.0]), "expected an integer dtype"),
    ):
        with pytest.raises(ValueError, match=message):
            part._core.set_rounding_rows(name, rows)
    with pytest.raises(KeyError, match="no parameter named `nope`"):
        part._core.set_rounding_rows("nope", None)
    part._core.set_rounding_rows(name, None)
    assert part._core.rounding_rows(name) is None


def test_a_float16_layer_used_twice_in_a_pass_with_dense_gradients_or_fused_adam():
    # torch cannot add sparse float16 gradients; the README's ways around it work.
    ids1, ids2 = torch.tensor([1, 2]), torch.tensor([2, 3])
    e = SplitTokenEmbeddings({"orig": 10}, ["orig"], 4, dtype=torch.float16, sparse=False)
    (e(ids1).float().sum() + e(ids2).float().sum()).backward()
    g = e.token_embedding["orig"].weight.grad
    assert g.layout == torch.strided and g.dtype == torch.float16
    assert g[:, 0].tolist() == [0, 1, 2, 1, 0, 0, 0, 0, 0, 0]
    f = SplitTokenEmbeddings({"orig": 10}, ["orig"], 4, dtype=torch.float16, fused_adam={"lr": 0.1})
    before = f.token_embedding["orig"].weight.detach().clone()
    (f(ids1).float().sum() + f(ids2).float().sum()).backward()
    moved = (f.token_embedding["orig"].weight != before).any(dim=1)
    assert moved.tolist() == [False, True, True, True] + [False] * 6

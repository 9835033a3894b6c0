"""The numpy-level bindings: each layer against a numpy reference written from
docs/spec.md §2, the direct backward paths against the crate's tape, the
optimisers against PyTorch's formulas (§7), checkpoints, golden vectors, and
the errors (ValueError / OSError with the crate's message)."""

import gc
import os

import numpy as np
import pytest

import splitgrad as sg

SIZES = {"orig": 6, "special": 0, "prompt": 3}
ORDER = ["orig", "special", "prompt"]


def emb(dtype="float32", seed=0):
    e = sg.SplitTokenEmbeddings(SIZES, ORDER, 4, dtype=dtype)
    e.reset_parameters(seed)
    return e


def table(e):
    return np.concatenate([e.parameter(f"token_embedding.{s}.weight") for s in ORDER])


# --- SplitTokenEmbeddings -------------------------------------------------


def test_embeddings_forward_is_the_lookup_of_the_concatenated_tables():
    e = emb()
    ids = np.array([[0, 6, 8, 5], [7, 7, 1, 0]])
    out = e.forward(ids)
    assert out.shape == (2, 4, 4) and out.dtype == np.float32
    np.testing.assert_array_equal(out, table(e)[ids])


def test_embeddings_accept_any_integer_dtype_and_lists():
    e = emb()
    ids = np.array([3, 6, 8])
    ref = e.forward(ids)
    for d in (np.int8, np.int32, np.uint16, np.uint64):
        np.testing.assert_array_equal(e.forward(ids.astype(d)), ref)
    np.testing.assert_array_equal(e.forward([3, 6, 8]), ref)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_embeddings_backward_equals_the_tape_and_a_scatter_add(dtype):
    e = emb(dtype)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 9, size=(3, 5))
    g = rng.standard_normal((3, 5, 4)).astype(dtype)
    fast = e.backward(ids, g)
    tape = e.backward_tape(ids, g)
    assert sorted(fast.names()) == sorted(tape.names())
    dense = np.zeros((9, 4), dtype)
    np.add.at(dense, ids.reshape(-1), g.reshape(-1, 4))
    start = 0
    for s in ORDER:
        name = f"token_embedding.{s}.weight"
        size = SIZES[s]
        hit = sorted({int(i) - start for i in ids.reshape(-1) if start <= i < start + size})
        if not hit:
            assert name not in fast
        else:
            assert fast.is_sparse(name)
            np.testing.assert_array_equal(fast.rows(name), hit)
            np.testing.assert_array_equal(fast.values(name), tape.values(name))  # bit for bit
            np.testing.assert_array_equal(fast.rows(name), tape.rows(name))
            np.testing.assert_allclose(fast.dense(name), dense[start : start + size], rtol=1e-6)
        start += size


def test_frozen_split_gets_no_gradient():
    e = emb()
    e.set_trainable("orig", False)
    g = e.backward([0, 1, 7], np.ones((3, 4), np.float32))
    assert g.names() == ["token_embedding.prompt.weight"]
    with pytest.raises(ValueError, match=r"no split named `x` \(splits: orig, special, prompt\)"):
        e.set_trainable("x", False)


def test_embeddings_errors_are_value_errors_with_the_crates_message():
    e = emb()
    with pytest.raises(ValueError, match=r"^input id 9 at position \[1, 1\] is out of range 0\.\.9$"):
        e.forward(np.array([[0, 1], [2, 9]]))
    with pytest.raises(ValueError, match=r"input id -1 at position \[0\]"):
        e.forward([-1])
    with pytest.raises(ValueError, match="expected an integer dtype"):
        e.forward(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"grad_output has shape \[2, 3\], expected \(2, 4\)"):
        e.backward([0, 1], np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="has dtype float64, expected float32"):
        e.backward([0, 1], np.ones((2, 4)))
    with pytest.raises(ValueError, match="split_order is empty"):
        sg.SplitTokenEmbeddings({"a": 1}, [], 4)
    with pytest.raises(ValueError, match="split `b` has a size but is missing from split_order"):
        sg.SplitTokenEmbeddings({"a": 1, "b": 2}, ["a"], 4)
    with pytest.raises(ValueError, match="hidden_size must be positive, got 0"):
        sg.SplitTokenEmbeddings({"a": 1}, ["a"], 0)


def test_parameter_views_share_the_layers_memory_and_keep_it_alive():
    e = emb()
    p = e.parameter("token_embedding.prompt.weight")
    p[1] = 42.0
    np.testing.assert_array_equal(e.forward([7]), np.full((1, 4), 42.0, np.float32))
    names = [n for n, _ in e.named_parameters()]
    assert names == [f"token_embedding.{s}.weight" for s in ORDER]
    del e
    gc.collect()
    assert (p[1] == 42.0).all()  # the view keeps the layer alive


def test_reset_is_seeded_and_normal():
    a = sg.SplitTokenEmbeddings({"x": 3000}, ["x"], 8)
    b = sg.SplitTokenEmbeddings({"x": 3000}, ["x"], 8)
    a.reset_parameters(9)
    b.reset_parameters(9)
    w = a.parameter("token_embedding.x.weight")
    np.testing.assert_array_equal(w, b.parameter("token_embedding.x.weight"))
    assert abs(w.mean()) < 0.02 and abs(w.std() - 1) < 0.02


def test_state_dict_round_trip_and_checks():
    a, b = emb(seed=1), emb(seed=2)
    sd = a.state_dict()
    assert sorted(sd) == sorted(f"token_embedding.{s}.weight" for s in ORDER)
    view = b.parameter("token_embedding.orig.weight")
    b.load_state_dict(sd)
    np.testing.assert_array_equal(view, sd["token_embedding.orig.weight"])  # in place
    bad = dict(sd)
    bad["token_embedding.orig.weight"] = np.zeros((6, 5), np.float32)
    with pytest.raises(ValueError, match=r"tensor has shape \[6, 5\], expected \(6, 4\)"):
        b.load_state_dict(bad)
    nan = dict(sd)
    nan["token_embedding.prompt.weight"] = np.full((3, 4), np.nan, np.float32)
    with pytest.raises(ValueError, match="non-finite value NaN"):
        b.load_state_dict(nan)


# --- SplitLanguageModellingHead --------------------------------------------


def head(dtype="float64", seed=3):
    h = sg.SplitLanguageModellingHead({"orig": 5, "new": 2}, ["orig", "new"], 3, dtype=dtype)
    h.reset_parameters(seed)
    return h


def head_reference(w, hidden, labels):
    """Per-token cross-entropy from the full logits (spec §2.2) and its gradients for upstream g."""
    z = hidden.reshape(-1, w.shape[1]) @ w.T
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    y = labels.reshape(-1)
    active = y != -100
    loss = np.where(active, lse - z[np.arange(len(y)), np.where(active, y, 0)], 0.0)
    p = np.exp(z - lse[:, None])
    p[np.arange(len(y))[active], y[active]] -= 1
    p[~active] = 0
    return loss.reshape(labels.shape), p


def head_weight(h):
    return np.concatenate([h.parameter("lm_head.orig.weight"), h.parameter("lm_head.new.weight")])


def test_head_forward_and_backward_against_full_logits():
    h = head()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 3))
    labels = np.array([[0, 6, -100, 2], [5, 1, 1, -100]])
    loss = h.forward(x, labels)
    w = head_weight(h)
    ref, p = head_reference(w, x, labels)
    np.testing.assert_allclose(loss, ref, rtol=1e-12, atol=1e-12)
    assert loss[0, 2] == 0.0
    g = rng.standard_normal(labels.shape)
    gh, grads = h.backward(x, labels, g)
    gp = p * g.reshape(-1, 1)
    np.testing.assert_allclose(gh, (gp @ w).reshape(x.shape), rtol=1e-10, atol=1e-12)
    dw = gp.T @ x.reshape(-1, 3)
    np.testing.assert_allclose(grads.values("lm_head.orig.weight"), dw[:5], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads.values("lm_head.new.weight"), dw[5:], rtol=1e-10, atol=1e-12)
    assert not grads.is_sparse("lm_head.orig.weight")


def test_head_summed_path_equals_per_token_path():
    h = head()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, 3))
    labels = np.array([0, 6, -100, 2, 5, 1, 3])
    total, gh, grads = h.forward_sum_backward(x, labels)
    assert abs(total - h.forward(x, labels).sum()) < 1e-12
    assert abs(h.forward_sum(x, labels) - total) < 1e-12
    gh2, grads2 = h.backward(x, labels, np.ones(7))
    np.testing.assert_allclose(gh, gh2, rtol=1e-12, atol=1e-14)
    for n in grads.names():
        np.testing.assert_allclose(grads.values(n), grads2.values(n), rtol=1e-12, atol=1e-14)
    _, none, _ = h.forward_sum_backward(x, labels, hidden_grad=False)
    assert none is None


def test_head_frozen_split_and_errors():
    h = head("float32")
    h.set_trainable("orig", False)
    x = np.ones((2, 3), np.float32)
    _, grads = h.backward(x, [1, 6], np.ones(2, np.float32))
    assert grads.names() == ["lm_head.new.weight"]
    with pytest.raises(ValueError, match=r"^label 7 at position \[1\] is out of range 0\.\.7$"):
        h.forward(x, [1, 7])
    with pytest.raises(ValueError, match=r"hidden has shape \[2, 4\], expected \(…, 3\)"):
        h.forward(np.ones((2, 4), np.float32), [1, 2])
    with pytest.raises(ValueError, match="labels has shape"):
        h.forward(x, [1, 2, 3])


# --- SplitVocabulary -------------------------------------------------------

LANG = np.array([0, 1, 0, 2])
TOK = np.array([2, 2, 1, 4])


def vocab(dtype="float64", gate_init=0.3):
    return sg.SplitVocabulary(LANG, TOK, 5, 3, 3, gate_init, dtype=dtype)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_vocabulary_seed_forward_and_penalties():
    sv = vocab()
    rng = np.random.default_rng(5)
    shared_table = rng.standard_normal((5, 3))
    rows_view = sv.parameter("split_vocabulary.rows")
    sv.seed_from(shared_table)
    np.testing.assert_array_equal(rows_view, shared_table[TOK])  # in the same buffer
    tokens = np.array([2, 2, 1, 4, 0, 4])
    langs = np.array([0, 1, 1, 2, 0, 0])
    shared = shared_table[tokens]
    np.testing.assert_array_equal(sv.forward(tokens, langs, shared), shared)  # exactly, after seed_from
    assert sv.fusion_penalty() == 0.0
    rows_view += rng.standard_normal(rows_view.shape) * 0.1
    sv.parameter("split_vocabulary.gate_logit")[:] = [0.5, -1.0, 2.0, 0.0]
    g = sigmoid(sv.parameter("split_vocabulary.gate_logit"))
    np.testing.assert_allclose(sv.gate(), g, rtol=1e-15)
    assert abs(sv.penalty() - g.mean()) < 1e-15
    np.testing.assert_array_equal(sv.rows_of(tokens, langs), [0, 1, -1, 3, -1, -1])
    out = sv.forward(tokens, langs, shared)
    ref = shared.copy()
    for n, r in enumerate(sv.rows_of(tokens, langs)):
        if r >= 0:
            ref[n] = shared[n] + g[r] * (rows_view[r] - shared[n])
    np.testing.assert_allclose(out, ref, rtol=1e-14)
    # one token axis (the kernel straight) and two (through the tape): the same bits
    for gate in (True, False):
        np.testing.assert_array_equal(
            sv.forward(tokens, langs, shared, gate),
            sv.forward(tokens[None], langs[None], shared[None], gate)[0],
        )
    fused = sv.forward(tokens, langs, shared, use_gate=False)
    ref2 = shared.copy()
    for n, r in enumerate(sv.rows_of(tokens, langs)):
        if r >= 0:
            ref2[n] = rows_view[r]
    np.testing.assert_array_equal(fused, ref2)
    # fusion penalty: mean distance of each row to its token's centroid
    cent = {t: rows_view[TOK == t].mean(axis=0) for t in set(TOK)}
    fp = np.mean([np.linalg.norm(rows_view[i] - cent[TOK[i]]) for i in range(4)])
    assert abs(sv.fusion_penalty() - fp) < 1e-14


def test_vocabulary_backward_against_the_formulas():
    sv = vocab()
    rng = np.random.default_rng(6)
    rows = sv.parameter("split_vocabulary.rows")
    rows[:] = rng.standard_normal(rows.shape)
    tokens = np.array([2, 2, 1, 4, 0, 2])
    langs = np.array([0, 1, 0, 2, 0, 0])
    shared = rng.standard_normal((6, 3))
    up = rng.standard_normal((6, 3))
    gs, grads = sv.backward(tokens, langs, shared, up)
    g = sigmoid(sv.parameter("split_vocabulary.gate_logit"))
    r_of = sv.rows_of(tokens, langs)
    ref_s = up.copy()
    ref_rows = np.zeros_like(rows)
    ref_gate = np.zeros(4)
    for n, r in enumerate(r_of):
        if r >= 0:
            ref_s[n] = (1 - g[r]) * up[n]
            ref_rows[r] += g[r] * up[n]
            ref_gate[r] += (up[n] * (rows[r] - shared[n])).sum()
    ref_gate *= g * (1 - g)
    np.testing.assert_allclose(gs, ref_s, rtol=1e-14)
    np.testing.assert_allclose(grads.dense("split_vocabulary.rows"), ref_rows, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(grads.dense("split_vocabulary.gate_logit"), ref_gate, rtol=1e-13, atol=1e-15)
    pg = sv.penalty_backward(0.5, 0.0)
    np.testing.assert_allclose(pg.dense("split_vocabulary.gate_logit"), 0.5 * g * (1 - g) / 4, rtol=1e-14)
    # fusion penalty gradient by central differences
    fg = sv.penalty_backward(0.0, 1.0).dense("split_vocabulary.rows")
    eps = 1e-6
    for i, j in [(0, 0), (1, 2), (3, 1), (2, 0)]:
        keep = rows[i, j]
        rows[i, j] = keep + eps
        up_ = sv.fusion_penalty()
        rows[i, j] = keep - eps
        dn = sv.fusion_penalty()
        rows[i, j] = keep
        assert abs((up_ - dn) / (2 * eps) - fg[i, j]) < 1e-6


def test_fusion_penalty_backward_from_the_forwards_norms():
    sv = vocab()
    rows = sv.parameter("split_vocabulary.rows")
    rows[:] = np.random.default_rng(8).standard_normal(rows.shape)
    value, norms = sv.fusion_penalty_norms()
    assert value == sv.fusion_penalty() and norms.shape == (rows.shape[0],)
    want = sv.penalty_backward(0.5, 0.7)
    got = sv.penalty_backward(0.5, 0.7, norms)
    for name in ("split_vocabulary.rows", "split_vocabulary.gate_logit"):
        assert np.array_equal(got.dense(name), want.dense(name))
    with pytest.raises(ValueError, match=r"norms has shape \[3\], expected \(4,\) \(one per row\)"):
        sv.penalty_backward(0.0, 1.0, norms[:3])
    with pytest.raises(ValueError, match="fusion_norms"):
        sv.penalty_backward(0.0, 1.0, norms.reshape(2, 2))


def test_fused_step_from_the_norms_equals_the_dense_sum():
    # Two forwards and both penalties: the rows' update from the forward's
    # distances (the gradient formed row by row) equals, bit for bit, the
    # update of the stored dense sum.
    rng = np.random.default_rng(9)
    tokens, langs = np.array([2, 2, 1, 4, 0, 2]), np.array([0, 1, 0, 2, 0, 0])
    layers = []
    for with_norms in (False, True):
        sv = vocab()
        sv.parameter("split_vocabulary.rows")[:] = np.random.default_rng(10).standard_normal((4, 3))
        opts = (sg.LazyAdam(lr=0.05, dtype="float64"), sg.Optimizer.adam(0.05, dtype="float64"))
        layers.append((sv, opts, with_norms))
    for step in range(3):
        shared, up1, up2 = (rng.standard_normal((6, 3)) for _ in range(3))
        for sv, opts, with_norms in layers:
            _, g1 = sv.backward(tokens, langs, shared, up1)
            _, g2 = sv.backward(tokens, langs, shared, up2)
            norms = sv.fusion_penalty_norms()[1] if with_norms else None
            sv.fused_step([g1, g2], 0.5, 0.7, *opts, norms)
    (a, oa, _), (b, ob, _) = layers
    for name in ("split_vocabulary.rows", "split_vocabulary.gate_logit"):
        assert np.array_equal(a.parameter(name), b.parameter(name))
    for x, y in zip(oa, ob):
        sx, sy = x.state_dict(), y.state_dict()
        assert sx.keys() == sy.keys() and all(np.array_equal(sx[k], sy[k]) for k in sx)


def test_gradients_from_parts_sum_repeated_rows_and_check_their_input():
    e = emb("float64")
    v = np.arange(12, dtype=np.float64).reshape(3, 4)
    g = sg.Gradients.from_parts(e, {"token_embedding.orig.weight": (np.array([4, 1, 4]), v)}, 0.5)
    assert g.is_sparse("token_embedding.orig.weight")
    assert list(g.rows("token_embedding.orig.weight")) == [1, 4]
    np.testing.assert_array_equal(g.values("token_embedding.orig.weight"), [v[1] * 0.5, (v[0] + v[2]) * 0.5])
    sv = vocab()
    d = sg.Gradients.from_parts(sv, {"split_vocabulary.gate_logit": (None, np.ones(4))}, 2.0)
    np.testing.assert_array_equal(d.dense("split_vocabulary.gate_logit"), np.full(4, 2.0))
    with pytest.raises(KeyError, match="no parameter `nope` in this layer"):
        sg.Gradients.from_parts(e, {"nope": (None, v)})
    with pytest.raises(ValueError, match=r"orig.weight: row 9 at position \[1\] is out of range 0\.\.6"):
        sg.Gradients.from_parts(e, {"token_embedding.orig.weight": (np.array([0, 9]), v[:2])})
    with pytest.raises(ValueError, match="values of token_embedding.orig.weight"):
        sg.Gradients.from_parts(e, {"token_embedding.orig.weight": (np.array([0, 1]), v)})
    with pytest.raises(ValueError, match="scale must be finite"):
        sg.Gradients.from_parts(e, {}, float("inf"))


def test_vocabulary_errors():
    with pytest.raises(ValueError, match="dim must be positive, got 0"):
        sg.SplitVocabulary(LANG, TOK, 5, 0, 3)
    with pytest.raises(ValueError, match="gate_init must be finite, got NaN"):
        sg.SplitVocabulary(LANG, TOK, 5, 3, 3, float("nan"))
    with pytest.raises(ValueError, match=r"array `language_index`: language id 3 at position \[1\] is out of range 0\.\.3"):
        sg.SplitVocabulary([0, 3], [1, 1], 5, 3, 3)
    with pytest.raises(ValueError, match=r"array `language_index`: language id -2 at position \[1\] is out of range 0\.\.3"):
        sg.SplitVocabulary([0, -2], [1, 1], 5, 3, 3)
    with pytest.raises(ValueError, match=r"array `token_index`: token id -1 at position \[0\] is out of range 0\.\.5"):
        sg.SplitVocabulary([0, 1], [-1, 1], 5, 3, 3)
    with pytest.raises(ValueError, match=r"pair \(language 0, token 1\) at position \[1\] repeats position \[0\]"):
        sg.SplitVocabulary([0, 0], [1, 1], 5, 3, 3)
    with pytest.raises(ValueError, match="is empty"):
        sg.SplitVocabulary([], [], 5, 3, 3)
    sv = vocab()
    with pytest.raises(ValueError, match=r"seed table has shape \[4, 3\], expected \(5, 3\)"):
        sv.seed_from(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"token id 5 at position \[1\] is out of range 0\.\.5"):
        sv.forward([0, 5], [0, 0], np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"language_ids has shape \[3\], expected \[2\] like token_ids"):
        sv.forward([0, 1], [0, 0, 0], np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"shared has shape \[2, 2\], expected \(2, 3\)"):
        sv.forward([0, 1], [0, 0], np.zeros((2, 2)))


def test_vocabulary_from_npz(tmp_path):
    path = tmp_path / "index.npz"
    np.savez(path, language_index=LANG.astype(np.int32), token_index=TOK.astype(np.uint8))
    sv = sg.SplitVocabulary.from_npz(str(path), 5, 3, 3, 0.0)
    l, t = sv.index()
    np.testing.assert_array_equal(l, LANG)
    np.testing.assert_array_equal(t, TOK)
    assert sorted(sv.state_dict()) == [
        "split_vocabulary.gate_logit",
        "split_vocabulary.language_index",
        "split_vocabulary.rows",
        "split_vocabulary.token_index",
    ]
    with pytest.raises(OSError, match="missing.npz: No such file or directory"):
        sg.SplitVocabulary.from_npz(str(tmp_path / "missing.npz"), 5, 3, 3)
    np.savez(path, language_index=LANG, token_index=np.array([2, 2, 1, 9]))
    with pytest.raises(ValueError, match=r"index.npz: array `token_index`: token id 9 at position \[3\]"):
        sg.SplitVocabulary.from_npz(str(path), 5, 3, 3)


# --- optimisers ------------------------------------------------------------


def test_lazy_adam_and_adam_follow_pytorchs_formulas():
    e = emb("float64")
    w0 = e.parameter("token_embedding.orig.weight").copy()
    ids = np.array([1, 1, 4])
    g = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    opt = sg.LazyAdam(lr=0.01, dtype="float64")
    grads = e.backward(ids, g)
    opt.step(e, grads)
    gr = grads.values("token_embedding.orig.weight")
    m = 0.1 * gr
    v = 0.001 * gr * gr
    step = 0.01 * np.sqrt(1 - 0.999) / (1 - 0.9)
    ref = w0.copy()
    ref[[1, 4]] -= step * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(e.parameter("token_embedding.orig.weight"), ref, rtol=1e-12)
    sd = opt.state_dict()
    assert sd["token_embedding.orig.weight.step"] == 1
    assert opt.lr == 0.01
    opt.lr = 0.02
    assert opt.lr == 0.02
    with pytest.raises(ValueError):
        opt.lr = float("nan")
    again = sg.LazyAdam(lr=0.02, dtype="float64")
    again.load_state_dict(sd, e)
    assert again.state_dict().keys() == sd.keys()

    p = sg.SplitVocabulary(LANG, TOK, 5, 3, 3, 0.0, dtype="float64")
    adam = sg.Adam(lr=0.1, dtype="float64")
    gl = p.penalty_backward(1.0, 0.0)
    adam.step(p, gl)
    gg = gl.dense("split_vocabulary.gate_logit")
    ref = -0.1 * (0.1 * gg / 0.1) / (np.sqrt(0.001 * gg * gg) / np.sqrt(0.001) + 1e-8)
    np.testing.assert_allclose(p.parameter("split_vocabulary.gate_logit"), ref, rtol=1e-12)

    s = sg.SGD(lr=0.5, dtype="float64")
    before = p.parameter("split_vocabulary.gate_logit").copy()
    s.step([p], [gl])
    np.testing.assert_allclose(p.parameter("split_vocabulary.gate_logit"), before - 0.5 * gg, rtol=1e-14)
    with pytest.raises(ValueError, match="float64"):
        sg.Adam().step(p, gl)
    with pytest.raises(TypeError, match="expected a splitgrad layer"):
        sg.Adam(dtype="float64").step(object(), gl)


def test_step_refuses_gradients_of_a_layer_it_was_not_given():
    e = emb("float64")
    p = sg.SplitVocabulary(LANG, TOK, 5, 3, 3, 0.0, dtype="float64")
    ge = e.backward(np.array([1, 4]), np.ones((2, 4)))
    gp = p.penalty_backward(1.0, 0.0)
    w0 = e.parameter("token_embedding.orig.weight").copy()
    g0 = p.parameter("split_vocabulary.gate_logit").copy()
    opt = sg.SGD(lr=0.5, dtype="float64")
    with pytest.raises(ValueError, match="split_vocabulary.gate_logit.*none of the layers"):
        opt.step(e, [ge, gp])
    # nothing moved: the check runs before any update
    np.testing.assert_array_equal(e.parameter("token_embedding.orig.weight"), w0)
    np.testing.assert_array_equal(p.parameter("split_vocabulary.gate_logit"), g0)
    opt.step([e, p], [ge, gp])
    assert not np.array_equal(e.parameter("token_embedding.orig.weight"), w0)
    assert not np.array_equal(p.parameter("split_vocabulary.gate_logit"), g0)


# --- checkpoints -----------------------------------------------------------


def test_checkpoint_round_trip(tmp_path):
    e = emb()
    h = sg.SplitLanguageModellingHead({"orig": 6, "special": 0, "prompt": 3}, ORDER, 4)
    h.reset_parameters(7)
    opt = sg.LazyAdam()
    opt.step(e, e.backward([0, 7], np.ones((2, 4), np.float32)))
    path = tmp_path / "model.safetensors"
    sg.save_checkpoint(str(path), [e, h], opt, metadata={"step": 1}, extra={"history": np.arange(3.0)})
    e2 = sg.SplitTokenEmbeddings(SIZES, ORDER, 4)
    h2 = sg.SplitLanguageModellingHead({"orig": 6, "special": 0, "prompt": 3}, ORDER, 4)
    opt2 = sg.LazyAdam()
    meta, rest = sg.load_checkpoint(str(path), [e2, h2], opt2)
    assert meta == {"step": 1}
    np.testing.assert_array_equal(rest["history"], np.arange(3.0))
    for a, b in [(e, e2), (h, h2)]:
        for k, v in a.state_dict().items():
            np.testing.assert_array_equal(b.state_dict()[k], v)
    assert opt2.state_dict().keys() == opt.state_dict().keys()
    with pytest.raises(OSError, match="No such file or directory"):
        sg.load_checkpoint(str(tmp_path / "none.safetensors"), [e2])
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.safetensors"):
        sg.load_checkpoint(str(tmp_path / "junk.safetensors"), [e2])
    with pytest.raises(OSError):
        sg.save_checkpoint(str(tmp_path / "no" / "such" / "dir.safetensors"), [e])


def test_checkpoint_metadata_keeps_its_types(tmp_path):
    e = emb()
    path = tmp_path / "typed.safetensors"
    meta = {"step": 7, "lr": 0.1, "frozen": True, "name": "1", "n": np.int64(3), "x": np.float32(0.5)}
    sg.save_checkpoint(str(path), [e], metadata=meta)
    got, _ = sg.load_checkpoint(str(path), [emb()])
    assert got == {"step": 7, "lr": 0.1, "frozen": True, "name": "1", "n": 3, "x": 0.5}
    assert [type(got[k]) for k in ("step", "lr", "frozen", "name", "n", "x")] == [int, float, bool, str, int, float]
    with pytest.raises(ValueError, match="reserved"):
        sg.save_checkpoint(str(path), [e], metadata={"splitgrad.metadata_types": "{}"})
    # The command line's checkpoints are typed by their format's table.
    from splitgrad import _metadata

    cli = {"format": "splitgrad-bigram-1", "step": "5", "lr": "0.01", "use_gate": "true", "corpus": "synthetic"}
    assert _metadata.decode(cli) == {"format": "splitgrad-bigram-1", "step": 5, "lr": 0.01, "use_gate": True, "corpus": "synthetic"}
    with pytest.raises(ValueError, match="'step'"):
        _metadata.decode({"format": "splitgrad-bigram-1", "step": "five"})


# --- golden vectors --------------------------------------------------------


@pytest.mark.parametrize("layer", sg.golden.LAYERS)
def test_golden_generate_then_evaluate(layer, tmp_path):
    for seed in range(5):
        case = sg.golden.generate(layer, seed)
        results = sg.golden.evaluate(layer, sg.golden.generate_bytes(layer, seed))
        assert results
        for k, v in results.items():
            np.testing.assert_array_equal(case[k], v)
    with pytest.raises(ValueError, match="not an npz file"):
        sg.golden.evaluate(layer, b"junk")
    (tmp_path / "in" / layer).mkdir(parents=True)
    (tmp_path / "in" / layer / "a.npz").write_bytes(sg.golden.generate_bytes(layer, 1))
    (tmp_path / "in" / layer / "b.npz").write_bytes(b"junk")
    summary = sg.golden.evaluate_dir(tmp_path / "in", tmp_path / "out")
    assert summary["ok"] == [f"{layer}/a"]
    assert summary["failed"][0][0] == f"{layer}/b"
    assert os.path.exists(tmp_path / "out" / layer / "a.npz")


def test_bad_dtype_names():
    with pytest.raises(ValueError, match="dtype must be float32 or float64, got int32"):
        sg.SplitTokenEmbeddings({"a": 1}, ["a"], 2, dtype="int32")


def test_the_extension_says_how_it_was_compiled():
    """`_splitgrad.BUILD` names the build a timing measured (python/bench.py reports it)."""
    import splitgrad._splitgrad as ext

    assert ext.BUILD in ("debug", "release")


def test_fused_step_refuses_another_layers_gradients():
    # They were skipped without a word (matched by parameter) and, on the
    # path that forms the rows' gradient by rows, taken by name.
    tokens, langs = np.array([2, 1]), np.array([0, 1])
    a, b = vocab(), vocab()
    shared, up = np.ones((2, 3)), np.ones((2, 3))
    _, gb = b.backward(tokens, langs, shared, up)
    opts = (sg.LazyAdam(lr=0.05, dtype="float64"), sg.Optimizer.adam(0.05, dtype="float64"))
    before = a.parameter("split_vocabulary.rows").copy()
    for norms in (None, a.fusion_penalty_norms()[1]):
        with pytest.raises(ValueError, match="fused_step: the gradients hold `split_vocabulary.rows` of another layer"):
            a.fused_step([gb], 0.5, 0.7, *opts, norms)
    assert np.array_equal(a.parameter("split_vocabulary.rows"), before)


def test_set_rounding_on_an_optimiser_that_rounds_nothing_is_refused():
    opt = sg.SGD(lr=0.1)
    for args in (("nearest",), ("stochastic", 5)):
        with pytest.raises(ValueError, match="set_rounding: SGD stores no value in half precision"):
            opt.set_rounding(*args)
    lazy = sg.LazyAdam(lr=0.1)
    lazy.set_rounding("nearest")
    assert lazy.rounding == ("nearest", None)
    lazy.set_rounding("stochastic")
    assert lazy.rounding == ("stochastic", 0)
    # A seed with nearest rounding would draw nothing: refused, the rounding unchanged.
    lazy.set_rounding("stochastic", 9)
    with pytest.raises(ValueError, match=r"set_rounding: seed 5 draws the random bits of stochastic rounding, and \"nearest\" draws none: leave the seed out"):
        lazy.set_rounding("nearest", 5)
    assert lazy.rounding == ("stochastic", 9)


def _bf16_bits(x):
    """float32 values → their bfloat16 bits (round to nearest even), uint16."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


_FULL = [("float32", None, None), ("float64", None, None)]
_HALF = [("float32", "bf16", "bfloat16"), ("float32", "bf16", None)]


@pytest.mark.parametrize(
    "dtype, table, act, kind",
    [c + (k,) for c in _FULL for k in ("lazy_adam", "adam", "sgd")]
    # SGD refuses half-precision tables.
    + [c + (k,) for c in _HALF for k in ("lazy_adam", "adam")],
)
def test_backward_step_is_the_step_of_the_backwards_gradients(dtype, table, act, kind):
    # Each touched row summed and updated in one pass: the bits of
    # step(layer, backward(...)), the state too, over three steps.
    make = {
        "lazy_adam": lambda: sg.LazyAdam(lr=0.05, dtype=dtype),
        "adam": lambda: sg.Optimizer.adam(0.05, dtype=dtype),
        "sgd": lambda: sg.Optimizer.sgd(0.05, dtype=dtype),
    }[kind]
    a, b = emb(dtype, seed=4), emb(dtype, seed=4)
    oa, ob = make(), make()
    if table is not None:
        for e in (a, b):
            e.set_dtype(table)
        for o in (oa, ob):
            o.set_state_dtype("bf16")
            o.set_rounding("stochastic", 7)
    rng = np.random.default_rng(5)
    for _ in range(3):
        ids = rng.integers(0, 9, size=(4, 6))
        g = rng.standard_normal((4, 6, 4)).astype(dtype)
        if act is not None:
            g = _bf16_bits(g)
        a.backward_step(ids, g, oa, act=act)
        ob.step(b, b.backward(ids, g, act=act))
    for s in ORDER:
        name = f"token_embedding.{s}.weight"
        assert np.array_equal(a.parameter(name), b.parameter(name)), name
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])), k


def test_backward_step_refuses_an_optimiser_of_another_dtype_and_bad_input():
    e = emb("float32")
    before = table(e).copy()
    with pytest.raises(ValueError, match="float32 layer and a float64 optimiser"):
        e.backward_step([1, 2], np.ones((2, 4), np.float32), sg.LazyAdam(dtype="float64"))
    opt = sg.LazyAdam()
    with pytest.raises(ValueError, match="grad_output"):
        e.backward_step([1, 2], np.ones((3, 4), np.float32), opt)
    with pytest.raises(ValueError, match="out of range"):
        e.backward_step([1, 99], np.ones((2, 4), np.float32), opt)
    assert np.array_equal(table(e), before) and opt.state_dict() == {}

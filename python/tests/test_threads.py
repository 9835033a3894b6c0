"""Several Python threads on one module: concurrent forwards and backwards
give what serial calls give, and concurrent fused steps are serialised
(never a torn update)."""

import threading

import numpy as np
import pytest

import splitgrad as sg

THREADS = 4
ROUNDS = 6


def run_threads(work):
    """Runs work(k) on THREADS threads started together; re-raises the first error."""
    barrier = threading.Barrier(THREADS)
    results, errors = [None] * THREADS, []

    def body(k):
        try:
            barrier.wait()
            results[k] = work(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def _grads(g):
    return {n: (g.rows(n).copy() if g.is_sparse(n) else None, g.values(n).copy()) for n in g.names()}


def _same(a, b):
    assert sorted(a) == sorted(b)
    for n in a:
        for x, y in zip(a[n], b[n]):
            assert (x is None and y is None) or np.array_equal(x, y), n


def test_numpy_layers_from_threads_equal_serial_calls():
    rng = np.random.default_rng(0)
    emb = sg.SplitTokenEmbeddings({"orig": 50, "prompt": 6}, ["orig", "prompt"], 16)
    emb.reset_parameters(0)
    head = sg.SplitLanguageModellingHead({"orig": 50, "prompt": 6}, ["orig", "prompt"], 16)
    head.reset_parameters(1)
    voc = sg.SplitVocabulary(np.array([0, 1, 1, 2]), np.array([3, 3, 9, 40]), 56, 16, 3, 0.1)
    voc.seed_from(rng.standard_normal((56, 16)).astype(np.float32))
    inputs = []
    for k in range(THREADS):
        ids = rng.integers(0, 56, size=(8, 32))
        g = rng.standard_normal((8, 32, 16)).astype(np.float32)
        h = rng.standard_normal((64, 16)).astype(np.float32)
        labels = rng.integers(-1, 56, size=64)
        labels[labels < 0] = -100
        langs = rng.integers(0, 3, size=ids.shape)
        inputs.append((ids, g, h, labels, langs))

    def work(k):
        ids, g, h, labels, langs = inputs[k]
        out = []
        for _ in range(ROUNDS):
            e = emb.forward(ids)
            eg = _grads(emb.backward(ids, g))
            loss = head.forward(h, labels)
            gh, hg = head.backward(h, labels, np.ones_like(loss))
            v = voc.forward(ids, langs, e)
            gs, vg = voc.backward(ids, langs, e, g)
            out.append((e, eg, loss, gh, _grads(hg), v, gs, _grads(vg)))
        return out

    serial = [work(k)[0] for k in range(THREADS)]
    for k, rounds in enumerate(run_threads(work)):
        for got in rounds:
            for a, b in zip(serial[k], got):
                if isinstance(a, dict):
                    _same(a, b)
                else:
                    assert np.array_equal(a, b)


def test_numpy_optimiser_steps_from_threads_are_whole():
    # every thread applies the same gradient: any order of whole steps ends
    # in the same bits, a torn step does not
    emb = sg.SplitTokenEmbeddings({"orig": 300}, ["orig"], 32)
    emb.reset_parameters(3)
    ref = sg.SplitTokenEmbeddings({"orig": 300}, ["orig"], 32)
    ref.reset_parameters(3)
    ids = np.arange(300).reshape(10, 30)
    g = np.random.default_rng(4).standard_normal((10, 30, 32)).astype(np.float32)
    opt, ref_opt = sg.SGD(lr=0.01), sg.SGD(lr=0.01)
    grads = emb.backward(ids, g)
    for _ in range(THREADS * ROUNDS):
        ref_opt.step(ref, ref.backward(ids, g))

    def work(k):
        for _ in range(ROUNDS):
            opt.step(emb, grads)

    run_threads(work)
    assert np.array_equal(emb.parameter("token_embedding.orig.weight"), ref.parameter("token_embedding.orig.weight"))


def test_numpy_state_changes_from_threads_beside_forwards_equal_serial_calls():
    # two threads run forward and backward while the others load the same
    # state, re-seed the same rows and set trainable flags that are already
    # set: every forward and backward must equal the serial one, and no call
    # may fail for the object being in use
    rng = np.random.default_rng(5)
    emb = sg.SplitTokenEmbeddings({"orig": 40, "prompt": 8}, ["orig", "prompt"], 12)
    emb.reset_parameters(2)
    voc = sg.SplitVocabulary(np.array([0, 1, 1, 2, 0]), np.array([3, 3, 9, 40, 47]), 48, 12, 3, 0.2)
    table = rng.standard_normal((48, 12)).astype(np.float32)
    voc.seed_from(table)
    emb_state, voc_state = emb.state_dict(), voc.state_dict()
    ids = rng.integers(0, 48, size=(6, 10))
    langs = rng.integers(0, 3, size=ids.shape)
    g = rng.standard_normal((6, 10, 12)).astype(np.float32)

    def reads():
        e = emb.forward(ids)
        eg = _grads(emb.backward(ids, g))
        v = voc.forward(ids, langs, e)
        gs, vg = voc.backward(ids, langs, e, g)
        return [e, eg, v, gs, _grads(vg), voc.fusion_penalty(), voc.penalty()]

    serial = reads()

    def work(k):
        got = []
        for _ in range(ROUNDS * 3):
            if k < 2:
                got.append(reads())
            elif k == 2:
                emb.load_state_dict(emb_state)
                voc.load_state_dict(voc_state)
                emb.set_trainable("prompt", True)
            else:
                voc.seed_from(table)
                voc.set_parameter_trainable("split_vocabulary.gate_logit", True)
                emb.set_parameter_trainable("token_embedding.orig.weight", True)
                assert emb.is_trainable("token_embedding.orig.weight")
        return got

    for rounds in run_threads(work)[:2]:
        assert len(rounds) == ROUNDS * 3
        for got in rounds:
            for a, b in zip(serial, got):
                if isinstance(a, dict):
                    _same(a, b)
                else:
                    assert np.array_equal(a, b)


def test_numpy_fused_steps_and_optimiser_loads_from_threads_are_whole():
    # fused steps of one vocabulary from the same gradients (the penalties'
    # read the rows as they are), beside forwards, state reads and loads of
    # the optimisers' own state: whole steps, one at a time, end in the
    # bits of as many serial steps; a torn one does not
    def make():
        v = sg.SplitVocabulary(np.array([0, 1, 1, 2, 0, 2]), np.array([3, 3, 9, 20, 5, 5]), 24, 8, 3, 0.1)
        v.seed_from(np.random.default_rng(6).standard_normal((24, 8)).astype(np.float32))
        return v, sg.SGD(lr=0.05, momentum=0.5), sg.Adam(lr=0.01)

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 24, size=40)
    langs = rng.integers(0, 3, size=40)
    shared = rng.standard_normal((40, 8)).astype(np.float32)
    up = rng.standard_normal((40, 8)).astype(np.float32)
    ref, ref_r, ref_g = make()
    _, grads = ref.backward(ids, langs, shared, up)
    for _ in range(2 * ROUNDS):
        ref.fused_step([grads], 0.3, 0.2, ref_r, ref_g)
    voc, r, g = make()
    # The same gradients, as voc's own (a layer's fused_step takes no other's).
    _, grads = voc.backward(ids, langs, shared, up)

    def work(k):
        for _ in range(ROUNDS):
            if k < 2:
                voc.fused_step([grads], 0.3, 0.2, r, g)
            elif k == 2:
                voc.forward(ids, langs, shared)
                voc.backward(ids, langs, shared, up)
                voc.state_dict()
            else:
                r.state_dict()
                r.lr = 0.05
                g.lr = 0.01
                voc.fusion_penalty_norms()

    run_threads(work)
    for name in ("split_vocabulary.rows", "split_vocabulary.gate_logit"):
        assert np.array_equal(voc.parameter(name), ref.parameter(name)), name
    for a, b in ((r, ref_r), (g, ref_g)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sorted(sa) == sorted(sb)
        for k in sa:
            assert np.array_equal(sa[k], sb[k]), k


def test_one_optimiser_for_rows_and_gates_is_refused_not_a_deadlock():
    voc = sg.SplitVocabulary(np.array([0]), np.array([1]), 4, 2, 1)
    opt = sg.SGD(lr=0.1)
    _, grads = voc.backward(np.array([1]), np.array([0]), np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32))
    with pytest.raises(ValueError, match="one optimiser"):
        voc.fused_step([grads], 0.0, 0.0, opt, opt)
    with pytest.raises(ValueError, match="given twice"):
        opt.step([voc, voc], grads)


torch = pytest.importorskip("torch", reason="torch is not installed: the drop-ins' thread tests need it")
from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings  # noqa: E402


def test_drop_ins_from_threads_equal_serial_calls():
    torch.manual_seed(0)
    emb = SplitTokenEmbeddings({"orig": 50, "prompt": 6}, ["orig", "prompt"], 16)
    emb.reset_parameters()
    head = SplitLanguageModellingHead({"orig": 50, "prompt": 6}, ["orig", "prompt"], 16)
    head.reset_parameters()
    weights = [*emb.parameters(), *head.parameters()]
    batches = [torch.randint(0, 56, (4, 24), generator=torch.Generator().manual_seed(k)) for k in range(THREADS)]

    def work(k):
        ids = batches[k]
        out = []
        for _ in range(ROUNDS):
            h = emb(ids[:, :-1]).reshape(-1, 16)
            loss = head(h, ids[:, 1:].reshape(-1)).cross_entropy.mean()
            grads = torch.autograd.grad(loss, weights)
            out.append((loss.detach(), [g.to_dense() for g in grads]))
        return out

    serial = [work(k)[0] for k in range(THREADS)]
    for k, rounds in enumerate(run_threads(work)):
        for loss, grads in rounds:
            assert torch.equal(loss, serial[k][0])
            for a, b in zip(grads, serial[k][1]):
                assert torch.equal(a, b)


def test_fused_steps_from_threads_are_serialised():
    def make():
        torch.manual_seed(1)
        m = SplitTokenEmbeddings({"orig": 40, "prompt": 8}, ["orig", "prompt"], 8, fused_adam={"lr": 0.01})
        m.reset_parameters()
        return m

    ids = torch.randint(0, 48, (6, 20), generator=torch.Generator().manual_seed(2))
    r = torch.randn(6, 20, 8, generator=torch.Generator().manual_seed(3))
    # the loss is linear in the table: every step has the same gradient,
    # so whole steps in any order end in the same bits
    ref = make()
    for _ in range(THREADS * ROUNDS):
        (ref(ids) * r).sum().backward()
    m = make()

    def work(k):
        for _ in range(ROUNDS):
            (m(ids) * r).sum().backward()

    run_threads(work)
    for a, b in zip(m.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    st, ref_st = m.fused_optimizer_state(), ref.fused_optimizer_state()
    for k in ref_st:
        assert np.array_equal(st[k], ref_st[k]), k

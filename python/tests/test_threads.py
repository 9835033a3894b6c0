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

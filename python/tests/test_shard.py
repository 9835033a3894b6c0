"""Sharded layers (splitgrad.torch.shard) on 2 and 4 gloo processes train the
same weights as one unsharded process on the combined batch (its loss over
P): embeddings and split vocabulary on fused_adam, the vocabulary-parallel
head, a dense layer under DistributedDataParallel; frozen splits, uneven and
empty per-process batches (the head and the dense layer on torch Adam);
checkpoints, with the torch optimiser's state, resumed on the same P (bit
for bit) and on another; a killed process, and one stopped (SIGSTOP)
between or inside exchanges, make the others stop with an error naming it
within the timeout."""

import gc
import os
import signal
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import datetime  # noqa: E402

import torch.multiprocessing as mp  # noqa: E402

V, D, L, B, STEPS = 41, 8, 3, 64, 3
SIZES = {"orig": V - 5, "new": 5}
FUSED = {"lr": 0.01}


class Model(torch.nn.Module):
    def __init__(self, index_path, dtype=None, fused=FUSED):
        super().__init__()
        from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary

        self.emb = SplitTokenEmbeddings(SIZES, list(SIZES), D, dtype=dtype, fused_adam=fused)
        self.sv = SplitVocabulary(index_path, V, D, L, gate_init=0.5, dtype=dtype, fused_adam=fused)
        self.lin = torch.nn.Linear(D, D, dtype=dtype)
        self.head = SplitLanguageModellingHead(SIZES, list(SIZES), D, dtype=dtype)

    def forward(self, tokens, langs, labels, ce_weight=1.0):
        # (The loss in float32 whatever the layers' dtype: a no-op for float32 layers.)
        x = self.sv(tokens, langs, self.emb(tokens))
        ce = self.head(torch.tanh(self.lin(x)), labels).cross_entropy.float().sum()
        return ce_weight * ce + 0.1 * self.sv.fusion_penalty().float() + 0.1 * self.sv.penalty().float()


def make_index(tmp_path):
    rng = np.random.default_rng(3)
    cells = np.sort(rng.choice(L * V, size=30, replace=False))
    path = str(tmp_path / "index.npz")
    np.savez(path, language_index=cells // V, token_index=cells % V)
    return path


def build(index_path, frozen, dtype=None, fused=FUSED):
    torch.manual_seed(0)
    m = Model(index_path, dtype, fused)
    kept = m.sv.rows.dtype
    m.sv.seed_from(torch.randn(V, D, generator=torch.Generator().manual_seed(1)).to(kept))
    with torch.no_grad():
        m.sv.rows.add_((0.1 * torch.randn(m.sv.rows.shape, generator=torch.Generator().manual_seed(2))).to(kept))
    if frozen:
        m.emb.token_embedding["orig"].weight.requires_grad_(False)
        m.head.lm_head["new"].weight.requires_grad_(False)
    return m


def batches():
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        labels = torch.randint(0, V, (B,), generator=g)
        labels[::7] = -100
        out.append((torch.randint(0, V, (B,), generator=g), torch.randint(0, L, (B,), generator=g), labels))
    return out


def optimiser(m):
    """Torch Adam for the dense layer and the head (whose rows the sharded head holds); in
    float16 with an eps float16 holds (torch's 1e-8 is 0 there, and an untouched row's
    update 0/0)."""
    eps = 1e-4 if m.lin.weight.dtype == torch.float16 else 1e-8
    return torch.optim.Adam([p for p in list(m.lin.parameters()) + list(m.head.parameters()) if p.requires_grad], lr=0.01, eps=eps)


def reference(index_path, frozen, world, steps=STEPS, dtype=None, fused=FUSED):
    m = build(index_path, frozen, dtype, fused)
    opt = optimiser(m)
    for tokens, langs, labels in batches()[:steps]:
        opt.zero_grad()
        m(tokens, langs, labels, ce_weight=1.0 / world).backward()
        opt.step()
    return m


def worker(rank, world, store, index_path, cuts, frozen, out, save_dir, load_dir, dtype=None, fused=FUSED):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    from splitgrad.torch import gather_state_dict, load_shards, save_shards, shard

    m = shard(build(index_path, frozen, dtype, fused))
    opt = optimiser(m)
    first = 0
    if load_dir is not None:
        load_shards(m, load_dir, optimizer=opt)
        dense = torch.load(os.path.join(load_dir, "dense.pt"))
        m.lin.load_state_dict(dense)
        first = 2
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    for step, (tokens, langs, labels) in enumerate(batches()):
        if step < first:
            continue
        part = slice(cuts[rank], cuts[rank + 1])
        opt.zero_grad()
        ddp(tokens[part], langs[part], labels[part]).backward()
        opt.step()
        if save_dir is not None and step == 1:
            save_shards(m, save_dir, optimizer=opt)
            if rank == 0:
                torch.save(m.lin.state_dict(), os.path.join(save_dir, "dense.pt"))
    state = gather_state_dict(m, dst=0)
    sent = sum(mod.bytes_sent for mod in (m.emb, m.sv, m.head))
    # Each rank's stochastic-rounding seeds (its fused optimisers').
    seeds = [m.emb._fused.rounding] + [o.rounding for o in m.sv._fused]
    every = [None] * world
    dist.all_gather_object(every, seeds)
    if rank == 0:
        torch.save({"state": state, "sent": sent, "seeds": every}, out)
    else:
        assert state is None
    # The DDP wrapper and its reducer go while the group is alive, not
    # after it at the function's return (gloo work outliving its group
    # can abort a process as it exits).
    del ddp
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def check(state, ref, start):
    for k, v in ref.state_dict().items():
        if not k.endswith(("lm_head.new.weight", "token_embedding.orig.weight")):
            assert not torch.equal(v, start[k]), f"{k} did not train"
        torch.testing.assert_close(state[k], v, rtol=1e-5, atol=2e-6, msg=k)


def test_sharded_training_equals_one_process_and_resumes_on_another_p(tmp_path):
    world, cuts, frozen = 2, [0, B // 2 + 5, B], True
    index_path = make_index(tmp_path)
    out = str(tmp_path / "out.pt")
    save_dir = str(tmp_path / "shards") if world == 2 else None
    mp.start_processes(
        worker, args=(world, str(tmp_path / "store"), index_path, cuts, frozen, out, save_dir, None),
        nprocs=world, start_method="spawn",
    )
    got = torch.load(out)
    assert got["sent"] > 0
    ref = reference(index_path, frozen, world)
    start = build(index_path, frozen).state_dict()
    if frozen:
        for k in ("emb.token_embedding.orig.weight", "head.lm_head.new.weight"):
            assert torch.equal(got["state"][k], start[k]), k
    check(got["state"], ref, start)

    if save_dir is not None:
        # The shards after two steps: one d9d-loadable file equal to the
        # reference after two steps, and a resume on 4 processes (one with
        # an empty batch) that takes the third step as the reference does.
        from splitgrad.torch import consolidate

        two = reference(index_path, frozen, world, steps=2)
        full = consolidate(save_dir, str(tmp_path / "full.pt"))
        plain = build(index_path, frozen)
        plain.load_state_dict({**two.state_dict(), **torch.load(str(tmp_path / "full.pt"))})
        for k, v in full.items():
            torch.testing.assert_close(plain.state_dict()[k], two.state_dict()[k], rtol=1e-5, atol=2e-6, msg=k)
        assert not [f for f in os.listdir(save_dir) if f.startswith(".tmp-")]
        # Resumed from those shards, with the head's and the dense layer's
        # Adam state: on the same P the third step is the uninterrupted
        # run's, bit for bit; on 1 and 4 processes (one with an empty batch)
        # the reference's with the third step's loss over the new P.
        for p_new, cuts_new in ((2, cuts), (1, [0, B]), (4, [0, 20, 20, 50, B])):
            out_new = str(tmp_path / f"out{p_new}.pt")
            mp.start_processes(
                worker,
                args=(p_new, str(tmp_path / f"store{p_new}"), index_path, cuts_new, frozen, out_new, None, save_dir),
                nprocs=p_new, start_method="spawn",
            )
            resumed = torch.load(out_new)["state"]
            if p_new == world:
                for k, v in got["state"].items():
                    assert torch.equal(resumed[k], v), k
                continue
            m = build(index_path, frozen)
            opt = optimiser(m)
            for step, (tokens, langs, labels) in enumerate(batches()):
                opt.zero_grad()
                m(tokens, langs, labels, ce_weight=1.0 / (world if step < 2 else p_new)).backward()
                opt.step()
            check(resumed, m, start)


def test_a_process_takes_its_rows_from_the_shards_without_the_whole_table():
    """``load_shards``' gathering: this process's rows, in its order, from
    shards strided over another number of processes (one of them empty, one
    replicated), and an error naming the table and the row no shard holds."""
    import splitgrad.torch  # noqa: F401  (splitgrad.shard is loaded through it)
    from splitgrad.shard import _my_rows

    full = torch.arange(40.0).reshape(10, 4)
    parts = [(np.arange(r, 10, 3), full[r::3]) for r in range(3)] + [(np.arange(0), full[:0])]
    mine = np.array([7, 2, 9, 0])
    assert torch.equal(_my_rows("dir", "w", 10, mine, parts), full[mine])
    assert torch.equal(_my_rows("dir", "w", 10, None, parts), full)
    assert torch.equal(_my_rows("dir", "w", 10, mine, [(None, full)]), full[mine])
    assert _my_rows("dir", "w", 10, np.arange(0), parts).shape == (0, 4)
    # Without the third shard, rows 2, 5 and 8 are held by none.
    with pytest.raises(ValueError, match=r"^dir: `w`: no shard holds row 2 of its 10$"):
        _my_rows("dir", "w", 10, mine, parts[:2])


def test_an_unreadable_shard_file_is_named(tmp_path):
    """A shard file cut short, or not torch's at all, is a ValueError naming it."""
    import splitgrad.torch  # noqa: F401  (splitgrad.shard is loaded through it)
    from splitgrad.shard import _load_mapped

    good = tmp_path / "shard-0-of-1.pt"
    torch.save({"rank": 0, "world": 1, "layers": {"": {"tensors": {"w": ((4, 2), torch.arange(4), torch.ones(4, 2))}}}}, good)
    assert torch.equal(_load_mapped(str(good))["layers"][""]["tensors"]["w"][2], torch.ones(4, 2))
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut\.pt: cannot read the shard: "):
        _load_mapped(str(cut))
    for name, data in (("garbage.pt", b"x" * 100), ("empty.pt", b"")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"{name}: not a shard file \(not an archive of torch\.save\)"):
            _load_mapped(str(tmp_path / name))


def head_worker(rank, world, store, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from splitgrad.torch import SplitLanguageModellingHead, shard

    torch.manual_seed(0)
    full = SplitLanguageModellingHead(SIZES, list(SIZES), D, dtype=torch.float64)
    head = shard(full)
    g = torch.Generator().manual_seed(5)
    h = torch.randn(30, D, generator=g, dtype=torch.float64)
    lab = torch.randint(0, V, (30,), generator=g)
    lab[3] = -100
    up = torch.randn(30, generator=g, dtype=torch.float64)
    part = slice(rank * 15, (rank + 1) * 15)
    hp = h[part].clone().requires_grad_(True)
    loss = head(hp, lab[part]).cross_entropy
    (loss * up[part]).sum().backward()
    local = {s: (torch.from_numpy(head._rows[s]), head.lm_head[s].grad) for s in SIZES}
    torch.save({"loss": loss.detach(), "gh": hp.grad, "local": local}, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def test_vocabulary_parallel_head_equals_the_whole_head(tmp_path):
    from splitgrad.torch import SplitLanguageModellingHead

    out = str(tmp_path / "head")
    mp.start_processes(head_worker, args=(2, str(tmp_path / "store"), out), nprocs=2, start_method="spawn")
    torch.manual_seed(0)
    full = SplitLanguageModellingHead(SIZES, list(SIZES), D, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    h = torch.randn(30, D, generator=g, dtype=torch.float64).requires_grad_(True)
    lab = torch.randint(0, V, (30,), generator=g)
    lab[3] = -100
    up = torch.randn(30, generator=g, dtype=torch.float64)
    loss = full(h, lab).cross_entropy
    (loss * up).sum().backward()
    got = [torch.load(f"{out}.{r}") for r in range(2)]
    torch.testing.assert_close(torch.cat([x["loss"] for x in got]), loss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat([x["gh"] for x in got]), h.grad, rtol=1e-12, atol=1e-12)
    for s in SIZES:
        w = torch.zeros_like(full.lm_head[s].weight)
        for x in got:
            rows, gr = x["local"][s]
            w[rows] = gr * 2  # each rank's share is averaged over the 2 processes
        torch.testing.assert_close(w, full.lm_head[s].weight.grad, rtol=1e-12, atol=1e-12, msg=s)


def fault_worker(rank, world, store, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    from splitgrad.torch import SplitTokenEmbeddings, shard

    emb = shard(SplitTokenEmbeddings(SIZES, list(SIZES), D, fused_adam=FUSED), timeout=3.0)
    emb(torch.arange(V)).sum().backward()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t = time.monotonic()
    try:
        emb(torch.arange(V)).sum().backward()
        msg = ""
    except RuntimeError as e:
        msg = str(e)
    with open(out, "w") as f:
        f.write(f"{time.monotonic() - t}\n{msg}")
    os._exit(0)  # the group is broken: leave without its teardown


def test_a_killed_process_makes_the_other_stop_with_an_error(tmp_path):
    out = str(tmp_path / "fault")
    ctx = mp.start_processes(fault_worker, args=(2, str(tmp_path / "store"), out), nprocs=2, start_method="spawn", join=False)
    for p in ctx.processes:
        p.join(60)
    assert [p.exitcode for p in ctx.processes] == [0, -signal.SIGKILL]
    elapsed, msg = open(out).read().split("\n", 1)
    assert float(elapsed) < 15.0
    assert msg.startswith("rank 0:") and "did not reach it: rank 1 (it entered" in msg, msg


STALL_TIMEOUT = 2.0


def stall_worker(rank, world, store, out, stalled, inside, port):
    """Trains the model two steps, then rank ``stalled`` stops (SIGSTOP):
    before the third step's first exchange, or inside it (after recording its
    arrival). The others write how long their third step ran and its error.
    (Not at the second step: there DistributedDataParallel's forward
    broadcasts its rebuilt buckets on the default group, whose timeout is
    init_process_group's.)"""
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    init = f"tcp://127.0.0.1:{port}" if port else f"file://{store}"  # tcp: rank 0 hosts the store
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    from splitgrad.torch import shard

    m = shard(build(make_index_at(os.path.dirname(store)), False), timeout=STALL_TIMEOUT)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opt = optimiser(m)
    for step, (tokens, langs, labels) in enumerate(batches()):
        if step == 2 and rank == stalled:
            if inside:
                dist.all_to_all_single = lambda *a, **k: os.kill(os.getpid(), signal.SIGSTOP)
            else:
                os.kill(os.getpid(), signal.SIGSTOP)
        part = slice(rank * B // world, (rank + 1) * B // world)
        t = time.monotonic()
        try:
            opt.zero_grad()
            ddp(tokens[part], langs[part], labels[part]).backward()
            opt.step()
            msg = ""
        except RuntimeError as e:
            msg = str(e)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{time.monotonic() - t}\n{msg}")
    os._exit(0)  # the group is broken: leave without its teardown


def make_index_at(directory):
    path = os.path.join(directory, "index.npz")
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return path


def run_stalled(tmp_path, world, stalled, inside, tcp=False):
    """Runs ``stall_worker`` on ``world`` processes; returns each survivor's
    (seconds, message). The stopped process is killed, and nothing outlives
    the call (a deadline bounds it)."""
    make_index(tmp_path)
    out = str(tmp_path / "stall")
    port = 0
    if tcp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ctx = mp.start_processes(stall_worker, args=(world, str(tmp_path / "store"), out, stalled, inside, port),
                             nprocs=world, start_method="spawn", join=False)
    survivors = [r for r in range(world) if r != stalled]
    deadline = time.monotonic() + 60.0
    try:
        while time.monotonic() < deadline and not all(os.path.exists(f"{out}.{r}") for r in survivors):
            time.sleep(0.1)
        for r in survivors:
            ctx.processes[r].join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # a stopped process dies from SIGKILL too
                p.join(10)
    codes = [p.exitcode for p in ctx.processes]
    assert codes == [-signal.SIGKILL if r == stalled else 0 for r in range(world)], codes
    got = {}
    for r in survivors:
        elapsed, msg = open(f"{out}.{r}").read().split("\n", 1)
        got[r] = (float(elapsed), msg)
    return got


@pytest.mark.parametrize("world, stalled", [(2, 1), (4, 2)])
def test_a_stalled_process_makes_the_others_stop_naming_it_within_the_timeout(tmp_path, world, stalled):
    for r, (elapsed, msg) in run_stalled(tmp_path, world, stalled, inside=False).items():
        assert STALL_TIMEOUT * 0.9 < elapsed < STALL_TIMEOUT + 3.0, (r, elapsed, msg)
        assert msg.startswith(f"rank {r}:") and f"did not reach it: rank {stalled} (it entered" in msg, msg
        assert all(f"rank {q} (" not in msg for q in range(world) if q not in (r, stalled)), msg


def test_a_process_stalled_inside_an_exchange_is_named_within_twice_the_timeout(tmp_path):
    for r, (elapsed, msg) in run_stalled(tmp_path, 2, 1, inside=True).items():
        assert 2 * STALL_TIMEOUT * 0.9 < elapsed < 2 * STALL_TIMEOUT + 3.0, (r, elapsed, msg)
        assert msg.startswith(f"rank {r}:") and "rank 1 entered it but did not answer" in msg, msg


def test_a_stalled_store_host_is_reported_within_twice_the_timeout(tmp_path):
    # Under init_method tcp:// rank 0 hosts the store: stopped, it stops the store too.
    for r, (elapsed, msg) in run_stalled(tmp_path, 2, 0, inside=False, tcp=True).items():
        assert 2 * STALL_TIMEOUT * 0.9 < elapsed < 2 * STALL_TIMEOUT + 3.0, (r, elapsed, msg)
        assert msg.startswith(f"rank {r}:") and "store did not answer within 2 s" in msg and "rank 0" in msg, msg


def dense_worker(rank, world, store, directory, out):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    from splitgrad.torch import SplitTokenEmbeddings, load_shards, save_shards, shard

    class Net(torch.nn.Module):
        def __init__(self, width=D):
            super().__init__()
            torch.manual_seed(5)
            self.emb = SplitTokenEmbeddings(SIZES, list(SIZES), D, fused_adam=FUSED)
            self.lin = torch.nn.Linear(D, width)
            self.register_buffer("calls", torch.zeros(()))

    m = shard(Net())
    with torch.no_grad():
        m.lin.weight.add_(1.0)
        m.calls.fill_(7)
    saved = {k: v.clone() for k, v in m.state_dict().items()}
    save_shards(m, directory)
    back = shard(Net())  # other weights: a fresh model
    load_shards(back, directory)
    got = {"same": all(torch.equal(saved[k], v) for k, v in back.state_dict().items())}
    try:
        load_shards(shard(Net(width=D + 1)), directory)
        got["other"] = None
    except ValueError as e:
        got["other"] = str(e)
    if rank == 0:
        torch.save(got, out)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2])
def test_a_shard_directory_restores_the_models_other_parameters(tmp_path, world):
    # The dense layer and the buffer beside the sharded table come back from
    # rank 0's shard, on any P; a model whose other parameters differ is refused.
    out, directory = tmp_path / "got.pt", tmp_path / "shards"
    mp.spawn(dense_worker, args=(world, str(tmp_path / "store"), str(directory), str(out)), nprocs=world, join=True)
    got = torch.load(out)
    assert got["same"]
    assert got["other"] == f"load_shards: {directory}: `lin.weight` has shape (8, 8), the model's (9, 8)"


def index_worker(rank, world, store, paths, directory, out):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    from splitgrad.torch import SplitVocabulary, consolidate, gather_state_dict, load_shards, save_shards, shard

    class Net(torch.nn.Module):
        def __init__(self, path, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.sv = SplitVocabulary(path, V, D, L, fused_adam=FUSED)
            with torch.no_grad():
                self.sv.rows.normal_()

    got = {}
    a = shard(Net(paths["a"], 1))
    full = gather_state_dict(a)
    save_shards(a, directory)
    other = shard(Net(paths["b"], 2))  # another index of the same size
    before = [t.detach().clone() for _, _, t in other.sv.local_state().values()]
    try:
        load_shards(other, directory)
        got["load_shards"] = None
    except ValueError as e:
        got["load_shards"] = str(e)
    got["untouched"] = all(torch.equal(x, t) for x, (_, _, t) in zip(before, other.sv.local_state().values()))
    same = shard(Net(paths["a"], 3))
    load_shards(same, directory)
    got["same"] = all(torch.equal(x, y) for (_, _, x), (_, _, y) in zip(a.sv.local_state().values(), same.sv.local_state().values()))
    if rank == 0:
        whole = consolidate(directory, os.path.join(os.path.dirname(directory), "whole.pt"))
        for what, state in (("gathered", full), ("consolidated", whole)):
            plain_other, plain_same = Net(paths["b"], 4), Net(paths["a"], 5)
            rows = plain_other.sv.rows.detach().clone()
            try:
                plain_other.load_state_dict(state)
                got[what] = None
            except RuntimeError as e:
                got[what] = str(e)
            got[what + " untouched"] = torch.equal(plain_other.sv.rows, rows)
            plain_same.load_state_dict(state)
            got[what + " same"] = torch.equal(plain_same.sv.rows, state["sv.rows"])
        torch.save(got, out)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2])
def test_the_rows_of_another_index_are_refused_through_the_shards(tmp_path, world):
    # A split vocabulary's rows belong to its index's pairs: shards, a gathered
    # state dict and a consolidated one name the index, and a layer built from
    # another index (of the same size) refuses them, unchanged; the same index loads.
    cells = np.sort(np.random.default_rng(3).choice(L * V, size=30, replace=False))
    free = sorted(set(range(L * V)) - set(cells.tolist()))
    paths = {}
    for name, c in (("a", cells), ("b", np.sort(np.concatenate([cells[:-1], [free[-1]]])))):
        paths[name] = str(tmp_path / f"{name}.npz")
        np.savez(paths[name], language_index=c // V, token_index=c % V)
    out, directory = tmp_path / "got.pt", tmp_path / "shards"
    mp.spawn(index_worker, args=(world, str(tmp_path / "store"), paths, str(directory), str(out)), nprocs=world, join=True)
    got = torch.load(out)
    another = r"\(30 rows, sha256 [0-9a-f]{16}; this layer: 30 rows, sha256 [0-9a-f]{16}\): its rows belong to other \(language, token\) pairs"
    import re

    assert re.search(rf"^load_shards: {re.escape(str(directory))}: layer `sv` was saved by a SplitVocabulary with another index {another}", got["load_shards"]), got["load_shards"]
    assert got["untouched"] and got["same"]
    for what in ("gathered", "consolidated"):
        assert re.search(rf"sv\.rows: saved by a SplitVocabulary with another index {another}", got[what] or ""), got[what]
        assert got[what + " untouched"] and got[what + " same"], what


# --- half precision ----------------------------------------------------------


HALF = {
    "bf16": (torch.bfloat16, {"lr": 0.05, "state_dtype": "bf16", "seed": 11}),
    "f16": (torch.float16, {"lr": 0.05}),
}


def spawn_half(tmp_path, name, world, index_path, kind, save_dir=None, load_dir=None):
    dtype, fused = HALF[kind]
    cuts = {1: [0, B], 2: [0, B // 2 + 5, B]}[world]
    out = str(tmp_path / f"{name}.pt")
    mp.start_processes(
        worker, args=(world, str(tmp_path / f"store-{name}"), index_path, cuts, False, out, save_dir, load_dir, dtype, fused),
        nprocs=world, start_method="spawn",
    )
    return torch.load(out)


def assert_follows(state, model, dtype):
    """Every tensor of ``model`` in ``state``, of ``dtype``, with at least 90 %
    of its elements bit for bit and the rest within two bf16 ulps."""
    for k, v in model.state_dict().items():
        mine = state[k]
        assert mine.dtype == dtype, k
        same = float((mine.view(torch.int16) == v.view(torch.int16)).float().mean())
        assert same >= 0.9, f"{k}: {same:.3f} of the elements the unsharded model's"
        torch.testing.assert_close(mine.float(), v.float(), rtol=2**-6, atol=2**-10, msg=k)


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_half_precision_layers_sharded_on_one_process_train_as_the_unsharded_ones(tmp_path, kind):
    # bf16 tables with bf16 moments and a seed of its own, or f16 tables with
    # f32 moments: sharded on one process, the embeddings, the split
    # vocabulary, the head and the dense layer end bit for bit where the
    # unsharded model ends, each in its dtype.
    dtype, fused = HALF[kind]
    index_path = make_index(tmp_path)
    got = spawn_half(tmp_path, "one", 1, index_path, kind)
    ref, start = reference(index_path, False, 1, dtype=dtype, fused=fused), build(index_path, False, dtype, fused).state_dict()
    seed = fused.get("seed", 0)
    assert got["seeds"] == [[("stochastic", seed)] * 3]
    for k, v in ref.state_dict().items():
        assert got["state"][k].dtype == dtype, k
        assert not torch.equal(v, start[k]), f"{k} did not train"
        assert torch.equal(got["state"][k].view(torch.int16), v.view(torch.int16)), k


def test_bf16_layers_sharded_on_two_processes_train_and_resume(tmp_path):
    # On two processes every row still draws the stochastic roundings it
    # draws unsharded (keyed by its place in the whole table), so the weights
    # are the unsharded model's but where an f32 gradient, summed over the
    # processes in another order (or averaged in bf16 by
    # DistributedDataParallel, the dense layer's), rounds otherwise: at least
    # 90 % of every tensor's elements bit for bit, the rest within two ulps.
    # Rows keyed by their place on the rank would differ in about half their
    # elements, rows given to the wrong rank or pair by a row. A resume from
    # the shards (bf16 moments, the step counts) on two processes ends bit for
    # bit on the uninterrupted run, and one on one process follows the
    # unsharded model as closely; the consolidated file loads into the
    # unsharded bf16 model.
    from splitgrad.torch import consolidate

    dtype, fused = HALF["bf16"]
    index_path = make_index(tmp_path)
    save_dir = str(tmp_path / "shards")
    got = spawn_half(tmp_path, "two", 2, index_path, "bf16", save_dir=save_dir)
    assert got["seeds"] == [[("stochastic", fused["seed"])] * 3] * 2
    ref, start = reference(index_path, False, 2, dtype=dtype, fused=fused), build(index_path, False, dtype, fused).state_dict()
    for k, v in ref.state_dict().items():
        moved = (v.float() - start[k].float()).abs().max()
        assert moved > 0.02, f"{k} moved {moved}"
    assert_follows(got["state"], ref, dtype)
    resumed = spawn_half(tmp_path, "resumed", 2, index_path, "bf16", load_dir=save_dir)
    for k, v in got["state"].items():
        assert torch.equal(resumed["state"][k].view(torch.int16), v.view(torch.int16)), k
    # Resumed on one process (the rows and bf16 moments re-strided): the
    # reference with the third step's loss over one process, as closely.
    alone = spawn_half(tmp_path, "alone", 1, index_path, "bf16", load_dir=save_dir)
    m = build(index_path, False, dtype, fused)
    opt = optimiser(m)
    for step, (tokens, langs, labels) in enumerate(batches()):
        opt.zero_grad()
        m(tokens, langs, labels, ce_weight=0.5 if step < 2 else 1.0).backward()
        opt.step()
    assert_follows(alone["state"], m, dtype)
    shard_file = torch.load(os.path.join(save_dir, "shard-0-of-2.pt"), weights_only=True)
    moments = {k: v.dtype for k, v in shard_file["layers"]["emb"]["fused"].items() if v.ndim}
    assert moments and set(moments.values()) == {torch.bfloat16}, moments
    full = consolidate(save_dir, str(tmp_path / "full.pt"))
    plain = build(index_path, False, dtype, fused)
    plain.load_state_dict(full, strict=False)
    for k, v in full.items():
        assert v.dtype == dtype and torch.equal(plain.state_dict()[k].view(torch.int16), v.view(torch.int16)), k


def ids_worker(rank, world, store, index_path, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, shard

    emb = shard(SplitTokenEmbeddings(SIZES, list(SIZES), D, fused_adam=FUSED))
    sv = shard(SplitVocabulary(index_path, V, D, L, fused_adam=FUSED))
    head = shard(SplitLanguageModellingHead(SIZES, list(SIZES), D))
    shared = torch.zeros(2, D)
    ok = torch.tensor([1, 2])
    calls = {
        "float input_ids": lambda: emb(torch.tensor([1.7, 2.2])),
        "bool input_ids": lambda: emb(torch.tensor([True, False])),
        "float token_ids": lambda: sv(torch.tensor([1.7, 2.2]), torch.tensor([0, 1]), shared),
        "float lang_per_token": lambda: sv(ok, torch.tensor([0.9, 0.1]), shared),
        "float labels": lambda: head(torch.zeros(2, D), torch.tensor([1.9, 1.9])),
        "list input_ids": lambda: emb([1, 2]),
    }
    got = {}
    for what, call in calls.items():
        try:
            call()
            got[what] = None
        except (ValueError, TypeError) as e:
            got[what] = str(e)
    torch.save(got, out)
    dist.destroy_process_group()


def test_sharded_layers_refuse_ids_that_are_not_integers(tmp_path):
    # As the unsharded layers do: a float id is not cut toward zero, a bool
    # is not an id.
    out = str(tmp_path / "ids.pt")
    mp.spawn(ids_worker, args=(1, str(tmp_path / "store"), make_index(tmp_path), out), nprocs=1, join=True)
    got = torch.load(out)
    for what, message in got.items():
        assert message is not None, f"{what} was taken"
        name = what.split()[1]
        assert f"array `{name}`" in message, (what, message)


def atomic_load_worker(rank, world, store, index_path, directory, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from splitgrad.torch import load_shards, save_shards, shard
    from splitgrad.shard import _sharded_modules  # noqa: I001 (after splitgrad.torch, which imports it)

    tokens, langs, labels = batches()[0]
    src = shard(build(index_path, False))
    src(tokens, langs, labels).backward()
    save_shards(src, directory)
    # A NaN in a moment of the last sharded layer's fused state, in its
    # second optimiser's (the vocabulary's gate logits'): the layers before
    # it, and its rows' optimiser, load before it is refused.
    path = os.path.join(directory, "shard-0-of-1.pt")
    saved = torch.load(path, weights_only=False)
    last = [p for p, _ in _sharded_modules(src) if saved["layers"][p]["fused"]][-1]
    key = next(k for k, v in saved["layers"][last]["fused"].items() if v.ndim >= 1 and k.startswith("1:"))
    saved["layers"][last]["fused"][key].view(-1)[0] = float("nan")
    torch.save(saved, path)
    # Moments in float32, and values after two steps of its own.
    dst = shard(build(index_path, False))
    for tokens, langs, labels in batches()[:2]:
        dst(tokens, langs, labels).backward()

    def state():
        tables = {f"{p}.{n}": t.clone() for p, m in _sharded_modules(dst) for n, (_, _, t) in m.local_state().items()}
        fused = {f"{p}.{k}": torch.from_numpy(np.array(v)) for p, m in _sharded_modules(dst) for k, v in m._fused_state().items()}
        dense = {k: v.clone() for k, v in dst.lin.state_dict().items()}
        return tables, fused, dense

    before = state()
    try:
        load_shards(dst, directory)
        err = None
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    after = state()
    same = [
        b.keys() == a.keys() and all(torch.equal(b[k].reshape(-1).view(torch.uint8), a[k].reshape(-1).view(torch.uint8)) for k in b)
        for b, a in zip(before, after)
    ]
    torch.save({"err": err, "same": same, "fused": sorted(before[1]), "last": last}, out)
    dist.destroy_process_group()


def test_a_load_of_shards_that_fails_leaves_the_model_as_it_was(tmp_path):
    # Shards with a NaN in the last layer's fused state: refused, and the
    # tables, the fused states and the model's other parameters are those
    # before the call.
    out, directory = str(tmp_path / "out.pt"), str(tmp_path / "shards")
    mp.spawn(atomic_load_worker, args=(1, str(tmp_path / "store"), make_index(tmp_path), directory, out), nprocs=1, join=True)
    got = torch.load(out)
    assert got["err"] is not None and "non-finite" in got["err"], got["err"]
    assert got["last"] != "emb", "no layer loads before the refused one"
    assert got["fused"], "no fused state to compare"
    assert got["same"] == [True, True, True], (got["err"], got["same"])

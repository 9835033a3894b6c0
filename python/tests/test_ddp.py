"""Two processes under torch.distributed (gloo, one machine) with
DistributedDataParallel train the same weights as one process on the combined
batch: embeddings (sparse gradients), split vocabulary and head; and with the
embeddings and the split vocabulary on fused_adam, after prepare_distributed."""

import gc
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the DDP test needs it")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

V, D, L, N, STEPS = 40, 8, 3, 32, 3


class Model(torch.nn.Module):
    def __init__(self, index_path, fused=None):
        super().__init__()
        from splitgrad.torch import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary

        self.emb = SplitTokenEmbeddings({"orig": V - 4, "new": 4}, ["orig", "new"], D, fused_adam=fused)
        self.sv = SplitVocabulary(index_path, V, D, L, gate_init=0.5, fused_adam=fused)
        self.head = SplitLanguageModellingHead({"orig": V - 4, "new": 4}, ["orig", "new"], D)

    def forward(self, tokens, langs, labels, ce_weight=1.0):
        shared = self.emb(tokens)
        x = self.sv(tokens, langs, shared)
        ce = self.head(x, labels).cross_entropy.sum()
        return ce_weight * ce + 0.1 * self.sv.fusion_penalty() + 0.1 * self.sv.penalty()


def batches():
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        out.append(
            (
                torch.randint(0, V, (2 * N,), generator=g),
                torch.randint(0, L, (2 * N,), generator=g),
                torch.randint(0, V, (2 * N,), generator=g),
            )
        )
    return out


def build(index_path, fused=None):
    torch.manual_seed(0)
    m = Model(index_path, fused)
    m.emb.reset_parameters()
    m.head.reset_parameters()
    m.sv.seed_from(m.emb.token_embedding["orig"].weight.detach().new_zeros(V, D).normal_(generator=torch.Generator().manual_seed(1)))
    return m


def optimisers(m):
    sparse = [m.emb.token_embedding[s].weight for s in ("orig", "new")]
    dense = [m.sv.rows, m.sv.gate_logit] + list(m.head.parameters())
    return [torch.optim.SparseAdam(sparse, lr=0.01), torch.optim.Adam(dense, lr=0.01)]


def worker(rank, world, store, index_path, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    m = build(index_path)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opts = optimisers(m)
    for tokens, langs, labels in batches():
        part = slice(rank * N, (rank + 1) * N)
        for o in opts:
            o.zero_grad()
        ddp(tokens[part], langs[part], labels[part]).backward()
        for o in opts:
            o.step()
    # fused_adam moves rows from one process's gradients: refused here
    from splitgrad.torch import SplitTokenEmbeddings

    fused = SplitTokenEmbeddings({"orig": V - 4, "new": 4}, ["orig", "new"], D, fused_adam={"lr": 0.01})
    try:
        fused(torch.tensor([1]))
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    with torch.no_grad():
        fused(torch.tensor([1]))  # inference needs no agreement between processes
    if rank == 0:
        state = {k: v.clone() for k, v in m.state_dict().items()}
        torch.save({"state": state, "fused_refused": refused}, out)
    # The DDP wrapper and its reducer go while the group is alive, not
    # after it at the function's return (gloo work outliving its group
    # can abort a process as it exits).
    del ddp
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_two_gloo_processes_train_like_one_on_the_combined_batch(tmp_path):
    rng = np.random.default_rng(0)
    cells = np.sort(rng.choice(L * V, size=30, replace=False))
    index_path = str(tmp_path / "index.npz")
    np.savez(index_path, language_index=cells // V, token_index=cells % V)
    out = str(tmp_path / "ddp.pt")
    mp.start_processes(worker, args=(2, str(tmp_path / "store"), index_path, out), nprocs=2, start_method="spawn")
    saved = torch.load(out)
    ddp_state = saved["state"]
    refused = saved["fused_refused"]
    assert "drift apart" in refused and "prepare_distributed" in refused and "SparseAdam" in refused

    # One process, the combined batch: DDP averages the two ranks' gradients,
    # so the loss is the mean of the two halves' losses.
    m = build(index_path)
    opts = optimisers(m)
    for tokens, langs, labels in batches():
        for o in opts:
            o.zero_grad()
        halves = [m(tokens[r * N : (r + 1) * N], langs[r * N : (r + 1) * N], labels[r * N : (r + 1) * N]) for r in range(2)]
        ((halves[0] + halves[1]) / 2).backward()
        for o in opts:
            o.step()
    start = build(index_path).state_dict()
    for k, v in m.state_dict().items():
        assert not torch.equal(v, start[k]), f"{k} did not train"
        torch.testing.assert_close(ddp_state[k], v, rtol=1e-5, atol=1e-6, msg=k)


FUSED = {"lr": 0.01}


def fused_batches(cut):
    """batches(), rank 1's part (from `cut` on) kept off the "new" split: a
    gradient that only one process has."""
    out = []
    for tokens, langs, labels in batches():
        tokens = tokens.clone()
        tokens[cut:] = tokens[cut:] % (V - 4)
        out.append((tokens, langs, labels))
    return out


def fused_worker(rank, world, store, index_path, out, cut):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from splitgrad.torch import prepare_distributed

    m = build(index_path, FUSED)
    if rank == 1:  # prepare_distributed starts every process from rank 0's weights
        with torch.no_grad():
            m.sv.rows.add_(1.0)
            m.emb.token_embedding["orig"].weight.mul_(2.0)
    ddp = torch.nn.parallel.DistributedDataParallel(prepare_distributed(m))
    opt = torch.optim.Adam(m.head.parameters(), lr=0.01)
    for tokens, langs, labels in fused_batches(cut):
        # Rank 0 takes tokens [0, cut), rank 1 the rest: uneven parts, which
        # the gathers pad and trim, or none at all.
        part = slice(0, cut) if rank == 0 else slice(cut, 2 * N)
        opt.zero_grad()
        ddp(tokens[part], langs[part], labels[part]).backward()
        opt.step()
    torch.save({k: v.clone() for k, v in m.state_dict().items()}, f"{out}.{rank}")
    # The DDP wrapper and its reducer go while the group is alive, not
    # after it at the function's return (gloo work outliving its group
    # can abort a process as it exits).
    del ddp
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("cut", [N + 5, 2 * N], ids=["uneven", "rank-1-empty"])
def test_fused_adam_under_two_gloo_processes_trains_like_one(tmp_path, cut):
    rng = np.random.default_rng(1)
    cells = np.sort(rng.choice(L * V, size=30, replace=False))
    index_path = str(tmp_path / "index.npz")
    np.savez(index_path, language_index=cells // V, token_index=cells % V)
    out = str(tmp_path / "fused")
    args = (2, str(tmp_path / "store"), index_path, out, cut)
    mp.start_processes(fused_worker, args=args, nprocs=2, start_method="spawn")
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    assert all((t[:cut] >= V - 4).any() and not (t[cut:] >= V - 4).any() for t, _, _ in fused_batches(cut))
    # The fused layers take the same step on both processes: the same bits.
    for k in ranks[0]:
        assert torch.equal(ranks[0][k], ranks[1][k]), k

    # One process on the combined batch. DDP averages the two ranks'
    # gradients: the mean of the halves' cross-entropies, the penalties once.
    m = build(index_path, FUSED)
    opt = torch.optim.Adam(m.head.parameters(), lr=0.01)
    for tokens, langs, labels in fused_batches(cut):
        opt.zero_grad()
        m(tokens, langs, labels, ce_weight=0.5).backward()
        opt.step()
    start = build(index_path).state_dict()
    for k, v in m.state_dict().items():
        assert not torch.equal(v, start[k]), f"{k} did not train"
        torch.testing.assert_close(ranks[0][k], v, rtol=1e-5, atol=1e-6, msg=k)


def bf16_worker(rank, world, store, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from splitgrad.torch import SplitTokenEmbeddings, prepare_distributed

    torch.manual_seed(0)
    emb = SplitTokenEmbeddings({"orig": V}, ["orig"], D, dtype=torch.bfloat16, fused_adam=FUSED)
    if rank == 1:  # prepare_distributed starts every process from rank 0's weights
        with torch.no_grad():
            emb.token_embedding["orig"].weight.mul_(2.0)
    prepare_distributed(emb)
    for tokens, _, _ in batches():
        part = tokens[rank * N : (rank + 1) * N]
        emb(part).float().square().sum().backward()
    torch.save({k: v.clone() for k, v in emb.state_dict().items()}, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def test_bf16_fused_adam_under_two_gloo_processes(tmp_path):
    out = str(tmp_path / "bf16")
    mp.start_processes(bf16_worker, args=(2, str(tmp_path / "store"), out), nprocs=2, start_method="spawn")
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    from splitgrad.torch import SplitTokenEmbeddings

    torch.manual_seed(0)
    one = SplitTokenEmbeddings({"orig": V}, ["orig"], D, dtype=torch.bfloat16, fused_adam=FUSED)
    start = {k: v.clone() for k, v in one.state_dict().items()}
    for tokens, _, _ in batches():  # the mean of the two halves' losses, one forward on one process
        (0.5 * one(tokens).float().square().sum()).backward()
    for k, v in one.state_dict().items():
        assert ranks[0][k].dtype == torch.bfloat16
        assert torch.equal(ranks[0][k].view(torch.int16), ranks[1][k].view(torch.int16)), k  # the same step on both
        assert not torch.equal(v, start[k])
        # the averaged gradient is summed in another order than one process sums it, so a
        # stochastic store may land one bf16 step away
        torch.testing.assert_close(ranks[0][k].float(), v.float(), rtol=2**-7, atol=2**-7, msg=k)

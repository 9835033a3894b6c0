"""Arguments a call would not honour are refused by name, where they were
once taken and ignored: conversions of a sharded layer (its kernels would
go on training their own buffers, and save_shards write stale rows),
shard / load_shards / gather_state_dict given what they cannot act on,
metadata that is no scalar,
sizes that are no integers, a layer moved to shared memory."""

import datetime
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")

import splitgrad  # noqa: E402
from splitgrad.torch import SplitTokenEmbeddings, SplitVocabulary  # noqa: E402

SIZES = {"orig": 7, "new": 3}


def emb(**kw):
    return SplitTokenEmbeddings(SIZES, list(SIZES), 4, **kw)


def test_a_layer_is_not_moved_to_shared_memory():
    e = emb(fused_adam={"lr": 0.1})
    with pytest.raises(ValueError, match="cannot move to shared memory: its parameters live in the kernels' buffers"):
        e.share_memory()


@pytest.mark.parametrize("value, kind", [(np.arange(2000), "ndarray"), ({"a": 1}, "dict"), (None, "NoneType"), ([1, 2], "list")])
def test_metadata_that_is_no_scalar_is_refused(tmp_path, value, kind):
    path = tmp_path / "c.safetensors"
    with pytest.raises(TypeError, match=f"metadata 'x': a {kind} is not stored \\(expected str, bool, int or float"):
        splitgrad.save_checkpoint(str(path), [emb()._core], metadata={"x": value})
    assert not path.exists()
    # Scalars, numpy's too, are kept and typed back.
    splitgrad.save_checkpoint(str(path), [emb()._core], metadata={"a": np.int64(3), "b": np.float32(0.5), "c": "s", "d": True})


def test_sizes_that_are_no_integers_are_refused(tmp_path):
    with pytest.raises(TypeError, match=r"hidden_size: expected an integer, got 3\.5"):
        SplitTokenEmbeddings(SIZES, list(SIZES), 3.5)
    path = tmp_path / "index.npz"
    np.savez(path, language_index=np.array([0, 1]), token_index=np.array([2, 3]))
    with pytest.raises(TypeError, match=r"dim: expected an integer, got 4\.7"):
        SplitVocabulary(path, 5, 4.7, 2)
    with pytest.raises(TypeError, match=r"vocab_size: expected an integer, got 5\.9"):
        SplitVocabulary(path, 5.9, 4, 2)


class Two(torch.nn.Module):
    def __init__(self, with_b=True):
        super().__init__()
        self.a = emb(fused_adam={"lr": 0.1})
        if with_b:
            self.b = emb(fused_adam={"lr": 0.1})


def _solo(rank, store, out, directory):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    from splitgrad.torch import gather_state_dict, load_shards, save_shards, shard

    got = {}

    def error(name, fn):
        try:
            fn()
            got[name] = None
        except Exception as e:  # noqa: BLE001 - the test compares the type and message
            got[name] = (type(e).__name__, str(e))

    m = shard(Two())
    before = m.a.token_embedding["orig"].detach().clone()
    error("half", lambda: m.half())
    error("double", lambda: m.a.double())
    error("share", lambda: m.share_memory())
    got["still_f32"] = m.a.token_embedding["orig"].dtype == torch.float32 and torch.equal(before, m.a.token_embedding["orig"].detach())
    error("nothing", lambda: shard(torch.nn.Sequential(torch.nn.Linear(2, 2))))
    error("dst", lambda: gather_state_dict(m, dst=5))
    save_shards(m, directory)
    error("unsharded", lambda: load_shards(Two(), directory))
    error("fewer", lambda: load_shards(shard(Two(with_b=False)), directory))
    # A state_dtype is kept by the sharded layer, as its other fused_adam options are.
    error("f32_state", lambda: shard(SplitTokenEmbeddings(SIZES, list(SIZES), 4, fused_adam={"lr": 0.1, "state_dtype": torch.float32})))
    # Half-precision layers shard, and take their activations in their own dtype only.
    from splitgrad.torch import SplitLanguageModellingHead

    half = shard(emb(dtype=torch.bfloat16, fused_adam={"lr": 0.1, "state_dtype": "bf16"}))
    error("float", lambda: half.float())
    index = os.path.join(os.path.dirname(directory), "index.npz")
    np.savez(index, language_index=np.array([0, 1]), token_index=np.array([2, 3]))
    sv = shard(SplitVocabulary(index, 5, 4, 2, dtype=torch.bfloat16, fused_adam={"lr": 0.1}))
    error("sv_shared", lambda: sv(torch.tensor([2, 3]), torch.tensor([0, 1]), torch.zeros(2, 4)))
    head = shard(SplitLanguageModellingHead(SIZES, list(SIZES), 4, dtype=torch.float16))
    error("head_hidden", lambda: head(torch.zeros(2, 4), torch.tensor([1, 2])))
    got["half_out"] = (half(torch.tensor([1, 8])).dtype, sv(torch.tensor([2, 3]), torch.tensor([0, 1]), torch.zeros(2, 4, dtype=torch.bfloat16)).dtype)
    table = torch.randn(5, 4).to(torch.bfloat16)
    sv.seed_from(table)  # a bf16 table, as the layer keeps its rows
    got["seeded"] = torch.equal(sv.rows.detach(), table[[2, 3]])
    torch.save(got, out)
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="gloo is not available")
def test_sharded_layers_refuse_what_they_would_not_honour(tmp_path):
    import torch.multiprocessing as mp

    out, store, directory = tmp_path / "got.pt", tmp_path / "store", tmp_path / "shards"
    mp.spawn(_solo, args=(str(store), str(out), str(directory)), nprocs=1, join=True)
    got = torch.load(out)
    conv = "cannot be converted {}: the sharded layers keep their rows as torch.float32 in the kernels' buffers, on the CPU (convert the layer before shard)"
    assert got["half"] == ("TypeError", "ShardedTokenEmbeddings " + conv.format("to torch.float16"))
    assert got["double"] == ("TypeError", "ShardedTokenEmbeddings " + conv.format("to torch.float64"))
    assert got["share"] == ("TypeError", "ShardedTokenEmbeddings " + conv.format("to shared memory"))
    assert got["still_f32"]
    assert got["nothing"] == ("ValueError", "shard: no SplitTokenEmbeddings, SplitVocabulary or SplitLanguageModellingHead in this Sequential (a subclass of them is not sharded)")
    assert got["dst"] == ("ValueError", "gather_state_dict: dst 5 is not a rank of the layers' group (expected 0 <= dst < 1)")
    assert got["unsharded"] == ("ValueError", f"load_shards: no sharded layer in this Two (call shard(model) first; {directory} holds layers `a`, `b`)")
    assert got["fewer"] == ("ValueError", f"load_shards: {directory} holds layers this model lacks: `b` (its sharded layers: `a`)")
    assert got["f32_state"] is None
    assert got["float"] == ("TypeError", "ShardedTokenEmbeddings cannot be converted to torch.float32: the sharded layers keep their rows as torch.bfloat16 in the kernels' buffers, on the CPU (convert the layer before shard)")
    assert got["sv_shared"] == ("ValueError", "array `shared`: has dtype torch.float32, expected torch.bfloat16 (the layer's dtype)")
    assert got["head_hidden"] == ("ValueError", "array `hidden_states`: has dtype torch.float32, expected torch.float16 (the layer's dtype)")
    assert got["half_out"] == (torch.bfloat16, torch.bfloat16)
    assert got["seeded"]

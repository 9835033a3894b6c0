"""Row-sharded layers on torch.distributed (gloo): ``shard``, ``gather_state_dict``,
``save_shards``, ``load_shards``, ``consolidate``.

Ownership: row ``g`` of a layer's vocabulary (the splits concatenated in
``split_order``) belongs to rank ``g % P`` of the group, where it is local row
``g // P``; a ``SplitVocabulary`` row belongs to rank ``token % P`` (all rows
of a token on one rank, so the fusion penalty's per-token centroids stay
local). A stride (a hash by residue) rather than contiguous blocks: a
tokenizer's frequent ids are its low ids, and a new split of a few trainable
rows sits at the end of the vocabulary, so contiguous blocks would put the
hot or the trainable rows, and their optimiser work, on one rank; the stride
spreads both evenly and keeps the owner and the local index one division away.
Resharding to another P is a re-stride of the full rows (``load_shards``).

Half precision: a bf16 or f16 layer shards with its ``fused_adam`` options
(``state_dtype``, ``rounding``, ``seed``); its rows, moments and activations
stay in their dtypes, the math in f32. Each rank's tables key their
stochastic roundings by their rows' places in the whole table
(``set_rounding_rows``), so a row draws the bits it draws unsharded.

Exchanges are ``torch.distributed.all_to_all_single`` (gloo has it, with
uneven splits), ``all_gather`` and ``all_reduce``; see docs/architecture.md.
The gradients are averaged over the processes (each owner's row gradient is
the sum of what every process sent, over P), as DistributedDataParallel
averages, so one process on the whole batch with its loss over P takes the
same steps.
"""

from __future__ import annotations

import collections
import datetime
import os
import tempfile
import threading
import time

import numpy as np
import torch
from torch import nn

from . import _splitgrad as _sg
from .torch import (
    _HALF,
    _INDEX_KEY,
    LM_IGNORE_INDEX,
    SequenceCausalLMOutput,
    SplitLanguageModellingHead,
    SplitTokenEmbeddings,
    SplitVocabulary,
    _act,
    _applied,
    _configured,
    _first_order,
    _graph_task,
    _half_np,
    _np_dtype,
    _out,
    _own_dtype,
    _table_in,
    _tensor_of,
)

dist = torch.distributed

__all__ = ["consolidate", "gather_state_dict", "load_shards", "save_shards", "shard"]


# --- collectives -------------------------------------------------------------


_COMMS = [0]  # how many _Comm this process has made: the same sequence on every process
_TIMED = {}  # (id(the caller's group), timeout) -> (that group, the group made from it)
_MADE = {}  # id(group) -> (group, timeout) for the groups made here


def _check_timeout(timeout) -> float:
    t = float(timeout)
    if not (t > 0 and t < float("inf")):
        raise ValueError(f"shard: timeout {timeout!r}, expected a finite number of seconds > 0")
    return t


def _alive(group) -> bool:
    try:
        return group in dist.distributed_c10d._world.pg_map
    except (AttributeError, TypeError):  # pragma: no cover - another torch
        return True


def _timed_group(group, timeout: float):
    """A group of ``group``'s processes (all of them when ``None``) whose
    collectives time out after ``timeout`` seconds: made once per group and
    timeout (a collective over those processes; every process makes the
    same calls), reused after, and returned as is when it is passed back."""
    made = _MADE.get(id(group))
    if made is not None and made[0] is group and made[1] == timeout and _alive(group):
        return group
    cached = _TIMED.get((id(group), timeout))
    if cached is not None and cached[0] is group and _alive(cached[1]):
        return cached[1]
    td = datetime.timedelta(seconds=timeout)
    if group is None:
        new = dist.new_group(timeout=td)
    else:
        new = dist.new_group(
            ranks=dist.get_process_group_ranks(group), timeout=td,
            backend=dist.get_backend(group), use_local_synchronization=True,
        )
    _MADE[id(new)] = (new, timeout)
    _TIMED[(id(group), timeout)] = (group, new)
    return new


def _within(fn, seconds):
    """``fn()`` run on a daemon thread; ``None`` if it has not returned (or
    it raised RuntimeError) within ``seconds``."""
    box = []

    def run():
        try:
            box.append(fn())
        except RuntimeError:
            box.append(None)

    th = threading.Thread(target=run, daemon=True, name="splitgrad-shard-store")
    th.start()
    th.join(seconds)
    return box[0] if box else None


class _Comm:
    """The group, this rank, and the bytes this rank has sent (``sent``).

    The exchanges run on a gloo group of their own over the same processes,
    made with ``timeout`` (seconds) as its timeout (``new_group(timeout=)``):
    a collective that some peer has not joined within ``timeout`` of this
    rank entering it fails, as does one whose peer died (gloo sees its
    connection close at once). Before each collective a rank records in the
    store how many it has entered; when one fails, the RuntimeError names
    the ranks that had not entered it (dead, or stalled between exchanges).
    If every peer had entered it (one stopped inside it), each survivor
    records in the store that it is alive and waits up to ``timeout`` more
    for the others' records, and names the ranks whose record never came.
    So a peer that dies or stalls stops the others with an error naming it
    within ``timeout`` of their entering the exchange it misses (2 ×
    ``timeout`` when it stopped inside an exchange, or when it hosts the
    store: then the error says the store did not answer). ``timeout`` must
    exceed the longest a rank may spend away from the exchanges while the
    others wait (a checkpoint write, an evaluation on one rank) and the
    longest single transfer (``gather_state_dict`` moves whole tables).
    """

    def __init__(self, group, timeout: float = 30.0):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("splitgrad.torch.shard needs torch.distributed initialised (init_process_group)")
        self.timeout = _check_timeout(timeout)
        self.group = _timed_group(group, self.timeout)
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.sent = 0
        self.seq = 0
        _COMMS[0] += 1
        self._prefix = f"splitgrad-shard/{_COMMS[0]}/"
        try:
            self._store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):  # pragma: no cover - another torch
            self._store = None

    def _run(self, what, fn, *args, **kw):
        self.seq += 1
        if self._store is not None:
            self._store.set(f"{self._prefix}{self.rank}", str(self.seq))
        try:
            return fn(*args, group=self.group, **kw)
        except RuntimeError as exc:
            raise RuntimeError(f"rank {self.rank}: {what} (exchange #{self.seq}) failed: {self._who()} ({exc})") from exc

    def _who(self) -> str:
        """The ranks that had not entered this rank's current collective, or
        (when all had) those that did not answer within ``timeout`` after it.
        The store is read from a daemon thread, waited for at most
        ``timeout`` (a TCPStore's ``check`` has no timeout of its own)."""
        if self._store is None:
            return "the failed peer is not known"
        others = [r for r in range(self.world) if r != self.rank]
        alive = f"{self._prefix}alive/{self.seq}/"

        def behind():
            self._store.set(f"{alive}{self.rank}", "1")
            late = []
            for r in others:
                key = f"{self._prefix}{r}"
                seen = int(self._store.get(key)) if self._store.check([key]) else 0
                if seen < self.seq:
                    late.append(f"rank {r} (it entered {seen} of them)")
            return late

        def mute():
            # Every peer entered it: the survivors answer in the store.
            deadline = time.monotonic() + self.timeout
            while True:
                left = [r for r in others if not self._store.check([f"{alive}{r}"])]
                if not left or time.monotonic() >= deadline:
                    return left
                time.sleep(0.02)

        late, left = _within(behind, self.timeout), []
        if late is not None and not late:
            left = _within(mute, self.timeout + 1.0)
        if late is None or (not late and left is None):
            return (
                f"the group's store did not answer within {self.timeout:g} s (the process hosting it, "
                "rank 0 unless a launcher's agent hosts it, may have died or be stalled)"
            )
        if late:
            return "did not reach it: " + ", ".join(late) + "; it died or stalls"
        if not left:
            return "every peer had entered it and is alive (the exchange itself failed)"
        names = ", ".join(f"rank {r}" for r in left)
        return f"{names} entered it but did not answer within {self.timeout:g} s after it failed; it died or stalls inside it"

    def all_to_all(self, send: torch.Tensor, out_counts, in_counts) -> torch.Tensor:
        send = send.contiguous()
        out = send.new_empty((int(sum(in_counts)),) + tuple(send.shape[1:]))
        self.sent += send.numel() * send.element_size()
        self._run(
            "all_to_all_single", dist.all_to_all_single, out, send,
            output_split_sizes=list(in_counts), input_split_sizes=list(out_counts),
        )
        return out

    def counts(self, out_counts: torch.Tensor):
        """Each rank's count for this rank, given this rank's count for each."""
        got = torch.empty_like(out_counts)
        self.sent += out_counts.numel() * 8
        self._run("all_to_all_single (counts)", dist.all_to_all_single, got, out_counts.contiguous())
        return got.tolist()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        self.sent += t.numel() * t.element_size()
        self._run("all_reduce", dist.all_reduce, t)
        return t

    def gather_rows(self, t: torch.Tensor):
        """Every rank's ``t`` (n_p, ...) concatenated in rank order, and the n_p."""
        t = t.contiguous()
        n = torch.tensor([t.shape[0]], dtype=torch.int64)
        ns = [torch.empty_like(n) for _ in range(self.world)]
        self.sent += 8
        self._run("all_gather (sizes)", dist.all_gather, ns, n)
        ns = [int(x) for x in ns]
        padded = t.new_zeros((max(ns),) + tuple(t.shape[1:]))
        padded[: t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        self.sent += padded.numel() * padded.element_size()
        self._run("all_gather", dist.all_gather, parts, padded)
        return torch.cat([p[:k] for p, k in zip(parts, ns)]), ns


class _Route:
    """Items sent to their owners and answers brought back in the items' order."""

    def __init__(self, comm: _Comm, owner: torch.Tensor):
        self.comm = comm
        self.order = torch.argsort(owner, stable=True)
        self.out_counts = torch.bincount(owner, minlength=comm.world).to(torch.int64)
        self.in_counts = comm.counts(self.out_counts)
        self.out_list = self.out_counts.tolist()

    def send(self, t: torch.Tensor) -> torch.Tensor:
        """Items (in the items' order) to their owners: what this rank receives."""
        return self.comm.all_to_all(t[self.order], self.out_list, self.in_counts)

    def back(self, t: torch.Tensor) -> torch.Tensor:
        """Answers to what this rank received, returned to the senders, in their items' order."""
        got = self.comm.all_to_all(t, self.in_counts, self.out_list)
        out = torch.empty_like(got)
        out[self.order] = got
        return out


def _strided(sizes, order, world, rank):
    """Local split sizes (rows g of the concatenation with g % world == rank)."""
    out, off = {}, 0
    for s in order:
        n = sizes[s]
        first = (-(off - rank)) % world  # the first row of this split that rank owns, from the split's start
        out[s] = 0 if first >= n else (n - first + world - 1) // world
        off += n
    return out


def _local_rows(sizes, order, world, rank):
    """For each split, the split-relative rows this rank owns (an int64 array)."""
    out, off = {}, 0
    for s in order:
        g = np.arange(off, off + sizes[s], dtype=np.int64)
        out[s] = (g[g % world == rank] - off)
        off += sizes[s]
    return out


class _Sharded(nn.Module):
    """What the three sharded layers share: the group, their parameters on the local kernels' buffers."""

    def _apply(self, fn, recurse=True):
        # .half(), .to(dtype), .double(), .cuda(), .share_memory(): the kernels train their own
        # buffers, which torch's copies would leave behind (and save_shards would write stale rows).
        out = _applied(fn, self._dtype)
        if out is not None and (out.dtype != self._dtype or out.device.type != "cpu" or out.is_shared()):
            what = f"to {out.device}" if out.device.type != "cpu" else "to shared memory" if out.is_shared() else f"to {out.dtype}"
            raise TypeError(
                f"{type(self).__name__} cannot be converted {what}: the sharded layers keep their rows as "
                f"{self._dtype} in the kernels' buffers, on the CPU (convert the layer before shard)"
            )
        return super()._apply(fn, recurse)

    def _init_comm(self, group, timeout):
        self._comm = _Comm(group, timeout)
        self.world, self.rank = self._comm.world, self._comm.rank

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has sent in this layer's exchanges so far."""
        return self._comm.sent

    def _sync_trainable(self):
        for name, p in self._local_params():
            if self._core is not None and self._core.is_trainable(name) != bool(p.requires_grad):
                self._core.set_parameter_trainable(name, bool(p.requires_grad))

    def local_state(self):
        """{name: (full shape, this rank's rows of it (split-relative, int64) or None, local tensor)}."""
        raise NotImplementedError

    def _state_params(self):
        """{name (as in ``local_state``): the parameter holding this rank's rows}."""
        raise NotImplementedError

    def _fused_state(self):
        return {}

    def _set_fused_state(self, state):
        """Puts back a state ``_fused_state`` gave (empty: no state)."""


def _param(core, name):
    return nn.Parameter(_tensor_of(core, name))


_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _int_ids(t, what: str) -> torch.Tensor:
    """`t` flattened as int64 ids, refused unless it is a CPU tensor of an integer dtype (as the
    unsharded layers refuse it): a float, bool or complex id is not cut toward zero."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"array `{what}`: expected a torch tensor of integer ids, got {type(t).__name__}")
    if t.dtype not in _ID_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _ID_DTYPES)
        raise ValueError(f"array `{what}`: has dtype {t.dtype}, expected an integer dtype ({names})")
    if t.device.type != "cpu":
        raise ValueError(f"array `{what}`: is on {t.device}, expected a CPU tensor")
    return t.reshape(-1).to(torch.int64)


def _check_ids(flat: torch.Tensor, n: int, what: str):
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= n):
        bad = int(torch.nonzero((flat < 0) | (flat >= n))[0])
        raise ValueError(f"array `{what}`: at position {bad}: id {int(flat[bad])}, expected 0 <= id < {n}")


# --- embeddings --------------------------------------------------------------


class _ShardedEmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m, ids, anchor):
        flat = ids.reshape(-1).to(torch.int64)
        uniq, inv = torch.unique(flat, return_inverse=True)
        route = _Route(m._comm, uniq % m.world)
        asked = route.send(uniq // m.world)
        rows = _out(m, m._core.forward(asked.numpy(), act=_act(m))) if asked.numel() else torch.zeros((0, m.hidden), dtype=m._dtype)
        got = route.back(rows)
        ctx.m, ctx.route, ctx.asked, ctx.inv, ctx.n_uniq, ctx.uniq = m, route, asked, inv, uniq.numel(), uniq
        return got[inv].reshape(tuple(ids.shape) + (m.hidden,))

    @staticmethod
    def backward(ctx, grad):
        _first_order(ctx, "sharded SplitTokenEmbeddings")
        m = ctx.m
        # Each id's rows summed in the engine's dtype (a half layer's upstream
        # gradient widened first, as the unsharded kernel sums it).
        g = grad.reshape(-1, m.hidden).to(m._engine)
        gu = g.new_zeros((ctx.n_uniq, m.hidden)).index_add_(0, ctx.inv, g)
        got = ctx.route.send(gu)
        # The splits any process's batch reached: each takes a step everywhere (its step count moves).
        reached = torch.zeros(len(m._order), dtype=torch.float64)
        if ctx.uniq.numel():
            reached[torch.unique(torch.bucketize(ctx.uniq, m._ends, right=True))] = 1.0
        m._comm.all_reduce(reached)
        grads = m._core.backward(ctx.asked.numpy(), got.numpy())
        parts = {}
        for name, seen in zip(m._names, reached.tolist()):
            if seen == 0 or not m._core.is_trainable(name):
                continue
            if name in grads:
                parts[name] = (np.array(grads.rows(name)), np.array(grads.values(name)))
            else:
                parts[name] = (np.zeros(0, np.int64), np.zeros((0, m.hidden), dtype=_np_dtype(m._engine)))
        if parts:
            m._fused.step(m._core, _sg.Gradients.from_parts(m._core, parts, 1.0 / m.world))
        return None, None, None


class ShardedTokenEmbeddings(_Sharded):
    """``SplitTokenEmbeddings`` whose rows and fused Adam state are split over a group (see the module doc)."""

    def __init__(self, full: SplitTokenEmbeddings, process_group=None, timeout: float = 30.0):
        super().__init__()
        if full._fused is None:
            raise ValueError("shard(SplitTokenEmbeddings): build it with fused_adam=...; the owner of a row applies its step")
        self._init_comm(process_group, timeout)
        full._sync()
        self._order = list(full._split_order)
        self._sizes = {s: shape[0] for s, shape in zip(self._order, full._shapes)}
        self.hidden = int(full._shapes[0][1]) if full._shapes else 0
        self.vocab = sum(self._sizes.values())
        self._ends = torch.tensor(np.cumsum([self._sizes[s] for s in self._order]), dtype=torch.int64)
        self._dtype, self._engine = full._dtype, full._engine
        self._names = [f"token_embedding.{s}.weight" for s in self._order]
        local = _strided(self._sizes, self._order, self.world, self.rank)
        self._rows = _local_rows(self._sizes, self._order, self.world, self.rank)
        self._core = _sg.SplitTokenEmbeddings(
            local, self._order, self.hidden, dtype=_np_dtype(self._engine), storage=_HALF.get(self._dtype)
        )
        self.token_embedding = nn.ParameterDict()
        for s, name in zip(self._order, self._names):
            # Each row's stochastic roundings draw the bits of its place in the whole table.
            self._core.set_rounding_rows(name, self._rows[s])
            p = _param(self._core, name)
            with torch.no_grad():
                p.copy_(full.token_embedding[s].weight[torch.from_numpy(self._rows[s])])
            p.requires_grad_(full.token_embedding[s].weight.requires_grad)
            self.token_embedding[s] = p
        self._fused_cfg, self._fused_opts = full._fused_cfg, full._fused_opts
        self._fused = _configured(_sg.Optimizer.lazy_adam(*self._fused_cfg, _np_dtype(self._engine)), self._fused_opts)
        self._load_fused(full.fused_optimizer_state() or {}, full=True)
        self._anchor = torch.zeros((), dtype=self._dtype, requires_grad=True)

    def _local_params(self):
        return [(n, self.token_embedding[s]) for s, n in zip(self._order, self._names)]

    def _state_params(self):
        return dict(self._local_params())

    def _load_fused(self, state, full):
        """Loads a fused Adam state (of the full table when ``full``, else of this rank's rows)."""
        if not state:
            return
        own = {}
        for key, v in state.items():
            v = np.asarray(v)
            name = key.rsplit(".", 1)[0]
            split = name.split(".")[1]
            own[key] = v[self._rows[split]] if full and v.ndim >= 1 else v
        self._fused.load_state_dict(own, self._core)

    def _fused_state(self):
        return self._fused.state_dict()

    def _set_fused_state(self, state):
        self._fused.load_state_dict(dict(state), self._core)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        _check_ids(_int_ids(input_ids, "input_ids"), self.vocab, "input_ids")
        self._sync_trainable()
        anchor = self._anchor if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()) else self._anchor.detach()
        return _ShardedEmbeddingFunction.apply(self, input_ids, anchor)

    def local_state(self):
        return {
            n: ((self._sizes[s], self.hidden), self._rows[s], self.token_embedding[s].detach())
            for s, n in zip(self._order, self._names)
        }


# --- split vocabulary --------------------------------------------------------


class _ShardedVocabularyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m, use_gate, tokens, langs, shared, anchor):
        t = _int_ids(tokens, "token_ids")
        l_ = _int_ids(langs, "lang_per_token")
        if m._dtype != m._engine:
            _own_dtype(m, shared, "shared")
        s = shared.reshape(-1, m.dim)
        if not (t.shape[0] == l_.shape[0] == s.shape[0]):
            raise ValueError(f"token_ids, lang_per_token and shared hold {t.shape[0]}, {l_.shape[0]}, {s.shape[0]} tokens")
        _check_ids(t, m.vocab, "token_ids")
        _check_ids(l_, m.n_languages, "lang_per_token")
        keys = (l_ * m.vocab + t).numpy()
        pos = np.searchsorted(m._keys, keys)
        has = torch.from_numpy((pos < m._keys.size) & (m._keys[np.minimum(pos, max(m._keys.size - 1, 0))] == keys) if m._keys.size else np.zeros(keys.shape, bool))
        idx = torch.nonzero(has).reshape(-1)
        route = _Route(m._comm, t[idx] % m.world)
        ask_ids = route.send(torch.stack([t[idx], l_[idx]], 1))
        ask_s = route.send(s[idx].detach())
        if ask_ids.shape[0]:
            ans = _out(m, m._core.forward(ask_ids[:, 0].numpy(), ask_ids[:, 1].numpy(), _half_np(ask_s), use_gate, act=_act(m)))
        else:
            ans = ask_s.new_zeros((0, m.dim))
        got = route.back(ans)
        out = s.detach().clone()
        out[idx] = got
        ctx.m, ctx.use_gate, ctx.route, ctx.idx, ctx.ask = m, use_gate, route, idx, (ask_ids, ask_s)
        ctx.shape = tuple(shared.shape)
        return out.reshape(ctx.shape)

    @staticmethod
    def backward(ctx, grad):
        _first_order(ctx, "sharded SplitVocabulary")
        m = ctx.m
        g = grad.reshape(-1, m.dim)
        got = ctx.route.send(g[ctx.idx].contiguous())
        ask_ids, ask_s = ctx.ask
        if got.shape[0]:
            gs, grads = m._core.backward(
                ask_ids[:, 0].numpy(), ask_ids[:, 1].numpy(), _half_np(ask_s), _half_np(got), ctx.use_gate, True,
                act=_act(m),
            )
            ans = _out(m, gs)
        else:
            grads, ans = None, got.new_zeros((0, m.dim))
        back = ctx.route.back(ans)
        out = g.clone()
        out[ctx.idx] = back
        m._defer(grads=grads)
        return None, None, None, None, out.reshape(ctx.shape), None


class _ShardedPenaltyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m, kind, anchor):
        local = 0.0
        if m._core is not None:
            local = (m._core.penalty() if kind == "penalty" else m._core.fusion_penalty()) * m.n_local
        total = m._comm.all_reduce(torch.tensor([local], dtype=torch.float64))
        ctx.m, ctx.kind = m, kind
        return torch.tensor(float(total) / m.n_rows, dtype=m._dtype)

    @staticmethod
    def backward(ctx, grad):
        _first_order(ctx, f"sharded SplitVocabulary.{ctx.kind}")
        ctx.m._defer(**{ctx.kind: float(grad)})
        return None, None, None


class ShardedVocabulary(_Sharded):
    """``SplitVocabulary`` whose rows, gates and fused optimiser state are split
    over a group by token (``token % P``). ``forward``, ``penalty`` and
    ``fusion_penalty`` are collectives: every process calls them in the same order."""

    def __init__(self, full: SplitVocabulary, process_group=None, timeout: float = 30.0):
        super().__init__()
        if full._fused is None:
            raise ValueError("shard(SplitVocabulary): build it with fused_adam=...; the owner of a row applies its step")
        self._init_comm(process_group, timeout)
        full._sync()
        lang, tok = (np.asarray(a, dtype=np.int64) for a in full._core.index())
        self.n_rows, self.dim = full.n_rows, full.dim
        self._dtype, self._engine = full._dtype, full._engine
        self.vocab, self.n_languages = int(full._core.vocab_size), int(full._core.n_languages)
        # The index's name, as the unsharded layer's state dict gives it: saved
        # with the shards and in gathered state dicts, refused by another index.
        self._index_id = full._index_name()
        self._keys = np.sort(lang * self.vocab + tok)
        mine = np.nonzero(tok % self.world == self.rank)[0]
        self._rows = {"rows": mine, "gate_logit": mine}
        self.n_local = int(mine.size)
        self._core = None
        if self.n_local:
            self._core = _sg.SplitVocabulary(
                lang[mine], tok[mine], self.vocab, self.dim, self.n_languages, 0.0, _np_dtype(self._engine),
                storage=_HALF.get(self._dtype),
            )
            for name in ("split_vocabulary.rows", "split_vocabulary.gate_logit"):
                self._core.set_rounding_rows(name, mine)
            self.rows = _param(self._core, "split_vocabulary.rows")
            self.gate_logit = _param(self._core, "split_vocabulary.gate_logit")
        else:
            self.rows = nn.Parameter(torch.zeros((0, self.dim), dtype=self._dtype))
            self.gate_logit = nn.Parameter(torch.zeros((0,), dtype=self._dtype))
        sel = torch.from_numpy(mine)
        with torch.no_grad():
            self.rows.copy_(full.rows[sel])
            self.gate_logit.copy_(full.gate_logit[sel])
        self.rows.requires_grad_(full.rows.requires_grad)
        self.gate_logit.requires_grad_(full.gate_logit.requires_grad)
        lr, betas, eps = full._fused_cfg
        self._fused_opts = full._fused_opts
        name, opts = _np_dtype(self._engine), self._fused_opts
        self._fused = (
            _configured(_sg.Optimizer.lazy_adam(lr, betas, eps, name), opts),
            _configured(_sg.Optimizer.adam(lr, betas, eps, 0.0, False, name), opts),
        )
        states = full.fused_optimizer_state()
        if states is not None:
            self._load_fused(list(states), full=True)
        self._pending = None
        self._anchor = torch.zeros((), dtype=self._dtype, requires_grad=True)

    def _local_params(self):
        return [("split_vocabulary.rows", self.rows), ("split_vocabulary.gate_logit", self.gate_logit)]

    def _state_params(self):
        return {"rows": self.rows, "gate_logit": self.gate_logit}

    def _load_fused(self, states, full):
        if self._core is None:
            return
        for opt, st in zip(self._fused, states):
            own = {k: (np.asarray(v)[self._rows["rows"]] if full and np.asarray(v).ndim >= 1 else np.asarray(v)) for k, v in st.items()}
            if own:
                opt.load_state_dict(own, self._core)

    def _fused_state(self):
        if self._core is None:
            return {}
        out = {}
        for i, opt in enumerate(self._fused):
            for k, v in opt.state_dict().items():
                out[f"{i}:{k}"] = v
        return out

    def _set_fused_state(self, state):
        if self._core is None:
            return
        for i, opt in enumerate(self._fused):
            opt.load_state_dict({k.split(":", 1)[1]: v for k, v in state.items() if k.startswith(f"{i}:")}, self._core)

    def _defer(self, grads=None, penalty=0.0, fusion_penalty=0.0):
        # A step left by a backward pass that raised before it ended goes
        # with it (every process's pass raised, or the exchange names the
        # one that did not).
        if self._pending is not None and self._pending["task"] != _graph_task():
            self._pending = None
        if self._pending is None:
            self._pending = {"grads": [], "penalty": 0.0, "fusion": 0.0, "task": _graph_task()}
            torch.autograd.Variable._execution_engine.queue_callback(self._fused_step)
        p = self._pending
        if grads is not None:
            p["grads"].append(grads)
        p["penalty"] += penalty
        p["fusion"] += fusion_penalty

    def _fused_step(self):
        p, self._pending = self._pending, None
        # The penalties' weights, averaged over the processes; each rank's
        # penalties are its rows' share (n_local / n_rows) of the means.
        w = self._comm.all_reduce(torch.tensor([p["penalty"], p["fusion"]], dtype=torch.float64))
        if self._core is None:
            return
        share = self.n_local / self.n_rows / self.world
        grads = []
        for g in p["grads"]:
            parts = {}
            for name in g.names():
                parts[name] = (np.array(g.rows(name)) if g.is_sparse(name) else None, np.array(g.values(name)))
            grads.append(_sg.Gradients.from_parts(self._core, parts, 1.0 / self.world))
        self._core.fused_step(grads, float(w[0]) * share, float(w[1]) * share, *self._fused, None)

    def _anchored(self):
        on = torch.is_grad_enabled() and (self.rows.requires_grad or self.gate_logit.requires_grad)
        return self._anchor if on else self._anchor.detach()

    def forward(self, token_ids, lang_per_token, shared: torch.Tensor, use_gate: bool = True) -> torch.Tensor:
        self._sync_trainable()
        t = token_ids if isinstance(token_ids, torch.Tensor) else torch.as_tensor(np.asarray(token_ids))
        l_ = lang_per_token if isinstance(lang_per_token, torch.Tensor) else torch.as_tensor(np.asarray(lang_per_token))
        return _ShardedVocabularyFunction.apply(self, bool(use_gate), t, l_, shared, self._anchored())

    def penalty(self) -> torch.Tensor:
        self._sync_trainable()
        return _ShardedPenaltyFunction.apply(self, "penalty", self._anchored())

    def fusion_penalty(self) -> torch.Tensor:
        self._sync_trainable()
        return _ShardedPenaltyFunction.apply(self, "fusion_penalty", self._anchored())

    @torch.no_grad()
    def seed_from(self, table: torch.Tensor) -> None:
        if self._core is not None:
            self._core.seed_from(_table_in(self, table))

    def local_state(self):
        return {
            "rows": ((self.n_rows, self.dim), self._rows["rows"], self.rows.detach()),
            "gate_logit": ((self.n_rows,), self._rows["gate_logit"], self.gate_logit.detach()),
        }


# --- vocabulary-parallel head ------------------------------------------------


class _ShardedHeadFunction(torch.autograd.Function):
    """Megatron's vocabulary-parallel cross-entropy through the fused kernel.

    Every rank runs the kernel on every token against its V/P rows with a
    local label (the token's, where this rank owns it, else local row 0):
    its loss plus that label's logit is the slice's log-sum-exp. The slices'
    log-sum-exps and label logits are gathered and combined. The backward
    runs the kernel with each token's upstream gradient times
    exp(lse_slice − lse), which gives the slice's softmax share, and a
    rank-one correction per token at its local label row (O(N·H)) replaces
    the local one-hot by the true one."""

    @staticmethod
    def forward(ctx, m, hidden, labels, anchor, *weights):
        if m._dtype != m._engine:
            _own_dtype(m, hidden, "hidden_states")
        h = hidden.reshape(-1, m.hidden).detach()
        lab = _int_ids(labels, "labels")
        if lab.shape[0] != h.shape[0]:
            raise ValueError(f"labels hold {lab.shape[0]} tokens, hidden_states {h.shape[0]}")
        comm = m._comm
        # Gathered in the layer's dtype, then widened (exactly) to the engine's:
        # a half layer's kernels and the slices' combination compute in f32.
        h_all, ns = comm.gather_rows(h)
        h_all = h_all.to(m._engine)
        lab_all, _ = comm.gather_rows(lab)
        ignored = lab_all == LM_IGNORE_INDEX
        bad = ~ignored & ((lab_all < 0) | (lab_all >= m.vocab))
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise ValueError(f"array `labels`: at position {i} of the gathered batch: label {int(lab_all[i])}, expected -100 or 0 <= label < {m.vocab}")
        local = ~ignored & (lab_all % m.world == m.rank)
        lab_p = torch.where(local, lab_all // m.world, torch.zeros_like(lab_all))
        loss_p, saved = m._core.forward_saved(h_all.numpy(), lab_p.numpy())
        w_sel = m._rows_of(lab_p)
        z = (h_all * w_sel).sum(1)
        lse_p = torch.from_numpy(loss_p) + z
        stats, _ = comm.gather_rows(torch.stack([lse_p, torch.where(local, z, torch.zeros_like(z))]).reshape(1, -1))
        stats = stats.reshape(m.world, 2, -1)
        lse = torch.logsumexp(stats[:, 0], 0)
        zlab = stats[:, 1].sum(0)
        loss = torch.where(ignored, torch.zeros_like(lse), lse - zlab)
        start = sum(ns[: m.rank])
        ctx.m, ctx.saved, ctx.ns, ctx.start = m, saved, ns, start
        ctx.state = (h_all, lab_p, local, lse_p, lse, w_sel, ignored)
        ctx.shape = tuple(hidden.shape)
        return loss[start : start + ns[m.rank]].reshape(tuple(labels.shape)).to(m._dtype)

    @staticmethod
    def backward(ctx, grad):
        _first_order(ctx, "sharded SplitLanguageModellingHead")
        m = ctx.m
        h_all, lab_p, local, lse_p, lse, w_sel, ignored = ctx.state
        g_all, _ = m._comm.gather_rows(grad.reshape(-1).contiguous())
        g_all = g_all.to(m._engine)
        g_all = torch.where(ignored, torch.zeros_like(g_all), g_all)  # an ignored token's loss is the constant 0
        share = torch.exp(lse_p - lse)
        g_p = g_all * share
        gh, grads = m._core.backward(h_all.numpy(), lab_p.numpy(), g_p.numpy(), hidden_grad=True, saved=ctx.saved)
        c = g_p - torch.where(local, g_all, torch.zeros_like(g_all))
        gh = torch.from_numpy(gh) + c.unsqueeze(1) * w_sel
        m._comm.all_reduce(gh)
        out_h = gh[ctx.start : ctx.start + ctx.ns[m.rank]].reshape(ctx.shape).to(m._dtype)
        out_w = []
        for (lo, hi), name, need in zip(m._ranges, m._names, ctx.needs_input_grad[4:]):
            if not need:
                out_w.append(None)
                continue
            if name in grads:
                w = torch.from_numpy(np.array(grads.dense(name) if grads.is_sparse(name) else grads.values(name)))
            else:
                w = torch.zeros((hi - lo, m.hidden), dtype=m._engine)
            sel = (lab_p >= lo) & (lab_p < hi)
            w.index_add_(0, lab_p[sel] - lo, c[sel].unsqueeze(1) * h_all[sel])
            out_w.append((w / m.world).to(m._dtype))
        return (None, out_h, None, None, *out_w)


class ShardedLanguageModellingHead(_Sharded):
    """``SplitLanguageModellingHead`` over V/P rows per process (row g on rank g % P).

    ``forward(hidden_states, shared)``: each process passes its own tokens'
    hidden states and labels and gets their per-token cross-entropy. The
    hidden states and labels are all-gathered (every vocabulary slice needs
    every token), each rank's slice gives its log-sum-exp for every token,
    those are all-gathered (2·N reals a rank) and combined; the backward
    all-reduces the hidden states' gradient (N·H reals). N × V is never
    formed. The weights' gradients stay local (averaged over the processes,
    as DistributedDataParallel averages) for a torch optimiser.
    """

    def __init__(self, full: SplitLanguageModellingHead, process_group=None, timeout: float = 30.0):
        super().__init__()
        self._init_comm(process_group, timeout)
        full._sync()
        self._order = list(full._split_order)
        self._sizes = {s: shape[0] for s, shape in zip(self._order, full._shapes)}
        self.hidden = int(full._shapes[0][1])
        self.vocab = sum(self._sizes.values())
        if self.vocab < self.world:
            raise ValueError(f"shard(SplitLanguageModellingHead): {self.vocab} rows cannot be split over {self.world} processes")
        self._dtype, self._engine = full._dtype, full._engine
        self._names = [f"lm_head.{s}.weight" for s in self._order]
        local = _strided(self._sizes, self._order, self.world, self.rank)
        self._rows = _local_rows(self._sizes, self._order, self.world, self.rank)
        self._core = _sg.SplitLanguageModellingHead(
            local, self._order, self.hidden, dtype=_np_dtype(self._engine), storage=_HALF.get(self._dtype)
        )
        self.lm_head = nn.ParameterDict()
        self._ranges, lo = [], 0
        for s, name in zip(self._order, self._names):
            p = _param(self._core, name)
            with torch.no_grad():
                p.copy_(full.lm_head[s].weight[torch.from_numpy(self._rows[s])])
            p.requires_grad_(full.lm_head[s].weight.requires_grad)
            self.lm_head[s] = p
            self._ranges.append((lo, lo + local[s]))
            lo += local[s]
        self._anchor = torch.zeros((), dtype=self._dtype, requires_grad=True)

    def _local_params(self):
        return [(n, self.lm_head[s]) for s, n in zip(self._order, self._names)]

    def _state_params(self):
        return dict(self._local_params())

    def _rows_of(self, lab_p):
        """The local rows ``lab_p``, in the engine's dtype."""
        out = torch.zeros((lab_p.shape[0], self.hidden), dtype=self._engine)
        for (lo, hi), s in zip(self._ranges, self._order):
            sel = (lab_p >= lo) & (lab_p < hi)
            out[sel] = self.lm_head[s].detach()[lab_p[sel] - lo].to(self._engine)
        return out

    def forward(self, hidden_states: torch.Tensor, shared) -> SequenceCausalLMOutput:
        labels = shared.labels if hasattr(shared, "labels") else shared
        self._sync_trainable()
        weights = [self.lm_head[s] for s in self._order]
        losses = _ShardedHeadFunction.apply(self, hidden_states, labels, self._anchor, *weights)
        return SequenceCausalLMOutput(cross_entropy=losses)

    def local_state(self):
        return {
            n: ((self._sizes[s], self.hidden), self._rows[s], self.lm_head[s].detach())
            for s, n in zip(self._order, self._names)
        }


# --- the interface -----------------------------------------------------------

_KINDS = {
    SplitTokenEmbeddings: ShardedTokenEmbeddings,
    SplitVocabulary: ShardedVocabulary,
    SplitLanguageModellingHead: ShardedLanguageModellingHead,
}


def shard(module: nn.Module, process_group=None, timeout: float = 30.0) -> nn.Module:
    """The sharded form of ``module``; call it on every process after
    ``init_process_group`` and before ``DistributedDataParallel``.

    A ``SplitTokenEmbeddings`` or ``SplitVocabulary`` (built with
    ``fused_adam``) or a ``SplitLanguageModellingHead``: returns its sharded
    module, holding this rank's rows (copied from ``module``, which the caller
    may then drop). Any other module: each of those layers inside it is
    replaced by its sharded module, every sharded module's parameters are left
    out of DistributedDataParallel's buckets, and ``module`` is returned.
    A layer in bfloat16 or float16 stays so (its rows, activations and fused
    optimiser state, with its ``fused_adam`` options), each row rounding as it
    would unsharded. ``process_group``: the processes (default: all of them); the exchanges
    run on a new group of those processes whose collectives time out after
    ``timeout`` seconds. A peer that dies or stalls (alive but not joining
    an exchange) makes every other rank raise a RuntimeError naming it
    within ``timeout`` of entering the exchange it misses (2 × ``timeout``
    if it stopped inside one or hosts the store), never a hang; ``timeout`` must exceed the
    longest a rank may be away from the exchanges while the others wait
    (a checkpoint write, an evaluation on one rank) and the longest single
    transfer (``gather_state_dict`` moves whole tables). After that error the
    group is unusable."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("splitgrad.torch.shard needs torch.distributed initialised (init_process_group)")
    timeout = _check_timeout(timeout)
    group = _timed_group(process_group, timeout)
    kind = _KINDS.get(type(module))
    if kind is not None:
        return kind(module, group, timeout)
    found = False
    for prefix, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            kind = _KINDS.get(type(child))
            if kind is not None:
                setattr(parent, name, kind(child, group, timeout))
                found = True
    if not found:
        raise ValueError(
            f"shard: no SplitTokenEmbeddings, SplitVocabulary or SplitLanguageModellingHead in this "
            f"{type(module).__name__} (a subclass of them is not sharded)"
        )
    ignored = [n for n, _ in _sharded_params(module)]
    if ignored:
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ignored)
    return module


def _sharded_params(model):
    for prefix, mod in model.named_modules():
        if isinstance(mod, _Sharded):
            for name, _ in mod.named_parameters():
                yield (f"{prefix}.{name}" if prefix else name), mod


def _sharded_modules(model):
    if isinstance(model, _Sharded):
        return [("", model)]
    return [(p, m) for p, m in model.named_modules() if isinstance(m, _Sharded)]


def _key(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _d9d_name(mod, name):
    """The local state's name as the full module's state dict calls it."""
    return name


def gather_state_dict(sharded: nn.Module, dst: int = 0):
    """The full state dict of ``sharded`` (a sharded layer or a model holding
    them) under d9d's names, on rank ``dst`` of the layers' group; ``None``
    elsewhere. A collective: every process calls it."""
    mods = _sharded_modules(sharded)
    if not mods:
        raise ValueError("gather_state_dict: no sharded layer in this module")
    world = mods[0][1]._comm.world
    if isinstance(dst, bool) or not isinstance(dst, (int, np.integer)) or not 0 <= int(dst) < world:
        raise ValueError(f"gather_state_dict: dst {dst!r} is not a rank of the layers' group (expected 0 <= dst < {world})")
    out = {}
    rank_is_dst = None
    for prefix, mod in mods:
        comm = mod._comm
        rank_is_dst = comm.rank == dst
        for name, (shape, rows, t) in mod.local_state().items():
            t = t.contiguous()
            idx = torch.from_numpy(rows)
            all_t, _ = comm.gather_rows(t)
            all_i, _ = comm.gather_rows(idx)
            if rank_is_dst:
                full = t.new_zeros(shape)
                full[all_i] = all_t
                out[_key(prefix, name)] = full
    if not rank_is_dst:
        return None
    out.update({k: v.clone() for k, v in _dense_state(sharded, mods).items()})
    return _named_indexes(out, {prefix: mod._index_id for prefix, mod in mods if isinstance(mod, ShardedVocabulary)})


def _named_indexes(state: dict, indexes: dict) -> collections.OrderedDict:
    """``state`` as a state dict whose metadata names each split vocabulary's
    index (``indexes``: layer prefix → name), as ``SplitVocabulary.state_dict``
    does, so that ``load_state_dict`` refuses it on a layer of another index."""
    out = collections.OrderedDict(state)
    out._metadata = collections.OrderedDict((prefix, {_INDEX_KEY: name}) for prefix, name in indexes.items())
    return out


def _atomic_save(obj, path):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _optimizer_params(model, optimizer):
    """[(group, [(parameter name in ``model``, parameter)])] for ``optimizer``'s groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for gi, group in enumerate(optimizer.param_groups):
        ps = []
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError(f"optimizer: a parameter of group {gi} (shape {tuple(p.shape)}) is not a parameter of the model")
            ps.append((names[id(p)], p))
        out.append((group, ps))
    return out


def _sharded_owner(mods):
    """{id(parameter): (layer prefix, local name)} for the sharded layers' parameters."""
    return {id(p): (prefix, n) for prefix, mod in mods for n, p in mod._state_params().items()}


def _optimizer_shard(model, mods, optimizer, rank):
    """This rank's part of ``optimizer``'s state: per sharded layer, each
    parameter's state split into row tensors (the parameter's shape: its
    rows) and the rest; on rank 0 the other parameters' state (replicated,
    as under DistributedDataParallel) and the groups' settings."""
    owner = _sharded_owner(mods)
    layers, dense, groups = {prefix: {} for prefix, _ in mods}, {}, []
    for group, ps in _optimizer_params(model, optimizer):
        groups.append({"settings": {k: v for k, v in group.items() if k != "params"}, "params": [n for n, _ in ps]})
        for name, p in ps:
            st = optimizer.state.get(p)
            if not st:
                continue
            if id(p) in owner:
                prefix, local = owner[id(p)]
                rows = {k: v.detach().clone() for k, v in st.items() if torch.is_tensor(v) and v.ndim >= 1 and v.shape == p.shape}
                other = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in st.items() if k not in rows}
                layers[prefix][local] = {"rows": rows, "other": other}
            elif rank == 0:
                dense[name] = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
    return layers, ({"dense": dense, "groups": groups} if rank == 0 else None)


def save_shards(model: nn.Module, directory, optimizer=None) -> str:
    """Each process writes its rows and fused optimiser state to
    ``directory/shard-<rank>-of-<P>.pt`` (temp file + rename; ends with a
    barrier, so every shard is complete when any process returns). Returns
    this process's file.

    ``optimizer``: a torch optimiser over the model's parameters (the head's
    rows, the dense rest); its state is written too: each sharded
    parameter's in this rank's shard (the tensors of the parameter's shape
    as rows, re-strided on loading like the weights), the other parameters'
    (the same on every process under DistributedDataParallel) and the
    groups' settings in rank 0's. ``load_shards(..., optimizer=)`` restores it.

    The model's other parameters and buffers (its state dict without the
    sharded layers', the same on every process under DistributedDataParallel)
    go into rank 0's shard too, so that the directory is a whole checkpoint:
    ``load_shards`` restores them."""
    mods = _sharded_modules(model)
    if not mods:
        raise ValueError("save_shards: no sharded layer in this module")
    comm = mods[0][1]._comm
    os.makedirs(directory, exist_ok=True)
    optim_layers, optim = _optimizer_shard(model, mods, optimizer, comm.rank) if optimizer is not None else ({}, None)
    layers = {}
    for prefix, mod in mods:
        layers[prefix] = {
            "tensors": {n: (shape, torch.from_numpy(np.asarray(rows)), t.clone()) for n, (shape, rows, t) in mod.local_state().items()},
            "fused": {k: _state_tensor(v) for k, v in mod._fused_state().items()},
        }
        if isinstance(mod, ShardedVocabulary):
            layers[prefix]["index"] = mod._index_id
        if optimizer is not None:
            layers[prefix]["optimizer"] = optim_layers[prefix]
    path = os.path.join(str(directory), f"shard-{comm.rank}-of-{comm.world}.pt")
    blob = {"rank": comm.rank, "world": comm.world, "layers": layers}
    if optimizer is not None:
        blob["has_optimizer"] = True
        blob["optimizer"] = optim
    if comm.rank == 0:
        blob["dense"] = {k: v.detach().clone() for k, v in _dense_state(model, mods).items()}
    _atomic_save(blob, path)
    comm._run("barrier", dist.barrier)
    return path


def _state_tensor(v) -> torch.Tensor:
    """A fused optimiser's state entry as a tensor for a shard file: bf16
    moments (which the kernels give as their bits, in uint16) as bfloat16."""
    a = np.array(v)
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _dense_state(model, mods):
    """``model``'s state dict without its sharded layers' entries."""
    if isinstance(model, _Sharded):
        return {}
    under = tuple(f"{p}." for p, _ in mods)
    return {k: v for k, v in model.state_dict().items() if not k.startswith(under)}


def _dense_to_load(directory, model, mods, saved):
    """The non-sharded state ``save_shards`` kept in rank 0's shard, to load
    with ``load_state_dict`` (None: shards written before it kept it),
    refusing a model whose other parameters are not the saved ones."""
    if saved is None or isinstance(model, _Sharded):
        return None
    own = _dense_state(model, mods)
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or extra:
        raise ValueError(
            f"load_shards: {directory} holds other non-sharded parameters than this model's: "
            f"missing {missing or 'none'}, not in the model {extra or 'none'}"
        )
    for k, v in own.items():
        if tuple(v.shape) != tuple(saved[k].shape):
            raise ValueError(f"load_shards: {directory}: `{k}` has shape {tuple(saved[k].shape)}, the model's {tuple(v.shape)}")
    return {k: saved[k] for k in own}


def _read_shards(directory):
    names = [f for f in os.listdir(directory) if f.startswith("shard-") and f.endswith(".pt")]
    if not names:
        raise FileNotFoundError(f"{directory}: no shard-<rank>-of-<P>.pt files")
    worlds = {int(f[:-3].split("-of-")[1]) for f in names}
    if len(worlds) != 1:
        raise ValueError(f"{directory}: shards of different process counts {sorted(worlds)}")
    (world,) = worlds
    shards = []
    for r in range(world):
        p = os.path.join(directory, f"shard-{r}-of-{world}.pt")
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p}: missing (the checkpoint has {world} shards)")
        shards.append(_load_mapped(p))
    return shards


def _load_mapped(path):
    """A shard file, its tensors mapped from the file rather than read: a
    process then reads only the rows it takes (torch < 2.1, which cannot map
    a file, reads it whole). A file torch cannot read is a ValueError naming
    it."""
    try:
        try:
            return torch.load(path, weights_only=True, mmap=True)
        except TypeError:
            return torch.load(path, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"PK\x03\x04":
            raise ValueError(f"{path}: not a shard file (not an archive of torch.save)") from e
        reason = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: cannot read the shard: {reason}") from e


def _my_rows(directory, what, n_rows, mine, parts):
    """This process's rows ``mine`` (row ids of a table of ``n_rows`` rows;
    None: every row) gathered from ``parts`` [(the rows a shard holds, or None
    for all; its tensor)], in the order of ``mine``, without building the
    table: the memory is this process's rows and one id per table row. A row
    no shard holds is an error naming the table."""
    n_mine = n_rows if mine is None else len(mine)
    where = torch.full((n_rows,), -1, dtype=torch.int64)
    where[slice(None) if mine is None else torch.as_tensor(np.asarray(mine), dtype=torch.int64)] = torch.arange(n_mine)
    out, got = None, torch.zeros(n_mine, dtype=torch.bool)
    for rows, t in parts:
        held = torch.arange(t.shape[0]) if rows is None else torch.as_tensor(np.asarray(rows), dtype=torch.int64)
        pos = where[held]
        sel = pos >= 0
        if out is None:
            out = t.new_zeros((n_mine,) + tuple(t.shape[1:]))
        if bool(sel.any()):
            out[pos[sel]] = t[sel]
            got[pos[sel]] = True
    if out is None or not bool(got.all()):
        missing = int(torch.nonzero(~got)[0]) if n_mine else 0
        row = missing if mine is None else int(np.asarray(mine)[missing])
        raise ValueError(f"{directory}: `{what}`: no shard holds row {row} of its {n_rows}")
    return out


def _full_tensors(directory, shards):
    """{layer prefix: {name: full tensor}}, for ``consolidate``."""
    out = {}
    for prefix in shards[0]["layers"]:
        out[prefix] = {}
        for name, (shape, _, _) in shards[0]["layers"][prefix]["tensors"].items():
            held = [s["layers"][prefix]["tensors"][name][1:] for s in shards]
            out[prefix][name] = _my_rows(directory, _key(prefix, name), shape[0], None, held)
    return out


def _optimizer_state_of(directory, shards, model, mods, optimizer, comm):
    """``optimizer``'s state dict from the shards: each sharded parameter's
    rows re-strided to this rank's (its other state taken as saved when
    every shard agrees, or from this rank's shard on the same P), the rest
    from rank 0's shard."""
    if not all(s.get("has_optimizer") for s in shards):
        raise ValueError(f"{directory}: the shards hold no optimiser state (save_shards was called without optimizer=)")
    saved = shards[0]["optimizer"]
    ps = _optimizer_params(model, optimizer)
    if [g["params"] for g in saved["groups"]] != [[n for n, _ in group] for _, group in ps]:
        raise ValueError(
            f"{directory}: the optimiser's parameter groups {[[n for n, _ in g] for _, g in ps]} "
            f"are not the saved ones {[g['params'] for g in saved['groups']]}"
        )
    same_p = len(shards) == comm.world
    owner, here = _sharded_owner(mods), dict(mods)
    sd = optimizer.state_dict()
    state, idx = {}, 0
    for _, group in ps:
        for name, p in group:
            i = idx
            idx += 1
            if id(p) not in owner:
                if name in saved["dense"]:
                    state[i] = saved["dense"][name]
                continue
            prefix, local = owner[id(p)]
            parts = [s["layers"][prefix].get("optimizer", {}).get(local) for s in shards]
            if all(x is None for x in parts):
                continue
            if any(x is None for x in parts):
                raise ValueError(f"{directory}: optimiser state of `{_key(prefix, local)}` in some shards only")
            st = {}
            for k in parts[0]["other"]:
                vals = [x["other"][k] for x in parts]
                if same_p:
                    st[k] = vals[comm.rank]
                elif all((torch.equal(v, vals[0]) if torch.is_tensor(v) else v == vals[0]) for v in vals):
                    st[k] = vals[0]
                else:
                    raise ValueError(f"{directory}: optimiser state `{k}` of `{_key(prefix, local)}` differs between the shards and is not row-wise; it cannot be re-strided to {comm.world} processes")
            for k in parts[0]["rows"]:
                shape = shards[0]["layers"][prefix]["tensors"][local][0]
                held = [(s["layers"][prefix]["tensors"][local][1], x["rows"][k]) for s, x in zip(shards, parts)]
                mine = here[prefix].local_state()[local][1]
                st[k] = _my_rows(directory, f"{_key(prefix, local)}: {k}", shape[0], mine, held)
            state[i] = st
    sd["state"] = state
    for g, sg in zip(sd["param_groups"], saved["groups"]):
        g.update(sg["settings"])
    return sd


def load_shards(model: nn.Module, directory, optimizer=None) -> None:
    """Loads ``directory``'s shards (written by any number of processes) into
    ``model``'s sharded layers: each process takes its own rows and their
    fused optimiser state. With ``optimizer`` (built over the same
    parameters, in the same groups, as the one given to ``save_shards``)
    its state is restored too: the sharded parameters' rows re-strided to
    this process, the rest as saved, the groups' settings (``lr``, ...) as saved.
    The model's other parameters and buffers come back as rank 0's shard
    keeps them (shards written before it kept them leave them as they are);
    a model whose other parameters differ from the saved ones is refused.
    The shard files are mapped, not read whole, and each process copies out
    its own rows only: no process builds a whole table."""
    shards = _read_shards(directory)
    mods = _sharded_modules(model)
    held = sorted(shards[0]["layers"])
    if not mods:
        raise ValueError(
            f"load_shards: no sharded layer in this {type(model).__name__} (call shard(model) first; "
            f"{directory} holds layers {', '.join(f'`{h}`' for h in held) or 'none'})"
        )
    for prefix, _ in mods:
        if prefix not in shards[0]["layers"]:
            raise KeyError(f"{directory}: no shard of layer `{prefix}`")
    extra = sorted(set(held) - {prefix for prefix, _ in mods})
    if extra:
        raise ValueError(
            f"load_shards: {directory} holds layers this model lacks: {', '.join(f'`{e}`' for e in extra)} "
            f"(its sharded layers: {', '.join(f'`{p}`' for p, _ in mods)})"
        )
    for prefix, mod in mods:
        # (Shards written before the index was kept carry none.)
        theirs = shards[0]["layers"][prefix].get("index")
        if isinstance(mod, ShardedVocabulary) and theirs is not None and theirs != mod._index_id:
            raise ValueError(
                f"load_shards: {directory}: layer `{prefix}` was saved by a SplitVocabulary with another index "
                f"({theirs}; this layer: {mod._index_id}): its rows belong to other (language, token) pairs. "
                "Build the layer from the index file of the model that saved them"
            )
    optim_sd = _optimizer_state_of(directory, shards, model, mods, optimizer, mods[0][1]._comm) if optimizer is not None and mods else None
    # Everything is read and checked before anything changes, so that a
    # load that fails leaves the model as it was: this process's rows of
    # every table, every fused state, the non-sharded state.
    rows, fused = [], []
    for prefix, mod in mods:
        local = mod.local_state()
        saved = shards[0]["layers"][prefix]["tensors"]
        mine = []
        for name, (shape, ids, t) in local.items():
            if name not in saved:
                raise KeyError(f"{directory}: no shard of `{_key(prefix, name)}`")
            held = [s["layers"][prefix]["tensors"][name][1:] for s in shards]
            mine.append((t, _my_rows(directory, _key(prefix, name), shape[0], ids, held)))
        rows.append(mine)
        fused.append({k: _half_np(v) for k, v in _my_fused(directory, shards, prefix, local).items()})
    dense = _dense_to_load(directory, model, mods, shards[0].get("dense"))
    # The fused states first (each optimiser checks its state whole before
    # it takes it); one refused puts back every state loaded before it, the
    # vocabulary's rows' state included when its gates' state is refused.
    # (Shards that hold no fused state for a layer leave its state as it is.)
    loaded = []
    try:
        for (_, mod), st in zip(mods, fused):
            if st:
                loaded.append((mod, mod._fused_state()))
                mod._set_fused_state(st)
    except BaseException:
        for mod, before in reversed(loaded):
            mod._set_fused_state(before)
        raise
    with torch.no_grad():
        for mine in rows:
            for t, new in mine:
                t.copy_(new)
    if dense is not None:
        # Through load_state_dict, so that every module takes its entries its own way.
        model.load_state_dict(dense, strict=False)
    if optim_sd is not None:
        optimizer.load_state_dict(optim_sd)


def _my_fused(directory, shards, prefix, local):
    """Layer ``prefix``'s fused optimiser state for this process's rows
    (``local``: its ``local_state()``): the row-wise entries gathered from
    every shard (``_my_rows``), the others (step counts) as saved."""
    out = {}
    for key in shards[0]["layers"][prefix]["fused"]:
        parts = [s["layers"][prefix]["fused"].get(key) for s in shards]
        v0 = next(p for p in parts if p is not None)
        if v0.ndim == 0:
            out[key] = v0
            continue
        name = _fused_param(key)
        tensors = [s["layers"][prefix]["tensors"][name] for s in shards]
        held = [(t[1], p) for t, p in zip(tensors, parts) if p is not None]
        out[key] = _my_rows(directory, f"{_key(prefix, name)}: {key}", tensors[0][0][0], local[name][1], held)
    return out


def _fused_param(key):
    """The ``local_state`` name of the parameter a fused state entry
    (``[i:]<param>.<field>``) belongs to."""
    param = key.split(":", 1)[-1].rsplit(".", 1)[0]
    return param.split(".", 1)[1] if param.startswith("split_vocabulary.") else param


def consolidate(directory, path) -> dict:
    """The shards in ``directory`` as one d9d-loadable state dict (layer
    weights under d9d's names), written to ``path`` atomically (torch.save
    format; ``model.load_state_dict(torch.load(path))`` on the unsharded
    model). Needs no process group. Returns the state dict."""
    shards = _read_shards(directory)
    full = _full_tensors(directory, shards)
    indexes = {p: layer["index"] for p, layer in shards[0]["layers"].items() if "index" in layer}
    out = _named_indexes({_key(p, n): t for p, ts in full.items() for n, t in ts.items()}, indexes)
    _atomic_save(out, path)
    return out

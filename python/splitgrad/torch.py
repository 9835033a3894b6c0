"""PyTorch drop-ins whose forward and backward run splitgrad's kernels.

- ``SplitTokenEmbeddings(split_vocab_size, split_order, hidden_size)`` and
  ``SplitLanguageModellingHead(split_vocab_size, split_order, hidden_size)``:
  d9d's constructors, parameter names (``token_embedding.<split>.weight``,
  ``lm_head.<split>.weight``, one ``nn.Embedding`` / bias-free ``nn.Linear``
  per split), initialised at construction as d9d's are and by
  ``reset_parameters`` (torch's initialisers, so a seeded run draws what d9d
  draws), freezing by ``requires_grad_(False)`` and ``state_dict``
  compatibility.
- ``SplitVocabulary(index_path, vocab_size, dim, n_languages, gate_init)``:
  the reference module's constructor, parameters (``rows``, ``gate_logit``)
  and methods (``seed_from``, ``gate``, ``penalty``, ``fusion_penalty``,
  ``forward(token_ids, lang_per_token, shared, use_gate)``).

Each parameter is a torch tensor over the kernels' own buffer (no copy): a
torch optimiser, ``load_state_dict`` or ``DistributedDataParallel``'s
broadcast write into it in place and the kernels see the change. The
embedding tables' gradients reach torch as sparse coalesced COO tensors (one
row per distinct id), so ``torch.optim.SparseAdam`` applies; with
``fused_adam={"lr": ...}`` a row-sparse Adam (SparseAdam's update) moves the
rows inside the backward instead, and torch sees no gradient for them; under
torch.distributed call ``prepare_distributed(model)`` before
DistributedDataParallel, so that every process takes the same step from the
gradients of all (it is refused otherwise).

Differences from d9d, by design (docs/spec.md §2.1): an id outside the
vocabulary raises ``ValueError`` (d9d returns a zero vector), a sized split
missing from ``split_order`` is an error, and a token sends gradient only to
the split that owns it. Tensors must be on the CPU.

Half precision: ``dtype=torch.bfloat16`` / ``torch.float16`` (or ``.to()``,
``.half()``, ``.bfloat16()`` afterwards) keeps the parameters in that type in
the kernels' own buffers, with the math in float32; the layer's activations,
upstream gradient and torch-facing gradients are in that type, each the
float32 result on the widened values rounded once; ``fused_adam`` stores by
stochastic rounding (docs/spec.md §7.2, §7.3).

Importing this module needs torch; torch is not a dependency of splitgrad.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - exercised where torch is absent
    raise ImportError(
        "splitgrad.torch needs PyTorch (pip install torch); torch is not a dependency of splitgrad"
    ) from exc

from . import _splitgrad as _sg

__all__ = [
    "SequenceCausalLMOutput",
    "SplitLanguageModellingHead",
    "SplitTokenEmbeddings",
    "SplitVocabulary",
    "consolidate",
    "gather_state_dict",
    "load_shards",
    "prepare_distributed",
    "save_shards",
    "shard",
]

LM_IGNORE_INDEX = -100


@dataclasses.dataclass
class SequenceCausalLMOutput:
    """What d9d's head returns: the per-token cross-entropy, 0 where ignored."""

    cross_entropy: torch.Tensor


def _np_dtype(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "float32"
    if dtype == torch.float64:
        return "float64"
    raise TypeError(f"splitgrad.torch layers are float32 or float64, not {dtype}")


_HALF = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _engine_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute in for parameters kept as ``dtype``:
    float64 for float64, float32 for float32, bfloat16 and float16."""
    if dtype in _HALF:
        return torch.float32
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"splitgrad.torch layers are float32, float64, bfloat16 or float16, not {dtype}")
    return dtype


def _keep_as(core, dtype: torch.dtype) -> None:
    """Keeps the kernels' parameters as ``dtype`` (a half type, or the layer's own)."""
    core.set_dtype(_HALF.get(dtype) or _np_dtype(dtype))


def _tensor_of(core, name: str) -> torch.Tensor:
    """The kernels' parameter ``name`` as a torch tensor over its buffer (no
    copy); bf16 comes from the kernels as its bits in a uint16 array."""
    a = core.parameter(name)
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if a.dtype == np.uint16 else t


def _act(module):
    """The kernels' ``act`` argument: None when the layer's activations are
    of the engine's dtype, else their half type. The kernels then take and
    return them in it: inputs widened exactly, outputs rounded once to
    nearest, in buffers they keep for the next step."""
    return _HALF.get(module._dtype)


def _out(module, a: np.ndarray) -> torch.Tensor:
    """An output of the kernels as a tensor of the layer's dtype (bf16 comes
    as its bits in a uint16 array; no copy)."""
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if a.dtype == np.uint16 else t


def _half_np(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy without a copy (bf16 as its bits in a uint16 array)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _own_dtype(module, t: torch.Tensor, what: str) -> None:
    """A ValueError naming ``what`` unless ``t`` is of the layer's dtype."""
    if t.dtype != module._dtype:
        hint = ""
        if t.dtype in _HALF:
            hint = f"; convert the layer, .to({t.dtype}), for {str(t.dtype).removeprefix('torch.')} activations"
        raise ValueError(f"array `{what}`: has dtype {t.dtype}, expected {module._dtype} (the layer's dtype{hint})")


def _act_in(module, t: torch.Tensor, what: str) -> np.ndarray:
    """An activation (or upstream gradient) in the layer's dtype, as the
    kernels take it with ``act=_act(module)``."""
    if not isinstance(t, torch.Tensor):
        return t
    _cpu(t, what)
    if module._dtype != module._engine or t.dtype in _HALF:
        _own_dtype(module, t, what)
        return _half_np(t)
    return _real(t, what)


def _grad_in(module, g: torch.Tensor, what: str) -> np.ndarray:
    """An upstream gradient, of the layer's dtype (torch's autograd casts one
    to its output's dtype), as the kernels take it with ``act=_act(module)``."""
    if module._dtype != module._engine:
        # _act_in checks the device and the dtype of a half-precision one.
        return _act_in(module, g, what)
    _cpu(g, what)
    _own_dtype(module, g, what)
    return _real(g, what)


def _widened(module, t: torch.Tensor, what: str) -> np.ndarray:
    """An activation of the layer's dtype widened by torch to the engine's
    (the head: its results are scaled before they are rounded)."""
    if isinstance(t, torch.Tensor) and (module._dtype != module._engine or t.dtype in _HALF):
        _cpu(t, what)
        _own_dtype(module, t, what)
        t = t.to(module._engine)
    return _real(t, what)


def _table_in(module, table: torch.Tensor) -> np.ndarray:
    """A table of shared rows (``seed_from``'s) as the kernels take it: one
    in half precision widened (exactly) to the engine's dtype."""
    t = table.to(module._engine) if isinstance(table, torch.Tensor) and table.dtype in _HALF else table
    return _real(t, "table")


def _cpu(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}; splitgrad's kernels run on the CPU")
    return t


def _ids(t, what: str) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        _cpu(t, what)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"array `{what}`: has dtype {t.dtype}, expected an integer dtype")
        return t.detach().numpy()
    return np.asarray(t)


def _real(t: torch.Tensor, what: str) -> np.ndarray:
    _cpu(t, what)
    return t.detach().contiguous().numpy()


def _serialised_forward(forward):
    """Runs an autograd Function's forward holding its module's lock."""

    def run(ctx, module, *args):
        with module._lock:
            return forward(ctx, module, *args)

    return run


def _serialised_backward(backward):
    """Runs an autograd Function's backward holding its module's lock."""

    def run(ctx, *grads):
        with ctx.module._lock:
            return backward(ctx, *grads)

    return run


def _first_order(ctx, what: str) -> None:
    """Refuses a backward that is itself to be differentiated (``create_graph=True``).

    The kernels' backward is not recorded by autograd, so its result would
    silently count as a constant in a second derivative.
    """
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{what}: its backward is not differentiable, so double backward "
            "(create_graph=True, a gradient of a gradient) is not supported"
        )


def _save_inputs(ctx, *inputs):
    """Keeps what the backward reads of the forward's inputs.

    Tensors go through ``ctx.save_for_backward``, so that torch's version
    counter refuses a backward after they were changed in place (as torch's
    own layers do); anything else (a numpy array, a list) is copied.
    """
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    ctx.save_for_backward(*tensors)
    ctx.copied = [None if isinstance(x, torch.Tensor) else np.array(x, copy=True) for x in inputs]


def _saved_inputs(ctx):
    """The inputs kept by ``_save_inputs``, in order."""
    tensors = iter(ctx.saved_tensors)  # raises if one was changed in place since the forward
    return [next(tensors) if c is None else c for c in ctx.copied]


def _shared(core, name: str) -> nn.Parameter:
    return nn.Parameter(_tensor_of(core, name))


class _Bound:
    """Keeps torch parameters on the kernels' buffers and their trainable flags in step."""

    def _bind(self, pairs, sparse=()):
        # Calls into the kernels' layer from several Python threads take
        # turns (each kernel already runs on every core); the lock is
        # re-entrant, since a fused step runs inside a backward.
        self._lock = threading.RLock()
        # pairs: [(torch module holding `.weight` or the module itself, attribute, kernel name)];
        # sparse: the kernel names whose gradients reach torch as sparse tensors
        self._pairs = list(pairs)
        self._ptrs = {n: self._param(o, a).data_ptr() for o, a, n in self._pairs}
        self._sparse_names = frozenset(sparse)
        self._coalesced = _Coalesced()
        for o, a, n in self._pairs:
            if n in self._sparse_names:
                self._coalesced.watch(self._param(o, a))

    @staticmethod
    def _param(owner, attr) -> nn.Parameter:
        return getattr(owner, attr)

    def _sync(self):
        with self._lock:
            self._sync_locked()

    def _sync_locked(self):
        for owner, attr, name in self._pairs:
            p = self._param(owner, attr)
            if not isinstance(p, nn.Parameter):
                self._check_stand_in(p, name)
            elif p.data_ptr() != self._ptrs[name]:
                self._rebind(p, name)
            if self._core.is_trainable(name) != bool(p.requires_grad):
                self._core.set_parameter_trainable(name, bool(p.requires_grad))

    # Copies: copy.deepcopy, pickle, torch.save / torch.load(weights_only=False).
    # The kernels' layer is copied by its own reducer (splitgrad._copy); the
    # torch parameters are then put back on the new layer's buffers, the fused
    # optimiser is rebuilt from its configuration and state, and what belongs
    # to one process (its process group, a pending fused step) is left out.

    def __getstate__(self):
        self._sync()
        state = dict(nn.Module.__getstate__(self))
        state["_fused"] = self._fused_states()
        state["_coalesced"] = None
        state["_lock"] = None
        state["_group"] = None
        state["_ptrs"] = {}
        if "_local" in state:
            if self._pending is not None:
                raise RuntimeError(f"{type(self).__name__}: cannot copy during a backward pass (a fused step is pending)")
            state["_local"] = None
        return state

    def __setstate__(self, state):
        fused = state.pop("_fused", None)
        nn.Module.__setstate__(self, state)
        # copies made before layers kept half precision: their dtype was the engine's
        if "_dtype" not in self.__dict__:
            self._dtype = self._param(*self._pairs[0][:2]).dtype if self._pairs else torch.float32
        self.__dict__.setdefault("_engine", self._dtype)
        self.__dict__.setdefault("_fused_opts", None)
        self._coalesced = _Coalesced()
        self._lock = threading.RLock()
        if "_local" in self.__dict__:
            self._local = threading.local()
        for owner, attr, name in self._pairs:
            p = self._param(owner, attr)
            p.__dict__.pop("_splitgrad_coalesced_watchers", None)
            self._rebind(p, name)
        self._fused = self._new_fused()
        if fused is not None:
            self._load_fused_states(fused)
        self._sync()

    # Conversions: .to(dtype), .half(), .bfloat16(), .float(), .double().

    def _apply(self, fn, recurse=True):
        target = self._conversion_target(fn)
        if target is not None:
            self._convert(target)
        return super()._apply(fn, recurse)

    def _conversion_target(self, fn):
        """The dtype ``fn`` (what ``nn.Module._apply`` applies to each
        tensor) turns this layer's parameters into, if it changes it; an
        error for a move off the CPU."""
        out = _applied(fn, self._dtype)
        if out is None:
            return None
        if out.device.type != "cpu":
            raise ValueError(f"{type(self).__name__} cannot move to {out.device}; splitgrad's kernels run on the CPU")
        if out.is_shared():
            raise ValueError(
                f"{type(self).__name__} cannot move to shared memory: its parameters live in the kernels' "
                "buffers, which the next forward would take back"
            )
        return None if out.dtype == self._dtype else out.dtype

    def _convert(self, dtype: torch.dtype) -> None:
        """Keeps the parameters as ``dtype`` from now on, in new buffers of
        the kernels (rounded to nearest, as torch's conversion rounds); the
        torch parameters stay the same objects, over the new buffers."""
        if dtype not in _HALF and dtype != self._engine:
            hint = f" (build it with dtype={dtype} instead)" if dtype in (torch.float32, torch.float64) else ""
            raise TypeError(
                f"{type(self).__name__} computes in {_np_dtype(self._engine)} and keeps its parameters as {_np_dtype(self._engine)}, "
                f"bfloat16 or float16, not {dtype}{hint}"
            )
        with self._lock:
            self._sync_locked()
            params = [(self._param(o, a), n) for o, a, n in self._pairs]
            with torch.no_grad():
                for p, _ in params:  # let go of the old buffers, so that they are freed
                    p.data = torch.empty(0, dtype=p.dtype)
                try:
                    _keep_as(self._core, dtype)
                finally:
                    for p, n in params:
                        buf = _tensor_of(self._core, n)
                        p.data = buf
                        self._ptrs[n] = buf.data_ptr()
            self._dtype = dtype

    @property
    def parameter_bytes(self) -> int:
        """The bytes the kernels' parameters take, as they are kept."""
        return self._core.parameter_bytes

    # A layer with a fused optimiser overrides these three; the head has none.
    def _new_fused(self):
        return None

    def _fused_states(self):
        return None

    def _load_fused_states(self, states):
        raise AssertionError("no fused optimiser to load")

    def _check_stand_in(self, p, name: str) -> None:
        """Refuses a tensor that is not an ``nn.Parameter`` in a parameter's
        place (``torch.func.functional_call``, a parametrization) unless it
        is a view of the layer's own buffer: the kernels compute on that
        buffer, and adopting the tensor would write its values into the
        layer for good."""
        buf = _tensor_of(self._core, name)
        try:
            own = p.data_ptr() == buf.data_ptr() and p.shape == buf.shape and p.stride() == buf.stride()
        except RuntimeError:  # a tensor with no storage (torch.func's wrappers)
            own = False
        if not own or p.dtype != buf.dtype:
            raise TypeError(
                f"{type(self).__name__}: parameter `{name}` is a {type(p).__name__}, not the layer's "
                "nn.Parameter: the kernels compute on the layer's own buffers, so other values cannot "
                "stand in for its parameters for one call (torch.func.functional_call, "
                "parametrizations); copy the layer (copy.deepcopy) and load_state_dict into the copy"
            )

    def _rebind(self, p: torch.Tensor, name: str):
        buf = _tensor_of(self._core, name)
        if p.dtype != buf.dtype or p.shape != buf.shape or p.device.type != "cpu":
            raise TypeError(
                f"parameter `{name}` is now {p.dtype} {tuple(p.shape)} on {p.device}; "
                f"this layer keeps it as {buf.dtype} {tuple(buf.shape)} on the CPU "
                "(convert the whole layer, .to(torch.bfloat16) or .float(), or build it with dtype=...)"
            )
        with torch.no_grad():
            buf.copy_(p)
        p.data = buf
        self._ptrs[name] = buf.data_ptr()
        if name in self._sparse_names:
            self._coalesced.watch(p)  # a parameter object put in place of the layer's own


def _has_fused(layer) -> None:
    """A ValueError unless ``layer`` was built with a fused optimiser."""
    if layer._fused is None:
        raise ValueError(
            f"{type(layer).__name__} has no fused Adam to load a state into (build it with fused_adam={{...}})"
        )


def _fused_config(fused_adam):
    """``(lr, betas, eps)`` of a ``fused_adam`` dict, or ``None``."""
    return None if fused_adam is None else _fused_options(fused_adam)[0]


_STATE_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16",
}


def _applied(fn, dtype):
    """What ``fn`` (what ``nn.Module._apply`` applies to each tensor) makes
    of a tensor of ``dtype`` on the CPU, to tell a conversion, a move or
    ``share_memory_`` apart; ``None`` when it gives no tensor (torch's own
    ``_apply`` then raises what ``fn`` raises)."""
    try:
        out = fn(torch.zeros(1, dtype=dtype))
    except Exception:  # noqa: BLE001 - torch's own _apply then raises what fn raises
        return None
    return out if isinstance(out, torch.Tensor) else None


def _integer(x, what: str) -> int:
    """``x`` as an int, if it is one (a float such as 4.0 is not taken: it
    would be cut, not checked)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what}: expected an integer, got {x!r}")
    return int(x)


def _graph_task():
    """The id of the backward pass running in this thread (-1 outside one; None where torch does not
    say): a fused step queued by a pass that raised is told from the next pass's by it."""
    f = getattr(torch._C, "_current_graph_task_id", None)
    return None if f is None else f()


def _fused_options(fused_adam):
    """``((lr, betas, eps), options)`` of a ``fused_adam`` dict: options are
    ``state_dtype`` (None: the engine's; ``torch.bfloat16`` or ``"bf16"``)
    and ``rounding`` (``"stochastic"``, the default, or ``"nearest"``) with
    its ``seed``; ``None`` when every option is its default."""
    if fused_adam is None:
        return None, None
    cfg = dict(fused_adam)
    lr, betas, eps = cfg.pop("lr", 1e-3), tuple(cfg.pop("betas", (0.9, 0.999))), cfg.pop("eps", 1e-8)
    seeded = "seed" in cfg
    state_dtype, rounding, seed = cfg.pop("state_dtype", None), cfg.pop("rounding", "stochastic"), cfg.pop("seed", 0)
    if cfg:
        raise TypeError(f"fused_adam takes lr, betas, eps, state_dtype, rounding, seed; got {sorted(cfg)}")
    if rounding not in ("stochastic", "nearest"):
        raise ValueError(f"fused_adam: rounding must be 'stochastic' or 'nearest', got {rounding!r}")
    if isinstance(state_dtype, torch.dtype):
        if state_dtype not in _STATE_DTYPES:
            raise ValueError(f"fused_adam: state_dtype {state_dtype} is not a floating dtype")
        state_dtype = _STATE_DTYPES[state_dtype]
    elif state_dtype is not None and not isinstance(state_dtype, str):
        raise TypeError(f"fused_adam: state_dtype must be a torch dtype or a name such as 'bf16', got {state_dtype!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"fused_adam: seed must be an integer in [0, 2**64), got {seed!r}")
    if seeded and rounding == "nearest":
        raise ValueError(
            f"fused_adam: seed {seed!r} draws the random bits of stochastic rounding, and rounding "
            "'nearest' draws none: leave the seed out"
        )
    options = None
    if state_dtype is not None or rounding != "stochastic" or int(seed) != 0:
        options = {"state_dtype": state_dtype, "rounding": rounding, "seed": int(seed)}
    return (float(lr), tuple(float(b) for b in betas), float(eps)), options


def _configured(opt, options):
    """``opt`` (a kernels' Optimizer) with the ``fused_adam`` options applied."""
    if options is not None:
        if options["state_dtype"] is not None:
            opt.set_state_dtype(options["state_dtype"])
        if options["rounding"] == "nearest":
            opt.set_rounding("nearest")
        else:
            opt.set_rounding("stochastic", options["seed"])
    return opt


def _refuse_distributed(layer) -> None:
    """A training forward of a layer with fused_adam under torch.distributed
    that ``prepare_distributed`` has not set up: it would move its rows from
    this process's gradients alone, and the processes' weights would drift
    apart unseen."""
    if layer._fused is None or not torch.is_grad_enabled() or layer._group is not None:
        return
    d = torch.distributed
    if d.is_available() and d.is_initialized() and d.get_world_size() > 1:
        raise RuntimeError(
            f"{type(layer).__name__}(fused_adam=...) updates its rows inside the backward, and "
            f"torch.distributed runs {d.get_world_size()} processes: unprepared, each would move them from its "
            "own gradients and their weights would drift apart. Call "
            "splitgrad.torch.prepare_distributed(model) on every process before "
            "DistributedDataParallel(model), or build the layer without fused_adam and use "
            "torch.optim.SparseAdam: the sparse gradients then reach DistributedDataParallel"
        )


def _group_size(layer) -> int:
    """The number of processes whose gradients a fused step takes (1 alone)."""
    return 1 if layer._group is None else torch.distributed.get_world_size(layer._group)


def _gather(t: torch.Tensor, group) -> torch.Tensor:
    """Every process's `t` (n_p, ...), concatenated in rank order along the
    first axis; the n_p may differ, the other sizes may not."""
    d = torch.distributed
    world = d.get_world_size(group)
    t = t.contiguous()
    shape = torch.tensor(list(t.shape), dtype=torch.int64)
    shapes = [torch.empty_like(shape) for _ in range(world)]
    d.all_gather(shapes, shape, group=group)
    rest = [tuple(x[1:].tolist()) for x in shapes]
    if any(r != tuple(t.shape[1:]) for r in rest):
        raise RuntimeError(f"the processes' tensors differ past their first axis: {[tuple(x.tolist()) for x in shapes]}")
    n = [int(x[0]) for x in shapes]
    padded = torch.zeros((max(n),) + tuple(t.shape[1:]), dtype=t.dtype)
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    d.all_gather(parts, padded, group=group)
    return torch.cat([p[:k] for p, k in zip(parts, n)])


def _averaged(layer, grads):
    """The average of every process's gradients `grads` (of `layer`'s
    kernels), the same on each process: row-sparse ones are gathered and
    summed row by row in rank order, dense ones summed by an all-reduce. A
    parameter has a gradient where any process's has one."""
    d = torch.distributed
    group, world, dtype = layer._group, _group_size(layer), layer._engine
    layout = layer._grad_layout
    present = torch.tensor([float(name in grads) for name, _, _ in layout], dtype=torch.float64)
    d.all_reduce(present, group=group)
    parts = {}
    for (name, shape, sparse), seen in zip(layout, present.tolist()):
        if seen == 0:
            continue
        if sparse:
            if name in grads:
                rows = torch.from_numpy(np.array(grads.rows(name)))
                values = torch.from_numpy(np.array(grads.values(name)))
            else:
                rows = torch.zeros(0, dtype=torch.int64)
                values = torch.zeros((0,) + tuple(shape[1:]), dtype=dtype)
            parts[name] = (_gather(rows, group).numpy(), _gather(values, group).numpy())
        else:
            values = torch.from_numpy(np.array(grads.dense(name))) if name in grads else torch.zeros(shape, dtype=dtype)
            d.all_reduce(values, group=group)
            parts[name] = (None, values.numpy())
    return _sg.Gradients.from_parts(layer._core, parts, 1.0 / world)


def prepare_distributed(model: nn.Module, process_group=None) -> nn.Module:
    """Lets the layers of ``model`` built with ``fused_adam`` train under
    torch.distributed. Call it on every process, after
    ``init_process_group`` and before ``DistributedDataParallel(model)``.

    It sets each such layer's parameters to rank 0's values, leaves them out
    of DistributedDataParallel (which would wait for gradients they never
    produce), and makes their fused steps take the gradients of every
    process: the backward gathers the processes' row-sparse gradients (the
    rows their batches touched) and sums the dense ones, and applies the
    average, as DistributedDataParallel averages, so every process takes the
    same step. ``process_group``: the processes (default: a
    new group of all of them, apart from the one DistributedDataParallel
    uses). Returns ``model``.
    """
    d = torch.distributed
    if not (d.is_available() and d.is_initialized()):
        raise RuntimeError("prepare_distributed needs torch.distributed initialised (init_process_group)")
    group = process_group if process_group is not None else d.new_group()
    ignored = []
    for prefix, mod in model.named_modules():
        if isinstance(mod, (SplitTokenEmbeddings, SplitVocabulary)) and mod._fused is not None:
            mod._group = group
            mod._sync()
            for name, p in mod.named_parameters():
                ignored.append(f"{prefix}.{name}" if prefix else name)
                with torch.no_grad():
                    d.broadcast(p.data, src=d.get_global_rank(group, 0), group=group)
    if ignored:
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
    return model


def _sparse(grads, name: str, shape, dtype=None) -> torch.Tensor:
    """A row-sparse gradient as a coalesced sparse COO tensor (no copy of the
    values, unless ``dtype``, the parameter's, is another: then rounded to
    nearest)."""
    values = torch.from_numpy(grads.values(name))
    if dtype is not None and values.dtype != dtype:
        values = values.to(dtype)
    return torch.sparse_coo_tensor(
        torch.from_numpy(grads.rows(name)).unsqueeze(0),
        values,
        tuple(shape),
        is_coalesced=True,
        check_invariants=False,
    )


class _Coalesced:
    """Keeps the coalesced flag of the sparse gradients a layer hands to torch.

    When torch stores a parameter's first sparse gradient of a pass as its
    ``.grad`` it rebuilds the tensor from its indices and values and forgets
    that it was coalesced, so ``SparseAdam`` (which calls ``coalesce()``)
    sorts and merges rows that are already sorted and unique. A hook after
    accumulation marks ``.grad`` coalesced again, but only while it still
    holds exactly the indices and values this layer produced: a gradient
    summed with another one (two forwards in a pass, ``retain_graph``, DDP's
    reduction) is left as torch made it.
    """

    def __init__(self):
        self._made = {}

    def made(self, param: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        self._made[id(param)] = (g._indices().data_ptr(), g._values().data_ptr())
        return g

    def watch(self, param: torch.Tensor) -> None:
        watchers = param.__dict__.setdefault("_splitgrad_coalesced_watchers", set())
        if id(self) in watchers or not hasattr(param, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            return
        frozen = not param.requires_grad
        with torch.no_grad():
            if frozen:  # torch takes hooks on trainable tensors only; the hook outlives the freeze
                param.requires_grad_(True)
            param.register_post_accumulate_grad_hook(self._hook)
            if frozen:
                param.requires_grad_(False)
        watchers.add(id(self))

    def _hook(self, param: torch.Tensor) -> None:
        made = self._made.pop(id(param), None)
        g = param.grad
        if made is None or g is None or not g.is_sparse or g.is_coalesced():
            return
        idx, val = g._indices(), g._values()
        if (idx.data_ptr(), val.data_ptr()) != made:
            return
        param.grad = torch.sparse_coo_tensor(idx, val, g.shape, is_coalesced=True, check_invariants=False)


def _dense(grads, name: str, shape, dtype) -> torch.Tensor:
    """A gradient as a dense tensor of ``dtype`` (the parameter's)."""
    if name in grads:
        t = torch.from_numpy(grads.dense(name) if grads.is_sparse(name) else grads.values(name))
        return t if t.dtype == dtype else t.to(dtype)
    return torch.zeros(tuple(shape), dtype=dtype)


# --- SplitTokenEmbeddings -------------------------------------------------


class _EmbeddingFunction(torch.autograd.Function):
    @staticmethod
    @_serialised_forward
    def forward(ctx, module, input_ids, *weights):
        ids = _ids(input_ids, "input_ids")
        out = module._core.forward(ids, act=_act(module))
        ctx.module = module
        _save_inputs(ctx, input_ids)
        return _out(module, out)

    @staticmethod
    @_serialised_backward
    def backward(ctx, grad_output):
        _first_order(ctx, "SplitTokenEmbeddings")
        m = ctx.module
        (input_ids,) = _saved_inputs(ctx)
        ids = _ids(input_ids, "input_ids")
        g = _grad_in(m, grad_output, "grad_output")
        if m._fused is not None:
            if _group_size(m) > 1:  # every process takes the same step, from all gradients
                grads = _averaged(m, m._core.backward(ids, g, act=_act(m)))
                m._fused.step(m._core, grads)
            else:  # each touched row summed and updated at once, never stored
                m._core.backward_step(ids, g, m._fused, act=_act(m))
            return (None, None) + (None,) * len(m._names)
        grads = m._core.backward(ids, g, act=_act(m))
        out = []
        for need, name, shape, w in zip(ctx.needs_input_grad[2:], m._names, m._shapes, m._weights()):
            if not need:
                out.append(None)
            elif not m._sparse:
                out.append(_dense(grads, name, shape, m._dtype))
            elif name in grads:
                out.append(m._coalesced.made(w, _sparse(grads, name, shape, m._dtype)))
            else:  # a trainable split the batch did not reach: an empty gradient
                rows = torch.zeros((1, 0), dtype=torch.int64)
                values = torch.zeros((0, shape[1]), dtype=m._dtype)
                out.append(
                    torch.sparse_coo_tensor(rows, values, tuple(shape), is_coalesced=True, check_invariants=False)
                )
        return (None, None, *out)


class SplitTokenEmbeddings(_Bound, nn.Module):
    """d9d's ``SplitTokenEmbeddings`` on splitgrad's kernels.

    ``fused_adam``: ``None`` (gradients go to torch, sparse), or a dict of
    ``lr``, ``betas``, ``eps`` for a row-sparse Adam applied inside the
    backward (SparseAdam's update; its state is ``fused_optimizer_state()``),
    and optionally ``state_dtype`` (``torch.bfloat16`` / ``"bf16"``: the
    moments kept in bf16), ``rounding`` (``"stochastic"``, the default, or
    ``"nearest"``: how stores into bf16/f16 round) and its ``seed``.

    ``dtype``: float32 (the default dtype), float64, or ``torch.bfloat16`` /
    ``torch.float16``: the tables are then kept in half precision (half the
    bytes), the math runs in float32, and the outputs and the upstream
    gradient are in that dtype; ``.to(torch.bfloat16)``, ``.half()``,
    ``.float()`` convert it afterwards.

    ``sparse``: the tables' gradients reach torch as sparse COO tensors (the
    default, for ``SparseAdam``) or, with ``sparse=False``, dense, as d9d's
    ``nn.Embedding`` tables give them (for torch's dense optimisers).
    """

    def __init__(
        self, split_vocab_size, split_order, hidden_size: int, *, dtype=None, fused_adam=None, sparse: bool = True
    ):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self._engine = _engine_dtype(dtype)
        sizes = dict(split_vocab_size)
        # Half-precision tables are allocated as such (never as f32 first).
        self._core = _sg.SplitTokenEmbeddings(
            sizes, list(split_order), _integer(hidden_size, "hidden_size"), dtype=_np_dtype(self._engine), storage=_HALF.get(dtype)
        )
        self.token_embedding = nn.ModuleDict()
        for name, size in sizes.items():
            w = _tensor_of(self._core, f"token_embedding.{name}.weight")
            # sparse=True tells DistributedDataParallel that the gradient is sparse
            self.token_embedding[name] = nn.Embedding(size, hidden_size, _weight=w, sparse=bool(sparse))
        self._split_order = list(split_order)
        self._names = [f"token_embedding.{s}.weight" for s in self._split_order]
        self._shapes = [(sizes[s], hidden_size) for s in self._split_order]
        self._bind(
            [(self.token_embedding[s], "weight", n) for s, n in zip(self._split_order, self._names)],
            sparse=self._names if sparse else (),
        )
        self._sparse = bool(sparse)
        self._dtype = dtype
        self._grad_layout = [(n, shape, True) for n, shape in zip(self._names, self._shapes)]
        self._group = None  # set by prepare_distributed
        self._fused_cfg, self._fused_opts = _fused_options(fused_adam)
        self._fused = self._new_fused()
        self.reset_parameters()  # as d9d's nn.Embedding tables are at construction

    def _new_fused(self):
        if self._fused_cfg is None:
            return None
        opt = _sg.Optimizer.lazy_adam(*self._fused_cfg, _np_dtype(self._engine))
        return _configured(opt, getattr(self, "_fused_opts", None))

    def reset_parameters(self):
        for e in self.token_embedding.values():
            e.reset_parameters()

    def _weights(self):
        return [self.token_embedding[s].weight for s in self._split_order]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        _refuse_distributed(self)
        self._sync()
        return _EmbeddingFunction.apply(self, input_ids, *self._weights())

    def fused_optimizer_state(self):
        """The fused Adam's state by parameter name (``exp_avg``, ``exp_avg_sq``, ``step``)."""
        return None if self._fused is None else self._fused.state_dict()

    def load_fused_optimizer_state(self, state):
        """Loads a state ``fused_optimizer_state`` gave (checked whole before
        anything changes)."""
        _has_fused(self)
        with self._lock:
            self._fused.load_state_dict(state, self._core)

    def _fused_states(self):
        return None if self._fused is None else [self._fused.state_dict()]

    def _load_fused_states(self, states):
        self._fused.load_state_dict(states[0], self._core)


# --- SplitLanguageModellingHead ----------------------------------------------


class _HeadFunction(torch.autograd.Function):
    @staticmethod
    @_serialised_forward
    def forward(ctx, module, hidden, labels, *weights):
        h = _widened(module, hidden, "hidden_states")
        lab = _ids(labels, "labels")
        loss, saved = module._core.forward_saved(h, lab)
        ctx.module, ctx.saved = module, saved
        _save_inputs(ctx, hidden, labels)
        return torch.from_numpy(loss).to(module._dtype)

    @staticmethod
    @_serialised_backward
    def backward(ctx, grad_loss):
        _first_order(ctx, "SplitLanguageModellingHead")
        m = ctx.module
        hidden, labels = _saved_inputs(ctx)
        h, lab = _widened(m, hidden, "hidden_states"), _ids(labels, "labels")
        _grad_in(m, grad_loss, "grad_loss")
        g = _widened(m, grad_loss, "grad_loss")
        want_h = ctx.needs_input_grad[1]
        active = g[lab != LM_IGNORE_INDEX]
        scale = float(active.flat[0]) if active.size else 0.0
        if active.size == 0 or (active == active.flat[0]).all():
            # sum or mean of the losses: the summed kernel (6·N·V·H flops), scaled
            _, gh, grads = m._core.forward_sum_backward(h, lab, hidden_grad=want_h)
        else:
            gh, grads = m._core.backward(h, lab, g, hidden_grad=want_h, saved=ctx.saved)
            scale = 1.0
        out_h = None
        if want_h:
            out_h = torch.from_numpy(gh)
            if scale != 1.0:
                out_h = out_h.mul(scale)
            out_h = out_h.to(m._dtype)
        out = []
        for need, name, shape in zip(ctx.needs_input_grad[3:], m._names, m._shapes):
            if not need:
                out.append(None)
                continue
            w = _dense(grads, name, shape, m._engine)
            out.append((w.mul(scale) if scale != 1.0 else w).to(m._dtype))
        return (None, out_h, None, *out)


class _HeadSumFunction(torch.autograd.Function):
    @staticmethod
    @_serialised_forward
    def forward(ctx, module, hidden, labels, *weights):
        h = _widened(module, hidden, "hidden_states")
        lab = _ids(labels, "labels")
        loss, gh, grads = module._core.forward_sum_backward(h, lab, hidden_grad=ctx.needs_input_grad[1])
        ctx.module, ctx.gh, ctx.grads = module, gh, grads
        return torch.tensor(loss, dtype=hidden.dtype)

    @staticmethod
    @_serialised_backward
    def backward(ctx, grad):
        _first_order(ctx, "SplitLanguageModellingHead.forward_sum")
        m, c = ctx.module, float(grad)
        out_h = None
        if ctx.needs_input_grad[1]:
            out_h = torch.from_numpy(ctx.gh)
            out_h = (out_h.mul(c) if c != 1.0 else out_h).to(m._dtype)
        out = []
        for need, name, shape in zip(ctx.needs_input_grad[3:], m._names, m._shapes):
            if not need:
                out.append(None)
                continue
            w = _dense(ctx.grads, name, shape, m._engine)
            out.append((w.mul(c) if c != 1.0 else w).to(m._dtype))
        return (None, out_h, None, *out)


def _linear(core, name: str, hidden: int, size: int) -> nn.Linear:
    lin = nn.Linear(hidden, size, bias=False, device="meta")
    lin.weight = _shared(core, name)
    return lin


class SplitLanguageModellingHead(_Bound, nn.Module):
    """d9d's ``SplitLanguageModellingHead`` on splitgrad's fused kernels.

    ``forward(hidden_states, shared)`` → ``SequenceCausalLMOutput`` with the
    per-token ``cross_entropy`` (0 at label −100); ``shared`` is anything with
    ``.labels`` (d9d's ``SequenceCausalLMHeadShared``) or the labels tensor.
    The N × V logits are never formed. When the upstream gradient is the same
    for every token (the loss is their sum or mean) the backward is the summed
    kernel's; ``forward_sum`` computes that loss and its gradients in one pass.

    ``dtype``: as ``SplitTokenEmbeddings``'s (bfloat16 / float16 weights, the
    math in float32, the hidden states, losses and gradients in that dtype).
    """

    def __init__(self, split_vocab_size, split_order, hidden_size: int, *, dtype=None):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self._dtype, self._engine = dtype, _engine_dtype(dtype)
        sizes = dict(split_vocab_size)
        self._core = _sg.SplitLanguageModellingHead(
            sizes, list(split_order), _integer(hidden_size, "hidden_size"), dtype=_np_dtype(self._engine), storage=_HALF.get(dtype)
        )
        self.lm_head = nn.ModuleDict(
            {name: _linear(self._core, f"lm_head.{name}.weight", hidden_size, size) for name, size in sizes.items()}
        )
        self._split_order = list(split_order)
        self._names = [f"lm_head.{s}.weight" for s in self._split_order]
        self._shapes = [(sizes[s], hidden_size) for s in self._split_order]
        self._bind([(self.lm_head[s], "weight", f"lm_head.{s}.weight") for s in self._split_order])
        self.reset_parameters()  # as d9d's nn.Linear heads are at construction

    def reset_parameters(self):
        for head in self.lm_head.values():
            head.reset_parameters()

    def _weights(self):
        self._sync()
        return [self.lm_head[s].weight for s in self._split_order]

    def forward(self, hidden_states: torch.Tensor, shared) -> SequenceCausalLMOutput:
        labels = shared.labels if hasattr(shared, "labels") else shared
        losses = _HeadFunction.apply(self, hidden_states, labels, *self._weights())
        return SequenceCausalLMOutput(cross_entropy=losses)

    def forward_sum(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``Σ_n cross_entropy_n`` (a 0-d tensor) with its gradients formed in the same pass."""
        return _HeadSumFunction.apply(self, hidden_states, labels, *self._weights())


# --- SplitVocabulary ---------------------------------------------------------


class _VocabularyFunction(torch.autograd.Function):
    @staticmethod
    @_serialised_forward
    def forward(ctx, module, use_gate, token_ids, lang, shared, rows, gate_logit):
        t = _ids(token_ids, "token_ids")
        l_ = _ids(lang, "lang_per_token")
        s = _act_in(module, shared, "shared")
        out = module._core.forward(t, l_, s, use_gate, act=_act(module))
        ctx.module, ctx.use_gate = module, use_gate
        _save_inputs(ctx, token_ids, lang, shared)
        return _out(module, out)

    @staticmethod
    @_serialised_backward
    def backward(ctx, grad):
        _first_order(ctx, "SplitVocabulary")
        m = ctx.module
        token_ids, lang, shared = _saved_inputs(ctx)
        t, l_, s = _ids(token_ids, "token_ids"), _ids(lang, "lang_per_token"), _act_in(m, shared, "shared")
        g = _grad_in(m, grad, "grad_output")
        gs, grads = m._core.backward(t, l_, s, g, ctx.use_gate, ctx.needs_input_grad[4], act=_act(m))
        out_s = _out(m, gs) if ctx.needs_input_grad[4] else None
        if m._fused is not None:
            # ∂shared stays this process's own; the fused step takes the
            # average of every process's gradients.
            if _group_size(m) > 1:
                grads = _averaged(m, grads)
            m._defer(grads=grads)
            return (None, None, None, None, out_s, None, None)
        rows = None
        if ctx.needs_input_grad[5]:
            name = "split_vocabulary.rows"
            if m._sparse and name in grads and grads.is_sparse(name):
                rows = m._coalesced.made(m.rows, _sparse(grads, name, (m.n_rows, m.dim), m._dtype))
            else:
                rows = _dense(grads, name, (m.n_rows, m.dim), m._dtype)
        gate = None
        if ctx.needs_input_grad[6]:
            gate = _dense(grads, "split_vocabulary.gate_logit", (m.n_rows,), m._dtype)
        return (None, None, None, None, out_s, rows, gate)


class _PenaltyFunction(torch.autograd.Function):
    """mean(σ(gate_logit)) in fused mode: its gradient joins the fused step."""

    @staticmethod
    @_serialised_forward
    def forward(ctx, module, gate_logit):
        ctx.module = module
        return torch.tensor(module._core.penalty(), dtype=gate_logit.dtype)

    @staticmethod
    @_serialised_backward
    def backward(ctx, grad):
        _first_order(ctx, "SplitVocabulary.penalty")
        ctx.module._defer(penalty=float(grad))
        return None, None


class _FusionPenaltyFunction(torch.autograd.Function):
    """The fusion penalty; its backward reuses the forward's row distances.

    The distances hold for the rows of the forward. torch refuses the
    backward if the rows were changed in place since (the saved-tensor
    check); a change by the layer itself (a fused step, ``seed_from``)
    makes the backward compute them again.
    """

    @staticmethod
    @_serialised_forward
    def forward(ctx, module, rows):
        value, norms = module._core.fusion_penalty_norms()
        ctx.module, ctx.norms, ctx.generation = module, norms, module._generation
        ctx.save_for_backward(rows)
        return torch.tensor(value, dtype=rows.dtype)

    @staticmethod
    @_serialised_backward
    def backward(ctx, grad):
        _first_order(ctx, "SplitVocabulary.fusion_penalty")
        ctx.saved_tensors  # raises if the rows were changed in place since the forward
        m, c = ctx.module, float(grad)
        norms = ctx.norms if ctx.generation == m._generation else None
        if m._fused is not None:
            m._defer(fusion=c, norms=norms)
            return None, None
        grads = m._core.penalty_backward(0.0, c, norms) if c != 0.0 else None
        if grads is None or "split_vocabulary.rows" not in grads:
            return None, torch.zeros((m.n_rows, m.dim), dtype=m._dtype)
        return None, _dense(grads, "split_vocabulary.rows", (m.n_rows, m.dim), m._dtype)


_INDEX_KEY = "splitgrad_index"


def _index_id(lang: np.ndarray, tok: np.ndarray) -> str:
    """A name for an index: its row count and a digest of its pairs, in order."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(lang, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(tok, dtype="<i8").tobytes())
    return f"{len(lang)} rows, sha256 {h.hexdigest()[:16]}"


def _describe_index(name) -> str:
    return name if isinstance(name, str) else repr(name)


class SplitVocabulary(_Bound, nn.Module):
    """The reference ``SplitVocabulary`` on splitgrad's kernels: chosen (language,
    token) pairs get a private row, mixed with the shared row by a sigmoid gate.

    ``forward(token_ids, lang_per_token, shared, use_gate=True)``:
    ``shared + σ(gate)·(row − shared)`` where a pair has a row (``row`` alone
    with ``use_gate=False``), ``shared`` elsewhere. ``penalty()`` is the mean
    gate, ``fusion_penalty()`` the mean distance of each row to its token's
    centroid (one fused kernel). Gradients reach ``shared``, ``rows`` (sparse:
    the rows the batch used) and ``gate_logit``.

    ``fused_adam``: ``None``, or a dict of ``lr``, ``betas``, ``eps``: then one
    optimiser step at the end of each backward pass moves the rows (lazy Adam,
    SparseAdam's update) and the gate logits (Adam) from the sum of the
    gradients of every forward, ``penalty`` and ``fusion_penalty`` of that
    pass, and torch sees no gradient for them.

    ``sparse``: the rows' gradient is a sparse COO tensor of the rows the batch
    used (the default) or, with ``sparse=False``, dense.

    ``dtype`` and the ``fused_adam`` options: as ``SplitTokenEmbeddings``'s.
    """

    def __init__(
        self, index_path, vocab_size: int, dim: int, n_languages: int, gate_init: float = 0.0, *, dtype=None,
        fused_adam=None, sparse: bool = True,
    ):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self._engine = _engine_dtype(dtype)
        self._core = _sg.SplitVocabulary.from_npz(
            str(index_path),
            _integer(vocab_size, "vocab_size"),
            _integer(dim, "dim"),
            _integer(n_languages, "n_languages"),
            float(gate_init),
            _np_dtype(self._engine),
            storage=_HALF.get(dtype),
        )
        self.n_rows = self._core.n_rows
        self.dim = int(dim)
        lang, tok = self._core.index()
        self.register_buffer("row_language", torch.from_numpy(lang), persistent=False)
        self.register_buffer("row_token", torch.from_numpy(tok), persistent=False)
        self.rows = _shared(self._core, "split_vocabulary.rows")
        self.gate_logit = _shared(self._core, "split_vocabulary.gate_logit")
        self._initialised = False
        self._bind(
            [(self, "rows", "split_vocabulary.rows"), (self, "gate_logit", "split_vocabulary.gate_logit")],
            sparse=["split_vocabulary.rows"] if sparse else (),
        )
        self._sparse = bool(sparse)
        self._dtype = dtype
        self._grad_layout = [
            ("split_vocabulary.rows", (self.n_rows, self.dim), True),
            ("split_vocabulary.gate_logit", (self.n_rows,), False),
        ]
        self._group = None  # set by prepare_distributed
        self._fused_cfg, self._fused_opts = _fused_options(fused_adam)
        self._fused = self._new_fused()
        # The fused step pending in this thread's backward pass: each thread's
        # backward collects its own gradients and takes its own step.
        self._local = threading.local()
        # Counts the layer's own changes to its rows (fused steps, seed_from),
        # which torch's in-place check does not see.
        self._generation = 0

    # A state dict's rows are the rows of its index's pairs: its metadata
    # (kept by torch.save) names the index, and a load refuses another one.
    # The keys stay the reference module's, "rows" and "gate_logit"; a state
    # dict without the name (built by hand, or by another module) loads as is.

    def _index_name(self) -> str:
        name = self.__dict__.get("_index_id")
        if name is None:  # (computed once; copies made before it was kept compute it again)
            name = self.__dict__["_index_id"] = _index_id(*self._core.index())
        return name

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        meta = getattr(destination, "_metadata", None)
        if meta is not None:
            meta.setdefault(prefix[:-1], {})[_INDEX_KEY] = self._index_name()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        theirs = (local_metadata or {}).get(_INDEX_KEY)
        if theirs is not None and theirs != self._index_name():
            # Nothing of this layer is loaded; torch raises with the message.
            error_msgs.append(
                f"{prefix or 'SplitVocabulary.'}rows: saved by a SplitVocabulary with another index "
                f"({_describe_index(theirs)}; this layer: {self._index_name()}): its rows "
                "belong to other (language, token) pairs. Build the layer from the index file of the "
                "model that saved them"
            )
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def _new_fused(self):
        if self._fused_cfg is None:
            return None
        lr, betas, eps = self._fused_cfg
        name, opts = _np_dtype(self._engine), getattr(self, "_fused_opts", None)
        return (
            _configured(_sg.Optimizer.lazy_adam(lr, betas, eps, name), opts),
            _configured(_sg.Optimizer.adam(lr, betas, eps, 0.0, False, name), opts),
        )

    @property
    def _pending(self):
        p = getattr(self._local, "pending", None)
        if p is not None and p["task"] != _graph_task():
            # Left by a backward pass that raised before it ended (its
            # callback never ran): its step goes with it, and the next
            # pass steps on its own gradients.
            self._local.pending = p = None
        return p

    @_pending.setter
    def _pending(self, value):
        self._local.pending = value

    def _defer(self, grads=None, penalty=0.0, fusion=0.0, norms=None):
        """Collects this backward pass's gradients; the step runs when it ends.

        ``norms``: the fusion penalty's row distances, valid for the rows as
        they are (None: not known, the step computes them).
        """
        if self._pending is None:
            self._pending = {"grads": [], "penalty": 0.0, "fusion": 0.0, "norms": None, "stale": False,
                             "task": _graph_task()}
            torch.autograd.Variable._execution_engine.queue_callback(self._fused_step)
        p = self._pending
        if grads is not None:
            p["grads"].append(grads)
        p["penalty"] += penalty
        if fusion:
            p["fusion"] += fusion
            if norms is None:
                p["stale"] = True
            elif p["norms"] is None:
                p["norms"] = norms

    def _fused_step(self):
        p, self._local.pending = self._local.pending, None
        norms = None if p["stale"] else p["norms"]
        world = _group_size(self)
        if world > 1:  # the penalties' weights, averaged over the processes
            w = torch.tensor([p["penalty"], p["fusion"], float(norms is None)], dtype=torch.float64)
            torch.distributed.all_reduce(w, group=self._group)
            p["penalty"], p["fusion"] = float(w[0]) / world, float(w[1]) / world
            if w[2] > 0:  # one process must compute the distances: all do
                norms = None
        with self._lock:
            self._core.fused_step(p["grads"], p["penalty"], p["fusion"], *self._fused, norms)
        self._generation += 1

    def fused_optimizer_state(self):
        """The fused optimisers' states: (rows, gate_logit)."""
        return None if self._fused is None else tuple(o.state_dict() for o in self._fused)

    def load_fused_optimizer_state(self, state):
        """Loads the states ``fused_optimizer_state`` gave, (rows, gate_logit):
        both or, when one is refused, neither."""
        _has_fused(self)
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise ValueError(
                "load_fused_optimizer_state: expected (the rows' state, the gate logits' state), "
                f"as fused_optimizer_state() gives, not {type(state).__name__}"
            )
        with self._lock:
            rows, gates = self._fused
            before = rows.state_dict()
            rows.load_state_dict(state[0], self._core)
            try:
                gates.load_state_dict(state[1], self._core)
            except BaseException:
                rows.load_state_dict(before, self._core)
                raise

    def _fused_states(self):
        return None if self._fused is None else [o.state_dict() for o in self._fused]

    def _load_fused_states(self, states):
        for o, st in zip(self._fused, states):
            o.load_state_dict(st, self._core)

    @torch.no_grad()
    def seed_from(self, table: torch.Tensor) -> None:
        """Copy each split row from the shared row it specialises."""
        with self._lock:
            self._sync()
            self._core.seed_from(_table_in(self, table))
        self._generation += 1
        self._initialised = True

    def gate(self) -> torch.Tensor:
        return torch.sigmoid(self.gate_logit)

    def penalty(self) -> torch.Tensor:
        """Mean gate opening: an L1 that pushes unused rows back to shared."""
        if self._fused is not None:
            self._sync()
            return _PenaltyFunction.apply(self, self.gate_logit)
        return self.gate().mean()

    def fusion_penalty(self) -> torch.Tensor:
        """Mean distance of each row to the centroid of its token's rows."""
        self._sync()
        return _FusionPenaltyFunction.apply(self, self.rows)

    def forward(self, token_ids, lang_per_token, shared: torch.Tensor, use_gate: bool = True) -> torch.Tensor:
        _refuse_distributed(self)
        self._sync()
        return _VocabularyFunction.apply(
            self, bool(use_gate), token_ids, lang_per_token, shared, self.rows, self.gate_logit
        )

    def extra_repr(self) -> str:
        return f"rows={self.n_rows}"


# Row-sharded layers (splitgrad/shard.py), here so that scripts use one namespace.
from .shard import consolidate, gather_state_dict, load_shards, save_shards, shard  # noqa: E402

"""splitgrad for Python.

The three layers of splitgrad over numpy arrays, their optimisers, checkpoints
and golden vectors (this module), and PyTorch drop-ins for d9d's
``SplitTokenEmbeddings`` / ``SplitLanguageModellingHead`` and the reference
``SplitVocabulary`` (``splitgrad.torch``, importable when torch is installed).

Errors of the Rust library are raised as ``ValueError`` (bad ids, shapes,
dtypes, configurations), ``OSError`` (files that cannot be read or written)
or ``FloatingPointError`` (a diverged training run), with the library's
one-line message.

Every object may be shared between threads. A layer or an optimiser keeps its
state behind a read-write lock, waited for with the GIL released: forwards,
backwards, penalties and reads of the state run at once; steps
(``Optimizer.step``, ``SplitVocabulary.fused_step``), loads, ``seed_from``,
``reset_parameters`` and freezing wait for those and run alone, so two steps
on one layer are serialised, never torn.
"""

from ._splitgrad import (
    Gradients,
    Optimizer,
    SplitLanguageModellingHead,
    SplitTokenEmbeddings,
    SplitVocabulary,
    num_threads,
    set_num_threads,
)
from . import _splitgrad, _metadata
from . import _copy, golden  # noqa: F401  (_copy: deepcopy and pickle of the layers)

__all__ = [
    "Adam",
    "Gradients",
    "LazyAdam",
    "Optimizer",
    "SGD",
    "SplitLanguageModellingHead",
    "SplitTokenEmbeddings",
    "SplitVocabulary",
    "golden",
    "load_checkpoint",
    "num_threads",
    "save_checkpoint",
    "set_num_threads",
]

__version__ = "0.1.0"


def save_checkpoint(path, modules, optimizer=None, metadata=None, extra=None):
    """Writes the state of ``modules``, of ``optimizer`` (under ``optimizer.``),
    the ``extra`` arrays and ``metadata`` to one safetensors file, atomically.

    Metadata values are stored as strings; ``bool``, ``int`` and ``float``
    values come back from ``load_checkpoint`` as what they were.
    """
    return _splitgrad.save_checkpoint(path, modules, optimizer, _metadata.encode(metadata), extra)


def load_checkpoint(path, modules, optimizer=None):
    """Loads ``modules`` and ``optimizer`` saved by ``save_checkpoint``,
    checking every tensor before anything changes: ``(metadata, other
    tensors)``, the metadata with the types it was saved with."""
    metadata, rest = _splitgrad.load_checkpoint(path, modules, optimizer)
    return _metadata.decode(metadata), rest


def Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False, dtype="float32"):
    """``torch.optim.Adam`` (``AdamW`` with ``decoupled_weight_decay=True``)."""
    return Optimizer.adam(lr, tuple(betas), eps, weight_decay, decoupled_weight_decay, dtype)


def LazyAdam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, dtype="float32"):
    """``torch.optim.SparseAdam``: only the rows present in a gradient move."""
    return Optimizer.lazy_adam(lr, tuple(betas), eps, dtype)


def SGD(lr=1e-3, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, dtype="float32"):
    """``torch.optim.SGD``."""
    return Optimizer.sgd(lr, momentum, dampening, nesterov, weight_decay, dtype)

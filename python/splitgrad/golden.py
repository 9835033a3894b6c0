"""Golden vectors (docs/spec.md §4): evaluate a case, generate one, or a folder of them."""

import io
import os

import numpy as np

from ._splitgrad import golden_evaluate as _evaluate
from ._splitgrad import golden_evaluate_dir as _evaluate_dir
from ._splitgrad import golden_generate as _generate

LAYERS = ("split-embeddings", "split-vocabulary", "lm-head")


def _arrays(data):
    with np.load(io.BytesIO(data)) as z:
        return {k: z[k] for k in z.files}


def _case_bytes(case):
    if isinstance(case, (bytes, bytearray)):
        return bytes(case), "case.npz"
    if isinstance(case, (str, os.PathLike)):
        with open(case, "rb") as f:
            return f.read(), os.fspath(case)
    buf = io.BytesIO()
    np.savez(buf, **case)
    return buf.getvalue(), "case.npz"


def evaluate(layer, case):
    """The results of one case: ``case`` is a path, the bytes of an ``.npz`` or a
    dict of arrays; returns a dict of arrays. Raises ``ValueError`` naming the
    case and the array for a malformed case, ``OSError`` for an unreadable file."""
    data, label = _case_bytes(case)
    return _arrays(_evaluate(layer, data, label))


def generate(layer, seed, dtype="float64"):
    """A random case of ``layer`` (inputs and results) as a dict of arrays."""
    return _arrays(_generate(layer, seed, dtype))


def generate_bytes(layer, seed, dtype="float64"):
    """A random case of ``layer`` as the bytes of an ``.npz`` file."""
    return bytes(_generate(layer, seed, dtype))


def evaluate_dir(inputs, out):
    """``splitgrad golden eval --inputs IN --out OUT``: ``{"ok": [...], "failed": [(case, message)]}``."""
    return _evaluate_dir(os.fspath(inputs), os.fspath(out))

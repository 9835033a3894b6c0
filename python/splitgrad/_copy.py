"""``copy.deepcopy`` and ``pickle`` of the numpy layers.

Each layer is rebuilt from its configuration, the dtype its parameters are
kept in, and its state dict (a copy of every parameter and buffer) with the
trainable flag and the rounding rows of each parameter, so
the copy is independent of the original: a step on one never moves the
other. The reducers are registered with :mod:`copyreg`, which both
``pickle`` and ``copy`` consult for extension types.
"""

from __future__ import annotations

import copyreg

import numpy as np

from ._splitgrad import SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary


def _trainable(layer) -> dict:
    return {name: layer.is_trainable(name) for name in layer.parameter_names()}


def _rounding_rows(layer) -> dict:
    """The parameters' rounding rows (``set_rounding_rows``), where set."""
    rows = {name: layer.rounding_rows(name) for name in layer.parameter_names()}
    return {name: r for name, r in rows.items() if r is not None}


def _copy_parameters(layer, state) -> None:
    """Writes the copied parameters into the new layer's buffers as they
    were, NaN and infinities included: a copy reproduces its layer, where a
    load (``load_state_dict``, ``load_checkpoint``) refuses non-finite
    values as a sign of a damaged file or a diverged run."""
    for name in layer.parameter_names():
        dst = layer.parameter(name)
        src = np.asarray(state[name])
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(
                f"copy of {type(layer).__name__}: parameter `{name}` is {src.dtype} {src.shape}, "
                f"expected {dst.dtype} {dst.shape}"
            )
        np.copyto(dst, src)


def _restore(layer, state, trainable, param_dtype=None, rounding_rows=None):
    if param_dtype is not None and param_dtype != layer.param_dtype:
        layer.set_dtype(param_dtype)  # parameters kept in bf16 / f16
    _copy_parameters(layer, state)
    for name, flag in trainable.items():
        layer.set_parameter_trainable(name, flag)
    for name, rows in (rounding_rows or {}).items():
        layer.set_rounding_rows(name, rows)
    return layer


def _split_sizes(layer, prefix: str, state) -> dict:
    return {s: int(state[f"{prefix}.{s}.weight"].shape[0]) for s in layer.split_order}


def _rebuild_split(cls, sizes, order, hidden, dtype, state, trainable, param_dtype=None, rounding_rows=None):
    return _restore(cls(sizes, order, hidden, dtype=dtype), state, trainable, param_dtype, rounding_rows)


def _reduce_split(prefix: str):
    def reduce(layer):
        state = layer.state_dict()
        args = (
            type(layer),
            _split_sizes(layer, prefix, state),
            layer.split_order,
            layer.hidden_size,
            layer.dtype,
            state,
            _trainable(layer),
            layer.param_dtype,
            _rounding_rows(layer),
        )
        return _rebuild_split, args

    return reduce


def _rebuild_vocabulary(
    lang, tok, vocab_size, dim, n_languages, dtype, score, state, trainable, param_dtype=None, rounding_rows=None
):
    layer = SplitVocabulary(lang, tok, vocab_size, dim, n_languages, 0.0, dtype, score)
    return _restore(layer, state, trainable, param_dtype, rounding_rows)


def _reduce_vocabulary(layer):
    state = layer.state_dict()
    lang, tok = layer.index()
    score = state.get("split_vocabulary.score")
    score = None if score is None else [float(x) for x in score]
    args = (
        lang, tok, layer.vocab_size, layer.dim, layer.n_languages, layer.dtype, score, state, _trainable(layer),
        layer.param_dtype, _rounding_rows(layer),
    )
    return _rebuild_vocabulary, args


copyreg.pickle(SplitTokenEmbeddings, _reduce_split("token_embedding"))
copyreg.pickle(SplitLanguageModellingHead, _reduce_split("lm_head"))
copyreg.pickle(SplitVocabulary, _reduce_vocabulary)

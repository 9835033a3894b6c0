"""Typed checkpoint metadata.

safetensors stores metadata as strings only. ``save_checkpoint`` writes each
value (a ``str``, ``bool``, ``int`` or ``float``, numpy's scalars too; anything
else is refused rather than stored as its ``str``) and, for the values that were
``bool``, ``int`` or ``float``, records their types under the key ``splitgrad.metadata_types`` (a
JSON object from key to ``"bool"``, ``"int"`` or ``"float"``);
``load_checkpoint`` turns those values back and drops the key. A checkpoint of
``splitgrad train`` (``format`` ``splitgrad-bigram-1``) gets its settings
typed from the format's own table. Any other value stays a string.
"""

import json

import numpy as np

TYPES_KEY = "splitgrad.metadata_types"

_PARSE = {
    "bool": lambda s: {"true": True, "false": False, "True": True, "False": False}[s],
    "int": int,
    "float": float,
}

# The typed metadata of `splitgrad train`'s checkpoints (docs/spec.md, the
# checkpoint section).
_BIGRAM = {
    "step": "int",
    "steps": "int",
    "batch": "int",
    "seed": "int",
    "vocab_size": "int",
    "n_languages": "int",
    "dim": "int",
    "heldout_tokens": "int",
    "gate_init": "float",
    "lr": "float",
    "gate_penalty": "float",
    "fusion_penalty": "float",
    "heldout_ce": "float",
    "heldout_ce_closed": "float",
    "use_gate": "bool",
}


def _type_of(value):
    # bool before int: bool is a subclass of int.
    for name, t in (("bool", bool), ("int", int), ("float", float)):
        if isinstance(value, t):
            return name
    for name, t in (("bool", np.bool_), ("int", np.integer), ("float", np.floating)):
        if isinstance(value, t):
            return name
    return None


def encode(metadata):
    """The string metadata to store for ``metadata`` (a mapping or None)."""
    if metadata is None:
        return None
    out, types = {}, {}
    for key, value in dict(metadata).items():
        if not isinstance(key, str):
            raise ValueError(f"metadata key {key!r} is not a string")
        if key == TYPES_KEY:
            raise ValueError(f"metadata key {TYPES_KEY!r} is reserved")
        t = _type_of(value)
        if t is None and not isinstance(value, str):
            raise TypeError(
                f"metadata {key!r}: a {type(value).__name__} is not stored (expected str, bool, int or float; "
                "safetensors metadata are strings: put arrays in the tensors)"
            )
        if t == "float":
            value = repr(float(value))  # round-trips exactly
        elif t == "int":
            value = str(int(value))
        elif t == "bool":
            value = str(bool(value)).lower()
        out[key] = value if t else str(value)
        if t:
            types[key] = t
    if types:
        out[TYPES_KEY] = json.dumps(types, sort_keys=True)
    return out


def decode(metadata):
    """The metadata as saved: typed values back from their strings."""
    metadata = dict(metadata)
    raw = metadata.pop(TYPES_KEY, None)
    if raw is not None:
        try:
            types = json.loads(raw)
            if not isinstance(types, dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise ValueError(f"checkpoint metadata {TYPES_KEY!r} is not a JSON object of types: {e}") from None
    elif metadata.get("format") == "splitgrad-bigram-1":
        types = _BIGRAM
    else:
        types = {}
    for key, t in types.items():
        if key not in metadata:
            continue
        parse = _PARSE.get(t)
        if parse is None:
            raise ValueError(f"checkpoint metadata {key!r}: unknown type {t!r} in {TYPES_KEY!r}")
        try:
            metadata[key] = parse(metadata[key])
        except (KeyError, ValueError):
            raise ValueError(
                f"checkpoint metadata {key!r}: {metadata[key]!r} is not a {t}"
            ) from None
    return metadata

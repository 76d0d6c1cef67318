"""Host values as notebook users hold them, turned into Python values once, before any check
(docs/design.md, "Priming").

Every argument that takes a number also takes a numpy scalar (`np.float32(0.7)`, `np.int64(5)`), a 0-d
numpy array or a 0-d tensor (`logits.argmax()`); every argument that takes token ids (a prompt, stop
ids, one value per prompt) also takes a 1-D tensor or array, or a list of numpy / torch integers. The
checks that follow see plain `int` / `float` / `list`, so their messages show plain values.

numpy is not a dependency: a value can only be a numpy one where numpy has been imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch


def _numpy():
    return sys.modules.get("numpy")


def scalar(value: object) -> object:
    """`value` as a Python number where it is a numpy scalar, a 0-d numpy array or a 0-d tensor (a bool
    stays a bool, so checks that refuse bools still do); anything else unchanged. A 0-d tensor on an
    accelerator is read (one device -> host copy): pass host values on a path that must not sync."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.dim() == 0 else value
    np = _numpy()
    if np is not None and (isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0)):
        return value.item()
    return value


def is_array(value: object) -> bool:
    """A tensor or a numpy array (of any rank)."""
    np = _numpy()
    return isinstance(value, torch.Tensor) or (np is not None and isinstance(value, np.ndarray))


def values(value: object) -> list | None:
    """A 1-D tensor / array, or a list or tuple, as a list of Python values (`scalar` of each element);
    None for anything else (a number, a string, an array of another rank)."""
    if is_array(value):
        return value.tolist() if value.ndim == 1 else None
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [scalar(v) for v in value]
    return None


def token_ids(value: object) -> list[int] | None:
    """An id or ids (an int, a list, a 1-D tensor / array, numpy / torch integers) as a list of ints; None
    where `value` is not that (bools are not ids)."""
    one = scalar(value)
    many = [one] if isinstance(one, int) else values(value)
    if many is None or any(isinstance(t, bool) or not isinstance(t, int) for t in many):
        return None
    return many


def rows(prompts: object) -> list | None:
    """A batch of prompts as a list of prompts: a 2-D tensor / array is its rows (as lists), a list or
    tuple is itself, as is a 1-D numpy array of dtype object (ragged prompts); None for anything else (a 1-D
    array of numbers is one prompt, not a batch)."""
    if is_array(prompts):
        if (
            prompts.ndim == 1 and getattr(getattr(prompts, "dtype", None), "kind", None) == "O"
        ):  # numpy's ragged batch of sequences
            return list(prompts)
        return prompts.tolist() if prompts.ndim == 2 else None
    if isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
        return list(prompts)
    return None

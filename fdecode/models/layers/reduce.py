"""The one collective a tensor-parallel layer ends with: the sum of every rank's partial output
(docs/design.md, "Tensor parallelism").

Functional collectives (`_c10d_functional`), so a captured step keeps them as graph nodes; in eager
mode their result is an AsyncCollectiveTensor, waited for here so that it never leaks into the state.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol


def done(t: torch.Tensor) -> torch.Tensor:
    """The plain result of a functional collective. Traced, it already is one (followed by a
    `wait_tensor` node); in eager mode it is an AsyncCollectiveTensor, which must not leak into
    the state or the caller's logits, so wait for it here."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def summed(x: torch.Tensor, tp) -> torch.Tensor:
    """`x` summed over the ranks of `tp` (a `TPGroup`); `x` itself where `tp` is None (one device)."""
    return x if tp is None else done(funcol.all_reduce(x, "sum", tp.group))

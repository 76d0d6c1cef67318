"""Gated DeltaNet recurrence (Yang et al. 2024, "Gated Delta Networks"), row by row, as pure functions
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

Per value head, with S a [dk, dv] matrix kept in float32, a row t with key k_t (L2-normalised),
query q_t (L2-normalised, times dk**-0.5), value v_t, decay g_t <= 0 and write strength beta_t:

    S <- S * exp(g_t);   delta = beta_t * (v_t - S^T k_t);   S <- S + k_t delta^T;   o_t = S^T q_t

Before it, the q|k|v channels go through a depthwise causal conv1d (kernel k, SiLU) whose state is
the last k - 1 inputs of each channel (the *conv window*). Rows run in order; a row with `valid`
False leaves both states exactly as they were (its output is computed but meaningless). With
`snapshots=True` the functions return the state after every row ([B, Q, ...]), which
verify-with-rollback selects from (`fdecode.state.recurrent`); otherwise only the state after
the last row. With `parents` the rows are draft-tree nodes in topological order: row j starts
from the state after its parent row (the state before row 0 for -1), not after row j - 1, so a
node's conv window holds its ancestors' inputs and its delta-rule state their updates
(docs/design.md, "Trees"). This is the reference and, on every backend, the implementation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _keep(valid: torch.Tensor | None, j: int, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    if valid is None:
        return new
    mask = valid[:, j].reshape(-1, *([1] * (new.dim() - 1)))
    return torch.where(mask, new, old)


def _history(first: torch.Tensor, parents: torch.Tensor | None) -> torch.Tensor | None:
    """For tree rows, [B, Q + 1, ...]: entry 0 the state before row 0, entry j + 1 the state after row j, written
    as the rows run (one state copied per row, where stacking the states so far at each row would copy
    O(Q^2)); None for a chain."""
    if parents is None:
        return None
    history = first.new_empty(first.shape[0], parents.shape[1] + 1, *first.shape[1:])
    history[:, 0] = first
    return history


def _start(parents: torch.Tensor | None, j: int, last: torch.Tensor, history: torch.Tensor | None) -> torch.Tensor:
    """The state row j starts from: `last` (the state after row j - 1) for a chain; for tree rows the state after
    row parents[:, j] of each lane (-1: before row 0)."""
    if history is None:
        return last
    lanes = torch.arange(history.shape[0], device=history.device)
    return history[lanes, parents[:, j] + 1]


def _after(history: torch.Tensor | None, j: int, state: torch.Tensor, states: list[torch.Tensor]) -> torch.Tensor:
    """Record `state` as the state after row j (in `history` for tree rows, else in `states`); returns it."""
    if history is None:
        states.append(state)
    else:
        history[:, j + 1] = state
    return state


def _result(history: torch.Tensor | None, states: list[torch.Tensor], last: torch.Tensor, snapshots: bool):
    """The states after every row [B, Q, ...] (snapshots) or `last`, the state after the last row."""
    if not snapshots:
        return last
    return torch.stack(states, dim=1) if history is None else history[:, 1:]


def causal_conv_rows(
    x: torch.Tensor,  # [B, Q, C] inputs, model dtype
    window: torch.Tensor,  # [B, C, k-1] the last k-1 inputs before row 0
    weight: torch.Tensor,  # [C, k] depthwise kernel, oldest tap first
    valid: torch.Tensor | None = None,  # [B, Q] bool, None: every row
    *,
    snapshots: bool = False,
    parents: torch.Tensor | None = None,  # [B, Q] int64: each row's parent row, -1 for the root (None: a chain)
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(causal depthwise conv) of each row [B, Q, C] and the window after each row [B, Q, C, k-1]
    (snapshots) or after the last row [B, C, k-1]."""
    outs, windows = [], []
    window = window.to(x.dtype)
    history = _history(window, parents)
    for j in range(x.shape[1]):
        before = _start(parents, j, window, history)
        full = torch.cat([before, x[:, j, :, None]], dim=-1)  # [B, C, k]
        outs.append(F.silu((full.to(weight.dtype) * weight).sum(-1)).to(x.dtype))
        window = _after(history, j, _keep(valid, j, full[..., 1:], before), windows)
    return torch.stack(outs, dim=1), _result(history, windows, window, snapshots)


def l2_normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the FLA / transformers convention)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rows(
    q: torch.Tensor,  # [B, Q, Hv, dk] float32, normalised and scaled
    k: torch.Tensor,  # [B, Q, Hv, dk] float32, normalised
    v: torch.Tensor,  # [B, Q, Hv, dv] float32
    g: torch.Tensor,  # [B, Q, Hv] float32, log decay (<= 0)
    beta: torch.Tensor,  # [B, Q, Hv] float32 in (0, 1)
    state: torch.Tensor,  # [B, Hv, dk, dv] float32 before row 0
    valid: torch.Tensor | None = None,  # [B, Q] bool, None: every row
    *,
    snapshots: bool = False,
    parents: torch.Tensor | None = None,  # [B, Q] int64: each row's parent row, -1 for the root (None: a chain)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs o [B, Q, Hv, dv] float32 and the state after each row [B, Q, Hv, dk, dv] (snapshots)
    or after the last row [B, Hv, dk, dv]."""
    outs, states = [], []
    history = _history(state, parents)
    for j in range(q.shape[1]):
        before = _start(parents, j, state, history)
        s = before * g[:, j].exp()[..., None, None]  # [B, Hv, dk, dv]
        k_j = k[:, j, :, :, None]  # [B, Hv, dk, 1]
        delta = (v[:, j] - (s * k_j).sum(dim=-2)) * beta[:, j, :, None]  # [B, Hv, dv]
        s = s + k_j * delta[:, :, None, :]
        outs.append((s * q[:, j, :, :, None]).sum(dim=-2))  # [B, Hv, dv]
        state = _after(history, j, _keep(valid, j, s, before), states)
    return torch.stack(outs, dim=1), _result(history, states, state, snapshots)

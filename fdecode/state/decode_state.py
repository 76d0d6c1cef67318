"""`DecodeState` and `StepOutput`: the immutable pytrees a decode step consumes and returns.

Glossary (per lane b; B = max_batch, K = drafts, W = K + 1, E = max_stop_ids):
- *committed*: a token that is part of the output sequence; *t* is the last
  committed token, which is not yet in the target KV.
- *window*: `tokens[b] = [t, d1 .. dK]`, validated at positions `base_pos[b] + 0..K`.
- *accepted*: the L new tokens a step commits (1 <= L <= W for an active lane,
  0 for an inactive one), reported padded with -1.
- *greedy lane* (temperature 0) commits the target argmax; a *random lane*
  commits tokens distributed exactly as the target's filtered distribution
  (speculative rejection sampling, see `fdecode.ops.sampling`).

Donation contract (JAX `donate_argnums`): a step consumes its input state. The KV
leaves are written in place and aliased into the new state, so a step costs
O(work), never O(cache capacity). Do not use a state after passing it to a step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class StepOutput:
    """What one transition (prefill or step) committed, packed so the host does one device->host copy."""

    packed: torch.Tensor  # [B, W + 2] int64: accepted tokens (-1 padded) | count L | status (0 running, 1 finished, 2 error)

    @property
    def tokens(self) -> torch.Tensor:
        """[B, W] int64: the accepted tokens of each lane, padded with -1."""
        return self.packed[:, :-2]

    @property
    def num_tokens(self) -> torch.Tensor:
        """[B] int64: L, the number of tokens each lane committed (0 for an inactive lane)."""
        return self.packed[:, -2]

    @property
    def finished(self) -> torch.Tensor:
        """[B] bool: the lane is done (stop id, budget or capacity reached, error, or never started)."""
        return self.packed[:, -1] > 0

    @property
    def error(self) -> torch.Tensor:
        """[B] bool: the lane was stopped because it ran past its KV blocks (see `cut_at_missing_kv`)."""
        return self.packed[:, -1] == 2

    @staticmethod
    def pack(tokens: torch.Tensor, num_tokens: torch.Tensor, status: torch.Tensor) -> StepOutput:
        """status: [B] int64 or bool, 0 running, 1 finished, 2 stopped with an error."""
        return StepOutput(torch.cat([tokens, num_tokens[:, None], status[:, None].long()], dim=1))

    def __repr__(self) -> str:
        b, w = self.packed.shape[0], self.packed.shape[1] - 2
        return f"StepOutput(lanes={b}, window={w}, device={self.packed.device})"


class KVLease:
    """Marks the states that share one KV pool: alive while any of them is (see `DecodeState.kv_lease`)."""

    __slots__ = ("__weakref__",)


@dataclass(frozen=True)
class DecodeState:
    """Everything a decode step reads and writes; fixed-shape tensors only."""

    tokens: torch.Tensor  # [B, W] int64: t then K drafts
    base_pos: torch.Tensor  # [B] int64: position of t; the target KV holds positions < base_pos
    block_tables: torch.Tensor  # [B, max_blocks] int64: KV block of each lane, -1 = unallocated
    target_kv: torch.Tensor  # [L_t, 2, num_slots, Hkv_t, D_t] target paged KV (block 0 = scratch)
    draft_kv: torch.Tensor  # [L_d, 2, num_slots, Hkv_d, D_d] draft paged KV (block 0 = scratch)
    active: torch.Tensor  # [B] bool: lane is decoding; inactive lanes write only the scratch slot
    remaining: torch.Tensor  # [B] int64: tokens the lane may still commit
    stop_ids: torch.Tensor  # [B, E] int64: ids that end the lane (the stop id is emitted), -1 = none
    temperature: torch.Tensor  # [B] float32: 0 = greedy lane, > 0 = random lane
    top_k: torch.Tensor  # [B] int64: keep the k most probable tokens, 0 = off
    top_p: torch.Tensor  # [B] float32: keep the smallest top set of mass >= top_p, 1 = off
    min_p: torch.Tensor  # [B] float32: keep tokens with p >= min_p * max p, 0 = off
    seed: torch.Tensor  # [B] int64 in [0, 2**63): the lane's PRNG key (Philox, `fdecode.ops.random`)
    counter: torch.Tensor  # [B] int64: transitions so far; with `seed`, addresses this step's random numbers
    draft_probs: torch.Tensor  # [B, K, V] float32: distribution each pending draft was sampled from
    output: torch.Tensor  # [B, W + 2] int64: packed StepOutput of the transition that made this state

    @property
    def step_output(self) -> StepOutput:
        return StepOutput(self.output)

    def replace(self, **changes: torch.Tensor) -> DecodeState:
        new = dataclasses.replace(self, **changes)
        if "base_pos" not in changes and "active" not in changes:
            new.bound_positions(self.max_position)
        if not {"active", "temperature", "top_k", "top_p"} & changes.keys():
            new.record_sampling(self.lane_sampling)
        if new.target_kv is self.target_kv or new.draft_kv is self.draft_kv:  # still over (part of) the pool
            new.share_kv_lease(self)
        return new

    @property
    def kv_lease(self) -> KVLease | None:
        """Host-side token shared by every state over the same KV leaves (None: not leased from a pool).

        Not a field: a step's KV pool is free again once no state carrying its lease is alive
        (`fdecode.graphs.compile.KVPool`). `replace`, and a step for the state it returns, pass it on.
        """
        return getattr(self, "_kv_lease", None)

    def share_kv_lease(self, other: DecodeState) -> DecodeState:
        """Carry `other`'s lease (this state aliases its KV leaves); returns self."""
        object.__setattr__(self, "_kv_lease", other.kv_lease)
        return self

    def lease_kv(self, lease: KVLease) -> DecodeState:
        object.__setattr__(self, "_kv_lease", lease)
        return self

    @property
    def max_position(self) -> int | None:
        """Host-side upper bound on every active lane's `base_pos`, None when unknown.

        Not a field, so not a pytree leaf and never seen by a graph: the host tracks it (prefill
        knows the prompts, each step adds at most W, an `Engine` tightens it from what it has read)
        and the step uses it to pick the attention window (`DecodeConfig.bucket_for`) without a sync.
        """
        return getattr(self, "_max_position", None)

    def bound_positions(self, bound: int | None) -> DecodeState:
        """Record `bound` as this state's `max_position` (host bookkeeping only); returns self."""
        object.__setattr__(self, "_max_position", bound)
        return self

    @property
    def lane_sampling(self) -> tuple[tuple[float, int, float] | None, ...] | None:
        """Host-side (temperature, top_k, top_p) of each lane that may be active (None: a free lane),
        or None when unknown. Like `max_position`, host bookkeeping the step reads to pick its
        `SamplingPlan` without a sync (unknown: the plan exact for any parameters)."""
        return getattr(self, "_lane_sampling", None)

    def record_sampling(self, lanes: tuple[tuple[float, int, float] | None, ...] | None) -> DecodeState:
        """Record `lanes` as this state's `lane_sampling` (host bookkeeping only); returns self."""
        object.__setattr__(self, "_lane_sampling", None if lanes is None else tuple(lanes))
        return self

    @property
    def consumed(self) -> bool:
        """True once a step has taken this state (its KV leaves now belong to the returned state)."""
        return getattr(self, "_consumed", False)

    def mark_consumed(self) -> None:
        # Host-side bookkeeping only: not a field, so not a pytree leaf and never seen by the graph.
        object.__setattr__(self, "_consumed", True)

    def clone(self) -> DecodeState:
        """A deep copy (KV included): a state that can be stepped without consuming this one."""
        new = DecodeState(*(t.clone() for t in _fields(self))).bound_positions(self.max_position)
        return new.record_sampling(self.lane_sampling)

    def __repr__(self) -> str:
        b, w = self.tokens.shape
        return (
            f"DecodeState(lanes={b}, window={w}, active={int(self.active.sum())}, "
            f"device={self.tokens.device}, kv_dtype={self.target_kv.dtype}, "
            f"target_kv={tuple(self.target_kv.shape)}, draft_kv={tuple(self.draft_kv.shape)})"
        )


def _fields(obj: object) -> list[torch.Tensor]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]


for _cls in (DecodeState, StepOutput):
    pytree.register_pytree_node(
        _cls,
        lambda obj: (_fields(obj), None),
        lambda leaves, _ctx, cls=_cls: cls(*leaves),
        serialized_type_name=f"fdecode.{_cls.__name__}",
    )

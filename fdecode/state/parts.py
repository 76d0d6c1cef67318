"""The parts of a `DecodeState`: small frozen pytrees, one per concern (docs/design.md, "The state").

    kv          KV          the paged KV pools and block tables; a hybrid model's recurrent leaves
    lanes       Lanes       the window, each lane's position, budget, stop ids and packed output
    sampling    Sampling    each lane's sampling parameters, its PRNG address, the pending drafts' q
    processors  Processors  penalties and logit bias (None: the step has neither)
    grammar     Grammar     the grammar pool and each lane's automaton state (None: no grammars)
    draft       Draft       the draft kind's own leaves: n-gram history, missed tokens, tree parents

A feature the step is not compiled with is absent: its fields are None, and an optional part whose
fields are all None is None itself. Neither adds a leaf to the pytree (None is a leaf to torch's
pytree, so a part's flatten leaves its None fields out and names the fields present in its context). Every field also has a flat
name (`ROUTES`: the field's own, a grammar field's with `grammar_` in front), read as `state.counts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.utils import _pytree as pytree

Leaf = torch.Tensor | None


class Part:
    """A part's shared behaviour: flat names, a map over its leaves, a repr of shapes (never values)."""

    PREFIX: ClassVar[str] = ""  # in front of a field's name to make its flat name
    OPTIONAL: ClassVar[bool] = True  # a part whose fields are all None is absent (None)

    def values(self) -> tuple[Leaf, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def __repr__(self) -> str:
        shown = [
            f"{f.name}={list(v.shape)} {str(v.dtype).removeprefix('torch.')}"
            for f, v in zip(dataclasses.fields(self), self.values())
            if v is not None
        ]
        return f"{type(self).__name__}({', '.join(shown)})"


@dataclass(frozen=True, eq=False, repr=False)  # eq=False: `==` is identity (tensors have no bool ==)
class KV(Part):
    """What the models' forwards read and write in place (the donation contract, `DecodeState`)."""

    OPTIONAL: ClassVar[bool] = False
    # [L_t, 2, num_slots, Hkv_t, D_t] target paged KV (block 0 = scratch); MLA: [L_t, 1, num_slots, 1, R + Dr]
    # latents (`fdecode.ops.latent_kv`)
    target_kv: torch.Tensor
    draft_kv: torch.Tensor  # [L_d, 2, num_slots, Hkv_d, D_d] draft paged KV (block 0 = scratch)
    block_tables: torch.Tensor  # [B, max_blocks] int64: KV block of each lane, -1 = unallocated
    # The recurrent state of linear-attention layers, `fdecode.state.recurrent` (None: the model has none):
    target_conv: Leaf = None  # [B, Lr_t, 1, conv_dim, k-1] conv windows after the positions < base_pos
    target_rec: Leaf = None  # [B, Lr_t, 1, Hv, dk, dv] float32 delta-rule states after the positions < base_pos
    draft_conv: Leaf = None  # [B, Lr_d, K, conv_dim, k-1] draft conv windows after the last advance's K rows (tree: 1)
    draft_rec: Leaf = None  # [B, Lr_d, K, Hv, dk, dv] float32 draft delta-rule states after those rows (tree: 1)


@dataclass(frozen=True, eq=False, repr=False)
class Lanes(Part):
    """Each lane's window and progress."""

    OPTIONAL: ClassVar[bool] = False
    tokens: torch.Tensor  # [B, W] int64: t then K drafts
    base_pos: torch.Tensor  # [B] int64: position of t; the target KV holds positions < base_pos
    active: torch.Tensor  # [B] bool: lane is decoding; inactive lanes write only the scratch slot
    remaining: torch.Tensor  # [B] int64: tokens the lane may still commit
    stop_ids: torch.Tensor  # [B, E] int64: ids that end the lane (the stop id is emitted), -1 = none
    min_left: torch.Tensor  # [B] int64: tokens the lane commits before a stop id may be one (min_tokens)
    output: torch.Tensor  # [B, DecodeConfig.output_width] int64: packed StepOutput of the transition that made it


@dataclass(frozen=True, eq=False, repr=False)
class Sampling(Part):
    """Each lane's sampling parameters and the randomness of its transitions (`fdecode.ops.random`)."""

    OPTIONAL: ClassVar[bool] = False
    temperature: torch.Tensor  # [B] float32: 0 = greedy lane, > 0 = random lane
    top_k: torch.Tensor  # [B] int64: keep the k most probable tokens, 0 = off
    top_p: torch.Tensor  # [B] float32: keep the smallest top set of mass >= top_p, 1 = off
    min_p: torch.Tensor  # [B] float32: keep tokens with p >= min_p * max p, 0 = off
    seed: torch.Tensor  # [B] int64 in [0, 2**63): the lane's PRNG key (Philox)
    counter: torch.Tensor  # [B] int64: transitions so far; with `seed`, addresses this step's random numbers
    draft_probs: torch.Tensor  # [B, K, V] float32: distribution each pending draft was sampled from


@dataclass(frozen=True, eq=False, repr=False)
class Processors(Part):
    """Logit processors (`fdecode.ops.processors`): penalties (`DecodeConfig.penalties`) and logit bias
    (`DecodeConfig.max_logit_bias`); a feature's fields are None where the config leaves it off."""

    penalties: Leaf = None  # [B, 3] float32: repetition (1 = off), frequency, presence (0 = off)
    counts: Leaf = None  # [B, V] int32: each token's count among the lane's generated tokens (written in place)
    seen: Leaf = None  # [B, V] bool: the token is in the lane's prompt
    bias_ids: Leaf = None  # [B, NB] int64: ids with a logit bias, -1 = none
    bias: Leaf = None  # [B, NB] float32: their biases


@dataclass(frozen=True, eq=False, repr=False)
class Grammar(Part):
    """Grammars (`fdecode.ops.grammar`, the pool: `fdecode.state.grammar_pool`); flat names `grammar_*`."""

    PREFIX: ClassVar[str] = "grammar_"
    state: Leaf = None  # [B] int64: the lane's automaton state after its committed tokens, -1 = none
    allowed: Leaf = None  # [S, ceil(V / 32)] int32: the pool's allowed-token bitmask rows (written in place)
    keys: Leaf = None  # [T] int64 ascending: the pool's transitions, state * V + token (int64 max: free)
    next: Leaf = None  # [T] int64: the state each key leads to


@dataclass(frozen=True, eq=False, repr=False)
class Draft(Part):
    """The leaves of the draft kind (`fdecode.drafts`) and of a draft tree; None where it has none."""

    # n-gram drafts (`fdecode.drafts.ngram`): the committed token at each position, -1 past the last one,
    # written in place like the KV.
    history: Leaf = None  # [B, blocks_per_lane * block_size + W] int64
    # A draft LM that sits out depth-0 steps (`fdecode.ops.catch_up`): per lane the last C committed tokens it
    # has not seen, the newest (at base_pos) last, -1 = none.
    missed: Leaf = None  # [B, DecodeConfig.draft_catch_up] int64
    # Draft trees (`fdecode.tree`): each window row's parent row (-1: the root t).
    tree_parents: Leaf = None  # [B, W] int64


PARTS: dict[str, type[Part]] = {
    "kv": KV,
    "lanes": Lanes,
    "sampling": Sampling,
    "processors": Processors,
    "grammar": Grammar,
    "draft": Draft,
}
FIELDS: dict[str, tuple[str, ...]] = {
    part: tuple(f.name for f in dataclasses.fields(cls)) for part, cls in PARTS.items()
}
# flat name -> (part, field), in the state's leaf order
ROUTES: dict[str, tuple[str, str]] = {
    PARTS[part].PREFIX + field: (part, field) for part, fields in FIELDS.items() for field in fields
}


def unknown(names) -> TypeError:
    """The error for flat names no part holds."""
    return TypeError(
        f"DecodeState has no leaf {', '.join(map(repr, names))}; its leaves are {', '.join(ROUTES)} "
        f"and its parts {', '.join(PARTS)}"
    )


def made(cls: type[Part], fields: dict[str, Leaf]) -> Part | None:
    """`cls(**fields)`, or None for an optional part whose fields are all None."""
    if cls.OPTIONAL and all(v is None for v in fields.values()):
        return None
    return cls(**fields)


def with_fields(part: Part | None, name: str, changes: dict[str, Leaf]) -> Part | None:
    """`part` (the state's part `name`, None: absent) with `changes` (field names), absent again if they leave
    every field None. Traceable: a step builds its next state with it (names from `FIELDS`, not a class's fields)."""
    fields = {field: None if part is None else getattr(part, field) for field in FIELDS[name]}
    fields.update(changes)
    return made(PARTS[name], fields)


def parts_from(leaves: dict[str, Leaf]) -> dict[str, Part | None]:
    """The parts holding `leaves` (flat names; a missing optional leaf is None). Raises TypeError for a name no
    part holds or a required leaf missing."""
    strays = [name for name in leaves if name not in ROUTES]
    if strays:
        raise unknown(strays)
    grouped: dict[str, dict[str, Leaf]] = {part: {} for part in PARTS}
    for name, value in leaves.items():
        part, field = ROUTES[name]
        grouped[part][field] = value
    return {part: with_fields(None, part, grouped[part]) for part in PARTS}


def mapped(part: Part | None, fn: Callable[[torch.Tensor], torch.Tensor]) -> Part | None:
    """`part` with `fn` applied to each of its leaves (None stays None)."""
    if part is None:
        return None
    return type(part)(*(None if v is None else fn(v) for v in part.values()))


def _flatten(part: Part) -> tuple[list[torch.Tensor], tuple[str, ...]]:
    """A part's leaves, its None fields left out (the context names the fields present: structure)."""
    present = [(f.name, getattr(part, f.name)) for f in dataclasses.fields(part) if getattr(part, f.name) is not None]
    return [leaf for _, leaf in present], tuple(name for name, _ in present)


for _cls in PARTS.values():
    pytree.register_pytree_node(
        _cls,
        _flatten,
        lambda children, names, cls=_cls: cls(**dict(zip(names, children))),
        serialized_type_name=f"fdecode.state.{_cls.__name__}",
    )

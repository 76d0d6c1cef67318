"""`DecodeState` and `StepOutput`: the immutable pytrees a decode step consumes and returns
(docs/design.md, "The state"). A state is made of parts (`fdecode.state.parts`: kv, lanes, sampling and
the optional processors, grammar, draft); its leaves also read, and `replace`, by flat name.

Terms (per lane b: *committed*, *t*, *verified tokens* `tokens[b] = [t, d1 .. dK]`, *accepted*,
*greedy* and *random* lanes; B = max_batch, K = drafts, W = K + 1) are those of docs/design.md,
"Glossary".

Donation contract (JAX `donate_argnums`): a step consumes its input state. The KV leaves (and a
hybrid model's recurrent-state leaves, `fdecode.state.recurrent`) are written in place and aliased
into the new state, so a step costs O(work), never O(cache capacity). A state passed to a step (or
one sharing its KV: a `replace` or pytree copy of it) is refused from then on; so is a state whose
KV pool a later `prefill` took over (the rules: `fdecode.state.ownership`): the KV ticket is not a
leaf but the pytree context. What the host knows of a state (its position bound, lanes' sampling, draft lag)
is not on it: the Step keeps it (`fdecode.host_record`). Both dataclasses compare by identity (`eq=False`),
and printing a state never syncs the device.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from fdecode.state.ownership import TICKET, KVTicket, set_ticket, storage_of
from fdecode.state.parts import (
    FIELDS,
    KV,
    PARTS,
    ROUTES,
    Draft,
    Grammar,
    Lanes,
    Part,
    Processors,
    Sampling,
    mapped,
    parts_from,
    unknown,
    with_fields,
)

# Why a lane was stopped with an error, by its status in the packed output (the host's message).
ERRORS = {
    2: "ran out of KV blocks (pool exhausted while the request grew)",
    3: "no token was allowed: the request's grammar allows only its EOS here and min_tokens masks it",
}
REPR_LANES = 8  # a StepOutput repr lists the tokens of batches up to this many lanes


@dataclass(frozen=True, eq=False)  # eq=False: `==` is identity (a field-wise == of tensors cannot be a bool)
class StepOutput:
    """What one transition (prefill or step) committed, packed so the host does one device->host copy.

    packed: [B, W + 3 + W x C] int64, per lane: the accepted tokens (-1 padded) | the drafts the verified
    rows carried | logprobs, C = `DecodeConfig.logprob_columns` per window row (float32 bit patterns: the
    committed token's, then N top ids and N top logprobs) | the count L | status (0 running, 1 finished,
    2 stopped: out of KV blocks, 3 stopped: a row allowed no token; `ERRORS`). window: W (None: a packing
    without logprobs, W = width - 3)."""

    packed: torch.Tensor
    window: int | None = None

    @property
    def width(self) -> int:
        """W, the tokens column count."""
        return self.packed.shape[1] - 3 if self.window is None else self.window

    @property
    def tokens(self) -> torch.Tensor:
        """[B, W] int64: the accepted tokens of each lane, padded with -1."""
        return self.packed[:, : self.width]

    @property
    def num_drafts(self) -> torch.Tensor:
        """[B] int64: the drafts this transition verified (proposed in the window and checked), 0 for a
        first-row step, priming or an inactive lane."""
        return self.packed[:, self.width]

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
        """[B] bool: the lane was stopped with an error (status >= 2, `ERRORS` says which): it ran past its
        KV blocks (`cut_at_missing_kv`) or a row allowed no token (`cut_at_masked_rows`)."""
        return self.packed[:, -1] >= 2

    @property
    def logprobs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(token [B, W] float32, top_ids [B, W, N] int64, top [B, W, N] float32): each committed token's
        logprob and the N most probable alternatives of its row, None where the step computes none."""
        w = self.width
        columns = self.packed[:, w + 1 : -2]
        if columns.shape[1] == 0:
            return None
        rows = columns.reshape(columns.shape[0], w, -1)
        n = (rows.shape[2] - 1) // 2
        as_float = lambda x: x.to(torch.int32).view(torch.float32)
        return as_float(rows[..., 0]), rows[..., 1 : 1 + n], as_float(rows[..., 1 + n :])

    @staticmethod
    def pack(
        tokens: torch.Tensor,
        num_tokens: torch.Tensor,
        status: torch.Tensor,
        drafts: torch.Tensor | None = None,
        logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> StepOutput:
        """status: [B] int64 or bool, 0 running, 1 finished, >= 2 stopped with an error (`ERRORS`);
        drafts: [B] (None: 0);
        logprobs: (token [B, W], top_ids [B, W, N], top [B, W, N]) float32 / int64 / float32, or None."""
        b, w = tokens.shape
        drafts = torch.zeros_like(num_tokens) if drafts is None else drafts
        columns = [tokens, drafts[:, None].long()]
        if logprobs is not None:
            token_lp, top_ids, top_lp = logprobs
            bits = lambda x: x.float().contiguous().view(torch.int32).long()
            columns.append(torch.cat([bits(token_lp)[..., None], top_ids.long(), bits(top_lp)], dim=-1).reshape(b, -1))
        columns += [num_tokens[:, None], status[:, None].long()]
        return StepOutput(torch.cat(columns, dim=1), w)

    def __repr__(self) -> str:
        """The committed tokens of each lane for a batch of at most REPR_LANES lanes on the CPU; otherwise
        shapes only, since reading an accelerator's tensor would sync the device."""
        b, w, device = self.packed.shape[0], self.width, self.packed.device
        head = f"<StepOutput lanes={b} K+1={w} device={device}"
        if device.type != "cpu" or b > REPR_LANES:
            return f"{head} (out.tokens.tolist() reads the tokens)>"
        lanes = [
            f"\n  lane {lane}: {row[: row[-2]]}{' finished' if row[-1] else ''}{' (error)' if row[-1] >= 2 else ''}"
            for lane, row in enumerate(self.packed.tolist())
        ]
        return head + "".join(lanes) + ">"


@dataclass(frozen=True, eq=False)  # eq=False: `==` is identity (a field-wise == of tensors cannot be a bool)
class DecodeState:
    """Everything a decode step reads and writes; fixed-shape tensors only, in parts (`fdecode.state.parts`):
    an optional part is None where the step is compiled without its feature. Each leaf also reads by its flat
    name (`state.tokens`, `state.counts`, `state.grammar_keys`: None where absent); `DecodeState.of` builds
    a state from flat names and `replace` changes leaves by them."""

    kv: KV
    lanes: Lanes
    sampling: Sampling
    processors: Processors | None = None
    grammar: Grammar | None = None
    draft: Draft | None = None

    @classmethod
    def of(cls, **leaves: torch.Tensor | None) -> DecodeState:
        """The state of `leaves` by flat name (`fdecode.state.parts.ROUTES`); an absent optional leaf is None."""
        return cls(**parts_from(leaves))

    @property
    def step_output(self) -> StepOutput:
        return StepOutput(self.output, self.tokens.shape[1])

    def replace(self, **changes: torch.Tensor | Part | None) -> DecodeState:
        """A new state with `changes`, by flat leaf name or part name (`with_leaves`); it keeps the KV chain
        (`kv_ticket`) while the KV leaves are kept."""
        new = with_leaves(self, **changes)
        ticket = self.kv_ticket
        set_ticket(new, ticket if _same_kv(new, self) or ticket is None else ticket.detached())
        return new

    @property
    def kv_ticket(self) -> KVTicket | None:
        """Host-side token of the KV chain this state belongs to (`fdecode.state.ownership`): shared by
        the states over the same KV content, spent when one of them is stepped or its pool re-primed.
        None: unknown (a state a step was never given)."""
        return self.__dict__.get(TICKET)

    @property
    def consumed(self) -> bool:
        """True once this state may no longer be stepped: a step took it (or a state sharing its KV),
        or a later prefill re-primed its KV pool (`fdecode.state.ownership`)."""
        ticket = self.kv_ticket
        return ticket is not None and ticket.spent is not None

    def clone(self) -> DecodeState:
        """A deep copy (KV included): a state that can be stepped without consuming this one."""
        new = map_leaves(self, torch.Tensor.clone)
        ticket = self.kv_ticket
        set_ticket(new, None if ticket is None else ticket.detached())  # KV of its own, equally stale
        return new

    def __repr__(self) -> str:
        # Shapes, dtype and device only: reading a tensor value would sync the device.
        # K+1: the verified tokens per lane ("window" is the attention window, `DecodeConfig.context_buckets`).
        b, w = self.tokens.shape
        optional = [name for name in ("processors", "grammar", "draft") if getattr(self, name) is not None]
        return (
            f"<DecodeState lanes={b} K+1={w} "
            f"device={self.tokens.device} kv_dtype={self.target_kv.dtype} "
            f"target_kv={tuple(self.target_kv.shape)} draft_kv={tuple(self.draft_kv.shape)}"
            f"{' with ' + ', '.join(optional) if optional else ''}"
            f"{' consumed' if self.consumed else ''}>"
        )


def _reader(part: str, field: str) -> property:
    def read(state: DecodeState) -> torch.Tensor | None:
        holder = getattr(state, part)
        return None if holder is None else getattr(holder, field)

    return property(read, doc=f"`state.{part}.{field}` (None where the state has no {part} part).")


for _flat, (_part, _field) in ROUTES.items():  # the flat read access: state.tokens, state.counts, ...
    setattr(DecodeState, _flat, _reader(_part, _field))

LEAVES = tuple(ROUTES)  # every flat leaf name, in the state's leaf order
# Per part: its name, a getter of its fields' values (each part has several: attrgetter returns a tuple) and the
# values of an absent part.
_GETTERS = tuple((name, operator.attrgetter(*FIELDS[name]), (None,) * len(FIELDS[name])) for name in PARTS)


MEMO = "_leaves"  # where a state keeps its leaves once read: not a field, so not a pytree leaf, never in a graph


def leaves_of(state: DecodeState) -> tuple[torch.Tensor | None, ...]:
    """`state`'s leaf of each name in `LEAVES` (None where absent), read part by part once and then kept beside
    the state (it is frozen: they cannot change): a Step reads them several times a call (its trust in the state,
    `fdecode.graphs.trusted`, and its host records, `fdecode.host_record`)."""
    leaves = state.__dict__.get(MEMO)
    if leaves is None:
        leaves = ()
        for name, get, absent in _GETTERS:
            part = getattr(state, name)
            leaves += absent if part is None else get(part)
        state.__dict__[MEMO] = leaves
    return leaves


def with_leaves(state: DecodeState, **changes: torch.Tensor | Part | None) -> DecodeState:
    """`state` with `changes` by flat leaf name (routed to its part) or part name, without a KV ticket: what a
    step builds inside its graph (`DecodeState.replace` is this plus the ticket). An optional part left with no
    leaf becomes None. Raises TypeError for a name that is neither."""
    grouped: dict[str, dict[str, torch.Tensor | None]] = {}
    whole: dict[str, Part | None] = {}
    for name, value in changes.items():
        if name in PARTS:
            whole[name] = value
        elif name in ROUTES:
            part, field = ROUTES[name]
            grouped.setdefault(part, {})[field] = value
        else:
            raise unknown([name])
    for part, fields in grouped.items():
        whole[part] = with_fields(whole.get(part, getattr(state, part)), part, fields)
    return dataclasses.replace(state, **whole)


def present_parts(state: DecodeState) -> tuple[str, ...]:
    """The names of `state`'s parts that are not None."""
    return tuple(name for name in PARTS if getattr(state, name) is not None)


def map_leaves(state: DecodeState, fn: Callable[[torch.Tensor], torch.Tensor]) -> DecodeState:
    """A state of `fn` of each of `state`'s leaves, without a KV ticket."""
    return DecodeState(*(mapped(getattr(state, name), fn) for name in PARTS))


def _kv_storages(state: DecodeState) -> tuple[int | None, int | None]:
    return storage_of(state.target_kv), storage_of(state.draft_kv)


def _same_kv(a: DecodeState, b: DecodeState) -> bool:
    """Both states' KV leaves are the same objects, or views of the same storages."""
    if a.target_kv is b.target_kv and a.draft_kv is b.draft_kv:
        return True
    kv = _kv_storages(a)
    return None not in kv and kv == _kv_storages(b)


def _ref(leaf: object) -> Callable[[], object]:
    try:
        return weakref.ref(leaf)
    except TypeError:  # a leaf that is not a tensor (a pytree map may put anything there)
        return lambda: leaf


class _TicketContext:
    """A DecodeState's pytree context: the parts present, its KV ticket and (weakly) the KV leaves it was
    flattened from, so an unflatten can tell whether a map replaced the KV. Only the parts are structure:
    contexts of the same parts compare equal, so states of different chains still have the same TreeSpec."""

    __slots__ = ("ticket", "leaves", "kv", "parts")

    def __init__(self, state: DecodeState) -> None:
        self.parts = present_parts(state)  # structure: the parts present (an absent one has no leaves)
        self.ticket = state.kv_ticket
        self.leaves = (_ref(state.target_kv), _ref(state.draft_kv))
        self.kv = _kv_storages(state)

    def rebuilt(self, parts: list[Part]) -> DecodeState:
        new = DecodeState(**dict(zip(self.parts, parts)))
        kept = self.leaves[0]() is new.target_kv and self.leaves[1]() is new.draft_kv
        same_kv = kept or (None not in self.kv and _kv_storages(new) == self.kv)
        set_ticket(new, self.ticket if same_kv or self.ticket is None else self.ticket.detached())
        return new

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TicketContext) and other.parts == self.parts

    def __hash__(self) -> int:
        return hash(self.parts)

    def __repr__(self) -> str:
        return "<DecodeState KV ticket>"


pytree.register_pytree_node(
    DecodeState,
    lambda state: ([getattr(state, name) for name in present_parts(state)], _TicketContext(state)),
    lambda parts, ctx: ctx.rebuilt(list(parts)),
    serialized_type_name="fdecode.DecodeState",
)
pytree.register_pytree_node(
    StepOutput,
    lambda obj: ([obj.packed], obj.window),
    lambda leaves, window: StepOutput(*leaves, window),
    serialized_type_name="fdecode.StepOutput",
)

"""`DecodeState` and `StepOutput`: the immutable pytrees a decode step consumes and returns
(docs/design.md, "The state").

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
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from fdecode.state.ownership import TICKET, KVTicket, set_ticket, storage_of

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
    """Everything a decode step reads and writes; fixed-shape tensors only."""

    tokens: torch.Tensor  # [B, W] int64: t then K drafts
    base_pos: torch.Tensor  # [B] int64: position of t; the target KV holds positions < base_pos
    block_tables: torch.Tensor  # [B, max_blocks] int64: KV block of each lane, -1 = unallocated
    target_kv: torch.Tensor  # [L_t, 2, num_slots, Hkv_t, D_t] target paged KV (block 0 = scratch); MLA: [L_t, 1, num_slots, 1, R + Dr] latents (`fdecode.ops.latent_kv`)
    draft_kv: torch.Tensor  # [L_d, 2, num_slots, Hkv_d, D_d] draft paged KV (block 0 = scratch)
    # Recurrent state of linear-attention layers (hybrid models; 0 layers otherwise), `fdecode.state.recurrent`:
    target_conv: torch.Tensor  # [B, Lr_t, 1, conv_dim, k-1] conv windows after the positions < base_pos
    target_rec: torch.Tensor  # [B, Lr_t, 1, Hv, dk, dv] float32 delta-rule states after the positions < base_pos
    draft_conv: torch.Tensor  # [B, Lr_d, K, conv_dim, k-1] draft conv windows after the last advance's K rows
    draft_rec: torch.Tensor  # [B, Lr_d, K, Hv, dk, dv] float32 draft delta-rule states after those rows
    # n-gram drafts (`fdecode.drafts.ngram`): the committed token at each position, -1 past the last one,
    # written in place like the KV; [B, 0] for any other draft.
    history: torch.Tensor  # [B, blocks_per_lane * block_size + W] int64
    # A draft LM that sits out depth-0 steps (`fdecode.ops.catch_up`): per lane the last C committed tokens it
    # has not seen, the newest (at base_pos) last, -1 = none; [B, 0] where the draft runs at every step.
    missed: torch.Tensor  # [B, DecodeConfig.draft_catch_up] int64
    active: torch.Tensor  # [B] bool: lane is decoding; inactive lanes write only the scratch slot
    remaining: torch.Tensor  # [B] int64: tokens the lane may still commit
    stop_ids: torch.Tensor  # [B, E] int64: ids that end the lane (the stop id is emitted), -1 = none
    temperature: torch.Tensor  # [B] float32: 0 = greedy lane, > 0 = random lane
    top_k: torch.Tensor  # [B] int64: keep the k most probable tokens, 0 = off
    top_p: torch.Tensor  # [B] float32: keep the smallest top set of mass >= top_p, 1 = off
    min_p: torch.Tensor  # [B] float32: keep tokens with p >= min_p * max p, 0 = off
    # Logit processors (`fdecode.ops.processors`); [B, 0] where the config leaves the feature off:
    penalties: torch.Tensor  # [B, 3] float32: repetition (1 = off), frequency, presence (0 = off)
    counts: torch.Tensor  # [B, V] int32: each token's count among the lane's generated tokens (written in place)
    seen: torch.Tensor  # [B, V] bool: the token is in the lane's prompt
    min_left: torch.Tensor  # [B] int64: tokens the lane commits before a stop id may be one (min_tokens)
    bias_ids: torch.Tensor  # [B, NB] int64: ids with a logit bias, -1 = none
    bias: torch.Tensor  # [B, NB] float32: their biases
    # Grammars (`fdecode.ops.grammar`; [0, 0] / [0] pools where DecodeConfig.max_grammar_states is 0):
    grammar_state: torch.Tensor  # [B] int64: the lane's automaton state after its committed tokens, -1 = none
    grammar_allowed: torch.Tensor  # [S, ceil(V / 32)] int32: the pool's allowed-token bitmask rows (written in place)
    grammar_keys: torch.Tensor  # [T] int64 ascending: the pool's transitions, state * V + token (int64 max: free)
    grammar_next: torch.Tensor  # [T] int64: the state each key leads to
    seed: torch.Tensor  # [B] int64 in [0, 2**63): the lane's PRNG key (Philox, `fdecode.ops.random`)
    counter: torch.Tensor  # [B] int64: transitions so far; with `seed`, addresses this step's random numbers
    draft_probs: torch.Tensor  # [B, K, V] float32: distribution each pending draft was sampled from
    output: (
        torch.Tensor
    )  # [B, DecodeConfig.output_width] int64: packed StepOutput of the transition that made this state
    # Draft trees (`fdecode.tree`): each window row's parent row (-1: the root t); [B, 0] for a chain.
    tree_parents: torch.Tensor  # [B, W] int64

    @property
    def step_output(self) -> StepOutput:
        return StepOutput(self.output, self.tokens.shape[1])

    def replace(self, **changes: torch.Tensor) -> DecodeState:
        """A new state with `changes`; it keeps the KV chain (`kv_ticket`) while the KV leaves are kept."""
        new = dataclasses.replace(self, **changes)
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
        new = DecodeState(*(t.clone() for t in _fields(self)))
        ticket = self.kv_ticket
        set_ticket(new, None if ticket is None else ticket.detached())  # KV of its own, equally stale
        return new

    def __repr__(self) -> str:
        # Shapes, dtype and device only: reading a tensor value would sync the device.
        # K+1: the verified tokens per lane ("window" is the attention window, `DecodeConfig.context_buckets`).
        b, w = self.tokens.shape
        return (
            f"<DecodeState lanes={b} K+1={w} "
            f"device={self.tokens.device} kv_dtype={self.target_kv.dtype} "
            f"target_kv={tuple(self.target_kv.shape)} draft_kv={tuple(self.draft_kv.shape)}"
            f"{' consumed' if self.consumed else ''}>"
        )


def _fields(obj: object) -> list[torch.Tensor]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]


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


_NAMES = tuple(f.name for f in dataclasses.fields(DecodeState))


class _TicketContext:
    """A DecodeState's pytree context: its KV ticket and (weakly) the leaves it was flattened from, so an
    unflatten can tell whether a map replaced the KV. Not structure: every context compares equal, so states
    of different chains still have the same TreeSpec."""

    __slots__ = ("ticket", "leaves", "kv")

    def __init__(self, state: DecodeState) -> None:
        self.ticket = state.kv_ticket
        self.leaves = tuple(_ref(t) for t in _fields(state))
        self.kv = _kv_storages(state)

    def rebuilt(self, leaves: list[torch.Tensor]) -> DecodeState:
        new = DecodeState(*leaves)
        changed = {name for name, ref, leaf in zip(_NAMES, self.leaves, leaves) if ref() is not leaf}
        same_kv = not {"target_kv", "draft_kv"} & changed or (None not in self.kv and _kv_storages(new) == self.kv)
        set_ticket(new, self.ticket if same_kv or self.ticket is None else self.ticket.detached())
        return new

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TicketContext)

    def __hash__(self) -> int:
        return hash(_TicketContext)

    def __repr__(self) -> str:
        return "<DecodeState KV ticket>"


pytree.register_pytree_node(
    DecodeState,
    lambda state: (_fields(state), _TicketContext(state)),
    lambda leaves, ctx: ctx.rebuilt(list(leaves)) if isinstance(ctx, _TicketContext) else DecodeState(*leaves),
    serialized_type_name="fdecode.DecodeState",
)
pytree.register_pytree_node(
    StepOutput,
    lambda obj: ([obj.packed], obj.window),
    lambda leaves, window: StepOutput(*leaves, window),
    serialized_type_name="fdecode.StepOutput",
)

"""`NgramDraft` and its drafter: prompt lookup (n-gram) drafts, a draft with no weights and no KV
(docs/design.md, "Prompt lookup: n-gram drafts").

`fdecode.compile(target, "ngram", cfg)` (or `NgramDraft(max_n=..., min_n=...)`) proposes, for each
lane, the K tokens that followed the latest earlier occurrence of its last n committed tokens,
n from `max_n` down to `min_n` (`fdecode.ops.ngram`), inside the step graph, over a per-lane token
history in the state (`DecodeState.history`, written in place as tokens are committed; priming
writes the prompt). The proposal is a point mass (q = 1 on each proposed token), so rejection
sampling stays exact for random lanes; a lane without a match proposes nothing, and the verify
never accepts a draft that was not proposed. An Engine pauses verifying them while they are not being
accepted (`DecodeConfig.draft_gate`: `fdecode.runtime.gate`).
"""

from __future__ import annotations

import dataclasses

import torch

from fdecode.drafts.base import Drafter
from fdecode.drafts.tokens import point_masses
from fdecode.ops.grammar import walk, walk_tree
from fdecode.ops.ngram import lookup, lookup_list, write_history
from fdecode.tree.ngram import ngram_tree


class NgramDraft(torch.nn.Module):
    """Prompt-lookup drafts: n from `max_n` down to `min_n` (1 <= min_n <= max_n), K = the step's
    `num_draft_tokens`. Holds no weights; the step's copy (`bound`) knows the target's KV layout."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        super().__init__()
        for name, value in (("max_n", max_n), ("min_n", min_n)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"NgramDraft.{name} must be a positive int, got {value!r}")
        if min_n > max_n:
            raise ValueError(f"NgramDraft needs min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.kv_config = None  # set by `bound`: the target's KV layout with no layers

    def bound(self, target: torch.nn.Module) -> NgramDraft:
        """The step's copy for `target` (its `kv_config` is a `NoKV` of the target's attention shape)."""
        draft = NgramDraft(self.max_n, self.min_n)
        kv = target.kv_config
        draft.kv_config = NoKV(kv.num_heads, kv.num_kv_heads, kv.head_dim)
        return draft

    def extra_repr(self) -> str:
        return f"max_n={self.max_n}, min_n={self.min_n}"


@dataclasses.dataclass(frozen=True)
class NoKV:
    """The draft-KV layout of a draft without KV: attention shapes for the kernel checks, no layers, and
    a one-element placeholder leaf. Not an empty tensor: a step tells its KV pools apart by the storage
    address of their leaves (`fdecode.state.ownership`), and every empty tensor has address 0."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int = 0

    def new_kv(self, num_slots: int, *, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        return torch.zeros(1, dtype=dtype, device=device)


class NgramDrafter(Drafter):
    """Prompt lookup inside the step: no forward, no KV, every depth proposes all K (a lookup costs nothing)."""

    kind = "ngram"
    forwards = False  # priming writes the prompt into the history; there is no draft forward
    has_weights = False  # every tensor-parallel rank looks up the same committed tokens

    def recurrent(self, draft) -> bool:
        return False

    def history_width(self, cfg) -> int:
        """Every position of a lane's blocks (`blocks_per_lane * block_size`, which the widest attention window
        reads, even where `max_seq_len` is not a multiple of the block size) plus room for a step's -1 padding
        past the end (`fdecode.ops.ngram.write_history`)."""
        return cfg.blocks_per_lane * cfg.block_size + cfg.W

    def proposals(self, draft, cfg, depth: int) -> int:
        return cfg.K

    def gated(self, cfg) -> bool:
        return cfg.draft_gate and not cfg.tree  # a tree's depth 0 drafts one node: a trial would verify it, not a tree

    def adapts(self, cfg) -> bool:
        # A chain's lookup costs nothing: the gate decides between depth K and 0. A tree's rows cost where rows do
        # (a CPU): the controller weighs them against its chains, as a draft LM's (`tree_levels`).
        return cfg.tree and cfg.adaptive_depth

    def backend_reason(self, backend: str) -> str | None:
        if backend in ("cudagraphs", "torchair"):
            return (
                "the n-gram draft's token-history leaf is written in place but not yet held at a static address "
                "(priming rebuilds it), so graph replay would copy or re-record it every step"
            )
        return None

    def forward_bytes(self, draft) -> int:
        return 0

    def layers_per_forward(self, draft) -> int:
        return 0

    def propose(
        self,
        draft,
        cfg,
        state,
        committed,
        rows,
        pos,
        context,
        draft_u,
        *,
        plan,
        draft_regions,
        proposals,
        catch_up,
        last,
    ):
        """Prompt lookup over the lane's token history (written in place, like the KV). q is a point mass on
        each proposed token (rejection sampling stays exact), zero where none."""
        write_history(state.history, state.base_pos, committed.accepted)
        found = lookup(state.history[:, : context.shape[1] * cfg.block_size], pos, cfg.K, draft.max_n, draft.min_n)
        if cfg.grammars:  # a proposal that leaves the lane's language ends the proposal there
            vocab = state.draft_probs.shape[-1]
            walked = walk(state.grammar_keys, state.grammar_next, committed.grammar_state, found, vocab)[:, 1:]
            found = torch.where(torch.cumsum((walked == -2).long(), dim=1) > 0, -1, found)
        draft_probs = state.draft_probs if draft_u is None else point_masses(found, state.draft_probs.shape[-1])
        return list(found.unbind(1)), draft_probs, state.missed

    def propose_tree(self, draft, cfg, state, committed, pos, context, *, shape, draft_regions, run_rows, catch_up):
        """The k most frequent continuations of each node (`fdecode.tree.ngram`), over the history written first."""
        write_history(state.history, state.base_pos, committed.accepted)
        window = state.history[:, : context.shape[1] * cfg.block_size]
        vocab = state.draft_probs.shape[-1]
        tokens, parents = ngram_tree(window, pos, shape, draft.max_n, draft.min_n, vocab)
        if cfg.grammars:  # a node that leaves the lane's language is absent, and so is everything under it
            root = parents.new_full((parents.shape[0], 1), -1)
            walked = walk_tree(
                state.grammar_keys, state.grammar_next, committed.grammar_state,
                torch.cat([root, tokens], 1), torch.cat([root, parents], 1), shape.levels, vocab,
            )  # fmt: skip
            tokens = torch.where(walked[:, 1:] == -2, -1, tokens)
        return tokens, parents

    def host_proposals(self, draft, tokens: list[int], k: int) -> list[int]:
        """The step's lookup rule on the host (`fdecode.ops.ngram.lookup_list`)."""
        return lookup_list(tokens, k, draft.max_n, draft.min_n)

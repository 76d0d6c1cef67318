"""`Drafter`: what a decode step asks of its draft, one subclass per draft kind
(docs/design.md, "Draft kinds").

A drafter is a stateless strategy: one object per kind (`fdecode.drafts.drafter_for`), whose methods take
the draft module the step owns (an fdecode model, an MTP head or an `NgramDraft`). The step, the prefill,
the backends, tensor parallelism and the Engine ask it, never the draft's type:

- state: which leaves the kind adds (`history_width`, `missed_width`);
- priming: whether the prompt runs through a draft forward (`forwards`);
- the step: how it proposes the next window (`propose`) and how many drafts (`proposals`), the next tree
  (`propose_tree`), and a host loop's proposals for a draft without a forward (`host_proposals`);
- the schedule: which depths it runs (`depths`), whether it may sit steps out (`idles`), and which depth
  policy an Engine uses (`gated`, `adapts`: `fdecode.runtime.policy`);
- backends and costs: why a backend cannot capture it (`backend_reason`), the bytes a forward reads and
  the decoder layers it runs (`layers_per_forward`).
"""

from __future__ import annotations

from fdecode.models.cost import forward_bytes
from fdecode.models.regions import decoder_layers
from fdecode.state.recurrent import is_hybrid
from fdecode.tree.shape import tree_depths


class Drafter:
    """The defaults of a draft with a forward (a draft LM or an MTP head); `kind` names it in messages."""

    kind = "model"
    forwards = True  # priming runs the prompt through the draft (it keeps KV of its own)
    has_weights = True  # tensor parallelism shards it (`fdecode.models.sharding`)
    shares_target = False  # it borrows the target's embedding and LM head (an MTP head, bound to the target)

    def recurrent(self, draft) -> bool:
        """Whether the draft carries linear-attention state (a ring of states over the window's rows)."""
        return is_hybrid(draft)

    def depths(self, draft, cfg, *, target) -> tuple[int, ...]:
        """The depths a step of this draft beside `target` runs (`Schedule.depths`): a tree step 0 .. S, chains,
        and K, its N nodes (`fdecode.tree.shape.tree_depths`; a recurrent model's state follows each node's
        parent, so any of them rolls back); a chain step where the target or the draft carries linear-attention
        state (`recurrent`) 0 or K, else any depth 0 .. K."""
        k, recurrent = cfg.K, is_hybrid(target) or self.recurrent(draft)
        if cfg.tree:
            return tree_depths(cfg)
        return (0, k) if recurrent else tuple(range(k + 1))

    def idles(self, draft, cfg) -> bool:
        """Whether the draft sits out depth-0 steps and catches up later (`fdecode.ops.catch_up`)."""
        return False

    def history_width(self, cfg) -> int:
        """Columns of `DecodeState.history`, the committed tokens a lookup reads (0: none kept)."""
        return 0

    def missed_width(self, draft, cfg) -> int:
        """Columns of `DecodeState.missed`: `draft_catch_up` where the draft sits out depth-0 steps, else 0."""
        return cfg.draft_catch_up if self.idles(draft, cfg) else 0

    def proposals(self, draft, cfg, depth: int) -> int:
        """How many drafts a step of `depth` proposes for the next window: as many as it verified (at least the
        one the draft's first forward makes anyway, which keeps the draft's KV in step); all K where a recurrent
        draft's ring needs them (`commit_ring`); none at depth 0 where the draft sits the step out (`idles`)."""
        if self.recurrent(draft):
            return cfg.K
        return 0 if depth == 0 and self.idles(draft, cfg) else max(depth, 1)

    def layers_per_forward(self, draft) -> int:
        """Decoder layers one draft forward runs (`fdecode.models.regions.layer_copies`): a draft LM's all."""
        return decoder_layers(draft)

    def forward_kwargs(self, draft, j: int) -> dict:
        """Extra keywords of draft forward j (an MTP head's layer); {} for a draft LM."""
        return {}

    def layer_of(self, draft, j: int) -> int:
        """The layer draft forward j runs (an MTP head's j mod its layers); 0 for a draft LM."""
        return 0

    def gated(self, cfg) -> bool:
        """Whether an Engine pauses verifying drafts that do not pay: the on/off `DraftGate` depth policy."""
        return False

    def adapts(self, cfg) -> bool:
        """Whether an Engine chooses each launch's depth by cost and acceptance (`DepthController`)."""
        return cfg.adaptive_depth

    def backend_reason(self, backend: str) -> str | None:
        """Why `backend` cannot capture a step of this draft kind (None: it can)."""
        return None

    def tree_reason(self, draft) -> str | None:
        """Why this draft cannot draft trees (`fdecode.tree`; None: it can, where its models can)."""
        return None

    def forward_bytes(self, draft) -> int:
        """The bytes of weights one draft forward reads (`fdecode.models.cost.forward_bytes`)."""
        return forward_bytes(draft)

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
        """The next window's drafts ([B] int64 each, -1 where none), their q [B, K, V] and the `missed` leaf.

        rows: the fused op's draft rows (`prepare_next_draft`); pos: P, each lane's next position; context: the
        attention window's block columns; draft_u: [B, K, 2] uniforms (None: greedy-only); `plan`, `draft_regions`, `proposals` (how many, `proposals`), `catch_up` (the draft takes what it sat out first,
        `fdecode.ops.catch_up`) and `last` (the last committed token per lane, the next window's first)."""
        raise NotImplementedError

    def propose_tree(self, draft, cfg, state, committed, pos, context, *, shape, draft_regions, run_rows, catch_up):
        """The next tree's `shape.nodes` nodes (`fdecode.tree.shape.TreeShape`: the config's tree, or a chain at a
        shallower depth): tokens [B, n] (-1 absent) and parents [B, n] (0: the root), in topological order, the
        draft's chain first where it has one, from the last committed token at `pos`
        (`fdecode.tree.step.tree_advance`). run_rows: the committed run's last rows a draft that catches up on
        it runs (`fdecode.tree.step.catch_up_length`); catch_up: a draft that sat depth-0 steps out (`idles`) first takes
        the tokens it missed."""
        raise NotImplementedError

    def host_proposals(self, draft, tokens: list[int], k: int) -> list[int]:
        """Up to k drafts after a lane's `tokens` (prompt and output), proposed on the host by a draft without a
        forward (`forwards` False) in a host-side loop (`fdecode.baseline.BeforeLoop`)."""
        raise NotImplementedError(f"a {self.kind} draft proposes through its forwards, not on the host")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r})"

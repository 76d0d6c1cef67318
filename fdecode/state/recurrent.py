"""The recurrent state of hybrid models (Gated DeltaNet layers) in `DecodeState`, with rollback
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

Leaves, lane first, per model (`target_*`, `draft_*`; L = its linear-attention layers, R = copies):

    conv: [B, L, R, conv_dim, k-1]  cfg.dtype  conv windows (the last k-1 q|k|v inputs)
    rec:  [B, L, R, Hv, dk, dv]     float32    delta-rule states

A model without linear-attention layers (Llama, an MTP head) has none: its leaves are None (absent).
Target (R = 1): the state after every committed position < base_pos; `commit_verify` makes it
verify snapshot L - 1 on the device (L = 0 keeps it bit for bit); after a tree's verify, the snapshot of
the accepted path's node at depth L - 1. Draft LM (R = K): the states
after the last advance's rows at P .. P+K-1; the next advance starts from copy min(L, K) - 1, and
`commit_ring` refills the copies (a tree's draft, R = 1: its state through the root, `draft_copies`). Priming puts the target's state in copy 0, the draft's in every
copy. Each update of a leaf in the step is one in-place copy, so the leaf is donated like the KV.
"""

from __future__ import annotations

import torch

State = tuple[torch.Tensor, torch.Tensor]  # (conv, rec), lane first


def is_hybrid(model: torch.nn.Module) -> bool:
    """Whether `model` carries a recurrent state (its forward takes `recurrent=`)."""
    return hasattr(model, "new_recurrent")


def empty_leaves(
    model: torch.nn.Module, batch: int, copies: int, *, dtype: torch.dtype, device
) -> State | tuple[None, None]:
    """Zero (conv, rec) leaves for `batch` lanes and `copies` copies; (None, None) for a model without them."""
    if is_hybrid(model):
        return model.new_recurrent(batch, copies, dtype=dtype, device=device)
    return None, None


def forward_rows(
    model: torch.nn.Module,
    *args,
    recurrent: State | None = None,
    valid: torch.Tensor | None = None,
    snapshots: bool = False,
    parents: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, State | None]:
    """`model(*args, **kwargs)` as (logits, hidden, states after the rows); states are None (and
    `recurrent`, `parents` unused) for a model without a recurrent state, whose call is left exactly as it was.
    parents: [B, Q] the rows are tree nodes, each continuing its parent row's state (-1: `recurrent`)."""
    if not is_hybrid(model):
        logits, hidden = model(*args, **kwargs)
        return logits, hidden, None
    tree = {} if parents is None else {"parents": parents}
    return model(*args, recurrent=recurrent, valid=valid, snapshots=snapshots, **tree, **kwargs)


def pick(states: State, index: torch.Tensor) -> State:
    """Copy / row `index[b]` of lane b: [B, L, R, ...] -> [B, L, ...]."""

    def one(t: torch.Tensor) -> torch.Tensor:
        at = index.view(-1, 1, 1, *([1] * (t.dim() - 3))).expand(t.shape[0], t.shape[1], 1, *t.shape[3:])
        return t.gather(2, at).squeeze(2)

    return one(states[0]), one(states[1])


def _write(leaf: torch.Tensor, new: torch.Tensor, keep: torch.Tensor) -> None:
    mask = keep.view(-1, *([1] * (leaf.dim() - 1)))
    leaf.copy_(torch.where(mask, leaf, new.to(leaf.dtype)))


def commit_verify(leaves: State, snapshots: State, length: torch.Tensor, path: torch.Tensor | None = None) -> None:
    """Target leaves (R = 1) <- the snapshot after each lane's accepted prefix (`length` [B], 0 keeps): row
    L - 1 of a chain's window; of a tree's, the row of the accepted path's node at depth L - 1 (`path` [B, S + 1],
    the path's rows by depth, `fdecode.ops.tree.greedy_tree_accept`)."""
    row = (length - 1).clamp_min(0)
    if path is not None:
        row = path.gather(1, row[:, None])[:, 0].clamp_min(0)
    chosen = pick(snapshots, row)
    for leaf, new in zip(leaves, chosen):
        _write(leaf, new[:, :, None], length == 0)


def draft_start(leaves: State, length: torch.Tensor, copies: int) -> State:
    """The state a draft advance starts from: copy min(L, K) - 1 (see the module docstring)."""
    return pick(leaves, (length.clamp(1, copies) - 1))


def commit_ring(leaves: State, ring: list[State], live: torch.Tensor) -> None:
    """Draft leaves (R = K) <- the states after the advance's rows at P .. P+K-1, for `live` lanes."""
    for i, leaf in enumerate(leaves):
        _write(leaf, torch.stack([state[i] for state in ring], dim=2), ~live)


def draft_copies(cfg) -> int:
    """R of a recurrent draft's leaves: K for a chain (the ring over the advance's rows), 1 for a tree (its state
    through the root, where the next catch-up starts: `fdecode.tree.draft_state`)."""
    return 1 if cfg.tree else cfg.K


LEAVES = ("target_conv", "target_rec", "draft_conv", "draft_rec")


def zero_leaves(
    target: torch.nn.Module, draft: torch.nn.Module, batch: int, *, copies: int, dtype: torch.dtype, device
) -> dict[str, torch.Tensor]:
    """The four `DecodeState` leaves of `batch` lanes at zero: target R = 1, draft R = `copies` (K); None for a
    model without a recurrent state."""
    target_conv, target_rec = empty_leaves(target, batch, 1, dtype=dtype, device=device)
    draft_conv, draft_rec = empty_leaves(draft, batch, copies, dtype=dtype, device=device)
    return dict(zip(LEAVES, (target_conv, target_rec, draft_conv, draft_rec)))


def first_copy(leaves: dict[str, torch.Tensor | None], model: str) -> State | None:
    """Copy 0 of `model`'s ("target" / "draft") leaves: the state a forward over new rows starts from (None:
    the model has no recurrent state)."""
    conv, rec = leaves[f"{model}_conv"], leaves[f"{model}_rec"]
    return None if conv is None else (conv[:, :, 0], rec[:, :, 0])


def after_prompts(
    leaves: dict[str, torch.Tensor], target_states: State | None, draft_states: State | None
) -> dict[str, torch.Tensor]:
    """`leaves` holding the states after the prompts: the target's in its copy, the draft's in every copy."""
    out = dict(leaves)
    for model, states in (("target", target_states), ("draft", draft_states)):
        if states is not None:
            for kind, state in zip(("conv", "rec"), states):
                leaf = leaves[f"{model}_{kind}"]
                out[f"{model}_{kind}"] = state[:, :, None].expand_as(leaf).to(leaf.dtype).contiguous()
    return out


def leaf_shapes(model: torch.nn.Module, batch: int, copies: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The (conv, rec) leaf shapes `empty_leaves` gives `model`, without allocating them (None: no leaves)."""
    if is_hybrid(model):
        return model.kv_config.conv_shape(batch, copies), model.kv_config.rec_shape(batch, copies)
    return None


def check_leaves(state, target: torch.nn.Module, draft: torch.nn.Module, *, batch: int, k: int) -> None:
    """Raise a ValueError naming the leaf when `state`'s recurrent leaves are not the layout this step's
    models hold (a state of another step, or leaves rebuilt by hand); host-side shapes only."""
    for model, name, copies in ((target, "target", 1), (draft, "draft", k)):
        shapes = leaf_shapes(model, batch, copies)
        for kind, want in zip(("conv", "rec"), shapes or (None, None)):
            leaf = getattr(state, f"{name}_{kind}")
            have = None if leaf is None else tuple(leaf.shape)
            if have != want:
                holds = "no recurrent state" if want is None else f"{want} ([B, linear-attention layers, copies, ...])"
                raise ValueError(
                    f"state.{name}_{kind} is {'absent' if have is None else have}, this step's {name} holds {holds}: "
                    f"was the state made by a step with other models?"
                )

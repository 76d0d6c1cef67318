"""Whole-sequence forwards (training, scoring) through the same paged layers decoding uses
(docs/design.md, "Model families and the registry").

Each of the B sequences gets a block of its own, one block = the whole sequence
(`block_size = T`), in a throwaway KV cache: sequence b lives in block b + 1
(block 0 is the scratch block, as everywhere in fdecode). The forward then is
exactly the decode-time forward with causal attention over positions 0..T-1, so
a model trained or scored here is the model decoding runs, bit for bit in math.
Autograd flows through the cache writes, so this is also the training forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdecode.models.llama import LlamaModel
from fdecode.models.mtp.head import MTPHead


def dense_forward(
    model: LlamaModel | MTPHead,
    tokens: torch.Tensor,  # [B, T] int64
    *,
    hidden_in: torch.Tensor | None = None,  # [B, T, H] for an MTP head: hidden of position p - 1 at row p
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [B, T, V] float32 and the model's hidden output [B, T, H] for full sequences."""
    b, t = tokens.shape
    device = tokens.device
    weight = next(model.parameters())
    positions = torch.arange(t, device=device).expand(b, t)  # [B, T]
    block_tables = torch.arange(1, b + 1, device=device)[:, None]  # [B, 1]
    slots = block_tables * t + positions  # [B, T]
    kv = model.kv_config.new_kv((b + 1) * t, dtype=weight.dtype, device=device)
    return model(tokens, positions, slots, kv, block_tables, block_size=t, hidden_in=hidden_in)


def shift_hidden(hidden: torch.Tensor) -> torch.Tensor:
    """[B, T, H] -> row p holds hidden[p - 1] (zeros at p = 0): what an MTP head pairs with token p."""
    return torch.cat([hidden.new_zeros(hidden[:, :1].shape), hidden[:, :-1]], dim=1)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, *, ahead: int = 1) -> torch.Tensor:
    """Mean cross-entropy (nats/token) of row p predicting tokens[p + ahead]. logits [B, T, V], tokens [B, T]."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-ahead].reshape(-1, v), tokens[:, ahead:].reshape(-1))


def sequence_losses(target: LlamaModel, draft: LlamaModel | MTPHead, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean next-token cross-entropy (nats/token) over `tokens` [B, T] of the target, of its MTP head
    at recursive depths 1 and 2, and of an independent `draft` LM: the objective `examples/train_tiny.py`
    trains and the held-out loss the bundled model reports.

    Row p of depth 1 reads token p and the target hidden of p - 1, and predicts token p + 1; row p of
    depth 2 reads token p and the depth-1 output of row p - 1 (which predicted token p).
    """
    logits, hidden = dense_forward(target, tokens)
    mtp1_logits, mtp1_h = dense_forward(target.mtp, tokens, hidden_in=shift_hidden(hidden))
    mtp2_logits, _ = dense_forward(target.mtp, tokens, hidden_in=shift_hidden(mtp1_h))
    draft_logits, _ = dense_forward(draft, tokens)
    return {
        "target": next_token_loss(logits, tokens),
        "mtp1": next_token_loss(mtp1_logits, tokens),
        "mtp2": next_token_loss(mtp2_logits, tokens),
        "draft": next_token_loss(draft_logits, tokens),
    }


@torch.no_grad()
def heldout_losses(
    target: LlamaModel, draft: LlamaModel, windows: torch.Tensor, *, chunk: int = 16
) -> dict[str, float]:
    """`sequence_losses` averaged over `windows` [N, T], evaluated `chunk` windows at a time."""
    totals: dict[str, float] = {}
    for part in windows.split(chunk):
        for name, value in sequence_losses(target, draft, part).items():
            totals[name] = totals.get(name, 0.0) + value.item() * len(part) / len(windows)
    return totals

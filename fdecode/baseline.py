"""Baselines the benchmarks compare against: the "before" loop and target-only decoding.

`BeforeLoop` is the usual speculative-decoding loop that fdecode replaces. It uses the
same models, the same compiled forwards and the same semantics (repair row, redirect,
scratch slot), but after every validation it copies the target argmax and the window
to the host (`.cpu()`), rebuilds the next draft input there in Python (last/prev
tokens, hidden-row indices, positions, KV lengths, slots) and copies it back before it
can launch the draft. The device idles for that whole round trip.

`TargetOnly` is plain greedy autoregressive decoding with the target, compiled, one
token per step, device-resident (the host only launches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch.profiler import record_function

from fdecode.graphs.backends import capture
from fdecode.graphs.compile import fresh_code
from fdecode.ops.paging import slot_of


class BeforeLoop:
    """Greedy speculative decoding with a host round trip between validation and drafting."""

    def __init__(self, step, *, backend: str = "inductor") -> None:
        self.step = step
        target, draft, cfg = step.target, step.draft, step.config
        bs = cfg.block_size

        def validate(tokens, positions, slots, kv, tables):
            return target(tokens, positions, slots, kv, tables, block_size=bs, attention=cfg.attention)

        def draft_forward(tokens, positions, slots, kv, tables, hidden):
            return draft(tokens, positions, slots, kv, tables, block_size=bs, hidden_in=hidden, attention=cfg.attention)

        self._validate = capture(backend, fresh_code(validate, "before_validate"), cfg)
        self._draft = capture(backend, fresh_code(draft_forward, "before_draft"), cfg)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> tuple[list[list[int]], int]:
        """Returns the new tokens of each prompt and the number of iterations."""
        cfg = self.step.config
        batch, window, k, bs = cfg.max_batch, cfg.W, cfg.K, cfg.block_size
        state = self.step.prefill(prompts, max_new_tokens=max_new_tokens)  # same priming as fdecode
        device = state.tokens.device
        first = state.output.cpu().tolist()
        outputs = [first[b][: first[b][-2]] for b in range(len(prompts))]
        tables = state.block_tables.cpu().tolist()
        base = state.base_pos.cpu().tolist()
        remaining = state.remaining.cpu().tolist()
        active = state.active.cpu().tolist()
        tokens = state.tokens

        def slot(b: int, p: int) -> int:
            blk = p // bs
            if p < 0 or blk >= len(tables[b]) or tables[b][blk] < 0:
                return 0
            return tables[b][blk] * bs + p % bs

        def to_device(rows) -> torch.Tensor:
            return torch.tensor(rows, dtype=torch.int64).to(device)

        iterations = 0
        while any(active):
            # The host knows every position exactly, so it attends over the same window the step would.
            context = state.block_tables[:, : cfg.bucket_for(max(p for p, a in zip(base, active) if a))]
            positions = [[base[b] + j for j in range(window)] for b in range(batch)]
            slots = [[slot(b, p) if active[b] else 0 for p in row] for b, row in enumerate(positions)]
            with record_function("before/validate"):
                logits, hidden = self._validate(
                    tokens, to_device(positions), to_device(slots), state.target_kv, context
                )
            with record_function("before/host round trip"):
                # Greedy tokens and the window come back to the host before anything else can run.
                host = torch.cat([logits.argmax(dim=-1), tokens], dim=1).cpu().tolist()
                rows_tok, rows_pos, rows_slot, rows_hidden, lasts, live = [], [], [], [], [], []
                for b in range(batch):
                    greedy, window_tokens = host[b][:window], host[b][window:]
                    n = 0
                    if active[b]:
                        a = 0
                        while a < k and window_tokens[a + 1] == greedy[a]:
                            a += 1
                        n = min(a + 1, remaining[b])
                        if b < len(outputs):
                            outputs[b] += greedy[:n]
                        remaining[b] -= n
                    last = greedy[n - 1] if n else 0
                    prev = greedy[n - 2] if n > 1 else last
                    pos = base[b] + n
                    repair = pos - 1 if n == window else pos + 1
                    rows_tok.append([prev, last])
                    rows_pos.append([pos - 1, pos])
                    rows_slot.append([slot(b, repair), slot(b, pos)] if n else [0, 0])
                    # Hidden row indices into hidden.view(B * W, H); index B * W is the zero placeholder.
                    rows_hidden.append([b * window + n - 2 if n > 1 else batch * window, b * window + n - 1 if n else batch * window])
                    lasts.append(last)
                    live.append(n > 0)
                    base[b] = pos
                    active[b] = active[b] and remaining[b] > 0
                flat_hidden = torch.cat([hidden.reshape(batch * window, -1), hidden.new_zeros(1, hidden.shape[-1])])
                h_rows = flat_hidden[to_device(rows_hidden)]  # [B, 2, H]
            with record_function("before/draft"):
                draft_logits, h = self._draft(
                    to_device(rows_tok), to_device(rows_pos), to_device(rows_slot), state.draft_kv, context, h_rows
                )
                proposal = draft_logits[:, 1].argmax(dim=-1)
                h = h[:, 1:2]
                drafts = [proposal]
                for j in range(1, k):
                    p = [[base[b] + j] for b in range(batch)]
                    s = [[slot(b, base[b] + j) if live[b] else 0] for b in range(batch)]
                    draft_logits, h = self._draft(
                        proposal[:, None], to_device(p), to_device(s), state.draft_kv, context, h
                    )
                    proposal = draft_logits[:, 0].argmax(dim=-1)
                    drafts.append(proposal)
                tokens = torch.stack([to_device(lasts), *drafts], dim=1)
            iterations += 1
        return outputs, iterations


class TargetOnly:
    """Greedy autoregressive decoding with the target alone: one compiled forward per token."""

    def __init__(self, step, *, backend: str = "inductor") -> None:
        self.step = step
        target, cfg = step.target, step.config
        bs = cfg.block_size

        def next_token(tokens, positions, kv, tables):  # [B, 1] -> [B, 1]
            slots = slot_of(tables, positions, bs)
            logits, _ = target(tokens, positions, slots, kv, tables, block_size=bs, attention=cfg.attention)
            return logits.argmax(dim=-1)

        self._next = capture(backend, fresh_code(next_token, "target_only_step"), cfg)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> tuple[list[list[int]], int]:
        state = self.step.prefill(prompts, max_new_tokens=max_new_tokens)
        token = state.tokens[:, :1]
        position = state.base_pos[:, None]
        produced = [token]
        for _ in range(max_new_tokens - 1):
            token = self._next(token, position, state.target_kv, state.block_tables)
            position = position + 1
            produced.append(token.clone())  # a CUDA-graph replay reuses its output buffer: keep a copy (no sync)
        out = torch.cat(produced, dim=1).cpu().tolist()
        return [row for row in out[: len(prompts)]], max_new_tokens - 1

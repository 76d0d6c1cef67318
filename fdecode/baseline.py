"""Baselines the benchmarks compare against: the "before" loop and target-only decoding
(docs/design.md, "Why").

`BeforeLoop` is the usual speculative-decoding loop that fdecode replaces: the same models, compiled
forwards and semantics (repair row, redirect, scratch slot), but after every validation it reads the
target argmax and the window back to the host, rebuilds the next inputs there in Python and uploads
them before it can launch the draft. Per iteration: one packed device -> host read into a pinned
buffer (the one wait) and one packed pinned upload with `non_blocking=True` (`fdecode.staging`).
With an n-gram draft (`draft="ngram"`) the host does the prompt lookup itself (`Drafter.host_proposals`:
`lookup_list`, the same rule as the step's) between the read and the upload.

`TargetOnly` is plain greedy autoregressive decoding with the target, compiled, one
token per step, device-resident (the host only launches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.profiler import record_function

from fdecode.graphs.backends import capture
from fdecode.graphs.pure import fresh_code
from fdecode.ops.paging import slot_of
from fdecode.staging import Fence, Uploads, host_buffer
from fdecode.state.recurrent import commit_ring, commit_verify, draft_start, forward_rows, is_hybrid


class BeforeLoop:
    """Greedy speculative decoding with a host round trip between validation and drafting."""

    def __init__(self, step, *, backend: str = "inductor") -> None:
        self.step = step
        target, draft, drafter, cfg = step.target, step.draft, step.drafter, step.config
        bs = cfg.block_size

        # A hybrid model's recurrent state goes in and its states after the rows come out (None otherwise):
        # the rollback to the accepted prefix is the step's (`fdecode.state.recurrent`), from host-known L.
        def validate(tokens, positions, slots, kv, tables, recurrent):  # a draft id < 0 (n-gram: none) runs as 0
            return forward_rows(
                target,
                tokens.clamp_min(0),
                positions,
                slots,
                kv,
                tables,
                block_size=bs,
                attention=cfg.attention,
                recurrent=recurrent,
                snapshots=True,
            )

        def draft_forward(tokens, positions, slots, kv, tables, hidden, recurrent, valid, j):  # j: forward index
            return forward_rows(
                draft,
                tokens,
                positions,
                slots,
                kv,
                tables,
                block_size=bs,
                hidden_in=hidden,
                attention=cfg.attention,
                recurrent=recurrent,
                valid=valid,
                **drafter.forward_kwargs(draft, j),
            )

        self._validate = capture(backend, fresh_code(validate, "before_validate"), cfg)
        self._draft = capture(backend, fresh_code(draft_forward, "before_draft"), cfg)

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, max_iterations: int | None = None
    ) -> tuple[list[list[int]], int]:
        """Returns the new tokens of each prompt and the number of iterations (at most `max_iterations`)."""
        cfg = self.step.config
        batch, window, k, bs = cfg.max_batch, cfg.W, cfg.K, cfg.block_size
        state = self.step.prefill(prompts, max_new_tokens=max_new_tokens)  # same priming as fdecode
        device = state.tokens.device
        uploads, read, fence = Uploads(device), host_buffer((batch, 2 * window), torch.int64, device), Fence(device)

        def read_back(values: torch.Tensor, into: torch.Tensor) -> list:
            """`values` on the host: one packed non-blocking copy into pinned `into`, one wait."""
            into.copy_(values, non_blocking=True)
            fence.record()
            fence.wait()
            return into.tolist()

        # What the prefill left, in one read: first tokens (output), block tables, base_pos, remaining, active.
        lanes = torch.stack([state.base_pos, state.remaining, state.active.long()], dim=1)
        start = torch.cat([state.output, state.block_tables, lanes], dim=1)
        start = read_back(start, host_buffer(tuple(start.shape), torch.int64, device))
        width = cfg.output_width  # the packed StepOutput: [t.., drafts, logprobs.., count, finished]
        outputs = [start[b][: start[b][width - 2]] for b in range(len(prompts))]
        tables = [row[width:-3] for row in start]
        base, remaining, active = ([row[i] for row in start] for i in (-3, -2, -1))
        tokens = state.tokens

        def slot(b: int, p: int) -> int:
            blk = p // bs
            if p < 0 or blk >= len(tables[b]) or tables[b][blk] < 0:
                return 0
            return tables[b][blk] * bs + p % bs

        def validate_inputs() -> list[torch.Tensor]:  # positions, slots [B, W] of the next validation
            positions = [[base[b] + j for j in range(window)] for b in range(batch)]
            slots = [[slot(b, p) if active[b] else 0 for p in row] for b, row in enumerate(positions)]
            return [torch.tensor(positions), torch.tensor(slots)]

        positions, slots = uploads(*validate_inputs())
        hybrid_target, hybrid_draft = is_hybrid(self.step.target), self.step.drafter.recurrent(self.step.draft)
        iterations = 0
        while any(active) and (max_iterations is None or iterations < max_iterations):
            # The host knows every position exactly, so it attends over the same window the step would.
            context = state.block_tables[:, : cfg.bucket_for(max(p for p, a in zip(base, active) if a))]
            with record_function("before/validate"):
                committed = (state.target_conv[:, :, 0], state.target_rec[:, :, 0]) if hybrid_target else None
                logits, hidden, snapshots = self._validate(
                    tokens, positions, slots, state.target_kv, context, committed
                )
            with record_function("before/host round trip"):
                # Greedy tokens and the window come back to the host (one packed read, the one wait)
                # before anything else can run.
                host = read_back(torch.cat([logits.argmax(dim=-1), tokens], dim=1), read)
                rows_tok, rows_pos, rows_slot, rows_hidden, lasts, live, counts = [], [], [], [], [], [], []
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
                    rows_hidden.append(
                        [b * window + n - 2 if n > 1 else batch * window, b * window + n - 1 if n else batch * window]
                    )
                    lasts.append(last)
                    live.append(n > 0)
                    counts.append(n)
                    base[b] = pos
                    active[b] = active[b] and remaining[b] > 0
                if not self.step.drafter.forwards:  # proposals on the host (a lookup, as every peer does it)
                    drafter, draft = self.step.drafter, self.step.draft
                    proposals = [
                        (
                            drafter.host_proposals(draft, list(prompts[b]) + outputs[b], k)
                            if b < len(outputs) and live[b]
                            else []
                        )
                        for b in range(batch)
                    ]
                    rows = [[lasts[b], *p, *[-1] * (k - len(p))] for b, p in enumerate(proposals)]
                    tokens, counts, positions, slots = uploads(
                        torch.tensor(rows), torch.tensor(counts), *validate_inputs()
                    )
                    if snapshots is not None:
                        commit_verify((state.target_conv, state.target_rec), snapshots, counts)
                    iterations += 1
                    continue
                # Draft forwards j >= 1 and the next validation: positions and slots [K - 1, B, 1].
                later_pos = [[[base[b] + j] for b in range(batch)] for j in range(1, k)]
                later_slot = [[[slot(b, base[b] + j) if live[b] else 0] for b in range(batch)] for j in range(1, k)]
                # Everything the device needs next, in one packed non-blocking upload.
                rows = [torch.tensor(r) for r in (rows_tok, rows_pos, rows_slot, rows_hidden, lasts, counts)]
                later = [torch.tensor(r, dtype=torch.int64).view(k - 1, batch, 1) for r in (later_pos, later_slot)]
                (rows_tok, rows_pos, rows_slot, rows_hidden, lasts, counts, later_pos, later_slot, positions, slots) = (
                    uploads(*rows, *later, *validate_inputs())
                )
                if snapshots is not None:
                    commit_verify((state.target_conv, state.target_rec), snapshots, counts)
                flat_hidden = torch.cat([hidden.reshape(batch * window, -1), hidden.new_zeros(1, hidden.shape[-1])])
                h_rows = flat_hidden[rows_hidden]  # [B, 2, H]
            with record_function("before/draft"):
                ring_leaves = (state.draft_conv, state.draft_rec)
                start = draft_start(ring_leaves, counts, k) if hybrid_draft else None
                valid = (
                    torch.stack([counts == window, torch.ones_like(counts, dtype=torch.bool)], 1)
                    if hybrid_draft
                    else None
                )
                draft_logits, h, recurrent = self._draft(
                    rows_tok, rows_pos, rows_slot, state.draft_kv, context, h_rows, start, valid, 0
                )
                proposal = draft_logits[:, 1].argmax(dim=-1)
                h = h[:, 1:2]
                drafts, ring = [proposal], [recurrent]
                for j in range(1, k):
                    draft_logits, h, recurrent = self._draft(
                        proposal[:, None],
                        later_pos[j - 1],
                        later_slot[j - 1],
                        state.draft_kv,
                        context,
                        h,
                        recurrent,
                        None,
                        self.step.drafter.layer_of(
                            self.step.draft, j
                        ),  # one captured graph per MTP layer, not one per j
                    )
                    proposal = draft_logits[:, 0].argmax(dim=-1)
                    drafts.append(proposal)
                    ring.append(recurrent)
                if hybrid_draft:
                    commit_ring(ring_leaves, ring, counts > 0)
                tokens = torch.stack([lasts, *drafts], dim=1)
            iterations += 1
        return outputs, iterations


class TargetOnly:
    """Greedy autoregressive decoding with the target alone: one compiled forward per token (`next_token`, the
    captured function: (tokens [B, 1], positions, KV, block tables, recurrent state) -> (next [B, 1], state))."""

    def __init__(self, step, *, backend: str = "inductor") -> None:
        self.step = step
        target, cfg = step.target, step.config
        bs = cfg.block_size

        def next_token(tokens, positions, kv, tables, recurrent):  # [B, 1] -> [B, 1], recurrent state after it
            slots = slot_of(tables, positions, bs)
            logits, _, after = forward_rows(
                target,
                tokens,
                positions,
                slots,
                kv,
                tables,
                block_size=bs,
                attention=cfg.attention,
                recurrent=recurrent,
            )
            return logits.argmax(dim=-1), after

        self.next_token = capture(backend, fresh_code(next_token, "target_only_step"), cfg)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> tuple[list[list[int]], int]:
        state = self.step.prefill(prompts, max_new_tokens=max_new_tokens)
        token = state.tokens[:, :1]
        position = state.base_pos[:, None]
        produced = [token]
        recurrent = (state.target_conv[:, :, 0], state.target_rec[:, :, 0]) if is_hybrid(self.step.target) else None
        for _ in range(max_new_tokens - 1):
            token, recurrent = self.next_token(token, position, state.target_kv, state.block_tables, recurrent)
            position = position + 1
            produced.append(token.clone())  # a CUDA-graph replay reuses its output buffer: keep a copy (no sync)
        out = torch.cat(produced, dim=1).cpu().tolist()
        return [row for row in out[: len(prompts)]], max_new_tokens - 1

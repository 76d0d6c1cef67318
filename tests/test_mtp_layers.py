"""An MTP head of several layers (`mtp_num_hidden_layers` = n > 1, issue 16): draft forward j runs layer
j mod n, each layer with its own paged KV; every draft row writes every layer's keys and values.

The reference is the chain worked out by hand: the rows (token, hidden) a lane's draft has seen, the
shared fc over them, then layer j mod n called over the whole row sequence in a throwaway cache of its
own (causal attention over every row, as the paged KV holds an entry of that layer at every row).
"""

from __future__ import annotations

import pytest
import torch

from fdecode.baseline import BeforeLoop
from fdecode.models import from_hf
from fdecode.models.dense import dense_forward, shift_hidden
from fdecode.models.hybrid_mtp import HybridMTPHead
from fdecode.ops.attention import paged_context
from hybrid_models import PROMPTS, compiled, hf_greedy, run, save_with_mtp


def by_hand(head: HybridMTPHead, tokens: list[int], hiddens: torch.Tensor, layer: int):
    """(logits [V], normed output [H]) of the last row: `layer` of `head` over the rows (tokens[q],
    hiddens[q]), q = 0 .. T-1, in a throwaway cache; the output is the hidden the next forward takes."""
    embed, lm_head = head._shared
    n = len(tokens)
    x = head.eh_proj(torch.cat([head.enorm(embed(torch.tensor([tokens]))), head.hnorm(hiddens[None])], dim=-1))
    kv = head.kv_config.new_kv(2 * n, dtype=torch.float32, device="cpu")
    positions, table = torch.arange(n)[None], torch.tensor([[1]])
    ctx = paged_context(table, positions, n, kernel="torch")
    out = head.norm(head.layers[layer](x, positions, n + positions, kv, layer, ctx, head.rotary))
    return lm_head(out)[0, -1], out[0, -1]


def test_drafts_follow_the_hand_chain_across_steps(tmp_path) -> None:
    """n = 2, K = 3: forwards 0, 1, 2 run layers 0, 1, 0 (layer 0 reused). After priming and after each
    step, every lane's proposals equal the hand chain's argmaxes over the rows its draft has seen: row p
    pairs the token at p with the hidden the step gave it (the target's of p - 1 for prompt, repair and
    current rows; the previous forward's normed output for chained rows, which accepted drafts keep).
    The layers differ, so running layer 0 throughout would propose other tokens."""
    save_with_mtp(tmp_path, layers=2)
    k = 3
    step = compiled(str(tmp_path), "mtp", k)
    head = step.draft
    assert isinstance(head, HybridMTPHead) and head.num_mtp_layers == 2
    assert tuple(step.empty_state().draft_kv.shape[:2]) == (2, 2)  # two KV layers: one per MTP layer
    state = step.prefill([list(p) for p in PROMPTS], max_new_tokens=10)
    seqs = [list(p) for p in PROMPTS]
    rows: dict[int, tuple[list[int], torch.Tensor]] = {}  # lane -> tokens, hiddens of its rows 0, 1, ...
    out, other_layer_differs, checked = state.step_output, False, 0
    for _ in range(3):
        for lane, seq in enumerate(seqs):
            new = out.tokens[lane, : int(out.num_tokens[lane])].tolist()
            if not new or bool(out.finished[lane]):
                continue
            committed = seq + new
            p = len(committed) - 1  # P: the position of the last committed token, the current row
            hidden = shift_hidden(dense_forward(step.target, torch.tensor([committed]))[1])[0]  # row q: hidden q - 1
            if lane not in rows:  # priming: the prompt rows, then the current row
                tokens, hiddens = committed, hidden
            else:
                tokens, hiddens = rows[lane]
                keep = p if len(new) < k + 1 else p - 1  # L = W: d'K's repair row at P - 1 replaces the chain's
                tokens, hiddens = tokens[:keep] + committed[keep:], torch.cat([hiddens[:keep], hidden[keep:]])
            drafts = state.tokens[lane, 1:].tolist()
            for j in range(k):
                logits, normed = by_hand(head, tokens, hiddens, j % 2)
                assert int(logits.argmax()) == drafts[j], (lane, j)
                other_layer_differs |= int(by_hand(head, tokens, hiddens, (j + 1) % 2)[0].argmax()) != drafts[j]
                tokens, hiddens = tokens + [drafts[j]], torch.cat([hiddens, normed[None]])  # the chained row
            rows[lane], seqs[lane] = (tokens, hiddens), committed
            checked += 1
        state, out = step(state)
    assert checked >= 6 and other_layer_differs  # lanes checked after steps too; the test tells the layers apart


@pytest.mark.parametrize("k", [1, 3])
def test_multi_layer_head_from_a_folder_is_lossless(tmp_path, k: int) -> None:
    """K = 3 > n = 2 reuses layer 0; K = 1 runs layer 0 only. Greedy equals transformers either way,
    and so does the host-round-trip loop over the same head."""
    save_with_mtp(tmp_path, layers=2)
    step = compiled(str(tmp_path), "mtp", k)
    want = [hf_greedy(p) for p in PROMPTS]
    outs, _, _ = run(step, PROMPTS)
    assert outs == want
    before, _ = BeforeLoop(step, backend="eager").generate([list(p) for p in PROMPTS], max_new_tokens=12)
    assert before == want


def test_a_head_with_fewer_layers_than_its_config_declares_is_refused(tmp_path) -> None:
    save_with_mtp(tmp_path, layers=1, declared=2)
    with pytest.raises(ValueError, match=r"missing \[mtp\.layers\.1\."):
        from_hf(tmp_path)

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


@pytest.mark.parametrize("k", [3])
def test_drafts_after_priming_follow_the_hand_chain(tmp_path, k: int) -> None:
    """n = 2, K = 3: forwards 0, 1, 2 run layers 0, 1, 0 (layer 0 reused); each proposal equals the
    hand chain's argmax. The layers differ, so running layer 0 throughout would propose other tokens."""
    save_with_mtp(tmp_path, layers=2)
    step = compiled(str(tmp_path), "mtp", k)
    head = step.draft
    assert isinstance(head, HybridMTPHead) and head.num_mtp_layers == 2
    assert tuple(step.empty_state().draft_kv.shape[:2]) == (2, 2)  # two KV layers: one per MTP layer
    state = step.prefill([list(p) for p in PROMPTS], max_new_tokens=8)
    other_layer_differs = False
    for lane, prompt in enumerate(PROMPTS):
        first = int(state.step_output.tokens[lane, 0])
        _, target_hidden = dense_forward(step.target, torch.tensor([list(prompt) + [first]]))
        tokens, hiddens = list(prompt) + [first], shift_hidden(target_hidden)[0]  # row p: token p, hidden p - 1
        drafts = state.tokens[lane, 1:].tolist()
        for j in range(k):
            logits, out = by_hand(head, tokens, hiddens, j % 2)
            assert int(logits.argmax()) == drafts[j], (lane, j)
            other_layer_differs |= int(by_hand(head, tokens, hiddens, (j + 1) % 2)[0].argmax()) != drafts[j]
            tokens, hiddens = tokens + [drafts[j]], torch.cat([hiddens, out[None]])  # chains the normed output
    assert other_layer_differs  # the test tells the layers apart


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

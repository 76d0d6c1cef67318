"""MTP heads of several layers: draft forward j runs layer j mod n, each layer with its own paged KV, and
every draft row writes every layer's keys and values. Qwen3.5 (`HybridMTPHead`, `mtp_num_hidden_layers`
= n > 1, issue 16: n layers sharing fc and the norms) and DeepSeek-V3 / GLM-4.5 (`NextNMTPHead`,
`num_nextn_predict_layers` = n > 1, issue 17: n modules at `model.layers.{N + k}.*`, each with its own
enorm / hnorm / eh_proj / shared_head.norm and decoder layer).

The reference is the chain worked out by hand: the rows (token, hidden) a lane's draft has seen, the
layer's input over them (the shared fc, or module m's own eh_proj and norms), then layer j mod n called
over the whole row sequence in a throwaway cache of its own (causal attention over every row, as the
paged KV holds an entry of that layer at every row).
"""

from __future__ import annotations

import pytest
import torch
from support import deepseek_models, glm_models, hybrid_models
from support.hybrid_models import PROMPTS, compiled, run

from fdecode.baseline import BeforeLoop
from fdecode.models import from_hf
from fdecode.models.dense import dense_forward, shift_hidden
from fdecode.models.loading.checkpoint import CheckpointTensors
from fdecode.models.mtp.head import MTPHead
from fdecode.models.mtp.hybrid import HybridMTPHead
from fdecode.models.mtp.nextn import NextNMTPHead
from fdecode.ops.attention import paged_context


def save_deepseek(folder, *, layers: int, declared: int | None = None) -> None:
    deepseek_models.save_with_mtp(folder, deepseek_models.random_mtp_state(layers=layers), declared=declared)


# family -> (save a target + MTP head of `layers` layers to a folder, greedy oracle, new tokens); the
# three targets share the prompts (the same seeded draw over a 97-token vocabulary).
FAMILIES = {
    "qwen3_5": (hybrid_models.save_with_mtp, hybrid_models.hf_greedy, hybrid_models.NEW),
    "deepseek_v3": (save_deepseek, deepseek_models.hf_greedy, deepseek_models.NEW),
    "glm4_moe": (glm_models.save_glm, glm_models.hf_greedy, glm_models.NEW),
}


def by_hand(head: MTPHead, tokens: list[int], hiddens: torch.Tensor, layer: int):
    """(logits [V], chained hidden [H]) of the last row: MTP layer `layer` of `head` over the rows
    (tokens[q], hiddens[q]), q = 0 .. T-1, in a throwaway cache; the chained hidden is what the next
    forward takes (the normed output for `HybridMTPHead`, the layer output for `NextNMTPHead`)."""
    embed, lm_head = head.shared
    n = len(tokens)
    # parts: the enorm / hnorm / eh_proj / norm of this layer (shared, or the module's own)
    if isinstance(head, HybridMTPHead):
        parts, block = head, head.layers[layer]
    else:
        parts, block = head.layers[layer], head.layers[layer].layer
    x = parts.eh_proj(torch.cat([parts.enorm(embed(torch.tensor([tokens]))), parts.hnorm(hiddens[None])], dim=-1))
    kv = head.kv_config.new_kv(2 * n, dtype=torch.float32, device="cpu")
    positions, table = torch.arange(n)[None], torch.tensor([[1]])
    ctx = paged_context(table, positions, n, kernel="torch")
    h = block(x, positions, n + positions, kv, layer, ctx, head.rotary)
    out = parts.norm(h)
    return lm_head(out)[0, -1], (out if head.chains_normed else h)[0, -1]


@pytest.mark.parametrize("family", ["qwen3_5", "deepseek_v3"])
def test_drafts_follow_the_hand_chain_across_steps(tmp_path, family: str) -> None:
    """n = 2, K = 3: forwards 0, 1, 2 run layers 0, 1, 0 (layer 0 reused). After priming and after each
    step, every lane's proposals equal the hand chain's argmaxes over the rows its draft has seen: row p
    pairs the token at p with the hidden the step gave it (the target's of p - 1 for prompt, repair and
    current rows; the previous forward's chained hidden for chained rows, which accepted drafts keep).
    The layers differ, so running layer 0 throughout would propose other tokens; a layer that skipped
    the KV writes of rows where the other one ran would attend over slots it never wrote."""
    FAMILIES[family][0](tmp_path, layers=2)
    k = 3
    step = compiled(str(tmp_path), "mtp", k)
    head = step.draft
    assert isinstance(head, (HybridMTPHead, NextNMTPHead)) and head.num_mtp_layers == 2
    assert step.empty_state().draft_kv.shape[0] == 2  # two KV layers: one per MTP layer
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
                logits, chained = by_hand(head, tokens, hiddens, j % 2)
                assert int(logits.argmax()) == drafts[j], (lane, j)
                other_layer_differs |= int(by_hand(head, tokens, hiddens, (j + 1) % 2)[0].argmax()) != drafts[j]
                tokens, hiddens = tokens + [drafts[j]], torch.cat([hiddens, chained[None]])  # the chained row
            rows[lane], seqs[lane] = (tokens, hiddens), committed
            checked += 1
        state, out = step(state)
    assert checked >= 6 and other_layer_differs  # lanes checked after steps too; the test tells the layers apart


@pytest.mark.parametrize(("family", "k"), [("qwen3_5", 1), ("qwen3_5", 3), ("deepseek_v3", 3), ("glm4_moe", 3)])
def test_multi_layer_head_from_a_folder_is_lossless(tmp_path, family: str, k: int) -> None:
    """A 2-layer head loaded from a folder in the family's layout. K = 3 > n = 2 reuses layer 0; K = 1
    runs layer 0 only. Greedy equals transformers either way, and so does the host-round-trip loop over
    the same head (Qwen3.5)."""
    save, greedy, new = FAMILIES[family]
    save(tmp_path, layers=2)
    step = compiled(str(tmp_path), "mtp", k)
    assert step.draft.num_mtp_layers == 2
    want = [greedy(p) for p in PROMPTS]
    outs, _, _ = run(step, PROMPTS, new)
    assert outs == want
    if family == "qwen3_5":
        before, _ = BeforeLoop(step, backend="eager").generate([list(p) for p in PROMPTS], max_new_tokens=new)
        assert before == want


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_head_with_fewer_layers_than_its_config_declares_is_refused(tmp_path, family: str, monkeypatch) -> None:
    """Only layer (module) 0 in the folder, 2 declared: refused, naming layer 1's keys, before any tensor is read."""
    FAMILIES[family][0](tmp_path, layers=1, declared=2)
    monkeypatch.setattr(CheckpointTensors, "__getitem__", lambda self, key: pytest.fail(f"read {key}"))
    with pytest.raises(ValueError, match=r"missing \[mtp\.layers\.1\.") as err:
        from_hf(tmp_path)
    if family != "qwen3_5":  # a DeepSeek-style module has its own eh_proj
        assert "mtp.layers.1.eh_proj.weight" in str(err.value)

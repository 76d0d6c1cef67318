"""Drafts whose vocabulary is larger or smaller than the target's (`fdecode.models.vocab`).

A larger draft's extra ids are never proposed; the target ids a smaller draft lacks are never drafted
and come from the residual draw. Greedy lanes still commit transformers' greedy tokens, and random
lanes the target's exact distribution (the V = 5 enumeration of support/tiny_vocab.py).
"""

from __future__ import annotations

import pytest
import torch
from support.llama_models import VOCAB, fdecode_target, hf_greedy, independent_draft
from support.stats import ALPHA, chi2_pvalue
from support.tiny_vocab import LANES, TINY, V, exact_distribution, sampled_sequences, tiny_target

import fdecode
from fdecode.models import LlamaModel

PROMPTS = [(5, 17, 33, 2), (90, 91, 3), (95, 80, 81, 82)]  # ids 80 .. 95 are missing from the smaller draft


def with_vocab(model: LlamaModel, vocab: int) -> LlamaModel:
    """`model` with `vocab` rows of embedding and LM head: cut, or grown with LM-head rows 10x the first
    ones (so that, were they proposable, the extra ids would win the draft's argmax wherever it is > 0)."""
    grown = LlamaModel(model.config.replace(vocab_size=vocab))
    state = model.state_dict()
    for name in ("embed_tokens.weight", "lm_head.weight"):
        rows = state[name]
        extra = max(vocab - rows.shape[0], 0)
        state[name] = torch.cat([rows, 10 * rows[:extra] if name == "lm_head.weight" else rows[:extra]])[:vocab]
    grown.load_state_dict(state)
    return grown.eval()


def greedy_step(draft: LlamaModel) -> fdecode.compile:
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=3, max_seq_len=48, block_size=4, backend="eager")
    return fdecode.compile(fdecode_target(2), draft, cfg)


@pytest.mark.parametrize("vocab", [VOCAB + 40, VOCAB - 16])
def test_greedy_with_a_draft_of_another_vocabulary_is_the_targets_greedy(vocab):
    draft = with_vocab(independent_draft("partial", fdecode_target(2)), vocab)
    step = greedy_step(draft)
    got = fdecode.generate(step, PROMPTS, max_new_tokens=12)
    assert got == [hf_greedy(p, 12) for p in PROMPTS]
    assert type(draft.lm_head) is torch.nn.Linear and type(draft.embed_tokens) is torch.nn.Embedding  # the caller's


def test_a_larger_draft_proposes_what_it_would_without_its_extra_ids():
    """Its extra ids would be its argmax everywhere: the drafts match the same draft cut to the target's ids."""
    draft = independent_draft("partial", fdecode_target(2))
    same, larger = greedy_step(draft), greedy_step(with_vocab(draft, VOCAB + 40))
    a, b = same.prefill(PROMPTS[:1], max_new_tokens=20), larger.prefill(PROMPTS[:1], max_new_tokens=20)
    for _ in range(3):
        assert a.tokens[0].tolist() == b.tokens[0].tolist() and max(b.tokens[0].tolist()) < VOCAB
        (a, out_a), (b, out_b) = same(a), larger(b)
        assert out_a.num_tokens.tolist() == out_b.num_tokens.tolist()


def tiny_draft_with_vocab(vocab: int) -> LlamaModel:
    """A random 1-layer draft over `vocab` ids; a larger one puts nearly all its mass on the ids past V."""
    draft = LlamaModel.random(TINY.replace(num_layers=1, vocab_size=vocab), seed=5, std=0.6)
    with torch.no_grad():
        draft.lm_head.weight[V:] = 50.0
    return draft


@pytest.mark.parametrize(
    ("vocab", "params"),
    [
        (V + 3, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
        (3, dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)),  # PROMPT holds 3, which this draft lacks
    ],
)
def test_emitted_sequences_follow_the_target_with_a_draft_of_another_vocabulary(vocab, params):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=LANES, max_seq_len=12, block_size=4, backend="eager")
    step = fdecode.compile(target, tiny_draft_with_vocab(vocab), cfg)
    samples = sampled_sequences(step, params, batches=40)
    cells = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    counts = torch.bincount(cells, minlength=V**3)
    expected = exact_distribution(target, params)
    assert chi2_pvalue(counts, expected) > ALPHA
    assert expected[counts > 0].min() > 0


def test_a_draft_with_another_tokenizer_is_refused_but_one_padded_differently_is_not(tmp_path):
    """Where both folders have a tokenizer.json, a shared id naming two tokens is refused; extra ids are padding."""
    import json

    from fdecode.models import save_hf

    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=16, block_size=4, backend="eager")
    vocab = {chr(ord("a") + i): i for i in range(V)}

    def folder(name, model, tokens, added=()):
        save_hf(model, tmp_path / name)
        added = [{"id": i, "content": t, "special": True} for i, t in added]
        (tmp_path / name / "tokenizer.json").write_text(json.dumps({"model": {"vocab": tokens}, "added_tokens": added}))
        return tmp_path / name

    target = folder("target", tiny_target(), vocab)
    padded = folder("padded", tiny_draft_with_vocab(V + 3), vocab, [(V, "<pad0>"), (V + 1, "<pad1>")])
    assert fdecode.compile(target, padded, cfg).draft.config.vocab_size == V + 3
    swapped = folder("swapped", tiny_draft_with_vocab(V + 3), {**vocab, "a": 1, "b": 0})
    with pytest.raises(ValueError, match=r"tokenizer differs .* id 0: 'b' in the draft, 'a' in the target"):
        fdecode.compile(target, swapped, cfg)
    (swapped / "tokenizer.json").unlink()  # nothing to compare: accepted
    assert fdecode.compile(target, swapped, cfg).draft_kind == "model"

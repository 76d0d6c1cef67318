"""Draft kinds behind one protocol (`fdecode.drafts`): what each kind answers, and that nothing outside the
package asks a draft for its type."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from support.hybrid_models import hybrid_target
from support.llama_models import fdecode_target

import fdecode
from fdecode.drafts import LM, MTP, NGRAM, NgramDraft, drafter_for
from fdecode.models import ModelConfig, MTPHead
from fdecode.runtime.depth import DepthController
from fdecode.runtime.gate import DraftGate
from fdecode.runtime.policy import FixedDepth, depth_policy

CFG = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=64, block_size=4, backend="eager")
PACKAGE = Path(fdecode.__file__).parent
# A question about a draft's kind: its class, its kind string, an attribute only one kind has (duck typing), or
# the old helpers that asked them.
KIND_CHECK = re.compile(
    r"isinstance\([^)]*\b(MTPHead|NgramDraft|HybridMTPHead|NextNMTPHead)\b"
    r"|draft_kind\s*[!=]=|\.kind\s*[!=]=|is_ngram\(|idles_draft\(|is_hybrid\([^)]*draft"
    r"|(?:has|get)attr\(draft\b"
)


def test_each_draft_module_has_its_drafter() -> None:
    target = fdecode_target(2)
    head = MTPHead.random(ModelConfig(**{**target.config.__dict__, "num_layers": 1}), seed=1)
    assert drafter_for(NgramDraft()) is NGRAM
    assert drafter_for(head) is MTP
    assert drafter_for(fdecode_target(1)) is LM
    assert [d.kind for d in (LM, MTP, NGRAM)] == ["model", "mtp", "ngram"]
    assert repr(MTP) == "MTPDrafter(kind='mtp')"


def test_what_each_kind_answers() -> None:
    lm, cfg = fdecode_target(1), dataclasses.replace(CFG, draft_catch_up=2)
    # How many drafts a depth proposes: as many as it verified, none where a draft LM sits out, K for lookups.
    assert [LM.proposals(lm, cfg, d) for d in range(4)] == [0, 1, 2, 3]
    assert [LM.proposals(lm, dataclasses.replace(CFG, draft_catch_up=0), d) for d in range(4)] == [1, 1, 2, 3]
    assert [NGRAM.proposals(None, cfg, d) for d in range(4)] == [3, 3, 3, 3]
    # Which leaves each adds: the history of a lookup, the tokens an idle draft missed.
    assert NGRAM.history_width(cfg) == cfg.blocks_per_lane * cfg.block_size + cfg.W and LM.history_width(cfg) == 0
    assert LM.missed_width(lm, cfg) == 2 and MTP.missed_width(None, cfg) == 0
    assert LM.idles(lm, cfg) and not MTP.idles(None, cfg) and not NGRAM.idles(None, cfg)
    # Which depths a step runs: any 0 .. K; 0 or K beside a recurrent model (target or draft); in a tree 0, chains
    # of 1 .. S and trees past S (`tree_sizes`), beside a recurrent model too (its state follows each node's parent).
    hybrid = hybrid_target()
    assert LM.depths(lm, cfg, target=lm) == NGRAM.depths(None, cfg, target=lm) == (0, 1, 2, 3)
    assert LM.depths(hybrid, cfg, target=lm) == NGRAM.depths(None, cfg, target=hybrid) == (0, 3)
    tree = dataclasses.replace(CFG, num_draft_tokens=4, draft_topk=2, draft_depth=2)
    assert LM.depths(lm, tree, target=lm) == NGRAM.depths(None, tree, target=lm) == (0, 1, 2, 3, 4)
    assert LM.depths(lm, tree, target=hybrid) == LM.depths(hybrid, tree, target=hybrid) == (0, 1, 2, 3, 4)
    # The depth policy's kind, priming, weights and backends.
    assert NGRAM.gated(cfg) and not NGRAM.adapts(cfg) and LM.adapts(cfg) and not LM.gated(cfg)
    assert not NGRAM.forwards and LM.forwards and MTP.shares_target and not LM.shares_target
    assert "history" in NGRAM.backend_reason("cudagraphs") and LM.backend_reason("cudagraphs") is None
    assert NGRAM.forward_bytes(NgramDraft()) == 0 and LM.forward_bytes(lm) > 0
    # Decoder layers a draft forward runs (`layer_regions="auto"` counts them): all a draft LM's, one of an MTP
    # head's, none for a lookup.
    head = MTPHead.random(ModelConfig(**{**lm.config.__dict__, "num_layers": 1}), seed=1)
    assert LM.layers_per_forward(fdecode_target(2)) == 2 and MTP.layers_per_forward(head) == 1
    assert NGRAM.layers_per_forward(NgramDraft()) == 0
    # A host loop's proposals (`fdecode.baseline`): a lookup's, the step's rule; a draft with forwards has none.
    assert NGRAM.host_proposals(NgramDraft(2, 1), [1, 2, 3, 1, 2], 2) == [3, 1]
    with pytest.raises(NotImplementedError, match="proposes through its forwards"):
        LM.host_proposals(lm, [1, 2], 2)


TREE = {"num_draft_tokens": 4, "draft_topk": 2, "draft_depth": 2}


@pytest.mark.parametrize(
    ("draft", "changes", "policy"),
    [
        ("ngram", {}, DraftGate),
        ("ngram", {"draft_gate": False}, FixedDepth),
        ("ngram", TREE, DepthController),  # a tree's rows are weighed against its chains
        ("ngram", {**TREE, "adaptive_depth": False}, FixedDepth),
        ("self", {}, DepthController),
        ("self", {"adaptive_depth": False}, FixedDepth),
    ],
)
def test_the_drafter_chooses_the_engines_depth_policy(draft, changes, policy) -> None:
    target = fdecode_target(2)
    step = fdecode.compile(target, target if draft == "self" else draft, dataclasses.replace(CFG, **changes))
    assert isinstance(depth_policy(step), policy) and isinstance(fdecode.Engine(step).policy, policy)
    chosen = depth_policy(step)  # one interface: a launch's depth, and the counts the metrics read
    depth, _ = chosen.launch(None)
    assert chosen.depth == depth and chosen.launches[depth] == sum(chosen.launches.values()) == 1


def test_no_draft_kind_check_outside_the_drafts_package() -> None:
    """The step, priming, backends, TP and the Engine ask the drafter: at most 3 places outside `fdecode/drafts/`
    ask a draft for its type (today one: an MTP head passed as the target is refused)."""
    found = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "drafts" not in path.relative_to(PACKAGE).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if KIND_CHECK.search(line)
    ]
    assert len(found) <= 3, "\n".join(found)

"""fdecode.models against transformers: same logits through the paged KV cache, checkpoint round trips, MTP.

Every case runs two prompts of different lengths (7 and 4 tokens) through a
paged cache with block size 4 and shuffled, non-contiguous blocks: one prefill
call (the short prompt padded with scratch-slot rows), three single-token decode
calls, and one 3-token window call, and compares every real row's logits with
HF's logits for the whole sequence at that position.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from fdecode.models import LlamaModel, ModelConfig, MTPHead, from_hf, save_hf
from fdecode.models.families.llama import config_from_hf
from fdecode.models.layers.rope import rope_inv_freq

BLOCK = 4
MAX_BLOCKS = 5  # 20 positions per lane; the longest sequence here has 13
PROMPT_LENS = (7, 4)
DECODE_STEPS = 3  # single-token calls, then one window of WINDOW tokens
WINDOW = 3
TOL = 1e-4

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)
CASES = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2Config, {}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 32}),  # head_dim != hidden / heads
    "llama_tied": (transformers.LlamaConfig, {"tie_word_embeddings": True}),
    "llama3_rope": (
        transformers.LlamaConfig,
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "yarn_rope": (
        transformers.Qwen3Config,
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
}


def hf_model(case: str) -> transformers.PreTrainedModel:
    config_cls, extra = CASES[case]
    config = config_cls(**{**TINY, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    # HF initialises norms to 1 and biases to 0; perturb everything so a dropped or swapped weight shows.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


def sequences() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, 128, (n + DECODE_STEPS + WINDOW,), generator=gen) for n in PROMPT_LENS]


def block_tables() -> torch.Tensor:
    """[2, MAX_BLOCKS]: shuffled blocks 1..10 (block 0 is scratch); lane 1's last two left unallocated."""
    perm = torch.randperm(2 * MAX_BLOCKS, generator=torch.Generator().manual_seed(3)) + 1
    tables = perm.view(2, MAX_BLOCKS).clone()
    tables[1, 3:] = -1
    return tables


def slot_of(tables: torch.Tensor, lane: int, pos: int) -> int:
    return int(tables[lane, pos // BLOCK]) * BLOCK + pos % BLOCK


def run_paged(
    model: LlamaModel, seqs: list[torch.Tensor], tables: torch.Tensor, kv: torch.Tensor
) -> list[tuple[int, int, torch.Tensor]]:
    """Prefill, DECODE_STEPS single-token calls, one WINDOW call. Returns (lane, position, logits [V]) rows."""
    prompt_lens = list(PROMPT_LENS)
    calls = [[list(range(n)) for n in prompt_lens]]
    calls += [[[n + i] for n in prompt_lens] for i in range(DECODE_STEPS)]
    calls += [[list(range(n + DECODE_STEPS, n + DECODE_STEPS + WINDOW)) for n in prompt_lens]]
    rows = []
    for lane_positions in calls:
        q = max(len(p) for p in lane_positions)
        tokens = torch.zeros(2, q, dtype=torch.int64)
        positions = torch.full((2, q), -1, dtype=torch.int64)  # padding rows: position -1, scratch slot 0
        slots = torch.zeros(2, q, dtype=torch.int64)
        for lane, pos_list in enumerate(lane_positions):
            for i, p in enumerate(pos_list):
                tokens[lane, i], positions[lane, i], slots[lane, i] = seqs[lane][p], p, slot_of(tables, lane, p)
        logits, hidden = model(tokens, positions, slots, kv, tables, block_size=BLOCK)
        assert logits.shape == (2, q, 128) and logits.dtype == torch.float32
        assert hidden.shape == (2, q, model.config.hidden_size)
        assert torch.isfinite(logits).all()  # padding rows included
        rows += [(lane, p, logits[lane, i]) for lane, pl in enumerate(lane_positions) for i, p in enumerate(pl)]
    return rows


def new_kv(cfg: ModelConfig) -> torch.Tensor:
    return cfg.new_kv((1 + 2 * MAX_BLOCKS) * BLOCK, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("case", sorted(CASES))
def test_paged_logits_match_transformers(case: str) -> None:
    hf = hf_model(case)
    model = from_hf(hf)
    seqs, tables = sequences(), block_tables()
    with torch.no_grad():
        expected = [hf(seq[None]).logits[0] for seq in seqs]  # [L, V] per lane
    rows = run_paged(model, seqs, tables, new_kv(model.config))
    assert len(rows) == sum(len(s) for s in seqs)
    worst = max((logits - expected[lane][pos]).abs().max().item() for lane, pos, logits in rows)
    assert worst <= TOL, f"{case}: max |diff| {worst}"


def test_config_parsing() -> None:
    cfg = from_hf(hf_model("llama3_rope")).config
    assert cfg.rope_scaling_dict["rope_type"] == "llama3" and cfg.rope_theta == 10000.0
    assert cfg.model_type == "llama" and cfg.num_kv_heads == 2 and not cfg.tie_word_embeddings
    # transformers 4 style: rope_theta at the top, rope_scaling with "type"; missing head_dim / kv heads.
    old = {
        "model_type": "qwen2",
        "vocab_size": 8,
        "hidden_size": 32,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "rope_theta": 5e5,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    cfg = config_from_hf(old)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.attention_bias, cfg.rope_theta) == (8, 4, True, 5e5)
    assert cfg.rope_scaling == (("factor", 2.0), ("rope_type", "linear"))
    hash(cfg)
    with pytest.raises(ValueError, match="dynamic"):
        config_from_hf({**old, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ValueError, match="longrope"):
        rope_inv_freq(cfg.replace(rope_scaling=(("rope_type", "longrope"),)))


def test_unsupported_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mistral.*llama"):
        config_from_hf({"model_type": "mistral"})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 8}))
    with pytest.raises(ValueError, match="gpt2"):
        from_hf(tmp_path)
    with pytest.raises(TypeError):
        from_hf(42)


def test_save_hf_round_trip(tmp_path: Path) -> None:
    hf = hf_model("llama_tied")
    model = from_hf(hf)
    save_hf(model, tmp_path)
    seqs, tables = sequences(), block_tables()
    rows = run_paged(model, seqs, tables, new_kv(model.config))
    reloaded = from_hf(tmp_path)
    assert reloaded.lm_head.weight is reloaded.embed_tokens.weight and reloaded.mtp is None
    for (_, _, a), (_, _, b) in zip(rows, run_paged(reloaded, seqs, tables, new_kv(model.config))):
        assert torch.equal(a, b)
    # ... and transformers reads the same folder.
    hf_back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf_back).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(hf_back(seqs[0][None]).logits, hf(seqs[0][None]).logits, rtol=0, atol=0)


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_loads_folder_saved_by_transformers(tmp_path: Path, shard: str | None) -> None:
    hf = hf_model("qwen3")
    hf.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").is_file() == bool(shard)
    seqs, tables = sequences(), block_tables()
    ref, got = from_hf(hf), from_hf(tmp_path)
    for (_, _, a), (_, _, b) in zip(
        run_paged(ref, seqs, tables, new_kv(ref.config)), run_paged(got, seqs, tables, new_kv(got.config))
    ):
        assert torch.equal(a, b)


def test_compiled_forward_matches_eager() -> None:
    model = from_hf(hf_model("qwen3"))
    tables = block_tables()
    tokens = torch.tensor([[5, 6], [7, 8]])
    positions = torch.tensor([[4, 5], [2, 3]])
    slots = torch.tensor(
        [[slot_of(tables, 0, 4), slot_of(tables, 0, 5)], [slot_of(tables, 1, 2), slot_of(tables, 1, 3)]]
    )

    def step(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return model(tokens, positions, slots, kv, tables, block_size=BLOCK)

    # A cache full of noise: stale entries must be masked, not merely zero.
    kv_eager = new_kv(model.config).normal_(generator=torch.Generator().manual_seed(4))
    kv_compiled = kv_eager.clone()
    eager = step(kv_eager)
    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")(kv_compiled)
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(kv_compiled, kv_eager, rtol=0, atol=0)  # the in-place writes happened


def tiny_config(**changes: object) -> ModelConfig:
    return ModelConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        **changes,
    )


def test_mtp_head_shares_target_io_and_writes_only_its_slots() -> None:
    cfg = tiny_config(qk_norm=True)
    target = LlamaModel.random(cfg, seed=0)
    head = MTPHead.random(cfg, seed=1).bind(target)
    assert head.kv_config.num_layers == 1 and head.config is cfg
    assert not any(p.data_ptr() == target.embed_tokens.weight.data_ptr() for p in head.parameters())
    kv = head.kv_config.new_kv((1 + 2 * MAX_BLOCKS) * BLOCK, dtype=torch.float32, device="cpu")
    tables = block_tables()
    tokens, positions = torch.tensor([[3, 4], [5, 6]]), torch.tensor([[0, 1], [0, 1]])
    slots = torch.tensor(
        [[slot_of(tables, 0, 0), slot_of(tables, 0, 1)], [slot_of(tables, 1, 0), slot_of(tables, 1, 1)]]
    )
    hidden_in = torch.randn(2, 2, 64, generator=torch.Generator().manual_seed(5))
    logits, hidden = head(tokens, positions, slots, kv, tables, block_size=BLOCK, hidden_in=hidden_in)
    assert logits.shape == (2, 2, 128) and logits.dtype == torch.float32 and hidden.shape == (2, 2, 64)
    written = kv.abs().flatten(3).sum(-1)[0, 0] != 0  # [num_slots]: slots holding keys
    assert sorted(torch.nonzero(written).flatten().tolist()) == sorted(slots.flatten().tolist())
    assert (kv[0, 1].abs().flatten(1).sum(-1) != 0).eq(written).all()  # values: same slots
    # The shared weights follow the target and stay shared after a dtype move.
    target.mtp = head
    target.to(torch.float64)
    assert head.shared[0].weight.data_ptr() == target.embed_tokens.weight.data_ptr()
    logits64, _ = head(tokens, positions, slots, kv.double(), tables, block_size=BLOCK, hidden_in=hidden_in.double())
    torch.testing.assert_close(logits64, logits, rtol=0, atol=1e-5)  # logits are float32 whatever the weights


def _mtp_model() -> LlamaModel:
    target = LlamaModel.random(tiny_config(qk_norm=True, model_type="qwen3"), seed=0)
    target.mtp = MTPHead.random(target.config, seed=1).bind(target)
    return target


def _relayout(key: str, layout: str, num_layers: int) -> str:
    """fdecode's MTP key (layout c) written in layout a (Qwen3-Next) or b (DeepSeek-V3)."""
    if not key.startswith("mtp."):
        return key
    rest = key[len("mtp.") :]
    if layout == "a":
        for ours, theirs in (
            ("eh_proj.", "fc."),
            ("enorm.", "pre_fc_norm_embedding."),
            ("hnorm.", "pre_fc_norm_hidden."),
            ("layer.", "layers.0."),
        ):
            if rest.startswith(ours):
                return "mtp." + theirs + rest[len(ours) :]
        return key
    prefix = f"model.layers.{num_layers}."
    if rest.startswith("layer."):
        return prefix + rest[len("layer.") :]
    return prefix + ("shared_head." + rest if rest.startswith("norm.") else rest)


@pytest.mark.parametrize("layout", ["a", "b", "c"])
def test_mtp_weights_round_trip(tmp_path: Path, layout: str) -> None:
    model = _mtp_model()
    save_hf(model, tmp_path)
    if layout != "c":
        weights = load_file(str(tmp_path / "model.safetensors"))
        weights = {_relayout(k, layout, 2): v for k, v in weights.items()}
        if layout == "b":  # DeepSeek-V3 also stores copies of the shared embedding / head: ignored
            weights["model.layers.2.embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
            weights["model.layers.2.shared_head.head.weight"] = weights["lm_head.weight"].clone()
        save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    loaded = from_hf(tmp_path)
    assert isinstance(loaded.mtp, MTPHead)
    assert loaded.mtp.shared[0] is loaded.embed_tokens and loaded.mtp.shared[1] is loaded.lm_head
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_checkpoint_key_mismatch_is_reported(tmp_path: Path) -> None:
    save_hf(LlamaModel.random(tiny_config(), seed=0), tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["model.layers.0.self_attn.extra.weight"] = weights.pop("model.norm.weight")
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \[norm.weight\], unexpected \[layers.0.self_attn.extra.weight\]"):
        from_hf(tmp_path)


def test_last_logits_are_the_last_rows_logits() -> None:
    """`last_logits=True` (a draft's first forward, whose earlier rows only write KV) gives the last row's logits
    of the full forward, for a draft LM, an MTP head and a hybrid model, and writes the same KV."""
    from fdecode.models.hybrid import HybridModel
    from fdecode.models.hybrid_config import FULL, LINEAR, HybridConfig

    cfg = tiny_config(qk_norm=True)
    target = LlamaModel.random(cfg, seed=0)
    hybrid = HybridModel.random(
        HybridConfig(
            vocab_size=128,
            hidden_size=16,
            intermediate_size=32,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=8,
            model_type="qwen3_5_text",
            layer_types=(LINEAR, FULL),
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=4,
            linear_value_head_dim=4,
            partial_rotary_factor=0.5,
        ),
        seed=2,
        std=0.3,
    )
    tables = block_tables()
    tokens, positions = torch.tensor([[3, 4, 9], [5, 6, 7]]), torch.tensor([[0, 1, 2], [0, 1, 2]])
    slots = torch.tensor([[slot_of(tables, b, p) for p in range(3)] for b in range(2)])
    for model, extra in (
        (target, {}),
        (
            MTPHead.random(cfg, seed=1).bind(target),
            {"hidden_in": torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(5))},
        ),
        (hybrid, {}),
    ):
        kv_config = getattr(model, "kv_config", model.config)
        kvs = [kv_config.new_kv((1 + 2 * MAX_BLOCKS) * BLOCK, dtype=torch.float32, device="cpu") for _ in range(2)]
        with torch.no_grad():
            full, hidden = model(tokens, positions, slots, kvs[0], tables, block_size=BLOCK, **extra)[:2]
            last, same = model(tokens, positions, slots, kvs[1], tables, block_size=BLOCK, last_logits=True, **extra)[
                :2
            ]
        assert last.shape == (2, 1, full.shape[-1]), type(model).__name__
        torch.testing.assert_close(last, full[:, -1:], rtol=0, atol=1e-6)  # a one-row matmul blocks differently
        torch.testing.assert_close(same, hidden, rtol=0, atol=0)
        torch.testing.assert_close(kvs[1], kvs[0], rtol=0, atol=0)

"""Checkpoint key names of the Llama layout and of DeepSeek-style MTP modules (docs/design.md, "Model
families and the registry").

HF `model.<name>` is fdecode `<name>`; `lm_head.weight` is the same. A multi-token-prediction head is
recognised in three layouts and named `mtp.*`:
  (a) Qwen3-Next: mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*, mtp.norm
  (b) DeepSeek-V3: model.layers.<num_layers>.{enorm,hnorm,eh_proj,shared_head.norm,<decoder layer>}
      (the DeepSeek-V3 / GLM-4.5 families: module k at model.layers.<num_layers + k>.*, `rename_nextn`)
  (c) fdecode (what save_hf writes): mtp.enorm, mtp.hnorm, mtp.eh_proj, mtp.layer.*, mtp.norm
Only the key names are translated: the MTP layer must have this model's decoder-layer shapes.
"""

from __future__ import annotations

import re

_QWEN3_NEXT_NAMES = {
    "mtp.fc.": "mtp.eh_proj.",
    "mtp.pre_fc_norm_embedding.": "mtp.enorm.",
    "mtp.pre_fc_norm_hidden.": "mtp.hnorm.",
    "mtp.layers.0.": "mtp.layer.",
}
_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")


def rename(hf_key: str, num_layers: int) -> str | None:
    """fdecode name of a checkpoint key, or None for keys that are deliberately ignored."""
    if hf_key.endswith("rotary_emb.inv_freq"):
        return None  # older checkpoints saved the RoPE table; fdecode recomputes it
    mtp_prefix = f"model.layers.{num_layers}."
    if hf_key.startswith(mtp_prefix):  # (b) DeepSeek-V3
        part = nextn_part(hf_key[len(mtp_prefix) :])
        return None if part is None else "mtp." + part
    for old, new in _QWEN3_NEXT_NAMES.items():  # (a) Qwen3-Next
        if hf_key.startswith(old):
            return new + hf_key[len(old) :]
    if hf_key.startswith("model."):
        return hf_key[len("model.") :]
    return hf_key  # lm_head.*, and mtp.* of layouts (a) norm and (c)


def nextn_part(rest: str) -> str | None:
    """The fdecode name, within one MTP module, of the key `model.layers.{N}.<rest>` of layout (b) (`enorm.*`,
    `hnorm.*`, `eh_proj.*`, `norm.*`, `layer.*`); None for its copies of the target's embedding / LM head,
    which the head shares (`rename_nextn`: the modules of a head of several)."""
    if rest.startswith(("embed_tokens.", "shared_head.head.")):
        return None
    if rest.startswith(("enorm.", "hnorm.", "eh_proj.")):
        return rest
    if rest.startswith("shared_head.norm."):
        return "norm." + rest[len("shared_head.norm.") :]
    return "layer." + rest


def rename_nextn(hf_key: str, num_layers: int) -> str | None:
    """`rename`, with module k of a DeepSeek-style MTP head at `model.layers.{num_layers + k}.*` (k >= 0)
    named `mtp.layers.k.*` (`nextn_part`): the DeepSeek-V3 and GLM-4.5 families."""
    match = _LAYER_KEY.fullmatch(hf_key)
    if match is None or int(match[1]) < num_layers or hf_key.endswith("rotary_emb.inv_freq"):
        return rename(hf_key, num_layers)
    part = nextn_part(match[2])
    return None if part is None else f"mtp.layers.{int(match[1]) - num_layers}.{part}"

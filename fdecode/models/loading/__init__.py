"""Hugging Face loading (docs/design.md, "Model families and the registry"): `hf` (`from_hf`, `save_hf`),
`checkpoint` (per-tensor safetensors reads), `expert_weights` (per-expert keys into stacked experts), `eos`
(a model's stop ids)."""

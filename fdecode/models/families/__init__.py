"""One declaration per checkpoint family (`Family`), listed by `fdecode.models.registry`
(docs/design.md, "Model families and the registry"): `llama` (Llama, Qwen2, Qwen3), `qwen3_5` (Qwen3.5,
Qwen3.5-MoE), `qwen3_next`, `deepseek_v3`, `glm4_moe`. Shared helpers: `family` (the declaration's type),
`hf_config` (config.json fields), `keys` (checkpoint key names)."""

"""Multi-token-prediction heads (docs/design.md, "MTP head vs draft LM"): `head` (`MTPHead`, the one-layer
head and what every head shares), `nextn` (DeepSeek-V3 / GLM-4.5 heads of n modules), `hybrid` (Qwen3.5 /
Qwen3-Next heads)."""

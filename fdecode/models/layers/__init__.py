"""Shared blocks with no model-type strings (docs/design.md, "Model families and the registry"):
`decoder_layer` (RMSNorm, MLP, attention, the Llama decoder layer), `rope` and `partial_rope`, `norms`
(offset and gated RMSNorms), `gated_attention`, `deltanet` (Gated DeltaNet), `mla` (multi-head latent
attention), `moe` and `routing` (MoE blocks and routers), `float32` (modules kept float32 in a model of any
dtype)."""

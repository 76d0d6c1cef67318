"""What every fdecode decoder LM shares, whatever its layers: the KV config, tied embeddings, random init
(docs/design.md, "Model families and the registry").

A family's model (`LlamaModel`, `HybridModel`) subclasses `DecoderLM` and sets `config`,
`embed_tokens` and `lm_head`; it overrides `init_random_` where its parameters need other values.
"""

from __future__ import annotations

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.decoder_layer import init_random_


class DecoderLM(nn.Module):
    config: ModelConfig
    embed_tokens: nn.Embedding
    lm_head: nn.Linear

    rank_config: ModelConfig | None = None  # a tensor-parallel rank's shapes (`fdecode.models.sharding`)

    @property
    def kv_config(self) -> ModelConfig:
        """Config that shapes this model's KV cache and recurrent state: the model's own, or a tensor-parallel
        rank's (its share of the heads) where the model is one rank's shard."""
        return self.config if self.rank_config is None else self.rank_config

    def tie_weights_(self) -> None:
        """Make lm_head.weight the very tensor of embed_tokens.weight when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @classmethod
    def random(cls, cfg: ModelConfig, *, seed: int, std: float = 0.02, dtype: torch.dtype = torch.float32):
        model = cls(cfg).to(dtype)
        model.init_random_(seed=seed, std=std)
        return model

    def init_random_(self, *, seed: int, std: float) -> None:
        init_random_(self, seed=seed, std=std)

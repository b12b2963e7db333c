"""Building blocks of the model code: linear layers with fused shards, RMSNorm, rotary embedding,
the paged attention layer and its metadata."""

from pagedcore.layers.activation import silu_and_mul
from pagedcore.layers.attention import Attention, AttentionMetadata
from pagedcore.layers.embedding import VocabEmbedding
from pagedcore.layers.layernorm import RMSNorm
from pagedcore.layers.linear import Linear, MergedLinear
from pagedcore.layers.rotary_embedding import RotaryEmbedding, apply_rotary_emb

__all__ = [
    "Attention", "AttentionMetadata", "Linear", "MergedLinear", "RMSNorm", "RotaryEmbedding",
    "VocabEmbedding", "apply_rotary_emb", "silu_and_mul",
]

"""The token embedding table; with tied embeddings it is also the LM head's weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        # Left uninitialised: the checkpoint fills it (see linear.py).
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype),  # [vocab, hidden]
                                   requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 [num_tokens] -> [num_tokens, hidden], a new tensor (safe to modify in place)."""
        return F.embedding(input_ids, self.weight)

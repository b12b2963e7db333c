"""GrammarBitmask: one step's allowed-token bitmask of the constrained rows, filled by xgrammar.

A reusable int32 buffer [rows, ceil(vocab / 32)] (bit j of a row set = token j allowed), grown when a
step has more rows than any before. Every constrained row is filled in one batched call (xgrammar's
threads); the unconstrained rows of the buffer are left stale and never read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


class GrammarBitmask:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._buffer: torch.Tensor | None = None   # int32 [capacity, ceil(vocab / 32)], on the CPU
        self._batch = None                          # xgrammar.BatchGrammarMatcher, made on first use

    def fill(self, num_rows: int, row_ids: Sequence[int], matchers: Sequence) -> torch.Tensor:
        """The bitmask of a step with num_rows sampling rows: int32 [num_rows, ceil(vocab / 32)], rows
        row_ids filled from their matchers (matchers[i] is row row_ids[i]'s), the others undefined."""
        import xgrammar as xgr

        if self._buffer is None or self._buffer.shape[0] < num_rows:
            self._buffer = xgr.allocate_token_bitmask(max(num_rows, 8), self.vocab_size)
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(max_threads=max(1, min(4, (os.cpu_count() or 2) // 2)))
        bitmask = self._buffer[:num_rows]
        self._batch.batch_fill_next_token_bitmask(list(matchers), bitmask, list(row_ids))
        return bitmask

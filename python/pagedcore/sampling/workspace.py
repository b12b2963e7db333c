"""`RowBuffers`: reusable [rows, vocab] float32 buffers for the sampler's row subsets.

A fresh [rows, vocab] tensor above glibc's 32 MB mmap ceiling (170 rows of a 49152 vocabulary)
is mapped and page-faulted anew every step, which costs more than the copy into it: index_select
of 213 such rows measured 34 ms fresh against ~3 ms into a warm buffer. One buffer per role,
grown to the largest batch seen and then reused.
"""

from __future__ import annotations

import torch


class RowBuffers:
    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def rows_of(self, role: str, src: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """src [R, V] -> a copy of src[rows] (all of src when rows is None) [N, V] in role's buffer,
        valid until the next call for the same role."""
        num_rows = src.shape[0] if rows is None else rows.numel()
        buf = self._buffers.get(role)
        if (buf is None or buf.shape[0] < num_rows or buf.shape[1] != src.shape[1] or buf.dtype != src.dtype
                or buf.device != src.device):
            buf = self._buffers[role] = torch.empty(num_rows, src.shape[1], dtype=src.dtype, device=src.device)
        out = buf[:num_rows]  # [N, V] contiguous view
        if rows is None:
            return out.copy_(src)
        return torch.index_select(src, 0, rows, out=out)

"""The greedy token of each logits row in C++ (cpp/kernels/argmax_rows.h), equal to
torch.argmax(dim=-1): the first index of the maximum, NaN counted largest.

torch's CPU argmax over one 49152-wide row took ~45-50 us a row (it does not vectorise that
reduction), ~1% of a single-stream decode token of the default model; this one reads the row at
memory speed.

    tokens = argmax_rows(logits)   # fp32 [num_rows, vocab] -> int64 numpy [num_rows]
"""

from __future__ import annotations

import numpy as np
import torch

from pagedcore import _core


def argmax_rows(logits: torch.Tensor) -> np.ndarray:
    """logits [num_rows, vocab] -> int64 numpy [num_rows]. The C++ kernel for fp32 CPU rows with a
    unit inner stride; any other tensor goes through torch.argmax (same result)."""
    if (logits.dim() != 2 or logits.dtype is not torch.float32 or not logits.is_cpu or logits.shape[1] == 0
            or (logits.shape[0] > 1 and logits.stride(0) < logits.shape[1]) or logits.stride(1) != 1):
        return logits.argmax(dim=-1).cpu().numpy()
    out = np.empty(logits.shape[0], dtype=np.int64)  # [num_rows]
    _core.argmax_rows_cpu(logits.data_ptr(), logits.shape[0], logits.shape[1],
                          max(logits.stride(0), logits.shape[1]), out.ctypes.data)
    return out


def argmax_rows_tensor(logits: torch.Tensor) -> torch.Tensor:
    """As argmax_rows, as an int64 tensor [num_rows] on logits' device (the sampler's form)."""
    if logits.is_cpu:
        return torch.from_numpy(argmax_rows(logits))
    return logits.argmax(dim=-1)

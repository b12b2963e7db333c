"""Temperature / top-k / top-p / min-p sampling of fp32 logit rows in C++ (cpp/kernels/sample_rows.h
says what is drawn and why: the torch sampler took ~130 us for a plainly sampled 49,152-wide row and
~0.3-1 ms for a truncated one on the 2-core Zen 4).

    tokens = sample_rows(logits, rows, noise)   # logits [R, V] fp32 (consumed) -> int64 numpy [R]
"""

from __future__ import annotations

import os

import numpy as np
import torch

from pagedcore import _core
from pagedcore.sampling.row_sampling import RowSampling


def enabled() -> bool:
    """PAGEDCORE_CPU_SAMPLER=0 turns the kernel off (A/B measurements, a fallback): the torch stages
    sample every row, and only greedy steps run as one C++ call."""
    return os.environ.get("PAGEDCORE_CPU_SAMPLER", "1") != "0"


def takes(logits: torch.Tensor) -> bool:
    """The kernel's layout: fp32 CPU rows with a unit inner stride (else the torch sampler runs)."""
    return (logits.dim() == 2 and logits.dtype is torch.float32 and logits.is_cpu and logits.shape[1] > 0
            and logits.stride(1) == 1 and (logits.shape[0] <= 1 or logits.stride(0) >= logits.shape[1]))


def sample_rows(logits: torch.Tensor, rows: RowSampling, noise: torch.Tensor | None = None,
                cuts: np.ndarray | None = None) -> np.ndarray:
    """logits [R, V] (see takes(); random rows are overwritten with their weights), rows of R entries,
    noise [R, noise_width] float32 (rows.draw_noise() when None) -> int64 numpy [R]. cuts (tests): a
    float32 numpy [R] that receives each random row's weight threshold max(tau_k, tau_p, min_p)."""
    if not takes(logits):
        raise TypeError(f"sample_rows takes fp32 CPU rows with a unit inner stride, got {logits.dtype} "
                        f"{tuple(logits.shape)} strides {logits.stride()} on {logits.device}")
    num_rows, vocab_size = logits.shape
    if rows.num_rows != num_rows or rows.vocab_size != vocab_size:
        raise ValueError(f"logits are [{num_rows}, {vocab_size}] but the row parameters were built for "
                         f"[{rows.num_rows}, {rows.vocab_size}]")
    if noise is None:
        noise = rows.draw_noise()
    width = rows.noise_width
    if (noise.dtype is not torch.float32 or not noise.is_cpu or tuple(noise.shape) != (num_rows, width)
            or not noise.is_contiguous()):
        raise ValueError(f"noise must be a contiguous fp32 CPU tensor [{num_rows}, {width}], got {noise.dtype} "
                         f"{tuple(noise.shape)}")
    if cuts is not None and (cuts.dtype != np.float32 or cuts.shape != (num_rows,) or not cuts.flags.c_contiguous):
        raise ValueError(f"cuts must be a contiguous float32 numpy array of {num_rows}")
    out = np.empty(num_rows, dtype=np.int64)  # [R]
    _core.sample_rows_cpu(logits.data_ptr(), num_rows, vocab_size, max(logits.stride(0), vocab_size),
                          rows.temperature.ctypes.data, rows.top_k.ctypes.data, rows.top_p.ctypes.data,
                          rows.min_p.ctypes.data, noise.data_ptr(), width, out.ctypes.data,
                          0 if cuts is None else cuts.ctypes.data)
    return out

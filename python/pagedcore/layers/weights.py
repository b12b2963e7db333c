"""Checkpoint tensors as the model's load_weights receives them: a torch.Tensor, or a lazy weight
that decodes itself straight into the parameter (a quantised GGUF tensor), skipping a temporary."""

from __future__ import annotations

from typing import Protocol, Union

import torch


class LazyWeight(Protocol):
    shape: tuple[int, ...]

    def load_into(self, out: torch.Tensor) -> None:
        """Writes the tensor's values into out (its shape, the model's dtype, maybe non-contiguous)."""


CheckpointTensor = Union[torch.Tensor, LazyWeight]


def copy_weight(target: torch.Tensor, loaded: CheckpointTensor, name: str) -> None:
    """Fills target (a parameter or rows of one) from loaded, converting dtype once."""
    if tuple(loaded.shape) != tuple(target.shape):
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(loaded.shape)}; the config implies "
                         f"{tuple(target.shape)}")
    if isinstance(loaded, torch.Tensor):
        target.copy_(loaded)
    else:
        loaded.load_into(target)

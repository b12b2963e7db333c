"""What one pipeline stage hands the next: the residual stream as it stands after the stage's layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class IntermediateTensors:
    """hidden: the last layer's output, not yet added into residual; residual: the running sum
    (None only before the first layer). Both [num_tokens, hidden_size], the model dtype. The next
    stage updates residual in place (its first layer's add-and-norm): pass writable tensors."""

    hidden: torch.Tensor
    residual: torch.Tensor | None

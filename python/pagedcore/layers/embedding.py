"""The token embedding table; with tied embeddings it is also the LM head's weight.

Dense (one float dtype, [vocab, hidden]) or, for a GGUF served as stored, the file's block rows
(uint8 [vocab, row_bytes], e.g. Q8_0: most of the default model's bytes). Blocked rows are decoded
on lookup (only the rows of this step's tokens), and the tied LM head runs the quantized linear
kernel over the same bytes: no float copy of the table exists.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.layers.linear import KernelBinding
from pagedcore.layers.weights import CheckpointTensor, copy_weight
from pagedcore.ops import linear as linear_ops


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dtype = dtype  # of the looked-up rows (the activations)
        # Left uninitialised: the checkpoint fills it (see linear.py).
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype),  # [vocab, hidden]
                                   requires_grad=False)
        self.block_format: str | None = None  # "q8_0", ... when the rows are GGUF blocks
        self._ggml_type = None
        self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32)  # dense tied head
        self._quant_kernel = None  # blocked tied head: QuantLinearKernel over self.weight
        self._quant_kernel_x_dtype = None

    def load_weight(self, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        """Fills the table: GGUF blocks are kept when the loader offers them (block_format), else
        the values are converted into the dense [vocab, hidden] parameter."""
        block_format = getattr(loaded, "block_format", None)
        if block_format is None:
            copy_weight(self.weight.data, loaded, name)
            return
        if tuple(loaded.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(loaded.shape)}; the config implies "
                             f"{(self.vocab_size, self.hidden_size)}")
        self.weight.data = loaded.block_rows()  # uint8 [vocab, row_bytes]
        self.block_format = block_format
        self._ggml_type = loaded.ggml_type
        self._quant_kernel = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 [num_tokens] -> [num_tokens, hidden], a new tensor (safe to modify in place)."""
        if self.block_format is None:
            return F.embedding(input_ids, self.weight)
        from pagedcore.loader.gguf_dequant import dequantize_rows  # (the loader package imports layers)

        if self.block_format.endswith("x16"):  # repacked for the tied head: gather the rows' bytes back
            from pagedcore.ops.quant_repack import gather_rows_x16

            rows = gather_rows_x16(self.weight, input_ids, self.block_format, self.hidden_size)
        else:
            rows = self.weight.index_select(0, input_ids)  # uint8 [num_tokens, row_bytes]
        return dequantize_rows(rows, self._ggml_type).to(self.dtype)  # [num_tokens, hidden]

    def process_weights_after_loading(self) -> None:
        """A blocked table repacks into 16-row groups where the CPU has the x16 kernel (as quantized
        linear layers do): the tied LM head's logits are the model's largest product at every batch
        size, and lookups gather their rows' bytes back (ops/quant_repack.py). Same bytes."""
        if self.block_format is None or os.environ.get("PAGEDCORE_QUANT_REPACK", "1") == "0":
            return
        from pagedcore.ops.quant_repack import repack_x16, repackable

        repacked = repackable(self.block_format, self.vocab_size)
        if repacked is not None:
            self.weight.data = repack_x16(self.weight.data, self.block_format, self.hidden_size)
            self.block_format, self._quant_kernel = repacked, None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied LM head: hidden [num_rows, hidden] -> fp32 logits [num_rows, vocab]."""
        if self.block_format is not None:
            kernel = self._quant_kernel
            if kernel is None or not kernel.matches(self.weight) or hidden.dtype is not self._quant_kernel_x_dtype:
                from pagedcore.ops.quant_linear import QuantLinearKernel

                kernel = self._quant_kernel = QuantLinearKernel(
                    self.weight, self.block_format, self.hidden_size, x_dtype=hidden.dtype, out_dtype=torch.float32)
                self._quant_kernel_x_dtype = hidden.dtype
            return kernel(hidden.contiguous())
        if self._logits_kernel.takes(hidden):
            return self._logits_kernel(hidden, self.weight, None)
        return linear_ops.torch_linear(hidden, self.weight, None).float()

    def weight_bytes(self) -> dict[str, int]:
        """Resident bytes of the table by format."""
        fmt = self.block_format.removesuffix("x16") if self.block_format else str(self.weight.dtype).removeprefix("torch.")
        return {fmt: self.weight.nbytes}  # a repacked table holds its file format's bytes


class VocabParallelEmbedding(VocabEmbedding):
    """This tensor-parallel rank's rows [vocab_start, vocab_end) of the table (dense only). A lookup
    finds the tokens in its range, zeroes the others' rows, and one all_reduce adds the ranks'
    results: each token's row comes from exactly one rank, plus zeros, so the sum is exact. As the
    tied LM head it gives the logits of its vocabulary columns only (the driver joins the slices)."""

    def __init__(self, vocab_start: int, vocab_end: int, hidden_size: int, dtype: torch.dtype, comm):
        super().__init__(vocab_end - vocab_start, hidden_size, dtype)
        self.vocab_start = vocab_start
        self.vocab_end = vocab_end
        self.comm = comm  # distributed.communicator.Communicator of this stage's tensor-parallel group

    def load_weight(self, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        if getattr(loaded, "block_format", None) is not None:
            raise ValueError(f"checkpoint tensor {name!r}: tensor parallelism shards dense tables only; "
                             "load the model with --dtype float32|bfloat16")
        copy_weight(self.weight.data, loaded, name)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 [num_tokens] (global ids) -> [num_tokens, hidden], summed over the ranks."""
        local_ids = input_ids - self.vocab_start  # [num_tokens]
        outside = (local_ids < 0) | (local_ids >= self.vocab_size)  # bool [num_tokens]: another rank's
        hidden = F.embedding(local_ids.masked_fill_(outside, 0), self.weight)  # [num_tokens, hidden]
        hidden.masked_fill_(outside.unsqueeze(1), 0)
        self.comm.all_reduce(hidden)
        return hidden

    def extra_repr(self) -> str:
        return f"vocab=[{self.vocab_start}, {self.vocab_end}), hidden={self.hidden_size}"

"""The token embedding table; with tied embeddings it is also the LM head's weight.

Dense (one float dtype, [vocab, hidden]) or, for a GGUF served as stored, the file's block rows
(uint8 [vocab, row_bytes], e.g. Q8_0: most of the default model's bytes). Blocked rows are decoded
on lookup (only the rows of this step's tokens), and the tied LM head runs the quantized linear
kernel over the same bytes: no float copy of the table exists.

A dense table that is also the tied LM head is repacked into its x16 layout where dense layers are
(ops/dense_repack.py: AVX512-BF16 CPUs by default): the head then runs the x16 kernel like every
other linear, and the table is held once, as an X16Weight. Lookups of every held layout (dense,
GGUF blocks incl. the k-quants, their x16 repacks) are decoded in C++ from the bytes as held
(ops/embedding_rows.py); a decode step's lookup through torch ops cost more than its one row is worth.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.layers.held_weights import source_dtype
from pagedcore.layers.linear import KernelBinding
from pagedcore.layers.linear_quant import QUANT_MAX_ROWS
from pagedcore.layers.weights import CheckpointTensor, copy_weight
from pagedcore.ops import dense_repack
from pagedcore.ops import linear as linear_ops
from pagedcore.ops.dense_repack import X16_FORMATS, X16Weight
from pagedcore.ops.embedding_rows import decodes, embedding_rows


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, keep_16bit: bool = False):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dtype = dtype  # of the looked-up rows (the activations)
        # A bf16 or fp16 table under fp32 activations (a GGUF's F16 / BF16 token_embd, a GPTQ / AWQ checkpoint's,
        # a 16-bit HF checkpoint run in float32) is held as stored (half the bytes; lookups widen rows exactly, the
        # tied head's kernel widens the weights: the same values).
        self.keep_16bit = keep_16bit and dtype is torch.float32
        # Left uninitialised: the checkpoint fills it (see linear.py).
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype),  # [vocab, hidden]
                                   requires_grad=False)
        self.block_format: str | None = None  # "q8_0", ... when the rows are GGUF blocks
        self._ggml_type = None
        self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32)  # dense tied head
        self._quant_kernel = None  # blocked tied head: QuantLinearKernel over self.weight
        self._quant_kernel_x_dtype = None
        self.tied_head = False  # set by the model when this table is also its LM head (repacked then)

    def load_weight(self, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        """Fills the table: GGUF blocks are kept when the loader offers them (block_format), else
        the values are converted into the dense [vocab, hidden] parameter."""
        if type(self.weight) is X16Weight:  # a reload after processing: the checkpoint layout again
            self.weight = nn.Parameter(self.weight.unpacked().contiguous(), requires_grad=False)
            self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32)
        block_format = getattr(loaded, "block_format", None)
        if block_format is None:
            if self.keep_16bit:  # held as stored if 16-bit, else (a reload of other values too) in self.dtype
                held = source_dtype(loaded)
                want = held if held in (torch.bfloat16, torch.float16) else self.dtype
                if self.weight.dtype is not want:
                    self.weight = nn.Parameter(torch.empty_like(self.weight, dtype=want), requires_grad=False)
                    self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32)
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
        held = self._held_format()
        if held is not None and input_ids.is_cpu and decodes(held):  # C++: only these rows' bytes are read
            table = self.weight.packed if type(self.weight) is X16Weight else self.weight
            return embedding_rows(table, held, input_ids, self.hidden_size, self.dtype)
        if self.block_format is None:
            return F.embedding(input_ids, self.weight).to(self.dtype)
        from pagedcore.loader.gguf_dequant import dequantize_rows  # (the loader package imports layers)

        if self.block_format.endswith("x16"):  # repacked for the tied head: gather the rows' bytes back
            from pagedcore.ops.quant_repack import gather_rows_x16

            rows = gather_rows_x16(self.weight, input_ids, self.block_format, self.hidden_size)
        else:
            rows = self.weight.index_select(0, input_ids)  # uint8 [num_tokens, row_bytes]
        return dequantize_rows(rows, self._ggml_type).to(self.dtype)  # [num_tokens, hidden]

    def _held_format(self) -> str | None:
        """The layout the table's bytes are in (a block format, "f32x16"/"bf16x16"/"f16x16", or the dense
        dtype's name), or None for a table not on the CPU / of another dtype (F.embedding's)."""
        if self.block_format is not None:
            return self.block_format
        weight = self.weight
        if type(weight) is X16Weight:
            if weight.packed is not None:
                return X16_FORMATS[weight.dtype]
            self.weight = nn.Parameter(weight.plain, requires_grad=False)  # .data = t since: hold t
            self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32)
            weight = self.weight
        if weight.is_cpu and weight.dtype in (self.dtype, torch.bfloat16, torch.float16) and weight.is_contiguous():
            return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(weight.dtype)
        return None

    def process_weights_after_loading(self) -> None:
        """A blocked table repacks into 16-row groups where the CPU has the x16 kernel (as quantized
        linear layers do): the tied LM head's logits are the model's largest product at every batch
        size, and lookups gather their rows' bytes back (ops/quant_repack.py). Same bytes.
        A dense table that is the tied head repacks where dense layers do (dense_repack_enabled),
        held once as an X16Weight; the head then runs the x16 kernel."""
        if self.block_format is None:
            weight = self.weight
            if (self.tied_head and type(weight) is not X16Weight and weight.is_cpu
                    and dense_repack.dense_repack_enabled(weight.dtype) and not dense_repack.x16_problem(weight)):
                self.weight = nn.Parameter(X16Weight.of(weight.data), requires_grad=False)
                self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32, x16=True)
            return
        if os.environ.get("PAGEDCORE_QUANT_REPACK", "1") == "0":
            return
        from pagedcore.ops.quant_repack import repack_x16, repackable

        repacked = repackable(self.block_format, self.vocab_size)
        if repacked is not None:
            self.weight.data = repack_x16(self.weight.data, self.block_format, self.hidden_size)
            self.block_format, self._quant_kernel = repacked, None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied LM head: hidden [num_rows, hidden] -> fp32 logits [num_rows, vocab]."""
        if self.block_format is not None:
            return self._blocked_head(hidden.dtype)(hidden.contiguous())
        held = self._held_format()
        binding = self._dense_head_binding(held)
        if binding.takes(hidden):
            return binding(hidden, self.weight.packed if binding.x16 else self.weight, None)
        return linear_ops.torch_linear(hidden, self.weight, None).float()

    def head_kernel(self, x_dtype: torch.dtype):
        """(the kernel binding logits() runs for x of x_dtype, the most rows it takes in one call), or
        None where logits() calls torch (models/greedy_decode.py runs the head through it)."""
        if self.block_format is not None:
            return self._blocked_head(x_dtype), QUANT_MAX_ROWS
        held = self._held_format()
        if held is None or x_dtype not in (self.weight.dtype, self.dtype):  # (a kept 16-bit table: fp32 x)
            return None
        binding = self._dense_head_binding(held)
        return binding.bound(self.weight.packed if binding.x16 else self.weight, None, x_dtype), binding.max_rows

    def _blocked_head(self, x_dtype: torch.dtype):
        """The QuantLinearKernel over the table's blocks for x of x_dtype (built again when either changed)."""
        kernel = self._quant_kernel
        if kernel is None or not kernel.matches(self.weight) or x_dtype is not self._quant_kernel_x_dtype:
            from pagedcore.ops.quant_linear import QuantLinearKernel

            kernel = self._quant_kernel = QuantLinearKernel(
                self.weight, self.block_format, self.hidden_size, x_dtype=x_dtype, out_dtype=torch.float32)
            self._quant_kernel_x_dtype = x_dtype
        return kernel

    def _dense_head_binding(self, held: str | None) -> KernelBinding:
        """The dense head's KernelBinding for the table as held (rebound if it was repacked or replaced)."""
        x16 = held in X16_FORMATS.values()
        if self._logits_kernel.x16 != x16:
            self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32, x16=x16)
        return self._logits_kernel

    def widen_held_table(self) -> None:
        """A bf16 / fp16 table held as stored under fp32 activations (keep_16bit) becomes fp32, the same values
        (for a move to a GPU, whose lookups and tied head take one dtype). No-op otherwise."""
        if self.block_format is not None or self.weight.dtype not in (torch.bfloat16, torch.float16) or (
                self.dtype is not torch.float32):
            return
        values = self.weight.unpacked() if type(self.weight) is X16Weight else self.weight.data  # [vocab, hidden]
        self.weight = nn.Parameter(values.float().contiguous(), requires_grad=False)
        self._logits_kernel = KernelBinding(self.weight, out_dtype=torch.float32)

    def weight_bytes(self) -> dict[str, int]:
        """Resident bytes of the table by format."""
        fmt = self.block_format.removesuffix("x16") if self.block_format else str(self.weight.dtype).removeprefix("torch.")
        # (an X16Weight's nbytes are W's: the packed layout holds the same bytes)
        return {fmt: self.weight.nbytes}  # a repacked table holds its file format's bytes


class VocabParallelEmbedding(VocabEmbedding):
    """This tensor-parallel rank's rows [vocab_start, vocab_end) of the table: dense, or a GGUF's block rows kept
    as stored (the rank's rows of blocks, repacked for its tied head as the whole table would be). A lookup
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
            super().load_weight(param_name, loaded, name)  # the rank's block rows, kept
            return
        copy_weight(self.weight.data, loaded, name)

    def process_weights_after_loading(self) -> None:
        """A dense slice stays in the checkpoint layout (its lookups mask and all-reduce); block rows repack as
        the whole table's do (the tied head's kernel; lookups decode from the repacked bytes)."""
        if self.block_format is not None:
            super().process_weights_after_loading()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 [num_tokens] (global ids) -> [num_tokens, hidden], summed over the ranks."""
        local_ids = input_ids - self.vocab_start  # [num_tokens]
        outside = (local_ids < 0) | (local_ids >= self.vocab_size)  # bool [num_tokens]: another rank's
        local_ids.masked_fill_(outside, 0)
        hidden = (super().forward(local_ids) if self.block_format is not None  # [num_tokens, hidden]
                  else F.embedding(local_ids, self.weight))
        hidden.masked_fill_(outside.unsqueeze(1), 0)
        self.comm.all_reduce(hidden)
        return hidden

    def extra_repr(self) -> str:
        return f"vocab=[{self.vocab_start}, {self.vocab_end}), hidden={self.hidden_size}"

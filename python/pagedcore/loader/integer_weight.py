"""A pre-quantized checkpoint's linear weight as the integers it stores, before it becomes what the
kernels run: GPTQ / AWQ (gptq_awq_checkpoint.py) and compressed-tensors (compressed_tensors_checkpoint.py)
unpack their tensors into one of these, so the conversion to kernel formats lives in one place.

    GroupedIntWeight   W[n, k] = scale[n, g] * (q[n, k] - zero[n, g]),  g = group[k];  q unsigned b-bit
        4 bits, every zero 8   -> Q4_0 blocks  d = scale, W = d (q - 8)                      exact
        4 bits, other zeros    -> Q4_1 blocks  d = scale, m = -scale * zero rounded to fp16   (see below)
        8 bits, every zero 128 -> Q8_0 blocks  d = scale, qs = q - 128 (int8)                 exact
    ChannelInt8Weight  W[n, k] = scale[n] * q[n, k],  q int8  -> int8_per_channel (W8A8 kernel)  exact

A GGUF block is 32 inputs with one scale, so groups must be runs of whole blocks: a group size that is a
multiple of 32, or (act order: g_idx scatters a group over K) groups of multiples of 32 inputs, which are
sorted by group once at load (`input_perm`, stable) while the layer gathers x[:, input_perm] before its
kernel. Q4_1's m = -scale * zero is rounded to fp16: off by at most 2^-11 |scale * zero| <= 15/2048 scale,
under 0.75% of one quantization step. Scales are rounded to fp16 (a block's d): exact for fp16 scales and
for bf16 / fp32 ones that fp16 holds (normal fp16 range, <= 11 significant bits).
"""

from __future__ import annotations

import torch

from pagedcore.loader.errors import ModelLoadError

BLOCK = 32  # weights per GGUF block, along the input dim
_SYMMETRIC_ZERO = {4: 8, 8: 128}  # the zero point of a symmetric b-bit weight stored unsigned


class GroupedIntWeight:
    """One linear weight [N, K] of unsigned b-bit integers (b = 4 or 8) in groups along K (a LazyWeight for
    the layers): block_rows() gives its GGUF blocks (inputs in input_perm's order when it is not None),
    load_into the exact dequantised values (fp32, the checkpoint's input order; slices go through it)."""

    def __init__(self, name: str, bits: int, q: torch.Tensor, group: torch.Tensor, zeros: torch.Tensor,
                 scales: torch.Tensor, input_perm: torch.Tensor | None = None, block_format: str | None = None):
        # q [N, K] and group int64 [K] in input_perm's order; zeros [N, G]; scales [N, G]. block_format: a cut
        # keeps its whole weight's (a slice of an asymmetric weight may hold only zeros of 8: still Q4_1)
        N, K = q.shape
        if K % BLOCK:
            raise ModelLoadError(f"{name}: {K} inputs; the block kernels need a multiple of {BLOCK}")
        if not bool((group.view(-1, BLOCK) == group.view(-1, BLOCK)[:, :1]).all()):
            raise ModelLoadError(f"{name}: groups whose sizes are not multiples of {BLOCK}, so a block of 32 inputs "
                                 "would mix two scales; use a checkpoint quantized with groups of 32, 64, 128... "
                                 "(without act order), or the model's GGUF")
        self.shape = (N, K)
        self.bits = bits
        self.input_perm = input_perm
        self._name = name
        self._q = q.to(torch.uint8).contiguous()
        self._group = group.to(torch.int64)
        self._zeros = zeros.to(torch.int16).contiguous()
        self._scales = scales.to(torch.float32).contiguous()
        symmetric = bool((self._zeros == _SYMMETRIC_ZERO[bits]).all())
        if bits == 8 and not symmetric:
            raise ModelLoadError(f"{name}: asymmetric 8-bit weights (zero points other than 128); the Q8_0 "
                                 "kernels hold symmetric ones: use a symmetric (sym=True) 8-bit checkpoint, a "
                                 "4-bit one, or the model's GGUF")
        self.block_format = block_format or {4: "q4_0" if symmetric else "q4_1", 8: "q8_0"}[bits]

    def narrow(self, dim: int, start: int, length: int) -> GroupedIntWeight:
        """A tensor-parallel rank's cut, in the checkpoint's input order: output rows [start, start + length) with
        their groups' scales and zeros (dim 0), or those inputs of every row (dim 1), which must be whole blocks of
        32: the rank's blocks are then the one-process layer's blocks there (act order: the inputs of the range,
        kept in their sorted order, must still make whole blocks of one group). ValueError otherwise."""
        if dim == 0:
            return GroupedIntWeight(self._name, self.bits, self._q[start:start + length], self._group,
                                    self._zeros[start:start + length], self._scales[start:start + length],
                                    self.input_perm, self.block_format)
        if dim != 1:
            raise ValueError(f"{self._name}: a linear weight is cut along dim 0 or 1, not {dim}")
        if self.input_perm is None:
            if start % BLOCK or length % BLOCK:
                raise ValueError(f"{self._name}: tensor parallelism would cut its inputs at [{start}, "
                                 f"{start + length}), inside a block of {BLOCK}; choose a --tensor-parallel-size "
                                 "that cuts the heads and the intermediate size on multiples of 32")
            return GroupedIntWeight(self._name, self.bits, self._q[:, start:start + length],
                                    self._group[start:start + length], self._zeros, self._scales,
                                    block_format=self.block_format)
        inside = (self.input_perm >= start) & (self.input_perm < start + length)  # bool [K], sorted order
        positions = inside.nonzero().squeeze(1)  # int64 [length]: the range's inputs, still sorted by group
        try:
            return GroupedIntWeight(self._name, self.bits, self._q[:, positions], self._group[positions],
                                    self._zeros, self._scales, self.input_perm[positions] - start, self.block_format)
        except ModelLoadError as error:
            raise ValueError(f"{self._name}: act order (g_idx) leaves this tensor-parallel rank's inputs "
                             f"[{start}, {start + length}) in groups that are not whole blocks of {BLOCK} ({error}); "
                             "run it with --tensor-parallel-size 1 or use a checkpoint without act order") from None

    def dequantized(self) -> torch.Tensor:
        """fp32 [N, K]: scale * (q - zero), the checkpoint's own formula, in its input order."""
        values = self._scales[:, self._group] * (self._q.to(torch.float32)
                                                 - self._zeros[:, self._group].to(torch.float32))
        if self.input_perm is None:
            return values
        unsorted = torch.empty_like(values)
        unsorted[:, self.input_perm] = values
        return unsorted

    def load_into(self, out: torch.Tensor) -> None:
        out.copy_(self.dequantized())

    def block_rows(self) -> torch.Tensor:
        """uint8 [N, row_bytes]: GGUF Q4_0 (d, qs), Q4_1 (d, m, qs) or Q8_0 (d, qs) blocks of 32 inputs,
        little-endian fp16 fields, as ggml lays them out."""
        N, K = self.shape
        nb = K // BLOCK
        group = self._group[::BLOCK]  # [nb]: each block's group (one per block, checked above)
        d = self._scales[:, group].to(torch.float16)  # [N, nb]
        q = self._q.view(N, nb, BLOCK)
        if self.block_format == "q8_0":
            qs = (q.to(torch.int16) - 128).to(torch.int8).view(torch.uint8)  # [N, nb, 32]: q - 128 as int8 bytes
            return torch.cat([_fp16_bytes(d), qs], dim=-1).reshape(N, -1).contiguous()
        qs = q[..., :16] | (q[..., 16:] << 4)  # [N, nb, 16]: byte j = q[j] | q[j + 16] << 4, as ggml
        fields = [_fp16_bytes(d)]
        if self.block_format == "q4_1":
            m = (-(self._scales[:, group] * self._zeros[:, group].to(torch.float32))).to(torch.float16)  # [N, nb]
            if not bool(torch.isfinite(m).all()):
                raise ModelLoadError(f"{self._name}: scale * zero overflows fp16 (a scale above ~4096); "
                                     "this checkpoint cannot run on the Q4 block kernels")
            fields.append(_fp16_bytes(m))
        return torch.cat([*fields, qs], dim=-1).reshape(N, -1).contiguous()


class ChannelInt8Weight:
    """One linear weight [N, K] of int8 with one scale per output row, run as the int8_per_channel (W8A8)
    layer runs it: int8_rows() are the kernel's operands as stored."""

    block_format = None  # not GGUF blocks: QuantLinearMethod takes int8_rows()

    def __init__(self, name: str, values: torch.Tensor, scales: torch.Tensor):
        N = values.shape[0]
        if values.dtype != torch.int8 or values.dim() != 2:
            raise ModelLoadError(f"{name}: an int8 [out, in] weight was expected, got {values.dtype} "
                                 f"{tuple(values.shape)}")
        if scales.numel() != N:  # (a tensor-strategy scale is broadcast to the rows by the caller)
            raise ModelLoadError(f"{name}: weight_scale has {scales.numel()} values for {N} output rows")
        self.shape = tuple(values.shape)
        self.input_perm = None
        self._name = name
        self._values = values.contiguous()  # int8 [N, K]
        self._scales = scales.reshape(N).to(torch.float32).contiguous()  # fp32 [N]

    def narrow(self, dim: int, start: int, length: int) -> ChannelInt8Weight:
        """A tensor-parallel rank's cut: output rows with their scales (dim 0), or those inputs of every row, each
        row keeping its scale (dim 1): the values and scales the one-process layer holds there."""
        if dim not in (0, 1):
            raise ValueError(f"{self._name}: a linear weight is cut along dim 0 or 1, not {dim}")
        scales = self._scales.narrow(0, start, length) if dim == 0 else self._scales
        return ChannelInt8Weight(self._name, self._values.narrow(dim, start, length), scales)

    def int8_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._values, self._scales

    def dequantized(self) -> torch.Tensor:
        return self._values.to(torch.float32) * self._scales[:, None]

    def load_into(self, out: torch.Tensor) -> None:
        out.copy_(self.dequantized())


def sorted_by_group(name: str, g_idx: torch.Tensor, K: int, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An act-order layer's (input_perm int64 [K], group int64 [K] in that order): inputs sorted by group,
    stably, so each group is a run (GroupedIntWeight checks the runs are whole blocks)."""
    g_idx = g_idx.to(torch.int64).reshape(-1)
    if g_idx.numel() != K or int(g_idx.min()) < 0 or int(g_idx.max()) >= num_groups:
        raise ModelLoadError(f"{name}: g_idx has {g_idx.numel()} entries in {int(g_idx.min())}.."
                             f"{int(g_idx.max())}; expected {K} group indices below {num_groups}")
    input_perm = torch.argsort(g_idx, stable=True)
    return input_perm, g_idx[input_perm]


def _fp16_bytes(values: torch.Tensor) -> torch.Tensor:
    """fp16 [N, nb] -> uint8 [N, nb, 2], little-endian (GGUF's byte order on x86 and ARM)."""
    return values.contiguous().view(torch.uint8).view(*values.shape, 2)

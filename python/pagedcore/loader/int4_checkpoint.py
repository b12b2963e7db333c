"""4-bit GPTQ and AWQ checkpoints (an HF folder whose config.json has a quantization_config) loaded into
the GGUF 4-bit block kernels and kept quantized: each layer's packed integers become Q4_0 or Q4_1 blocks
once, at load, and run on the same x16 kernels as a GGUF file (layers/linear_quant.py).

What the checkpoints hold for a linear layer y = x W^T, W [N, K] (N outputs, K inputs, G groups of
`group_size` inputs, each group one scale and one zero point per output):

    GPTQ  qweight int32 [K/8, N]  nibble j (bits 4j..4j+3) of [i, n] is q[8i + j, n]
          qzeros  int32 [G, N/8]  nibble j of [g, c] is the zero of output 8c + j; checkpoint_format
                                  "gptq" (AutoGPTQ's, the default) stores zero - 1, "gptq_v2" the zero
          scales  fp16 [G, N];  g_idx int32 [K], the group of input k (k // group_size unless desc_act)
          W[n, k] = scales[g, n] * (q[k, n] - zero[g, n]),  g = g_idx[k]
    AWQ   qweight int32 [K, N/8]  nibble i of [k, c] is q[k, 8c + order[i]], order = [0 2 4 6 1 3 5 7]
          qzeros  int32 [G, N/8]  packed the same way;  scales fp16 [G, N]
          W[n, k] = scales[k // group_size, n] * (q[k, n] - zero[k // group_size, n])

Each run of 32 inputs (group_size is a multiple of 32, so a run has one scale and one zero) becomes a
GGUF block of 32 weights along K:
    a layer whose zeros are all 8 (GPTQ sym=True)  Q4_0  d = scale, W = d (q - 8): exact
    any other layer (AWQ, GPTQ sym=False)           Q4_1  d = scale, m = -scale * zero rounded to fp16,
        W = d q + m: off by at most 2^-11 |scale * zero| <= 15/2048 scale, under 0.75% of one
        quantization step (fp16 scales are kept exactly; other scale dtypes are rounded to fp16)
Act-order GPTQ (desc_act=True: g_idx is not k // group_size, a group's inputs are scattered over K): the
inputs are sorted by group once at load (input_perm, stable), so every group is a run of whole blocks, and
the layer gathers x[:, input_perm] before its kernel (layers/linear_quant.py; the C++ decoder stack does
the same gather). A fused layer's shards (q/k/v, gate/up share their input, so GPTQ gives them one order)
must agree. Refused with the reason and the fix: bits other than 4, a group_size
that is not a multiple of 32 (or -1), groups whose sizes are not multiples of 32, AWQ's GEMV packing,
AWQ without zero points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from pagedcore.loader.errors import ModelLoadError

INT4_METHODS = ("gptq", "awq")
_BLOCK = 32  # weights per GGUF block, along the input dim
_NIBBLE_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # [8]: nibble j at bits 4j
_AWQ_COLUMN_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]  # column j of an AWQ int32 sits in this nibble
_PARTS = ("qweight", "qzeros", "scales", "g_idx")


@dataclasses.dataclass(frozen=True)
class Int4Scheme:
    method: str  # "gptq" | "awq"
    group_size: int  # inputs per (scale, zero) group; -1: one group per output row
    sym: bool  # GPTQ sym=True: every zero is 8 (such layers become Q4_0)
    zero_minus_one: bool  # GPTQ checkpoint_format "gptq": qzeros hold zero - 1


def int4_scheme(quantization_config: dict[str, Any] | None, path: str) -> Int4Scheme | None:
    """The scheme of a config.json's quantization_config (None when it has none); a method or variant the
    block kernels cannot run is refused with what is supported."""
    if not quantization_config:
        return None
    qc = quantization_config
    method = str(qc.get("quant_method", "unknown")).lower()
    if method not in INT4_METHODS:
        raise ModelLoadError(f"{path} is a pre-quantized {method!r} checkpoint; pagedcore loads 4-bit GPTQ and AWQ "
                             "checkpoints (quant_method 'gptq' / 'awq'), serves GGUF files as stored (Q8_0, Q4_0, "
                             "Q4_1, Q4_K, Q5_K, Q6_K) and quantizes dense checkpoints at load with --quantization "
                             "int8_per_channel: use the model's GGUF, GPTQ/AWQ or unquantized checkpoint")
    bits = qc.get("bits", qc.get("w_bit"))
    group_size = qc.get("group_size", qc.get("q_group_size", 128))
    if bits != 4:
        raise ModelLoadError(f"{path}: {method} with bits={bits}; pagedcore runs 4-bit {method} weights only "
                             "(its Q4 block kernels); use a 4-bit checkpoint or the model's GGUF")
    if not isinstance(group_size, int) or not (group_size == -1 or (group_size > 0 and group_size % _BLOCK == 0)):
        raise ModelLoadError(f"{path}: {method} group_size={group_size!r}; the block kernels need groups of a "
                             f"multiple of {_BLOCK} inputs (32, 64, 128, ...) or -1 (one group a row)")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ModelLoadError(f"{path}: AWQ version {version!r}; pagedcore reads the GEMM packing (AutoAWQ's "
                                 "default, version 'gemm'), not GEMV's: re-save the model with version='gemm'")
        if not qc.get("zero_point", True):
            raise ModelLoadError(f"{path}: AWQ with zero_point=false is not supported; use a checkpoint quantized "
                                 "with zero points (AutoAWQ's default)")
        return Int4Scheme("awq", group_size, sym=False, zero_minus_one=False)
    checkpoint_format = str(qc.get("checkpoint_format", "gptq")).lower()
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ModelLoadError(f"{path}: GPTQ checkpoint_format {checkpoint_format!r}; pagedcore reads 'gptq' "
                             "(AutoGPTQ's) and 'gptq_v2'")
    return Int4Scheme("gptq", group_size, sym=bool(qc.get("sym", True)),
                      zero_minus_one=checkpoint_format == "gptq")


class Int4Weight:
    """One GPTQ / AWQ linear weight [N, K] (a LazyWeight): block_rows() gives its GGUF blocks for a
    quantized layer to keep (inputs in input_perm's order when it is not None); load_into gives the exact
    dequantised values (fp32, the checkpoint's input order; a slice goes through it, shard_weights.py)."""

    def __init__(self, name: str, scheme: Int4Scheme, parts: dict[str, torch.Tensor]):
        # q uint8 [N, K] and group int64 [K] in input_perm's order; zeros int16 [N, G]; scales fp32 [N, G]
        q, group, zeros, scales, self.input_perm = _unpack(name, scheme, parts)
        self.shape = tuple(q.shape)
        self._name = name
        self._q, self._group, self._zeros, self._scales = q, group, zeros, scales
        # Q4_0 when every zero is 8 (exact); otherwise Q4_1, whose m = -scale * zero is fp16.
        self.block_format = "q4_0" if scheme.sym and bool((zeros == 8).all()) else "q4_1"

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
        """uint8 [N, row_bytes]: GGUF Q4_0 (d, qs) or Q4_1 (d, m, qs) blocks of 32 inputs, little-endian fp16."""
        N, K = self.shape
        nb = K // _BLOCK
        group = self._group[::_BLOCK]  # [nb]: each block's group (one per block, checked at unpacking)
        d = self._scales[:, group].to(torch.float16)  # [N, nb]
        q = self._q.view(N, nb, _BLOCK)
        qs = q[..., :16] | (q[..., 16:] << 4)  # [N, nb, 16]: byte j = q[j] | q[j + 16] << 4, as ggml
        fields = [_fp16_bytes(d)]
        if self.block_format == "q4_1":
            m = (-(self._scales[:, group] * self._zeros[:, group].to(torch.float32))).to(torch.float16)  # [N, nb]
            if not bool(torch.isfinite(m).all()):
                raise ModelLoadError(f"{self._name}: scale * zero overflows fp16 (a scale above ~4096); "
                                     "this checkpoint cannot run on the Q4 block kernels")
            fields.append(_fp16_bytes(m))
        return torch.cat([*fields, qs], dim=-1).reshape(N, -1).contiguous()


def _fp16_bytes(values: torch.Tensor) -> torch.Tensor:
    """fp16 [N, nb] -> uint8 [N, nb, 2], little-endian (GGUF's byte order on x86 and ARM)."""
    return values.contiguous().view(torch.uint8).view(*values.shape, 2)


def _unpack(name: str, scheme: Int4Scheme, parts: dict[str, torch.Tensor]):
    """(q uint8 [N, K], group int64 [K], zeros int16 [N, G], scales fp32 [N, G], input_perm int64 [K] or None)
    of one layer's packed tensors; with act order, q's inputs and group are in input_perm's order."""
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ModelLoadError(f"{name}: qweight / qzeros are {qweight.dtype} / {qzeros.dtype}, not int32 "
                             f"({scheme.method} packs 8 nibbles in each int32)")
    nibbles = (qweight.unsqueeze(-1) >> _NIBBLE_SHIFTS) & 15  # [rows, cols, 8]
    zero_nibbles = (qzeros.unsqueeze(-1) >> _NIBBLE_SHIFTS) & 15  # [G, N/8, 8]
    if scheme.method == "gptq":
        K, N = qweight.shape[0] * 8, qweight.shape[1]
        q = nibbles.permute(1, 0, 2).reshape(N, K)  # row n: inputs 8i + j in order
        zeros = zero_nibbles.reshape(qzeros.shape[0], -1)  # [G, N]
        if scheme.zero_minus_one:
            zeros = zeros + 1  # AutoGPTQ stores zero - 1 (so a stored 15 is a zero of 16)
    else:
        K, N = qweight.shape[0], qweight.shape[1] * 8
        q = nibbles[..., _AWQ_COLUMN_NIBBLE].reshape(K, N).t()  # [N, K]
        zeros = zero_nibbles[..., _AWQ_COLUMN_NIBBLE].reshape(qzeros.shape[0], -1)  # [G, N]
    group_size = scheme.group_size if scheme.group_size > 0 else K
    G = -(-K // group_size)
    if K % _BLOCK:
        raise ModelLoadError(f"{name}: {K} inputs; the Q4 block kernels need a multiple of {_BLOCK}")
    if tuple(scales.shape) != (G, N) or tuple(zeros.shape) != (G, N):
        raise ModelLoadError(f"{name}: scales {tuple(scales.shape)} / qzeros {tuple(qzeros.shape)} do not match "
                             f"qweight {tuple(qweight.shape)} with group_size {scheme.group_size} ({G} groups)")
    group = torch.arange(K) // group_size  # [K]: the group of each input
    g_idx = parts.get("g_idx")
    input_perm = None
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64).reshape(-1), group):
        g_idx = g_idx.to(torch.int64).reshape(-1)
        if g_idx.numel() != K or int(g_idx.min()) < 0 or int(g_idx.max()) >= G:
            raise ModelLoadError(f"{name}: g_idx has {g_idx.numel()} entries in {int(g_idx.min())}.."
                                 f"{int(g_idx.max())}; expected {K} group indices below {G}")
        input_perm = torch.argsort(g_idx, stable=True)  # [K]: inputs sorted by group (act order undone)
        group = g_idx[input_perm]
        if not bool((group.view(-1, _BLOCK) == group.view(-1, _BLOCK)[:, :1]).all()):
            raise ModelLoadError(f"{name}: act-order groups whose sizes are not multiples of {_BLOCK}, so a "
                                 "block of 32 sorted inputs would mix two scales; use a checkpoint quantized "
                                 "with desc_act=False, or the model's GGUF")
        q = q[:, input_perm]
    return (q.to(torch.uint8).contiguous(), group, zeros.t().to(torch.int16).contiguous(),
            scales.t().to(torch.float32).contiguous(), input_perm)


def int4_weights(weights: Iterator[tuple[str, Any]], scheme: Int4Scheme, path: str) -> Iterator[tuple[str, Any]]:
    """The checkpoint's (name, tensor) stream with each layer's qweight / qzeros / scales / g_idx replaced
    by one (prefix + ".weight", Int4Weight); other tensors (norms, embeddings, an unquantized lm_head,
    biases) pass through. A layer is emitted once its tensors have all arrived (they may span shards)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = {"qweight", "qzeros", "scales"} | ({"g_idx"} if scheme.method == "gptq" else set())
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in _PARTS:
            yield name, tensor
            continue
        got = pending.setdefault(prefix, {})
        got[part] = tensor if isinstance(tensor, torch.Tensor) else _materialize(tensor)
        if needed <= got.keys():
            yield prefix + ".weight", Int4Weight(prefix, scheme, pending.pop(prefix))
    for prefix, got in pending.items():  # a GPTQ layer saved without g_idx (its groups are then k // size)
        missing = sorted({"qweight", "qzeros", "scales"} - got.keys())
        if missing:
            raise ModelLoadError(f"{path}: {prefix} has {sorted(got)} but not {missing}; the checkpoint is "
                                 "incomplete or not a 4-bit GPTQ/AWQ one")
        yield prefix + ".weight", Int4Weight(prefix, scheme, got)


def _materialize(weight: Any) -> torch.Tensor:
    """A lazy safetensors weight read whole (the packed tensors are small: 4 bits a weight)."""
    return weight.narrow(0, 0, weight.shape[0])

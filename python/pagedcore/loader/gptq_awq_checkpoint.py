"""GPTQ and AWQ checkpoints (an HF folder whose config.json has a quantization_config) loaded into the
GGUF block kernels and kept quantized: each layer's packed integers become Q4_0, Q4_1 or Q8_0 blocks once,
at load (integer_weight.py), and run on the same x16 kernels as a GGUF file (layers/linear_quant.py).

What the checkpoints hold for a linear layer y = x W^T, W [N, K] (N outputs, K inputs, G groups of
`group_size` inputs, each group one scale and one zero point per output; b bits a weight, 32 / b a word):

    GPTQ  qweight int32 [K*b/32, N]  field j (bits bj..bj+b-1) of [i, n] is q[(32/b) i + j, n]
          qzeros  int32 [G, N*b/32]  field j of [g, c] is the zero of output (32/b) c + j; checkpoint_format
                                     "gptq" (AutoGPTQ's, the default) stores zero - 1, "gptq_v2" the zero
          scales  fp16 [G, N];  g_idx int32 [K], the group of input k (k // group_size unless desc_act)
          W[n, k] = scales[g, n] * (q[k, n] - zero[g, n]),  g = g_idx[k]
    AWQ   (4 bits) qweight int32 [K, N/8]  nibble i of [k, c] is q[k, 8c + order[i]], order = [0 2 4 6 1 3 5 7]
          qzeros  int32 [G, N/8]  packed the same way;  scales fp16 [G, N]
          W[n, k] = scales[k // group_size, n] * (q[k, n] - zero[k // group_size, n])

GPTQ sym=True (every zero 2^(b-1)) becomes Q4_0 (4 bits) or Q8_0 (8 bits) exactly; AWQ and asymmetric
4-bit GPTQ become Q4_1 (m rounded to fp16, integer_weight.py). Act-order GPTQ (desc_act=True) sorts the
inputs by group once. Refused with the reason and the fix: bits other than 4 and 8 (AWQ: 4), asymmetric
8-bit GPTQ, a group_size that is not a multiple of 32 (or -1), act-order groups whose sizes are not
multiples of 32, AWQ's GEMV packing, AWQ without zero points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.integer_weight import BLOCK, GroupedIntWeight, sorted_by_group

GPTQ_AWQ_METHODS = ("gptq", "awq")
_AWQ_COLUMN_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]  # column j of an AWQ int32 sits in this nibble
_PARTS = ("qweight", "qzeros", "scales", "g_idx")


@dataclasses.dataclass(frozen=True)
class GptqAwqScheme:
    method: str  # "gptq" | "awq"
    group_size: int  # inputs per (scale, zero) group; -1: one group per output row
    sym: bool  # GPTQ sym=True: every zero is 2^(bits-1) (Q4_0 / Q8_0)
    zero_minus_one: bool  # GPTQ checkpoint_format "gptq": qzeros hold zero - 1
    bits: int = 4  # 4 | 8 (AWQ: 4)

    def convert(self, weights: Iterator[tuple[str, Any]], path: str) -> Iterator[tuple[str, Any]]:
        return gptq_awq_weights(weights, self, path)


def gptq_awq_scheme(quantization_config: dict[str, Any], path: str) -> GptqAwqScheme:
    """The scheme of a GPTQ / AWQ config.json's quantization_config; a variant the block kernels cannot run
    is refused with what is supported."""
    qc = quantization_config
    method = str(qc.get("quant_method")).lower()
    bits = qc.get("bits", qc.get("w_bit"))
    group_size = qc.get("group_size", qc.get("q_group_size", 128))
    if bits not in ((4,) if method == "awq" else (4, 8)):
        runs = "4-bit AWQ" if method == "awq" else "4- and 8-bit GPTQ"
        raise ModelLoadError(f"{path}: {method} with bits={bits}; pagedcore runs {runs} weights (its Q4 / Q8_0 "
                             "block kernels); use such a checkpoint or the model's GGUF")
    if not isinstance(group_size, int) or not (group_size == -1 or (group_size > 0 and group_size % BLOCK == 0)):
        raise ModelLoadError(f"{path}: {method} group_size={group_size!r}; the block kernels need groups of a "
                             f"multiple of {BLOCK} inputs (32, 64, 128, ...) or -1 (one group a row)")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ModelLoadError(f"{path}: AWQ version {version!r}; pagedcore reads the GEMM packing (AutoAWQ's "
                                 "default, version 'gemm'), not GEMV's: re-save the model with version='gemm'")
        if not qc.get("zero_point", True):
            raise ModelLoadError(f"{path}: AWQ with zero_point=false is not supported; use a checkpoint quantized "
                                 "with zero points (AutoAWQ's default)")
        return GptqAwqScheme("awq", group_size, sym=False, zero_minus_one=False)
    checkpoint_format = str(qc.get("checkpoint_format", "gptq")).lower()
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ModelLoadError(f"{path}: GPTQ checkpoint_format {checkpoint_format!r}; pagedcore reads 'gptq' "
                             "(AutoGPTQ's) and 'gptq_v2'")
    sym = bool(qc.get("sym", True))
    if bits == 8 and not sym:
        raise ModelLoadError(f"{path}: 8-bit GPTQ with sym=false; the Q8_0 kernels hold symmetric 8-bit weights: "
                             "use a sym=True checkpoint, a 4-bit one, or the model's GGUF")
    return GptqAwqScheme("gptq", group_size, sym=sym, zero_minus_one=checkpoint_format == "gptq", bits=bits)


def gptq_awq_weight(name: str, scheme: GptqAwqScheme, parts: dict[str, torch.Tensor]) -> GroupedIntWeight:
    """One layer's qweight / qzeros / scales (/ g_idx) as a GroupedIntWeight (inputs sorted by group under
    act order)."""
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ModelLoadError(f"{name}: qweight / qzeros are {qweight.dtype} / {qzeros.dtype}, not int32 "
                             f"({scheme.method} packs {32 // scheme.bits} values in each int32)")
    fields = _fields(qweight, scheme.bits)  # [rows, cols, 32 / bits]
    zero_fields = _fields(qzeros, scheme.bits)  # [G, N * bits / 32, 32 / bits]
    if scheme.method == "gptq":
        K, N = qweight.shape[0] * (32 // scheme.bits), qweight.shape[1]
        q = fields.permute(1, 0, 2).reshape(N, K)  # row n: inputs (32 / bits) i + j in order
        zeros = zero_fields.reshape(qzeros.shape[0], -1)  # [G, N]
        if scheme.zero_minus_one:
            zeros = zeros + 1  # AutoGPTQ stores zero - 1 (so a stored 15 is a zero of 16)
    else:
        K, N = qweight.shape[0], qweight.shape[1] * 8
        q = fields[..., _AWQ_COLUMN_NIBBLE].reshape(K, N).t()  # [N, K]
        zeros = zero_fields[..., _AWQ_COLUMN_NIBBLE].reshape(qzeros.shape[0], -1)  # [G, N]
    group_size = scheme.group_size if scheme.group_size > 0 else K
    G = -(-K // group_size)
    if tuple(scales.shape) != (G, N) or tuple(zeros.shape) != (G, N):
        raise ModelLoadError(f"{name}: scales {tuple(scales.shape)} / qzeros {tuple(qzeros.shape)} do not match "
                             f"qweight {tuple(qweight.shape)} with group_size {scheme.group_size} ({G} groups)")
    group = torch.arange(K) // group_size  # [K]: the group of each input
    g_idx = parts.get("g_idx")
    input_perm = None
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64).reshape(-1), group):
        input_perm, group = sorted_by_group(name, g_idx, K, G)
        q = q[:, input_perm]
    return GroupedIntWeight(name, scheme.bits, q, group, zeros.t(), scales.t(), input_perm)


def _fields(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [rows, cols] -> int32 [rows, cols, 32 / bits]: field j is bits bj..bj+b-1 of each word."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def gptq_awq_weights(weights: Iterator[tuple[str, Any]], scheme: GptqAwqScheme,
                     path: str) -> Iterator[tuple[str, Any]]:
    """The checkpoint's (name, tensor) stream with each layer's qweight / qzeros / scales / g_idx replaced
    by one (prefix + ".weight", GroupedIntWeight); other tensors (norms, embeddings, an unquantized lm_head,
    biases) pass through. A layer is emitted once its tensors have all arrived (they may span shards)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = {"qweight", "qzeros", "scales"} | ({"g_idx"} if scheme.method == "gptq" else set())
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in _PARTS:
            yield name, tensor
            continue
        got = pending.setdefault(prefix, {})
        got[part] = materialize(tensor)
        if needed <= got.keys():
            yield prefix + ".weight", gptq_awq_weight(prefix, scheme, pending.pop(prefix))
    for prefix, got in pending.items():  # a GPTQ layer saved without g_idx (its groups are then k // size)
        missing = sorted({"qweight", "qzeros", "scales"} - got.keys())
        if missing:
            raise ModelLoadError(f"{path}: {prefix} has {sorted(got)} but not {missing}; the checkpoint is "
                                 f"incomplete or not a {scheme.method.upper()} one")
        yield prefix + ".weight", gptq_awq_weight(prefix, scheme, got)


def materialize(weight: Any) -> torch.Tensor:
    """A lazy safetensors weight read whole, in its stored dtype (packed tensors are small: 4 or 8 bits a weight;
    0-d scales too)."""
    if isinstance(weight, torch.Tensor):
        return weight
    return weight.read()

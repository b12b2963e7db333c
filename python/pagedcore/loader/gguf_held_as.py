"""GGUF types the kernels run through another block format, converted exactly at load.

    Q3_K   (256: 16 scales of 6 bits, 3-bit quants)   -> Q6_K   the same d, each 16-weight scale s - 32 as Q6_K's
                                                                int8 scale, each quant q3 in [-4, 3] as q6 = q3 + 32
    IQ4_NL (32: fp16 d, 4-bit indices into a table)  -> Q8_0   the same d, each index as its table value (int8)

Every weight dequantises to the same float (both sides are exact products of the fp16 d and small integers:
tests/loader/test_gguf_held_as.py holds it to gguf.quants bit for bit), and the integer dot products the kernels
take against the int8 activations are the same integers. The cost is bytes: Q3_K 110 -> 210 per 256 weights
(1.9x), IQ4_NL 18 -> 34 per 32 (1.9x). Why these two: llama.cpp's Q2_K and Q3_K_* files of a small model hold
their `ffn_down` in Q3_K (the rest in Q4_0 / Q4_K / Q5_0 fallbacks), and IQ4_NL is its fallback for rows that are
not whole super-blocks; a native kernel for each would keep the file's bytes.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as T

HELD_AS = {T.Q3_K: "q6_k", T.IQ4_NL: "q8_0"}  # file type -> the kernels' format its blocks become
_Q3_K_BYTES, _Q6_K_BYTES, _IQ4_NL_BYTES, _Q8_0_BYTES = 110, 210, 18, 34
_IQ4_NL_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                              dtype=torch.int8)
_SHIFTS_2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
_SHIFTS_1 = torch.arange(8, dtype=torch.uint8)


def held_rows(rows: torch.Tensor, ggml_type: T) -> torch.Tensor:
    """uint8 [n, file row bytes] of `ggml_type` -> uint8 [n, row bytes] of HELD_AS[ggml_type] (a new tensor)."""
    n = rows.shape[0]
    if ggml_type == T.Q3_K:
        return _q3_k_as_q6_k(rows.reshape(-1, _Q3_K_BYTES)).reshape(n, -1)
    if ggml_type == T.IQ4_NL:
        return _iq4_nl_as_q8_0(rows.reshape(-1, _IQ4_NL_BYTES)).reshape(n, -1)
    raise ValueError(f"{ggml_type.name} is held as stored, not converted (converted: {[t.name for t in HELD_AS]})")


def _q3_k_as_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """[B, 110] (hmask 32, qs 64, scales 12, d 2) -> [B, 210] (ql 128, qh 64, scales 16, d 2)."""
    B = blocks.shape[0]
    hmask, qs, packed, d = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108], blocks[:, 108:110]
    # Weight 128 h + 32 s + l: its 2 low bits at bits 2 s of qs[32 h + l], its high bit (set: no -4 offset) at bit
    # 4 h + s of hmask[l]: q3 = low - 4 (1 - high), so q6 = q3 + 32 = low + 4 high + 28 in [28, 35].
    low = (qs.reshape(B, 2, 1, 32) >> _SHIFTS_2.view(1, 1, 4, 1)) & 3  # [B, 2, 4, 32]
    high = ((hmask.reshape(B, 1, 32) >> _SHIFTS_1.view(1, 8, 1)) & 1).reshape(B, 2, 4, 32)
    q6 = low + 4 * high + 28  # [B, h, t, l] = weight 128 h + 32 t + l, uint8
    # 16 scales of 6 bits: the low nibble from byte i (i < 8) or the high nibble of byte i - 8; the top 2 bits from
    # bits 2 (i // 4) of byte 8 + i % 4. Stored s, meaning s - 32.
    lo = torch.cat([packed[:, :8] & 15, packed[:, :8] >> 4], dim=1)  # [B, 16]
    hi = ((packed[:, 8:12].reshape(B, 1, 4) >> _SHIFTS_2.view(1, 4, 1)) & 3).reshape(B, 16)
    scales = ((lo | (hi << 4)).to(torch.int16) - 32).to(torch.int8)  # [B, 16]
    # Q6_K (quant_blocks.h): weight 128 h + 32 t + l keeps its low 4 bits in ql[64 h + 32 (t & 1) + l] (high nibble
    # for t >= 2) and its top 2 bits at bits 2 t of qh[32 h + l].
    ql = (q6[:, :, :2] & 15) | ((q6[:, :, 2:] & 15) << 4)  # [B, 2, 2, 32]
    qh = ((q6 >> 4) << (2 * torch.arange(4, dtype=torch.uint8)).view(1, 1, 4, 1)).sum(dim=2, dtype=torch.uint8)
    return torch.cat([ql.reshape(B, 128), qh.reshape(B, 64), scales.view(torch.uint8), d], dim=1)


def _iq4_nl_as_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """[B, 18] (d 2, qs 16: weight j in the low nibble of qs[j], j + 16 in the high) -> [B, 34] (d 2, q 32)."""
    qs = blocks[:, 2:]
    index = torch.cat([qs & 15, qs >> 4], dim=1).long()  # [B, 32]
    return torch.cat([blocks[:, :2], _IQ4_NL_VALUES[index].view(torch.uint8)], dim=1)

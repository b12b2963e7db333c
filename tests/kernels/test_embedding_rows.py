"""The C++ embedding-row decoder (ops/embedding_rows.py) against the Python decoder it replaces
(loader/gguf_dequant.dequantize_rows, quant_repack.gather_rows_x16) bit for bit, on every held
layout: GGUF blocks (with subnormal, negative, inf/NaN fp16 scales), their x16 repacks, dense
rows and their x16 repacks; out-of-range ids and malformed tables are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore.loader.gguf_dequant import dequantize_rows
from pagedcore.ops.dense_repack import pack_x16
from pagedcore.ops.embedding_rows import TABLE_FORMATS, decodes, embedding_rows
from pagedcore.ops.quant_repack import gather_rows_x16, repack_x16

from .test_quant_linear import _GGML, random_weight

BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
KQUANT_FORMATS = ("q4_k", "q5_k", "q6_k")
# A k-quant super-block's bytes and its fp16 fields' offsets (quant_blocks.h): Q4_K / Q5_K d, dmin; Q6_K d.
_KQUANT_BLOCK = {"q4_k": (144, (0, 2)), "q5_k": (176, (0, 2)), "q6_k": (210, (208,))}


def _special_scales(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """Some blocks' fp16 fields set to subnormals, zero, -0, inf and NaN (the decoder's edge cases)."""
    raw = raw.clone()
    block_bytes = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24}[fmt]
    specials = np.array([6e-8, 3e-5, 0.0, -0.0, np.inf, -np.inf, np.nan, -2.5], dtype=np.float16).view(np.uint8)
    blocks = raw.view(raw.shape[0], -1, block_bytes)
    for i in range(8):
        blocks[i, i % blocks.shape[1], 0:2] = torch.from_numpy(specials[2 * i:2 * i + 2].copy())
        if fmt in ("q4_1", "q5_1"):
            blocks[i + 8, i % blocks.shape[1], 2:4] = torch.from_numpy(specials[2 * i:2 * i + 2].copy())
    return raw


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    int_view = torch.int32 if a.dtype is torch.float32 else torch.int16
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    return torch.equal(a_nan, b_nan) and torch.equal(a[~a_nan].view(int_view), b[~b_nan].view(int_view))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("x16", [False, True], ids=["ggml", "x16"])
@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
@pytest.mark.parametrize("K", [32, 576])
def test_block_rows_equal_python_decoder(fmt, x16, out_dtype, K):
    rng = np.random.default_rng(hash((fmt, K)) % 2**32)
    N = 48
    raw, _, _ = random_weight(fmt, N, K, rng)
    raw = _special_scales(raw, fmt)
    table, held = (repack_x16(raw, fmt, K), fmt + "x16") if x16 else (raw, fmt)
    ids = torch.tensor([0, 47, 5, 5, 16, 31, 1, 2, 3, 4, 9, 12, 33], dtype=torch.int64)  # repeats, every group
    got = embedding_rows(table, held, ids, K, out_dtype)
    rows = gather_rows_x16(table, ids, held, K) if x16 else raw.index_select(0, ids)
    want = dequantize_rows(rows, _GGML[fmt]).to(out_dtype)
    assert got.shape == (ids.shape[0], K) and got.dtype is out_dtype
    assert _same_bits(got, want)


def _special_kquant_scales(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """Some super-blocks' fp16 fields (d, and dmin) set to subnormals, zeros, infs and NaN."""
    raw = raw.clone()
    block_bytes, offsets = _KQUANT_BLOCK[fmt]
    specials = np.array([6e-8, 3e-5, 0.0, -0.0, np.inf, -np.inf, np.nan, -2.5], dtype=np.float16).view(np.uint8)
    blocks = raw.view(raw.shape[0], -1, block_bytes)
    for i in range(8):
        for j, offset in enumerate(offsets):
            row = i + 8 * j
            blocks[row, i % blocks.shape[1], offset:offset + 2] = torch.from_numpy(specials[2 * i:2 * i + 2].copy())
    return raw


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("x16", [False, True], ids=["ggml", "x16"])
@pytest.mark.parametrize("fmt", KQUANT_FORMATS)
@pytest.mark.parametrize("K", [256, 768])
def test_kquant_rows_equal_python_decoder(fmt, x16, out_dtype, K):
    """Q4_K / Q5_K / Q6_K tables (the token tables of users' Q4_K_M, Q5_K_M, Q6_K files) against
    gguf.quants' decoder, from the file layout and from the x16 repack."""
    rng = np.random.default_rng(hash((fmt, K, "k")) % 2**32)
    N = 48
    raw, _, _ = random_weight(fmt, N, K, rng)
    raw = _special_kquant_scales(raw, fmt)
    table, held = (repack_x16(raw, fmt, K), fmt + "x16") if x16 else (raw, fmt)
    ids = torch.tensor([0, 47, 5, 5, 16, 31, 1, 2, 3, 4, 9, 12, 33, 8, 15], dtype=torch.int64)
    got = embedding_rows(table, held, ids, K, out_dtype)
    rows = gather_rows_x16(table, ids, held, K) if x16 else raw.index_select(0, ids)
    with np.errstate(invalid="ignore", over="ignore"):  # gguf.quants warns at inf * 0 (NaN, as ours)
        want = dequantize_rows(rows, _GGML[fmt]).to(out_dtype)
    assert got.shape == (ids.shape[0], K) and got.dtype is out_dtype
    assert _same_bits(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("x16", [False, True], ids=["plain", "x16"])
def test_dense_rows_equal_the_table(dtype, x16):
    torch.manual_seed(0)
    W = torch.randn(64, 96).to(dtype)
    table = pack_x16(W) if x16 else W
    held = {torch.float32: "f32x16", torch.bfloat16: "bf16x16"}[dtype] if x16 else str(dtype).removeprefix("torch.")
    ids = torch.tensor([63, 0, 17, 17, 40])
    assert torch.equal(embedding_rows(table, held, ids, 96, dtype), W[ids])


@pytest.mark.parametrize("x16", [False, True], ids=["plain", "x16"])
def test_a_bf16_table_gives_fp32_rows_widened_exactly(x16):
    """A pre-quantized checkpoint's bf16 table under fp32 activations (layers/embedding.py keep_16bit)."""
    torch.manual_seed(1)
    W = torch.randn(64, 96).to(torch.bfloat16)
    ids = torch.tensor([63, 0, 17, 17, 40] + list(range(1, 64)) * 50)  # > one task's rows too
    got = embedding_rows(pack_x16(W) if x16 else W, "bf16x16" if x16 else "bfloat16", ids, 96, torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, W.float()[ids])


@pytest.mark.parametrize("x16", [False, True], ids=["plain", "x16"])
def test_an_fp16_table_gives_fp32_rows_widened_exactly(x16):
    """A GPTQ / AWQ checkpoint's fp16 table under fp32 activations (layers/embedding.py keep_16bit): fp32 rows
    only (fp16 is no activation dtype)."""
    torch.manual_seed(2)
    W = torch.randn(64, 96).half()
    W[5, 3] = 2.0 ** -20  # a subnormal
    ids = torch.tensor([63, 0, 5, 17, 17, 40] + list(range(1, 64)) * 50)
    table, held = (pack_x16(W), "f16x16") if x16 else (W, "float16")
    got = embedding_rows(table, held, ids, 96, torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, W.float()[ids])
    with pytest.raises(ValueError, match="fp16 tables: fp32 only"):
        embedding_rows(table, held, ids, 96, torch.bfloat16)


def test_many_ids_run_in_parallel_tasks_and_agree():
    rng = np.random.default_rng(7)
    raw, _, _ = random_weight("q4_1", 64, 256, rng)
    ids = torch.from_numpy(rng.integers(0, 64, size=3000))  # > one task's rows: the parallel branch
    got = embedding_rows(repack_x16(raw, "q4_1", 256), "q4_1x16", ids, 256, torch.float32)
    assert torch.equal(got, dequantize_rows(raw.index_select(0, ids), _GGML["q4_1"]))


def test_errors_name_the_problem():
    rng = np.random.default_rng(1)
    raw, _, _ = random_weight("q8_0", 32, 64, rng)
    with pytest.raises(IndexError, match="outside the table's 32 rows"):
        embedding_rows(raw, "q8_0", torch.tensor([3, 32]), 64, torch.float32)
    with pytest.raises(IndexError, match="id -1"):
        embedding_rows(raw, "q8_0", torch.tensor([-1]), 64, torch.float32)
    with pytest.raises(ValueError, match="not whole rows"):
        embedding_rows(raw[:, :-1].contiguous(), "q8_0", torch.tensor([0]), 64, torch.float32)
    with pytest.raises(ValueError, match="cannot have 8 rows"):  # x16 needs whole 16-row groups
        embedding_rows(raw[:8].contiguous(), "q8_0x16", torch.tensor([0]), 64, torch.float32)
    with pytest.raises(ValueError, match="no C\\+\\+ decoder for 'q2_k'"):
        embedding_rows(raw, "q2_k", torch.tensor([0]), 64, torch.float32)
    with pytest.raises(ValueError, match="holds torch.float32"):
        embedding_rows(torch.zeros(4, 8), "float32", torch.tensor([0]), 8, torch.bfloat16)
    assert not decodes("q2_k") and all(decodes(f) for f in TABLE_FORMATS)
    assert all(decodes(f) and decodes(f + "x16") for f in KQUANT_FORMATS)
    assert embedding_rows(raw, "q8_0", torch.tensor([], dtype=torch.int64), 64, torch.float32).shape == (0, 64)

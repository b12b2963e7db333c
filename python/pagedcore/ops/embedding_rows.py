"""Token-embedding lookups decoded in C++ from the table's held layout (cpp/kernels/embedding_rows.h).

A table is held as its tied LM head's kernel reads it: dense rows or their x16 repack
(ops/dense_repack.py), GGUF blocks or their x16 repack (ops/quant_repack.py). A decode step looks up
one row per sequence; doing that with torch ops (index arithmetic, a gather, a decode, a cast) cost
~0.1-0.4 ms a step on the 2-core machines, more than the row is worth. The C++ decoder reads only
the asked rows' bytes and writes their values, exactly as pagedcore.loader.gguf_dequant decodes
them (tests/kernels/test_embedding_rows.py holds it to that, bit for bit).

    rows = embedding_rows(table, "q8_0x16", ids, K, torch.float32)   # [len(ids), K]
"""

from __future__ import annotations

import torch

from pagedcore import _core
from pagedcore.ops.dtypes import CPU_DTYPE_CODES

# Format name (the table's held layout) -> the kernel's WeightFormat.
TABLE_FORMATS = {
    "float32": _core.WeightFormat.DENSE_F32, "bfloat16": _core.WeightFormat.DENSE_BF16,
    "f32x16": _core.WeightFormat.F32X16, "bf16x16": _core.WeightFormat.BF16X16,
    "float16": _core.WeightFormat.DENSE_F16, "f16x16": _core.WeightFormat.F16X16,
    "q8_0": _core.WeightFormat.Q8_0, "q4_0": _core.WeightFormat.Q4_0, "q4_1": _core.WeightFormat.Q4_1,
    "q8_0x16": _core.WeightFormat.Q8_0X16, "q4_0x16": _core.WeightFormat.Q4_0X16,
    "q4_1x16": _core.WeightFormat.Q4_1X16,
    "q5_0": _core.WeightFormat.Q5_0, "q5_1": _core.WeightFormat.Q5_1, "q5_0x16": _core.WeightFormat.Q5_0X16,
    "q5_1x16": _core.WeightFormat.Q5_1X16,
    "q4_k": _core.WeightFormat.Q4_K, "q5_k": _core.WeightFormat.Q5_K, "q6_k": _core.WeightFormat.Q6_K,
    "q4_kx16": _core.WeightFormat.Q4_KX16, "q5_kx16": _core.WeightFormat.Q5_KX16,
    "q6_kx16": _core.WeightFormat.Q6_KX16,
}
_DENSE_DTYPES = {"float32": torch.float32, "f32x16": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16x16": torch.bfloat16, "float16": torch.float16, "f16x16": torch.float16}


def decodes(fmt: str) -> bool:
    """Whether embedding_rows decodes tables held as `fmt`."""
    return fmt in TABLE_FORMATS


def embedding_rows(table: torch.Tensor, fmt: str, ids: torch.Tensor, K: int, out_dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` (int64 [n]) of `table` held as `fmt` -> a new [n, K] tensor of out_dtype (a dense
    table's own dtype, or fp32 from a bf16 or fp16 one: an fp16 table's only). Raises IndexError for an id
    outside the table, ValueError for a table whose bytes do not fit fmt and K."""
    if fmt not in TABLE_FORMATS:
        raise ValueError(f"no C++ decoder for {fmt!r} tables; it decodes {', '.join(TABLE_FORMATS)}")
    if not (table.is_cpu and table.is_contiguous() and ids.is_cpu and ids.dim() == 1):
        raise ValueError("embedding_rows: a contiguous CPU table and 1-D CPU ids")
    dense = _DENSE_DTYPES.get(fmt)
    widened = dense in (torch.bfloat16, torch.float16) and out_dtype is torch.float32  # exact
    if dense is not None and (table.dtype is not dense or (out_dtype is not dense and not widened)
                              or (dense is torch.float16 and not widened)):
        raise ValueError(f"embedding_rows: a {fmt} table holds {dense} and its rows come out as {dense} (or "
                         f"fp32 from bf16; fp16 tables: fp32 only), not {table.dtype} -> {out_dtype}")
    if dense is None and table.dtype is not torch.uint8:
        raise ValueError(f"embedding_rows: a {fmt} table is uint8 block bytes, not {table.dtype}")
    if out_dtype not in CPU_DTYPE_CODES:
        raise ValueError(f"embedding_rows: rows come out as float32 or bfloat16, not {out_dtype}")
    num_rows = table_rows(table, fmt, K)
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], K, dtype=out_dtype)  # [n, K]
    _core.embedding_rows_cpu(out.data_ptr(), table.data_ptr(), ids.data_ptr(), ids.shape[0], num_rows, K, K,
                             TABLE_FORMATS[fmt], CPU_DTYPE_CODES[out_dtype])
    return out


def table_rows(table: torch.Tensor, fmt: str, K: int) -> int:
    """The table's number of rows, checked against its bytes (the kernel trusts this)."""
    if fmt in _DENSE_DTYPES:
        rows, rem = divmod(table.numel(), K)
    else:
        from pagedcore.ops.quant_linear import row_bytes

        rows, rem = divmod(table.numel(), row_bytes(fmt, K))  # x16: the repacked row (k-quants: > ggml's)
    if rem or rows == 0:
        raise ValueError(f"embedding_rows: a {fmt} table of {table.numel()} elements is not whole rows of K = {K}")
    return rows

"""Whether tensor parallelism can cut a model whose weights stay in blocks, decided before any weight is read.

A block holds a run of inputs with one scale, so a row-parallel layer (o_proj, down_proj: each rank holds
some of its input columns) can only be cut on block boundaries:

    format                                  inputs per block   cut at
    GGUF Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1   32                 o_proj: q_rows (whole heads); down_proj:
    GGUF Q4_K / Q5_K / Q6_K                 256                the rank's intermediate range
    GPTQ / AWQ / compressed-tensors int     32 (their groups are whole blocks: loader/integer_weight.py)
    fp8 with block-wise scales              the block's inputs (128); rows on 16-row groups (Fp8Weight)

Row cuts (q / k / v, gate / up, the vocabulary) move whole rows and always fit; int8 and fp8 rows with per-row
scales cut anywhere. A GGUF's types are read from its header (a Q4_K_M file keeps some layers in Q6_K); an HF
checkpoint's block is 32, and where it stores g_idx (act order scatters each group over the inputs) a rank's inputs
must hold each group a whole number of blocks: the row-parallel layers' g_idx are read here (a few KB each).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pagedcore.distributed.rank import ParallelLayout
from pagedcore.distributed.shard_weights import LAYER_SLICES
from pagedcore.distributed.sharding import check_layout, shard_plan
from pagedcore.loader.compressed_tensors_checkpoint import CompressedTensorsScheme
from pagedcore.loader.fp8_checkpoint import Fp8Scheme
from pagedcore.loader.gptq_awq_checkpoint import GptqAwqScheme
from pagedcore.loader.integer_weight import BLOCK
from pagedcore.loader.quantization import WeightPlan
from pagedcore.loader.source import ModelSource
from pagedcore.model_config import ModelConfig

# (HF layer tensor name, dim, start, length) -> why that cut falls inside a block, or None
CutCheck = Callable[[str, int, int, int], "str | None"]


def block_cut_error(source: ModelSource, plan: WeightPlan, tp_size: int) -> str | None:
    """Why `tp_size` ranks cannot cut this model's kept blocks (the first cut that fails, and the sizes that
    work), or None where every cut falls on a block boundary or nothing is held in blocks."""
    found = _model_and_check(source, plan)
    if found is None:
        return None
    config, check = found
    error = _first_error(config, tp_size, check)
    if error is None:
        return None
    fits = [n for n in range(1, 9) if _fits(config, n, check)]
    other = (", or pass --dtype float32|bfloat16 (the GGUF dequantised at load: cuts anywhere)"
             if source.format == "gguf" else "")
    return (f"--tensor-parallel-size {tp_size} would cut a weight kept in blocks inside a block: {error}; "
            f"--tensor-parallel-size in {fits} cuts on whole blocks (up to 8 tried){other}")


def _model_and_check(source: ModelSource, plan: WeightPlan) -> tuple[ModelConfig, CutCheck] | None:
    if source.format == "gguf":
        if not plan.keep_blocks:
            return None
        from pagedcore.loader import gguf_loader
        from pagedcore.loader.gguf_file import GGUFFile

        gguf = GGUFFile(source.path)
        config = gguf_loader.config_from_gguf(gguf, plan.dtype)
        tensors = dict(gguf_loader.weights_from_gguf(gguf, config, keep_blocks=True))  # header only: lazy

        def gguf_check(name: str, dim: int, start: int, length: int) -> str | None:
            tensor = tensors.get(name)
            return None if tensor is None else tensor.cut_error(dim, start, length)

        return config, gguf_check
    scheme = plan.prequantized
    grouped = isinstance(scheme, GptqAwqScheme) or (isinstance(scheme, CompressedTensorsScheme) and not scheme.w8a8)
    fp8_blocks = isinstance(scheme, Fp8Scheme) and scheme.block_size is not None
    if not grouped and not fp8_blocks:
        return None  # dense, int8 / fp8 rows: any cut
    from pagedcore.loader import hf_loader

    config = hf_loader.config_from_hf(source.path, plan.dtype, hf_loader.read_generation_config(source.path))
    if fp8_blocks:
        block_k = scheme.block_size[1]
        inputs = {"self_attn.o_proj.weight": config.num_heads * config.head_dim,
                  "mlp.down_proj.weight": config.intermediate_size}

        def fp8_check(name: str, dim: int, start: int, length: int) -> str | None:
            if dim == 0 and (start % 16 or length % 16):
                return f"{name} (fp8 scale blocks held per 16 rows) would be cut at rows [{start}, {start + length})"
            end_of_row = start + length == inputs.get(name.split(".", 3)[-1], -1)
            if dim == 1 and (start % block_k or (length % block_k and not end_of_row)):
                return (f"{name} (fp8 scale blocks of {block_k} inputs) would be cut at inputs "
                        f"[{start}, {start + length})")
            return None

        return config, fp8_check

    groups = _row_parallel_groups(source.path)  # name -> int64 [K] group of each input, where g_idx is stored

    def hf_check(name: str, dim: int, start: int, length: int) -> str | None:
        if dim != 1:
            return None
        if start % BLOCK or length % BLOCK:
            return f"{name} (blocks of {BLOCK} inputs) would be cut at inputs [{start}, {start + length})"
        group = groups.get(name)
        if group is not None:  # act order: the rank's inputs of each group must still fill whole blocks
            counts = torch.bincount(group[start:start + length])
            if bool((counts % BLOCK != 0).any()):
                return (f"{name} (act order: g_idx scatters each group over the inputs) would leave the inputs "
                        f"[{start}, {start + length}) with groups that are not whole blocks of {BLOCK}; use a "
                        "checkpoint without act order (desc_act=False)")
        return None

    return config, hf_check


def _row_parallel_groups(folder: str) -> dict[str, torch.Tensor]:
    """The g_idx of each o_proj / down_proj of an HF folder (GPTQ's g_idx, compressed-tensors' weight_g_idx; int32
    [K], a few KB each), keyed by the layer's weight name; empty when the checkpoint stores none."""
    from pagedcore.loader import hf_loader

    groups = {}
    for name, tensor in hf_loader.lazy_weights_from_safetensors(hf_loader.safetensors_files(folder)):
        prefix, _, part = name.rpartition(".")
        if part in ("g_idx", "weight_g_idx") and prefix.endswith(("self_attn.o_proj", "mlp.down_proj")):
            groups[prefix + ".weight"] = tensor.read().to(torch.int64).reshape(-1)
    return groups


def _first_error(config: ModelConfig, tp_size: int, check: CutCheck) -> str | None:
    layout = ParallelLayout(tp_size=tp_size)
    check_layout(config, layout)
    for rank in range(tp_size):
        shard = shard_plan(config, layout.rank_info(rank))
        for layer in range(config.num_layers):
            for rest, (dim, which) in LAYER_SLICES.items():
                start, end = getattr(shard, which)
                error = check(f"model.layers.{layer}.{rest}", dim, start, end - start)
                if error is not None:
                    return f"rank {rank}: {error}"
    return None


def _fits(config: ModelConfig, tp_size: int, check: CutCheck) -> bool:
    try:
        return _first_error(config, tp_size, check) is None
    except ValueError:  # a layout the heads cannot take
        return False

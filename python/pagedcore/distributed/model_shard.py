"""load_model_shard: one rank's part of a model, read from the checkpoint every rank sees.

Each rank reads only its slices (distributed/shard_weights.py: safetensors slices; a GGUF tensor's
blocks cut, or dequantised and cut, one tensor at a time; a pre-quantized checkpoint's rows, blocks and
scales), builds the model from its shard_config and ShardPlan (models/llama.py), and reports the weight
bytes it holds. LoadedModel.config stays the FULL model's config (the driver needs the vocabulary, EOS ids
and lengths); the rank's own sizes are shard_config(config, rank), its KV cache
KVCacheSpec.of(shard_config(...), ...).
"""

from __future__ import annotations

import logging
import os

import torch

from pagedcore.distributed.communicator import Communicator
from pagedcore.distributed.block_cuts import block_cut_error
from pagedcore.distributed.intermediate_tensors import IntermediateTensors
from pagedcore.distributed.rank import RankInfo
from pagedcore.distributed.shard_weights import shard_checkpoint
from pagedcore.distributed.sharding import check_layout, shard_config, shard_plan
from pagedcore.layers.linear import LINEAR_METHODS
from pagedcore.loader import gguf_loader, hf_loader
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.loader.model_loader import LoadedModel, _Timer, build_model
from pagedcore.loader.quantization import plan_weights
from pagedcore.loader.source import resolve_source
from pagedcore.loader.tokenizer import tokenizer_from_folder, tokenizer_from_gguf
from pagedcore.loader.weight_memory import describe, weight_bytes_by_format
from pagedcore.model_config import dtype_name

__all__ = ["IntermediateTensors", "check_shardable", "load_model_shard"]
logger = logging.getLogger(__name__)


def check_shardable(model: str | None, dtype: str, quantization: str | None, tp_size: int) -> None:
    """Tensor parallelism cuts every weight format the loader holds: dense rows, int8 / fp8 rows with their
    per-row scales, and blocks (GGUF's, GPTQ / AWQ / compressed-tensors int) on whole blocks. Raises ValueError,
    naming the sizes that work, where a row-parallel cut would fall inside a block (distributed/block_cuts.py);
    read from the GGUF header or config.json, before any weight. Pipeline parallelism moves whole layers."""
    if tp_size <= 1:
        return
    source = resolve_source(model)
    error = block_cut_error(source, plan_weights(source, _dtype(dtype), quantization), tp_size)
    if error is not None:
        raise ValueError(error)


def load_model_shard(model: str | None, dtype: str, quantization: str | None, rank: RankInfo,
                     tp_comm: Communicator | None, load_tokenizer: bool = False) -> LoadedModel:
    """Rank `rank`'s part of the model (see the top of this file). tp_comm: the Communicator of the
    rank's stage group when tp_size > 1 (ignored otherwise). Raises ValueError for a layout the model
    cannot be split into or blocks it would cut inside (before any weight is read; an act-order checkpoint's
    groups as its tensors are cut), ModelLoadError for a checkpoint problem."""
    tp_size = rank.tp_size
    if tp_size > 1 and tp_comm is None:
        raise ValueError(f"rank {rank.rank}: --tensor-parallel-size {tp_size} needs the stage's Communicator")
    if tp_size > 1 and tp_comm.world_size != tp_size:
        raise ValueError(f"rank {rank.rank}: the communicator has {tp_comm.world_size} ranks, the layout "
                         f"{tp_size} tensor-parallel ranks")
    timer = _Timer()
    source = resolve_source(model)
    plan = plan_weights(source, _dtype(dtype), quantization)
    check_shardable(model, dtype, quantization, tp_size)
    tokenizer, generation_config, chat_template = None, {}, None
    if source.format == "gguf":
        gguf = GGUFFile(source.path)
        config = gguf_loader.config_from_gguf(gguf, plan.dtype)
        weights = gguf_loader.weights_from_gguf(gguf, config, plan.keep_blocks)
        chat_template = gguf.metadata.get("tokenizer.chat_template")
    else:
        generation_config = hf_loader.read_generation_config(source.path)
        config = hf_loader.config_from_hf(source.path, plan.dtype, generation_config)
        # Lazy: a stage never reads another stage's layers, a TP rank reads only its slices.
        weights = hf_loader.lazy_weights_from_safetensors(hf_loader.safetensors_files(source.path))
        if plan.prequantized is not None:  # GPTQ / AWQ / compressed-tensors / fp8: the kernels' weights, then cut
            weights = plan.prequantized.convert(weights, source.path)
    check_layout(config, rank.layout)
    timer.lap("metadata")
    if load_tokenizer:
        tokenizer = (tokenizer_from_gguf(source.path, gguf.metadata) if source.format == "gguf"
                     else tokenizer_from_folder(source.path))
        chat_template = chat_template or getattr(tokenizer, "chat_template", None)
    timer.lap("tokenizer")
    shard = shard_plan(config, rank)
    method = LINEAR_METHODS[plan.weight_format]
    # --quantization int8_per_channel | fp8: a row-parallel tensor's whole rows are quantized, then cut
    quantize_rows = method.quantize_rows if getattr(method, "quantize_dense_to", None) and tp_size > 1 else None
    model_module = build_model(shard_config(config, rank), plan.weight_format,
                               shard_checkpoint(shard, weights, quantize_rows),
                               shard=shard, tp_comm=tp_comm if tp_size > 1 else None)
    timer.lap("weights")
    loaded = LoadedModel(config, model_module, tokenizer, generation_config, chat_template, source, timer.laps,
                         plan.weight_format)
    loaded.weight_bytes = weight_bytes_by_format(model_module)
    logger.info("rank %d (tp %d/%d, pp %d/%d, layers %s, heads %s, vocab %s): %s (%s)", rank.rank, rank.tp_rank,
                tp_size, rank.pp_rank, rank.pp_size, shard.layers, shard.q_heads, shard.vocab,
                describe(loaded.weight_bytes), os.path.basename(source.path))
    return loaded


def _dtype(dtype: str | torch.dtype) -> str:
    return dtype if dtype == "auto" else dtype_name(dtype)

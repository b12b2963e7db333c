"""load_model_shard: one rank's part of a model, read from the checkpoint every rank sees.

Each rank reads only its slices (distributed/shard_weights.py: safetensors slices; a GGUF tensor
dequantised and cut one tensor at a time), builds the model from its shard_config and ShardPlan
(models/llama.py), and reports the weight bytes it holds. LoadedModel.config stays the FULL model's
config (the driver needs the vocabulary, EOS ids and lengths); the rank's own sizes are
shard_config(config, rank), its KV cache KVCacheSpec.of(shard_config(...), ...).
"""

from __future__ import annotations

import logging
import os

import torch

from pagedcore.distributed.communicator import Communicator
from pagedcore.distributed.intermediate_tensors import IntermediateTensors
from pagedcore.distributed.rank import RankInfo
from pagedcore.distributed.shard_weights import shard_checkpoint
from pagedcore.distributed.sharding import check_layout, shard_config, shard_plan
from pagedcore.layers.linear import LINEAR_METHODS, DenseLinearMethod
from pagedcore.loader import gguf_loader, hf_loader
from pagedcore.loader.fp8_checkpoint import Fp8Scheme
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
    """Tensor parallelism cuts dense weights and an fp8 checkpoint's rows (with their per-row scales) only: another
    quantized format (--dtype auto on a GGUF keeps its blocks; GPTQ / AWQ / compressed-tensors int; --quantization
    ...) with tp > 1 is refused, naming the fix. Pipeline parallelism moves whole layers, so any format runs there."""
    if tp_size <= 1:
        return
    source = resolve_source(model)
    plan = plan_weights(source, _dtype(dtype), quantization)
    if isinstance(plan.prequantized, Fp8Scheme):
        return  # an fp8 checkpoint's rows and their per-row scales cut as dense rows do (Fp8Weight.narrow)
    if not isinstance(LINEAR_METHODS[plan.weight_format], DenseLinearMethod) or plan.keep_blocks:
        if plan.prequantized is not None:
            raise ValueError(f"--tensor-parallel-size {tp_size} shards dense weights only, and this "
                             f"{plan.prequantized.method} checkpoint stays quantized; run it with "
                             "--tensor-parallel-size 1 (--pipeline-parallel-size moves whole layers and runs it)")
        how = f"--quantization {quantization}" if quantization else "--dtype auto on a GGUF file"
        raise ValueError(f"--tensor-parallel-size {tp_size} shards dense weights only, and {how} keeps them in "
                         f"the quantized format {plan.weight_format!r}; pass --dtype float32|bfloat16 "
                         f"(the GGUF is dequantised at load){' and drop --quantization' if quantization else ''}, "
                         "or run --tensor-parallel-size 1")


def load_model_shard(model: str | None, dtype: str, quantization: str | None, rank: RankInfo,
                     tp_comm: Communicator | None, load_tokenizer: bool = False) -> LoadedModel:
    """Rank `rank`'s part of the model (see the top of this file). tp_comm: the Communicator of the
    rank's stage group when tp_size > 1 (ignored otherwise). Raises ValueError for a layout the model
    cannot be split into or a quantized format with tp > 1 (before any weight is read),
    ModelLoadError for a checkpoint problem."""
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
        if plan.prequantized is not None:  # GPTQ / AWQ / compressed-tensors (pipeline stages only: tensor
            weights = plan.prequantized.convert(weights, source.path)  # parallelism refuses them above)
    check_layout(config, rank.layout)
    timer.lap("metadata")
    if load_tokenizer:
        tokenizer = (tokenizer_from_gguf(source.path, gguf.metadata) if source.format == "gguf"
                     else tokenizer_from_folder(source.path))
        chat_template = chat_template or getattr(tokenizer, "chat_template", None)
    timer.lap("tokenizer")
    shard = shard_plan(config, rank)
    model_module = build_model(shard_config(config, rank), plan.weight_format, shard_checkpoint(shard, weights),
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

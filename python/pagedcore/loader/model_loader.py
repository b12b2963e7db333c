"""load_model: one call from a path (or nothing) to a ready model, its tokenizer and defaults."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import time
from typing import Any

import torch

from pagedcore.layers.linear import linear_method
from pagedcore.layers.linear_quant import QuantLinearMethod
from pagedcore.loader import gguf_loader, hf_loader
from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.loader.quantization import WeightPlan, plan_weights
from pagedcore.loader.source import ModelSource, resolve_source
from pagedcore.loader.tokenizer import tokenizer_from_folder, tokenizer_from_gguf
from pagedcore.loader.weight_memory import describe, weight_bytes_by_format
from pagedcore.model_config import ModelConfig, dtype_name
from pagedcore.ops.linear_isa import log_dispatch
from pagedcore.models.registry import model_class

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadedModel:
    config: ModelConfig
    model: torch.nn.Module  # LlamaForCausalLM: forward(input_ids, positions, kv_cache, attn_metadata)
    tokenizer: Any  # transformers PreTrainedTokenizerFast, or None when load_tokenizer=False
    generation_config: dict[str, Any]  # defaults from generation_config.json; {} for GGUF
    chat_template: str | None
    source: ModelSource
    load_seconds: dict[str, float]  # phase -> wall seconds: "metadata", "tokenizer", "weights"
    weight_format: str = "float32"  # the linear layers' LINEAR_METHODS name ("gguf": blocks as stored)
    weight_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # format -> resident bytes

    @property
    def total_weight_bytes(self) -> int:
        return sum(self.weight_bytes.values())


def load_model(model: str | os.PathLike | None = None, dtype: str | torch.dtype = "auto",
               load_tokenizer: bool = True, quantization: str | None = None) -> LoadedModel:
    """model: None (the bundled SmolLM2-135M-Instruct GGUF), a .gguf file, or an HF folder.
    dtype: "auto" (a GGUF keeps its quantized blocks with fp32 activations; an HF folder is float32),
    "float32" or "bfloat16" (a GGUF is dequantised to it). quantization: None, "gguf" (= auto on a
    GGUF), "int8_per_channel", or "gptq" / "awq" / "compressed-tensors" (= None on such a checkpoint; see
    loader/quantization.py).
    Weights are converted once, here. Raises ModelLoadError with what was found and what is supported."""
    if isinstance(dtype, torch.dtype) or dtype != "auto":
        dtype = dtype_name(dtype)
    source = resolve_source(model)
    plan = plan_weights(source, dtype, quantization)
    if source.format == "gguf":
        loaded = _load_gguf(source, plan, load_tokenizer)
    else:
        loaded = _load_hf(source, plan, load_tokenizer)
    loaded.weight_bytes = weight_bytes_by_format(loaded.model)
    logger.info("%s (%s, linear weights %s)", describe(loaded.weight_bytes), os.path.basename(source.path),
                plan.weight_format)
    log_dispatch(logger)  # which kernel every family runs on this CPU, once per process
    return loaded


def _load_gguf(source: ModelSource, plan: WeightPlan, load_tokenizer: bool) -> LoadedModel:
    timer = _Timer()
    gguf = GGUFFile(source.path)
    config = gguf_loader.config_from_gguf(gguf, plan.dtype)
    timer.lap("metadata")
    tokenizer = tokenizer_from_gguf(source.path, gguf.metadata) if load_tokenizer else None
    timer.lap("tokenizer")
    model = build_model(config, plan.weight_format, gguf_loader.weights_from_gguf(gguf, config, plan.keep_blocks))
    timer.lap("weights")
    chat_template = gguf.metadata.get("tokenizer.chat_template")
    return LoadedModel(config, model, tokenizer, {}, chat_template, source, timer.laps, plan.weight_format)


def _load_hf(source: ModelSource, plan: WeightPlan, load_tokenizer: bool) -> LoadedModel:
    timer = _Timer()
    generation_config = hf_loader.read_generation_config(source.path)
    config = hf_loader.config_from_hf(source.path, plan.dtype, generation_config)
    shards = hf_loader.safetensors_files(source.path)
    timer.lap("metadata")
    tokenizer = tokenizer_from_folder(source.path) if load_tokenizer else None
    timer.lap("tokenizer")
    weights = hf_loader.weights_from_safetensors(shards)
    if plan.prequantized is not None:  # GPTQ / AWQ / compressed-tensors: each layer's packed tensors become one
        weights = plan.prequantized.convert(weights, source.path)  # integer weight (loader/integer_weight.py)
    model = build_model(config, plan.weight_format, weights)
    timer.lap("weights")
    chat_template = getattr(tokenizer, "chat_template", None) or hf_loader.read_chat_template(source.path)
    return LoadedModel(config, model, tokenizer, generation_config, chat_template, source, timer.laps,
                       plan.weight_format)


def build_model(config: ModelConfig, weight_format: str, weights, **shard) -> torch.nn.Module:
    """The model with its linear layers in `weight_format` (a LINEAR_METHODS name), weights loaded.
    shard: `shard=` ShardPlan and `tp_comm=` of one rank (distributed/model_shard.py), else nothing."""
    method = linear_method(weight_format)
    if isinstance(method, QuantLinearMethod):  # (kept quantized weights under the model's activation dtype)
        method = method.for_dtype(config.torch_dtype)
    model = model_class(config.architecture)(config, method, **shard)
    try:
        with _one_torch_thread():
            model.load_weights(weights)
    except ModelLoadError:
        raise
    except ValueError as error:  # a shape or name mismatch between checkpoint and config
        raise ModelLoadError(f"the weights do not fit the config: {error}") from None
    _return_freed_memory()
    return model.eval()


def _return_freed_memory() -> None:
    """Hands the heap's free pages back to the OS (glibc malloc_trim; elsewhere nothing). Loading
    frees as much as it keeps: a repacked dense layer drops its checkpoint-layout copy (layers/linear.py
    DenseLinearMethod), and the loader its conversion buffers. glibc keeps freed chunks of these sizes
    in its heap, so without this the process stays as large as the load's peak (measured, default
    model in bf16 under LLM(): 786 MiB resident, 645 after the trim)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass


@contextlib.contextmanager
def _one_torch_thread():
    """Loading is memory-bound: a second thread does not speed it up (0.22 s for the default model
    either way), but under CPU contention each of its thousands of small parallel ops can wait for a
    descheduled OpenMP thread (measured: 0.3 s -> 9 s). So load on one thread, then restore."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(num_threads)


class _Timer:
    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now

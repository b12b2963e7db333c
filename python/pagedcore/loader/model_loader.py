"""load_model: one call from a path (or nothing) to a ready model, its tokenizer and defaults."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any

import torch

from pagedcore.layers.linear import linear_method
from pagedcore.loader import gguf_loader, hf_loader
from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.loader.source import ModelSource, resolve_source
from pagedcore.loader.tokenizer import tokenizer_from_folder, tokenizer_from_gguf
from pagedcore.model_config import ModelConfig, dtype_name
from pagedcore.models.registry import model_class


@dataclasses.dataclass
class LoadedModel:
    config: ModelConfig
    model: torch.nn.Module  # LlamaForCausalLM: forward(input_ids, positions, kv_cache, attn_metadata)
    tokenizer: Any  # transformers PreTrainedTokenizerFast, or None when load_tokenizer=False
    generation_config: dict[str, Any]  # defaults from generation_config.json; {} for GGUF
    chat_template: str | None
    source: ModelSource
    load_seconds: dict[str, float]  # phase -> wall seconds: "metadata", "tokenizer", "weights"


def load_model(model: str | os.PathLike | None = None, dtype: str | torch.dtype = "float32",
               load_tokenizer: bool = True) -> LoadedModel:
    """model: None (the bundled SmolLM2-135M-Instruct GGUF), a .gguf file, or an HF folder.
    dtype: "float32" or "bfloat16"; weights are converted once, here. Raises ModelLoadError with what
    was found and what is supported."""
    dtype = dtype_name(dtype)
    source = resolve_source(model)
    if source.format == "gguf":
        return _load_gguf(source, dtype, load_tokenizer)
    return _load_hf(source, dtype, load_tokenizer)


def _load_gguf(source: ModelSource, dtype: str, load_tokenizer: bool) -> LoadedModel:
    timer = _Timer()
    gguf = GGUFFile(source.path)
    config = gguf_loader.config_from_gguf(gguf, dtype)
    timer.lap("metadata")
    tokenizer = tokenizer_from_gguf(source.path, gguf.metadata) if load_tokenizer else None
    timer.lap("tokenizer")
    model = _build(config, gguf_loader.weight_format(gguf, config), gguf_loader.weights_from_gguf(gguf, config))
    timer.lap("weights")
    chat_template = gguf.metadata.get("tokenizer.chat_template")
    return LoadedModel(config, model, tokenizer, {}, chat_template, source, timer.laps)


def _load_hf(source: ModelSource, dtype: str, load_tokenizer: bool) -> LoadedModel:
    timer = _Timer()
    generation_config = hf_loader.read_generation_config(source.path)
    config = hf_loader.config_from_hf(source.path, dtype, generation_config)
    shards = hf_loader.safetensors_files(source.path)
    timer.lap("metadata")
    tokenizer = tokenizer_from_folder(source.path) if load_tokenizer else None
    timer.lap("tokenizer")
    model = _build(config, hf_loader.weight_format(config), hf_loader.weights_from_safetensors(shards))
    timer.lap("weights")
    chat_template = getattr(tokenizer, "chat_template", None) or hf_loader.read_chat_template(source.path)
    return LoadedModel(config, model, tokenizer, generation_config, chat_template, source, timer.laps)


def _build(config: ModelConfig, weight_format: str, weights) -> torch.nn.Module:
    """The model with its linear layers in `weight_format` (a LINEAR_METHODS name), weights loaded."""
    model = model_class(config.architecture)(config, linear_method(weight_format))
    try:
        with _one_torch_thread():
            model.load_weights(weights)
    except ModelLoadError:
        raise
    except ValueError as error:  # a shape or name mismatch between checkpoint and config
        raise ModelLoadError(f"the weights do not fit the config: {error}") from None
    return model.eval()


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

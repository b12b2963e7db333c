"""An HF model folder -> ModelConfig, weights (memory-mapped safetensors) and generation defaults.

Folder layout read:
    config.json                      architecture and shape
    model.safetensors                one file, or
    model.safetensors.index.json     {"weight_map": {tensor name: shard file}} + the shard files
    generation_config.json           optional sampling defaults and EOS ids
    tokenizer.json / tokenizer_config.json ...   read by tokenizer.py
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch

from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.quantization import prequantized_scheme
from pagedcore.model_config import ModelConfig
from pagedcore.models.registry import MODEL_CLASSES

_INDEX_FILE = "model.safetensors.index.json"
logger = logging.getLogger(__name__)


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{path} is not valid JSON ({error}); re-download or re-save the model") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def read_generation_config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "generation_config.json")
    return read_json(path) if os.path.isfile(path) else {}


def read_chat_template(folder: str) -> str | None:
    """The chat template without building a tokenizer: chat_template.jinja (transformers >= 4.43
    writes it) or tokenizer_config.json's "chat_template"."""
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    path = os.path.join(folder, "tokenizer_config.json")
    template = read_json(path).get("chat_template") if os.path.isfile(path) else None
    return template if isinstance(template, str) else None


def config_from_hf(folder: str, dtype: str, generation_config: dict[str, Any]) -> ModelConfig:
    path = os.path.join(folder, "config.json")
    raw = read_json(path)
    architectures = raw.get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture not in MODEL_CLASSES:
        raise ModelLoadError(f"{path} declares architecture {architecture!r}; pagedcore runs "
                             f"{sorted(MODEL_CLASSES)}")
    prequantized_scheme(raw.get("quantization_config"), path)  # refuses pre-quantized formats it cannot run
    if raw.get("hidden_act", "silu") != "silu" or raw.get("mlp_bias", False):
        raise ModelLoadError(f"{path}: hidden_act={raw.get('hidden_act')!r}, mlp_bias={raw.get('mlp_bias')}; "
                             "pagedcore's Llama family needs silu and no MLP bias")

    def need(key: str) -> Any:
        if key not in raw:
            raise ModelLoadError(f"{path} lacks {key!r}, which a {architecture} needs")
        return raw[key]

    num_heads = need("num_attention_heads")
    # transformers >= 5 writes rope_parameters; older files (and the hub) rope_theta + rope_scaling.
    rope = raw.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    window = raw.get("sliding_window")
    if window and raw.get("use_sliding_window", True) and window < need("max_position_embeddings"):
        logger.warning("%s: sliding_window=%d is not implemented; attention sees the whole sequence, so "
                       "outputs past %d tokens differ from the reference model", path, window, window)
    eos = generation_config.get("eos_token_id", raw.get("eos_token_id"))
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    try:
        return ModelConfig(
            architecture=architecture,
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or need("hidden_size") // num_heads,
            vocab_size=need("vocab_size"),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=need("max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 has q/k/v bias always (its config has no flag); Llama and Qwen3 say so in the config.
            attention_bias=architecture == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos_ids),
            dtype=dtype,
        )
    except ValueError as error:
        raise ModelLoadError(f"{path}: {error}") from None


def safetensors_files(folder: str) -> list[str]:
    index_path = os.path.join(folder, _INDEX_FILE)
    if os.path.isfile(index_path):
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index_path} has no 'weight_map'; re-save the model")
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights; pagedcore reads safetensors "
                             "(re-save with save_pretrained(..., safe_serialization=True)) or a .gguf file")
    paths = [os.path.join(folder, name) for name in files]
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        raise ModelLoadError(f"{folder}: shard(s) {missing} named in {_INDEX_FILE} are missing")
    return paths


def weights_from_safetensors(paths: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every shard; tensors are memory-mapped, read on copy."""
    from safetensors import SafetensorError, safe_open

    for path in paths:
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except SafetensorError as error:
            raise ModelLoadError(f"{path} is not a readable safetensors file ({error}); "
                                 "re-download or re-save it") from None


class SafetensorsWeight:
    """One tensor of an open safetensors file, read when asked (a LazyWeight): whole (load_into) or
    one slice (narrow: only those bytes are read), for a tensor-parallel rank that holds a part."""

    def __init__(self, handle, name: str):
        self._handle = handle  # safe_open(...) of the shard file, open while the weights are consumed
        self._name = name
        self.shape = tuple(handle.get_slice(name).get_shape())
        self.dtype_name = handle.get_slice(name).get_dtype()  # safetensors' name: "F32", "BF16", "I8", ...

    def load_into(self, out: torch.Tensor) -> None:
        out.copy_(self._handle.get_tensor(self._name))

    def read(self) -> torch.Tensor:
        """The whole tensor, in its stored dtype (fp8 weights, 0-d scales)."""
        return self._handle.get_tensor(self._name)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Rows [start, start + length) along dim, read from the file (a dim-1 cut reads strided runs)."""
        index = tuple(slice(start, start + length) if d == dim else slice(None) for d in range(len(self.shape)))
        return self._handle.get_slice(self._name)[index]


def lazy_weights_from_safetensors(paths: list[str]) -> Iterator[tuple[str, SafetensorsWeight]]:
    """(name, SafetensorsWeight) for every tensor of every shard; each must be consumed before the next
    is asked for (its file closes when the iteration moves past it)."""
    from safetensors import SafetensorError, safe_open

    for path in paths:
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, SafetensorsWeight(f, name)
        except SafetensorError as error:
            raise ModelLoadError(f"{path} is not a readable safetensors file ({error}); "
                                 "re-download or re-save it") from None

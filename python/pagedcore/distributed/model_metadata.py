"""What the driver of a parallel model loads: the config, tokenizer, chat template and weight plan,
never the weights (the ranks load their shards; the driver runs no layer).

Reads config.json / GGUF metadata through the loader's own readers, so the ModelConfig is the one a
rank's loader builds from the same file. Cheap: a GGUF's header, an HF folder's JSON files.
"""

from __future__ import annotations

import time

from pagedcore.loader import gguf_loader, hf_loader
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.loader.model_loader import LoadedModel
from pagedcore.loader.quantization import WeightPlan, plan_weights
from pagedcore.loader.source import resolve_source
from pagedcore.loader.tokenizer import tokenizer_from_folder, tokenizer_from_gguf
from pagedcore.model_config import dtype_name


def load_model_metadata(model: str | None, dtype: str = "auto", quantization: str | None = None,
                        load_tokenizer: bool = True) -> tuple[LoadedModel, WeightPlan]:
    """A LoadedModel whose `model` is None (weight_bytes stays empty until the ranks report), and the
    weight plan the ranks will follow (its weight_format says dense or quantized)."""
    if dtype != "auto":
        dtype = dtype_name(dtype)
    source = resolve_source(model)
    plan = plan_weights(source, dtype, quantization)
    laps: dict[str, float] = {}
    t0 = time.perf_counter()
    if source.format == "gguf":
        gguf = GGUFFile(source.path)
        config = gguf_loader.config_from_gguf(gguf, plan.dtype)
        laps["metadata"] = time.perf_counter() - t0
        tokenizer = tokenizer_from_gguf(source.path, gguf.metadata) if load_tokenizer else None
        chat_template, generation_config = gguf.metadata.get("tokenizer.chat_template"), {}
    else:
        generation_config = hf_loader.read_generation_config(source.path)
        config = hf_loader.config_from_hf(source.path, plan.dtype, generation_config)
        laps["metadata"] = time.perf_counter() - t0
        tokenizer = tokenizer_from_folder(source.path) if load_tokenizer else None
        chat_template = getattr(tokenizer, "chat_template", None) or hf_loader.read_chat_template(source.path)
    laps["tokenizer"] = time.perf_counter() - t0 - laps["metadata"]
    loaded = LoadedModel(config, None, tokenizer, generation_config, chat_template, source, laps, plan.weight_format)
    return loaded, plan

"""A GGUF re-quantized at load into another block format: each quantized tensor dequantised to
fp32 and quantized again with gguf.quants.quantize (its reference quantizer). For comparing formats
on the same weights (`pagedcore bench perplexity`'s q8_0 row); serving loads files as they are."""

from __future__ import annotations

import os

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from pagedcore.loader import gguf_loader
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.loader.model_loader import LoadedModel, build_model
from pagedcore.loader.source import resolve_source
from pagedcore.loader.weight_memory import weight_bytes_by_format

# gguf.quants quantizes these (not the k-quants).
_QUANTIZABLE = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
                "q4_1": GGMLQuantizationType.Q4_1, "q5_0": GGMLQuantizationType.Q5_0,
                "q5_1": GGMLQuantizationType.Q5_1}


class RequantizedWeight:
    """A GGUFWeight whose blocks (if it has any) are re-quantized into `target` when read."""

    def __init__(self, weight: gguf_loader.GGUFWeight, target: str):
        self.shape = weight.shape
        self._weight = weight
        self.block_format = target if weight.block_format is not None else None
        self.ggml_type = _QUANTIZABLE[target] if self.block_format else weight.ggml_type

    def load_into(self, out: torch.Tensor) -> None:
        self._weight.load_into(out)

    def block_rows(self) -> torch.Tensor:
        values = torch.empty(self.shape, dtype=torch.float32)  # [out, in], HF row order
        self._weight.load_into(values)
        blocks = gguf_quants.quantize(values.numpy(), self.ggml_type)  # uint8 [out, row_bytes]
        return torch.from_numpy(np.ascontiguousarray(blocks))


def load_requantized(model: str | os.PathLike | None, target: str) -> LoadedModel:
    """The GGUF `model` with every quantized tensor re-quantized to `target` (q8_0, q4_0, q4_1, q5_0, q5_1)."""
    if target not in _QUANTIZABLE:
        raise ValueError(f"re-quantizing to {target!r}: gguf.quants quantizes {sorted(_QUANTIZABLE)}")
    source = resolve_source(model)
    if source.format != "gguf":
        raise ValueError(f"{source.path} is not a GGUF file; re-quantizing reads GGUF blocks")
    gguf = GGUFFile(source.path)
    config = gguf_loader.config_from_gguf(gguf, "float32")
    weights = ((name, RequantizedWeight(weight, target))
               for name, weight in gguf_loader.weights_from_gguf(gguf, config, keep_blocks=True))
    loaded = LoadedModel(config, build_model(config, "gguf", weights), None, {}, None, source, {}, "gguf")
    loaded.weight_bytes = weight_bytes_by_format(loaded.model)
    return loaded

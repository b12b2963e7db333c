"""Which model class runs which architecture, by HF `architectures` name or GGUF `general.architecture`."""

from __future__ import annotations

from torch import nn

from pagedcore.models.llama import LlamaForCausalLM

# HF config.json `architectures[0]` -> implementation. One class covers the whole family.
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}

# GGUF `general.architecture` -> the HF name it corresponds to. llama.cpp files Mistral, SmolLM2
# and TinyLlama under "llama".
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_CLASSES[architecture]
    except KeyError:
        raise ValueError(f"architecture {architecture!r} is not supported; pagedcore runs "
                         f"{sorted(MODEL_CLASSES)}") from None

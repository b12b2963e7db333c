"""Model code (Llama family) and the registry from architecture names to it."""

from pagedcore.models.llama import LlamaForCausalLM
from pagedcore.models.registry import GGUF_ARCHITECTURES, MODEL_CLASSES, model_class

__all__ = ["GGUF_ARCHITECTURES", "LlamaForCausalLM", "MODEL_CLASSES", "model_class"]

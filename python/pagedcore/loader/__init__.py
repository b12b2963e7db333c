"""Model loading: GGUF files (dequantised) and HF folders (safetensors) into pagedcore's model code."""

from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.model_loader import LoadedModel, load_model
from pagedcore.loader.source import ModelSource, default_model_path

__all__ = ["LoadedModel", "ModelLoadError", "ModelSource", "default_model_path", "load_model"]

"""ModelConfig: the shape of a Llama-family model, validated once, whatever file it came from.

The loader fills it from an HF `config.json` or from GGUF metadata; the model code reads only this.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pagedcore.config import FP16_DTYPE_NAMES, FP16_REFUSAL

# The dtypes weights and the KV cache may have; the names are what users pass on the command line.
SUPPORTED_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# rope_scaling types the rotary embedding implements; None means plain RoPE.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def dtype_name(dtype: str | torch.dtype) -> str:
    """'float32' / 'bfloat16' from either spelling; anything else is an error that lists the choices."""
    if isinstance(dtype, torch.dtype):
        for name, value in SUPPORTED_DTYPES.items():
            if value == dtype:
                return name
    elif dtype in SUPPORTED_DTYPES:
        return dtype
    elif dtype in ("fp32", "float", "bf16"):
        return {"fp32": "float32", "float": "float32", "bf16": "bfloat16"}[dtype]
    if dtype in FP16_DTYPE_NAMES or dtype is torch.float16:
        raise ValueError(FP16_REFUSAL)
    raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(SUPPORTED_DTYPES)}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str  # HF class name, e.g. "LlamaForCausalLM"; the models registry maps it to code
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3", "factor": 8.0, ...} or None
    attention_bias: bool = False  # bias on the q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # every id that ends generation (Llama 3 has several)
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}; "
                                 "check the model's config.json / GGUF metadata")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim ({self.head_dim}) must be even: RoPE rotates pairs of dims")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
        self._check_rope_scaling()

    def _check_rope_scaling(self) -> None:
        scaling = self.rope_scaling
        if scaling is None:
            return
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_scaling type {rope_type!r} is not supported; supported: "
                             f"{list(SUPPORTED_ROPE_TYPES)} (or no rope_scaling)")
        if rope_type == "default":  # transformers 5 writes this for plain RoPE
            object.__setattr__(self, "rope_scaling", None)
            return
        if "factor" not in scaling or not scaling["factor"] > 0:
            raise ValueError(f"rope_scaling {scaling} needs a positive 'factor'")
        if rope_type == "llama3":
            missing = [key for key in _LLAMA3_ROPE_KEYS if key not in scaling]
            if missing:
                raise ValueError(f"rope_scaling of type 'llama3' lacks {missing}; it needs {list(_LLAMA3_ROPE_KEYS)}")
            if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
                raise ValueError("rope_scaling llama3 needs high_freq_factor > low_freq_factor, got "
                                 f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
        object.__setattr__(self, "rope_scaling", {**scaling, "rope_type": rope_type})

    @property
    def torch_dtype(self) -> torch.dtype:
        return SUPPORTED_DTYPES[self.dtype]

    @property
    def q_size(self) -> int:
        """Width of the query projection: num_heads * head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection: num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

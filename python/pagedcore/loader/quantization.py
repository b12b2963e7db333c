"""How a checkpoint's linear weights are held, from --dtype and --quantization (vLLM's flag names).

    source  dtype          quantization       weights                               activations
    GGUF    auto           None | gguf        blocks as stored (per tensor format)  float32
    GGUF    float32|bf16   None               dequantised at load to that dtype     that dtype
    GGUF    float32        gguf               blocks as stored                      float32
    HF      auto|float32   None               float32                               float32
    HF      bfloat16       None               bfloat16                              bfloat16
    any     auto|float32   int8_per_channel   int8 per output row, quantized here   float32 (W8A8)

Refused: bfloat16 with kept quantized weights (the quantized kernels take fp32 activations),
`gguf` on an HF folder, GPTQ/AWQ and other pre-quantized checkpoints, unknown names.
"""

from __future__ import annotations

import dataclasses

from pagedcore.config import quantization_error
from pagedcore.loader.errors import ModelLoadError
from pagedcore.model_config import dtype_name


@dataclasses.dataclass(frozen=True)
class WeightPlan:
    dtype: str  # the model's activation (and non-linear weight) dtype: "float32" | "bfloat16"
    weight_format: str  # the LINEAR_METHODS name of the linear layers
    keep_blocks: bool  # a GGUF's quantized tensors stay blocks (linears and the embedding)


def plan_weights(source_format: str, dtype: str, quantization: str | None) -> WeightPlan:
    """source_format "gguf" | "hf"; dtype "auto" or a dtype name; quantization None or a name."""
    if dtype != "auto":
        dtype = dtype_name(dtype)
    if quantization is not None:
        error = quantization_error(quantization)
        if error:
            raise ModelLoadError(error)
        if dtype == "bfloat16":
            raise ModelLoadError(f"quantization {quantization!r} runs float32 activations; use --dtype auto "
                                 "(or float32) with it, or drop --quantization for a dense bfloat16 model")
    if quantization == "int8_per_channel":
        return WeightPlan("float32", "int8_per_channel", keep_blocks=False)
    if source_format == "gguf":
        if dtype == "auto" or quantization == "gguf":
            return WeightPlan("float32", "gguf", keep_blocks=True)
        return WeightPlan(dtype, dtype, keep_blocks=False)
    if quantization == "gguf":
        raise ModelLoadError("quantization 'gguf' serves a .gguf file's blocks; this is an HF folder. Pass a "
                             ".gguf file, or use int8_per_channel to quantize this checkpoint at load")
    dense = "float32" if dtype == "auto" else dtype
    return WeightPlan(dense, dense, keep_blocks=False)


def refuse_prequantized(quantization_config: dict | None, path: str) -> None:
    """An HF config.json with a quantization_config (GPTQ, AWQ, ...) holds weights pagedcore cannot
    read: refuse it by name rather than fail on its qweight/qzeros tensors."""
    if not quantization_config:
        return
    method = quantization_config.get("quant_method", "unknown")
    raise ModelLoadError(f"{path} is a pre-quantized {method!r} checkpoint; pagedcore does not load "
                         f"{method} weights. It serves GGUF files as stored (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, "
                         "Q6_K) and quantizes dense checkpoints at load with --quantization int8_per_channel: "
                         "use the model's GGUF or its unquantized checkpoint")

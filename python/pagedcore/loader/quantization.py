"""How a checkpoint's linear weights are held, from --dtype and --quantization (vLLM's flag names).

    source  dtype          quantization       weights                               activations
    GGUF    auto           None | gguf        blocks as stored (per tensor format)  float32
    GGUF    float32|bf16   None               dequantised at load to that dtype     that dtype
    GGUF    float32        gguf               blocks as stored                      float32
    HF      auto|float32   None               float32                               float32
    HF      bfloat16       None               bfloat16                              bfloat16
    any     auto|float32   int8_per_channel   int8 per output row, quantized here   float32 (W8A8)
    HF GPTQ auto|float32   None | gptq        Q4_0 / Q4_1 blocks (int4_checkpoint.py)  float32
    HF AWQ  auto|float32   None | awq         Q4_1 blocks (int4_checkpoint.py)         float32

An HF folder's quantization_config decides (as in vLLM, --quantization may be left unset or name the
checkpoint's method). Refused: bfloat16 with kept quantized weights (the quantized kernels take fp32
activations), `gguf` on an HF folder, gptq / awq on another kind of checkpoint, other pre-quantized
checkpoints and variants (int4_checkpoint.py says which), unknown names.
"""

from __future__ import annotations

import dataclasses
import os

from pagedcore.config import quantization_error
from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.int4_checkpoint import INT4_METHODS, Int4Scheme, int4_scheme
from pagedcore.loader.source import ModelSource
from pagedcore.model_config import dtype_name


@dataclasses.dataclass(frozen=True)
class WeightPlan:
    dtype: str  # the model's activation (and non-linear weight) dtype: "float32" | "bfloat16"
    weight_format: str  # the LINEAR_METHODS name of the linear layers
    keep_blocks: bool  # a GGUF's quantized tensors stay blocks (linears and the embedding)
    int4: Int4Scheme | None = None  # an HF GPTQ / AWQ checkpoint: its layers become Q4 blocks at load


def plan_weights(source: ModelSource, dtype: str, quantization: str | None) -> WeightPlan:
    """dtype "auto" or a dtype name; quantization None or a name. An HF folder's config.json is read
    for a quantization_config."""
    if dtype != "auto":
        dtype = dtype_name(dtype)
    source_format = source.format
    int4 = checkpoint_int4_scheme(source)
    if int4 is not None:
        if quantization not in (None, int4.method):
            raise ModelLoadError(f"{source.path} is a {int4.method.upper()} checkpoint; --quantization "
                                 f"{quantization} does not apply to it: leave --quantization unset (or pass "
                                 f"{int4.method})")
        if dtype == "bfloat16":
            raise ModelLoadError(f"{source.path} is a {int4.method.upper()} checkpoint, run on the Q4 block "
                                 "kernels with float32 activations; use --dtype auto (or float32)")
        return WeightPlan("float32", int4.method, keep_blocks=True, int4=int4)
    if quantization in INT4_METHODS:
        raise ModelLoadError(f"--quantization {quantization} loads an HF folder of {quantization.upper()} weights "
                             f"(config.json with a quantization_config whose quant_method is {quantization!r}); "
                             f"{source.path} is not one: leave --quantization unset for it")
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


def checkpoint_int4_scheme(source: ModelSource) -> Int4Scheme | None:
    """The GPTQ / AWQ scheme of an HF folder's config.json (None: a GGUF, or no quantization_config);
    other pre-quantized checkpoints are refused by name rather than failing on their tensors."""
    if source.format != "hf":
        return None
    from pagedcore.loader.hf_loader import read_json

    path = os.path.join(source.path, "config.json")
    if not os.path.isfile(path):
        return None  # config_from_hf reports the missing file
    return int4_scheme(read_json(path).get("quantization_config"), path)

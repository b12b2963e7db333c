"""How a checkpoint's linear weights are held, from --dtype and --quantization (vLLM's flag names).

    source  dtype          quantization       weights                               activations
    GGUF    auto           None | gguf        blocks as stored (per tensor format)  float32
    GGUF    float32|bf16   None               dequantised at load to that dtype     that dtype
    GGUF    float32        gguf               blocks as stored                      float32
    HF      auto|float32   None               float32                               float32
    HF      bfloat16       None               bfloat16                              bfloat16
    any     auto|float32   int8_per_channel   int8 per output row, quantized here   float32 (W8A8)
    HF GPTQ auto|float32   None | gptq        Q4_0 / Q4_1 / Q8_0 blocks (gptq_awq_checkpoint.py)  float32
    HF AWQ  auto|float32   None | awq         Q4_1 blocks (gptq_awq_checkpoint.py)                 float32
    HF c-t  auto|float32   None | compressed-tensors   int8 per channel (W8A8) or Q4_0 / Q4_1 / Q8_0
                                                  blocks (compressed_tensors_checkpoint.py), or fp8   float32
    HF fp8  auto|float32   None | fp8         fp8 e4m3 rows + per-row scales, as stored (fp8_checkpoint.py) float32
    HF fp8  bfloat16       None | fp8         the same                                    bfloat16 (bf16 dot)
    any     auto|float32   fp8                fp8 e4m3 per output row, quantized here    float32 (W8A16)
    any     bfloat16       fp8                the same                                    bfloat16

(HF fp8 includes compressed-tensors' fp8 checkpoints.) An HF folder's quantization_config decides (as in vLLM,
--quantization may be left unset or name the checkpoint's method). fp8 weights run under bf16 activations too:
e4m3 converts to bf16 exactly and the kernels multiply on bf16 pair dot products where the CPU has them (vLLM's
arithmetic for these checkpoints). Refused: bfloat16 with the other kept quantized weights (their kernels quantize
fp32 activations), `gguf` on an HF folder, gptq / awq / compressed-tensors on another kind of checkpoint, other
pre-quantized checkpoints and variants (the checkpoint modules say which), unknown names.
"""

from __future__ import annotations

import dataclasses
import os

from pagedcore.config import quantization_error
from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.compressed_tensors_checkpoint import (METHOD as COMPRESSED_TENSORS, CompressedTensorsScheme,
                                                           compressed_tensors_scheme)
from pagedcore.loader.fp8_checkpoint import FP8, Fp8Scheme, fp8_scheme
from pagedcore.loader.gptq_awq_checkpoint import GPTQ_AWQ_METHODS, GptqAwqScheme, gptq_awq_scheme
from pagedcore.loader.source import ModelSource
from pagedcore.model_config import dtype_name


@dataclasses.dataclass(frozen=True)
class WeightPlan:
    dtype: str  # the model's activation (and non-linear weight) dtype: "float32" | "bfloat16"
    weight_format: str  # the LINEAR_METHODS name of the linear layers
    keep_blocks: bool  # a GGUF's quantized tensors stay blocks (linears and the embedding)
    # An HF checkpoint stored quantized (GPTQ, AWQ, compressed-tensors): scheme.convert(weights, path) turns
    # its layers' packed tensors into the integer weights the kernels hold (loader/integer_weight.py).
    prequantized: GptqAwqScheme | CompressedTensorsScheme | Fp8Scheme | None = None


PREQUANTIZED_METHODS = (*GPTQ_AWQ_METHODS, COMPRESSED_TENSORS)  # (fp8: a checkpoint's method, or quantize at load)
FP8_ONLINE = "fp8_per_channel"  # the linear method of --quantization fp8 on a dense checkpoint


def plan_weights(source: ModelSource, dtype: str, quantization: str | None) -> WeightPlan:
    """dtype "auto" or a dtype name; quantization None or a name. An HF folder's config.json is read
    for a quantization_config."""
    if dtype != "auto":
        dtype = dtype_name(dtype)
    source_format = source.format
    scheme = checkpoint_scheme(source)
    if scheme is not None:
        if quantization not in (None, scheme.method):
            raise ModelLoadError(f"{source.path} is a {scheme.method} checkpoint; --quantization "
                                 f"{quantization} does not apply to it: leave --quantization unset (or pass "
                                 f"{scheme.method})")
        if dtype == "bfloat16" and not isinstance(scheme, Fp8Scheme):
            raise ModelLoadError(f"{source.path} is a {scheme.method} checkpoint, run on the quantized kernels "
                                 "with float32 activations; use --dtype auto (or float32)")
        activations = "bfloat16" if dtype == "bfloat16" else "float32"
        return WeightPlan(activations, scheme.method, keep_blocks=True, prequantized=scheme)
    if quantization in PREQUANTIZED_METHODS:
        raise ModelLoadError(f"--quantization {quantization} loads an HF folder stored in that format "
                             f"(config.json with a quantization_config whose quant_method is {quantization!r}); "
                             f"{source.path} is not one: leave --quantization unset for it")
    if quantization is not None:
        error = quantization_error(quantization)
        if error:
            raise ModelLoadError(error)
        if dtype == "bfloat16" and quantization != FP8:
            raise ModelLoadError(f"quantization {quantization!r} runs float32 activations; use --dtype auto "
                                 "(or float32) with it, or drop --quantization for a dense bfloat16 model")
    if quantization == "int8_per_channel":
        return WeightPlan("float32", "int8_per_channel", keep_blocks=False)
    if quantization == FP8:  # vLLM's online fp8: a dense checkpoint's linear weights quantized at load
        return WeightPlan("bfloat16" if dtype == "bfloat16" else "float32", FP8_ONLINE, keep_blocks=False)
    if source_format == "gguf":
        if dtype == "auto" or quantization == "gguf":
            return WeightPlan("float32", "gguf", keep_blocks=True)
        return WeightPlan(dtype, dtype, keep_blocks=False)
    if quantization == "gguf":
        raise ModelLoadError("quantization 'gguf' serves a .gguf file's blocks; this is an HF folder. Pass a "
                             ".gguf file, or use int8_per_channel to quantize this checkpoint at load")
    dense = "float32" if dtype == "auto" else dtype
    return WeightPlan(dense, dense, keep_blocks=False)


def checkpoint_scheme(source: ModelSource) -> GptqAwqScheme | CompressedTensorsScheme | Fp8Scheme | None:
    """The scheme of an HF folder's config.json quantization_config (None: a GGUF, or none)."""
    if source.format != "hf":
        return None
    from pagedcore.loader.hf_loader import read_json

    path = os.path.join(source.path, "config.json")
    if not os.path.isfile(path):
        return None  # config_from_hf reports the missing file
    return prequantized_scheme(read_json(path).get("quantization_config"), path)


def prequantized_scheme(quantization_config: dict | None,
                        path: str) -> GptqAwqScheme | CompressedTensorsScheme | Fp8Scheme | None:
    """The scheme of a quantization_config (None when there is none); other pre-quantized methods are
    refused by name, with what is supported, rather than failing on their tensors."""
    if not quantization_config:
        return None
    method = str(quantization_config.get("quant_method", "unknown")).lower()
    if method in GPTQ_AWQ_METHODS:
        return gptq_awq_scheme(quantization_config, path)
    if method == COMPRESSED_TENSORS:
        return compressed_tensors_scheme(quantization_config, path)
    if method == FP8:
        return fp8_scheme(quantization_config, path)
    raise ModelLoadError(f"{path} is a pre-quantized {method!r} checkpoint; pagedcore loads GPTQ (4 and 8 bits), "
                         "AWQ (4 bits), fp8 (per-tensor / per-channel) and compressed-tensors int8 / int4 / fp8 "
                         "checkpoints, serves GGUF files as stored (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) "
                         "and quantizes dense checkpoints at load with --quantization int8_per_channel or fp8: use the "
                         "model's GGUF, such a checkpoint or its unquantized weights")

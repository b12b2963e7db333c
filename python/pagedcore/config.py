"""`EngineConfig`: every engine knob in one validated dataclass (vLLM's names where they exist).

An invalid value raises ValueError at construction, naming the field, the value and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DTYPES = ("float32", "bfloat16")
# vLLM's --dtype half / float16 (fp16 activations): refused with what to use instead.
FP16_DTYPE_NAMES = ("float16", "half", "fp16")
FP16_REFUSAL = ("--dtype float16 (fp16 activations) is not supported: the CPU kernels compute in float32 or "
                "bfloat16. An fp16 checkpoint runs under --dtype auto (or float32) with its weights held fp16 as "
                "stored, the float32 model at half the weight bytes; --dtype bfloat16 runs bf16 activations")
_FP8_CACHE_DTYPES = ("fp8_e4m3", "fp8_e5m2")   # KV cache only (vLLM's --kv-cache-dtype names)
# EngineConfig.block_size None -> these: vLLM's defaults (128 on its CPU platform, 16 on CUDA); 16 also where a
# draft model proposes, whose scratch blocks and per-step copies of each sequence's tail block grow with the block.
CPU_DEFAULT_BLOCK_SIZE = 128
SMALL_BLOCK_SIZE = 16
# --quantization names (vLLM's where it has one): "gguf" serves a .gguf file's blocks as stored (the
# default for a GGUF under --dtype auto); "int8_per_channel" quantizes a dense checkpoint at load
# (int8 weights, one scale per output channel; W8A8 with dynamic per-token activation scales), named
# like vLLM's online schemes (fp8_per_tensor, fp8_per_block); "fp8" is vLLM's: an fp8 checkpoint's method, or
# a dense checkpoint's weights quantized to e4m3 at load (one scale per output channel; weight-only, fp32
# activations); "gptq" / "awq" / "compressed-tensors" name
# the method of an HF folder stored quantized (optional there, as in vLLM: the checkpoint's
# quantization_config decides). docs/quantization.md says more.
QUANTIZATION_METHODS = ("gguf", "int8_per_channel", "fp8", "gptq", "awq", "compressed-tensors")
# Names vLLM knows for pre-quantized checkpoints or kernels pagedcore does not run: refused with the above.
UNSUPPORTED_QUANTIZATION = ("gptq_marlin", "awq_marlin", "bitsandbytes", "marlin", "ipex", "fbgemm_fp8", "modelopt")


def quantization_error(name: str) -> str | None:
    """Why --quantization `name` is refused (naming what is supported), or None when it is known."""
    if name in QUANTIZATION_METHODS:
        return None
    supported = ("gguf (a .gguf file's blocks served as stored: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), "
                 "int8_per_channel (a dense checkpoint quantized to int8 at load), fp8 (an HF folder of fp8 "
                 "weights, or a dense checkpoint quantized to fp8 e4m3 at load), gptq / awq (an HF folder of "
                 "GPTQ / AWQ weights; the marlin kernels are CUDA's, the checkpoint loads as gptq / awq) or "
                 "compressed-tensors (an HF folder of int8 W8A8, int4 / int8 weight-only or fp8 layers)")
    if name in UNSUPPORTED_QUANTIZATION:
        return f"quantization {name!r} is not supported by pagedcore; use {supported}"
    return f"unknown quantization {name!r}; pagedcore supports {supported}"
_PREEMPTION_MODES = ("recompute", "swap")
_POLICIES = ("fcfs", "priority")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "KI": 1024, "M": 1000**2, "MB": 1000**2,
          "MIB": 1024**2, "MI": 1024**2, "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "GI": 1024**3,
          "T": 1000**4, "TB": 1000**4, "TIB": 1024**4, "TI": 1024**4}


def parse_memory_size(value: int | float | str) -> int | float:
    """'4GiB' / '512MB' / 4e9 -> bytes (int); a number in (0, 1] -> that fraction of available memory (float)."""
    if isinstance(value, bool):
        raise ValueError(f"memory size must be bytes, a size like '4GiB' or a fraction in (0, 1], got {value!r}")
    if isinstance(value, (int, float)):
        if 0 < value <= 1:
            return float(value)
        if value > 1:
            return int(value)
        raise ValueError(f"memory size must be > 0, got {value!r}")
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"cannot read memory size {value!r}; write bytes, '4GiB', '512MB' or a fraction like 0.3")
    number, unit = float(m.group(1)), (m.group(2) or "").upper()
    if unit == "" and 0 < number <= 1:
        return number
    return int(number * _UNITS[unit])


@dataclass
class EngineConfig:
    model: str | None = None                 # HF folder or .gguf file; None = the bundled default
    dtype: str = "auto"                      # weights, activations and KV cache: auto | float32 | bfloat16
                                             # (auto: a GGUF keeps its blocks, fp32 activations; an HF folder,
                                             # or any model on a GPU or with tensor parallelism, float32)
    quantization: str | None = None          # None | gguf | int8_per_channel | gptq | awq | ... (QUANTIZATION_METHODS)
    # vLLM's --kv-cache-dtype: auto | float32 | bfloat16 | fp8 (= fp8_e4m3) | fp8_e4m3 | fp8_e5m2. auto is the
    # activations' dtype, except for a GGUF run as stored in-process on the CPU, whose fp32 activations get a
    # bf16 cache (half the cache's bytes and attention's reads; keys and values are rounded to bf16 as they
    # are written). fp8: a quarter of fp32's bytes, values rounded to OCP fp8 with scale 1 and saturated, as
    # vLLM without calibrated scales. A dtype other than the activations' is for in-process CPU engines only.
    kv_cache_dtype: str = "auto"
    # Tokens per KV block. None: 128 on the CPU, as vLLM-CPU (a head's keys of a block lie in one 16 KB run that
    # the hardware prefetcher follows: the fixed workload's attention took 7-19% less time than with 16 on the
    # Zen 5 VM, docs/performance.md), 16 on
    # a GPU (vLLM's CUDA default) or with a draft model's speculation. The prefix cache reuses whole blocks:
    # 16 finds shorter shared prefixes.
    block_size: int | None = None
    max_num_seqs: int = 256                  # sequences per step
    max_num_batched_tokens: int | None = None  # token budget per step; None = 2048 (>= max_model_len unchunked)
    max_model_len: int | None = None         # prompt + output; None = the model's context length, at most 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"       # recompute | swap
    scheduling_policy: str = "fcfs"          # fcfs | priority
    kv_cache_memory: int | float | str | None = None  # bytes, '4GiB' or a fraction of available memory; None = 4 GiB capped at 40%
    swap_space: int | float | str = "1GiB"   # CPU swap pool for preemption_mode=swap (bytes or size string)
    num_gpu_blocks_override: int | None = None  # force the number of KV blocks (tests, simulations)
    # Host memory of the KV cache made resident: "background" (a thread commits it while the engine
    # serves; engine/host_memory.py) or "startup" (before the engine returns: benchmarks, for a quiet
    # machine from the first step). No vLLM counterpart: vLLM-CPU zero-fills its cache at start-up.
    kv_cache_commit: str = "background"
    num_threads: int | None = None           # torch and kernel threads; None = all cores
    seed: int = 0                            # seed of the global sampling generator
    device: str = "cpu"                      # cpu | cuda[:N]
    gpu_memory_utilization: float = 0.9      # on a GPU: share of its memory for weights, activations and KV cache
    enable_trace: bool = False               # per-step engine trace (the live simulator)
    max_logprobs: int = 20                   # the largest logprobs / prompt_logprobs a request may ask for
    # Speculative decoding (vLLM's speculative_config): a dict such as {"method": "ngram",
    # "num_speculative_tokens": 4}, validated into a spec_decode.SpeculativeConfig; None = off.
    speculative_config: object = None
    # vLLM's num_scheduler_steps (multi-step scheduling): greedy decode steps run up to this many tokens
    # a sequence in one scheduler step and one C++ call (engine/multi_step.py); 1 = one token a step.
    num_scheduler_steps: int = 1
    # Multi-LoRA (vLLM's names; docs/lora.md): adapters per step, their largest rank, adapters kept loaded.
    enable_lora: bool = False
    max_loras: int = 1                       # distinct adapters in one step (the weight slots)
    max_lora_rank: int = 16                  # the largest adapter rank accepted
    max_cpu_loras: int | None = None         # adapters kept loaded (an LRU); None = max_loras
    # Parallelism (vLLM's names; docs/distributed.md). tensor x pipeline ranks run the model in worker
    # processes (or Ray actors) driven by this engine's one scheduler; data-parallel replicas are whole
    # engines behind one front end. All 1: the model runs in this process, as before.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # mp | ray; None = mp when a model needs more than one rank

    def __post_init__(self):
        def fail(field, allowed):
            raise ValueError(f"EngineConfig.{field} must be {allowed}, got {getattr(self, field)!r}")

        if self.dtype in ("fp32", "float"):
            self.dtype = "float32"
        if self.dtype in ("bf16",):
            self.dtype = "bfloat16"
        if self.dtype in FP16_DTYPE_NAMES:
            raise ValueError(FP16_REFUSAL)
        if self.dtype not in (*_DTYPES, "auto"):
            fail("dtype", "one of " + ", ".join((*_DTYPES, "auto")))
        if self.dtype == "auto" and self.quantization is None and self.device != "cpu":
            # The quantized kernels run on the CPU only: on a GPU a GGUF is dequantised to float32 (an HF
            # folder is float32 under auto anyway). CPU tensor-parallel ranks cut the blocks as stored.
            self.dtype = "float32"
        self.kv_cache_dtype = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp8": "fp8_e4m3"}.get(
            self.kv_cache_dtype, self.kv_cache_dtype)
        if self.kv_cache_dtype not in (*_DTYPES, *_FP8_CACHE_DTYPES, "auto"):
            fail("kv_cache_dtype", "one of " + ", ".join(("auto", *_DTYPES, "fp8", *_FP8_CACHE_DTYPES)))
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype != self.dtype:
            where = ("device " + repr(self.device) if self.device != "cpu" else
                     "tensor or pipeline parallelism" if self.tensor_parallel_size * self.pipeline_parallel_size > 1
                     else None)
            if where is not None:
                raise ValueError(f"EngineConfig.kv_cache_dtype {self.kv_cache_dtype!r} differs from the activations' "
                                 f"and is supported in-process on the CPU only, not with {where}; drop "
                                 "--kv-cache-dtype or pass auto")
        if self.quantization is not None and quantization_error(self.quantization):
            raise ValueError(f"EngineConfig.quantization: {quantization_error(self.quantization)}")
        if self.block_size is None:
            self.block_size = self.default_block_size()
        for field in ("block_size", "max_num_seqs"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                fail(field, "a positive integer")
        if self.block_size & (self.block_size - 1):
            fail("block_size", "a power of two (8, 16, 32, ...)")
        for field in ("max_num_batched_tokens", "max_model_len", "num_gpu_blocks_override", "num_threads"):
            v = getattr(self, field)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                fail(field, "None or a positive integer")
        if self.preemption_mode not in _PREEMPTION_MODES:
            fail("preemption_mode", "'recompute' or 'swap'")
        if self.scheduling_policy not in _POLICIES:
            fail("scheduling_policy", "'fcfs' or 'priority'")
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            fail("device", "'cpu' or 'cuda[:N]'")
        if not (isinstance(self.gpu_memory_utilization, (int, float)) and 0 < self.gpu_memory_utilization <= 1):
            fail("gpu_memory_utilization", "a fraction in (0, 1]")
        if self.kv_cache_memory is not None:
            parse_memory_size(self.kv_cache_memory)
        if self.kv_cache_commit not in ("background", "startup"):
            fail("kv_cache_commit", "'background' or 'startup'")
        if parse_memory_size(self.swap_space) is None:
            fail("swap_space", "bytes or a size like '1GiB'")
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            fail("max_logprobs", "an integer >= 0")
        for field in ("max_loras", "max_lora_rank"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                fail(field, "a positive integer")
        for field in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                fail(field, "a positive integer")
        if self.distributed_executor_backend not in (None, "mp", "ray"):
            fail("distributed_executor_backend", "'mp' (local processes) or 'ray' (a Ray cluster)")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif isinstance(self.max_cpu_loras, bool) or not isinstance(self.max_cpu_loras, int) \
                or self.max_cpu_loras < self.max_loras:
            fail("max_cpu_loras", f"None or an integer >= max_loras ({self.max_loras})")
        if self.enable_lora and self.device != "cpu":
            raise ValueError(f"EngineConfig.enable_lora: the LoRA kernel runs on the CPU only, and device is "
                             f"{self.device!r}; use --device cpu or drop --enable-lora")
        from pagedcore.spec_decode.config import SpeculativeConfig  # light: no engine imports
        self.speculative_config = SpeculativeConfig.from_value(self.speculative_config)
        steps = self.num_scheduler_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 64:
            fail("num_scheduler_steps", "an integer from 1 to 64")
        if steps > 1 and self.speculative_config is not None:
            raise ValueError("EngineConfig.num_scheduler_steps > 1 and speculative_config both run several tokens a "
                             "sequence per step and cannot be combined; drop one of them")

    def default_block_size(self) -> int:
        """block_size None: CPU_DEFAULT_BLOCK_SIZE on the CPU (tensor and pipeline ranks too), SMALL_BLOCK_SIZE on
        a GPU or where a draft model proposes (spec_decode/draft_proposer.py copies each proposing sequence's
        tail block into scratch blocks every step: up to 127 tokens of K/V a layer at 128)."""
        from pagedcore.spec_decode.config import DRAFT_METHODS, SpeculativeConfig  # light: no engine imports

        spec = SpeculativeConfig.from_value(self.speculative_config)
        if self.device != "cpu" or (spec is not None and spec.method in DRAFT_METHODS):
            return SMALL_BLOCK_SIZE
        return CPU_DEFAULT_BLOCK_SIZE

    def resolve_dtype(self, model_dtype: str, kv_cache_default: str | None = None) -> None:
        """dtype "auto" becomes the loaded model's activation dtype; kv_cache_dtype "auto" becomes
        kv_cache_default where the engine gives one (a GGUF run as stored, in-process on the CPU:
        bfloat16, as llama.cpp keeps an f16 cache and vLLM a 16-bit one for a GGUF), else dtype."""
        if self.dtype == "auto":
            self.dtype = model_dtype
        if self.kv_cache_dtype == "auto":
            self.kv_cache_dtype = kv_cache_default or self.dtype

    def resolve_lengths(self, model_max_len: int) -> None:
        """Fills max_model_len / max_num_batched_tokens from the model and checks them against each other."""
        if self.max_model_len is None:
            self.max_model_len = min(model_max_len, 8192)
        elif self.max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} is longer than the model's context length {model_max_len}; "
                f"use --max-model-len <= {model_max_len}")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = 2048 if self.enable_chunked_prefill else max(2048, self.max_model_len)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})")

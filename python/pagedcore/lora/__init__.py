"""Multi-LoRA serving: PEFT adapters over one copy of the base weights, mixed freely in a step.

LoRARequest names an adapter (vLLM's spelling); LoRAManager loads adapters (an LRU of at most
max_cpu_loras), keeps up to max_loras of them in the per-layer weight stacks and builds each step's
row -> adapter metadata; the C++ kernel (cpp/kernels/lora_kernel.h) adds the low-rank terms of
every adapter in one call per layer. docs/lora.md has the whole picture.
"""

from pagedcore.lora.errors import LoRAError, LoRANotFoundError
from pagedcore.lora.manager import LoRAManager
from pagedcore.lora.request import LoRARequest

__all__ = ["LoRAError", "LoRAManager", "LoRANotFoundError", "LoRARequest"]

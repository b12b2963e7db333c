"""LoRARequest: which adapter a request runs, spelt as vLLM spells it."""

from __future__ import annotations

from dataclasses import dataclass

from pagedcore.lora.errors import LoRAError


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str                 # what clients call it (OpenAI `model`, TGIS `adapter_id`)
    lora_int_id: int               # > 0, unique per adapter: the scheduler's and the prefix cache's key
    lora_path: str                 # a PEFT folder: adapter_config.json + adapter_model.safetensors
    base_model_name: str | None = None  # the parent /v1/models lists (None: the served model)

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise LoRAError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id <= 0:
            raise LoRAError(f"lora_int_id must be an integer > 0 (0 is the base model), got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise LoRAError(f"lora_path must name a PEFT adapter folder, got {self.lora_path!r}")

    # vLLM's older attribute names, for code written against them.
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

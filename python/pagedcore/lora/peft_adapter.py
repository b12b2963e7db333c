"""A PEFT LoRA adapter folder read into the model's layout: A and scaled B per target, per fused shard.

PEFT stores one (A [r, in], B [out, r]) pair per adapted projection under the HF module name
(`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`); our q/k/v and gate/up are
fused (qkv_proj, gate_up_proj), so each pair lands on its shard of the fused layer. Scaling is
folded into B once here: lora_alpha / r, or lora_alpha / sqrt(r) for rsLoRA.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from pagedcore.lora.errors import LoRAError
from pagedcore.lora.request import LoRARequest

# HF projection -> (our layer's name beside it, shard id in that layer; None: the whole layer).
TARGETS = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "o_proj": ("o_proj", None),
    "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
    "down_proj": ("down_proj", None),
}
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<which>lora_A|lora_B)(?:\.[A-Za-z0-9_]+)?\.weight$")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass
class LoRAAdapter:
    """One adapter in the model's layout, on the CPU in fp32."""

    request: LoRARequest
    rank: int  # the largest rank of any target
    # Our layer name ("model.layers.3.self_attn.qkv_proj") -> shard id (None: whole layer) ->
    # (A [r, in], scaling * B [shard_out, r]).
    layers: dict[str, dict[str | None, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * 4 + b.numel() * 4 for shards in self.layers.values() for a, b in shards.values())


def _fail(request: LoRARequest, msg: str) -> LoRAError:
    return LoRAError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): {msg}")


def read_adapter_config(request: LoRARequest) -> dict:
    folder = request.lora_path
    if not os.path.isdir(folder):
        raise _fail(request, "no such folder; lora_path must be a PEFT adapter folder on this machine")
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(path):
        raise _fail(request, f"{CONFIG_FILE} is missing; a PEFT LoRA folder holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise _fail(request, f"{CONFIG_FILE} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise _fail(request, f"{CONFIG_FILE} must hold a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise _fail(request, f"peft_type is {peft_type}; pagedcore serves LoRA adapters only")
    refusals = {
        "modules_to_save": "modules_to_save (fully trained extra modules such as lm_head or embed_tokens) is not "
                           "supported; train the adapter without modules_to_save",
        "use_dora": "DoRA adapters (use_dora) are not supported; use a plain LoRA adapter",
        "fan_in_fan_out": "fan_in_fan_out adapters (GPT-2 Conv1D layout) do not fit Llama-family projections",
        "alpha_pattern": "alpha_pattern (a lora_alpha per module) is not supported; give one lora_alpha",
    }
    for key, why in refusals.items():
        if config.get(key):
            raise _fail(request, f"{key} = {config[key]!r}: {why}")
    if config.get("bias", "none") != "none":
        raise _fail(request, f"bias = {config['bias']!r}: adapters that train biases are not supported "
                             "(bias must be 'none')")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _fail(request, f"{CONFIG_FILE} needs a positive {key}, got {value!r}")
    return config


def _read_weights(request: LoRARequest) -> dict[str, torch.Tensor]:
    folder = request.lora_path
    path = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(folder, "adapter_model.bin")):
            raise _fail(request, "only adapter_model.bin (a pickle) is present; pagedcore loads safetensors only, "
                                 "which cannot run code: re-save with save_pretrained(..., safe_serialization=True)")
        raise _fail(request, f"{WEIGHTS_FILE} is missing")
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except Exception as e:  # a truncated or corrupt file: safetensors raises its own error types
        raise _fail(request, f"{WEIGHTS_FILE} cannot be read ({type(e).__name__}: {e}); "
                             "is the file complete?") from None


def load_peft_adapter(request: LoRARequest, model: nn.Module, max_lora_rank: int) -> LoRAAdapter:
    """Reads, checks against `model` (names, layer count, shapes) and lays out one adapter.
    Raises LoRAError naming the file, the field or the shape and the fix."""
    from pagedcore.layers.linear import Linear

    config = read_adapter_config(request)
    tensors = _read_weights(request)
    alpha = float(config["lora_alpha"])
    rslora = bool(config.get("use_rslora", False))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            if "lora_embedding" in key or "lora_magnitude" in key:
                raise _fail(request, f"tensor {key!r}: embedding LoRA and DoRA are not supported")
            raise _fail(request, f"tensor {key!r} is not a LoRA A or B matrix of a projection")
        pairs.setdefault(m["module"], {})[m["which"]] = tensor
    if not pairs:
        raise _fail(request, f"{WEIGHTS_FILE} holds no lora_A / lora_B tensors")
    adapter = LoRAAdapter(request=request, rank=0)
    for module, pair in sorted(pairs.items()):
        parent, _, projection = module.rpartition(".")
        if projection not in TARGETS:
            raise _fail(request, f"it adapts {module!r}; pagedcore adapts the q/k/v/o and gate/up/down projections "
                                 f"({', '.join(TARGETS)})")
        if set(pair) != {"lora_A", "lora_B"}:
            raise _fail(request, f"{module!r} has {sorted(pair)} but needs both lora_A and lora_B")
        ours, shard = TARGETS[projection]
        layer_name = f"{parent}.{ours}"
        try:
            layer = model.get_submodule(layer_name)
        except AttributeError:
            layer = None
        if not isinstance(layer, Linear):
            raise _fail(request, f"it adapts {module!r}, which this model does not have (base-model mismatch: was "
                                 "the adapter trained for another model? it names "
                                 f"{config.get('base_model_name_or_path')!r})")
        a, b = pair["lora_A"], pair["lora_B"]
        out_rows = layer.out_features if shard is None else layer.shard_rows[shard][1]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != layer.in_features or b.shape[0] != out_rows \
                or a.shape[0] != b.shape[1]:
            raise _fail(request, f"{module!r} has A {tuple(a.shape)} and B {tuple(b.shape)}, but this model's "
                                 f"projection is [{out_rows}, {layer.in_features}] (A must be "
                                 f"[r, {layer.in_features}], B [{out_rows}, r]): base-model mismatch; was it trained for "
                                 f"{config.get('base_model_name_or_path')!r}?")
        rank = a.shape[0]
        if rank > max_lora_rank:
            raise _fail(request, f"{module!r} has rank {rank}, above --max-lora-rank {max_lora_rank}; restart with "
                                 f"--max-lora-rank {rank} or more")
        scaling = alpha / math.sqrt(rank) if rslora else alpha / rank
        a32 = a.to(torch.float32).contiguous()
        b32 = (b.to(torch.float32) * scaling).contiguous()
        if not (torch.isfinite(a32).all() and torch.isfinite(b32).all()):
            raise _fail(request, f"{module!r} holds NaN or infinite values")
        adapter.layers.setdefault(layer_name, {})[shard] = (a32, b32)
        adapter.rank = max(adapter.rank, rank)
    return adapter

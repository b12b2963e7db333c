"""Fixtures for the LoRA tests: a tiny random Llama (HF folder), PEFT adapters made on it with
random non-zero A and B, and HF's merged models (merge_and_unload) as the reference."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

from tests.models import tiny_models


@dataclass
class AdapterSpec:
    name: str
    rank: int
    targets: tuple[str, ...]
    alpha: float
    rslora: bool = False


# Several ranks and target sets; one rsLoRA. Ids are 1-based positions in this list.
ADAPTERS = [
    AdapterSpec("attn-r4", 4, ("q_proj", "v_proj"), 8.0),
    AdapterSpec("all-r8", 8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), 16.0),
    AdapterSpec("mlp-r16-rs", 16, ("gate_proj", "down_proj", "k_proj"), 4.0, rslora=True),
]


def make_peft_adapter(hf_model, folder, spec: AdapterSpec, seed: int):
    """Saves a PEFT LoRA adapter of hf_model in folder (A and B random, non-zero) and returns
    HF's model with it merged (merge_and_unload), fp32, eval mode."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets), lora_dropout=0.0,
                        bias="none", use_rslora=spec.rslora, init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.1)
    peft_model.save_pretrained(str(folder))
    return peft_model.merge_and_unload().eval()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """(hf_model, folder) of a tiny random Llama (GQA 8:2, llama3 RoPE scaling), fp32."""
    hf_model = tiny_models.build_hf_model("llama")
    folder = tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("lora_tiny_llama"))
    return hf_model, folder


@pytest.fixture(scope="session")
def adapters(tiny_base, tmp_path_factory):
    """[(spec, adapter folder, merged HF model)] for ADAPTERS."""
    hf_model, _ = tiny_base
    out = []
    for i, spec in enumerate(ADAPTERS):
        folder = tmp_path_factory.mktemp(f"adapter_{spec.name}")
        out.append((spec, str(folder), make_peft_adapter(hf_model, folder, spec, seed=100 + i)))
    return out

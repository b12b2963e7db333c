"""Reading PEFT folders and the adapter LRU: every bad input is a clear LoRAError and disturbs nothing."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from pagedcore.lora import LoRAError, LoRAManager, LoRANotFoundError, LoRARequest

from .conftest import AdapterSpec, make_peft_adapter


@pytest.fixture(scope="module")
def base_model(tiny_base):
    from pagedcore.loader import load_model

    return load_model(tiny_base[1], dtype="float32").model


@pytest.fixture()
def manager(base_model):
    live = set()
    m = LoRAManager(base_model, max_loras=2, max_lora_rank=16, max_cpu_loras=2, is_request_live=live.__contains__)
    m.live = live
    yield m
    for module in base_model.modules():  # the fixture model is shared: take the hooks off again
        if getattr(module, "lora", None) is not None:
            module.lora = None


def copy_adapter(adapters, tmp_path, index=0):
    dst = tmp_path / f"copy{index}"
    shutil.copytree(adapters[index][1], dst)
    return dst


def test_loads_into_fused_layout(manager, adapters):
    spec, folder, _ = adapters[0]  # q and v of rank 4
    manager.add_adapter(LoRARequest(spec.name, 1, folder))
    adapter = manager._loaded[1]
    assert adapter.rank == 4
    shards = adapter.layers["model.layers.0.self_attn.qkv_proj"]
    assert set(shards) == {"q", "v"}
    a, b = shards["q"]
    assert a.shape == (4, 128) and b.shape == (128, 4)
    assert "model.layers.0.mlp.gate_up_proj" not in adapter.layers


def test_missing_and_corrupt_files(manager, adapters, tmp_path):
    with pytest.raises(LoRAError, match="no such folder"):
        manager.add_adapter(LoRARequest("gone", 1, str(tmp_path / "nope")))
    folder = copy_adapter(adapters, tmp_path)
    os.remove(folder / "adapter_config.json")
    with pytest.raises(LoRAError, match="adapter_config.json is missing"):
        manager.add_adapter(LoRARequest("noconfig", 1, str(folder)))
    folder = copy_adapter(adapters, tmp_path, 1)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoRAError, match="not valid JSON"):
        manager.add_adapter(LoRARequest("badjson", 1, str(folder)))
    folder = copy_adapter(adapters, tmp_path, 2)
    data = (folder / "adapter_model.safetensors").read_bytes()
    (folder / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(LoRAError, match="cannot be read"):
        manager.add_adapter(LoRARequest("truncated", 1, str(folder)))
    os.remove(folder / "adapter_model.safetensors")
    (folder / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(LoRAError, match=r"adapter_model.bin \(a pickle\)"):
        manager.add_adapter(LoRARequest("pickled", 1, str(folder)))
    assert manager.list_adapters() == []  # nothing half-registered


@pytest.mark.parametrize("field, value, message", [
    ("modules_to_save", ["lm_head"], "modules_to_save"),
    ("use_dora", True, "DoRA"),
    ("bias", "all", "bias"),
    ("peft_type", "IA3", "LoRA adapters only"),
])
def test_refused_config_fields(manager, adapters, tmp_path, field, value, message):
    folder = copy_adapter(adapters, tmp_path)
    config = json.loads((folder / "adapter_config.json").read_text())
    config[field] = value
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(LoRAError, match=message):
        manager.add_adapter(LoRARequest("x", 1, str(folder)))


def test_rank_above_limit(base_model, adapters):
    spec, folder, _ = adapters[2]  # rank 16
    m = LoRAManager(base_model, max_loras=1, max_lora_rank=8, max_cpu_loras=1)
    try:
        with pytest.raises(LoRAError, match=r"rank 16, above --max-lora-rank 8; restart with --max-lora-rank 16"):
            m.add_adapter(LoRARequest(spec.name, 3, folder))
    finally:
        for module in base_model.modules():
            if getattr(module, "lora", None) is not None:
                module.lora = None


def test_base_model_mismatch(manager, tmp_path):
    from tests.models import tiny_models

    other = tiny_models.build_hf_model("llama_tied")  # 4 KV heads: k/v projections of another shape
    make_peft_adapter(other, tmp_path / "other", AdapterSpec("other", 4, ("k_proj",), 8.0), seed=1)
    with pytest.raises(LoRAError, match="base-model mismatch"):
        manager.add_adapter(LoRARequest("other", 1, str(tmp_path / "other")))


def test_names_ids_and_not_found(manager, adapters):
    (s0, f0, _), (s1, f1, _) = adapters[0], adapters[1]
    manager.add_adapter(LoRARequest(s0.name, 1, f0))
    manager.add_adapter(LoRARequest(s0.name, 1, f0))  # the same again: fine
    with pytest.raises(LoRAError, match="already used by adapter"):
        manager.add_adapter(LoRARequest("another-name", 1, f1))
    with pytest.raises(LoRAError, match="already loaded"):
        manager.add_adapter(LoRARequest(s0.name, 2, f1))
    with pytest.raises(LoRANotFoundError, match=f"loaded adapters: {s0.name}"):
        manager.get("nope")
    manager.remove_adapter(s0.name)
    assert manager.list_adapters() == []
    with pytest.raises(LoRAError, match="give this adapter a new id"):  # its KV may still be in the prefix cache
        manager.add_adapter(LoRARequest(s0.name, 1, f0))
    manager.add_adapter(LoRARequest(s0.name, 7, f0))


def test_lru_evicts_unused_and_refuses_when_all_in_use(manager, adapters):
    reqs = [LoRARequest(spec.name, i + 1, folder) for i, (spec, folder, _) in enumerate(adapters)]
    manager.acquire(reqs[0], "r0")
    manager.acquire(reqs[1], "r1")
    manager.live.update({"r0", "r1"})
    with pytest.raises(LoRAError, match="all 2 loaded adapters .* in use"):
        manager.acquire(reqs[2], "r2")
    assert set(manager._loaded) == {1, 2}  # nothing disturbed
    manager.live.discard("r0")  # r0 finished: adapter 1 may go
    manager.acquire(reqs[2], "r2")
    assert list(manager._loaded) == [2, 3]
    with pytest.raises(LoRAError, match="unfinished request"):
        manager.remove_adapter(reqs[1].lora_name)


def test_prepare_groups_tokens_by_slot(manager, adapters):
    import numpy as np

    reqs = [LoRARequest(spec.name, i + 1, folder) for i, (spec, folder, _) in enumerate(adapters[:2])]
    for r in reqs:
        manager.add_adapter(r)
    # seqs: adapter 2 (3 tokens), base (2), adapter 1 (1), adapter 2 (2)
    manager.prepare(np.array([2, 0, 1, 2], dtype=np.uint64), np.array([0, 3, 5, 6, 8], dtype=np.int32))
    batch = manager.batch_ref.batch
    slot2, slot1 = manager._slot_ids.index(2), manager._slot_ids.index(1)
    rows_by_slot = {}
    starts = batch.segment_starts.tolist()
    for g, slot in enumerate(batch.segment_slots.tolist()):
        rows_by_slot[slot] = batch.token_indices[starts[g]:starts[g + 1]].tolist()
    assert rows_by_slot == {slot2: [0, 1, 2, 6, 7], slot1: [5]}
    manager.prepare(np.zeros(2, dtype=np.uint64), np.array([0, 1, 2], dtype=np.int32))
    assert manager.batch_ref.batch is None

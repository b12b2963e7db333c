"""With --enable-lora the C++ decoder stack runs the steps that have no adapter rows (base-model
traffic) as before: bit for bit the layer loop. Steps with adapter rows run in the stack too
(test_stack_lora.py holds them to the layer loop, test_engine_vs_hf.py mixed runs to HF)."""

from __future__ import annotations

import numpy as np
import torch

from pagedcore.loader import load_model
from pagedcore.lora import LoRAManager, LoRARequest

from ..models.paged_driver import PagedDriver
from ..models.test_decoder_stack import _stack_and_loop
from ..models.test_llama_parity import random_prompt


def test_the_stack_runs_base_steps_with_lora_enabled(tiny_base, adapters):
    model = load_model(tiny_base[1], dtype="float32").model
    manager = LoRAManager(model, max_loras=2, max_lora_rank=16, max_cpu_loras=2)
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    stack = model.model._decoder_stack()
    assert stack.lora_batch is manager.batch_ref
    driver = PagedDriver(model, seed=5)
    for seq_id, length in {0: 5, 1: 17}.items():
        driver.step([(seq_id, random_prompt(length, seed=seq_id))])

    manager.prepare(None, np.array([0, 1, 2], dtype=np.int32))  # a base-only step
    by_stack, by_loop = _stack_and_loop(model, driver, [(0, [7]), (1, [8])])
    for name, got, want in zip(("hidden", "residual", "kv_cache"), by_stack, by_loop):
        assert torch.equal(got, want), name

    spec, folder, _ = adapters[1]  # every projection adapted
    request = manager.add_adapter(LoRARequest(spec.name, 2, folder))
    manager.acquire(request, "r1")
    manager.prepare(np.array([2, 0], dtype=np.uint64), np.array([0, 1, 2], dtype=np.int32))  # seq 0 adapted
    hidden = torch.zeros(2, model.config.hidden_size)
    assert stack.takes(hidden, driver.kv_cache)  # adapter rows too: the stack adds their terms (test_stack_lora.py)
    manager.clear_step()
    assert stack.takes(hidden, driver.kv_cache)

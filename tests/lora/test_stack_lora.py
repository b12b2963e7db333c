"""Adapter steps inside the C++ decoder stack: the same mixed batches (the base model and three
adapters, prefill, chunked prefill, decode, padding; fp32 and bf16) run with the stack on and with
it off (PAGEDCORE_DECODER_STACK=0: the Python layer loop, which test_engine_vs_hf.py holds to HF
with the adapters merged) give the same logits and KV cache bit for bit, greedy tokens fed back;
and the stack did run those steps (its lora_steps counter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore.loader import load_model
from pagedcore.lora import LoRAManager, LoRARequest

from ..models.paged_driver import PagedDriver
from ..models.test_decoder_stack import _stack_and_loop
from ..models.test_llama_parity import random_prompt

# Sequence id -> adapter id (0: the base model). Two sequences share adapter 2 (one segment of
# several sequences), adapter 1 adapts every projection, adapter 3 the MLP and k (rsLoRA).
SEQ_ADAPTERS = {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 0}
PROMPT_LENS = {0: 5, 1: 17, 2: 9, 3: 12, 4: 6, 5: 3}
NUM_DECODE_STEPS = 5


def _model_with_adapters(folder, adapters, dtype, **load_args):
    model = load_model(folder, dtype=dtype, load_tokenizer=False, **load_args).model
    manager = LoRAManager(model, max_loras=3, max_lora_rank=16, max_cpu_loras=3)
    for i, (spec, path, _) in enumerate(adapters):
        manager.acquire(LoRARequest(spec.name, i + 1, path), f"request-{i}")
    return model, manager


def _run(model, manager, stack_on: bool, monkeypatch) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """The step script below with the stack on or off: (logits of every step, the KV cache, the
    stack's lora_steps; -1 with the stack off)."""
    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "1" if stack_on else "0")
    model.model.refresh_decoder_stack()
    stack = model.model._decoder_stack()
    assert (stack is not None) == stack_on, model.decoder_stack_status.reason
    driver = PagedDriver(model, seed=5)
    prompts = {seq: random_prompt(n, seed=10 + seq) for seq, n in PROMPT_LENS.items()}
    last: dict[int, int] = {}  # seq -> its greedy next token

    def step(chunks, num_padding=0):
        lens = [len(tokens) for _, tokens in chunks]
        query_start_loc = np.concatenate(([0], np.cumsum(lens))).astype(np.int32)
        manager.prepare(np.array([SEQ_ADAPTERS[seq] for seq, _ in chunks], dtype=np.uint64), query_start_loc)
        logits = driver.step(chunks, num_padding)  # fp32 [num_real_tokens, vocab]
        for (seq, _), end in zip(chunks, query_start_loc[1:]):
            last[seq] = int(logits[end - 1].argmax())
        return logits

    out = [step([(0, prompts[0]), (1, prompts[1]), (2, prompts[2])])]  # prefill: base + two adapters
    # decodes, a new prompt's first chunk, a whole new prompt (sharing adapter 2), padding rows
    out.append(step([(0, [last[0]]), (1, [last[1]]), (3, prompts[3][:7]), (2, [last[2]]), (4, prompts[4])], 2))
    out.append(step([(3, prompts[3][7:]), (1, [last[1]]), (5, prompts[5])]))  # the chunk's rest
    for _ in range(NUM_DECODE_STEPS):
        out.append(step([(seq, [last[seq]]) for seq in sorted(last)]))
    out.append(step([(3, [last[3]])]))  # one adapter row alone
    manager.clear_step()
    return out, driver.kv_cache, -1 if stack is None else stack.lora_steps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adapter_steps_in_the_stack_equal_the_layer_loop(tiny_base, adapters, dtype, monkeypatch):
    model, manager = _model_with_adapters(tiny_base[1], adapters, dtype)
    by_stack, stack_cache, lora_steps = _run(model, manager, True, monkeypatch)
    by_loop, loop_cache, _ = _run(model, manager, False, monkeypatch)
    assert lora_steps == len(by_stack), "every step had adapter rows: the stack should have run them all"
    for i, (got, want) in enumerate(zip(by_stack, by_loop)):
        assert torch.equal(got, want), f"step {i}: logits differ by {(got - want).abs().max().item()}"
    assert torch.equal(stack_cache, loop_cache)


def test_a_quantized_model_runs_adapters_in_the_stack_as_the_loop(tiny_base, adapters, monkeypatch):
    """int8_per_channel weights: the adapter hooks see only x and y, the stack runs the quantized
    kernels without the fused SwiGLU in adapter steps, then silu_mul, as the loop does."""
    model, manager = _model_with_adapters(tiny_base[1], adapters, "float32", quantization="int8_per_channel")
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    by_stack, stack_cache, lora_steps = _run(model, manager, True, monkeypatch)
    by_loop, loop_cache, _ = _run(model, manager, False, monkeypatch)
    assert lora_steps == len(by_stack)
    for i, (got, want) in enumerate(zip(by_stack, by_loop)):
        assert torch.equal(got, want), f"step {i}: logits differ by {(got - want).abs().max().item()}"
    assert torch.equal(stack_cache, loop_cache)


def test_the_stack_holds_every_layer_state_to_the_loop(tiny_base, adapters):
    """One mixed adapter step: hidden, residual and every cache slot after the last layer, bit for bit
    (a difference the logits could round away would show here)."""
    model, manager = _model_with_adapters(tiny_base[1], adapters, "float32")
    driver = PagedDriver(model, seed=7)
    for seq, length in {0: 5, 1: 17, 2: 9}.items():
        manager.prepare(np.array([SEQ_ADAPTERS[seq]], dtype=np.uint64), np.array([0, length], dtype=np.int32))
        driver.step([(seq, random_prompt(length, seed=seq))])
    chunks = [(0, [7]), (1, [8]), (3, random_prompt(4, seed=3)), (2, [9])]
    manager.prepare(np.array([SEQ_ADAPTERS[seq] for seq, _ in chunks], dtype=np.uint64),
                    np.array([0, 1, 2, 6, 7], dtype=np.int32))
    stack = model.model._decoder_stack()
    before = stack.lora_steps
    by_stack, by_loop = _stack_and_loop(model, driver, chunks, num_padding=1)
    assert stack.lora_steps == before + 1
    for name, got, want in zip(("hidden", "residual", "kv_cache"), by_stack, by_loop):
        assert torch.equal(got, want), f"{name}: max diff {(got - want).abs().max().item()}"


def test_a_slot_refilled_after_binding_is_what_the_stack_reads(tiny_base, adapters, monkeypatch):
    """The stack binds the slot stacks once; an adapter loaded into a slot later (here: more adapters
    than slots, so slots are reused) is read through the same pointers."""
    model = load_model(tiny_base[1], dtype="float32", load_tokenizer=False).model
    manager = LoRAManager(model, max_loras=1, max_lora_rank=16, max_cpu_loras=3)
    for i, (spec, path, _) in enumerate(adapters):
        manager.acquire(LoRARequest(spec.name, i + 1, path), f"request-{i}")
    stack = model.model._decoder_stack()
    prompt = random_prompt(11, seed=1)
    qsl = np.array([0, len(prompt)], dtype=np.int32)
    results = {}
    for stack_on in (True, False):
        monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "1" if stack_on else "0")
        model.model.refresh_decoder_stack()
        for adapter_id in (1, 2, 3, 1):  # one slot: each adapter overwrites the previous one
            manager.prepare(np.array([adapter_id], dtype=np.uint64), qsl)
            results.setdefault(adapter_id, []).append(PagedDriver(model, seed=3).step([(0, prompt)]))
    manager.clear_step()
    for adapter_id, runs in results.items():
        assert all(torch.equal(runs[0], other) for other in runs[1:]), f"adapter {adapter_id}"
    assert not torch.equal(results[1][0], results[2][0])
    del stack


def test_base_rows_of_an_adapter_step_equal_a_base_only_step(tiny_base, adapters):
    """In an adapter step the stack runs gate_up unfused and silu_mul after it; a base row must still get
    the bits of a step without adapters (fused SwiGLU epilogue), for fp32 and bf16."""
    for dtype in ("float32", "bfloat16"):
        model, manager = _model_with_adapters(tiny_base[1], adapters, dtype)
        driver = PagedDriver(model, seed=9)
        for seq, length in {0: 6, 1: 13}.items():
            manager.prepare(np.array([SEQ_ADAPTERS[seq]], dtype=np.uint64), np.array([0, length], dtype=np.int32))
            driver.step([(seq, random_prompt(length, seed=20 + seq))])
        chunks = [(0, [5]), (1, [6])]  # seq 0: base, seq 1: adapter 1
        input_ids, positions, metadata = driver.prepare(chunks)
        inner = model.model
        stack = inner._decoder_stack()
        with torch.inference_mode():
            hidden, cos_sin = inner.embed_tokens(input_ids), inner.rotary_emb(positions)
            manager.prepare(np.array([0, 1], dtype=np.uint64), np.array([0, 1, 2], dtype=np.int32))
            mixed, _ = stack(hidden.clone(), cos_sin, driver.kv_cache.clone(), metadata)
            manager.clear_step()
            base_only, _ = stack(hidden.clone(), cos_sin, driver.kv_cache.clone(), metadata)
        assert torch.equal(mixed[0], base_only[0]), dtype
        assert not torch.equal(mixed[1], base_only[1]), dtype

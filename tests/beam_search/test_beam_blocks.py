"""Beams share blocks: the prompt's and every common prefix's blocks are held once (C++ pool ref
counts), only a beam's own tail is its own (copy on write). Peak KV blocks in use for beam width 4
against the same prompt run as 4 independent sequences (prefix caching off, so nothing else shares)."""

from __future__ import annotations

import torch

from pagedcore import LLM, SamplingParams
from pagedcore.sampling_params import BeamSearchParams

from tests.models import tiny_models

PROMPT_LEN, MAX_TOKENS, BLOCK_SIZE = 64, 32, 16


def peak_blocks_used(llm, add) -> int:
    """Runs the requests `add(engine)` queues; the most KV blocks in use after any step."""
    engine = llm.llm_engine
    total = engine.scheduler.config.num_gpu_blocks
    peak = 0

    def listener(out, result, timing):
        nonlocal peak
        peak = max(peak, total - engine.scheduler.stats().num_free_blocks)

    engine.step_listeners.append(listener)
    try:
        add(engine)
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.step_listeners.remove(listener)
    assert engine.scheduler.stats().num_free_blocks == total
    return peak


def measure(folder) -> dict[str, int]:
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, tiny_models.VOCAB_SIZE, (PROMPT_LEN,), generator=g).tolist()
    llm = LLM(folder, max_model_len=256, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {
        "beam_width_4": peak_blocks_used(llm, lambda e: e.add_request(
            "b", prompt_token_ids=prompt,
            params=BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS, ignore_eos=True))),
        "4_independent": peak_blocks_used(llm, lambda e: [e.add_request(
            f"s{i}", prompt_token_ids=prompt, params=greedy) for i in range(4)]),
        "n_4": peak_blocks_used(llm, lambda e: e.add_request(
            "n", prompt_token_ids=prompt, params=SamplingParams(n=4, temperature=1.0, seed=0, max_tokens=MAX_TOKENS,
                                                                ignore_eos=True))),
    }


def test_beams_use_far_fewer_blocks_than_independent_sequences(tiny_llama):
    peaks = measure(tiny_llama[1])
    # 4 independent sequences hold 4 x ceil((64 + 32) / 16) = 24 blocks at the end.
    assert peaks["4_independent"] == 24
    # The beams share the 4 prompt blocks; each holds at most its own 2 generated blocks, + copies in flight.
    assert peaks["beam_width_4"] <= 4 + 4 * 2 + 4
    assert peaks["beam_width_4"] < peaks["4_independent"]


if __name__ == "__main__":   # the figure in docs/beam-search.md
    import os
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_models.save_hf_folder(tiny_models.build_hf_model("llama"), tmp)
        print(measure(folder), "load", os.getloadavg()[0], file=sys.stdout)

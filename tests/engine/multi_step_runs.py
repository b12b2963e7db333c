"""One helper for the multi-step tests (test_multi_step_sampled / _edits / _logprobs): generate with an
engine of num_scheduler_steps, torch's global generator seeded first, and check that no KV block leaked."""

from __future__ import annotations

import torch

from pagedcore import LLM


def generate(folder, prompts, params, steps: int, seed: int = 0, monkeypatch=None, **engine):
    """(llm, [(token ids, logprobs, finish reason)] a request). monkeypatch given: the worker declines every
    multi-step call, so each step holding placeholders goes through the forward and MultiStep.verify()."""
    llm = LLM(folder, max_model_len=256, num_scheduler_steps=steps, **engine)
    if monkeypatch is not None:
        monkeypatch.setattr(llm.llm_engine.worker, "execute_multi_step", lambda step, *args: None)
    torch.manual_seed(seed)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    sched = llm.llm_engine.scheduler
    assert sched.stats().num_free_blocks == sched.config.num_gpu_blocks   # nothing leaked by placeholders
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].finish_reason) for o in outs]

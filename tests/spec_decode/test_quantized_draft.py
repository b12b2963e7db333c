"""A quantized self-draft: a GGUF as the draft of the same GGUF's weights dequantised to fp32 / bf16
(the default model's real pair, in miniature: a tiny Llama with Q4_1 matrices).

- The draft runs as stored (its Q4_1 blocks, fp32 activations and an fp32 KV cache of its own), the
  target in --dtype; greedy with speculation equals greedy without it, token for token.
- "dtype": "float32" dequantises the draft: then it is the target itself (acceptance 100%).
- One memory budget: the KV sizing log and memory_report show the draft's weights and KV next to
  the target's.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore import LLM, SamplingParams
from tests.engine.conftest import prompts_with_shared_prefix
from tests.quantization import quant_models

from .test_greedy_parity import check_clean

ALWAYS = {"disable_by_batch_size": None, "backoff_after_misses": 0}
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def q4_1_gguf(tmp_path_factory):
    return quant_models.write_block_gguf(tmp_path_factory.mktemp("q4_1_draft") / "tiny-q4_1.gguf", "llama_tied",
                                         T.Q4_1)


@pytest.fixture(scope="module")
def prompts():
    return [p + p[-12:] for p in prompts_with_shared_prefix(3, seed=7)]


def _generate(path, prompts, **engine):
    llm = LLM(path, max_model_len=256, kv_cache_memory="16MiB", **engine)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gguf_draft_runs_as_stored_and_greedy_is_exact(q4_1_gguf, prompts, dtype):
    _, expected = _generate(q4_1_gguf, prompts, dtype=dtype)
    spec = {"method": "draft_model", "model": q4_1_gguf, "num_speculative_tokens": 4, **ALWAYS}
    llm, got = _generate(q4_1_gguf, prompts, dtype=dtype, speculative_config=spec)
    assert got == expected
    engine = llm.llm_engine
    draft = engine.draft
    assert "q4_1" in draft.weight_bytes and "bfloat16" not in draft.weight_bytes   # the blocks as stored
    assert engine.loaded.weight_format == dtype                                      # the target dequantised
    assert draft.model_config.dtype == "float32" and draft.runner.kv_cache.dtype == torch.float32
    assert engine.worker.runner.kv_cache.dtype == getattr(torch, dtype)
    stats = engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
    print("acceptance", dtype, stats.as_dict())
    check_clean(llm)


def test_gguf_draft_dequantised_on_request_is_the_target(q4_1_gguf, prompts):
    _, expected = _generate(q4_1_gguf, prompts, dtype="float32")
    spec = {"method": "draft_model", "model": q4_1_gguf, "num_speculative_tokens": 4, "dtype": "float32", **ALWAYS}
    llm, got = _generate(q4_1_gguf, prompts, dtype="float32", speculative_config=spec)
    assert got == expected
    draft = llm.llm_engine.draft
    assert set(draft.weight_bytes) == {"float32"}
    stats = llm.llm_engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_memory_report_and_sizing_log_show_the_draft(q4_1_gguf):
    plain = LLM(q4_1_gguf, dtype="bfloat16", max_model_len=256, kv_cache_memory="16MiB").llm_engine
    spec = {"method": "draft_model", "model": q4_1_gguf, "num_speculative_tokens": 4}
    engine = LLM(q4_1_gguf, dtype="bfloat16", max_model_len=256, kv_cache_memory="16MiB",
                 speculative_config=spec).llm_engine
    draft = engine.draft
    report, alone = engine.memory_report(), plain.memory_report()
    assert alone.draft_weight_bytes == alone.draft_kv_cache_bytes == 0
    assert report.weight_bytes == alone.weight_bytes                               # the target's, unchanged
    assert report.draft_weight_bytes == sum(draft.weight_bytes.values()) > 0
    assert report.draft_weight_bytes < report.weight_bytes                         # Q4_1 blocks vs bf16
    num_blocks = engine.scheduler.config.num_gpu_blocks
    assert report.draft_kv_cache_bytes == (num_blocks + draft.scratch_blocks) * draft.spec.bytes_per_block
    assert report.kv_cache_bytes == num_blocks * engine.kv_cache_spec.bytes_per_block
    # One budget: target KV + draft KV (its share of every block id and its scratch) fit 16 MiB.
    assert report.kv_cache_bytes + report.draft_kv_cache_bytes <= 16 * 1024**2
    # fp32 draft KV per block id is twice the bf16 target's: the target gets a third of the blocks' bytes.
    assert draft.spec.bytes_per_block == 2 * engine.kv_cache_spec.bytes_per_block
    text = engine.kv_cache_description
    assert "draft model tiny-q4_1.gguf" in text and "q4_1" in text and "float32 activations" in text
    assert f"same {num_blocks} block ids" in text
    assert f"the target's {sum(engine.loaded.weight_bytes.values()) / 1e6:.1f} MB" in text
    assert engine.view.memory_report() == report
    skip = LLM(q4_1_gguf, dtype="bfloat16", max_model_len=256, kv_cache_memory="16MiB",
               speculative_config={"method": "layer_skip", "num_layers": 1}).llm_engine
    assert skip.memory_report().draft_weight_bytes == skip.memory_report().draft_kv_cache_bytes == 0

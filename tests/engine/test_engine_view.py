"""EngineView: the read-only face the servers, benchmarks and the trace recorder use."""

from __future__ import annotations

from pagedcore import LLM, SamplingParams


def test_view_reports_the_setup_and_live_state(tiny_llama):
    _, folder = tiny_llama
    engine = LLM(folder, max_model_len=64, block_size=16, num_gpu_blocks_override=16).llm_engine
    view = engine.view
    assert view.config is engine.config and view.model_config.vocab_size == engine.model_config.vocab_size
    assert view.tokenizer is engine.tokenizer and view.model_path is not None
    assert view.kv_cache_bytes == 16 * view.kv_cache_bytes_per_block and "16 blocks" in view.kv_cache_description
    assert view.num_parameters > 0 and view.startup_seconds > 0 and view.last_step_timing is None
    assert isinstance(view.generation_config, dict) and isinstance(view.load_seconds, dict)

    seen = []
    listener = lambda out, result, timing: seen.append(timing["num_tokens"])  # noqa: E731
    view.add_step_listener(listener)
    engine.add_request("a", prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=3, ignore_eos=True))
    assert view.request_ids() == ["a"] and view.num_unfinished_requests == 1
    seq_id = engine.registry.get_request("a").seqs[0].seq_id
    assert view.request_of_seq(seq_id)[0] == "a"
    engine.step()
    assert seen == [3] and view.last_step_timing["num_tokens"] == 3
    assert view.scheduler_stats().num_running == 1
    view.remove_step_listener(listener)
    while engine.has_unfinished_requests():
        engine.step()
    assert seen == [3] and view.request_ids() == [] and view.request_of_seq(seq_id) is None
    assert view.scheduler_stats().num_free_blocks == 16

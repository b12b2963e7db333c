from pagedcore.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput


def test_metrics_lifecycle():
    m = RequestMetrics(arrival_time=10.0)
    assert m.time_to_first_token is None and m.e2e_latency is None and m.time_per_output_token is None
    m.on_scheduled(10.5)
    m.on_scheduled(11.0)  # rescheduled after a preemption: the queue time is the first wait
    assert m.first_scheduled_time == 10.5 and m.time_in_queue == 0.5
    m.on_tokens(12.0)
    assert m.time_to_first_token == 2.0 and m.time_per_output_token is None
    m.on_tokens(12.5)
    m.on_tokens(13.0, num_tokens=2)  # speculative decoding can add several at once
    assert m.num_generation_tokens == 4 and m.last_token_time == 13.0
    assert m.time_per_output_token == (13.0 - 12.0) / 3
    m.on_finished(13.5)
    assert m.e2e_latency == 3.5


def test_request_output_shape():
    out = CompletionOutput(index=0, text="hi", token_ids=[5, 6], cumulative_logprob=-1.5,
                           logprobs=[{5: Logprob(-1.0, 1, "h")}, {6: Logprob(-0.5, 2, "i")}])
    assert not out.finished()
    out.finish_reason, out.stop_reason = "stop", "###"
    assert out.finished()
    request = RequestOutput("r1", "prompt", [1, 2], None, [out], finished=True,
                            metrics=RequestMetrics(arrival_time=0.0, num_cached_tokens=16))
    assert request.num_cached_tokens == 16
    assert RequestOutput("r2", None, [1], None, [], finished=False).num_cached_tokens is None

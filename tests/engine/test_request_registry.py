"""RequestRegistry as exact bookkeeping: add, lookup, finish, abort, and fork copying every piece
of a sequence's state (detokenizer, stop checker, logprobs, generator) so the two advance apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore.engine.request_registry import RequestRegistry
from pagedcore.outputs import Logprob, RequestMetrics
from pagedcore.sampling_params import SamplingParams
from tests.detokenizer.conftest import build_sentencepiece_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_sentencepiece_tokenizer()


def add(registry: RequestRegistry, request_id: str, params: SamplingParams, prompt_ids=(5, 6, 7)):
    req = registry.new_request(request_id, None, list(prompt_ids), params, RequestMetrics(arrival_time=1.0))
    registry.add(req)
    return req


def advance(seq, token_ids: list[int]) -> None:
    """What the output processor does for each sampled token (with made-up logprobs)."""
    for token in token_ids:
        seq.output_token_ids.append(token)
        seq.text += seq.stop_checker.feed(seq.detokenizer.add_tokens([token]))
        entry = {token: Logprob(-0.5, 1), token + 1: Logprob(-1.5, 2)}
        seq.logprobs.append(entry)
        seq.cumulative_logprob += entry[token].logprob


def test_add_lookup_and_first_scheduling(tokenizer):
    registry = RequestRegistry(tokenizer)
    req = registry.new_request("a", "p", [5, 6], SamplingParams(n=3, prompt_logprobs=1), RequestMetrics(1.0))
    seq = req.seqs[0]
    assert "a" not in registry and registry.get_seq(seq.seq_id) is None   # built, not yet registered
    registry.add(req)
    assert "a" in registry and len(registry) == 1 and registry.request_ids() == ["a"]
    assert registry.get_request("a") is req and registry.seqs_of([seq.seq_id]) == [seq]
    assert req.needs_fork and req.prompt_logprobs == [None] and dict(registry.owed_prompt_logprobs) == {seq.seq_id: seq}
    with pytest.raises(ValueError, match="already in use"):
        registry.new_request("a", None, [1], SamplingParams(), RequestMetrics(1.0))
    ids = np.array([seq.seq_id, 999], dtype=np.int64)
    assert registry.take_first_scheduled(ids) == [seq]
    assert registry.take_first_scheduled(ids) == []                      # once per request
    child = registry.add_sample(req, 1, req.params.child_params(1))
    assert registry.get_seq(child.seq_id) is child and req.seqs == [seq, child] and child.output_token_ids == []
    registry.prompt_logprobs_done(seq.seq_id)
    assert not registry.owed_prompt_logprobs


def test_finish_and_abort_forget_every_sequence(tokenizer):
    registry = RequestRegistry(tokenizer)
    done = add(registry, "done", SamplingParams(prompt_logprobs=0))
    for seq in done.seqs:
        seq.finish_reason = "length"
    assert registry.finish("done") is done
    assert "done" not in registry and registry.get_seq(done.seqs[0].seq_id) is None
    assert not registry.owed_prompt_logprobs and registry.finish("done") is None

    live = add(registry, "live", SamplingParams(n=2))
    first = live.seqs[0]
    second = registry.add_sample(live, 1, live.params.child_params(1))
    second.finish_reason = "length"
    assert registry.abort("live") is live and registry.abort("live") is None
    assert (first.finish_reason, second.finish_reason) == ("abort", "length")   # a finished one keeps its reason
    assert not live.needs_fork and len(registry) == 0
    assert registry.get_seq(first.seq_id) is None and registry.get_seq(second.seq_id) is None
    # Never scheduled, then aborted: nothing left to stamp.
    assert registry.take_first_scheduled(np.array([first.seq_id], dtype=np.int64)) == []


def test_fork_copies_all_state_and_the_copies_advance_apart(tokenizer):
    registry = RequestRegistry(tokenizer)
    params = SamplingParams(temperature=1.0, seed=7, stop=["zz"], logprobs=1)
    req = add(registry, "beam", params)
    parent = req.seqs[0]
    words = tokenizer.encode("the quick brown fox", add_special_tokens=False).ids
    advance(parent, words[:3])
    torch.rand(5, generator=parent.generator)                    # the generator has moved on from its seed

    child = registry.fork(parent.seq_id)
    assert child.seq_id != parent.seq_id and registry.get_seq(child.seq_id) is child
    assert req.seqs == [parent, child] and child.index == 1 and child.request is req
    assert (child.output_token_ids, child.text, child.logprobs, child.cumulative_logprob) == \
        (parent.output_token_ids, parent.text, parent.logprobs, parent.cumulative_logprob)
    for name in ("output_token_ids", "logprobs", "detokenizer", "stop_checker", "generator"):
        assert getattr(child, name) is not getattr(parent, name), name
    assert child.detokenizer.output_text == parent.detokenizer.output_text
    assert child.stop_checker.text == parent.stop_checker.text
    # Same generator state: the next draws agree, and drawing from one leaves the other alone.
    assert torch.equal(torch.rand(4, generator=child.generator), torch.rand(4, generator=parent.generator))
    torch.rand(3, generator=child.generator)
    assert not torch.equal(torch.rand(4, generator=child.generator), torch.rand(4, generator=parent.generator))

    before = (list(parent.output_token_ids), parent.text, len(parent.logprobs), parent.cumulative_logprob)
    advance(child, words[3:])
    assert (list(parent.output_token_ids), parent.text, len(parent.logprobs), parent.cumulative_logprob) == before
    reference = add(registry, "reference", params).seqs[0]        # the same tokens, never forked
    advance(reference, words[:3])
    assert parent.text == reference.text
    advance(reference, words[3:])
    assert child.text == reference.text and child.text.strip() == "the quick brown fox"
    advance(parent, words[3:])
    assert parent.text == child.text and parent.cumulative_logprob == child.cumulative_logprob

    # Forked sequences belong to the request: finishing it forgets them too.
    assert registry.fork(child.seq_id, index=5).index == 5
    for seq in req.seqs:
        seq.finish_reason = "stop"
    registry.finish("beam")
    assert all(registry.get_seq(s.seq_id) is None for s in req.seqs)


def test_fork_of_an_unseeded_plain_sequence(tokenizer):
    registry = RequestRegistry(tokenizer=None)
    req = add(registry, "plain", SamplingParams(temperature=0))
    parent = req.seqs[0]
    parent.output_token_ids += [9, 10]
    child = registry.fork(parent.seq_id)
    assert child.generator is None and child.detokenizer is None and child.stop_checker is None
    assert child.logprobs is None and child.cumulative_logprob is None and child.output_token_ids == [9, 10]
    with pytest.raises(KeyError):
        registry.fork(12345)

"""The one-call step's logit edits (sampling/logit_edits.py, cpp/kernels/logit_edits.h) against the
Sampler's torch stages (sampling/penalties.py) on the same SamplingMetadata: the edited logits equal
bit for bit, for random rows of logit_bias, min_tokens bans and repetition / presence / frequency
penalties with repeated tokens (prompt and output), -inf and NaN logits; and every bad input refused
with nothing written."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore import _core
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.metadata import SamplingMetadata
from pagedcore.sampling.penalties import apply_edits
from pagedcore.sampling_params import SamplingParams

EOS = [0, 1]


@st.composite
def steps(draw):
    vocab = draw(st.integers(8, 300))
    num_rows = draw(st.integers(1, 6))
    tokens = st.integers(0, vocab - 1)
    params, prompts, outputs = [], [], []
    for _ in range(num_rows):
        kw = {}
        if draw(st.booleans()):
            kw["repetition_penalty"] = draw(st.floats(0.0625, 3.0, width=32))
        if draw(st.booleans()):
            kw["presence_penalty"] = draw(st.floats(-2.0, 2.0, width=32))
        if draw(st.booleans()):
            kw["frequency_penalty"] = draw(st.floats(-2.0, 2.0, width=32))
        if draw(st.booleans()):
            kw["logit_bias"] = draw(st.dictionaries(tokens, st.floats(-100, 100, width=32), max_size=6))
        if draw(st.booleans()):
            kw["min_tokens"] = draw(st.integers(1, 40))
            kw["stop_token_ids"] = draw(st.lists(tokens, max_size=3))
            kw["ignore_eos"] = draw(st.booleans())
        params.append(SamplingParams(temperature=draw(st.sampled_from([0.0, 0.8])), max_tokens=64, **kw))
        # few distinct tokens: many repeats
        pool = draw(st.lists(tokens, min_size=1, max_size=5))
        prompts.append(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=30)))
        outputs.append(draw(st.lists(st.sampled_from(pool) | tokens, max_size=30)))
    seed = draw(st.integers(0, 2**31 - 1))
    return vocab, params, prompts, outputs, seed


def _metadata(vocab, params, prompts, outputs):
    return SamplingMetadata.from_requests(params, vocab_size=vocab, eos_token_ids=EOS, prompt_token_ids=prompts,
                                          output_token_ids=outputs,
                                          generators=[torch.Generator().manual_seed(1) for _ in params])


def _from_requests(vocab, params, prompts, outputs):
    """The engine's builder, with the same inputs the Sampler's metadata gets."""
    return LogitEdits.from_requests(params, vocab_size=vocab, eos_token_ids=EOS, prompt_token_ids=prompts,
                                    output_token_ids=outputs, num_output_tokens=[len(o) for o in outputs])


@settings(max_examples=200, deadline=None)
@given(steps())
def test_edits_equal_the_torch_stages_bit_for_bit(step):
    vocab, params, prompts, outputs, seed = step
    md = _metadata(vocab, params, prompts, outputs)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(params), vocab, generator=g) * 4  # [R, V]
    logits[logits.abs() < 0.05] = 0.0  # zeros: the repetition rule's boundary
    logits[0, g.seed() % vocab] = float("-inf")
    logits[-1, (g.seed() + 1) % vocab] = float("nan")
    expected = logits.clone()
    apply_edits(expected, md)  # the Sampler's torch stages
    edits = _from_requests(vocab, params, prompts, outputs)
    if edits is None:
        assert md.logit_bias is None and md.banned is None and md.repetition is None and md.output_tokens is None
        return
    got = logits.clone()
    edits.apply(got)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(expected, nan=7.0))


def test_repeated_output_tokens_count_once_each_occurrence():
    params = [SamplingParams(frequency_penalty=0.1, presence_penalty=0.3, repetition_penalty=1.7)]
    edits = _from_requests(10, params, [[2, 2, 9]], [[4, 4, 4, 2, 4]])
    pairs = sorted(zip(edits.counted_tokens.tolist(), edits.counts.tolist()))
    assert pairs == [(2, 1), (4, 4)]
    assert sorted(edits.repetition_tokens.tolist()) == [2, 4, 9]
    logits = torch.full((1, 10), 1.0)
    edits.apply(logits)
    # 4: 1 / 1.7, - 0.3, then -0.1 four times, one at a time (float32)
    x = np.float32(np.float32(1.0) / np.float32(1.7)) - np.float32(0.3)
    for _ in range(4):
        x = np.float32(x + np.float32(-0.1))
    assert logits[0, 4].item() == float(x)


def test_no_edits_is_none():
    assert _from_requests(10, [SamplingParams(temperature=0.5), SamplingParams()], [[1], [2]], [[3], []]) is None


def _edits(**changes) -> LogitEdits:
    edits = _from_requests(10, [SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, logit_bias={3: 1.0},
                                               min_tokens=2)], [[1, 2]], [[3]])
    return dataclasses.replace(edits, **changes)


@pytest.mark.parametrize("changes, message", [
    ({"bias_tokens": np.array([10], dtype=np.int32)}, "outside the vocabulary"),
    ({"ban_rows": np.array([1, 0], dtype=np.int32)}, "of a step of 1 rows"),
    ({"counts": np.array([0], dtype=np.int32)}, "has count 0"),
    ({"repetition_penalty": np.array([0.0], dtype=np.float32)}, "repetition_penalty"),
    ({"frequency_penalty": np.array([np.inf], dtype=np.float32)}, "frequency_penalty"),
    ({"bias_values": np.array([np.nan], dtype=np.float32)}, "not finite"),
])
def test_bad_edits_are_refused_and_nothing_is_written(changes, message):
    logits = torch.randn(1, 10)
    before = logits.clone()
    with pytest.raises((ValueError, IndexError), match=message):  # IndexError: an index out of range
        _edits(**changes).apply(logits)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("changes, message", [
    ({"bias_values": np.zeros(2, dtype=np.float32)}, "bias_values must be 1-D of 1"),
    ({"presence_penalty": np.zeros(3, dtype=np.float32)}, "presence_penalty must be 1-D of 1"),
])
def test_arrays_of_the_wrong_length_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        _edits(**changes).apply(torch.randn(1, 10))


def test_wrong_dtypes_and_layouts_are_refused():
    with pytest.raises(TypeError):
        _core.apply_logit_edits(np.zeros((1, 10), dtype=np.float32), _edits(counts=np.array([1], dtype=np.int64)))
    with pytest.raises(ValueError, match="contiguous"):
        _edits().apply(torch.randn(10, 4).t())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _from_requests(10, [SamplingParams(repetition_penalty=1.2)], [[1, 12]], [[3]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        LogitEdits.from_requests([SamplingParams(frequency_penalty=0.2)], vocab_size=10, eos_token_ids=EOS,
                                 prompt_token_ids=[[1]], output_token_ids=[[3, -1]], num_output_tokens=[2])

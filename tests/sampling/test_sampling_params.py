import math

import pytest

from pagedcore.sampling_params import MIN_TEMPERATURE, BeamSearchParams, SamplingParams


def test_defaults_are_vllms():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1, 1.0, 1.0, 0, 0.0, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.stop, p.stop_token_ids, p.include_stop_str_in_output, p.ignore_eos) == ([], [], False, False)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs, p.logit_bias) == (16, 0, None, None, None)
    assert (p.skip_special_tokens, p.spaces_between_special_tokens, p.detokenize) == (True, True, True)
    assert not p.is_greedy and not p.has_penalties and not p.has_truncation


# (field, bad value, words the message must contain besides the field name)
INVALID = [
    ("n", 0, ">= 1"), ("n", 1.5, ">= 1"), ("n", True, ">= 1"),
    ("temperature", -0.1, ">= 0"), ("temperature", math.nan, ">= 0"), ("temperature", math.inf, ">= 0"),
    ("temperature", "hot", ">= 0"),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.01, "(0, 1]"), ("top_p", -1, "(0, 1]"),
    ("top_k", -2, ">= 1"), ("top_k", 2.0, ">= 1"),
    ("min_p", -0.1, "[0, 1]"), ("min_p", 1.5, "[0, 1]"),
    ("seed", 1.5, "None or in"), ("seed", 2**64, "None or in"),
    ("presence_penalty", 2.5, "[-2, 2]"), ("presence_penalty", -3, "[-2, 2]"),
    ("frequency_penalty", 2.01, "[-2, 2]"),
    ("repetition_penalty", 0.0, "> 0"), ("repetition_penalty", -1.0, "> 0"),
    ("stop", 5, "string"), ("stop", [""], "non-empty"), ("stop", ["ok", 3], "non-empty"),
    ("stop_token_ids", [-1], ">= 0"), ("stop_token_ids", 7, ">= 0"), ("stop_token_ids", [1.0], ">= 0"),
    ("include_stop_str_in_output", 1, "True or False"), ("ignore_eos", None, "True or False"),
    ("skip_special_tokens", "yes", "True or False"), ("spaces_between_special_tokens", 0, "True or False"),
    ("detokenize", 1, "True or False"),
    ("max_tokens", 0, ">= 1"), ("max_tokens", 2.0, ">= 1"),
    ("min_tokens", -1, ">= 0"),
    ("logprobs", -1, ">= 0"), ("logprobs", 1.0, ">= 0"), ("prompt_logprobs", -5, ">= 0"),
    ("logit_bias", [1, 2], "dict"), ("logit_bias", {-1: 1.0}, "token ids >= 0"),
    ("logit_bias", {"5": 1.0}, "token ids >= 0"), ("logit_bias", {5: 101.0}, "[-100, 100]"),
    ("logit_bias", {5: math.nan}, "[-100, 100]"),
]


@pytest.mark.parametrize("name,value,allowed", INVALID)
def test_invalid_value_names_field_value_and_range(name, value, allowed):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{name: value})
    message = str(info.value)
    assert f"SamplingParams.{name}" in message
    assert allowed in message
    assert repr(value) in message or str(value) in message


def test_cross_field_checks():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(4\), got 5"):
        SamplingParams(min_tokens=5, max_tokens=4)
    with pytest.raises(ValueError, match="detokenize=False"):
        SamplingParams(stop=["x"], detokenize=False)
    SamplingParams(min_tokens=5, max_tokens=None)  # unbounded max_tokens takes any min_tokens


def test_normalisations():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(logit_bias={3: 1}).logit_bias == {3: 1.0}
    assert SamplingParams(logit_bias={}).logit_bias is None
    assert SamplingParams(temperature=1e-4).temperature == MIN_TEMPERATURE  # clamped, as vLLM does
    assert SamplingParams(temperature=0).is_greedy


def test_derived_flags_follow_later_edits():
    p = SamplingParams()
    p.top_p = 0.5
    assert p.has_truncation
    p.frequency_penalty = 0.1
    assert p.has_penalties


def test_child_params_get_distinct_reproducible_seeds():
    p = SamplingParams(n=3, seed=7, temperature=0.5)
    children = [p.child_params(i) for i in range(3)]
    assert [c.seed for c in children] == [7, 8, 9]
    assert all(c.n == 1 and c.temperature == 0.5 for c in children)
    assert SamplingParams(n=2).child_params(1).seed is None
    assert SamplingParams(seed=2**64 - 1).child_params(1).seed == 0  # wraps inside torch's seed range


def test_beam_search_params():
    b = BeamSearchParams(beam_width=4, max_tokens=32)
    assert (b.ignore_eos, b.temperature, b.length_penalty, b.include_stop_str_in_output) == (False, 0.0, 1.0, False)
    for kwargs, field in [
        ({"beam_width": 0, "max_tokens": 8}, "beam_width"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
        ({"beam_width": 2, "max_tokens": 8, "temperature": -1.0}, "temperature"),
        ({"beam_width": 2, "max_tokens": 8, "length_penalty": math.inf}, "length_penalty"),
        ({"beam_width": 2, "max_tokens": 8, "ignore_eos": "no"}, "ignore_eos"),
    ]:
        with pytest.raises(ValueError, match=f"BeamSearchParams.{field}"):
            BeamSearchParams(**kwargs)

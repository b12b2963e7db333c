"""Logit edits (bias, min_tokens, penalties) against the naive per-row reference."""

import random

import pytest
import torch

from pagedcore.sampling.sampler import Sampler
from pagedcore.sampling.metadata import SamplingMetadata
from pagedcore.sampling.penalties import apply_edits
from pagedcore.sampling_params import SamplingParams

from .naive import process_row

VOCAB = 50
EOS = [2, 7]


def random_rows(rnd: random.Random, num_rows: int):
    params, prompts, outputs = [], [], []
    for _ in range(num_rows):
        kwargs = {}
        if rnd.random() < 0.5:
            kwargs["repetition_penalty"] = rnd.choice([0.5, 1.3, 2.0])
        if rnd.random() < 0.5:
            kwargs["presence_penalty"] = rnd.uniform(-2, 2)
        if rnd.random() < 0.5:
            kwargs["frequency_penalty"] = rnd.uniform(-2, 2)
        if rnd.random() < 0.4:
            kwargs["logit_bias"] = {rnd.randrange(VOCAB): rnd.uniform(-100, 100) for _ in range(rnd.randrange(1, 4))}
        if rnd.random() < 0.4:
            kwargs["min_tokens"] = rnd.randrange(1, 6)
            kwargs["stop_token_ids"] = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(0, 3))]
            kwargs["ignore_eos"] = rnd.random() < 0.3
        params.append(SamplingParams(temperature=rnd.choice([0.0, 0.7]), **kwargs))
        # Few distinct tokens, so duplicates (counts > 1, prompt and output overlap) are common.
        prompts.append([rnd.randrange(12) for _ in range(rnd.randrange(0, 10))])
        outputs.append([rnd.randrange(12) for _ in range(rnd.randrange(0, 8))])
    return params, prompts, outputs


def edit(logits, md):
    """The sampler's edit stages only, in its order."""
    logits = logits.clone()
    apply_edits(logits, md)
    return logits


@pytest.mark.parametrize("seed", range(20))
def test_edits_match_reference(seed):
    rnd = random.Random(seed)
    params, prompts, outputs = random_rows(rnd, rnd.randrange(1, 9))
    md = SamplingMetadata.from_requests(params, vocab_size=VOCAB, eos_token_ids=EOS,
                                        prompt_token_ids=prompts, output_token_ids=outputs)
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(seed)) * 4
    got = edit(logits, md)
    want = torch.stack([process_row(logits[i], p, prompts[i], outputs[i], EOS) for i, p in enumerate(params)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(10))
def test_greedy_rows_take_argmax_after_edits(seed):
    rnd = random.Random(100 + seed)
    params, prompts, outputs = random_rows(rnd, 6)
    params = [SamplingParams(**{**p.__dict__, "temperature": 0.0}) for p in params]
    md = SamplingMetadata.from_requests(params, vocab_size=VOCAB, eos_token_ids=EOS,
                                        prompt_token_ids=prompts, output_token_ids=outputs)
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(seed))
    want = [int(process_row(logits[i], p, prompts[i], outputs[i], EOS).argmax()) for i, p in enumerate(params)]
    assert Sampler()(logits.clone(), md).sampled_token_ids.tolist() == want


def test_penalty_formulas_by_hand():
    logits = torch.tensor([[2.0, -2.0, 1.0, 3.0, 0.5]])
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    md = SamplingMetadata.from_requests([p], vocab_size=5, prompt_token_ids=[[0]], output_token_ids=[[1, 2, 2]])
    got = edit(logits, md)[0].tolist()
    # 0: prompt only, positive -> /2. 1: once, negative -> *2, -0.5 -0.25. 2: twice -> /2, -0.5 -0.5.
    assert got == pytest.approx([1.0, -4.75, -0.5, 3.0, 0.5])


def test_min_tokens_masks_stop_ids_until_reached():
    p = SamplingParams(min_tokens=2, stop_token_ids=[4])
    md = SamplingMetadata.from_requests([p, p, SamplingParams(min_tokens=2, stop_token_ids=[4], ignore_eos=True)],
                                        vocab_size=6,
                                        eos_token_ids=[5], num_output_tokens=[1, 2, 0])
    got = edit(torch.zeros(3, 6), md)
    assert torch.isinf(got[0, [4, 5]]).all() and torch.isfinite(got[0, :4]).all()
    assert torch.isfinite(got[1]).all()  # two outputs already: nothing masked
    assert torch.isinf(got[2, 4]) and torch.isfinite(got[2, 5])  # ignore_eos: EOS is not a stop token


def test_no_stage_tensors_when_no_row_needs_them():
    md = SamplingMetadata.from_requests([SamplingParams(), SamplingParams(temperature=0)], vocab_size=10)
    for name in ("logit_bias", "banned", "repetition", "repetition_penalty", "output_tokens",
                 "presence_penalty", "frequency_penalty", "top_k", "top_p", "min_p", "max_num_logprobs"):
        assert getattr(md, name) is None, name
    greedy = SamplingMetadata.from_requests([SamplingParams(temperature=0)] * 3, vocab_size=10)
    assert greedy.all_greedy and greedy.temperature is None and greedy.random_row_ids is None


def test_only_rows_with_penalties_contribute_tokens():
    params = [SamplingParams(), SamplingParams(frequency_penalty=1.0), SamplingParams()]
    md = SamplingMetadata.from_requests(params, vocab_size=10, output_token_ids=[[1] * 100, [2, 3], [4] * 50])
    assert md.output_tokens.row_ids.tolist() == [1, 1] and md.output_tokens.token_ids.tolist() == [2, 3]


@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
def test_token_lists_may_be_lists_arrays_or_tensors(kind):
    import numpy as np

    convert = {"list": list, "numpy": lambda x: np.array(x, dtype=np.int32),
               "tensor": lambda x: torch.tensor(x, dtype=torch.int32)}[kind]
    p = SamplingParams(repetition_penalty=1.5)
    md = SamplingMetadata.from_requests([p, p], vocab_size=10, prompt_token_ids=[convert([1, 2]), convert([3])],
                                        output_token_ids=[convert([4]), convert([])])
    assert md.repetition.row_ids.tolist() == [0, 0, 1, 0]
    assert md.repetition.token_ids.tolist() == [1, 2, 3, 4]
    assert md.repetition.token_ids.dtype == torch.long


def test_metadata_errors_say_what_to_pass():
    with pytest.raises(ValueError, match="make_generator"):
        SamplingMetadata.from_requests([SamplingParams(seed=1)], vocab_size=10)
    with pytest.raises(ValueError, match=r"token id 10, outside the vocabulary \[0, 10\)"):
        SamplingMetadata.from_requests([SamplingParams(logit_bias={10: 1.0})], vocab_size=10)
    with pytest.raises(ValueError, match="prompt_token_ids and output_token_ids"):
        SamplingMetadata.from_requests([SamplingParams(repetition_penalty=1.1)], vocab_size=10)
    with pytest.raises(ValueError, match="output_token_ids"):
        SamplingMetadata.from_requests([SamplingParams(presence_penalty=1.0)], vocab_size=10)
    with pytest.raises(ValueError, match="num_output_tokens"):
        SamplingMetadata.from_requests([SamplingParams(min_tokens=1)], vocab_size=10, eos_token_ids=[1])
    with pytest.raises(ValueError, match="at least one row"):
        SamplingMetadata.from_requests([], vocab_size=10)
    md = SamplingMetadata.from_requests([SamplingParams()], vocab_size=10)
    with pytest.raises(ValueError, match=r"shape \(2, 10\) but the metadata was built for \[1, 10\]"):
        Sampler()(torch.zeros(2, 10), md)

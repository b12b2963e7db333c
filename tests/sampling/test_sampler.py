"""The Sampler end to end: greedy, seeded reproducibility whatever the batch, logprobs, n > 1 rows."""

import random

import pytest
import torch

from pagedcore.sampling.sampler import Sampler, repeat_rows
from pagedcore.sampling import SamplingMetadata, logprob_dicts, make_generator, prompt_logprobs
from pagedcore.sampling_params import SamplingParams

VOCAB = 1000


def run(params, logits, generators=None, **kwargs):
    md = SamplingMetadata.from_requests(params, vocab_size=logits.shape[1], generators=generators, **kwargs)
    return Sampler()(logits.clone(), md)


def test_all_greedy_is_argmax():
    logits = torch.randn(9, VOCAB)
    out = run([SamplingParams(temperature=0)] * 9, logits)
    assert out.sampled_token_ids.dtype == torch.long and out.sampled_token_ids.shape == (9,)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs is None and out.logprob_token_ids is None and out.sampled_token_ranks is None


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_top_k_one_is_greedy(temperature):
    logits = torch.randn(16, VOCAB) * 2
    out = run([SamplingParams(temperature=temperature, top_k=1)] * 16, logits)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


def test_mixed_batch_greedy_rows_stay_argmax():
    logits = torch.randn(10, VOCAB)
    params = [SamplingParams(temperature=0 if i % 3 == 0 else 1.0, top_p=0.9 if i % 2 else 1.0) for i in range(10)]
    out = run(params, logits)
    greedy = [i for i in range(10) if i % 3 == 0]
    assert out.sampled_token_ids[greedy].tolist() == logits[greedy].argmax(-1).tolist()


def test_extreme_temperature_follows_the_peak():
    logits = torch.randn(32, VOCAB)
    logits[:, 7] += 8.0
    out = run([SamplingParams(temperature=0.01)] * 32, logits)
    assert (out.sampled_token_ids == 7).all()


TARGETS = [
    SamplingParams(temperature=1.0, seed=42),  # plain: full-vocabulary race
    SamplingParams(temperature=0.8, top_p=0.9, seed=7),  # candidate path (peaked logits below)
    SamplingParams(temperature=1.3, top_k=20, min_p=0.02, seed=3),
    SamplingParams(temperature=1.0, top_p=0.999, seed=11, presence_penalty=0.5),  # wide nucleus: full path
]


def neighbour(rnd):
    return rnd.choice([
        SamplingParams(temperature=0), SamplingParams(), SamplingParams(top_p=0.5), SamplingParams(top_k=5),
        SamplingParams(seed=rnd.randrange(1000)), SamplingParams(min_p=0.1, seed=rnd.randrange(1000)),
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5),
    ])


def target_tokens(target, position, batch_size, num_steps=6):
    """The target row's tokens over num_steps steps, placed at `position` among random neighbours."""
    rnd = random.Random(batch_size * 1000 + position)
    torch.manual_seed(rnd.randrange(2**31))  # unseeded neighbours draw differently in every scenario
    params = [neighbour(rnd) for _ in range(batch_size)]
    params[position] = target
    generators = [make_generator(p) for p in params]
    outputs = [[] for _ in range(batch_size)]
    tokens = []
    for step in range(num_steps):
        # The target's logits depend only on the step; the neighbours' on everything.
        logits = torch.randn(batch_size, VOCAB) * 3
        logits[position] = torch.randn(VOCAB, generator=torch.Generator().manual_seed(step)) * 3
        out = run(params, logits, generators, prompt_token_ids=[[1, 2, 3]] * batch_size, output_token_ids=outputs)
        sampled = out.sampled_token_ids.tolist()
        for row in range(batch_size):
            outputs[row].append(sampled[row])
        tokens.append(sampled[position])
    return tokens


@pytest.mark.parametrize("target", range(len(TARGETS)))
def test_seeded_row_is_reproducible_whatever_the_batch(target):
    params = TARGETS[target]
    alone = target_tokens(params, 0, 1)
    assert len(set(alone)) > 1  # really sampling
    for position, batch_size in [(0, 3), (2, 3), (5, 8), (63, 64), (17, 40)]:
        assert target_tokens(params, position, batch_size) == alone, (position, batch_size)


def test_different_seeds_differ_and_same_seed_repeats():
    logits = torch.zeros(1, VOCAB)  # uniform: any two independent streams differ almost surely

    def stream(seed):
        generator = make_generator(SamplingParams(seed=seed))
        return [run([SamplingParams(seed=seed)], logits, [generator]).sampled_token_ids.item() for _ in range(5)]

    assert stream(1) == stream(1)
    assert stream(1) != stream(2)


def test_logprobs_are_the_raw_distribution():
    logits = torch.randn(4, VOCAB) * 2
    params = [
        SamplingParams(temperature=0, logprobs=0),
        SamplingParams(temperature=0.5, logprobs=3, logit_bias={5: 50.0}),
        SamplingParams(top_k=3, logprobs=5, repetition_penalty=2.0),
        SamplingParams(),
    ]
    out = run(params, logits, prompt_token_ids=[[1]] * 4, output_token_ids=[[2]] * 4)
    raw = logits.log_softmax(-1)
    sampled = out.sampled_token_ids
    asked = [0, 1, 2]
    assert out.logprob_token_ids.shape == (4, 6) and out.logprobs.dtype == torch.float32
    assert torch.equal(out.logprob_token_ids[:, 0], sampled)
    torch.testing.assert_close(out.logprobs[asked, 0], raw[asked].gather(1, sampled[asked].unsqueeze(1)).squeeze(1))
    top = raw.topk(5, dim=-1)
    assert torch.equal(out.logprob_token_ids[asked, 1:], top.indices[asked])
    torch.testing.assert_close(out.logprobs[asked, 1:], top.values[asked])
    ranks = [int((raw[r] >= raw[r, sampled[r]]).sum()) for r in range(4)]
    assert out.sampled_token_ranks[asked].tolist() == ranks[:3]
    # The row that asked for nothing is filler: sampled id, then zeros, NaN logprobs, rank 0.
    assert out.logprobs[3].isnan().all() and out.sampled_token_ranks[3] == 0
    assert out.logprob_token_ids[3, 1:].eq(0).all()
    assert out.sampled_token_ids[1].item() == 5  # the bias steered the draw ...
    assert out.logprobs[1, 0].item() == pytest.approx(raw[1, 5].item())  # ... but not the logprob

    dicts = logprob_dicts(out.logprob_token_ids, out.logprobs, out.sampled_token_ranks,
                          [p.logprobs for p in params], decode=lambda t: f"<{t}>")
    assert dicts[3] is None
    assert list(dicts[0]) == [sampled[0].item()] and dicts[0][sampled[0].item()].rank == 1
    assert len(dicts[1]) in (4, 5) and dicts[1][5].rank == ranks[1] and dicts[1][5].decoded_token == "<5>"
    top_tokens = top.indices[2, :5].tolist()
    everyone = run([SamplingParams(logprobs=2)] * 3, logits[:3])
    torch.testing.assert_close(everyone.logprobs[:, 1:], raw[:3].topk(2, dim=-1).values)
    assert [dicts[2][t].rank for t in top_tokens] == [1, 2, 3, 4, 5] or sampled[2].item() in top_tokens


def test_prompt_logprobs():
    prompt = [3, 9, 4, 4, 0, 7]
    logits = torch.randn(len(prompt), 20)
    result = prompt_logprobs(logits, prompt, 2, decode=str)
    assert len(result) == len(prompt) and result[0] is None
    raw = logits.log_softmax(-1)
    for position in range(1, len(prompt)):
        entry = result[position]
        token = prompt[position]
        row = raw[position - 1]
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-6)
        assert entry[token].rank == int((row >= row[token]).sum())
        assert entry[token].decoded_token == str(token)
        best = row.topk(2).indices.tolist()
        assert set(best) <= set(entry) and entry[best[0]].rank in (1, entry[token].rank)
    assert prompt_logprobs(logits[:-1], prompt, 0)[1:] == [
        {t: v[t]} for t, v in zip(prompt[1:], prompt_logprobs(logits, prompt, 0)[1:])]
    assert prompt_logprobs(logits[:1], [5], 3) == [None]
    with pytest.raises(ValueError, match="6 or 5 logit rows"):
        prompt_logprobs(logits[:3], prompt, 1)


def test_repeat_rows_for_n_samples():
    logits = torch.randn(2, 50)
    repeated = repeat_rows(logits, [3, 1])
    assert repeated.shape == (4, 50) and torch.equal(repeated[2], logits[0]) and torch.equal(repeated[3], logits[1])
    assert repeat_rows(logits, 2).shape == (4, 50)
    parent = SamplingParams(n=3, seed=5)
    children = [parent.child_params(i) for i in range(3)]
    out = run(children, repeat_rows(torch.zeros(1, 1000), 3), [make_generator(c) for c in children])
    assert len(set(out.sampled_token_ids.tolist())) > 1  # distinct seeds: the children diverge


def test_logits_are_consumed_in_place():
    logits = torch.randn(2, 50)
    before = logits.clone()
    md = SamplingMetadata.from_requests([SamplingParams(temperature=0.5)] * 2, vocab_size=50)
    Sampler()(logits, md)
    assert not torch.equal(logits, before)  # documented: pass a clone if you still need them


def test_half_precision_logits_are_widened():
    logits = torch.randn(3, 300).to(torch.bfloat16)
    out = run([SamplingParams(temperature=0, logprobs=1)] * 3, logits)
    assert torch.equal(out.sampled_token_ids, logits.float().argmax(-1))
    assert out.logprobs.dtype == torch.float32


def test_all_greedy_step_runs_nothing_but_argmax(monkeypatch):
    import pagedcore.sampling.sampler as sampler_module

    def forbidden(*args, **kwargs):
        raise AssertionError("a random-path stage ran in an all-greedy step")

    for name in ("to_weights_", "block_race", "sample_truncated", "gather_logprobs"):
        monkeypatch.setattr(sampler_module, name, forbidden)
    logits = torch.randn(4, 100)
    assert torch.equal(run([SamplingParams(temperature=0)] * 4, logits).sampled_token_ids, logits.argmax(-1))

"""The C++ sampler (ops/sample_rows.py, cpp/kernels/sample_rows.h) against a float64 torch reference:
the weights against torch.exp, the kept set of top-k / top-p / min-p (ties included) by sorting, the
drawn token equal to the reference race on the same noise, frequencies against the kept
distribution, bit-identical results on every ISA the CPU runs, the Sampler's use of it (seeded rows
the same in any batch), and the wrapper's errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore import _core
from pagedcore.ops.sample_rows import sample_rows, takes
from pagedcore.sampling.metadata import SamplingMetadata, make_generator
from pagedcore.sampling.row_sampling import RowSampling
from pagedcore.sampling.sampler import Sampler
from pagedcore.sampling_params import SamplingParams

from .conftest import available_isas

BLOCK = 256


def _rows(params, vocab, generators=None) -> RowSampling:
    return RowSampling.from_params(params, generators, vocab)


def reference_kept(w: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """w [V] (the kernel's own weights) -> bool [V], by sample_rows.h's definitions in float64."""
    return (w.double() > 0) & (w.double() >= reference_cut(w, top_k, top_p, min_p))


def reference_cut(w: torch.Tensor, top_k: int, top_p: float, min_p: float) -> float:
    """The weight threshold max(tau_k, tau_p, min_p) of sample_rows.h, in float64 over the weights w [V]."""
    w64 = w.double()
    ordered = torch.sort(w64, descending=True).values
    tau_k = ordered[top_k - 1].item() if top_k < w.numel() else 0.0
    by_k = torch.where(w64 >= tau_k, w64, 0.0)
    tau_p = 0.0
    if top_p < 1:
        target = float(np.float32(top_p)) * by_k.sum().item()
        values, counts = torch.unique(ordered[ordered >= tau_k], sorted=True, return_counts=True)
        above = 0.0
        for v, c in zip(values.flip(0).tolist(), counts.flip(0).tolist()):
            if not above < target:
                break
            tau_p = v
            above += v * c
    return max(tau_k, tau_p, float(np.float32(min_p)))


def reference_race(w: torch.Tensor, kept: torch.Tensor, noise: torch.Tensor) -> int:
    """The two races of sample_rows.h in float64 over the kept weights."""
    vocab = w.numel()
    kw = torch.where(kept, w.double(), 0.0)
    num_blocks = -(-vocab // BLOCK)
    padded = torch.zeros(num_blocks * BLOCK, dtype=torch.float64)
    padded[:vocab] = kw
    mass = padded.view(num_blocks, BLOCK).sum(dim=1)
    score = torch.where(mass > 0, mass / noise[:num_blocks].double(), -1.0)
    block = int(score.argmax())
    inside = padded[block * BLOCK:(block + 1) * BLOCK]
    score = torch.where(inside > 0, inside / noise[num_blocks:].double(), -1.0)
    return block * BLOCK + int(score.argmax())


@settings(max_examples=150, deadline=None)
@given(vocab=st.integers(2, 1500), scale=st.sampled_from([0.3, 2.0, 6.0]), coarse=st.booleans(),
       temperature=st.sampled_from([0.3, 0.8, 1.0, 1.7]), top_k=st.integers(0, 60),
       top_p=st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.1]), min_p=st.sampled_from([0.0, 0.01, 0.3]),
       seed=st.integers(0, 2**31 - 1))
def test_one_row_equals_the_reference(vocab, scale, coarse, temperature, top_k, top_p, min_p, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, vocab, generator=gen) * scale
    if coarse:  # few distinct values: ties at every threshold
        logits = logits.mul(2).round().div(2)
    original = logits.clone()
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rows = _rows([params], vocab)
    noise = rows.draw_noise()
    cuts = np.zeros(1, dtype=np.float32)
    token = int(sample_rows(logits, rows, noise, cuts)[0])
    w = logits[0]  # the kernel's weights
    inv_t = torch.tensor(1.0) / torch.tensor(temperature, dtype=torch.float32)  # fp32, as the kernel has it
    shifted = (original[0] - original[0].max()) * inv_t
    expect = torch.where(shifted >= -87, torch.exp(shifted.double()), 0.0)
    torch.testing.assert_close(w.double(), expect, rtol=3e-7, atol=1e-38)
    k = top_k if 0 < top_k < vocab else vocab
    assert cuts[0] == reference_cut(w, k, top_p, min_p)
    kept = reference_kept(w, k, top_p, min_p)
    assert kept[token]
    assert token == reference_race(w, kept, noise[0])


@pytest.mark.parametrize("scale,top_k,top_p", [(1.0, 0, 0.95), (1.0, 0, 0.5), (0.5, 0, 0.99), (1.0, 3000, 0.9),
                                               (1.0, 60, 1.0), (3.0, 500, 1.0), (0.2, 0, 0.95)])
def test_wide_rows_equal_the_reference(scale, top_k, top_p):
    """A real vocabulary with flat rows: top-p nuclei of thousands of tokens (the kernel's binned walk,
    past 2048 candidates) and top-k past the number of blocks (the bound ladder)."""
    vocab = 49152
    gen = torch.Generator().manual_seed(int(scale * 10) + top_k)
    logits = torch.randn(4, vocab, generator=gen) * scale
    params = SamplingParams(temperature=0.9, top_k=top_k, top_p=top_p)
    rows = _rows([params] * 4, vocab)
    noise = rows.draw_noise()
    cuts = np.zeros(4, dtype=np.float32)
    tokens = sample_rows(logits, rows, noise, cuts)
    for r in range(4):
        assert cuts[r] == reference_cut(logits[r], top_k or vocab, top_p, 0.0)
        kept = reference_kept(logits[r], top_k or vocab, top_p, 0.0)
        assert kept[tokens[r]]
        assert tokens[r] == reference_race(logits[r], kept, noise[r])
        if top_p < 1:
            assert int(kept.sum()) > 100  # wide enough to be a real test of the walk


@pytest.mark.parametrize("settings_", [dict(temperature=1.0), dict(temperature=0.7, top_k=20),
                                       dict(temperature=1.3, top_p=0.5), dict(temperature=1.0, min_p=0.2),
                                       dict(temperature=0.9, top_k=100, top_p=0.8, min_p=0.01)])
def test_frequencies_follow_the_kept_distribution(settings_):
    vocab, draws = 600, 40000  # three blocks, the last short
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(vocab, generator=gen) * 2
    params = SamplingParams(**settings_)
    rows = _rows([params] * draws, vocab)
    batch = logits.repeat(draws, 1)
    tokens = sample_rows(batch, rows)
    w = batch[0]
    kept = reference_kept(w, params.top_k or vocab, params.top_p, params.min_p)
    probs = torch.where(kept, w.double(), 0.0)
    probs /= probs.sum()
    counts = np.bincount(tokens, minlength=vocab)
    assert counts[~kept.numpy()].sum() == 0
    expect = probs.numpy()[kept.numpy()] * draws
    chi2 = float((((counts[kept.numpy()] - expect) ** 2) / expect).sum())
    df = int(kept.sum()) - 1
    assert chi2 < df + 6 * np.sqrt(2 * max(df, 1)), (chi2, df)


def test_bit_identical_on_every_isa():
    vocab = 49152
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(16, vocab, generator=gen) * 3
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=(i % 3) * 40, min_p=0.01 * (i % 2))
              for i in range(16)]
    rows = _rows(params, vocab)
    noise = rows.draw_noise()
    saved = _core.kernel_isa()
    results = {}
    try:
        for isa in available_isas():
            assert _core.set_kernel_isa(isa)
            out = logits.clone()
            results[isa] = (sample_rows(out, rows, noise), out)
    finally:
        _core.set_kernel_isa(saved)
    print("ISA paths run:", ", ".join(results))
    first_tokens, first_weights = next(iter(results.values()))
    for tokens, weights in results.values():
        assert np.array_equal(tokens, first_tokens)
        assert torch.equal(weights, first_weights)


def test_greedy_rows_and_special_rows():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0],        # greedy: the first maximum
                           [-inf, -inf, -inf, -inf],    # nothing above -inf: the argmax (0)
                           [0.0, nan, 1.0, nan],        # NaN weighs 0
                           [0.0, inf, 1.0, inf]])       # +inf logits share the mass
    params = [SamplingParams(temperature=0)] + [SamplingParams(temperature=1.0)] * 3
    for _ in range(50):
        tokens = sample_rows(logits.clone(), _rows(params, 4))
        assert tokens[0] == 1 and tokens[1] == 0 and tokens[2] in (0, 2) and tokens[3] in (1, 3)


def test_the_sampler_takes_cpu_rows_and_seeded_rows_do_not_depend_on_the_batch():
    vocab = 1000
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(4, vocab, generator=gen) * 2
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=42)
    others = [SamplingParams(temperature=0), SamplingParams(temperature=1.2, top_k=5), SamplingParams(temperature=0.5)]

    def run(batch_params, row_of_seeded):
        gens = [make_generator(p) for p in batch_params]
        md = SamplingMetadata.from_requests(batch_params, vocab_size=vocab, generators=gens)
        assert md.rows is not None
        rows = torch.stack([logits[0] if i == row_of_seeded else logits[1 + i % 3] for i in range(len(batch_params))])
        return int(Sampler()(rows, md).sampled_token_ids[row_of_seeded])

    alone = run([seeded], 0)
    in_batch = run([others[0], others[1], seeded, others[2]], 2)
    assert alone == in_batch


def test_the_wrapper_refuses_what_the_kernel_does_not_take():
    rows = _rows([SamplingParams(temperature=1.0)], 8)
    with pytest.raises(TypeError, match="fp32 CPU rows"):
        sample_rows(torch.zeros(1, 8, dtype=torch.bfloat16), rows)
    with pytest.raises(TypeError, match="unit inner stride"):
        sample_rows(torch.zeros(1, 16)[:, ::2], rows)
    with pytest.raises(ValueError, match="built for"):
        sample_rows(torch.zeros(2, 8), rows)
    with pytest.raises(ValueError, match="noise must be"):
        sample_rows(torch.zeros(1, 8), rows, torch.ones(1, 3))
    bad = dataclasses.replace(rows, top_p=np.array([1.5], dtype=np.float32))
    with pytest.raises(ValueError, match="top_p"):
        sample_rows(torch.zeros(1, 8), bad)
    assert takes(torch.zeros(2, 8)) and not takes(torch.zeros(2, 8, dtype=torch.float64))


def test_seeded_rows_need_their_generator():
    with pytest.raises(ValueError, match="make_generator"):
        _rows([SamplingParams(temperature=1.0, seed=3)], 8)

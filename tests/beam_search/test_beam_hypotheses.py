"""BeamHypotheses as exact bookkeeping: HF's score, the bounded heap, and the three early_stopping rules."""

from __future__ import annotations

import pytest
import torch

from pagedcore.engine.beam_hypotheses import BeamHypotheses


def f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def add(h: BeamHypotheses, cumulative: float, length: int, reason: str = "stop"):
    score = float(h.score(torch.tensor([cumulative], dtype=torch.float32), length)[0])
    h.add(score, [7] * length, cumulative, [cumulative / length] * length, reason)
    return score


def test_score_is_the_float32_sum_over_generated_length_to_the_penalty():
    h = BeamHypotheses(2, length_penalty=2.0, early_stopping=False, max_tokens=10)
    assert add(h, -6.0, 3) == pytest.approx(-6.0 / 9)
    assert h.score(torch.tensor([-6.0]), 3).dtype == torch.float32


def test_keeps_the_best_beam_width_best_first():
    h = BeamHypotheses(2, length_penalty=1.0, early_stopping=False, max_tokens=10)
    add(h, -4.0, 2)        # -2.0
    add(h, -3.0, 3)        # -1.0
    add(h, -9.0, 3)        # -3.0: worse than both kept, dropped
    add(h, -1.5, 1)        # -1.5: replaces -2.0
    assert [round(x.score, 3) for x in h.best()] == [-1.0, -1.5]
    assert len(h) == 2 and h.is_full


def test_early_stopping_true_stops_once_full():
    h = BeamHypotheses(2, length_penalty=1.0, early_stopping=True, max_tokens=10)
    add(h, -1.0, 1)
    assert not h.update_done(f32(-0.1), 1)
    add(h, -2.0, 1)
    assert h.update_done(f32(-0.1), 1)          # even though the running beam is better


def test_early_stopping_false_asks_whether_the_best_running_beam_can_still_win():
    h = BeamHypotheses(2, length_penalty=1.0, early_stopping=False, max_tokens=10)
    add(h, -2.0, 2)                              # -1.0
    add(h, -3.0, 2)                              # -1.5 (the worst kept)
    assert not h.update_done(f32(-4.0), 3)       # -4/3 = -1.33 > -1.5: it may still win
    assert h.update_done(f32(-6.0), 3)           # -6/3 = -2.0: it cannot
    assert h.update_done(f32(-0.1), 4)           # once impossible, always (HF's flag is sticky)


def test_early_stopping_never_scores_the_running_beam_at_max_tokens_with_a_positive_penalty():
    h = BeamHypotheses(2, length_penalty=1.0, early_stopping="never", max_tokens=10)
    add(h, -2.0, 2)
    add(h, -3.0, 2)                              # worst kept: -1.5
    assert not h.update_done(f32(-6.0), 3)       # -6/10 = -0.6 at max_tokens: it may still win
    assert h.update_done(f32(-16.0), 3)          # -1.6 even at max_tokens


def test_not_full_never_stops_and_no_running_beam_always_does():
    h = BeamHypotheses(3, length_penalty=1.0, early_stopping=True, max_tokens=10)
    add(h, -1.0, 1)
    assert not h.update_done(f32(-50.0), 5)
    assert h.update_done(None, 5)

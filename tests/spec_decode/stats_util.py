"""Pearson's chi-square goodness of fit, with the p-value from torch (no scipy in the test deps)."""

from __future__ import annotations

import numpy as np
import torch


def chi_square_p(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """counts [V] observed, probs [V] expected (sums to 1) -> p-value. Bins expecting fewer than
    min_expected are pooled into one; observations where probs is 0 give p = 0."""
    n = counts.sum()
    expected = probs * n
    if counts[expected == 0].sum() > 0:
        return 0.0
    big = expected >= min_expected
    obs = list(counts[big]) + ([counts[~big].sum()] if (~big).any() else [])
    exp = list(expected[big]) + ([expected[~big].sum()] if (~big).any() else [])
    obs, exp = np.asarray(obs, dtype=np.float64), np.asarray(exp, dtype=np.float64)
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))

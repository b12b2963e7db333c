"""The random draw of the sampler: the exponential race.

argmax_i(w_i / E_i) with E_i ~ Exponential(1) i.i.d. picks i with probability w_i / sum(w) (w >= 0,
unnormalised is fine). Each row's noise comes from that row's own generator when it has one, so a
seeded request draws the same noise whatever else shares its batch; unseeded rows share the global one.
"""

from __future__ import annotations

import torch


def exponential_noise(num_rows: int, width: int, generators: dict[int, torch.Generator],
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """Exponential(1) noise [num_rows, width] float32; row r uses generators[r] when present."""
    noise = torch.empty(num_rows, width, dtype=torch.float32, device=device)  # [num_rows, width]
    if len(generators) < num_rows:
        noise.uniform_()  # global generator; seeded rows are overwritten below
    for row, generator in generators.items():
        noise[row].uniform_(generator=generator)
    # -log(U) ~ Exponential(1). We build it from uniform_ rather than exponential_ because torch's CPU
    # exponential_ is ~4x slower (scalar log1p in double). U in [0, 1): U = 0 gives E = +inf, which
    # only ever loses the race (w / inf = 0), and E > 0 always, so w = 0 never yields 0/0 = NaN.
    return noise.log_().neg_()


def exponential_race(weights: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample one column per row of weights [num_rows, width] (>= 0; consumed in place) -> [num_rows] int64."""
    num_rows, width = weights.shape
    noise = exponential_noise(num_rows, width, generators, weights.device)  # [num_rows, width]
    return weights.div_(noise).argmax(dim=-1)  # [num_rows]


def subset_generators(generators: dict[int, torch.Generator], row_ids: list[int]) -> dict[int, torch.Generator]:
    """Re-key generators for the sub-batch made of rows row_ids (new position -> generator)."""
    if not generators:
        return {}
    return {pos: generators[row] for pos, row in enumerate(row_ids) if row in generators}

"""`RowSampling`: the C++ sampler's per-row inputs (ops/sample_rows.py), in row order.

One step's sampled rows as four numpy arrays (temperature 0 = greedy, top_k = vocab_size when off,
top_p 1 when off, min_p 0 when off) and the seeded rows' generators. The Sampler builds one for the
rows it samples on the CPU, and the engine for a step it runs as one C++ call (models/greedy_decode.py):
both draw their noise here, so the two paths give the same token for the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore import _core
from pagedcore.sampling.noise import exponential_noise
from pagedcore.sampling_params import SamplingParams


@dataclass
class RowSampling:
    temperature: np.ndarray  # [R] float32, 0 = greedy (argmax)
    top_k: np.ndarray  # [R] int64, vocab_size = off
    top_p: np.ndarray  # [R] float32, 1 = off
    min_p: np.ndarray  # [R] float32, 0 = off
    generators: dict[int, torch.Generator]  # row -> the row's own generator (seeded rows)
    vocab_size: int

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None] | None,
                    vocab_size: int) -> RowSampling:
        """generators[i]: row i's persistent generator when params[i].seed is set (see make_generator)."""
        row_generators = {}
        for row, p in enumerate(params):
            if p.seed is None or p.temperature == 0:
                continue
            generator = None if generators is None else generators[row]
            if generator is None:
                raise ValueError(f"row {row} has seed={p.seed} but no generator; create one per request with "
                                 "make_generator(params) and pass the same object every step")
            row_generators[row] = generator
        return cls(
            temperature=np.array([p.temperature for p in params], dtype=np.float32),
            top_k=np.array([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params], dtype=np.int64),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            min_p=np.array([p.min_p for p in params], dtype=np.float32),
            generators=row_generators, vocab_size=vocab_size)

    @property
    def num_rows(self) -> int:
        return len(self.temperature)

    @property
    def noise_width(self) -> int:
        return _core.sample_noise_width(self.vocab_size)

    def draw_noise(self) -> torch.Tensor:
        """Exponential(1) noise [R, noise_width] float32: a seeded row's from its own generator (the
        same draws in any batch), the others' from torch's global one. Draw once per step, and only
        for a step that samples: the generators advance."""
        return exponential_noise(self.num_rows, self.noise_width, self.generators)

    def draw_step_noise(self, query_start_loc: np.ndarray) -> torch.Tensor:
        """The noise of a multi-step (engine/multi_step.py), row r here being sequence r there, which steps
        q_len_r = query_start_loc[r + 1] - query_start_loc[r] times: float32 [query_start_loc[-1], noise_width],
        row query_start_loc[r] + i its step i's. Step i draws for the sequences still stepping, in order,
        exactly what a single step of those rows draws (draw_noise), and nothing when they are all greedy:
        the draws of single steps, unless a sequence stops (EOS, a stop id) before its last step, after
        which the global generator's draws for unseeded rows shift (seeded rows' never do)."""
        start = np.asarray(query_start_loc, dtype=np.int64)                   # [R + 1]
        q_len = np.diff(start)                                                # [R]
        noise = torch.zeros(int(start[-1]), self.noise_width, dtype=torch.float32)  # [num_tokens, W]
        for i in range(int(q_len.max(initial=0))):
            stepping = np.flatnonzero(q_len > i)                              # rows of step i, in order
            if not (self.temperature[stepping] > 0).any():
                continue                                                      # a greedy step draws nothing
            generators = {j: self.generators[r] for j, r in enumerate(stepping.tolist()) if r in self.generators}
            noise[torch.from_numpy(start[stepping] + i)] = exponential_noise(len(stepping), self.noise_width,
                                                                             generators)
        return noise

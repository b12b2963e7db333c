"""CostModel: the time of one engine step from what the scheduler put into it, fitted to real steps.

    t_step = a + b * num_tokens + c * num_context_tokens + d * num_seqs + e * num_swapped_blocks
             fixed   GEMM rows     attention reads (Σ seq_lens)  per-sequence   KV copied to/from CPU

The defaults were fitted to 236 timed steps of the real engine (two runs of `pagedcore simulate
--record-calibration --num-threads 1`, seeds 0 and 1) running the bundled SmolLM2-135M in float32 on
this project's shared 2-core CPU machine; see docs/simulator.md for how, and how to refit elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

FEATURES = ("num_tokens", "num_context_tokens", "num_seqs")


@dataclass(frozen=True)
class CostModel:
    a: float = 0.0   # seconds per step
    b: float = 0.0   # seconds per scheduled token
    c: float = 0.0   # seconds per context token read by attention
    d: float = 0.0   # seconds per scheduled sequence
    e: float = 0.0   # seconds per block swapped in or out (not fitted: measured by a copy benchmark)
    source: str = "unfitted"
    fit: dict = field(default_factory=dict, compare=False)   # r2, median relative error, num_steps

    def __post_init__(self):
        for name in "abcde":
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0 seconds, got {getattr(self, name)}")

    def step_time(self, num_tokens: int, num_context_tokens: int, num_seqs: int, num_swapped_blocks: int = 0) -> float:
        return (self.a + self.b * num_tokens + self.c * num_context_tokens + self.d * num_seqs
                + self.e * num_swapped_blocks)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def load(cls, path: str) -> CostModel:
        with open(path, encoding="utf-8") as f:
            return cls(**json.load(f))

    def describe(self) -> str:
        return (f"t = {_time(self.a)} + {_time(self.b)}/token + {_time(self.c)}/context token + {_time(self.d)}/seq "
                f"+ {_time(self.e)}/swapped block  ({self.source})")


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fit_cost_model(rows: np.ndarray, step_seconds: np.ndarray, e: float = 0.0, source: str = "fitted") -> CostModel:
    """Least squares of step_seconds on [1, num_tokens, num_context_tokens, num_seqs] (rows [n, 3]),
    every coefficient kept >= 0: a negative one is dropped and the rest refitted (collinear features,
    e.g. decode-only steps where tokens == seqs, would otherwise trade signs)."""
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURES))
    y = np.asarray(step_seconds, dtype=np.float64)
    if len(y) < 8:
        raise ValueError(f"need at least 8 timed steps to fit a cost model, got {len(y)}; record a longer trace")
    x = np.hstack([np.ones((len(y), 1)), rows])
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    pred = x @ coef
    ss_res, ss_tot = float(((y - pred) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    quality = {"num_steps": int(len(y)), "r2": round(1 - ss_res / ss_tot, 4) if ss_tot else 1.0,
               "median_relative_error": round(float(np.median(np.abs(pred - y) / np.maximum(y, 1e-9))), 4)}
    a, b, c, d = (float(v) for v in coef)
    return CostModel(a, b, c, d, e, source=source, fit=quality)


def fit_from_trace(path: str, e: float = 0.0, skip_steps: int = 3) -> CostModel:
    """Fits to the timed steps of a JSONL trace (`pagedcore serve --enable-trace --trace-file F`); the
    first `skip_steps` steps (one-off warm-up costs) are left out."""
    rows, times = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            total = record.get("timing", {}).get("total") if record.get("kind") == "step" else None
            if total is not None and record["step"] > skip_steps:
                rows.append([record[k] for k in FEATURES])
                times.append(total)
    return fit_cost_model(np.array(rows), np.array(times), e=e, source=f"fitted to {len(times)} steps of {path}")


# Measured on this project's machine (2 cores shared with other jobs, load average ~8 while it ran, hence
# the modest fit); regenerate with `pagedcore simulate --record-calibration TRACE --num-threads 1`.
DEFAULT_COST_MODEL = CostModel(
    a=0.1549, b=6.90e-3, c=2.11e-5, d=0.0, e=6.2e-5,
    source="SmolLM2-135M fp32, 1 CPU thread, 2-core machine (236 steps)",
    fit={"num_steps": 236, "r2": 0.9144, "median_relative_error": 0.1684})

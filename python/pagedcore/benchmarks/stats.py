"""Small statistics shared by the bench commands: percentiles and the per-step time breakdown."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), so results match np.percentile.
    NaN for an empty list: a metric with no samples (e.g. ITL of one-token outputs) is not zero."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float], scale: float = 1.0) -> dict:
    """mean, median, p50/p90/p99, min, max of values * scale (e.g. scale=1000 for ms)."""
    xs = [v * scale for v in values]
    out = {"count": len(xs), "mean": sum(xs) / len(xs) if xs else math.nan,
           "min": min(xs) if xs else math.nan, "max": max(xs) if xs else math.nan}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(xs, q)
    return out


# Step phases in the order a step runs them. The engine times schedule / forward / sample /
# update_and_outputs itself (LLMEngine.last_step_timing); StepProbe splits "forward" further.
PHASES = ("schedule", "input_prep", "model_forward", "lm_head", "sample", "update_and_outputs")
PHASE_LABELS = {
    "schedule": "scheduler (C++ schedule + arrays)",
    "input_prep": "input prep (tensors, block moves, gather)",
    "model_forward": "model forward (30 layers)",
    "lm_head": "lm_head (sampled rows)",
    "sample": "sampling",
    "update_and_outputs": "update + detokenize + outputs",
    "between_steps": "outside steps (add_request, loop)",
}


def breakdown(step_records: Iterable[dict], wall: float | None = None) -> dict:
    """Sums phase seconds over steps; shares are of the summed step time, or of wall if given
    (then 'between_steps' holds what no step accounts for)."""
    totals = dict.fromkeys(PHASES, 0.0)
    step_total = 0.0
    num_steps = 0
    for rec in step_records:
        num_steps += 1
        step_total += rec["total"]
        for phase in PHASES:
            totals[phase] += rec.get(phase, 0.0)
    denominator = wall if wall else step_total
    if wall:
        totals["between_steps"] = max(0.0, wall - step_total)
    return {"num_steps": num_steps, "step_seconds": step_total, "seconds": totals,
            "share": {k: (v / denominator if denominator else 0.0) for k, v in totals.items()},
            "outside_forward_share": (1.0 - (totals["model_forward"] + totals["lm_head"]) / denominator
                                      if denominator else 0.0)}


def format_breakdown(b: dict, indent: str = "  ") -> str:
    lines = []
    for phase, seconds in b["seconds"].items():
        lines.append(f"{indent}{PHASE_LABELS[phase]:<42} {seconds:9.3f} s  {100 * b['share'][phase]:5.1f} %")
    lines.append(f"{indent}{'share outside the model forward + lm_head':<42} {'':9}    "
                 f"{100 * b['outside_forward_share']:5.1f} %")
    return "\n".join(lines)

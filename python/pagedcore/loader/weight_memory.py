"""Resident weight bytes of a loaded model, by format: what the start-up log and benchmarks report."""

from __future__ import annotations

from torch import nn


def weight_bytes_by_format(model: nn.Module) -> dict[str, int]:
    """Format name ("q4_1", "q8_0", "int8_per_channel", "float32", "bfloat16", ...) -> bytes held by
    the model's parameters in that format. Layers that keep their weights outside plain parameters
    (quantized linears, a blocked embedding) report their own through weight_bytes()."""
    counts: dict[str, int] = {}
    counted: set[int] = set()
    for module in model.modules():
        method = getattr(module, "method", None)
        report = getattr(method, "weight_bytes", None)
        if report is not None:
            layer_counts = report(module)
        elif callable(getattr(module, "weight_bytes", None)):
            layer_counts = module.weight_bytes()
        else:
            continue
        for name, nbytes in layer_counts.items():
            counts[name] = counts.get(name, 0) + nbytes
        counted.update(id(p) for p in module.parameters(recurse=False))
    for param in model.parameters():
        if id(param) not in counted:
            name = str(param.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + param.nbytes
            counted.add(id(param))
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def describe(counts: dict[str, int]) -> str:
    """'96.6 MB of weights: q8_0 30.1 MB, q4_1 66.4 MB, float32 0.1 MB'."""
    total = sum(counts.values())
    parts = ", ".join(f"{name} {nbytes / 1e6:.1f} MB" for name, nbytes in counts.items())
    return f"{total / 1e6:.1f} MB of weights: {parts}"

"""PNG plots of a `bench serve` result: latency distributions and throughput against offered load.

matplotlib is optional (not an engine dependency): without it the plots are skipped with a note
that says how to get them; the JSON result holds every number the plots show.
"""

from __future__ import annotations

import math
import os


def write_serve_plots(result: dict, plot_dir: str) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")               # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return []
    os.makedirs(plot_dir, exist_ok=True)
    paths = [_latency_distribution(plt, result, os.path.join(plot_dir, "latency_distribution.png"))]
    if len(result["runs"]) > 1:
        paths.append(_throughput_vs_load(plt, result, os.path.join(plot_dir, "throughput_vs_load.png")))
    return paths


def _latency_distribution(plt, result: dict, path: str) -> str:
    """One panel per metric (TTFT, TPOT, ITL, E2E), an empirical CDF per offered rate."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, metric in zip(axes.flat, ("ttft", "tpot", "itl", "e2e")):
        for run in result["runs"]:
            ok = [r for r in run["requests"] if r["success"]]
            if metric == "itl":
                values = [x * 1000 for r in ok for x in r["itl"]]
            else:
                values = [r[metric] * 1000 for r in ok if not math.isnan(r[metric])]
            if not values:
                continue
            values.sort()
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=f"rate {run['request_rate']}")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['model']} @ {result['base_url']}: latency distribution")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _throughput_vs_load(plt, result: dict, path: str) -> str:
    """Achieved output tok/s and p50/p99 TTFT against offered request rate ('inf' drawn at the right end)."""
    runs = result["runs"]
    finite = [r["request_rate"] for r in runs if r["request_rate"] != "inf"]
    inf_x = (max(finite) * 1.5) if finite else 1.0
    xs = [inf_x if r["request_rate"] == "inf" else r["request_rate"] for r in runs]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(xs, [r["output_token_throughput"] for r in runs], "o-", label="output tok/s")
    ax.set_xlabel("offered load (requests/s; rightmost = all at once)" if "inf" in [r["request_rate"] for r in runs]
                  else "offered load (requests/s)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, [r["ttft_ms"]["p50"] for r in runs], "s--", color="tab:orange", label="TTFT p50")
    ax2.plot(xs, [r["ttft_ms"]["p99"] for r in runs], "^--", color="tab:red", label="TTFT p99")
    ax2.set_ylabel("TTFT (ms)")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left")
    fig.suptitle(f"{result['model']}: throughput vs offered load")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

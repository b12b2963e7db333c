"""`pagedcore bench allreduce` with tiny settings: it runs both backends in two rank processes and
prints the table with the CPU and the load average. No timing is asserted (a shared machine)."""

from __future__ import annotations

import json

from pagedcore.cli import main


def test_allreduce_bench_runs_tiny(tmp_path, capsys):
    out_json = tmp_path / "ar.json"
    rc = main(["--log-level", "WARNING", "bench", "allreduce", "--rows", "1", "8", "--hidden-size", "64",
               "--iters", "5", "--warmup", "1", "--output-json", str(out_json)])
    text = capsys.readouterr().out
    assert rc == 0
    for field in ("CPU:", "load average", "all-reduce of [rows, 64]", "shm", "gloo", "gloo/shm", "bfloat16"):
        assert field in text, field
    result = json.loads(out_json.read_text())
    assert result["hidden_size"] == 64 and result["world_size"] == 2
    assert set(result["results"]) == {f"{b}/{r}/{d}" for b in ("shm", "gloo") for r in (1, 8)
                                      for d in ("float32", "bfloat16")}
    assert all(m["median_us"] > 0 and m["p90_us"] >= m["median_us"] for m in result["results"].values())

"""`pagedcore bench soak` for 60 s on a small KV cache: mixed HTTP + gRPC load with clients that hang
up mid-stream; passes only with no 5xx, no growth of RSS / fds / queues, and every block free again
once idle. The long run (30 min at 32 streams) is a benchmark, run by hand (docs/serving-http.md)."""

from __future__ import annotations

import json

import pytest

from pagedcore.benchmarks.soak import Sample, Tally, verdict


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_60_second_soak_passes(tmp_path):
    from pagedcore.cli import main

    out = tmp_path / "soak.json"
    code = main(["bench", "soak", "--duration", "60", "--concurrency", "8", "--max-tokens", "8",
                 "--kv-cache-memory", "16MiB", "--max-model-len", "256", "--sample-interval", "2",
                 "--server-log", str(tmp_path / "server.log"), "--output-json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0, (result["problems"], (tmp_path / "server.log").read_text()[-3000:])
    assert result["passed"] and not result["failures"]
    assert sum(result["ok"].values()) > 0 and sum(result["aborted"].values()) > 0
    kinds = set(result["ok"]) | set(result["aborted"])
    assert any(k.startswith("grpc") for k in kinds) and any(k.startswith("http") for k in kinds)
    assert result["idle_end"]["kv_cache_usage"] == 0.0


def _samples(rss_mib, fds=None, waiting=None):
    n = len(rss_mib)
    return [Sample(t=float(i * 10), rss_bytes=int(r * (1 << 20)), num_fds=(fds or [50] * n)[i], kv_cache_usage=0.1,
                   num_running=4, num_waiting=(waiting or [0] * n)[i]) for i, r in enumerate(rss_mib)]


IDLE = {"idle_start": {"num_fds": 50, "kv_cache_usage": 0.0, "num_running": 0, "num_waiting": 0},
        "idle_end": {"num_fds": 52, "kv_cache_usage": 0.0, "num_running": 0, "num_waiting": 0}}


def _ok() -> Tally:
    t = Tally()
    t.ok["http"] = 10
    return t


def test_the_verdict_passes_a_flat_run():
    assert verdict(_samples([500, 520, 510, 515, 512, 518, 511, 516, 514, 513, 515]), IDLE, _ok(), 100) == []


def test_the_verdict_catches_growth_leaks_and_errors():
    climbing = _samples([500 + 40 * i for i in range(12)])
    assert any("RSS grew" in p for p in verdict(climbing, IDLE, _ok(), 120))
    fds = _samples([500] * 12, fds=[50 + 10 * i for i in range(12)])
    assert any("open fds grew" in p for p in verdict(fds, IDLE, _ok(), 120))
    queue = _samples([500] * 12, waiting=[2 * i for i in range(12)])
    assert any("waiting queue grew" in p for p in verdict(queue, IDLE, _ok(), 120))
    leak = {**IDLE, "idle_end": {**IDLE["idle_end"], "kv_cache_usage": 0.05}}
    assert any("block leak" in p for p in verdict(_samples([500] * 12), leak, _ok(), 120))
    bad = _ok()
    bad.fail("http-completion-whole", "HTTP 500: boom")
    assert any("1 failed requests" in p for p in verdict(_samples([500] * 12), IDLE, bad, 120))

"""The simulator's routes without a browser or a model: the page and its files, the comparison
endpoint, the live stream's answer when the server records no trace, and the trace overhead script."""

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from pagedcore.simulator.router import STATIC_DIR, simulator_router


@pytest.fixture
def client():
    app = FastAPI()
    app.include_router(simulator_router(None, None))
    with TestClient(app) as c:
        yield c


def test_the_page_and_its_files_are_served_from_the_package(client):
    page = client.get("/")
    assert page.status_code == 200 and '<base href="/simulator/static/">' in page.text
    for name in ("app.js", "state.js", "feed.js", "grid.js", "grid_layout.js", "explain.js", "timeline.js", "panels.js",
                 "simulate.js", "style.css"):
        r = client.get(f"/simulator/static/{name}")
        assert r.status_code == 200 and len(r.content) > 500, name
    assert client.get("/simulator/static/..%2Frouter.py").status_code == 404
    assert client.get("/simulator/static/nothing.js").status_code == 404


def test_the_page_fetches_nothing_from_the_network():
    import os
    import re

    for name in os.listdir(STATIC_DIR):
        with open(os.path.join(STATIC_DIR, name), encoding="utf-8") as f:
            text = f.read()
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", text), name
        assert "import(" not in text and "cdn" not in text.lower(), name


def test_without_a_recorder_the_stream_says_how_to_get_one(client):
    assert client.get("/simulator/info").json()["live"] is False
    body = client.get("/simulator/events").text
    assert '"kind": "unavailable"' in body and "--disable-trace" in body
    assert client.get("/simulator/state").status_code == 404


def test_the_comparison_endpoint_returns_every_policy(client):
    r = client.post("/simulator/simulate", json={
        "workload": {"num_requests": 120, "max_output_len": 64}, "config": {"num_gpu_blocks": 512},
        "policies": ["continuous", "static"], "trace_policy": "static"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["policy"] for x in body["results"]] == ["continuous", "static"]
    assert body["results"][0]["metrics"]["num_requests"] == 120
    assert len(body["results"][0]["series"]["time"]) > 10
    assert body["trace"][0]["kind"] == "snapshot" and body["trace"][0]["config"]["model"] == "simulation: static"
    bad = client.post("/simulator/simulate", json={"workload": {"num_requests": 10, "bogus": 1}})
    assert bad.status_code == 400 and "bogus" in bad.text


def test_the_workload_button_needs_a_server_engine(client):
    assert client.post("/simulator/workload", json={}).status_code == 404


def test_trace_overhead_script_runs():
    from .trace_overhead import measure

    r = measure(num_requests=40, num_seqs=16, repeats=1)
    assert r["steps"] > 0 and all(r[k] > 0 for k in ("off", "events", "tracer", "recorder"))


def test_serve_records_the_trace_unless_told_not_to():
    import argparse

    from pagedcore.serving.cli import add_serve_parser, cmd_serve

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_serve_parser(sub)
    assert parser.parse_args(["serve"]).enable_trace is True
    assert parser.parse_args(["serve", "--enable-trace"]).enable_trace is True     # still accepted
    assert parser.parse_args(["serve", "--disable-trace"]).enable_trace is False
    args = parser.parse_args(["serve", "--disable-trace", "--trace-file", "t.jsonl"])
    with pytest.raises(ValueError, match="--trace-file needs the trace: drop --disable-trace"):
        cmd_serve(args)


def test_info_reports_the_cost_of_the_trace():
    from pagedcore import _core
    from pagedcore.simulator.recorder import TraceRecorder
    from pagedcore.simulator.trace import StepTracer

    recorder = TraceRecorder()
    recorder.start(StepTracer(_core.Scheduler(_core.SchedulerConfig(num_gpu_blocks=8, block_size=4, enable_trace=True))))
    app = FastAPI()
    app.include_router(simulator_router(None, recorder))
    with TestClient(app) as c:
        info = c.get("/simulator/info").json()
    assert info["live"] is True and info["why_not_live"] is None
    assert info["trace_cost"] == {"num_records": 0, "seconds": 0.0}

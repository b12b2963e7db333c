"""CORS with vLLM's flags: --allowed-origins / --allowed-methods / --allowed-headers as JSON lists and
--allow-credentials. Without them no CORS headers are sent (pages of other origins cannot read
responses). The app is built in-process (no model: CORS is answered before any handler runs)."""

from __future__ import annotations

import argparse

import httpx
import pytest
from starlette.testclient import TestClient

from pagedcore.serving.http_app import build_app
from pagedcore.serving.state import ServerState
from pagedcore.serving.transport_args import add_transport_args, check_transport_args


def _cors(*argv: str):
    parser = argparse.ArgumentParser()
    add_transport_args(parser)
    return check_transport_args(parser.parse_args(list(argv)))


def _client(cors) -> TestClient:
    return TestClient(build_app(ServerState(served_model_names=["m"], cors=cors, api_keys=["k"])))


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def _preflight(client: httpx.Client, origin: str) -> httpx.Response:
    return client.options("/v1/completions", headers={"Origin": origin, **PREFLIGHT})


def test_json_lists_as_vllm_takes_them():
    cors = _cors("--allowed-origins", '["https://a.example", "https://b.example"]', "--allowed-methods",
                 '["GET", "POST"]', "--allowed-headers", '["Authorization", "Content-Type"]', "--allow-credentials")
    assert cors.allowed_origins == ["https://a.example", "https://b.example"]
    assert cors.allowed_methods == ["GET", "POST"] and cors.allow_credentials
    assert _cors("--allowed-origins", "https://a.example,https://b.example").allowed_origins == \
        ["https://a.example", "https://b.example"]
    assert _cors() is None


@pytest.mark.parametrize("argv,message", [
    (["--allowed-origins", '["*"]', "--allow-credentials"], "--allow-credentials cannot be combined"),
])
def test_contradictory_cors_flags_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        _cors(*argv)


def test_malformed_json_list_is_refused():
    parser = argparse.ArgumentParser()
    add_transport_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--allowed-origins", '["https://a.example"'])


def test_listed_origin_gets_preflight_and_headers():
    cors = _cors("--allowed-origins", '["https://app.example"]', "--allowed-methods", '["GET", "POST"]',
                 "--allow-credentials")
    with _client(cors) as client:
        ok = _preflight(client, "https://app.example")
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert ok.headers["access-control-allow-credentials"] == "true"
        # A real request from that origin: the answer (here 401, no key) carries the CORS header too.
        r = client.get("/v1/models", headers={"Origin": "https://app.example"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://app.example"
        # Another origin is refused at the preflight and gets no CORS header.
        other = _preflight(client, "https://evil.example")
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        plain = client.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in plain.headers


def test_wildcard_origin():
    with _client(_cors("--allowed-origins", '["*"]')) as client:
        ok = _preflight(client, "https://anything.example")
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "*"


def test_no_cors_flags_no_cors_headers():
    with _client(None) as client:
        r = client.get("/version", headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        assert _preflight(client, "https://app.example").status_code == 405    # OPTIONS is not a route

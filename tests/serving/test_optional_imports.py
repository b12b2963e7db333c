"""The serving layer's one optional import: gRPC stubs that were never built and cannot be generated
(no grpcio-tools) turn gRPC off; any other import error of in-tree code propagates."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from pagedcore.serving import server
from pagedcore.serving.grpc import stubs
from pagedcore.serving.grpc.stubs import StubsUnavailableError


def test_missing_grpc_tools_is_the_optional_case(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc_tools", None)  # `import grpc_tools` raises ImportError
    with pytest.raises(StubsUnavailableError, match="grpcio-tools is not installed"):
        stubs.generate_stubs(tmp_path / "generation.proto", tmp_path / "out")


def _start_grpc_with(monkeypatch, error: ImportError):
    def fail(*_):
        raise error
    broken = types.ModuleType("pagedcore.serving.grpc.server")
    broken.__getattr__ = fail  # `from ... import start_grpc_server` raises `error`
    monkeypatch.setitem(sys.modules, "pagedcore.serving.grpc.server", broken)
    args = types.SimpleNamespace(grpc_port=8033, host="127.0.0.1")
    return asyncio.run(server._start_grpc(args, None, None))


def test_start_grpc_turns_grpc_off_only_for_the_optional_case(monkeypatch):
    assert _start_grpc_with(monkeypatch, StubsUnavailableError("no stubs")) is None
    with pytest.raises(ImportError, match="in-tree breakage"):
        _start_grpc_with(monkeypatch, ImportError("in-tree breakage"))

"""Helpers of the HTTP serving tests: a real `pagedcore serve` subprocess and /metrics reading."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

SERVED_NAMES = ["smol", "smollm2"]
MAX_MODEL_LEN = 1024
MAX_BODY_BYTES = 65536
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m pagedcore.cli serve ...` on a free port; its log goes to a temporary file."""

    def __init__(self, *args: str, env: dict | None = None, https: dict | None = None):
        """https: httpx's TLS arguments (verify=, cert=) for a server started with --ssl-* flags."""
        self.port = free_port()
        self.https = https
        self.url = f"{'https' if https is not None else 'http'}://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="pagedcore-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "pagedcore.cli", "serve", "--port", str(self.port), "--grpc-port", "0",
               "--kv-cache-memory", "256MiB", "--max-model-len", str(MAX_MODEL_LEN),
               "--uvicorn-log-level", "warning", *args]
        environ = {k: v for k, v in os.environ.items() if k != "PAGEDCORE_API_KEY"}   # keys only when asked
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**environ, **(env or {})})
        self.health_seen: list[int] = []   # /health status codes seen while starting, in order

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status = httpx.get(self.url + "/health", timeout=5, **(self.https or {})).status_code
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            self.health_seen.append(status)
            if status == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        os.unlink(self._log.name)
        return self.proc.returncode


def metric(server_url: str, name: str, **labels) -> float:
    """One sample of /metrics (summed over label sets that match `labels`)."""
    text = httpx.get(server_url + "/metrics", timeout=30).text
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total, found = total + float(value), True
    return total if found else 0.0


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()

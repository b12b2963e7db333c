"""Fixtures of the simulator's browser tests: a tiny random-weight model served with the simulator
mounted and a trace file, and headless Chromium (Debian's package) driven by Playwright.

Playwright is told to use the system chromium (`executable_path`): `playwright install` would
download a browser, which this project never does. Without either, the browser tests skip and say
what to install.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "test-artifacts")
START_TIMEOUT_S = 120


def chromium_path() -> str | None:
    return os.environ.get("PAGEDCORE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimulatorServer:
    """`pagedcore serve --enable-trace` (through tests.simulator.server_launcher) in a subprocess."""

    def __init__(self, model: str, trace_file: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trace_file = trace_file
        self.log = tempfile.NamedTemporaryFile("w+", prefix="pagedcore-sim-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "tests.simulator.server_launcher", model, "--port", str(self.port),
               "--grpc-port", "0", "--max-model-len", "256", "--num-threads", "1", "--uvicorn-log-level", "warning",
               "--trace-file", trace_file, *args]
        root = os.path.dirname(ARTIFACTS)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=root)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s:\n{self.read_log()}")

    def read_log(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory):
    from ..models import tiny_models

    return tiny_models.save_hf_folder(tiny_models.build_hf_model("llama"), tmp_path_factory.mktemp("sim_tiny_llama"))


@pytest.fixture(scope="session")
def sim_server(tiny_model_folder, tmp_path_factory):
    # 1 MiB of KV cache is 85 blocks of 16 tokens for this model: small enough that a workload of
    # 20 requests sharing a system prompt fills it and preempts, large enough for any one request.
    trace = str(tmp_path_factory.mktemp("sim_trace") / "live.jsonl")
    server = SimulatorServer(tiny_model_folder, trace, "--kv-cache-memory", "1MiB", "--block-size", "16")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed: pip install playwright (never `playwright install`)")
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium: apt-get install -y chromium (or set PAGEDCORE_CHROMIUM to a Chromium binary)")
    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page of the browser with its console errors collected."""

    def __init__(self, browser, url: str):
        self.page = browser.new_page(viewport={"width": 1500, "height": 1050})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.goto(url)

    def js(self, expression: str, arg=None):
        return self.page.evaluate(expression, arg)

    def wait_for(self, expression: str, timeout_s: float = 30.0, arg=None):
        self.page.wait_for_function(expression, arg=arg, timeout=timeout_s * 1000)

    def screenshot(self, name: str) -> str:
        path = os.path.join(ARTIFACTS, name)
        self.page.screenshot(path=path, full_page=True)
        return path


@pytest.fixture
def open_page(browser):
    pages = []

    def make(url: str) -> Page:
        pages.append(Page(browser, url))
        return pages[-1]

    yield make
    for p in pages:
        p.page.close()

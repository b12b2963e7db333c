"""Shared pieces of the communication tests: spawned rank processes that never outlive their test,
and the check that a test leaves nothing of this process's in /dev/shm."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from contextlib import contextmanager

import pytest


@contextmanager
def spawned(target, *arg_tuples):
    """Starts one spawned process per argument tuple; kills and reaps any still running on exit."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args, daemon=True) for args in arg_tuples]
    for p in procs:
        p.start()
    try:
        yield procs
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)


def join_ok(procs, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]
    assert codes == [0] * len(procs), f"rank processes exited with {codes} (see their stderr above)"


def own_segments() -> list[str]:
    prefix = f"pagedcore-{os.getpid()}-"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


@pytest.fixture
def no_leftover_segments():
    """Fails the test if it leaves a shared-memory segment of this process behind."""
    before = own_segments()
    yield
    left = [n for n in own_segments() if n not in before]
    assert not left, f"the test left {left} in /dev/shm"

"""Helpers of the end-to-end distributed tests: a tiny model whose heads split, process checks."""

from __future__ import annotations

import os
import time

from pagedcore.sampling_params import SamplingParams

# tests/models/tiny_models "llama": 8 query heads, 2 KV heads (TP=2: one KV head each), 3 layers
# (PP=2: layers 0-1 and 2), vocabulary 512 (TP=2: 256 logits columns each).
TINY_KIND = "llama"


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def is_gone(pid: int) -> bool:
    """The process no longer runs (exited, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_gone(pids, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(is_gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return all(is_gone(p) for p in pids)


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (every thread's), from /proc."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
    return children


def rank_pids(driver_pid: int) -> list[int]:
    """The driver's rank processes (spawned children running worker_main), in rank order."""
    ranks = []
    for child in child_pids(driver_pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmdline = f.read()
        except FileNotFoundError:
            continue
        if b"multiprocessing.spawn" in cmdline or b"spawn_main" in cmdline:
            ranks.append(child)
    return sorted(ranks)


def shm_segments(driver_pid: int) -> list[str]:
    """Shared-memory segments named after the driver (pagedcore-<pid>-...)."""
    try:
        return [name for name in os.listdir("/dev/shm") if name.startswith(f"pagedcore-{driver_pid}-")]
    except FileNotFoundError:
        return []

"""The KV cache's memory committed on a thread (host_memory.commit_in_background, the default
kv_cache_commit="background"): the pages become resident, what the engine writes meanwhile is kept,
a released tensor stops the thread, and without MADV_POPULATE_WRITE the commit falls back to the
foreground. The engine serves while the commit runs, with the tokens of a cache committed up front."""

from __future__ import annotations

import mmap
import threading

import pytest
import torch

from pagedcore.config import EngineConfig
from pagedcore.engine import host_memory
from pagedcore.engine import kv_cache as kvc


def _needs_populate():
    if host_memory._madvise() is None:
        pytest.skip("no libc madvise")
    probe = mmap.mmap(-1, host_memory._PAGE_SIZE)
    tensor = torch.frombuffer(probe, dtype=torch.uint8)
    ok = host_memory.commit_in_background(tensor, "probe")
    if ok is None:
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    ok.wait()


def test_background_commit_makes_a_tensor_resident_and_keeps_concurrent_writes():
    _needs_populate()
    num_bytes = 96 * 2**20
    mapping = mmap.mmap(-1, num_bytes)                       # fresh: never touched
    tensor = torch.frombuffer(mapping, dtype=torch.float32)   # [num_bytes / 4]
    assert host_memory.resident_fraction(tensor) == 0
    commit = host_memory.commit_in_background(tensor, "test buffer")
    assert commit is not None
    # Written while the thread commits: one float a page, from the back (where the thread arrives last).
    per_page = host_memory._PAGE_SIZE // 4
    index = torch.arange(tensor.numel() - per_page, -1, -per_page)             # [pages]
    tensor[index] = index.to(torch.float32)
    assert commit.wait(timeout=120)
    assert commit.error is None and not commit.stopped
    assert commit.committed_bytes >= num_bytes - 2 * host_memory._PAGE_SIZE
    assert host_memory.resident_fraction(tensor) == 1
    assert torch.equal(tensor[index], index.to(torch.float32))                  # no write was undone
    assert host_memory.wait_for_background_commits(timeout=1)
    del tensor
    mapping.close()


def test_a_released_tensor_stops_the_commit(monkeypatch):
    _needs_populate()
    real = host_memory._madvise()
    in_first_chunk, release = threading.Event(), threading.Event()
    calls = []

    def madvise(addr, length, advice):   # the thread's first chunk waits until the tensor is gone
        calls.append(length)
        if len(calls) == 2:               # call 1: commit_in_background's probe of one page
            in_first_chunk.set()
            release.wait(60)
        return real(addr, length, advice)

    monkeypatch.setattr(host_memory, "_madvise", lambda: madvise)
    tensor = torch.empty(64 * 2**20, dtype=torch.uint8)       # [64 MiB]: 64 chunks
    commit = host_memory.commit_in_background(tensor, "released buffer")
    assert commit is not None and in_first_chunk.wait(60)
    del tensor                        # the thread holds it only during a call: freed when that call ends
    release.set()
    assert commit.wait(timeout=60)
    assert commit.error is None and commit.stopped
    assert commit.committed_bytes == host_memory._BACKGROUND_CHUNK_BYTES   # the one chunk under way
    assert len(calls) == 2


def test_without_populate_the_cache_is_committed_in_the_foreground(monkeypatch):
    monkeypatch.setattr(host_memory, "_madvise", lambda: None)
    spec = kvc.KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32)
    cache = kvc.allocate(spec, 2048, "cpu", background_commit=True)   # [2, 2, 2048, 2, 16, 64] = 64 MiB
    assert not host_memory._running
    assert host_memory.resident_fraction(cache) == 1                     # resident when allocate returns


def test_kv_cache_commit_is_validated():
    assert EngineConfig().kv_cache_commit == "background"
    assert EngineConfig(kv_cache_commit="startup").kv_cache_commit == "startup"
    with pytest.raises(ValueError, match="kv_cache_commit"):
        EngineConfig(kv_cache_commit="lazy")


def test_cli_flag_reaches_the_config():
    import argparse

    from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args([])).kv_cache_commit == "background"
    args = parser.parse_args(["--kv-cache-commit", "startup"])
    assert engine_config_from_args(args).kv_cache_commit == "startup"


def test_the_engine_serves_while_its_cache_is_committed(tiny_llama):
    """A 1 GiB cache for a tiny model: the steps run while the thread still commits (on a machine that
    commits a GiB faster than the first steps start, they run after it: the answers are the same)."""
    from pagedcore import LLM, SamplingParams
    from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix

    hf_model, folder = tiny_llama
    llm = LLM(folder, dtype="float32", kv_cache_memory="1GiB", max_model_len=256)   # kv_cache_commit="background"
    prompts = prompts_with_shared_prefix(6)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf_model, p, 10) for p in prompts]
    assert llm.llm_engine.wait_for_kv_commit(timeout=300)
    assert host_memory.resident_fraction(llm.llm_engine.worker.runner.kv_cache) == 1


def test_commits_stop_and_finish_before_the_interpreter_exits(monkeypatch):
    """The atexit hook stops a running commit at its next chunk and waits for it: a daemon thread left
    running into finalization is killed when it next takes the GIL, and inside torch's release of a cache's
    last reference that aborted the process ("terminate called without an active exception")."""
    _needs_populate()
    real = host_memory._madvise()
    in_chunk, release = threading.Event(), threading.Event()

    def madvise(addr, length, advice):   # every chunk waits for the test to let it go
        if length == host_memory._BACKGROUND_CHUNK_BYTES:
            in_chunk.set()
            release.wait(60)
        return real(addr, length, advice)

    monkeypatch.setattr(host_memory, "_madvise", lambda: madvise)
    tensor = torch.empty(64 * 2**20, dtype=torch.uint8)       # [64 MiB]: 64 chunks
    commit = host_memory.commit_in_background(tensor, "exiting buffer")
    assert commit is not None and in_chunk.wait(60)
    stopper = threading.Thread(target=host_memory._stop_at_exit)   # what atexit runs: flags, then waits
    stopper.start()
    while not commit._exiting:
        stopper.join(0.01)
    release.set()                                              # the chunk under way ends; no other starts
    stopper.join(60)
    assert commit.done and commit.stopped and not commit._thread.is_alive()
    assert commit.committed_bytes == host_memory._BACKGROUND_CHUNK_BYTES

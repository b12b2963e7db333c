"""The shared-memory all-reduce between real processes (spawn, 2 ranks): sums equal to the reference
(fp32 exact for integer-valued data, bf16 summed in fp32 and rounded once), odd sizes, sizes above
one slot, many calls in a row, and a SIGKILLed peer turning into PeerDiedError instead of a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from pagedcore.distributed import comm_spec as cs
from pagedcore.distributed.errors import PeerDiedError
from tests.distributed.comm_helpers import join_ok, no_leftover_segments, own_segments, spawned  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_leftover_segments")

SIZES = [1, 7, 576, 8 * 576 + 5, 40_000]   # 40k fp32 = 160 KB: ten rounds of a 16 KiB slot


def rank_data(rank: int, numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Integer-valued fp32 (every partial sum exact), or bf16 values whose sum needs rounding."""
    gen = torch.Generator().manual_seed(seed * 10 + rank)
    if dtype == torch.float32:
        return torch.randint(-1000, 1000, (numel,), generator=gen).float()
    return (torch.randn(numel, generator=gen) * (1 + 99 * rank)).to(torch.bfloat16)


def expected_sum(world_size: int, numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    total = sum(rank_data(r, numel, dtype, seed).float() for r in range(world_size))
    return total.to(dtype)


def _rank_sums(spec, rank):
    comm = cs.open_communicator(spec, rank, timeout=60)
    for seed, numel in enumerate(SIZES):
        for dtype in (torch.float32, torch.bfloat16):
            x = rank_data(rank, numel, dtype, seed)
            comm.all_reduce(x)
            assert torch.equal(x, expected_sum(2, numel, dtype, seed)), (numel, dtype)
    for call in range(300):   # many calls in a row, sizes changing
        x = torch.full((1 + call % 97, 3), float(call + rank))
        comm.all_reduce(x)
        assert torch.equal(x, torch.full_like(x, float(2 * call + 1))), call
    comm.close()


def test_all_reduce_equals_the_sum_in_two_processes():
    spec = cs.create_shm_group(world_size=2, max_bytes=16 << 10)
    try:
        with spawned(_rank_sums, (spec, 0), (spec, 1)) as procs:
            join_ok(procs)
    finally:
        cs.release(spec)


def test_a_group_of_one_unlinks_its_name_on_open_and_is_the_identity():
    # Two ends in one process are enough to see the segment's life cycle.
    spec = cs.create_shm_group(world_size=1, max_bytes=1024)
    assert spec.name in own_segments()
    comm = cs.open_communicator(spec, 0)
    assert spec.name not in own_segments()       # every end open: unlinked
    x = torch.tensor([1.5, 2.0], dtype=torch.bfloat16)
    comm.all_reduce(x)                            # a group of one: the identity
    assert x.tolist() == [1.5, 2.0]
    comm.close()
    cs.release(spec)


def _rank_then_die(spec, rank):
    comm = cs.open_communicator(spec, rank, timeout=60)
    comm.all_reduce(torch.ones(100))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_peer_raises_peer_died_error_in_bounded_time():
    spec = cs.create_shm_group(world_size=2, max_bytes=4096)
    try:
        with spawned(_rank_then_die, (spec, 1)) as procs:
            comm = cs.open_communicator(spec, 0, timeout=120)
            x = torch.ones(100)
            comm.all_reduce(x)
            assert torch.equal(x, torch.full((100,), 2.0))
            start = time.monotonic()
            with pytest.raises(PeerDiedError, match=r"rank 1 \(pid \d+\)"):
                comm.all_reduce(torch.ones(100))
            assert time.monotonic() - start < 30          # the liveness check, not the 120 s deadline
            procs[0].join(10)
            assert procs[0].exitcode == -signal.SIGKILL
            with pytest.raises(PeerDiedError, match="unusable"):
                comm.all_reduce(torch.ones(100))          # the group stays broken
            comm.close()
    finally:
        cs.release(spec)


def test_waits_end_on_timeout_and_on_is_alive():
    spec = cs.create_shm_group(world_size=2, max_bytes=4096)
    try:
        comm = cs.open_communicator(spec, 0, timeout=0.2)     # rank 1 never comes
        with pytest.raises(TimeoutError, match="timed out"):
            comm.all_reduce(torch.ones(4))
        comm.close()
    finally:
        cs.release(spec)
    spec = cs.create_shm_group(world_size=2, max_bytes=4096)
    try:
        comm = cs.open_communicator(spec, 0, timeout=None, is_alive=lambda: False)
        with pytest.raises(PeerDiedError, match="is_alive"):
            comm.all_reduce(torch.ones(4))
        comm.close()
    finally:
        cs.release(spec)


def test_misuse_is_refused_with_the_fix():
    spec = cs.create_shm_group(world_size=1, max_bytes=1024)
    comm = cs.open_communicator(spec, 0)
    with pytest.raises(TypeError, match="torch.float32"):
        comm.all_reduce(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        comm.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="outside a group"):
        cs.open_communicator(spec, 1)
    comm.close()
    with pytest.raises(RuntimeError, match="closed"):
        comm.all_reduce(torch.ones(3))
    cs.release(spec)
    with pytest.raises(ValueError, match="world_size"):
        cs.create_shm_group(world_size=0)


def test_a_crashed_runs_segments_are_removed_by_the_next_create():
    from pagedcore import _core

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid = int(done.stdout)                         # a process that is gone
    stale = f"pagedcore-{dead_pid}-0-deadbeef"
    _core.ShmAllReduce.create(stale, 2, 1024)          # as a creator SIGKILLed before its ranks opened
    assert os.path.exists(f"/dev/shm/{stale}")
    spec = cs.create_shm_group(world_size=1, max_bytes=1024)
    try:
        assert not os.path.exists(f"/dev/shm/{stale}")
    finally:
        _core.shm_unlink(stale)
        cs.release(spec)

"""The gloo Communicator and Channel (torch.distributed, for ranks on different machines) between real
processes on this machine: sums equal to the reference, FIFO numpy payloads, a killed peer and a
dead writer turning into PeerDiedError in bounded time."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from pagedcore.distributed import comm_spec as cs
from pagedcore.distributed.errors import PeerDiedError
from tests.distributed.comm_helpers import join_ok, spawned
from tests.distributed.test_shm_communicator import SIZES, expected_sum, rank_data

NUM_VALUES = 20


def _rank(spec, rank, channel):
    comm = cs.open_communicator(spec, rank, timeout=60, is_alive=lambda: True)   # the polling wait
    for seed, numel in enumerate(SIZES):
        for dtype in (torch.float32, torch.bfloat16):
            x = rank_data(rank, numel, dtype, seed)
            comm.all_reduce(x)
            assert torch.equal(x, expected_sum(2, numel, dtype, seed)), (numel, dtype)
    for call in range(50):
        x = torch.full((1 + call % 13,), float(call + rank))
        comm.all_reduce(x)
        assert torch.equal(x, torch.full_like(x, float(2 * call + 1)))
    reader = cs.open_channel_reader(channel, 0, timeout=60)
    for k in range(NUM_VALUES):
        got = reader.get(timeout=60)
        assert got["k"] == k and np.array_equal(got["ids"], np.arange(k * 1000, dtype=np.int32))
    comm.close()
    reader.close()


def test_all_reduce_and_channel_in_two_processes():
    spec = cs.create_gloo_group(world_size=2)
    channel = cs.create_gloo_channel(num_readers=1, max_in_flight=3)
    with spawned(_rank, (spec, 1, channel)) as procs:
        _rank_zero_and_writer(spec, channel)
        join_ok(procs)


def _rank_zero_and_writer(spec, channel):
    comm = cs.open_communicator(spec, 0, timeout=60)
    for seed, numel in enumerate(SIZES):
        for dtype in (torch.float32, torch.bfloat16):
            x = rank_data(0, numel, dtype, seed)
            comm.all_reduce(x)
            assert torch.equal(x, expected_sum(2, numel, dtype, seed)), (numel, dtype)
    for call in range(50):
        x = torch.full((1 + call % 13,), float(call))
        comm.all_reduce(x)
    writer = cs.open_channel_writer(channel, timeout=60)
    for k in range(NUM_VALUES):      # more than max_in_flight: put waits for the reader at times
        writer.put({"k": k, "ids": np.arange(k * 1000, dtype=np.int32)}, timeout=60)
    comm.close()
    writer.close()


def _reduce_once_then_die(spec):
    comm = cs.open_communicator(spec, 1, timeout=60)
    comm.all_reduce(torch.ones(10))
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("polling", [False, True], ids=["blocking-wait", "polling-wait"])
def test_a_killed_peer_raises_peer_died_error(polling):
    spec = cs.create_gloo_group(world_size=2)
    with spawned(_reduce_once_then_die, (spec,)) as procs:
        comm = cs.open_communicator(spec, 0, timeout=60, is_alive=(lambda: True) if polling else None)
        comm.all_reduce(torch.ones(10))
        procs[0].join(30)
        start = time.monotonic()
        with pytest.raises(PeerDiedError, match="gloo"):
            comm.all_reduce(torch.ones(10))
        assert time.monotonic() - start < 45
        comm.close()


def _put_then_die(channel):
    writer = cs.open_channel_writer(channel, timeout=60)
    writer.put("only value")
    time.sleep(0.5)          # the reader takes it before the store goes away with this process
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_writer_is_detected():
    channel = cs.create_gloo_channel(num_readers=1)
    with spawned(_put_then_die, (channel,)) as procs:
        reader = cs.open_channel_reader(channel, 0, timeout=60)
        assert reader.get(timeout=60) == "only value"
        procs[0].join(30)
        with pytest.raises(PeerDiedError):
            reader.get(timeout=30)
        reader.close()

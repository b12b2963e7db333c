"""The shared-memory channel between real processes (spawn): FIFO order of numpy payloads to every
reader (arrays as out-of-band pickle buffers, values larger than the ring streamed through),
backpressure with a small ring, and a dead writer or reader turning into PeerDiedError."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from pagedcore.distributed import comm_spec as cs
from pagedcore.distributed.errors import PeerDiedError
from pagedcore.distributed.shm_channel import decode_frame, encode_frame
from tests.distributed.comm_helpers import join_ok, no_leftover_segments, spawned  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_leftover_segments")

NUM_VALUES = 60


def value(k: int) -> dict:
    """Value k: a dict like a StepInput (int32/int64/fp32 arrays, a non-contiguous one, plain Python)."""
    rng = np.random.default_rng(k)
    n = int(rng.integers(0, 40_000)) if k % 7 else 100_000    # every 7th value is ~0.8 MB: above the ring
    big = np.arange(n, dtype=np.int64) * k
    return {"k": k, "token_ids": rng.integers(0, 49152, size=int(rng.integers(1, 300)), dtype=np.int32),
            "big": big, "logits": rng.standard_normal((3, 5)).astype(np.float32),
            "strided": np.arange(20, dtype=np.float32)[::3], "names": ["req-%d" % k] * (k % 3)}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[key], b[key]) and a[key].dtype == b[key].dtype if isinstance(a[key], np.ndarray)
        else a[key] == b[key] for key in a)


def _reader(spec, index):
    ch = cs.open_channel_reader(spec, index)
    for k in range(NUM_VALUES):
        got = ch.get(timeout=60)
        assert same(got, value(k)), k
        assert got["big"].flags.writeable
    ch.close()


def test_fifo_order_with_numpy_payloads_to_two_readers():
    spec = cs.create_shm_channel(num_readers=2, capacity_bytes=256 << 10)   # values up to 0.8 MB
    try:
        with spawned(_reader, (spec, 0), (spec, 1)) as procs:
            writer = cs.open_channel_writer(spec)
            for k in range(NUM_VALUES):
                writer.put(value(k), timeout=60)
            join_ok(procs)
            writer.close()
    finally:
        cs.release(spec)


def test_frames_round_trip_and_arrays_are_aligned():
    v = value(3)
    frame = bytearray().join(encode_frame(v))
    got = decode_frame(frame)
    assert same(got, v)
    assert got["big"].ctypes.data % 16 == 0


def test_backpressure_blocks_the_writer_until_the_reader_reads():
    spec = cs.create_shm_channel(num_readers=1, capacity_bytes=4096)
    writer, reader = cs.open_channel_writer(spec), cs.open_channel_reader(spec, 0)
    payload = np.ones(400, dtype=np.float32)               # ~1.7 KB a frame: two fit
    writer.put(payload, timeout=1)
    writer.put(payload, timeout=1)
    with pytest.raises(TimeoutError):
        writer.put(payload, timeout=0.2)
    assert np.array_equal(reader.get(timeout=1), payload)
    writer.put(payload * 2, timeout=1)                     # room again; the timeout broke nothing
    assert np.array_equal(reader.get(timeout=1), payload)
    assert np.array_equal(reader.get(timeout=1), payload * 2)
    with pytest.raises(TimeoutError):
        reader.get(timeout=0.1)
    with pytest.raises(RuntimeError, match="reader end"):
        reader.put(1)
    with pytest.raises(RuntimeError, match="writer end"):
        writer.get()
    writer.close()
    with pytest.raises(PeerDiedError, match="closed"):
        reader.get(timeout=5)                               # the writer closed and nothing is left
    reader.close()
    cs.release(spec)


def _write_then_die(spec):
    ch = cs.open_channel_writer(spec)
    ch.put({"a": np.arange(5)})
    ch.put("second")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_writer_is_detected_after_its_values_are_read():
    spec = cs.create_shm_channel(num_readers=1, capacity_bytes=1 << 16)
    try:
        with spawned(_write_then_die, (spec,)) as procs:
            reader = cs.open_channel_reader(spec, 0)
            assert np.array_equal(reader.get(timeout=60)["a"], np.arange(5))
            assert reader.get(timeout=60) == "second"
            start = time.monotonic()
            with pytest.raises(PeerDiedError, match=r"writer \(pid \d+\)"):
                reader.get(timeout=120)
            assert time.monotonic() - start < 30
            procs[0].join(10)
            reader.close()
    finally:
        cs.release(spec)


def _open_reader_then_die(spec):
    cs.open_channel_reader(spec, 1)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_reader_fails_the_writer_it_holds_back():
    spec = cs.create_shm_channel(num_readers=2, capacity_bytes=8192)
    try:
        with spawned(_open_reader_then_die, (spec,)) as procs:
            procs[0].join(60)
            writer, reader0 = cs.open_channel_writer(spec), cs.open_channel_reader(spec, 0)
            with pytest.raises(PeerDiedError, match=r"reader 1 \(pid \d+\)"):
                for _ in range(100):                        # reader 0 keeps up; reader 1 never reads
                    writer.put(np.zeros(500, dtype=np.float32), timeout=120)
                    reader0.get(timeout=5)
            writer.close()
            reader0.close()
    finally:
        cs.release(spec)


def test_is_alive_ends_a_wait():
    spec = cs.create_shm_channel(num_readers=1, capacity_bytes=4096)
    reader = cs.open_channel_reader(spec, 0)               # the writer never opens
    with pytest.raises(PeerDiedError, match="is_alive"):
        reader.get(timeout=None, is_alive=lambda: False)
    reader.close()
    cs.release(spec)
    with pytest.raises(ValueError, match="reader_index 2"):
        cs.open_channel_reader(spec, 2)

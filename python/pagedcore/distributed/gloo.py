"""Communicator and Channel over torch.distributed gloo, for ranks on different machines (the Ray
path); on one machine the shared-memory ones are faster (no sockets).

Each group is its own gloo process group over its own rendezvous store (not torch.distributed's
global default group), so a process can hold several groups (its stage's TP group, channels) and
nothing needs every process of the job to create every group. Group rank 0 (a channel's writer)
hosts the tcp store at the spec's host:port; the others connect to it.

Channel protocol (writer = group rank 0, reader i = group rank i + 1):
    put:  wait until every reader has read all but max_in_flight - 1 values (store counters read/<i>),
          send [frame bytes as int64] then the frame (shm_channel.encode_frame) to each reader,
          then store.add("written", 1);
    get:  wait until store "written" passes this reader's count, recv the size and the frame,
          store.add("read/<i>", 1).
The store polls make timeouts and is_alive checks possible; gloo reports a peer whose connection
closed (its process died) as an error, turned into PeerDiedError."""

from __future__ import annotations

import datetime
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from pagedcore.distributed.comm_spec import GlooChannelSpec, GlooGroupSpec
from pagedcore.distributed.communicator import Channel, Communicator, IsAlive
from pagedcore.distributed.errors import PeerDiedError
from pagedcore.distributed.shm_channel import decode_frame, encode_frame

__all__ = ["GlooCommunicator", "GlooChannel", "connect_store"]

DEFAULT_TIMEOUT = 300.0   # seconds: joining the group, and the gloo op deadline


def connect_store(init_method: str, rank: int, world_size: int, timeout: float) -> dist.Store:
    """The rendezvous store of `init_method`: "tcp://host:port" (rank 0 hosts it) or "file:///path"."""
    url = urlparse(init_method)
    delta = datetime.timedelta(seconds=timeout)
    if url.scheme == "tcp":
        return dist.TCPStore(url.hostname, url.port, world_size, rank == 0, timeout=delta)
    if url.scheme == "file":
        store = dist.FileStore(url.path, world_size)
        store.set_timeout(delta)
        return store
    raise ValueError(f"init_method {init_method!r}: give tcp://host:port or file:///path")


def _wait(ready: Callable[[], bool], timeout: float | None, is_alive: IsAlive | None, what: str) -> None:
    """Polls ready() with a back-off (spin briefly, then sleep up to 1 ms); checks is_alive and the
    deadline every ~50 ms."""
    start = time.monotonic()
    next_check = start + 0.05
    while not ready():
        now = time.monotonic()
        waited = now - start
        if now >= next_check:
            if is_alive is not None and not is_alive():
                raise PeerDiedError(f"is_alive() reports the peer gone while waiting for {what}")
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            next_check = now + 0.05
        if waited > 50e-6:
            time.sleep(min(max(waited / 20, 20e-6), 1e-3))


def _wait_work(work, timeout: float | None, is_alive: IsAlive | None, what: str) -> None:
    """Waits for a gloo Work; a peer whose connection closed becomes PeerDiedError."""
    try:
        if is_alive is None:
            work.wait()      # gloo's own deadline (the group timeout) bounds it
        else:
            _wait(work.is_completed, timeout, is_alive, what)
            work.wait()      # raises the op's error, if any
    except (RuntimeError, dist.DistBackendError) as e:
        raise PeerDiedError(f"gloo {what} failed: {e}") from e


class GlooCommunicator(Communicator):
    """One rank's end of a gloo group (open it with comm_spec.open_communicator(GlooGroupSpec, rank)).
    all_reduce takes CPU tensors (fp32, bf16; bf16 is summed in fp32 above two ranks, so the result is
    rounded once, as in the shared-memory group)."""

    def __init__(self, spec: GlooGroupSpec, rank: int, *, timeout: float | None = DEFAULT_TIMEOUT,
                 is_alive: IsAlive | None = None):
        self.rank = rank
        self.world_size = spec.world_size
        self.global_rank = spec.group_ranks[rank]
        self.timeout = timeout
        self.is_alive = is_alive
        t = DEFAULT_TIMEOUT if timeout is None else timeout
        self._store = connect_store(spec.init_method, rank, spec.world_size, t)
        self._group = dist.ProcessGroupGloo(dist.PrefixStore("pagedcore-gloo-group", self._store), rank,
                                            spec.world_size, datetime.timedelta(seconds=t))

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self._group is None:
            raise RuntimeError("all_reduce on a closed GlooCommunicator")
        if tensor.device.type != "cpu":
            raise ValueError(f"GlooCommunicator.all_reduce takes CPU tensors, got one on {tensor.device}")
        if tensor.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"tensor has dtype {tensor.dtype}; the gloo all-reduce takes torch.float32 or torch.bfloat16")
        if not tensor.is_contiguous():
            raise ValueError("GlooCommunicator.all_reduce needs a contiguous tensor (call .contiguous())")
        if tensor.numel() == 0 or self.world_size == 1:
            return
        wide = tensor.float() if tensor.dtype == torch.bfloat16 and self.world_size > 2 else tensor
        _wait_work(self._group.allreduce([wide]), self.timeout, self.is_alive, "the all-reduce")
        if wide is not tensor:
            tensor.copy_(wide)

    def close(self) -> None:
        self._group = None
        self._store = None


class GlooChannel(Channel):
    """One end of a gloo channel: the writer (reader_index None, group rank 0) or reader `reader_index`."""

    def __init__(self, spec: GlooChannelSpec, reader_index: int | None, *, timeout: float | None = DEFAULT_TIMEOUT):
        self.reader_index = reader_index
        self.num_readers = spec.num_readers
        self.max_in_flight = spec.max_in_flight
        self._rank = 0 if reader_index is None else reader_index + 1
        t = DEFAULT_TIMEOUT if timeout is None else timeout
        world = spec.num_readers + 1
        self._store = connect_store(spec.init_method, self._rank, world, t)
        self._group = dist.ProcessGroupGloo(dist.PrefixStore("pagedcore-gloo-channel", self._store), self._rank,
                                            world, datetime.timedelta(seconds=t))
        self._count = 0                  # values put (writer) or read (reader)
        self._sends: deque = deque()     # (count, works) of values not yet known read by all readers

    def _store_count(self, key: str) -> int:
        try:
            return self._store.add(key, 0)
        except (RuntimeError, dist.DistStoreError) as e:
            raise PeerDiedError(f"the channel's store is unreachable (its writer is gone?): {e}") from e

    def put(self, value: object, timeout: float | None = None, is_alive: IsAlive | None = None) -> None:
        if self.reader_index is not None:
            raise RuntimeError("put on a channel's reader end (open it with open_channel_writer)")
        limit = self._count - self.max_in_flight + 1   # every reader must have read this many

        def room() -> bool:
            return all(self._store_count(f"read/{i}") >= limit for i in range(self.num_readers))

        _wait(room, timeout, is_alive, "the channel's readers to make room")
        while self._sends and self._sends[0][0] < limit:   # read by all: their sends are complete
            for work in self._sends.popleft()[1]:
                _wait_work(work, timeout, is_alive, "a channel send")
        frame = torch.frombuffer(bytearray().join(encode_frame(value)), dtype=torch.uint8)
        size = torch.tensor([frame.numel()], dtype=torch.int64)
        works = []
        for i in range(self.num_readers):
            works.append(self._group.send([size], i + 1, 0))
            works.append(self._group.send([frame], i + 1, 1))
        self._sends.append((self._count, works, (size, frame)))   # the tensors live until sent
        self._count += 1
        self._store.add("written", 1)

    def get(self, timeout: float | None = None, is_alive: IsAlive | None = None) -> object:
        if self.reader_index is None:
            raise RuntimeError("get on a channel's writer end (open it with open_channel_reader)")
        _wait(lambda: self._store_count("written") > self._count, timeout, is_alive, "the channel's writer")
        size = torch.empty(1, dtype=torch.int64)
        _wait_work(self._group.recv([size], 0, 0), timeout, is_alive, "a channel receive")
        frame = torch.empty(int(size.item()), dtype=torch.uint8)
        _wait_work(self._group.recv([frame], 0, 1), timeout, is_alive, "a channel receive")
        self._count += 1
        self._store.add(f"read/{self.reader_index}", 1)
        return decode_frame(frame.numpy())   # the values' arrays are views of `frame`

    def close(self, linger: float = 10.0) -> None:
        """The writer hosts the store and the sends: before letting go of them it waits (at most
        `linger` seconds) until every reader has read every value, as a socket's linger does."""
        if self._group is None:
            return
        if self.reader_index is None:
            try:
                _wait(lambda: all(self._store_count(f"read/{i}") >= self._count for i in range(self.num_readers)),
                      linger, None, "the readers to read the last values")
            except (TimeoutError, PeerDiedError):
                pass   # a reader that is gone or stuck: close anyway
        self._sends.clear()
        self._group = None
        self._store = None

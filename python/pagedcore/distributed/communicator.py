"""The two ways ranks talk: a Communicator (collective over one tensor-parallel group) and a Channel
(one writer, n readers, FIFO of Python values). Implementations: shared memory between processes on
one machine (the hot path: no sockets), torch.distributed gloo across machines, NCCL on CUDA.

Every wait takes an optional is_alive callable (checked a few times a second) so that a peer that died
turns into PeerDiedError, never a hang."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

IsAlive = Callable[[], bool]  # False once the peer (process, actor) is gone


class Communicator(ABC):
    """One rank's end of a collective group (the tensor-parallel ranks of one pipeline stage)."""

    rank: int        # this rank's index inside the group, 0 .. world_size - 1
    world_size: int

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor) -> None:
        """In-place sum over the group of a contiguous tensor (CPU fp32/bf16 for shm and gloo, CUDA for
        NCCL). Every rank calls it with the same shape and dtype, in the same order."""

    def close(self) -> None:
        """Releases shared memory / process groups. Idempotent."""


class Channel(ABC):
    """A FIFO of Python values from one writer to n readers (n = 1: point to point). Values are pickled
    with protocol 5, so numpy arrays travel as raw bytes (no Python object per element)."""

    @abstractmethod
    def put(self, value: object, timeout: float | None = None, is_alive: IsAlive | None = None) -> None:
        """Writer side. Blocks while the readers have not consumed enough; TimeoutError / PeerDiedError."""

    @abstractmethod
    def get(self, timeout: float | None = None, is_alive: IsAlive | None = None) -> object:
        """Reader side: the next value. TimeoutError after timeout seconds; PeerDiedError when is_alive
        says the writer is gone."""

    def close(self) -> None:
        """Releases the channel's resources. Idempotent."""

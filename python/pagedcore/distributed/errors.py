"""Errors of the distributed runtime. A dead rank makes the engine unusable (the step cannot finish on
a model with a shard missing): the serving layer turns that into 503 health and a non-zero exit."""

from __future__ import annotations


class PeerDiedError(RuntimeError):
    """A wait on a communicator or channel found the process at the other end gone."""


class WorkerDiedError(RuntimeError):
    """A worker rank (process or Ray actor) died or stopped answering; names the rank and the cause.
    The engine cannot go on: every request in flight fails with this message."""

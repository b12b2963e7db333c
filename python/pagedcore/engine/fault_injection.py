"""A test hook that raises inside one engine step, to prove what a fault does to a running server.

Off unless PAGEDCORE_FAULT_INJECTION is set when the engine is built (never set it in production):
    step:N    the N-th step (1 = the first the engine runs) raises InjectedStepFault once, after its
              forward and before any token is sampled: the requests of that step fail, the engine goes on
    fatal:N   the N-th step raises InjectedFatalFault, marked `engine_unusable`: the server reports 503,
              fails every request and exits non-zero
    delay:MS  every step the engine runs sleeps MS milliseconds, after its forward (a slow model on a
              fast machine: tests that hang up mid-prefill need the prefill to last longer than their
              client's timeout, whatever the CPU)
Several comma-separated entries are allowed ("step:2,step:5").
"""

from __future__ import annotations

import os
import time

ENV_VAR = "PAGEDCORE_FAULT_INJECTION"


class InjectedStepFault(RuntimeError):
    """A one-step failure (a bad input, a transient error): the engine stays usable."""


class InjectedFatalFault(RuntimeError):
    """A failure after which the engine cannot be trusted (a corrupted device, lost memory)."""

    engine_unusable = True


_KINDS = {"step": InjectedStepFault, "fatal": InjectedFatalFault}


class FaultInjector:
    def __init__(self, spec: str | None):
        self.faults: dict[int, type[RuntimeError]] = {}   # step number -> what it raises
        # Set before the entries are read: a delay:MS entry below sets it (set after, it was lost).
        self.num_steps = 0
        self.delay_s = 0.0
        for entry in filter(None, (part.strip() for part in (spec or "").split(","))):
            kind, _, number = entry.partition(":")
            if kind == "delay" and number.isdigit():
                self.delay_s = int(number) / 1000
                continue
            if kind not in _KINDS or not number.isdigit() or int(number) < 1:
                raise ValueError(f"{ENV_VAR}={spec!r}: each entry must be step:N or fatal:N with N >= 1, or delay:MS, "
                                 f"got {entry!r}")
            self.faults[int(number)] = _KINDS[kind]

    @classmethod
    def from_env(cls) -> FaultInjector | None:
        spec = os.environ.get(ENV_VAR)
        return cls(spec) if spec else None

    def on_step(self) -> None:
        """Called once per step, between the forward and the sampler."""
        self.num_steps += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        fault = self.faults.pop(self.num_steps, None)
        if fault is not None:
            raise fault(f"fault injected by {ENV_VAR} at step {self.num_steps}")

"""StepProbe: splits the engine's per-step 'forward' time into input prep, model forward, lm_head
and attention kernels, without touching engine code.

The engine already times schedule / forward / sample / update_and_outputs (last_step_timing) and
calls its step_listeners after each step. The probe adds timers around the model's forward (module
hooks), compute_logits (an instance attribute that shadows the method) and the attention kernels
(attributes of pagedcore.kernels, looked up at each call), and folds them into one record per step.
Cost: ~64 perf_counter pairs per step (two attention kernels x 30 layers + 2), a few microseconds.
With ops=True every Linear (and the gate/up SwiGLU call) is timed as well (~120 more hook pairs,
~0.5 ms a step): use it only to see the split, not for headline figures. Steps small enough for the
C++ decoder stack (layers/decoder_stack.py) run no Python layers or attention calls; with ops=True
the stack's own op timers (DecoderStack.set_profiling) add its linears (qkv, o_proj, gate_up, down)
and attention (+ cache writes) to the step's record, so the split covers both paths. A step the
worker runs as one greedy C++ call (models/greedy_decode.py) is split by that call's own timers:
layers -> model_forward, final norm + head + argmax -> lm_head (so "sample" is ~0 for such steps).
"""

from __future__ import annotations

import time

from torch import nn

from pagedcore.ops import attention as kernels

_KERNELS = ("paged_attention", "reshape_and_cache")


class StepProbe:
    def __init__(self, engine, ops: bool = False):
        self.engine = engine
        self.ops = ops
        self.records: list[dict] = []
        self._acc = {"model_forward": 0.0, "lm_head": 0.0, "attention": 0.0, "linears": 0.0}
        self._handles = []
        self._originals = {}
        self._t_model = 0.0
        self._profiled_stack = None   # the decoder stack whose op timers this probe turned on
        self._timed_greedy = None     # the one-call greedy decoder whose timers this probe turned on

    # -- timers ------------------------------------------------------------------------------------
    def _timed(self, key, fn):
        acc = self._acc

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - t0
        return wrapper

    def _linear_hooks(self, module: nn.Module):
        acc = self._acc
        start = {}

        def pre(mod, _inputs):
            start[id(mod)] = time.perf_counter()

        def post(mod, _inputs, _output):
            acc["linears"] += time.perf_counter() - start.pop(id(mod))

        return module.register_forward_pre_hook(pre), module.register_forward_hook(post)

    def _stack_seconds(self) -> None:
        """Adds the decoder stack's op seconds since the last step (ops=True) to this step's timers."""
        model = self.engine.view.model
        stack = getattr(getattr(model, "model", model), "_stack", None)   # LlamaForCausalLM.model holds it
        if not self.ops or stack is None:
            return
        if stack is not self._profiled_stack:   # built (or rebuilt) since: time it from now on
            stack.set_profiling(True)
            stack.profile(reset=True)
            self._profiled_stack = stack
            return
        seconds = stack.profile(reset=True)
        self._acc["linears"] += sum(seconds.get(op, 0.0) for op in ("qkv", "o_proj", "gate_up", "down"))
        self._acc["attention"] += seconds.get("attention", 0.0) + seconds.get("cache_write", 0.0)

    def _greedy_seconds(self) -> None:
        """A step the worker ran as one greedy C++ call (models/greedy_decode.py) has no model forward
        or compute_logits call to time: the decoder's own timers give its layers (lookup, rotary rows,
        stack) and head (final norm, LM head, argmax) seconds, added to model_forward and lm_head."""
        offer = getattr(self.engine.view.model, "greedy_decoder", None)
        decoder = offer() if offer is not None else None
        if decoder is not self._timed_greedy:   # built (or rebuilt) since: time it from now on
            if self._timed_greedy is not None:
                self._timed_greedy.set_timing(False)
            if decoder is not None:
                decoder.set_timing(True)
                decoder.take_seconds()
            self._timed_greedy = decoder
            return
        if decoder is not None:
            layers, head = decoder.take_seconds()
            self._acc["model_forward"] += layers
            self._acc["lm_head"] += head

    def _listener(self, _out, _result, timing):
        self._stack_seconds()
        self._greedy_seconds()
        rec = dict(timing)
        rec.update(self._acc)
        rec["input_prep"] = max(0.0, timing["forward"] - self._acc["model_forward"] - self._acc["lm_head"])
        self.records.append(rec)
        for key in self._acc:
            self._acc[key] = 0.0

    # -- install / remove --------------------------------------------------------------------------
    def __enter__(self) -> StepProbe:
        model = self.engine.view.model

        def pre(_mod, _inputs):
            self._t_model = time.perf_counter()

        def post(_mod, _inputs, _output):
            self._acc["model_forward"] += time.perf_counter() - self._t_model

        self._handles += [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
        self._originals["compute_logits"] = model.compute_logits
        model.compute_logits = self._timed("lm_head", model.compute_logits)
        for name in _KERNELS:
            self._originals[name] = getattr(kernels, name)
            setattr(kernels, name, self._timed("attention", self._originals[name]))
        if self.ops:
            from pagedcore.layers.linear import Linear, MergedLinear
            self._silu_mul_modules = []
            for module in model.modules():
                if isinstance(module, Linear):
                    self._handles += self._linear_hooks(module)
                if isinstance(module, MergedLinear):  # gate/up runs through forward_silu_mul, not forward
                    module.forward_silu_mul = self._timed("linears", module.forward_silu_mul)
                    self._silu_mul_modules.append(module)
        self.engine.view.add_step_listener(self._listener)
        self._stack_seconds()   # a stack built by the warm-up: its timers start now
        self._greedy_seconds()  # likewise the greedy decoder
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        model = self.engine.view.model
        model.__dict__.pop("compute_logits", None)   # the class method shows through again
        for module in getattr(self, "_silu_mul_modules", []):
            module.__dict__.pop("forward_silu_mul", None)
        for name in _KERNELS:
            setattr(kernels, name, self._originals[name])
        self.engine.view.remove_step_listener(self._listener)
        if self._profiled_stack is not None:
            self._profiled_stack.set_profiling(False)
            self._profiled_stack = None
        if self._timed_greedy is not None:
            self._timed_greedy.set_timing(False)
            self._timed_greedy = None

    def take(self) -> list[dict]:
        """Returns the records so far and starts a new list."""
        records, self.records = self.records, []
        return records

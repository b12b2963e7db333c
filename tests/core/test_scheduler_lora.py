"""The scheduler's LoRA constraint under random request streams (the hypothesis state machine of
test_scheduler_random.py, with adapters): every step holds at most max_loras distinct adapters,
reports each sequence's adapter in adapter_ids, and every request still finishes."""

import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import initialize, rule

from pagedcore import _core

from .scheduler_model import ShadowCache
from .test_scheduler_random import SHARED_PREFIX, SchedulerMachine


class LoRASchedulerMachine(SchedulerMachine):
    @initialize(
        num_blocks=st.integers(6, 40),
        num_cpu_blocks=st.integers(0, 24),
        block_size=st.sampled_from([2, 4, 8]),
        budget=st.integers(4, 64),
        max_num_seqs=st.integers(1, 8),
        swap=st.booleans(),
        prefix_caching=st.booleans(),
        priority=st.booleans(),
        max_loras=st.integers(1, 3),
    )
    def setup(self, num_blocks, num_cpu_blocks, block_size, budget, max_num_seqs, swap, prefix_caching, priority,
              max_loras):
        self.cfg = _core.SchedulerConfig(
            num_gpu_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size,
            max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=96,
            enable_prefix_caching=prefix_caching,
            preemption_mode=_core.PreemptionMode.SWAP if swap else _core.PreemptionMode.RECOMPUTE,
            policy=_core.SchedulingPolicy.PRIORITY if priority else _core.SchedulingPolicy.FCFS,
            max_loras=max_loras)
        self.s = _core.Scheduler(self.cfg)
        self.shadow = ShadowCache(num_blocks, num_cpu_blocks, block_size)
        self.next_id = 0
        self.live = set()
        self.forkable = set()
        self.rng = np.random.default_rng(0)

    @rule(prompt_len=st.integers(1, 60), shared=st.booleans(), max_tokens=st.integers(1, 24),
          priority=st.integers(0, 3), adapter=st.integers(0, 5))
    def add_with_adapter(self, prompt_len, shared, max_tokens, priority, adapter):
        prompt = SHARED_PREFIX[:prompt_len] if shared else list(self.rng.integers(10, 900, prompt_len))
        sid = self.next_id
        self.next_id += 1
        try:
            self.s.add_sequence(sid, prompt, max_tokens=max_tokens, eos_token_ids=[2], priority=priority,
                                adapter_id=adapter)
        except ValueError as e:
            assert -(-prompt_len // self.cfg.block_size) > self.cfg.num_gpu_blocks, str(e)
            return
        assert self.s.get_sequence(sid).adapter_id == adapter
        self.live.add(sid)

    def check_step(self, out):
        super().check_step(out)
        adapters = out.adapter_ids.tolist()
        assert len(adapters) == out.num_seqs
        assert adapters == [self.s.get_sequence(sid).adapter_id for sid in out.seq_ids.tolist()]
        assert len({a for a in adapters if a != 0}) <= self.cfg.max_loras


LoRASchedulerMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_lora_request_streams = LoRASchedulerMachine.TestCase

"""Random request streams against the C++ scheduler, checking invariants after every step.

Arrivals (some sharing a prefix), aborts, forks (right after a sample or mid-generation), draft
tokens (appended, retracted, then j of k accepted), EOS and preemptions are drawn by hypothesis;
after every step we check: no leaked or doubly owned block, ref counts equal references, the
token budget and sequence cap held, no write into a block another live sequence can read, every
sequence reading back exactly its own tokens through its block table (shadow cache), before the
forward and again after update() rolled rejected drafts back, and a verify window never split.
Under FCFS every admitted request finishes once arrivals stop.
"""

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedcore import _core

from .scheduler_model import ShadowCache

EOS = 2
SHARED_PREFIX = list(range(1000, 1040))   # a "system prompt" many requests start with


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(6, 40),
        num_cpu_blocks=st.integers(0, 24),
        block_size=st.sampled_from([2, 4, 8]),
        budget=st.integers(4, 64),
        max_num_seqs=st.integers(1, 8),
        swap=st.booleans(),
        prefix_caching=st.booleans(),
        priority=st.booleans(),
    )
    def setup(self, num_blocks, num_cpu_blocks, block_size, budget, max_num_seqs, swap, prefix_caching, priority):
        self.cfg = _core.SchedulerConfig(
            num_gpu_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size,
            max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=96,
            enable_prefix_caching=prefix_caching,
            preemption_mode=_core.PreemptionMode.SWAP if swap else _core.PreemptionMode.RECOMPUTE,
            policy=_core.SchedulingPolicy.PRIORITY if priority else _core.SchedulingPolicy.FCFS)
        self.s = _core.Scheduler(self.cfg)
        self.shadow = ShadowCache(num_blocks, num_cpu_blocks, block_size)
        self.next_id = 0
        self.live = set()
        self.forkable = set()     # running sequences whose last token has no KV yet (just updated)
        self.rng = np.random.default_rng(0)

    # -- rules ------------------------------------------------------------------------------
    @rule(prompt_len=st.integers(1, 60), shared=st.booleans(), max_tokens=st.integers(1, 24),
          priority=st.integers(0, 3))
    def add(self, prompt_len, shared, max_tokens, priority):
        prompt = (SHARED_PREFIX[:prompt_len] if shared else
                  list(self.rng.integers(10, 900, prompt_len)))
        sid = self.next_id
        self.next_id += 1
        try:
            self.s.add_sequence(sid, prompt, max_tokens=max_tokens, eos_token_ids=[EOS], priority=priority)
        except ValueError as e:  # only what can never fit is refused
            assert -(-prompt_len // self.cfg.block_size) > self.cfg.num_gpu_blocks, str(e)
            return
        self.live.add(sid)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        assert self.s.abort_sequence(sid)
        self.live.discard(sid)
        self.forkable.discard(sid)

    @precondition(lambda self: self.forkable)
    @rule(data=st.data(), token=st.integers(10, 900))
    def fork(self, data, token):
        parent = data.draw(st.sampled_from(sorted(self.forkable)))
        child = self.next_id
        self.next_id += 1
        self.s.fork_sequence(parent, child, token)
        self.live.add(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork_mid_generation(self, data):
        """A running sequence forked as it is, mid-prefill or with drafts pending."""
        running = sorted(set(self.s.running_ids()) & self.live)
        if not running:
            return
        parent = data.draw(st.sampled_from(running))
        child = self.next_id
        self.next_id += 1
        self.s.fork_sequence(parent, child)
        self.live.add(child)
        event("fork mid-generation")

    @precondition(lambda self: self.live)
    @rule(data=st.data(), num_drafts=st.integers(1, 5), eos_rate=st.floats(0, 0.2))
    def draft(self, data, num_drafts, eos_rate):
        """A drafter proposes num_drafts tokens; the next step that reaches them verifies them."""
        sid = data.draw(st.sampled_from(sorted(self.live)))
        seq = self.s.get_sequence(sid)
        max_seq_len = min(self.cfg.max_model_len, self.cfg.num_gpu_blocks * self.cfg.block_size)
        num_drafts = min(num_drafts, max_seq_len - seq.num_tokens,
                         self.cfg.max_num_batched_tokens - 1 - seq.num_draft_tokens)
        if num_drafts <= 0:
            return
        drafts = np.where(self.rng.random(num_drafts) < eos_rate, EOS, self.rng.integers(10, 900, num_drafts))
        self.s.append_tokens(sid, drafts, draft=True)
        self.forkable.discard(sid)
        event("drafted")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def retract_drafts(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        k = self.s.get_sequence(sid).num_draft_tokens
        if k == 0:
            return
        n = data.draw(st.integers(1, k))
        self.s.remove_tail_tokens(sid, n)
        assert self.s.get_sequence(sid).num_draft_tokens == k - n

    @rule(eos_rate=st.floats(0, 0.3), num_forks=st.integers(0, 2))
    def step(self, eos_rate, num_forks):
        out = self.s.schedule()
        self.check_step(out)
        for name, happened in (("preempted", len(out.preempted_seq_ids)), ("swapped out", len(out.blocks_to_swap_out)),
                               ("swapped in", len(out.blocks_to_swap_in)), ("copy-on-write", len(out.blocks_to_copy)),
                               ("prefix hit", self.s.stats().prefix_hit_tokens)):
            if happened:
                event(name)
        n = len(out.sample_seq_ids)
        tokens = np.where(self.rng.random(n) < eos_rate, EOS, self.rng.integers(10, 900, n))
        # Verify drafts: sample i accepts its first j drafts and then, usually, the target's own token.
        rows_per_sample = np.diff(out.logits_start_loc)
        num_accepted, accepted = [], []
        for i in range(n):
            lo, hi = int(out.logits_start_loc[i]), int(out.logits_start_loc[i + 1])
            drafts = out.input_ids[out.logits_indices[lo:hi - 1] + 1].tolist()
            j = int(self.rng.integers(0, len(drafts) + 1))
            own = [int(tokens[i])] if self.rng.random() < 0.9 else []   # sometimes no bonus (or nothing)
            num_accepted.append(j + len(own))
            accepted += drafts[:j] + own
            if drafts:
                event(f"accepted {j} of {len(drafts)} drafts")
        forks = []
        parents = [sid for sid, rows in zip(out.sample_seq_ids.tolist(), rows_per_sample) if rows == 1]
        for parent in parents[:num_forks]:   # n > 1: a row sampled again
            forks.append([parent, self.next_id, int(self.rng.integers(10, 900))])
            self.live.add(self.next_id)
            self.next_id += 1
        fork_array = np.array(forks, dtype=np.int64).reshape(-1, 3)
        if all(rows == 1 for rows in rows_per_sample) and all(c == 1 for c in num_accepted):
            res = self.s.update(tokens, forks=fork_array)        # the one-token form
        else:
            res = self.s.update(np.array(accepted, dtype=np.int64), fork_array,
                                num_accepted_tokens=np.array(num_accepted, dtype=np.int64))
        for sid in res.finished_seq_ids.tolist():
            self.live.discard(sid)
        running = set(self.s.running_ids())
        self.forkable = {int(sid) for sid in out.sample_seq_ids} & running
        self.check_after_update()

    # -- checks -----------------------------------------------------------------------------
    def check_step(self, out):
        cfg = self.cfg
        assert out.num_tokens <= cfg.max_num_batched_tokens
        assert out.num_seqs <= cfg.max_num_seqs
        assert out.num_tokens == int(out.num_scheduled_tokens.sum()) == int(out.query_start_loc[-1])
        assert len(set(out.seq_ids.tolist())) == out.num_seqs
        self.shadow.apply(out)
        pool = self.s.gpu_pool
        for i, sid in enumerate(out.seq_ids.tolist()):
            seq = self.s.get_sequence(sid)
            lo, hi = int(out.query_start_loc[i]), int(out.query_start_loc[i + 1])
            c = int(out.num_computed_tokens[i])
            assert out.positions[lo:hi].tolist() == list(range(c, c + hi - lo))
            assert out.input_ids[lo:hi].tolist() == seq.token_ids[c:c + hi - lo]
            # No write into a block that another live sequence can read.
            for slot in out.slot_mapping[lo:hi].tolist():
                assert pool.ref_count(slot // cfg.block_size) == 1
            # Every token of the context reads back as this sequence's own token.
            ctx = self.shadow.context(seq.block_table, int(out.seq_lens[i]))
            assert ctx.tolist() == seq.token_ids[: int(out.seq_lens[i])]
            # Logits rows: the last k + 1 rows of a chunk that reaches the end, and no chunk ends inside
            # a verify window (the last k + 1 tokens).
            rows = int(out.num_logits_rows[i])
            k = seq.num_draft_tokens
            if hi - lo > 0 and c + hi - lo == seq.num_tokens:
                assert rows == k + 1
            else:
                assert rows == 0 and c + hi - lo <= seq.num_tokens - k - 1
        sampled = [sid for sid, rows in zip(out.seq_ids.tolist(), out.num_logits_rows.tolist()) if rows]
        assert out.sample_seq_ids.tolist() == sampled
        assert np.diff(out.logits_start_loc).tolist() == [r for r in out.num_logits_rows.tolist() if r]
        expected_rows = [row for i, rows in enumerate(out.num_logits_rows.tolist())
                         for row in range(int(out.query_start_loc[i + 1]) - rows, int(out.query_start_loc[i + 1]))]
        assert out.logits_indices.tolist() == expected_rows

    def check_after_update(self):
        """After update(): every running sequence still reads back its computed tokens, holds the
        blocks its tokens need and none past them (rejected drafts rolled back)."""
        bs = self.cfg.block_size
        for sid in self.s.running_ids():
            seq = self.s.get_sequence(sid)
            assert seq.num_computed_tokens < seq.num_tokens
            assert -(-seq.num_computed_tokens // bs) <= len(seq.block_table) <= -(-seq.num_tokens // bs)
            ctx = self.shadow.context(seq.block_table, seq.num_computed_tokens)
            assert ctx.tolist() == seq.token_ids[: seq.num_computed_tokens]

    @invariant()
    def blocks_are_accounted_for(self):
        if not hasattr(self, "s"):
            return
        gpu_refs, cpu_refs = Counter(), Counter()
        ids = self.s.running_ids() + self.s.swapped_ids() + self.s.waiting_ids()
        assert len(ids) == len(set(ids))
        assert set(ids) == self.live
        for sid in self.s.running_ids():
            gpu_refs.update(self.s.get_sequence(sid).block_table)
        for sid in self.s.swapped_ids():
            cpu_refs.update(self.s.get_sequence(sid).block_table)
        for sid in self.s.waiting_ids():
            assert self.s.get_sequence(sid).block_table == []
        for pool, refs in ((self.s.gpu_pool, gpu_refs), (self.s.cpu_pool, cpu_refs)):
            free = set(pool.free_block_ids())
            assert len(free) == pool.num_free_blocks
            for b in range(pool.num_blocks):
                assert pool.ref_count(b) == refs.get(b, 0), (b, pool.ref_count(b), refs.get(b, 0))
                assert (b in free) == (refs.get(b, 0) == 0)

    def teardown(self):
        if not hasattr(self, "s"):
            return
        # Liveness: with arrivals stopped, everything admitted finishes (FCFS and priority alike).
        for _ in range(5000):
            if not self.s.has_unfinished():
                break
            out = self.s.schedule()
            self.check_step(out)
            self.s.update(np.full(len(out.sample_seq_ids), 11))
        assert not self.s.has_unfinished()
        assert self.s.gpu_pool.num_free_blocks == self.cfg.num_gpu_blocks
        assert self.s.cpu_pool.num_free_blocks == self.cfg.num_cpu_blocks


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_random_request_streams = SchedulerMachine.TestCase

"""The data-parallel router: longest cached prefix among the replicas within the balance slack, else the
least loaded, ties to the lowest index; and the read-only C++ probe it sends each replica."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pagedcore import _core
from pagedcore.distributed.dp_router import DPRouter, scheduler_probe

BLOCK = 4


def fixed(values: list[int]):
    """Probes answering a fixed cached length per replica, recording what they were asked."""
    calls = []

    def make(i):
        def probe(ids, adapter_id, cache_salt):
            calls.append((i, list(ids), adapter_id, cache_salt))
            return values[i]
        return probe
    return [make(i) for i in range(len(values))], calls


def test_the_longest_cached_prefix_wins():
    probes, calls = fixed([4, 12, 8])
    decision = DPRouter(probes).choose([1, 2, 3, 4, 5], adapter_id=7, cache_salt=0)
    assert (decision.replica, decision.num_cached_tokens, decision.reason) == (1, 12, "prefix")
    assert {c[0] for c in calls} == {0, 1, 2} and all(c[1:] == ([1, 2, 3, 4, 5], 7, 0) for c in calls)


def test_no_prefix_anywhere_goes_to_the_least_loaded_then_the_lowest_index():
    probes, _ = fixed([0, 0, 0])
    router = DPRouter(probes)
    assert router.choose([1, 2, 3]).replica == 0          # all equal: lowest index
    router.routed(0, 100)
    assert router.choose([1, 2, 3]).replica == 1
    router.routed(1, 10)
    router.routed(2, 50)
    # One request each: fewest prompt tokens decides.
    decision = router.choose([1, 2, 3])
    assert (decision.replica, decision.reason) == (1, "load")


def test_equal_prefixes_fall_to_the_least_loaded():
    probes, _ = fixed([8, 8])
    router = DPRouter(probes)
    router.routed(0, 5)
    assert router.choose([1] * 9).replica == 1


def test_the_balance_slack_spreads_a_hot_prefix():
    # Replica 0 holds the shared prefix; it keeps winning until it carries more than `slack` requests
    # beyond replica 1, which then gets one (and caches the prefix too).
    probes, _ = fixed([16, 0])
    router = DPRouter(probes, balance_slack=2)
    chosen = []
    for _ in range(4):
        replica = router.choose([1] * 20).replica
        router.routed(replica, 20)
        chosen.append(replica)
    assert chosen == [0, 0, 0, 1]
    router.finished(0, 20)   # requests end: the loads come back within the slack
    assert router.choose([1] * 20).replica == 0


def test_slack_zero_is_least_loaded_first():
    probes, _ = fixed([16, 0])
    router = DPRouter(probes, balance_slack=0)
    router.routed(0, 1)
    assert router.choose([1] * 20).replica == 1


def test_no_prompt_ids_means_load_only_and_no_probe():
    probes, calls = fixed([16, 0])
    router = DPRouter(probes)
    router.routed(0, 1)
    assert router.choose(None).replica == 1
    assert calls == []


def test_excluded_replicas_are_skipped():
    probes, _ = fixed([16, 8, 0])
    router = DPRouter(probes)
    assert router.choose([1] * 20, exclude=[0]).replica == 1
    with pytest.raises(ValueError, match="excluded"):
        router.choose([1] * 20, exclude=[0, 1, 2])


def test_loads_never_go_negative_and_bad_settings_are_refused():
    router = DPRouter(fixed([0])[0])
    router.finished(0, 10)
    assert (router.loads[0].num_requests, router.loads[0].num_prompt_tokens) == (0, 0)
    with pytest.raises(ValueError, match="balance_slack"):
        DPRouter(fixed([0])[0], balance_slack=-1)
    with pytest.raises(ValueError, match="at least one replica"):
        DPRouter([])


# -- the C++ probe ----------------------------------------------------------------------------------------
def scheduler(num_blocks=32, prefix_caching=True):
    return _core.Scheduler(_core.SchedulerConfig(num_gpu_blocks=num_blocks, block_size=BLOCK, max_num_seqs=8,
                                                 max_model_len=256, enable_prefix_caching=prefix_caching))


def run(s, seq_id, prompt, max_tokens=2, **keys):
    s.add_sequence(seq_id, np.asarray(prompt), max_tokens=max_tokens, **keys)
    while s.has_unfinished():
        out = s.schedule()
        s.update(np.full(len(out.sample_seq_ids), 7))


def test_the_probe_counts_whole_cached_blocks_under_the_cache_key():
    s = scheduler()
    prompt = list(range(100, 110))                     # 10 tokens: 2 full blocks computed
    run(s, 1, prompt, adapter_id=3)
    probe = scheduler_probe(s)
    assert probe(prompt, 3, 0) == 8
    assert probe(prompt + [5, 6, 7], 3, 0) == 8
    assert probe(prompt, 0, 0) == 0                    # another adapter
    assert probe(prompt, 3, 9) == 0                    # another salt
    assert probe(prompt[:8], 3, 0) == 4                # the last token is never a hit
    before = s.stats()
    probe(prompt, 3, 0)
    after = s.stats()
    assert (after.prefix_query_tokens, after.prefix_hit_tokens) == (before.prefix_query_tokens,
                                                                    before.prefix_hit_tokens)


def test_the_probe_predicts_the_admission():
    s = scheduler()
    run(s, 1, list(range(100, 114)))
    prompt = list(range(100, 109)) + [900, 901, 902, 903]
    predicted = scheduler_probe(s)(prompt, 0, 0)
    hits_before = s.stats().prefix_hit_tokens
    run(s, 2, prompt)
    assert predicted == 8 == s.stats().prefix_hit_tokens - hits_before


def test_the_probe_with_prefix_caching_off_finds_nothing():
    s = scheduler(prefix_caching=False)
    run(s, 1, list(range(100, 110)))
    assert scheduler_probe(s)(list(range(100, 110)), 0, 0) == 0


def test_probing_from_another_thread_while_the_engine_thread_steps():
    """The router probes on the event loop while the replica's thread schedules and updates: every answer
    is a whole number of blocks no longer than the probed prompt allows, and nothing breaks."""
    s = scheduler(num_blocks=24)
    probe = scheduler_probe(s)
    stop = threading.Event()
    errors = []

    def drive():
        try:
            for i in range(200):
                base = 100 + (i % 5) * 40           # five prompt families, evicting one another
                s.add_sequence(i + 1, np.arange(base, base + 13), max_tokens=3)
                while s.has_unfinished():
                    out = s.schedule()
                    s.update(np.full(len(out.sample_seq_ids), 7))
        except Exception as error:   # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            stop.set()

    thread = threading.Thread(target=drive)
    thread.start()
    answers = []
    while True:   # at least one round, however fast the engine thread finishes
        finished = stop.is_set()
        for base in range(100, 300, 40):
            answers.append(probe(list(range(base, base + 13)), 0, 0))
        if finished:
            break
    thread.join()
    assert not errors
    assert answers and all(a % BLOCK == 0 and 0 <= a <= 12 for a in answers)
    assert max(answers) == 12     # some probes found a family cached
